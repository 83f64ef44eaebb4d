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
        for row in 0..depth.max(1) {
            let bid = bids.get(row).map_or((String::new(), String::new()), |(p, q)| (q.to_string(), amount(**p)));
            let ask = asks.get(row).map_or((String::new(), String::new()), |(p, q)| (amount(**p), q.to_string()));
            if bid.0.is_empty() && ask.0.is_empty() && row > 0 {
                break;
            }
            out.push_str(&format!("{:>10} {:>14} | {:<14} {:<10}\n", bid.0, bid.1, ask.0, ask.1));
        }
        out.push_str("\nlast trades\n");
        for (at_ms, price, quantity, aggressor) in &self.trades {
            let taker = if *aggressor == gpux_engine::Side::Buy { "buyer" } else { "seller" };
            out.push_str(&format!("  {}  {quantity:>4} GPU(s) at {}  ({taker} took)\n", crate::clock::when(*at_ms), amount(*price)));
        }
        out
    }
}

async fn subscribe(connection: &mut Connection, instrument: InstrumentId) -> Result<(), Failure> {
    for channel in [Channel::Book, Channel::Trades] {
        let id = connection.new_id();
        match connection.request(ClientMessage::Subscribe { id, channel, instrument }).await {
            Ok(ServerMessage::Subscribed { .. }) => {}
            Ok(ServerMessage::Error { code, message, .. }) => return Err(Failure::Refused(format!("{}: {message}", crate::snake(&code)))),
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
    subscribe(connection, instrument).await?;
    let mut book = Book::default();
    let deadline = seconds.map(|s| now_ms() + s * 1_000);
    let mut last_drawn = 0;
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
            // On a terminal: clear the screen and draw from the top. Into a
            // pipe or a file: one plain snapshot after another, no escapes.
            if std::io::IsTerminal::is_terminal(&std::io::stdout()) {
                out!("\x1b[2J\x1b[H{}", book.render(&symbol, depth));
            } else {
                out!("{}", book.render(&symbol, depth));
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
