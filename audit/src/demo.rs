//! The built-in demo session: two suppliers list H100 hosts and an MI300X
//! host, renters buy spot, preemptible and gang capacity, an aggregator buys
//! a reserved window and resells it, a spot buyer preempts a preemptible
//! lease, and time runs through the window's delivery and expiry; then a
//! budget bid, a stop and an all-or-none bid trade on the A100 book. Every
//! command is written out explicitly so the stream doubles as an example of
//! the audit format.

use gpux_engine::*;

/// 2026-12-02T15:00:00Z.
const START_MS: u64 = 1_796_223_600_000;
const MINUTE: u64 = 60_000;

struct DemoSession {
    at_ms: u64,
    inputs: Vec<Input>,
    next_client_order_id: u64,
}

impl DemoSession {
    fn push(&mut self, command: Command) {
        self.inputs.push(Input { at_ms: self.at_ms, command });
    }

    fn order(&mut self, account: u32, instrument: u32, side: Side, price: u64, quantity: u32) -> NewOrder {
        self.next_client_order_id += 1;
        NewOrder {
            duration: LeaseDuration::Hours(2),
            ..NewOrder::limit(AccountId(account), self.next_client_order_id, InstrumentId(instrument), side, price, quantity)
        }
    }

    fn ask(&mut self, supplier: u32, host: u32, gpu_mask: u64, instrument: u32, price: u64) {
        let mut order = self.order(supplier, instrument, Side::Sell, price, gpu_mask.count_ones());
        order.supply = Some(GpuSet { host: HostId(host), gpu_mask });
        self.push(Command::place(order));
    }

    fn register(&mut self, supplier: u32, host: &str, gpus: u32, spec: GpuSpec) {
        for index in 0..gpus {
            self.push(Command::register(AccountId(supplier), host, &format!("GPU-{host}-{index}"), spec.clone()));
        }
    }
}

pub fn inputs() -> Vec<Input> {
    let mut s = DemoSession { at_ms: START_MS + MINUTE, inputs: Vec::new(), next_client_order_id: 0 };
    opening(&mut s);
    first_trades(&mut s);
    a_window_resold(&mut s);
    order_types(&mut s);
    s.inputs
}

/// Five accounts, three hosts, and the suppliers' first asks.
fn opening(s: &mut DemoSession) {
    // Accounts 0, 1: suppliers; 2, 3: renters; 4: aggregator.
    for role in [Role::Supplier, Role::Supplier, Role::Renter, Role::Renter, Role::Aggregator] {
        s.push(Command::OpenAccount { role });
    }
    for account in 2..5 {
        s.push(Command::Deposit { account: AccountId(account), amount_minor: 1_000_000_000 });
    }
    let h100 = GpuSpec::h100_sxm();
    let mi300x = GpuSpec {
        vendor: Vendor::Amd,
        model: "AMD Instinct MI300X".into(),
        memory_mib: 196_592,
        interconnect: Interconnect::InfinityFabric,
        mig_profile: None,
    };
    s.register(0, "dc1-node-01", 8, h100.clone());
    s.register(1, "lab-box-7", 4, h100);
    s.register(1, "lab-amd-1", 2, mi300x);

    // Instruments: 0 H100 spot, 1 H100 preemptible, 6 MI300X spot; the first
    // H100 hourly window (16:00Z) is instrument 10.
    s.ask(0, 0, 0x0f, 0, 2_100_000);
    s.ask(0, 0, 0xf0, 0, 2_300_000);
    s.ask(1, 1, 0x0f, 1, 900_000);
    s.ask(1, 1, 0x0f, 0, 2_050_000);
    s.ask(1, 2, 0b11, 6, 3_200_000);
}

/// Bids that trade: preemptible batch work, a gang job that preempts it,
/// an immediate-or-cancel bid, an urgent one.
fn first_trades(s: &mut DemoSession) {
    s.at_ms += MINUTE;
    let mut batch = s.order(3, 1, Side::Buy, 900_000, 2);
    batch.duration = LeaseDuration::UntilCancelled;
    s.push(Command::place(batch));
    // A gang job needs 4 GPUs on one host: the cheapest such host runs the
    // preemptible batch lease, which gets 30 s notice.
    let mut gang = s.order(2, 0, Side::Buy, 2_200_000, 4);
    gang.one_host = true;
    s.push(Command::place(gang));
    let mut amd = s.order(3, 6, Side::Buy, 3_300_000, 1);
    amd.time_in_force = TimeInForce::Ioc;
    s.push(Command::place(amd));

    s.at_ms += MINUTE;
    let urgent = s.order(2, 0, Side::Buy, 2_100_000, 1);
    s.push(Command::place(urgent));
}

/// A reserved window bought and resold, coded mistakes, and the window's
/// delivery, expiry and archiving.
fn a_window_resold(s: &mut DemoSession) {
    // The aggregator buys the 16:00 window and resells it at a profit.
    s.ask(0, 0, 0x30, 10, 1_800_000);
    let window_bid = s.order(4, 10, Side::Buy, 1_800_000, 2);
    s.push(Command::place(window_bid));
    let resale = s.order(4, 10, Side::Sell, 2_400_000, 2);
    s.push(Command::place(resale));
    let window_buyer = s.order(3, 10, Side::Buy, 2_400_000, 1);
    s.push(Command::place(window_buyer));

    // Mistakes get coded rejections.
    let mut off_tick = s.order(3, 0, Side::Buy, 2_000_500, 1);
    off_tick.time_in_force = TimeInForce::Ioc;
    s.push(Command::place(off_tick));
    s.push(Command::CancelOrder { account: AccountId(3), order: OrderId(9_999) });

    // Run through the window's delivery (16:00) and expiry (17:00).
    for _ in 0..8 {
        s.at_ms += 15 * MINUTE;
        s.push(Command::Tick);
    }
    // An hour after the expiry the window's contracts go to the archive, and
    // a day after it the window itself.
    s.at_ms += 75 * MINUTE;
    s.push(Command::Tick);
    s.at_ms += 24 * 60 * MINUTE;
    s.push(Command::Tick);
}

fn order_types(s: &mut DemoSession) {
    // Order types beyond plain ones (docs/market-rules.md), on the A100 spot
    // book (instrument 2), listed by a third supplier (account 5, host 3).
    s.push(Command::OpenAccount { role: Role::Supplier });
    let a100 = GpuSpec {
        vendor: Vendor::Nvidia,
        model: "NVIDIA A100-SXM4-80GB".into(),
        memory_mib: 81_920,
        interconnect: Interconnect::NvLink,
        mig_profile: None,
    };
    s.register(5, "dc2-node-01", 8, a100);
    s.ask(5, 3, 0x03, 2, 1_200_000);
    s.ask(5, 3, 0x0c, 2, 1_300_000);
    // A budget of $7.50 for two-hour leases at up to $1.40: two GPUs at 1.20
    // (4.80), one at 1.30 (2.60); the 0.10 left buys none: budget_spent.
    let spend = s.order(2, 2, Side::Buy, 1_400_000, 10);
    s.push(Command::place_with(spend, OrderOptions { budget_minor: 7_500_000, ..OrderOptions::default() }));
    // A buy stop at 1.50 arms off the book (the last trade is 1.30).
    let stop = s.order(3, 2, Side::Buy, 1_600_000, 1);
    s.push(Command::place_with(stop, OrderOptions { stop_price_minor_per_gpu_hour: 1_500_000, ..OrderOptions::default() }));
    // An all-or-none bid for 3 rests untraded: one GPU is offered.
    let gang = s.order(3, 2, Side::Buy, 1_600_000, 3);
    s.push(Command::place_with(gang, OrderOptions { all_or_none: true, ..OrderOptions::default() }));
    // Two more GPUs at 1.50 make it whole: it fills at 1.30 and 1.50, and
    // the trade at 1.50 triggers the stop, which rests at 1.60 until the
    // next ask fills it.
    s.ask(5, 3, 0x30, 2, 1_500_000);
    s.ask(5, 3, 0x40, 2, 1_550_000);
}
