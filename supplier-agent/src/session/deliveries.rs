//! The agent's side of delivery: the backend the owner configured and the
//! delivery manager's task it runs under (docs/agent.md "Delivery"), what
//! is handed to it (workloads, jobs with their files' token, ends,
//! preemptions, logs and exec requests), the statuses and interconnect
//! probes waiting to be sent, the GPUs of ended leases not yet released,
//! and the fabric's firewall.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use ed25519_dalek::SigningKey;
use gpux_client::Connection;
use gpux_engine::LeaseId;
use gpux_protocol::{ClientMessage, DeliveryState, FabricProbeBody, FailureCode, Fault, JobAssignment, ServerMessage, Workload};

use super::host::{Billing, Host};
use crate::config::{AgentConfig, BackendKind};
use crate::delivery::{DeliveryBackend, Manager, Order, Report, Tuning};
use crate::limits::PROBE_DEADLINE;

/// A message the manager's reports call for, waiting for the loop.
pub(super) enum ToExchange {
    /// A GPU the host failed a delivery on goes offline.
    Offline(gpux_engine::GpuId),
    /// A renter's logs or exec outcome (`Report::Logs`, `Report::Exec`),
    /// relayed as the manager reported it.
    Relay(Report),
    /// A lease the manager could not re-adopt: its workload, asked for and delivered.
    Workload(LeaseId),
    /// A lease the manager re-adopted: its volumes, asked for and synced again.
    Volumes(LeaseId),
}

/// What `Deliveries::next` brings.
pub(super) enum FromDelivery {
    Report(Report),
    /// An interconnect probe ended: it waits to be sent.
    Probe,
}

/// Orders to the delivery manager, and its reports.
type ManagerLink = (tokio::sync::mpsc::UnboundedSender<Order>, tokio::sync::mpsc::UnboundedReceiver<Report>);

pub(super) struct Deliveries {
    /// The backend the owner configured (none: lease events are logged
    /// only); the manager runs it, and the health check asks it.
    backend: Option<Arc<dyn DeliveryBackend>>,
    tuning: Tuning,
    /// The key renters seal their workloads' secrets to.
    pub(super) encryption_key: Arc<gpux_protocol::delivery::EncryptionKey>,
    /// Orders to the delivery manager and its reports (set up by `start`).
    manager: Option<ManagerLink>,
    /// Where jobs' files live on this host (`<state dir>/jobs/<lease>`).
    jobs_dir: PathBuf,
    /// Where leases' volumes live on this host (`<state dir>/volumes/<lease>`).
    volumes_dir: PathBuf,
    /// Volumes attached to this host's leases whose workload has not come
    /// yet (`volumes_attached` comes right before it).
    volumes: BTreeMap<LeaseId, Box<crate::delivery::volumes::VolumeFiles>>,
    /// The newest delivery status per lease not yet sent (the link was down).
    statuses_unsent: BTreeMap<LeaseId, DeliveryState>,
    /// GPUs (host masks) of ended leases whose workloads are not yet
    /// confirmed gone: not offered until they are.
    releasing: BTreeMap<LeaseId, u64>,
    /// Jobs assigned without a token for their files (an exchange that
    /// sends none with the assignment): asked for from the loop.
    tokens_wanted: Vec<(LeaseId, JobAssignment)>,
    /// What the manager's reports call for at the exchange, in order, sent
    /// from the loop: GPUs a failed delivery takes offline (before the
    /// failure's status), logs and exec outcomes for renters, workloads of
    /// leases the manager could not re-adopt.
    outbox: std::collections::VecDeque<ToExchange>,
    /// Interconnect probes that completed (or failed) on their own tasks,
    /// to sign and send (docs/agent.md "Interconnect probe").
    probes: (tokio::sync::mpsc::UnboundedSender<FabricProbeBody>, tokio::sync::mpsc::UnboundedReceiver<FabricProbeBody>),
    /// Probes not yet acknowledged (the link was down).
    probes_unsent: Vec<FabricProbeBody>,
    /// The probe's size, MiB, where this host declared a fabric to probe.
    probe_mib: Option<u32>,
    /// The fabric's firewall, when this agent keeps it (`[fabric] firewall`).
    firewall: Option<crate::firewall::Firewall>,
}

impl Deliveries {
    pub(super) fn new(config: &AgentConfig) -> Result<Deliveries> {
        // The X25519 key renters seal their workloads' secrets to: a file of its
        // own beside the host key, with the same 0600 rules.
        let mut encryption_key_file = config.key_file.clone().into_os_string();
        encryption_key_file.push(".x25519");
        let secret = crate::keys::load_or_create(std::path::Path::new(&encryption_key_file))?.to_bytes();
        let firewall = match &config.fabric {
            Some(fabric) if fabric.firewall == crate::config::FirewallKind::Nftables => {
                let address = fabric.address.parse().context("fabric.address")?;
                std::fs::create_dir_all(state_dir(config)).context("the agent's state directory")?;
                Some(crate::firewall::Firewall::new(&config.host, address, state_dir(config).join("firewall.json"))?)
            }
            _ => None,
        };
        let tuning = config.delivery.as_ref().map_or_else(Tuning::default, |d| Tuning {
            stop_grace: Duration::from_millis(d.stop_grace_ms),
            ready_after: Duration::from_millis(d.ready_after_ms),
            concurrency: d.concurrency as usize,
        });
        Ok(Deliveries {
            backend: delivery_backend(config)?,
            tuning,
            encryption_key: Arc::new(gpux_protocol::delivery::EncryptionKey::from_bytes(secret)),
            manager: None,
            jobs_dir: state_dir(config).join("jobs"),
            volumes_dir: state_dir(config).join("volumes"),
            volumes: BTreeMap::new(),
            statuses_unsent: BTreeMap::new(),
            releasing: BTreeMap::new(),
            tokens_wanted: Vec::new(),
            outbox: Default::default(),
            probes: tokio::sync::mpsc::unbounded_channel(),
            probes_unsent: Vec::new(),
            probe_mib: config.fabric.as_ref().map(|f| f.probe_mib).filter(|&mib| mib > 0),
            firewall,
        })
    }

    /// Installs the fabric's firewall and starts the delivery manager.
    pub(super) fn start(&mut self) -> Result<()> {
        if let Some(firewall) = &self.firewall {
            // Closed to all but this host and the clusters it served when it
            // stopped, before anything is offered.
            firewall.apply().context("the fabric's firewall (docs/agent.md \"Firewall\")")?;
            tracing::info!(table = firewall.table(), "fabric firewall installed");
        }
        if let Some(backend) = &self.backend {
            tracing::info!(backend = backend.name(), "delivering leases");
            self.manager = Some(Manager::spawn(backend.clone(), self.encryption_key.clone(), self.tuning));
        }
        Ok(())
    }

    /// Whether a delivery manager runs.
    pub(super) fn managed(&self) -> bool {
        self.manager.is_some()
    }

    /// The backend, for the health check.
    pub(super) fn backend(&self) -> Option<&dyn DeliveryBackend> {
        self.backend.as_deref()
    }

    fn order(&self, order: Order) {
        if let Some((orders, _)) = &self.manager {
            let _ = orders.send(order);
        }
    }

    /// The next report of the delivery manager, or the next interconnect
    /// probe that ended (queued to be sent).
    pub(super) async fn next(&mut self) -> FromDelivery {
        let manager = &mut self.manager;
        let reports = async {
            match manager {
                Some((_, reports)) => reports.recv().await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            Some(report) = reports => FromDelivery::Report(report),
            Some(probe) = self.probes.1.recv() => {
                self.probes_unsent.push(probe);
                FromDelivery::Probe
            }
            else => std::future::pending().await,
        }
    }

    /// The renter's volumes for one of this host's leases: kept for its
    /// workload, which follows (docs/agent.md "Volumes").
    pub(super) fn volumes_attached(
        &mut self,
        host: &Host,
        lease: LeaseId,
        renter: gpux_engine::AccountId,
        volumes: Vec<gpux_protocol::VolumeAttachment>,
        store: Option<gpux_protocol::jobs::StoreGrant>,
    ) {
        if self.manager.is_none() || !host.leases.contains_key(&lease) {
            tracing::debug!(%lease, "volumes for a lease on another host");
            return;
        }
        let Some(store) = store else {
            tracing::warn!(%lease, "volumes came without a store token: the workload starts without them");
            return;
        };
        let dir = self.volumes_dir.join(lease.0.to_string());
        let files = crate::delivery::volumes::VolumeFiles::new(lease, renter, volumes, dir, store);
        self.volumes.insert(lease, Box::new(files));
    }

    /// Hands a lease's workload (or, for the hook, the lease itself) to the
    /// delivery manager; `start_ms` on this host's clock.
    pub(super) fn deliver(&mut self, host: &mut Host, lease: LeaseId, workload: Option<Box<Workload>>, clock_offset_ms: i64) {
        let (Some(_), Some(state)) = (&self.manager, host.leases.get_mut(&lease)) else { return };
        if state.billing == Billing::AsMeasured {
            state.billing = Billing::DeliveryPending;
        }
        let (start_ms, end_ms, mask) = (state.start_ms.saturating_add_signed(-clock_offset_ms), state.end_ms, state.gpu_mask);
        // A workload set again later (`set_workload`) keeps the lease's volumes.
        let volumes = self.volumes.get(&lease).cloned();
        self.order(Order::Deliver { lease, gpus: host.leased_gpus(mask), workload, start_ms, end_ms, volumes });
    }

    /// A service's replica on one of this host's leases: its port
    /// published, its command run, `running` reported once its readiness
    /// probe answers (docs/agent.md "Services").
    pub(super) fn replica_assigned(
        &self,
        host: &mut Host,
        lease: LeaseId,
        replica: gpux_protocol::ReplicaAssignment,
        clock_offset_ms: i64,
    ) {
        let (Some(_), Some(state)) = (&self.manager, host.leases.get_mut(&lease)) else {
            tracing::debug!(%lease, service = %replica.service, "a replica for a lease on another host");
            return;
        };
        if state.billing == Billing::AsMeasured {
            state.billing = Billing::DeliveryPending;
        }
        tracing::info!(%lease, service = %replica.service, slot = replica.slot, "delivering a service's replica");
        let (start_ms, end_ms, mask) = (state.start_ms.saturating_add_signed(-clock_offset_ms), state.end_ms, state.gpu_mask);
        let workload = Workload { ports: vec![replica.port], ..Workload::image(replica.image) };
        let opened = gpux_protocol::Secrets {
            command: replica.command,
            readiness: Some(gpux_protocol::delivery::Readiness { port: replica.port, http_path: replica.readiness_path }),
            ..gpux_protocol::Secrets::default()
        };
        let (workload, opened) = (Box::new(workload), Box::new(opened));
        self.order(Order::DeliverReplica { lease, gpus: host.leased_gpus(mask), workload, opened, start_ms, end_ms });
    }

    /// A job's attempt on one of this host's leases: with the token for
    /// its files it goes to the manager now; an exchange that sent none is
    /// asked for one from the loop (never while a message is handled).
    pub(super) fn job_assigned(
        &mut self,
        host: &mut Host,
        lease: LeaseId,
        assignment: JobAssignment,
        store: Option<gpux_protocol::jobs::StoreGrant>,
        clock_offset_ms: i64,
    ) {
        let (Some(_), Some(state)) = (&self.manager, host.leases.get_mut(&lease)) else {
            // The supplier's other hosts share its account and its pushes.
            tracing::debug!(%lease, job = %assignment.job, "a job for a lease on another host");
            return;
        };
        if state.billing == Billing::AsMeasured {
            state.billing = Billing::DeliveryPending;
        }
        match store {
            Some(grant) => self.deliver_job(host, lease, assignment, grant.url, grant.token, clock_offset_ms),
            None => self.tokens_wanted.push((lease, assignment)),
        }
    }

    fn deliver_job(
        &mut self,
        host: &mut Host,
        lease: LeaseId,
        assignment: JobAssignment,
        store_url: String,
        token: String,
        clock_offset_ms: i64,
    ) {
        let Some(state) = host.leases.get_mut(&lease) else { return };
        if state.billing == Billing::AsMeasured {
            state.billing = Billing::DeliveryPending;
        }
        let (start_ms, end_ms, mask) = (state.start_ms.saturating_add_signed(-clock_offset_ms), state.end_ms, state.gpu_mask);
        tracing::info!(%lease, job = %assignment.job, attempt = assignment.attempt, "delivering a job");
        if let Some(firewall) = self.firewall.as_mut().filter(|_| assignment.nodes > 1) {
            let members = assignment.peers.iter().filter_map(|p| p.address.parse().ok()).collect();
            match firewall.admit(lease, members) {
                Ok(()) => tracing::info!(%lease, admitted = firewall.admitted().len(), "fabric firewall admits the cluster's members"),
                Err(error) => tracing::error!(%lease, %error, "the fabric firewall could not admit the cluster's members"),
            }
        }
        self.start_probe(lease, &assignment);
        let files = crate::delivery::jobs::JobFiles {
            dir: self.jobs_dir.join(lease.0.to_string()),
            pip_cache: self.jobs_dir.join("pip-cache"),
            assignment,
            store_url,
            token,
            resumed: false,
            uploaded: Default::default(),
        };
        self.order(Order::DeliverJob { lease, gpus: host.leased_gpus(mask), files: Box::new(files), start_ms, end_ms });
    }

    /// Starts a cluster attempt's interconnect probe on its own task when
    /// this host declared a fabric and the attempt names every member: a
    /// ring all-reduce among the members' agents while the workload is
    /// delivered (docs/agent.md "Interconnect probe"); what it measured,
    /// or that it did not complete, comes back to be signed and sent.
    fn start_probe(&self, lease: LeaseId, assignment: &JobAssignment) {
        let Some(probe_mib) = self.probe_mib else { return };
        if assignment.nodes < 2 || assignment.peers.len() != assignment.nodes as usize {
            return;
        }
        let ring = crate::probe::Ring {
            job: assignment.job.0,
            attempt: assignment.attempt,
            rank: assignment.node_rank,
            members: assignment.peers.clone(),
            bytes: probe_mib as u64 * (1 << 20),
            deadline: PROBE_DEADLINE,
        };
        let results = self.probes.0.clone();
        tokio::spawn(async move {
            let outcome = crate::probe::run(&ring).await;
            let elapsed_us = match &outcome {
                Ok(elapsed) => (elapsed.as_micros() as u64).max(1),
                Err(error) => {
                    tracing::warn!(%lease, %error, "the interconnect probe did not complete");
                    0
                }
            };
            let _ = results.send(FabricProbeBody {
                lease,
                job: gpux_protocol::JobId(ring.job),
                attempt: ring.attempt,
                ranks: ring.members.len() as u32,
                rank: ring.rank,
                bytes: ring.bytes,
                elapsed_us,
            });
        });
    }

    /// The leases the exchange has active on this host: the manager
    /// re-adopts their workloads and removes the others'; the firewall
    /// forgets the clusters that ended meanwhile.
    pub(super) fn reconcile(&mut self, active: std::collections::BTreeSet<LeaseId>) {
        if let Some(firewall) = &mut self.firewall {
            let ended: Vec<LeaseId> = firewall.leases().into_iter().filter(|lease| !active.contains(lease)).collect();
            if let Err(error) = firewall.forget(&ended) {
                tracing::error!(%error, "the fabric firewall could not be updated");
            }
        }
        self.order(Order::Reconcile { active });
    }

    /// A lease of this host ended: its workload is stopped and its GPUs
    /// offered again once it is confirmed gone.
    pub(super) fn lease_ended(&mut self, lease: LeaseId, mask: u64) {
        if let Some(firewall) = &mut self.firewall {
            if let Err(error) = firewall.forget(&[lease]) {
                tracing::error!(%lease, %error, "the fabric firewall could not be updated");
            }
        }
        self.volumes.remove(&lease);
        if self.manager.is_some() {
            self.releasing.insert(lease, mask);
            self.order(Order::End { lease });
        }
    }

    /// SIGTERM now; the lease ends at `deadline_ms` (this host's clock)
    /// whatever the workload does.
    pub(super) fn preempt(&self, lease: LeaseId, deadline_ms: u64) {
        self.order(Order::Preempt { lease, deadline_ms });
    }

    /// A renter's logs request, for the agent that runs (or ran) the lease:
    /// the exchange may ask every agent of the account.
    pub(super) fn logs(&self, request: u64, lease: LeaseId, tail_bytes: u32) {
        self.order(Order::Logs { request, lease, tail_bytes });
    }

    pub(super) fn exec(&self, request: u64, lease: LeaseId, command: Vec<String>, timeout_ms: u32) {
        self.order(Order::Exec { request, lease, command, timeout_ms });
    }

    /// A status to send (the newest per lease).
    pub(super) fn status(&mut self, lease: LeaseId, state: DeliveryState) {
        self.statuses_unsent.insert(lease, state);
    }

    /// The GPUs being released from ended leases, as a host mask.
    pub(super) fn releasing_mask(&self) -> u64 {
        self.releasing.values().fold(0, |mask, m| mask | m)
    }

    /// More GPUs of an ended lease are being removed.
    pub(super) fn removing(&mut self, lease: LeaseId, mask: u64) {
        *self.releasing.entry(lease).or_default() |= mask;
    }

    /// An ended lease's workload is gone; whether its GPUs were held back.
    pub(super) fn released(&mut self, lease: LeaseId) -> bool {
        self.releasing.remove(&lease).is_some()
    }

    /// A leased GPU unhealthy for `lost_after_ms` is lost: its lease is
    /// failed on the host's side (`gpu_unavailable`), so the exchange ends
    /// it and bills nothing after (what was delivered before is paid), and
    /// a re-match bid replaces it where the renter asked for one.
    pub(super) fn fail_lost_leases(&mut self, host: &mut Host, lost_after_ms: u64, now_ms: u64) {
        for (lease, uuids) in host.lost_leases(lost_after_ms, now_ms) {
            if let Some(state) = host.leases.get_mut(&lease) {
                state.billing = Billing::HostFailed;
            }
            let reason = format!("GPU {} unavailable for {} s", uuids.join(","), lost_after_ms / 1_000);
            tracing::error!(%lease, %reason, "a leased GPU is lost: failing the lease on the host's side");
            let failure = crate::delivery::Failure::public(FailureCode::GpuUnavailable, reason);
            self.status(lease, DeliveryState::Failed { code: failure.code, fault: Fault::Host, reason: failure.reason });
        }
    }

    /// Queues a message for the exchange (sent by `flush`).
    pub(super) fn send(&mut self, message: ToExchange) {
        self.outbox.push_back(message);
    }

    /// Whether anything waits to be sent or asked for.
    pub(super) fn due(&self) -> bool {
        !self.tokens_wanted.is_empty() || !self.outbox.is_empty() || !self.statuses_unsent.is_empty() || !self.probes_unsent.is_empty()
    }

    /// Asks for the tokens jobs wait for, then sends the statuses and
    /// probes that wait.
    pub(super) async fn flush(
        &mut self,
        connection: &mut Connection,
        host: &mut Host,
        key: &SigningKey,
        clock_offset_ms: i64,
    ) -> Result<()> {
        for (lease, assignment) in std::mem::take(&mut self.tokens_wanted) {
            let id = connection.new_id();
            match connection.request(ClientMessage::JobStoreToken { id, job: None, lease: Some(lease), volume: None }).await? {
                ServerMessage::JobStoreToken { url, token, .. } => self.deliver_job(host, lease, assignment, url, token, clock_offset_ms),
                other => {
                    tracing::warn!(%lease, ?other, "no job store token: the job cannot be delivered");
                    let reason = FailureCode::HostError.describe().to_string();
                    self.status(lease, DeliveryState::Failed { code: FailureCode::HostError, fault: Fault::Host, reason });
                }
            }
        }
        while let Some(message) = self.outbox.front() {
            let id = connection.new_id();
            match message {
                ToExchange::Offline(gpu) => {
                    connection.request(ClientMessage::SetGpuOnline { id, gpu: *gpu, online: false }).await?;
                }
                ToExchange::Relay(Report::Logs { request, data, truncated }) => {
                    let logs = ClientMessage::Logs { id, request: *request, data: data.clone(), truncated: *truncated };
                    connection.request(logs).await?;
                }
                ToExchange::Relay(Report::Exec { request, outcome }) => {
                    connection.request(ClientMessage::ExecDone { id, request: *request, outcome: outcome.clone() }).await?;
                }
                // Nothing else is relayed.
                ToExchange::Relay(_) => {}
                ToExchange::Workload(lease) => {
                    let lease = *lease;
                    match connection.request(ClientMessage::LeaseDelivery { id, lease }).await? {
                        // A service's replica: its command and readiness too.
                        ServerMessage::LeaseDelivery { replica: Some(replica), .. } => {
                            self.replica_assigned(host, lease, *replica, clock_offset_ms)
                        }
                        ServerMessage::LeaseDelivery { workload: Some(workload), volumes, .. } => {
                            // Its volumes are restored from the store before it starts again.
                            if let Some(v) = volumes {
                                self.volumes_attached(host, lease, v.renter, v.volumes, v.store);
                            }
                            self.deliver(host, lease, Some(workload), clock_offset_ms)
                        }
                        _ => {}
                    }
                }
                ToExchange::Volumes(lease) => {
                    let lease = *lease;
                    if let ServerMessage::LeaseDelivery { volumes: Some(v), .. } =
                        connection.request(ClientMessage::LeaseDelivery { id, lease }).await?
                    {
                        self.volumes_attached(host, lease, v.renter, v.volumes, v.store);
                        if let Some(files) = self.volumes.get(&lease) {
                            tracing::info!(%lease, "the re-adopted workload's volumes are synced again");
                            let files = Box::new((**files).clone().already_restored());
                            self.order(Order::Volumes { lease, volumes: files });
                        }
                    }
                }
            }
            // Sent (a connection lost before is sent again on the next).
            self.outbox.pop_front();
        }
        self.send_statuses(connection).await?;
        self.send_probes(connection, key).await
    }

    /// Sends the delivery statuses that wait; each is acknowledged durable.
    async fn send_statuses(&mut self, connection: &mut Connection) -> Result<()> {
        while let Some((&lease, state)) = self.statuses_unsent.iter().next() {
            let id = connection.new_id();
            let message = ClientMessage::DeliveryStatus { id, lease, state: state.clone() };
            match connection.request(message).await? {
                ServerMessage::Ack { .. } => {}
                ServerMessage::Error { code, message, .. } => tracing::warn!(%lease, ?code, %message, "delivery status refused"),
                other => bail!("sending a delivery status: {other:?}"),
            }
            self.statuses_unsent.remove(&lease);
        }
        Ok(())
    }

    /// Signs and sends the interconnect probes that wait; each is
    /// acknowledged durable (or refused, and dropped: a probe for an attempt
    /// that already ended).
    async fn send_probes(&mut self, connection: &mut Connection, key: &SigningKey) -> Result<()> {
        while let Some(body) = self.probes_unsent.first().cloned() {
            let id = connection.new_id();
            let (lease, mbps) = (body.lease, body.bus_mbps());
            let report = Box::new(gpux_protocol::FabricProbeReport::sign(body, key));
            match connection.request(ClientMessage::FabricProbe { id, report }).await? {
                ServerMessage::Ack { .. } => tracing::info!(%lease, mbps, "interconnect probe sent"),
                ServerMessage::Error { code, message, .. } => tracing::warn!(%lease, ?code, %message, "interconnect probe refused"),
                other => bail!("sending an interconnect probe: {other:?}"),
            }
            self.probes_unsent.remove(0);
        }
        Ok(())
    }
}

/// Whether this host runs renters' workloads (the `docker` or `process` backend).
pub(super) fn delivers_workloads(config: &AgentConfig) -> bool {
    matches!(&config.delivery, Some(crate::config::DeliveryConfig { backend: BackendKind::Docker | BackendKind::Process, .. }))
}

/// Whether leases are delivered without a workload (the hook).
pub(super) fn runs_without_workload(config: &AgentConfig) -> bool {
    matches!(
        (&config.delivery, &config.delivery_hook),
        (Some(crate::config::DeliveryConfig { backend: BackendKind::Hook, .. }), _) | (None, Some(_))
    )
}

/// Where per-lease scratch data lives (`delivery.state_dir`, default
/// `<key_file's dir>/leases`). Absolute: the container engine reads a
/// relative bind source as a volume's name.
fn state_dir(config: &AgentConfig) -> PathBuf {
    let dir = config
        .delivery
        .as_ref()
        .and_then(|d| d.state_dir.clone())
        .unwrap_or_else(|| config.key_file.parent().map_or_else(|| PathBuf::from("leases"), |d| d.join("leases")));
    std::path::absolute(&dir).unwrap_or(dir)
}

/// The backend the owner's config names (`[delivery]`, or the older
/// `delivery_hook` alone); `None` logs lease events only.
fn delivery_backend(config: &AgentConfig) -> Result<Option<Arc<dyn DeliveryBackend>>> {
    use crate::delivery::{docker::DockerBackend, hook::HookBackend, process::ProcessBackend};
    Ok(match (&config.delivery, &config.delivery_hook) {
        (None, None) => None,
        (None, Some(hook)) => Some(Arc::new(HookBackend::new(hook.clone()))),
        (Some(delivery), hook) => match delivery.backend {
            BackendKind::Docker => Some(Arc::new(
                DockerBackend::connect(delivery.docker.clone(), config.host.clone(), state_dir(config))
                    .with_context(|| format!("connecting to the container engine at {}", delivery.docker.socket))?,
            )),
            BackendKind::Process => Some(Arc::new(ProcessBackend::new(state_dir(config), delivery.public_address.clone()))),
            BackendKind::Hook => {
                let hook = delivery.hook.clone().or_else(|| hook.clone()).context("delivery.hook is required")?;
                Some(Arc::new(HookBackend::new(hook)))
            }
        },
    })
}
