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
pub mod process;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

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
pub struct Job {
    pub lease: LeaseId,
    pub gpus: Vec<LeasedGpu>,
    /// `None` only for the hook backend, which runs on every lease.
    pub workload: Option<Workload>,
    pub secrets: Secrets,
    pub end_ms: Option<u64>,
}

/// Why a start failed, and whose fault it is (`FailureCode::fault`).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{code:?}: {reason}")]
pub struct Failure {
    pub code: FailureCode,
    pub reason: String,
}

impl Failure {
    pub fn new(code: FailureCode, reason: impl Into<String>) -> Self {
        let mut reason: String = reason.into();
        if reason.len() > gpux_protocol::delivery::limits::REASON_BYTES_MAX {
            let mut cut = gpux_protocol::delivery::limits::REASON_BYTES_MAX;
            while !reason.is_char_boundary(cut) {
                cut -= 1;
            }
            reason.truncate(cut);
        }
        Failure { code, reason }
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
}

/// A workload found running when the agent started (re-adoption).
#[derive(Clone, Debug)]
pub struct Found {
    pub lease: LeaseId,
    pub running: bool,
    pub endpoints: Vec<Endpoint>,
}

/// A start attempt's outcome: lease, attempt number, endpoints or failure.
type Started = mpsc::UnboundedSender<(LeaseId, u64, Result<Vec<Endpoint>, Failure>)>;

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
    async fn start(&self, job: &Job, progress: &Progress) -> Result<Vec<Endpoint>, Failure>;
    async fn poll(&self, lease: LeaseId) -> Poll;
    /// Asks the workload to stop (SIGTERM): a preemption notice, ending at `deadline_ms`.
    async fn terminate(&self, job: &Job, deadline_ms: u64);
    /// Stops (after `grace`) and removes the workload and its scratch data.
    async fn remove(&self, lease: LeaseId, grace: Duration);
    /// The last `tail_bytes` of its output, and whether there was more.
    async fn logs(&self, lease: LeaseId, tail_bytes: u32) -> (String, bool);
    /// Workloads of this agent found on the host (by their lease label);
    /// `Err` when the engine could not be asked (nothing may be concluded
    /// then: a workload not listed is not a workload that is gone).
    async fn find(&self) -> Result<Vec<Found>, String>;
    /// The workload of one lease, looked up by its name rather than listed:
    /// `Ok(None)` when there is none, `Err` when the engine could not say.
    async fn found(&self, lease: LeaseId) -> Result<Option<Found>, String>;
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
    },
    Preempt {
        lease: LeaseId,
        deadline_ms: u64,
    },
    End {
        lease: LeaseId,
    },
    Logs {
        request: u64,
        lease: LeaseId,
        tail_bytes: u32,
    },
    /// The leases the exchange says are active on this host: workloads of
    /// others are removed, running ones of these re-adopted. Answers with
    /// `Report::Unadopted` for active leases that have nothing running.
    Reconcile {
        active: BTreeSet<LeaseId>,
    },
}

/// What the manager tells the session.
#[derive(Debug)]
pub enum Report {
    Status { lease: LeaseId, state: DeliveryState },
    Logs { request: u64, data: String, truncated: bool },
    Unadopted { leases: Vec<LeaseId> },
}

/// How often running workloads are checked for exits.
const POLL_EVERY: Duration = Duration::from_secs(1);

/// Attempts at looking up a lease's workload before re-adoption gives up
/// (waiting 1 s, 2 s, ... between them: under a minute in all).
const FIND_ATTEMPTS: u32 = 10;

struct Entry {
    job: Job,
    restarts: u32,
    phase: Phase,
    endpoints: Vec<Endpoint>,
    /// When secrets that were to follow stop being waited for.
    secrets_deadline: Option<tokio::time::Instant>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Phase {
    AwaitingSecrets,
    Starting,
    Running,
    Done,
}

pub struct Manager {
    backend: Arc<dyn DeliveryBackend>,
    key: Arc<EncryptionKey>,
    stop_grace: Duration,
    entries: BTreeMap<LeaseId, Entry>,
    reports: mpsc::UnboundedSender<Report>,
    progress: Progress,
}

impl Manager {
    /// Starts the manager's task; returns where to send orders and where reports come out.
    pub fn spawn(
        backend: Arc<dyn DeliveryBackend>,
        key: Arc<EncryptionKey>,
        stop_grace: Duration,
    ) -> (mpsc::UnboundedSender<Order>, mpsc::UnboundedReceiver<Report>) {
        let (orders_tx, orders) = mpsc::unbounded_channel();
        let (reports, reports_rx) = mpsc::unbounded_channel();
        let (progress, progress_rx) = mpsc::unbounded_channel();
        let manager = Manager { backend, key, stop_grace, entries: BTreeMap::new(), reports, progress };
        tokio::spawn(manager.run(orders, progress_rx));
        (orders_tx, reports_rx)
    }

    async fn run(mut self, mut orders: mpsc::UnboundedReceiver<Order>, mut progress: mpsc::UnboundedReceiver<(LeaseId, DeliveryState)>) {
        let mut polling = tokio::time::interval(POLL_EVERY);
        let (started_tx, mut started) = mpsc::unbounded_channel();
        let mut generation = 0u64;
        let mut generations: BTreeMap<LeaseId, u64> = BTreeMap::new();
        loop {
            tokio::select! {
                order = orders.recv() => {
                    let Some(order) = order else { return };
                    match order {
                        Order::Deliver { lease, gpus, workload, start_ms, end_ms } => {
                            // A new workload replaces the running one.
                            if self.entries.remove(&lease).is_some() {
                                self.backend.remove(lease, self.stop_grace).await;
                            }
                            let Some(job) = self.prepare(lease, gpus, workload.map(|w| *w), end_ms) else { continue };
                            let waiting = job.workload.as_ref().is_some_and(|w| w.secrets_follow && w.sealed.is_none());
                            let mut entry = Entry { job, restarts: 0, phase: Phase::Starting, endpoints: Vec::new(), secrets_deadline: None };
                            if waiting {
                                entry.phase = Phase::AwaitingSecrets;
                                entry.secrets_deadline = Some(tokio::time::Instant::now() + Duration::from_millis(SECRETS_WAIT_MS));
                                self.status(lease, DeliveryState::AwaitingSecrets);
                                self.entries.insert(lease, entry);
                                continue;
                            }
                            generation += 1;
                            generations.insert(lease, generation);
                            self.launch(&mut entry, generation, &started_tx, start_ms);
                            self.entries.insert(lease, entry);
                        }
                        Order::Preempt { lease, deadline_ms } => {
                            if let Some(entry) = self.entries.get(&lease) {
                                self.backend.terminate(&entry.job, deadline_ms).await;
                            }
                        }
                        Order::End { lease } => {
                            generations.remove(&lease);
                            if self.entries.remove(&lease).is_some() || self.backend.runs_without_workload() {
                                self.backend.remove(lease, self.stop_grace).await;
                                self.status(lease, DeliveryState::Stopped);
                            }
                        }
                        Order::Logs { request, lease, tail_bytes } => {
                            let (data, truncated) = if self.entries.contains_key(&lease) {
                                self.backend.logs(lease, tail_bytes).await
                            } else {
                                (String::new(), false)
                            };
                            let _ = self.reports.send(Report::Logs { request, data, truncated });
                        }
                        Order::Reconcile { active } => self.reconcile(active).await,
                    }
                }
                Some((lease, state)) = progress.recv() => {
                    if self.entries.get(&lease).is_some_and(|e| e.phase == Phase::Starting) {
                        self.status(lease, state);
                    }
                }
                Some((lease, of_generation, result)) = started.recv() => {
                    if generations.get(&lease) != Some(&of_generation) {
                        continue; // replaced or ended meanwhile
                    }
                    let Some(entry) = self.entries.get_mut(&lease) else { continue };
                    match result {
                        Ok(endpoints) => {
                            entry.phase = Phase::Running;
                            entry.endpoints = endpoints;
                            let state = running(entry);
                            self.status(lease, state);
                        }
                        Err(failure) => {
                            entry.phase = Phase::Done;
                            tracing::warn!(%lease, code = ?failure.code, reason = %failure.reason, "delivery failed");
                            self.status(lease, failure.state());
                        }
                    }
                }
                _ = polling.tick() => {
                    self.supervise(&mut generation, &mut generations, &started_tx).await;
                }
            }
        }
    }

    /// Checks the workload against the limits, opens its secrets; reports a failure and returns `None` when it cannot run.
    fn prepare(&mut self, lease: LeaseId, gpus: Vec<LeasedGpu>, workload: Option<Workload>, end_ms: Option<u64>) -> Option<Job> {
        let Some(workload) = workload else {
            if self.backend.runs_without_workload() {
                return Some(Job { lease, gpus, workload: None, secrets: Secrets::default(), end_ms });
            }
            return None;
        };
        if let Err(refused) = workload.validate() {
            self.status(lease, Failure::new(FailureCode::WorkloadRefused, refused.to_string()).state());
            return None;
        }
        let secrets = match &workload.sealed {
            None => Secrets::default(),
            Some(sealed) => match self.key.unseal(sealed) {
                Ok(secrets) => secrets,
                Err(error) => {
                    self.status(lease, Failure::new(FailureCode::SecretsInvalid, error.to_string()).state());
                    return None;
                }
            },
        };
        if let Err(refused) = secrets.validate() {
            self.status(lease, Failure::new(FailureCode::WorkloadRefused, refused.to_string()).state());
            return None;
        }
        Some(Job { lease, gpus, workload: Some(workload), secrets, end_ms })
    }

    fn launch(&self, entry: &mut Entry, generation: u64, started: &Started, start_ms: u64) {
        entry.phase = Phase::Starting;
        let (backend, job, progress, started) = (self.backend.clone(), entry.job.clone(), self.progress.clone(), started.clone());
        self.status(job.lease, DeliveryState::Starting);
        tokio::spawn(async move {
            let wait = start_ms.saturating_sub(now_ms());
            if wait > 0 {
                tokio::time::sleep(Duration::from_millis(wait)).await;
            }
            let result = backend.start(&job, &progress).await;
            let _ = started.send((job.lease, generation, result));
        });
    }

    /// Restarts or reports exited workloads; gives up on secrets that never came.
    async fn supervise(&mut self, generation: &mut u64, generations: &mut BTreeMap<LeaseId, u64>, started: &Started) {
        let leases: Vec<LeaseId> = self.entries.keys().copied().collect();
        for lease in leases {
            let Some(entry) = self.entries.get(&lease) else { continue };
            match entry.phase {
                Phase::AwaitingSecrets if entry.secrets_deadline.is_some_and(|d| d <= tokio::time::Instant::now()) => {
                    let failure = Failure::new(FailureCode::SecretsMissing, "the sealed secrets never came");
                    self.entries.get_mut(&lease).expect("present").phase = Phase::Done;
                    self.status(lease, failure.state());
                }
                Phase::Running => {
                    let code = match self.backend.poll(lease).await {
                        Poll::Running => continue,
                        Poll::Exited(code) => code,
                        Poll::Gone => -1,
                    };
                    let entry = self.entries.get_mut(&lease).expect("present");
                    let restart = match entry.job.workload.as_ref().map_or(RestartPolicy::Never, |w| w.restart) {
                        RestartPolicy::Never => false,
                        RestartPolicy::Always => true,
                        RestartPolicy::OnFailure { max_restarts } => code != 0 && entry.restarts < max_restarts,
                    };
                    self.status(lease, DeliveryState::Exited { code });
                    let entry = self.entries.get_mut(&lease).expect("present");
                    if restart {
                        entry.restarts += 1;
                        self.backend.remove(lease, Duration::ZERO).await;
                        *generation += 1;
                        generations.insert(lease, *generation);
                        let mut entry = self.entries.remove(&lease).expect("present");
                        self.launch(&mut entry, *generation, started, 0);
                        self.entries.insert(lease, entry);
                    } else {
                        entry.phase = Phase::Done;
                    }
                }
                _ => {}
            }
        }
    }

    async fn reconcile(&mut self, active: BTreeSet<LeaseId>) {
        // Each active lease's workload is looked up by name: one broken
        // container elsewhere can make a whole listing fail, and a failed
        // lookup must not read as "nothing runs" (the lease would be
        // delivered again, replacing the very container that runs).
        let mut unadopted = Vec::new();
        let missing: Vec<LeaseId> = active.iter().copied().filter(|lease| !self.entries.contains_key(lease)).collect();
        for lease in missing {
            let mut attempt = 0;
            let found = loop {
                match self.backend.found(lease).await {
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
                Some(workload) if workload.running => {
                    tracing::info!(%lease, "re-adopted a running workload");
                    let job = Job { lease, gpus: Vec::new(), workload: None, secrets: Secrets::default(), end_ms: None };
                    let entry = Entry { job, restarts: 0, phase: Phase::Running, endpoints: workload.endpoints, secrets_deadline: None };
                    let state = running(&entry);
                    self.entries.insert(lease, entry);
                    self.status(lease, state);
                }
                Some(_) => {
                    self.backend.remove(lease, Duration::ZERO).await;
                    unadopted.push(lease);
                }
                None => unadopted.push(lease),
            }
        }
        // Workloads of leases that ended while the agent was away.
        match self.backend.find().await {
            Ok(found) => {
                for workload in found.into_iter().filter(|w| !active.contains(&w.lease)) {
                    tracing::info!(lease = %workload.lease, "removing the workload of a lease that ended while the agent was away");
                    self.backend.remove(workload.lease, Duration::ZERO).await;
                }
            }
            Err(error) => tracing::warn!(%error, "could not list this host's workloads; those of ended leases stay until the next start"),
        }
        let _ = self.reports.send(Report::Unadopted { leases: unadopted });
    }

    fn status(&self, lease: LeaseId, state: DeliveryState) {
        let _ = self.reports.send(Report::Status { lease, state });
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
