//! Jobs (docs/jobs.md, docs/protocol.md "Jobs"): submissions checked and
//! journaled, a job's state and the account's jobs, cancels, tokens for
//! the job store, and the silence rule that fails a job's lease whose host
//! stopped speaking so that the job resumes elsewhere.

use gpux_engine::{ContractKind, EventKind, LeaseId};
use gpux_gateway::link::{ConnectionId, JobRequest};
use gpux_market::jobs::{limits, JobTerms};
use gpux_market::JournalEntry;
use gpux_protocol::{ErrorCode, JobId, JobSubmission, ServerMessage};

use super::{error, Sequencer};
use crate::job_store::{Grant, Issuer};

/// How long a job's lease may go without a word from its host (a delivery
/// status or a usage report; the agent reports every 10 s by default)
/// before the exchange fails its delivery (`--job-silence-ms`).
pub const JOB_SILENCE_MS_DEFAULT: u64 = 120_000;

/// How long a job store token is valid (a host's: its lease's end plus
/// the billing grace, if later).
pub const JOB_STORE_TOKEN_MS: u64 = gpux_engine::time::MS_PER_HOUR;

impl Sequencer {
    /// Sets how long a job's lease may be silent (`--job-silence-ms`).
    pub fn set_job_silence_ms(&mut self, silence_ms: u64) {
        self.job_silence_ms = silence_ms.max(1_000);
    }

    /// Hands out tokens for this job store (`--job-store`).
    pub fn set_job_store(&mut self, issuer: Issuer) {
        issuer.running.replace(self.market.jobs().running_leases().chain(self.market.volumes().leases()));
        self.job_store = Some(issuer);
    }

    /// Keeps the job store's running leases: a host's token holds while
    /// its lease runs, not a moment longer.
    pub(super) fn note_job_leases(&self, events: &[gpux_engine::Event]) {
        let Some(store) = &self.job_store else { return };
        for event in events {
            match event.kind {
                EventKind::LeaseCreated { lease, .. }
                    if self.market.jobs().job_of_lease(lease).is_some() || self.market.volumes().holds(lease) =>
                {
                    store.running.started(lease)
                }
                EventKind::LeaseEnded { lease, .. } => store.running.ended(lease, self.market.clock_ms()),
                _ => {}
            }
        }
    }

    pub(super) fn job(&mut self, connection: ConnectionId, id: u64, request: JobRequest) {
        let Some(account) = self.account(connection) else { return self.reply(connection, error(Some(id), ErrorCode::NotAuthenticated)) };
        let answer = match request {
            JobRequest::Submit { job } => match self.submit_job(account, id, *job) {
                Some(answer) => answer,
                None => return,
            },
            JobRequest::Status { job } => match self.market.jobs().info(job, account) {
                Some(info) => ServerMessage::Job { id, job: Box::new(info) },
                None => error(Some(id), ErrorCode::UnknownJob),
            },
            JobRequest::List { offset } => {
                let (mut jobs, more) = self.market.jobs().list(account, offset as usize, limits::JOBS_PAGE_MAX);
                let cut = gpux_protocol::fit_page(&mut jobs);
                let next_offset = (more || cut).then_some(offset + jobs.len() as u32);
                ServerMessage::Jobs { id, jobs, next_offset }
            }
            JobRequest::Cancel { job } => match self.market.jobs().cancellable(job, account) {
                None => error(Some(id), ErrorCode::UnknownJob),
                Some(live) => {
                    if live {
                        let at_ms = self.market.clock_ms();
                        if self.journal(JournalEntry::CancelJob { at_ms, account, job }).is_none() {
                            return;
                        }
                    }
                    match self.market.jobs().info(job, account) {
                        Some(info) => ServerMessage::Job { id, job: Box::new(info) },
                        None => error(Some(id), ErrorCode::UnknownJob),
                    }
                }
            },
            JobRequest::StoreToken { job, lease, volume } => self.job_store_token(account, id, job, lease, volume),
            JobRequest::Resize { job, gpus } => {
                if let Err(refusal) = self.market.jobs().check_resize(job, account, gpus) {
                    let code = match self.market.jobs().info(job, account) {
                        None => ErrorCode::UnknownJob,
                        Some(_) => refusal.into(),
                    };
                    return self.reply(connection, error(Some(id), code));
                }
                let at_ms = self.market.clock_ms();
                if self.journal(JournalEntry::ResizeJob { at_ms, account, job, gpus }).is_none() {
                    return;
                }
                match self.market.jobs().info(job, account) {
                    Some(info) => ServerMessage::Job { id, job: Box::new(info) },
                    None => error(Some(id), ErrorCode::UnknownJob),
                }
            }
            JobRequest::Bill { job, offset } => match self.job_bill(connection, account, id, job, offset) {
                Some(refusal) => refusal,
                None => return,
            },
        };
        self.reply(connection, answer);
    }

    /// Checks and journals a submission; `None` when the batch failed.
    fn submit_job(&mut self, account: gpux_engine::AccountId, id: u64, submission: JobSubmission) -> Option<ServerMessage> {
        if let Err(invalid) = submission.validate() {
            let message = format!("{}: {invalid}", ErrorCode::JobInvalid.message());
            return Some(ServerMessage::Error { id: Some(id), code: ErrorCode::JobInvalid, message });
        }
        let Some(instrument) = self.market.engine().instrument(submission.instrument) else {
            return Some(error(Some(id), ErrorCode::UnknownInstrument));
        };
        if !matches!(instrument.contract, ContractKind::Spot | ContractKind::Preemptible) {
            return Some(error(Some(id), ErrorCode::JobInstrumentInvalid));
        }
        let price = submission.limit_minor_per_gpu_hour;
        if !price.is_multiple_of(instrument.tick_minor.max(1))
            || !(instrument.price_min_minor_per_gpu_hour..=instrument.price_max_minor_per_gpu_hour).contains(&price)
        {
            let message = format!(
                "limit_minor_per_gpu_hour: a multiple of the book's tick ({}) from {} to {}",
                instrument.tick_minor, instrument.price_min_minor_per_gpu_hour, instrument.price_max_minor_per_gpu_hour
            );
            return Some(ServerMessage::Error { id: Some(id), code: ErrorCode::JobInvalid, message });
        }
        for alternative in &submission.alternatives {
            if let Some(message) = self.alternative_refusal(alternative) {
                return Some(ServerMessage::Error { id: Some(id), code: ErrorCode::JobInvalid, message });
            }
        }
        let known = self.market.engine().config().regions.clone();
        if let Some(unknown) = submission.regions.iter().find(|r| !known.contains(r)) {
            let message = format!("{}: regions: `{unknown}` is not a region of this exchange", ErrorCode::JobInvalid.message());
            return Some(ServerMessage::Error { id: Some(id), code: ErrorCode::JobInvalid, message });
        }
        let (terms, recovery) = JobTerms::new(account, submission);
        let participant = self.market.engine().participant_of(account);
        if let Err(refusal) = self.market.jobs().check_submit(&terms, participant) {
            return Some(error(Some(id), refusal.into()));
        }
        let at_ms = self.market.clock_ms();
        let (_, applied) = self.journal(JournalEntry::SubmitJobV2 { at_ms, terms, recovery })?;
        Some(match applied.job {
            Some(Ok(job)) => match self.market.jobs().info(job, account) {
                Some(info) => ServerMessage::Job { id, job: Box::new(info) },
                None => error(Some(id), ErrorCode::UnknownJob),
            },
            Some(Err(refusal)) => error(Some(id), refusal.into()),
            None => error(Some(id), ErrorCode::JobInvalid),
        })
    }

    /// Why another book of a job is refused (`job_invalid`), if it is:
    /// a spot or preemptible book of this exchange, its limit on the book's
    /// tick within its price band.
    fn alternative_refusal(&self, alternative: &gpux_protocol::JobAlternative) -> Option<String> {
        let prefix = ErrorCode::JobInvalid.message();
        let Some(instrument) = self.market.engine().instrument(alternative.instrument) else {
            return Some(format!("{prefix}: alternatives: instrument {} is not listed", alternative.instrument.0));
        };
        if !matches!(instrument.contract, ContractKind::Spot | ContractKind::Preemptible) {
            return Some(format!("{prefix}: alternatives: instrument {} is not a spot or preemptible book", alternative.instrument.0));
        }
        let price = alternative.limit_minor_per_gpu_hour;
        if !price.is_multiple_of(instrument.tick_minor.max(1))
            || !(instrument.price_min_minor_per_gpu_hour..=instrument.price_max_minor_per_gpu_hour).contains(&price)
        {
            return Some(format!(
                "{prefix}: alternatives: instrument {}'s limit a multiple of its tick ({}) from {} to {}",
                alternative.instrument.0,
                instrument.tick_minor,
                instrument.price_min_minor_per_gpu_hour,
                instrument.price_max_minor_per_gpu_hour
            ));
        }
        None
    }

    /// A token for the job store: the renter's own prefix, or a host's
    /// grant for the job of one of its running leases.
    fn job_store_token(
        &mut self,
        account: gpux_engine::AccountId,
        id: u64,
        job: Option<JobId>,
        lease: Option<LeaseId>,
        volume: Option<String>,
    ) -> ServerMessage {
        let Some(issuer) = &self.job_store else { return error(Some(id), ErrorCode::JobStoreUnavailable) };
        let expires_at_ms = self.clock.now_ms() + JOB_STORE_TOKEN_MS;
        if let Some(name) = volume {
            return match self.volume_grant(account, &name, lease, expires_at_ms) {
                Ok(grant) => {
                    let expires_at_ms = grant.expires_at_ms();
                    ServerMessage::JobStoreToken { id, url: issuer.url.clone(), token: issuer.issue(&grant), expires_at_ms }
                }
                Err(code) => error(Some(id), code),
            };
        }
        let grant = match (job, lease) {
            (job, None) => {
                if job.is_some_and(|job| self.market.jobs().info(job, account).is_none()) {
                    return error(Some(id), ErrorCode::UnknownJob);
                }
                Grant::Renter { account, participant: Some(self.market.engine().participant_of(account)), expires_at_ms }
            }
            (_, Some(lease)) => match self.host_grant(account, lease, expires_at_ms) {
                Some(grant) => grant,
                None => return error(Some(id), ErrorCode::JobStoreUnavailable),
            },
        };
        // A host's grant may last past the hour (to its lease's end): the answer says so.
        let expires_at_ms = grant.expires_at_ms();
        ServerMessage::JobStoreToken { id, url: issuer.url.clone(), token: issuer.issue(&grant), expires_at_ms }
    }

    /// The job store and a token for the attempt now on `lease`, for its
    /// host: sent with the attempt's `job_assigned`. None without a store.
    pub(super) fn host_store_grant(&self, lease: LeaseId) -> Option<gpux_protocol::jobs::StoreGrant> {
        let issuer = self.job_store.as_ref()?;
        let supplier = self.market.engine().lease(lease)?.supplier;
        let grant = self.host_grant(supplier, lease, self.clock.now_ms() + JOB_STORE_TOKEN_MS)?;
        let Grant::Host { expires_at_ms, .. } = grant else { return None };
        Some(gpux_protocol::jobs::StoreGrant { url: issuer.url.clone(), token: issuer.issue(&grant), expires_at_ms })
    }

    /// What a host's token for the job on `lease` grants: the attempt's
    /// files while the lease runs. None when the lease is not `account`'s
    /// running job lease.
    fn host_grant(&self, account: gpux_engine::AccountId, lease: LeaseId, expires_at_ms: u64) -> Option<Grant> {
        let engine = self.market.engine();
        let info = engine.lease(lease).filter(|l| l.active && l.supplier == account)?;
        let job = self.market.jobs().job_of_lease(lease)?;
        let terms = self.market.jobs().terms(job)?;
        let bundle = terms.run.bundle.as_ref().map(|b| b.sha256.clone());
        let inputs = terms
            .run
            .inputs
            .iter()
            .filter_map(|i| match &i.source {
                gpux_protocol::InputSource::Store { sha256, .. } => Some(sha256.clone()),
                gpux_protocol::InputSource::Https { .. } => None,
            })
            .collect();
        // A host's token lasts its lease, an hour at least: a long job
        // syncs its checkpoints to the end without asking again. The
        // store refuses it the moment the lease ends, whatever its
        // expiry (`RunningLeases`). (Lease times are the exchange's clock,
        // the one tokens are checked on.)
        let expires_at_ms = expires_at_ms.max(info.end_ms.unwrap_or(0));
        let attempt = match self.market.jobs().state(job)? {
            gpux_market::jobs::JobState::Running { attempt, .. } | gpux_market::jobs::JobState::Starting { attempt, .. } => *attempt,
            _ => return None,
        };
        Some(Grant::Host { renter: info.renter, job, lease, attempt, bundle, inputs, expires_at_ms })
    }

    /// Hands the invoices' worker the job's bill: the transfers of its
    /// leases since it was submitted, signed like an invoice. `Some`: the
    /// refusal to send instead.
    fn job_bill(
        &mut self,
        connection: ConnectionId,
        account: gpux_engine::AccountId,
        id: u64,
        job: JobId,
        offset: u32,
    ) -> Option<ServerMessage> {
        let Some(info) = self.market.jobs().info(job, account) else { return Some(error(Some(id), ErrorCode::UnknownJob)) };
        let leases = self.market.jobs().leases_of(job).iter().copied().collect();
        self.leases_bill(connection, account, id, leases, info.submitted_at_ms, format!("job-{}", job.0), offset)
    }

    /// Hands the invoices' worker a bill of some of the account's leases:
    /// their transfers from `since_ms` to now, signed like an invoice (a
    /// job's, a service's). `Some`: the refusal to send instead.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn leases_bill(
        &mut self,
        connection: ConnectionId,
        account: gpux_engine::AccountId,
        id: u64,
        leases: std::collections::BTreeSet<LeaseId>,
        since_ms: u64,
        period: String,
        offset: u32,
    ) -> Option<ServerMessage> {
        let engine = self.market.engine();
        let mut hot_leases = gpux_settlement::invoice::LeaseRecords::new();
        for lease in &leases {
            if let Some(lease_info) = engine.lease(*lease) {
                hot_leases.insert(*lease, (lease_info.clone(), engine.lease_symbol(*lease).unwrap_or_default()));
            }
        }
        let bounds = (since_ms, self.market.clock_ms() + 1);
        let (Some(desk), Some(outbound)) = (&self.invoices, self.sessions.get(connection).map(|c| c.outbound.clone())) else {
            return Some(error(Some(id), ErrorCode::InvoiceUnavailable));
        };
        let parent = engine.parent_of(account);
        let bill =
            crate::invoices::InvoiceWork { outbound, id, account, parent, period, bounds, offset, hot_leases, only_leases: Some(leases) };
        (!desk.submit(bill)).then(|| error(Some(id), ErrorCode::InvoiceUnavailable))
    }

    /// Fails the delivery of job and service leases whose host counts as gone
    /// (`gpux_market::jobs::Silence`: silent for `--job-silence-ms`, never
    /// started, or silent while no connected agent runs the lease), each
    /// journaled; the market checks the rest.
    pub(super) fn fail_silent_job_leases(&mut self) {
        let now_ms = self.market.clock_ms();
        let rules = gpux_market::jobs::Silence::with_silence(self.job_silence_ms);
        let sessions = &self.sessions;
        let connected = |lease, supplier| sessions.runner_of(supplier, lease).is_some();
        let mut silent = self.market.jobs().silent_leases(now_ms, rules, connected);
        // A service's replicas follow the same rule (docs/services.md).
        silent.extend(self.market.services().silent_leases(now_ms, rules, connected));
        for (lease, _supplier) in silent {
            if self.journal(JournalEntry::JobLeaseSilent { at_ms: now_ms, lease }).is_none() {
                return;
            }
        }
    }

    /// Settles cluster jobs whose held member exit waited its time with
    /// no host fault among the peers (`CLUSTER_EXIT_HOLD_MS`), each journaled.
    pub(super) fn end_due_exit_holds(&mut self) {
        let now_ms = self.market.clock_ms();
        for job in self.market.jobs().held_exits_due(now_ms) {
            if self.journal(JournalEntry::JobExitHoldEnded { at_ms: now_ms, job }).is_none() {
                return;
            }
        }
    }
}
