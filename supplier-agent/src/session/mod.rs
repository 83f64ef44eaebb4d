//! One agent against the exchange: log in with the host key, register the
//! host's GPUs (resuming those registered before), offer them, report
//! health changes and signed usage, answer hardware challenges, and deliver
//! every lease's workload or job. When the connection drops it keeps
//! sampling and recording, reconnects with exponential back-off and
//! jitter, withdraws its stale asks, offers again and sends what queued
//! meanwhile.
//!
//! This file is the loop. What the agent knows lives in types that own it:
//! `Host` (`host.rs`: GPUs, leases, windows sold), `Offers` (`offers.rs`:
//! the asks of one connection), `Reporting` (`reporting.rs`: usage reports
//! and the exchange's clock), `HostHealth` (`health.rs`: the back-off after
//! a failed delivery), `Challenges` (`challenges.rs`), `Deliveries`
//! (`deliveries.rs`: the delivery manager and what waits to be sent to the
//! exchange); `registration.rs` registers the GPUs. The message handler
//! (`on_message`) changes that state and never waits on the exchange: what
//! it calls for (asks placed again, reports, statuses, challenges answered,
//! tokens asked for) is done by `flush`, from the loop, when no message waits.

mod challenges;
mod deliveries;
mod health;
mod host;
mod offers;
mod registration;
mod reporting;
#[cfg(test)]
mod tests;

use std::collections::BTreeSet;
use std::time::Duration;

use anyhow::{bail, Result};
use ed25519_dalek::SigningKey;
use gpux_engine::{Event, EventKind, LeaseKind, Role};
use gpux_protocol::{ClientMessage, DeliveryState, ErrorCode, ServerMessage};

pub use gpux_client::Connection;

use crate::backend::GpuBackend;
use crate::config::AgentConfig;
use crate::delivery::Report;
pub use crate::limits::CLOCK_SYNC_EVERY;
use crate::limits::{BACKOFF_MAX, BACKOFF_MIN, RECONCILE_WAIT};
use crate::reports::ReportBook;
use challenges::{Asked, Challenges};
use deliveries::{Deliveries, FromDelivery, ToExchange};
use health::HostHealth;
use host::{Billing, Host, LeaseState};
use offers::{ClientOrderIds, Offers, Room};
use reporting::Reporting;

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
    /// The GPUs' vendor backend: inventory, samples, challenges.
    backend: Box<dyn GpuBackend>,
    host: Host,
    reporting: Reporting,
    deliveries: Deliveries,
    health: HostHealth,
    challenges: Challenges,
    order_ids: ClientOrderIds,
    /// GPUs the exchange would not register yet (`gpus_awaiting_challenge`:
    /// the account's unproven GPUs are at their limit): registration is
    /// tried again at this time (this host's clock).
    register_again_at: Option<tokio::time::Instant>,
}

/// What one connection knows (asks and ids die with it), and what its
/// message handler left for the loop to do.
struct Link {
    connection: Connection,
    offers: Offers,
    /// Whether the owner's schedule made the GPUs available at the last sample.
    available: Option<bool>,
    /// Whether the delivery manager has listed this host's workloads since
    /// the login: until then nothing is offered (a workload of a lease that
    /// ended while the agent was away may still hold a GPU).
    reconciled: bool,
    due: Due,
}

/// What the message handler left for `flush`.
#[derive(Default)]
struct Due {
    /// Place the asks again. Once the events that came with a message are
    /// read: a fill's `lease_created` comes before its ask's
    /// `order_closed`, and cancelling the ask in between would be refused
    /// (`unknown_order`, journaled).
    reoffer: bool,
    /// Send the recorded usage reports.
    reports: bool,
    /// Read the GPUs' classes again (a challenge was decided).
    classes: bool,
}

impl Due {
    fn any(&self) -> bool {
        self.reoffer || self.reports || self.classes
    }
}

impl Agent {
    pub fn new(config: AgentConfig, key: SigningKey, backend: Box<dyn GpuBackend>) -> Result<Self> {
        let health = HostHealth::new(Duration::from_millis(config.delivery.as_ref().map_or(30_000, |d| d.health_backoff_ms)));
        Ok(Agent {
            reporting: Reporting::new(ReportBook::open(&config.key_file)?),
            deliveries: Deliveries::new(&config)?,
            health,
            config,
            key,
            backend,
            host: Host::default(),
            challenges: Challenges::default(),
            order_ids: ClientOrderIds::from_clock(),
            register_again_at: None,
        })
    }

    /// Runs until `stop` fires, reconnecting after connection losses.
    pub async fn run(mut self, stop: impl std::future::Future<Output = ()>) -> Result<()> {
        tokio::pin!(stop);
        self.reporting.start_measuring();
        self.deliveries.start()?;
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
            tracing::warn!(error = %format!("{error:#}"), retry_in_ms = wait.as_millis() as u64, pending_reports = self.reporting.book.pending(), "exchange connection lost");
            // Keep measuring while away: the reports cover the outage too.
            let deadline = tokio::time::sleep(wait);
            tokio::pin!(deadline);
            loop {
                tokio::select! {
                    _ = &mut stop => return Ok(()),
                    _ = &mut deadline => break,
                    // Health changes reach the exchange when the agent is back.
                    _ = sampling.tick() => { self.host.sample(self.backend.as_mut(), now_ms())?; }
                    _ = reporting.tick() => self.reporting.record(&mut self.host, &self.key)?,
                }
            }
            backoff = (backoff * 2).min(BACKOFF_MAX);
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
        self.reporting.logged_in(connection.clock_offset_ms);
        self.register_again_at = registration::register(&self.config, self.backend.as_mut(), &mut self.host, &mut connection).await?;
        if deliveries::delivers_workloads(&self.config) {
            self.publish_encryption_key(&mut connection).await?;
        }
        if self.deliveries.backend().is_some() {
            self.health.resume(&mut connection, &mut self.host).await?;
        }
        // Health changes seen while away reach the exchange now.
        for gpu in self.host.gpus.iter().filter(|g| g.healthy != g.info.online) {
            let id = connection.new_id();
            connection.request(ClientMessage::SetGpuOnline { id, gpu: gpu.info.gpu, online: gpu.healthy }).await?;
        }
        if self.host.id().is_none() {
            match self.register_again_at {
                // Registered later, once the account's earlier GPUs passed their challenges.
                Some(_) => bail!("no GPU of this host is registered yet; logging in again"),
                None => return Err(Fatal("no GPU of this host qualifies for any listed class".into()).into()),
            }
        }
        let offers = Offers::open(&self.config, &self.host, &mut connection).await?;
        let mut link = Link { connection, offers, available: None, reconciled: !self.deliveries.managed(), due: Due::default() };
        self.resume_leases(&mut link).await?;
        // The manager lists the host's workloads before anything is offered
        // (a workload of a lease that ended meanwhile may hold a GPU); an
        // engine that does not answer in time leaves the offers to the
        // answer, whenever it comes.
        let deadline = tokio::time::Instant::now() + RECONCILE_WAIT;
        while !link.reconciled {
            match tokio::time::timeout_at(deadline, self.deliveries.next()).await {
                Ok(FromDelivery::Report(report)) => self.on_delivery_report(&mut link, report),
                Ok(FromDelivery::Probe) => {}
                Err(_) => break,
            }
        }
        link.due.reoffer = false;
        self.reoffer_all(&mut link).await?;
        self.offer_windows(&mut link).await?;
        link.due.reports = true;
        self.flush(&mut link).await?;
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
                message = link.connection.next() => self.on_message(link, message?)?,
                // Only when no message is waiting (biased: polled after it).
                _ = std::future::ready(()), if link.due.any() || self.challenges.due() || self.deliveries.due() => {
                    self.flush(link).await?;
                }
                from = self.deliveries.next() => {
                    if let FromDelivery::Report(report) = from {
                        self.on_delivery_report(link, report);
                    }
                }
                _ = sampling.tick() => self.sample(link).await?,
                _ = reporting.tick() => {
                    self.reporting.record(&mut self.host, &self.key)?;
                    self.reporting.send(&mut link.connection).await?;
                    self.offer_windows(link).await?;
                    if self.reporting.clock_sync_due() {
                        self.reporting.sync_clock(&mut link.connection).await?;
                    }
                    if self.register_again_at.is_some_and(|at| at <= tokio::time::Instant::now()) {
                        let before = self.host.gpus.len();
                        self.register_again_at =
                            registration::register(&self.config, self.backend.as_mut(), &mut self.host, &mut link.connection).await?;
                        link.due.reoffer |= self.host.gpus.len() > before;
                    }
                }
            }
        }
    }

    /// What the message handler left for the loop. The asks first, while
    /// no message waits (the requests after it let messages queue up, and
    /// the asks would then be placed from what they make stale); then
    /// challenges answered, classes read again, job store tokens asked for,
    /// statuses, probes and reports sent.
    async fn flush(&mut self, link: &mut Link) -> Result<()> {
        if std::mem::take(&mut link.due.reoffer) {
            self.reoffer_all(link).await?;
        }
        self.challenges.answer(&mut link.connection, &self.host, self.backend.as_mut()).await?;
        if std::mem::take(&mut link.due.classes) && registration::refresh_classes(&mut self.host, &mut link.connection).await? {
            link.due.reoffer = true;
        }
        let offset = self.reporting.clock_offset_ms;
        self.deliveries.flush(&mut link.connection, &mut self.host, &self.key, offset).await?;
        if std::mem::take(&mut link.due.reports) {
            self.reporting.send(&mut link.connection).await?;
        }
        Ok(())
    }

    async fn reoffer_all(&mut self, link: &mut Link) -> Result<()> {
        let room = Room {
            available: self.config.available_at(now_ms()),
            releasing: self.deliveries.releasing_mask(),
            reconciled: link.reconciled,
        };
        link.offers.reoffer_all(&mut link.connection, &self.config, &self.host, &room, &mut self.order_ids).await
    }

    async fn offer_windows(&mut self, link: &mut Link) -> Result<()> {
        link.offers.offer_windows(&mut link.connection, &self.config, &self.host, link.reconciled, &mut self.order_ids).await
    }

    /// Publishes the key renters seal secrets to. Only a host that runs
    /// renters' workloads does: bids that carry one trade only with
    /// suppliers that published it.
    async fn publish_encryption_key(&self, connection: &mut Connection) -> Result<()> {
        let id = connection.new_id();
        let key = &self.deliveries.encryption_key;
        let publish = ClientMessage::SetEncryptionKey { id, encryption_key: hex::encode(key.public()), signature: key.certify(&self.key) };
        match connection.request(publish).await? {
            ServerMessage::Ack { .. } => Ok(()),
            other => Err(Fatal(format!("publishing the encryption key: {other:?}")).into()),
        }
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
                let mask = self.host.mask_of(&info.gpus);
                if mask == 0 {
                    continue; // another host of this account
                }
                active.insert(info.lease);
                self.host.leases.entry(info.lease).or_insert(LeaseState {
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
        self.deliveries.reconcile(active);
        Ok(())
    }

    /// What the delivery manager reports: statuses (a host failure takes
    /// the GPUs off sale), logs and exec outcomes for renters, GPUs
    /// released, the workloads it could not re-adopt. Like the message
    /// handler it never waits on the exchange: what goes there is queued
    /// for `flush`.
    fn on_delivery_report(&mut self, link: &mut Link, report: Report) {
        match report {
            Report::Status { lease, state } => {
                let outcome = match &state {
                    DeliveryState::Failed { fault: gpux_protocol::Fault::Host, .. } => Some(Billing::HostFailed),
                    DeliveryState::AwaitingSecrets | DeliveryState::Pulling { .. } | DeliveryState::Starting => None,
                    _ => Some(Billing::AsMeasured),
                };
                if let (Some(outcome), Some(lease_state)) = (outcome, self.host.leases.get_mut(&lease)) {
                    // Once the host failed a lease, nothing makes it billable again.
                    if lease_state.billing != Billing::HostFailed {
                        lease_state.billing = outcome;
                    }
                }
                if outcome == Some(Billing::HostFailed) {
                    if let Some(mask) = self.host.leases.get(&lease).filter(|l| !l.ended).map(|l| l.gpu_mask) {
                        self.health.host_failed(lease, mask);
                        for gpu in self.host.fail_delivery(mask) {
                            self.deliveries.send(ToExchange::Offline(gpu));
                        }
                    }
                }
                if matches!(state, DeliveryState::Running { .. }) {
                    self.health.ran();
                }
                self.deliveries.status(lease, state);
            }
            relayed @ (Report::Logs { .. } | Report::Exec { .. }) => self.deliveries.send(ToExchange::Relay(relayed)),
            Report::Removing { lease, gpus } => self.deliveries.removing(lease, self.host.mask_of_uuids(&gpus)),
            Report::Released { lease } => link.due.reoffer |= self.deliveries.released(lease),
            Report::Unadopted { leases, adopted } => {
                if !link.reconciled {
                    link.reconciled = true;
                    link.due.reoffer = true;
                }
                for lease in leases {
                    self.deliveries.send(ToExchange::Workload(lease));
                }
                for lease in adopted {
                    self.deliveries.send(ToExchange::Volumes(lease));
                }
            }
        }
    }

    /// A pushed message: the state it changes, and what it calls for left
    /// for `flush` (never a wait on the exchange here).
    fn on_message(&mut self, link: &mut Link, message: ServerMessage) -> Result<()> {
        let offset = self.reporting.clock_offset_ms;
        match message {
            ServerMessage::Private { event, .. } => self.on_event(link, event)?,
            ServerMessage::Workload { lease, workload } => self.deliveries.deliver(&mut self.host, lease, Some(workload), offset),
            ServerMessage::ReplicaAssigned { lease, replica } => self.deliveries.replica_assigned(&mut self.host, lease, *replica, offset),
            ServerMessage::VolumesAttached { lease, renter, volumes, store } => {
                self.deliveries.volumes_attached(&self.host, lease, renter, volumes, store)
            }
            ServerMessage::JobAssigned { lease, assignment, store } => {
                self.deliveries.job_assigned(&mut self.host, lease, *assignment, store, offset)
            }
            ServerMessage::GpuChallenge { challenge, gpu, seed, n, .. } => self.challenges.ask(Asked::Compute { challenge, gpu, seed, n }),
            ServerMessage::GpuMemoryChallenge { challenge, gpu, seed, words_log2, passes, .. } => {
                self.challenges.ask(Asked::Memory { challenge, gpu, seed, words_log2, passes })
            }
            // Only the agent that runs (or ran) the lease answers: the
            // exchange may ask every agent of the account.
            ServerMessage::LogsWanted { request, lease, tail_bytes } => self.deliveries.logs(request, lease, tail_bytes),
            ServerMessage::ExecWanted { request, lease, command, timeout_ms } => self.deliveries.exec(request, lease, command, timeout_ms),
            _ => {}
        }
        Ok(())
    }

    /// One of the account's events.
    fn on_event(&mut self, link: &mut Link, event: Event) -> Result<()> {
        let Event { kind, at_ms, .. } = event;
        let host = self.host.id();
        match kind {
            EventKind::LeaseCreated { lease, kind, host: on, gpu_mask, start_ms, end_ms, .. } if Some(on) == host => {
                self.host.lease_started(lease, LeaseState { kind, gpu_mask, start_ms, end_ms, ended: false, billing: Billing::AsMeasured });
                self.host.log_lease_event("start", lease, gpu_mask, end_ms);
                if deliveries::runs_without_workload(&self.config) {
                    self.deliveries.deliver(&mut self.host, lease, None, self.reporting.clock_offset_ms);
                }
                // An exclusive lease also takes the GPUs out of the preemptible ask.
                link.due.reoffer |= kind != LeaseKind::Preemptible;
            }
            EventKind::PreemptionNotice { lease, ends_at_ms } => {
                if let Some(state) = self.host.leases.get(&lease).copied() {
                    // SIGTERM now; the lease ends at the deadline whatever the workload does.
                    self.host.log_lease_event("preempt", lease, state.gpu_mask, Some(ends_at_ms));
                    self.deliveries.preempt(lease, self.reporting.host_ms(ends_at_ms));
                }
            }
            EventKind::LeaseEnded { lease, .. } => self.lease_ended(link, lease, at_ms)?,
            EventKind::OrderClosed { order, .. } => link.due.reoffer |= link.offers.order_closed(order),
            EventKind::FabricProbed { lease, claimed_gbps, mbps, borne_out, .. } if self.host.leases.contains_key(&lease) => {
                match borne_out {
                    true => tracing::info!(%lease, claimed_gbps, mbps, "interconnect probe recorded: bears the fabric claim out"),
                    false => tracing::warn!(%lease, claimed_gbps, mbps, "interconnect probe recorded: does NOT bear the fabric claim out"),
                }
            }
            EventKind::GpuChallenged { gpu, outcome, mflops: rate, verified, .. } => {
                challenges::decided(&self.host, gpu, "compute", outcome, rate, verified);
                link.due.classes = true;
            }
            EventKind::GpuMemoryChallenged { gpu, outcome, mbps: rate, verified, .. } => {
                challenges::decided(&self.host, gpu, "memory", outcome, rate, verified);
                link.due.classes = true;
            }
            EventKind::ContractCreated { instrument, supplier, gpu, .. } if supplier == link.connection.account => {
                if let Some(bit) = self.host.gpus.iter().find(|g| g.info.gpu == gpu).map(|g| g.bit()) {
                    *self.host.windows_sold.entry(instrument).or_default() |= bit;
                }
            }
            _ => {}
        }
        Ok(())
    }

    /// A lease of this host ended at `at_ms`: its workload is stopped, its
    /// reports recorded up to the end (sent by `flush`) and its chains
    /// forgotten; its GPUs offered again.
    fn lease_ended(&mut self, link: &mut Link, lease: gpux_engine::LeaseId, at_ms: u64) -> Result<()> {
        let Some(state) = self.host.leases.get_mut(&lease) else { return Ok(()) };
        state.end_ms = Some(at_ms);
        state.ended = true;
        let mask = state.gpu_mask;
        self.host.log_lease_event("end", lease, mask, Some(at_ms));
        // Its GPUs are offered again once the workload is confirmed gone.
        self.deliveries.lease_ended(lease, mask);
        self.health.lease_ended(lease);
        self.reporting.record(&mut self.host, &self.key)?;
        self.reporting.book.close_lease(lease)?;
        self.host.leases.remove(&lease);
        link.due.reports = true;
        link.due.reoffer = true;
        Ok(())
    }

    /// Samples the GPUs: health changes told to the exchange, lost GPUs'
    /// leases failed, the asks placed again when health or the owner's
    /// schedule changed.
    async fn sample(&mut self, link: &mut Link) -> Result<()> {
        self.health.check(self.deliveries.backend(), &mut self.host).await;
        self.deliveries.fail_lost_leases(&mut self.host, self.config.gpu_lost_after_ms, now_ms());
        let available = self.config.available_at(now_ms());
        let availability_changed = link.available != Some(available);
        link.available = Some(available);
        let changed = self.host.sample(self.backend.as_mut(), now_ms())?;
        for &(gpu, online) in &changed {
            let id = link.connection.new_id();
            link.connection.request(ClientMessage::SetGpuOnline { id, gpu, online }).await?;
        }
        link.due.reoffer |= !changed.is_empty() || availability_changed;
        Ok(())
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

fn now_ms() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64)
}
