//! The ledger against the engine, on random journals of deposits, bids and
//! GPU-backed asks (spot, preemptible, reserved windows), lease ends, usage
//! charges (within and beyond escrow) and withdrawals:
//! - every transfer keeps the sum of all balances at zero;
//! - each participant's available and held balances equal the engine's own
//!   view of its funds (two independent bookkeepings agree);
//! - what suppliers are owed plus the exchange's fees equals exactly what
//!   renters were charged plus what they owe: nothing is paid twice.

use gpux_engine::*;
use gpux_settlement::ledger::{Ledger, LedgerAccount};
use proptest::prelude::*;

const T0: u64 = 1_796_223_660_000;

#[derive(Clone, Debug)]
enum Op {
    Advance(u64),
    Bid { renter: u32, market: usize, ticks: u64, quantity: u32, hours: u32 },
    Ask { supplier: u32, market: usize, ticks: u64, mask: u64 },
    EndLease(u64),
    Charge { lease: u64, amount: u64 },
    Withdraw { renter: u32, amount: u64 },
    Deposit { renter: u32, amount: u64 },
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        2 => (0..2 * 3_600_000u64).prop_map(Op::Advance),
        4 => (0..3u32, 0..3usize, 0..5u64, 1..3u32, 0..3u32).prop_map(|(renter, market, ticks, quantity, hours)| Op::Bid { renter, market, ticks, quantity, hours }),
        4 => (0..2u32, 0..3usize, 0..5u64, 1..4u64).prop_map(|(supplier, market, ticks, mask)| Op::Ask { supplier, market, ticks, mask }),
        1 => any::<u64>().prop_map(Op::EndLease),
        3 => (any::<u64>(), 1..20_000_000u64).prop_map(|(lease, amount)| Op::Charge { lease, amount }),
        1 => (0..3u32, 1..100_000_000u64).prop_map(|(renter, amount)| Op::Withdraw { renter, amount }),
        1 => (0..3u32, 1..100_000_000u64).prop_map(|(renter, amount)| Op::Deposit { renter, amount }),
    ]
}

struct World {
    engine: Engine,
    ledger: Ledger,
    now: u64,
    next_client_order_id: u64,
    markets: Vec<InstrumentId>,
    usage_charged: u128,
}

impl World {
    fn new() -> Self {
        let engine = Engine::new(EngineConfig::demo()).expect("valid config");
        let mut world = World { engine, ledger: Ledger::new(250), now: T0, next_client_order_id: 0, markets: Vec::new(), usage_charged: 0 };
        // Accounts 0..3: renters; 3, 4: suppliers with a 3-GPU host each.
        for role in [Role::Renter, Role::Renter, Role::Renter, Role::Supplier, Role::Supplier] {
            world.apply(Command::OpenAccount { role });
        }
        for renter in 0..3 {
            world.apply(Command::Deposit { account: AccountId(renter), amount_minor: 50_000_000 });
        }
        for supplier in 0..2u32 {
            for gpu in 0..3 {
                world.apply(Command::RegisterGpu {
                    account: AccountId(3 + supplier),
                    host: format!("host-{supplier}"),
                    gpu_uuid: format!("GPU-{supplier}-{gpu}"),
                    spec: GpuSpec::h100_sxm(),
                });
            }
        }
        let window = world.engine.instruments().into_iter().find(|i| i.symbol.starts_with("H100-SXM-80G/R/")).expect("a window").instrument;
        world.markets = vec![InstrumentId(0), InstrumentId(1), window];
        world
    }

    fn apply(&mut self, command: Command) {
        let events = self.engine.apply(&Input { at_ms: self.now, command }).to_vec();
        for event in &events {
            match event.kind {
                EventKind::FundsCharged { to: None, amount_minor, .. } | EventKind::UsageUnpaid { amount_minor, .. } => {
                    self.usage_charged += amount_minor as u128
                }
                _ => {}
            }
            self.ledger.apply(event).expect("every engine event posts cleanly");
        }
    }

    fn run(&mut self, op: Op) {
        let price = |ticks: u64| 1_500_000 + ticks * 100_000;
        let command = match op {
            Op::Advance(ms) => {
                self.now += ms;
                Command::Tick
            }
            Op::Bid { renter, market, ticks, quantity, hours } => {
                self.next_client_order_id += 1;
                let mut order =
                    NewOrder::limit(AccountId(renter), self.next_client_order_id, self.markets[market], Side::Buy, price(ticks), quantity);
                order.duration = if hours == 0 { LeaseDuration::UntilCancelled } else { LeaseDuration::Hours(hours) };
                Command::PlaceOrder(order)
            }
            Op::Ask { supplier, market, ticks, mask } => {
                self.next_client_order_id += 1;
                let mut order = NewOrder::limit(
                    AccountId(3 + supplier),
                    self.next_client_order_id,
                    self.markets[market],
                    Side::Sell,
                    price(ticks),
                    mask.count_ones(),
                );
                order.supply = Some(GpuSet { host: HostId(supplier), gpu_mask: mask });
                Command::PlaceOrder(order)
            }
            Op::EndLease(pick) if self.engine.lease_count() > 0 => {
                let lease = LeaseId(pick % self.engine.lease_count());
                let renter = self.engine.lease(lease).expect("lease").renter;
                Command::EndLease { account: renter, lease }
            }
            Op::Charge { lease, amount } if self.engine.lease_count() > 0 => {
                Command::SettleUsage { lease: LeaseId(lease % self.engine.lease_count()), amount_minor: amount }
            }
            Op::Withdraw { renter, amount } => Command::Withdraw { account: AccountId(renter), amount_minor: amount },
            Op::Deposit { renter, amount } => Command::Deposit { account: AccountId(renter), amount_minor: amount },
            _ => Command::Tick,
        };
        self.apply(command);
    }

    fn check(&self) {
        assert_eq!(self.ledger.sum(), 0, "double entry: balances sum to zero");
        for account in 0..5 {
            let (available, held) = self.engine.funds(AccountId(account)).expect("account");
            assert_eq!(self.ledger.balance(LedgerAccount::Available(AccountId(account))), available as i128, "available of {account}");
            assert_eq!(self.ledger.balance(LedgerAccount::Held(AccountId(account))), held as i128, "held of {account}");
        }
        let paid: i128 = (0..5).map(|a| self.ledger.balance(LedgerAccount::Payable(AccountId(a)))).sum::<i128>()
            + self.ledger.balance(LedgerAccount::Fees);
        assert_eq!(paid, self.usage_charged as i128, "suppliers plus fees get exactly what usage charged, once");
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 96, ..ProptestConfig::default() })]

    #[test]
    fn the_ledger_agrees_with_the_engine_and_balances_to_zero(ops in prop::collection::vec(op(), 1..120)) {
        let mut world = World::new();
        for op in ops {
            world.run(op);
            world.check();
        }
    }
}

#[test]
fn a_usage_charge_pays_the_supplier_less_the_fee() {
    let mut world = World::new();
    world.run(Op::Ask { supplier: 0, market: 0, ticks: 0, mask: 1 });
    world.run(Op::Bid { renter: 0, market: 0, ticks: 0, quantity: 1, hours: 1 });
    world.apply(Command::SettleUsage { lease: LeaseId(0), amount_minor: 1_000_000 });
    // 2.5% of 1.000000 to the exchange, the rest owed to the supplier.
    assert_eq!(world.ledger.balance(LedgerAccount::Fees), 25_000);
    assert_eq!(world.ledger.balance(LedgerAccount::Payable(AccountId(3))), 975_000);
    world.check();
}

#[test]
fn a_transfer_is_never_applied_twice() {
    let mut ledger = Ledger::new(0);
    let deposit = Event { seq: 7, at_ms: T0, kind: EventKind::FundsDeposited { account: AccountId(0), amount_minor: 5 } };
    ledger.apply(&deposit).expect("first time");
    assert!(ledger.apply(&deposit).is_err(), "the same event again is refused");
    assert_eq!(ledger.balance(LedgerAccount::Available(AccountId(0))), 5);
}
