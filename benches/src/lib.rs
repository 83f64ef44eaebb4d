//! Workload generators for the engine benchmarks.
//!
//! A workload is a command stream generated once, ahead of the measurement,
//! by driving a scratch engine and reading its events (to know which orders
//! are open and which GPUs are free), then replayed on a fresh engine that was
//! brought to the same starting state. So the measured loop is exactly
//! `Engine::apply` over the stream, with event generation included and the
//! generator's own bookkeeping excluded.

pub mod process;

use gpux_engine::*;
use rustc_hash::FxHashMap;

/// 2026-12-02T15:01:00Z.
pub const START_MS: u64 = 1_796_223_660_000;
pub const MID_MINOR: u64 = 2_000_000;
pub const TICK_MINOR: u64 = 1_000;
const SPOT: InstrumentId = InstrumentId(0);
const GPUS_PER_HOST: u32 = 64;
/// Hosts one supplier account registers (its share of the GPU table).
const HOSTS_PER_SUPPLIER: u32 = limits::GPUS_PER_ACCOUNT_MAX / GPUS_PER_HOST;
/// Commands sequenced within one millisecond of engine time.
const COMMANDS_PER_MS: u64 = 1_000;

/// A starting state (as the inputs that build it) and the stream to measure.
pub struct Workload {
    pub setup: Vec<Input>,
    pub measured: Vec<Input>,
}

impl Workload {
    /// A fresh engine in the workload's starting state.
    pub fn prepared_engine(&self) -> Engine {
        let mut engine = Engine::new(EngineConfig::demo()).expect("demo config is valid");
        for input in &self.setup {
            engine.apply(input);
        }
        engine
    }
}

/// Small deterministic PRNG (xorshift64*), so workloads need no dependency.
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Self {
        Rng(seed.max(1))
    }
    pub fn next_u64(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    pub fn below(&mut self, bound: u64) -> u64 {
        self.next_u64() % bound
    }
}

/// Drives a scratch engine and records every input it applies.
struct Generator {
    engine: Engine,
    inputs: Vec<Input>,
    at_ms: u64,
    commands: u64,
    renters: Vec<AccountId>,
    /// Suppliers: one per `HOSTS_PER_SUPPLIER` hosts (an account holds at
    /// most `limits::GPUS_PER_ACCOUNT_MAX` GPUs).
    suppliers: Vec<AccountId>,
    hosts: Vec<HostId>,
    /// Per host, the GPUs neither offered nor leased.
    free_gpus: Vec<u64>,
    asks: FxHashMap<OrderId, (HostId, u64)>,
    /// Which resting ask offers a `(host, bit)`.
    ask_of_gpu: FxHashMap<(u32, u32), OrderId>,
    open: Vec<OrderId>,
    open_index: FxHashMap<OrderId, usize>,
    next_client_order_id: u64,
    rng: Rng,
}

impl Generator {
    fn new(seed: u64, gpus: u32) -> Self {
        let mut generator = Generator {
            engine: Engine::new(EngineConfig::demo()).expect("demo config is valid"),
            inputs: Vec::new(),
            at_ms: START_MS,
            commands: 0,
            renters: Vec::new(),
            suppliers: vec![AccountId(0)],
            hosts: Vec::new(),
            free_gpus: Vec::new(),
            asks: FxHashMap::default(),
            ask_of_gpu: FxHashMap::default(),
            open: Vec::new(),
            open_index: FxHashMap::default(),
            next_client_order_id: 0,
            rng: Rng::new(seed),
        };
        generator.apply(Command::OpenAccount { role: Role::Supplier });
        for renter in 0..8 {
            generator.apply(Command::OpenAccount { role: Role::Renter });
            generator.apply(Command::Deposit { account: AccountId(renter + 1), amount_minor: 1 << 50 });
            generator.renters.push(AccountId(renter + 1));
        }
        let spec = GpuSpec::h100_sxm();
        for host in 0..gpus.div_ceil(GPUS_PER_HOST) {
            if host > 0 && host % HOSTS_PER_SUPPLIER == 0 {
                let next = AccountId(generator.engine.account_count());
                generator.apply(Command::OpenAccount { role: Role::Supplier });
                generator.suppliers.push(next);
            }
            let supplier = generator.suppliers[(host / HOSTS_PER_SUPPLIER) as usize];
            for index in 0..GPUS_PER_HOST {
                generator.apply(Command::register(supplier, &format!("host-{host}"), &format!("GPU-{host}-{index}"), spec.clone()));
            }
            // Proven, as a real host's GPUs are after their first challenge:
            // a supplier holds only one host's worth of unproven GPUs.
            for index in 0..GPUS_PER_HOST {
                let gpu = GpuId(host * GPUS_PER_HOST + index);
                generator.apply(Command::RecordChallenge { gpu, answer: ChallengeAnswer::Correct { n: 256, elapsed_ms: 10 } });
            }
            generator.hosts.push(HostId(host));
            generator.free_gpus.push(u64::MAX);
        }
        generator
    }

    fn apply(&mut self, command: Command) {
        self.commands += 1;
        if self.commands.is_multiple_of(COMMANDS_PER_MS) {
            self.at_ms += 1;
        }
        let input = Input { at_ms: self.at_ms, command };
        let events = self.engine.apply(&input).to_vec();
        self.inputs.push(input);
        for event in events {
            self.observe(event.kind);
        }
    }

    fn observe(&mut self, kind: EventKind) {
        match kind {
            EventKind::OrderAccepted { order, .. } => {
                self.open_index.insert(order, self.open.len());
                self.open.push(order);
            }
            EventKind::OrderClosed { order, .. } => {
                if let Some(index) = self.open_index.remove(&order) {
                    self.open.swap_remove(index);
                    if let Some(&moved) = self.open.get(index) {
                        self.open_index.insert(moved, index);
                    }
                }
                if let Some((host, mask)) = self.asks.remove(&order) {
                    self.free_gpus[host.0 as usize] |= mask;
                    for bit in 0..64 {
                        if mask & (1u64 << bit) != 0 {
                            self.ask_of_gpu.remove(&(host.0, bit));
                        }
                    }
                }
            }
            EventKind::LeaseCreated { host, gpu_mask, .. } => {
                // The leased GPUs leave the ask that offered them and stay busy.
                for bit in 0..64 {
                    if gpu_mask & (1u64 << bit) != 0 {
                        if let Some(order) = self.ask_of_gpu.remove(&(host.0, bit)) {
                            if let Some((_, mask)) = self.asks.get_mut(&order) {
                                *mask &= !(1u64 << bit);
                            }
                        }
                    }
                }
            }
            _ => {}
        }
    }

    fn client_order_id(&mut self) -> u64 {
        self.next_client_order_id += 1;
        self.next_client_order_id
    }

    fn order(&mut self, account: AccountId, side: Side, price: u64, quantity: u32) -> NewOrder {
        NewOrder::limit(account, self.client_order_id(), SPOT, side, price, quantity)
    }

    /// An ask of `quantity` free GPUs of one host, or `None` when supply ran out.
    fn ask(&mut self, price: u64, quantity: u32, time_in_force: TimeInForce) -> Option<NewOrder> {
        let start = self.rng.below(self.hosts.len() as u64) as usize;
        let host_index = (0..self.hosts.len())
            .map(|offset| (start + offset) % self.hosts.len())
            .find(|&index| self.free_gpus[index].count_ones() >= quantity)?;
        let mut mask = 0u64;
        let mut free = self.free_gpus[host_index];
        for _ in 0..quantity {
            let bit = free & free.wrapping_neg();
            mask |= bit;
            free &= !bit;
        }
        self.free_gpus[host_index] = free;
        let supplier = self.suppliers[host_index / HOSTS_PER_SUPPLIER as usize];
        let mut order = self.order(supplier, Side::Sell, price, quantity);
        order.supply = Some(GpuSet { host: self.hosts[host_index], gpu_mask: mask });
        order.time_in_force = time_in_force;
        Some(order)
    }

    fn place(&mut self, order: NewOrder) {
        let supply = order.supply;
        let before = self.next_client_order_id;
        self.apply(Command::place(order));
        if let Some(set) = supply {
            // The accepted ask is the newest open order (if it still rests).
            if let Some(&id) = self.open.last() {
                if self.engine.order(id).is_some_and(|o| o.client_order_id == before) {
                    let remaining = self.engine.order(id).map_or(0, |o| o.quantity);
                    let leased = self.engine_leased_mask(set.host);
                    let mask = set.gpu_mask & !leased;
                    debug_assert_eq!(mask.count_ones(), remaining);
                    self.asks.insert(id, (set.host, mask));
                    for bit in 0..64 {
                        if mask & (1u64 << bit) != 0 {
                            self.ask_of_gpu.insert((set.host.0, bit), id);
                        }
                    }
                    return;
                }
            }
            // Filled or killed at once: whatever it did not lease is free again.
            let leased = self.engine_leased_mask(set.host);
            self.free_gpus[set.host.0 as usize] |= set.gpu_mask & !leased;
        }
    }

    fn engine_leased_mask(&self, host: HostId) -> u64 {
        (0..GPUS_PER_HOST)
            .filter(|&index| {
                let gpu = self.engine.host_gpu(host, index).expect("registered");
                self.engine.gpu_leases(gpu).is_some_and(|(exclusive, _)| exclusive.is_some())
            })
            .fold(0, |mask, index| mask | (1u64 << index))
    }

    fn renter(&mut self) -> AccountId {
        self.renters[self.rng.below(self.renters.len() as u64) as usize]
    }

    /// A resting order `1..=levels` ticks away from the mid price.
    fn add_resting(&mut self, levels: u64) {
        let distance = (1 + self.rng.below(levels)) * TICK_MINOR;
        let quantity = 1 + self.rng.below(4) as u32;
        if self.rng.below(2) == 0 {
            let renter = self.renter();
            let order = self.order(renter, Side::Buy, MID_MINOR - distance, quantity);
            self.place(order);
        } else if let Some(order) = self.ask(MID_MINOR + distance, quantity, TimeInForce::Gtc) {
            self.place(order);
        }
    }

    fn cancel_random(&mut self) {
        if self.open.is_empty() {
            return;
        }
        let order = self.open[self.rng.below(self.open.len() as u64) as usize];
        let account = self.engine.order(order).expect("open").account;
        self.apply(Command::CancelOrder { account, order });
    }

    /// An IOC order on a random side taking `quantity` GPUs from the best
    /// levels, its limit the price where that much is reached.
    fn cross_quantity(&mut self, quantity: u32) {
        let side = if self.rng.below(2) == 0 { Side::Buy } else { Side::Sell };
        let depth = self.engine.depth(SPOT, side.opposite());
        let mut cumulative = 0u64;
        let Some(&(limit, _)) = depth.iter().find(|&&(_, level)| {
            cumulative += level;
            cumulative >= quantity as u64
        }) else {
            return;
        };
        let order = match side {
            Side::Buy => {
                let renter = self.renter();
                let mut order = self.order(renter, Side::Buy, limit, quantity);
                order.time_in_force = TimeInForce::Ioc;
                Some(order)
            }
            Side::Sell => self.ask(limit, quantity, TimeInForce::Ioc),
        };
        if let Some(order) = order {
            self.place(order);
        }
    }

    fn cross_side(&mut self, side: Side, levels: usize, quantity_max: u32) {
        let depth = self.engine.depth(SPOT, side.opposite());
        let Some(&(limit, _)) = depth.get(levels.min(depth.len()).saturating_sub(1)) else { return };
        let quantity: u64 = depth.iter().take(levels).map(|&(_, quantity)| quantity).sum();
        let quantity = quantity.min(quantity_max as u64) as u32;
        let order = match side {
            Side::Buy => {
                let renter = self.renter();
                let mut order = self.order(renter, Side::Buy, limit, quantity);
                order.time_in_force = TimeInForce::Ioc;
                Some(order)
            }
            Side::Sell => self.ask(limit, quantity, TimeInForce::Ioc),
        };
        if let Some(order) = order {
            self.place(order);
        }
    }

    fn fill_book(&mut self, resting: usize, levels: u64) {
        while self.open.len() < resting {
            self.add_resting(levels);
        }
    }

    fn finish(self, setup_len: usize) -> Workload {
        let mut inputs = self.inputs;
        let measured = inputs.split_off(setup_len);
        Workload { setup: inputs, measured }
    }
}

/// The realistic mix on a book of `resting` orders: 60% resting adds within
/// 100 ticks of the mid, 30% cancels of random open orders, 10% IOC orders
/// crossing the best level(s). For the book to stay near its size the
/// crossing orders must take about three resting orders each (0.6 added =
/// 0.3 cancelled + 0.1 x 3 filled): they take 8 GPUs (about 3 orders), 16
/// when the book is above its size, 4 when below.
pub fn mixed_flow(resting: usize, commands: usize, seed: u64) -> Workload {
    let mut generator = Generator::new(seed, resting as u32 * 3 + commands as u32 + 1_000);
    generator.fill_book(resting, 100);
    let setup_len = generator.inputs.len();
    while generator.inputs.len() - setup_len < commands {
        match generator.rng.below(10) {
            0..=5 => generator.add_resting(100),
            6..=8 => generator.cancel_random(),
            _ => {
                let quantity = match generator.open.len() {
                    open if open > resting + resting / 20 => 16,
                    open if open < resting - resting / 20 => 4,
                    _ => 8,
                };
                generator.cross_quantity(quantity)
            }
        }
    }
    generator.finish(setup_len)
}

/// `commands` resting adds on a book of `resting` orders.
pub fn adds(resting: usize, commands: usize, seed: u64) -> Workload {
    let mut generator = Generator::new(seed, (resting + commands) as u32 * 5);
    generator.fill_book(resting, 100);
    let setup_len = generator.inputs.len();
    while generator.inputs.len() - setup_len < commands {
        generator.add_resting(100);
    }
    generator.finish(setup_len)
}

/// `commands` cancels of random open orders, on a book of `resting + commands`.
pub fn cancels(resting: usize, commands: usize, seed: u64) -> Workload {
    let mut generator = Generator::new(seed, (resting + commands) as u32 * 5);
    generator.fill_book(resting + commands, 100);
    let setup_len = generator.inputs.len();
    while generator.inputs.len() - setup_len < commands {
        generator.cancel_random();
    }
    generator.finish(setup_len)
}

/// `commands` IOC orders, alternating sides, each taking everything in the
/// best `levels` price levels, on a book of `resting` orders spread over
/// 1000 ticks a side (about 5 orders a level). Nothing refills the book, so
/// every measured command is an aggressive order.
pub fn crosses(resting: usize, levels: usize, commands: usize, seed: u64) -> Workload {
    let mut generator = Generator::new(seed, resting as u32 * 4 + (commands * levels * 40) as u32);
    generator.fill_book(resting, 1_000);
    let setup_len = generator.inputs.len();
    for index in 0..commands {
        let side = if index % 2 == 0 { Side::Buy } else { Side::Sell };
        generator.cross_side(side, levels, limits::QUANTITY_MAX);
    }
    generator.finish(setup_len)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The mixed workload is what its name says: about 60/30/10 and a book
    /// that stays near its working size.
    #[test]
    fn the_mixed_flow_keeps_its_mix_and_its_book_size() {
        let workload = mixed_flow(2_000, 20_000, 7);
        let mut engine = workload.prepared_engine();
        let (mut places, mut cancels, mut crossing) = (0, 0, 0);
        let mut max_open = 0;
        for input in &workload.measured {
            match &input.command {
                Command::Place { order, .. } if order.time_in_force == TimeInForce::Ioc => crossing += 1,
                Command::Place { .. } => places += 1,
                Command::CancelOrder { .. } => cancels += 1,
                _ => {}
            }
            engine.apply(input);
            max_open = max_open.max(engine.open_order_count());
        }
        let total = (places + cancels + crossing) as f64;
        eprintln!("adds {places} cancels {cancels} crosses {crossing} max open {max_open} final {}", engine.open_order_count());
        assert!((places as f64 / total - 0.6).abs() < 0.05, "adds {places} of {total}");
        assert!((cancels as f64 / total - 0.3).abs() < 0.05, "cancels {cancels} of {total}");
        assert!((crossing as f64 / total - 0.1).abs() < 0.03, "crosses {crossing} of {total}");
        assert!(max_open < 2_300, "the book stays near 2000 orders: {max_open}");
    }
}
