//! Every rejection code, one case each: the command is refused with that code
//! and the engine's state is exactly what it was before (same state hash, and
//! the only event is the `Rejected` one).

mod common;

use common::*;
use gpux_engine::*;

/// The market every case starts from: a renter with a resting bid, a second
/// renter, a supplier with a 4-GPU host and one GPU offered in spot, a second
/// supplier, and a spot lease of one GPU held by the renter.
struct Fixture {
    market: Market,
    renter: AccountId,
    other_renter: AccountId,
    supplier: AccountId,
    other_supplier: AccountId,
    host: HostId,
    resting_bid: OrderId,
    resting_bid_client_id: u64,
    resting_ask: OrderId,
    lease: LeaseId,
    window: InstrumentId,
}

impl Fixture {
    fn new(config: EngineConfig) -> Self {
        let mut market = Market::with_config(config);
        let renter = market.renter(1_000_000_000);
        let other_renter = market.renter(1_000_000_000);
        let supplier = market.supplier();
        let other_supplier = market.supplier();
        market.h100_host(other_supplier, "other-host", 1);
        let host = market.h100_host(supplier, "host-a", 4);
        market.ask(supplier, host, 0b0001, H100_SPOT, USD_2);
        let (_, events) = market.bid(renter, H100_SPOT, USD_2, 1);
        let lease = leases(&events)[0].0;
        let resting_ask = market.ask(supplier, host, 0b0010, H100_SPOT, 3_000_000);
        let bid = market.order(renter, H100_SPOT, Side::Buy, 1_000_000, 1);
        let resting_bid_client_id = bid.client_order_id;
        let resting_bid = accepted(&market.place(bid)).expect("bid rests");
        let window = market.window("/R/2026-12-02T17/1H");
        Fixture {
            market,
            renter,
            other_renter,
            supplier,
            other_supplier,
            host,
            resting_bid,
            resting_bid_client_id,
            resting_ask,
            lease,
            window,
        }
    }

    fn bid(&mut self) -> NewOrder {
        self.market.order(self.renter, H100_SPOT, Side::Buy, USD_2, 1)
    }
}

type Case = (&'static str, RejectCode, fn(&mut Fixture) -> Command);

fn place(order: NewOrder) -> Command {
    Command::place(order)
}

const CASES: &[Case] = &[
    ("deposit to an account that does not exist", RejectCode::UnknownAccount, |_| Command::Deposit {
        account: AccountId(999),
        amount_minor: 1,
    }),
    ("a supplier account cannot buy", RejectCode::RoleNotPermitted, |f| place(f.market.order(f.supplier, H100_SPOT, Side::Buy, USD_2, 1))),
    ("a zero deposit", RejectCode::AmountInvalid, |f| Command::Deposit { account: f.renter, amount_minor: 0 }),
    ("withdrawing more than is available", RejectCode::InsufficientFunds, |f| Command::Withdraw {
        account: f.renter,
        amount_minor: 2_000_000_000,
    }),
    ("a bid whose hold exceeds available funds", RejectCode::InsufficientFunds, |f| {
        let mut order = f.bid();
        order.quantity = 4000;
        place(order)
    }),
    ("an instrument that does not exist", RejectCode::UnknownInstrument, |f| {
        let mut order = f.bid();
        order.instrument = InstrumentId(9_999);
        place(order)
    }),
    ("a window past its trading stop", RejectCode::InstrumentNotTrading, |f| {
        // 17:00 window stops trading at 16:45.
        f.market.advance(HOUR + 44 * 60_000);
        let window = f.window;
        let mut order = f.bid();
        order.instrument = window;
        place(order)
    }),
    ("a zero price", RejectCode::PriceNotPositive, |f| {
        let mut order = f.bid();
        order.price_minor_per_gpu_hour = 0;
        place(order)
    }),
    ("a price off the tick", RejectCode::PriceOffTick, |f| {
        let mut order = f.bid();
        order.price_minor_per_gpu_hour = 2_000_500;
        place(order)
    }),
    ("a price above the band", RejectCode::PriceOutOfBand, |f| {
        let mut order = f.bid();
        order.price_minor_per_gpu_hour = 200_000_000;
        place(order)
    }),
    ("a zero quantity", RejectCode::QuantityZero, |f| {
        let mut order = f.bid();
        order.quantity = 0;
        place(order)
    }),
    ("an absurd quantity", RejectCode::QuantityTooLarge, |f| {
        let mut order = f.bid();
        order.quantity = 1_000_000;
        place(order)
    }),
    ("a min quantity above the quantity", RejectCode::MinQuantityInvalid, |f| {
        let mut order = f.bid();
        order.min_quantity = 2;
        place(order)
    }),
    ("a zero-hour lease", RejectCode::DurationInvalid, |f| {
        let mut order = f.bid();
        order.duration = LeaseDuration::Hours(0);
        place(order)
    }),
    ("a good-till-time already past", RejectCode::ExpiryInPast, |f| {
        let mut order = f.bid();
        order.time_in_force = TimeInForce::Gtt { expire_at_ms: f.market.now_ms };
        place(order)
    }),
    ("a client order id already open", RejectCode::DuplicateClientOrderId, |f| {
        let mut order = f.bid();
        order.client_order_id = f.resting_bid_client_id;
        place(order)
    }),
    ("a post-only bid that would cross", RejectCode::PostOnlyWouldCross, |f| {
        let mut order = f.bid();
        order.price_minor_per_gpu_hour = 3_000_000;
        order.post_only = true;
        place(order)
    }),
    ("post-only on an IOC order", RejectCode::PostOnlyNotLimit, |f| {
        let mut order = f.bid();
        order.post_only = true;
        order.time_in_force = TimeInForce::Ioc;
        place(order)
    }),
    ("cancelling an order that does not exist", RejectCode::UnknownOrder, |f| Command::CancelOrder {
        account: f.renter,
        order: OrderId(77_777),
    }),
    ("cancelling another account's order", RejectCode::NotYourOrder, |f| Command::CancelOrder {
        account: f.other_renter,
        order: f.resting_bid,
    }),
    ("replacing an ask with more GPUs than it names", RejectCode::ReplaceInvalid, |f| Command::ReplaceOrder {
        account: f.supplier,
        order: f.resting_ask,
        price_minor_per_gpu_hour: 3_000_000,
        quantity: 2,
    }),
    ("a spot ask without GPUs", RejectCode::SupplyRequired, |f| place(f.market.order(f.supplier, H100_SPOT, Side::Sell, USD_2, 1))),
    ("a bid that names GPUs", RejectCode::SupplyNotAllowed, |f| {
        let mut order = f.bid();
        order.supply = Some(GpuSet { host: f.host, gpu_mask: 1 });
        place(order)
    }),
    ("offering a GPU already in a spot ask", RejectCode::InsufficientCapacity, |f| {
        let mut order = f.market.order(f.supplier, H100_SPOT, Side::Sell, USD_2, 1);
        order.supply = Some(GpuSet { host: f.host, gpu_mask: 0b0010 });
        place(order)
    }),
    ("a mask that does not match the quantity", RejectCode::InsufficientCapacity, |f| {
        let mut order = f.market.order(f.supplier, H100_SPOT, Side::Sell, USD_2, 1);
        order.supply = Some(GpuSet { host: f.host, gpu_mask: 0b1100 });
        place(order)
    }),
    ("reselling contracts not held", RejectCode::InsufficientContracts, |f| {
        let window = f.window;
        place(f.market.order(f.renter, window, Side::Sell, USD_2, 1))
    }),
    ("an ask on a host that does not exist", RejectCode::UnknownHost, |f| {
        let mut order = f.market.order(f.supplier, H100_SPOT, Side::Sell, USD_2, 1);
        order.supply = Some(GpuSet { host: HostId(99), gpu_mask: 1 });
        place(order)
    }),
    ("an ask on another supplier's host", RejectCode::NotYourHost, |f| {
        let mut order = f.market.order(f.other_supplier, H100_SPOT, Side::Sell, USD_2, 1);
        order.supply = Some(GpuSet { host: f.host, gpu_mask: 0b0100 });
        place(order)
    }),
    ("a GPU that does not exist", RejectCode::UnknownGpu, |f| Command::SetGpuOnline {
        account: f.supplier,
        gpu: GpuId(999),
        online: false,
    }),
    ("another supplier's GPU", RejectCode::NotYourGpu, |f| {
        let gpu = f.market.engine.host_gpu(f.host, 0).expect("gpu");
        Command::SetGpuOnline { account: f.other_supplier, gpu, online: false }
    }),
    ("a GPU UUID registered twice", RejectCode::GpuAlreadyRegistered, |f| {
        Command::register(f.supplier, "host-a", "GPU-host-a-0", h100_spec())
    }),
    ("a GPU that meets no class", RejectCode::GpuNotQualified, |f| Command::Register {
        account: f.supplier,
        host: "host-a".into(),
        gpu_uuid: "GPU-new".into(),
        spec: GpuSpec { model: "Voodoo 2".into(), ..h100_spec() },
        region: None,
        zone: String::new(),
        fabric: None,
    }),
    ("registering a GPU on another supplier's host", RejectCode::NotYourHost, |f| {
        Command::register(f.other_supplier, "host-a", "GPU-new", h100_spec())
    }),
    ("a 65th GPU on one host", RejectCode::HostFull, |f| {
        let supplier = f.market.supplier();
        f.market.h100_host(supplier, "big-host", 64);
        for gpu in 0..64 {
            let gpu = GpuId(f.market.engine.gpu_count() - 1 - gpu);
            f.market.apply(Command::RecordChallenge { gpu, answer: ChallengeAnswer::Correct { n: 256, elapsed_ms: 10 } });
        }
        Command::register(supplier, "big-host", "GPU-65", h100_spec())
    }),
    ("a 65th unproven GPU of one supplier", RejectCode::GpusAwaitingChallenge, |f| {
        let supplier = f.market.supplier();
        f.market.h100_host(supplier, "new-host", 64);
        Command::register(supplier, "next-host", "GPU-next", h100_spec())
    }),
    ("an empty host name", RejectCode::NameInvalid, |f| Command::register(f.supplier, "", "GPU-new", h100_spec())),
    ("a UUID with control characters", RejectCode::NameInvalid, |f| Command::register(f.supplier, "host-a", "GPU\n1", h100_spec())),
    ("ending a lease that does not exist", RejectCode::UnknownLease, |f| Command::EndLease { account: f.renter, lease: LeaseId(999) }),
    ("ending another renter's lease", RejectCode::NotYourLease, |f| Command::EndLease { account: f.other_renter, lease: f.lease }),
    ("ending a lease twice", RejectCode::LeaseNotActive, |f| {
        let (renter, lease) = (f.renter, f.lease);
        f.market.apply(Command::EndLease { account: renter, lease });
        Command::EndLease { account: renter, lease }
    }),
    ("failing the delivery of a lease that does not exist", RejectCode::UnknownLease, |f| Command::FailLeaseDelivery {
        account: f.supplier,
        lease: LeaseId(999),
    }),
    ("a renter failing a lease's delivery", RejectCode::NotYourLease, |f| Command::FailLeaseDelivery { account: f.renter, lease: f.lease }),
    ("failing an ended lease's delivery", RejectCode::LeaseNotActive, |f| {
        let (renter, lease) = (f.renter, f.lease);
        f.market.apply(Command::EndLease { account: renter, lease });
        Command::FailLeaseDelivery { account: f.supplier, lease }
    }),
    ("settling nothing", RejectCode::AmountInvalid, |f| Command::SettleUsage { lease: f.lease, amount_minor: 0, verified_gpu_ms: 0 }),
    ("settling usage after the lease's billing closed", RejectCode::LeaseBillingClosed, |f| {
        let (renter, lease) = (f.renter, f.lease);
        f.market.apply(Command::EndLease { account: renter, lease });
        f.market.advance(EngineConfig::demo().billing_grace_ms);
        Command::SettleUsage { lease, amount_minor: 1_000, verified_gpu_ms: 1_800 }
    }),
    ("a payout of nothing", RejectCode::AmountInvalid, |f| Command::Payout { account: f.supplier, amount_minor: 0 }),
    ("a payout above the supplier's earnings", RejectCode::InsufficientFunds, |f| {
        let lease = f.lease;
        f.market.apply(Command::SettleUsage { lease, amount_minor: 1_000_000, verified_gpu_ms: 1_800_000 });
        Command::Payout { account: f.supplier, amount_minor: 1_000_000 }
    }),
    ("a payout to an account that does not exist", RejectCode::UnknownAccount, |_| Command::Payout {
        account: AccountId(999),
        amount_minor: 1,
    }),
    ("a fee above the maximum", RejectCode::FeeInvalid, |_| Command::SetFee { fee_bps: 2_001 }),
    ("a billing grace above a day", RejectCode::BillingGraceInvalid, |_| Command::SetBillingGrace { grace_ms: 24 * HOUR + 1 }),
];

#[test]
fn every_invalid_command_is_rejected_with_its_code_and_changes_nothing() {
    for (name, code, build) in CASES {
        let mut fixture = Fixture::new(EngineConfig::demo());
        let command = build(&mut fixture);
        let before = fixture.market.engine.state_hash();
        let events = fixture.market.apply(command);
        assert_eq!(rejection(&events), Some(*code), "{name}: {events:?}");
        assert_eq!(events.len(), 1, "{name}: a rejection emits only itself: {events:?}");
        assert_eq!(fixture.market.engine.state_hash(), before, "{name}: state changed");
        assert!(!code.message().is_empty());
    }
}

#[test]
fn a_command_stamped_earlier_than_the_engine_clock_is_rejected() {
    let mut fixture = Fixture::new(EngineConfig::demo());
    let before = fixture.market.engine.state_hash();
    let events = fixture.market.engine.apply(&Input { at_ms: T0 - 1, command: Command::Tick }).to_vec();
    assert_eq!(rejection(&events), Some(RejectCode::TimeWentBackwards));
    assert_eq!(fixture.market.engine.state_hash(), before);
}

#[test]
fn the_account_limit_is_a_rejection() {
    let mut config = EngineConfig::demo();
    config.accounts_max = 4;
    let mut fixture = Fixture::new(config);
    let events = fixture.market.apply(Command::OpenAccount { role: Role::Renter });
    assert_eq!(rejection(&events), Some(RejectCode::TooManyAccounts));
}

#[test]
fn the_open_order_limit_is_a_rejection() {
    let mut config = EngineConfig::demo();
    config.orders_per_account_max = 1;
    let mut fixture = Fixture::new(config);
    let order = fixture.bid();
    let mut order = NewOrder { price_minor_per_gpu_hour: 1_000_000, ..order };
    order.client_order_id = 9_999;
    let before = fixture.market.engine.state_hash();
    let events = fixture.market.place(order);
    assert_eq!(rejection(&events), Some(RejectCode::TooManyOpenOrders));
    assert_eq!(fixture.market.engine.state_hash(), before);
}
