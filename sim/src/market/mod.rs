//! The discrete-event loop: participants act at simulated times, every action
//! goes to the real exchange (`SimExchange`) as a command or a signed usage
//! report, and the engine's events drive what happens next.
//!
//! The one design decision: the simulator keeps its own ground truth (when
//! each host was really up, what each lease really delivered, which reports
//! were lies) apart from the exchange's state, and checks the exchange against
//! it: no GPU leased twice at once, every charge exact for what was verified,
//! nothing billed beyond what was delivered, every cheat refused. The queue is
//! ordered by (time, insertion number) and every random draw comes from one
//! seeded stream in processing order, so a seed replays exactly.

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::sync::Arc;

use ed25519_dalek::SigningKey;
use gpux_engine::{
    AccountId, Command, ContractKind, Event, EventKind, GpuId, GpuSet, HostId, Input, InstrumentId, InstrumentState, LeaseDuration,
    LeaseId, LeaseKind, NewOrder, OrderId, OrderOptions, Role, Side, TimeInForce,
};
use gpux_protocol::{genesis_hash, UsageBody, UsageReport};
use gpux_settlement::ledger::LedgerAccount;
use gpux_settlement::UsageOutcome;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use rustc_hash::FxHashMap;

use crate::config::{SimConfig, MS_PER_DAY, MS_PER_HOUR, START_MS};
use crate::exchange::SimExchange;
use crate::metrics::{CheatStats, Metrics};
use crate::population::{self, Population, RenterKind, SupplierCheat, CLASSES};
use gpux_market::JournalEntry;

mod challenges;
mod events;
mod managed;
mod renters;
mod services;
mod suppliers;
mod usage;

const TICK_MINOR: u64 = 1_000;
const SAMPLE_EVERY_MS: u64 = 15 * 60_000;
/// The share of a renter's spot price it pays for preemptible time.
const PREEMPT_DISCOUNT_PERCENT: u64 = 55;
const PATIENCE_MS_MAX: u64 = 2 * MS_PER_HOUR;
/// How long after a host crashes its agent's session is seen to be gone
/// (the connection closes; the exchange then cancels the host's asks).
const SESSION_LOSS_DETECTED_MS: u64 = 30_000;

#[derive(Clone, Copy, Debug)]
enum Action {
    SupplierWake(u32),
    /// A fabric group's host offers its GPUs again right after a lease on
    /// it ends, as the agent does (other hosts wait for their next wake: a
    /// simplification older reports were made with).
    Reoffer(u32),
    JobArrival(u32),
    AggregatorWake(u32),
    Report {
        lease: LeaseId,
        last: bool,
    },
    EndLease(LeaseId),
    HostDown(u32),
    /// The exchange notices a crashed host's session is gone.
    SessionLost(u32),
    HostUp(u32),
    NetworkDown(u32),
    NetworkUp(u32),
    Sample,
    Snapshot,
    Restart,
    RenterCheat(u32),
    /// A hardware challenge of an idle GPU (scheduled again each time).
    Challenge(GpuId),
    /// The memory challenge that follows a GPU's compute answer (not scheduled again).
    MemoryChallenge(GpuId),
    /// The GPU's answer to a challenge arrives.
    ChallengeAnswer(u64, GpuId),
    /// A challenge of a host that went down runs out.
    ChallengeExpire(u64),
    /// A managed job's work ran to its end on this lease.
    ManagedDone(gpux_market::jobs::JobId, LeaseId),
    /// The exchange looks for silent job leases.
    ManagedSilence,
    /// A managed job's workload exits after checkpointing at a preemption notice.
    ManagedExit(gpux_market::jobs::JobId, LeaseId),
    /// A renter creates its service.
    ServiceCreate(u32),
    /// A service's replica is up on its lease: its host reports it running.
    ReplicaUp(LeaseId),
    /// The simulated router reports every service's load.
    ServiceLoad,
}

struct Scheduled {
    at_ms: u64,
    order: u64,
    action: Action,
}

impl PartialEq for Scheduled {
    fn eq(&self, other: &Self) -> bool {
        (self.at_ms, self.order) == (other.at_ms, other.order)
    }
}
impl Eq for Scheduled {}
impl PartialOrd for Scheduled {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}
impl Ord for Scheduled {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        (self.at_ms, self.order).cmp(&(other.at_ms, other.order))
    }
}

struct SupplierState {
    account: AccountId,
    key: SigningKey,
    host: Option<HostId>,
    gpus: Vec<GpuId>,
    /// When the host was really down (sorted, drawn ahead): the truth.
    down: Vec<(u64, u64)>,
    is_down: bool,
    network_down_until: u64,
    offered_window: Option<InstrumentId>,
    next_client_order_id: u64,
    /// A hardware challenge was answered, and one found a GPU wrong or slow.
    challenge_answered: bool,
    challenge_caught: bool,
    /// A fabric group's host shares its account with the group's others:
    /// it withdraws its own asks (these), never the account's.
    asks: Vec<OrderId>,
}

struct RenterState {
    account: AccountId,
    /// Renters that run a liveness watcher sign observations of their
    /// leases with this key (every other renter).
    watcher: Option<Arc<Watcher>>,
}

/// A watching renter's keys: the one its account logged in with (liveness
/// observations) and its GPU probe's, each with its public half computed
/// once (a `SigningKey` made from bytes computes it, a scalar
/// multiplication each time).
pub(super) struct Watcher {
    key: SigningKey,
    public: [u8; 32],
    probe: SigningKey,
    probe_public: [u8; 32],
}

impl Watcher {
    fn new(key: SigningKey) -> Watcher {
        // The probe's own key, made by the renter for its leases.
        let probe = SigningKey::from_bytes(&key.to_bytes().map(|b| b ^ 0xa5));
        Watcher { public: key.verifying_key().to_bytes(), probe_public: probe.verifying_key().to_bytes(), key, probe }
    }
}

struct AggregatorState {
    account: AccountId,
    bid_window: Option<InstrumentId>,
    offered_window: Option<InstrumentId>,
}

struct SimJob {
    renter: u32,
    kind: RenterKind,
    window: bool,
    /// Bought with a cluster bid; and whether, when it arrived, a fabric
    /// group of its class had that many hosts up with every GPU free.
    cluster: bool,
    supply_existed: bool,
    /// The fabric group of each host a cluster bid's leases run on.
    groups: Vec<Option<u32>>,
    wanted: u32,
    filled: u32,
    placed_at_ms: u64,
    first_fill_ms: Option<u64>,
    run_ms: Option<u64>,
}

#[derive(Clone, Default)]
struct Chain {
    accepted: u32,
    prev_hash: String,
    last_end_ms: u64,
    last_report: Option<UsageReport>,
}

struct SimLease {
    supplier: u32,
    price: u64,
    start_ms: u64,
    end_ms: Option<u64>,
    ended_ms: Option<u64>,
    gpus: Vec<(GpuId, String)>,
    chains: Vec<Chain>,
    /// The agent gave up reporting (a broken agent) from this time.
    stopped_ms: Option<u64>,
    /// A report arrived after billing closed.
    late: bool,
    /// Verified GPU-ms when its bill became provisional (reports missing at
    /// the grace), if it did.
    provisional_verified_ms: Option<u64>,
    /// The agent sent its last report (after the lease ended).
    last_report_sent: bool,
    /// Billing closed; the lease is kept only for a last report still on its way.
    billing_closed: bool,
    /// The renter's account and, if it watches its leases, its key; the end
    /// of its last liveness observation.
    renter: AccountId,
    watcher: Option<Arc<Watcher>>,
    observed_to_ms: u64,
    /// A fake-availability host's workload died here (the host goes on
    /// reporting the GPUs available).
    dead_from_ms: Option<u64>,
    disputed: bool,
    /// An accepted report claimed time after the workload died, on a
    /// watched lease.
    faked_watched: bool,
}

#[derive(Clone, Copy)]
struct WindowInfo {
    instrument: InstrumentId,
    class_index: usize,
    start_ms: u64,
}

pub struct Sim {
    pub config: SimConfig,
    rng: ChaCha8Rng,
    /// Hardware challenges draw from their own stream, so that turning them
    /// on or changing their schedule leaves the market's draws as they were.
    challenge_rng: ChaCha8Rng,
    pub exchange: SimExchange,
    queue: BinaryHeap<Reverse<Scheduled>>,
    queue_order: u64,
    pub now_ms: u64,
    population: Population,
    suppliers: Vec<SupplierState>,
    renters: Vec<RenterState>,
    aggregators: Vec<AggregatorState>,
    supplier_of_account: FxHashMap<AccountId, u32>,
    /// Every host's supplier (a fabric group's hosts share an account).
    supplier_of_host: FxHashMap<HostId, u32>,
    renter_of_account: FxHashMap<AccountId, u32>,
    underpayers: Vec<AccountId>,
    jobs: Vec<SimJob>,
    job_of_order: FxHashMap<OrderId, u32>,
    last_trade_buy_order: Option<OrderId>,
    leases: FxHashMap<LeaseId, SimLease>,
    /// Per GPU: the supplier, the class, how many leases run on it, and every
    /// interval it was leased (to prove none overlap).
    gpu_supplier: Vec<u32>,
    gpu_class: Vec<usize>,
    gpu_lease_count: Vec<u8>,
    gpu_online: Vec<bool>,
    /// A hardware challenge took the GPU out of its class.
    gpu_disqualified: Vec<bool>,
    gpu_intervals: Vec<Vec<(u64, u64)>>,
    instrument_kind: FxHashMap<InstrumentId, (usize, usize)>,
    windows: Vec<WindowInfo>,
    /// Last trade price per class and kind (spot, preemptible, reserved).
    reference_price: [[u64; 3]; 4],
    pub metrics: Metrics,
    /// Wall-clock time spent signing and settling usage reports (for the
    /// events/s breakdown on stderr; never in the report, which must not
    /// depend on the machine).
    pub report_wall: std::time::Duration,
    /// Likewise, signing, verifying and applying the renters' liveness and
    /// GPU probe observations.
    pub evidence_wall: std::time::Duration,
    /// The renters' signed observations applied.
    pub observations: u64,
    /// Posted-price counterfactual: GPUs free per class per hour, and the jobs.
    posted_capacity: Vec<[u32; 4]>,
    posted_jobs: Vec<PostedJob>,
    /// Training work submitted as gpux jobs, and which job each of their leases serves.
    managed: std::collections::BTreeMap<gpux_market::jobs::JobId, managed::Managed>,
    managed_lease: FxHashMap<LeaseId, gpux_market::jobs::JobId>,
    /// Inference renters that run a service instead of buying leases, the
    /// services, and which service each of their leases serves.
    service_renters: std::collections::BTreeSet<u32>,
    services: std::collections::BTreeMap<gpux_protocol::ServiceId, services::SimService>,
    service_lease: FxHashMap<LeaseId, gpux_protocol::ServiceId>,
}

struct PostedJob {
    hour: u32,
    class_index: u8,
    contract: u8,
    limit: u64,
    quantity: u32,
    hours: u32,
}

fn tick_round(price: u64) -> u64 {
    (price / TICK_MINOR).max(1) * TICK_MINOR
}

fn overlap_ms(a: (u64, u64), b: (u64, u64)) -> u64 {
    a.1.min(b.1).saturating_sub(a.0.max(b.0))
}

/// Demand over the day: low at night (UTC), a peak in the afternoon.
fn diurnal_factor(at_ms: u64) -> f64 {
    let hour = ((at_ms % MS_PER_DAY) / MS_PER_HOUR) as f64;
    1.0 + 0.5 * ((hour - 9.0) / 24.0 * std::f64::consts::TAU).sin()
}

impl Sim {
    pub fn new(config: SimConfig) -> Self {
        let mut rng = ChaCha8Rng::seed_from_u64(config.seed);
        let population = population::draw(&config, &mut rng);
        let hours = (config.days as u64 * 24) as usize;
        let mut base = [[0u64; 3]; 4];
        for (index, class) in CLASSES.iter().enumerate() {
            base[index] = [class.list_price_minor * 80 / 100, class.list_price_minor * 45 / 100, class.list_price_minor * 70 / 100];
        }
        let exchange = if config.record_journal { SimExchange::recording() } else { SimExchange::new() };
        let challenge_rng = ChaCha8Rng::seed_from_u64(config.seed ^ 0x6368_616c_6c65_6e67);
        let mut sim = Sim {
            challenge_rng,
            metrics: Metrics::new(hours, config.days as usize),
            config,
            rng,
            exchange,
            queue: BinaryHeap::new(),
            queue_order: 0,
            now_ms: START_MS,
            population,
            suppliers: Vec::new(),
            renters: Vec::new(),
            aggregators: Vec::new(),
            supplier_of_account: FxHashMap::default(),
            supplier_of_host: FxHashMap::default(),
            renter_of_account: FxHashMap::default(),
            underpayers: Vec::new(),
            jobs: Vec::new(),
            job_of_order: FxHashMap::default(),
            last_trade_buy_order: None,
            leases: FxHashMap::default(),
            gpu_supplier: Vec::new(),
            gpu_class: Vec::new(),
            gpu_lease_count: Vec::new(),
            gpu_online: Vec::new(),
            gpu_disqualified: Vec::new(),
            gpu_intervals: Vec::new(),
            instrument_kind: FxHashMap::default(),
            windows: Vec::new(),
            reference_price: base,
            posted_capacity: vec![[0; 4]; hours],
            posted_jobs: Vec::new(),
            managed: Default::default(),
            managed_lease: FxHashMap::default(),
            service_renters: Default::default(),
            services: Default::default(),
            service_lease: FxHashMap::default(),
            report_wall: std::time::Duration::ZERO,
            evidence_wall: std::time::Duration::ZERO,
            observations: 0,
        };
        for listed in sim.exchange.engine().instruments() {
            sim.learn_instrument(listed.instrument);
        }
        sim.open_suppliers();
        let grouped: Vec<u32> = sim.population.suppliers.iter().filter_map(|s| s.fabric_group).collect();
        sim.metrics.fabric_hosts = grouped.len() as u64;
        sim.metrics.fabric_groups = grouped.iter().collect::<std::collections::BTreeSet<_>>().len() as u64;
        sim.schedule_first_challenges();
        sim.open_renters();
        sim.open_aggregators();
        sim.schedule_run_wide();
        sim.open_services();
        sim
    }

    fn schedule(&mut self, at_ms: u64, action: Action) {
        self.queue_order += 1;
        self.queue.push(Reverse(Scheduled { at_ms, order: self.queue_order, action }));
    }

    /// Applies one command at the current time and reacts to its events.
    fn submit(&mut self, command: Command) -> Vec<Event> {
        let mut events = Vec::new();
        self.exchange.apply(Input { at_ms: self.now_ms, command }, &mut events);
        self.observe(&events);
        events
    }

    fn open_account(&mut self, role: Role) -> AccountId {
        let events = self.submit(Command::OpenAccount { role });
        events
            .iter()
            .find_map(|e| match e.kind {
                EventKind::AccountOpened { account, .. } => Some(account),
                _ => None,
            })
            .expect("the engine opens accounts up to its limit")
    }

    fn open_suppliers(&mut self) {
        for index in 0..self.population.suppliers.len() {
            // A fabric group's hosts run under its first host's account and key.
            let (account, key) = match self.population.suppliers[index].fabric_group {
                Some(first) if first as usize != index => {
                    let owner = &self.suppliers[first as usize];
                    (owner.account, owner.key.clone())
                }
                _ => {
                    let account = self.open_account(Role::Supplier);
                    let key = SigningKey::from_bytes(&self.population.suppliers[index].key_seed);
                    self.exchange.register_key(account, key.verifying_key().to_bytes());
                    self.exchange.publish_encryption_key(account, &key);
                    (account, key)
                }
            };
            let model = &self.population.suppliers[index];
            let (class_index, gpu_count) = (model.class_index, model.gpu_count);
            let mut state = SupplierState {
                account,
                key,
                host: None,
                gpus: Vec::new(),
                down: Vec::new(),
                is_down: false,
                network_down_until: 0,
                offered_window: None,
                next_client_order_id: 1,
                challenge_answered: false,
                challenge_caught: false,
                asks: Vec::new(),
            };
            self.register_gpus(index, &mut state);
            self.draw_faults(index, &mut state);
            let posted_hours = self.posted_capacity.len();
            for hour in 0..posted_hours {
                let owner_busy = model_owner_busy(self.population.suppliers[index].owner_day_start_hour, hour as u64);
                if !owner_busy {
                    self.posted_capacity[hour][class_index] += gpu_count;
                }
            }
            self.supplier_of_account.entry(account).or_insert(index as u32);
            if let Some(host) = state.host {
                self.supplier_of_host.insert(host, index as u32);
            }
            debug_assert!(
                self.population.suppliers[index].fabric_group.is_none() || state.gpus.len() as u32 == gpu_count,
                "a fabric group's host registered all its GPUs"
            );
            self.suppliers.push(state);
            let first_wake = START_MS + self.rng.random_range(0..self.config.supplier_wake_ms);
            self.schedule(first_wake, Action::SupplierWake(index as u32));
        }
    }

    /// Registers the supplier's GPUs on its host.
    fn register_gpus(&mut self, index: usize, state: &mut SupplierState) {
        let (class_index, gpu_count, account) =
            (self.population.suppliers[index].class_index, self.population.suppliers[index].gpu_count, state.account);
        for gpu_index in 0..gpu_count {
            let uuid = format!("GPU-{index:06}-{gpu_index}");
            let spec = population::spec_of(class_index);
            let events = self.submit(self.register_gpu(index, account, uuid, spec));
            for event in events {
                if let EventKind::GpuRegistered { host, gpu, .. } = event.kind {
                    state.host = Some(host);
                    state.gpus.push(gpu);
                    self.gpu_supplier.push(index as u32);
                    self.gpu_class.push(class_index);
                    self.gpu_lease_count.push(0);
                    self.gpu_online.push(true);
                    self.gpu_disqualified.push(false);
                    self.gpu_intervals.push(Vec::new());
                    debug_assert_eq!(self.gpu_supplier.len(), gpu.0 as usize + 1);
                }
            }
        }
    }

    /// Draws the host's crashes and network losses ahead, so the truth about
    /// every interval is known.
    fn draw_faults(&mut self, index: usize, state: &mut SupplierState) {
        let end_ms = self.config.end_ms();
        for day in 0..self.config.days as u64 {
            let day_start = START_MS + day * MS_PER_DAY;
            if self.rng.random_range(0..1_000) < self.config.fault_per_mille {
                let at = day_start + self.rng.random_range(0..MS_PER_DAY) / 60_000 * 60_000;
                let until = (at + self.rng.random_range(10..240) * 60_000).min(end_ms);
                state.down.push((at, until));
                self.schedule(at, Action::HostDown(index as u32));
                self.schedule(until, Action::HostUp(index as u32));
            }
            if self.rng.random_range(0..1_000) < self.config.fault_per_mille {
                let at = day_start + self.rng.random_range(0..MS_PER_DAY);
                let until = at + self.rng.random_range(5..120) * 60_000;
                self.schedule(at, Action::NetworkDown(index as u32));
                self.schedule(until, Action::NetworkUp(index as u32));
            }
        }
        state.down.sort_unstable();
    }

    fn open_renters(&mut self) {
        for index in 0..self.population.renters.len() {
            let account = self.open_account(Role::Renter);
            let underpays = self.population.renters[index].underpays;
            let deposit = if underpays { 0 } else { self.rng.random_range(50..500) * 1_000_000 };
            if deposit > 0 {
                self.submit(Command::Deposit { account, amount_minor: deposit });
            }
            if underpays {
                self.underpayers.push(account);
                let at = START_MS + self.rng.random_range(0..self.config.days as u64 * MS_PER_DAY);
                self.schedule(at, Action::RenterCheat(index as u32));
            }
            // Every other renter watches its leases; its key is bound as a
            // login binds it (drawn from no random stream, so the market's
            // draws stay as they were).
            let watcher = (index % 2 == 0).then(|| {
                let mut seed = [0x5a; 32];
                seed[..4].copy_from_slice(&(index as u32).to_le_bytes());
                let watcher = Watcher::new(SigningKey::from_bytes(&seed));
                self.exchange.register_key(account, watcher.public);
                Arc::new(watcher)
            });
            self.renter_of_account.insert(account, index as u32);
            self.renters.push(RenterState { account, watcher });
            let first = self.next_arrival(index as u32, START_MS);
            self.schedule(first, Action::JobArrival(index as u32));
        }
    }

    fn open_aggregators(&mut self) {
        for index in 0..self.population.aggregators.len() {
            let account = self.open_account(Role::Aggregator);
            self.submit(Command::Deposit { account, amount_minor: 20_000_000_000 });
            self.aggregators.push(AggregatorState { account, bid_window: None, offered_window: None });
            let at = START_MS + self.rng.random_range(0..MS_PER_HOUR);
            self.schedule(at, Action::AggregatorWake(index as u32));
        }
    }

    fn schedule_run_wide(&mut self) {
        let end_ms = self.config.end_ms();
        let mut at = START_MS;
        while at < end_ms {
            self.schedule(at, Action::Sample);
            at += SAMPLE_EVERY_MS;
        }
        let restarts = self.config.restarts as u64;
        for k in 1..=restarts {
            let at = START_MS + k * (end_ms - START_MS) / (restarts + 1);
            self.schedule(at.saturating_sub(2 * MS_PER_HOUR).max(START_MS), Action::Snapshot);
            self.schedule(at, Action::Restart);
        }
        if self.config.managed_jobs_bps > 0 || self.config.service_renters_bps > 0 {
            self.schedule(START_MS + managed::SILENCE_CHECK_MS, Action::ManagedSilence);
        }
    }

    /// The time of a renter's next job after `after_ms`: a Poisson process
    /// thinned by the daily cycle, with bursts on the hour now and then.
    fn next_arrival(&mut self, renter: u32, after_ms: u64) -> u64 {
        // Candidates at the peak rate, kept with the day's share of the peak.
        let rate_per_ms = self.population.renters[renter as usize].jobs_per_day * 2.0 / MS_PER_DAY as f64;
        let mut at = after_ms;
        loop {
            let gap = -(1.0 - self.rng.random::<f64>()).ln() / rate_per_ms;
            at = at.saturating_add(gap as u64 + 1);
            let burst = if (at / MS_PER_HOUR).is_multiple_of(37) { 3.0 } else { 1.0 };
            if at >= self.config.end_ms() || self.rng.random::<f64>() < (diurnal_factor(at) * burst / 2.0).min(1.0) {
                return at;
            }
        }
    }

    /// Runs to the end of the simulated period; `progress` is told the
    /// simulated time now and then.
    pub fn run(&mut self, mut progress: impl FnMut(u64)) {
        let end_ms = self.config.end_ms();
        let mut last_progress = START_MS;
        // Engine timers and simulator actions interleave in time order: a
        // timer may cause an action (a lease's last report) due before the
        // next queued one.
        while let Some(Reverse(next)) = self.queue.peek() {
            let next_at_ms = next.at_ms;
            if next_at_ms >= end_ms {
                break;
            }
            let due = self.exchange.engine().next_due_ms();
            if due <= next_at_ms {
                self.now_ms = due.max(self.now_ms);
                self.submit(Command::Tick);
                continue;
            }
            let Some(Reverse(next)) = self.queue.pop() else { break };
            self.now_ms = next.at_ms;
            self.metrics.sim_actions += 1;
            self.act(next.action);
            if self.now_ms - last_progress >= MS_PER_HOUR {
                last_progress = self.now_ms;
                progress(self.now_ms - START_MS);
            }
        }
        self.advance_engine_to(end_ms);
        self.now_ms = end_ms;
        self.finish();
        progress(end_ms - START_MS);
    }

    /// Fires the engine's timers (lease ends, windows, escrow top-ups,
    /// billing closes) due before `at_ms`, each at its own time.
    fn advance_engine_to(&mut self, at_ms: u64) {
        loop {
            let due = self.exchange.engine().next_due_ms();
            if due > at_ms {
                break;
            }
            self.now_ms = due.max(self.now_ms);
            self.submit(Command::Tick);
        }
    }

    fn act(&mut self, action: Action) {
        match action {
            Action::SupplierWake(index) => self.supplier_wake(index),
            Action::Reoffer(index) => self.supplier_offer(index),
            Action::JobArrival(index) => self.job_arrival(index),
            Action::AggregatorWake(index) => self.aggregator_wake(index),
            Action::Report { lease, last } => self.report(lease, last),
            Action::EndLease(lease) => {
                if let Some(sim_lease) = self.leases.get(&lease) {
                    if sim_lease.ended_ms.is_none() {
                        let renter = self.exchange.engine().lease(lease).map(|l| l.renter).expect("a simulated lease is in the engine");
                        self.submit(Command::EndLease { account: renter, lease });
                    }
                }
            }
            Action::HostDown(index) => {
                self.suppliers[index as usize].is_down = true;
                self.metrics.faults.crashes += 1;
                self.schedule(self.now_ms + SESSION_LOSS_DETECTED_MS, Action::SessionLost(index));
            }
            Action::SessionLost(index) => {
                // The agent logged in with cancel_on_disconnect: the exchange
                // cancels the host's asks once its session is gone.
                // A fabric group's hosts share an account: while another of
                // its sessions is open the exchange cancels only what this
                // one placed, the whole account's once its last is gone.
                let group = self.population.suppliers[index as usize].fabric_group;
                let last = group.is_none_or(|group| {
                    (0..self.suppliers.len()).all(|i| self.population.suppliers[i].fabric_group != Some(group) || self.suppliers[i].is_down)
                });
                let account = self.suppliers[index as usize].account;
                if self.suppliers[index as usize].is_down && last {
                    self.submit(Command::MassCancel { account, instrument: None });
                    self.exchange.supplier_disconnected(self.now_ms, account);
                } else if self.suppliers[index as usize].is_down {
                    for order in std::mem::take(&mut self.suppliers[index as usize].asks) {
                        if self.exchange.engine().order(order).is_some() {
                            self.submit(Command::CancelOrder { account, order });
                        }
                    }
                }
            }
            Action::HostUp(index) => {
                self.suppliers[index as usize].is_down = false;
            }
            Action::NetworkDown(index) => {
                self.suppliers[index as usize].network_down_until = self.now_ms + 1;
                self.metrics.faults.network_losses += 1;
            }
            Action::NetworkUp(index) => self.suppliers[index as usize].network_down_until = 0,
            Action::Sample => self.sample(),
            Action::ManagedDone(job, lease) => self.managed_done(job, lease),
            Action::ManagedSilence => self.managed_silence_check(),
            Action::ManagedExit(job, lease) => self.managed_exit(job, lease),
            Action::ServiceCreate(index) => self.create_service(index),
            Action::ReplicaUp(lease) => self.replica_up(lease),
            Action::ServiceLoad => self.services_load(),
            Action::Snapshot => self.exchange.snapshot(),
            Action::Restart => self.restart(),
            Action::RenterCheat(index) => self.renter_cheat(index),
            Action::Challenge(gpu) => self.challenge_gpu(gpu, true),
            Action::MemoryChallenge(gpu) => self.challenge_gpu(gpu, false),
            Action::ChallengeAnswer(challenge, gpu) => self.answer_challenge(challenge, gpu),
            Action::ChallengeExpire(challenge) => self.expire_challenge(challenge),
        }
    }

    fn restart(&mut self) {
        if let Some(check) = self.exchange.restart() {
            self.metrics.faults.restarts += 1;
            self.metrics.faults.restart_entries_replayed += check.replayed_entries;
            if check.hash_before != check.hash_after || !check.ledger_matches {
                self.metrics.faults.restart_mismatches += 1;
            }
        }
    }

    // ---------------------------------------------------------------- metrics

    fn sample(&mut self) {
        // The last sample of each day measures what the state holds.
        let day = ((self.now_ms - START_MS) / MS_PER_DAY) as usize;
        if (self.now_ms - START_MS) % MS_PER_DAY >= MS_PER_DAY - SAMPLE_EVERY_MS && self.metrics.hot_state_by_day.len() == day {
            self.metrics.hot_state_by_day.push(self.exchange.hot_state_bytes());
        }
        let hour = ((self.now_ms - START_MS) / MS_PER_HOUR) as usize;
        let Some(samples) = self.metrics.hours.get_mut(hour) else { return };
        for gpu in 0..self.gpu_supplier.len() {
            let class_index = self.gpu_class[gpu];
            let supplier = &self.suppliers[self.gpu_supplier[gpu] as usize];
            let leased = self.gpu_lease_count[gpu] > 0;
            if leased || (self.gpu_online[gpu] && !supplier.is_down) {
                samples[class_index].available_gpu_samples += 1;
            }
            if leased {
                samples[class_index].leased_gpu_samples += 1;
            }
        }
    }

    /// End-of-run checks: no GPU leased twice at once, the ledger balanced and
    /// equal to the engine's balances, what underpayers still owe.
    fn finish(&mut self) {
        self.managed_finish();
        self.services_finish();
        // Leases still running count up to the end of the run.
        for lease in self.leases.values() {
            if lease.ended_ms.is_none() {
                for (gpu, _) in &lease.gpus {
                    self.gpu_intervals[gpu.0 as usize].push((lease.start_ms, self.now_ms.max(lease.start_ms + 1)));
                }
            }
        }
        for intervals in &mut self.gpu_intervals {
            intervals.sort_unstable();
            self.metrics.double_bookings += intervals.windows(2).filter(|pair| pair[1].0 < pair[0].1).count() as u64;
        }
        self.posted_baseline();
        for account in self.underpayers.clone() {
            self.metrics.underpayer_debt_minor += self.exchange.engine().balances(account).map_or(0, |b| b.debt_minor);
        }
        let moved = self.metrics.underpayer_debt_minor;
        let stats = self.metrics.renter_cheats.entry("open-ended lease left unfunded").or_default();
        stats.moved_minor = moved;
        // An unfunded lease is caught when the engine ends it (or its bid was
        // refused); those still running at the end had funds enough so far.
        stats.caught = stats.attempts;
        self.record_scores();
    }

    /// Every supplier's reliability score at the end of the run, by what the
    /// simulator knows it was (the truth the exchange does not see).
    fn record_scores(&mut self) {
        let now_ms = self.exchange.market().clock_ms();
        for (index, state) in self.suppliers.iter().enumerate() {
            let model = &self.population.suppliers[index];
            let kind = match (model.cheat, model.faults.stops_reporting, state.down.is_empty()) {
                (Some(cheat), _, _) => format!("cheat: {}", cheat.label()),
                (None, true, _) => "honest, agent stops reporting".to_string(),
                (None, false, false) => "honest, host went down".to_string(),
                (None, false, true) => "honest".to_string(),
            };
            let score = self.exchange.market().reliability().supplier(state.account, now_ms).score_bps;
            self.metrics.scores.entry(kind).or_default().push(score);
        }
    }

    /// The ledger balances: the sum of all accounts is zero and every
    /// participant's four ledger balances equal the engine's.
    pub fn ledger_matches_engine(&self) -> bool {
        let ledger = self.exchange.ledger();
        let engine = self.exchange.engine();
        ledger.sum() == 0
            && (0..engine.account_count()).all(|a| {
                let account = AccountId(a);
                let balances = engine.balances(account).unwrap_or_default();
                ledger.balance(LedgerAccount::Available(account)) == balances.available_minor as i128
                    && ledger.balance(LedgerAccount::Held(account)) == balances.held_minor as i128
                    && ledger.balance(LedgerAccount::Payable(account)) == balances.payable_minor as i128
                    && -ledger.balance(LedgerAccount::Debt(account)) == balances.debt_minor as i128
            })
    }

    pub fn gpu_count(&self) -> usize {
        self.gpu_supplier.len()
    }
}

/// A home rig's owner uses it for ten hours from its day's start hour.
fn model_owner_busy(owner_day_start_hour: Option<u32>, run_hour: u64) -> bool {
    owner_day_start_hour.is_some_and(|start| {
        let hour = (run_hour % 24) as u32;
        (hour + 24 - start) % 24 < 10
    })
}

/// GPU time a host really delivered in `[from_ms, to_ms)`: the interval less
/// the time the host was down.
fn delivered_ms(down: &[(u64, u64)], from_ms: u64, to_ms: u64) -> u64 {
    let lost: u64 = down.iter().map(|&interval| overlap_ms(interval, (from_ms, to_ms))).sum();
    (to_ms - from_ms).saturating_sub(lost)
}
