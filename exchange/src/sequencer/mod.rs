//! The sequencer: one thread that owns the market state, the journal and the
//! connection registry, and is the only writer of market state.
//!
//! It takes requests in batches (everything that queued while the previous
//! batch was being committed), turns each into journal entries stamped with
//! the exchange clock, applies them through `MarketState::apply` (the one
//! apply path, shared with recovery, the simulator and the audit), appends the
//! batch to the journal in one durable commit, and only then releases what
//! the batch produced: acks, rejects, private events, market data and
//! snapshots. Nothing leaves the process before the inputs behind it are on
//! disk. A journal or ledger error stops the sequencer with that error (the
//! process exits and the next start replays the journal).
//!
//! **Pipelined commit.** The commit runs on a journal thread: while batch k
//! is written and fsynced there, the sequencer applies batch k+1; it waits
//! for k's commit before it hands k+1 over, and releases k's output only
//! then. So at most one batch is on its way to disk while the next is
//! applied, and nothing of a batch leaves before its own commit. A journal
//! that takes several batches at once (`JournalAppend::pipeline_depth` over
//! 1; Raft's is `gpux_replica::PIPELINE_DEPTH`) gets batch k+1 while k is still
//! on its way, up to that many, each released in order after its own
//! commit. A batch without journal entries (queries) releases behind the
//! batches in flight, never ahead of them. Requests that read the journal or change who receives
//! what (logins, subscriptions, disconnects, every query but the hot path's
//! orders, bids and usage reports; see [`pipelined`]) first wait for the
//! batch in flight, so they see every commit before them.
//!
//! Files: `mod.rs` batching, commit and release; `recovery.rs` the restart
//! from snapshot plus journal and the snapshots taken; `sessions.rs` logins,
//! subscriptions and disconnects; `delivery.rs` lease delivery requests;
//! `queries.rs` read-only answers.

mod access;
mod challenges;
mod delivery;
mod fanout;
mod jobs;
mod liveness;
mod opening;
mod queries;
mod recovery;
mod session_table;
mod sessions;
#[cfg(test)]
mod tests;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use crossbeam_channel::{Receiver, RecvTimeoutError};
use gpux_engine::{AccountId, Command, EventKind, Input, InstrumentId, LeaseId, OrderId};
use gpux_market::{Applied, Audience, JournalEntry, MarketError, MarketState};
use gpux_protocol::{Channel, ErrorCode, ServerMessage};

use crate::metrics::Metrics;
use crate::snapshots::SnapshotWriter;
use gpux_gateway::link::{Body, Clock, ConnectionId, Outgoing, QueueError, Request, SharedFrame};
use gpux_journal::JournalStore;

pub use challenges::CHALLENGE_INTERVAL_MS_DEFAULT;
pub use jobs::JOB_SILENCE_MS_DEFAULT;
pub use opening::{AccountOpening, OpeningMode, ACCOUNTS_PER_ADDRESS_HOUR_DEFAULT, OPENING_ADDRESSES_MAX};
pub use recovery::{BillingPolicy, Recovery};

pub use crate::limits::BATCH_MAX;
pub use crate::limits::LOGS_PENDING_MAX;
pub use crate::limits::LOGS_PENDING_PER_ACCOUNT_MAX;
pub use crate::limits::LOGS_PENDING_PER_SUPPLIER_MAX;
pub use crate::limits::LOGS_WAIT_MS;
pub use crate::limits::SUBSCRIPTIONS_PER_CONNECTION_MAX;

/// Why the sequencer stopped serving. Either way the journal holds every
/// acknowledged entry and the next start replays it.
#[derive(Debug, thiserror::Error)]
pub enum SequencerError {
    /// Acknowledged means durable: without the journal nothing may be
    /// acknowledged, and the in-memory state is ahead of the disk.
    /// `committed`: the last entry on disk; `state_hash`: the state as of
    /// it (what a restart recovers), from the snapshot replica, when it had
    /// kept up.
    /// `unanswered`: the last entry and state hash with the failed batch
    /// too, which a restart recovers instead when the disk kept that batch
    /// after all (an `fsync` that failed after its write): no answer of it
    /// was sent either way.
    #[error("the journal could not be written after entry {committed}{}{}: {source:#}",
        state_hash.map_or(String::new(), |h| format!(" (state hash {h:016x}, what a restart recovers")),
        match (state_hash, unanswered) {
            (None, _) => String::new(),
            (Some(_), Some((seq, h))) => format!(", or entry {seq} with state hash {h:016x} if the disk kept the unanswered batch that failed)"),
            (Some(_), None) => ")".to_string(),
        })]
    Journal { committed: u64, state_hash: Option<u64>, unanswered: Option<(u64, u64)>, source: gpux_journal::JournalError },
    #[error(transparent)]
    Market(#[from] MarketError),
}

/// A renter's `lease_logs` (or `lease_exec`) request waiting for its
/// host's answer; both count in the same shares.
struct LogsWait {
    /// A `lease_exec`: answered `lease_exec`, not `lease_logs`.
    exec: bool,
    connection: ConnectionId,
    /// The participants of the renter that asked and of the supplier
    /// asked (their shares).
    renter: gpux_engine::AccountId,
    supplier: gpux_engine::AccountId,
    id: u64,
    lease: gpux_engine::LeaseId,
    deadline_ms: u64,
}

pub struct Sequencer {
    market: MarketState,
    /// The journal, shared with the journal thread that commits batches.
    journal: Arc<Mutex<Box<dyn JournalStore>>>,
    /// Hands batches to the journal thread (started at the first commit).
    committer: Option<Committer>,
    /// The batches on their way to disk, oldest first, with what each
    /// releases once there: at most the journal's pipeline depth (1 for the
    /// local journal, `gpux_replica::PIPELINE_DEPTH` through Raft).
    in_flight: std::collections::VecDeque<InFlight>,
    /// How many batches the journal takes at once
    /// (`JournalAppend::pipeline_depth`).
    pipeline_depth: usize,
    /// The sequence number the current batch's first entry gets.
    next_seq: u64,
    /// The last entry known to be on disk.
    committed_seq: u64,
    clock: Clock,
    operator_keys: BTreeSet<[u8; 32]>,
    /// Inputs of the current batch, journaled before anything below is sent.
    entries: Vec<JournalEntry>,
    /// Transfers of the current batch, committed with its journal entries.
    transfers: Vec<gpux_settlement::ledger::Transfer>,
    /// What the batch archived, written to the journal's archive in its commit.
    archived: gpux_market::Archived,
    /// What the batch produced, in release order.
    pending: Vec<(Target, Pending)>,
    /// The first broken invariant of this batch: nothing of it is released.
    fatal: Option<SequencerError>,
    /// Open connections, the accounts' present sessions, key expiries.
    sessions: session_table::Sessions,
    /// Market data's feeds, local and down remote gateways' links.
    fanout: fanout::FanOut,
    metrics: Arc<Metrics>,
    depth_refreshed_ms: u64,
    /// The snapshot replica, fed every committed batch.
    snapshots: SnapshotWriter,
    logs_pending: BTreeMap<u64, LogsWait>,
    next_logs_request: u64,
    /// When each GPU is next challenged.
    challenges: challenges::Schedule,
    /// The invoices' worker (none in the sequencer's own tests).
    invoices: Option<crate::invoices::InvoiceDesk>,
    /// Who may open an account, and the counts per address.
    openings: opening::Openings,
    /// Set from outside to end `run` (a cluster node that stops leading);
    /// looked at between batches, at least once a second.
    stop: Arc<std::sync::atomic::AtomicBool>,
    /// How long a job's lease may be silent before its delivery fails.
    job_silence_ms: u64,
    /// Signs job store tokens, where the exchange runs a job store.
    job_store: Option<crate::job_store::Issuer>,
    /// The data directory's free space against the journal's reserve
    /// (none in the sequencer's own tests).
    disk: Option<crate::disk::DiskState>,
}

/// Whether a request is new work, which the exchange stops taking while
/// its disk is down to the journal's reserve (docs/operations.md "Disk
/// space"): orders, registrations, deposits, jobs, sub-accounts and keys.
/// Cancels, lease ends, delivery statuses, reports, reads and withdrawals
/// still pass: they end work, or are what the reserve is for.
fn new_work(body: &Body) -> bool {
    use gpux_gateway::link::{AccessRequest, JobRequest};
    match body {
        // Every form of placing an order, and the other commands that add.
        Body::Command { command } => {
            command.new_order().is_some()
                || matches!(
                    command,
                    Command::ReplaceOrder { .. }
                        | Command::Register { .. }
                        | Command::DeprecatedRegisterGpu { .. }
                        | Command::DeprecatedRegisterGpuInRegion { .. }
                        | Command::DeprecatedRegisterGpuOnFabric { .. }
                        | Command::Deposit { .. }
                        | Command::OfferLease { .. }
                )
        }
        Body::Bid { .. } => true,
        Body::Job { request } => matches!(request, JobRequest::Submit { .. } | JobRequest::Resize { .. }),
        Body::Access { request } => {
            matches!(request, AccessRequest::OpenSubAccount | AccessRequest::MoveFunds { .. } | AccessRequest::AddKey { .. })
        }
        _ => false,
    }
}

/// A batch for the journal thread: its entries, transfers and archive,
/// and where to say how its commit went.
struct CommitJob {
    entries: Vec<JournalEntry>,
    transfers: Vec<gpux_settlement::ledger::Transfer>,
    archived: gpux_market::Archived,
    done: crossbeam_channel::Sender<Committed>,
}

/// The journal thread and the way to it.
struct Committer {
    jobs: crossbeam_channel::Sender<CommitJob>,
    thread: std::thread::JoinHandle<()>,
}

impl Drop for Sequencer {
    /// Ends the journal thread and waits for it, so the journal is closed
    /// (its file left clean) when the sequencer is gone.
    fn drop(&mut self) {
        if let Some(Committer { jobs, thread }) = self.committer.take() {
            drop(jobs);
            let _ = thread.join();
        }
    }
}

/// How a batch's commit went: its first entry's sequence number, or why
/// not; its entries (for the snapshot replica) and how long it took.
struct Committed {
    first_seq: gpux_journal::Result<u64>,
    entries: Vec<JournalEntry>,
    elapsed: Duration,
}

/// The batch handed to the journal thread and not yet known durable.
struct InFlight {
    /// What it produced, and what batches without entries produced since
    /// (they must not overtake it), released in that order once it is on disk.
    pending: Vec<(Target, Pending)>,
    done: crossbeam_channel::Receiver<Committed>,
}

/// Whether a request may be handled while the batch before it is still
/// on its way to disk: the hot path (orders, bids, usage reports), which
/// reads no journal and changes no connection's audience. Everything else
/// waits for the batch in flight first.
fn pipelined(body: &Body) -> bool {
    matches!(body, Body::Command { .. } | Body::Bid { .. } | Body::Usage { .. })
}

/// The journal thread: commits each batch it is handed, in order, and says
/// how it went. Ends when the sequencer goes. A journal that takes several
/// batches at once (`pipeline_depth` over 1: Raft) gets each proposed here
/// and waited for on a second thread, in order, so the next is proposed
/// while the ones before are on their way.
fn commit_batches(journal: Arc<Mutex<Box<dyn JournalStore>>>, jobs: crossbeam_channel::Receiver<CommitJob>, depth: usize) {
    let propose = |job: &CommitJob| lock(&journal).propose(&job.entries, &job.transfers, &job.archived);
    if depth <= 1 {
        for job in jobs {
            let started = std::time::Instant::now();
            let first_seq = propose(&job)();
            let _ = job.done.send(Committed { first_seq, entries: job.entries, elapsed: started.elapsed() });
        }
        return;
    }
    let (waits, waiting) = crossbeam_channel::bounded::<(gpux_journal::Proposed, CommitJob, std::time::Instant)>(depth);
    let waiter = std::thread::Builder::new()
        .name("gpux-journal-wait".into())
        .spawn(move || {
            for (proposed, job, started) in waiting {
                let first_seq = proposed();
                let _ = job.done.send(Committed { first_seq, entries: job.entries, elapsed: started.elapsed() });
            }
        })
        .expect("the journal's waiting thread starts");
    for job in jobs {
        let started = std::time::Instant::now();
        let proposed = propose(&job);
        if waits.send((proposed, job, started)).is_err() {
            break;
        }
    }
    drop(waits);
    let _ = waiter.join();
}

/// The journal, locked (a panic while it was held does not make it unusable:
/// the journal's own transactions keep it whole).
fn lock(journal: &Mutex<Box<dyn JournalStore>>) -> MutexGuard<'_, Box<dyn JournalStore>> {
    journal.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
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

impl Sequencer {
    /// The market as the journal so far made it.
    pub fn market(&self) -> &MarketState {
        &self.market
    }

    pub fn state_hash(&self) -> u64 {
        self.market.state_hash()
    }

    /// Hands invoice requests to this worker.
    pub fn set_invoices(&mut self, desk: crate::invoices::InvoiceDesk) {
        self.invoices = Some(desk);
    }

    /// Sets what opening an account costs (`--account-opening`, `--accounts-max`,
    /// `--accounts-per-address-hour`).
    pub fn set_account_opening(&mut self, policy: AccountOpening) {
        self.openings.policy = policy;
    }

    /// Sets how many frames each market-data feed buffers (`--feed-frames-max`).
    pub fn set_feed_frames_max(&mut self, frames: usize) {
        self.fanout.set_frames_max(frames);
    }

    /// Serves requests until every sender is gone (the gateway shut down),
    /// committing what is in flight, then writes a last snapshot and returns
    /// the state hash. A journal or ledger error ends it early.
    pub fn run(mut self, requests: Receiver<Request>) -> Result<u64, SequencerError> {
        while !self.stop.load(std::sync::atomic::Ordering::SeqCst) {
            let mut batch = Vec::new();
            take_queued(&requests, &mut batch);
            // With a batch in flight, `step` waits for it and for requests
            // together; without one, nothing waits but the next request.
            if batch.is_empty() && self.in_flight.is_empty() {
                match requests.recv_timeout(self.time_until_due()) {
                    Ok(request) => batch.push(request),
                    Err(RecvTimeoutError::Timeout) => {}
                    Err(RecvTimeoutError::Disconnected) => break,
                }
                take_queued(&requests, &mut batch);
            }
            self.step(batch, Some(&requests))?;
        }
        self.settle()?;
        // A clean stop leaves a snapshot of everything, durable before it returns.
        self.snapshots.finish();
        Ok(self.market.state_hash())
    }

    /// Set it and `run` returns after the batch in hand (within a second).
    pub fn stop_flag(&self) -> Arc<std::sync::atomic::AtomicBool> {
        self.stop.clone()
    }

    fn time_until_due(&self) -> Duration {
        let due = self.market.engine().next_due_ms();
        Duration::from_millis(due.saturating_sub(self.clock.now_ms()).clamp(1, 1_000))
    }

    /// One batch: handle, commit, release, all before it returns.
    #[cfg(test)]
    fn process(&mut self, batch: Vec<Request>) -> Result<(), SequencerError> {
        self.step(batch, None)?;
        self.settle()
    }

    /// One batch: handle it, then hand it to the journal thread once the
    /// batch before it is on disk (and released); it may still be on its
    /// way to disk when this returns (`settle` waits for it). With
    /// `requests`, what arrives while the batch before is being committed
    /// joins this batch (up to `BATCH_MAX`): batches stay as large as when
    /// each waited for the last, and their apply overlaps its commit.
    fn step(&mut self, batch: Vec<Request>, requests: Option<&Receiver<Request>>) -> Result<(), SequencerError> {
        if batch.iter().any(|request| !pipelined(&request.body)) || self.sessions_due() {
            self.settle()?;
        }
        self.market.advance_clock(self.clock.now_ms());
        self.check_disk();
        if self.market.engine().next_due_ms() <= self.market.clock_ms() {
            self.apply_command(None, 0, Command::Tick);
        }
        let mut handled = batch.len();
        for request in batch {
            self.handle(request);
        }
        if let Some(requests) = requests {
            self.gather(requests, &mut handled)?;
        }
        self.run_challenges();
        self.fail_silent_job_leases();
        self.end_due_exit_holds();
        self.expire_logs_requests();
        self.expire_sessions();
        if let Some(fatal) = self.fatal.take() {
            return Err(fatal);
        }
        if !self.entries.is_empty() || !self.archived.is_empty() {
            while self.in_flight.len() >= self.pipeline_depth {
                self.settle_oldest()?;
            }
            self.submit();
        } else if let Some(in_flight) = self.in_flight.back_mut() {
            in_flight.pending.append(&mut self.pending);
        } else {
            let pending = std::mem::take(&mut self.pending);
            self.release(pending);
        }
        self.refresh_depth();
        Ok(())
    }

    /// With batches in flight, handles requests as they arrive until the
    /// oldest is on disk (then releases it), the batch holds `BATCH_MAX`,
    /// or the batch has entries and the journal takes one more batch. A
    /// request that may not pass the batches in flight waits for them first.
    fn gather(&mut self, requests: &Receiver<Request>, handled: &mut usize) -> Result<(), SequencerError> {
        while *handled < BATCH_MAX && self.fatal.is_none() {
            let room = self.in_flight.len() < self.pipeline_depth;
            if room && (!self.entries.is_empty() || !self.archived.is_empty()) {
                return Ok(());
            }
            let Some(done) = self.in_flight.front().map(|in_flight| in_flight.done.clone()) else { return Ok(()) };
            crossbeam_channel::select! {
                recv(done) -> committed => return self.finish_commit(committed.ok()),
                recv(requests) -> request => {
                    // A gateway gone ends the gathering; `run` sees it next.
                    let Ok(request) = request else { return Ok(()) };
                    if !pipelined(&request.body) {
                        self.settle()?;
                    }
                    *handled += 1;
                    self.handle(request);
                }
            }
        }
        Ok(())
    }

    /// Hands the batch to the journal thread (starting it the first time).
    fn submit(&mut self) {
        let (done, done_rx) = crossbeam_channel::bounded(1);
        let entries = std::mem::take(&mut self.entries);
        self.next_seq += entries.len() as u64;
        let job = CommitJob { entries, transfers: std::mem::take(&mut self.transfers), archived: std::mem::take(&mut self.archived), done };
        let depth = self.pipeline_depth;
        let committer = self.committer.get_or_insert_with(|| {
            let (jobs, jobs_rx) = crossbeam_channel::bounded(depth);
            let journal = self.journal.clone();
            let thread = std::thread::Builder::new()
                .name("gpux-journal".into())
                .spawn(move || commit_batches(journal, jobs_rx, depth))
                .expect("the journal thread starts");
            Committer { jobs, thread }
        });
        // A journal thread that is gone answers nothing: `settle` says so.
        let _ = committer.jobs.send(job);
        self.in_flight.push_back(InFlight { pending: std::mem::take(&mut self.pending), done: done_rx });
    }

    /// Waits for every batch in flight to be on disk, releasing what each
    /// produced in order and feeding it to the snapshot replica. A failed
    /// commit stops the sequencer: nothing of that batch, or of any after
    /// it, was sent.
    fn settle(&mut self) -> Result<(), SequencerError> {
        while !self.in_flight.is_empty() {
            self.settle_oldest()?;
        }
        Ok(())
    }

    /// Waits for the oldest batch in flight, then releases it.
    fn settle_oldest(&mut self) -> Result<(), SequencerError> {
        let Some(in_flight) = self.in_flight.front() else { return Ok(()) };
        let committed = in_flight.done.recv().ok();
        self.finish_commit(committed)
    }

    /// The oldest batch in flight's commit came back (`None`: the journal
    /// thread is gone): releases it, or stops the sequencer.
    fn finish_commit(&mut self, committed: Option<Committed>) -> Result<(), SequencerError> {
        let Some(in_flight) = self.in_flight.pop_front() else { return Ok(()) };
        let committed = committed.unwrap_or_else(|| Committed {
            first_seq: Err(gpux_journal::JournalError::Stopped),
            entries: Vec::new(),
            elapsed: Duration::ZERO,
        });
        let first_seq = match committed.first_seq {
            Ok(first_seq) => first_seq,
            Err(source) => {
                // The replica holds the committed state: its hash says
                // what a restart will recover.
                let committed_seq = self.committed_seq;
                let finished = self.snapshots.finish_failed(committed.entries).filter(|((seq, _), _)| *seq == committed_seq);
                let state_hash = finished.map(|((_, hash), _)| hash);
                let unanswered = finished.and_then(|(_, with_failed)| with_failed).filter(|(seq, _)| *seq > committed_seq);
                return Err(SequencerError::Journal { committed: committed_seq, state_hash, unanswered, source });
            }
        };
        self.metrics.observe_commit(committed.elapsed);
        self.metrics.journal_entries.inc_by(committed.entries.len() as u64);
        self.committed_seq = first_seq + committed.entries.len() as u64 - 1;
        // The snapshot replica applies the batch on its own thread.
        self.snapshots.committed(first_seq, committed.entries);
        self.release(in_flight.pending);
        Ok(())
    }

    /// The journal, for the queries that read it (after `settle`: they see
    /// every commit before them).
    fn store(&self) -> MutexGuard<'_, Box<dyn JournalStore>> {
        lock(&self.journal)
    }

    fn handle(&mut self, request: Request) {
        if !self.permitted(&request) {
            return;
        }
        if self.disk.as_ref().is_some_and(crate::disk::DiskState::low) && new_work(&request.body) {
            self.metrics.disk_low_refusals.inc();
            return self.reply(request.connection(), error(request.id(), ErrorCode::DiskLow));
        }
        let Request { connection, id, body } = request;
        match body {
            Body::Connect { outbound } => self.connect(connection, outbound),
            Body::Authenticate { public_key, role, cancel_on_disconnect, presence, invite, address } => {
                let login = sessions::Login { public_key, role, cancel_on_disconnect, presence, invite, address };
                self.authenticate(connection, id, login)
            }
            Body::Command { command } => self.apply_command(Some(connection), id, command),
            Body::Subscribe { channel, instrument } => self.subscribe(connection, id, channel, instrument),
            Body::Resync { channel, instrument } => self.resync(connection, channel, instrument),
            Body::Unsubscribe { channel, instrument } => self.unsubscribe(connection, id, channel, instrument),
            Body::Instruments {} => self.instruments(connection, id),
            Body::OpenOrders { after } => self.open_orders(connection, id, after.map(OrderId)),
            Body::Leases { after } => self.leases(connection, id, after.map(LeaseId)),
            Body::Stats { instrument } => self.stats(connection, id, instrument),
            Body::SupplierStats { supplier } => self.supplier_stats(connection, id, supplier),
            Body::RenterStats { renter } => self.renter_stats(connection, id, renter),
            Body::BookOffers { instrument, offset, after } => self.book_offers(connection, id, instrument, offset, after),
            Body::SearchOffers { search } => self.search_offers(connection, id, *search),
            Body::MyGpus { offset } => self.my_gpus(connection, id, offset),
            Body::Usage { report, checked_by } => self.usage(connection, id, *report, checked_by),
            Body::Statement { after } => self.statement(connection, id, after),
            Body::RecentStatement { before } => self.recent_statement(connection, id, before),
            Body::Balance {} => self.balance(connection, id),
            Body::Disconnect { exchange_stopping } => self.disconnect(connection, exchange_stopping),
            Body::Bid { command, workload, rematch } => self.bid(connection, id, command, workload, rematch),
            Body::Delivery { request } => self.delivery(connection, id, request),
            Body::Challenge { request } => self.challenge(connection, id, request),
            Body::Liveness { report } => self.liveness(connection, id, *report),
            Body::GpuProbe { report } => self.gpu_probe(connection, id, report),
            Body::Access { request } => self.access(connection, id, request),
            Body::ExchangeKey {} => self.exchange_key(connection, id),
            Body::Listing {} => self.listing(connection, id),
            Body::LeaseTelemetry { lease } => self.lease_telemetry(connection, id, lease),
            Body::History { request } => self.history(connection, id, request),
            Body::Book { instrument } => self.book(connection, id, instrument),
            Body::Job { request } => self.job(connection, id, request),
        }
    }

    /// Journals one entry and applies it to the market; returns its journal
    /// sequence number and what it caused (already routed for release). After
    /// a broken invariant nothing more is applied and the batch is dropped.
    fn journal(&mut self, entry: JournalEntry) -> Option<(u64, Applied)> {
        if self.fatal.is_some() {
            return None;
        }
        let applied = match self.market.apply(&entry) {
            Ok(applied) => applied,
            Err(error) => {
                tracing::error!(%error, "market invariant broken; stopping");
                self.fatal = Some(error.into());
                return None;
            }
        };
        self.entries.push(entry);
        let journal_seq = self.next_seq + self.entries.len() as u64 - 1;
        let mut applied = applied;
        self.note_registrations(&applied.events);
        self.note_job_leases(&applied.events);
        self.route(&mut applied);
        for command in applied.follow_ups.clone() {
            // Journaled like any command: replay meets it as its own entry.
            self.apply_command(None, 0, command);
        }
        Some((journal_seq, applied))
    }

    /// Watches the data directory's free space against the journal's
    /// reserve (`--disk-reserve-mib`).
    pub fn set_disk(&mut self, disk: std::sync::Arc<crate::disk::Disk>) {
        // Snapshots keep twice the reserve free, as the job store does.
        self.snapshots.set_reserve(disk.reserve_bytes().saturating_mul(2).max(crate::snapshots::SNAPSHOT_RESERVE_BYTES));
        self.disk = Some(crate::disk::DiskState::new(disk));
    }

    /// Takes no new work while the disk is down to the journal's reserve,
    /// and takes it again by itself once space is back.
    fn check_disk(&mut self) {
        let now_ms = self.clock.now_ms();
        let Some(disk) = &mut self.disk else { return };
        if disk.check(now_ms) {
            let (free, reserve) = (disk.disk.free_bytes(), disk.disk.reserve_bytes());
            if disk.low() {
                tracing::error!(
                    free_bytes = free,
                    reserve_bytes = reserve,
                    "disk down to the journal's reserve: refusing new work (disk_low) until space comes back"
                );
            } else {
                tracing::warn!(free_bytes = free, reserve_bytes = reserve, "disk space back: taking new work again");
            }
            self.metrics.disk_low.set(i64::from(disk.low()));
        }
    }

    /// Stamps a command with the exchange clock, journals and applies it,
    /// and answers the connection that sent it (if any).
    fn apply_command(&mut self, connection: Option<ConnectionId>, id: u64, command: Command) {
        self.metrics.commands.inc();
        if command.new_order().is_some() {
            self.metrics.orders.inc();
        }
        let input = Input { at_ms: self.market.clock_ms(), command };
        let from = self.pending.len();
        let Some((journal_seq, applied)) = self.journal(JournalEntry::Engine(input)) else { return };
        let Some(connection) = connection else { return };
        self.echo_own_events(connection, from);
        let reply = match applied.events.last().map(|e| e.kind) {
            Some(EventKind::Rejected { code, .. }) => self.reject(id, journal_seq, code),
            _ => {
                let order = applied.events.iter().find_map(|e| match e.kind {
                    EventKind::OrderAccepted { order, .. } => Some(order),
                    _ => None,
                });
                if let Some(order) = order {
                    self.remember_session_order(connection, order);
                }
                ServerMessage::Ack { id, journal_seq, order }
            }
        };
        self.reply(connection, reply);
    }

    /// The answer to a refused command: its code, what it means, and the
    /// bound it ran into with its figures where it has one (the tick, the
    /// band, the most allowed, needed against available).
    pub(super) fn reject(&self, id: u64, journal_seq: u64, code: gpux_engine::RejectCode) -> ServerMessage {
        let (message, bound) = match self.bound_of(journal_seq, code) {
            Some((said, bound)) => (format!("{}: {said}", code.message()), Some(bound)),
            None => (code.message().to_string(), None),
        };
        ServerMessage::Reject { id, journal_seq, code, message, bound }
    }

    /// The bound the command journaled at `journal_seq` ran into, in words
    /// and figures (docs/protocol.md "Requests and answers").
    fn bound_of(&self, journal_seq: u64, code: gpux_engine::RejectCode) -> Option<(String, gpux_protocol::views::Bound)> {
        use gpux_engine::RejectCode as R;
        use gpux_protocol::views::Bound;
        let index = usize::try_from(journal_seq.checked_sub(self.next_seq)?).ok()?;
        let JournalEntry::Engine(input) = self.entries.get(index)? else { return None };
        let engine = self.market.engine();
        let money = |minor: u64| minor.to_string();
        // The price an order or a replacement names, and its instrument.
        let priced = || match &input.command {
            Command::ReplaceOrder { order, price_minor_per_gpu_hour, .. } => {
                engine.order(*order).map(|o| (o.instrument, *price_minor_per_gpu_hour))
            }
            command => command.new_order().map(|o| (o.instrument, o.price_minor_per_gpu_hour)),
        };
        match code {
            R::PriceOffTick => {
                let (instrument, price) = priced()?;
                let tick = engine.instrument(instrument)?.tick_minor.max(1);
                let below = price / tick * tick;
                let said = format!("{price} is not a multiple of the class's tick {tick}: {} or {} are", money(below), money(below + tick));
                Some((said, Bound { tick_minor: Some(tick), ..Bound::default() }))
            }
            R::PriceOutOfBand => {
                let (instrument, price) = priced()?;
                let info = engine.instrument(instrument)?;
                let (min, max) = (info.price_min_minor_per_gpu_hour, info.price_max_minor_per_gpu_hour);
                let said = format!("{price} is outside the class's band {min} to {max} per GPU-hour");
                Some((said, Bound { min: Some(min), max: Some(max), ..Bound::default() }))
            }
            R::QuantityTooLarge => {
                let max = u64::from(gpux_engine::limits::QUANTITY_MAX);
                Some((format!("an order is for at most {max} GPUs"), Bound { min: Some(1), max: Some(max), ..Bound::default() }))
            }
            R::DurationInvalid => {
                let max = u64::from(gpux_engine::limits::DURATION_HOURS_MAX);
                let said = format!("a fixed lease is 1 minute to {max} hours, to the minute (or open-ended: until cancelled)");
                Some((said, Bound { min: Some(1), max: Some(max * 60), ..Bound::default() }))
            }
            R::AmountInvalid => match &input.command {
                Command::Deposit { .. } | Command::MoveFunds { .. } | Command::Withdraw { .. } | Command::Payout { .. } => {
                    let max = gpux_engine::limits::DEPOSIT_MINOR_MAX;
                    let said = format!("an amount is 1 to {max} minor units");
                    Some((said, Bound { min: Some(1), max: Some(max), ..Bound::default() }))
                }
                _ => None,
            },
            R::InsufficientFunds => {
                let (account, needed) = match &input.command {
                    Command::Withdraw { account, amount_minor } | Command::Payout { account, amount_minor } => {
                        (*account, Some(*amount_minor))
                    }
                    Command::MoveFunds { parent, sub_account, amount_minor, to_sub_account } => {
                        (if *to_sub_account { *parent } else { *sub_account }, Some(*amount_minor))
                    }
                    Command::Place { order, options, .. } => (order.account, engine.bid_hold(order, options)),
                    command => (command.new_order()?.account, None),
                };
                let available = engine.balances(account)?.available_minor;
                let said = match needed {
                    Some(needed) => format!("it needs {} and the account has {} available", money(needed), money(available)),
                    None => format!("the account has {} available", money(available)),
                };
                Some((said, Bound { needed_minor: needed, available_minor: Some(available), ..Bound::default() }))
            }
            _ => None,
        }
    }

    /// A REST request's session is not the account's presence, so the
    /// account's events do not reach it; those its own command caused (the
    /// frames for its account queued since `from`) do, before its answer
    /// (docs/rest.md "Writes").
    fn echo_own_events(&mut self, connection: ConnectionId, from: usize) {
        let Some(state) = self.sessions.get(connection) else { return };
        let Some(account) = state.account.filter(|_| !state.presence) else { return };
        let own: Vec<std::sync::Arc<SharedFrame>> = self.pending[from..]
            .iter()
            .filter_map(|(target, item)| match (target, item) {
                (Target::Account(to), Pending::Frame(frame)) if *to == account => Some(frame.clone()),
                _ => None,
            })
            .collect();
        self.pending.extend(own.into_iter().map(|frame| (Target::Connection(connection), Pending::Frame(frame))));
    }

    /// A usage report from a supplier's connection: journaled whatever its
    /// fate, verified and metered by settlement, charged to the lease.
    fn usage(&mut self, connection: ConnectionId, id: u64, report: gpux_protocol::UsageReport, checked_by: Option<[u8; 32]>) {
        let Some(account) = self.account(connection) else { return };
        let at_ms = self.market.clock_ms();
        if let Some(key) = checked_by {
            self.market.mark_report_checked(account, key, &report);
        }
        let Some((journal_seq, applied)) = self.journal(JournalEntry::usage(at_ms, account, report)) else { return };
        let reply = match applied.usage.expect("a usage report has an outcome") {
            Ok(gpux_settlement::UsageOutcome::Accepted { charge_minor, .. }) => {
                self.metrics.usage_accepted.inc();
                ServerMessage::UsageAccepted { id, journal_seq, duplicate: false, charged_minor: charge_minor }
            }
            Ok(gpux_settlement::UsageOutcome::Duplicate) => {
                self.metrics.usage_accepted.inc();
                ServerMessage::UsageAccepted { id, journal_seq, duplicate: true, charged_minor: 0 }
            }
            Err(code) => {
                self.metrics.usage_refused.with_label_values(&[code.name()]).inc();
                ServerMessage::UsageRejected { id, journal_seq, code, message: code.message().to_string() }
            }
        };
        self.reply(connection, reply);
    }

    /// Queues what an entry owes: market data once per feed, private events
    /// and delivery messages once per account (one shared frame).
    /// The notices are moved out of `applied` into frames (not copied).
    fn route(&mut self, applied: &mut Applied) {
        self.metrics.observe_events(&applied.events);
        self.transfers.extend_from_slice(&applied.transfers);
        self.archived.append(&mut applied.archived);
        for mut notice in applied.notices.drain(..) {
            // A job's attempt goes to its host with the token for its files
            // (the market, pure, holds no key to sign one).
            if let ServerMessage::JobAssigned { lease, store: store @ None, .. } = &mut notice.message {
                *store = self.host_store_grant(*lease);
            }
            let frame = SharedFrame::new(notice.message);
            match notice.to {
                Audience::Feed(channel, instrument) => self.pending.push((Target::Feed(channel, instrument), Pending::Frame(frame))),
                Audience::Accounts(accounts) => {
                    for account in accounts.into_iter().flatten() {
                        self.pending.push((Target::Account(account), Pending::Frame(frame.clone())));
                    }
                }
            }
        }
    }

    /// The account a connection logged in as.
    fn account(&self, connection: ConnectionId) -> Option<AccountId> {
        self.sessions.get(connection).and_then(|c| c.account)
    }

    fn reply(&mut self, connection: ConnectionId, message: ServerMessage) {
        self.pending.push((Target::Connection(connection), Pending::Frame(SharedFrame::new(message))));
    }

    /// Rewrites the book-depth gauges, at most once a second.
    fn refresh_depth(&mut self) {
        let now = self.market.clock_ms();
        if now < self.depth_refreshed_ms + 1_000 {
            return;
        }
        self.depth_refreshed_ms = now;
        // Expired windows drop out of the gauges.
        self.metrics.book_quantity.reset();
        let engine = self.market.engine();
        for instrument in engine.listed_instruments() {
            for (side, name) in [(gpux_engine::Side::Buy, "bid"), (gpux_engine::Side::Sell, "ask")] {
                let quantity: u64 = engine.depth(instrument.instrument, side).iter().map(|(_, q)| q).sum();
                self.metrics.book_quantity.with_label_values(&[instrument.symbol.as_str(), name]).set(quantity as i64);
            }
        }
    }

    /// Sends everything a batch produced, now that it is durable. A
    /// connection whose queue is full is told to close as a slow consumer.
    fn release(&mut self, pending: Vec<(Target, Pending)>) {
        for (target, item) in pending {
            match (target, item) {
                (Target::Connection(connection), Pending::Frame(frame)) => self.send(connection, Outgoing::Frame(frame)),
                (Target::Connection(connection), Pending::Control(control)) => self.send(connection, control),
                (Target::Account(account), Pending::Frame(frame)) => {
                    for connection in self.sessions.of(account) {
                        self.send(connection, Outgoing::Frame(frame.clone()));
                    }
                }
                (Target::Feed(channel, instrument), Pending::Frame(frame)) => self.fanout.publish((channel, instrument), frame),
                (_, Pending::Control(_)) => unreachable!("controls go to one connection"),
            }
        }
    }

    fn send(&mut self, connection: ConnectionId, outgoing: Outgoing) {
        let Some(state) = self.sessions.get(connection) else { return };
        // Private frames are never dropped: a connection that cannot take
        // one more is closed instead (the gateway counts it).
        if let Err(QueueError::Full) = state.outbound.frames.try_send(outgoing) {
            state.outbound.too_slow.notify_one();
            self.disconnect(connection, false);
        }
    }
}

/// Moves what is queued into `batch`, up to `BATCH_MAX` in all.
fn take_queued(requests: &Receiver<Request>, batch: &mut Vec<Request>) {
    while batch.len() < BATCH_MAX {
        match requests.try_recv() {
            Ok(request) => batch.push(request),
            Err(_) => break,
        }
    }
}

fn error(id: Option<u64>, code: ErrorCode) -> ServerMessage {
    ServerMessage::Error { id, code, message: code.message().to_string() }
}
