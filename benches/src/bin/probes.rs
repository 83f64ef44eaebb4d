//! Short probes for `scripts/bench`: each prints one line `figure: value`,
//! gpux's path and the bare ceiling of the same work on the same machine in
//! the same run, so the ratio is what is compared (docs/PERFORMANCE.md).
//!
//! - `engine-bare N`: a bare array-of-levels book (FIFO queues per price,
//!   an id map for cancels; no GPUs, leases, money or events) on the
//!   engine-latency probe's mix (60% adds, 30% cancels, 10% crossing IOC
//!   orders taking three resting orders each, so the book stays at about
//!   10k resting orders within 100 ticks of the mid): the ceiling of
//!   price-time matching in Rust.
//! - `redb-bare SECONDS`: redb commits of 200 records of 128 bytes with
//!   `Durability::Immediate` (fsync) in a fresh file: the ceiling of the
//!   journal's group commit.
//! - `ed25519-bare N`: ed25519 signature verification on one core, one at
//!   a time and in batches of 64 (ed25519-dalek): the ceiling of the usage
//!   report path.
//! - `usage N`: gpux settlement's whole report path on one core (signature,
//!   hash chain, interval checks, metering) over N reports of one chain,
//!   under the legacy rule, under ZIP-215, and for reports the gateway
//!   verified; then ZIP-215 verification alone, single and batched.
//! - `verifier N`: the gateway's verifier pool (one thread) fed N reports
//!   by 200 tasks at once, as 200 reporting agents' connections, against
//!   the same tasks verifying each report on their own task (one worker).
//! - `fanout-bare SUBSCRIBERS SECONDS`: a bare WebSocket broadcast over
//!   loopback: one publisher, a tokio broadcast channel, one task per
//!   subscriber writing each frame (an encoded `book_update`, shared, not
//!   copied) with batched flushes, and as many reading clients in the same
//!   process decoding each frame, as exchange-load's subscribers do. The
//!   publisher is paced by the slowest reader (it stays at most 4 096
//!   frames ahead, sleeping a millisecond when it is), so nothing is skipped: the ceiling of delivered
//!   market-data frames per second on this machine.
//! - `raft NODES SECONDS`: the replicated market (gpux-replica) with NODES
//!   replicas in this process over loopback TCP, each with its redb log
//!   (fsync per append) and market: batches of 64 journal entries
//!   (deposits) written through the leader by 1 and by 8 concurrent
//!   writers, each write waiting for its commit on a majority and its
//!   apply on the leader. Run with 1 and with 3 nodes for the ratio.

use std::collections::{HashMap, VecDeque};
use std::time::{Duration, Instant};

use ed25519_dalek::{Signer, SigningKey, Verifier};
use gpux_benches::Rng;
use gpux_engine::{AccountId, LeaseId};
use gpux_protocol::{genesis_hash, UsageBody, UsageReport};

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let number = |index: usize, default: u64| args.get(index).and_then(|v| v.parse().ok()).unwrap_or(default);
    match args.first().map(String::as_str) {
        Some("engine-bare") => engine_bare(number(1, 1_000_000) as usize),
        Some("redb-bare") => redb_bare(Duration::from_secs(number(1, 3))),
        Some("ed25519-bare") => ed25519_bare(number(1, 20_000) as usize),
        Some("usage") => usage(number(1, 20_000) as usize),
        Some("verifier") => verifier(number(1, 20_000) as usize),
        Some("fanout-bare") => fanout_bare(number(1, 200) as usize, Duration::from_secs(number(2, 5))),
        Some("raft") => raft(number(1, 3), Duration::from_secs(number(2, 3))),
        _ => {
            eprintln!(
                "usage: probes engine-bare N | redb-bare SECONDS | ed25519-bare N | usage N | verifier N | fanout-bare SUBSCRIBERS SECONDS | raft NODES SECONDS"
            );
            std::process::exit(2);
        }
    }
}

/// One side of a bare book: a FIFO of (order id, quantity) per tick.
struct Side {
    levels: Vec<VecDeque<(u64, u32)>>,
}

impl Side {
    fn new(ticks: usize) -> Side {
        Side { levels: (0..ticks).map(|_| VecDeque::new()).collect() }
    }
}

struct BareBook {
    bids: Side,
    asks: Side,
    /// Where each resting order is: side (true = bid) and tick.
    resting: HashMap<u64, (bool, usize)>,
}

impl BareBook {
    fn add(&mut self, id: u64, bid: bool, tick: usize, quantity: u32) {
        let side = if bid { &mut self.bids } else { &mut self.asks };
        side.levels[tick].push_back((id, quantity));
        self.resting.insert(id, (bid, tick));
    }

    fn cancel(&mut self, id: u64) -> bool {
        let Some((bid, tick)) = self.resting.remove(&id) else { return false };
        let side = if bid { &mut self.bids } else { &mut self.asks };
        let level = &mut side.levels[tick];
        if let Some(at) = level.iter().position(|(o, _)| *o == id) {
            level.remove(at);
        }
        true
    }

    /// An IOC order taking the best `orders` resting orders whole (their
    /// quantities) up to `limit`; the number of fills.
    fn cross(&mut self, bid: bool, limit: usize, orders: u32) -> u32 {
        let mut quantity = u32::MAX;
        let mut left = orders;
        let mut fills = 0;
        let ticks: Box<dyn Iterator<Item = usize>> =
            if bid { Box::new(0..=limit) } else { Box::new((limit..self.bids.levels.len()).rev()) };
        for tick in ticks {
            let level = if bid { &mut self.asks.levels[tick] } else { &mut self.bids.levels[tick] };
            while left > 0 {
                let Some(front) = level.front_mut() else { break };
                let taken = front.1.min(quantity);
                front.1 -= taken;
                quantity -= taken;
                fills += 1;
                if front.1 == 0 {
                    let (id, _) = level.pop_front().expect("a front");
                    self.resting.remove(&id);
                    left -= 1;
                }
            }
            if left == 0 {
                break;
            }
        }
        fills
    }
}

fn engine_bare(commands: usize) {
    const TICKS: usize = 200;
    const MID: usize = 100;
    let mut rng = Rng::new(7);
    let mut book = BareBook { bids: Side::new(TICKS), asks: Side::new(TICKS), resting: HashMap::new() };
    let mut open: Vec<u64> = Vec::new();
    let mut next_id = 1u64;
    // About 10k resting orders, bids below the mid and asks above.
    for _ in 0..10_000 {
        let bid = rng.below(2) == 0;
        let offset = 1 + rng.below(99) as usize;
        let tick = if bid { MID - offset } else { MID + offset };
        book.add(next_id, bid, tick, 1 + rng.below(4) as u32);
        open.push(next_id);
        next_id += 1;
    }
    // The stream is drawn ahead, so only the book is timed.
    enum Op {
        Add(bool, usize, u32),
        Cancel(usize),
        Cross(bool, usize, u32),
    }
    let ops: Vec<Op> = (0..commands)
        .map(|_| match rng.below(10) {
            0..=5 => {
                let bid = rng.below(2) == 0;
                let offset = 1 + rng.below(99) as usize;
                Op::Add(bid, if bid { MID - offset } else { MID + offset }, 1 + rng.below(4) as u32)
            }
            6..=8 => Op::Cancel(rng.below(u64::MAX) as usize),
            _ => {
                // Any price: it takes about three resting orders, as the
                // engine probe's crossing orders do.
                let bid = rng.below(2) == 0;
                Op::Cross(bid, if bid { TICKS - 1 } else { 0 }, 3)
            }
        })
        .collect();
    let started = Instant::now();
    let mut fills = 0u64;
    for op in &ops {
        match *op {
            Op::Add(bid, tick, quantity) => {
                book.add(next_id, bid, tick, quantity);
                open.push(next_id);
                next_id += 1;
            }
            Op::Cancel(mut pick) => {
                // Ids of orders a cross filled are stale: drop them and pick again.
                while !open.is_empty() {
                    let id = open.swap_remove(pick % open.len());
                    if book.cancel(id) {
                        break;
                    }
                    pick = pick.wrapping_mul(6364136223846793005).wrapping_add(1);
                }
            }
            Op::Cross(bid, limit, quantity) => fills += book.cross(bid, limit, quantity) as u64,
        }
    }
    let elapsed = started.elapsed();
    println!(
        "bare book: {:.2} M commands/s ({commands} commands, {fills} fills, {} resting at the end)",
        commands as f64 / elapsed.as_secs_f64() / 1e6,
        book.resting.len()
    );
}

fn redb_bare(duration: Duration) {
    const TABLE: redb::TableDefinition<u64, &[u8]> = redb::TableDefinition::new("records");
    let dir = tempfile::tempdir().expect("temp dir");
    let db = redb::Database::create(dir.path().join("bare.redb")).expect("redb file");
    let record = [7u8; 128];
    let started = Instant::now();
    let (mut key, mut commits) = (0u64, 0u64);
    while started.elapsed() < duration {
        let mut transaction = db.begin_write().expect("write");
        transaction.set_durability(redb::Durability::Immediate).expect("durability");
        {
            let mut table = transaction.open_table(TABLE).expect("table");
            for _ in 0..200 {
                table.insert(key, record.as_slice()).expect("insert");
                key += 1;
            }
        }
        transaction.commit().expect("commit");
        commits += 1;
    }
    let seconds = started.elapsed().as_secs_f64();
    println!("bare redb: {:.0} records/s at 200 per fsynced commit ({:.0} commits/s)", key as f64 / seconds, commits as f64 / seconds);
}

fn ed25519_bare(count: usize) {
    let key = SigningKey::from_bytes(&[9; 32]);
    let public = key.verifying_key();
    let messages: Vec<Vec<u8>> =
        (0..count).map(|i| format!("report {i} of a usage chain, about a hundred bytes long ...").into_bytes()).collect();
    let signatures: Vec<ed25519_dalek::Signature> = messages.iter().map(|m| key.sign(m)).collect();
    let started = Instant::now();
    // `verify`, the check settlement makes (docs/PERFORMANCE.md "Settlement").
    let valid = messages.iter().zip(&signatures).filter(|(m, s)| public.verify(m, s).is_ok()).count();
    let single = count as f64 / started.elapsed().as_secs_f64();
    assert_eq!(valid, count);
    let started = Instant::now();
    for (messages, signatures) in messages.chunks(64).zip(signatures.chunks(64)) {
        let messages: Vec<&[u8]> = messages.iter().map(Vec::as_slice).collect();
        let keys = vec![public; messages.len()];
        ed25519_dalek::verify_batch(&messages, signatures, &keys).expect("valid batch");
    }
    let batched = count as f64 / started.elapsed().as_secs_f64();
    println!("bare ed25519: {single:.0} verifications/s one at a time, {batched:.0}/s in batches of 64 (one core)");
}

/// `count` reports of one chain, signed by `key`.
fn signed_reports(key: &SigningKey, count: usize) -> Vec<UsageReport> {
    let mut reports: Vec<UsageReport> = Vec::with_capacity(count);
    for index in 0..count as u64 {
        let prev_hash = reports.last().map_or_else(genesis_hash, |r| r.hash());
        let body = UsageBody {
            lease: LeaseId(1),
            gpu_uuid: "GPU-a".into(),
            seq: index as u32 + 1,
            start_ms: 1_000_000 + index * 10_000,
            end_ms: 1_000_000 + (index + 1) * 10_000,
            available_ms: 10_000,
            utilisation_percent: 80,
            memory_used_mib_max: 1_000,
            unhealthy_samples: 0,
            prev_hash,
            readings: None,
        };
        reports.push(UsageReport::sign(body, key));
    }
    reports
}

fn usage(count: usize) {
    let key = SigningKey::from_bytes(&[9; 32]);
    let public = key.verifying_key().to_bytes();
    let reports = signed_reports(&key, count);
    let terms = gpux_settlement::LeaseTerms {
        lease: LeaseId(1),
        supplier: AccountId(1),
        gpu_uuids: vec!["GPU-a".into()],
        start_ms: 1_000_000,
        end_ms: None,
        price_minor_per_gpu_hour: 2_000_000,
        billing_closed: false,
    };
    use gpux_settlement::SignatureRule;
    // The sequencer's cost per report under each rule: verifying it there
    // (legacy, or ZIP-215), or only checking the chain and metering a report
    // the gateway verified (ZIP-215, marked).
    let mut rates = Vec::new();
    for (rule, marked) in [(SignatureRule::Legacy, false), (SignatureRule::Zip215, false), (SignatureRule::Zip215, true)] {
        let mut settlement = gpux_settlement::Settlement::default();
        settlement.set_signature_rule(rule);
        let started = Instant::now();
        for report in &reports {
            if marked {
                settlement.mark_checked(public, report);
            }
            settlement.report(AccountId(1), &public, Some(&terms), report, u64::MAX / 2).expect("an honest report");
        }
        rates.push(count as f64 / started.elapsed().as_secs_f64());
    }
    println!(
        "gpux usage reports per second on the sequencer's core: {:.0} verifying (legacy), {:.0} verifying (ZIP-215), {:.0} verified by the gateway ({count} reports)",
        rates[0], rates[1], rates[2]
    );
    // The gateway's side: ZIP-215 verification one at a time, and what
    // batches of 64 would give.
    let started = Instant::now();
    assert!(reports.iter().all(|r| r.verify_zip215(&public)));
    let single = count as f64 / started.elapsed().as_secs_f64();
    let started = Instant::now();
    for chunk in reports.chunks(64) {
        let batch: Vec<(&UsageReport, [u8; 32])> = chunk.iter().map(|r| (r, public)).collect();
        assert!(gpux_protocol::verify_batch_zip215(&batch));
    }
    let batched = count as f64 / started.elapsed().as_secs_f64();
    println!("ZIP-215 verification (ed25519-zebra, one core): {single:.0}/s one at a time, {batched:.0}/s in batches of 64");
}

fn verifier(count: usize) {
    const TASKS: usize = 200;
    let key = SigningKey::from_bytes(&[9; 32]);
    let public = key.verifying_key().to_bytes();
    let reports = signed_reports(&key, count);
    let chunks: Vec<Vec<UsageReport>> = reports.chunks(count.div_ceil(TASKS)).map(<[UsageReport]>::to_vec).collect();
    // The connections' tasks on one worker thread, as the gateway's runtime.
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
    let inline = runtime.block_on(async {
        let started = Instant::now();
        let tasks: Vec<_> = chunks
            .clone()
            .into_iter()
            .map(|chunk| tokio::spawn(async move { chunk.iter().filter(|r| r.verify_zip215(&public)).count() }))
            .collect();
        let mut verified = 0;
        for task in tasks {
            verified += task.await.expect("task");
        }
        assert_eq!(verified, count);
        count as f64 / started.elapsed().as_secs_f64()
    });
    let batches = prometheus::IntCounter::new("batches", "batches").expect("counter");
    let pool = gpux_gateway::verifier::Verifier::start(1, batches);
    let pooled = runtime.block_on(async {
        let started = Instant::now();
        let tasks: Vec<_> = chunks
            .into_iter()
            .map(|chunk| {
                let pool = pool.clone();
                tokio::spawn(async move {
                    let mut verified = 0;
                    for report in chunk {
                        verified += usize::from(pool.verify(report, public).await.1);
                    }
                    verified
                })
            })
            .collect();
        let mut verified = 0;
        for task in tasks {
            verified += task.await.expect("task");
        }
        assert_eq!(verified, count);
        count as f64 / started.elapsed().as_secs_f64()
    });
    println!(
        "gpux gateway usage verification, {TASKS} connections: {inline:.0} reports/s each on its own task (one core), {pooled:.0}/s through the verifier pool (one thread; mean batch {:.1})",
        count as f64 / pool.batches() as f64
    );
}

fn fanout_bare(subscribers: usize, duration: Duration) {
    use futures_util::{SinkExt, StreamExt};
    use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
    use std::sync::Arc;
    use tokio_tungstenite::tungstenite::{Bytes, Message};
    const AHEAD_MAX: u64 = 4_096;
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build().expect("runtime");
    let delivered = runtime.block_on(async move {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("address");
        let (feed, _) = tokio::sync::broadcast::channel::<Bytes>(8_192);
        let stop = Arc::new(AtomicBool::new(false));
        let counters: Vec<Arc<AtomicU64>> = (0..subscribers).map(|_| Arc::new(AtomicU64::new(0))).collect();
        let mut readers = Vec::new();
        for counter in &counters {
            let (counter, stop) = (counter.clone(), stop.clone());
            let client = tokio::spawn(tokio_tungstenite::connect_async(format!("ws://{addr}")));
            let (stream, _) = listener.accept().await.expect("accept");
            let _ = stream.set_nodelay(true);
            let server = tokio_tungstenite::accept_async(stream).await.expect("upgrade");
            let (mut socket, _) = client.await.expect("task").expect("connect");
            let mut updates = feed.subscribe();
            tokio::spawn(async move {
                let (mut sink, _) = server.split();
                while let Ok(frame) = updates.recv().await {
                    if sink.feed(Message::Binary(frame)).await.is_err() {
                        return;
                    }
                    // What else is ready goes in the same write.
                    for _ in 0..64 {
                        match updates.try_recv() {
                            Ok(frame) => {
                                if sink.feed(Message::Binary(frame)).await.is_err() {
                                    return;
                                }
                            }
                            Err(_) => break,
                        }
                    }
                    if sink.flush().await.is_err() {
                        return;
                    }
                }
            });
            readers.push(tokio::spawn(async move {
                while let Some(Ok(frame)) = socket.next().await {
                    if let Message::Binary(bytes) = frame {
                        if let Ok(gpux_protocol::ServerMessage::BookUpdate { .. }) = gpux_protocol::decode_server_binary(&bytes) {
                            counter.fetch_add(1, Ordering::Relaxed);
                        }
                    }
                    if stop.load(Ordering::Relaxed) {
                        return;
                    }
                }
            }));
        }
        let started = Instant::now();
        let mut published = 0u64;
        while started.elapsed() < duration {
            let slowest = counters.iter().map(|c| c.load(Ordering::Relaxed)).min().unwrap_or(0);
            if published - slowest >= AHEAD_MAX {
                // Far enough ahead (about 0.1 s of every reader's frames):
                // sleep rather than spin, so the publisher takes no core.
                tokio::time::sleep(Duration::from_millis(1)).await;
                continue;
            }
            for _ in 0..64 {
                published += 1;
                let update = gpux_protocol::ServerMessage::BookUpdate {
                    instrument: gpux_engine::InstrumentId(0),
                    seq: published,
                    side: gpux_engine::Side::Buy,
                    price_minor_per_gpu_hour: 2_000_000 + published % 100,
                    quantity: published % 7,
                };
                let _ = feed.send(Bytes::from(gpux_protocol::encode_server_binary(&update)));
            }
        }
        let seconds = started.elapsed().as_secs_f64();
        let delivered: u64 = counters.iter().map(|c| c.load(Ordering::Relaxed)).sum();
        stop.store(true, Ordering::Relaxed);
        drop(feed);
        delivered as f64 / seconds
    });
    runtime.shutdown_background();
    println!(
        "bare fan-out: {delivered:.0} frames/s delivered in all to {subscribers} WebSocket subscribers ({:.0}/s each; publisher paced, none skipped)",
        delivered / subscribers as f64
    );
}

/// See the module's `raft`.
fn raft(nodes: u64, duration: Duration) {
    use gpux_engine::{Command, EngineConfig, Input, Role};
    use gpux_market::JournalEntry;
    use gpux_replica::{log_store::LogStore, network, state_machine::MarketMachine, Batch};
    use std::sync::Arc;

    const ENTRIES: usize = 64;
    let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().expect("runtime");
    runtime.block_on(async move {
        let dir = tempfile::tempdir().expect("temp dir");
        let secret: Arc<[u8]> = Arc::from(&b"probe"[..]);
        let config = Arc::new(
            openraft::Config { heartbeat_interval: 100, election_timeout_min: 500, election_timeout_max: 1_000, ..Default::default() }
                .validate()
                .expect("valid"),
        );
        let mut members = std::collections::BTreeMap::new();
        let mut listeners = Vec::new();
        for id in 1..=nodes {
            let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("binds");
            members.insert(id, openraft::BasicNode::new(listener.local_addr().expect("addr").to_string()));
            listeners.push((id, listener));
        }
        let mut rafts = Vec::new();
        for (id, listener) in listeners {
            let log = LogStore::open(&dir.path().join(format!("{id}-log.redb"))).expect("log");
            let machine = MarketMachine::open(&dir.path().join(format!("{id}-sm.redb")), EngineConfig::demo()).expect("machine");
            let raft = gpux_replica::Raft::new(id, config.clone(), network::TcpNetwork::new(&secret, id), log, machine).await.expect("raft");
            tokio::spawn(network::serve(listener, raft.clone(), secret.clone(), Default::default()));
            rafts.push(raft);
        }
        rafts[0].initialize(members).await.expect("initialized");
        let leader = loop {
            if let Some(raft) = rafts.iter().find(|r| r.metrics().borrow().state.is_leader()) {
                break raft.clone();
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        };
        let open = Batch { entries: vec![JournalEntry::Engine(Input { at_ms: 1, command: Command::OpenAccount { role: Role::Renter } })] };
        leader.client_write(open).await.expect("committed");
        let deposits = Batch {
            entries: (0..ENTRIES)
                .map(|_| JournalEntry::Engine(Input {
                    at_ms: 2,
                    command: Command::Deposit { account: gpux_engine::AccountId(0), amount_minor: 1 },
                }))
                .collect(),
        };
        for writers in [1usize, 8] {
            let deadline = Instant::now() + duration;
            let mut tasks = Vec::new();
            for _ in 0..writers {
                let (leader, batch) = (leader.clone(), deposits.clone());
                tasks.push(tokio::spawn(async move {
                    let mut latencies = Vec::new();
                    while Instant::now() < deadline {
                        let started = Instant::now();
                        leader.client_write(batch.clone()).await.expect("committed");
                        latencies.push(started.elapsed());
                    }
                    latencies
                }));
            }
            let started = Instant::now();
            let mut latencies = Vec::new();
            for task in tasks {
                latencies.extend(task.await.expect("writer"));
            }
            let seconds = started.elapsed().as_secs_f64();
            latencies.sort();
            let p99 = latencies[(latencies.len() * 99 / 100).min(latencies.len() - 1)];
            println!(
                "replicated market, {nodes} node(s) over loopback TCP, {writers} writer(s): {:.0} batches/s = {:.0} journal entries/s committed and applied, p50 {:.2} ms, p99 {:.2} ms per batch",
                latencies.len() as f64 / seconds,
                (latencies.len() * ENTRIES) as f64 / seconds,
                latencies[latencies.len() / 2].as_secs_f64() * 1e3,
                p99.as_secs_f64() * 1e3
            );
        }
        for raft in rafts {
            let _ = raft.shutdown().await;
        }
    });
}
