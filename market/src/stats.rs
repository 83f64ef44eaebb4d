//! Rolling 24-hour statistics per instrument (open, high, low, last, volume,
//! trade count), kept from the trades the market applies. Trades older than
//! the window are dropped as new ones arrive (a read only skips them); each
//! instrument keeps at most `TRADES_PER_INSTRUMENT_MAX` (the oldest go first).

use std::collections::{BTreeMap, VecDeque};

use gpux_engine::InstrumentId;
use serde::{Deserialize, Serialize};

pub const WINDOW_MS: u64 = gpux_engine::time::MS_PER_DAY;
pub const TRADES_PER_INSTRUMENT_MAX: usize = 1_000_000;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
struct Print {
    at_ms: u64,
    price: u64,
    quantity: u32,
}

/// One instrument's figures over `[window_start_ms, now]`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DayStats {
    pub window_start_ms: u64,
    pub open: Option<u64>,
    pub high: Option<u64>,
    pub low: Option<u64>,
    pub last: Option<u64>,
    pub volume: u64,
    pub trades: u64,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct RollingStats {
    prints: BTreeMap<InstrumentId, VecDeque<Print>>,
}

impl RollingStats {
    pub fn record(&mut self, instrument: InstrumentId, at_ms: u64, price: u64, quantity: u32) {
        let prints = self.prints.entry(instrument).or_default();
        if prints.len() >= TRADES_PER_INSTRUMENT_MAX {
            prints.pop_front();
        }
        prints.push_back(Print { at_ms, price, quantity });
        Self::expire(prints, at_ms);
    }

    /// Drops an instrument's prints (a retired window).
    pub fn forget(&mut self, instrument: InstrumentId) {
        self.prints.remove(&instrument);
    }

    /// The figures over the 24 hours up to `now_ms`. Reading changes
    /// nothing (the state must not depend on who asked what).
    pub fn day(&self, instrument: InstrumentId, now_ms: u64) -> DayStats {
        let window_start_ms = now_ms.saturating_sub(WINDOW_MS);
        let mut stats = DayStats { window_start_ms, ..DayStats::default() };
        let Some(prints) = self.prints.get(&instrument) else { return stats };
        for print in prints.iter().filter(|print| print.at_ms >= window_start_ms) {
            stats.open.get_or_insert(print.price);
            stats.high = Some(stats.high.map_or(print.price, |high| high.max(print.price)));
            stats.low = Some(stats.low.map_or(print.price, |low| low.min(print.price)));
            stats.last = Some(print.price);
            stats.volume += print.quantity as u64;
            stats.trades += 1;
        }
        stats
    }

    fn expire(prints: &mut VecDeque<Print>, now_ms: u64) {
        let window_start_ms = now_ms.saturating_sub(WINDOW_MS);
        while prints.front().is_some_and(|print| print.at_ms < window_start_ms) {
            prints.pop_front();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stats_cover_the_last_24_hours_only() {
        let mut stats = RollingStats::default();
        let instrument = InstrumentId(0);
        stats.record(instrument, 0, 5_000, 1);
        stats.record(instrument, WINDOW_MS / 2, 2_000, 2);
        stats.record(instrument, WINDOW_MS / 2 + 1, 3_000, 4);
        let day = stats.day(instrument, WINDOW_MS + 10);
        assert_eq!(
            day,
            DayStats {
                window_start_ms: 10,
                open: Some(2_000),
                high: Some(3_000),
                low: Some(2_000),
                last: Some(3_000),
                volume: 6,
                trades: 2
            }
        );
        assert_eq!(stats.day(InstrumentId(5), 0).trades, 0);
    }
}
