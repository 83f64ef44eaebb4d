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

use ed25519_dalek::SigningKey;
use gpux_engine::{
    AccountId, Command, ContractKind, Event, EventKind, GpuId, GpuSet, HostId, Input, InstrumentId, InstrumentState, LeaseDuration,
    LeaseId, LeaseKind, NewOrder, OrderId, Role, Side, TimeInForce,
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

const TICK_MINOR: u64 = 1_000;
const SAMPLE_EVERY_MS: u64 = 15 * 60_000;
/// The share of a renter's spot price it pays for preemptible time.
const PREEMPT_DISCOUNT_PERCENT: u64 = 55;
const PATIENCE_MS_MAX: u64 = 2 * MS_PER_HOUR;

#[derive(Clone, Copy, Debug)]
enum Action {
    SupplierWake(u32),
    JobArrival(u32),
    AggregatorWake(u32),
    Report { lease: LeaseId, last: bool },
    EndLease(LeaseId),
    HostDown(u32),
    HostUp(u32),
    NetworkDown(u32),
    NetworkUp(u32),
    Sample,
    Snapshot,
    Restart,
    RenterCheat(u32),
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
}

struct RenterState {
    account: AccountId,
}

struct AggregatorState {
    account: AccountId,
    bid_window: Option<InstrumentId>,
    offered_window: Option<InstrumentId>,
}

struct Job {
    renter: u32,
    kind: RenterKind,
    window: bool,
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
    /// The agent sent its last report (after the lease ended).
    last_report_sent: bool,
    /// Billing closed; the lease is kept only for a last report still on its way.
    billing_closed: bool,
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
    pub exchange: SimExchange,
    queue: BinaryHeap<Reverse<Scheduled>>,
    queue_order: u64,
    pub now_ms: u64,
    population: Population,
    suppliers: Vec<SupplierState>,
    renters: Vec<RenterState>,
    aggregators: Vec<AggregatorState>,
    supplier_of_account: FxHashMap<AccountId, u32>,
    underpayers: Vec<AccountId>,
    jobs: Vec<Job>,
    job_of_order: FxHashMap<OrderId, u32>,
    last_trade_buy_order: Option<OrderId>,
    leases: FxHashMap<LeaseId, SimLease>,
    /// Per GPU: the supplier, the class, how many leases run on it, and every
    /// interval it was leased (to prove none overlap).
    gpu_supplier: Vec<u32>,
    gpu_class: Vec<usize>,
    gpu_lease_count: Vec<u8>,
    gpu_online: Vec<bool>,
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
    /// Posted-price counterfactual: GPUs free per class per hour, and the jobs.
    posted_capacity: Vec<[u32; 4]>,
    posted_jobs: Vec<PostedJob>,
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
        let mut sim = Sim {
            metrics: Metrics::new(hours, config.days as usize),
            config,
            rng,
            exchange: SimExchange::new(),
            queue: BinaryHeap::new(),
            queue_order: 0,
            now_ms: START_MS,
            population,
            suppliers: Vec::new(),
            renters: Vec::new(),
            aggregators: Vec::new(),
            supplier_of_account: FxHashMap::default(),
            underpayers: Vec::new(),
            jobs: Vec::new(),
            job_of_order: FxHashMap::default(),
            last_trade_buy_order: None,
            leases: FxHashMap::default(),
            gpu_supplier: Vec::new(),
            gpu_class: Vec::new(),
            gpu_lease_count: Vec::new(),
            gpu_online: Vec::new(),
            gpu_intervals: Vec::new(),
            instrument_kind: FxHashMap::default(),
            windows: Vec::new(),
            reference_price: base,
            posted_capacity: vec![[0; 4]; hours],
            posted_jobs: Vec::new(),
            report_wall: std::time::Duration::ZERO,
        };
        for index in 0..sim.exchange.engine().instruments().len() as u32 {
            sim.learn_instrument(InstrumentId(index));
        }
        sim.open_suppliers();
        sim.open_renters();
        sim.open_aggregators();
        sim.schedule_run_wide();
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
        let end_ms = self.config.end_ms();
        for index in 0..self.population.suppliers.len() {
            let account = self.open_account(Role::Supplier);
            let model = &self.population.suppliers[index];
            let key = SigningKey::from_bytes(&model.key_seed);
            self.exchange.register_key(account, key.verifying_key().to_bytes());
            let (class_index, gpu_count, host_name) = (model.class_index, model.gpu_count, model.host_name.clone());
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
            };
            for gpu_index in 0..gpu_count {
                let uuid = format!("GPU-{index:06}-{gpu_index}");
                let spec = population::spec_of(class_index);
                let events = self.submit(Command::RegisterGpu { account, host: host_name.clone(), gpu_uuid: uuid, spec });
                for event in events {
                    if let EventKind::GpuRegistered { host, gpu, .. } = event.kind {
                        state.host = Some(host);
                        state.gpus.push(gpu);
                        self.gpu_supplier.push(index as u32);
                        self.gpu_class.push(class_index);
                        self.gpu_lease_count.push(0);
                        self.gpu_online.push(true);
                        self.gpu_intervals.push(Vec::new());
                        debug_assert_eq!(self.gpu_supplier.len(), gpu.0 as usize + 1);
                    }
                }
            }
            // Faults are drawn ahead so the truth about every interval is known.
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
            let posted_hours = self.posted_capacity.len();
            for hour in 0..posted_hours {
                let owner_busy = model_owner_busy(self.population.suppliers[index].owner_day_start_hour, hour as u64);
                if !owner_busy {
                    self.posted_capacity[hour][class_index] += gpu_count;
                }
            }
            self.supplier_of_account.insert(account, index as u32);
            self.suppliers.push(state);
            let first_wake = START_MS + self.rng.random_range(0..self.config.supplier_wake_ms);
            self.schedule(first_wake, Action::SupplierWake(index as u32));
        }
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
            self.renters.push(RenterState { account });
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
            Action::Snapshot => self.exchange.snapshot(),
            Action::Restart => self.restart(),
            Action::RenterCheat(index) => self.renter_cheat(index),
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

    // ---------------------------------------------------------------- events

    fn observe(&mut self, events: &[Event]) {
        for event in events {
            match event.kind {
                EventKind::InstrumentListed { instrument } => self.learn_instrument(instrument),
                EventKind::OrderAccepted { order, client_order_id, account, .. }
                    if client_order_id > 0 && !self.supplier_of_account.contains_key(&account) =>
                {
                    let job = self.jobs.get(client_order_id as usize - 1);
                    if job.is_some_and(|job| self.renters.get(job.renter as usize).is_some_and(|r| r.account == account)) {
                        self.job_of_order.insert(order, client_order_id as u32 - 1);
                    }
                }
                EventKind::Trade { instrument, price_minor_per_gpu_hour, quantity, buy_order, .. } => {
                    self.on_trade(instrument, price_minor_per_gpu_hour, quantity, buy_order)
                }
                EventKind::OrderClosed { order, .. } => self.on_order_closed(order),
                EventKind::LeaseCreated { lease, kind, renter, host: _, price_minor_per_gpu_hour, start_ms, end_ms, supplier, .. } => {
                    self.on_lease_created(lease, kind, renter, supplier, price_minor_per_gpu_hour, start_ms, end_ms)
                }
                EventKind::LeaseEnded { lease, .. } => self.on_lease_ended(lease),
                EventKind::PreemptionNotice { .. } => {
                    let day = ((self.now_ms - START_MS) / MS_PER_DAY) as usize;
                    if let Some(count) = self.metrics.preemptions_by_day.get_mut(day) {
                        *count += 1;
                    }
                }
                EventKind::LeaseBillingClosed { lease, verified_gpu_ms, usage_charged_minor, .. } => {
                    self.on_billing_closed(lease, verified_gpu_ms, usage_charged_minor)
                }
                EventKind::FundsCharged { to: None, amount_minor, reason: gpux_engine::HoldReason::Lease(lease), .. }
                | EventKind::UsageUnpaid { lease, amount_minor, .. } => {
                    if let Some(sim_lease) = self.leases.get(&lease) {
                        let class_index = self.population.suppliers[sim_lease.supplier as usize].class_index;
                        self.metrics.supplier_revenue_minor[class_index] += amount_minor;
                    }
                    if let EventKind::UsageUnpaid { .. } = event.kind {
                        self.metrics.billing.unpaid_usage_minor += amount_minor;
                    }
                }
                EventKind::FeeCharged { amount_minor, .. } => self.metrics.billing.fees_minor += amount_minor,
                EventKind::SlaCredited { amount_minor, .. } => {
                    self.metrics.billing.sla_credits += 1;
                    self.metrics.billing.sla_credited_minor += amount_minor;
                }
                EventKind::GpuStatusChanged { gpu, online } => self.gpu_online[gpu.0 as usize] = online,
                _ => {}
            }
        }
    }

    fn learn_instrument(&mut self, instrument: InstrumentId) {
        let Some(info) = self.exchange.engine().instrument(instrument) else { return };
        let Some(class_index) = CLASSES.iter().position(|c| c.name == info.class) else { return };
        let kind = match info.contract {
            ContractKind::Spot => 0,
            ContractKind::Preemptible => 1,
            ContractKind::Reserved { window_start_ms, window_end_ms } => {
                if window_end_ms - window_start_ms == MS_PER_DAY {
                    self.windows.push(WindowInfo { instrument, class_index, start_ms: window_start_ms });
                }
                2
            }
        };
        self.instrument_kind.insert(instrument, (class_index, kind));
    }

    fn on_trade(&mut self, instrument: InstrumentId, price: u64, quantity: u32, buy_order: OrderId) {
        self.last_trade_buy_order = Some(buy_order);
        if let Some(&(class_index, kind)) = self.instrument_kind.get(&instrument) {
            self.reference_price[class_index][kind] = price;
            let hour = ((self.now_ms - START_MS) / MS_PER_HOUR) as usize;
            if let Some(bucket) = self.metrics.trades.get_mut(hour) {
                bucket[class_index][kind].notional_minor += price as u128 * quantity as u128;
                bucket[class_index][kind].gpus += quantity as u64;
            }
        }
        if let Some(&job) = self.job_of_order.get(&buy_order) {
            let job = &mut self.jobs[job as usize];
            job.filled += quantity;
            job.first_fill_ms.get_or_insert(self.now_ms);
        }
    }

    fn on_order_closed(&mut self, order: OrderId) {
        let Some(job_index) = self.job_of_order.remove(&order) else { return };
        let job = &self.jobs[job_index as usize];
        let stats = if job.window { &mut self.metrics.window_bids } else { self.metrics.jobs.entry(job.kind).or_default() };
        stats.gpus_filled += job.filled as u64;
        if job.filled >= job.wanted {
            stats.fully_filled += 1;
        } else if job.filled == 0 {
            stats.unfilled += 1;
        }
        if let Some(first) = job.first_fill_ms {
            stats.time_to_fill_ms.push(first - job.placed_at_ms);
        }
    }

    #[allow(clippy::too_many_arguments)]
    fn on_lease_created(
        &mut self,
        lease: LeaseId,
        kind: LeaseKind,
        renter: AccountId,
        supplier: AccountId,
        price: u64,
        start_ms: u64,
        end_ms: Option<u64>,
    ) {
        let supplier_index = *self.supplier_of_account.get(&supplier).expect("leases are sold by simulated suppliers");
        let info = self.exchange.engine().lease(lease).expect("a created lease exists");
        let gpus: Vec<(GpuId, String)> =
            info.gpus.iter().map(|&gpu| (gpu, self.exchange.engine().gpu(gpu).expect("a leased GPU exists").uuid)).collect();
        for (gpu, _) in &gpus {
            self.gpu_lease_count[gpu.0 as usize] += 1;
        }
        self.metrics.leases_by_kind[kind as usize] += 1;
        if self.suppliers[supplier_index as usize].is_down {
            self.metrics.faults.leases_on_down_hosts += 1;
        }
        let chains = vec![Chain { prev_hash: genesis_hash(), last_end_ms: start_ms, ..Chain::default() }; gpus.len()];
        let stops = self.population.suppliers[supplier_index as usize].faults.stops_reporting;
        if stops {
            self.metrics.faults.agents_stopped_reporting += 1;
        }
        self.leases.insert(
            lease,
            SimLease {
                supplier: supplier_index,
                price,
                start_ms,
                end_ms,
                ended_ms: None,
                gpus,
                chains,
                stopped_ms: stops.then_some(start_ms + MS_PER_HOUR / 2),
                late: false,
                last_report_sent: false,
                billing_closed: false,
            },
        );
        let delay = self.population.suppliers[supplier_index as usize].faults.report_delay_ms;
        self.schedule(start_ms + self.config.report_interval_ms + delay, Action::Report { lease, last: false });
        // A spot or preemptible lease answers the job whose bid just traded.
        if kind != LeaseKind::Reserved {
            if let Some(job) = self.last_trade_buy_order.and_then(|order| self.job_of_order.get(&order)).copied() {
                let job = &self.jobs[job as usize];
                if let (Some(run_ms), true) = (job.run_ms, self.renters[job.renter as usize].account == renter) {
                    self.schedule(start_ms + run_ms, Action::EndLease(lease));
                }
            }
        }
    }

    fn on_lease_ended(&mut self, lease: LeaseId) {
        let Some(sim_lease) = self.leases.get_mut(&lease) else { return };
        let ended = self.now_ms.max(sim_lease.start_ms);
        sim_lease.ended_ms = Some(ended);
        for (gpu, _) in &sim_lease.gpus {
            self.gpu_lease_count[gpu.0 as usize] -= 1;
            if ended > sim_lease.start_ms {
                self.gpu_intervals[gpu.0 as usize].push((sim_lease.start_ms, ended));
            }
        }
        let delay = self.population.suppliers[sim_lease.supplier as usize].faults.report_delay_ms;
        self.schedule(ended + delay, Action::Report { lease, last: true });
    }

    fn on_billing_closed(&mut self, lease: LeaseId, verified_gpu_ms: u64, usage_charged_minor: u64) {
        let Some(sim_lease) = self.leases.get_mut(&lease) else { return };
        sim_lease.billing_closed = true;
        // A last report still on its way will be refused: keep the lease for it.
        let late = !sim_lease.last_report_sent && sim_lease.stopped_ms.is_none();
        sim_lease.late |= late;
        let owned;
        let sim_lease = if late {
            self.leases.get(&lease).expect("just seen")
        } else {
            owned = self.leases.remove(&lease).expect("just seen");
            &owned
        };
        let supplier = &self.suppliers[sim_lease.supplier as usize];
        let end = sim_lease.ended_ms.expect("billing closes after the lease ended");
        let delivered: u64 = sim_lease.gpus.iter().map(|_| delivered_ms(&supplier.down, sim_lease.start_ms, end)).sum();
        let billing = &mut self.metrics.billing;
        billing.leases_closed += 1;
        billing.delivered_gpu_ms += delivered;
        billing.verified_gpu_ms += verified_gpu_ms;
        billing.usage_charged_minor += usage_charged_minor;
        billing.delivered_value_minor += (sim_lease.price as u128 * delivered as u128 / MS_PER_HOUR as u128) as u64;
        if usage_charged_minor != (sim_lease.price as u128 * verified_gpu_ms as u128 / MS_PER_HOUR as u128) as u64 {
            billing.charge_rule_violations += 1;
        }
        if verified_gpu_ms > delivered {
            billing.overbilled_leases += 1;
            billing.overbilled_gpu_ms += verified_gpu_ms - delivered;
        }
        let unbilled = delivered.saturating_sub(verified_gpu_ms);
        if sim_lease.stopped_ms.is_some() {
            self.metrics.faults.unbilled_stopped_gpu_ms += unbilled;
        } else if sim_lease.late {
            self.metrics.faults.unbilled_late_gpu_ms += unbilled;
        } else {
            billing.clean_leases += 1;
            if verified_gpu_ms != delivered {
                billing.clean_mismatches += 1;
            }
        }
    }

    // ------------------------------------------------------------ suppliers

    fn supplier_wake(&mut self, index: u32) {
        let jitter = self.rng.random_range(0..60_000);
        self.schedule(self.now_ms + self.config.supplier_wake_ms + jitter, Action::SupplierWake(index));
        let i = index as usize;
        let Some(host) = self.suppliers[i].host else { return };
        if self.suppliers[i].is_down {
            return;
        }
        let account = self.suppliers[i].account;
        let class_index = self.population.suppliers[i].class_index;
        let hour = (self.now_ms - START_MS) / MS_PER_HOUR;
        let owner_busy = model_owner_busy(self.population.suppliers[i].owner_day_start_hour, hour);
        let spot = InstrumentId(class_index as u32 * 2);
        let preempt = InstrumentId(class_index as u32 * 2 + 1);
        self.submit(Command::MassCancel { account, instrument: Some(spot) });
        self.submit(Command::MassCancel { account, instrument: Some(preempt) });
        let mut free_mask = 0u64;
        for bit in 0..self.suppliers[i].gpus.len() {
            let gpu = self.suppliers[i].gpus[bit];
            let leased = self.gpu_lease_count[gpu.0 as usize] > 0;
            // A home rig's owner uses it by day: idle GPUs go offline then.
            let want_online = leased || !owner_busy;
            if self.gpu_online[gpu.0 as usize] != want_online {
                self.submit(Command::SetGpuOnline { account, gpu, online: want_online });
            }
            if want_online && !leased {
                free_mask |= 1 << bit;
            }
        }
        let floor = self.population.suppliers[i].floor_minor;
        if free_mask != 0 {
            let spot_price = tick_round((self.reference_price[class_index][0] * self.rng.random_range(94..104) / 100).max(floor));
            let preempt_price = tick_round(
                (self.reference_price[class_index][1] * self.rng.random_range(94..104) / 100).max(floor * PREEMPT_DISCOUNT_PERCENT / 100),
            );
            let quantity = free_mask.count_ones();
            for (instrument, price) in [(spot, spot_price), (preempt, preempt_price)] {
                let id = self.next_supplier_order_id(i);
                let mut order = NewOrder::limit(account, id, instrument, Side::Sell, price, quantity);
                order.supply = Some(GpuSet { host, gpu_mask: free_mask });
                self.place(order);
            }
        }
        if self.population.suppliers[i].sells_windows {
            self.offer_window(i, host, class_index, floor);
        }
        if self.population.suppliers[i].cheat == Some(SupplierCheat::DoubleSell) && self.rng.random_range(0..8) == 0 {
            self.double_sell(i, host, class_index);
        }
    }

    fn next_supplier_order_id(&mut self, supplier: usize) -> u64 {
        let id = self.suppliers[supplier].next_client_order_id;
        self.suppliers[supplier].next_client_order_id += 1;
        id
    }

    /// Places an order, counting a refusal by its code.
    fn place(&mut self, order: NewOrder) -> bool {
        let events = self.submit(Command::PlaceOrder(order));
        for event in &events {
            if let EventKind::Rejected { code, .. } = event.kind {
                *self.metrics.orders_rejected.entry(format!("{code:?}")).or_default() += 1;
                return false;
            }
        }
        true
    }

    fn next_window(&self, class_index: usize) -> Option<WindowInfo> {
        let engine = self.exchange.engine();
        self.windows
            .iter()
            .filter(|w| w.class_index == class_index && w.start_ms > self.now_ms + MS_PER_HOUR)
            .find(|w| engine.instrument(w.instrument).is_some_and(|i| i.state == InstrumentState::Trading))
            .copied()
    }

    /// A data-centre owner sells half its GPUs in the next daily window.
    fn offer_window(&mut self, i: usize, host: HostId, class_index: usize, floor: u64) {
        let Some(window) = self.next_window(class_index) else { return };
        if self.suppliers[i].offered_window == Some(window.instrument) {
            return;
        }
        self.suppliers[i].offered_window = Some(window.instrument);
        let count = (self.suppliers[i].gpus.len() as u32 / 2).max(1);
        let mask = (1u64 << count) - 1;
        let price = tick_round((self.reference_price[class_index][2] * self.rng.random_range(95..106) / 100).max(floor));
        let id = self.next_supplier_order_id(i);
        let mut order = NewOrder::limit(self.suppliers[i].account, id, window.instrument, Side::Sell, price, count);
        order.supply = Some(GpuSet { host, gpu_mask: mask });
        self.place(order);
    }

    /// Double-selling: registering a GPU another host listed, and offering a
    /// leased GPU again for a window while its open-ended lease runs.
    fn double_sell(&mut self, i: usize, host: HostId, class_index: usize) {
        let account = self.suppliers[i].account;
        let victim = self.rng.random_range(0..self.suppliers.len());
        let uuid = format!("GPU-{victim:06}-0");
        let spec = population::spec_of(self.population.suppliers[victim].class_index);
        let events =
            self.submit(Command::RegisterGpu { account, host: self.population.suppliers[i].host_name.clone(), gpu_uuid: uuid, spec });
        self.record_engine_cheat(SupplierCheat::DoubleSell, &events);
        let leased_mask = self.suppliers[i]
            .gpus
            .iter()
            .enumerate()
            .filter(|(_, gpu)| self.gpu_lease_count[gpu.0 as usize] > 0)
            .fold(0u64, |mask, (bit, _)| mask | (1 << bit));
        let Some(window) = self.next_window(class_index) else { return };
        if leased_mask == 0 {
            return;
        }
        let id = self.next_supplier_order_id(i);
        let mut order = NewOrder::limit(account, id, window.instrument, Side::Sell, 1_000_000, leased_mask.count_ones());
        order.supply = Some(GpuSet { host, gpu_mask: leased_mask });
        let events = self.submit(Command::PlaceOrder(order));
        // Offering a GPU whose lease ends before the window is legitimate;
        // only an open-ended lease makes this a double sale.
        let open_ended = self.suppliers[i].gpus.iter().any(|gpu| {
            self.gpu_lease_count[gpu.0 as usize] > 0
                && self
                    .exchange
                    .engine()
                    .gpu_leases(*gpu)
                    .and_then(|(l, _)| l)
                    .and_then(|l| self.exchange.engine().lease(l))
                    .is_some_and(|l| l.end_ms.is_none())
        });
        if open_ended {
            self.record_engine_cheat(SupplierCheat::DoubleSell, &events);
        } else if let Some(EventKind::OrderAccepted { order, .. }) =
            events.iter().map(|e| e.kind).find(|k| matches!(k, EventKind::OrderAccepted { .. }))
        {
            self.submit(Command::CancelOrder { account, order });
        }
    }

    fn record_engine_cheat(&mut self, cheat: SupplierCheat, events: &[Event]) {
        let stats = self.metrics.cheats.entry(cheat).or_default();
        stats.attempts += 1;
        match events.iter().find_map(|e| match e.kind {
            EventKind::Rejected { code, .. } => Some(code),
            _ => None,
        }) {
            Some(code) => {
                stats.caught += 1;
                *stats.codes.entry(format!("{code:?}")).or_default() += 1;
            }
            None => {
                // Accepted: whatever it sells is money it could take; count the attempt as not caught.
                if let Some(EventKind::OrderAccepted { order, account, .. }) =
                    events.iter().map(|e| e.kind).find(|k| matches!(k, EventKind::OrderAccepted { .. }))
                {
                    self.submit(Command::CancelOrder { account, order });
                }
            }
        }
    }

    // --------------------------------------------------------------- reports

    /// The agent of the lease's host reports every GPU of the lease, from the
    /// end of its last accepted report to now (or to the lease's end).
    fn report(&mut self, lease_id: LeaseId, last: bool) {
        let Some(lease) = self.leases.get(&lease_id) else { return };
        let supplier_index = lease.supplier as usize;
        let supplier = &self.suppliers[supplier_index];
        // A dead agent or a host without network sends when it is back.
        let back = if supplier.is_down {
            supplier.down.iter().find(|(from, until)| *from <= self.now_ms && self.now_ms < *until).map(|(_, until)| *until)
        } else if supplier.network_down_until > 0 {
            Some(self.now_ms + 5 * 60_000)
        } else {
            None
        };
        if let Some(back) = back {
            self.schedule(back.max(self.now_ms + 1), Action::Report { lease: lease_id, last });
            return;
        }
        if !last && lease.ended_ms.is_some() {
            return;
        }
        if lease.stopped_ms.is_some_and(|stop| self.now_ms >= stop) {
            return;
        }
        let faults = self.population.suppliers[supplier_index].faults;
        let agent_now =
            (self.now_ms - faults.report_delay_ms.min(self.now_ms - lease.start_ms)).saturating_add_signed(faults.clock_skew_ms);
        let known_end = lease.ended_ms.or(lease.end_ms);
        let report_end =
            if last { lease.ended_ms.expect("the last report follows the end") } else { known_end.map_or(agent_now, |e| e.min(agent_now)) };
        let account = supplier.account;
        for gpu_index in 0..lease.gpus.len() {
            self.report_gpu(lease_id, gpu_index, report_end, account);
        }
        if last {
            let lease = self.leases.get_mut(&lease_id).expect("still open");
            lease.last_report_sent = true;
            if lease.billing_closed {
                self.leases.remove(&lease_id);
                return;
            }
        }
        let lease = self.leases.get(&lease_id).expect("still open");
        if self.population.suppliers[supplier_index].cheat.is_some() && !lease.gpus.is_empty() && self.rng.random_range(0..3) == 0 {
            self.cheat(lease_id);
        }
        let lease = self.leases.get(&lease_id).expect("still open");
        let next = self.now_ms + self.config.report_interval_ms;
        if !last && lease.ended_ms.is_none() && lease.end_ms.is_none_or(|end| next < end + faults.report_delay_ms) {
            self.schedule(next, Action::Report { lease: lease_id, last: false });
        }
    }

    fn report_gpu(&mut self, lease_id: LeaseId, gpu_index: usize, end_ms: u64, account: AccountId) {
        let lease = self.leases.get(&lease_id).expect("reported leases exist");
        let chain = &lease.chains[gpu_index];
        let start_ms = chain.last_end_ms;
        if end_ms <= start_ms {
            return;
        }
        let supplier = &self.suppliers[lease.supplier as usize];
        let available_ms = delivered_ms(&supplier.down, start_ms, end_ms);
        let body = UsageBody {
            lease: lease_id,
            gpu_uuid: lease.gpus[gpu_index].1.clone(),
            seq: chain.accepted + 1,
            start_ms,
            end_ms,
            available_ms,
            utilisation_percent: 90,
            memory_used_mib_max: 40_000,
            unhealthy_samples: 0,
            prev_hash: chain.prev_hash.clone(),
        };
        let started = std::time::Instant::now();
        let report = UsageReport::sign(body, &supplier.key);
        let mut events = Vec::new();
        let outcome = self.exchange.report(self.now_ms, account, &report, &mut events);
        self.report_wall += started.elapsed();
        self.observe(&events);
        match outcome {
            Ok(UsageOutcome::Accepted { .. }) => {
                let lease = self.leases.get_mut(&lease_id).expect("reported leases exist");
                let chain = &mut lease.chains[gpu_index];
                chain.accepted += 1;
                chain.prev_hash = report.hash();
                chain.last_end_ms = end_ms;
                chain.last_report = Some(report);
            }
            Ok(UsageOutcome::Duplicate) => {}
            Err(code) => {
                *self.metrics.faults.honest_reports_refused.entry(format!("{code:?}")).or_default() += 1;
                if code == gpux_settlement::UsageRejectCode::BillingClosed {
                    if let Some(lease) = self.leases.get_mut(&lease_id) {
                        lease.late = true;
                    }
                }
            }
        }
    }

    /// One dishonest report of the supplier's kind about one of its leases.
    fn cheat(&mut self, lease_id: LeaseId) {
        let lease = self.leases.get(&lease_id).expect("cheated leases exist");
        let supplier_index = lease.supplier as usize;
        let Some(kind) = self.population.suppliers[supplier_index].cheat else { return };
        let chain = lease.chains[0].clone();
        let now = self.now_ms;
        let mut body = UsageBody {
            lease: lease_id,
            gpu_uuid: lease.gpus[0].1.clone(),
            seq: chain.accepted + 1,
            start_ms: chain.last_end_ms,
            end_ms: now.max(chain.last_end_ms + 60_000),
            available_ms: 0,
            utilisation_percent: 100,
            memory_used_mib_max: 80_000,
            unhealthy_samples: 0,
            prev_hash: chain.prev_hash.clone(),
        };
        body.available_ms = body.end_ms - body.start_ms;
        let mut key = self.suppliers[supplier_index].key.clone();
        let mut reports = Vec::new();
        match kind {
            SupplierCheat::InflateAvailable => body.available_ms = (body.end_ms - body.start_ms) * 3 / 2 + 1,
            SupplierCheat::ClaimFuture => {
                body.end_ms = now + 6 * MS_PER_HOUR;
                body.available_ms = body.end_ms - body.start_ms;
            }
            SupplierCheat::Replay => {
                let Some(old) = chain.last_report.clone() else { return };
                let mut altered = old.body.clone();
                altered.end_ms += 60 * 60_000;
                altered.available_ms = altered.end_ms - altered.start_ms;
                reports.push(UsageReport::sign(altered, &key));
                reports.push(old);
            }
            SupplierCheat::Forge => {
                let mut seed = [0u8; 32];
                self.rng.fill(&mut seed);
                key = SigningKey::from_bytes(&seed);
            }
            SupplierCheat::PhantomGpu => body.gpu_uuid = format!("GPU-phantom-{supplier_index}"),
            SupplierCheat::DoubleCount => {
                if chain.accepted == 0 {
                    return;
                }
                body.start_ms = chain.last_end_ms - 30 * 60_000;
                body.available_ms = body.end_ms - body.start_ms;
            }
            SupplierCheat::BeforeLease => {
                body.start_ms = lease.start_ms.saturating_sub(2 * MS_PER_HOUR);
                body.end_ms = lease.start_ms.saturating_sub(MS_PER_HOUR);
                body.available_ms = MS_PER_HOUR;
                body.seq = 1;
                body.prev_hash = genesis_hash();
                if chain.accepted > 0 {
                    body.seq = chain.accepted + 1;
                    body.prev_hash = chain.prev_hash.clone();
                }
            }
            SupplierCheat::ForeignLease => {
                // Someone else's lease, claimed with the cheater's own key.
                let Some((&other, other_lease)) = self.leases.iter().find(|(_, l)| l.supplier as usize != supplier_index) else { return };
                body.lease = other;
                body.gpu_uuid = other_lease.gpus[0].1.clone();
                body.seq = 1;
                body.prev_hash = genesis_hash();
                body.start_ms = other_lease.start_ms;
                body.end_ms = now.max(other_lease.start_ms + 1);
                body.available_ms = body.end_ms - body.start_ms;
            }
            SupplierCheat::DoubleSell => return,
        }
        if reports.is_empty() {
            reports.push(UsageReport::sign(body, &key));
        }
        let account = self.suppliers[supplier_index].account;
        for report in reports {
            let payable_before = self.payable(account);
            let mut events = Vec::new();
            let outcome = self.exchange.report(self.now_ms, account, &report, &mut events);
            self.observe(&events);
            let moved = self.payable(account).saturating_sub(payable_before);
            let stats: &mut CheatStats = self.metrics.cheats.entry(kind).or_default();
            stats.attempts += 1;
            stats.moved_minor += moved;
            match outcome {
                Err(code) => {
                    stats.caught += 1;
                    *stats.codes.entry(format!("{code:?}")).or_default() += 1;
                }
                Ok(UsageOutcome::Duplicate) => {
                    stats.caught += 1;
                    *stats.codes.entry("duplicate (nothing moved)".into()).or_default() += 1;
                }
                Ok(UsageOutcome::Accepted { .. }) => {}
            }
        }
    }

    fn payable(&self, account: AccountId) -> u64 {
        self.exchange.engine().balances(account).map_or(0, |b| b.payable_minor + b.available_minor)
    }

    // ---------------------------------------------------------------- renters

    fn job_arrival(&mut self, index: u32) {
        let next = self.next_arrival(index, self.now_ms);
        self.schedule(next, Action::JobArrival(index));
        let renter = &self.population.renters[index as usize];
        let (kind, class_index, eagerness_bps, underpays) = (renter.kind, renter.class_index, renter.eagerness_bps, renter.underpays);
        let account = self.renters[index as usize].account;
        let (quantity, hours, run_ms, contract) = match kind {
            RenterKind::Training => {
                let quantity = [1, 2, 4, 8, 8][self.rng.random_range(0..5)];
                (quantity, self.rng.random_range(2..16u32), None, 0)
            }
            RenterKind::Inference => (self.rng.random_range(1..3u32), 0, Some(self.rng.random_range(6 * MS_PER_HOUR..3 * MS_PER_DAY)), 0),
            RenterKind::Batch => (self.rng.random_range(1..5u32), self.rng.random_range(1..5u32), None, 1),
        };
        let window = if kind == RenterKind::Training && hours >= 12 && class_index != 2 && self.rng.random_range(0..4) == 0 {
            self.next_window(class_index)
        } else {
            None
        };
        let (instrument, contract) = match window {
            Some(w) => (w.instrument, 2),
            None => (InstrumentId(class_index as u32 * 2 + contract as u32), contract),
        };
        // A renter follows the going price up to what the job is worth to it:
        // the class's list price (less for preemptible time) scaled by its
        // eagerness. Without that cap, resting bids lifted by each other's
        // trades would walk prices up without end.
        let chasing = self.reference_price[class_index][contract] * (10_000 + eagerness_bps as u64) / 10_000;
        let list = CLASSES[class_index].list_price_minor * if contract == 1 { PREEMPT_DISCOUNT_PERCENT } else { 100 } / 100;
        let worth = list * (9_000 + eagerness_bps as u64) / 10_000;
        let price = tick_round(chasing.min(worth));
        let duration = match (run_ms, underpays) {
            (Some(_), _) | (_, true) => LeaseDuration::UntilCancelled,
            (None, false) => LeaseDuration::Hours(hours),
        };
        let billable_hours = match (window, duration) {
            (Some(_), _) => 24,
            (None, LeaseDuration::Hours(h)) => h as u64,
            (None, LeaseDuration::UntilCancelled) => 1,
        };
        let hold = price * billable_hours * quantity as u64;
        let available = self.exchange.engine().balances(account).map_or(0, |b| b.available_minor);
        if !underpays && available < hold * 3 {
            self.submit(Command::Deposit { account, amount_minor: hold * 6 });
        } else if underpays && available < hold {
            self.submit(Command::Deposit { account, amount_minor: hold - available });
        }
        self.posted_counterfactual(class_index, contract, price, quantity, run_ms.map_or(hours as u64, |ms| ms.div_ceil(MS_PER_HOUR)));
        let job = self.jobs.len() as u64;
        self.jobs.push(Job {
            renter: index,
            kind,
            window: window.is_some(),
            wanted: quantity,
            filled: 0,
            placed_at_ms: self.now_ms,
            first_fill_ms: None,
            run_ms: if underpays { Some(3 * MS_PER_DAY) } else { run_ms },
        });
        let stats = if window.is_some() { &mut self.metrics.window_bids } else { self.metrics.jobs.entry(kind).or_default() };
        stats.placed += 1;
        stats.gpus_wanted += quantity as u64;
        let patience = match window {
            Some(w) => w.start_ms - 16 * 60_000 - self.now_ms,
            None => self.rng.random_range(10 * 60_000..PATIENCE_MS_MAX),
        };
        let mut order = NewOrder::limit(account, job + 1, instrument, Side::Buy, price, quantity);
        order.time_in_force = TimeInForce::Gtt { expire_at_ms: self.now_ms + patience };
        order.one_host = kind == RenterKind::Training && window.is_none();
        order.duration = duration;
        if underpays {
            self.metrics.renter_cheats.entry("open-ended lease left unfunded").or_default().attempts += 1;
        }
        if !self.place(order) {
            let stats = if window.is_some() { &mut self.metrics.window_bids } else { self.metrics.jobs.entry(kind).or_default() };
            stats.unfilled += 1;
            if underpays {
                self.metrics.renter_cheats.entry("open-ended lease left unfunded").or_default().caught += 1;
            }
        }
    }

    /// Remembers a job for the posted-price counterfactual (`posted_baseline`).
    fn posted_counterfactual(&mut self, class_index: usize, contract: usize, limit: u64, quantity: u32, hours: u64) {
        let hour = ((self.now_ms - START_MS) / MS_PER_HOUR) as u32;
        self.posted_jobs.push(PostedJob {
            hour,
            class_index: class_index as u8,
            contract: contract.min(1) as u8,
            limit,
            quantity,
            hours: hours.max(1) as u32,
        });
    }

    /// What a posted-price marketplace would have paid suppliers for the same
    /// jobs: each class and contract priced all run long at the run's own
    /// volume-weighted clearing price (a posted market that guessed the
    /// average right), sold first come first served to every job whose limit
    /// reaches it while the GPUs are free for all its hours; no auction, no
    /// preemption, no windows.
    fn posted_baseline(&mut self) {
        let mut posted = [[0u64; 2]; 4];
        for (class_index, prices) in posted.iter_mut().enumerate() {
            for (kind, price) in prices.iter_mut().enumerate() {
                let notional: u128 = self.metrics.trades.iter().map(|h| h[class_index][kind].notional_minor).sum();
                let gpus: u64 = self.metrics.trades.iter().map(|h| h[class_index][kind].gpus).sum();
                *price = if gpus == 0 { u64::MAX } else { (notional / gpus as u128) as u64 };
            }
        }
        for job in std::mem::take(&mut self.posted_jobs) {
            let (class_index, price) = (job.class_index as usize, posted[job.class_index as usize][job.contract as usize]);
            if job.limit < price {
                continue;
            }
            let from = job.hour as usize;
            let to = (from + job.hours as usize).min(self.posted_capacity.len());
            if (from..to).all(|h| self.posted_capacity[h][class_index] >= job.quantity) {
                for hour in from..to {
                    self.posted_capacity[hour][class_index] -= job.quantity;
                }
                self.metrics.posted_baseline_minor[class_index] += price * job.quantity as u64 * (to - from) as u64;
            }
        }
    }

    /// An underpaying renter tries to take back funds its leases hold, and to
    /// bid with money it does not have.
    fn renter_cheat(&mut self, index: u32) {
        let account = self.renters[index as usize].account;
        let balances = self.exchange.engine().balances(account).unwrap_or_default();
        let events = self.submit(Command::Withdraw { account, amount_minor: balances.available_minor + balances.held_minor + 1 });
        self.record_renter_cheat("withdrawal of held funds", &events);
        let class_index = self.population.renters[index as usize].class_index;
        let order = NewOrder::limit(account, u64::MAX - index as u64, InstrumentId(class_index as u32 * 2), Side::Buy, 90_000_000, 64);
        let events = self.submit(Command::PlaceOrder(order));
        self.record_renter_cheat("bid beyond its funds", &events);
    }

    fn record_renter_cheat(&mut self, label: &'static str, events: &[Event]) {
        let stats = self.metrics.renter_cheats.entry(label).or_default();
        stats.attempts += 1;
        if let Some(code) = events.iter().find_map(|e| match e.kind {
            EventKind::Rejected { code, .. } => Some(code),
            _ => None,
        }) {
            stats.caught += 1;
            *stats.codes.entry(format!("{code:?}")).or_default() += 1;
        }
    }

    // ------------------------------------------------------------ aggregators

    /// An aggregator buys contracts in the next daily window below the going
    /// spot price and offers what it holds again above it.
    fn aggregator_wake(&mut self, index: u32) {
        self.schedule(self.now_ms + MS_PER_HOUR, Action::AggregatorWake(index));
        let model = &self.population.aggregators[index as usize];
        let (class_index, target) = (model.class_index, model.contracts_per_window);
        let Some(window) = self.next_window(class_index) else { return };
        let state = &self.aggregators[index as usize];
        let account = state.account;
        let held = self.exchange.engine().contracts_held(account, window.instrument);
        if state.bid_window != Some(window.instrument) && held < target {
            self.aggregators[index as usize].bid_window = Some(window.instrument);
            let price = tick_round(self.reference_price[class_index][2] * 97 / 100);
            let mut order = NewOrder::limit(account, 0, window.instrument, Side::Buy, price, target - held);
            order.client_order_id = self.now_ms;
            order.time_in_force = TimeInForce::Gtt { expire_at_ms: window.start_ms - 16 * 60_000 };
            self.place(order);
        }
        if held > 0 && self.aggregators[index as usize].offered_window != Some(window.instrument) {
            self.aggregators[index as usize].offered_window = Some(window.instrument);
            let price = tick_round(self.reference_price[class_index][0] * 102 / 100);
            let mut order = NewOrder::limit(account, 0, window.instrument, Side::Sell, price, held);
            order.client_order_id = self.now_ms + 1;
            self.place(order);
        }
    }

    // ---------------------------------------------------------------- metrics

    fn sample(&mut self) {
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
