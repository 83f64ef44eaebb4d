//! A service's life against the real market (docs/services.md): it bids for
//! its replicas, hands each to the host its bid filled on, replaces one
//! whose host failed it or whose workload exited, scales, fails after
//! replicas that never become ready, and is deleted; every step journaled
//! as the sequencer journals it, and the journal replays to the same state.

use gpux_engine::*;
use gpux_market::{Applied, JournalEntry, MarketState};
use gpux_protocol::{
    DeliveryState, Endpoint, ErrorCode, FailureCode, Fault, ReplicaState, ServerMessage, ServiceId, ServiceInfo, ServiceSpec, ServiceState,
};

const T0: u64 = 1_796_223_600_000;
const PRICE: u64 = 2_000_000;

struct Journal {
    market: MarketState,
    entries: Vec<JournalEntry>,
    now_ms: u64,
    /// Replicas handed to hosts: (lease, supplier account told, slot).
    assigned: Vec<(LeaseId, u32)>,
    /// Every `service_update` the renter was told.
    updates: Vec<ServiceInfo>,
}

impl Journal {
    fn new() -> Journal {
        Journal {
            market: MarketState::new(EngineConfig::demo()).expect("demo"),
            entries: Vec::new(),
            now_ms: T0,
            assigned: Vec::new(),
            updates: Vec::new(),
        }
    }

    /// Journals and applies an entry, then each follow-up, as the sequencer does.
    fn record(&mut self, entry: JournalEntry) -> Applied {
        let applied = self.market.apply(&entry).expect("applies");
        self.entries.push(entry);
        for notice in &applied.notices {
            match &notice.message {
                ServerMessage::ReplicaAssigned { lease, replica } => {
                    assert_eq!(notice.to, gpux_market::Audience::account(self.market.engine().lease(*lease).expect("lease").supplier));
                    self.assigned.push((*lease, replica.slot));
                }
                ServerMessage::ServiceUpdate { service } => self.updates.push((**service).clone()),
                _ => {}
            }
        }
        for command in applied.follow_ups.clone() {
            self.engine(command);
        }
        applied
    }

    fn engine(&mut self, command: Command) -> Vec<Event> {
        self.now_ms += 1;
        self.record(JournalEntry::Engine(Input { at_ms: self.now_ms, command })).events
    }

    fn info(&self, service: ServiceId) -> ServiceInfo {
        self.market.services().info(service, RENTER).expect("the renter's service")
    }

    fn status(&mut self, lease: LeaseId, state: DeliveryState) {
        self.now_ms += 1;
        self.record(JournalEntry::DeliveryStatus { at_ms: self.now_ms, account: SUPPLIER, lease, state });
    }

    fn running(&mut self, lease: LeaseId, port: u16) {
        let endpoints = vec![Endpoint { container_port: 8000, host: format!("10.0.0.{}", lease.0), port }];
        self.status(lease, DeliveryState::Running { endpoints, ssh: None, restarts: 0 });
    }
}

const RENTER: AccountId = AccountId(0);
const SUPPLIER: AccountId = AccountId(1);

/// A market with a renter, a supplier whose hosts deliver workloads and
/// `hosts` hosts of one H100 each, each offered on the spot book.
fn market(hosts: usize, deposit: u64) -> Journal {
    let mut j = Journal::new();
    j.engine(Command::OpenAccount { role: Role::Renter });
    j.engine(Command::OpenAccount { role: Role::Supplier });
    let identity = ed25519_dalek::SigningKey::from_bytes(&[41; 32]);
    let key = gpux_protocol::delivery::EncryptionKey::from_bytes([51; 32]);
    j.record(JournalEntry::EncryptionKey { account: SUPPLIER, key: key.public(), signature: key.certify(&identity) });
    if deposit > 0 {
        j.engine(Command::Deposit { account: RENTER, amount_minor: deposit });
    }
    for host in 0..hosts {
        ask(&mut j, host);
    }
    j
}

/// Registers host `index` (one GPU) and offers it on the spot book.
fn ask(j: &mut Journal, index: usize) {
    let events = j.engine(Command::register(SUPPLIER, &format!("host-{index}"), &format!("GPU-{index}"), GpuSpec::h100_sxm()));
    let host = events.iter().find_map(|e| match e.kind {
        EventKind::GpuRegistered { host, .. } => Some(host),
        _ => None,
    });
    let mut order = NewOrder::limit(SUPPLIER, 1_000 + index as u64, InstrumentId(0), Side::Sell, PRICE, 1);
    order.supply = Some(GpuSet { host: host.expect("registered"), gpu_mask: 0b1 });
    j.engine(Command::place(order));
}

fn spec(replicas: u32) -> ServiceSpec {
    ServiceSpec {
        name: "echo".into(),
        instrument: InstrumentId(0),
        gpus: 1,
        limit_minor_per_gpu_hour: PRICE,
        budget_minor_per_hour: 4 * PRICE,
        replicas,
        min_replicas: 0,
        max_replicas: 4,
        image: "localhost/gpux-test:latest".into(),
        command: vec!["python3".into(), "-m".into(), "http.server".into(), "8000".into()],
        port: 8000,
        readiness_path: Some("/".into()),
        regions: Vec::new(),
        min_supplier_score_bps: 0,
        scaling: None,
        key_hashes: Vec::new(),
    }
}

fn create(j: &mut Journal, spec: ServiceSpec) -> Result<ServiceId, ErrorCode> {
    j.now_ms += 1;
    j.record(JournalEntry::CreateService { at_ms: j.now_ms, account: RENTER, spec: Box::new(spec) }).service.expect("a service entry")
}

fn scale(j: &mut Journal, service: ServiceId, replicas: u32) -> Result<ServiceId, ErrorCode> {
    j.now_ms += 1;
    j.record(JournalEntry::ScaleService { at_ms: j.now_ms, account: RENTER, service, replicas }).service.expect("a service entry")
}

fn states(info: &ServiceInfo) -> Vec<ReplicaState> {
    info.replicas.iter().map(|r| r.state).collect()
}

fn active(j: &Journal, lease: LeaseId) -> bool {
    j.market.engine().lease(lease).is_some_and(|l| l.active)
}

fn replay(j: &Journal) {
    let mut again = MarketState::new(EngineConfig::demo()).expect("demo");
    for entry in &j.entries {
        again.apply(entry).expect("replays");
    }
    assert_eq!(again.state_hash(), j.market.state_hash(), "the journal replays to the same state");
}

#[test]
fn a_service_keeps_its_replicas_through_a_host_failure_and_an_exit_scales_and_is_deleted() {
    let mut j = market(3, 1_000_000_000);
    let service = create(&mut j, spec(2)).expect("created");
    let info = j.info(service);
    assert_eq!(info.state, ServiceState::Running);
    assert_eq!(states(&info), [ReplicaState::Starting, ReplicaState::Starting], "both bids filled on hosts offered");
    assert_eq!(j.assigned.len(), 2, "each replica handed to its host");
    let (first, second) = (j.assigned[0].0, j.assigned[1].0);
    // Each replica's workload publishes the service's port.
    let workload = j.market.deliveries().lease(first).and_then(|d| d.workload.clone()).expect("the replica's workload");
    assert_eq!(workload.ports, [8000]);

    // Running: ready at the endpoint of the service's port.
    j.running(first, 31_001);
    j.running(second, 31_002);
    let info = j.info(service);
    assert_eq!(states(&info), [ReplicaState::Ready, ReplicaState::Ready]);
    assert_eq!(info.replicas[0].endpoint.as_deref(), Some(format!("10.0.0.{}:31001", first.0).as_str()));

    // The first replica's host fails it: its lease ends, a replacement is
    // bid at once and fills on the third host, in the same slot.
    let failed = DeliveryState::Failed { code: FailureCode::HostError, fault: Fault::Host, reason: "gpu lost".into() };
    j.status(first, failed);
    assert!(!active(&j, first), "the failed lease ended");
    let info = j.info(service);
    assert_eq!(info.replaced, 1);
    assert_eq!(info.bids, 3);
    let (third, slot) = *j.assigned.last().expect("a replacement");
    assert_eq!(slot, 0, "the replacement takes the failed replica's slot");
    assert_eq!(states(&info), [ReplicaState::Starting, ReplicaState::Ready]);
    j.running(third, 31_003);

    // The second replica's workload exits: the service ends its lease
    // (the renter's end) and bids again; no host is offered, so it rests.
    j.status(second, DeliveryState::Exited { code: 1 });
    assert!(!active(&j, second), "the exited replica's lease ended");
    let info = j.info(service);
    assert_eq!(states(&info), [ReplicaState::Ready, ReplicaState::Bidding]);
    assert_eq!(info.replaced, 2);
    // A host offered later fills it.
    ask(&mut j, 3);
    assert_eq!(states(&j.info(service)), [ReplicaState::Ready, ReplicaState::Starting]);
    let fourth = j.assigned.last().expect("filled").0;

    // Scaling: outside the bounds refused; down to one lets the replica
    // furthest from serving go (the one still starting).
    assert_eq!(scale(&mut j, service, 5), Err(ErrorCode::ServiceScaleInvalid));
    assert_eq!(scale(&mut j, service, 1), Ok(service));
    assert!(!active(&j, fourth), "the starting replica let go");
    assert!(active(&j, third), "the ready one kept");
    assert_eq!(states(&j.info(service)), [ReplicaState::Ready]);
    // Up to two: a bid rests (no host offered).
    assert_eq!(scale(&mut j, service, 2), Ok(service));
    assert_eq!(states(&j.info(service)), [ReplicaState::Ready, ReplicaState::Bidding]);
    // Another account cannot touch it.
    j.now_ms += 1;
    let other = j.record(JournalEntry::DeleteService { at_ms: j.now_ms, account: SUPPLIER, service }).service;
    assert_eq!(other, Some(Err(ErrorCode::UnknownService)));

    // Deleted: the resting bid cancelled, the lease ended.
    j.now_ms += 1;
    j.record(JournalEntry::DeleteService { at_ms: j.now_ms, account: RENTER, service });
    let info = j.info(service);
    assert_eq!(info.state, ServiceState::Deleted);
    assert!(info.replicas.is_empty());
    assert!(!active(&j, third));
    assert!(j.market.engine().open_orders(RENTER).is_empty(), "no bid left: {:?}", j.market.engine().open_orders(RENTER));
    assert_eq!(j.updates.last().map(|u| u.state), Some(ServiceState::Deleted), "the renter told");
    replay(&j);
}

#[test]
fn replicas_that_never_become_ready_fail_the_service_rather_than_buy_forever() {
    let mut j = market(8, 1_000_000_000);
    let service = create(&mut j, spec(1)).expect("created");
    for failure in 1..=gpux_protocol::services::limits::REPLICA_FAILURES_MAX {
        let lease = j.assigned.last().expect("a replica").0;
        j.status(lease, DeliveryState::Failed { code: FailureCode::PullFailed, fault: Fault::Renter, reason: "no image".into() });
        assert!(!active(&j, lease));
        let state = j.info(service).state;
        match failure < gpux_protocol::services::limits::REPLICA_FAILURES_MAX {
            true => assert_eq!(state, ServiceState::Running, "replaced after failure {failure}"),
            false => assert_eq!(state, ServiceState::Failed),
        }
    }
    assert!(j.market.engine().open_orders(RENTER).is_empty(), "a failed service bids no more");
    assert_eq!(scale(&mut j, service, 1), Err(ErrorCode::ServiceScaleInvalid), "nor scales");
    replay(&j);
}

#[test]
fn a_refused_bid_waits_for_the_renter_and_bounds_are_refused_in_the_journal() {
    // No funds: the bid is refused and the replica waits, saying why.
    let mut j = market(1, 0);
    let service = create(&mut j, spec(1)).expect("created");
    let info = j.info(service);
    assert_eq!(states(&info), [ReplicaState::Bidding]);
    assert_eq!(info.replicas[0].stalled.as_deref(), Some("bid refused: insufficient_funds"));
    assert_eq!(info.bids, 1, "refused once, not again and again");
    // Funded, the renter's scale bids again and it fills.
    j.engine(Command::Deposit { account: RENTER, amount_minor: 1_000_000_000 });
    assert_eq!(scale(&mut j, service, 1), Ok(service));
    let info = j.info(service);
    assert_eq!(states(&info), [ReplicaState::Starting]);
    assert_eq!(info.replicas[0].stalled, None);

    // A spec out of bounds and the account's most.
    assert_eq!(create(&mut j, ServiceSpec { port: 0, ..spec(1) }), Err(ErrorCode::ServiceInvalid));
    for _ in 1..gpux_protocol::services::limits::SERVICES_PER_ACCOUNT_MAX {
        create(&mut j, spec(0)).expect("within the account's most");
    }
    assert_eq!(create(&mut j, spec(0)), Err(ErrorCode::TooManyServices));
    let (page, more) = j.market.services().list(RENTER, 0, 10);
    assert_eq!((page.len(), more), (10, true));
    assert!(page.windows(2).all(|w| w[0].service > w[1].service), "newest first");
    replay(&j);
}

#[test]
fn routers_loads_are_summed_and_scale_a_service_up_down_to_zero_and_wake_it() {
    use gpux_protocol::{ScalingTarget, ServiceLoad, ServiceScaling};
    let mut j = market(6, 1_000_000_000);
    let scaling = ServiceScaling { target: ScalingTarget::InFlight(2), up_window_ms: 2_000, down_window_ms: 10_000 };
    let service = create(&mut j, ServiceSpec { scaling: Some(scaling), ..spec(1) }).expect("created");
    let load = |j: &mut Journal, at_ms: u64, router: u32, in_flight: u32, queued: u32| {
        j.now_ms = at_ms;
        let load = ServiceLoad { requests_per_second_milli: 0, in_flight, queued };
        j.record(JournalEntry::ServiceLoad { at_ms, account: RENTER, service, router, load }).service.expect("a service entry")
    };
    let t = j.now_ms + 1_000;
    // Two routers, 3 in flight each: 6 wants 3 replicas; added once the
    // load wanted them for the whole up window (the first report, router
    // 1's alone, wanted 2: the window's fewest went to 2 first).
    for second in 0..=2 {
        load(&mut j, t + second * 1_000, 1, 3, 0).expect("taken");
        load(&mut j, t + second * 1_000 + 1, 2, 3, 0).expect("taken");
    }
    let info = j.info(service);
    assert_eq!(info.replicas.len(), 3, "{:?}", info.last_scaling);
    let decision = info.last_scaling.clone().expect("a decision");
    assert_eq!((decision.from, decision.to, decision.reason.as_str()), (2, 3, "load_above"));
    // Router 2 stops reporting: its last report goes stale and router 1's
    // 3 alone want 2 (once its report is 5 s old); after a down window of
    // that, the service goes to 2.
    let t = t + 3_000;
    for second in 0..=16 {
        load(&mut j, t + second * 1_000, 1, 3, 0).expect("taken");
    }
    let info = j.info(service);
    assert_eq!(info.replicas.len(), 2);
    assert_eq!(info.last_scaling.as_ref().map(|d| d.reason.as_str()), Some("load_below"));
    // Idle for the down window: to zero.
    let t = t + 17_000;
    for second in 0..=11 {
        load(&mut j, t + second * 1_000, 1, 0, 0).expect("taken");
    }
    let info = j.info(service);
    assert!(info.replicas.is_empty(), "{:?}", info.last_scaling);
    assert_eq!(info.last_scaling.as_ref().map(|d| d.reason.as_str()), Some("idle"));
    // A request waits: woken at once.
    load(&mut j, t + 12_500, 1, 0, 1).expect("taken");
    let info = j.info(service);
    assert_eq!(info.replicas.len(), 1);
    assert_eq!(info.last_scaling.as_ref().map(|d| (d.from, d.to, d.reason.as_str())), Some((0, 1, "woken")));
    // A service without autoscaling takes no load.
    let manual = create(&mut j, spec(0)).expect("created");
    j.now_ms += 1;
    let refused = j
        .record(JournalEntry::ServiceLoad { at_ms: j.now_ms, account: RENTER, service: manual, router: 1, load: ServiceLoad::default() })
        .service;
    assert_eq!(refused, Some(Err(ErrorCode::ServiceNotScaling)));
    replay(&j);
}

fn update(j: &mut Journal, service: ServiceId, image: &str) -> Result<ServiceId, ErrorCode> {
    j.now_ms += 1;
    let run = gpux_protocol::ServiceRun { image: image.into(), ..spec(0).run() };
    j.record(JournalEntry::UpdateService { at_ms: j.now_ms, account: RENTER, service, run }).service.expect("a service entry")
}

fn ready_count(j: &Journal, service: ServiceId) -> usize {
    j.info(service).replicas.iter().filter(|r| r.state == ReplicaState::Ready).count()
}

#[test]
fn a_rolling_update_brings_each_new_replica_up_before_an_old_one_goes_and_rolls_back_when_it_cannot_start() {
    use gpux_protocol::RolloutState;
    let mut j = market(6, 1_000_000_000);
    let service = create(&mut j, spec(2)).expect("created");
    let first: Vec<LeaseId> = j.assigned.iter().map(|(l, _)| *l).collect();
    for lease in &first {
        j.running(*lease, 30_000 + lease.0 as u16);
    }
    assert_eq!(ready_count(&j, service), 2);

    // Update: one new replica bid beside the two old ones.
    assert_eq!(update(&mut j, service, "localhost/gpux-test:v2"), Ok(service));
    let info = j.info(service);
    assert_eq!((info.generation, info.rollout), (1, Some(RolloutState::Rolling)));
    assert_eq!(info.replicas.len(), 3, "a surge replica beside the old ones");
    assert_eq!(ready_count(&j, service), 2, "the old ones serve on");
    assert_eq!(scale(&mut j, service, 3), Err(ErrorCode::ServiceScaleInvalid), "no scale while it rolls");
    assert_eq!(update(&mut j, service, "localhost/gpux-test:v3"), Err(ErrorCode::ServiceNotRunning), "one update at a time");
    for step in 0..2 {
        let (new, _) = *j.assigned.last().expect("the new replica");
        assert!(!first.contains(&new));
        j.running(new, 31_000 + step);
        assert!(ready_count(&j, service) >= 2, "never fewer ready than before, step {step}");
    }
    let info = j.info(service);
    assert_eq!(info.rollout, Some(RolloutState::Done));
    assert_eq!(info.replicas.len(), 2);
    assert!(info.replicas.iter().all(|r| r.generation == 1 && r.state == ReplicaState::Ready), "{:?}", info.replicas);
    assert!(first.iter().all(|lease| !active(&j, *lease)), "the old replicas' leases ended");
    assert_eq!(info.spec.image, "localhost/gpux-test:v2");

    // An update whose replicas cannot start: after 5 failures in a row,
    // back to the old run; the old replicas never stopped serving.
    let serving: Vec<LeaseId> = info.replicas.iter().filter_map(|r| r.lease).collect();
    assert_eq!(update(&mut j, service, "localhost/gpux-test:broken"), Ok(service));
    for _ in 0..gpux_protocol::services::limits::REPLICA_FAILURES_MAX {
        if j.info(service).rollout != Some(RolloutState::Rolling) {
            break;
        }
        let host = j.assigned.len() + 10;
        ask(&mut j, host);
        let (lease, _) = *j.assigned.last().expect("a new replica");
        assert!(!serving.contains(&lease));
        j.status(lease, DeliveryState::Failed { code: FailureCode::PullFailed, fault: Fault::Renter, reason: "no such image".into() });
        assert!(serving.iter().all(|lease| active(&j, *lease)), "the old replicas serve on");
    }
    let info = j.info(service);
    assert_eq!(info.rollout, Some(RolloutState::RolledBack));
    assert_eq!(info.state, ServiceState::Running);
    assert_eq!(info.spec.image, "localhost/gpux-test:v2", "the old run is back");
    assert_eq!(info.replicas.len(), 2);
    assert_eq!(ready_count(&j, service), 2);
    assert!(j.market.engine().open_orders(RENTER).is_empty(), "no bid left behind: {:?}", j.market.engine().open_orders(RENTER));
    replay(&j);
}

/// Registers host `index` (one GPU) offered on the preemptible book, and
/// on the spot book too when `spot`: a spot buyer then preempts it.
fn preemptible_ask(j: &mut Journal, index: usize, spot: bool) {
    let events = j.engine(Command::register(SUPPLIER, &format!("host-{index}"), &format!("GPU-{index}"), GpuSpec::h100_sxm()));
    let host = events.iter().find_map(|e| match e.kind {
        EventKind::GpuRegistered { host, .. } => Some(host),
        _ => None,
    });
    let supply = Some(GpuSet { host: host.expect("registered"), gpu_mask: 0b1 });
    let order = NewOrder { supply, ..NewOrder::limit(SUPPLIER, 1_000 + index as u64, InstrumentId(1), Side::Sell, PRICE / 2, 1) };
    j.engine(Command::place(order));
    if spot {
        let order = NewOrder { supply, ..NewOrder::limit(SUPPLIER, 2_000 + index as u64, InstrumentId(0), Side::Sell, PRICE, 1) };
        j.engine(Command::place(order));
    }
}

/// A preemptible replica's notice: a stand-in is bid for at once and is
/// ready while the noticed replica still serves; the noticed one goes
/// when its lease ends (its workload's exit at the SIGTERM is no failure
/// of the run, and bids nothing more); the scaler counts the stand-in,
/// not both; the journal replays.
#[test]
fn a_preempted_replica_is_replaced_at_its_notice_before_it_goes() {
    let mut j = market(0, 1_000_000_000);
    // Host 0 sells preemptible and spot time; hosts 1 and 2 preemptible only.
    preemptible_ask(&mut j, 0, true);
    preemptible_ask(&mut j, 1, false);
    let service =
        create(&mut j, ServiceSpec { instrument: InstrumentId(1), limit_minor_per_gpu_hour: PRICE / 2, ..spec(2) }).expect("created");
    let leases: Vec<LeaseId> = j.info(service).replicas.iter().map(|r| r.lease.expect("filled")).collect();
    for (port, lease) in leases.iter().enumerate() {
        j.running(*lease, 30_000 + port as u16);
    }
    assert_eq!(states(&j.info(service)), [ReplicaState::Ready, ReplicaState::Ready]);
    let on_host_0 = *leases.iter().find(|l| j.market.engine().lease(**l).is_some_and(|i| i.gpus[0] == GpuId(0))).expect("host 0 serves");
    // A third host offers preemptible time; a spot buyer takes host 0.
    preemptible_ask(&mut j, 2, false);
    j.engine(Command::OpenAccount { role: Role::Renter });
    let urgent = AccountId(2);
    j.engine(Command::Deposit { account: urgent, amount_minor: 1_000_000_000 });
    let bid = NewOrder { duration: LeaseDuration::Hours(1), ..NewOrder::limit(urgent, 1, InstrumentId(0), Side::Buy, PRICE, 1) };
    let events = j.engine(Command::place(bid));
    assert!(events.iter().any(|e| matches!(e.kind, EventKind::PreemptionNotice { lease, .. } if lease == on_host_0)), "{events:?}");

    // At the notice: the noticed replica still serves, its stand-in's bid
    // filled on host 2 in the same entries.
    let info = j.info(service);
    assert_eq!(info.replicas.len(), 3, "{:?}", info.replicas);
    let noticed: Vec<bool> = info.replicas.iter().map(|r| r.noticed).collect();
    assert_eq!(noticed.iter().filter(|n| **n).count(), 1);
    let noticed_replica = info.replicas.iter().find(|r| r.noticed).expect("noticed");
    assert_eq!((noticed_replica.lease, noticed_replica.state), (Some(on_host_0), ReplicaState::Ready), "it still serves");
    let stand_in = info.replicas.iter().find(|r| r.lease.is_some_and(|l| !leases.contains(&l))).expect("the stand-in's lease");
    assert_eq!(stand_in.state, ReplicaState::Starting);
    assert_eq!(info.replaced, 1);
    let stand_in_lease = stand_in.lease.expect("leased");
    j.running(stand_in_lease, 30_002);
    assert_eq!(ready_count(&j, service), 3, "the stand-in is ready before the noticed one goes");
    // A scale to 2 lets nothing go: the noticed replica is not counted.
    scale(&mut j, service, 2).expect("scaled");
    assert_eq!(j.info(service).replicas.len(), 3);

    // The workload exits at the SIGTERM: no failure, no new bid.
    let bids = j.info(service).bids;
    j.status(on_host_0, DeliveryState::Exited { code: 0 });
    let info = j.info(service);
    assert_eq!(info.replicas.len(), 2, "the noticed replica went: {:?}", info.replicas);
    assert!(info.replicas.iter().all(|r| !r.noticed && r.state == ReplicaState::Ready));
    assert_eq!((info.bids, info.replaced, info.state), (bids, 1, ServiceState::Running));
    // The notice runs out: the lease was already let go; nothing more moves.
    j.now_ms += 60_000;
    j.engine(Command::Tick);
    assert!(!active(&j, on_host_0));
    assert_eq!(j.info(service).replicas.len(), 2);
    replay(&j);
}

/// A noticed replica whose lease simply runs out (its host stops it at the
/// deadline) goes too; its stand-in keeps the count.
#[test]
fn a_noticed_replica_whose_lease_runs_out_goes_and_its_stand_in_stays() {
    let mut j = market(0, 1_000_000_000);
    preemptible_ask(&mut j, 0, true);
    let service =
        create(&mut j, ServiceSpec { instrument: InstrumentId(1), limit_minor_per_gpu_hour: PRICE / 2, ..spec(1) }).expect("created");
    let first = j.info(service).replicas[0].lease.expect("filled");
    j.running(first, 30_000);
    j.engine(Command::OpenAccount { role: Role::Renter });
    let urgent = AccountId(2);
    j.engine(Command::Deposit { account: urgent, amount_minor: 1_000_000_000 });
    let bid = NewOrder { duration: LeaseDuration::Hours(1), ..NewOrder::limit(urgent, 1, InstrumentId(0), Side::Buy, PRICE, 1) };
    j.engine(Command::place(bid));
    // No other host yet: the stand-in bids and rests.
    let info = j.info(service);
    assert_eq!(states(&info), [ReplicaState::Ready, ReplicaState::Bidding]);
    j.now_ms += 120_000;
    j.engine(Command::Tick);
    assert!(!active(&j, first), "the notice ran out");
    let info = j.info(service);
    assert_eq!(states(&info), [ReplicaState::Bidding], "the stand-in stays, nothing else bids: {:?}", info.replicas);
    assert_eq!((info.bids, info.replaced), (2, 1));
    // A host comes: the stand-in fills.
    preemptible_ask(&mut j, 1, false);
    assert_eq!(states(&j.info(service)), [ReplicaState::Starting]);
    replay(&j);
}

/// A floor: slot 0 bids the spot book at the floor's limit, the rest the
/// service's preemptible book; a scale down keeps the floor; the floor's
/// replica lost is bid again on the spot book; a floor above min_replicas
/// is refused; the journal (CreateServiceV2) replays.
#[test]
fn a_floor_keeps_its_replicas_on_the_spot_book_through_scales_and_losses() {
    let mut j = market(0, 1_000_000_000);
    preemptible_ask(&mut j, 0, true);
    preemptible_ask(&mut j, 1, false);
    let floor = gpux_protocol::ServiceFloor { instrument: InstrumentId(0), replicas: 1, limit_minor_per_gpu_hour: PRICE };
    let spec = ServiceSpec { instrument: InstrumentId(1), limit_minor_per_gpu_hour: PRICE / 2, min_replicas: 1, ..spec(2) };
    let terms = |floor| gpux_market::services::ServiceTerms { floor: Some(floor) };
    j.now_ms += 1;
    let over = gpux_protocol::ServiceFloor { replicas: 2, ..floor };
    let refused =
        j.record(JournalEntry::CreateServiceV2 { at_ms: j.now_ms, account: RENTER, spec: Box::new(spec.clone()), terms: terms(over) });
    assert_eq!(refused.service, Some(Err(ErrorCode::ServiceInvalid)), "a floor above min_replicas");
    j.now_ms += 1;
    let created = j.record(JournalEntry::CreateServiceV2 { at_ms: j.now_ms, account: RENTER, spec: Box::new(spec), terms: terms(floor) });
    let service = created.service.expect("an entry").expect("created");
    let info = j.info(service);
    assert_eq!(info.floor, Some(floor));
    let kind = |j: &Journal, lease: Option<LeaseId>| j.market.engine().lease(lease.expect("leased")).expect("lease").kind;
    assert_eq!(kind(&j, info.replicas[0].lease), LeaseKind::Spot, "slot 0 is the floor's: spot");
    assert_eq!(kind(&j, info.replicas[1].lease), LeaseKind::Preemptible, "slot 1 the service's preemptible book");
    assert_eq!(j.market.engine().lease(info.replicas[0].lease.expect("leased")).expect("lease").price_minor_per_gpu_hour, PRICE);

    // A scale to 1 lets the preemptible replica go, never the floor's.
    scale(&mut j, service, 1).expect("scaled");
    let info = j.info(service);
    assert_eq!(info.replicas.iter().map(|r| r.slot).collect::<Vec<_>>(), [0]);
    assert_eq!(kind(&j, info.replicas[0].lease), LeaseKind::Spot);
    assert_eq!(scale(&mut j, service, 0), Err(ErrorCode::ServiceScaleInvalid), "min_replicas holds the floor");

    // The floor's host goes silent: its slot bids the spot book again, and
    // fills there on a new host's spot ask.
    let lost = info.replicas[0].lease.expect("leased");
    j.now_ms += 1;
    j.record(JournalEntry::JobLeaseSilent { at_ms: j.now_ms, lease: lost });
    assert!(!active(&j, lost));
    assert_eq!(states(&j.info(service)), [ReplicaState::Bidding]);
    ask(&mut j, 2);
    let info = j.info(service);
    assert_eq!(states(&info), [ReplicaState::Starting]);
    assert_eq!(kind(&j, info.replicas[0].lease), LeaseKind::Spot, "replaced on the spot book");
    replay(&j);
}

/// Re-match carries a lease's volumes (docs/storage.md "Volumes"): a bid
/// with a read-write volume, opted into re-match, whose host fails its
/// lease; the replacement bid takes the volume over in the next entry and
/// its lease is given it (its host hears the volumes before the workload),
/// so the renter's files follow the workload; the journal replays.
#[test]
fn a_rematched_replacement_takes_its_failed_leases_volumes_over() {
    let mut j = market(2, 1_000_000_000);
    j.now_ms += 1;
    let created = j.record(JournalEntry::CreateVolume { at_ms: j.now_ms, account: RENTER, name: "data".into(), size_gib: 10 });
    let volume = created.volume.expect("an answer").expect("created").volume;
    let client_order_id = 7;
    let workload = Box::new(gpux_protocol::Workload::image("localhost/app:1"));
    j.record(JournalEntry::BidWorkload { account: RENTER, client_order_id, workload });
    j.record(JournalEntry::BidRematch { account: RENTER, client_order_id });
    let mounts = vec![gpux_protocol::VolumeMount { volume: "data".into(), mount: "/data".into(), read_only: false }];
    j.record(JournalEntry::BidVolumes { account: RENTER, client_order_id, mounts });
    let bid = NewOrder {
        time_in_force: TimeInForce::Ioc,
        duration: LeaseDuration::Hours(2),
        ..NewOrder::limit(RENTER, client_order_id, InstrumentId(0), Side::Buy, PRICE, 1)
    };
    let events = j.engine(Command::place(bid));
    let first = events.iter().find_map(|e| match e.kind {
        EventKind::LeaseCreated { lease, .. } => Some(lease),
        _ => None,
    });
    let first = first.expect("a lease");
    let writer = |j: &Journal| j.market.volumes().info(volume).expect("the volume").writer;
    assert_eq!(writer(&j), Some(first));
    assert_eq!(j.market.volumes().attachments(first).len(), 1);

    // Its host fails it: the replacement's lease writes the volume.
    let failed = DeliveryState::Failed { code: FailureCode::HostError, fault: Fault::Host, reason: "gpu lost".into() };
    j.status(first, failed);
    assert!(!active(&j, first));
    let (leases, _) = j.market.engine().leases_of(RENTER, None, 100);
    let replacement = leases.iter().map(|l| l.lease).find(|l| *l != first && active(&j, *l));
    let replacement = replacement.expect("re-match replaced the lease");
    assert_eq!(writer(&j), Some(replacement), "the replacement took the volume over");
    let given = j.market.volumes().attachments(replacement);
    assert_eq!((given.len(), given[0].mount.as_str(), given[0].read_only), (1, "/data", false), "{given:?}");
    assert!(j.market.volumes().attachments(first).is_empty());
    replay(&j);
}
