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
//! **Pipelined commit** (`commit.rs`): while batch k is written and
//! fsynced on the journal thread, the sequencer applies batch k+1; k's
//! output is released only once k is on disk, and k+1 is handed over only
//! then. A batch without journal entries (queries) releases behind the
//! batch in flight, never ahead of it. Requests that read the journal or
//! change who receives what (logins, subscriptions, disconnects, every
//! query but the hot path's orders, bids and usage reports; see
//! [`pipelined`]) first wait for the batch in flight, so they see every
//! commit before them.
//!
//! Files: `mod.rs` the loop: batching and handling; `commit.rs` the
//! journal thread and the batch in flight; `commands.rs` commands and usage
//! reports journaled and answered; `release.rs` what a batch produced,
//! routed and sent once durable; `disk_low.rs` new work refused while the
//! disk is down to the journal's reserve; `recovery.rs` the restart from
//! snapshot plus journal and the snapshots taken; `sessions.rs` logins,
//! subscriptions and disconnects; `delivery.rs` lease delivery requests;
//! `queries.rs` read-only answers.

mod access;
mod challenges;
mod commands;
mod commit;
mod delivery;
mod disk_low;
mod fanout;
mod jobs;
mod liveness;
mod opening;
mod queries;
mod recovery;
mod release;
mod services;
mod session_table;
mod sessions;
#[cfg(test)]
mod tests;
mod volumes;

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use crossbeam_channel::{Receiver, RecvTimeoutError};
use gpux_engine::{AccountId, Command, InstrumentId, LeaseId, OrderId};
use gpux_market::{Applied, JournalEntry, MarketError, MarketState};
use gpux_protocol::{Channel, ErrorCode, ServerMessage};

use crate::metrics::Metrics;
use crate::snapshots::SnapshotWriter;
use gpux_gateway::link::{Body, Clock, ConnectionId, Outgoing, Request, SharedFrame};

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

pub struct Sequencer {
    market: MarketState,
    clock: Clock,
    /// The apply stage: what the batch in hand journals and produces.
    batch: Batch,
    /// The commit stage: the journal, its thread, the batch on its way.
    commit: commit::Commit,
    /// The release stage: open connections, the accounts' present
    /// sessions, key expiries.
    sessions: session_table::Sessions,
    /// The release stage: market data's feeds, local and down remote
    /// gateways' links.
    fanout: fanout::FanOut,
    /// The snapshot replica, fed every committed batch.
    snapshots: SnapshotWriter,
    metrics: Arc<Metrics>,
    depth_refreshed_ms: u64,
    /// Renters' logs and exec requests waiting for their hosts.
    host_waits: delivery::HostWaits,
    /// When each GPU is next challenged.
    challenges: challenges::Schedule,
    /// How long a job's lease may be silent before its delivery fails.
    job_silence_ms: u64,
    /// The operator's storage price (minor units per GiB-month), journaled
    /// as `StorageRules` when the market's differs and volumes exist.
    storage_minor_per_gib_month: u64,
    operator_keys: BTreeSet<[u8; 32]>,
    /// Who may open an account, and the counts per address.
    openings: opening::Openings,
    /// Signs job store tokens, where the exchange runs a job store.
    job_store: Option<crate::job_store::Issuer>,
    /// The invoices' worker (none in the sequencer's own tests).
    invoices: Option<crate::invoices::InvoiceDesk>,
    /// The data directory's free space against the journal's reserve
    /// (none in the sequencer's own tests).
    disk: Option<crate::disk::DiskState>,
    /// Set from outside to end `run` (a cluster node that stops leading);
    /// looked at between batches, at least once a second.
    stop: Arc<std::sync::atomic::AtomicBool>,
}

/// What the batch in hand journals and produces, until it is committed.
#[derive(Default)]
struct Batch {
    /// The sequence number its first entry gets.
    first_seq: u64,
    /// Its inputs, journaled before anything below is sent.
    entries: Vec<JournalEntry>,
    /// Its transfers, committed with its journal entries.
    transfers: Vec<gpux_settlement::ledger::Transfer>,
    /// What it archived, written to the journal's archive in its commit.
    archived: gpux_market::Archived,
    /// What it produced, in release order.
    pending: Vec<(Target, Pending)>,
    /// Its first broken invariant: nothing of it is released.
    fatal: Option<SequencerError>,
}

impl Batch {
    /// Whether it has anything to commit.
    fn to_commit(&self) -> bool {
        !self.entries.is_empty() || !self.archived.is_empty()
    }
}

/// Whether a request may be handled while the batch before it is still
/// on its way to disk: the hot path (orders, bids, usage reports), which
/// reads no journal and changes no connection's audience. Everything else
/// waits for the batch in flight first.
fn pipelined(body: &Body) -> bool {
    matches!(body, Body::Command { .. } | Body::Bid { .. } | Body::Usage { .. })
}

enum Target {
    Connection(ConnectionId),
    Account(AccountId),
    Feed(Channel, InstrumentId),
    /// The job store (with `Pending::Purge`).
    Store,
}

enum Pending {
    Frame(Arc<SharedFrame>),
    Control(Outgoing),
    /// A deleted volume's files to remove, once its deletion is durable.
    Purge(AccountId, gpux_protocol::VolumeId),
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
            if batch.is_empty() && !self.commit.in_flight() {
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
        self.charge_storage();
        self.end_due_exit_holds();
        self.expire_logs_requests();
        self.expire_sessions();
        if let Some(fatal) = self.batch.fatal.take() {
            return Err(fatal);
        }
        if self.batch.to_commit() {
            self.submit()?;
        } else if !self.commit.queue_behind(&mut self.batch.pending) {
            let pending = std::mem::take(&mut self.batch.pending);
            self.release(pending);
        }
        self.refresh_depth();
        Ok(())
    }

    /// With a batch in flight, handles requests as they arrive until it is
    /// on disk (then releases it) or the batch holds `BATCH_MAX`. A request
    /// that may not pass the batch in flight waits for it first.
    fn gather(&mut self, requests: &Receiver<Request>, handled: &mut usize) -> Result<(), SequencerError> {
        while *handled < BATCH_MAX && self.batch.fatal.is_none() {
            let Some(done) = self.commit.done() else { return Ok(()) };
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

    fn handle(&mut self, request: Request) {
        if !self.permitted(&request) {
            return;
        }
        if self.disk.as_ref().is_some_and(crate::disk::DiskState::low) && disk_low::new_work(&request.body) {
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
            Body::Bid { command, workload, rematch, volumes } => self.bid(connection, id, *command, workload, rematch, volumes),
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
            Body::Service { request } => self.service(connection, id, request),
            Body::Volume { request } => self.volume(connection, id, request),
        }
    }

    /// Journals one entry and applies it to the market; returns its journal
    /// sequence number and what it caused (already routed for release). After
    /// a broken invariant nothing more is applied and the batch is dropped.
    fn journal(&mut self, entry: JournalEntry) -> Option<(u64, Applied)> {
        if self.batch.fatal.is_some() {
            return None;
        }
        let applied = match self.market.apply(&entry) {
            Ok(applied) => applied,
            Err(error) => {
                tracing::error!(%error, "market invariant broken; stopping");
                self.batch.fatal = Some(error.into());
                return None;
            }
        };
        self.batch.entries.push(entry);
        let journal_seq = self.batch.first_seq + self.batch.entries.len() as u64 - 1;
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

    /// The account a connection logged in as.
    fn account(&self, connection: ConnectionId) -> Option<AccountId> {
        self.sessions.get(connection).and_then(|c| c.account)
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
