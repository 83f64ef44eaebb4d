//! gpux-market: the market as pure sequenced state, and the one way it
//! changes.
//!
//! [`MarketState`] holds everything a journal rebuilds: the matching engine,
//! settlement's usage chains and meters, the double-entry ledger, the
//! binding of public keys to accounts, lease delivery records, market-data
//! sequence numbers and the rolling 24-hour statistics. [`MarketState::apply`]
//! takes one [`JournalEntry`] and returns what it caused ([`Applied`]): the
//! engine's events, the ledger's transfers, and the messages each account and
//! each market-data feed is owed. The exchange's sequencer (live and in
//! recovery), the simulator and the audit replay all call it; there is no
//! other path, so they cannot disagree about what a journal means.
//!
//! No IO, no clocks, no threads: time comes from the entries. Queries never
//! change the state, so answering them cannot make a live exchange differ
//! from a replay of its journal.

pub mod challenges;
pub mod delivery;
pub mod disputes;
pub mod entry;
pub mod jobs;
pub mod keys;
pub mod reliability;
pub mod rematch;
mod routing;
pub mod scaling;
pub mod services;
pub mod stats;
pub mod telemetry;
pub mod volumes;

use std::collections::BTreeMap;

use gpux_engine::state_hash::StateHasher;
use gpux_engine::{AccountId, Command, Engine, EngineConfig, Event, EventKind, InstrumentId, LeaseId, OrderOptions};
use gpux_protocol::{Channel, DeliveryState, ErrorCode, ServerMessage, UsageRejectCode};
use gpux_settlement::ledger::{Ledger, LedgerError, Transfer};
use gpux_settlement::{settle_report, Settlement, UsageOutcome};
use serde::{Deserialize, Serialize};

pub use delivery::{Assigned, Deliveries, HostEncryptionKey, LeaseDelivery};
pub use entry::JournalEntry;
pub use stats::{DayStats, RollingStats};

/// Why an entry could not be applied. Every one is a broken invariant (the
/// state may be half-changed): the caller stops rather than go on.
#[derive(Debug, thiserror::Error)]
pub enum MarketError {
    #[error("ledger invariant broken: {0}")]
    Ledger(#[from] LedgerError),
    /// A genesis entry after the market had started.
    #[error("a genesis listing is only the journal's first entry")]
    GenesisNotFirst,
    /// A genesis listing the engine refuses (the journal was not written by an exchange that validated it).
    #[error("the genesis listing is invalid: {0}")]
    GenesisInvalid(gpux_engine::config::ConfigError),
}

/// Who a message is for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Audience {
    /// Every session of these accounts (one or two, deduplicated).
    Accounts([Option<AccountId>; 2]),
    /// Every subscriber of a market-data feed.
    Feed(Channel, InstrumentId),
}

impl Audience {
    pub fn account(account: AccountId) -> Audience {
        Audience::Accounts([Some(account), None])
    }
}

/// A message the entry owes someone, in the order it must be sent.
#[derive(Clone, Debug, PartialEq)]
pub struct Notice {
    pub to: Audience,
    pub message: ServerMessage,
}

/// What applying one entry caused.
#[derive(Clone, Debug, Default)]
pub struct Applied {
    /// The engine's events (for a usage report: those of its charge).
    pub events: Vec<Event>,
    /// The ledger's postings for those events.
    pub transfers: Vec<Transfer>,
    /// Private events, market data and delivery messages, in release order.
    pub notices: Vec<Notice>,
    /// A usage report's outcome.
    pub usage: Option<Result<UsageOutcome, UsageRejectCode>>,
    /// A delivery status that is the lease's first `running`.
    pub first_running: bool,
    /// Commands the market rules call for next (a host failure ends its
    /// lease; a job bids again): the live sequencer journals and applies
    /// each as its own entry, in order, so a replay meets them in the
    /// journal and does not act on this.
    pub follow_ups: Vec<Command>,
    /// A `SubmitJob` entry's job, or why it was refused.
    pub job: Option<Result<jobs::JobId, jobs::JobRefusal>>,
    /// A service entry's service, or why it was refused.
    pub service: Option<Result<gpux_protocol::ServiceId, gpux_protocol::ErrorCode>>,
    /// The volume a volume entry created or deleted (state `deleted`), or why not.
    pub volume: Option<Result<Box<gpux_protocol::VolumeInfo>, gpux_protocol::ErrorCode>>,
    /// Volumes deleted by this entry: their files are to be removed from
    /// the store.
    pub volumes_purged: Vec<(AccountId, gpux_protocol::VolumeId)>,
    /// The reason of an autoscaling decision the entry made (for metrics).
    pub scaled: Option<&'static str>,
    /// What left the hot state with this entry: the exchange keeps it in
    /// its archive, where queries still find it.
    pub archived: Archived,
}

/// What one entry took out of the hot state.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Archived {
    /// Leases [`LEASE_RETENTION_MS`] after their bill became final, as they
    /// ended, each with its delivery record (workload, sealed as it came,
    /// and last status) if it had one.
    pub leases: Vec<ArchivedLease>,
    /// Contracts of reserved windows [`LEASE_RETENTION_MS`] after they
    /// expired, as they ended.
    pub contracts: Vec<gpux_engine::ContractInfo>,
    /// Reserved windows [`WINDOW_RETENTION_MS`] after they expired (once
    /// their leases left), as they were listed.
    pub instruments: Vec<gpux_engine::InstrumentInfo>,
    /// Trades the entry printed, for the exchange's history index
    /// (docs/protocol.md "History"); nothing left the hot state with them.
    pub trades: Vec<gpux_protocol::TradeRecord>,
}

impl Archived {
    pub fn is_empty(&self) -> bool {
        self.leases.is_empty() && self.contracts.is_empty() && self.instruments.is_empty() && self.trades.is_empty()
    }

    pub fn append(&mut self, other: &mut Archived) {
        self.leases.append(&mut other.leases);
        self.contracts.append(&mut other.contracts);
        self.instruments.append(&mut other.instruments);
        self.trades.append(&mut other.trades);
    }

    pub fn clear(&mut self) {
        self.leases.clear();
        self.contracts.clear();
        self.instruments.clear();
        self.trades.clear();
    }
}

/// A lease as it left the hot state.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ArchivedLease {
    pub info: gpux_engine::LeaseInfo,
    pub delivery: Option<LeaseDelivery>,
    /// The instrument it traded on (empty if unknown: archived before
    /// symbols were kept).
    pub symbol: String,
}

/// How long after a preempted lease's end its host may report the workload
/// stopped before the preemption counts as honoured late.
pub const PREEMPTION_STOP_MS: u64 = 60_000;

/// Resting asks of a book a job's new attempt reads to price it there
/// (`MarketState::choose_job_book`), best first.
pub const JOB_QUOTE_OFFERS_MAX: usize = 512;

/// How long a lease stays in the hot state after its billing closed.
pub const LEASE_RETENTION_MS: u64 = 60 * 60_000;

/// How long an expired reserved window stays in the hot state (its 24-hour
/// statistics and market-data feeds still answer); its contracts leave after
/// [`LEASE_RETENTION_MS`], and it waits for its last lease to leave.
pub const WINDOW_RETENTION_MS: u64 = 24 * 60 * 60_000;

/// Where a signed observation's signature stands when the market checks it
/// before it is journaled.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Signature {
    /// The check verifies it (one at a time, the sequencer's way).
    Unchecked,
    /// The caller verified it against this key (the simulator, in ZIP-215
    /// batches); the check holds the key to the signer's.
    VerifiedWith([u8; 32]),
}

/// The whole state a journal rebuilds. `clock_ms` is the newest exchange time
/// seen; it is kept for restarts but is not part of [`state_hash`](Self::state_hash)
/// (the live exchange also advances it between entries).
#[derive(Clone, Serialize, Deserialize)]
pub struct MarketState {
    engine: Engine,
    settlement: Settlement,
    ledger: Ledger,
    /// API keys: owner keys bound at login, keys added and revoked.
    keys: keys::Keys,
    deliveries: Deliveries,
    book_seq: BTreeMap<InstrumentId, u64>,
    trade_seq: BTreeMap<InstrumentId, u64>,
    stats: RollingStats,
    /// Suppliers' and hosts' reliability records (the scores' facts).
    reliability: reliability::Reliability,
    /// Spot bids and leases covered by re-match.
    rematch: rematch::Rematch,
    /// Jobs and their leases (docs/jobs.md "A job's life").
    jobs: jobs::Jobs,
    /// Hardware challenges in flight.
    challenges: challenges::Challenges,
    /// Renters' liveness evidence against suppliers' reports, and renters'
    /// dispute records.
    disputes: disputes::Disputes,
    /// Preempted leases whose workload the host has not yet reported
    /// stopped, with the time they ended.
    preempted: BTreeMap<LeaseId, u64>,
    /// The UTC day the engine's supplier scores were last all refreshed.
    scores_day: u64,
    /// Leases' recent telemetry from accepted usage reports.
    telemetry: telemetry::Telemetry,
    /// Services and their replicas (docs/services.md).
    services: services::Services,
    /// Renters' volumes and the leases and bids that hold them (docs/storage.md).
    volumes: volumes::Volumes,
    clock_ms: u64,
}

impl MarketState {
    pub fn new(config: EngineConfig) -> Result<MarketState, gpux_engine::config::ConfigError> {
        Ok(MarketState::from_engine(Engine::new(config)?))
    }

    /// A market around an engine (whose history it did not see: use a new engine).
    pub fn from_engine(engine: Engine) -> MarketState {
        MarketState {
            engine,
            settlement: Settlement::default(),
            ledger: Ledger::new(),
            keys: keys::Keys::default(),
            deliveries: Deliveries::default(),
            book_seq: BTreeMap::new(),
            trade_seq: BTreeMap::new(),
            stats: RollingStats::default(),
            reliability: reliability::Reliability::default(),
            rematch: rematch::Rematch::default(),
            jobs: jobs::Jobs::default(),
            challenges: challenges::Challenges::default(),
            disputes: disputes::Disputes::default(),
            preempted: BTreeMap::new(),
            scores_day: 0,
            telemetry: telemetry::Telemetry::default(),
            services: services::Services::default(),
            volumes: volumes::Volumes::default(),
            clock_ms: 0,
        }
    }

    /// Whether nothing has happened in this market yet (no entry applied
    /// that moved its clock or caused an event): where a genesis listing
    /// may still replace its listing.
    pub fn is_pristine(&self) -> bool {
        self.clock_ms == 0 && self.engine.next_event_seq() == 1
    }

    /// Jobs and their states (docs/jobs.md "A job's life").
    pub fn jobs(&self) -> &jobs::Jobs {
        &self.jobs
    }

    /// Services and their replicas (docs/services.md).
    pub fn services(&self) -> &services::Services {
        &self.services
    }

    /// Renters' volumes (docs/storage.md).
    pub fn volumes(&self) -> &volumes::Volumes {
        &self.volumes
    }

    /// Applies one journal entry. The only way the market changes.
    pub fn apply(&mut self, entry: &JournalEntry) -> Result<Applied, MarketError> {
        let mut applied = Applied::default();
        if let Some(at_ms) = entry.at_ms() {
            self.clock_ms = self.clock_ms.max(at_ms);
        }
        // Messages the entry itself owes, sent after those of its events.
        let mut owed = Vec::new();
        match entry {
            JournalEntry::Genesis { listing } => self.genesis(listing)?,
            JournalEntry::Engine(input) => self.apply_engine(input, &mut applied, &mut owed),
            JournalEntry::SubmitJob { at_ms, terms } => self.submit_job(*at_ms, terms, &Default::default(), &mut applied, &mut owed),
            JournalEntry::SubmitJobV2 { at_ms, terms, recovery } => self.submit_job(*at_ms, terms, recovery, &mut applied, &mut owed),
            JournalEntry::JobExitHoldEnded { at_ms, job } => {
                let outcome = self.jobs.exit_hold_ended(*job, *at_ms);
                self.job_outcome(outcome, &mut applied, &mut owed);
            }
            JournalEntry::CancelJob { at_ms, account, job } => {
                let outcome = self.jobs.cancel(*job, *account, *at_ms);
                self.job_outcome(outcome, &mut applied, &mut owed);
            }
            JournalEntry::ResizeJob { at_ms: _, account, job, gpus } => {
                if let Ok(outcome) = self.jobs.resize(*job, *account, *gpus) {
                    self.job_outcome(outcome, &mut applied, &mut owed);
                }
            }
            JournalEntry::JobLeaseSilent { at_ms: _, lease } => self.job_lease_silent(*lease, &mut applied),
            JournalEntry::CreateService { at_ms, account, spec } => {
                let terms = services::ServiceTerms::default();
                let created = self.services.create(*account, (**spec).clone(), terms, *at_ms).map(|(service, outcome)| {
                    self.service_outcome(outcome, &mut applied, &mut owed);
                    service
                });
                applied.service = Some(created);
            }
            JournalEntry::CreateServiceV2 { at_ms, account, spec, terms } => {
                let created = self.services.create(*account, (**spec).clone(), terms.clone(), *at_ms).map(|(service, outcome)| {
                    self.service_outcome(outcome, &mut applied, &mut owed);
                    service
                });
                applied.service = Some(created);
            }
            JournalEntry::ScaleService { at_ms, account, service, replicas } => {
                let scaled = self.services.scale(*service, *account, *replicas, *at_ms).map(|outcome| {
                    self.service_outcome(outcome, &mut applied, &mut owed);
                    *service
                });
                applied.service = Some(scaled);
            }
            JournalEntry::ServiceLoad { at_ms, account, service, router, load } => {
                let observed = self.services.load(*service, *account, *router, *load, *at_ms).map(|outcome| {
                    applied.scaled = outcome.scaled;
                    self.service_outcome(outcome, &mut applied, &mut owed);
                    *service
                });
                applied.service = Some(observed);
            }
            JournalEntry::UpdateService { at_ms, account, service, run } => {
                let updated = self.services.update(*service, *account, run.clone(), *at_ms).map(|outcome| {
                    self.service_outcome(outcome, &mut applied, &mut owed);
                    *service
                });
                applied.service = Some(updated);
            }
            JournalEntry::DeleteService { at_ms, account, service } => {
                let deleted = self.services.delete(*service, *account, *at_ms).map(|outcome| {
                    self.service_outcome(outcome, &mut applied, &mut owed);
                    *service
                });
                applied.service = Some(deleted);
            }
            JournalEntry::CreateVolume { at_ms, account, name, size_gib } => {
                let created = self.volumes.create(*account, name, *size_gib, *at_ms);
                applied.volume =
                    Some(created.and_then(|id| self.volumes.info(id).map(Box::new).ok_or(gpux_protocol::ErrorCode::UnknownVolume)));
            }
            JournalEntry::DeleteVolume { at_ms, account, name } => {
                let deleted = self.volumes.delete(*account, name, *at_ms).map(|(info, due)| {
                    self.volume_removed(&info, due, &mut applied);
                    Box::new(info)
                });
                applied.volume = Some(deleted);
            }
            JournalEntry::BidVolumes { account, client_order_id, mounts } => {
                // Checked by the sequencer against this same state: a
                // refusal here only repeats one it already answered.
                let _ = self.volumes.bid_volumes(*account, *client_order_id, mounts, self.clock_ms);
            }
            JournalEntry::StorageRules { at_ms, minor_per_gib_month } => {
                let owed = self.volumes.set_price(*minor_per_gib_month, *at_ms);
                applied.follow_ups.extend(owed.into_iter().map(|(account, amount_minor)| Command::ChargeStorage { account, amount_minor }));
            }
            JournalEntry::StorageCharge { at_ms } => self.charge_storage(*at_ms, &mut applied, &mut owed),
            JournalEntry::BindKey { public_key, account } => self.keys.bind(*public_key, *account),
            JournalEntry::SignatureRule { rule } => self.settlement.set_signature_rule(*rule),
            JournalEntry::JobRules { version } => self.jobs.adopt_rules(*version),
            JournalEntry::AddKey { at_ms, by, account, public_key, scopes, expires_at_ms, label } => {
                self.add_key(*at_ms, *by, None, *account, public_key, scopes, *expires_at_ms, label)
            }
            JournalEntry::AddKeyBy { at_ms, by, by_key, account, public_key, scopes, expires_at_ms, label } => {
                self.add_key(*at_ms, *by, Some(*by_key), *account, public_key, scopes, *expires_at_ms, label)
            }
            JournalEntry::RevokeKey { at_ms: _, by, public_key } => self.revoke_key(*by, public_key),
            JournalEntry::UsageReport { at_ms, account, report } | JournalEntry::UsageReportV2 { at_ms, account, report } => {
                self.apply_usage(*at_ms, *account, report, &mut applied)
            }
            JournalEntry::BidWorkload { account, client_order_id, workload } => {
                self.deliveries.bid_workload(*account, *client_order_id, workload.clone())
            }
            JournalEntry::BidRematch { account, client_order_id } => self.rematch.bid_rematch(*account, *client_order_id),
            JournalEntry::LeaseWorkload { account: _, lease, workload } => self.set_lease_workload(*lease, workload, &mut owed),
            JournalEntry::EncryptionKey { account, key, signature } => self.set_encryption_key(*account, key, signature),
            JournalEntry::ChallengeIssued { at_ms, gpu, seed, n } => self.issue_challenge(*at_ms, *gpu, seed, *n, &mut owed),
            JournalEntry::MemoryChallengeIssued { at_ms, gpu, seed, words_log2, passes } => {
                self.issue_memory_challenge(*at_ms, *gpu, seed, (*words_log2, *passes), &mut owed)
            }
            JournalEntry::ChallengeCommitted { at_ms, account: _, challenge, commitment, open_seed } => {
                self.challenges.commit(*challenge, *commitment, *open_seed, *at_ms)
            }
            JournalEntry::ChallengeAnswered { at_ms: _, account: _, challenge, verdict } => {
                self.close_challenge(*challenge, Some(*verdict), &mut applied)
            }
            JournalEntry::ChallengeExpired { at_ms: _, challenge } => self.close_challenge(*challenge, None, &mut applied),
            JournalEntry::FabricProbe { at_ms: _, account: _, report } => applied.follow_ups.push(fabric_probed(&report.body)),
            JournalEntry::Liveness { at_ms, account, report } => {
                let found = self.disputes.observe(*account, report);
                applied.follow_ups.extend(self.disputed(report.body.lease, found, *at_ms))
            }
            JournalEntry::GpuProbe { at_ms, account, report } => {
                let found = self.disputes.probed(*account, report);
                applied.follow_ups.extend(self.disputed(report.body.lease, found, *at_ms))
            }
            JournalEntry::SupplierDisconnected { at_ms, account } => self.supplier_disconnected(*at_ms, *account),
            JournalEntry::DeliveryStatus { at_ms, account, lease, state } => {
                self.apply_delivery_status(*at_ms, *account, *lease, state, &mut applied, &mut owed)
            }
        }
        self.post(&mut applied)?;
        applied.notices.extend(owed);
        Ok(applied)
    }

    /// The genesis listing: only as the market's first entry.
    fn genesis(&mut self, listing: &gpux_engine::EngineConfig) -> Result<(), MarketError> {
        if !self.is_pristine() {
            return Err(MarketError::GenesisNotFirst);
        }
        *self = MarketState::new(listing.clone()).map_err(MarketError::GenesisInvalid)?;
        Ok(())
    }

    /// A job submitted: its id (or why it was refused) in `applied.job`.
    fn submit_job(
        &mut self,
        at_ms: u64,
        terms: &jobs::JobTerms,
        recovery: &jobs::JobRecovery,
        applied: &mut Applied,
        owed: &mut Vec<Notice>,
    ) {
        let participant = self.engine.participant_of(terms.account);
        let submitted = self.jobs.submit(terms.clone(), recovery.clone(), participant, at_ms).map(|(job, outcome)| {
            self.job_outcome(outcome, applied, owed);
            job
        });
        applied.job = Some(submitted);
    }

    /// A job's lease whose host went silent fails its delivery (the job
    /// resumes elsewhere); one no longer active is forgotten.
    fn job_lease_silent(&mut self, lease: LeaseId, applied: &mut Applied) {
        match self.engine.lease(lease).filter(|l| l.active && (self.jobs.runs_on(lease) || self.services.runs_on(lease))) {
            Some(info) => applied.follow_ups.push(Command::FailLeaseDelivery { account: info.supplier, lease }),
            None => self.jobs.forget_heard(lease),
        }
    }

    fn revoke_key(&mut self, by: AccountId, public_key: &[u8; 32]) {
        if self.keys.check_revoke(&self.engine, by, public_key).is_ok() {
            self.keys.revoke(*public_key);
        }
    }

    /// A host's published encryption key: it delivers workloads from now.
    fn set_encryption_key(&mut self, account: AccountId, key: &[u8; 32], signature: &str) {
        self.deliveries.set_encryption_key(account, HostEncryptionKey { key: *key, signature: signature.to_string() });
        self.engine.set_delivering(account);
    }

    /// A challenge answered (its verdict) or expired (`None`): the engine
    /// records the GPU's result.
    fn close_challenge(
        &mut self,
        challenge: u64,
        verdict: Option<Result<(), gpux_protocol::challenge::ChallengeError>>,
        applied: &mut Applied,
    ) {
        if let Some((gpu, answer)) = self.challenges.close(challenge, verdict) {
            applied.follow_ups.push(Command::RecordChallenge { gpu, answer });
        }
    }

    /// A supplier's agent disconnected during its leases: counted in its
    /// reliability record.
    fn supplier_disconnected(&mut self, at_ms: u64, account: AccountId) {
        let leases = self.engine.active_leases_supplied(account);
        self.reliability.disconnected(&self.engine, account, &leases, at_ms);
        self.refresh_scores(&[account], at_ms);
    }

    /// A compute challenge issued to a GPU's owner.
    fn issue_challenge(&mut self, at_ms: u64, gpu: gpux_engine::GpuId, seed: &[u8; 32], n: u32, owed: &mut Vec<Notice>) {
        let Some(owner) = self.engine.gpu(gpu).map(|g| g.owner) else { return };
        let challenge = self.challenges.issue(gpu, owner, *seed, n, at_ms);
        let expires_at_ms = self.challenges.get(challenge).map_or(at_ms, |p| p.expires_at_ms());
        owed.push(Notice {
            to: Audience::account(owner),
            message: ServerMessage::GpuChallenge { challenge, gpu, seed: hex::encode(seed), n, expires_at_ms },
        });
    }

    /// A memory challenge (`(words_log2, passes)`) issued to a GPU's owner.
    fn issue_memory_challenge(&mut self, at_ms: u64, gpu: gpux_engine::GpuId, seed: &[u8; 32], size: (u32, u32), owed: &mut Vec<Notice>) {
        let Some(owner) = self.engine.gpu(gpu).map(|g| g.owner) else { return };
        let challenge = self.challenges.issue_memory(gpu, owner, *seed, size, at_ms);
        let expires_at_ms = self.challenges.get(challenge).map_or(at_ms, |p| p.expires_at_ms());
        let (words_log2, passes) = size;
        owed.push(Notice {
            to: Audience::account(owner),
            message: ServerMessage::GpuMemoryChallenge { challenge, gpu, seed: hex::encode(seed), words_log2, passes, expires_at_ms },
        });
    }

    /// A renter's workload for its lease, sent to the lease's host.
    fn set_lease_workload(&mut self, lease: LeaseId, workload: &gpux_protocol::Workload, owed: &mut Vec<Notice>) {
        let Some(supplier) = self.engine.lease(lease).map(|l| l.supplier) else { return };
        let workload = Box::new(workload.clone());
        self.deliveries.set_lease_workload(lease, supplier, workload.clone());
        owed.push(Notice { to: Audience::account(supplier), message: ServerMessage::Workload { lease, workload } });
    }

    /// An engine command: the scores' day, the bid's region and workload
    /// terms, the engine's events and what follows from them (records,
    /// archiving, workloads to hosts, replacements, jobs).
    fn apply_engine(&mut self, input: &gpux_engine::Input, applied: &mut Applied, owed: &mut Vec<Notice>) {
        // A new UTC day moves every score's window: the engine matches
        // this entry's bids with today's scores.
        let day = input.at_ms / reliability::MS_PER_DAY;
        if day > self.scores_day {
            self.scores_day = day;
            let suppliers: Vec<AccountId> = self.reliability.suppliers().collect();
            self.refresh_scores(&suppliers, input.at_ms);
        }
        // A bid in some regions (not a cluster bid's): a replacement keeps them.
        if let Command::Place { order, regions, cluster: None, .. } = &input.command {
            if !regions.is_empty() {
                self.rematch.bid_regions(order.account, order.client_order_id, regions);
            }
        }
        // A bid that carries a workload (its own, the failed lease's that
        // a replacement takes over, or a job's attempt) trades only with
        // suppliers that can deliver it.
        if let Some(order) = input.command.new_order() {
            let replaces = order.client_order_id.checked_sub(rematch::REPLACEMENT_CLIENT_ORDER_ID_BASE).map(LeaseId);
            if self.deliveries.bid_has_workload(order.account, order.client_order_id)
                || (self.jobs.rules() >= 1 && self.jobs.is_job_bid(order.account, order.client_order_id))
                || self.services.is_service_bid(order.account, order.client_order_id)
                || replaces.is_some_and(|failed| self.deliveries.lease(failed).is_some_and(|d| d.workload.is_some()))
            {
                self.engine.expect_workload(order.account, order.client_order_id);
            }
        }
        applied.events.extend_from_slice(self.engine.apply(input));
        // Before archiving: the facts name leases still held.
        let mut touched = self.reliability.observe(&self.engine, &applied.events);
        touched.extend(self.watch_preemptions(&applied.events));
        self.refresh_scores(&touched, input.at_ms);
        self.archive(input.at_ms, applied);
        // A lease's volumes reach its host before its workload.
        if !self.volumes.is_empty() {
            self.watch_storage_funds(&applied.events, owed);
            let rematch = &self.rematch;
            for attached in self.volumes.observe(&applied.events, |lease| rematch.covers(lease)) {
                owed.push(Notice {
                    to: Audience::account(attached.supplier),
                    message: ServerMessage::VolumesAttached {
                        lease: attached.lease,
                        renter: attached.renter,
                        volumes: attached.volumes,
                        store: None,
                    },
                });
            }
        }
        for assigned in self.deliveries.observe(&applied.events) {
            owed.push(Notice {
                to: Audience::account(assigned.supplier),
                message: ServerMessage::Workload { lease: assigned.lease, workload: assigned.workload },
            });
        }
        let rematched = self.rematch.observe(&applied.events);
        applied.follow_ups.extend(rematched.replacement.map(|(order, regions)| Command::Place {
            order,
            options: OrderOptions::default(),
            regions,
            cluster: None,
        }));
        let jobs = self.jobs.observe(&applied.events);
        self.job_outcome(jobs, applied, owed);
        if !self.services.is_empty() {
            let services = self.services.observe(&applied.events);
            self.service_outcome(services, applied, owed);
        }
        self.watch_job_preemptions_ahead(applied, owed);
        self.hand_over_workloads(rematched.replaced, owed);
    }

    /// Storage charged to `at_ms` (each account's share a follow-up
    /// `ChargeStorage`); accounts whose debt is repaid are paid up; volumes
    /// unpaid past the grace and the notice are deleted, their owners told.
    fn charge_storage(&mut self, at_ms: u64, applied: &mut Applied, owed: &mut Vec<Notice>) {
        let charges = self.volumes.charge(at_ms);
        applied.follow_ups.extend(charges.into_iter().map(|(account, amount_minor)| Command::ChargeStorage { account, amount_minor }));
        for account in self.volumes.unpaid_accounts() {
            if self.engine.balances(account).is_some_and(|b| b.debt_minor == 0) && self.volumes.paid_up(account) {
                self.tell_volumes(account, owed);
            }
        }
        for (info, due) in self.volumes.delete_unpaid(at_ms) {
            self.volume_removed(&info, due, applied);
            owed.push(Notice { to: Audience::account(info.owner), message: ServerMessage::VolumeUpdate { volume: Box::new(info) } });
        }
    }

    /// A removed volume's last storage charged, its files to be purged.
    fn volume_removed(&mut self, info: &gpux_protocol::VolumeInfo, due: u64, applied: &mut Applied) {
        if due > 0 {
            applied.follow_ups.push(Command::ChargeStorage { account: info.owner, amount_minor: due });
        }
        applied.volumes_purged.push((info.owner, info.volume));
    }

    /// Each of `account`'s volumes as it stands now, pushed to it.
    fn tell_volumes(&self, account: AccountId, owed: &mut Vec<Notice>) {
        for volume in self.volumes.of(account) {
            owed.push(Notice { to: Audience::account(account), message: ServerMessage::VolumeUpdate { volume: Box::new(volume) } });
        }
    }

    /// Storage charges that left accounts owing start their grace; debt
    /// repaid in full ends it (the owners told either way).
    fn watch_storage_funds(&mut self, events: &[gpux_engine::Event], owed: &mut Vec<Notice>) {
        for event in events {
            let changed = match event.kind {
                EventKind::StorageCharged { account, unpaid_minor, .. } if unpaid_minor > 0 => {
                    self.volumes.note_unpaid(account, event.at_ms).then_some(account)
                }
                EventKind::DebtRepaid { account, .. } => {
                    (self.engine.balances(account).is_some_and(|b| b.debt_minor == 0) && self.volumes.paid_up(account)).then_some(account)
                }
                _ => None,
            };
            if let Some(account) = changed {
                self.tell_volumes(account, owed);
            }
        }
    }

    /// Leases and windows past their retention leave the live state: the
    /// leases into `applied.archived` for the journal's archive.
    fn archive(&mut self, at_ms: u64, applied: &mut Applied) {
        let archive_by_ms = at_ms.saturating_sub(LEASE_RETENTION_MS);
        for (info, symbol) in self.engine.archive_leases_with_symbols(archive_by_ms) {
            self.ledger.forget_lease(info.lease);
            let delivery = self.deliveries.forget_lease(info.lease);
            self.rematch.forget_lease(info.lease);
            self.telemetry.forget_lease(info.lease);
            applied.archived.leases.push(ArchivedLease { info, delivery, symbol });
        }
        // An expired window's contracts leave too (nothing queries them;
        // the journal holds their history), and a day later the window.
        applied.archived.contracts = self.engine.archive_windows(archive_by_ms);
        applied.archived.instruments = self.engine.retire_windows(at_ms.saturating_sub(WINDOW_RETENTION_MS));
        for window in &applied.archived.instruments {
            self.book_seq.remove(&window.instrument);
            self.trade_seq.remove(&window.instrument);
            self.stats.forget(window.instrument);
        }
    }

    /// Each replacement of a failed lease takes over its workload (secrets
    /// sealed to the failed host's key wait for the renter), and the renter
    /// is told.
    fn hand_over_workloads(&mut self, replaced: Vec<(LeaseId, Option<LeaseId>, AccountId)>, owed: &mut Vec<Notice>) {
        for (failed, replacement, renter) in replaced {
            // The replacement takes over the failed lease's workload.
            let workload = self.deliveries.lease(failed).and_then(|d| d.workload.clone());
            let supplier = replacement.and_then(|lease| self.engine.lease(lease)).map(|l| l.supplier);
            if let (Some(lease), Some(supplier), Some(mut workload)) = (replacement, supplier, workload) {
                // Secrets sealed to the failed host's key do not open
                // on another: the new host waits for the renter to
                // seal them to its key (told by `lease_replaced`).
                let new_key = self.deliveries.encryption_key(supplier).map(|k| hex::encode(k.key));
                if workload
                    .sealed
                    .as_ref()
                    .is_some_and(|sealed| !new_key.as_ref().is_some_and(|key| sealed.recipient.eq_ignore_ascii_case(key)))
                {
                    workload.sealed = None;
                    workload.secrets_follow = true;
                }
                self.deliveries.set_lease_workload(lease, supplier, workload.clone());
                owed.push(Notice { to: Audience::account(supplier), message: ServerMessage::Workload { lease, workload } });
            }
            owed.push(Notice { to: Audience::account(renter), message: ServerMessage::LeaseReplaced { lease: failed, replacement } });
        }
    }

    /// A usage report: settled, recorded, and checked against the renter's
    /// liveness evidence.
    fn apply_usage(&mut self, at_ms: u64, account: AccountId, report: &gpux_protocol::UsageReport, applied: &mut Applied) {
        let key = self.account_key(account).unwrap_or([0; 32]);
        let (outcome, events) = settle_report(&mut self.engine, &mut self.settlement, &key, at_ms, account, report);
        match outcome {
            Err(code) => {
                self.reliability.refused(&self.engine, account, report.body.lease, code, at_ms);
                self.refresh_scores(&[account], at_ms);
            }
            Ok(UsageOutcome::Accepted { verified_ms, .. }) => {
                self.telemetry.record(&report.body);
                self.jobs.heard(report.body.lease, account, at_ms);
                self.services.heard(report.body.lease, account, at_ms);
                if let Some(renter) = self.engine.lease(report.body.lease).map(|l| l.renter) {
                    let found = self.disputes.claimed(renter, &report.body, verified_ms);
                    applied.follow_ups.extend(self.disputed(report.body.lease, found, at_ms));
                }
            }
            Ok(UsageOutcome::Duplicate) => {}
        }
        applied.events = events;
        applied.usage = Some(outcome);
    }

    /// A host's delivery status: a late preemption, the first running,
    /// the renter told, a job's end, and a host's failure ending the lease.
    fn apply_delivery_status(
        &mut self,
        at_ms: u64,
        account: AccountId,
        lease: LeaseId,
        state: &DeliveryState,
        applied: &mut Applied,
        owed: &mut Vec<Notice>,
    ) {
        let stopped = matches!(state, DeliveryState::Stopped | DeliveryState::Exited { .. } | DeliveryState::Failed { .. });
        if let Some(ended_ms) = self.preempted.get(&lease).copied().filter(|_| stopped) {
            self.preempted.remove(&lease);
            if at_ms > ended_ms + PREEMPTION_STOP_MS {
                self.reliability.late_preemption(&self.engine, lease, at_ms);
                self.refresh_scores(&[account], at_ms);
            }
        }
        applied.first_running = self.deliveries.record_status(lease, account, state.clone(), at_ms);
        if applied.first_running && self.engine.lease(lease).is_some_and(|l| l.supplier == account) {
            self.reliability.delivered(&self.engine, lease);
        }
        if let Some(info) = self.engine.lease(lease) {
            owed.push(Notice {
                to: Audience::account(info.renter),
                message: ServerMessage::Delivery { lease, state: state.clone(), at_ms },
            });
            // A job's workload that exited ends the job (its host's word).
            if info.supplier == account {
                self.jobs.status_heard(lease, account, at_ms);
                let outcome = self.services.delivery_status(lease, account, state, at_ms);
                self.service_outcome(outcome, applied, owed);
            }
            if let (DeliveryState::Running { .. }, true) = (state, info.supplier == account) {
                let outcome = self.jobs.workload_running(lease, at_ms);
                self.job_outcome(outcome, applied, owed);
            }
            if let (DeliveryState::Exited { code }, true) = (state, info.supplier == account) {
                let outcome = self.jobs.workload_exited(lease, *code, at_ms);
                self.job_outcome(outcome, applied, owed);
            }
            if let (DeliveryState::Failed { code, fault: gpux_protocol::Fault::Renter, .. }, true) = (state, info.supplier == account) {
                let outcome = self.jobs.undeliverable(lease, *code, at_ms);
                self.job_outcome(outcome, applied, owed);
            }
            let host_failed = matches!(state, DeliveryState::Failed { fault: gpux_protocol::Fault::Host, .. });
            if host_failed && info.active {
                applied.follow_ups.push(Command::FailLeaseDelivery { account, lease });
            }
            // A workload asked to end its lease when it exits: the renter's
            // end, billed to the exit (docs/protocol.md "Lease delivery").
            let ended = matches!(state, DeliveryState::Exited { .. } | DeliveryState::Failed { fault: gpux_protocol::Fault::Renter, .. });
            let end_on_exit = self.deliveries.lease(lease).and_then(|d| d.workload.as_ref()).is_some_and(|w| w.end_lease_on_exit);
            if ended && end_on_exit && info.active && info.supplier == account && self.jobs.job_of_lease(lease).is_none() {
                applied.follow_ups.push(Command::EndLease { account: info.renter, lease });
            }
        }
    }

    /// Books the events in the ledger, forgets leases whose billing closed,
    /// numbers market data and routes private events.
    fn post(&mut self, applied: &mut Applied) -> Result<(), MarketError> {
        for event in &applied.events {
            applied.transfers.extend(self.ledger.apply(event)?);
            if let EventKind::LeaseBillingClosed { lease, .. } = event.kind {
                self.settlement.forget_lease(lease);
                self.disputes.forget_lease(lease);
            }
            if let Some(notice) = self.market_data(event, &mut applied.archived.trades) {
                applied.notices.push(notice);
            }
            let accounts = routing::accounts_of(&self.engine, event);
            if accounts[0].is_some() || accounts[1].is_some() {
                let reason = match event.kind {
                    EventKind::Rejected { code, .. } => Some(code.message().to_string()),
                    _ => None,
                };
                applied
                    .notices
                    .push(Notice { to: Audience::Accounts(accounts), message: ServerMessage::Private { event: *event, reason } });
            }
        }
        Ok(())
    }

    /// Numbers a book update or a trade in its feed and records trades in
    /// the stats and, for the journal's history index, in `trades`.
    fn market_data(&mut self, event: &Event, trades: &mut Vec<gpux_protocol::TradeRecord>) -> Option<Notice> {
        match event.kind {
            EventKind::BookLevel { instrument, side, price_minor_per_gpu_hour, quantity } => {
                let seq = self.book_seq.entry(instrument).or_insert(0);
                *seq += 1;
                Some(Notice {
                    to: Audience::Feed(Channel::Book, instrument),
                    message: ServerMessage::BookUpdate { instrument, seq: *seq, side, price_minor_per_gpu_hour, quantity },
                })
            }
            EventKind::Trade { instrument, price_minor_per_gpu_hour, quantity, aggressor, buy_order, sell_order, buyer, seller } => {
                let seq = self.trade_seq.entry(instrument).or_insert(0);
                *seq += 1;
                self.stats.record(instrument, event.at_ms, price_minor_per_gpu_hour, quantity);
                trades.push(gpux_protocol::TradeRecord {
                    instrument,
                    seq: *seq,
                    at_ms: event.at_ms,
                    price_minor_per_gpu_hour,
                    quantity,
                    aggressor,
                    buy_order,
                    sell_order,
                    buyer,
                    seller,
                });
                Some(Notice {
                    to: Audience::Feed(Channel::Trades, instrument),
                    message: ServerMessage::Trade {
                        instrument,
                        seq: *seq,
                        price_minor_per_gpu_hour,
                        quantity,
                        aggressor,
                        at_ms: event.at_ms,
                    },
                })
            }
            _ => None,
        }
    }

    // Checks the sequencer makes before journaling a request: a request
    // that fails one is answered with the code and never journaled.

    /// A renter setting its lease's workload.
    pub fn check_lease_workload(&self, account: AccountId, lease: LeaseId) -> Result<(), ErrorCode> {
        let info = self.engine.lease(lease).filter(|l| l.renter == account).ok_or(ErrorCode::UnknownLease)?;
        if !info.active {
            return Err(ErrorCode::LeaseNotActive);
        }
        Ok(())
    }

    /// A host reporting a lease's delivery status. Once the lease's bill
    /// is final only `stopped` is taken (it moves no money: a container
    /// removed late is still shown gone).
    pub fn check_delivery_status(&self, account: AccountId, lease: LeaseId, state: &DeliveryState) -> Result<(), ErrorCode> {
        let info = self.engine.lease(lease).filter(|l| l.supplier == account).ok_or(ErrorCode::UnknownLease)?;
        if info.billing_closed && *state != DeliveryState::Stopped {
            return Err(ErrorCode::LeaseNotActive);
        }
        if !state.valid() {
            return Err(ErrorCode::DeliveryStatusInvalid);
        }
        Ok(())
    }

    /// Follows preempted leases until their host reports the workload
    /// stopped: a lease preempted while its workload was not stopped is
    /// watched; one still watched when its bill closes was honoured late
    /// (never reported stopped). Returns the suppliers whose records changed.
    fn watch_preemptions(&mut self, events: &[Event]) -> Vec<AccountId> {
        let mut touched = Vec::new();
        for event in events {
            match event.kind {
                EventKind::LeaseEnded { lease, reason: gpux_engine::LeaseEndReason::Preempted } => {
                    let running = self.deliveries.lease(lease).and_then(|d| d.state.as_ref()).is_some_and(|(state, _)| {
                        !matches!(state, DeliveryState::Stopped | DeliveryState::Exited { .. } | DeliveryState::Failed { .. })
                    });
                    if running {
                        self.preempted.insert(lease, event.at_ms);
                    }
                }
                EventKind::LeaseBillingClosed { lease, .. } if self.preempted.remove(&lease).is_some() => {
                    self.reliability.late_preemption(&self.engine, lease, event.at_ms);
                    touched.extend(self.engine.lease(lease).map(|l| l.supplier));
                }
                _ => {}
            }
        }
        touched
    }

    /// A cluster member's interconnect probe (docs/market-rules.md
    /// "Interconnect probe"): the lease's supplier's, signed by the key it
    /// logged in with, for the lease's running cluster attempt at the rank
    /// it holds there, on a host that declared a fabric, its figures in
    /// range, and the lease's first.
    pub fn check_fabric_probe(&self, account: AccountId, report: &gpux_protocol::FabricProbeReport) -> Result<(), ErrorCode> {
        let body = &report.body;
        let lease = self.engine.lease(body.lease).filter(|l| l.supplier == account && !l.billing_closed);
        let fabric = lease.and_then(|l| self.engine.lease_fabric(l.lease));
        let member = match self.jobs.state(body.job) {
            Some(gpux_protocol::JobState::Running { attempt, leases }) => {
                *attempt == body.attempt && leases.len() as u32 == body.ranks && leases.get(body.rank as usize) == Some(&body.lease)
            }
            _ => false,
        };
        let first = fabric.as_ref().is_some_and(|f| f.probe.as_ref().is_none_or(|p| p.lease != body.lease));
        let signed = self.account_key(account).is_some_and(|key| report.verify(&key));
        if !(member && first && body.is_valid() && signed && self.jobs.job_of_lease(body.lease) == Some(body.job)) {
            return Err(ErrorCode::FabricProbeInvalid);
        }
        Ok(())
    }

    /// A renter's liveness observation of its lease.
    pub fn check_liveness(&self, account: AccountId, report: &gpux_protocol::LivenessReport, now_ms: u64) -> Result<(), ErrorCode> {
        self.check_liveness_signed(account, report, now_ms, Signature::Unchecked)
    }

    /// [`MarketState::check_liveness`], its signature's check as `signature`
    /// says: with `VerifiedWith(key)`, the caller verified it (in a ZIP-215
    /// batch: [`gpux_protocol::verify_signed_batch_zip215`]) against `key`,
    /// which must be the key the account logged in with.
    pub fn check_liveness_signed(
        &self,
        account: AccountId,
        report: &gpux_protocol::LivenessReport,
        now_ms: u64,
        signature: Signature,
    ) -> Result<(), ErrorCode> {
        let lease = self.engine.lease(report.body.lease);
        let key = self.account_key(account);
        // Last, as the cheaper checks fail first.
        let signed = || match signature {
            Signature::Unchecked => key.is_some_and(|key| report.verify(&key)),
            Signature::VerifiedWith(verified) => key == Some(verified),
        };
        self.disputes.check(account, lease.as_ref(), report, signed, now_ms)
    }

    /// A renter's GPU probe observation of its lease.
    pub fn check_gpu_probe(&self, account: AccountId, report: &gpux_protocol::GpuProbeReport, now_ms: u64) -> Result<(), ErrorCode> {
        self.check_gpu_probe_signed(account, report, now_ms, Signature::Unchecked)
    }

    /// [`MarketState::check_gpu_probe`], its signature's check as
    /// `signature` says: with `VerifiedWith(key)`, the caller verified it
    /// against `key`, which must be the probe key the report names.
    pub fn check_gpu_probe_signed(
        &self,
        account: AccountId,
        report: &gpux_protocol::GpuProbeReport,
        now_ms: u64,
        signature: Signature,
    ) -> Result<(), ErrorCode> {
        let lease = self.engine.lease(report.body.lease);
        let signed = || match signature {
            Signature::Unchecked => report.verify(),
            Signature::VerifiedWith(verified) => report.key() == Some(verified),
        };
        self.disputes.check_probe(account, lease.as_ref(), report, signed, now_ms)
    }

    /// Disputed GPU time of a lease: its proven part counted in its
    /// supplier's and host's records (a port that does not answer alone
    /// proves nothing); returns the command that holds its charge.
    fn disputed(&mut self, lease: LeaseId, found: disputes::Found, at_ms: u64) -> Option<Command> {
        if found == disputes::Found::default() {
            return None;
        }
        if found.proven_gpu_ms > 0 {
            if let Some(supplier) = self.reliability.disputed(&self.engine, lease, found.proven_gpu_ms, at_ms) {
                self.refresh_scores(&[supplier], at_ms);
            }
        }
        Some(Command::HoldDisputed { lease, disputed_gpu_ms: found.disputed_gpu_ms, proven_gpu_ms: found.proven_gpu_ms })
    }

    /// What the job rules called for: the commands as follow-ups, each
    /// transition pushed to the job's renter, each attempt handed to its
    /// hosts (and recorded as the lease's workload, so `lease_delivery`
    /// shows its image).
    fn job_outcome(&mut self, mut outcome: jobs::Outcome, applied: &mut Applied, owed: &mut Vec<Notice>) {
        for (job, attempt, cause) in std::mem::take(&mut outcome.moves) {
            let (book, choice) = self.choose_job_book(job);
            if let Some(bid) = self.jobs.rebook(job, attempt, cause, book, choice, self.clock_ms) {
                let client_order_id = jobs::Jobs::bid_client_order_id(job, attempt);
                outcome.bids.retain(|b| b.new_order().is_none_or(|o| o.client_order_id != client_order_id));
                outcome.bids.push(bid);
            }
        }
        applied.follow_ups.extend(outcome.commands());
        for (job, account, state) in &outcome.transitions {
            if let Some(mut info) = self.jobs.info(*job, *account) {
                info.state = self.jobs.shown(state);
                owed.push(Notice { to: Audience::account(*account), message: ServerMessage::JobUpdate { job: Box::new(info) } });
            }
        }
        // A cluster attempt's members by rank, where each listens (every
        // lease of the attempt on a host with a fabric; else no peers).
        let mut members: BTreeMap<(gpux_protocol::JobId, u32), Option<Vec<gpux_engine::MemberAddress>>> = BTreeMap::new();
        for (lease, _, assignment) in &outcome.assigned {
            let entry = members.entry((assignment.job, assignment.attempt)).or_insert_with(|| Some(Vec::new()));
            let address = self.engine.member_address(*lease);
            match (entry.as_mut(), address) {
                (Some(list), Some(address)) if assignment.nodes > 1 => list.push(address),
                _ => *entry = None,
            }
        }
        for (lease, supplier, mut assignment) in outcome.assigned {
            if let Some(Some(peers)) = members.get(&(assignment.job, assignment.attempt)) {
                if peers.len() == assignment.nodes as usize {
                    assignment.peers = peers.clone();
                }
            }
            let workload = Box::new(gpux_protocol::Workload {
                shm_mib: assignment.run.shm_mib,
                ..gpux_protocol::Workload::image(assignment.run.image.clone())
            });
            self.deliveries.set_lease_workload(lease, supplier, workload);
            owed.push(Notice {
                to: Audience::account(supplier),
                message: ServerMessage::JobAssigned { lease, assignment: Box::new(assignment), store: None },
            });
        }
    }

    /// What a service calls for: its commands as follow-ups, each replica
    /// handed to its host (the workload recorded for the lease, the
    /// command and readiness in `replica_assigned`), and its renter told
    /// of every service that changed.
    fn service_outcome(&mut self, outcome: services::Outcome, applied: &mut Applied, owed: &mut Vec<Notice>) {
        applied.follow_ups.extend(outcome.commands());
        for (lease, supplier, replica) in outcome.assigned {
            let workload = gpux_protocol::Workload { ports: vec![replica.port], ..gpux_protocol::Workload::image(replica.image.clone()) };
            self.deliveries.set_lease_workload(lease, supplier, Box::new(workload));
            owed.push(Notice {
                to: Audience::account(supplier),
                message: ServerMessage::ReplicaAssigned { lease, replica: Box::new(replica) },
            });
        }
        for service in outcome.changed {
            let Some(account) = self.services.account_of(service) else { continue };
            if let Some(info) = self.services.info(service, account) {
                owed.push(Notice { to: Audience::account(account), message: ServerMessage::ServiceUpdate { service: Box::new(info) } });
            }
        }
    }

    /// A reserved window sold on a GPU that a job's preemptible lease
    /// runs on (or a job's preemptible lease created on a GPU with one
    /// ahead): the preemption it schedules goes to the job's feed before
    /// its notice (docs/jobs.md "Preemption").
    fn watch_job_preemptions_ahead(&mut self, applied: &Applied, owed: &mut Vec<Notice>) {
        let mut leases = Vec::new();
        for event in &applied.events {
            match event.kind {
                EventKind::ContractCreated { gpu, .. } => leases.extend(self.engine.preemptible_lease_on(gpu)),
                EventKind::LeaseCreated { lease, kind: gpux_engine::LeaseKind::Preemptible, .. } => leases.push(lease),
                _ => {}
            }
        }
        for lease in leases {
            let Some(job) = self.jobs.job_of_lease(lease) else { continue };
            let ahead = self.engine.preemption_ahead(lease).map(|(notice_at_ms, ends_at_ms)| jobs::PreemptionAhead {
                lease,
                notice_at_ms,
                ends_at_ms,
            });
            let Some(account) = self.jobs.terms(job).map(|t| t.account) else { continue };
            if self.jobs.set_preemption_ahead(lease, ahead) {
                if let Some(info) = self.jobs.info(job, account) {
                    owed.push(Notice { to: Audience::account(account), message: ServerMessage::JobUpdate { job: Box::new(info) } });
                }
            }
        }
    }

    /// The book a job's new attempt bids on (docs/jobs.md "Failover"): of
    /// its books, the one whose resting asks would fill its GPUs at the
    /// lowest expected cost now (a preemptible book's rework added), the
    /// one it bid on before among equals; with none offering, that one.
    fn choose_job_book(&self, job: jobs::JobId) -> (jobs::JobAlternative, jobs::BookChoice) {
        let books = self.jobs.books(job);
        let Some(current) = books.first().cloned() else {
            return (jobs::JobAlternative { instrument: InstrumentId(0), limit_minor_per_gpu_hour: 0 }, jobs::BookChoice::NoneOffered);
        };
        let quotes: Vec<(jobs::JobAlternative, u64)> =
            books.into_iter().filter_map(|book| self.job_book_quote(job, &book).map(|cost| (book, cost))).collect();
        let offering = quotes.len() as u32;
        match quotes.into_iter().enumerate().min_by_key(|(index, (_, cost))| (*cost, *index)) {
            Some((_, (book, expected_minor))) => (book, jobs::BookChoice::Cheapest { expected_minor, offering }),
            None => (current, jobs::BookChoice::NoneOffered),
        }
    }

    /// What `job`'s attempt would cost for its hours on `book` from the
    /// asks resting there now that its bid could take: within the book's
    /// limit, from suppliers that deliver, past its score, verification
    /// and region filters, on one host when it wants one, on `nodes` hosts
    /// of `gpus_per_node` for a cluster (fabric groups are not weighed:
    /// the bid itself finds one). `None` when they do not add up to the job.
    fn job_book_quote(&self, job: jobs::JobId, book: &jobs::JobAlternative) -> Option<u64> {
        let (terms, regions) = (self.jobs.terms(job)?, self.jobs.regions(job));
        let instrument = self.engine.instrument(book.instrument)?;
        if instrument.state != gpux_engine::InstrumentState::Trading {
            return None;
        }
        let (offers, _) = self.engine.offers(book.instrument, 0, JOB_QUOTE_OFFERS_MAX);
        let per_host = if terms.gpus_per_node > 0 && terms.gpus_per_node < terms.gpus {
            Some(terms.gpus_per_node)
        } else if terms.one_host || terms.gpus_per_node > 0 {
            Some(terms.gpus)
        } else {
            None
        };
        let (mut left, mut cost_per_hour) = (terms.gpus, 0u64);
        let mut hosts = std::collections::BTreeSet::new();
        for offer in offers {
            if offer.price_minor_per_gpu_hour > book.limit_minor_per_gpu_hour {
                break;
            }
            let score_ok = terms.min_supplier_score_bps == 0 || offer.supplier_score_bps.is_some_and(|s| s >= terms.min_supplier_score_bps);
            let region_ok = regions.is_empty() || offer.region.as_ref().is_some_and(|r| regions.contains(r));
            let quantity = if terms.verified_only { offer.gpus_verified.min(offer.quantity) } else { offer.quantity };
            if !score_ok || !region_ok || !self.engine.delivers(offer.supplier) || quantity == 0 {
                continue;
            }
            let take = match per_host {
                Some(need) if quantity < need || !offer.host.is_some_and(|h| hosts.insert(h)) => continue,
                Some(need) => need,
                None => quantity.min(left),
            };
            cost_per_hour = cost_per_hour.saturating_add(offer.price_minor_per_gpu_hour.saturating_mul(take as u64));
            left -= take.min(left);
            if left == 0 {
                let mut cost = cost_per_hour.saturating_mul(terms.hours as u64);
                if instrument.contract == gpux_engine::ContractKind::Preemptible {
                    cost = cost.saturating_add(cost.saturating_mul(jobs::limits::PREEMPTIBLE_REWORK_BPS) / 10_000);
                }
                return Some(cost);
            }
        }
        None
    }

    /// A host publishing its encryption key, signed by its identity key.
    pub fn check_encryption_key(&self, account: AccountId, key: &[u8; 32], signature: &str) -> Result<(), ErrorCode> {
        let identity = self.account_key(account).unwrap_or([0; 32]);
        if !gpux_protocol::delivery::encryption_key_certified(key, &identity, signature) {
            return Err(ErrorCode::EncryptionKeyInvalid);
        }
        Ok(())
    }

    pub fn engine(&self) -> &Engine {
        &self.engine
    }

    pub fn settlement(&self) -> &Settlement {
        &self.settlement
    }

    pub fn ledger(&self) -> &Ledger {
        &self.ledger
    }

    pub fn deliveries(&self) -> &Deliveries {
        &self.deliveries
    }

    /// The account's first key: the one it was opened with (its host key,
    /// for a supplier), or a sub-account's first key added.
    pub fn account_key(&self, account: AccountId) -> Option<[u8; 32]> {
        self.keys.identity(account)
    }

    /// The rule usage reports' signatures are checked by.
    pub fn signature_rule(&self) -> gpux_settlement::SignatureRule {
        self.settlement.signature_rule()
    }

    /// The next usage report applied is `report` from `account`, whose
    /// signature the gateway verified under ZIP-215 against `key`: if `key`
    /// is the account's, settlement need not verify it again (the outcome is
    /// the same; a replay verifies it).
    pub fn mark_report_checked(&mut self, account: AccountId, key: [u8; 32], report: &gpux_protocol::UsageReport) {
        if self.account_key(account) == Some(key) {
            self.settlement.mark_checked(key, report);
        }
    }

    /// The API keys.
    pub fn keys(&self) -> &keys::Keys {
        &self.keys
    }

    /// The newest book update's sequence number in an instrument's feed.
    pub fn book_seq(&self, instrument: InstrumentId) -> u64 {
        self.book_seq.get(&instrument).copied().unwrap_or(0)
    }

    pub fn stats(&self) -> &RollingStats {
        &self.stats
    }

    /// Hardware challenges in flight.
    pub fn challenges(&self) -> &challenges::Challenges {
        &self.challenges
    }

    /// Renters' dispute records.
    pub fn disputes(&self) -> &disputes::Disputes {
        &self.disputes
    }

    /// Suppliers' and hosts' reliability records.
    pub fn reliability(&self) -> &reliability::Reliability {
        &self.reliability
    }

    /// Hands the engine the current scores of `suppliers`, for bids that
    /// filter on them.
    /// A journaled key grant: checked before journaling, re-checked so that
    /// replay of any journal keeps the same invariants.
    #[allow(clippy::too_many_arguments)]
    fn add_key(
        &mut self,
        at_ms: u64,
        by: AccountId,
        by_key: Option<[u8; 32]>,
        account: AccountId,
        public_key: &[u8; 32],
        scopes: &gpux_protocol::Scopes,
        expires_at_ms: Option<u64>,
        label: &str,
    ) {
        let grant = (scopes, expires_at_ms, label);
        if self.keys.check_add(&self.engine, by, account, public_key, grant, at_ms).is_ok() {
            let grant =
                keys::KeyGrant { account, scopes: *scopes, expires_at_ms, label: label.to_string(), added_at_ms: at_ms, added_by: by_key };
            self.keys.add(*public_key, grant);
        }
    }

    fn refresh_scores(&mut self, suppliers: &[AccountId], now_ms: u64) {
        for &supplier in suppliers {
            let score = self.reliability.supplier(supplier, now_ms).score_bps;
            self.engine.set_supplier_score(supplier, score);
        }
    }

    /// The newest exchange time seen.
    pub fn clock_ms(&self) -> u64 {
        self.clock_ms
    }

    /// Moves the exchange clock forward (never back). Only the live
    /// sequencer calls it, between entries; entries carry their own times.
    pub fn advance_clock(&mut self, now_ms: u64) {
        self.clock_ms = self.clock_ms.max(now_ms);
    }

    /// The accounts an event concerns (at most two, deduplicated).
    pub fn accounts_of(&self, event: &Event) -> [Option<AccountId>; 2] {
        routing::accounts_of(&self.engine, event)
    }

    /// A lease's recent telemetry (empty once it left the hot state).
    pub fn lease_telemetry(&self, lease: LeaseId) -> Vec<gpux_protocol::GpuTelemetry> {
        self.telemetry.lease(lease)
    }

    /// A hash of the whole state but the clock: equal for markets that
    /// applied the same entries, whether live, replayed from any snapshot,
    /// simulated or audited.
    pub fn state_hash(&self) -> u64 {
        let mut hasher = StateHasher::new();
        hasher.u64(self.engine.state_hash());
        let rest = (
            (&self.settlement, &self.ledger, &self.keys, &self.deliveries, &self.telemetry),
            (
                &self.book_seq,
                &self.trade_seq,
                &self.stats,
                &self.reliability,
                &self.rematch,
                &self.jobs,
                self.scores_day,
                &self.challenges,
                &self.disputes,
                &self.preempted,
            ),
        );
        hasher.bytes(&gpux_protocol::encode_record(&rest));
        // Hashed once there is one, so markets from before services hash as they did.
        if !self.services.is_empty() {
            hasher.bytes(&gpux_protocol::encode_record(&self.services));
        }
        // Likewise volumes.
        if !self.volumes.is_empty() {
            hasher.bytes(&gpux_protocol::encode_record(&self.volumes));
        }
        hasher.finish()
    }

    /// Encoded sizes of the parts that grow with the market's history, bytes.
    pub fn hot_state_bytes(&self) -> HotState {
        HotState {
            engine: gpux_protocol::encode_record(&self.engine).len() as u64,
            settlement: gpux_protocol::encode_record(&self.settlement).len() as u64,
            ledger: gpux_protocol::encode_record(&self.ledger).len() as u64,
            reliability: gpux_protocol::encode_record(&self.reliability).len() as u64,
        }
    }
}

/// Encoded sizes of the market's state, bytes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct HotState {
    pub engine: u64,
    pub settlement: u64,
    pub ledger: u64,
    /// Reliability records: one bucket per supplier and host per active day,
    /// for the score window's 30 days, so it grows for 30 days, then stays.
    pub reliability: u64,
}

/// What a cluster's signed interconnect probe records on its lease's hosts.
fn fabric_probed(body: &gpux_protocol::fabric::FabricProbeBody) -> Command {
    Command::RecordFabricProbe { lease: body.lease, ranks: body.ranks, mbps: body.bus_mbps() }
}
