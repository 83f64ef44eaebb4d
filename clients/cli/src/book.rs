//! `gpux book`: a live level-2 view of one instrument. The book is rebuilt
//! from the snapshot and then the sequence-numbered updates; a gap in the
//! sequence (a lost update) resubscribes for a fresh snapshot rather than
//! showing a wrong book.

use std::collections::BTreeMap;
use std::collections::VecDeque;
use std::time::Duration;

use gpux_client::{now_ms, Connection};
use gpux_engine::{InstrumentId, Side};
use gpux_protocol::{Channel, ClientMessage, ServerMessage};

use crate::money::amount;
use crate::Failure;

const TRADES_SHOWN: usize = 10;

#[derive(Default)]
struct Book {
    seq: u64,
    bids: BTreeMap<u64, u64>,
    asks: BTreeMap<u64, u64>,
    trades: VecDeque<(u64, u64, u32, Side)>,
    synced: bool,
}

impl Book {
    /// Applies one market-data message; `false` when the sequence has a gap.
    fn apply(&mut self, message: &ServerMessage) -> bool {
        match message {
            ServerMessage::BookSnapshot { seq, bids, asks, .. } => {
                self.seq = *seq;
                self.bids = bids.iter().copied().collect();
                self.asks = asks.iter().copied().collect();
                self.synced = true;
            }
            // Updates at or below the snapshot's seq are already in it.
            ServerMessage::BookUpdate { seq, side, price_minor_per_gpu_hour, quantity, .. } if self.synced && *seq > self.seq => {
                if *seq != self.seq + 1 {
                    return false;
                }
                self.seq = *seq;
                let levels = if *side == Side::Buy { &mut self.bids } else { &mut self.asks };
                if *quantity == 0 {
                    levels.remove(price_minor_per_gpu_hour);
                } else {
                    levels.insert(*price_minor_per_gpu_hour, *quantity);
                }
            }
            ServerMessage::Trade { price_minor_per_gpu_hour, quantity, aggressor, at_ms, .. } => {
                self.trades.push_front((*at_ms, *price_minor_per_gpu_hour, *quantity, *aggressor));
                self.trades.truncate(TRADES_SHOWN);
            }
            _ => {}
        }
        true
    }

    fn render(&self, symbol: &str, depth: usize) -> String {
        let mut out = format!(
            "{symbol}  (book seq {})\n\n{:>10} {:>14} | {:<14} {:<10}\n",
            self.seq, "bid GPUs", "bid $/GPU-h", "ask $/GPU-h", "ask GPUs"
        );
        let bids: Vec<_> = self.bids.iter().rev().take(depth).collect();
        let asks: Vec<_> = self.asks.iter().take(depth).collect();
        // Every price of the view with as many decimals as the finest needs.
        let prices: Vec<u64> =
            bids.iter().chain(&asks).map(|(p, _)| **p).chain(self.trades.iter().map(|(_, price, _, _)| *price)).collect();
        let decimals = prices.iter().map(|p| decimals_of(&amount(*p))).max().unwrap_or(2);
        let price = |minor: u64| with_decimals(&amount(minor), decimals);
        for row in 0..depth.max(1) {
            let bid = bids.get(row).map_or((String::new(), String::new()), |(p, q)| (q.to_string(), price(**p)));
            let ask = asks.get(row).map_or((String::new(), String::new()), |(p, q)| (price(**p), q.to_string()));
            if bid.0.is_empty() && ask.0.is_empty() && row > 0 {
                break;
            }
            out.push_str(&format!("{:>10} {:>14} | {:<14} {:<10}\n", bid.0, bid.1, ask.0, ask.1));
        }
        out.push_str("\nlast trades\n");
        for (at_ms, price, quantity, aggressor) in &self.trades {
            let taker = if *aggressor == gpux_engine::Side::Buy { "buyer" } else { "seller" };
            out.push_str(&format!(
                "  {}  {quantity:>4} GPU(s) at {}  ({taker} took)\n",
                crate::clock::when(*at_ms),
                self::price(*price, decimals)
            ));
        }
        out
    }
}

/// Decimals after the point in an amount as `amount` writes it.
fn decimals_of(text: &str) -> usize {
    text.split_once('.').map_or(0, |(_, fraction)| fraction.chars().take_while(char::is_ascii_digit).count())
}

/// The amount written with `decimals` decimals (zeros added; `amount`
/// never writes more than an amount has).
fn with_decimals(text: &str, decimals: usize) -> String {
    let have = decimals_of(text);
    match text.split_once('.') {
        Some((whole, fraction)) if have < decimals => {
            let (digits, rest) = fraction.split_at(have);
            format!("{whole}.{digits}{}{rest}", "0".repeat(decimals - have))
        }
        _ => text.to_string(),
    }
}

fn price(minor: u64, decimals: usize) -> String {
    with_decimals(&amount(minor), decimals)
}

/// The instrument's last trades before the feed starts (newest first), so
/// the view shows them at once (`--once` too).
async fn recent_trades(connection: &mut Connection, instrument: InstrumentId) -> VecDeque<(u64, u64, u32, Side)> {
    let id = connection.new_id();
    match connection.request(ClientMessage::Trades { id, instrument, before_seq: None }).await {
        Ok(ServerMessage::Trades { trades, .. }) => {
            trades.iter().take(TRADES_SHOWN).map(|t| (t.at_ms, t.price_minor_per_gpu_hour, t.quantity, t.aggressor)).collect()
        }
        _ => VecDeque::new(),
    }
}

async fn subscribe(connection: &mut Connection, instrument: InstrumentId) -> Result<(), Failure> {
    for channel in [Channel::Book, Channel::Trades] {
        let id = connection.new_id();
        match connection.request(ClientMessage::Subscribe { id, channel, instrument }).await {
            Ok(ServerMessage::Subscribed { .. }) => {}
            Ok(ServerMessage::Error { code, message, .. }) => return Err(Failure::Refused(format!("{}: {message}", code.name()))),
            Ok(other) => return Err(Failure::Unreachable(format!("expected subscribed, got {other:?}"))),
            Err(error) => return Err(Failure::Unreachable(format!("{error:#}"))),
        }
    }
    Ok(())
}

pub async fn watch(
    connection: &mut Connection,
    instrument: InstrumentId,
    depth: usize,
    once: bool,
    seconds: Option<u64>,
    json: bool,
) -> Result<(), Failure> {
    let id = connection.new_id();
    let symbol = match connection.request(ClientMessage::Instruments { id }).await {
        Ok(ServerMessage::Instruments { instruments, .. }) => {
            instruments.into_iter().find(|i| i.instrument == instrument).map_or(instrument.0.to_string(), |i| i.symbol)
        }
        _ => instrument.0.to_string(),
    };
    let trades = recent_trades(connection, instrument).await;
    subscribe(connection, instrument).await?;
    let mut book = Book { trades, ..Book::default() };
    let deadline = seconds.map(|s| now_ms() + s * 1_000);
    let (mut last_drawn, mut drawn) = (0, String::new());
    loop {
        let message = match connection.next_within(Duration::from_millis(200)).await {
            Ok(message) => message,
            Err(error) => return Err(Failure::Unreachable(format!("{error:#}"))),
        };
        if let Some(message) = &message {
            if json {
                out!("{}", gpux_protocol::encode_server_text(message));
            }
            if !book.apply(message) {
                // A gap: start again from a fresh snapshot.
                book = Book { trades: std::mem::take(&mut book.trades), ..Book::default() };
                for channel in [Channel::Book, Channel::Trades] {
                    let id = connection.new_id();
                    let _ = connection.request(ClientMessage::Unsubscribe { id, channel, instrument }).await;
                }
                subscribe(connection, instrument).await?;
            }
        }
        if once && book.synced {
            if !json {
                out!("{}", book.render(&symbol, depth));
            }
            return Ok(());
        }
        if !json && !once && book.synced && now_ms() - last_drawn >= 250 {
            last_drawn = now_ms();
            // Only when the view changed. On a terminal: clear the screen and
            // draw from the top. Into a pipe or a file: one plain snapshot
            // after another, no escapes.
            let view = book.render(&symbol, depth);
            if view != drawn {
                if std::io::IsTerminal::is_terminal(&std::io::stdout()) {
                    out!("\x1b[2J\x1b[H{view}");
                } else {
                    out!("{view}");
                }
                drawn = view;
            }
        }
        if deadline.is_some_and(|d| now_ms() >= d) {
            return Ok(());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn update(seq: u64, price: u64, quantity: u64) -> ServerMessage {
        ServerMessage::BookUpdate { instrument: InstrumentId(0), seq, side: Side::Buy, price_minor_per_gpu_hour: price, quantity }
    }

    #[test]
    fn a_column_of_prices_shares_its_decimals() {
        assert_eq!(with_decimals("$2.00", 3), "$2.000");
        assert_eq!(with_decimals("$2.125", 3), "$2.125");
        assert_eq!(with_decimals("2.5 CNY", 2), "2.50 CNY");
        let book = Book {
            synced: true,
            bids: [(2_000_000, 1)].into_iter().collect(),
            asks: [(2_125_000, 2)].into_iter().collect(),
            ..Book::default()
        };
        let view = book.render("H100-SXM-80G/SPOT", 5);
        assert!(view.contains("$2.000") && view.contains("$2.125"), "{view}");
    }

    #[test]
    fn updates_older_than_the_snapshot_are_ignored_and_a_gap_is_reported() {
        let mut book = Book::default();
        let snapshot = ServerMessage::BookSnapshot { instrument: InstrumentId(0), seq: 10, bids: vec![(100, 2)], asks: vec![] };
        assert!(book.apply(&snapshot));
        assert!(book.apply(&update(9, 100, 7)), "already in the snapshot");
        assert!(book.apply(&update(10, 100, 7)), "already in the snapshot");
        assert_eq!(book.bids, BTreeMap::from([(100, 2)]));
        assert!(book.apply(&update(11, 100, 0)));
        assert!(book.bids.is_empty());
        assert!(!book.apply(&update(13, 90, 1)), "12 is missing");
    }
}
