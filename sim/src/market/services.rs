//! Inference served as gpux services (`SimConfig::service_renters_bps`,
//! docs/services.md): a share of inference renters, instead of buying
//! leases, create one service with autoscaling on requests per second. Its
//! traffic follows the day (a tenth of its peak at night, the peak in the
//! afternoon of the renter's part of the world); the simulator plays its
//! router, reporting the load every five minutes, and each replica's host
//! reports it running a minute and a half after its lease starts. The
//! market does the rest as it does on the exchange: it bids for replicas,
//! adds and removes them on the load, and replaces those whose lease ends
//! early (a host gone silent, a preemption). The report sets requests
//! served and not, replicas replaced, and the cost beside leases bought by
//! hand for the peak.

use gpux_protocol::{ScalingTarget, ServiceId, ServiceLoad, ServiceScaling, ServiceSpec};

use super::*;

/// How often the simulated router reports a service's load.
pub(super) const LOAD_EVERY_MS: u64 = 5 * 60_000;
/// A replica's host reports it running (image pulled, model loaded, its
/// readiness answered) this long after its lease starts.
pub(super) const REPLICA_START_MS: u64 = 90_000;
/// Requests per second a replica is scaled for, and the most it serves.
pub(super) const TARGET_RPS: u64 = 40;
pub(super) const CAPACITY_RPS: u64 = 50;
/// The service's port.
const PORT: u16 = 8000;

pub(super) struct SimService {
    account: AccountId,
    /// Requests per second at the day's peak, and the hour (UTC) it falls on.
    peak_rps: u64,
    peak_hour: u64,
    created_ms: u64,
    /// The price its replicas' bids go up to, per GPU-hour.
    limit_minor: u64,
    /// Usage charged on its leases whose billing closed.
    charged_minor: u64,
    verified_gpu_ms: u64,
}

impl SimService {
    /// Requests per second at `at_ms`: a tenth of the peak at night, the
    /// peak at `peak_hour`.
    fn rps_at(&self, at_ms: u64) -> u64 {
        let hour = (at_ms % MS_PER_DAY) as f64 / MS_PER_HOUR as f64;
        let phase = (hour - self.peak_hour as f64) / 24.0 * std::f64::consts::TAU;
        // cos is 1 at the peak, -1 twelve hours away: 0.1 to 1.0 of the peak.
        let share = 0.55 + 0.45 * phase.cos();
        (self.peak_rps as f64 * share).round() as u64
    }

    /// Replicas the peak needs at the target: what a renter buying leases
    /// by hand keeps all day.
    fn peak_replicas(&self) -> u64 {
        self.peak_rps.div_ceil(TARGET_RPS)
    }
}

impl Sim {
    /// Which inference renters run a service: drawn after every other
    /// participant, and only when the share is above 0, so runs without it
    /// are the same as before it existed.
    pub(super) fn open_services(&mut self) {
        if self.config.service_renters_bps == 0 {
            return;
        }
        for index in 0..self.population.renters.len() {
            let renter = &self.population.renters[index];
            if renter.kind != RenterKind::Inference || renter.underpays {
                continue;
            }
            if self.rng.random_range(0..10_000) >= self.config.service_renters_bps {
                continue;
            }
            self.service_renters.insert(index as u32);
            let at = START_MS + self.rng.random_range(0..2 * MS_PER_HOUR);
            self.schedule(at, Action::ServiceCreate(index as u32));
        }
        self.schedule(START_MS + LOAD_EVERY_MS, Action::ServiceLoad);
    }

    /// The renter creates its service: one replica of one GPU on its
    /// class's spot book (a third of them on the preemptible book), up to
    /// what its peak needs and one more.
    pub(super) fn create_service(&mut self, index: u32) {
        let renter = &self.population.renters[index as usize];
        let (class_index, eagerness_bps, region) = (renter.class_index, renter.eagerness_bps, renter.region);
        let account = self.renters[index as usize].account;
        let peak_rps = self.rng.random_range(40..=300);
        let peak_hour = self.rng.random_range(12..=20) + region.map_or(0, |r| u64::from(r) * 3) % 24;
        let contract = usize::from(self.rng.random_range(0..3) == 0);
        let limit_minor = self.job_price(class_index, contract, eagerness_bps, region, false);
        let mut service = SimService {
            account,
            peak_rps,
            peak_hour: peak_hour % 24,
            created_ms: self.now_ms,
            limit_minor,
            charged_minor: 0,
            verified_gpu_ms: 0,
        };
        let max_replicas = (service.peak_replicas() + 1).min(u64::from(gpux_market::services::limits::REPLICAS_MAX)) as u32;
        let hours = self.config.days as u64 * 24;
        let deposit = limit_minor * max_replicas as u64 * hours * 2;
        self.submit(Command::Deposit { account, amount_minor: deposit });
        let regions = region.map(|r| vec![population::REGIONS[r as usize].name.to_string()]).unwrap_or_default();
        let spec = ServiceSpec {
            name: format!("sim-inference-{index}"),
            instrument: InstrumentId(class_index as u32 * 2 + contract as u32),
            gpus: 1,
            limit_minor_per_gpu_hour: limit_minor,
            budget_minor_per_hour: limit_minor * max_replicas as u64,
            replicas: 1,
            min_replicas: 1,
            max_replicas,
            image: "sim/serve:1".into(),
            command: Vec::new(),
            port: PORT,
            readiness_path: Some("/health".into()),
            regions,
            min_supplier_score_bps: 0,
            scaling: Some(ServiceScaling {
                target: ScalingTarget::RequestsPerSecondMilli(TARGET_RPS * 1_000),
                up_window_ms: 10 * 60_000,
                down_window_ms: 30 * 60_000,
            }),
            key_hashes: Vec::new(),
        };
        let mut events = Vec::new();
        let applied = self.exchange.entry(JournalEntry::CreateService { at_ms: self.now_ms, account, spec: Box::new(spec) }, &mut events);
        match applied.service {
            Some(Ok(id)) => {
                service.created_ms = self.now_ms;
                self.metrics.services.created += 1;
                self.services.insert(id, service);
            }
            _ => self.metrics.services.refused += 1,
        }
        self.observe(&events);
    }

    /// A lease just created: a service's replica starts on it, and its
    /// host reports it running once it is up.
    pub(super) fn service_lease_created(&mut self, lease: LeaseId) {
        let Some(replica) = self.exchange.market().services().replica_of(lease) else { return };
        if !self.services.contains_key(&replica.service) {
            return;
        }
        self.service_lease.insert(lease, replica.service);
        self.schedule(self.now_ms + REPLICA_START_MS, Action::ReplicaUp(lease));
    }

    /// The replica's host reports it running, unless the host is down or
    /// the lease already ended.
    pub(super) fn replica_up(&mut self, lease: LeaseId) {
        let Some(info) = self.exchange.engine().lease(lease).filter(|l| l.active) else { return };
        let supplier = info.supplier;
        let host_down = self.supplier_of_account.get(&supplier).is_some_and(|&s| {
            let host = &self.suppliers[s as usize];
            host.is_down || host.network_down_until != 0
        });
        if host_down {
            return;
        }
        let endpoints = vec![gpux_protocol::Endpoint {
            container_port: PORT,
            host: format!("10.0.{}.{}", lease.0 / 250 % 250, lease.0 % 250),
            port: 30_000,
        }];
        let state = gpux_protocol::DeliveryState::Running { endpoints, ssh: None, restarts: 0 };
        let mut events = Vec::new();
        self.exchange.entry(JournalEntry::DeliveryStatus { at_ms: self.now_ms, account: supplier, lease, state }, &mut events);
        self.observe(&events);
    }

    /// The router's report: each service's load now, and what its ready
    /// replicas served over the last interval.
    pub(super) fn services_load(&mut self) {
        if self.now_ms + LOAD_EVERY_MS < self.config.end_ms() {
            self.schedule(self.now_ms + LOAD_EVERY_MS, Action::ServiceLoad);
        }
        let ids: Vec<ServiceId> = self.services.keys().copied().collect();
        for id in ids {
            let (account, rps) = {
                let service = &self.services[&id];
                (service.account, service.rps_at(self.now_ms))
            };
            let Some(info) = self.exchange.market().services().info(id, account) else { continue };
            let ready = info.replicas.iter().filter(|r| r.state == gpux_protocol::ReplicaState::Ready).count() as u64;
            let served = rps.min(ready * CAPACITY_RPS);
            let seconds = LOAD_EVERY_MS / 1_000;
            let stats = &mut self.metrics.services;
            stats.requests += rps * seconds;
            stats.served += served * seconds;
            stats.ready_replica_ms += ready * LOAD_EVERY_MS;
            stats.intervals += 1;
            stats.intervals_without_ready += u64::from(ready == 0);
            let load = ServiceLoad { requests_per_second_milli: rps * 1_000, in_flight: 0, queued: 0 };
            let mut events = Vec::new();
            let entry = JournalEntry::ServiceLoad { at_ms: self.now_ms, account, service: id, router: 0, load };
            let applied = self.exchange.entry(entry, &mut events);
            if let Some(reason) = applied.scaled {
                *self.metrics.services.scalings.entry(reason.to_string()).or_default() += 1;
            }
            self.observe(&events);
        }
    }

    /// A lease's billing closed: a service's replica's charge.
    pub(super) fn service_billing_closed(&mut self, lease: LeaseId, verified_gpu_ms: u64, charged_minor: u64) -> bool {
        let Some(service) = self.service_lease.get(&lease).and_then(|id| self.services.get_mut(id)) else { return false };
        service.charged_minor += charged_minor;
        service.verified_gpu_ms += verified_gpu_ms;
        true
    }

    /// Whether the renter runs a service (and buys no leases by hand).
    pub(super) fn runs_service(&self, renter: u32) -> bool {
        self.service_renters.contains(&renter)
    }

    /// At the run's end: each service's replacements and cost, beside a
    /// fleet bought by hand for the peak.
    pub(super) fn services_finish(&mut self) {
        for (id, service) in &self.services {
            let Some(info) = self.exchange.market().services().info(*id, service.account) else { continue };
            let stats = &mut self.metrics.services;
            stats.replaced += info.replaced;
            stats.bids += info.bids;
            if info.state != gpux_protocol::ServiceState::Running {
                stats.not_running += 1;
            }
            // Leases still running: charged so far.
            let (mut charged, mut verified) = (service.charged_minor, service.verified_gpu_ms);
            if let Some((leases, _)) = self.exchange.market().services().bill_of(*id, service.account) {
                for lease in leases {
                    if let Some(l) = self.exchange.engine().lease(lease).filter(|l| !l.billing_closed) {
                        charged += l.usage_charged_minor;
                        verified += l.verified_gpu_ms;
                    }
                }
            }
            stats.charged_minor += charged;
            stats.verified_gpu_ms += verified;
            // By hand: the peak's replicas leased from creation to the end,
            // at the price per GPU-hour the service's replicas paid on
            // average (its limit when nothing was charged).
            let live_ms = self.now_ms.saturating_sub(service.created_ms);
            let by_hand_gpu_ms = service.peak_replicas() * live_ms;
            let by_hand = match verified {
                0 => (by_hand_gpu_ms as u128 * service.limit_minor as u128 / MS_PER_HOUR as u128) as u64,
                _ => (by_hand_gpu_ms as u128 * charged as u128 / verified as u128) as u64,
            };
            stats.by_hand_gpu_ms += by_hand_gpu_ms;
            stats.by_hand_minor += by_hand;
        }
    }
}
