//! One agent session against the exchange: log in with the host key,
//! register the host's GPUs (resuming those registered before), keep one
//! ask per configured contract kind covering every healthy, free GPU at the
//! owner's floor price, report health changes, and run the delivery hook on
//! every lease event for this host.
//!
//! The agent re-derives its asks from what it knows (GPU health, its leases)
//! whenever that changes, by cancelling its ask of a kind and placing a new
//! one: simple, and always consistent with the engine's view.
//!
//! Every `report_interval_ms` it signs a usage report per leased GPU (the
//! interval since the last one, with the share of samples that found the GPU
//! healthy) and sends the queue in order. When the connection drops it keeps
//! sampling and recording, reconnects with exponential back-off and jitter,
//! withdraws its stale asks, offers again and sends what queued meanwhile.

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use ed25519_dalek::SigningKey;
use gpux_engine::{Event, EventKind, GpuSet, HostId, InstrumentId, LeaseId, LeaseKind, OrderId, RejectCode, Role, Side};
use gpux_protocol::*;

pub use gpux_client::Connection;

use crate::backend::GpuBackend;
use crate::config::{AgentConfig, BackendKind, OfferedContract};
use crate::delivery::{DeliveryBackend, LeasedGpu, Manager, Order, Report, Tuning};
pub use crate::limits::CLOCK_SYNC_EVERY;
use crate::limits::{
    BACKOFF_MAX, BACKOFF_MIN, CLIENT_ORDER_ID_STRIDE, CLOCK_DRIFT_NOTED_MS, HEALTH_BACKOFF_MAX, PROBE_DEADLINE, RECONCILE_WAIT,
    REGISTER_AGAIN_AFTER,
};
use crate::reports::{Interval, ReportBook};

/// What the agent knows about one of its GPUs.
struct HostGpu {
    info: gpux_protocol::views::Gpu,
    healthy: bool,
    /// The delivery hook failed for this GPU's lease: it counts as unavailable
    /// (reported so, hence not billed) until that lease ends.
    delivery_failed: bool,
    /// Samples since this GPU's last report.
    window: Window,
    /// Since when (this host's clock) its samples read it unhealthy.
    unhealthy_since: Option<u64>,
}

#[derive(Clone, Copy, Default)]
struct Window {
    samples: u32,
    unhealthy: u32,
    utilisation_sum: u64,
    memory_used_mib_max: u32,
    /// The highest temperature read, and power summed over the samples
    /// that read it (mW) with their count, for the report's readings.
    temperature_c_max: Option<u32>,
    power_mw_sum: u64,
    power_samples: u32,
}

/// A lease on this host, as the agent follows it.
#[derive(Clone, Copy, Debug)]
struct LeaseState {
    kind: LeaseKind,
    gpu_mask: u64,
    start_ms: u64,
    /// The scheduled end, or the actual end once it ended.
    end_ms: Option<u64>,
    ended: bool,
    billing: Billing,
}

/// How a lease's usage reports count its time (docs/market-rules.md,
/// "Delivery failures"): a delivery the host fails is not billed at all, so
/// the reports of a delivery under way wait until its outcome is known.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Billing {
    /// Reports carry the available time the samples show.
    AsMeasured,
    /// A workload is being delivered: no report until it runs or fails
    /// (or the lease ends); the samples keep accumulating.
    DeliveryPending,
    /// The host failed the delivery: every report carries no available time.
    HostFailed,
}

/// An error the agent cannot fix by reconnecting.
#[derive(Debug)]
pub struct Fatal(pub String);

impl std::fmt::Display for Fatal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for Fatal {}

pub struct Agent {
    config: AgentConfig,
    key: SigningKey,
    backend: Box<dyn GpuBackend>,
    reports: ReportBook,
    gpus: Vec<HostGpu>,
    leases: BTreeMap<LeaseId, LeaseState>,
    next_client_order_id: u64,
    /// The exchange's clock minus ours, from the last login or clock sync.
    clock_offset_ms: i64,
    /// When the offset was last measured.
    clock_synced_at: Option<tokio::time::Instant>,
    /// GPUs (as a host mask) sold as contracts, per reserved window.
    windows_sold: BTreeMap<InstrumentId, u64>,
    /// The delivery backend, until `run` hands it to the manager's task.
    delivery_backend: Option<std::sync::Arc<dyn DeliveryBackend>>,
    encryption_key: std::sync::Arc<gpux_protocol::delivery::EncryptionKey>,
    /// Orders to the delivery manager and its reports (set up by `run`).
    delivery: Option<DeliveryLink>,
    /// Where jobs' files live on this host (`<state dir>/jobs/<lease>`).
    jobs_dir: PathBuf,
    /// The newest delivery status per lease not yet sent (the link was down).
    statuses_unsent: BTreeMap<LeaseId, DeliveryState>,
    /// The delivery backend, kept for the health check after a host failure.
    delivery_health: Option<std::sync::Arc<dyn DeliveryBackend>>,
    /// GPUs (host masks) of ended leases whose workloads are not yet
    /// confirmed gone: not offered until they are.
    releasing: BTreeMap<LeaseId, u64>,
    /// The host's failed deliveries and the health check that must pass
    /// before their GPUs are offered again.
    health: HostHealth,
    /// When this process began measuring (this host's clock): time before
    /// it, while the agent was down, was measured by nobody and is not billed.
    measuring_since_ms: Option<u64>,
    /// GPUs the exchange would not register yet (`gpus_awaiting_challenge`:
    /// the account's unproven GPUs are at their limit): registration is
    /// tried again at this time (this host's clock).
    register_again_at: Option<tokio::time::Instant>,
    /// Interconnect probes that completed (or failed) on their own tasks,
    /// to sign and send (docs/agent.md "Interconnect probe").
    probes: (tokio::sync::mpsc::UnboundedSender<FabricProbeBody>, tokio::sync::mpsc::UnboundedReceiver<FabricProbeBody>),
    /// Probes not yet acknowledged (the link was down).
    probes_unsent: Vec<FabricProbeBody>,
    /// The fabric's firewall, when this agent keeps it (`[fabric] firewall`).
    firewall: Option<crate::firewall::Firewall>,
}

/// After a delivery the host failed: its GPUs stay off sale (offline at the
/// exchange) until the failed lease ended and a health check passed, with a
/// back-off that grows with failures in a row (docs/agent.md "Delivery").
#[derive(Default)]
struct HostHealth {
    /// Leases the host failed that are still active, with their GPU masks.
    failed_leases: BTreeMap<LeaseId, u64>,
    /// Host failures since the last workload that reached `running`.
    failures_in_row: u32,
    /// The wait before the next check (doubles while checks fail).
    wait: Duration,
    /// When the next check is due (this host's clock).
    check_at: Option<tokio::time::Instant>,
}

/// What one connection knows (asks and ids die with it).
struct Link {
    connection: Connection,
    host: HostId,
    /// The spot and preemptible instrument (and its tick) of each class
    /// this host's GPUs are offered in, for each contract the owner offers.
    instruments: BTreeMap<(String, OfferedContract), (InstrumentId, u64)>,
    /// One ask per class and contract.
    asks: BTreeMap<(String, OfferedContract), OrderId>,
    /// Open asks in reserved windows.
    window_asks: BTreeMap<InstrumentId, OrderId>,
    /// Windows where an ask was refused (the GPUs are committed to an
    /// overlapping window); not tried again this connection.
    windows_refused: BTreeSet<InstrumentId>,
    /// Whether the owner's schedule made the GPUs available at the last sample.
    available: Option<bool>,
    /// Events asked for the asks to be offered again, once no message waits.
    reoffer_due: bool,
    /// Whether the delivery manager has listed this host's workloads since
    /// the login: until then nothing is offered (a workload of a lease that
    /// ended while the agent was away may still hold a GPU).
    reconciled: bool,
}

impl Agent {
    /// The next client order id of an ask on `host`: the supplier's hosts
    /// may share its account (docs/agent.md "Clusters"), so each takes the
    /// ids of its host's residue and no two agents send the same one.
    fn client_order_id(&mut self, host: HostId) -> u64 {
        self.next_client_order_id += CLIENT_ORDER_ID_STRIDE;
        self.next_client_order_id + host.0 as u64 % CLIENT_ORDER_ID_STRIDE
    }

    pub fn new(config: AgentConfig, key: SigningKey, backend: Box<dyn GpuBackend>) -> Result<Self> {
        let reports = ReportBook::open(&config.key_file)?;
        // The X25519 key renters seal their workloads' secrets to: a file of its
        // own beside the host key, with the same 0600 rules.
        let mut encryption_key_file = config.key_file.clone().into_os_string();
        encryption_key_file.push(".x25519");
        let secret = crate::keys::load_or_create(std::path::Path::new(&encryption_key_file))?.to_bytes();
        let encryption_key = std::sync::Arc::new(gpux_protocol::delivery::EncryptionKey::from_bytes(secret));
        let delivery_backend = delivery_backend(&config)?;
        let jobs_dir = state_dir(&config).join("jobs");
        let firewall = match &config.fabric {
            Some(fabric) if fabric.firewall == crate::config::FirewallKind::Nftables => {
                let address = fabric.address.parse().context("fabric.address")?;
                std::fs::create_dir_all(state_dir(&config)).context("the agent's state directory")?;
                Some(crate::firewall::Firewall::new(&config.host, address, state_dir(&config).join("firewall.json"))?)
            }
            _ => None,
        };
        Ok(Agent {
            firewall,
            delivery_health: delivery_backend.clone(),
            releasing: BTreeMap::new(),
            health: HostHealth::default(),
            measuring_since_ms: None,
            delivery_backend,
            encryption_key,
            delivery: None,
            statuses_unsent: BTreeMap::new(),
            config,
            key,
            backend,
            reports,
            gpus: Vec::new(),
            leases: BTreeMap::new(),
            next_client_order_id: client_order_id_base(),
            clock_offset_ms: 0,
            clock_synced_at: None,
            windows_sold: BTreeMap::new(),
            register_again_at: None,
            jobs_dir,
            probes: tokio::sync::mpsc::unbounded_channel(),
            probes_unsent: Vec::new(),
        })
    }

    /// Runs until `stop` fires, reconnecting after connection losses.
    pub async fn run(mut self, stop: impl std::future::Future<Output = ()>) -> Result<()> {
        tokio::pin!(stop);
        self.measuring_since_ms = Some(now_ms());
        if let Some(firewall) = &self.firewall {
            // Closed to all but this host and the clusters it served when it
            // stopped, before anything is offered.
            firewall.apply().context("the fabric's firewall (docs/agent.md \"Firewall\")")?;
            tracing::info!(table = firewall.table(), "fabric firewall installed");
        }
        if let Some(backend) = self.delivery_backend.take() {
            tracing::info!(backend = backend.name(), "delivering leases");
            let tuning = self.config.delivery.as_ref().map_or_else(Tuning::default, |d| Tuning {
                stop_grace: Duration::from_millis(d.stop_grace_ms),
                ready_after: Duration::from_millis(d.ready_after_ms),
                concurrency: d.concurrency as usize,
            });
            self.delivery = Some(Manager::spawn(backend, self.encryption_key.clone(), tuning));
        }
        let mut backoff = BACKOFF_MIN;
        let mut sampling = tokio::time::interval(Duration::from_millis(self.config.sample_interval_ms));
        let mut reporting = tokio::time::interval(Duration::from_millis(self.config.report_interval_ms));
        loop {
            let started = std::time::Instant::now();
            let error = match self.connect().await {
                Ok(mut link) => match self.serve(&mut link, &mut stop, &mut sampling, &mut reporting).await {
                    Ok(()) => return Ok(()),
                    Err(error) => error,
                },
                Err(error) => error,
            };
            if let Some(fatal) = error.downcast_ref::<Fatal>() {
                bail!("{fatal}");
            }
            if started.elapsed() > Duration::from_secs(60) {
                backoff = BACKOFF_MIN;
            }
            let wait = backoff + jitter(backoff / 4);
            tracing::warn!(error = %format!("{error:#}"), retry_in_ms = wait.as_millis() as u64, pending_reports = self.reports.pending(), "exchange connection lost");
            // Keep measuring while away: the reports cover the outage too.
            let deadline = tokio::time::sleep(wait);
            tokio::pin!(deadline);
            loop {
                tokio::select! {
                    _ = &mut stop => return Ok(()),
                    _ = &mut deadline => break,
                    // Health changes reach the exchange when the agent is back.
                    _ = sampling.tick() => { self.sample_only()?; }
                    _ = reporting.tick() => self.record_reports()?,
                }
            }
            backoff = (backoff * 2).min(BACKOFF_MAX);
        }
    }

    /// Publishes the key renters seal secrets to. Only a host that runs
    /// renters' workloads does: bids that carry one trade only with
    /// suppliers that published it.
    async fn publish_encryption_key(&self, connection: &mut Connection) -> Result<()> {
        let id = connection.new_id();
        let publish = ClientMessage::SetEncryptionKey {
            id,
            encryption_key: hex::encode(self.encryption_key.public()),
            signature: self.encryption_key.certify(&self.key),
        };
        match connection.request(publish).await? {
            ServerMessage::Ack { .. } => Ok(()),
            other => Err(Fatal(format!("publishing the encryption key: {other:?}")).into()),
        }
    }

    /// Logs in, registers, withdraws stale asks, offers, sends queued reports.
    async fn connect(&mut self) -> Result<Link> {
        let mut connection =
            Connection::open_invited(&self.config.exchange, &self.key, Some(Role::Supplier), true, self.config.invite.clone()).await.map_err(|error| match error {
                // A refused key stays refused: retrying would only hammer the exchange.
                gpux_client::ClientError::LoginRefused { code: ErrorCode::InviteRequired | ErrorCode::InviteInvalid, .. } => {
                    let key = hex::encode(self.key.verifying_key().to_bytes());
                    anyhow::Error::new(Fatal(format!(
                        "{error}: this exchange opens accounts by invitation; ask its operator for one for this host's key (`gpux invite {key} --role supplier`) and put it in the agent's config as invite = \"...\""
                    )))
                }
                gpux_client::ClientError::LoginRefused { .. } => anyhow::Error::new(Fatal(error.to_string())),
                other => anyhow::Error::new(other),
            })?;
        tracing::info!(account = %connection.account, public_key = %hex::encode(self.key.verifying_key().to_bytes()), "logged in");
        self.clock_offset_ms = connection.clock_offset_ms;
        self.clock_synced_at = Some(tokio::time::Instant::now());
        self.register(&mut connection).await?;
        if self.delivers_workloads() {
            self.publish_encryption_key(&mut connection).await?;
        }
        self.resume_health_backoff(&mut connection).await?;
        // Health changes seen while away reach the exchange now.
        for gpu in self.gpus.iter().filter(|g| g.healthy != g.info.online) {
            let id = connection.new_id();
            connection.request(ClientMessage::SetGpuOnline { id, gpu: gpu.info.gpu, online: gpu.healthy }).await?;
        }
        let host = match self.gpus.first() {
            Some(gpu) => gpu.info.host,
            // Registered later, once the account's earlier GPUs passed their challenges.
            None if self.register_again_at.is_some() => bail!("no GPU of this host is registered yet; logging in again"),
            None => return Err(Fatal("no GPU of this host qualifies for any listed class".into()).into()),
        };
        let instruments = self.instruments(&mut connection).await?;
        // Asks of an earlier connection are unknown to this one: withdraw
        // them. Only this host's: a supplier's other hosts may run agents
        // under the same key (a cluster's fabric group is one supplier's).
        withdraw_host_asks(&mut connection, host).await?;
        let mut link = Link {
            connection,
            host,
            instruments,
            asks: BTreeMap::new(),
            window_asks: BTreeMap::new(),
            windows_refused: BTreeSet::new(),
            available: None,
            reoffer_due: false,
            reconciled: self.delivery.is_none(),
        };
        self.resume_leases(&mut link).await?;
        // The manager lists the host's workloads before anything is offered
        // (a workload of a lease that ended meanwhile may hold a GPU); an
        // engine that does not answer in time leaves the offers to the
        // answer, whenever it comes.
        let deadline = tokio::time::Instant::now() + RECONCILE_WAIT;
        while !link.reconciled {
            match tokio::time::timeout_at(deadline, recv_report(&mut self.delivery)).await {
                Ok(Some(report)) => self.on_delivery_report(&mut link, report).await?,
                _ => break,
            }
        }
        link.reoffer_due = false;
        self.reoffer_all(&mut link).await?;
        self.offer_windows(&mut link).await?;
        self.send_reports(&mut link).await?;
        self.send_statuses(&mut link).await?;
        self.send_probes(&mut link).await?;
        Ok(link)
    }

    async fn serve(
        &mut self,
        link: &mut Link,
        stop: &mut std::pin::Pin<&mut impl std::future::Future<Output = ()>>,
        sampling: &mut tokio::time::Interval,
        reporting: &mut tokio::time::Interval,
    ) -> Result<()> {
        loop {
            // Messages first: a lease's workload arrives right behind its
            // `lease_created`, and a report recorded in between would bill,
            // as measured, time whose delivery is still to come (seen under
            // load: a delivery the host then failed was charged).
            tokio::select! {
                biased;
                _ = stop.as_mut() => return Ok(()),
                message = link.connection.next() => self.on_message(link, message?).await?,
                // Only when no message is waiting (biased: polled after it).
                _ = std::future::ready(()), if link.reoffer_due => {
                    link.reoffer_due = false;
                    self.reoffer_all(link).await?;
                }
                Some(report) = recv_report(&mut self.delivery) => self.on_delivery_report(link, report).await?,
                Some(probe) = self.probes.1.recv() => {
                    self.probes_unsent.push(probe);
                    self.send_probes(link).await?;
                }
                _ = sampling.tick() => self.sample(link).await?,
                _ = reporting.tick() => {
                    self.record_reports()?;
                    self.send_reports(link).await?;
                    self.offer_windows(link).await?;
                    if self.clock_synced_at.is_none_or(|at| at.elapsed() >= CLOCK_SYNC_EVERY) {
                        self.sync_clock(&mut link.connection).await?;
                    }
                    if self.register_again_at.is_some_and(|at| at <= tokio::time::Instant::now()) {
                        let before = self.gpus.len();
                        self.register(&mut link.connection).await?;
                        if self.gpus.len() > before {
                            link.reoffer_due = true;
                        }
                    }
                }
            }
        }
    }

    /// Measures the exchange's clock again (a `ping`; its `pong` carries
    /// the exchange's time), so a host clock that drifts during a long
    /// session still stamps reports in the exchange's time.
    async fn sync_clock(&mut self, connection: &mut Connection) -> Result<()> {
        let sent_ms = now_ms();
        let id = connection.new_id();
        let ServerMessage::Pong { server_time_ms, .. } = connection.request(ClientMessage::Ping { id }).await? else {
            bail!("a ping answered with something else than a pong");
        };
        let offset = clock_offset(sent_ms, now_ms(), server_time_ms);
        if (offset - self.clock_offset_ms).abs() > CLOCK_DRIFT_NOTED_MS {
            tracing::info!(was_ms = self.clock_offset_ms, now_ms = offset, "this host's clock drifted from the exchange's");
        }
        self.clock_offset_ms = offset;
        self.clock_synced_at = Some(tokio::time::Instant::now());
        Ok(())
    }

    /// The leases this host serves, as the exchange knows them: followed
    /// again for usage reports after a restart, and handed to the delivery
    /// manager, which re-adopts their running workloads and removes those of
    /// leases that ended meanwhile.
    async fn resume_leases(&mut self, link: &mut Link) -> Result<()> {
        let mut after = None;
        let mut active = BTreeSet::new();
        loop {
            let id = link.connection.new_id();
            let ServerMessage::Leases { leases, next_after, .. } = link.connection.request(ClientMessage::Leases { id, after }).await?
            else {
                bail!("listing leases: unexpected answer");
            };
            for info in leases.iter().filter(|l| l.active && l.supplier == link.connection.account) {
                let mask = info
                    .gpus
                    .iter()
                    .filter_map(|gpu| self.gpus.iter().find(|g| g.info.gpu == *gpu))
                    .fold(0u64, |m, g| m | 1u64 << g.info.index_on_host);
                if mask == 0 {
                    continue; // another host of this account
                }
                active.insert(info.lease);
                self.leases.entry(info.lease).or_insert(LeaseState {
                    kind: info.kind,
                    gpu_mask: mask,
                    start_ms: info.start_ms,
                    end_ms: info.end_ms,
                    ended: false,
                    billing: Billing::AsMeasured,
                });
            }
            match next_after {
                Some(next) => after = Some(next),
                None => break,
            }
        }
        if let Some(firewall) = &mut self.firewall {
            let ended: Vec<LeaseId> = firewall.leases().into_iter().filter(|lease| !active.contains(lease)).collect();
            if let Err(error) = firewall.forget(&ended) {
                tracing::error!(%error, "the fabric firewall could not be updated");
            }
        }
        if let Some((orders, _)) = &self.delivery {
            let _ = orders.send(Order::Reconcile { active });
        }
        Ok(())
    }

    async fn on_delivery_report(&mut self, link: &mut Link, report: Report) -> Result<()> {
        match report {
            Report::Status { lease, state } => {
                let outcome = match &state {
                    DeliveryState::Failed { fault: gpux_protocol::Fault::Host, .. } => Some(Billing::HostFailed),
                    DeliveryState::AwaitingSecrets | DeliveryState::Pulling { .. } | DeliveryState::Starting => None,
                    _ => Some(Billing::AsMeasured),
                };
                if let (Some(outcome), Some(lease_state)) = (outcome, self.leases.get_mut(&lease)) {
                    // Once the host failed a lease, nothing makes it billable again.
                    if lease_state.billing != Billing::HostFailed {
                        lease_state.billing = outcome;
                    }
                }
                if outcome == Some(Billing::HostFailed) {
                    if let Some(mask) = self.leases.get(&lease).filter(|l| !l.ended).map(|l| l.gpu_mask) {
                        self.health.failures_in_row += 1;
                        self.health.failed_leases.insert(lease, mask);
                        self.fail_delivery(link, mask).await?;
                    }
                }
                if matches!(state, DeliveryState::Running { .. }) {
                    self.health.failures_in_row = 0;
                }
                self.statuses_unsent.insert(lease, state);
                self.send_statuses(link).await?;
            }
            Report::Logs { request, data, truncated } => {
                let id = link.connection.new_id();
                link.connection.request(ClientMessage::Logs { id, request, data, truncated }).await?;
            }
            Report::Exec { request, outcome } => {
                let id = link.connection.new_id();
                link.connection.request(ClientMessage::ExecDone { id, request, outcome }).await?;
            }
            Report::Removing { lease, gpus } => {
                let mask = self.gpus.iter().filter(|g| gpus.contains(&g.info.uuid)).fold(0u64, |m, g| m | 1u64 << g.info.index_on_host);
                *self.releasing.entry(lease).or_default() |= mask;
            }
            Report::Released { lease } => {
                if self.releasing.remove(&lease).is_some() {
                    link.reoffer_due = true;
                }
            }
            Report::Unadopted { leases } => {
                if !link.reconciled {
                    link.reconciled = true;
                    link.reoffer_due = true;
                }
                for lease in leases {
                    let id = link.connection.new_id();
                    if let ServerMessage::LeaseDelivery { workload: Some(workload), .. } =
                        link.connection.request(ClientMessage::LeaseDelivery { id, lease }).await?
                    {
                        self.deliver(lease, Some(workload));
                    }
                }
            }
        }
        Ok(())
    }

    /// Signs and sends the interconnect probes that wait; each is
    /// acknowledged durable (or refused, and dropped: a probe for an attempt
    /// that already ended).
    async fn send_probes(&mut self, link: &mut Link) -> Result<()> {
        while let Some(body) = self.probes_unsent.first().cloned() {
            let id = link.connection.new_id();
            let (lease, mbps) = (body.lease, body.bus_mbps());
            let report = Box::new(gpux_protocol::FabricProbeReport::sign(body, &self.key));
            match link.connection.request(ClientMessage::FabricProbe { id, report }).await? {
                ServerMessage::Ack { .. } => tracing::info!(%lease, mbps, "interconnect probe sent"),
                ServerMessage::Error { code, message, .. } => tracing::warn!(%lease, ?code, %message, "interconnect probe refused"),
                other => bail!("sending an interconnect probe: {other:?}"),
            }
            self.probes_unsent.remove(0);
        }
        Ok(())
    }

    /// Starts a cluster attempt's interconnect probe on its own task when
    /// this host declared a fabric and the attempt names every member: a
    /// ring all-reduce among the members' agents while the workload is
    /// delivered (docs/agent.md "Interconnect probe"); what it measured,
    /// or that it did not complete, comes back to be signed and sent.
    fn start_probe(&self, lease: LeaseId, assignment: &gpux_protocol::JobAssignment) {
        let Some(fabric) = self.config.fabric.as_ref().filter(|f| f.probe_mib > 0) else { return };
        if assignment.nodes < 2 || assignment.peers.len() != assignment.nodes as usize {
            return;
        }
        let ring = crate::probe::Ring {
            job: assignment.job.0,
            attempt: assignment.attempt,
            rank: assignment.node_rank,
            members: assignment.peers.clone(),
            bytes: fabric.probe_mib as u64 * (1 << 20),
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

    /// Sends the delivery statuses that wait; each is acknowledged durable.
    async fn send_statuses(&mut self, link: &mut Link) -> Result<()> {
        while let Some((&lease, state)) = self.statuses_unsent.iter().next() {
            let id = link.connection.new_id();
            let message = ClientMessage::DeliveryStatus { id, lease, state: state.clone() };
            match link.connection.request(message).await? {
                ServerMessage::Ack { .. } => {}
                ServerMessage::Error { code, message, .. } => tracing::warn!(%lease, ?code, %message, "delivery status refused"),
                other => bail!("sending a delivery status: {other:?}"),
            }
            self.statuses_unsent.remove(&lease);
        }
        Ok(())
    }

    /// Hands a lease's workload (or, for the hook, the lease itself) to the delivery manager.
    fn deliver(&mut self, lease: LeaseId, workload: Option<Box<gpux_protocol::Workload>>) {
        let (Some((orders, _)), Some(state)) = (&self.delivery, self.leases.get_mut(&lease)) else { return };
        if state.billing == Billing::AsMeasured {
            state.billing = Billing::DeliveryPending;
        }
        let gpus = leased_gpus(&self.gpus, state.gpu_mask);
        // Lease times are the exchange's; the manager waits on this host's clock.
        let start_ms = state.start_ms.saturating_add_signed(-self.clock_offset_ms);
        let _ = orders.send(Order::Deliver { lease, gpus, workload, start_ms, end_ms: state.end_ms });
    }

    /// A job's attempt on one of this host's leases: the token for the
    /// job's files came with it (an exchange that sent none is asked), then
    /// the manager fetches them and runs it.
    async fn deliver_job(
        &mut self,
        link: &mut Link,
        lease: LeaseId,
        assignment: gpux_protocol::JobAssignment,
        store: Option<gpux_protocol::jobs::StoreGrant>,
    ) -> Result<()> {
        let (Some((orders, _)), Some(state)) = (&self.delivery, self.leases.get_mut(&lease)) else {
            // The supplier's other hosts share its account and its pushes.
            tracing::debug!(%lease, job = %assignment.job, "a job for a lease on another host");
            return Ok(());
        };
        if state.billing == Billing::AsMeasured {
            state.billing = Billing::DeliveryPending;
        }
        let gpus = leased_gpus(&self.gpus, state.gpu_mask);
        let start_ms = state.start_ms.saturating_add_signed(-self.clock_offset_ms);
        let end_ms = state.end_ms;
        let orders = orders.clone();
        let asked = match store {
            Some(grant) => ServerMessage::JobStoreToken { id: 0, url: grant.url, token: grant.token, expires_at_ms: grant.expires_at_ms },
            None => {
                let id = link.connection.new_id();
                link.connection.request(ClientMessage::JobStoreToken { id, job: None, lease: Some(lease) }).await?
            }
        };
        let (store_url, token) = match asked {
            ServerMessage::JobStoreToken { url, token, .. } => (url, token),
            other => {
                tracing::warn!(%lease, ?other, "no job store token: the job cannot be delivered");
                let state = DeliveryState::Failed {
                    code: FailureCode::HostError,
                    fault: gpux_protocol::Fault::Host,
                    reason: FailureCode::HostError.describe().to_string(),
                };
                self.statuses_unsent.insert(lease, state);
                return Ok(());
            }
        };
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
        let _ = orders.send(Order::DeliverJob { lease, gpus, files: Box::new(files), start_ms, end_ms });
        Ok(())
    }

    /// Registers every GPU the exchange does not know yet, then loads the
    /// host's GPUs as the exchange sees them.
    async fn register(&mut self, connection: &mut Connection) -> Result<()> {
        let inventory = self.backend.inventory()?;
        let known = my_gpus(connection).await?;
        self.register_again_at = None;
        for gpu in &inventory {
            if known.iter().any(|k| k.uuid == gpu.uuid) {
                continue;
            }
            let id = connection.new_id();
            let request = ClientMessage::RegisterGpu {
                id,
                host: self.config.host.clone(),
                gpu_uuid: gpu.uuid.clone(),
                spec: gpu.spec.clone(),
                region: self.config.region.clone(),
                zone: self.config.zone.clone(),
                fabric: self.config.fabric.as_ref().map(|f| f.claim()),
            };
            let answer = connection.request(request).await?;
            self.registered(gpu, answer)?;
        }
        let on_host: BTreeSet<&str> = inventory.iter().map(|g| g.uuid.as_str()).collect();
        let registered: Vec<gpux_protocol::views::Gpu> = my_gpus(connection)
            .await?
            .into_iter()
            .filter(|info| info.host_name == self.config.host && on_host.contains(info.uuid.as_str()))
            .collect();
        self.check_region(registered.first())?;
        for info in registered {
            match self.gpus.iter_mut().find(|g| g.info.uuid == info.uuid) {
                Some(gpu) => gpu.info = info,
                None => self.gpus.push(HostGpu {
                    healthy: info.online,
                    delivery_failed: false,
                    info,
                    window: Window::default(),
                    unhealthy_since: None,
                }),
            }
        }
        Ok(())
    }

    /// What the exchange answered to registering `gpu`: a GPU it refuses is
    /// logged and left unoffered; a region it refuses stops the agent.
    fn registered(&mut self, gpu: &crate::backend::GpuInventory, answer: ServerMessage) -> Result<()> {
        match answer {
            ServerMessage::Ack { .. } => tracing::info!(uuid = %gpu.uuid, model = %gpu.spec.model, "registered"),
            ServerMessage::Reject { code: RejectCode::GpuNotQualified, .. } => {
                tracing::warn!(uuid = %gpu.uuid, model = %gpu.spec.model, "meets no listed class; not offered")
            }
            ServerMessage::Reject { code: RejectCode::GpusAwaitingChallenge, .. } => {
                tracing::warn!(
                    uuid = %gpu.uuid,
                    "not registered yet: this account's GPUs that have not passed a hardware challenge are at their limit; trying again in a minute"
                );
                self.register_again_at = Some(tokio::time::Instant::now() + REGISTER_AGAIN_AFTER);
            }
            ServerMessage::Reject { code: RejectCode::TooManyGpus, .. } => {
                tracing::warn!(uuid = %gpu.uuid, "not registered: this account holds its share of the exchange's GPUs; not offered")
            }
            ServerMessage::Reject { code: RejectCode::UnknownRegion, .. } => {
                let region = self.config.region.as_deref().unwrap_or_default();
                return Err(Fatal(format!("region {region:?} is not one the exchange lists (gpux listing shows its regions)")).into());
            }
            ServerMessage::Reject { code: RejectCode::RegionMismatch, .. } => {
                let host = &self.config.host;
                return Err(Fatal(format!(
                    "host {host:?} is registered in another region; a host keeps its region (set region back, or register the moved machine under a new host name)"
                ))
                .into());
            }
            other => return Err(Fatal(format!("registering {}: {other:?}", gpu.uuid)).into()),
        }
        Ok(())
    }

    /// A host keeps the region its GPUs were registered in.
    fn check_region(&self, first: Option<&gpux_protocol::views::Gpu>) -> Result<()> {
        if let (Some(wanted), Some(info)) = (&self.config.region, first) {
            match &info.region {
                Some(region) if region != wanted => {
                    let host = &self.config.host;
                    return Err(Fatal(format!(
                        "host {host:?} is registered in region {region:?}, not {wanted:?}; a host keeps its region (set region back, or register the moved machine under a new host name)"
                    ))
                    .into());
                }
                Some(_) => {}
                None => tracing::warn!(
                    region = %wanted,
                    "this host registered its GPUs before it declared a region and stays in none (bids that require a region pass it by); register it under a new host name to declare one"
                ),
            }
        }
        Ok(())
    }

    /// The classes this host's GPUs are offered in: each GPU in its own
    /// (the first it qualifies for), so a host with mixed models or MIG
    /// profiles sells each kind in its own book.
    fn classes(&self) -> Vec<String> {
        let mut classes: Vec<String> = Vec::new();
        for class in self.gpus.iter().filter_map(|g| g.info.classes.first()) {
            if !classes.contains(class) {
                classes.push(class.clone());
            }
        }
        classes
    }

    /// The GPUs offered in `class`, as a mask over the host.
    fn class_mask(&self, class: &str) -> u64 {
        self.gpus
            .iter()
            .filter(|g| g.info.classes.first().is_some_and(|c| c == class))
            .fold(0u64, |m, g| m | (1u64 << g.info.index_on_host))
    }

    /// The spot and preemptible instruments of each class these GPUs are offered in.
    async fn instruments(&self, connection: &mut Connection) -> Result<BTreeMap<(String, OfferedContract), (InstrumentId, u64)>> {
        let classes = self.classes();
        if classes.is_empty() {
            bail!("no qualified GPU");
        }
        let id = connection.new_id();
        let ServerMessage::Instruments { instruments, .. } = connection.request(ClientMessage::Instruments { id }).await? else {
            bail!("the exchange did not list its instruments");
        };
        let mut found = BTreeMap::new();
        for class in &classes {
            for offer in self.config.offers.iter().filter(|o| !o.contract.is_window()) {
                let suffix = match offer.contract {
                    OfferedContract::Spot => "SPOT",
                    _ => "PREEMPT",
                };
                let symbol = format!("{class}/{suffix}");
                match instruments.iter().find(|i| i.symbol == symbol) {
                    Some(instrument) => {
                        found.insert((class.clone(), offer.contract), (instrument.instrument, instrument.tick_minor));
                    }
                    None => tracing::warn!(%symbol, "the exchange lists no such instrument: these GPUs are not offered there"),
                }
            }
        }
        Ok(found)
    }

    /// GPUs that can be sold now in a contract kind, as a mask over the host.
    fn free_mask(&self, contract: OfferedContract) -> u64 {
        if !self.config.available_at(now_ms()) {
            return 0;
        }
        let busy = self
            .leases
            .values()
            .filter(|lease| !lease.ended && (contract == OfferedContract::Preemptible || lease.kind != LeaseKind::Preemptible))
            .fold(0u64, |mask, lease| mask | lease.gpu_mask);
        let releasing = self.releasing.values().fold(0u64, |mask, m| mask | m);
        self.gpus.iter().filter(|g| g.healthy).fold(0u64, |mask, g| mask | (1u64 << g.info.index_on_host)) & !busy & !releasing
    }

    /// GPUs of one class that can be sold now in a contract kind.
    fn free_mask_in(&self, class: &str, contract: OfferedContract) -> u64 {
        self.free_mask(contract) & self.class_mask(class)
    }

    async fn reoffer_all(&mut self, link: &mut Link) -> Result<()> {
        for key in link.instruments.keys().cloned().collect::<Vec<_>>() {
            self.reoffer(link, key).await?;
        }
        Ok(())
    }

    /// Replaces the ask of one class and contract with one over the GPUs free now.
    async fn reoffer(&mut self, link: &mut Link, key: (String, OfferedContract)) -> Result<()> {
        if let Some(order) = link.asks.remove(&key) {
            let id = link.connection.new_id();
            link.connection.request(ClientMessage::CancelOrder { id, order }).await?;
        }
        let (class, contract) = (&key.0, key.1);
        let mask = if link.reconciled { self.free_mask_in(class, contract) } else { 0 };
        let (Some(&(instrument, tick_minor)), Some(offer)) =
            (link.instruments.get(&key), self.config.offers.iter().find(|o| o.contract == contract))
        else {
            return Ok(());
        };
        if mask == 0 {
            return Ok(());
        }
        let price = offer.price_floor_minor_per_gpu_hour.div_ceil(tick_minor) * tick_minor;
        let client_order_id = self.client_order_id(link.host);
        let mut order = OrderTicket::limit(client_order_id, instrument, Side::Sell, price, mask.count_ones());
        order.supply = Some(GpuSet { host: link.host, gpu_mask: mask });
        let id = link.connection.new_id();
        match link.connection.request(ClientMessage::NewOrder { id, order, workload: None }).await? {
            ServerMessage::Ack { order: Some(order), .. } => {
                tracing::info!(%class, ?contract, gpus = mask.count_ones(), price, "offered");
                link.asks.insert(key, order);
            }
            // A GPU can be busy in a way the agent has not heard of yet (a
            // window delivery); the next event or sample offers again.
            ServerMessage::Reject { code, .. } => tracing::warn!(%class, ?contract, ?code, "offer refused"),
            other => bail!("offering: {other:?}"),
        }
        Ok(())
    }

    /// Keeps an ask in each of the next tradable reserved windows the owner
    /// offers in, over the healthy GPUs not sold in that window and not held
    /// by a running lease that could reach into it.
    async fn offer_windows(&mut self, link: &mut Link) -> Result<()> {
        let offers: Vec<_> = self.config.offers.iter().filter(|o| o.contract.is_window()).cloned().collect();
        if offers.is_empty() || !link.reconciled {
            return Ok(());
        }
        let id = link.connection.new_id();
        let ServerMessage::Instruments { instruments, .. } = link.connection.request(ClientMessage::Instruments { id }).await? else {
            bail!("the exchange did not list its instruments");
        };
        for (class, offer) in self.classes().into_iter().flat_map(|class| offers.iter().map(move |offer| (class.clone(), offer.clone()))) {
            let Some(label) = offer.contract.window_label() else { continue };
            let mut windows: Vec<(u64, u64, InstrumentId, u64)> = instruments
                .iter()
                .filter(|i| i.class == class && i.symbol.ends_with(label) && i.state == gpux_engine::InstrumentState::Trading)
                .filter_map(|i| match i.contract {
                    gpux_engine::ContractKind::Reserved { window_start_ms, window_end_ms } => {
                        Some((window_start_ms, window_end_ms, i.instrument, i.tick_minor))
                    }
                    _ => None,
                })
                .collect();
            windows.sort();
            let in_class = self.class_mask(&class);
            for (window_start_ms, window_end_ms, instrument, tick_minor) in windows.into_iter().take(offer.windows_ahead as usize) {
                if link.window_asks.contains_key(&instrument)
                    || link.windows_refused.contains(&instrument)
                    || !self.config.available_throughout(window_start_ms, window_end_ms)
                {
                    continue;
                }
                let reaching = self
                    .leases
                    .values()
                    .filter(|l| !l.ended && l.kind != LeaseKind::Preemptible && l.end_ms.is_none_or(|end| end > window_start_ms))
                    .fold(0u64, |mask, l| mask | l.gpu_mask);
                let sold = self.windows_sold.get(&instrument).copied().unwrap_or(0);
                let mask = self.gpus.iter().filter(|g| g.healthy).fold(0u64, |m, g| m | (1u64 << g.info.index_on_host))
                    & !reaching
                    & !sold
                    & in_class;
                if mask == 0 {
                    continue;
                }
                let price = offer.price_floor_minor_per_gpu_hour.div_ceil(tick_minor) * tick_minor;
                let client_order_id = self.client_order_id(link.host);
                let mut order = OrderTicket::limit(client_order_id, instrument, Side::Sell, price, mask.count_ones());
                order.supply = Some(GpuSet { host: link.host, gpu_mask: mask });
                let id = link.connection.new_id();
                match link.connection.request(ClientMessage::NewOrder { id, order, workload: None }).await? {
                    ServerMessage::Ack { order: Some(order), .. } => {
                        tracing::info!(%instrument, gpus = mask.count_ones(), price, "offered in a reserved window");
                        link.window_asks.insert(instrument, order);
                    }
                    ServerMessage::Reject { code, .. } => {
                        tracing::debug!(%instrument, ?code, "window not offered");
                        link.windows_refused.insert(instrument);
                    }
                    other => bail!("offering a window: {other:?}"),
                }
            }
        }
        Ok(())
    }

    /// Reads the GPUs; returns those whose health changed.
    fn sample_only(&mut self) -> Result<Vec<(gpux_engine::GpuId, bool)>> {
        let samples = self.backend.sample(now_ms())?;
        let leased = self.leases.values().filter(|l| !l.ended).fold(0u64, |mask, l| mask | l.gpu_mask);
        let mut changed = Vec::new();
        for mut sample in samples {
            let Some(gpu) = self.gpus.iter_mut().find(|g| g.info.uuid == sample.uuid) else { continue };
            // A GPU running the owner's own work while nobody leases it is
            // taken locally: not for sale until it is free again.
            if sample.processes > 0 && leased & (1u64 << gpu.info.index_on_host) == 0 {
                sample.healthy = false;
            }
            if gpu.delivery_failed {
                sample.healthy = false;
            }
            gpu.window.samples += 1;
            gpu.window.unhealthy += u32::from(!sample.healthy);
            gpu.window.utilisation_sum += sample.utilisation_percent as u64;
            gpu.window.memory_used_mib_max = gpu.window.memory_used_mib_max.max(sample.memory_used_mib);
            if let Some(temperature) = sample.temperature_c {
                gpu.window.temperature_c_max = Some(gpu.window.temperature_c_max.map_or(temperature, |max| max.max(temperature)));
            }
            if let Some(power) = sample.power_mw {
                gpu.window.power_mw_sum += power as u64;
                gpu.window.power_samples += 1;
            }
            // Lost when the GPU itself reads unhealthy (not when the agent
            // holds it back after a failed delivery).
            gpu.unhealthy_since = match (sample.healthy || gpu.delivery_failed, gpu.unhealthy_since) {
                (true, _) => None,
                (false, since) => since.or(Some(now_ms())),
            };
            if gpu.healthy != sample.healthy {
                gpu.healthy = sample.healthy;
                tracing::warn!(uuid = %sample.uuid, healthy = sample.healthy, "GPU health changed");
                changed.push((gpu.info.gpu, sample.healthy));
            }
        }
        Ok(changed)
    }

    async fn sample(&mut self, link: &mut Link) -> Result<()> {
        self.check_health().await;
        self.fail_leases_of_lost_gpus(link).await?;
        let available = self.config.available_at(now_ms());
        let availability_changed = link.available != Some(available);
        link.available = Some(available);
        let changed = self.sample_only()?;
        for &(gpu, online) in &changed {
            let id = link.connection.new_id();
            link.connection.request(ClientMessage::SetGpuOnline { id, gpu, online }).await?;
        }
        if !changed.is_empty() || availability_changed {
            self.reoffer_all(link).await?;
        }
        Ok(())
    }

    /// Signs a report per leased GPU for the time since its last report.
    fn record_reports(&mut self) -> Result<()> {
        // Intervals are stated in the exchange's time, which leases are in too.
        let now = now_ms().saturating_add_signed(self.clock_offset_ms);
        // Time before this process began measuring was measured by nobody
        // (the agent was down): it is reported, but never as available.
        let measured_from = self.measuring_since_ms.map_or(u64::MAX, |ms| ms.saturating_add_signed(self.clock_offset_ms));
        let mut finished = Vec::new();
        for (&lease, state) in &self.leases {
            if state.billing == Billing::DeliveryPending && !state.ended {
                continue;
            }
            // An ended lease is reported up to its end as the exchange
            // stamped it, whatever this host's clock says: its chains are
            // closed right after, so a last interval cut short by a clock a
            // few ms behind would be followed by a new chain from the lease's
            // start (refused `replayed`; seen on an H200 host).
            let until = match state.end_ms {
                Some(end) if state.ended => end,
                Some(end) => end.min(now),
                None => now,
            };
            let mut done = state.ended;
            for gpu in self.gpus.iter_mut().filter(|g| state.gpu_mask & (1u64 << g.info.index_on_host) != 0) {
                let start = self.reports.next_start_ms(lease, &gpu.info.uuid, state.start_ms);
                if until <= start {
                    continue;
                }
                let window = std::mem::take(&mut gpu.window);
                let measured = until - start.max(measured_from).min(until);
                let available_ms = match window.samples {
                    _ if state.billing == Billing::HostFailed => 0,
                    0 if gpu.healthy => measured,
                    0 => 0,
                    samples => measured * (samples - window.unhealthy) as u64 / samples as u64,
                };
                let interval = Interval {
                    start_ms: start,
                    end_ms: until,
                    available_ms,
                    utilisation_percent: window.utilisation_sum.checked_div(window.samples as u64).unwrap_or(0) as u32,
                    memory_used_mib_max: window.memory_used_mib_max,
                    unhealthy_samples: window.unhealthy,
                    temperature_c_max: window.temperature_c_max,
                    power_w_mean: window.power_mw_sum.checked_div(window.power_samples as u64).map(|mw| (mw / 1_000) as u32),
                };
                self.reports.record(lease, &gpu.info.uuid, interval, &self.key)?;
                done &= state.end_ms.is_some_and(|end| until >= end);
            }
            if done {
                finished.push(lease);
            }
        }
        for lease in finished {
            self.leases.remove(&lease);
        }
        Ok(())
    }

    /// Sends queued reports in order until the queue is empty.
    async fn send_reports(&mut self, link: &mut Link) -> Result<()> {
        while let Some(report) = self.reports.front().cloned() {
            let id = link.connection.new_id();
            match link.connection.request(ClientMessage::UsageReport { id, report: report.clone() }).await? {
                ServerMessage::UsageAccepted { .. } => {}
                ServerMessage::UsageRejected { code, message, .. } => {
                    tracing::error!(lease = %report.body.lease, seq = report.body.seq, ?code, %message, "usage report refused")
                }
                other => bail!("sending a usage report: {other:?}"),
            }
            self.reports.acknowledge_front()?;
        }
        Ok(())
    }

    async fn on_message(&mut self, link: &mut Link, message: ServerMessage) -> Result<()> {
        let event = match message {
            ServerMessage::Private { event, .. } => event,
            ServerMessage::Workload { lease, workload } => {
                self.deliver(lease, Some(workload));
                return Ok(());
            }
            ServerMessage::JobAssigned { lease, assignment, store } => {
                self.deliver_job(link, lease, *assignment, store).await?;
                return Ok(());
            }
            ServerMessage::GpuChallenge { challenge, gpu, seed, n, .. } => {
                self.answer_challenge(link, challenge, gpu, &seed, n).await?;
                return Ok(());
            }
            ServerMessage::GpuMemoryChallenge { challenge, gpu, seed, words_log2, passes, .. } => {
                self.answer_memory_challenge(link, challenge, gpu, &seed, words_log2, passes).await?;
                return Ok(());
            }
            ServerMessage::LogsWanted { request, lease, tail_bytes } => {
                // Only the agent that runs (or ran) the lease answers: the
                // exchange may ask every agent of the account.
                if let Some((orders, _)) = &self.delivery {
                    let _ = orders.send(Order::Logs { request, lease, tail_bytes });
                }
                return Ok(());
            }
            ServerMessage::ExecWanted { request, lease, command, timeout_ms } => {
                if let Some((orders, _)) = &self.delivery {
                    let _ = orders.send(Order::Exec { request, lease, command, timeout_ms });
                }
                return Ok(());
            }
            _ => return Ok(()),
        };
        let reoffer = self.on_event(link, event).await?;
        // Offered again once the events that came with this one are read:
        // a fill's `lease_created` comes before its ask's `order_closed`,
        // and cancelling the ask in between would be refused
        // (`unknown_order`, journaled).
        link.reoffer_due |= reoffer;
        Ok(())
    }

    /// One of the account's events; whether the host's asks are to be
    /// offered again.
    async fn on_event(&mut self, link: &mut Link, event: Event) -> Result<bool> {
        let Event { kind, at_ms, .. } = event;
        let reoffer = match kind {
            EventKind::LeaseCreated { lease, kind, host, gpu_mask, start_ms, end_ms, .. } if host == link.host => {
                self.leases.insert(lease, LeaseState { kind, gpu_mask, start_ms, end_ms, ended: false, billing: Billing::AsMeasured });
                // Samples taken before the lease say nothing about it.
                for gpu in self.gpus.iter_mut().filter(|g| gpu_mask & (1u64 << g.info.index_on_host) != 0) {
                    gpu.window = Window::default();
                }
                self.log_lease_event("start", lease, gpu_mask, end_ms);
                if self.runs_without_workload() {
                    self.deliver(lease, None);
                }
                // An exclusive lease also takes the GPUs out of the preemptible ask.
                kind != LeaseKind::Preemptible
            }
            EventKind::PreemptionNotice { lease, ends_at_ms } => {
                if let Some(state) = self.leases.get(&lease).copied() {
                    // SIGTERM now; the lease ends at the deadline whatever the workload does.
                    self.log_lease_event("preempt", lease, state.gpu_mask, Some(ends_at_ms));
                    if let Some((orders, _)) = &self.delivery {
                        let _ = orders.send(Order::Preempt { lease, deadline_ms: ends_at_ms.saturating_add_signed(-self.clock_offset_ms) });
                    }
                }
                false
            }
            EventKind::LeaseEnded { lease, .. } => self.lease_ended(link, lease, at_ms).await?,
            EventKind::OrderClosed { order, .. } => {
                link.window_asks.retain(|_, ask| *ask != order);
                let closed: Vec<(String, OfferedContract)> =
                    link.asks.iter().filter(|(_, o)| **o == order).map(|(c, _)| c.clone()).collect();
                for contract in &closed {
                    link.asks.remove(contract);
                }
                !closed.is_empty()
            }
            EventKind::FabricProbed { lease, claimed_gbps, mbps, borne_out, .. } if self.leases.contains_key(&lease) => {
                match borne_out {
                    true => tracing::info!(%lease, claimed_gbps, mbps, "interconnect probe recorded: bears the fabric claim out"),
                    false => tracing::warn!(%lease, claimed_gbps, mbps, "interconnect probe recorded: does NOT bear the fabric claim out"),
                }
                false
            }
            EventKind::GpuChallenged { gpu, outcome, mflops: rate, verified, .. } => {
                self.challenge_decided(link, gpu, "compute", outcome, rate, verified).await?
            }
            EventKind::GpuMemoryChallenged { gpu, outcome, mbps: rate, verified, .. } => {
                self.challenge_decided(link, gpu, "memory", outcome, rate, verified).await?
            }
            EventKind::ContractCreated { instrument, supplier, gpu, .. } if supplier == link.connection.account => {
                if let Some(sold) = self.gpus.iter().find(|g| g.info.gpu == gpu) {
                    *self.windows_sold.entry(instrument).or_default() |= 1u64 << sold.info.index_on_host;
                }
                false
            }
            _ => false,
        };
        Ok(reoffer)
    }

    /// A lease of this host ended at `at_ms`: its workload is stopped, its
    /// reports sent up to the end and its chains forgotten; whether the
    /// host's asks are to be offered again.
    async fn lease_ended(&mut self, link: &mut Link, lease: LeaseId, at_ms: u64) -> Result<bool> {
        let Some(state) = self.leases.get_mut(&lease) else { return Ok(false) };
        if let Some(firewall) = &mut self.firewall {
            if let Err(error) = firewall.forget(&[lease]) {
                tracing::error!(%lease, %error, "the fabric firewall could not be updated");
            }
        }
        // Report up to the actual end, then forget the lease.
        state.end_ms = Some(at_ms);
        state.ended = true;
        let mask = state.gpu_mask;
        self.log_lease_event("end", lease, mask, Some(at_ms));
        if let Some((orders, _)) = &self.delivery {
            // Its GPUs are offered again once the workload is confirmed gone.
            self.releasing.insert(lease, mask);
            let _ = orders.send(Order::End { lease });
        }
        if self.health.failed_leases.remove(&lease).is_some() {
            // GPUs the host failed on come back only through the health check.
            let first = self.health_backoff() * 2u32.saturating_pow(self.health.failures_in_row.saturating_sub(1).min(12));
            self.health.wait = first.min(HEALTH_BACKOFF_MAX);
            self.health.check_at = Some(tokio::time::Instant::now() + self.health.wait);
            tracing::warn!(%lease, failures_in_row = self.health.failures_in_row, check_in_ms = self.health.wait.as_millis() as u64, "the host failed this lease's delivery: its GPUs stay off sale until a health check passes");
        }
        self.record_reports()?;
        self.send_reports(link).await?;
        self.reports.close_lease(lease)?;
        self.leases.remove(&lease);
        Ok(true)
    }

    /// A hardware challenge of one of the host's GPUs was decided: the GPUs'
    /// classes as the exchange has them now; whether they changed (the asks
    /// are then offered again).
    async fn challenge_decided(
        &mut self,
        link: &mut Link,
        gpu: gpux_engine::GpuId,
        kind: &str,
        outcome: gpux_engine::ChallengeOutcome,
        rate: u64,
        verified: bool,
    ) -> Result<bool> {
        let uuid = self.gpus.iter().find(|g| g.info.gpu == gpu).map(|g| g.info.uuid.clone()).unwrap_or_default();
        let classes_before: Vec<Vec<String>> = self.gpus.iter().map(|g| g.info.classes.clone()).collect();
        for info in my_gpus(&mut link.connection).await? {
            if let Some(known) = self.gpus.iter_mut().find(|g| g.info.uuid == info.uuid) {
                known.info = info;
            }
        }
        match outcome {
            gpux_engine::ChallengeOutcome::Passed => tracing::info!(%uuid, kind, rate, verified, "hardware challenge passed"),
            other => tracing::warn!(%uuid, kind, outcome = ?other, rate, "hardware challenge not passed"),
        }
        Ok(classes_before != self.gpus.iter().map(|g| g.info.classes.clone()).collect::<Vec<_>>())
    }

    /// Answers a hardware challenge (docs/agent.md "Hardware challenges"):
    /// the backend computes the product and commits to it by a Merkle root,
    /// the agent sends the root, then opens the leaves the exchange names.
    /// A challenge it cannot answer is left to expire (the exchange records
    /// it unanswered).
    async fn answer_challenge(&mut self, link: &mut Link, challenge: u64, gpu: gpux_engine::GpuId, seed: &str, n: u32) -> Result<()> {
        let Some((uuid, seed)) = self.challenged(challenge, gpu, seed) else { return Ok(()) };
        let started = std::time::Instant::now();
        let proof = match self.backend.challenge(&uuid, &seed, n) {
            Ok(proof) => proof,
            Err(error) => {
                tracing::warn!(challenge, %uuid, %error, "could not compute the challenge");
                return Ok(());
            }
        };
        let computed_ms = started.elapsed().as_millis() as u64;
        if Self::commit_and_open(link, challenge, &uuid, proof, false).await? {
            tracing::info!(challenge, %uuid, n, computed_ms, "hardware challenge answered");
        }
        Ok(())
    }

    /// Answers a memory-bandwidth challenge as [`Agent::answer_challenge`]
    /// does the compute one: the backend runs the passes and commits to the
    /// buffer's Merkle root, then opens the leaves the exchange names.
    async fn answer_memory_challenge(
        &mut self,
        link: &mut Link,
        challenge: u64,
        gpu: gpux_engine::GpuId,
        seed: &str,
        words_log2: u32,
        passes: u32,
    ) -> Result<()> {
        let Some((uuid, seed)) = self.challenged(challenge, gpu, seed) else { return Ok(()) };
        let started = std::time::Instant::now();
        let proof = match self.backend.memory_challenge(&uuid, &seed, words_log2, passes) {
            Ok(proof) => proof,
            Err(error) => {
                tracing::warn!(challenge, %uuid, %error, "could not run the memory challenge");
                return Ok(());
            }
        };
        let computed_ms = started.elapsed().as_millis() as u64;
        if Self::commit_and_open(link, challenge, &uuid, proof, true).await? {
            tracing::info!(challenge, %uuid, words_log2, passes, computed_ms, "memory challenge answered");
        }
        Ok(())
    }

    /// The challenged GPU's UUID and the challenge's seed; `None` (logged)
    /// for a GPU not on this host or a malformed seed.
    fn challenged(&self, challenge: u64, gpu: gpux_engine::GpuId, seed: &str) -> Option<(String, [u8; 32])> {
        let Some(uuid) = self.gpus.iter().find(|g| g.info.gpu == gpu).map(|g| g.info.uuid.clone()) else {
            // The supplier's other hosts share its account and its pushes.
            tracing::debug!(challenge, ?gpu, "challenge for a GPU on another host");
            return None;
        };
        let Some(seed) = hex::decode(seed).ok().and_then(|bytes| <[u8; 32]>::try_from(bytes).ok()) else {
            tracing::warn!(challenge, "challenge with a malformed seed");
            return None;
        };
        Some((uuid, seed))
    }

    /// Sends a computed challenge's root, then opens the leaves the
    /// exchange names (`challenge_opening`, or `memory_opening` for a
    /// memory challenge). Whether the exchange took the opening (refusals
    /// are logged).
    async fn commit_and_open(
        link: &mut Link,
        challenge: u64,
        uuid: &str,
        mut proof: Box<dyn crate::backend::MerkleProof>,
        memory: bool,
    ) -> Result<bool> {
        let id = link.connection.new_id();
        let commit = ClientMessage::ChallengeCommit { id, challenge, commitment: hex::encode(proof.root()) };
        let asked = match link.connection.request(commit).await? {
            ServerMessage::ChallengeRows { rows, .. } => rows,
            other => {
                tracing::warn!(challenge, ?other, "challenge commitment refused");
                return Ok(false);
            }
        };
        let leaves = match proof.open(&asked) {
            Ok(opened) => opened,
            Err(error) => {
                tracing::warn!(challenge, %uuid, %error, "could not open the challenge's leaves");
                return Ok(false);
            }
        };
        let id = link.connection.new_id();
        let opening = if memory {
            ClientMessage::MemoryOpening { id, challenge, leaves }
        } else {
            ClientMessage::ChallengeOpening { id, challenge, leaves }
        };
        match link.connection.request(opening).await? {
            ServerMessage::Ack { .. } => Ok(true),
            other => {
                tracing::warn!(challenge, ?other, "challenge opening refused");
                Ok(false)
            }
        }
    }

    /// The hook could not hand the GPUs over: they count as unavailable until
    /// the lease ends, so the exchange takes them off the books and the usage
    /// reports carry no available time (the renter is not billed for them).
    async fn fail_delivery(&mut self, link: &mut Link, mask: u64) -> Result<()> {
        let mut failed = Vec::new();
        for gpu in self.gpus.iter_mut().filter(|g| mask & (1u64 << g.info.index_on_host) != 0) {
            gpu.delivery_failed = true;
            if gpu.healthy {
                gpu.healthy = false;
                failed.push(gpu.info.gpu);
            }
        }
        for gpu in failed {
            let id = link.connection.new_id();
            link.connection.request(ClientMessage::SetGpuOnline { id, gpu, online: false }).await?;
        }
        Ok(())
    }

    /// A leased GPU unhealthy for `gpu_lost_after_ms` is lost: its lease is
    /// failed on the host's side (`gpu_unavailable`), so the exchange ends
    /// it and bills nothing after (what was delivered before is paid), and
    /// a re-match bid replaces it where the renter asked for one.
    async fn fail_leases_of_lost_gpus(&mut self, link: &mut Link) -> Result<()> {
        let lost_after = self.config.gpu_lost_after_ms;
        let now = now_ms();
        let lost_mask = self
            .gpus
            .iter()
            .filter(|g| g.unhealthy_since.is_some_and(|since| now.saturating_sub(since) >= lost_after))
            .fold(0u64, |mask, g| mask | 1u64 << g.info.index_on_host);
        if lost_mask == 0 {
            return Ok(());
        }
        let lost: Vec<LeaseId> = self
            .leases
            .iter()
            .filter(|(_, l)| !l.ended && l.billing != Billing::HostFailed && l.gpu_mask & lost_mask != 0)
            .map(|(&lease, _)| lease)
            .collect();
        for lease in lost {
            let state = self.leases.get_mut(&lease).expect("listed");
            state.billing = Billing::HostFailed;
            let uuids: Vec<&str> = self
                .gpus
                .iter()
                .filter(|g| state.gpu_mask & lost_mask & (1u64 << g.info.index_on_host) != 0)
                .map(|g| g.info.uuid.as_str())
                .collect();
            let reason = format!("GPU {} unavailable for {} s", uuids.join(","), lost_after / 1_000);
            tracing::error!(%lease, %reason, "a leased GPU is lost: failing the lease on the host's side");
            let failure = crate::delivery::Failure::public(FailureCode::GpuUnavailable, reason);
            self.statuses_unsent.insert(lease, DeliveryState::Failed { code: failure.code, fault: Fault::Host, reason: failure.reason });
        }
        self.send_statuses(link).await
    }

    /// A restarted agent keeps the back-off of the one before it: when the
    /// host's public record shows host-side delivery failures in a row and
    /// the exchange has its GPUs offline, they stay off sale until a health
    /// check passes, first after the wait that count calls for.
    async fn resume_health_backoff(&mut self, connection: &mut Connection) -> Result<()> {
        if self.health.check_at.is_some() || self.delivery_health.is_none() {
            return Ok(());
        }
        let Some(host) = self.gpus.first().map(|g| g.info.host) else { return Ok(()) };
        let id = connection.new_id();
        let ServerMessage::SupplierStats { hosts, .. } =
            connection.request(ClientMessage::SupplierStats { id, supplier: connection.account }).await?
        else {
            return Ok(());
        };
        let in_row = hosts.iter().find(|h| h.host == host).map_or(0, |h| h.record.failed_deliveries_in_row);
        let offline: Vec<usize> = self.gpus.iter().enumerate().filter(|(_, g)| !g.info.online).map(|(i, _)| i).collect();
        if in_row == 0 || offline.is_empty() {
            return Ok(());
        }
        for index in offline {
            self.gpus[index].delivery_failed = true;
            self.gpus[index].healthy = false;
        }
        self.health.failures_in_row = in_row;
        self.health.wait = (self.health_backoff() * 2u32.saturating_pow(in_row.saturating_sub(1).min(12))).min(HEALTH_BACKOFF_MAX);
        self.health.check_at = Some(tokio::time::Instant::now() + self.health.wait);
        tracing::warn!(
            failures_in_row = in_row,
            check_in_ms = self.health.wait.as_millis() as u64,
            "this host failed deliveries before the restart: its offline GPUs stay off sale until a health check passes"
        );
        Ok(())
    }

    fn health_backoff(&self) -> Duration {
        Duration::from_millis(self.config.delivery.as_ref().map_or(30_000, |d| d.health_backoff_ms))
    }

    /// Once every lease the host failed has ended and the back-off passed:
    /// the delivery backend must answer (the engine is up) for the GPUs it
    /// failed on to count as healthy again; a failed check doubles the wait.
    async fn check_health(&mut self) {
        let Some(due) = self.health.check_at else { return };
        if !self.health.failed_leases.is_empty() || tokio::time::Instant::now() < due {
            return;
        }
        let outcome = match &self.delivery_health {
            Some(backend) => match tokio::time::timeout(Duration::from_secs(5), backend.health()).await {
                Ok(outcome) => outcome,
                Err(_) => Err("the health check timed out after 5 s".to_string()),
            },
            None => Ok(()),
        };
        match outcome {
            Ok(()) => {
                tracing::info!("health check passed: the GPUs the host failed on are offered again");
                self.health.check_at = None;
                for gpu in &mut self.gpus {
                    gpu.delivery_failed = false;
                }
            }
            Err(error) => {
                self.health.wait = (self.health.wait * 2).min(HEALTH_BACKOFF_MAX);
                self.health.check_at = Some(tokio::time::Instant::now() + self.health.wait);
                tracing::warn!(%error, check_in_ms = self.health.wait.as_millis() as u64, "health check failed: the GPUs stay off sale");
            }
        }
    }

    fn log_lease_event(&self, event: &str, lease: LeaseId, mask: u64, until_ms: Option<u64>) {
        let uuids: Vec<&str> =
            self.gpus.iter().filter(|g| mask & (1u64 << g.info.index_on_host) != 0).map(|g| g.info.uuid.as_str()).collect();
        let until = until_ms.map_or("-".to_string(), |ms| ms.to_string());
        tracing::info!(event, %lease, gpus = %uuids.join(","), %until, "lease event");
    }

    /// Whether this host runs renters' workloads (the `docker` or `process` backend).
    fn delivers_workloads(&self) -> bool {
        matches!(&self.config.delivery, Some(crate::config::DeliveryConfig { backend: BackendKind::Docker | BackendKind::Process, .. }))
    }

    fn runs_without_workload(&self) -> bool {
        matches!(
            (&self.config.delivery, &self.config.delivery_hook),
            (Some(crate::config::DeliveryConfig { backend: BackendKind::Hook, .. }), _) | (None, Some(_))
        )
    }
}

/// Orders to the delivery manager, and its reports.
type DeliveryLink = (tokio::sync::mpsc::UnboundedSender<Order>, tokio::sync::mpsc::UnboundedReceiver<Report>);

/// The next report of the delivery manager, or never without one.
async fn recv_report(delivery: &mut Option<DeliveryLink>) -> Option<Report> {
    match delivery {
        Some((_, reports)) => reports.recv().await,
        None => std::future::pending().await,
    }
}

/// The host's GPUs in a lease's mask, as the delivery backends take them.
fn leased_gpus(gpus: &[HostGpu], gpu_mask: u64) -> Vec<LeasedGpu> {
    gpus.iter()
        .filter(|g| gpu_mask & (1u64 << g.info.index_on_host) != 0)
        .map(|g| LeasedGpu { uuid: g.info.uuid.clone(), index_on_host: g.info.index_on_host })
        .collect()
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
fn delivery_backend(config: &AgentConfig) -> Result<Option<std::sync::Arc<dyn DeliveryBackend>>> {
    use crate::delivery::{docker::DockerBackend, hook::HookBackend, process::ProcessBackend};
    let scratch = |_: &crate::config::DeliveryConfig| state_dir(config);
    Ok(match (&config.delivery, &config.delivery_hook) {
        (None, None) => None,
        (None, Some(hook)) => Some(std::sync::Arc::new(HookBackend::new(hook.clone()))),
        (Some(delivery), hook) => match delivery.backend {
            BackendKind::Docker => Some(std::sync::Arc::new(
                DockerBackend::connect(delivery.docker.clone(), config.host.clone(), scratch(delivery))
                    .with_context(|| format!("connecting to the container engine at {}", delivery.docker.socket))?,
            )),
            BackendKind::Process => Some(std::sync::Arc::new(ProcessBackend::new(scratch(delivery), delivery.public_address.clone()))),
            BackendKind::Hook => {
                let hook = delivery.hook.clone().or_else(|| hook.clone()).context("delivery.hook is required")?;
                Some(std::sync::Arc::new(HookBackend::new(hook)))
            }
        },
    })
}

/// Every GPU the account registered, page after page.
/// Cancels the account's open asks on `host`: every page of open orders
/// first, then the cancels.
async fn withdraw_host_asks(connection: &mut Connection, host: gpux_engine::HostId) -> Result<()> {
    let mut mine = Vec::new();
    let mut after = None;
    loop {
        let id = connection.new_id();
        match connection.request(ClientMessage::OpenOrders { id, after }).await? {
            ServerMessage::Orders { orders, next_after, .. } => {
                mine.extend(orders.iter().filter(|o| o.supply.is_some_and(|set| set.host == host)).map(|o| o.order));
                match next_after {
                    Some(next) => after = Some(next),
                    None => break,
                }
            }
            other => bail!("listing open orders: {other:?}"),
        }
    }
    for order in mine {
        let id = connection.new_id();
        // An order that closed meanwhile answers unknown_order: gone either way.
        connection.request(ClientMessage::CancelOrder { id, order }).await?;
    }
    Ok(())
}

async fn my_gpus(connection: &mut Connection) -> Result<Vec<gpux_protocol::views::Gpu>> {
    let mut all = Vec::new();
    let mut offset = 0;
    loop {
        let id = connection.new_id();
        match connection.request(ClientMessage::MyGpus { id, offset }).await? {
            ServerMessage::Gpus { gpus, next_offset, .. } => {
                all.extend(gpus);
                match next_offset {
                    Some(next) => offset = next,
                    None => return Ok(all),
                }
            }
            other => bail!("listing registered GPUs: {other:?}"),
        }
    }
}

/// A random extra wait of up to `bound`, so reconnecting agents spread out.
fn jitter(bound: Duration) -> Duration {
    let mut bytes = [0u8; 8];
    let random = getrandom::fill(&mut bytes).map_or(0, |()| u64::from_le_bytes(bytes));
    Duration::from_millis(random % (bound.as_millis() as u64 + 1))
}

/// The exchange's clock minus ours, from a ping sent at `sent_ms` and its
/// pong read at `read_ms` (our clock) carrying `server_ms`: the exchange
/// stamped it about half the round trip after it was sent.
pub fn clock_offset(sent_ms: u64, read_ms: u64, server_ms: u64) -> i64 {
    let midpoint = sent_ms + read_ms.saturating_sub(sent_ms) / 2;
    server_ms as i64 - midpoint as i64
}

/// Client order ids start from the clock so that a restarted agent never
/// reuses the id of an ask still open from its previous run (it would need
/// more asks than milliseconds passed between its starts).
fn client_order_id_base() -> u64 {
    now_ms() * CLIENT_ORDER_ID_STRIDE
}

fn now_ms() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A host 20 s ahead of the exchange, 40 ms round trip: the exchange's
    /// stamp is taken as of the trip's middle.
    #[test]
    fn the_clock_offset_is_read_at_the_round_trips_middle() {
        let sent = 1_800_000_020_000;
        assert_eq!(clock_offset(sent, sent + 40, 1_800_000_000_020), -20_000);
        assert_eq!(clock_offset(sent, sent, sent + 7), 7);
        assert_eq!(clock_offset(sent, sent - 5, sent), 0, "a clock stepped back mid-trip counts no trip");
    }

    /// A lease that ended is reported to its end even when this host's
    /// clock (with the offset it measured) is behind the exchange's, and
    /// then forgotten: no second chain for it starts from its beginning.
    #[test]
    fn an_ended_lease_is_reported_to_its_end_with_a_clock_behind_the_exchanges() {
        let dir = tempfile::tempdir().expect("temp dir");
        let config = AgentConfig::parse(&format!(
            "exchange = \"ws://127.0.0.1:9\"\nhost = \"h\"\nkey_file = \"{}\"\n",
            dir.path().join("host.key").display()
        ))
        .expect("config");
        let host: crate::fake::FakeHost = serde_json::from_str(
            r#"{"gpus": [{"uuid": "GPU-a", "vendor": "nvidia", "model": "NVIDIA H100 80GB HBM3", "memory_mib": 81559, "interconnect": "nv_link"}]}"#,
        )
        .expect("host");
        let backend = Box::new(crate::fake::FakeBackend::new(host).expect("backend"));
        let mut agent = Agent::new(config, SigningKey::from_bytes(&[4; 32]), backend).expect("agent");
        agent.gpus.push(HostGpu {
            info: gpux_protocol::views::Gpu {
                gpu: gpux_engine::GpuId(0),
                uuid: "GPU-a".into(),
                host: gpux_engine::HostId(0),
                host_name: "h".into(),
                index_on_host: 0,
                owner: gpux_engine::AccountId(0),
                spec: gpux_engine::GpuSpec::h100_sxm(),
                classes: vec!["H100-SXM-80G".into()],
                online: true,
                verified: false,
                challenge: None,
                memory: None,
                region: None,
                zone: String::new(),
                fabric: None,
            },
            healthy: true,
            delivery_failed: false,
            window: Window::default(),
            unhealthy_since: None,
        });
        // The exchange ended the lease at `end`; this host's clock, offset
        // included, reads a minute earlier.
        let end = now_ms();
        agent.clock_offset_ms = -60_000;
        let lease = LeaseId(7);
        let state = LeaseState {
            kind: LeaseKind::Spot,
            gpu_mask: 1,
            start_ms: end - 600_000,
            end_ms: Some(end),
            ended: true,
            billing: Billing::AsMeasured,
        };
        agent.leases.insert(lease, state);
        agent.record_reports().expect("recorded");
        let report = agent.reports.front().expect("a report").clone();
        assert_eq!((report.body.seq, report.body.start_ms, report.body.end_ms), (1, end - 600_000, end), "up to the end");
        assert!(agent.leases.is_empty(), "the lease is done");
        agent.reports.acknowledge_front().expect("acknowledged");
        agent.reports.close_lease(lease).expect("closed");
        agent.record_reports().expect("recorded");
        assert_eq!(agent.reports.pending(), 0, "no new chain from the lease's start");
    }
}
