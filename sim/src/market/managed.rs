//! Training work submitted as gpux jobs (`SimConfig::managed_jobs_bps`,
//! docs/jobs.md): the exchange bids for the job, the host "runs" it (its
//! work is so many GPU-hours, checkpointed every half hour), and when a host
//! goes silent (a crash, an agent that stopped reporting) the exchange fails
//! the lease after three report intervals and the job resumes on another
//! host from its last checkpoint. Half of them are preemptible (the plan
//! picks a preemptible book whenever it is cheaper): at a preemption notice
//! the workload checkpoints and exits, as docs/jobs.md asks, and the job
//! moves to its next attempt. The report sets completion, attempts ended by
//! hosts and by preemption, the work lost, the time to resume and the cost
//! beside leases bought by hand.

use gpux_market::jobs::{JobFailure, JobId, JobRun, JobState, JobTerms};

use super::*;

/// How often a job's workload checkpoints: what a failure loses at most.
pub(super) const CHECKPOINT_MS: u64 = 30 * 60_000;
/// How long a preempted workload takes to checkpoint and exit after the
/// notice's SIGTERM.
pub(super) const CHECKPOINT_AT_NOTICE_MS: u64 = 5_000;
/// How often the exchange looks for silent job leases (as its sequencer
/// does every batch; the simulator's clock jumps).
pub(super) const SILENCE_CHECK_MS: u64 = 10 * 60_000;

pub(super) struct Managed {
    gpus: u32,
    /// Work the job needs (ms on each of its GPUs), and what is checkpointed.
    work_ms: u64,
    done_ms: u64,
    submitted_ms: u64,
    /// The lease it runs on now, and since when.
    running: Option<(LeaseId, u64)>,
    failed_at_ms: Option<u64>,
    /// The preemption notice its running lease got, if any.
    noticed_at_ms: Option<u64>,
    /// Its last attempt ended by a preemption (since this notice).
    preempted_at_ms: Option<u64>,
    /// Usage charged on its leases so far.
    charged_minor: u64,
}

impl Sim {
    /// Whether this training work goes to the exchange as a gpux job; draws
    /// nothing when the share is 0.
    pub(super) fn managed_draw(&mut self) -> bool {
        self.config.managed_jobs_bps > 0 && self.rng.random_range(0..10_000) < self.config.managed_jobs_bps
    }

    /// The silence limit the simulated exchange runs with: three report intervals.
    fn silence_ms(&self) -> u64 {
        3 * self.config.report_interval_ms
    }

    /// Whether this managed job bids a preemptible book (half of them).
    pub(super) fn managed_preemptible_draw(&mut self) -> bool {
        self.rng.random_range(0..2) == 1
    }

    pub(super) fn submit_managed(&mut self, account: AccountId, instrument: InstrumentId, gpus: u32, hours: u32, price: u64) {
        let terms = JobTerms {
            account,
            name: "sim-training".into(),
            instrument,
            gpus,
            one_host: true,
            limit_minor_per_gpu_hour: price,
            hours,
            budget_minor: price * gpus as u64 * hours as u64 * 4,
            retries: 3,
            min_supplier_score_bps: 0,
            verified_only: false,
            gpus_per_node: 0,
            min_fabric_gbps: 0,
            run: JobRun {
                image: "sim/train:1".into(),
                command: vec!["train".into()],
                bundle: None,
                install: Vec::new(),
                checkpoint_dir: "/checkpoints".into(),
                outputs_dir: "/outputs".into(),
                checkpoint_interval_s: (CHECKPOINT_MS / 1_000) as u32,
                shm_mib: 0,
                inputs: Vec::new(),
            },
        };
        self.metrics.managed.submitted += 1;
        if instrument.0 % 2 == 1 {
            self.metrics.managed.preemptible += 1;
        }
        let mut events = Vec::new();
        let applied = self.exchange.entry(JournalEntry::SubmitJob { at_ms: self.now_ms, terms }, &mut events);
        if let Some(Ok(job)) = applied.job {
            // Three quarters of its hours: one attempt's leases are enough.
            let managed = Managed {
                gpus,
                work_ms: hours as u64 * MS_PER_HOUR * 3 / 4,
                done_ms: 0,
                submitted_ms: self.now_ms,
                running: None,
                failed_at_ms: None,
                noticed_at_ms: None,
                preempted_at_ms: None,
                charged_minor: 0,
            };
            self.managed.insert(job, managed);
        }
        self.observe(&events);
    }

    /// A lease just created: if a managed job's attempt runs on it, its
    /// work is done when what is left of it has run.
    pub(super) fn managed_lease_created(&mut self, lease: LeaseId, start_ms: u64) {
        let Some(job) = self.exchange.market().jobs().job_of_lease(lease) else { return };
        let now_ms = self.now_ms;
        let Some(managed) = self.managed.get_mut(&job).filter(|m| m.running.is_none()) else { return };
        if let Some(failed) = managed.failed_at_ms.take() {
            self.metrics.managed.waiting_ms.push(now_ms.saturating_sub(failed));
        }
        if let Some(noticed) = managed.preempted_at_ms.take() {
            self.metrics.managed.notice_to_resume_ms.push(now_ms.saturating_sub(noticed));
        }
        managed.running = Some((lease, start_ms));
        let done_at = start_ms + managed.work_ms.saturating_sub(managed.done_ms);
        self.managed_lease.insert(lease, job);
        self.schedule(done_at, Action::ManagedDone(job, lease));
        // Its host starts the workload at once, as an agent reports it
        // (the job is `running` from then on, not `starting`).
        if let Some(supplier) = self.exchange.engine().lease(lease).map(|l| l.supplier) {
            let state = gpux_protocol::DeliveryState::Running { endpoints: Vec::new(), ssh: None, restarts: 0 };
            let mut events = Vec::new();
            self.exchange.entry(JournalEntry::DeliveryStatus { at_ms: self.now_ms, account: supplier, lease, state }, &mut events);
            debug_assert!(events.is_empty(), "a running status moves no money: {events:?}");
        }
    }

    /// A lease ended: if a managed job ran on it and now bids again, its
    /// work since the last checkpoint is lost.
    pub(super) fn managed_lease_ended(&mut self, lease: LeaseId) {
        let Some(&job) = self.managed_lease.get(&lease) else { return };
        let state = self.exchange.market().jobs().state(job).cloned();
        let now_ms = self.now_ms;
        let Some(managed) = self.managed.get_mut(&job) else { return };
        let Some((running, start_ms)) = managed.running.filter(|(running, _)| *running == lease) else { return };
        let _ = running;
        managed.running = None;
        let noticed = managed.noticed_at_ms.take();
        if !matches!(state, Some(JobState::Bidding { .. })) {
            return;
        }
        let elapsed = now_ms.saturating_sub(start_ms);
        if let Some(noticed) = noticed {
            // The workload checkpointed at the notice and exited: the work
            // up to then is kept, the few seconds after it redone.
            let kept = noticed.saturating_sub(start_ms);
            managed.done_ms = (managed.done_ms + kept).min(managed.work_ms);
            managed.preempted_at_ms = Some(noticed);
            let stats = &mut self.metrics.managed;
            stats.preemptions += 1;
            stats.lost_work_gpu_ms += (elapsed - kept.min(elapsed)) * managed.gpus as u64;
            stats.lost_work_by_hand_gpu_ms += elapsed * managed.gpus as u64;
            return;
        }
        let checkpointed = elapsed / CHECKPOINT_MS * CHECKPOINT_MS;
        managed.done_ms = (managed.done_ms + checkpointed).min(managed.work_ms);
        managed.failed_at_ms = Some(now_ms);
        let stats = &mut self.metrics.managed;
        stats.failovers += 1;
        stats.lost_work_gpu_ms += (elapsed - checkpointed) * managed.gpus as u64;
        // By hand, nothing resumes: the attempt's whole work is lost.
        stats.lost_work_by_hand_gpu_ms += elapsed * managed.gpus as u64;
    }

    /// The job's work ran to its end on `lease`: its host reports the
    /// workload exited 0 and the job succeeds (its leases end).
    pub(super) fn managed_done(&mut self, job: JobId, lease: LeaseId) {
        let running = self.managed.get(&job).and_then(|m| m.running).is_some_and(|(l, _)| l == lease);
        let Some(info) = self.exchange.engine().lease(lease).filter(|l| l.active && running) else { return };
        let supplier = info.supplier;
        if let Some(managed) = self.managed.get(&job) {
            self.metrics.managed.time_to_finish_ms.push(self.now_ms - managed.submitted_ms);
        }
        let state = gpux_protocol::DeliveryState::Exited { code: 0 };
        let mut events = Vec::new();
        self.exchange.entry(JournalEntry::DeliveryStatus { at_ms: self.now_ms, account: supplier, lease, state }, &mut events);
        self.observe(&events);
    }

    /// A preemption notice on a lease: a managed job's workload checkpoints
    /// and exits shortly after (its host tells the exit).
    pub(super) fn managed_noticed(&mut self, lease: LeaseId) {
        let Some(&job) = self.managed_lease.get(&lease) else { return };
        let now_ms = self.now_ms;
        let Some(managed) = self.managed.get_mut(&job).filter(|m| m.running.is_some_and(|(l, _)| l == lease)) else { return };
        managed.noticed_at_ms = Some(now_ms);
        self.schedule(now_ms + CHECKPOINT_AT_NOTICE_MS, Action::ManagedExit(job, lease));
    }

    /// A noticed workload exits 0 after its checkpoint: the job moves.
    pub(super) fn managed_exit(&mut self, job: JobId, lease: LeaseId) {
        let running = self.managed.get(&job).and_then(|m| m.running).is_some_and(|(l, _)| l == lease);
        let Some(info) = self.exchange.engine().lease(lease).filter(|l| l.active && running) else { return };
        let supplier = info.supplier;
        let state = gpux_protocol::DeliveryState::Exited { code: 0 };
        let mut events = Vec::new();
        self.exchange.entry(JournalEntry::DeliveryStatus { at_ms: self.now_ms, account: supplier, lease, state }, &mut events);
        self.observe(&events);
    }

    /// The exchange fails job leases whose host said nothing for the silence limit.
    pub(super) fn managed_silence_check(&mut self) {
        self.schedule(self.now_ms + SILENCE_CHECK_MS, Action::ManagedSilence);
        // A host whose agent is down (crashed, or its network lost) has no
        // connected session: its job leases fail once nothing was heard of
        // them for the gone limit, as the exchange fails them; a connected
        // one gets the silence limit (every job lease's host reports
        // `running` when it is created, so the start rule holds).
        let rules = gpux_market::jobs::Silence::with_silence(self.silence_ms());
        let (leases, suppliers) = (&self.leases, &self.suppliers);
        let connected = |lease: LeaseId, _| {
            leases.get(&lease).is_none_or(|l| {
                let host = &suppliers[l.supplier as usize];
                !host.is_down && host.network_down_until == 0
            })
        };
        let mut silent = self.exchange.market().jobs().silent_leases(self.now_ms, rules, connected);
        // A service's replicas follow the same rule (docs/services.md).
        silent.extend(self.exchange.market().services().silent_leases(self.now_ms, rules, connected));
        for (lease, _) in silent {
            let mut events = Vec::new();
            self.exchange.entry(JournalEntry::JobLeaseSilent { at_ms: self.now_ms, lease }, &mut events);
            self.observe(&events);
        }
    }

    /// A lease's billing closed: a managed job's charge, or a training
    /// lease bought by hand.
    pub(super) fn managed_billing_closed(&mut self, lease: LeaseId, renter: AccountId, verified_gpu_ms: u64, charged_minor: u64) {
        if let Some(managed) = self.managed_lease.get(&lease).and_then(|job| self.managed.get_mut(job)) {
            managed.charged_minor += charged_minor;
            return;
        }
        let training =
            self.renter_of_account.get(&renter).is_some_and(|&r| self.population.renters[r as usize].kind == RenterKind::Training);
        if training && verified_gpu_ms > 0 {
            self.metrics.managed.by_hand_gpu_ms += verified_gpu_ms;
            self.metrics.managed.by_hand_charged_minor += charged_minor;
        }
    }

    /// At the run's end: how each managed job stands.
    pub(super) fn managed_finish(&mut self) {
        for (job, managed) in &self.managed {
            match self.exchange.market().jobs().state(*job) {
                Some(JobState::Succeeded) => {
                    self.metrics.managed.succeeded += 1;
                    self.metrics.managed.useful_gpu_ms += managed.work_ms * managed.gpus as u64;
                    self.metrics.managed.charged_minor += managed.charged_minor;
                }
                Some(JobState::Failed(reason)) => {
                    let reason = match reason {
                        JobFailure::RetriesExhausted => "retries exhausted".to_string(),
                        JobFailure::BudgetSpent => "budget spent".to_string(),
                        JobFailure::BidRefused(code) => format!("bid refused: {}", code.message()),
                        JobFailure::BidClosed(_) => "bid closed unfilled".to_string(),
                        JobFailure::OutOfTime => "out of time".to_string(),
                        JobFailure::WorkloadFailed(code) => format!("workload exited {code}"),
                        JobFailure::Undeliverable(code) => format!("undeliverable: {}", code.describe()),
                    };
                    *self.metrics.managed.failed.entry(reason).or_default() += 1;
                }
                _ => self.metrics.managed.unfinished += 1,
            }
        }
    }
}
