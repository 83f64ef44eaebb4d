//! Lease delivery: running the renter's workload on the leased GPUs.
//!
//! One trait, [`DeliveryBackend`], with three implementations chosen in the
//! owner's config: `docker` (the Docker Engine API through bollard: Docker
//! or podman), `process` (a command with `CUDA_VISIBLE_DEVICES` /
//! `HIP_VISIBLE_DEVICES` set, for bare hosts), and `hook` (the owner's own
//! program, as before). The [`Manager`] runs on its own task: the session
//! hands it orders (deliver, preempt, end, logs, reconcile) and forwards what
//! it reports (statuses, log tails) to the exchange, so a slow image pull
//! never holds up the session's order book work.
//!
//! Whatever the workload says, no backend grants privileged mode, the host's
//! network, host mounts or added capabilities: `Workload::validate` refuses
//! them here again, and the backends have no way to set them.

pub mod docker;
pub mod hook;
pub mod jobs;
pub mod process;
pub mod volumes;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use crate::limits::{FIND_ATTEMPTS, POLL_EVERY, REMOVE_RETRY_MAX, REMOVE_RETRY_MIN, SETTLE_POLL_EVERY};
use gpux_engine::LeaseId;
use gpux_protocol::delivery::{EncryptionKey, SECRETS_WAIT_MS};
use gpux_protocol::{DeliveryState, Endpoint, FailureCode, RestartPolicy, Secrets, Workload};
use tokio::sync::mpsc;

/// One GPU handed to a workload.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LeasedGpu {
    pub uuid: String,
    pub index_on_host: u32,
}

/// Everything a backend needs to start one lease's workload.
#[derive(Clone, Debug)]
pub struct Launch {
    pub lease: LeaseId,
    pub gpus: Vec<LeasedGpu>,
    /// `None` only for the hook backend, which runs on every lease.
    pub workload: Option<Workload>,
    pub secrets: Secrets,
    pub end_ms: Option<u64>,
    /// A job's attempt: its directories (mounted by the backend) and store.
    pub files: Option<jobs::JobFiles>,
    /// The renter's volumes: restored before the start, mounted by the backend.
    pub volumes: Option<volumes::VolumeFiles>,
}

/// Why a start failed, and whose fault it is (`FailureCode::fault`).
///
/// `reason` travels to the exchange (and so into its journal and the
/// renter's feed); `detail` stays in this host's log. A backend puts what
/// an engine or the OS said into `detail` ([`Failure::new`]): such texts can
/// carry the renter's sealed values (a command path, an environment
/// variable), so the reason sent is then the code's fixed text
/// (`FailureCode::describe`). Only reasons built from what is public anyway
/// (the image's name, a limit of the unsealed workload) use [`Failure::public`].
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{code:?}: {reason} ({detail})")]
pub struct Failure {
    pub code: FailureCode,
    pub reason: String,
    pub detail: String,
}

impl Failure {
    /// A failure whose detail stays on the host; the exchange is told the code's fixed text.
    pub fn new(code: FailureCode, detail: impl Into<String>) -> Self {
        Failure { code, reason: code.describe().to_string(), detail: detail.into() }
    }

    /// A failure whose reason holds nothing sealed and may be sent as it is.
    pub fn public(code: FailureCode, reason: impl Into<String>) -> Self {
        let mut reason: String = reason.into();
        if reason.len() > gpux_protocol::delivery::limits::REASON_BYTES_MAX {
            let mut cut = gpux_protocol::delivery::limits::REASON_BYTES_MAX;
            while !reason.is_char_boundary(cut) {
                cut -= 1;
            }
            reason.truncate(cut);
        }
        Failure { code, detail: reason.clone(), reason }
    }

    fn state(&self) -> DeliveryState {
        DeliveryState::Failed { code: self.code, fault: self.code.fault(), reason: self.reason.clone() }
    }
}

/// What a running workload is doing.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Poll {
    Running,
    Exited(i64),
    /// Its container or process is gone (removed behind the agent's back).
    Gone,
    /// The engine did not answer: nothing may be concluded (a workload not
    /// seen is not a workload that is gone).
    Unknown,
}

/// A workload found on the host (re-adoption, or one to remove).
#[derive(Clone, Debug)]
pub struct Found {
    pub lease: LeaseId,
    pub running: bool,
    pub endpoints: Vec<Endpoint>,
    /// The UUIDs of the GPUs it was given, where the backend records them:
    /// those GPUs stay off sale until it is confirmed gone.
    pub gpus: Vec<String>,
}

/// Progress a backend reports while it starts a workload.
pub type Progress = mpsc::UnboundedSender<(LeaseId, DeliveryState)>;

#[async_trait::async_trait]
pub trait DeliveryBackend: Send + Sync {
    fn name(&self) -> &'static str;
    /// Whether the backend runs for every lease, with or without a workload (the hook).
    fn runs_without_workload(&self) -> bool {
        false
    }
    /// Pulls what it needs and starts the workload; returns its endpoints.
    async fn start(&self, job: &Launch, progress: &Progress) -> Result<Vec<Endpoint>, Failure>;
    async fn poll(&self, lease: LeaseId) -> Poll;
    /// Asks the workload to stop (SIGTERM): a preemption notice, ending at `deadline_ms`.
    async fn terminate(&self, job: &Launch, deadline_ms: u64);
    /// Stops (after `grace`) and removes the workload and its scratch data.
    /// `Ok` only once it is confirmed gone (or was never there); `Err` when
    /// the engine could not confirm it, and the caller tries again.
    async fn remove(&self, lease: LeaseId, grace: Duration) -> Result<(), String>;
    /// The last `tail_bytes` of its output, and whether there was more.
    async fn logs(&self, lease: LeaseId, tail_bytes: u32) -> (String, bool);
    /// Workloads of this agent found on the host (by their lease label);
    /// `Err` when the engine could not be asked (nothing may be concluded
    /// then: a workload not listed is not a workload that is gone).
    async fn find(&self) -> Result<Vec<Found>, String>;
    /// The workload of one lease, looked up by its name rather than listed:
    /// `Ok(None)` when there is none, `Err` when the engine could not say.
    async fn found(&self, lease: LeaseId) -> Result<Option<Found>, String>;
    /// Whether the backend can deliver now (the container engine answers):
    /// the health check a host must pass before GPUs it failed a delivery
    /// on are offered again.
    async fn health(&self) -> Result<(), String> {
        Ok(())
    }
    /// Runs a renter's command in the lease's running workload
    /// (`lease_exec`), waiting up to `timeout`. A backend that runs no
    /// commands in workloads says so.
    async fn exec(&self, _lease: LeaseId, _command: &[String], _timeout: Duration) -> gpux_protocol::delivery::ExecOutcome {
        gpux_protocol::delivery::ExecOutcome::refused(format!("this host's {} backend runs no commands in workloads", self.name()))
    }
}

/// What the session asks of the manager.
#[derive(Debug)]
pub enum Order {
    /// Start (or replace) a lease's workload. `start_ms` is when the lease
    /// starts (a spot lease that displaces a preemptible one starts after
    /// the notice).
    Deliver {
        lease: LeaseId,
        gpus: Vec<LeasedGpu>,
        workload: Option<Box<Workload>>,
        start_ms: u64,
        end_ms: Option<u64>,
        /// The renter's volumes for it (`volumes_attached`).
        volumes: Option<Box<volumes::VolumeFiles>>,
    },
    /// Run a service's replica (docs/agent.md "Services"): a workload
    /// whose command and readiness came in clear from the exchange (a
    /// service carries no secrets), so nothing is unsealed.
    DeliverReplica {
        lease: LeaseId,
        gpus: Vec<LeasedGpu>,
        workload: Box<Workload>,
        opened: Box<Secrets>,
        start_ms: u64,
        end_ms: Option<u64>,
    },
    /// Run one attempt of a job (docs/agent.md "Jobs"): its files are
    /// fetched first, synced while it runs and once it ends.
    DeliverJob {
        lease: LeaseId,
        gpus: Vec<LeasedGpu>,
        files: Box<jobs::JobFiles>,
        start_ms: u64,
        end_ms: Option<u64>,
    },
    Preempt {
        lease: LeaseId,
        deadline_ms: u64,
    },
    /// A re-adopted lease's volumes (after a restart, its files still in
    /// this host's state folder): synced again from now on.
    Volumes {
        lease: LeaseId,
        volumes: Box<volumes::VolumeFiles>,
    },
    /// The lease ended: its workload is removed, retried until confirmed,
    /// and `Report::Released` follows.
    End {
        lease: LeaseId,
    },
    Logs {
        request: u64,
        lease: LeaseId,
        tail_bytes: u32,
    },
    /// A renter's command for a lease's workload.
    Exec {
        request: u64,
        lease: LeaseId,
        command: Vec<String>,
        timeout_ms: u32,
    },
    /// The leases the exchange says are active on this host: workloads of
    /// others are removed, running ones of these re-adopted. Answers with
    /// `Report::Unadopted` for active leases that have nothing running,
    /// once the host's workloads could be listed.
    Reconcile {
        active: BTreeSet<LeaseId>,
    },
}

/// What the manager tells the session.
#[derive(Debug)]
pub enum Report {
    Status {
        lease: LeaseId,
        state: DeliveryState,
    },
    Logs {
        request: u64,
        data: String,
        truncated: bool,
    },
    Exec {
        request: u64,
        outcome: gpux_protocol::delivery::ExecOutcome,
    },
    /// The answer to a `Reconcile`, sent once this host's workloads were
    /// listed (retried until the engine answers): nothing of an ended lease
    /// is left unknown.
    Unadopted {
        leases: Vec<LeaseId>,
        /// The running workloads re-adopted: their volumes (if any) are
        /// asked for, to be synced again.
        adopted: Vec<LeaseId>,
    },
    /// A workload of an ended lease is being removed: its GPUs stay off sale.
    Removing {
        lease: LeaseId,
        gpus: Vec<String>,
    },
    /// The lease's workload is confirmed gone: its GPUs may be sold again.
    Released {
        lease: LeaseId,
    },
}

/// How the manager is tuned (the owner's `[delivery]` settings).
#[derive(Clone, Copy, Debug)]
pub struct Tuning {
    /// SIGTERM to SIGKILL at a lease's end.
    pub stop_grace: Duration,
    /// How long a started workload must stay up before it is `running`.
    pub ready_after: Duration,
    /// Backend operations (pulls, starts, stops) running at once.
    pub concurrency: usize,
}

impl Default for Tuning {
    fn default() -> Self {
        Tuning { stop_grace: Duration::from_secs(10), ready_after: Duration::from_secs(2), concurrency: 8 }
    }
}

struct Entry {
    job: Launch,
    restarts: u32,
    phase: Phase,
    endpoints: Vec<Endpoint>,
    /// When secrets that were to follow stop being waited for.
    secrets_deadline: Option<tokio::time::Instant>,
    /// Which start attempt is current (results of older ones are dropped).
    generation: u64,
    /// A job's: when its files were last synced, and whether a sync is under way.
    synced_at: tokio::time::Instant,
    syncing: bool,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Phase {
    /// A job's files are being fetched.
    Preparing,
    AwaitingSecrets,
    Starting,
    /// Started; `running` once it has stayed up until `ready_at`.
    Settling {
        ready_at: tokio::time::Instant,
    },
    Running,
    Done,
}

/// A workload being removed until the engine confirms it gone.
struct Removal {
    /// Whether the renter is told `stopped` once it is gone.
    tell: bool,
    attempts: u32,
    in_flight: bool,
    next_at: tokio::time::Instant,
}

impl Entry {
    fn new(job: Launch, phase: Phase) -> Entry {
        Entry {
            job,
            restarts: 0,
            phase,
            endpoints: Vec::new(),
            secrets_deadline: None,
            generation: 0,
            synced_at: tokio::time::Instant::now(),
            syncing: false,
        }
    }
}

/// Results of the manager's own tasks, back on its loop.
enum Done {
    Started {
        lease: LeaseId,
        generation: u64,
        result: Result<Vec<Endpoint>, Failure>,
    },
    Removed {
        lease: LeaseId,
        result: Result<(), String>,
        /// The workload's last output, read before the first removal attempt.
        tail: Option<(String, bool)>,
    },
    Polled {
        results: Vec<(LeaseId, u64, Poll, bool)>,
        settling_only: bool,
    },
    Reconciled {
        adopted: Vec<Found>,
        unadopted: Vec<LeaseId>,
        orphans: Vec<Found>,
    },
    Prepared {
        lease: LeaseId,
        generation: u64,
        result: Result<Box<jobs::JobFiles>, Failure>,
    },
    /// A job's files were synced; `exited`: its workload had exited with
    /// this code, now told to the exchange.
    Synced {
        lease: LeaseId,
        exited: Option<i64>,
    },
}

/// Runs every lease's deliveries side by side: a pull, a start, a stop's
/// grace or an engine that does not answer for one lease never holds up
/// another's (each is a task of its own, at most `Tuning::concurrency` at
/// once); the loop itself only keeps the books.
pub struct Manager {
    backend: Arc<dyn DeliveryBackend>,
    key: Arc<EncryptionKey>,
    tuning: Tuning,
    slots: Arc<tokio::sync::Semaphore>,
    entries: BTreeMap<LeaseId, Entry>,
    removals: BTreeMap<LeaseId, Removal>,
    generation: u64,
    polling: bool,
    settle_polling: bool,
    reports: mpsc::UnboundedSender<Report>,
    progress: Progress,
    done: mpsc::UnboundedSender<Done>,
    /// Jobs' files of ended leases, synced once more and deleted when their
    /// workload is confirmed gone.
    ended_jobs: BTreeMap<LeaseId, Box<jobs::JobFiles>>,
    /// Volumes of ended leases, synced once more (within the store's grace
    /// after the lease's end) once the workload is gone, then deleted here.
    ended_volumes: BTreeMap<LeaseId, Box<volumes::VolumeFiles>>,
    /// The last output of ended leases' workloads, oldest first, at most
    /// `KEPT_LOGS_MAX`: logs asked for after the end come from here.
    kept_logs: std::collections::VecDeque<(LeaseId, String, bool)>,
    /// Log requests for leases whose workload is being removed: answered
    /// from the output kept at its removal (`LOG_WAITS_MAX` at most).
    log_waits: std::collections::VecDeque<(u64, LeaseId, u32)>,
}

/// Log requests held while their workload is removed; the oldest is
/// dropped past it (the exchange answers it `host_unreachable`).
const LOG_WAITS_MAX: usize = 64;

impl Manager {
    /// Starts the manager's task; returns where to send orders and where reports come out.
    pub fn spawn(
        backend: Arc<dyn DeliveryBackend>,
        key: Arc<EncryptionKey>,
        tuning: Tuning,
    ) -> (mpsc::UnboundedSender<Order>, mpsc::UnboundedReceiver<Report>) {
        let (orders_tx, orders) = mpsc::unbounded_channel();
        let (reports, reports_rx) = mpsc::unbounded_channel();
        let (progress, progress_rx) = mpsc::unbounded_channel();
        let (done, done_rx) = mpsc::unbounded_channel();
        let manager = Manager {
            backend,
            key,
            tuning,
            slots: Arc::new(tokio::sync::Semaphore::new(tuning.concurrency.max(1))),
            entries: BTreeMap::new(),
            removals: BTreeMap::new(),
            generation: 0,
            polling: false,
            settle_polling: false,
            reports,
            progress,
            done,
            ended_jobs: BTreeMap::new(),
            ended_volumes: BTreeMap::new(),
            kept_logs: std::collections::VecDeque::new(),
            log_waits: std::collections::VecDeque::new(),
        };
        tokio::spawn(manager.run(orders, progress_rx, done_rx));
        (orders_tx, reports_rx)
    }

    async fn run(
        mut self,
        mut orders: mpsc::UnboundedReceiver<Order>,
        mut progress: mpsc::UnboundedReceiver<(LeaseId, DeliveryState)>,
        mut done: mpsc::UnboundedReceiver<Done>,
    ) {
        let mut ticks = tokio::time::interval(POLL_EVERY);
        let mut settle_ticks = tokio::time::interval(SETTLE_POLL_EVERY);
        settle_ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                order = orders.recv() => {
                    let Some(order) = order else { return };
                    self.on_order(order);
                }
                Some((lease, state)) = progress.recv() => {
                    if self.entries.get(&lease).is_some_and(|e| e.phase == Phase::Starting) {
                        self.status(lease, state);
                    }
                }
                Some(result) = done.recv() => self.on_done(result),
                _ = ticks.tick() => self.supervise(),
                _ = settle_ticks.tick() => self.poll_round(true),
            }
        }
    }

    fn on_order(&mut self, order: Order) {
        match order {
            Order::Deliver { lease, gpus, workload, start_ms, end_ms, volumes } => {
                self.deliver(lease, gpus, workload.map(|w| *w), None, (start_ms, end_ms), volumes.map(|v| *v))
            }
            Order::DeliverReplica { lease, gpus, workload, opened, start_ms, end_ms } => {
                self.deliver(lease, gpus, Some(*workload), Some(*opened), (start_ms, end_ms), None)
            }
            Order::DeliverJob { lease, gpus, files, start_ms, end_ms } => self.deliver_job(lease, gpus, files, start_ms, end_ms),
            Order::Preempt { lease, deadline_ms } => {
                if let Some(entry) = self.entries.get(&lease) {
                    if let Some(files) = &entry.job.files {
                        if let Err(error) = files.notify_preemption(deadline_ms) {
                            tracing::warn!(%lease, %error, "could not write the job's preemption notice");
                        }
                    }
                    let (backend, job) = (self.backend.clone(), entry.job.clone());
                    tokio::spawn(async move { backend.terminate(&job, deadline_ms).await });
                }
            }
            Order::Volumes { lease, volumes } => {
                if let Some(entry) = self.entries.get_mut(&lease) {
                    entry.job.volumes = Some(*volumes);
                }
            }
            Order::End { lease } => {
                let ended = self.entries.remove(&lease);
                let tell = ended.is_some() || self.backend.runs_without_workload();
                if let Some(job) = ended.map(|e| e.job) {
                    if let Some(files) = job.files {
                        self.ended_jobs.insert(lease, Box::new(files));
                    }
                    if let Some(volumes) = job.volumes {
                        self.ended_volumes.insert(lease, Box::new(volumes));
                    }
                }
                self.remove(lease, tell);
            }
            Order::Logs { request, lease, tail_bytes } => self.logs(request, lease, tail_bytes),
            Order::Exec { request, lease, command, timeout_ms } => self.exec(request, lease, command, timeout_ms),
            Order::Reconcile { active } => self.reconcile(active),
        }
    }

    /// A renter's request for a lease's output: the running workload's
    /// tail, or the one kept from its end. A lease this host never ran (or
    /// forgot) is not answered: another agent of the account runs it, and
    /// the exchange answers `host_unreachable` if none does.
    fn logs(&mut self, request: u64, lease: LeaseId, tail_bytes: u32) {
        let reports = self.reports.clone();
        if self.removals.contains_key(&lease) && !self.entries.contains_key(&lease) {
            // Being removed: its output is kept at the removal; answered then.
            if self.log_waits.len() >= LOG_WAITS_MAX {
                self.log_waits.pop_front();
            }
            self.log_waits.push_back((request, lease, tail_bytes));
        } else if self.entries.contains_key(&lease) {
            let backend = self.backend.clone();
            tokio::spawn(async move {
                let (data, truncated) = backend.logs(lease, tail_bytes).await;
                let _ = reports.send(Report::Logs { request, data, truncated });
            });
        } else if let Some((_, data, truncated)) = self.kept_logs.iter().find(|(l, ..)| *l == lease) {
            let keep = (tail_bytes as usize).min(data.len());
            let mut start = data.len() - keep;
            while !data.is_char_boundary(start) {
                start += 1;
            }
            let _ = reports.send(Report::Logs { request, data: data[start..].to_string(), truncated: *truncated || start > 0 });
        }
    }

    /// A renter's command for a lease's workload: run while it runs, else
    /// refused with where it stands. A lease this host never ran is not
    /// answered (another agent of the account runs it).
    fn exec(&mut self, request: u64, lease: LeaseId, command: Vec<String>, timeout_ms: u32) {
        use gpux_protocol::delivery::ExecOutcome;
        let reports = self.reports.clone();
        let running = match self.entries.get(&lease) {
            Some(entry) => matches!(entry.phase, Phase::Running | Phase::Settling { .. }),
            None if self.removals.contains_key(&lease) || self.kept_logs.iter().any(|(l, ..)| *l == lease) => false,
            None => return,
        };
        if !running {
            let _ = reports.send(Report::Exec { request, outcome: ExecOutcome::refused("the workload is not running") });
            return;
        }
        let backend = self.backend.clone();
        tokio::spawn(async move {
            let outcome = backend.exec(lease, &command, Duration::from_millis(u64::from(timeout_ms))).await.bounded();
            let _ = reports.send(Report::Exec { request, outcome });
        });
    }

    /// Keeps an ended workload's last output (the oldest forgotten past `KEPT_LOGS_MAX`).
    fn keep_log(&mut self, lease: LeaseId, data: String, truncated: bool) {
        self.kept_logs.retain(|(l, ..)| *l != lease);
        self.kept_logs.push_back((lease, data, truncated));
        while self.kept_logs.len() > crate::limits::KEPT_LOGS_MAX {
            self.kept_logs.pop_front();
        }
    }

    /// A lease's workload to run (from `start_ms` to `end_ms`, with the
    /// renter's volumes): a new one replaces the running one (removed
    /// first, in its task); one whose secrets follow waits for them.
    fn deliver(
        &mut self,
        lease: LeaseId,
        gpus: Vec<LeasedGpu>,
        workload: Option<Workload>,
        opened: Option<Secrets>,
        (start_ms, end_ms): (u64, Option<u64>),
        volumes: Option<volumes::VolumeFiles>,
    ) {
        let replacing = self.entries.remove(&lease).is_some();
        let Some(mut job) = self.prepare(lease, gpus, workload, opened, end_ms) else {
            if replacing {
                self.remove(lease, false);
            }
            return;
        };
        job.volumes = volumes;
        let waiting = job.workload.as_ref().is_some_and(|w| w.secrets_follow && w.sealed.is_none());
        let mut entry = Entry::new(job, Phase::Starting);
        if waiting {
            entry.phase = Phase::AwaitingSecrets;
            entry.secrets_deadline = Some(tokio::time::Instant::now() + Duration::from_millis(SECRETS_WAIT_MS));
            self.status(lease, DeliveryState::AwaitingSecrets);
            if replacing {
                self.remove(lease, false);
            }
        } else {
            self.launch(&mut entry, start_ms, replacing);
        }
        self.entries.insert(lease, entry);
    }

    /// A job's run on the lease: its files are prepared (code, inputs,
    /// checkpoint) from `start_ms`, then its container starts.
    fn deliver_job(&mut self, lease: LeaseId, gpus: Vec<LeasedGpu>, files: Box<jobs::JobFiles>, start_ms: u64, end_ms: Option<u64>) {
        if let Some(old) = self.entries.remove(&lease) {
            self.remove(lease, false);
            if let Some(files) = old.job.files {
                self.ended_jobs.insert(lease, Box::new(files));
            }
        }
        let workload = Workload { shm_mib: files.assignment.run.shm_mib, ..Workload::image(files.assignment.run.image.clone()) };
        if let Err(refused) = workload.validate() {
            self.status(lease, Failure::public(FailureCode::WorkloadRefused, refused.to_string()).state());
            return;
        }
        let job = Launch { lease, gpus, workload: Some(workload), secrets: Secrets::default(), end_ms, files: None, volumes: None };
        let mut entry = Entry::new(job, Phase::Preparing);
        self.generation += 1;
        entry.generation = self.generation;
        let (generation, done) = (entry.generation, self.done.clone());
        self.status(lease, DeliveryState::Starting);
        self.entries.insert(lease, entry);
        tokio::spawn(async move {
            let wait = start_ms.saturating_sub(now_ms());
            if wait > 0 {
                tokio::time::sleep(Duration::from_millis(wait)).await;
            }
            let mut files = files;
            let result = files.prepare().await.map(|()| files);
            let _ = done.send(Done::Prepared { lease, generation, result });
        });
    }

    fn on_done(&mut self, done: Done) {
        match done {
            Done::Started { lease, generation, result } => self.started(lease, generation, result),
            Done::Removed { lease, result, tail } => {
                if let Some((data, truncated)) = tail {
                    self.keep_log(lease, data, truncated);
                }
                self.removed(lease, result);
                if !self.removals.contains_key(&lease) {
                    let (now, later) = self.log_waits.drain(..).partition::<Vec<_>, _>(|(_, l, _)| *l == lease);
                    self.log_waits = later.into();
                    for (request, lease, tail_bytes) in now {
                        self.logs(request, lease, tail_bytes);
                    }
                }
            }
            Done::Prepared { lease, generation, result } => self.prepared(lease, generation, result),
            Done::Synced { lease, exited } => {
                if let Some(entry) = self.entries.get_mut(&lease) {
                    entry.syncing = false;
                    entry.synced_at = tokio::time::Instant::now();
                }
                if let Some(code) = exited {
                    self.status(lease, DeliveryState::Exited { code });
                }
            }
            Done::Polled { results, settling_only } => {
                if settling_only {
                    self.settle_polling = false;
                } else {
                    self.polling = false;
                }
                for (lease, generation, poll, ready) in results {
                    self.on_poll(lease, generation, poll, ready);
                }
            }
            Done::Reconciled { adopted, unadopted, orphans } => self.reconciled(adopted, unadopted, orphans),
        }
    }

    /// A workload's start finished: running (or settling first), or failed.
    fn started(&mut self, lease: LeaseId, generation: u64, result: Result<Vec<Endpoint>, Failure>) {
        let Some(entry) = self.entries.get_mut(&lease).filter(|e| e.generation == generation) else {
            return; // replaced or ended meanwhile
        };
        match result {
            Ok(endpoints) => {
                entry.endpoints = endpoints;
                if self.tuning.ready_after.is_zero() && entry.job.secrets.readiness.is_none() {
                    entry.phase = Phase::Running;
                    let state = running(entry);
                    self.status(lease, state);
                } else {
                    // `running` once it stayed up: a command that
                    // exits at once is reported exited, never running.
                    entry.phase = Phase::Settling { ready_at: tokio::time::Instant::now() + self.tuning.ready_after };
                }
            }
            Err(failure) => {
                entry.phase = Phase::Done;
                tracing::warn!(%lease, code = ?failure.code, detail = %failure.detail, "delivery failed");
                self.status(lease, failure.state());
            }
        }
    }

    /// A workload's removal finished: confirmed (its GPUs are released, a
    /// job's last files synced), or retried later with back-off.
    fn removed(&mut self, lease: LeaseId, result: Result<(), String>) {
        let Some(removal) = self.removals.get_mut(&lease) else { return };
        removal.in_flight = false;
        if let Err(error) = result {
            removal.attempts += 1;
            let wait = (REMOVE_RETRY_MIN * 2u32.saturating_pow(removal.attempts - 1)).min(REMOVE_RETRY_MAX);
            removal.next_at = tokio::time::Instant::now() + wait;
            tracing::warn!(%lease, %error, attempts = removal.attempts, retry_in_ms = wait.as_millis() as u64, "the workload's removal is not confirmed; its GPUs stay off sale");
            return;
        }
        let Some(removal) = self.removals.remove(&lease) else { return };
        if removal.tell {
            self.status(lease, DeliveryState::Stopped);
        }
        let _ = self.reports.send(Report::Released { lease });
        if let Some(volumes) = self.ended_volumes.remove(&lease) {
            // What the workload wrote until it stopped goes back to the
            // store (within the store's grace after the lease's end), then
            // the volumes leave this host.
            tokio::spawn(async move {
                // The store takes it for 2 minutes after the lease's end.
                match volumes.sync_retrying(6, Duration::from_secs(15)).await {
                    Ok(put) => tracing::info!(%lease, put, "the ended lease's volumes synced"),
                    Err(error) => tracing::warn!(%lease, %error, "the ended lease's last volume sync failed"),
                }
                let _ = std::fs::remove_dir_all(&volumes.dir);
            });
        }
        if let Some(files) = self.ended_jobs.remove(&lease) {
            // The lease ended before its workload exited (a cancel, a
            // notice's deadline, its hours): the store takes nothing more
            // of it but its last output, within the log grace
            // (docs/jobs.md "Code and data"): what the workload wrote after
            // its last sync stays on this host, and its files leave it.
            let tail = self.kept_logs.iter().find(|(l, ..)| *l == lease).map(|(_, data, _)| data.clone());
            tokio::spawn(async move {
                if let Some(tail) = tail {
                    if let Err(error) = files.put_log(&tail).await {
                        tracing::warn!(%lease, %error, "putting the job's output in the store failed");
                    }
                }
                let _ = std::fs::remove_dir_all(&files.dir);
            });
        }
    }

    /// A job's files were prepared: its workload starts with them, or fails.
    fn prepared(&mut self, lease: LeaseId, generation: u64, result: Result<Box<jobs::JobFiles>, Failure>) {
        let in_container = self.backend.name() == "docker";
        let Some(mut entry) = self.entries.remove(&lease).filter(|e| e.generation == generation) else { return };
        match result {
            Ok(files) => {
                let mut env = files.env(in_container, entry.job.gpus.len());
                env.retain(|(name, _)| !name.is_empty());
                entry.job.secrets = Secrets { command: files.command(in_container), env, ..Secrets::default() };
                entry.job.files = Some(*files);
                entry.synced_at = tokio::time::Instant::now();
                self.launch(&mut entry, 0, false);
            }
            Err(failure) => {
                entry.phase = Phase::Done;
                tracing::warn!(%lease, code = ?failure.code, detail = %failure.detail, "the job's files could not be prepared");
                self.status(lease, failure.state());
            }
        }
        self.entries.insert(lease, entry);
    }

    /// The container engine's listing at start: workloads of active leases re-adopted,
    /// those of ended leases removed.
    fn reconciled(&mut self, adopted: Vec<Found>, unadopted: Vec<LeaseId>, orphans: Vec<Found>) {
        let readopted: Vec<LeaseId> = adopted.iter().map(|w| w.lease).filter(|l| !self.entries.contains_key(l)).collect();
        for workload in adopted {
            let lease = workload.lease;
            if self.entries.contains_key(&lease) {
                continue;
            }
            tracing::info!(%lease, "re-adopted a running workload");
            let job =
                Launch { lease, gpus: Vec::new(), workload: None, secrets: Secrets::default(), end_ms: None, files: None, volumes: None };
            let mut entry = Entry::new(job, Phase::Running);
            entry.endpoints = workload.endpoints;
            let state = running(&entry);
            self.entries.insert(lease, entry);
            self.status(lease, state);
        }
        for workload in orphans {
            if self.entries.contains_key(&workload.lease) || self.removals.contains_key(&workload.lease) {
                continue;
            }
            tracing::info!(lease = %workload.lease, "removing the workload of a lease that ended while the agent was away");
            let _ = self.reports.send(Report::Removing { lease: workload.lease, gpus: workload.gpus });
            self.remove(workload.lease, false);
        }
        let _ = self.reports.send(Report::Unadopted { leases: unadopted, adopted: readopted });
    }

    /// `ready`: the renter's readiness probe answered (or there is none).
    fn on_poll(&mut self, lease: LeaseId, generation: u64, poll: Poll, ready: bool) {
        let Some(entry) = self.entries.get_mut(&lease).filter(|e| e.generation == generation) else { return };
        let code = match poll {
            Poll::Running => {
                if let Phase::Settling { ready_at } = entry.phase {
                    let probed = entry.job.secrets.readiness.is_some();
                    if (probed && ready) || (!probed && ready_at <= tokio::time::Instant::now()) {
                        entry.phase = Phase::Running;
                        let state = running(entry);
                        self.status(lease, state);
                    }
                }
                return;
            }
            Poll::Unknown => return,
            Poll::Exited(code) => code,
            Poll::Gone => -1,
        };
        if !matches!(entry.phase, Phase::Running | Phase::Settling { .. }) {
            return;
        }
        if let Some(files) = entry.job.files.clone() {
            // A job's exit is told once what it wrote is in the store.
            entry.phase = Phase::Done;
            entry.syncing = true;
            let (done, backend) = (self.done.clone(), self.backend.clone());
            tokio::spawn(async move {
                let (tail, _) = backend.logs(lease, crate::limits::KEPT_LOG_BYTES).await;
                if let Err(error) = files.put_log(&tail).await {
                    tracing::warn!(%lease, %error, "putting the job's output in the store failed");
                }
                if let Err(error) = files.sync().await {
                    tracing::warn!(%lease, %error, "syncing the job's files at its exit failed");
                }
                let _ = done.send(Done::Synced { lease, exited: Some(code) });
            });
            return;
        }
        let restart = match entry.job.workload.as_ref().map_or(RestartPolicy::Never, |w| w.restart) {
            RestartPolicy::Never => false,
            RestartPolicy::Always => true,
            RestartPolicy::OnFailure { max_restarts } => code != 0 && entry.restarts < max_restarts,
        };
        if let Some(volumes) = entry.job.volumes.clone().filter(|v| v.writes() && !restart) {
            // An exit that may end the lease is told once the volumes
            // hold what the workload wrote.
            entry.phase = Phase::Done;
            entry.syncing = true;
            let done = self.done.clone();
            tokio::spawn(async move {
                if let Err(error) = volumes.sync_retrying(4, Duration::from_secs(5)).await {
                    tracing::warn!(%lease, %error, "syncing the lease's volumes at its exit failed");
                }
                let _ = done.send(Done::Synced { lease, exited: Some(code) });
            });
            return;
        }
        self.status(lease, DeliveryState::Exited { code });
        let mut entry = self.entries.remove(&lease).expect("present");
        if restart {
            entry.restarts += 1;
            self.launch(&mut entry, 0, true);
        } else {
            entry.phase = Phase::Done;
        }
        self.entries.insert(lease, entry);
    }

    /// Checks the workload against the limits, opens its secrets; reports a failure and returns `None` when it cannot run.
    fn prepare(
        &mut self,
        lease: LeaseId,
        gpus: Vec<LeasedGpu>,
        workload: Option<Workload>,
        opened: Option<Secrets>,
        end_ms: Option<u64>,
    ) -> Option<Launch> {
        let Some(workload) = workload else {
            if self.backend.runs_without_workload() {
                return Some(Launch { lease, gpus, workload: None, secrets: Secrets::default(), end_ms, files: None, volumes: None });
            }
            return None;
        };
        if let Err(refused) = workload.validate() {
            self.status(lease, Failure::public(FailureCode::WorkloadRefused, refused.to_string()).state());
            return None;
        }
        let secrets = match &workload.sealed {
            None => opened.unwrap_or_default(),
            Some(sealed) => match self.key.unseal(sealed) {
                Ok(secrets) => secrets,
                Err(error) => {
                    self.status(lease, Failure::public(FailureCode::SecretsInvalid, error.to_string()).state());
                    return None;
                }
            },
        };
        if let Err(refused) = secrets.validate() {
            // The limit a secret broke is told to the renter only as the code.
            tracing::warn!(%lease, %refused, "the sealed secrets break a limit");
            self.status(lease, Failure::new(FailureCode::WorkloadRefused, refused.to_string()).state());
            return None;
        }
        Some(Launch { lease, gpus, workload: Some(workload), secrets, end_ms, files: None, volumes: None })
    }

    /// Starts the entry's workload in a task of its own (after removing the
    /// one it replaces, when `replacing`).
    fn launch(&mut self, entry: &mut Entry, start_ms: u64, replacing: bool) {
        self.generation += 1;
        entry.generation = self.generation;
        entry.phase = Phase::Starting;
        let (backend, job, progress, done, slots) =
            (self.backend.clone(), entry.job.clone(), self.progress.clone(), self.done.clone(), self.slots.clone());
        let (generation, grace) = (entry.generation, self.tuning.stop_grace);
        self.status(job.lease, DeliveryState::Starting);
        tokio::spawn(async move {
            let wait = start_ms.saturating_sub(now_ms());
            if wait > 0 {
                tokio::time::sleep(Duration::from_millis(wait)).await;
            }
            let _slot = slots.acquire_owned().await;
            if replacing {
                if let Err(error) = backend.remove(job.lease, grace).await {
                    tracing::warn!(lease = %job.lease, %error, "could not remove the workload being replaced");
                }
            }
            // The renter's volumes are on this host before the workload starts.
            let restored = match &job.volumes {
                Some(volumes) => volumes.restore().await,
                None => Ok(()),
            };
            let result = match restored {
                Ok(()) => backend.start(&job, &progress).await,
                Err(failure) => Err(failure),
            };
            let _ = done.send(Done::Started { lease: job.lease, generation, result });
        });
    }

    /// Queues the lease's workload for removal, tried until the engine confirms it.
    fn remove(&mut self, lease: LeaseId, tell: bool) {
        let removal =
            self.removals.entry(lease).or_insert(Removal { tell, attempts: 0, in_flight: false, next_at: tokio::time::Instant::now() });
        removal.tell |= tell;
        self.start_removal(lease);
    }

    fn start_removal(&mut self, lease: LeaseId) {
        let Some(removal) = self.removals.get_mut(&lease) else { return };
        if removal.in_flight {
            return;
        }
        removal.in_flight = true;
        // The first attempt gives the workload its grace; retries force it.
        let first = removal.attempts == 0;
        let grace = if first { self.tuning.stop_grace } else { Duration::ZERO };
        let (backend, done) = (self.backend.clone(), self.done.clone());
        tokio::spawn(async move {
            // What it printed goes with the container: read it first.
            let tail = match first {
                true => Some(backend.logs(lease, crate::limits::KEPT_LOG_BYTES).await),
                false => None,
            };
            let result = backend.remove(lease, grace).await;
            let _ = done.send(Done::Removed { lease, result, tail });
        });
    }

    /// Each tick: removals due again, secrets given up on, and one round of
    /// polls (in a task; the next round only once it is back).
    fn supervise(&mut self) {
        let now = tokio::time::Instant::now();
        let due: Vec<LeaseId> = self.removals.iter().filter(|(_, r)| !r.in_flight && r.next_at <= now).map(|(&l, _)| l).collect();
        for lease in due {
            self.start_removal(lease);
        }
        let expired: Vec<LeaseId> = self
            .entries
            .iter()
            .filter(|(_, e)| e.phase == Phase::AwaitingSecrets && e.secrets_deadline.is_some_and(|d| d <= now))
            .map(|(&l, _)| l)
            .collect();
        for lease in expired {
            self.entries.get_mut(&lease).expect("present").phase = Phase::Done;
            self.status(lease, Failure::public(FailureCode::SecretsMissing, "the sealed secrets never came").state());
        }
        // Running leases' read-write volumes, every sync interval.
        let every = Duration::from_millis(gpux_protocol::volumes::limits::SYNC_INTERVAL_MS);
        for (&lease, entry) in self.entries.iter_mut() {
            let Some(volumes) = entry.job.volumes.as_ref().filter(|v| v.writes()) else { continue };
            if entry.syncing || !matches!(entry.phase, Phase::Running | Phase::Settling { .. }) || entry.synced_at + every > now {
                continue;
            }
            entry.syncing = true;
            let (volumes, done) = (volumes.clone(), self.done.clone());
            tokio::spawn(async move {
                if let Err(error) = volumes.sync().await {
                    tracing::warn!(%lease, %error, "syncing the lease's volumes failed; tried again next interval");
                }
                let _ = done.send(Done::Synced { lease, exited: None });
            });
        }
        // Running jobs' files, every checkpoint interval.
        for (&lease, entry) in self.entries.iter_mut() {
            let Some(files) = &entry.job.files else { continue };
            let every = Duration::from_secs(files.assignment.run.checkpoint_interval_s as u64);
            if entry.syncing || !matches!(entry.phase, Phase::Running | Phase::Settling { .. }) || entry.synced_at + every > now {
                continue;
            }
            entry.syncing = true;
            let (files, done) = (files.clone(), self.done.clone());
            tokio::spawn(async move {
                if let Err(error) = files.sync().await {
                    tracing::warn!(%lease, %error, "syncing the job's files failed; tried again next interval");
                }
                let _ = done.send(Done::Synced { lease, exited: None });
            });
        }
        self.poll_round(false);
    }

    /// One round of polls in a task of its own (the next round of its kind
    /// only once it is back): of every started workload each second, and of
    /// those settling (not yet `running`) every 100 ms, so a workload is
    /// reported `running` soon after its probe answers or its wait ends.
    fn poll_round(&mut self, settling_only: bool) {
        let in_flight = if settling_only { &mut self.settle_polling } else { &mut self.polling };
        if *in_flight {
            return;
        }
        let watched: Vec<(LeaseId, u64, Option<Probe>)> = self
            .entries
            .iter()
            .filter(|(_, e)| match e.phase {
                Phase::Settling { .. } => true,
                Phase::Running => !settling_only,
                _ => false,
            })
            .map(|(&l, e)| (l, e.generation, matches!(e.phase, Phase::Settling { .. }).then(|| probe_of(e)).flatten()))
            .collect();
        if watched.is_empty() {
            return;
        }
        *in_flight = true;
        let (backend, done) = (self.backend.clone(), self.done.clone());
        tokio::spawn(async move {
            let polls = watched.iter().map(|(lease, _, probe)| {
                let backend = backend.clone();
                async move {
                    let poll = backend.poll(*lease).await;
                    let ready = match probe {
                        Some(probe) if poll == Poll::Running => probe.answers().await,
                        _ => false,
                    };
                    (poll, ready)
                }
            });
            let results = futures_util::future::join_all(polls).await;
            let results =
                watched.into_iter().zip(results).map(|((lease, generation, _), (poll, ready))| (lease, generation, poll, ready)).collect();
            let _ = done.send(Done::Polled { results, settling_only });
        });
    }

    /// Looks up the active leases' workloads and lists the host's (in a
    /// task, retrying until the engine answers), then re-adopts, removes
    /// and answers `Unadopted`.
    fn reconcile(&mut self, active: BTreeSet<LeaseId>) {
        // Each active lease's workload is looked up by name: one broken
        // container elsewhere can make a whole listing fail, and a failed
        // lookup must not read as "nothing runs" (the lease would be
        // delivered again, replacing the very container that runs).
        let missing: Vec<LeaseId> = active.iter().copied().filter(|lease| !self.entries.contains_key(lease)).collect();
        let (backend, done) = (self.backend.clone(), self.done.clone());
        tokio::spawn(async move {
            let (mut adopted, mut unadopted) = (Vec::new(), Vec::new());
            for lease in missing {
                let mut attempt = 0;
                let found = loop {
                    match backend.found(lease).await {
                        Ok(found) => break found,
                        Err(error) if attempt < FIND_ATTEMPTS => {
                            attempt += 1;
                            tracing::warn!(%lease, %error, attempt, "could not look up the lease's workload; retrying");
                            tokio::time::sleep(POLL_EVERY * attempt).await;
                        }
                        Err(error) => {
                            tracing::error!(%lease, %error, "could not look up the lease's workload; starting it again");
                            break None;
                        }
                    }
                };
                match found {
                    Some(workload) if workload.running => adopted.push(workload),
                    Some(_) => {
                        if let Err(error) = backend.remove(lease, Duration::ZERO).await {
                            tracing::warn!(%lease, %error, "could not remove the stopped workload before starting it again");
                        }
                        unadopted.push(lease);
                    }
                    None => unadopted.push(lease),
                }
            }
            // Workloads of leases that ended while the agent was away: the
            // listing is retried until the engine answers, since a workload
            // not listed may still hold a GPU about to be sold again.
            let mut wait = REMOVE_RETRY_MIN;
            let orphans = loop {
                match backend.find().await {
                    Ok(found) => break found.into_iter().filter(|w| !active.contains(&w.lease)).collect(),
                    Err(error) => {
                        tracing::warn!(%error, retry_in_ms = wait.as_millis() as u64, "could not list this host's workloads; nothing is offered until it can");
                        tokio::time::sleep(wait).await;
                        wait = (wait * 2).min(REMOVE_RETRY_MAX);
                    }
                }
            };
            let _ = done.send(Done::Reconciled { adopted, unadopted, orphans });
        });
    }

    fn status(&self, lease: LeaseId, state: DeliveryState) {
        let _ = self.reports.send(Report::Status { lease, state });
    }
}

/// Where a settling workload's readiness probe knocks: the published
/// endpoint of the probe's container port.
struct Probe {
    address: String,
    http_path: Option<String>,
}

fn probe_of(entry: &Entry) -> Option<Probe> {
    let readiness = entry.job.secrets.readiness.as_ref()?;
    // A port that is not published cannot be probed: it is never ready,
    // and the renter sees the workload stay `starting`.
    let endpoint = entry.endpoints.iter().find(|e| e.container_port == readiness.port);
    let address = endpoint.map_or_else(|| "0.0.0.0:0".to_string(), |e| format!("{}:{}", e.host, e.port));
    Some(Probe { address, http_path: readiness.http_path.clone() })
}

impl Probe {
    /// A TCP connection within 1 s, and with a path, an HTTP/1.0 GET answered 2xx or 3xx within 2 s.
    async fn answers(&self) -> bool {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let connect = tokio::time::timeout(Duration::from_secs(1), tokio::net::TcpStream::connect(&self.address));
        let Ok(Ok(mut stream)) = connect.await else { return false };
        let Some(path) = &self.http_path else { return true };
        let exchange = async {
            stream.write_all(format!("GET {path} HTTP/1.0\r\nHost: {}\r\n\r\n", self.address).as_bytes()).await.ok()?;
            let mut head = [0u8; 16];
            let mut read = 0;
            while read < 12 {
                let n = stream.read(&mut head[read..]).await.ok()?;
                if n == 0 {
                    break;
                }
                read += n;
            }
            // "HTTP/1.x 200": the status's first digit.
            let status = std::str::from_utf8(&head[..read]).ok()?.split_whitespace().nth(1)?.to_string();
            Some(status.starts_with('2') || status.starts_with('3'))
        };
        tokio::time::timeout(Duration::from_secs(2), exchange).await.ok().flatten().unwrap_or(false)
    }
}

fn running(entry: &Entry) -> DeliveryState {
    let ssh = entry
        .endpoints
        .iter()
        .find(|e| e.container_port == 22)
        .filter(|_| !entry.job.secrets.ssh_keys.is_empty() || entry.job.workload.is_none())
        .map(|e| format!("ssh -p {} root@{}", e.port, e.host));
    DeliveryState::Running { endpoints: entry.endpoints.clone(), ssh, restarts: entry.restarts }
}

fn now_ms() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64)
}
