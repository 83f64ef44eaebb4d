//! Jobs at the exchange (docs/jobs.md "A job's life"): a job bids for its
//! GPUs within its limits, runs on the leases its bid fills, and when one of
//! them ends before the job did (preempted, or its host failed it) ends the
//! others and bids again, to resume from its last checkpoint, at most
//! `retries` times and within its budget. Pure and deterministic like the
//! rest of the market: it follows the engine's events and says what to do
//! next (`Outcome`); the sequencer journals each next step as its own
//! entry, as it does re-match's replacement bids.
//!
//! Journaled (`JournalEntry::SubmitJob`, `CancelJob`, `JobLeaseSilent`)
//! and applied by `MarketState`; on the wire as `submit_job` and friends
//! (docs/protocol.md "Jobs").

use std::collections::{BTreeMap, BTreeSet, VecDeque};

use gpux_engine::{
    AccountId, Event, EventKind, InstrumentId, LeaseDuration, LeaseEndReason, LeaseId, NewOrder, OrderCloseReason, OrderId, OrderOptions,
    RejectCode, SelfTradePrevention, Side, TimeInForce,
};
pub use gpux_protocol::jobs::limits;
pub use gpux_protocol::{
    AttemptCause, AttemptMove, BookChoice, JobAlternative, JobAssignment, JobFailure, JobId, JobInfo, JobRun, JobState, JobSubmission,
    PreemptionAhead,
};
use serde::{Deserialize, Serialize};

/// Client order ids from here up (below re-match's) are jobs' bids: this
/// plus the job's id times 1 024 plus the attempt.
pub const JOB_CLIENT_ORDER_ID_BASE: u64 = 1 << 62;
/// Attempts a job's client order ids leave room for (its first and up to
/// 1 023 retries).
pub const ATTEMPTS_MAX: u32 = 1_024;
/// Leases of one job `JobInfo` lists (its newest).
pub const INFO_LEASES_MAX: usize = 64;
/// The rules jobs follow, journaled (`JournalEntry::JobRules`) when an
/// exchange first runs them; a journal without the entry replays under 0.
/// 1 (2026-12-07): a job's bids trade only with suppliers that deliver; a
/// preemption notice makes any exit of the attempt its move; a cluster job
/// succeeds once every member exited 0.
/// 2 (2026-12-07): a workload's error restarts the job within its
/// `restarts_on_error`; a cluster member's non-zero exit waits
/// `CLUSTER_EXIT_HOLD_MS` for a peer's host fault before it fails the job.
/// 3 (2026-12-07): an account and its sub-accounts hold at most
/// `JOBS_LIVE_PER_PARTICIPANT_MAX` jobs not yet over together.
pub const JOB_RULES: u32 = 3;

/// What the market holds of a job: who pays, what it buys, its limits,
/// what it runs.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct JobTerms {
    pub account: AccountId,
    pub name: String,
    /// The book the plan chose (spot or preemptible).
    pub instrument: InstrumentId,
    pub gpus: u32,
    /// All on one host (a single-node job).
    pub one_host: bool,
    pub limit_minor_per_gpu_hour: u64,
    /// Hours each attempt's leases run at most.
    pub hours: u32,
    /// The most the job may hold in escrow over all its attempts.
    pub budget_minor: u64,
    /// New attempts after the first (`ATTEMPTS_MAX - 1` at most).
    pub retries: u32,
    pub min_supplier_score_bps: u32,
    pub verified_only: bool,
    pub run: JobRun,
    /// A cluster job's GPUs per host (each attempt bids `gpus /
    /// gpus_per_node` hosts in one fabric group); 0: not a cluster.
    pub gpus_per_node: u32,
    pub min_fabric_gbps: u32,
}

/// What a job does beyond `retries` (journaled with `SubmitJobV2`; a job
/// journaled with `SubmitJob` has none of it): restarts after its
/// workload's errors, other books its new attempts may bid on, the regions
/// it accepts (docs/jobs.md "Retries" and "Failover").
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct JobRecovery {
    pub restarts_on_error: u32,
    pub alternatives: Vec<JobAlternative>,
    pub regions: Vec<String>,
}

impl JobTerms {
    /// The terms the market holds of `account`'s submission, and its recovery.
    pub fn new(account: AccountId, submission: JobSubmission) -> (JobTerms, JobRecovery) {
        let JobSubmission {
            name,
            instrument,
            gpus,
            one_host,
            limit_minor_per_gpu_hour,
            hours,
            budget_minor,
            retries,
            min_supplier_score_bps,
            verified_only,
            run,
            nodes,
            min_fabric_gbps,
            restarts_on_error,
            alternatives,
            regions,
        } = submission;
        let recovery = JobRecovery { restarts_on_error, alternatives, regions };
        let terms = JobTerms {
            gpus_per_node: if nodes >= 2 { gpus / nodes } else { 0 },
            min_fabric_gbps,
            account,
            name,
            instrument,
            gpus,
            one_host,
            limit_minor_per_gpu_hour,
            hours,
            budget_minor,
            retries,
            min_supplier_score_bps,
            verified_only,
            run,
        };
        (terms, recovery)
    }
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
struct Job {
    terms: JobTerms,
    state: JobState,
    /// Escrow its leases took so far (each lease's price x GPUs x hours),
    /// counted against the budget.
    escrowed_minor: u64,
    /// Set by a cancel: what ends next ends it as cancelled.
    cancelling: bool,
    /// Bids placed so far.
    attempts: u32,
    /// Every lease it ran on, oldest first.
    leases: Vec<LeaseId>,
    submitted_at_ms: u64,
    updated_at_ms: u64,
    /// Resizes so far (their attempts do not count against `retries`).
    resizes: u32,
    /// A resize under way: the new size, its attempt, its bid once placed.
    /// The job runs on as it is until that bid fills.
    resizing: Option<Resize>,
    recovery: JobRecovery,
    /// Restarts after its workload's errors so far.
    restarts: u32,
    /// The book its attempts bid on now, at its limit there.
    book: JobAlternative,
    last_move: Option<AttemptMove>,
    /// A cluster member exited non-zero at `since_ms`: the job waits
    /// `CLUSTER_EXIT_HOLD_MS` for a peer's host fault before the exit
    /// counts as the workload's error.
    failing: Option<Failing>,
    /// The participant that submitted it: its account's parent for a
    /// sub-account, else its account (docs/market-rules.md "Shared limits").
    participant: AccountId,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
struct Failing {
    code: i64,
    since_ms: u64,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
struct Resize {
    gpus: u32,
    attempt: u32,
    order: Option<OrderId>,
    /// Its leases as its fill creates them.
    leases: Vec<LeaseId>,
}

/// What the exchange heard of a running job (or service replica) lease
/// from its supplier.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Heard {
    pub(crate) supplier: AccountId,
    pub(crate) created_ms: u64,
    /// The last delivery status or usage report.
    pub(crate) last_ms: u64,
    /// Whether any delivery status came (the host started on it).
    pub(crate) status_seen: bool,
}

impl Heard {
    /// A lease created at `at_ms`, nothing heard of it yet.
    pub(crate) fn new(supplier: AccountId, at_ms: u64) -> Heard {
        Heard { supplier, created_ms: at_ms, last_ms: at_ms, status_seen: false }
    }

    /// Whether its host counts as gone at `now_ms` by `rules`
    /// (`connected`: whether a connected session of the supplier runs the
    /// lease, asked only when that decides it).
    pub(crate) fn gone(&self, now_ms: u64, rules: Silence, connected: impl FnOnce() -> bool) -> bool {
        let quiet = now_ms.saturating_sub(self.last_ms);
        quiet >= rules.silence_ms
            || (!self.status_seen && now_ms.saturating_sub(self.created_ms) >= rules.start_ms)
            || (quiet >= rules.disconnected_ms && !connected())
    }
}

/// When a job lease's host counts as gone (docs/market-rules.md "Jobs"):
/// nothing heard of the lease for `silence_ms`; no delivery status at all
/// `start_ms` after it was created; or nothing heard for `disconnected_ms`
/// while no connected session of the supplier runs it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Silence {
    pub silence_ms: u64,
    pub start_ms: u64,
    pub disconnected_ms: u64,
}

impl Silence {
    /// The exchange's rules for `--job-silence-ms`: a host that never
    /// started on its lease, or whose agent is gone, is given at most
    /// `JOB_START_SILENCE_MS` / `JOB_GONE_SILENCE_MS`.
    pub fn with_silence(silence_ms: u64) -> Silence {
        Silence {
            silence_ms,
            start_ms: silence_ms.min(limits::JOB_START_SILENCE_MS),
            disconnected_ms: silence_ms.min(limits::JOB_GONE_SILENCE_MS),
        }
    }
}

/// What `Jobs::observe` gathers over one entry's events before it settles them.
#[derive(Default)]
struct Observed {
    /// The bid of the last trade: the leases after it are its fill's.
    buy_order: Option<OrderId>,
    started: Vec<JobId>,
    resized: Vec<JobId>,
    suppliers: BTreeMap<LeaseId, AccountId>,
}

/// What to do next, each journaled as its own entry.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Outcome {
    /// A bid to place for a job's next attempt.
    /// Each an engine command that places a bid (`Command::Place`, with
    /// cluster terms for a cluster job).
    pub bids: Vec<gpux_engine::Command>,
    /// Leases to end (by their renter) because the job no longer needs them.
    pub end_leases: Vec<(AccountId, LeaseId)>,
    /// Bids to cancel (a job cancelled while bidding).
    pub cancel_orders: Vec<(AccountId, OrderId)>,
    /// Every state a job entered, in order (for the renter's private feed).
    pub transitions: Vec<(JobId, AccountId, JobState)>,
    /// Attempts handed to hosts: each lease's supplier and what to run.
    pub assigned: Vec<(LeaseId, AccountId, JobAssignment)>,
    /// New attempts after the first (not a resize's), and why: the market
    /// chooses each one's book (`Jobs::books`, `Jobs::rebook`) before its
    /// bid in `bids` is placed.
    pub moves: Vec<(JobId, u32, AttemptCause)>,
}

impl Outcome {
    /// The engine commands it calls for, in the order to apply them: ends
    /// and cancels first (they free funds and GPUs), then bids.
    pub fn commands(&self) -> Vec<gpux_engine::Command> {
        use gpux_engine::Command;
        let ends = self.end_leases.iter().map(|&(account, lease)| Command::EndLease { account, lease });
        let cancels = self.cancel_orders.iter().map(|&(account, order)| Command::CancelOrder { account, order });
        ends.chain(cancels).chain(self.bids.iter().cloned()).collect()
    }

    pub fn append(&mut self, mut other: Outcome) {
        self.bids.append(&mut other.bids);
        self.end_leases.append(&mut other.end_leases);
        self.cancel_orders.append(&mut other.cancel_orders);
        self.transitions.append(&mut other.transitions);
        self.assigned.append(&mut other.assigned);
        self.moves.append(&mut other.moves);
    }
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Jobs {
    jobs: BTreeMap<JobId, Job>,
    next: u64,
    /// Bids by order id, and leases by id: the job each serves.
    orders: BTreeMap<OrderId, JobId>,
    leases: BTreeMap<LeaseId, JobId>,
    /// Each running lease's supplier and when the exchange last heard of
    /// the lease from it (created, a delivery status, a usage report).
    heard: BTreeMap<LeaseId, Heard>,
    /// Each account's jobs (for `jobs`, newest first).
    by_account: BTreeSet<(AccountId, JobId)>,
    /// Jobs not yet over, per account.
    live: BTreeMap<AccountId, usize>,
    /// Jobs not yet over, per participant (an account and its
    /// sub-accounts), counted under every rule, bounded from rules 3.
    live_by_participant: BTreeMap<AccountId, usize>,
    live_total: usize,
    /// Finished jobs kept, per account oldest first, and the accounts by
    /// how many they keep (the heaviest forgets first when all are full).
    finished: BTreeMap<AccountId, VecDeque<JobId>>,
    finished_by_count: BTreeSet<(usize, AccountId)>,
    finished_total: usize,
    /// Running job leases under a preemption notice: their workload was
    /// told to stop, so an exit of any lease of the attempt is the move to
    /// the next attempt, never the job's result (docs/jobs.md "Preemption").
    noticed: BTreeSet<LeaseId>,
    /// Members of running cluster attempts whose workload exited 0 (after
    /// its final sync): the job succeeds once every member's has.
    exited_ok: BTreeSet<LeaseId>,
    /// Leases of running attempts whose host reported the workload
    /// `running`: the attempt shows `starting` until every one has.
    started: BTreeSet<LeaseId>,
    /// The rules in force (`JOB_RULES` once journaled; 0 before).
    rules: u32,
    /// Jobs holding a cluster member's non-zero exit, since when.
    holds: BTreeMap<JobId, u64>,
    /// Running job leases with a preemption known to be coming.
    ahead: BTreeMap<LeaseId, PreemptionAhead>,
}

/// Why a job is refused at submission.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum JobRefusal {
    #[error("a job needs at least one GPU and one hour")]
    Empty,
    #[error("a job retries at most {} times", ATTEMPTS_MAX - 1)]
    TooManyRetries,
    #[error("the budget does not pay for one attempt at the limit price")]
    BudgetTooSmall,
    #[error(
        "the account holds {} jobs not yet over, its participant (it and its parent's sub-accounts) {}, or the exchange {}",
        limits::JOBS_LIVE_PER_ACCOUNT_MAX,
        limits::JOBS_LIVE_PER_PARTICIPANT_MAX,
        limits::JOBS_LIVE_MAX
    )]
    TooManyJobs,
    #[error("only a running job is resized, one resize at a time, to another size")]
    NotRunning,
}

impl From<JobRefusal> for gpux_protocol::ErrorCode {
    fn from(refusal: JobRefusal) -> Self {
        use gpux_protocol::ErrorCode;
        match refusal {
            JobRefusal::Empty | JobRefusal::TooManyRetries => ErrorCode::JobInvalid,
            JobRefusal::BudgetTooSmall => ErrorCode::JobBudgetTooSmall,
            JobRefusal::TooManyJobs => ErrorCode::TooManyJobs,
            JobRefusal::NotRunning => ErrorCode::JobNotRunning,
        }
    }
}

impl Jobs {
    /// The rules in force (`JOB_RULES` once an exchange journaled them).
    pub fn rules(&self) -> u32 {
        self.rules
    }

    /// Adopts the rules of `version` (never older ones).
    pub fn adopt_rules(&mut self, version: u32) {
        self.rules = self.rules.max(version);
    }

    pub fn state(&self, job: JobId) -> Option<&JobState> {
        self.jobs.get(&job).map(|j| &j.state)
    }

    pub fn terms(&self, job: JobId) -> Option<&JobTerms> {
        self.jobs.get(&job).map(|j| &j.terms)
    }

    /// The job as the wire shows it, if it is `account`'s (and still kept).
    pub fn info(&self, job: JobId, account: AccountId) -> Option<JobInfo> {
        let entry = self.jobs.get(&job).filter(|j| j.terms.account == account)?;
        let shown = entry.leases.len().saturating_sub(INFO_LEASES_MAX);
        Some(JobInfo {
            job,
            name: entry.terms.name.clone(),
            instrument: entry.book.instrument,
            gpus: entry.terms.gpus,
            state: self.shown(&entry.state),
            attempts: entry.attempts,
            retries: entry.terms.retries,
            escrowed_minor: entry.escrowed_minor,
            budget_minor: entry.terms.budget_minor,
            leases: entry.leases[shown..].to_vec(),
            submitted_at_ms: entry.submitted_at_ms,
            updated_at_ms: entry.updated_at_ms,
            run: entry.terms.run.clone(),
            restarts_on_error: entry.recovery.restarts_on_error,
            restarts: entry.restarts,
            alternatives: entry.recovery.alternatives.clone(),
            regions: entry.recovery.regions.clone(),
            last_move: entry.last_move,
            preemption_ahead: match &entry.state {
                JobState::Running { leases, .. } => leases.iter().filter_map(|l| self.ahead.get(l)).min_by_key(|a| a.notice_at_ms).copied(),
                _ => None,
            },
        })
    }

    /// `account`'s jobs, newest first: `max` from `offset`, and whether more follow.
    pub fn list(&self, account: AccountId, offset: usize, max: usize) -> (Vec<JobInfo>, bool) {
        let mut ids = self.by_account.range((account, JobId(0))..=(account, JobId(u64::MAX))).rev().skip(offset);
        let page: Vec<JobInfo> = ids.by_ref().take(max).filter_map(|&(_, job)| self.info(job, account)).collect();
        (page, ids.next().is_some())
    }

    /// Every lease of the job so far, oldest first (its bill).
    pub fn leases_of(&self, job: JobId) -> &[LeaseId] {
        self.jobs.get(&job).map_or(&[], |j| &j.leases)
    }

    /// The leases jobs run on now.
    pub fn running_leases(&self) -> impl Iterator<Item = LeaseId> + '_ {
        self.leases.keys().copied()
    }

    /// The job a lease runs, if any (while the lease runs).
    pub fn job_of_lease(&self, lease: LeaseId) -> Option<JobId> {
        self.leases.get(&lease).copied()
    }

    /// Whether a submission would be refused, without changing anything.
    pub fn check_submit(&self, terms: &JobTerms, participant: AccountId) -> Result<(), JobRefusal> {
        if terms.gpus == 0 || terms.hours == 0 {
            return Err(JobRefusal::Empty);
        }
        if terms.retries >= ATTEMPTS_MAX {
            return Err(JobRefusal::TooManyRetries);
        }
        if attempt_cost(terms.limit_minor_per_gpu_hour, terms) > terms.budget_minor {
            return Err(JobRefusal::BudgetTooSmall);
        }
        let live = self.live.get(&terms.account).copied().unwrap_or(0);
        if live >= limits::JOBS_LIVE_PER_ACCOUNT_MAX || self.live_total >= limits::JOBS_LIVE_MAX {
            return Err(JobRefusal::TooManyJobs);
        }
        let shared = self.live_by_participant.get(&participant).copied().unwrap_or(0);
        if self.rules >= 3 && shared >= limits::JOBS_LIVE_PER_PARTICIPANT_MAX {
            return Err(JobRefusal::TooManyJobs);
        }
        Ok(())
    }

    /// A new job: its first bid.
    pub fn submit(
        &mut self,
        terms: JobTerms,
        recovery: JobRecovery,
        participant: AccountId,
        at_ms: u64,
    ) -> Result<(JobId, Outcome), JobRefusal> {
        self.check_submit(&terms, participant)?;
        let id = JobId(self.next);
        self.next += 1;
        let account = terms.account;
        let state = JobState::Bidding { attempt: 1, order: None };
        let book = JobAlternative { instrument: terms.instrument, limit_minor_per_gpu_hour: terms.limit_minor_per_gpu_hour };
        let job = Job {
            recovery,
            restarts: 0,
            book,
            last_move: None,
            failing: None,
            terms,
            state: state.clone(),
            escrowed_minor: 0,
            cancelling: false,
            attempts: 1,
            leases: Vec::new(),
            submitted_at_ms: at_ms,
            updated_at_ms: at_ms,
            resizes: 0,
            resizing: None,
            participant,
        };
        self.jobs.insert(id, job);
        self.by_account.insert((account, id));
        *self.live.entry(account).or_default() += 1;
        *self.live_by_participant.entry(participant).or_default() += 1;
        self.live_total += 1;
        let mut outcome = Outcome::default();
        outcome.transitions.push((id, account, state));
        outcome.bids.push(self.bid(id, 1));
        Ok((id, outcome))
    }

    /// The renter cancels: its bid is cancelled or its leases ended; the job
    /// is cancelled once they are.
    pub fn cancel(&mut self, job: JobId, account: AccountId, at_ms: u64) -> Outcome {
        let mut outcome = Outcome::default();
        let Some(entry) = self.jobs.get_mut(&job).filter(|j| j.terms.account == account && !j.state.is_over()) else { return outcome };
        entry.cancelling = true;
        if let Some(order) = entry.resizing.as_ref().and_then(|r| r.order) {
            outcome.cancel_orders.push((account, order));
        }
        match &entry.state {
            JobState::Bidding { order: Some(order), .. } => outcome.cancel_orders.push((account, *order)),
            JobState::Bidding { order: None, .. } => self.enter(job, JobState::Cancelled, at_ms, &mut outcome),
            JobState::Running { leases, .. } => outcome.end_leases.extend(leases.iter().map(|l| (account, *l))),
            _ => {}
        }
        outcome
    }

    /// Whether `account` may resize `job` to `gpus` now.
    pub fn check_resize(&self, job: JobId, account: AccountId, gpus: u32) -> Result<(), JobRefusal> {
        let entry = self.jobs.get(&job).filter(|j| j.terms.account == account).ok_or(JobRefusal::NotRunning)?;
        if gpus == 0 || gpus > limits::GPUS_MAX {
            return Err(JobRefusal::Empty);
        }
        // A cluster job grows or shrinks by whole hosts of its size.
        let per_node = entry.terms.gpus_per_node;
        if per_node > 0 && (!gpus.is_multiple_of(per_node) || gpus / per_node > gpux_engine::limits::CLUSTER_NODES_MAX) {
            return Err(JobRefusal::Empty);
        }
        let attempt = match &entry.state {
            JobState::Running { attempt, .. } if entry.resizing.is_none() && !entry.cancelling && gpus != entry.terms.gpus => *attempt,
            _ => return Err(JobRefusal::NotRunning),
        };
        if attempt + 1 >= ATTEMPTS_MAX {
            return Err(JobRefusal::TooManyRetries);
        }
        let resized = JobTerms { gpus, ..entry.terms.clone() };
        if entry.escrowed_minor.saturating_add(attempt_cost(entry.book.limit_minor_per_gpu_hour, &resized)) > entry.terms.budget_minor {
            return Err(JobRefusal::BudgetTooSmall);
        }
        Ok(())
    }

    /// A running job grows (or shrinks) to `gpus` (docs/jobs.md "Growing a
    /// job"): it bids for the new size as its next attempt while it runs on;
    /// once that bid fills, its old leases end and it restarts on the new
    /// ones from its checkpoint. A bid that does not fill leaves it as it was.
    pub fn resize(&mut self, job: JobId, account: AccountId, gpus: u32) -> Result<Outcome, JobRefusal> {
        self.check_resize(job, account, gpus)?;
        let entry = self.jobs.get_mut(&job).expect("checked");
        let JobState::Running { attempt, .. } = entry.state else { unreachable!("checked") };
        entry.resizing = Some(Resize { gpus, attempt: attempt + 1, order: None, leases: Vec::new() });
        entry.attempts = attempt + 1;
        entry.resizes += 1;
        let mut outcome = Outcome::default();
        outcome.bids.push(self.bid_sized(job, attempt + 1, gpus));
        Ok(outcome)
    }

    /// Whether a cancel of `job` by `account` would do anything.
    pub fn cancellable(&self, job: JobId, account: AccountId) -> Option<bool> {
        self.jobs.get(&job).filter(|j| j.terms.account == account).map(|j| !j.state.is_over())
    }

    /// The workload of one of a job's leases exited (the host's delivery
    /// status): 0 finishes the job, anything else is the workload's error:
    /// the job restarts within its `restarts_on_error`, else fails (another
    /// host would fail the same way). Its leases are ended. Under a
    /// preemption notice on any lease of the attempt the exit, whatever
    /// its code, is the workload obeying the notice (or a rank losing its
    /// preempted peer): the attempt ends as preempted and the job moves on.
    /// A cluster member's error waits `CLUSTER_EXIT_HOLD_MS` for a peer's
    /// host fault (its lease ends at once): a rank that failed because its
    /// peer's host died moves with the job.
    pub fn workload_exited(&mut self, lease: LeaseId, code: i64, at_ms: u64) -> Outcome {
        let mut outcome = Outcome::default();
        let Some(&job) = self.leases.get(&lease) else { return outcome };
        let Some(entry) = self.jobs.get_mut(&job) else { return outcome };
        let JobState::Running { leases, .. } = &entry.state else { return outcome };
        let account = entry.terms.account;
        if self.rules >= 1 && leases.iter().any(|l| self.noticed.contains(l)) {
            // The exited lease is ended now (billing stops); the others
            // are ended as an attempt's first ended lease ends them.
            self.forget_lease(lease);
            outcome.end_leases.push((account, lease));
            self.lease_ended(job, lease, LeaseEndReason::Preempted, at_ms, &mut outcome);
            return outcome;
        }
        if self.rules >= 2 && (entry.failing.is_some() || (code != 0 && leases.len() > 1)) {
            entry.failing.get_or_insert(Failing { code, since_ms: at_ms });
            let since_ms = entry.failing.map_or(at_ms, |f| f.since_ms);
            let left = match &mut entry.state {
                JobState::Running { leases, .. } => {
                    leases.retain(|l| *l != lease);
                    leases.len()
                }
                _ => 0,
            };
            self.holds.insert(job, since_ms);
            self.forget_lease(lease);
            outcome.end_leases.push((account, lease));
            if left == 0 {
                self.error_exit(job, at_ms, &mut outcome);
            }
            return outcome;
        }
        if code != 0 && self.rules >= 2 {
            self.jobs.get_mut(&job).expect("found above").failing = Some(Failing { code, since_ms: at_ms });
            self.error_exit(job, at_ms, &mut outcome);
            return outcome;
        }
        if code == 0 && leases.len() > 1 && self.rules >= 1 {
            // A cluster: each member's last outputs are in the store when
            // its exit is told; the job is done when every member's is.
            self.exited_ok.insert(lease);
            if !leases.iter().all(|l| self.exited_ok.contains(l)) {
                return outcome;
            }
        }
        outcome.end_leases.extend(leases.iter().map(|l| (account, *l)));
        let state = if code == 0 { JobState::Succeeded } else { JobState::Failed(JobFailure::WorkloadFailed(code)) };
        self.enter(job, state, at_ms, &mut outcome);
        outcome
    }

    /// A failing job's exit counts as its workload's error: its leases end,
    /// and it restarts (within `restarts_on_error` and its budget) or fails.
    fn error_exit(&mut self, job: JobId, at_ms: u64, outcome: &mut Outcome) {
        let Some(entry) = self.jobs.get_mut(&job) else { return };
        let Some(Failing { code, .. }) = entry.failing.take() else { return };
        let account = entry.terms.account;
        let (attempt, leases) = match &mut entry.state {
            JobState::Running { attempt, leases } => (*attempt, std::mem::take(leases)),
            _ => return,
        };
        let restart = !entry.cancelling
            && entry.restarts < entry.recovery.restarts_on_error
            && entry.attempts.max(attempt) + 1 < ATTEMPTS_MAX
            && entry.escrowed_minor.saturating_add(attempt_cost(entry.book.limit_minor_per_gpu_hour, &entry.terms))
                <= entry.terms.budget_minor;
        let state = if entry.cancelling {
            JobState::Cancelled
        } else if restart {
            entry.restarts += 1;
            let next = entry.attempts.max(attempt) + 1;
            entry.attempts = next;
            JobState::Bidding { attempt: next, order: None }
        } else {
            JobState::Failed(JobFailure::WorkloadFailed(code))
        };
        for lease in leases {
            self.forget_lease(lease);
            outcome.end_leases.push((account, lease));
        }
        self.enter(job, state.clone(), at_ms, outcome);
        if let JobState::Bidding { attempt, .. } = state {
            outcome.moves.push((job, attempt, AttemptCause::ExitedWithError(code)));
            outcome.bids.push(self.bid(job, attempt));
        }
    }

    /// Jobs whose held cluster exit is due at `now_ms` (the exchange
    /// journals `JobExitHoldEnded` for each).
    pub fn held_exits_due(&self, now_ms: u64) -> Vec<JobId> {
        self.holds.iter().filter(|(_, since)| now_ms >= since.saturating_add(limits::CLUSTER_EXIT_HOLD_MS)).map(|(job, _)| *job).collect()
    }

    /// A held cluster exit's wait is over with no host fault: the exit is
    /// the workload's error.
    pub fn exit_hold_ended(&mut self, job: JobId, at_ms: u64) -> Outcome {
        let mut outcome = Outcome::default();
        let due =
            self.jobs.get(&job).and_then(|j| j.failing).is_some_and(|f| at_ms >= f.since_ms.saturating_add(limits::CLUSTER_EXIT_HOLD_MS));
        if due {
            self.error_exit(job, at_ms, &mut outcome);
        }
        outcome
    }

    /// The regions `job` accepts (empty: any).
    pub fn regions(&self, job: JobId) -> &[String] {
        self.jobs.get(&job).map_or(&[], |j| &j.recovery.regions)
    }

    /// The books `job`'s next attempt may bid on, each at its limit: the
    /// one it bids on now first, then its first book and its alternatives
    /// in the order the renter gave them.
    pub fn books(&self, job: JobId) -> Vec<JobAlternative> {
        let Some(entry) = self.jobs.get(&job) else { return Vec::new() };
        let first = JobAlternative { instrument: entry.terms.instrument, limit_minor_per_gpu_hour: entry.terms.limit_minor_per_gpu_hour };
        let mut books = vec![entry.book.clone()];
        for book in std::iter::once(&first).chain(&entry.recovery.alternatives) {
            if !books.iter().any(|b| b.instrument == book.instrument) {
                books.push(book.clone());
            }
        }
        books
    }

    /// The market chose `book` for `job`'s new attempt `attempt` (one of
    /// `books`): the attempt bids there; the bid that replaces the one in
    /// the outcome, if the job still bids for that attempt.
    pub fn rebook(
        &mut self,
        job: JobId,
        attempt: u32,
        cause: AttemptCause,
        book: JobAlternative,
        choice: BookChoice,
        at_ms: u64,
    ) -> Option<gpux_engine::Command> {
        let entry = self.jobs.get_mut(&job)?;
        if !matches!(entry.state, JobState::Bidding { attempt: a, order: None } if a == attempt) {
            return None;
        }
        entry.last_move = Some(AttemptMove { attempt, cause, instrument: book.instrument, choice, at_ms });
        entry.book = book;
        Some(self.bid(job, attempt))
    }

    /// The client order id of `job`'s bid for `attempt`.
    pub fn bid_client_order_id(job: JobId, attempt: u32) -> u64 {
        JOB_CLIENT_ORDER_ID_BASE + job.0 * ATTEMPTS_MAX as u64 + attempt as u64
    }

    /// A preemption known to be coming to a job's running lease (or none
    /// any more): whether it changed what the job's feed shows.
    pub fn set_preemption_ahead(&mut self, lease: LeaseId, ahead: Option<PreemptionAhead>) -> bool {
        if !self.leases.contains_key(&lease) {
            return false;
        }
        match ahead {
            Some(ahead) => self.ahead.insert(lease, ahead) != Some(ahead),
            None => self.ahead.remove(&lease).is_some(),
        }
    }

    /// Whether a preemption notice reached one of `lease`'s job's running
    /// attempt's leases (its workload is moving, not finishing).
    pub fn moving(&self, lease: LeaseId) -> bool {
        let Some(job) = self.leases.get(&lease).and_then(|job| self.jobs.get(job)) else { return false };
        self.rules >= 1 && matches!(&job.state, JobState::Running { leases, .. } if leases.iter().any(|l| self.noticed.contains(l)))
    }

    /// Stops following a lease of a job (ended, or left behind by its attempt).
    fn forget_lease(&mut self, lease: LeaseId) {
        self.leases.remove(&lease);
        self.heard.remove(&lease);
        self.noticed.remove(&lease);
        self.exited_ok.remove(&lease);
        self.started.remove(&lease);
        self.ahead.remove(&lease);
    }

    /// `state` as the renter sees it: a running attempt whose workloads do
    /// not all run yet is `starting`.
    pub fn shown(&self, state: &JobState) -> JobState {
        match state {
            JobState::Running { attempt, leases } if !leases.iter().all(|l| self.started.contains(l)) => {
                JobState::Starting { attempt: *attempt, leases: leases.clone() }
            }
            other => other.clone(),
        }
    }

    /// The host of one of a job's leases reported its workload `running`:
    /// once every lease of the attempt has, the job is `running` (told).
    pub fn workload_running(&mut self, lease: LeaseId, at_ms: u64) -> Outcome {
        let mut outcome = Outcome::default();
        let Some(&job) = self.leases.get(&lease) else { return outcome };
        let Some(entry) = self.jobs.get_mut(&job) else { return outcome };
        let JobState::Running { leases, .. } = &entry.state else { return outcome };
        if !self.started.insert(lease) || !leases.iter().all(|l| self.started.contains(l)) {
            return outcome;
        }
        entry.updated_at_ms = at_ms;
        outcome.transitions.push((job, entry.terms.account, entry.state.clone()));
        outcome
    }

    /// A host could not start one of the job's leases for the renter's
    /// reason: the job fails (another host would fail the same way).
    pub fn undeliverable(&mut self, lease: LeaseId, code: gpux_protocol::FailureCode, at_ms: u64) -> Outcome {
        let mut outcome = Outcome::default();
        let Some(&job) = self.leases.get(&lease) else { return outcome };
        let Some(entry) = self.jobs.get(&job) else { return outcome };
        let JobState::Running { leases, .. } = &entry.state else { return outcome };
        let account = entry.terms.account;
        outcome.end_leases.extend(leases.iter().map(|l| (account, *l)));
        self.enter(job, JobState::Failed(JobFailure::Undeliverable(code)), at_ms, &mut outcome);
        outcome
    }

    /// Whether `lease` is one of a job's.
    pub fn runs_on(&self, lease: LeaseId) -> bool {
        self.leases.contains_key(&lease)
    }

    /// The exchange heard of a job's lease from its supplier (a usage
    /// report): it is not silent.
    pub fn heard(&mut self, lease: LeaseId, supplier: AccountId, at_ms: u64) {
        if let Some(heard) = self.heard.get_mut(&lease).filter(|h| h.supplier == supplier) {
            heard.last_ms = heard.last_ms.max(at_ms);
        }
    }

    /// A delivery status of a job's lease from its supplier: its host
    /// started on it, and it is not silent.
    pub fn status_heard(&mut self, lease: LeaseId, supplier: AccountId, at_ms: u64) {
        if let Some(heard) = self.heard.get_mut(&lease).filter(|h| h.supplier == supplier) {
            heard.last_ms = heard.last_ms.max(at_ms);
            heard.status_seen = true;
        }
    }

    /// Stops following a lease's silence (it is no longer a running job lease).
    pub fn forget_heard(&mut self, lease: LeaseId) {
        self.heard.remove(&lease);
    }

    /// Job leases whose host counts as gone at `now_ms` by `rules`
    /// (`connected(lease, supplier)`: whether a connected session of the
    /// supplier runs the lease): the exchange fails their delivery so that
    /// the job resumes elsewhere (docs/market-rules.md "Jobs").
    pub fn silent_leases(&self, now_ms: u64, rules: Silence, connected: impl Fn(LeaseId, AccountId) -> bool) -> Vec<(LeaseId, AccountId)> {
        self.heard
            .iter()
            .filter(|(lease, h)| h.gone(now_ms, rules, || connected(**lease, h.supplier)))
            .map(|(l, h)| (*l, h.supplier))
            .collect()
    }

    /// Follows one engine entry's events.
    pub fn observe(&mut self, events: &[Event]) -> Outcome {
        let mut outcome = Outcome::default();
        let mut seen = Observed::default();
        for event in events {
            let at_ms = event.at_ms;
            match event.kind {
                EventKind::OrderAccepted { order, account, client_order_id, .. } => self.bid_accepted(account, client_order_id, order),
                EventKind::Rejected { account: Some(account), client_order_id, code } => {
                    self.bid_refused(account, client_order_id, code, at_ms, &mut outcome)
                }
                EventKind::Trade { buy_order: order, .. } => seen.buy_order = Some(order),
                EventKind::LeaseCreated { lease, supplier, gpu_mask, price_minor_per_gpu_hour, .. } => {
                    let gpus = gpu_mask.count_ones() as u64;
                    self.lease_created(lease, supplier, gpus, price_minor_per_gpu_hour, at_ms, &mut seen, &mut outcome);
                }
                EventKind::OrderClosed { order, reason, .. } => self.bid_closed(order, reason, at_ms, &mut outcome),
                EventKind::PreemptionNotice { lease, .. } if self.leases.contains_key(&lease) => {
                    self.noticed.insert(lease);
                    self.ahead.remove(&lease);
                }
                EventKind::LeaseEnded { lease, reason } => {
                    let Some(&job) = self.leases.get(&lease) else {
                        self.heard.remove(&lease);
                        continue;
                    };
                    self.forget_lease(lease);
                    self.lease_ended(job, lease, reason, at_ms, &mut outcome);
                }
                _ => {}
            }
        }
        let at_ms = events.last().map_or(0, |e| e.at_ms);
        for job in std::mem::take(&mut seen.resized) {
            self.switch_to_resized(job, at_ms, &mut seen, &mut outcome);
        }
        self.complete_transitions(&mut outcome);
        self.assign_started(&seen, &mut outcome);
        outcome
    }

    /// A job's bid (or its resize's) was accepted: it is known by its order id from now.
    fn bid_accepted(&mut self, account: AccountId, client_order_id: u64, order: OrderId) {
        let Some((job, attempt)) = self.job_of_bid(account, client_order_id) else { return };
        let Some(entry) = self.jobs.get_mut(&job) else { return };
        if entry.state == (JobState::Bidding { attempt, order: None }) {
            entry.state = JobState::Bidding { attempt, order: Some(order) };
            self.orders.insert(order, job);
        }
        if let Some(resize) = entry.resizing.as_mut().filter(|r| r.attempt == attempt && r.order.is_none()) {
            resize.order = Some(order);
            self.orders.insert(order, job);
        }
    }

    /// A job's bid was refused: the job fails (a resize's: the job runs on as it was).
    fn bid_refused(&mut self, account: AccountId, client_order_id: u64, code: RejectCode, at_ms: u64, outcome: &mut Outcome) {
        let Some((job, attempt)) = self.job_of_bid(account, client_order_id) else { return };
        if let Some(entry) = self.jobs.get_mut(&job) {
            if entry.resizing.as_ref().is_some_and(|r| r.attempt == attempt && r.order.is_none()) {
                entry.resizing = None;
                return;
            }
        }
        if self.jobs.get(&job).is_some_and(|j| j.state == JobState::Bidding { attempt, order: None }) {
            self.enter(job, JobState::Failed(JobFailure::BidRefused(code)), at_ms, outcome);
        }
    }

    /// A lease of a job's fill (the trade before it names the bid): held
    /// in the job's escrow and followed; the job's attempt runs from the
    /// first, and a resize's switch waits for its fill to be whole.
    #[allow(clippy::too_many_arguments)]
    fn lease_created(
        &mut self,
        lease: LeaseId,
        supplier: AccountId,
        gpus: u64,
        price_minor_per_gpu_hour: u64,
        at_ms: u64,
        seen: &mut Observed,
        outcome: &mut Outcome,
    ) {
        let buy_order = seen.buy_order;
        let Some(job) = buy_order.and_then(|order| self.orders.get(&order).copied()) else { return };
        let Some(entry) = self.jobs.get_mut(&job) else { return };
        let escrow = price_minor_per_gpu_hour.saturating_mul(gpus).saturating_mul(entry.terms.hours as u64);
        entry.escrowed_minor = entry.escrowed_minor.saturating_add(escrow);
        entry.leases.push(lease);
        self.leases.insert(lease, job);
        self.heard.insert(lease, Heard::new(supplier, at_ms));
        seen.suppliers.insert(lease, supplier);
        if entry.resizing.as_ref().is_some_and(|r| r.order == buy_order) {
            if let Some(resize) = entry.resizing.as_mut() {
                resize.leases.push(lease);
            }
            if !seen.resized.contains(&job) {
                seen.resized.push(job);
            }
            return;
        }
        let bidding = match &mut entry.state {
            JobState::Bidding { attempt, .. } => Some(*attempt),
            // Another host's part of the same all-or-none fill.
            JobState::Running { leases, .. } => {
                leases.push(lease);
                None
            }
            _ => None,
        };
        if let Some(attempt) = bidding {
            self.enter(job, JobState::Running { attempt, leases: vec![lease] }, at_ms, outcome);
            seen.started.push(job);
        }
    }

    /// A job's bid closed: unfilled, the job fails (or is cancelled, if its
    /// renter asked); a resize's bid unfilled leaves the job as it was.
    fn bid_closed(&mut self, order: OrderId, reason: OrderCloseReason, at_ms: u64, outcome: &mut Outcome) {
        let Some(job) = self.orders.remove(&order) else { return };
        if let Some(entry) = self.jobs.get_mut(&job).filter(|j| j.resizing.as_ref().is_some_and(|r| r.order == Some(order))) {
            if reason != OrderCloseReason::Filled {
                entry.resizing = None;
            }
            return;
        }
        let Some(entry) = self.jobs.get(&job) else { return };
        if reason == OrderCloseReason::Filled || !matches!(entry.state, JobState::Bidding { .. }) {
            return;
        }
        let state = if entry.cancelling { JobState::Cancelled } else { JobState::Failed(JobFailure::BidClosed(reason)) };
        self.enter(job, state, at_ms, outcome);
    }

    /// A resize whose bid filled: the old leases end, the job restarts on the new ones.
    fn switch_to_resized(&mut self, job: JobId, at_ms: u64, seen: &mut Observed, outcome: &mut Outcome) {
        let Some(entry) = self.jobs.get_mut(&job) else { return };
        let Some(resize) = entry.resizing.take() else { return };
        let account = entry.terms.account;
        entry.terms.gpus = resize.gpus;
        if let JobState::Running { leases, .. } = &entry.state {
            for old in leases.clone() {
                self.forget_lease(old);
                outcome.end_leases.push((account, old));
            }
        }
        self.enter(job, JobState::Running { attempt: resize.attempt, leases: resize.leases }, at_ms, outcome);
        seen.started.push(job);
    }

    /// A fill across several hosts creates its leases one event at a time:
    /// the renter is told the attempt with all of them.
    fn complete_transitions(&self, outcome: &mut Outcome) {
        for (job, _, state) in &mut outcome.transitions {
            if let (JobState::Running { attempt, leases }, Some(JobState::Running { attempt: now, leases: all })) =
                (&mut *state, self.jobs.get(job).map(|j| &j.state))
            {
                if attempt == now {
                    leases.clone_from(all);
                }
            }
        }
    }

    /// Each started attempt is handed to its hosts once all of its leases are known.
    fn assign_started(&self, seen: &Observed, outcome: &mut Outcome) {
        for job in &seen.started {
            let Some(entry) = self.jobs.get(job) else { continue };
            let JobState::Running { attempt, leases } = &entry.state else { continue };
            for (rank, lease) in leases.iter().enumerate() {
                let Some(&supplier) = seen.suppliers.get(lease) else { continue };
                let assignment = JobAssignment {
                    job: *job,
                    attempt: *attempt,
                    renter: entry.terms.account,
                    world_gpus: entry.terms.gpus,
                    node_rank: rank as u32,
                    nodes: leases.len() as u32,
                    run: entry.terms.run.clone(),
                    // Filled by the market, which knows the hosts' fabrics.
                    peers: Vec::new(),
                };
                outcome.assigned.push((*lease, supplier, assignment));
            }
        }
    }

    fn lease_ended(&mut self, job: JobId, lease: LeaseId, reason: LeaseEndReason, at_ms: u64, outcome: &mut Outcome) {
        let Some(entry) = self.jobs.get_mut(&job) else { return };
        let account = entry.terms.account;
        let JobState::Running { attempt, leases } = &mut entry.state else { return };
        let attempt = *attempt;
        leases.retain(|l| *l != lease);
        let others: Vec<LeaseId> = std::mem::take(leases);
        // The attempt is over with its first lease: the others are ended too.
        outcome.end_leases.extend(others.iter().map(|l| (account, *l)));
        for other in &others {
            // `forget_lease`, field by field: `entry` is still borrowed.
            self.leases.remove(other);
            self.heard.remove(other);
            self.noticed.remove(other);
            self.exited_ok.remove(other);
            self.started.remove(other);
            self.ahead.remove(other);
        }
        // A resize under way is dropped: its bid is cancelled, and the next
        // attempt (if any) bids at the size asked for.
        if let Some(resize) = entry.resizing.take() {
            if let Some(order) = resize.order {
                outcome.cancel_orders.push((account, order));
                self.orders.remove(&order);
            }
            entry.terms.gpus = resize.gpus;
        }
        let failed_by_host = matches!(reason, LeaseEndReason::Preempted | LeaseEndReason::DeliveryFailed);
        let state = if entry.cancelling {
            JobState::Cancelled
        } else if !failed_by_host {
            match reason {
                LeaseEndReason::DurationElapsed => JobState::Failed(JobFailure::OutOfTime),
                // Ended by the renter (or resold, or unfunded) outside the job.
                _ => JobState::Cancelled,
            }
        } else if attempt.saturating_sub(entry.resizes) > entry.terms.retries {
            JobState::Failed(JobFailure::RetriesExhausted)
        } else if entry.escrowed_minor.saturating_add(attempt_cost(entry.book.limit_minor_per_gpu_hour, &entry.terms))
            > entry.terms.budget_minor
        {
            JobState::Failed(JobFailure::BudgetSpent)
        } else {
            // After an abandoned resize the attempt numbers it took are skipped.
            let next = entry.attempts.max(attempt) + 1;
            entry.attempts = next;
            JobState::Bidding { attempt: next, order: None }
        };
        self.enter(job, state.clone(), at_ms, outcome);
        if let JobState::Bidding { attempt, .. } = state {
            let cause = if reason == LeaseEndReason::Preempted { AttemptCause::Preempted } else { AttemptCause::HostFailed };
            outcome.moves.push((job, attempt, cause));
            outcome.bids.push(self.bid(job, attempt));
        }
    }

    /// The job enters `state` at `at_ms`: told to its renter; a job that is
    /// over leaves the live count and joins its account's finished jobs.
    fn enter(&mut self, job: JobId, state: JobState, at_ms: u64, outcome: &mut Outcome) {
        let Some(entry) = self.jobs.get_mut(&job) else { return };
        let account = entry.terms.account;
        let participant = entry.participant;
        let was_over = entry.state.is_over();
        if !matches!(state, JobState::Running { .. }) {
            // A held exit is settled by whatever moved the job on.
            entry.failing = None;
            self.holds.remove(&job);
        }
        entry.state = state.clone();
        entry.updated_at_ms = at_ms;
        outcome.transitions.push((job, account, state.clone()));
        if state.is_over() && !was_over {
            if let Some(live) = self.live.get_mut(&account) {
                *live -= 1;
                if *live == 0 {
                    self.live.remove(&account);
                }
            }
            if let Some(live) = self.live_by_participant.get_mut(&participant) {
                *live -= 1;
                if *live == 0 {
                    self.live_by_participant.remove(&participant);
                }
            }
            self.live_total -= 1;
            self.finish(account, job);
        }
    }

    /// Keeps a finished job within the account's share and the table's bound.
    fn finish(&mut self, account: AccountId, job: JobId) {
        let kept = self.finished.entry(account).or_default();
        let before = kept.len();
        kept.push_back(job);
        self.finished_by_count.remove(&(before, account));
        self.finished_by_count.insert((before + 1, account));
        self.finished_total += 1;
        if before + 1 > limits::JOBS_FINISHED_PER_ACCOUNT_MAX {
            self.forget_oldest(account);
        }
        while self.finished_total > limits::JOBS_FINISHED_MAX {
            let Some(&(_, heaviest)) = self.finished_by_count.last() else { break };
            self.forget_oldest(heaviest);
        }
    }

    fn forget_oldest(&mut self, account: AccountId) {
        let Some(kept) = self.finished.get_mut(&account) else { return };
        let before = kept.len();
        let Some(job) = kept.pop_front() else { return };
        self.finished_by_count.remove(&(before, account));
        if before > 1 {
            self.finished_by_count.insert((before - 1, account));
        } else {
            self.finished.remove(&account);
        }
        self.finished_total -= 1;
        self.jobs.remove(&job);
        self.by_account.remove(&(account, job));
    }

    /// Whether `account`'s order `client_order_id` is one of its jobs' bids
    /// (it trades only with suppliers whose hosts deliver workloads).
    pub fn is_job_bid(&self, account: AccountId, client_order_id: u64) -> bool {
        self.job_of_bid(account, client_order_id).is_some()
    }

    fn job_of_bid(&self, account: AccountId, client_order_id: u64) -> Option<(JobId, u32)> {
        if !(JOB_CLIENT_ORDER_ID_BASE..1 << 63).contains(&client_order_id) {
            return None;
        }
        let offset = client_order_id - JOB_CLIENT_ORDER_ID_BASE;
        let job = JobId(offset / ATTEMPTS_MAX as u64);
        let attempt = (offset % ATTEMPTS_MAX as u64) as u32;
        self.jobs.get(&job).filter(|j| j.terms.account == account).map(|_| (job, attempt))
    }

    /// The bid of a job's attempt: all of its GPUs or none, resting until it
    /// fills (a job waits for capacity), at its limit, for its hours.
    fn bid(&self, job: JobId, attempt: u32) -> gpux_engine::Command {
        self.bid_sized(job, attempt, self.jobs[&job].terms.gpus)
    }

    /// A cluster job's bid is a cluster bid for `gpus / gpus_per_node`
    /// hosts (one host when that is 1).
    fn bid_sized(&self, job: JobId, attempt: u32, gpus: u32) -> gpux_engine::Command {
        let entry = &self.jobs[&job];
        let (terms, book) = (&entry.terms, &entry.book);
        let regions = entry.recovery.regions.clone();
        let client_order_id = JOB_CLIENT_ORDER_ID_BASE + job.0 * ATTEMPTS_MAX as u64 + attempt as u64;
        let order = NewOrder {
            time_in_force: TimeInForce::Gtc,
            self_trade_prevention: SelfTradePrevention::CancelNewest,
            one_host: terms.one_host || (terms.gpus_per_node > 0 && gpus == terms.gpus_per_node),
            duration: LeaseDuration::Hours(terms.hours),
            ..NewOrder::limit(terms.account, client_order_id, book.instrument, Side::Buy, book.limit_minor_per_gpu_hour, gpus)
        };
        let options = OrderOptions {
            all_or_none: true,
            min_supplier_score_bps: terms.min_supplier_score_bps,
            verified_only: terms.verified_only,
            ..OrderOptions::default()
        };
        let nodes = gpus.checked_div(terms.gpus_per_node).unwrap_or(0);
        if nodes >= 2 {
            let options = OrderOptions { all_or_none: false, ..options };
            let min_fabric_gbps = terms.min_fabric_gbps;
            return gpux_engine::Command::Place {
                order,
                options,
                regions,
                cluster: Some(gpux_engine::ClusterTerms { nodes, min_fabric_gbps }),
            };
        }
        gpux_engine::Command::Place { order, options, regions, cluster: None }
    }
}

/// The most one attempt can escrow: every GPU at `limit` for its hours.
fn attempt_cost(limit_minor_per_gpu_hour: u64, terms: &JobTerms) -> u64 {
    limit_minor_per_gpu_hour.saturating_mul(terms.gpus as u64).saturating_mul(terms.hours as u64)
}
