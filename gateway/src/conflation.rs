//! Market data for a connection that reads version 2 (docs/protocol.md
//! "Market data"): feed messages batched into one `market_data` frame, and
//! a book the connection fell behind on conflated per level instead of
//! resent as a snapshot.
//!
//! A connection whose outbox is full keeps reading its book feeds into a
//! [`Conflation`]: each level's latest total, per instrument, from the
//! first update it absorbed. When the peer has read enough, the conflated
//! books go out as one `book_conflated` each (the net effect of the updates
//! they stand for) and updates continue behind them. Trades are never
//! conflated: each is a fact of its own.

use std::collections::BTreeMap;

use gpux_engine::{InstrumentId, Side};
use gpux_protocol::codec::{market_data_binary, market_data_text};
use gpux_protocol::ServerMessage;
use tokio_tungstenite::tungstenite::Message;

use crate::link::SharedFrame;

pub use crate::limits::{BATCH_MESSAGES_MAX, CONFLATED_LEVELS_MAX};

/// The conflated books of one connection.
#[derive(Default, Debug)]
pub struct Conflation {
    books: BTreeMap<InstrumentId, Pending>,
    levels: usize,
}

#[derive(Debug)]
struct Pending {
    from_seq: u64,
    seq: u64,
    bids: BTreeMap<u64, u64>,
    asks: BTreeMap<u64, u64>,
}

/// The conflation is full: the caller resynchronises the instrument.
#[derive(Debug, PartialEq, Eq)]
pub struct Full;

impl Conflation {
    pub fn is_empty(&self) -> bool {
        self.books.is_empty()
    }

    /// Whether updates of `instrument` are being conflated: a later update
    /// of it must be absorbed too, or it would overtake the ones held.
    pub fn holds(&self, instrument: InstrumentId) -> bool {
        self.books.contains_key(&instrument)
    }

    /// Takes one book update in. An update at or below the held `seq` (a
    /// repeat) changes nothing. `Full` when the connection already holds
    /// `CONFLATED_LEVELS_MAX` levels and this one is new: the instrument's
    /// held levels are dropped and the caller resynchronises it.
    pub fn absorb(&mut self, instrument: InstrumentId, seq: u64, side: Side, price: u64, quantity: u64) -> Result<(), Full> {
        let pending = self.books.entry(instrument).or_insert_with(|| Pending {
            from_seq: seq,
            seq: seq - 1,
            bids: BTreeMap::new(),
            asks: BTreeMap::new(),
        });
        if seq <= pending.seq {
            return Ok(());
        }
        let levels = match side {
            Side::Buy => &mut pending.bids,
            Side::Sell => &mut pending.asks,
        };
        let new_level = !levels.contains_key(&price);
        if new_level && self.levels >= CONFLATED_LEVELS_MAX {
            self.forget(instrument);
            return Err(Full);
        }
        levels.insert(price, quantity);
        pending.seq = seq;
        self.levels += usize::from(new_level);
        Ok(())
    }

    /// Drops what is held of `instrument` (resynchronised or unsubscribed).
    pub fn forget(&mut self, instrument: InstrumentId) {
        if let Some(pending) = self.books.remove(&instrument) {
            self.levels -= pending.bids.len() + pending.asks.len();
        }
    }

    /// Everything held, one `book_conflated` per instrument (bids best
    /// first, asks best first), and the conflation emptied.
    pub fn drain(&mut self) -> Vec<ServerMessage> {
        self.levels = 0;
        std::mem::take(&mut self.books)
            .into_iter()
            .map(|(instrument, pending)| ServerMessage::BookConflated {
                instrument,
                from_seq: pending.from_seq,
                seq: pending.seq,
                bids: pending.bids.into_iter().rev().collect(),
                asks: pending.asks.into_iter().collect(),
            })
            .collect()
    }
}

/// What goes into one `market_data` frame: shared feed frames (encoded once
/// for every subscriber) and this connection's own conflated books.
#[derive(Default)]
pub struct Batch {
    shared: Vec<std::sync::Arc<SharedFrame>>,
    own: Vec<ServerMessage>,
}

impl Batch {
    pub fn is_empty(&self) -> bool {
        self.shared.is_empty() && self.own.is_empty()
    }

    pub fn is_full(&self) -> bool {
        self.shared.len() + self.own.len() >= BATCH_MESSAGES_MAX
    }

    /// Adds a feed frame. Own messages go after every shared one: the
    /// caller adds conflated books only once the shared frames before them
    /// are in (`take` between the two when the order would differ).
    pub fn push_shared(&mut self, frame: std::sync::Arc<SharedFrame>) {
        debug_assert!(self.own.is_empty(), "a shared frame after an own message would be reordered");
        self.shared.push(frame);
    }

    pub fn push_own(&mut self, message: ServerMessage) {
        self.own.push(message);
    }

    /// The batch as one WebSocket message in the connection's format, and
    /// the batch emptied. Shared frames are copied from their one encoding.
    pub fn take(&mut self, binary: bool) -> Message {
        let own: Vec<_> = std::mem::take(&mut self.own).into_iter().map(SharedFrame::new).collect();
        let frames: Vec<_> = std::mem::take(&mut self.shared).into_iter().chain(own).collect();
        if binary {
            let encoded: Vec<&[u8]> = frames.iter().map(|frame| frame.binary()).collect();
            Message::Binary(market_data_binary(&encoded).into())
        } else {
            Message::Text(market_data_text(frames.iter().map(|frame| frame.text())).into())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use gpux_protocol::codec::{decode_server_binary, decode_server_text};

    const I: InstrumentId = InstrumentId(0);

    #[test]
    fn conflated_levels_are_the_last_total_of_each_price_from_the_first_update_absorbed() {
        let mut conflation = Conflation::default();
        conflation.absorb(I, 41, Side::Buy, 100, 5).expect("room");
        conflation.absorb(I, 42, Side::Buy, 100, 7).expect("room");
        conflation.absorb(I, 43, Side::Sell, 120, 1).expect("room");
        conflation.absorb(I, 44, Side::Buy, 90, 2).expect("room");
        conflation.absorb(I, 45, Side::Sell, 120, 0).expect("room");
        conflation.absorb(I, 44, Side::Buy, 90, 9).expect("room"); // a repeat: ignored
        assert!(conflation.holds(I));
        assert_eq!(
            conflation.drain(),
            vec![ServerMessage::BookConflated {
                instrument: I,
                from_seq: 41,
                seq: 45,
                bids: vec![(100, 7), (90, 2)],
                asks: vec![(120, 0)]
            }]
        );
        assert!(conflation.is_empty() && !conflation.holds(I));
    }

    #[test]
    fn a_connection_past_its_share_of_levels_drops_the_instrument_to_be_resynchronised() {
        let mut conflation = Conflation::default();
        let other = InstrumentId(1);
        conflation.absorb(other, 1, Side::Buy, 1, 1).expect("room");
        for (seq, price) in (1..CONFLATED_LEVELS_MAX as u64).enumerate() {
            conflation.absorb(I, seq as u64 + 1, Side::Sell, price, 1).expect("room");
        }
        // A level already held still conflates; a new one is one too many.
        conflation.absorb(I, CONFLATED_LEVELS_MAX as u64, Side::Sell, 1, 3).expect("room");
        assert_eq!(conflation.absorb(I, CONFLATED_LEVELS_MAX as u64 + 1, Side::Buy, 7, 1), Err(Full));
        assert!(!conflation.holds(I) && conflation.holds(other));
        assert_eq!(conflation.levels, 1);
        conflation.absorb(I, 9_000, Side::Buy, 7, 1).expect("room");
        assert_eq!(conflation.levels, 2);
    }

    #[test]
    fn the_most_levels_a_connection_conflates_fit_one_frame_in_both_encodings() {
        let mut conflation = Conflation::default();
        for level in 0..CONFLATED_LEVELS_MAX as u64 {
            let side = if level % 2 == 0 { Side::Buy } else { Side::Sell };
            conflation.absorb(I, level + 1, side, 100_000_000 - level * 1_000, 999_999).expect("room");
        }
        let messages = conflation.drain();
        for binary in [false, true] {
            let mut batch = Batch::default();
            messages.iter().cloned().for_each(|message| batch.push_own(message));
            let bytes = batch.take(binary).len();
            assert!(bytes <= gpux_protocol::FRAME_BYTES_MAX, "{bytes} bytes, binary {binary}");
        }
    }

    #[test]
    fn a_batch_is_the_market_data_message_of_its_frames_in_order_in_both_formats() {
        for count in [1usize, 3, 250, 251, 300] {
            let updates: Vec<ServerMessage> = (0..count as u64)
                .map(|seq| ServerMessage::BookUpdate {
                    instrument: I,
                    seq: seq + 1,
                    side: Side::Buy,
                    price_minor_per_gpu_hour: 1_000 + seq,
                    quantity: seq,
                })
                .collect();
            let conflated =
                ServerMessage::BookConflated { instrument: InstrumentId(3), from_seq: 2, seq: 9, bids: vec![(5, 1)], asks: vec![] };
            let mut expected = updates.clone();
            expected.push(conflated.clone());
            let expected = ServerMessage::MarketData { messages: expected };
            for binary in [false, true] {
                let mut batch = Batch::default();
                for update in &updates {
                    batch.push_shared(SharedFrame::new(update.clone()));
                }
                batch.push_own(conflated.clone());
                let decoded = match batch.take(binary) {
                    Message::Binary(bytes) => decode_server_binary(&bytes).expect("decodes"),
                    Message::Text(text) => decode_server_text(&text).expect("decodes"),
                    other => panic!("{other:?}"),
                };
                assert_eq!(decoded, expected, "{count} messages, binary {binary}");
                assert!(batch.is_empty());
            }
        }
    }
}
