//! Services at the exchange (docs/services.md): a renter's service keeps
//! `replicas` copies of one workload running, each on a lease of its own.
//! The market bids for each replica it lacks (an open-ended, one-host,
//! all-or-none bid at the service's limit), hands the replica to the host
//! whose lease fills it, and when a replica's lease ends before the
//! service let it go (its host failed, was preempted or went silent, or
//! its workload exited) bids a replacement at once. Pure and deterministic
//! like the rest of the market: it follows the engine's events and the
//! hosts' delivery statuses and says what to do next (`Outcome`); the
//! sequencer journals each next step as its own entry.
//!
//! Journaled (`JournalEntry::CreateService`, `ScaleService`,
//! `DeleteService`) and applied by `MarketState`; on the wire as
//! `create_service` and friends (docs/protocol.md "Services").

use std::collections::{BTreeMap, BTreeSet, VecDeque};

use gpux_engine::{
    AccountId, Command, Event, EventKind, LeaseDuration, LeaseId, NewOrder, OrderCloseReason, OrderId, OrderOptions, SelfTradePrevention,
    Side, TimeInForce,
};
pub use gpux_protocol::services::limits;
use gpux_protocol::services::{
    ReplicaAssignment, ReplicaInfo, ReplicaState, RolloutState, ScalingDecision, ScalingTarget, ServiceId, ServiceInfo, ServiceLoad,
    ServiceRun, ServiceSpec, ServiceState,
};

use crate::scaling::{Load, Policy, Scaler, Target};
use gpux_protocol::{DeliveryState, ErrorCode};
use serde::{Deserialize, Serialize};

/// Client order ids from here up to re-match's are services' bids: this
/// plus the service's id times [`limits::BIDS_MAX`] plus the bid's number.
/// (Jobs' ids never reach this far into their own range below it.)
pub const SERVICE_CLIENT_ORDER_ID_BASE: u64 = (1 << 62) + (1 << 61);

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
struct Service {
    account: AccountId,
    spec: ServiceSpec,
    state: ServiceState,
    slots: BTreeMap<u32, Slot>,
    /// Bids placed so far.
    bids: u64,
    replaced: u64,
    /// Replicas in a row that exited or failed for the renter's reason
    /// before any became ready.
    failures_in_row: u32,
    /// Every lease it ran on, oldest first.
    leases: VecDeque<LeaseId>,
    created_at_ms: u64,
    updated_at_ms: u64,
    /// Autoscaling: the rule's memory of the load, each router's last
    /// report, and its latest decision.
    scaler: Scaler,
    routers: BTreeMap<u32, (u64, ServiceLoad)>,
    last_scaling: Option<ScalingDecision>,
    /// The run's generation: 0 as created, one more with each update.
    generation: u32,
    /// A rolling update: the run it replaces (to roll back to), and the
    /// slot of the one new replica it brings up at a time.
    rollout: Option<Rollout>,
    last_rollout: Option<RolloutState>,
    terms: ServiceTerms,
}

/// What a service has beyond its spec, journaled beside it
/// (`JournalEntry::CreateServiceV2`).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ServiceTerms {
    /// Slots `0..floor.replicas` bid on the floor's book, at its limit.
    pub floor: Option<gpux_protocol::ServiceFloor>,
}

impl Service {
    /// Replicas its budget pays for (the floor's at their limit).
    fn affordable(&self) -> u32 {
        gpux_protocol::services::affordable(&self.spec, self.terms.floor.as_ref())
    }

    /// Whether `slot` is one of the floor's.
    fn is_floor(&self, slot: u32) -> bool {
        self.terms.floor.is_some_and(|floor| slot < floor.replicas)
    }

    /// Replicas it keeps: its slots but those whose lease got a preemption
    /// notice (their stand-ins count instead).
    fn kept(&self) -> u32 {
        self.slots.values().filter(|s| !s.noticed).count() as u32
    }
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
struct Rollout {
    previous: ServiceRun,
    surge: Option<u32>,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
struct Slot {
    state: ReplicaState,
    /// The bid's client order id while it bids.
    client_order_id: Option<u64>,
    order: Option<OrderId>,
    lease: Option<LeaseId>,
    endpoint: Option<String>,
    /// Why it does not bid: the engine refused its last bid (the account
    /// lacked funds, say) or closed it unfilled (the renter cancelled it);
    /// it waits for the renter's next `scale_service` to bid again, so that
    /// a refusal never loops.
    stalled: Option<String>,
    since_ms: u64,
    /// The generation of the run its bid or lease is for.
    generation: u32,
    /// Its lease got a preemption notice: a stand-in slot bids beside it
    /// at once, and this slot goes (no new bid) when the lease ends.
    #[serde(default)]
    noticed: bool,
}

impl Slot {
    fn bidding(at_ms: u64) -> Slot {
        Slot {
            state: ReplicaState::Bidding,
            client_order_id: None,
            order: None,
            lease: None,
            endpoint: None,
            stalled: None,
            since_ms: at_ms,
            generation: 0,
            noticed: false,
        }
    }
}

/// How far a replica is from serving: what goes first when replicas go.
fn rank(state: ReplicaState) -> u8 {
    match state {
        ReplicaState::Bidding => 0,
        ReplicaState::Starting => 1,
        ReplicaState::Ready => 2,
    }
}

/// Every service of the exchange.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Services {
    services: BTreeMap<ServiceId, Service>,
    next_id: u64,
    /// Services not deleted, by account.
    live: BTreeSet<(AccountId, ServiceId)>,
    /// Deleted services still shown, oldest first, by account.
    deleted: BTreeMap<AccountId, VecDeque<ServiceId>>,
    /// Resting bids, and running leases, by the replica they are for.
    orders: BTreeMap<OrderId, (ServiceId, u32)>,
    leases: BTreeMap<LeaseId, (ServiceId, u32)>,
    heard: BTreeMap<LeaseId, crate::jobs::Heard>,
}

/// What to do next, each journaled as its own entry (ends and cancels
/// first, then bids), and what to tell.
#[derive(Debug, Default)]
pub struct Outcome {
    pub end_leases: Vec<(AccountId, LeaseId)>,
    pub cancel_orders: Vec<(AccountId, OrderId)>,
    pub bids: Vec<Command>,
    /// Services that changed (their renter is told).
    pub changed: BTreeSet<ServiceId>,
    /// Replicas handed to hosts: each lease's supplier and what to run.
    pub assigned: Vec<(LeaseId, AccountId, ReplicaAssignment)>,
    /// The reason of an autoscaling decision made.
    pub scaled: Option<&'static str>,
}

impl Outcome {
    pub fn commands(&self) -> Vec<Command> {
        let ends = self.end_leases.iter().map(|&(account, lease)| Command::EndLease { account, lease });
        let cancels = self.cancel_orders.iter().map(|&(account, order)| Command::CancelOrder { account, order });
        ends.chain(cancels).chain(self.bids.iter().cloned()).collect()
    }
}

impl Services {
    pub fn is_empty(&self) -> bool {
        self.services.is_empty()
    }

    /// Creates a service and bids for its replicas; refused when the spec
    /// (or its floor) breaks a bound or the account or the exchange holds
    /// its most.
    pub fn create(
        &mut self,
        account: AccountId,
        spec: ServiceSpec,
        terms: ServiceTerms,
        at_ms: u64,
    ) -> Result<(ServiceId, Outcome), ErrorCode> {
        spec.check().map_err(|_| ErrorCode::ServiceInvalid)?;
        if let Some(floor) = &terms.floor {
            floor.check(&spec).map_err(|_| ErrorCode::ServiceInvalid)?;
        }
        let held = self.live.range((account, ServiceId(0))..=(account, ServiceId(u64::MAX))).count();
        if held >= limits::SERVICES_PER_ACCOUNT_MAX || self.live.len() >= limits::SERVICES_LIVE_MAX {
            return Err(ErrorCode::TooManyServices);
        }
        self.next_id += 1;
        let id = ServiceId(self.next_id);
        let slots = (0..spec.replicas).map(|slot| (slot, Slot::bidding(at_ms))).collect();
        let service = Service {
            account,
            spec,
            state: ServiceState::Running,
            slots,
            bids: 0,
            replaced: 0,
            failures_in_row: 0,
            leases: VecDeque::new(),
            created_at_ms: at_ms,
            updated_at_ms: at_ms,
            scaler: Scaler::default(),
            routers: BTreeMap::new(),
            last_scaling: None,
            generation: 0,
            rollout: None,
            last_rollout: None,
            terms,
        };
        self.services.insert(id, service);
        self.live.insert((account, id));
        let mut outcome = Outcome::default();
        let slots: Vec<u32> = self.services[&id].slots.keys().copied().collect();
        for slot in slots {
            self.bid(id, slot, at_ms, &mut outcome);
        }
        outcome.changed.insert(id);
        Ok((id, outcome))
    }

    /// Whether `load` would take a report for the service: the account's,
    /// running, with autoscaling.
    pub fn accepts_load(&self, id: ServiceId, account: AccountId) -> Result<(), ErrorCode> {
        let service = self.services.get(&id).filter(|s| s.account == account).ok_or(ErrorCode::UnknownService)?;
        match service.spec.scaling.is_some() && service.state == ServiceState::Running {
            true => Ok(()),
            false => Err(ErrorCode::ServiceNotScaling),
        }
    }

    /// A router's load: kept as that router's last report, the reports of
    /// the service's routers from the last `LOAD_STALE_MS` summed, and
    /// the sum run through the service's autoscaling rule
    /// (`scaling::Scaler`); a decision sets the replicas as a scale would.
    pub fn load(&mut self, id: ServiceId, account: AccountId, router: u32, load: ServiceLoad, at_ms: u64) -> Result<Outcome, ErrorCode> {
        let service = self.services.get_mut(&id).filter(|s| s.account == account).ok_or(ErrorCode::UnknownService)?;
        let Some(scaling) = service.spec.scaling.filter(|_| service.state == ServiceState::Running) else {
            return Err(ErrorCode::ServiceNotScaling);
        };
        service.routers.insert(router, (at_ms, load));
        if service.routers.len() > limits::ROUTERS_MAX {
            let oldest = service.routers.iter().min_by_key(|(r, (at, _))| (*at, **r)).map(|(r, _)| *r);
            service.routers.retain(|r, _| Some(*r) != oldest);
        }
        let fresh = service.routers.values().filter(|(at, _)| at_ms.saturating_sub(*at) <= limits::LOAD_STALE_MS);
        let total = fresh.fold(Load { at_ms, ..Load::default() }, |sum, (_, l)| Load {
            at_ms,
            requests_per_second_milli: sum.requests_per_second_milli.saturating_add(l.requests_per_second_milli),
            in_flight: sum.in_flight.saturating_add(l.in_flight),
            queued: sum.queued.saturating_add(l.queued),
        });
        let policy = Policy {
            min_replicas: service.spec.min_replicas,
            max_replicas: service.spec.max_replicas,
            target: match scaling.target {
                ScalingTarget::RequestsPerSecondMilli(n) => Target::RequestsPerSecondMilli(n),
                ScalingTarget::InFlight(n) => Target::InFlight(n),
            },
            up_window_ms: scaling.up_window_ms,
            down_window_ms: scaling.down_window_ms,
        };
        if service.rollout.is_some() {
            // The replicas' count holds while an update rolls.
            return Ok(Outcome::default());
        }
        let running = service.kept();
        let affordable = service.affordable();
        let Some(decision) = service.scaler.observe(&policy, total, running, affordable) else { return Ok(Outcome::default()) };
        service.last_scaling =
            Some(ScalingDecision { from: decision.from, to: decision.to, reason: decision.reason.name().to_string(), at_ms });
        let mut outcome = self.set_replicas(id, decision.to, at_ms);
        outcome.scaled = Some(decision.reason.name());
        Ok(outcome)
    }

    /// Sets the replicas a running service keeps: new slots bid; the
    /// slots let go are those furthest from serving (bidding, then
    /// starting, then ready; the highest slot first). Slots whose last bid
    /// was refused bid again.
    pub fn scale(&mut self, id: ServiceId, account: AccountId, replicas: u32, at_ms: u64) -> Result<Outcome, ErrorCode> {
        let service = self.services.get(&id).filter(|s| s.account == account).ok_or(ErrorCode::UnknownService)?;
        let spec = &service.spec;
        if service.state != ServiceState::Running
            || service.rollout.is_some()
            || replicas < spec.min_replicas
            || replicas > spec.max_replicas
            || replicas > service.affordable()
        {
            return Err(ErrorCode::ServiceScaleInvalid);
        }
        Ok(self.set_replicas(id, replicas, at_ms))
    }

    fn set_replicas(&mut self, id: ServiceId, replicas: u32, at_ms: u64) -> Outcome {
        let service = &self.services[&id];
        let mut outcome = Outcome::default();
        // A noticed replica goes by itself; its stand-in counts instead.
        let now = service.kept();
        if replicas < now {
            let mut order: Vec<(u8, std::cmp::Reverse<u32>)> =
                service.slots.iter().filter(|(_, s)| !s.noticed).map(|(&slot, s)| (rank(s.state), std::cmp::Reverse(slot))).collect();
            // The floor's slots go last (a scale never goes below min_replicas,
            // which holds the floor).
            order.sort_by_key(|&(rank, std::cmp::Reverse(slot))| (service.is_floor(slot), rank, std::cmp::Reverse(slot)));
            for (_, std::cmp::Reverse(slot)) in order.into_iter().take((now - replicas) as usize) {
                self.let_go(id, slot, &mut outcome);
            }
        } else {
            let mut free = (0..).filter(|s| !service.slots.contains_key(s));
            let new: Vec<u32> = (now..replicas).map(|_| free.next().expect("unbounded")).collect();
            let entry = self.services.get_mut(&id).expect("present");
            for slot in &new {
                entry.slots.insert(*slot, Slot::bidding(at_ms));
            }
            let waiting: Vec<u32> = entry
                .slots
                .iter()
                .filter(|(_, s)| s.state == ReplicaState::Bidding && s.client_order_id.is_none())
                .map(|(k, _)| *k)
                .collect();
            for slot in waiting {
                self.bid(id, slot, at_ms, &mut outcome);
            }
        }
        self.touch(id, at_ms, &mut outcome);
        outcome
    }

    /// A new run (image, command, port, readiness) rolled out one replica
    /// at a time: a replica of the new run is bid for beside the others,
    /// and once it is ready one of the old run's goes (the one furthest
    /// from serving), until none is left; replicas still bidding take the
    /// new run at once. Should [`limits::REPLICA_FAILURES_MAX`] new
    /// replicas in a row fail before one is ready, the update rolls back:
    /// the old run is the service's again.
    pub fn update(&mut self, id: ServiceId, account: AccountId, run: ServiceRun, at_ms: u64) -> Result<Outcome, ErrorCode> {
        let service = self.services.get(&id).filter(|s| s.account == account).ok_or(ErrorCode::UnknownService)?;
        if service.state != ServiceState::Running || service.rollout.is_some() {
            return Err(ErrorCode::ServiceNotRunning);
        }
        let mut spec = service.spec.clone();
        let previous = spec.run();
        spec.set_run(run);
        spec.check().map_err(|_| ErrorCode::ServiceInvalid)?;
        let service = self.services.get_mut(&id).expect("present");
        service.spec = spec;
        service.generation += 1;
        service.failures_in_row = 0;
        service.rollout = Some(Rollout { previous, surge: None });
        service.last_rollout = Some(RolloutState::Rolling);
        let mut outcome = Outcome::default();
        // Bids not yet filled are for the new run from now.
        let waiting: Vec<u32> = service.slots.iter().filter(|(_, s)| s.state == ReplicaState::Bidding).map(|(k, _)| *k).collect();
        let (account, generation) = (service.account, service.generation);
        for slot in waiting {
            let s = self.slot_mut(id, slot);
            match s.order.take() {
                Some(order) => {
                    self.orders.remove(&order);
                    outcome.cancel_orders.push((account, order));
                    self.bid(id, slot, at_ms, &mut outcome);
                }
                // Stalled: its next bid (the renter's scale) is for the new run.
                None => s.generation = generation,
            }
        }
        self.roll(id, at_ms, &mut outcome);
        self.touch(id, at_ms, &mut outcome);
        Ok(outcome)
    }

    /// The rollout's next step: when no new replica is on its way and old
    /// ones remain, a new replica is bid for; with no old one left, it is done.
    fn roll(&mut self, id: ServiceId, at_ms: u64, outcome: &mut Outcome) {
        let service = self.services.get_mut(&id).expect("present");
        let generation = service.generation;
        let Some(rollout) = service.rollout.as_mut() else { return };
        let old = service.slots.values().filter(|s| s.generation < generation).count();
        if old == 0 {
            if let Some(surge) = rollout.surge.take() {
                // Nothing left to replace (old ones were lost meanwhile): the
                // surge replica is one too many.
                if service.slots.len() > 1 {
                    self.let_go(id, surge, outcome);
                }
            }
            let service = self.services.get_mut(&id).expect("present");
            service.rollout = None;
            service.last_rollout = Some(RolloutState::Done);
            return;
        }
        if rollout.surge.is_some() {
            return;
        }
        let slot = (0..).find(|s| !service.slots.contains_key(s)).expect("unbounded");
        rollout.surge = Some(slot);
        service.slots.insert(slot, Slot::bidding(at_ms));
        self.bid(id, slot, at_ms, outcome);
    }

    /// A replica became ready: during a rollout, when it is the new run's
    /// surge replica, one old replica goes and the rollout goes on.
    fn ready_during_rollout(&mut self, id: ServiceId, slot: u32, at_ms: u64, outcome: &mut Outcome) {
        let service = self.services.get_mut(&id).expect("present");
        let generation = service.generation;
        let Some(rollout) = service.rollout.as_mut() else { return };
        if rollout.surge != Some(slot) {
            return;
        }
        rollout.surge = None;
        let old = service
            .slots
            .iter()
            .filter(|(_, s)| s.generation < generation)
            .map(|(&k, s)| (rank(s.state), std::cmp::Reverse(k)))
            .min()
            .map(|(_, std::cmp::Reverse(k))| k);
        if let Some(old) = old {
            self.let_go(id, old, outcome);
        }
        self.roll(id, at_ms, outcome);
    }

    /// New replicas failed `REPLICA_FAILURES_MAX` times in a row during a
    /// rollout: the old run is the service's again (its replicas keep
    /// running; the new run's go).
    fn roll_back(&mut self, id: ServiceId, at_ms: u64, outcome: &mut Outcome) {
        let service = self.services.get_mut(&id).expect("present");
        let Some(rollout) = service.rollout.take() else { return };
        let generation = service.generation;
        service.spec.set_run(rollout.previous);
        service.generation += 1;
        service.failures_in_row = 0;
        service.last_rollout = Some(RolloutState::RolledBack);
        // The old run's replicas are the current run's again; the new
        // run's go, and the slots they leave bid for the old run.
        let new_generation = service.generation;
        let mut renew = Vec::new();
        for (slot, s) in service.slots.iter_mut() {
            if s.generation < generation {
                s.generation = new_generation;
            } else {
                renew.push(*slot);
            }
        }
        let keep = service.slots.len().saturating_sub(usize::from(rollout.surge.is_some()));
        for slot in renew {
            let replicas = self.services[&id].slots.len();
            self.let_go(id, slot, outcome);
            if replicas > keep {
                continue;
            }
            self.services.get_mut(&id).expect("present").slots.insert(slot, Slot::bidding(at_ms));
            self.bid(id, slot, at_ms, outcome);
        }
    }

    /// Deletes a service: bids cancelled, leases ended by the renter.
    pub fn delete(&mut self, id: ServiceId, account: AccountId, at_ms: u64) -> Result<Outcome, ErrorCode> {
        let service = self.services.get(&id).filter(|s| s.account == account).ok_or(ErrorCode::UnknownService)?;
        let mut outcome = Outcome::default();
        if service.state == ServiceState::Deleted {
            return Ok(outcome);
        }
        self.stop(id, ServiceState::Deleted, at_ms, &mut outcome);
        self.live.remove(&(account, id));
        let kept = self.deleted.entry(account).or_default();
        kept.push_back(id);
        while kept.len() > limits::SERVICES_DELETED_PER_ACCOUNT_MAX {
            if let Some(old) = kept.pop_front() {
                self.services.remove(&old);
            }
        }
        Ok(outcome)
    }

    /// Whether `account`'s order `client_order_id` is a service's bid (it
    /// trades only with suppliers whose hosts deliver workloads).
    pub fn is_service_bid(&self, account: AccountId, client_order_id: u64) -> bool {
        self.slot_of_bid(account, client_order_id).is_some()
    }

    fn slot_of_bid(&self, account: AccountId, client_order_id: u64) -> Option<(ServiceId, u32)> {
        let offset = client_order_id.checked_sub(SERVICE_CLIENT_ORDER_ID_BASE)?;
        if client_order_id >= crate::rematch::REPLACEMENT_CLIENT_ORDER_ID_BASE {
            return None;
        }
        let id = ServiceId(offset / limits::BIDS_MAX);
        let service = self.services.get(&id).filter(|s| s.account == account)?;
        service.slots.iter().find(|(_, s)| s.client_order_id == Some(client_order_id)).map(|(slot, _)| (id, *slot))
    }

    /// What the replica a lease runs was handed (for its host's restart).
    pub fn replica_of(&self, lease: LeaseId) -> Option<ReplicaAssignment> {
        let &(id, slot) = self.leases.get(&lease)?;
        let spec = &self.services.get(&id)?.spec;
        Some(ReplicaAssignment {
            service: id,
            slot,
            image: spec.image.clone(),
            command: spec.command.clone(),
            port: spec.port,
            readiness_path: spec.readiness_path.clone(),
        })
    }

    /// Whether a lease runs one of the services' replicas.
    pub fn runs_on(&self, lease: LeaseId) -> bool {
        self.leases.contains_key(&lease)
    }

    /// Follows one engine entry's events.
    pub fn observe(&mut self, events: &[Event]) -> Outcome {
        let mut outcome = Outcome::default();
        let mut buy_order = None;
        for event in events {
            let at_ms = event.at_ms;
            match event.kind {
                EventKind::OrderAccepted { order, account, client_order_id, .. } => {
                    if let Some((id, slot)) = self.slot_of_bid(account, client_order_id) {
                        self.slot_mut(id, slot).order = Some(order);
                        self.orders.insert(order, (id, slot));
                    }
                }
                EventKind::Rejected { account: Some(account), client_order_id, code } => {
                    if let Some((id, slot)) = self.slot_of_bid(account, client_order_id) {
                        let s = self.slot_mut(id, slot);
                        s.client_order_id = None;
                        s.stalled = Some(format!("bid refused: {}", code.name()));
                        s.since_ms = at_ms;
                        self.touch(id, at_ms, &mut outcome);
                    }
                }
                EventKind::Trade { buy_order: order, .. } => buy_order = Some(order),
                EventKind::LeaseCreated { lease, supplier, .. } => {
                    let Some(&(id, slot)) = buy_order.and_then(|order| self.orders.get(&order)) else { continue };
                    self.orders.remove(&buy_order.expect("matched"));
                    self.leases.insert(lease, (id, slot));
                    self.heard.insert(lease, crate::jobs::Heard::new(supplier, at_ms));
                    let service = self.services.get_mut(&id).expect("present");
                    // Every one is kept: the service's bill is theirs. At
                    // most one per bid, and a service places at most
                    // `limits::BIDS_MAX`.
                    service.leases.push_back(lease);
                    let replica = self.replica_of(lease).expect("its lease was just recorded");
                    let s = self.slot_mut(id, slot);
                    *s = Slot { state: ReplicaState::Starting, lease: Some(lease), generation: s.generation, ..Slot::bidding(at_ms) };
                    outcome.assigned.push((lease, supplier, replica));
                    self.touch(id, at_ms, &mut outcome);
                }
                EventKind::OrderClosed { order, reason, .. } if reason != OrderCloseReason::Filled => {
                    // Closed without a fill (the fill's lease removed it
                    // above): the slot waits for the renter.
                    if let Some((id, slot)) = self.orders.remove(&order) {
                        let s = self.slot_mut(id, slot);
                        s.client_order_id = None;
                        s.order = None;
                        s.stalled = Some(format!("bid closed: {}", reason.name()));
                        s.since_ms = at_ms;
                        self.touch(id, at_ms, &mut outcome);
                    }
                }
                EventKind::PreemptionNotice { lease, .. } => self.noticed(lease, at_ms, &mut outcome),
                EventKind::LeaseEnded { lease, .. } => {
                    self.heard.remove(&lease);
                    let noticed = self.leases.get(&lease).is_some_and(|&(id, slot)| self.services[&id].slots[&slot].noticed);
                    if noticed {
                        // Its stand-in bid at the notice: the slot goes.
                        let (id, slot) = self.leases.remove(&lease).expect("present");
                        self.services.get_mut(&id).expect("present").slots.remove(&slot);
                        self.touch(id, at_ms, &mut outcome);
                    } else if let Some((id, slot)) = self.leases.remove(&lease) {
                        // Lost before the service let it go: replaced.
                        let service = self.services.get_mut(&id).expect("present");
                        service.replaced += 1;
                        *self.slot_mut(id, slot) = Slot::bidding(at_ms);
                        self.bid(id, slot, at_ms, &mut outcome);
                        self.touch(id, at_ms, &mut outcome);
                    }
                }
                _ => {}
            }
        }
        outcome
    }

    /// A host's delivery status for one of its replica leases: running
    /// makes the replica ready (at the endpoint of the service's port);
    /// an exit, or a failure that is the renter's, ends its lease (the
    /// renter's end) and bids a replacement, unless
    /// [`limits::REPLICA_FAILURES_MAX`] such ends came in a row before any
    /// replica became ready: then the service fails.
    pub fn delivery_status(&mut self, lease: LeaseId, supplier: AccountId, state: &DeliveryState, at_ms: u64) -> Outcome {
        let mut outcome = Outcome::default();
        let Some(heard) = self.heard.get_mut(&lease).filter(|h| h.supplier == supplier) else { return outcome };
        heard.last_ms = heard.last_ms.max(at_ms);
        heard.status_seen = true;
        let Some(&(id, slot)) = self.leases.get(&lease) else { return outcome };
        match state {
            DeliveryState::Running { endpoints, .. } => {
                let port = self.services[&id].spec.port;
                let endpoint = endpoints.iter().find(|e| e.container_port == port).map(|e| match e.host.contains(':') {
                    true => format!("[{}]:{}", e.host, e.port),
                    false => format!("{}:{}", e.host, e.port),
                });
                let service = self.services.get_mut(&id).expect("present");
                service.failures_in_row = 0;
                let s = service.slots.get_mut(&slot).expect("present");
                if s.state != ReplicaState::Ready || s.endpoint != endpoint {
                    s.state = ReplicaState::Ready;
                    s.endpoint = endpoint;
                    s.since_ms = at_ms;
                    self.ready_during_rollout(id, slot, at_ms, &mut outcome);
                    self.touch(id, at_ms, &mut outcome);
                }
            }
            DeliveryState::Exited { .. } | DeliveryState::Failed { fault: gpux_protocol::Fault::Renter, .. }
                if self.services[&id].slots[&slot].noticed =>
            {
                // A preempted replica left at its notice's SIGTERM: its
                // stand-in bid already; its lease ends (no failure of the
                // renter's run).
                self.let_go(id, slot, &mut outcome);
                self.touch(id, at_ms, &mut outcome);
            }
            DeliveryState::Exited { .. } | DeliveryState::Failed { fault: gpux_protocol::Fault::Renter, .. } => {
                let service = self.services.get_mut(&id).expect("present");
                service.failures_in_row += 1;
                let account = service.account;
                self.leases.remove(&lease);
                self.heard.remove(&lease);
                outcome.end_leases.push((account, lease));
                let failed = self.services[&id].failures_in_row >= limits::REPLICA_FAILURES_MAX;
                if failed && self.services[&id].rollout.is_some() {
                    // The new run does not start: back to the old one (the
                    // slot bids again there).
                    let service = self.services.get_mut(&id).expect("present");
                    service.replaced += 1;
                    let generation = service.generation;
                    *self.slot_mut(id, slot) = Slot { generation, ..Slot::bidding(at_ms) };
                    self.roll_back(id, at_ms, &mut outcome);
                } else if failed {
                    self.stop(id, ServiceState::Failed, at_ms, &mut outcome);
                } else {
                    self.services.get_mut(&id).expect("present").replaced += 1;
                    *self.slot_mut(id, slot) = Slot::bidding(at_ms);
                    self.bid(id, slot, at_ms, &mut outcome);
                }
                self.touch(id, at_ms, &mut outcome);
            }
            _ => {
                let s = self.slot_mut(id, slot);
                if s.state == ReplicaState::Ready {
                    // A ready replica that reports starting again
                    // (restarted by its host) is not ready.
                    s.state = ReplicaState::Starting;
                    s.endpoint = None;
                    s.since_ms = at_ms;
                    self.touch(id, at_ms, &mut outcome);
                }
            }
        }
        outcome
    }

    /// A usage report for a replica lease from its supplier.
    pub fn heard(&mut self, lease: LeaseId, supplier: AccountId, at_ms: u64) {
        if let Some(heard) = self.heard.get_mut(&lease).filter(|h| h.supplier == supplier) {
            heard.last_ms = heard.last_ms.max(at_ms);
        }
    }

    /// Replica leases whose host counts as gone, by the jobs' silence rule.
    pub fn silent_leases(
        &self,
        now_ms: u64,
        rules: crate::jobs::Silence,
        connected: impl Fn(LeaseId, AccountId) -> bool,
    ) -> Vec<(LeaseId, AccountId)> {
        self.heard
            .iter()
            .filter(|(lease, h)| h.gone(now_ms, rules, || connected(**lease, h.supplier)))
            .map(|(l, h)| (*l, h.supplier))
            .collect()
    }

    /// The service as its renter sees it.
    pub fn info(&self, id: ServiceId, account: AccountId) -> Option<ServiceInfo> {
        let service = self.services.get(&id).filter(|s| s.account == account)?;
        Some(ServiceInfo {
            service: id,
            spec: service.spec.clone(),
            state: service.state,
            replicas: service
                .slots
                .iter()
                .map(|(&slot, s)| ReplicaInfo {
                    slot,
                    state: s.state,
                    lease: s.lease,
                    endpoint: s.endpoint.clone(),
                    stalled: s.stalled.clone(),
                    since_ms: s.since_ms,
                    generation: s.generation,
                    noticed: s.noticed,
                })
                .collect(),
            bids: service.bids,
            replaced: service.replaced,
            leases: service
                .leases
                .iter()
                .skip(service.leases.len().saturating_sub(gpux_protocol::services::INFO_LEASES_MAX))
                .copied()
                .collect(),
            created_at_ms: service.created_at_ms,
            updated_at_ms: service.updated_at_ms,
            last_scaling: service.last_scaling.clone(),
            generation: service.generation,
            rollout: service.last_rollout,
            floor: service.terms.floor,
        })
    }

    /// The account's services, newest first: a page from `offset`, and
    /// whether more follow.
    pub fn list(&self, account: AccountId, offset: usize, max: usize) -> (Vec<ServiceInfo>, bool) {
        let mut ids: Vec<ServiceId> =
            self.live.range((account, ServiceId(0))..=(account, ServiceId(u64::MAX))).map(|(_, id)| *id).collect();
        ids.extend(self.deleted.get(&account).into_iter().flatten().copied());
        ids.sort_unstable_by(|a, b| b.cmp(a));
        let page: Vec<ServiceInfo> = ids.iter().skip(offset).take(max).filter_map(|id| self.info(*id, account)).collect();
        (page, ids.len() > offset + max)
    }

    /// Every lease the renter's service ran on, oldest first, and when it
    /// was created: what its bill covers.
    pub fn bill_of(&self, id: ServiceId, account: AccountId) -> Option<(Vec<LeaseId>, u64)> {
        let service = self.services.get(&id).filter(|s| s.account == account)?;
        Some((service.leases.iter().copied().collect(), service.created_at_ms))
    }

    /// The renter of a service (for its notices).
    pub fn account_of(&self, id: ServiceId) -> Option<AccountId> {
        self.services.get(&id).map(|s| s.account)
    }

    /// A replica's lease got a preemption notice: a stand-in is bid for at
    /// once beside it (while no update rolls), so that a replacement can
    /// be ready before the notice runs out; the noticed slot goes when its
    /// lease ends.
    fn noticed(&mut self, lease: LeaseId, at_ms: u64, outcome: &mut Outcome) {
        let Some(&(id, slot)) = self.leases.get(&lease) else { return };
        let service = self.services.get_mut(&id).expect("present");
        if service.state != ServiceState::Running || service.rollout.is_some() || service.slots[&slot].noticed {
            return;
        }
        service.slots.get_mut(&slot).expect("present").noticed = true;
        service.replaced += 1;
        let stand_in = (0..).find(|s| !service.slots.contains_key(s)).expect("unbounded");
        service.slots.insert(stand_in, Slot::bidding(at_ms));
        self.bid(id, stand_in, at_ms, outcome);
        self.touch(id, at_ms, outcome);
    }

    fn slot_mut(&mut self, id: ServiceId, slot: u32) -> &mut Slot {
        self.services.get_mut(&id).and_then(|s| s.slots.get_mut(&slot)).expect("a service's slot")
    }

    fn touch(&mut self, id: ServiceId, at_ms: u64, outcome: &mut Outcome) {
        if let Some(service) = self.services.get_mut(&id) {
            service.updated_at_ms = service.updated_at_ms.max(at_ms);
        }
        outcome.changed.insert(id);
    }

    /// A slot the service no longer keeps: its bid cancelled or its lease
    /// ended by the renter.
    fn let_go(&mut self, id: ServiceId, slot: u32, outcome: &mut Outcome) {
        let service = self.services.get_mut(&id).expect("present");
        let account = service.account;
        let Some(s) = service.slots.remove(&slot) else { return };
        if let Some(order) = s.order.filter(|_| s.lease.is_none()) {
            self.orders.remove(&order);
            outcome.cancel_orders.push((account, order));
        }
        if let Some(lease) = s.lease {
            self.leases.remove(&lease);
            self.heard.remove(&lease);
            outcome.end_leases.push((account, lease));
        }
    }

    /// The service stops in `state`: every slot let go.
    fn stop(&mut self, id: ServiceId, state: ServiceState, at_ms: u64, outcome: &mut Outcome) {
        let slots: Vec<u32> = self.services[&id].slots.keys().copied().collect();
        for slot in slots {
            self.let_go(id, slot, outcome);
        }
        let service = self.services.get_mut(&id).expect("present");
        service.state = state;
        service.rollout = None;
        self.touch(id, at_ms, outcome);
    }

    /// The bid for a replica: open-ended, on one host, all its GPUs or
    /// none, resting until it fills, at the service's limit.
    fn bid(&mut self, id: ServiceId, slot: u32, at_ms: u64, outcome: &mut Outcome) {
        let service = self.services.get_mut(&id).expect("present");
        if service.state != ServiceState::Running {
            return;
        }
        if service.bids >= limits::BIDS_MAX {
            service.state = ServiceState::BidsExhausted;
            return;
        }
        let client_order_id = SERVICE_CLIENT_ORDER_ID_BASE + id.0 * limits::BIDS_MAX + service.bids;
        service.bids += 1;
        let spec = &service.spec;
        let (instrument, limit) = match service.terms.floor.filter(|floor| slot < floor.replicas) {
            Some(floor) => (floor.instrument, floor.limit_minor_per_gpu_hour),
            None => (spec.instrument, spec.limit_minor_per_gpu_hour),
        };
        let order = NewOrder {
            time_in_force: TimeInForce::Gtc,
            self_trade_prevention: SelfTradePrevention::CancelNewest,
            one_host: true,
            duration: LeaseDuration::UntilCancelled,
            ..NewOrder::limit(service.account, client_order_id, instrument, Side::Buy, limit, spec.gpus)
        };
        let options = OrderOptions { all_or_none: true, min_supplier_score_bps: spec.min_supplier_score_bps, ..OrderOptions::default() };
        outcome.bids.push(Command::Place { order, options, regions: spec.regions.clone(), cluster: None });
        let generation = service.generation;
        let s = service.slots.get_mut(&slot).expect("present");
        *s = Slot { client_order_id: Some(client_order_id), generation, ..Slot::bidding(at_ms) };
    }
}
