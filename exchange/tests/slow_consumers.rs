//! Subscribers that do not keep up (docs/protocol.md "A subscriber that
//! falls behind"): one that pauses is resynchronised with a fresh book
//! snapshot and never sees a gap; one that stops reading for good is closed
//! `slow_consumer`, told so if it reads again, and counted; the market goes on.

mod common;

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use common::*;
use gpux_engine::*;
use gpux_protocol::*;

/// Logged-in renters with money, to move the book.
async fn funded_traders(exchange: &Exchange, seeds: std::ops::Range<u8>) -> Vec<Client> {
    let (mut operator, _) = Client::login(&exchange.addr, &key(1), Role::Operator).await;
    let mut traders = Vec::new();
    for seed in seeds {
        let (trader, account) = Client::login(&exchange.addr, &key(seed), Role::Renter).await;
        let id = operator.id();
        let deposit = operator.request(ClientMessage::Deposit { id, account, amount_minor: 1 << 48 }).await;
        assert!(matches!(deposit, ServerMessage::Ack { .. }), "{deposit:?}");
        traders.push(trader);
    }
    traders
}

/// Each trader rests `orders` bids at prices no one else uses: one book
/// update each. Returns once every order is acknowledged.
async fn move_book(traders: &mut [Client], first_client_order_id: u64, orders: u64) {
    move_book_over(traders, first_client_order_id, orders, 100_000).await
}

/// `move_book` over `levels` prices: each is updated `orders / levels`
/// times per trader.
async fn move_book_over(traders: &mut [Client], first_client_order_id: u64, orders: u64, levels: u64) {
    const CHUNK: u64 = 500;
    for (index, trader) in traders.iter_mut().enumerate() {
        let base = first_client_order_id + index as u64 * 100_000;
        for chunk in (0..orders).step_by(CHUNK as usize) {
            let end = (chunk + CHUNK).min(orders);
            for client_order_id in base + chunk..base + end {
                let id = trader.id();
                let order = ticket(client_order_id, Side::Buy, 1_000_000 + (client_order_id % levels) * 1_000, 1);
                trader.send_nowait(&ClientMessage::NewOrder { id, order, workload: None }).await;
            }
            trader.flush().await;
            let mut acks = 0;
            while acks < end - chunk {
                match trader.recv_reply().await {
                    ServerMessage::Ack { .. } => acks += 1,
                    other @ (ServerMessage::Reject { .. } | ServerMessage::Error { .. }) => panic!("{other:?}"),
                    _ => {}
                }
            }
        }
    }
}

/// A client's copy of one side of the book, kept by docs/protocol.md's rules.
#[derive(Default)]
struct BookCopy {
    seq: u64,
    bids: BTreeMap<u64, u64>,
    snapshots: u32,
    /// Market-data version 2: `market_data` frames and `book_conflated`.
    batches: u32,
    conflated: u32,
}

impl BookCopy {
    /// Applies one message; panics on a gap, which the rules forbid.
    fn apply(&mut self, message: &ServerMessage) {
        match message {
            ServerMessage::BookSnapshot { seq, bids, .. } => {
                self.seq = *seq;
                self.bids = bids.iter().copied().collect();
                self.snapshots += 1;
            }
            ServerMessage::MarketData { messages } => {
                self.batches += 1;
                messages.iter().for_each(|message| self.apply(message));
            }
            ServerMessage::BookConflated { from_seq, seq, bids, asks, .. } => {
                assert_eq!(*from_seq, self.seq + 1, "a conflated book must continue where the copy is");
                assert!(asks.is_empty(), "only bids moved");
                self.seq = *seq;
                self.conflated += 1;
                for (price, quantity) in bids {
                    if *quantity == 0 {
                        self.bids.remove(price);
                    } else {
                        self.bids.insert(*price, *quantity);
                    }
                }
            }
            ServerMessage::BookUpdate { seq, side: Side::Buy, price_minor_per_gpu_hour, quantity, .. } if *seq > self.seq => {
                assert_eq!(*seq, self.seq + 1, "a gap in the book feed after seq {}", self.seq);
                self.seq = *seq;
                if *quantity == 0 {
                    self.bids.remove(price_minor_per_gpu_hour);
                } else {
                    self.bids.insert(*price_minor_per_gpu_hour, *quantity);
                }
            }
            _ => {}
        }
    }
}

/// The book as a fresh subscriber sees it now.
async fn current_book(addr: &str) -> (u64, BTreeMap<u64, u64>) {
    let mut fresh = Client::connect(addr).await;
    let id = fresh.id();
    fresh.send(&ClientMessage::Subscribe { id, channel: Channel::Book, instrument: InstrumentId(0) }).await;
    fresh
        .recv_until(|message| match message {
            ServerMessage::BookSnapshot { seq, bids, .. } => Some((*seq, bids.iter().copied().collect())),
            _ => None,
        })
        .await
}

/// Subscribes `reader` to instrument 0's book and reads to its snapshot.
async fn subscribed_copy(reader: &mut Client) -> BookCopy {
    let id = reader.id();
    reader.send(&ClientMessage::Subscribe { id, channel: Channel::Book, instrument: InstrumentId(0) }).await;
    let mut copy = BookCopy::default();
    while copy.snapshots == 0 {
        let message = reader.recv().await;
        copy.apply(&message);
    }
    copy
}

/// Reads until the copy is at the exchange's book as a fresh subscriber
/// sees it now, checks that their best levels agree (a snapshot carries
/// the best 1 000; the copy may also hold deeper ones that changed since)
/// and returns the book's `seq`.
async fn catch_up(reader: &mut Client, copy: &mut BookCopy, addr: &str) -> u64 {
    let (final_seq, final_bids) = current_book(addr).await;
    while copy.seq < final_seq {
        let message = reader.recv().await;
        copy.apply(&message);
    }
    assert_eq!(copy.seq, final_seq);
    let best: BTreeMap<u64, u64> = copy.bids.iter().rev().take(BOOK_SNAPSHOT_LEVELS_MAX).map(|(p, q)| (*p, *q)).collect();
    assert_eq!(best, final_bids, "the reader's book is the exchange's");
    final_seq
}

/// A reader that pauses while the book moves thousands of times, more than
/// the feed keeps, reads on to one fresh snapshot in place of what it
/// missed, never sees a gap, and ends with the exchange's book.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reader_that_pauses_gets_a_fresh_snapshot_in_place_of_what_it_missed() {
    let dir = tempfile::tempdir().expect("temp dir");
    let exchange = Exchange::start_with(dir.path(), Some(&key(1)), &["--feed-frames-max", "2048", "--write-stall-ms", "60000"]);
    let mut traders = funded_traders(&exchange, 20..26).await;
    let mut reader = Client::connect_with_receive_buffer(&exchange.addr, Some(4096)).await;
    let mut copy = subscribed_copy(&mut reader).await;
    // The reader stops reading while the book moves 54 000 times: more than
    // its socket buffers and the feed's 2 048 frames hold (the feed must hold a
    // sequencer batch: a chunk of 500 orders moves the book 500 times at once).
    move_book(&mut traders, 0, 9_000).await;
    let final_seq = catch_up(&mut reader, &mut copy, &exchange.addr).await;
    assert!(copy.snapshots >= 2, "the reader fell behind and was sent a fresh snapshot");
    // Still subscribed and served: the next update arrives.
    move_book(&mut traders[..1], 10_000, 1).await;
    let next = reader.recv_until(|message| matches!(message, ServerMessage::BookUpdate { .. }).then(|| message.clone())).await;
    copy.apply(&next);
    assert_eq!(copy.seq, final_seq + 1);
    let body = scrape(&exchange.metrics_addr).await;
    assert!(metric(&body, "gpux_feed_resyncs_total ") >= 1.0, "{body}");
    assert_eq!(metric(&body, "gpux_slow_consumers_total{cause=\"write_stalled\"}"), 0.0);
}

/// Market-data version 2: the same pause, and the reader's missed updates
/// come as one `book_conflated` per catch-up (each level's total now)
/// instead of a snapshot: no gap, every level kept (not only the best
/// 1 000), updates in `market_data` batches, the book the exchange's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_version_2_reader_that_pauses_gets_what_it_missed_conflated_per_level() {
    let dir = tempfile::tempdir().expect("temp dir");
    let exchange = Exchange::start_with(dir.path(), Some(&key(1)), &["--write-stall-ms", "60000"]);
    let mut traders = funded_traders(&exchange, 20..26).await;
    let mut reader = Client::connect_with_receive_buffer(&exchange.addr, Some(4096)).await;
    let mut auth = reader.auth_message(&key(40), Some(Role::Renter));
    if let ClientMessage::Auth { market_data_version, .. } = &mut auth {
        *market_data_version = Some(2);
    }
    reader.send(&auth).await;
    reader.recv_until(|message| matches!(message, ServerMessage::Authenticated { .. }).then_some(())).await;
    let mut copy = subscribed_copy(&mut reader).await;
    // 54 000 updates over 1 500 prices while the reader does not read: far
    // more than its socket and outbox hold, fewer levels than it may conflate.
    move_book_over(&mut traders, 0, 9_000, 1_500).await;
    let final_seq = catch_up(&mut reader, &mut copy, &exchange.addr).await;
    assert_eq!(copy.snapshots, 1, "caught up without a snapshot");
    assert!(copy.conflated >= 1 && copy.batches >= 1, "{} conflated, {} batches", copy.conflated, copy.batches);
    assert_eq!(copy.bids.len(), 1_500, "every level, deeper than a snapshot's 1 000");
    move_book(&mut traders[..1], 10_000, 1).await;
    let next = reader.recv_until(|message| matches!(message, ServerMessage::MarketData { .. }).then(|| message.clone())).await;
    copy.apply(&next);
    assert_eq!(copy.seq, final_seq + 1);
    let body = scrape(&exchange.metrics_addr).await;
    assert!(metric(&body, "gpux_book_conflations_total ") >= 1.0, "{body}");
    assert_eq!(metric(&body, "gpux_feed_resyncs_total "), 0.0, "{body}");
}

/// A login asking for a market-data version the exchange does not speak
/// is refused `wrong_type` and may log in again on the same challenge.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unknown_market_data_version_is_refused_wrong_type() {
    let dir = tempfile::tempdir().expect("temp dir");
    let exchange = Exchange::start_with(dir.path(), Some(&key(1)), &[]);
    let mut client = Client::connect(&exchange.addr).await;
    let mut auth = client.auth_message(&key(40), Some(Role::Renter));
    if let ClientMessage::Auth { market_data_version, .. } = &mut auth {
        *market_data_version = Some(3);
    }
    client.send(&auth).await;
    match client.recv_reply().await {
        ServerMessage::Error { code: ErrorCode::WrongType, message, .. } => assert!(message.contains("market_data_version 3"), "{message}"),
        other => panic!("{other:?}"),
    }
    let auth = client.auth_message(&key(40), Some(Role::Renter));
    client.send(&auth).await;
    assert!(matches!(client.recv_reply().await, ServerMessage::Authenticated { .. }));
}

/// A session without a key reads version 2 once it asks with
/// `market_data_version` (answered by the connection); an unknown version,
/// or a lower one than it reads, is refused `wrong_type`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_without_a_key_reads_version_2_once_it_asks() {
    let dir = tempfile::tempdir().expect("temp dir");
    let exchange = Exchange::start_with(dir.path(), Some(&key(1)), &[]);
    let mut traders = funded_traders(&exchange, 20..22).await;
    let mut reader = Client::connect(&exchange.addr).await;
    let refused = |answer: ServerMessage, version: u8| match answer {
        ServerMessage::Error { code: ErrorCode::WrongType, message, .. } => {
            assert!(message.contains(&format!("market_data_version {version}")), "{message}")
        }
        other => panic!("{other:?}"),
    };
    reader.send(&ClientMessage::MarketDataVersion { id: 1, version: 3 }).await;
    refused(reader.recv_reply().await, 3);
    reader.send(&ClientMessage::MarketDataVersion { id: 2, version: 2 }).await;
    assert_eq!(reader.recv_reply().await, ServerMessage::MarketDataVersion { id: 2, version: 2 });
    reader.send(&ClientMessage::MarketDataVersion { id: 3, version: 1 }).await;
    refused(reader.recv_reply().await, 1);
    let mut copy = subscribed_copy(&mut reader).await;
    move_book(&mut traders, 0, 20).await;
    let batch = reader.recv_until(|message| matches!(message, ServerMessage::MarketData { .. }).then(|| message.clone())).await;
    let ServerMessage::MarketData { messages } = &batch else { unreachable!() };
    assert!(!messages.is_empty() && messages.iter().all(|m| matches!(m, ServerMessage::BookUpdate { .. })), "{batch:?}");
    copy.apply(&batch);
    assert!(copy.batches >= 1);
}

/// Moves the book in the background, round after round (1 000 bids per
/// trader, then each cancels them all), until told to stop; hands the
/// traders back.
fn keep_moving_the_book(mut traders: Vec<Client>) -> (tokio::sync::oneshot::Sender<()>, tokio::task::JoinHandle<Vec<Client>>) {
    let (stop, mut stopped) = tokio::sync::oneshot::channel();
    let mover = tokio::spawn(async move {
        let mut round = 0;
        while stopped.try_recv().is_err() {
            move_book(&mut traders, round * 1_000_000, 1_000).await;
            for trader in traders.iter_mut() {
                let id = trader.id();
                let cancelled = trader.request(ClientMessage::MassCancel { id, instrument: None }).await;
                assert!(matches!(cancelled, ServerMessage::Ack { .. }), "{cancelled:?}");
            }
            round += 1;
        }
        traders
    });
    (stop, mover)
}

/// Polls the metrics until `name` reaches `value` (60 s at most).
async fn await_metric(exchange: &Exchange, name: &str, value: f64) {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let body = scrape(&exchange.metrics_addr).await;
        if metric(&body, name) == value {
            return;
        }
        assert!(Instant::now() < deadline, "{name} never reached {value}: {body}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// A subscriber that stops reading for good is closed `slow_consumer` once a
/// write has been blocked for the stall limit; reading again within the
/// close wait, it reads its backlog and then the reason; the metric counts
/// it, and the traders never noticed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reader_that_stops_reading_is_closed_as_a_slow_consumer_and_counted() {
    let dir = tempfile::tempdir().expect("temp dir");
    let exchange = Exchange::start_with(dir.path(), Some(&key(1)), &["--write-stall-ms", "1000"]);
    let traders = funded_traders(&exchange, 20..26).await;
    let mut sleeper = Client::connect_with_receive_buffer(&exchange.addr, Some(4096)).await;
    let id = sleeper.id();
    sleeper.request_subscribe(id, Channel::Book, InstrumentId(0)).await;
    let (stop, mover) = keep_moving_the_book(traders);
    await_metric(&exchange, "gpux_slow_consumers_total{cause=\"write_stalled\"}", 1.0).await;
    assert_eq!(sleeper.closed_reason().await, "slow_consumer");
    let _ = stop.send(());
    let mut traders = mover.await.expect("the traders were served throughout");
    drop(sleeper); // answers the close; the exchange then lets the socket go
    await_metric(&exchange, "gpux_connections ", 6.0).await;
    assert!(matches!(traders[0].place(ticket(99_999_999, Side::Buy, 1_000_000, 1)).await, ServerMessage::Ack { .. }));
}

/// A second session of a trader's account that does not read: the trader's
/// private events go to both (the trader reads its own: a chunk of 500
/// orders makes 1 000 frames, well under the queue's 4 096), the sleeper's
/// frame queue fills, and it is
/// closed rather than any event dropped: what it read before the close is
/// every event in order, with none missing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn private_events_are_never_dropped_a_full_queue_closes_the_connection() {
    let dir = tempfile::tempdir().expect("temp dir");
    let exchange = Exchange::start_with(dir.path(), Some(&key(1)), &["--outbound-frames-max", "4096", "--write-stall-ms", "60000"]);
    let traders = funded_traders(&exchange, 20..21).await;
    let mut sleeper = Client::connect_with_receive_buffer(&exchange.addr, Some(4096)).await;
    let auth = sleeper.auth_message(&key(20), Some(Role::Renter));
    sleeper.send(&auth).await;
    assert!(matches!(sleeper.recv_reply().await, ServerMessage::Authenticated { .. }));
    let (stop, mover) = keep_moving_the_book(traders);
    await_metric(&exchange, "gpux_slow_consumers_total{cause=\"queue_full\"}", 1.0).await;
    let (messages, reason) = sleeper.read_to_close().await;
    assert_eq!(reason, "slow_consumer");
    let accepted: Vec<u64> = messages
        .iter()
        .filter_map(|message| match message {
            ServerMessage::Private { event: Event { kind: EventKind::OrderAccepted { client_order_id, .. }, .. }, .. } => {
                Some(*client_order_id)
            }
            _ => None,
        })
        .collect();
    assert!(accepted.len() >= 100, "the sleeper read a backlog: {}", accepted.len());
    let expected: Vec<u64> = (0..accepted.len() as u64).map(|n| (n / 1_000) * 1_000_000 + n % 1_000).collect();
    assert_eq!(accepted, expected, "every private event up to the close, in order");
    let _ = stop.send(());
    mover.await.expect("the trader's own session was served throughout");
}
