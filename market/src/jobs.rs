//! Jobs at the exchange (docs/jobs.md "A job's life"): a job bids for its
//! GPUs within its limits, runs on the leases its bid fills, and when one of
//! them ends before the job did (preempted, or its host failed it) ends the
//! others and bids again, to resume from its last checkpoint, at most
//! `retries` times and within its budget. Pure and deterministic like the
//! rest of the market: it follows the engine's events and says what to do
//! next (`Outcome`); the sequencer journals each next step as its own
//! entry, as it does re-match's replacement bids.
//!
//! Journaled (`JournalEntry::SubmitJob`, `CancelJob`) and applied by
//! `MarketState`; not yet on the wire (issue "Jobs", next steps).

use std::collections::BTreeMap;

use gpux_engine::{
    AccountId, Event, EventKind, InstrumentId, LeaseDuration, LeaseEndReason, LeaseId, NewOrder, OrderCloseReason, OrderId, OrderOptions,
    RejectCode, SelfTradePrevention, Side, TimeInForce,
};
use serde::{Deserialize, Serialize};

/// Client order ids from here up (below re-match's) are jobs' bids: this
/// plus the job's id times 1 024 plus the attempt.
pub const JOB_CLIENT_ORDER_ID_BASE: u64 = 1 << 62;
/// Attempts a job's client order ids leave room for (its first and up to
/// 1 023 retries).
pub const ATTEMPTS_MAX: u32 = 1_024;

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct JobId(pub u64);

/// What the market holds of a job: who pays, what it buys, its limits.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct JobTerms {
    pub account: AccountId,
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
}

/// Why a job ended without finishing.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum JobFailure {
    /// Its leases failed more often than it may retry.
    RetriesExhausted,
    /// What is left of its budget pays for no further attempt.
    BudgetSpent,
    /// The exchange refused its bid (funds, limits): the code says why.
    BidRefused(RejectCode),
    /// Its bid closed unfilled (the renter cancelled the order itself, say).
    BidClosed(OrderCloseReason),
    /// Its leases ran their hours before the workload finished.
    OutOfTime,
    /// The workload exited with this code (the renter's code failed: not retried).
    WorkloadFailed(i64),
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum JobState {
    /// Its bid for `attempt` is on the book (or about to be).
    Bidding {
        attempt: u32,
        order: Option<OrderId>,
    },
    Running {
        attempt: u32,
        leases: Vec<LeaseId>,
    },
    Succeeded,
    Failed(JobFailure),
    Cancelled,
}

impl JobState {
    pub fn is_over(&self) -> bool {
        matches!(self, JobState::Succeeded | JobState::Failed(_) | JobState::Cancelled)
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
}

/// What to do next, each journaled as its own entry.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Outcome {
    /// A bid to place for a job's next attempt.
    pub bids: Vec<(NewOrder, OrderOptions)>,
    /// Leases to end (by their renter) because the job no longer needs them.
    pub end_leases: Vec<(AccountId, LeaseId)>,
    /// Bids to cancel (a job cancelled while bidding).
    pub cancel_orders: Vec<(AccountId, OrderId)>,
    /// Every state a job entered, in order (for the renter's private feed).
    pub transitions: Vec<(JobId, AccountId, JobState)>,
}

impl Outcome {
    /// The engine commands it calls for, in the order to apply them: ends
    /// and cancels first (they free funds and GPUs), then bids.
    pub fn commands(&self) -> Vec<gpux_engine::Command> {
        use gpux_engine::Command;
        let ends = self.end_leases.iter().map(|&(account, lease)| Command::EndLease { account, lease });
        let cancels = self.cancel_orders.iter().map(|&(account, order)| Command::CancelOrder { account, order });
        let bids = self.bids.iter().map(|(order, options)| Command::PlaceOrderWith { order: order.clone(), options: *options });
        ends.chain(cancels).chain(bids).collect()
    }
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Jobs {
    jobs: BTreeMap<JobId, Job>,
    next: u64,
    /// Bids by order id, and leases by id: the job and attempt each serves.
    orders: BTreeMap<OrderId, JobId>,
    leases: BTreeMap<LeaseId, JobId>,
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
}

impl Jobs {
    pub fn state(&self, job: JobId) -> Option<&JobState> {
        self.jobs.get(&job).map(|j| &j.state)
    }

    pub fn terms(&self, job: JobId) -> Option<&JobTerms> {
        self.jobs.get(&job).map(|j| &j.terms)
    }

    /// A new job: its first bid.
    pub fn submit(&mut self, terms: JobTerms) -> Result<(JobId, Outcome), JobRefusal> {
        if terms.gpus == 0 || terms.hours == 0 {
            return Err(JobRefusal::Empty);
        }
        if terms.retries >= ATTEMPTS_MAX {
            return Err(JobRefusal::TooManyRetries);
        }
        if attempt_cost(&terms) > terms.budget_minor {
            return Err(JobRefusal::BudgetTooSmall);
        }
        let id = JobId(self.next);
        self.next += 1;
        let account = terms.account;
        self.jobs.insert(id, Job { terms, state: JobState::Bidding { attempt: 1, order: None }, escrowed_minor: 0, cancelling: false });
        let mut outcome = Outcome::default();
        outcome.transitions.push((id, account, JobState::Bidding { attempt: 1, order: None }));
        outcome.bids.push(self.bid(id, 1));
        Ok((id, outcome))
    }

    /// The renter cancels: its bid is cancelled or its leases ended; the job
    /// is cancelled once they are.
    pub fn cancel(&mut self, job: JobId, account: AccountId) -> Outcome {
        let mut outcome = Outcome::default();
        let Some(entry) = self.jobs.get_mut(&job).filter(|j| j.terms.account == account && !j.state.is_over()) else { return outcome };
        entry.cancelling = true;
        match &entry.state {
            JobState::Bidding { order: Some(order), .. } => outcome.cancel_orders.push((account, *order)),
            JobState::Bidding { order: None, .. } => {
                entry.state = JobState::Cancelled;
                outcome.transitions.push((job, account, JobState::Cancelled));
            }
            JobState::Running { leases, .. } => outcome.end_leases.extend(leases.iter().map(|l| (account, *l))),
            _ => {}
        }
        outcome
    }

    /// The workload of one of a job's leases exited (the host's delivery
    /// status): 0 finishes the job, anything else fails it (not retried:
    /// the renter's code failed, not the host). Its leases are ended.
    pub fn workload_exited(&mut self, lease: LeaseId, code: i64) -> Outcome {
        let mut outcome = Outcome::default();
        let Some(&job) = self.leases.get(&lease) else { return outcome };
        let Some(entry) = self.jobs.get_mut(&job) else { return outcome };
        let JobState::Running { leases, .. } = &entry.state else { return outcome };
        let account = entry.terms.account;
        outcome.end_leases.extend(leases.iter().map(|l| (account, *l)));
        let state = if code == 0 { JobState::Succeeded } else { JobState::Failed(JobFailure::WorkloadFailed(code)) };
        entry.state = state.clone();
        outcome.transitions.push((job, account, state));
        outcome
    }

    /// Whether `lease` is one of a job's.
    pub fn runs_on(&self, lease: LeaseId) -> bool {
        self.leases.contains_key(&lease)
    }

    /// Follows one engine entry's events.
    pub fn observe(&mut self, events: &[Event]) -> Outcome {
        let mut outcome = Outcome::default();
        let mut buy_order = None;
        for event in events {
            match event.kind {
                EventKind::OrderAccepted { order, account, client_order_id, .. } => {
                    let Some((job, attempt)) = self.job_of_bid(account, client_order_id) else { continue };
                    if let Some(entry) = self.jobs.get_mut(&job) {
                        if entry.state == (JobState::Bidding { attempt, order: None }) {
                            entry.state = JobState::Bidding { attempt, order: Some(order) };
                            self.orders.insert(order, job);
                        }
                    }
                }
                EventKind::Rejected { account: Some(account), client_order_id, code } => {
                    let Some((job, attempt)) = self.job_of_bid(account, client_order_id) else { continue };
                    if let Some(entry) = self.jobs.get_mut(&job).filter(|j| j.state == JobState::Bidding { attempt, order: None }) {
                        let state = JobState::Failed(JobFailure::BidRefused(code));
                        entry.state = state.clone();
                        outcome.transitions.push((job, account, state));
                    }
                }
                EventKind::Trade { buy_order: order, .. } => buy_order = Some(order),
                EventKind::LeaseCreated { lease, renter, gpu_mask, price_minor_per_gpu_hour, .. } => {
                    let Some(job) = buy_order.and_then(|order| self.orders.get(&order).copied()) else { continue };
                    let Some(entry) = self.jobs.get_mut(&job) else { continue };
                    let escrow =
                        price_minor_per_gpu_hour.saturating_mul(gpu_mask.count_ones() as u64).saturating_mul(entry.terms.hours as u64);
                    entry.escrowed_minor = entry.escrowed_minor.saturating_add(escrow);
                    self.leases.insert(lease, job);
                    let attempt = match &mut entry.state {
                        JobState::Bidding { attempt, .. } => *attempt,
                        JobState::Running { leases, .. } => {
                            // Another host's part of the same all-or-none fill.
                            leases.push(lease);
                            continue;
                        }
                        _ => continue,
                    };
                    entry.state = JobState::Running { attempt, leases: vec![lease] };
                    outcome.transitions.push((job, renter, entry.state.clone()));
                }
                EventKind::OrderClosed { order, account, reason, .. } => {
                    let Some(job) = self.orders.remove(&order) else { continue };
                    let Some(entry) = self.jobs.get_mut(&job) else { continue };
                    if reason == OrderCloseReason::Filled || !matches!(entry.state, JobState::Bidding { .. }) {
                        continue;
                    }
                    let state = if entry.cancelling { JobState::Cancelled } else { JobState::Failed(JobFailure::BidClosed(reason)) };
                    entry.state = state.clone();
                    outcome.transitions.push((job, account, state));
                }
                EventKind::LeaseEnded { lease, reason } => {
                    let Some(job) = self.leases.remove(&lease) else { continue };
                    self.lease_ended(job, lease, reason, &mut outcome);
                }
                _ => {}
            }
        }
        outcome
    }

    fn lease_ended(&mut self, job: JobId, lease: LeaseId, reason: LeaseEndReason, outcome: &mut Outcome) {
        let Some(entry) = self.jobs.get_mut(&job) else { return };
        let account = entry.terms.account;
        let JobState::Running { attempt, leases } = &mut entry.state else { return };
        let attempt = *attempt;
        leases.retain(|l| *l != lease);
        let others: Vec<LeaseId> = std::mem::take(leases);
        // The attempt is over with its first lease: the others are ended too.
        outcome.end_leases.extend(others.iter().map(|l| (account, *l)));
        for other in &others {
            self.leases.remove(other);
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
        } else if attempt > entry.terms.retries {
            JobState::Failed(JobFailure::RetriesExhausted)
        } else if entry.escrowed_minor.saturating_add(attempt_cost(&entry.terms)) > entry.terms.budget_minor {
            JobState::Failed(JobFailure::BudgetSpent)
        } else {
            JobState::Bidding { attempt: attempt + 1, order: None }
        };
        entry.state = state.clone();
        outcome.transitions.push((job, account, state.clone()));
        if let JobState::Bidding { attempt, .. } = state {
            outcome.bids.push(self.bid(job, attempt));
        }
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
    fn bid(&self, job: JobId, attempt: u32) -> (NewOrder, OrderOptions) {
        let terms = &self.jobs[&job].terms;
        let client_order_id = JOB_CLIENT_ORDER_ID_BASE + job.0 * ATTEMPTS_MAX as u64 + attempt as u64;
        let order = NewOrder {
            time_in_force: TimeInForce::Gtc,
            self_trade_prevention: SelfTradePrevention::CancelNewest,
            one_host: terms.one_host,
            duration: LeaseDuration::Hours(terms.hours),
            ..NewOrder::limit(terms.account, client_order_id, terms.instrument, Side::Buy, terms.limit_minor_per_gpu_hour, terms.gpus)
        };
        let options = OrderOptions {
            all_or_none: true,
            min_supplier_score_bps: terms.min_supplier_score_bps,
            verified_only: terms.verified_only,
            ..OrderOptions::default()
        };
        (order, options)
    }
}

/// The most one attempt can escrow: every GPU at the limit for its hours.
fn attempt_cost(terms: &JobTerms) -> u64 {
    terms.limit_minor_per_gpu_hour.saturating_mul(terms.gpus as u64).saturating_mul(terms.hours as u64)
}
