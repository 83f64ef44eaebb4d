//! The sequencer: one thread that owns the engine, the journal and the
//! subscription registry, and is the only writer of market state.
//!
//! It takes requests in batches (everything that queued while the previous
//! batch was being committed), stamps engine commands with the exchange
//! clock, applies them to the engine, appends the batch to the journal in one
//! durable commit, and only then releases what the batch produced: acks,
//! rejects, private events, market data and snapshots. Nothing leaves the
//! process before the inputs behind it are on disk. A journal error is fatal:
//! the process stops and the next start replays the journal.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use crossbeam_channel::{Receiver, RecvTimeoutError};
use gpux_engine::{AccountId, Command, Engine, Event, EventKind, Input, InstrumentId, LeaseId, Role};
use gpux_protocol::{encode_server_binary, encode_server_text, Channel, DeliveryState, ErrorCode, ServerMessage};
use tokio::sync::{broadcast, mpsc, Notify};

use crate::delivery::{Deliveries, HostEncryptionKey};
use crate::journal::{Journal, JournalEntry};
use crate::metrics::Metrics;
use crate::snapshots::{Snapshot, SnapshotStore, SnapshotWriter, SNAPSHOT_EVERY_ENTRIES};
use crate::stats::RollingStats;

/// Requests handled in one batch at most (one journal commit).
pub const BATCH_MAX: usize = 4096;
/// Subscriptions one connection may hold.
pub const SUBSCRIPTIONS_PER_CONNECTION_MAX: usize = 64;

pub type ConnectionId = u64;

/// A server message encoded at most once per format and shared by every
/// connection it goes to.
pub struct SharedFrame {
    message: ServerMessage,
    text: OnceLock<String>,
    binary: OnceLock<Vec<u8>>,
}

impl SharedFrame {
    pub fn new(message: ServerMessage) -> Arc<Self> {
        Arc::new(SharedFrame { message, text: OnceLock::new(), binary: OnceLock::new() })
    }
    pub fn text(&self) -> &str {
        self.text.get_or_init(|| encode_server_text(&self.message))
    }
    pub fn binary(&self) -> &[u8] {
        self.binary.get_or_init(|| encode_server_binary(&self.message))
    }
    pub fn message(&self) -> &ServerMessage {
        &self.message
    }
}

/// What the sequencer sends one connection: its own frames (answers,
/// private events, snapshots), and the start and end of the market-data
/// feeds it subscribed to. Market data itself is published once per feed on
/// a broadcast channel that every subscriber reads on its own task, so the
/// sequencer's cost does not grow with the number of subscribers.
pub enum Outgoing {
    Frame(Arc<SharedFrame>),
    FeedStart { channel: Channel, instrument: InstrumentId, feed: broadcast::Receiver<Arc<SharedFrame>> },
    FeedEnd { channel: Channel, instrument: InstrumentId },
}

/// Where the sequencer sends a connection's frames, and how it tells a
/// connection that fell behind to close.
#[derive(Clone)]
pub struct Outbound {
    pub frames: mpsc::Sender<Outgoing>,
    pub too_slow: Arc<Notify>,
}

/// Frames one market-data feed buffers (default, `--feed-frames-max`); a
/// subscriber further behind loses its place and is resynchronised: a fresh
/// book snapshot, then the feed from there (`Request::Resync`).
pub const FEED_FRAMES_MAX: usize = 16_384;

pub enum Request {
    Connect {
        connection: ConnectionId,
        outbound: Outbound,
    },
    /// The gateway verified the signature; bind or look up the key.
    Authenticate {
        connection: ConnectionId,
        id: u64,
        public_key: [u8; 32],
        role: Option<Role>,
        cancel_on_disconnect: bool,
    },
    Command {
        connection: ConnectionId,
        id: u64,
        command: Command,
    },
    Subscribe {
        connection: ConnectionId,
        id: u64,
        channel: Channel,
        instrument: InstrumentId,
    },
    Unsubscribe {
        connection: ConnectionId,
        id: u64,
        channel: Channel,
        instrument: InstrumentId,
    },
    Instruments {
        connection: ConnectionId,
        id: u64,
    },
    OpenOrders {
        connection: ConnectionId,
        id: u64,
        offset: u32,
    },
    Leases {
        connection: ConnectionId,
        id: u64,
        offset: u32,
    },
    Stats {
        connection: ConnectionId,
        id: u64,
        instrument: InstrumentId,
    },
    Usage {
        connection: ConnectionId,
        id: u64,
        report: Box<gpux_protocol::UsageReport>,
    },
    Balance {
        connection: ConnectionId,
        id: u64,
    },
    Statement {
        connection: ConnectionId,
        id: u64,
        after: Option<u64>,
    },
    MyGpus {
        connection: ConnectionId,
        id: u64,
        offset: u32,
    },
    Disconnect {
        connection: ConnectionId,
    },
    /// The connection fell more than the feed's buffer behind one of its
    /// feeds and dropped it: send a fresh book snapshot (the conflated book)
    /// and restart the feed from now.
    Resync {
        connection: ConnectionId,
        channel: Channel,
        instrument: InstrumentId,
    },
    /// A bid with a workload for the leases it fills (validated by the gateway).
    Bid {
        connection: ConnectionId,
        id: u64,
        command: Command,
        workload: Box<gpux_protocol::Workload>,
    },
    /// Lease delivery: workloads, host keys, statuses, logs.
    Delivery {
        connection: ConnectionId,
        id: u64,
        request: DeliveryRequest,
    },
}

/// The delivery requests (docs/protocol.md "Lease delivery").
pub enum DeliveryRequest {
    SetWorkload { lease: LeaseId, workload: Box<gpux_protocol::Workload> },
    SetEncryptionKey { key: [u8; 32], signature: String },
    HostKey { lease: LeaseId },
    Status { lease: LeaseId, state: DeliveryState },
    Query { lease: LeaseId },
    Logs { lease: LeaseId, tail_bytes: u32 },
    LogsReply { request: u64, data: String, truncated: bool },
}

/// A renter's `lease_logs` request waiting for its host's answer.
struct LogsWait {
    connection: ConnectionId,
    id: u64,
    lease: LeaseId,
    deadline_ms: u64,
}

/// How long a renter's `lease_logs` waits for the host.
pub const LOGS_WAIT_MS: u64 = 10_000;
/// `lease_logs` requests waiting at once, exchange-wide (one per connection).
pub const LOGS_PENDING_MAX: usize = 1024;

struct Connection {
    outbound: Outbound,
    account: Option<AccountId>,
    subscriptions: BTreeSet<(Channel, InstrumentId)>,
    /// Cancel the account's orders when its last session ends.
    cancel_on_disconnect: bool,
}

pub struct Sequencer {
    engine: Engine,
    journal: Journal,
    clock_ms: u64,
    keys: HashMap<[u8; 32], AccountId>,
    /// Each account's public key (the host key, for a supplier).
    account_keys: HashMap<AccountId, [u8; 32]>,
    settlement: gpux_settlement::Settlement,
    ledger: gpux_settlement::ledger::Ledger,
    /// Transfers of the current batch, committed with its journal entries.
    transfers: Vec<gpux_settlement::ledger::Transfer>,
    operator_keys: BTreeSet<[u8; 32]>,
    connections: BTreeMap<ConnectionId, Connection>,
    connections_of: HashMap<AccountId, BTreeSet<ConnectionId>>,
    /// Market-data feeds with at least one subscription so far.
    feeds: HashMap<(Channel, InstrumentId), broadcast::Sender<Arc<SharedFrame>>>,
    /// Frames each feed buffers for its slowest subscriber.
    feed_frames_max: usize,
    book_seq: HashMap<InstrumentId, u64>,
    trade_seq: HashMap<InstrumentId, u64>,
    stats: RollingStats,
    /// Inputs of the current batch, journaled before anything below is sent.
    entries: Vec<JournalEntry>,
    /// What the batch produced, in release order.
    pending: Vec<(Target, Pending)>,
    metrics: Arc<Metrics>,
    depth_refreshed_ms: u64,
    snapshots: SnapshotWriter,
    /// The journal entry the newest snapshot taken includes (handed to the
    /// writer; durable shortly after).
    snapshot_seq: u64,
    deliveries: Deliveries,
    logs_pending: BTreeMap<u64, LogsWait>,
    next_logs_request: u64,
}

enum Target {
    Connection(ConnectionId),
    Account(AccountId),
    Feed(Channel, InstrumentId),
}

enum Pending {
    Frame(Arc<SharedFrame>),
    Control(Outgoing),
}

/// The operator's billing settings (flags); applied as journaled commands
/// when they differ from the engine's.
#[derive(Clone, Copy, Debug)]
pub struct BillingPolicy {
    pub fee_bps: u32,
    pub grace_ms: u64,
}

/// What a recovered exchange looks like, for the operator's log and tests.
pub struct Recovery {
    /// The journal entry the snapshot used includes (0: none).
    pub snapshot_seq: u64,
    /// Journal entries replayed after the snapshot.
    pub entries: u64,
    pub state_hash: u64,
}

impl Sequencer {
    /// Rebuilds the engine, key bindings and market-data counters from the
    /// newest valid snapshot and the journal entries after it.
    pub fn recover(
        engine: Engine,
        journal: Journal,
        snapshots: SnapshotStore,
        operator_keys: BTreeSet<[u8; 32]>,
        metrics: Arc<Metrics>,
        billing: BillingPolicy,
    ) -> anyhow::Result<(Self, Recovery)> {
        let snapshot = snapshots.latest_valid()?;
        anyhow::ensure!(
            snapshot.as_ref().is_none_or(|s| s.journal_seq < journal.next_seq()),
            "the newest snapshot is ahead of the journal: the journal file does not belong to these snapshots"
        );
        let snapshot_seq = snapshot.as_ref().map_or(0, |s| s.journal_seq);
        let entries = journal.entries_after(snapshot_seq)?;
        let mut sequencer = Sequencer {
            engine,
            journal,
            clock_ms: 0,
            keys: HashMap::new(),
            account_keys: HashMap::new(),
            settlement: gpux_settlement::Settlement::default(),
            ledger: gpux_settlement::ledger::Ledger::new(),
            transfers: Vec::new(),
            operator_keys,
            connections: BTreeMap::new(),
            connections_of: HashMap::new(),
            feeds: HashMap::new(),
            feed_frames_max: FEED_FRAMES_MAX,
            book_seq: HashMap::new(),
            trade_seq: HashMap::new(),
            stats: RollingStats::default(),
            entries: Vec::new(),
            pending: Vec::new(),
            metrics,
            depth_refreshed_ms: 0,
            snapshots: SnapshotWriter::spawn(snapshots)?,
            snapshot_seq,
            deliveries: Deliveries::default(),
            logs_pending: BTreeMap::new(),
            next_logs_request: 1,
        };
        if let Some(snapshot) = snapshot {
            sequencer.engine = snapshot.engine;
            sequencer.clock_ms = snapshot.clock_ms;
            sequencer.keys = snapshot.keys.into_iter().collect();
            sequencer.account_keys = sequencer.keys.iter().map(|(key, account)| (*account, *key)).collect();
            sequencer.settlement = snapshot.settlement;
            sequencer.ledger = snapshot.ledger;
            sequencer.book_seq = snapshot.book_seq.into_iter().collect();
            sequencer.trade_seq = snapshot.trade_seq.into_iter().collect();
            sequencer.stats = snapshot.stats;
            sequencer.deliveries = snapshot.deliveries;
        }
        let count = entries.len() as u64;
        for entry in entries {
            match entry {
                JournalEntry::Engine(input) => {
                    sequencer.clock_ms = sequencer.clock_ms.max(input.at_ms);
                    let events = sequencer.engine.apply(&input).to_vec();
                    sequencer.count_market_data(&events);
                    sequencer.post(&events);
                    sequencer.deliveries.observe(&events);
                }
                JournalEntry::BidWorkload { account, client_order_id, workload } => {
                    sequencer.deliveries.bid_workload(account, client_order_id, workload)
                }
                JournalEntry::LeaseWorkload { account: _, lease, workload } => {
                    let supplier = sequencer.engine.lease(lease).map(|l| l.supplier);
                    if let Some(supplier) = supplier {
                        sequencer.deliveries.set_lease_workload(lease, supplier, workload);
                    }
                }
                JournalEntry::EncryptionKey { account, key, signature } => {
                    sequencer.deliveries.set_encryption_key(account, HostEncryptionKey { key, signature })
                }
                JournalEntry::DeliveryStatus { at_ms, account, lease, state } => {
                    sequencer.clock_ms = sequencer.clock_ms.max(at_ms);
                    sequencer.deliveries.record_status(lease, account, state, at_ms);
                }
                JournalEntry::BindKey { public_key, account } => {
                    sequencer.keys.insert(public_key, account);
                    sequencer.account_keys.insert(account, public_key);
                }
                JournalEntry::UsageReport { at_ms, account, report } => {
                    sequencer.clock_ms = sequencer.clock_ms.max(at_ms);
                    // Its answer went out when it arrived; replay only re-derives the state.
                    let _outcome = sequencer.settle(at_ms, account, &report);
                }
            }
        }
        // Replayed transfers are on disk already; nothing was released either.
        sequencer.transfers.clear();
        sequencer.pending.clear();
        // The fee and the billing grace are engine state, changed only by
        // journaled commands, so a replay from any point reaches the same
        // charges whatever the flags say then.
        sequencer.clock_ms = sequencer.clock_ms.max(wall_clock_ms());
        if sequencer.engine.config().fee_bps != billing.fee_bps {
            sequencer.apply_command(None, 0, Command::SetFee { fee_bps: billing.fee_bps });
        }
        if sequencer.engine.config().billing_grace_ms != billing.grace_ms {
            sequencer.apply_command(None, 0, Command::SetBillingGrace { grace_ms: billing.grace_ms });
        }
        let state_hash = sequencer.engine.state_hash();
        Ok((sequencer, Recovery { snapshot_seq, entries: count, state_hash }))
    }

    /// A copy of everything committed so far, or none if the newest
    /// snapshot taken already has it.
    fn take_snapshot(&self) -> Option<Snapshot> {
        let journal_seq = self.journal.next_seq() - 1;
        if journal_seq == self.snapshot_seq {
            return None;
        }
        Some(Snapshot {
            journal_seq,
            clock_ms: self.clock_ms,
            engine: self.engine.clone(),
            keys: self.keys.iter().map(|(key, account)| (*key, *account)).collect(),
            book_seq: self.book_seq.iter().map(|(i, s)| (*i, *s)).collect(),
            trade_seq: self.trade_seq.iter().map(|(i, s)| (*i, *s)).collect(),
            stats: self.stats.clone(),
            settlement: self.settlement.clone(),
            ledger: self.ledger.clone(),
            deliveries: self.deliveries.clone(),
            state_hash: self.engine.state_hash(),
        })
    }

    /// Offers a snapshot to the writer thread: the sequencer copies its
    /// state and goes on; encoding and the fsync happen on that thread.
    fn snapshot(&mut self) {
        let engine = &self.engine;
        self.settlement.forget_closed(|lease| engine.lease(lease).is_none_or(|l| l.billing_closed));
        if let Some(snapshot) = self.take_snapshot() {
            let journal_seq = snapshot.journal_seq;
            if self.snapshots.offer(snapshot) {
                self.snapshot_seq = journal_seq;
            }
        }
    }

    pub fn state_hash(&self) -> u64 {
        self.engine.state_hash()
    }

    /// Serves requests until every sender is gone (the gateway shut down),
    /// committing what is in flight before returning.
    pub fn run(mut self, requests: Receiver<Request>) -> u64 {
        loop {
            let wait = self.time_until_due();
            let mut batch = Vec::new();
            match requests.recv_timeout(wait) {
                Ok(request) => batch.push(request),
                Err(RecvTimeoutError::Timeout) => {}
                Err(RecvTimeoutError::Disconnected) => break,
            }
            while batch.len() < BATCH_MAX {
                match requests.try_recv() {
                    Ok(request) => batch.push(request),
                    Err(_) => break,
                }
            }
            self.process(batch);
            if self.journal.next_seq() > self.snapshot_seq + SNAPSHOT_EVERY_ENTRIES {
                self.snapshot();
            }
        }
        // A clean stop leaves a snapshot of everything, durable before it returns.
        let engine = &self.engine;
        self.settlement.forget_closed(|lease| engine.lease(lease).is_none_or(|l| l.billing_closed));
        let last = self.take_snapshot();
        self.snapshots.finish(last);
        self.engine.state_hash()
    }

    fn time_until_due(&self) -> Duration {
        let due = self.engine.next_due_ms();
        let now = wall_clock_ms();
        Duration::from_millis(due.saturating_sub(now).clamp(1, 1_000))
    }

    fn process(&mut self, batch: Vec<Request>) {
        self.clock_ms = self.clock_ms.max(wall_clock_ms());
        if self.engine.next_due_ms() <= self.clock_ms {
            self.apply_command(None, 0, Command::Tick);
        }
        for request in batch {
            self.handle(request);
        }
        self.expire_logs_requests();
        if !self.entries.is_empty() {
            let started = std::time::Instant::now();
            if let Err(error) = self.journal.append_with_transfers(&self.entries, &self.transfers) {
                // Acknowledged means durable: without the journal nothing may be
                // acknowledged, and the in-memory state is ahead of the disk.
                tracing::error!(%error, "journal append failed; stopping so a restart replays the journal");
                std::process::exit(70);
            }
            self.metrics.observe_commit(started.elapsed());
            self.metrics.journal_entries.inc_by(self.entries.len() as u64);
            self.entries.clear();
            self.transfers.clear();
        }
        self.release();
        self.refresh_depth();
    }

    /// Rewrites the book-depth gauges, at most once a second.
    fn refresh_depth(&mut self) {
        if self.clock_ms < self.depth_refreshed_ms + 1_000 {
            return;
        }
        self.depth_refreshed_ms = self.clock_ms;
        // Expired windows drop out of the gauges.
        self.metrics.book_quantity.reset();
        for instrument in self.engine.instruments() {
            if instrument.state == gpux_engine::InstrumentState::Expired {
                continue;
            }
            for (side, name) in [(gpux_engine::Side::Buy, "bid"), (gpux_engine::Side::Sell, "ask")] {
                let quantity: u64 = self.engine.depth(instrument.instrument, side).iter().map(|(_, q)| q).sum();
                self.metrics.book_quantity.with_label_values(&[instrument.symbol.as_str(), name]).set(quantity as i64);
            }
        }
    }

    fn handle(&mut self, request: Request) {
        match request {
            Request::Connect { connection, outbound } => {
                self.connections.insert(
                    connection,
                    Connection { outbound, account: None, subscriptions: BTreeSet::new(), cancel_on_disconnect: false },
                );
            }
            Request::Authenticate { connection, id, public_key, role, cancel_on_disconnect } => {
                self.authenticate(connection, id, public_key, role, cancel_on_disconnect)
            }
            Request::Command { connection, id, command } => self.apply_command(Some(connection), id, command),
            Request::Subscribe { connection, id, channel, instrument } => self.subscribe(connection, id, channel, instrument),
            Request::Resync { connection, channel, instrument } => self.resync(connection, channel, instrument),
            Request::Unsubscribe { connection, id, channel, instrument } => {
                let removed = self.connections.get_mut(&connection).is_some_and(|c| c.subscriptions.remove(&(channel, instrument)));
                if removed {
                    self.reply(connection, ServerMessage::Unsubscribed { id, channel, instrument });
                    self.pending.push((Target::Connection(connection), Pending::Control(Outgoing::FeedEnd { channel, instrument })));
                } else {
                    self.reply(connection, error(Some(id), ErrorCode::NotSubscribed));
                }
            }
            Request::Instruments { connection, id } => {
                let instruments = self.engine.instruments();
                self.reply(connection, ServerMessage::Instruments { id, instruments });
            }
            Request::OpenOrders { connection, id, offset } => {
                let account = self.connections.get(&connection).and_then(|c| c.account);
                let all = account.map(|a| self.engine.open_orders(a)).unwrap_or_default();
                let start = (offset as usize).min(all.len());
                let end = (start + gpux_protocol::ORDERS_PAGE_MAX).min(all.len());
                let mut orders = all[start..end].to_vec();
                // A page also fits a frame: fewer items when they are big.
                gpux_protocol::fit_page(&mut orders);
                let end = start + orders.len();
                let next_offset = (end < all.len()).then_some(end as u32);
                self.reply(connection, ServerMessage::Orders { id, orders, next_offset });
            }
            Request::Leases { connection, id, offset } => {
                let account = self.connections.get(&connection).and_then(|c| c.account);
                let (mut leases, mut next_offset) =
                    account.map(|a| self.engine.leases_of(a, offset as usize, gpux_protocol::ORDERS_PAGE_MAX)).unwrap_or_default();
                if gpux_protocol::fit_page(&mut leases) {
                    next_offset = Some(offset as usize + leases.len());
                }
                self.reply(connection, ServerMessage::Leases { id, leases, next_offset: next_offset.map(|n| n as u32) });
            }
            Request::Stats { connection, id, instrument } => {
                let reply = if self.engine.instrument(instrument).is_some() {
                    let day = self.stats.day(instrument, self.clock_ms);
                    ServerMessage::Stats {
                        id,
                        instrument,
                        window_start_ms: day.window_start_ms,
                        open: day.open,
                        high: day.high,
                        low: day.low,
                        last: day.last,
                        volume: day.volume,
                        trades: day.trades,
                    }
                } else {
                    error(Some(id), ErrorCode::UnknownInstrument)
                };
                self.reply(connection, reply);
            }
            Request::MyGpus { connection, id, offset } => {
                let account = self.connections.get(&connection).and_then(|c| c.account);
                let all = account.map(|a| self.engine.gpus_of(a)).unwrap_or_default();
                let start = (offset as usize).min(all.len());
                let mut gpus: Vec<_> = all[start..].iter().take(gpux_protocol::ORDERS_PAGE_MAX).cloned().collect();
                gpux_protocol::fit_page(&mut gpus);
                let end = start + gpus.len();
                let next_offset = (end < all.len()).then_some(end as u32);
                self.reply(connection, ServerMessage::Gpus { id, gpus, next_offset });
            }
            Request::Usage { connection, id, report } => self.usage(connection, id, *report),
            Request::Statement { connection, id, after } => {
                let account = self.connections.get(&connection).and_then(|c| c.account);
                let page = gpux_protocol::ORDERS_PAGE_MAX;
                let reply = match account.map(|a| self.journal.statement(a, after, page)) {
                    Some(Ok(transfers)) => {
                        let mut lines: Vec<gpux_protocol::StatementLine> = transfers.iter().map(|t| t.line()).collect();
                        let cut = gpux_protocol::fit_page(&mut lines);
                        let next_after = (cut || transfers.len() == page).then(|| lines.last().map(|l| l.transfer)).flatten();
                        ServerMessage::Statement { id, lines, next_after }
                    }
                    Some(Err(error)) => {
                        tracing::error!(%error, "reading a statement");
                        ServerMessage::Statement { id, lines: Vec::new(), next_after: None }
                    }
                    None => ServerMessage::Statement { id, lines: Vec::new(), next_after: None },
                };
                self.reply(connection, reply);
            }
            Request::Balance { connection, id } => {
                let account = self.connections.get(&connection).and_then(|c| c.account);
                let balances = account.and_then(|a| self.engine.balances(a)).unwrap_or_default();
                self.reply(
                    connection,
                    ServerMessage::Balance {
                        id,
                        available_minor: balances.available_minor,
                        held_minor: balances.held_minor,
                        payable_minor: balances.payable_minor,
                        debt_minor: balances.debt_minor,
                    },
                );
            }
            Request::Disconnect { connection } => self.disconnect(connection),
            Request::Bid { connection, id, command, workload } => self.bid(connection, id, command, workload),
            Request::Delivery { connection, id, request } => self.delivery(connection, id, request),
        }
    }

    fn authenticate(&mut self, connection: ConnectionId, id: u64, public_key: [u8; 32], role: Option<Role>, cancel_on_disconnect: bool) {
        let account = match (self.keys.get(&public_key).copied(), role) {
            (Some(account), _) => Some(account),
            (None, Some(Role::Operator)) if !self.operator_keys.contains(&public_key) => None,
            (None, None) if self.operator_keys.contains(&public_key) => self.open_account(public_key, Role::Operator),
            (None, Some(role)) => self.open_account(public_key, role),
            (None, None) => None,
        };
        let Some(account) = account else {
            let reason = if role == Some(Role::Operator) { "operator_key_unknown" } else { "no_account" };
            self.metrics.auth_failures.with_label_values(&[reason]).inc();
            self.reply(connection, error(Some(id), ErrorCode::AuthFailed));
            return;
        };
        let role = self.engine.role(account).expect("bound accounts exist");
        if let Some(state) = self.connections.get_mut(&connection) {
            state.account = Some(account);
            state.cancel_on_disconnect = cancel_on_disconnect;
            self.connections_of.entry(account).or_default().insert(connection);
        }
        self.reply(connection, ServerMessage::Authenticated { id, account, role });
    }

    fn open_account(&mut self, public_key: [u8; 32], role: Role) -> Option<AccountId> {
        let input = Input { at_ms: self.clock_ms, command: Command::OpenAccount { role } };
        let events = self.engine.apply(&input).to_vec();
        self.entries.push(JournalEntry::Engine(input));
        let account = events.iter().find_map(|e| match e.kind {
            EventKind::AccountOpened { account, .. } => Some(account),
            _ => None,
        });
        self.route(&events);
        let account = account?;
        self.keys.insert(public_key, account);
        self.account_keys.insert(account, public_key);
        self.entries.push(JournalEntry::BindKey { public_key, account });
        Some(account)
    }

    fn apply_command(&mut self, connection: Option<ConnectionId>, id: u64, command: Command) {
        self.metrics.commands.inc();
        if matches!(command, Command::PlaceOrder(_)) {
            self.metrics.orders.inc();
        }
        let input = Input { at_ms: self.clock_ms, command };
        let events = self.engine.apply(&input).to_vec();
        self.entries.push(JournalEntry::Engine(input));
        let journal_seq = self.journal.next_seq() + self.entries.len() as u64 - 1;
        self.route(&events);
        for assigned in self.deliveries.observe(&events) {
            let frame = SharedFrame::new(ServerMessage::Workload { lease: assigned.lease, workload: assigned.workload });
            self.pending.push((Target::Account(assigned.supplier), Pending::Frame(frame)));
        }
        let Some(connection) = connection else { return };
        let reply = match events.last().map(|e| e.kind) {
            Some(EventKind::Rejected { code, .. }) => ServerMessage::Reject { id, journal_seq, code, message: code.message().to_string() },
            _ => {
                let order = events.iter().find_map(|e| match e.kind {
                    EventKind::OrderAccepted { order, .. } => Some(order),
                    _ => None,
                });
                ServerMessage::Ack { id, journal_seq, order }
            }
        };
        self.reply(connection, reply);
    }

    /// A usage report from a supplier's connection: journaled whatever its
    /// fate, verified and metered by settlement, charged to the lease.
    fn usage(&mut self, connection: ConnectionId, id: u64, report: gpux_protocol::UsageReport) {
        let Some(account) = self.connections.get(&connection).and_then(|c| c.account) else { return };
        let at_ms = self.clock_ms;
        self.entries.push(JournalEntry::UsageReport { at_ms, account, report: report.clone() });
        let journal_seq = self.journal.next_seq() + self.entries.len() as u64 - 1;
        let reply = match self.settle(at_ms, account, &report) {
            Ok(gpux_settlement::UsageOutcome::Accepted { charge_minor, .. }) => {
                self.metrics.usage_accepted.inc();
                ServerMessage::UsageAccepted { id, journal_seq, duplicate: false, charged_minor: charge_minor }
            }
            Ok(gpux_settlement::UsageOutcome::Duplicate) => {
                self.metrics.usage_accepted.inc();
                ServerMessage::UsageAccepted { id, journal_seq, duplicate: true, charged_minor: 0 }
            }
            Err(code) => {
                self.metrics.usage_refused.with_label_values(&[&crate::metrics::label(&code)]).inc();
                ServerMessage::UsageRejected { id, journal_seq, code, message: code.message().to_string() }
            }
        };
        self.reply(connection, reply);
    }

    /// Verifies, meters and charges one report (live or replayed) and routes
    /// the charge's events.
    fn settle(
        &mut self,
        at_ms: u64,
        account: AccountId,
        report: &gpux_protocol::UsageReport,
    ) -> Result<gpux_settlement::UsageOutcome, gpux_protocol::UsageRejectCode> {
        let (outcome, events) = gpux_settlement::settle_report(
            &mut self.engine,
            &mut self.settlement,
            &self.account_keys.get(&account).copied().unwrap_or([0; 32]),
            at_ms,
            account,
            report,
        );
        self.route(&events);
        outcome
    }

    /// A bid carrying a workload: the workload is journaled right before the
    /// bid, and every lease the bid fills receives it.
    fn bid(&mut self, connection: ConnectionId, id: u64, command: Command, workload: Box<gpux_protocol::Workload>) {
        let Command::PlaceOrder(order) = &command else { return };
        if order.side != gpux_engine::Side::Buy {
            self.reply(connection, error(Some(id), ErrorCode::WorkloadNotOnBid));
            return;
        }
        self.entries.push(JournalEntry::BidWorkload {
            account: order.account,
            client_order_id: order.client_order_id,
            workload: workload.clone(),
        });
        self.deliveries.bid_workload(order.account, order.client_order_id, workload);
        self.apply_command(Some(connection), id, command);
    }

    fn delivery(&mut self, connection: ConnectionId, id: u64, request: DeliveryRequest) {
        let Some(account) = self.connections.get(&connection).and_then(|c| c.account) else { return };
        let reply = match request {
            DeliveryRequest::SetWorkload { lease, workload } => self.set_workload(account, id, lease, workload),
            DeliveryRequest::SetEncryptionKey { key, signature } => {
                let identity = self.account_keys.get(&account).copied().unwrap_or([0; 32]);
                if !gpux_protocol::delivery::encryption_key_certified(&key, &identity, &signature) {
                    error(Some(id), ErrorCode::EncryptionKeyInvalid)
                } else {
                    self.entries.push(JournalEntry::EncryptionKey { account, key, signature: signature.clone() });
                    self.deliveries.set_encryption_key(account, HostEncryptionKey { key, signature });
                    ServerMessage::Ack { id, journal_seq: self.last_entry_seq(), order: None }
                }
            }
            DeliveryRequest::HostKey { lease } => match self.engine.lease(lease).filter(|l| l.renter == account) {
                None => error(Some(id), ErrorCode::UnknownLease),
                Some(info) => match (self.deliveries.encryption_key(info.supplier), self.account_keys.get(&info.supplier)) {
                    (Some(key), Some(identity)) => ServerMessage::HostKey {
                        id,
                        lease,
                        encryption_key: hex::encode(key.key),
                        identity_key: hex::encode(identity),
                        signature: key.signature.clone(),
                    },
                    _ => error(Some(id), ErrorCode::NoEncryptionKey),
                },
            },
            DeliveryRequest::Status { lease, state } => self.delivery_status(account, id, lease, state),
            DeliveryRequest::Query { lease } => match self.engine.lease(lease).filter(|l| l.renter == account || l.supplier == account) {
                None => error(Some(id), ErrorCode::UnknownLease),
                Some(_) => {
                    let delivery = self.deliveries.lease(lease);
                    let (state, at_ms) = match delivery.and_then(|d| d.state.clone()) {
                        Some((state, at_ms)) => (Some(state), Some(at_ms)),
                        None => (None, None),
                    };
                    ServerMessage::LeaseDelivery { id, lease, workload: delivery.and_then(|d| d.workload.clone()), state, at_ms }
                }
            },
            DeliveryRequest::Logs { lease, tail_bytes } => match self.engine.lease(lease).filter(|l| l.renter == account) {
                None => error(Some(id), ErrorCode::UnknownLease),
                Some(info) => {
                    let host_connected = self.connections_of.get(&info.supplier).is_some_and(|c| !c.is_empty());
                    if !host_connected {
                        error(Some(id), ErrorCode::HostUnreachable)
                    } else if self.logs_pending.len() >= LOGS_PENDING_MAX || self.logs_pending.values().any(|w| w.connection == connection)
                    {
                        error(Some(id), ErrorCode::RateLimited)
                    } else {
                        let request = self.next_logs_request;
                        self.next_logs_request += 1;
                        let deadline_ms = self.clock_ms + LOGS_WAIT_MS;
                        self.logs_pending.insert(request, LogsWait { connection, id, lease, deadline_ms });
                        let tail_bytes = tail_bytes.min(gpux_protocol::delivery::limits::LOG_TAIL_BYTES_MAX);
                        let wanted = SharedFrame::new(ServerMessage::LogsWanted { request, lease, tail_bytes });
                        self.pending.push((Target::Account(info.supplier), Pending::Frame(wanted)));
                        return;
                    }
                }
            },
            DeliveryRequest::LogsReply { request, mut data, truncated } => {
                let supplier_of = |lease| self.engine.lease(lease).map(|l| l.supplier);
                match self.logs_pending.get(&request) {
                    Some(wait) if supplier_of(wait.lease) == Some(account) => {
                        let wait = self.logs_pending.remove(&request).expect("present");
                        let limit = gpux_protocol::delivery::limits::LOG_TAIL_BYTES_MAX as usize;
                        let cut = data.len() > limit;
                        if cut {
                            let mut start = data.len() - limit;
                            while !data.is_char_boundary(start) {
                                start += 1;
                            }
                            data = data.split_off(start);
                        }
                        let answer = ServerMessage::LeaseLogs { id: wait.id, lease: wait.lease, data, truncated: truncated || cut };
                        self.reply(wait.connection, answer);
                    }
                    // Late (the renter was told the host did not answer) or not this host's.
                    _ => {}
                }
                ServerMessage::Received { id }
            }
        };
        self.reply(connection, reply);
    }

    fn set_workload(&mut self, account: AccountId, id: u64, lease: LeaseId, workload: Box<gpux_protocol::Workload>) -> ServerMessage {
        let Some(info) = self.engine.lease(lease).filter(|l| l.renter == account) else {
            return error(Some(id), ErrorCode::UnknownLease);
        };
        if !info.active {
            return error(Some(id), ErrorCode::LeaseNotActive);
        }
        self.entries.push(JournalEntry::LeaseWorkload { account, lease, workload: workload.clone() });
        self.deliveries.set_lease_workload(lease, info.supplier, workload.clone());
        let frame = SharedFrame::new(ServerMessage::Workload { lease, workload });
        self.pending.push((Target::Account(info.supplier), Pending::Frame(frame)));
        ServerMessage::Ack { id, journal_seq: self.last_entry_seq(), order: None }
    }

    /// A host's delivery status: journaled, relayed to the renter, counted;
    /// a failure on the host's side ends the lease `delivery_failed`.
    fn delivery_status(&mut self, account: AccountId, id: u64, lease: LeaseId, state: DeliveryState) -> ServerMessage {
        let Some(info) = self.engine.lease(lease).filter(|l| l.supplier == account) else {
            return error(Some(id), ErrorCode::UnknownLease);
        };
        if info.billing_closed {
            return error(Some(id), ErrorCode::LeaseNotActive);
        }
        if !state.valid() {
            return error(Some(id), ErrorCode::DeliveryStatusInvalid);
        }
        let at_ms = self.clock_ms;
        self.entries.push(JournalEntry::DeliveryStatus { at_ms, account, lease, state: state.clone() });
        let journal_seq = self.last_entry_seq();
        self.metrics.observe_delivery_status(&state);
        if self.deliveries.record_status(lease, account, state.clone(), at_ms) {
            self.metrics.observe_time_to_running(at_ms.saturating_sub(info.start_ms));
        }
        let host_failed = matches!(state, DeliveryState::Failed { fault: gpux_protocol::Fault::Host, .. });
        let frame = SharedFrame::new(ServerMessage::Delivery { lease, state, at_ms });
        self.pending.push((Target::Account(info.renter), Pending::Frame(frame)));
        if host_failed && info.active {
            // Journaled like any command: replay ends the lease the same way.
            self.apply_command(None, 0, Command::FailLeaseDelivery { account, lease });
        }
        ServerMessage::Ack { id, journal_seq, order: None }
    }

    /// Tells renters whose hosts did not send the logs in time.
    fn expire_logs_requests(&mut self) {
        let now = self.clock_ms;
        let expired: Vec<u64> = self.logs_pending.iter().filter(|(_, w)| w.deadline_ms <= now).map(|(r, _)| *r).collect();
        for request in expired {
            if let Some(wait) = self.logs_pending.remove(&request) {
                self.reply(wait.connection, error(Some(wait.id), ErrorCode::HostUnreachable));
            }
        }
    }

    /// The sequence number the newest entry of this batch will have.
    fn last_entry_seq(&self) -> u64 {
        self.journal.next_seq() + self.entries.len() as u64 - 1
    }

    fn subscribe(&mut self, connection: ConnectionId, id: u64, channel: Channel, instrument: InstrumentId) {
        if self.engine.instrument(instrument).is_none() {
            self.reply(connection, error(Some(id), ErrorCode::UnknownInstrument));
            return;
        }
        let Some(state) = self.connections.get_mut(&connection) else { return };
        if state.subscriptions.len() >= SUBSCRIPTIONS_PER_CONNECTION_MAX && !state.subscriptions.contains(&(channel, instrument)) {
            self.reply(connection, error(Some(id), ErrorCode::TooManySubscriptions));
            return;
        }
        let newly = state.subscriptions.insert((channel, instrument));
        self.reply(connection, ServerMessage::Subscribed { id, channel, instrument });
        if channel == Channel::Book {
            self.reply(connection, self.book_snapshot(instrument));
        }
        if newly {
            self.start_feed(connection, channel, instrument);
        }
    }

    fn book_snapshot(&self, instrument: InstrumentId) -> ServerMessage {
        ServerMessage::BookSnapshot {
            instrument,
            seq: self.book_seq.get(&instrument).copied().unwrap_or(0),
            bids: self.engine.depth_best(instrument, gpux_engine::Side::Buy, gpux_protocol::BOOK_SNAPSHOT_LEVELS_MAX),
            asks: self.engine.depth_best(instrument, gpux_engine::Side::Sell, gpux_protocol::BOOK_SNAPSHOT_LEVELS_MAX),
        }
    }

    /// Hands the connection a receiver of the feed from now on; updates
    /// older than a snapshot sent just before carry a seq the client ignores.
    fn start_feed(&mut self, connection: ConnectionId, channel: Channel, instrument: InstrumentId) {
        let capacity = self.feed_frames_max;
        let feed = self.feeds.entry((channel, instrument)).or_insert_with(|| broadcast::channel(capacity).0).subscribe();
        self.pending.push((Target::Connection(connection), Pending::Control(Outgoing::FeedStart { channel, instrument, feed })));
    }

    /// A subscriber lost its place in a feed: the book it missed is conflated
    /// into one fresh snapshot (levels by price, the current seq), then the
    /// feed resumes from there; trades resume with a gap in `seq`.
    fn resync(&mut self, connection: ConnectionId, channel: Channel, instrument: InstrumentId) {
        let subscribed = self.connections.get(&connection).is_some_and(|state| state.subscriptions.contains(&(channel, instrument)));
        if !subscribed {
            return;
        }
        self.metrics.feed_resyncs.inc();
        if channel == Channel::Book {
            self.reply(connection, self.book_snapshot(instrument));
        }
        self.start_feed(connection, channel, instrument);
    }

    /// Sets how many frames each market-data feed buffers (`--feed-frames-max`).
    pub fn set_feed_frames_max(&mut self, frames: usize) {
        self.feed_frames_max = frames.max(1);
    }

    fn disconnect(&mut self, connection: ConnectionId) {
        let Some(state) = self.connections.remove(&connection) else { return };
        let Some(account) = state.account else { return };
        let last = match self.connections_of.get_mut(&account) {
            Some(set) => {
                set.remove(&connection);
                set.is_empty()
            }
            None => true,
        };
        if state.cancel_on_disconnect && last {
            // Journaled like any command, so replay cancels the same orders.
            self.apply_command(None, 0, Command::MassCancel { account, instrument: None });
        }
    }

    /// Books the events in the ledger; keeps the transfers for the commit.
    /// A ledger error is an invariant broken: stop rather than go on.
    fn post(&mut self, events: &[Event]) {
        for event in events {
            match self.ledger.apply(event) {
                Ok(transfers) => self.transfers.extend(transfers),
                Err(error) => {
                    tracing::error!(%error, "ledger invariant broken; stopping");
                    std::process::exit(70);
                }
            }
        }
    }

    /// Queues market data and private events for release after the commit.
    fn route(&mut self, events: &[Event]) {
        self.metrics.observe_events(events);
        self.post(events);
        for event in events {
            if let Some(message) = self.market_data(event) {
                let (channel, instrument) = match &message {
                    ServerMessage::BookUpdate { instrument, .. } => (Channel::Book, *instrument),
                    ServerMessage::Trade { instrument, .. } => (Channel::Trades, *instrument),
                    _ => unreachable!("market data is book updates and trades"),
                };
                self.pending.push((Target::Feed(channel, instrument), Pending::Frame(SharedFrame::new(message))));
            }
            let accounts = self.accounts_of(event);
            if accounts.iter().flatten().next().is_some() {
                let reason = match event.kind {
                    EventKind::Rejected { code, .. } => Some(code.message().to_string()),
                    _ => None,
                };
                let frame = SharedFrame::new(ServerMessage::Private { event: *event, reason });
                for account in accounts.into_iter().flatten() {
                    self.pending.push((Target::Account(account), Pending::Frame(frame.clone())));
                }
            }
        }
    }

    fn count_market_data(&mut self, events: &[Event]) {
        for event in events {
            self.market_data(event);
        }
    }

    fn market_data(&mut self, event: &Event) -> Option<ServerMessage> {
        match event.kind {
            EventKind::BookLevel { instrument, side, price_minor_per_gpu_hour, quantity } => {
                let seq = self.book_seq.entry(instrument).or_insert(0);
                *seq += 1;
                Some(ServerMessage::BookUpdate { instrument, seq: *seq, side, price_minor_per_gpu_hour, quantity })
            }
            EventKind::Trade { instrument, price_minor_per_gpu_hour, quantity, aggressor, .. } => {
                let seq = self.trade_seq.entry(instrument).or_insert(0);
                *seq += 1;
                self.stats.record(instrument, event.at_ms, price_minor_per_gpu_hour, quantity);
                Some(ServerMessage::Trade { instrument, seq: *seq, price_minor_per_gpu_hour, quantity, aggressor, at_ms: event.at_ms })
            }
            _ => None,
        }
    }

    /// The accounts an event concerns (at most two, deduplicated).
    fn accounts_of(&self, event: &Event) -> [Option<AccountId>; 2] {
        use EventKind::*;
        let pair = match event.kind {
            AccountOpened { account, .. }
            | FundsDeposited { account, .. }
            | FundsWithdrawn { account, .. }
            | FundsHeld { account, .. }
            | FundsReleased { account, .. }
            | GpuRegistered { account, .. }
            | OrderAccepted { account, .. }
            | OrderReplaced { account, .. }
            | OrderReduced { account, .. }
            | OrderClosed { account, .. } => [Some(account), None],
            // A usage charge is money coming in for the lease's supplier
            // (to its payable): its feed shows it too.
            UsageUnpaid { renter, lease, .. } => [Some(renter), self.engine.lease(lease).map(|l| l.supplier)],
            PaymentNotice { renter, .. } => [Some(renter), None],
            DebtRepaid { account, .. } | PayoutSent { account, .. } => [Some(account), None],
            FeeCharged { supplier, .. } => [Some(supplier), None],
            SlaCredited { renter, supplier, .. } => [Some(renter), Some(supplier)],
            LeaseBillingClosed { lease, .. } => self.engine.lease(lease).map_or([None, None], |l| [Some(l.renter), Some(l.supplier)]),
            FeeChanged { .. } | BillingGraceChanged { .. } => [None, None],
            FundsCharged { account, to: None, reason: gpux_engine::HoldReason::Lease(lease), .. } => {
                [Some(account), self.engine.lease(lease).map(|l| l.supplier)]
            }
            FundsCharged { account, to, .. } => [Some(account), to],
            Rejected { account, .. } => [account, None],
            Trade { buyer, seller, .. } => [Some(buyer), Some(seller)],
            LeaseCreated { renter, supplier, .. } => [Some(renter), Some(supplier)],
            PreemptionNotice { lease, .. } | LeaseEnded { lease, .. } => {
                self.engine.lease(lease).map_or([None, None], |l| [Some(l.renter), Some(l.supplier)])
            }
            ContractCreated { holder, supplier, .. } => [Some(holder), Some(supplier)],
            ContractTransferred { from, to, .. } => [Some(from), Some(to)],
            DeliveryFailed { holder, supplier, .. } => [Some(holder), Some(supplier)],
            GpuStatusChanged { gpu, .. } => [self.engine.gpu(gpu).map(|g| g.owner), None],
            InstrumentListed { .. } | TradingStopped { .. } | InstrumentExpired { .. } | BookLevel { .. } => [None, None],
        };
        if pair[0] == pair[1] {
            [pair[0], None]
        } else {
            pair
        }
    }

    fn reply(&mut self, connection: ConnectionId, message: ServerMessage) {
        self.pending.push((Target::Connection(connection), Pending::Frame(SharedFrame::new(message))));
    }

    /// Sends everything the batch produced, now that it is durable. A
    /// connection whose queue is full is told to close as a slow consumer.
    fn release(&mut self) {
        let pending = std::mem::take(&mut self.pending);
        for (target, item) in pending {
            match (target, item) {
                (Target::Connection(connection), Pending::Frame(frame)) => self.send(connection, Outgoing::Frame(frame)),
                (Target::Connection(connection), Pending::Control(control)) => self.send(connection, control),
                (Target::Account(account), Pending::Frame(frame)) => {
                    let connections: Vec<ConnectionId> =
                        self.connections_of.get(&account).map(|set| set.iter().copied().collect()).unwrap_or_default();
                    for connection in connections {
                        self.send(connection, Outgoing::Frame(frame.clone()));
                    }
                }
                (Target::Feed(channel, instrument), Pending::Frame(frame)) => {
                    if let Some(feed) = self.feeds.get(&(channel, instrument)) {
                        // No receiver left is fine: nobody is subscribed now.
                        let _ = feed.send(frame);
                    }
                }
                (_, Pending::Control(_)) => unreachable!("controls go to one connection"),
            }
        }
    }

    fn send(&mut self, connection: ConnectionId, outgoing: Outgoing) {
        let Some(state) = self.connections.get(&connection) else { return };
        // Private frames are never dropped: a connection that cannot take
        // one more is closed instead (the gateway counts it).
        if let Err(mpsc::error::TrySendError::Full(_)) = state.outbound.frames.try_send(outgoing) {
            state.outbound.too_slow.notify_one();
            self.disconnect(connection);
        }
    }
}

fn error(id: Option<u64>, code: ErrorCode) -> ServerMessage {
    ServerMessage::Error { id, code, message: code.message().to_string() }
}

/// The exchange clock's offset from the wall clock (`--clock-offset-ms`):
/// zero in production; demos and tests move the exchange's time ahead to
/// reach a reserved window's start without waiting for it. Set once at start.
static CLOCK_OFFSET_MS: std::sync::atomic::AtomicI64 = std::sync::atomic::AtomicI64::new(0);

pub fn set_clock_offset_ms(offset_ms: i64) {
    CLOCK_OFFSET_MS.store(offset_ms, std::sync::atomic::Ordering::Relaxed);
}

/// The exchange's time: the wall clock plus the configured offset.
pub fn wall_clock_ms() -> u64 {
    let wall = SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64);
    wall.saturating_add_signed(CLOCK_OFFSET_MS.load(std::sync::atomic::Ordering::Relaxed))
}
