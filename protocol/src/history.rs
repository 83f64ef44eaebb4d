//! Market history: trades as printed, an account's fills and price candles
//! (docs/protocol.md "History"). The exchange keeps them in its journal's
//! index, written in the same commit as the entries that printed them, so
//! history survives restarts and is read without replaying the journal.

use gpux_engine::{AccountId, InstrumentId, OrderId, Side};
use serde::{Deserialize, Serialize};

/// Trades on one history page at most (fewer to fit a frame).
pub const TRADES_PAGE_MAX: usize = 500;
/// Candles on one page at most.
pub const CANDLES_PAGE_MAX: usize = 500;

/// A trade as the journal's index keeps it: who traded is known to the
/// exchange (for fills) and never published (a public trade is a [`TradePrint`]).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct TradeRecord {
    pub instrument: InstrumentId,
    /// The instrument's trade counter: the `seq` of its `trade` market data.
    pub seq: u64,
    pub at_ms: u64,
    pub price_minor_per_gpu_hour: u64,
    pub quantity: u32,
    pub aggressor: Side,
    pub buy_order: OrderId,
    pub sell_order: OrderId,
    pub buyer: AccountId,
    pub seller: AccountId,
}

impl TradeRecord {
    pub fn print(&self) -> TradePrint {
        TradePrint {
            seq: self.seq,
            at_ms: self.at_ms,
            price_minor_per_gpu_hour: self.price_minor_per_gpu_hour,
            quantity: self.quantity,
            aggressor: self.aggressor,
        }
    }

    /// The trade as `side`'s party saw it.
    pub fn fill(&self, side: Side) -> Fill {
        let order = match side {
            Side::Buy => self.buy_order,
            Side::Sell => self.sell_order,
        };
        Fill {
            instrument: self.instrument,
            seq: self.seq,
            at_ms: self.at_ms,
            side,
            order,
            price_minor_per_gpu_hour: self.price_minor_per_gpu_hour,
            quantity: self.quantity,
            liquidity: if side == self.aggressor { Liquidity::Taker } else { Liquidity::Maker },
        }
    }
}

/// A public trade: price, GPUs and the side that crossed; never who.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct TradePrint {
    pub seq: u64,
    pub at_ms: u64,
    pub price_minor_per_gpu_hour: u64,
    pub quantity: u32,
    pub aggressor: Side,
}

/// Whether an order's fill took liquidity (it crossed the book) or made it
/// (it rested there).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Liquidity {
    Maker,
    Taker,
}

/// One of an account's fills.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Fill {
    pub instrument: InstrumentId,
    pub seq: u64,
    pub at_ms: u64,
    pub side: Side,
    pub order: OrderId,
    pub price_minor_per_gpu_hour: u64,
    pub quantity: u32,
    pub liquidity: Liquidity,
}

impl Fill {
    /// Where the page after this fill starts.
    pub fn cursor(&self) -> FillCursor {
        FillCursor { at_ms: self.at_ms, instrument: self.instrument, seq: self.seq }
    }
}

/// A place in an account's fills (newest first): the fills strictly before it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub struct FillCursor {
    pub at_ms: u64,
    pub instrument: InstrumentId,
    pub seq: u64,
}

/// The candle intervals the exchange keeps.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize, strum::VariantNames)]
pub enum CandleInterval {
    #[serde(rename = "1m")]
    #[strum(serialize = "1m")]
    Minute,
    #[serde(rename = "1h")]
    #[strum(serialize = "1h")]
    Hour,
    #[serde(rename = "1d")]
    #[strum(serialize = "1d")]
    Day,
}

impl CandleInterval {
    pub const ALL: [CandleInterval; 3] = [CandleInterval::Minute, CandleInterval::Hour, CandleInterval::Day];

    pub fn ms(self) -> u64 {
        match self {
            CandleInterval::Minute => 60_000,
            CandleInterval::Hour => 3_600_000,
            CandleInterval::Day => 86_400_000,
        }
    }

    /// The interval's name on the wire (`1m`, `1h`, `1d`).
    pub fn name(self) -> &'static str {
        match self {
            CandleInterval::Minute => "1m",
            CandleInterval::Hour => "1h",
            CandleInterval::Day => "1d",
        }
    }

    pub fn from_name(name: &str) -> Option<CandleInterval> {
        CandleInterval::ALL.into_iter().find(|interval| interval.name() == name)
    }

    /// The start of the interval holding `at_ms` (UTC; days start at 00:00).
    pub fn start(self, at_ms: u64) -> u64 {
        at_ms - at_ms % self.ms()
    }
}

/// Open, high, low and close prices of the trades in one interval, GPUs
/// traded and the number of trades. Intervals without trades have no candle.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Candle {
    pub start_ms: u64,
    pub open: u64,
    pub high: u64,
    pub low: u64,
    pub close: u64,
    pub volume: u64,
    pub trades: u64,
}

/// A candle as the index keeps it: with the last trade it counts, so that
/// adding a trade again (a replay writing what its entries printed once
/// more) changes nothing.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct CandleRecord {
    pub candle: Candle,
    pub last_seq: u64,
}

impl CandleRecord {
    pub fn first(start_ms: u64, trade: &TradeRecord) -> CandleRecord {
        let price = trade.price_minor_per_gpu_hour;
        CandleRecord {
            candle: Candle { start_ms, open: price, high: price, low: price, close: price, volume: trade.quantity as u64, trades: 1 },
            last_seq: trade.seq,
        }
    }

    /// Counts `trade` in; a trade at or before the last counted is already in.
    pub fn add(&mut self, trade: &TradeRecord) {
        if trade.seq <= self.last_seq {
            return;
        }
        let price = trade.price_minor_per_gpu_hour;
        let candle = &mut self.candle;
        candle.high = candle.high.max(price);
        candle.low = candle.low.min(price);
        candle.close = price;
        candle.volume += trade.quantity as u64;
        candle.trades += 1;
        self.last_seq = trade.seq;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn trade(seq: u64, price: u64, quantity: u32) -> TradeRecord {
        TradeRecord {
            instrument: InstrumentId(0),
            seq,
            at_ms: 60_000 + seq,
            price_minor_per_gpu_hour: price,
            quantity,
            aggressor: Side::Buy,
            buy_order: OrderId(1),
            sell_order: OrderId(2),
            buyer: AccountId(1),
            seller: AccountId(2),
        }
    }

    #[test]
    fn a_candle_counts_each_trade_once_however_often_it_is_added() {
        let trades = [trade(1, 2_000, 1), trade(2, 2_500, 2), trade(3, 1_500, 3), trade(4, 2_100, 4)];
        let mut once = CandleRecord::first(60_000, &trades[0]);
        for t in &trades[1..] {
            once.add(t);
        }
        let mut twice = CandleRecord::first(60_000, &trades[0]);
        for t in trades.iter().chain(trades.iter()) {
            twice.add(t);
        }
        assert_eq!(once, twice);
        assert_eq!(once.candle, Candle { start_ms: 60_000, open: 2_000, high: 2_500, low: 1_500, close: 2_100, volume: 10, trades: 4 });
    }

    #[test]
    fn intervals_start_on_utc_boundaries() {
        let at_ms = 1_796_223_600_123; // 2026-12-03 15:00:00.123 UTC
        assert_eq!(CandleInterval::Minute.start(at_ms), 1_796_223_600_000);
        assert_eq!(CandleInterval::Hour.start(at_ms), 1_796_223_600_000);
        assert_eq!(CandleInterval::Day.start(at_ms), 1_796_169_600_000);
        for interval in CandleInterval::ALL {
            assert_eq!(CandleInterval::from_name(interval.name()), Some(interval));
        }
        assert_eq!(CandleInterval::from_name("5m"), None);
    }

    #[test]
    fn a_fill_says_which_side_took_liquidity() {
        let t = trade(7, 2_000, 1);
        assert_eq!(t.fill(Side::Buy).liquidity, Liquidity::Taker);
        assert_eq!(t.fill(Side::Sell).liquidity, Liquidity::Maker);
        assert_eq!(t.fill(Side::Sell).order, OrderId(2));
    }
}
