//! Property tests over random journals using the whole command vocabulary
//! (spot, preemptible and reserved books, resales, cancels, replaces, lease
//! ends, usage settlement, GPUs going offline, time jumps across window
//! starts and ends):
//! - replaying the same journal gives the same events and the same state hash,
//!   also after the journal went through JSON (the audit replay format);
//! - money is conserved: the sum of all accounts' available and held funds is
//!   always deposits minus withdrawals minus usage charged;
//! - no GPU is double-booked (the engine asserts it on every lease and
//!   contract it creates, so a violation panics the test).

mod common;

use common::*;
use gpux_engine::*;
use proptest::prelude::*;

#[derive(Clone, Debug)]
enum Op {
    Advance { ms: u64 },
    Bid { renter: usize, market: usize, ticks: u64, quantity: u32, hours: u32, tif: u8, gang: bool },
    Ask { supplier: usize, market: usize, ticks: u64, mask: u64 },
    Resale { holder: usize, market: usize, ticks: u64, quantity: u32 },
    Cancel { pick: usize },
    Replace { pick: usize, ticks: u64, quantity: u32 },
    MassCancel { who: usize },
    EndLease { pick: u64 },
    Settle { pick: u64, amount: u64 },
    Online { supplier: usize, gpu: u32, online: bool },
    Withdraw { who: usize, amount: u64 },
    Payout { supplier: usize, amount: u64 },
    Deposit { who: usize, amount: u64 },
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        2 => prop_oneof![0..120_000u64, 0..3 * 3_600_000u64].prop_map(|ms| Op::Advance { ms }),
        5 => (0..3usize, 0..6usize, 0..10u64, 1..4u32, 0..5u32, 0..4u8, prop::bool::weighted(0.2))
            .prop_map(|(renter, market, ticks, quantity, hours, tif, gang)| Op::Bid { renter, market, ticks, quantity, hours, tif, gang }),
        5 => (0..2usize, 0..6usize, 0..10u64, 1..16u64).prop_map(|(supplier, market, ticks, mask)| Op::Ask { supplier, market, ticks, mask }),
        3 => (0..4usize, 2..6usize, 0..10u64, 1..3u32).prop_map(|(holder, market, ticks, quantity)| Op::Resale { holder, market, ticks, quantity }),
        2 => any::<usize>().prop_map(|pick| Op::Cancel { pick }),
        1 => (any::<usize>(), 0..10u64, 1..4u32).prop_map(|(pick, ticks, quantity)| Op::Replace { pick, ticks, quantity }),
        1 => (0..6usize).prop_map(|who| Op::MassCancel { who }),
        1 => any::<u64>().prop_map(|pick| Op::EndLease { pick }),
        1 => (any::<u64>(), 1..5_000_000u64).prop_map(|(pick, amount)| Op::Settle { pick, amount }),
        1 => (0..2usize, 0..4u32, any::<bool>()).prop_map(|(supplier, gpu, online)| Op::Online { supplier, gpu, online }),
        1 => (0..4usize, 1..50_000_000u64).prop_map(|(who, amount)| Op::Withdraw { who, amount }),
        1 => (0..2usize, 1..5_000_000u64).prop_map(|(supplier, amount)| Op::Payout { supplier, amount }),
        1 => (0..4usize, 1..50_000_000u64).prop_map(|(who, amount)| Op::Deposit { who, amount }),
    ]
}

/// Builds the journal: a fixed population, then the random operations turned
/// into commands against the engine as it evolves (ids come from its events).
struct Journal {
    market: Market,
    inputs: Vec<Input>,
    buyers: Vec<AccountId>,
    suppliers: Vec<(AccountId, HostId)>,
    markets: Vec<InstrumentId>,
    orders: Vec<OrderId>,
    net_deposits: i128,
    fees: i128,
}

impl Journal {
    fn new() -> Self {
        let mut journal = Journal {
            market: Market::new(),
            inputs: Vec::new(),
            buyers: Vec::new(),
            suppliers: Vec::new(),
            markets: Vec::new(),
            orders: Vec::new(),
            net_deposits: 0,
            fees: 0,
        };
        for role in [Role::Renter, Role::Renter, Role::Renter, Role::Aggregator] {
            journal.record(Command::OpenAccount { role });
            let account = AccountId(journal.buyers.len() as u32);
            journal.buyers.push(account);
            journal.record(Command::Deposit { account, amount_minor: 500_000_000 });
        }
        for index in 0..2 {
            journal.record(Command::OpenAccount { role: Role::Supplier });
            let account = AccountId(4 + index);
            for gpu in 0..4 {
                journal.record(Command::register(account, &format!("host-{index}"), &format!("GPU-{index}-{gpu}"), h100_spec()));
            }
            journal.suppliers.push((account, HostId(index)));
        }
        let windows: Vec<InstrumentId> = journal
            .market
            .engine
            .instruments()
            .into_iter()
            .filter(|i| i.symbol.starts_with("H100-SXM-80G/R/"))
            .map(|i| i.instrument)
            .collect();
        journal.markets = vec![H100_SPOT, H100_PREEMPT, windows[0], windows[1], windows[2], windows[24]];
        journal
    }

    fn record(&mut self, command: Command) {
        let input = Input { at_ms: self.market.now_ms, command: command.clone() };
        let events = self.market.apply(command);
        for event in &events {
            match event.kind {
                EventKind::OrderAccepted { order, .. } => self.orders.push(order),
                EventKind::FundsDeposited { amount_minor, .. } => self.net_deposits += amount_minor as i128,
                EventKind::FundsWithdrawn { amount_minor, .. } => self.net_deposits -= amount_minor as i128,
                EventKind::PayoutSent { amount_minor, .. } => self.net_deposits -= amount_minor as i128,
                EventKind::FeeCharged { amount_minor, .. } => self.fees += amount_minor as i128,
                _ => {}
            }
        }
        self.inputs.push(input);
        let total: i128 = (0..6)
            .filter_map(|a| self.market.engine.balances(AccountId(a)))
            .map(|b| b.available_minor as i128 + b.held_minor as i128 + b.payable_minor as i128 - b.debt_minor as i128)
            .sum();
        assert_eq!(total + self.fees, self.net_deposits, "money is conserved: balances less debt, plus fees");
    }

    fn apply(&mut self, op: Op) {
        let price = |ticks: u64| 1_500_000 + ticks * 100_000;
        let command = match op {
            Op::Advance { ms } => {
                self.market.now_ms += ms;
                Command::Tick
            }
            Op::Bid { renter, market, ticks, quantity, hours, tif, gang } => {
                let mut order = self.market.order(self.buyers[renter], self.markets[market], Side::Buy, price(ticks), quantity);
                order.duration = if hours == 0 { LeaseDuration::UntilCancelled } else { LeaseDuration::Hours(hours) };
                order.time_in_force = [
                    TimeInForce::Gtc,
                    TimeInForce::Ioc,
                    TimeInForce::Fok,
                    TimeInForce::Gtt { expire_at_ms: self.market.now_ms + 1_800_000 },
                ][tif as usize];
                order.one_host = gang;
                Command::place(order)
            }
            Op::Ask { supplier, market, ticks, mask } => {
                let (account, host) = self.suppliers[supplier];
                let mut order = self.market.order(account, self.markets[market], Side::Sell, price(ticks), mask.count_ones());
                order.supply = Some(GpuSet { host, gpu_mask: mask });
                Command::place(order)
            }
            Op::Resale { holder, market, ticks, quantity } => {
                Command::place(self.market.order(self.buyers[holder], self.markets[market], Side::Sell, price(ticks), quantity))
            }
            Op::Cancel { pick } if !self.orders.is_empty() => {
                let order = self.orders[pick % self.orders.len()];
                let account = self.market.engine.order(order).map_or(AccountId(0), |o| o.account);
                Command::CancelOrder { account, order }
            }
            Op::Replace { pick, ticks, quantity } if !self.orders.is_empty() => {
                let order = self.orders[pick % self.orders.len()];
                let account = self.market.engine.order(order).map_or(AccountId(0), |o| o.account);
                Command::ReplaceOrder { account, order, price_minor_per_gpu_hour: price(ticks), quantity }
            }
            Op::MassCancel { who } => Command::MassCancel { account: AccountId(who as u32), instrument: None },
            Op::EndLease { pick } if self.market.engine.lease_count() > 0 => {
                let lease = LeaseId(pick % self.market.engine.lease_count());
                let account = self.market.engine.lease(lease).map_or(AccountId(0), |l| l.renter);
                Command::EndLease { account, lease }
            }
            Op::Settle { pick, amount } if self.market.engine.lease_count() > 0 => Command::SettleUsage {
                lease: LeaseId(pick % self.market.engine.lease_count()),
                amount_minor: amount,
                verified_gpu_ms: amount,
            },
            Op::Online { supplier, gpu, online } => {
                let (account, host) = self.suppliers[supplier];
                let gpu = self.market.engine.host_gpu(host, gpu).expect("registered");
                Command::SetGpuOnline { account, gpu, online }
            }
            Op::Withdraw { who, amount } => Command::Withdraw { account: self.buyers[who], amount_minor: amount },
            Op::Payout { supplier, amount } => Command::Payout { account: self.suppliers[supplier].0, amount_minor: amount },
            Op::Deposit { who, amount } => Command::Deposit { account: self.buyers[who], amount_minor: amount },
            _ => Command::Tick,
        };
        self.record(command);
    }
}

fn replay(inputs: &[Input]) -> (Vec<Event>, u64) {
    let mut engine = Engine::new(EngineConfig::demo()).expect("valid config");
    let mut events = Vec::new();
    for input in inputs {
        events.extend_from_slice(engine.apply(input));
    }
    (events, engine.state_hash())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 128, ..ProptestConfig::default() })]

    #[test]
    fn the_same_journal_always_gives_the_same_events_and_state(ops in prop::collection::vec(op(), 1..150)) {
        let mut journal = Journal::new();
        for op in ops {
            journal.apply(op);
        }
        let original_hash = journal.market.engine.state_hash();
        let (events, hash) = replay(&journal.inputs);
        prop_assert_eq!(&events, &journal.market.log);
        prop_assert_eq!(hash, original_hash);

        let json: Vec<String> = journal.inputs.iter().map(|i| serde_json::to_string(i).expect("serialisable")).collect();
        let parsed: Vec<Input> = json.iter().map(|line| serde_json::from_str(line).expect("parses back")).collect();
        let (_, hash_from_json) = replay(&parsed);
        prop_assert_eq!(hash_from_json, original_hash);
    }
}

#[test]
fn different_journals_give_different_state_hashes() {
    let mut one = Journal::new();
    let mut two = Journal::new();
    one.apply(Op::Bid { renter: 0, market: 0, ticks: 1, quantity: 1, hours: 1, tif: 0, gang: false });
    two.apply(Op::Bid { renter: 0, market: 0, ticks: 2, quantity: 1, hours: 1, tif: 0, gang: false });
    assert_ne!(one.market.engine.state_hash(), two.market.engine.state_hash());
}
