//! A job's life against the real engine (docs/jobs.md "A job's life"): it
//! bids, runs, is failed by its host, bids again and runs elsewhere, and
//! finishes; retries and budget run out; cancels; a refused bid.

use gpux_engine::*;
use gpux_market::jobs::{JobFailure, JobId, JobRefusal, JobState, JobTerms, Jobs, Outcome};

const USD_2: u64 = 2_000_000;
const T0: u64 = 1_796_223_600_000;

fn run() -> gpux_market::jobs::JobRun {
    gpux_market::jobs::JobRun::in_image("python:3.11", &["python3", "train.py"])
}

/// The supplier's hosts take workloads: it published the key workloads'
/// secrets are sealed to (a job's bids trade only with such suppliers).
fn delivers(supplier: AccountId) -> gpux_market::JournalEntry {
    let identity = ed25519_dalek::SigningKey::from_bytes(&[supplier.0 as u8 + 40; 32]);
    let key = gpux_protocol::delivery::EncryptionKey::from_bytes([supplier.0 as u8 + 50; 32]);
    gpux_market::JournalEntry::EncryptionKey { account: supplier, key: key.public(), signature: key.certify(&identity) }
}

struct World {
    engine: Engine,
    jobs: Jobs,
    now_ms: u64,
    renter: AccountId,
    supplier: AccountId,
    hosts: Vec<HostId>,
    next_id: u64,
}

impl World {
    fn new(hosts: usize) -> World {
        let mut world = World {
            engine: Engine::new(EngineConfig::demo()).expect("demo"),
            jobs: Jobs::default(),
            now_ms: T0,
            renter: AccountId(0),
            supplier: AccountId(1),
            hosts: Vec::new(),
            next_id: 1,
        };
        world.jobs.adopt_rules(gpux_market::jobs::JOB_RULES);
        world.run(Command::OpenAccount { role: Role::Renter });
        world.run(Command::OpenAccount { role: Role::Supplier });
        world.run(Command::Deposit { account: AccountId(0), amount_minor: 1_000_000_000 });
        for host in 0..hosts {
            let mut id = None;
            for gpu in 0..2 {
                let events =
                    world.run(Command::register(AccountId(1), &format!("host-{host}"), &format!("GPU-{host}-{gpu}"), GpuSpec::h100_sxm()));
                id = events.iter().find_map(|e| match e.kind {
                    EventKind::GpuRegistered { host, .. } => Some(host),
                    _ => None,
                });
            }
            world.hosts.push(id.expect("registered"));
        }
        world
    }

    fn run(&mut self, command: Command) -> Vec<Event> {
        self.now_ms += 1;
        self.engine.apply(&Input { at_ms: self.now_ms, command }).to_vec()
    }

    /// Applies what the jobs asked for, and what the engine then did, until
    /// nothing more is asked; every transition, in order.
    fn follow(&mut self, mut outcome: Outcome) -> Vec<JobState> {
        let mut seen = Vec::new();
        loop {
            seen.extend(outcome.transitions.drain(..).map(|(_, _, state)| state));
            let commands = outcome.commands();
            if commands.is_empty() {
                return seen;
            }
            let mut next = Outcome::default();
            for command in commands {
                let events = self.run(command);
                let more = self.jobs.observe(&events);
                next.bids.extend(more.bids);
                next.end_leases.extend(more.end_leases);
                next.cancel_orders.extend(more.cancel_orders);
                next.transitions.extend(more.transitions);
            }
            outcome = next;
        }
    }

    /// The supplier asks for host `index`'s two GPUs.
    fn ask(&mut self, index: usize) -> Vec<JobState> {
        let mut order = NewOrder::limit(self.supplier, self.next_id, InstrumentId(0), Side::Sell, USD_2, 2);
        self.next_id += 1;
        order.supply = Some(GpuSet { host: self.hosts[index], gpu_mask: 0b11 });
        let events = self.run(Command::place(order));
        let outcome = self.jobs.observe(&events);
        self.follow(outcome)
    }

    fn terms(&self, retries: u32, budget_minor: u64) -> JobTerms {
        JobTerms {
            account: self.renter,
            instrument: InstrumentId(0),
            gpus: 2,
            one_host: true,
            limit_minor_per_gpu_hour: USD_2,
            hours: 2,
            budget_minor,
            retries,
            min_supplier_score_bps: 0,
            verified_only: false,
            gpus_per_node: 0,
            min_fabric_gbps: 0,
            name: "train".into(),
            run: run(),
        }
    }

    fn lease_of(&self, job: JobId) -> LeaseId {
        match self.jobs.state(job) {
            Some(JobState::Running { leases, .. }) => leases[0],
            other => panic!("not running: {other:?}"),
        }
    }

    fn host_fails(&mut self, lease: LeaseId) -> Vec<JobState> {
        let events = self.run(Command::FailLeaseDelivery { account: self.supplier, lease });
        let outcome = self.jobs.observe(&events);
        self.follow(outcome)
    }
}

#[test]
fn a_job_failed_by_its_host_bids_again_runs_elsewhere_and_finishes() {
    let mut w = World::new(2);
    let (job, outcome) = w.jobs.submit(w.terms(2, 100 * USD_2), Default::default(), w.renter, T0).expect("accepted");
    let states = w.follow(outcome);
    assert!(matches!(states.as_slice(), [JobState::Bidding { attempt: 1, order: None }]), "{states:?}");
    assert!(matches!(w.jobs.state(job), Some(JobState::Bidding { attempt: 1, order: Some(_) })), "the bid rests: no GPUs yet");
    // A host offers: the bid fills all-or-none on one host.
    let states = w.ask(0);
    assert!(matches!(states.as_slice(), [JobState::Running { attempt: 1, .. }]), "{states:?}");
    let first = w.lease_of(job);
    // Its host fails it: the job bids again at once and waits for GPUs.
    let states = w.host_fails(first);
    assert!(matches!(states.as_slice(), [JobState::Bidding { attempt: 2, order: None }]), "{states:?}");
    let states = w.ask(1);
    assert!(matches!(states.as_slice(), [JobState::Running { attempt: 2, .. }]), "{states:?}");
    let second = w.lease_of(job);
    assert_ne!(first, second);
    // The workload exits 0: the job succeeds and its lease is ended (billing stops).
    let outcome = w.jobs.workload_exited(second, 0, T0);
    assert_eq!(outcome.end_leases, [(w.renter, second)]);
    let states = w.follow(outcome);
    assert_eq!(states, [JobState::Succeeded]);
    assert!(w.engine.lease(second).is_none_or(|l| !l.active), "the finished job's lease ended");
}

#[test]
fn retries_and_budget_bound_a_job_and_a_failing_workload_is_not_retried() {
    // One retry: the second host failure ends the job.
    let mut w = World::new(3);
    let (job, outcome) = w.jobs.submit(w.terms(1, 100 * USD_2), Default::default(), w.renter, T0).expect("accepted");
    w.follow(outcome);
    w.ask(0);
    let lease = w.lease_of(job);
    w.host_fails(lease);
    w.ask(1);
    let lease = w.lease_of(job);
    assert_eq!(w.host_fails(lease), [JobState::Failed(JobFailure::RetriesExhausted)]);

    // A budget for one attempt (2 GPUs x 2 h x US$2 = US$8): no second.
    let mut w = World::new(2);
    let (job, outcome) = w.jobs.submit(w.terms(5, 8 * 1_000_000), Default::default(), w.renter, T0).expect("accepted");
    w.follow(outcome);
    w.ask(0);
    let lease = w.lease_of(job);
    assert_eq!(w.host_fails(lease), [JobState::Failed(JobFailure::BudgetSpent)]);
    assert_eq!(w.jobs.submit(w.terms(0, 7 * 1_000_000), Default::default(), w.renter, T0).err(), Some(JobRefusal::BudgetTooSmall));

    // The renter's code fails: not retried, its leases end.
    let mut w = World::new(1);
    let (job, outcome) = w.jobs.submit(w.terms(5, 100 * USD_2), Default::default(), w.renter, T0).expect("accepted");
    w.follow(outcome);
    w.ask(0);
    let lease = w.lease_of(job);
    let states = {
        let outcome = w.jobs.workload_exited(lease, 3, T0);
        w.follow(outcome)
    };
    assert_eq!(states, [JobState::Failed(JobFailure::WorkloadFailed(3))]);
}

#[test]
fn a_job_cancels_while_bidding_or_running_and_a_refused_bid_fails_it() {
    let mut w = World::new(1);
    let (waiting, outcome) = w.jobs.submit(w.terms(1, 100 * USD_2), Default::default(), w.renter, T0).expect("accepted");
    w.follow(outcome);
    let outcome = w.jobs.cancel(waiting, w.renter, T0);
    assert_eq!(w.follow(outcome), [JobState::Cancelled], "its bid cancelled");
    let (running, outcome) = w.jobs.submit(w.terms(1, 100 * USD_2), Default::default(), w.renter, T0).expect("accepted");
    w.follow(outcome);
    w.ask(0);
    // Another account cannot cancel it.
    assert_eq!(w.jobs.cancel(running, w.supplier, T0), Outcome::default());
    let outcome = w.jobs.cancel(running, w.renter, T0);
    assert_eq!(w.follow(outcome), [JobState::Cancelled], "its lease ended");

    // A renter without the funds: the first bid is refused.
    let mut w = World::new(1);
    w.run(Command::Withdraw { account: w.renter, amount_minor: 1_000_000_000 });
    let (job, outcome) = w.jobs.submit(w.terms(1, 100 * USD_2), Default::default(), w.renter, T0).expect("accepted");
    assert_eq!(w.follow(outcome).last(), Some(&JobState::Failed(JobFailure::BidRefused(RejectCode::InsufficientFunds))));
    assert!(w.jobs.state(job).is_some_and(JobState::is_over));
}

/// Journaled: `SubmitJob` and the commands the market calls for, applied as
/// the sequencer applies them, carry a job to success through a host's
/// failure; the workload's exit comes as the host's delivery status; the
/// same journal replayed gives the same state.
#[test]
fn a_journaled_job_runs_through_a_host_failure_and_replays_to_the_same_state() {
    use gpux_market::{JournalEntry, MarketState};
    use gpux_protocol::DeliveryState;

    struct Journal {
        market: MarketState,
        entries: Vec<JournalEntry>,
        now_ms: u64,
    }
    impl Journal {
        /// Journals and applies an entry, then each follow-up, as the sequencer does.
        fn record(&mut self, entry: JournalEntry) -> gpux_market::Applied {
            let applied = self.market.apply(&entry).expect("applies");
            self.entries.push(entry);
            for command in applied.follow_ups.clone() {
                self.engine(command);
            }
            applied
        }
        fn engine(&mut self, command: Command) -> Vec<Event> {
            self.now_ms += 1;
            self.record(JournalEntry::Engine(Input { at_ms: self.now_ms, command })).events
        }
    }
    let mut j = Journal { market: MarketState::new(EngineConfig::demo()).expect("demo"), entries: Vec::new(), now_ms: T0 };
    j.record(JournalEntry::JobRules { version: gpux_market::jobs::JOB_RULES });
    let (renter, supplier) = (AccountId(0), AccountId(1));
    j.engine(Command::OpenAccount { role: Role::Renter });
    j.engine(Command::OpenAccount { role: Role::Supplier });
    j.record(delivers(supplier));
    j.engine(Command::Deposit { account: renter, amount_minor: 1_000_000_000 });
    for host in 0..2 {
        for gpu in 0..2 {
            j.engine(Command::register(supplier, &format!("host-{host}"), &format!("GPU-{host}-{gpu}"), GpuSpec::h100_sxm()));
        }
    }
    let terms = JobTerms {
        account: renter,
        instrument: InstrumentId(0),
        gpus: 2,
        one_host: true,
        limit_minor_per_gpu_hour: USD_2,
        hours: 2,
        budget_minor: 100 * USD_2,
        retries: 2,
        min_supplier_score_bps: 0,
        verified_only: false,
        gpus_per_node: 0,
        min_fabric_gbps: 0,
        name: "train".into(),
        run: run(),
    };
    j.now_ms += 1;
    let submitted = j.record(JournalEntry::SubmitJob { at_ms: j.now_ms, terms });
    let job = submitted.job.expect("a job entry").expect("accepted");
    let ask = |j: &mut Journal, host: u32, id: u64| {
        let mut order = NewOrder::limit(supplier, id, InstrumentId(0), Side::Sell, USD_2, 2);
        order.supply = Some(GpuSet { host: HostId(host), gpu_mask: 0b11 });
        j.engine(Command::place(order));
    };
    let running = |j: &Journal| match j.market.jobs().state(job) {
        Some(JobState::Running { attempt, leases }) => (*attempt, leases[0]),
        other => panic!("not running: {other:?}"),
    };
    ask(&mut j, 0, 1);
    let (attempt, first) = running(&j);
    assert_eq!(attempt, 1);
    j.engine(Command::FailLeaseDelivery { account: supplier, lease: first });
    assert!(matches!(j.market.jobs().state(job), Some(JobState::Bidding { attempt: 2, order: Some(_) })));
    ask(&mut j, 1, 2);
    let (attempt, second) = running(&j);
    assert_eq!(attempt, 2);
    // Another account's word about the workload counts for nothing.
    j.now_ms += 1;
    j.record(JournalEntry::DeliveryStatus { at_ms: j.now_ms, account: renter, lease: second, state: DeliveryState::Exited { code: 0 } });
    assert!(matches!(j.market.jobs().state(job), Some(JobState::Running { .. })));
    j.now_ms += 1;
    j.record(JournalEntry::DeliveryStatus { at_ms: j.now_ms, account: supplier, lease: second, state: DeliveryState::Exited { code: 0 } });
    assert_eq!(j.market.jobs().state(job), Some(&JobState::Succeeded));
    assert!(j.market.engine().lease(second).is_some_and(|l| !l.active), "its lease ended with it");

    // Replayed without acting on follow-ups (they are in the journal).
    let mut replay = MarketState::new(EngineConfig::demo()).expect("demo");
    for entry in &j.entries {
        replay.apply(entry).expect("replays");
    }
    assert_eq!(replay.state_hash(), j.market.state_hash());
    assert_eq!(replay.jobs().state(job), Some(&JobState::Succeeded));
}

#[test]
fn each_account_holds_its_share_of_live_jobs_and_keeps_its_newest_finished_ones() {
    use gpux_market::jobs::limits::{JOBS_FINISHED_PER_ACCOUNT_MAX, JOBS_LIVE_PER_ACCOUNT_MAX};
    let mut w = World::new(0);
    let mut live = Vec::new();
    for _ in 0..JOBS_LIVE_PER_ACCOUNT_MAX {
        live.push(w.jobs.submit(w.terms(1, 100 * USD_2), Default::default(), w.renter, T0).expect("within the share").0);
    }
    assert_eq!(w.jobs.submit(w.terms(1, 100 * USD_2), Default::default(), w.renter, T0).err(), Some(JobRefusal::TooManyJobs));
    // Another account is not held back by this one's jobs.
    let mut other = w.terms(1, 100 * USD_2);
    other.account = w.supplier;
    let (others, _) = w.jobs.submit(other, Default::default(), w.supplier, T0).expect("its own share");
    // Ended jobs make room; past 256 finished, the oldest are forgotten.
    let mut finished = 0;
    while finished < JOBS_FINISHED_PER_ACCOUNT_MAX + 10 {
        let job = match live.pop() {
            Some(job) => job,
            None => w.jobs.submit(w.terms(1, 100 * USD_2), Default::default(), w.renter, T0).expect("room again").0,
        };
        // Its bid was never placed here: the cancel ends it at once.
        assert_eq!(w.jobs.cancel(job, w.renter, T0).transitions.last().map(|t| t.2.clone()), Some(JobState::Cancelled));
        finished += 1;
    }
    let (page, more) = w.jobs.list(w.renter, 0, 1_000);
    assert_eq!(page.len(), JOBS_FINISHED_PER_ACCOUNT_MAX);
    assert!(!more);
    assert!(page.windows(2).all(|p| p[0].job > p[1].job), "newest first");
    let first_finished = JobId(JOBS_LIVE_PER_ACCOUNT_MAX as u64 - 1);
    assert!(w.jobs.info(first_finished, w.renter).is_none(), "the first job to finish was forgotten");
    assert_eq!(w.jobs.info(others, w.supplier).map(|i| i.state), Some(JobState::Bidding { attempt: 1, order: None }));
    assert!(w.jobs.info(others, w.renter).is_none(), "another account's job is not shown");
}

#[test]
fn a_running_job_grows_once_the_bigger_bid_fills_and_restarts_on_the_new_leases() {
    let mut w = World::new(3);
    let terms = JobTerms { one_host: false, ..w.terms(1, 100 * USD_2) };
    let (job, outcome) = w.jobs.submit(terms, Default::default(), w.renter, T0).expect("accepted");
    w.follow(outcome);
    w.ask(0);
    let first = w.lease_of(job);
    // Not while it runs at that size already, and not for another account.
    assert_eq!(w.jobs.resize(job, w.renter, 2).err(), Some(JobRefusal::NotRunning));
    assert_eq!(w.jobs.resize(job, w.supplier, 4).err(), Some(JobRefusal::NotRunning));
    let outcome = w.jobs.resize(job, w.renter, 4).expect("a running job grows");
    assert_eq!(w.jobs.resize(job, w.renter, 6).err(), Some(JobRefusal::NotRunning), "one resize at a time");
    assert_eq!(w.follow(outcome), Vec::<JobState>::new(), "it runs on while the bigger bid rests");
    assert!(matches!(w.jobs.state(job), Some(JobState::Running { attempt: 1, .. })));
    // Two more GPUs are not four: nothing changes.
    assert_eq!(w.ask(1), Vec::<JobState>::new());
    // Four free GPUs: the bid fills on two hosts, the old lease ends.
    let mut order = NewOrder::limit(w.supplier, w.next_id, InstrumentId(0), Side::Sell, USD_2, 2);
    w.next_id += 1;
    order.supply = Some(GpuSet { host: w.hosts[2], gpu_mask: 0b11 });
    let events = w.run(Command::place(order));
    let outcome = w.jobs.observe(&events);
    assert_eq!(outcome.end_leases, [(w.renter, first)], "the old size's lease ends");
    let JobState::Running { attempt: 2, leases } = w.jobs.state(job).cloned().expect("a job") else { panic!("{:?}", w.jobs.state(job)) };
    assert_eq!(leases.len(), 2);
    let ranks: Vec<(u32, u32, u32)> = outcome.assigned.iter().map(|(_, _, a)| (a.node_rank, a.nodes, a.world_gpus)).collect();
    assert_eq!(ranks, [(0, 2, 4), (1, 2, 4)], "each host told its rank and the new world size");
    w.follow(outcome);
    assert!(w.engine.lease(first).is_some_and(|l| !l.active));
    assert_eq!(w.jobs.terms(job).map(|t| t.gpus), Some(4));
    // A host failure after the resize still has its one retry: the resize took none.
    let states = w.host_fails(leases[0]);
    assert!(matches!(states.as_slice(), [JobState::Bidding { attempt: 3, .. }]), "{states:?}");
}

#[test]
fn a_resize_whose_bid_does_not_fill_leaves_the_job_as_it_was() {
    let mut w = World::new(2);
    let (job, outcome) = w.jobs.submit(w.terms(1, 100 * USD_2), Default::default(), w.renter, T0).expect("accepted");
    w.follow(outcome);
    w.ask(0);
    let lease = w.lease_of(job);
    // A budget that cannot pay the bigger size is refused up front.
    assert_eq!(w.jobs.resize(job, w.renter, 1_000).err(), Some(JobRefusal::BudgetTooSmall));
    let outcome = w.jobs.resize(job, w.renter, 4).expect("accepted");
    w.follow(outcome);
    // The job is cancelled while the resize bid rests: both end.
    let outcome = w.jobs.cancel(job, w.renter, T0);
    assert_eq!(outcome.cancel_orders.len(), 1, "the resize's bid is cancelled");
    assert_eq!(outcome.end_leases, [(w.renter, lease)]);
    assert_eq!(w.follow(outcome), [JobState::Cancelled]);
    assert_eq!(w.engine.open_orders(w.renter).len(), 0, "no bid of the job is left");
}

/// A job on two nodes bids a cluster (docs/jobs.md "Clusters"): its hosts
/// are one fabric group, each host is told every member's address by rank;
/// when one member's host fails, every member's lease ends and the job bids
/// a whole cluster again, restarting all from its checkpoint.
#[test]
fn a_cluster_job_runs_on_one_fabric_tells_each_host_its_peers_and_restarts_whole_when_a_member_fails() {
    use gpux_market::{JournalEntry, MarketState};
    use gpux_protocol::ServerMessage;

    struct Live {
        market: MarketState,
        now_ms: u64,
        /// Every `job_assigned` pushed, in order.
        assigned: Vec<(LeaseId, gpux_protocol::JobAssignment)>,
    }
    impl Live {
        /// Applies an entry and its follow-ups, as the sequencer does.
        fn record(&mut self, entry: JournalEntry) -> gpux_market::Applied {
            let applied = self.market.apply(&entry).expect("applies");
            for notice in &applied.notices {
                if let ServerMessage::JobAssigned { lease, assignment, .. } = &notice.message {
                    self.assigned.push((*lease, (**assignment).clone()));
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
        fn ask(&mut self, host: u32, id: u64, price: u64) {
            let mut order = NewOrder::limit(AccountId(1), id, InstrumentId(0), Side::Sell, price, 2);
            order.supply = Some(GpuSet { host: HostId(host), gpu_mask: 0b11 });
            self.engine(Command::place(order));
        }
    }
    let mut live = Live { market: MarketState::new(EngineConfig::demo()).expect("demo"), now_ms: T0, assigned: Vec::new() };
    live.record(JournalEntry::JobRules { version: gpux_market::jobs::JOB_RULES });
    let (renter, supplier) = (AccountId(0), AccountId(1));
    live.engine(Command::OpenAccount { role: Role::Renter });
    live.engine(Command::OpenAccount { role: Role::Supplier });
    live.record(delivers(supplier));
    live.engine(Command::Deposit { account: renter, amount_minor: 1_000_000_000 });
    // Three hosts of two GPUs on one fabric, and one host without.
    for host in 0..4u32 {
        for gpu in 0..2 {
            let (host_name, gpu_uuid, spec) = (format!("host-{host}"), format!("GPU-{host}-{gpu}"), GpuSpec::h100_sxm());
            let fabric = FabricClaim { group: "ib0".into(), gbps: 400, address: format!("10.0.0.{host}"), port_base: 29_500 };
            live.engine(match host {
                0..3 => Command::Register {
                    account: supplier,
                    host: host_name,
                    gpu_uuid,
                    spec,
                    region: Some("us-east".into()),
                    zone: "z1".into(),
                    fabric: Some(Box::new(fabric)),
                },
                _ => Command::register(supplier, &host_name, &gpu_uuid, spec),
            });
        }
    }
    let terms = cluster_terms(renter, InstrumentId(0));
    live.now_ms += 1;
    let submitted = live.record(JournalEntry::SubmitJob { at_ms: live.now_ms, terms });
    let job = submitted.job.expect("a job entry").expect("accepted");
    // The cheapest ask is on the host without a fabric: passed over.
    live.ask(3, 1, USD_2 / 2);
    live.ask(0, 2, USD_2);
    assert!(matches!(live.market.jobs().state(job), Some(JobState::Bidding { .. })), "one fabric host is not a cluster of two");
    live.ask(1, 3, USD_2);
    let Some(JobState::Running { attempt: 1, leases }) = live.market.jobs().state(job).cloned() else { panic!("not running") };
    let engine = live.market.engine();
    let host_of = |lease: &LeaseId| engine.gpu(engine.lease(*lease).expect("lease").gpus[0]).expect("gpu").host;
    assert_eq!(leases.iter().map(host_of).collect::<Vec<_>>(), [HostId(0), HostId(1)]);
    let peers =
        vec![MemberAddress { address: "10.0.0.0".into(), port: 29_500 }, MemberAddress { address: "10.0.0.1".into(), port: 29_500 }];
    let first: Vec<(LeaseId, u32, u32, Vec<MemberAddress>)> =
        live.assigned.drain(..).map(|(lease, a)| (lease, a.node_rank, a.nodes, a.peers)).collect();
    assert_eq!(first, [(leases[0], 0, 2, peers.clone()), (leases[1], 1, 2, peers)]);

    // Host 0 fails its member: both leases end, the job bids a cluster again.
    live.engine(Command::FailLeaseDelivery { account: supplier, lease: leases[0] });
    assert!(matches!(live.market.jobs().state(job), Some(JobState::Bidding { attempt: 2, .. })));
    assert!(leases.iter().all(|l| !live.market.engine().lease(*l).expect("lease").active), "the whole cluster stopped");
    live.ask(2, 4, USD_2);
    live.ask(1, 5, USD_2);
    let Some(JobState::Running { attempt: 2, leases }) = live.market.jobs().state(job).cloned() else { panic!("not running again") };
    assert_eq!(leases.len(), 2);
    let again: Vec<(u32, Vec<String>)> =
        live.assigned.drain(..).map(|(_, a)| (a.attempt, a.peers.iter().map(|p| p.address.clone()).collect())).collect();
    let ranks = vec!["10.0.0.2".to_string(), "10.0.0.1".into()];
    assert_eq!(again, [(2, ranks.clone()), (2, ranks)], "ranks in price-time order of the new members");

    // Rank 0 exits 0 first: the job waits for rank 1's last sync (told by
    // its own exit) before it succeeds; nothing ends before.
    let exit = |live: &mut Live, lease: LeaseId, code: i64| {
        live.now_ms += 1;
        let state = gpux_protocol::DeliveryState::Exited { code };
        live.record(JournalEntry::DeliveryStatus { at_ms: live.now_ms, account: supplier, lease, state });
    };
    exit(&mut live, leases[0], 0);
    assert!(matches!(live.market.jobs().state(job), Some(JobState::Running { attempt: 2, .. })), "rank 1 has not finished");
    assert!(leases.iter().all(|l| live.market.engine().lease(*l).expect("lease").active));
    exit(&mut live, leases[1], 0);
    assert_eq!(live.market.jobs().state(job), Some(&JobState::Succeeded), "every member finished");
    assert!(leases.iter().all(|l| !live.market.engine().lease(*l).expect("lease").active), "billing stops");
}

/// A market applied as the sequencer applies it: each entry and its
/// follow-ups, the engine's clock a millisecond further each time.
struct Sequenced {
    market: gpux_market::MarketState,
    now_ms: u64,
    next_id: u64,
}

impl Sequenced {
    /// A market under the current job rules (journaled first, as an
    /// exchange of this build does).
    fn new() -> Sequenced {
        let mut live = Sequenced { market: gpux_market::MarketState::new(EngineConfig::demo()).expect("demo"), now_ms: T0, next_id: 1 };
        live.record(gpux_market::JournalEntry::JobRules { version: gpux_market::jobs::JOB_RULES });
        live
    }

    fn record(&mut self, entry: gpux_market::JournalEntry) -> gpux_market::Applied {
        let applied = self.market.apply(&entry).expect("applies");
        for command in applied.follow_ups.clone() {
            self.engine(command);
        }
        applied
    }

    fn engine(&mut self, command: Command) -> gpux_market::Applied {
        self.now_ms += 1;
        self.record(gpux_market::JournalEntry::Engine(Input { at_ms: self.now_ms, command }))
    }

    fn ask(&mut self, host: u32, instrument: u32, price: u64) {
        let mut order = NewOrder::limit(AccountId(1), self.next_id, InstrumentId(instrument), Side::Sell, price, 2);
        self.next_id += 1;
        order.supply = Some(GpuSet { host: HostId(host), gpu_mask: 0b11 });
        self.engine(Command::place(order));
    }
}

/// A member of a cluster job gets a preemption notice: the other rank's
/// failing exit once its peer is gone moves the job to a whole new cluster
/// instead of failing it.
#[test]
fn a_cluster_job_with_a_preempted_member_moves_whole() {
    use gpux_market::JournalEntry;
    let mut live = recovery_market(0, 0);
    let (renter, supplier, spot) = (AccountId(0), AccountId(1), AccountId(2));
    fabric_hosts(&mut live, 4);
    let terms = cluster_terms(renter, InstrumentId(1));
    live.now_ms += 1;
    let applied = live.record(JournalEntry::SubmitJob { at_ms: live.now_ms, terms });
    let job = applied.job.expect("a job entry").expect("accepted");
    live.ask(0, 1, 800_000);
    live.ask(1, 1, 800_000);
    let Some(JobState::Running { attempt: 1, leases }) = live.market.jobs().state(job).cloned() else { panic!("not running") };
    // Host 1 also sells spot: a spot buyer takes it, preempting rank 1.
    live.ask(1, 0, USD_2);
    let applied = live.engine(Command::place(NewOrder::limit(spot, 1, InstrumentId(0), Side::Buy, USD_2, 2)));
    assert!(applied.events.iter().any(|e| e.kind == EventKind::PreemptionNotice { lease: leases[1], ends_at_ms: live.now_ms + 30_000 }));
    assert!(live.market.jobs().moving(leases[0]), "the whole attempt is moving");
    // Rank 0 loses its peer and exits 1: not the job's failure.
    live.now_ms += 1;
    let state = gpux_protocol::DeliveryState::Exited { code: 1 };
    live.record(JournalEntry::DeliveryStatus { at_ms: live.now_ms, account: supplier, lease: leases[0], state });
    assert!(matches!(live.market.jobs().state(job), Some(JobState::Bidding { attempt: 2, .. })), "{:?}", live.market.jobs().state(job));
    assert!(leases.iter().all(|l| !live.market.engine().lease(*l).expect("lease").active), "both members' leases ended");
    // A new cluster on hosts 2 and 3.
    live.ask(2, 1, 800_000);
    live.ask(3, 1, 800_000);
    assert!(matches!(live.market.jobs().state(job), Some(JobState::Running { attempt: 2, .. })));
}

/// A job of two nodes of two GPUs on `instrument`, on a fabric of 400 Gb/s.
fn cluster_terms(renter: AccountId, instrument: InstrumentId) -> JobTerms {
    JobTerms {
        account: renter,
        instrument,
        gpus: 4,
        one_host: false,
        limit_minor_per_gpu_hour: USD_2,
        hours: 2,
        budget_minor: 100 * USD_2,
        retries: 2,
        min_supplier_score_bps: 0,
        verified_only: false,
        gpus_per_node: 2,
        min_fabric_gbps: 400,
        name: "train".into(),
        run: run(),
    }
}

impl World {
    /// The supplier asks for host `index`'s two GPUs on `instrument`.
    fn ask_on(&mut self, index: usize, instrument: InstrumentId, price: u64) -> Vec<JobState> {
        let mut order = NewOrder::limit(self.supplier, self.next_id, instrument, Side::Sell, price, 2);
        self.next_id += 1;
        order.supply = Some(GpuSet { host: self.hosts[index], gpu_mask: 0b11 });
        let events = self.run(Command::place(order));
        let outcome = self.jobs.observe(&events);
        self.follow(outcome)
    }

    /// A spot renter buys host `index`'s two GPUs at `price`: a preemptible
    /// lease on them gets its notice.
    fn spot_buyer_preempts(&mut self, price: u64) -> Vec<JobState> {
        let buyer = AccountId(2);
        let order = NewOrder::limit(buyer, self.next_id, InstrumentId(0), Side::Buy, price, 2);
        self.next_id += 1;
        let events = self.run(Command::place(order));
        assert!(events.iter().any(|e| matches!(e.kind, EventKind::PreemptionNotice { .. })), "{events:?}");
        let outcome = self.jobs.observe(&events);
        self.follow(outcome)
    }

    fn exits(&mut self, lease: LeaseId, code: i64) -> Vec<JobState> {
        let outcome = self.jobs.workload_exited(lease, code, self.now_ms);
        self.follow(outcome)
    }
}

/// A preemptible job's lease gets a notice: whatever its workload does then
/// (checkpoints and exits 0, dies of the SIGTERM, or ignores it until the
/// deadline), the job bids its next attempt and resumes elsewhere; it is
/// never succeeded or failed by a preempted lease (docs/jobs.md "Preemption").
#[test]
fn a_preempted_job_moves_to_its_next_attempt_whatever_its_workload_does_on_the_notice() {
    const H100_PREEMPT: InstrumentId = InstrumentId(1);
    for exit in [Some(0), Some(-1), Some(143), None] {
        let mut w = World::new(2);
        w.run(Command::OpenAccount { role: Role::Renter });
        w.run(Command::Deposit { account: AccountId(2), amount_minor: 1_000_000_000 });
        let terms = JobTerms { instrument: H100_PREEMPT, limit_minor_per_gpu_hour: 1_000_000, ..w.terms(2, 100 * USD_2) };
        let (job, outcome) = w.jobs.submit(terms, Default::default(), w.renter, T0).expect("accepted");
        w.follow(outcome);
        // Host 0 offers preemptible time cheaply and spot time beside it.
        assert!(matches!(w.ask_on(0, H100_PREEMPT, 800_000).as_slice(), [JobState::Running { attempt: 1, .. }]));
        w.ask_on(0, InstrumentId(0), USD_2);
        let first = w.lease_of(job);
        assert!(!w.jobs.moving(first));
        assert_eq!(w.spot_buyer_preempts(USD_2), [], "the notice alone changes nothing yet");
        assert!(w.jobs.moving(first), "the job is moving");
        let states = match exit {
            Some(code) => {
                let states = w.exits(first, code);
                assert!(w.engine.lease(first).is_none_or(|l| !l.active), "the exited lease ended at once (billing stops)");
                states
            }
            None => {
                // The workload ignores the notice: the lease ends at its deadline.
                w.now_ms += 30_000;
                let events = w.run(Command::Tick);
                assert!(events.iter().any(|e| e.kind == EventKind::LeaseEnded { lease: first, reason: LeaseEndReason::Preempted }));
                let outcome = w.jobs.observe(&events);
                w.follow(outcome)
            }
        };
        assert_eq!(states, [JobState::Bidding { attempt: 2, order: None }], "exit {exit:?}: the job moves");
        assert!(matches!(w.jobs.state(job), Some(JobState::Bidding { attempt: 2, order: Some(_) })));
        // The next attempt lands on host 1 and this time finishes.
        assert!(matches!(w.ask_on(1, H100_PREEMPT, 800_000).as_slice(), [JobState::Running { attempt: 2, .. }]));
        let second = w.lease_of(job);
        assert_ne!(first, second);
        assert!(!w.jobs.moving(second));
        assert_eq!(w.exits(second, 0), [JobState::Succeeded]);
        // A late exit of the preempted lease changes nothing.
        assert_eq!(w.exits(first, 0), []);
    }
}

/// A job's bid trades only with suppliers whose hosts take workloads (as
/// `gpux run`'s bids do): the cheaper ask of a supplier that published no
/// encryption key is skipped and keeps its place; the job waits, then
/// lands on the first supplier that delivers.
#[test]
fn a_jobs_bid_skips_suppliers_that_cannot_deliver() {
    use gpux_market::JournalEntry;
    let mut live = Sequenced::new();
    let (renter, silent, delivering) = (AccountId(0), AccountId(1), AccountId(2));
    live.engine(Command::OpenAccount { role: Role::Renter });
    live.engine(Command::OpenAccount { role: Role::Supplier });
    live.engine(Command::OpenAccount { role: Role::Supplier });
    live.engine(Command::Deposit { account: renter, amount_minor: 1_000_000_000 });
    for (supplier, host) in [(silent, "sim-host"), (delivering, "real-host")] {
        for gpu in 0..2 {
            live.engine(Command::register(supplier, host, &format!("GPU-{host}-{gpu}"), GpuSpec::h100_sxm()));
        }
    }
    // The supplier that cannot deliver asks less.
    let mut cheap = NewOrder::limit(silent, 1, InstrumentId(0), Side::Sell, USD_2 / 2, 2);
    cheap.supply = Some(GpuSet { host: HostId(0), gpu_mask: 0b11 });
    live.engine(Command::place(cheap));
    let terms = World::new(0).terms(1, 100 * USD_2);
    live.now_ms += 1;
    let job = live.record(JournalEntry::SubmitJob { at_ms: live.now_ms, terms }).job.expect("a job entry").expect("accepted");
    assert!(matches!(live.market.jobs().state(job), Some(JobState::Bidding { order: Some(_), .. })), "it rests: no host can run it");
    assert_eq!(live.market.engine().depth(InstrumentId(0), Side::Sell), [(USD_2 / 2, 2)], "the skipped ask keeps its place");
    // The other supplier delivers and asks more: the job lands there.
    live.record(delivers(delivering));
    let mut ask = NewOrder::limit(delivering, 1, InstrumentId(0), Side::Sell, USD_2, 2);
    ask.supply = Some(GpuSet { host: HostId(1), gpu_mask: 0b11 });
    live.engine(Command::place(ask));
    let Some(JobState::Running { leases, .. }) = live.market.jobs().state(job).cloned() else { panic!("not running") };
    assert_eq!(live.market.engine().lease(leases[0]).expect("lease").supplier, delivering);
}

/// A job whose bid filled is `starting` (shown so, to its renter too) until
/// its host reports the workload `running`; then `running`, pushed.
#[test]
fn a_job_is_starting_until_its_workload_runs() {
    use gpux_market::JournalEntry;
    use gpux_protocol::{DeliveryState, ServerMessage};
    let mut live = Sequenced::new();
    let (renter, supplier) = (AccountId(0), AccountId(1));
    live.engine(Command::OpenAccount { role: Role::Renter });
    live.engine(Command::OpenAccount { role: Role::Supplier });
    live.record(delivers(supplier));
    live.engine(Command::Deposit { account: renter, amount_minor: 1_000_000_000 });
    for gpu in 0..2 {
        live.engine(Command::register(supplier, "host-0", &format!("GPU-0-{gpu}"), GpuSpec::h100_sxm()));
    }
    let terms = World::new(0).terms(1, 100 * USD_2);
    live.now_ms += 1;
    let job = live.record(JournalEntry::SubmitJob { at_ms: live.now_ms, terms }).job.expect("a job entry").expect("accepted");
    live.ask(0, 0, USD_2);
    let info = live.market.jobs().info(job, renter).expect("the renter's job");
    let JobState::Starting { attempt: 1, leases } = info.state else { panic!("{:?}", info.state) };
    assert!(matches!(live.market.jobs().state(job), Some(JobState::Running { .. })), "held as running");
    // A status short of running changes nothing; `running` does, pushed.
    let pushed = |applied: &gpux_market::Applied| -> Vec<JobState> {
        applied
            .notices
            .iter()
            .filter_map(|n| match &n.message {
                ServerMessage::JobUpdate { job } => Some(job.state.clone()),
                _ => None,
            })
            .collect()
    };
    live.now_ms += 1;
    let applied = live.record(JournalEntry::DeliveryStatus {
        at_ms: live.now_ms,
        account: supplier,
        lease: leases[0],
        state: DeliveryState::Starting,
    });
    assert_eq!(pushed(&applied), []);
    live.now_ms += 1;
    let state = DeliveryState::Running { endpoints: Vec::new(), ssh: None, restarts: 0 };
    let applied = live.record(JournalEntry::DeliveryStatus { at_ms: live.now_ms, account: supplier, lease: leases[0], state });
    assert_eq!(pushed(&applied), [JobState::Running { attempt: 1, leases: leases.clone() }]);
    assert_eq!(live.market.jobs().info(job, renter).expect("job").state, JobState::Running { attempt: 1, leases });
}

/// When a job lease's host counts as gone (docs/market-rules.md "Jobs"):
/// never started on it within the start limit; silent while no connected
/// agent runs it within the shorter limit; silent for `--job-silence-ms`
/// whatever its connection.
#[test]
fn a_job_lease_is_silent_when_its_host_never_starts_is_gone_or_says_nothing() {
    use gpux_market::jobs::Silence;
    let rules = Silence::with_silence(120_000);
    assert_eq!((rules.start_ms, rules.disconnected_ms), (30_000, 30_000));
    assert_eq!(Silence::with_silence(4_000), Silence { silence_ms: 4_000, start_ms: 4_000, disconnected_ms: 4_000 });
    let mut w = World::new(1);
    let (job, outcome) = w.jobs.submit(w.terms(1, 100 * USD_2), Default::default(), w.renter, T0).expect("accepted");
    w.follow(outcome);
    w.ask(0);
    let lease = w.lease_of(job);
    let created = w.now_ms;
    let silent = |w: &World, at: u64, connected: bool| !w.jobs.silent_leases(at, rules, |_, _| connected).is_empty();
    // Usage reports alone do not say the host started on it.
    w.jobs.heard(lease, w.supplier, created + 10_000);
    assert!(!silent(&w, created + 29_999, true));
    assert!(silent(&w, created + 30_000, true), "no delivery status 30 s after it was created");
    // A status: started. Then only the gone and silence rules apply.
    w.jobs.status_heard(lease, w.supplier, created + 1_000);
    let last = created + 10_000;
    assert!(!silent(&w, last + 30_000, true), "its agent is connected: 120 s");
    assert!(silent(&w, last + 30_000, false), "no connected agent runs it: 30 s");
    assert!(!silent(&w, last + 29_999, false));
    assert!(silent(&w, last + 120_000, true), "silent for --job-silence-ms");
    // Another supplier's word is not its host's.
    w.jobs.heard(lease, AccountId(9), last + 119_000);
    assert!(silent(&w, last + 120_000, true));
}

/// A journal written before the job rules of 2026-12-07 replays under the
/// rules it ran under: without its `JobRules` entry a preempted job's exit
/// 0 still ends it as succeeded, and a job's bid trades with a supplier
/// that does not deliver (docs/market-rules.md "Jobs"); from the entry on,
/// the new rules hold.
#[test]
fn a_journal_without_the_job_rules_entry_replays_under_the_old_rules() {
    use gpux_market::{JournalEntry, MarketState};
    let mut old = Sequenced { market: MarketState::new(EngineConfig::demo()).expect("demo"), now_ms: T0, next_id: 1 };
    assert_eq!(old.market.jobs().rules(), 0);
    let (renter, supplier) = (AccountId(0), AccountId(1));
    old.engine(Command::OpenAccount { role: Role::Renter });
    old.engine(Command::OpenAccount { role: Role::Supplier });
    old.engine(Command::Deposit { account: renter, amount_minor: 1_000_000_000 });
    for gpu in 0..2 {
        old.engine(Command::register(supplier, "host-0", &format!("GPU-0-{gpu}"), GpuSpec::h100_sxm()));
    }
    let terms = World::new(0).terms(1, 100 * USD_2);
    old.now_ms += 1;
    let job = old.record(JournalEntry::SubmitJob { at_ms: old.now_ms, terms }).job.expect("a job entry").expect("accepted");
    old.ask(0, 0, USD_2);
    assert!(matches!(old.market.jobs().state(job), Some(JobState::Running { .. })), "it filled on a supplier that published no key");
    old.record(JournalEntry::JobRules { version: gpux_market::jobs::JOB_RULES });
    assert_eq!(old.market.jobs().rules(), gpux_market::jobs::JOB_RULES);
    old.record(JournalEntry::JobRules { version: 0 });
    assert_eq!(old.market.jobs().rules(), gpux_market::jobs::JOB_RULES, "rules are never lowered");
    let terms = World::new(0).terms(1, 100 * USD_2);
    old.now_ms += 1;
    let second = old.record(JournalEntry::SubmitJob { at_ms: old.now_ms, terms }).job.expect("a job entry").expect("accepted");
    let mut ask = NewOrder::limit(supplier, 99, InstrumentId(0), Side::Sell, USD_2, 2);
    ask.supply = Some(GpuSet { host: HostId(0), gpu_mask: 0b11 });
    old.engine(Command::place(ask));
    assert!(
        matches!(old.market.jobs().state(second), Some(JobState::Bidding { .. })),
        "under the new rules it waits for a host that delivers"
    );
}

/// A market under the current rules with a renter (0, funded), a supplier
/// (1) whose hosts deliver, `h100` hosts of two H100s (host ids from 0)
/// then `a100` hosts of two A100s, and a second renter (2, funded).
fn recovery_market(h100: u32, a100: u32) -> Sequenced {
    let mut live = Sequenced::new();
    live.engine(Command::OpenAccount { role: Role::Renter });
    live.engine(Command::OpenAccount { role: Role::Supplier });
    live.engine(Command::OpenAccount { role: Role::Renter });
    live.record(delivers(AccountId(1)));
    live.engine(Command::Deposit { account: AccountId(0), amount_minor: 1_000_000_000 });
    live.engine(Command::Deposit { account: AccountId(2), amount_minor: 1_000_000_000 });
    let a100_spec = GpuSpec { model: "NVIDIA A100-SXM4-80GB".into(), memory_mib: 81_920, ..GpuSpec::h100_sxm() };
    for host in 0..h100 + a100 {
        let spec = if host < h100 { GpuSpec::h100_sxm() } else { a100_spec.clone() };
        for gpu in 0..2 {
            live.engine(Command::register(AccountId(1), &format!("host-{host}"), &format!("GPU-{host}-{gpu}"), spec.clone()));
        }
    }
    live
}

impl Sequenced {
    fn submit(&mut self, terms: JobTerms, recovery: gpux_market::jobs::JobRecovery) -> JobId {
        self.now_ms += 1;
        let entry = gpux_market::JournalEntry::SubmitJobV2 { at_ms: self.now_ms, terms, recovery };
        self.record(entry).job.expect("a job entry").expect("accepted")
    }

    fn running(&self, job: JobId) -> (u32, Vec<LeaseId>) {
        match self.market.jobs().state(job) {
            Some(JobState::Running { attempt, leases }) => (*attempt, leases.clone()),
            other => panic!("not running: {other:?}"),
        }
    }

    /// The host of `lease` reports its workload exited with `code`.
    fn exits(&mut self, lease: LeaseId, code: i64) {
        self.now_ms += 1;
        let state = gpux_protocol::DeliveryState::Exited { code };
        self.record(gpux_market::JournalEntry::DeliveryStatus { at_ms: self.now_ms, account: AccountId(1), lease, state });
    }

    /// The exchange finds `lease`'s host gone (its delivery fails).
    fn host_gone(&mut self, lease: LeaseId) {
        self.now_ms += 1;
        self.record(gpux_market::JournalEntry::JobLeaseSilent { at_ms: self.now_ms, lease });
    }

    fn info(&self, job: JobId) -> gpux_protocol::JobInfo {
        self.market.jobs().info(job, AccountId(0)).expect("the renter's job")
    }
}

/// `restarts_on_error` (docs/jobs.md "Retries"): a workload that exits 3
/// is restarted twice, each time as a new attempt, then the job fails with
/// its code; the restarts are not taken from `retries`, and every lease
/// ends at its exit.
#[test]
fn a_workload_error_restarts_the_job_within_restarts_on_error_then_fails_it() {
    use gpux_market::jobs::{AttemptCause, JobRecovery};
    let mut live = recovery_market(1, 0);
    let terms = World::new(0).terms(1, 100 * USD_2);
    let job = live.submit(terms, JobRecovery { restarts_on_error: 2, ..JobRecovery::default() });
    for attempt in 1..=3 {
        live.ask(0, 0, USD_2);
        let (running, leases) = live.running(job);
        assert_eq!(running, attempt);
        live.exits(leases[0], 3);
        assert!(!live.market.engine().lease(leases[0]).expect("lease").active, "billing stops at the exit");
        let info = live.info(job);
        if attempt < 3 {
            assert!(matches!(info.state, JobState::Bidding { attempt: a, .. } if a == attempt + 1), "{:?}", info.state);
            let moved = info.last_move.expect("a move");
            assert_eq!((moved.attempt, moved.cause), (attempt + 1, AttemptCause::ExitedWithError(3)));
        } else {
            assert_eq!(info.state, JobState::Failed(JobFailure::WorkloadFailed(3)));
        }
        assert_eq!(info.restarts, attempt.min(2));
    }
    // Without restarts the first error fails the job.
    let job = live.submit(World::new(0).terms(3, 100 * USD_2), JobRecovery::default());
    live.ask(0, 0, USD_2);
    let (_, leases) = live.running(job);
    live.exits(leases[0], 3);
    assert_eq!(live.info(job).state, JobState::Failed(JobFailure::WorkloadFailed(3)));
}

/// Failover (docs/jobs.md "Failover"): each new attempt bids the book of
/// the job's that would fill it at the lowest expected cost now (a
/// preemptible book's rework weighed in), and says why; with none offering
/// it stays on its book and waits.
#[test]
fn a_new_attempt_bids_the_cheapest_of_the_jobs_books_that_offers_it() {
    use gpux_market::jobs::{AttemptCause, BookChoice, JobAlternative, JobRecovery};
    const A100_SPOT: InstrumentId = InstrumentId(2);
    const H100_PREEMPT: InstrumentId = InstrumentId(1);
    // H100 hosts 0 to 2, A100 host 3.
    let mut live = recovery_market(3, 1);
    let alternatives = vec![
        JobAlternative { instrument: A100_SPOT, limit_minor_per_gpu_hour: 1_500_000 },
        JobAlternative { instrument: H100_PREEMPT, limit_minor_per_gpu_hour: 1_500_000 },
    ];
    let job = live.submit(World::new(0).terms(5, 100 * USD_2), JobRecovery { alternatives, ..JobRecovery::default() });
    live.ask(0, 0, USD_2);
    let (_, leases) = live.running(job);
    // Host 0 dies with nothing else offered: the job bids its book again.
    live.host_gone(leases[0]);
    let info = live.info(job);
    assert!(matches!(info.state, JobState::Bidding { attempt: 2, .. }), "{:?}", info.state);
    let moved = info.last_move.expect("a move");
    assert_eq!((moved.cause, moved.instrument, moved.choice), (AttemptCause::HostFailed, InstrumentId(0), BookChoice::NoneOffered));
    live.ask(1, 0, USD_2);
    let (attempt, leases) = live.running(job);
    assert_eq!(attempt, 2);
    // An A100 at 1.40 (2 GPUs x 2 h = 5.60) and a preemptible H100 at 1.25
    // (5.00, plus 15% rework = 5.75); the H100 spot book is empty. Host 1
    // dies: the A100 book wins.
    live.ask(3, 2, 1_400_000);
    live.ask(2, 1, 1_250_000);
    live.host_gone(leases[0]);
    let (attempt, leases) = live.running(job);
    assert_eq!(attempt, 3);
    let lease = live.market.engine().lease(leases[0]).expect("lease");
    assert_eq!((lease.kind, lease.gpus[0], lease.price_minor_per_gpu_hour), (LeaseKind::Spot, GpuId(6), 1_400_000), "on the A100 host");
    let info = live.info(job);
    assert_eq!(info.instrument, A100_SPOT, "the job shows the book it bids on now");
    let moved = info.last_move.expect("a move");
    assert_eq!(
        (moved.attempt, moved.instrument, moved.choice),
        (3, A100_SPOT, BookChoice::Cheapest { expected_minor: 5_600_000, offering: 2 })
    );
    // The A100 host dies: the preemptible H100 (the only book offering) wins.
    live.host_gone(leases[0]);
    let (attempt, leases) = live.running(job);
    assert_eq!(attempt, 4);
    let lease = live.market.engine().lease(leases[0]).expect("lease");
    assert_eq!((lease.kind, lease.gpus[0]), (LeaseKind::Preemptible, GpuId(4)), "on H100 host 2, preemptible");
    assert_eq!(live.info(job).last_move.map(|m| m.choice), Some(BookChoice::Cheapest { expected_minor: 5_750_000, offering: 1 }));
}

/// Two H100 hosts of one fabric group for `cluster_terms`' jobs.
fn fabric_hosts(live: &mut Sequenced, hosts: u32) {
    for host in 0..hosts {
        for gpu in 0..2 {
            let fabric = FabricClaim { group: "ib0".into(), gbps: 400, address: format!("10.0.0.{host}"), port_base: 29_500 };
            live.engine(Command::Register {
                account: AccountId(1),
                host: format!("host-{host}"),
                gpu_uuid: format!("GPU-{host}-{gpu}"),
                spec: GpuSpec::h100_sxm(),
                region: Some("us-east".into()),
                zone: "z1".into(),
                fabric: Some(Box::new(fabric)),
            });
        }
    }
}

/// A cluster rank that fails because its peer's host died (an NCCL
/// timeout) is not the job's failure: its exit waits
/// `CLUSTER_EXIT_HOLD_MS` for a host fault among its peers, which moves the
/// job; with none, the exit fails the job once the wait is over.
#[test]
fn a_cluster_ranks_error_waits_for_a_peers_host_fault_before_it_fails_the_job() {
    use gpux_market::jobs::{limits::CLUSTER_EXIT_HOLD_MS, AttemptCause, JobRecovery};
    use gpux_market::JournalEntry;
    for peer_dies in [true, false] {
        let mut live = recovery_market(0, 0);
        fabric_hosts(&mut live, 4);
        let job = live.submit(cluster_terms(AccountId(0), InstrumentId(0)), JobRecovery::default());
        live.ask(0, 0, USD_2);
        live.ask(1, 0, USD_2);
        let (_, leases) = live.running(job);
        let exited_at = live.now_ms + 1;
        live.exits(leases[0], 1);
        assert!(matches!(live.info(job).state, JobState::Running { .. } | JobState::Starting { .. }), "held, not failed");
        assert!(!live.market.engine().lease(leases[0]).expect("lease").active, "the exited rank's lease ends at once");
        assert!(live.market.jobs().held_exits_due(exited_at + CLUSTER_EXIT_HOLD_MS - 1).is_empty());
        assert_eq!(live.market.jobs().held_exits_due(exited_at + CLUSTER_EXIT_HOLD_MS), [job]);
        if peer_dies {
            live.host_gone(leases[1]);
            let info = live.info(job);
            assert!(matches!(info.state, JobState::Bidding { attempt: 2, .. }), "{:?}", info.state);
            assert_eq!(info.last_move.map(|m| m.cause), Some(AttemptCause::HostFailed));
            assert!(live.market.jobs().held_exits_due(u64::MAX).is_empty(), "the hold is settled");
        } else {
            live.now_ms = exited_at + CLUSTER_EXIT_HOLD_MS;
            live.record(JournalEntry::JobExitHoldEnded { at_ms: live.now_ms, job });
            assert_eq!(live.info(job).state, JobState::Failed(JobFailure::WorkloadFailed(1)));
            assert!(!live.market.engine().lease(leases[1]).expect("lease").active, "the other rank's lease ends");
        }
    }
}

/// A reserved window sold on a GPU of a job's preemptible lease schedules
/// its preemption: the job's feed says when, before the notice comes.
#[test]
fn a_window_sold_under_a_jobs_preemptible_lease_is_told_before_its_notice() {
    use gpux_market::jobs::JobRecovery;
    const H100_PREEMPT: InstrumentId = InstrumentId(1);
    let mut live = recovery_market(1, 0);
    let terms = JobTerms { instrument: H100_PREEMPT, ..World::new(0).terms(3, 100 * USD_2) };
    let job = live.submit(terms, JobRecovery::default());
    live.ask(0, 1, 800_000);
    let (_, leases) = live.running(job);
    assert_eq!(live.info(job).preemption_ahead, None);
    let window = live.market.engine().instrument_by_symbol("H100-SXM-80G/R/2026-12-02T17/1H").expect("a listed window");
    let mut ask = NewOrder::limit(AccountId(1), 500, window, Side::Sell, USD_2, 1);
    ask.supply = Some(GpuSet { host: HostId(0), gpu_mask: 0b1 });
    live.engine(Command::place(ask));
    let applied = live.engine(Command::place(NewOrder::limit(AccountId(2), 1, window, Side::Buy, USD_2, 1)));
    let window_start = T0 + 2 * 3_600_000;
    let ahead = gpux_protocol::PreemptionAhead { lease: leases[0], notice_at_ms: window_start - 30_000, ends_at_ms: window_start };
    assert_eq!(live.info(job).preemption_ahead, Some(ahead));
    let told = applied
        .notices
        .iter()
        .any(|n| matches!(&n.message, gpux_protocol::ServerMessage::JobUpdate { job: info } if info.preemption_ahead == Some(ahead)));
    assert!(told, "the renter's feed hears of it: {:?}", applied.notices);
    // The notice comes when it said: the job moves, and nothing is ahead.
    live.now_ms = window_start - 30_000;
    live.engine(Command::Tick);
    assert!(live.market.jobs().moving(leases[0]));
    assert_eq!(live.info(job).preemption_ahead, None);
}

/// A host that removes a lease's container only after the lease's bill is
/// final may still say `stopped` (it moves no money), so the renter's view
/// never shows a gone workload as running; any other status is then
/// `lease_not_active`.
#[test]
fn a_host_may_say_stopped_after_the_bill_is_final_and_nothing_else() {
    use gpux_protocol::{DeliveryState, ErrorCode};
    let mut live = recovery_market(1, 0);
    live.ask(0, 0, USD_2);
    let bid = NewOrder { duration: LeaseDuration::Hours(1), ..NewOrder::limit(AccountId(0), 7, InstrumentId(0), Side::Buy, USD_2, 2) };
    let applied = live.engine(Command::place(bid));
    let lease = applied
        .events
        .iter()
        .find_map(|e| match e.kind {
            EventKind::LeaseCreated { lease, .. } => Some(lease),
            _ => None,
        })
        .expect("a lease");
    let running = DeliveryState::Running { endpoints: Vec::new(), ssh: None, restarts: 0 };
    live.now_ms += 1;
    live.record(gpux_market::JournalEntry::DeliveryStatus { at_ms: live.now_ms, account: AccountId(1), lease, state: running.clone() });
    live.engine(Command::EndLease { account: AccountId(0), lease });
    // The billing grace passes: the bill is final.
    live.now_ms += 11 * 60_000;
    live.engine(Command::Tick);
    assert!(live.market.engine().lease(lease).expect("still in the hot state").billing_closed);
    let market = &live.market;
    assert_eq!(market.check_delivery_status(AccountId(1), lease, &running), Err(ErrorCode::LeaseNotActive));
    assert_eq!(market.check_delivery_status(AccountId(1), lease, &DeliveryState::Stopped), Ok(()));
    live.now_ms += 1;
    let balances = live.market.engine().balances(AccountId(0));
    let applied = live.record(gpux_market::JournalEntry::DeliveryStatus {
        at_ms: live.now_ms,
        account: AccountId(1),
        lease,
        state: DeliveryState::Stopped,
    });
    assert!(applied.events.is_empty() && applied.follow_ups.is_empty(), "no money moves: {applied:?}");
    assert_eq!(live.market.engine().balances(AccountId(0)), balances);
    let shown = live.market.deliveries().lease(lease).and_then(|d| d.state.clone()).map(|(state, _)| state);
    assert_eq!(shown, Some(DeliveryState::Stopped), "the renter sees it gone");
}

/// Issue 61: two aggregators' sub-accounts filled the exchange's jobs table.
/// From rules 3 an account and its sub-accounts hold
/// `JOBS_LIVE_PER_PARTICIPANT_MAX` live jobs together (each account still
/// at most `JOBS_LIVE_PER_ACCOUNT_MAX`); journals before replay as they ran.
#[test]
fn a_participants_sub_accounts_hold_its_share_of_live_jobs_together_from_rules_3() {
    use gpux_protocol::jobs::limits::{JOBS_LIVE_PER_ACCOUNT_MAX, JOBS_LIVE_PER_PARTICIPANT_MAX};
    for rules in [2, 3] {
        let mut w = World::new(0);
        w.jobs = Jobs::default();
        w.jobs.adopt_rules(rules);
        let parent = AccountId(1_000);
        let subs = JOBS_LIVE_PER_PARTICIPANT_MAX / JOBS_LIVE_PER_ACCOUNT_MAX;
        for sub in 0..subs {
            let mut terms = w.terms(0, 100 * USD_2);
            terms.account = AccountId(1_001 + sub as u32);
            for _ in 0..JOBS_LIVE_PER_ACCOUNT_MAX {
                w.jobs.submit(terms.clone(), Default::default(), parent, T0).expect("within the share");
            }
        }
        let mut terms = w.terms(0, 100 * USD_2);
        terms.account = AccountId(2_000);
        let refused = w.jobs.submit(terms.clone(), Default::default(), parent, T0).err();
        let expected = if rules >= 3 { Some(JobRefusal::TooManyJobs) } else { None };
        assert_eq!(refused, expected, "rules {rules}: a sub-account past its parent's share");
        let other = w.terms(0, 100 * USD_2);
        assert!(w.jobs.submit(other, Default::default(), w.renter, T0).is_ok(), "another participant submits");
    }
}
