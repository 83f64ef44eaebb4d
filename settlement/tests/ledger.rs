//! The ledger against the engine and a reference meter, on random journals
//! of deposits, bids and GPU-backed asks (spot, preemptible, reserved
//! windows), lease ends, signed usage reports (honest and forged) through the
//! real settlement, billing closes with SLA credits, payouts and withdrawals,
//! funds moved between a renter and its sub-account (renter 2 is renter
//! 0's sub-account; its withdrawals are refused), and leases resold (above
//! and below their price) on the resale book:
//! - every transfer keeps the sum of all balances at zero;
//! - each participant's available, held, payable and debt balances equal the
//!   engine's own view (two independent bookkeepings agree);
//! - every accepted report charges exactly what a reference meter computes
//!   from the honest reports sent, and a forged one changes nothing;
//! - what renters were charged equals what suppliers were credited, and the
//!   fees are exactly the rulebook's fee on each lease's charges: nothing is
//!   paid twice;
//! - replaying the event stream into a fresh ledger gives the same balances;
//! - every account's invoice reconciles with its ledger balances, and its
//!   usage, earnings and fee lines add up to the reference figures.

use std::collections::BTreeMap;

use ed25519_dalek::SigningKey;
use gpux_engine::*;
use gpux_protocol::{genesis_hash, UsageBody, UsageReport};
use gpux_settlement::ledger::{Ledger, LedgerAccount};
use gpux_settlement::{LeaseTerms, Settlement, UsageOutcome};
use proptest::prelude::*;

const T0: u64 = 1_796_223_660_000;

#[derive(Clone, Debug)]
enum Op {
    Advance(u64),
    Bid {
        renter: u32,
        market: usize,
        ticks: u64,
        quantity: u32,
        hours: u32,
    },
    Ask {
        supplier: u32,
        market: usize,
        ticks: u64,
        mask: u64,
    },
    EndLease(u64),
    Charge {
        lease: u64,
        amount: u64,
    },
    Withdraw {
        renter: u32,
        amount: u64,
    },
    Deposit {
        renter: u32,
        amount: u64,
    },
    Report {
        lease: u64,
        span_ms: u64,
        available_percent: u64,
        forged: bool,
    },
    Payout {
        supplier: u32,
        amount: u64,
    },
    Move {
        to_sub_account: bool,
        amount: u64,
    },
    /// The renter of a lease offers the rest of it on the resale book.
    Resell {
        lease: u64,
        ticks: u64,
    },
    ResaleBid {
        renter: u32,
        ticks: u64,
        quantity: u32,
        hours: u32,
    },
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
        6 => (any::<u64>(), 1..2 * 3_600_000u64, 50..=100u64, prop::bool::weighted(0.15))
            .prop_map(|(lease, span_ms, available_percent, forged)| Op::Report { lease, span_ms, available_percent, forged }),
        1 => (0..2u32, 1..5_000_000u64).prop_map(|(supplier, amount)| Op::Payout { supplier, amount }),
        2 => (any::<bool>(), 1..60_000_000u64).prop_map(|(to_sub_account, amount)| Op::Move { to_sub_account, amount }),
        2 => (any::<u64>(), 0..9u64).prop_map(|(lease, ticks)| Op::Resell { lease, ticks }),
        2 => (0..3u32, 0..9u64, 1..4u32, 1..4u32).prop_map(|(renter, ticks, quantity, hours)| Op::ResaleBid { renter, ticks, quantity, hours }),
    ]
}

/// One GPU's report chain, as the (honest) agent keeps it.
#[derive(Default)]
struct Chain {
    seq: u32,
    last_hash: Option<String>,
    last_end_ms: Option<u64>,
}

struct World {
    engine: Engine,
    ledger: Ledger,
    settlement: Settlement,
    events: Vec<Event>,
    now: u64,
    next_client_order_id: u64,
    markets: Vec<InstrumentId>,
    chains: BTreeMap<LeaseId, Chain>,
    /// Reference meter: verified GPU-ms per lease from the honest reports sent.
    verified_ms: BTreeMap<LeaseId, u64>,
    usage_charged: u128,
    supplier_credited: u128,
    charged_per_lease: BTreeMap<LeaseId, u128>,
    /// Every transfer posted, with its kind.
    transfers: Vec<gpux_settlement::ledger::Transfer>,
}

fn supplier_key(supplier: AccountId) -> SigningKey {
    SigningKey::from_bytes(&[supplier.0 as u8 + 10; 32])
}

impl World {
    fn new() -> Self {
        let engine = Engine::new(EngineConfig::demo()).expect("valid config");
        let mut world = World {
            engine,
            ledger: Ledger::new(),
            settlement: Settlement::default(),
            events: Vec::new(),
            now: T0,
            next_client_order_id: 0,
            markets: Vec::new(),
            chains: BTreeMap::new(),
            verified_ms: BTreeMap::new(),
            usage_charged: 0,
            supplier_credited: 0,
            charged_per_lease: BTreeMap::new(),
            transfers: Vec::new(),
        };
        // Accounts 0..3: renters (2 is 0's sub-account); 3, 4: suppliers
        // with a 3-GPU host each.
        world.apply(Command::OpenAccount { role: Role::Renter });
        world.apply(Command::OpenAccount { role: Role::Renter });
        world.apply(Command::OpenSubAccount { parent: AccountId(0) });
        for role in [Role::Supplier, Role::Supplier] {
            world.apply(Command::OpenAccount { role });
        }
        assert_eq!(world.engine.parent_of(AccountId(2)), Some(AccountId(0)));
        for renter in 0..3 {
            world.apply(Command::Deposit { account: AccountId(renter), amount_minor: 50_000_000 });
        }
        for supplier in 0..2u32 {
            for gpu in 0..3 {
                world.apply(Command::register(
                    AccountId(3 + supplier),
                    &format!("host-{supplier}"),
                    &format!("GPU-{supplier}-{gpu}"),
                    GpuSpec::h100_sxm(),
                ));
            }
        }
        let window = world.engine.instruments().into_iter().find(|i| i.symbol.starts_with("H100-SXM-80G/R/")).expect("a window").instrument;
        world.markets = vec![InstrumentId(0), InstrumentId(1), window];
        world
    }

    fn apply(&mut self, command: Command) -> Vec<Event> {
        let events = self.engine.apply(&Input { at_ms: self.now, command }).to_vec();
        for event in &events {
            match event.kind {
                EventKind::FundsCharged { to: None, amount_minor, reason: HoldReason::Lease(lease), .. }
                | EventKind::UsageUnpaid { amount_minor, lease, .. } => {
                    self.usage_charged += amount_minor as u128;
                    *self.charged_per_lease.entry(lease).or_default() += amount_minor as u128;
                }
                _ => {}
            }
            for transfer in self.ledger.apply(event).expect("every engine event posts cleanly") {
                if matches!(transfer.to, LedgerAccount::Payable(_)) {
                    self.supplier_credited += transfer.amount_minor as u128;
                }
                self.transfers.push(transfer);
            }
        }
        self.events.extend_from_slice(&events);
        events
    }

    /// Sends the next report of a lease's first GPU (forged: signed with a
    /// key that is not the supplier's) through settlement, as the exchange does.
    fn report(&mut self, pick: u64, span_ms: u64, available_percent: u64, forged: bool) {
        if self.engine.lease_count() == 0 {
            return;
        }
        let lease = self.engine.lease(LeaseId(pick % self.engine.lease_count())).expect("lease");
        let uuid = self.engine.gpu(lease.gpus[0]).expect("gpu").uuid;
        let chain = self.chains.entry(lease.lease).or_default();
        let start_ms = chain.last_end_ms.unwrap_or(lease.start_ms);
        let end_ms = (start_ms + span_ms).min(self.now);
        let lease_end = lease.ended_at_ms.or(lease.end_ms);
        if end_ms <= start_ms || lease_end.is_some_and(|end| start_ms >= end) || lease.billing_closed {
            return;
        }
        let body = UsageBody {
            lease: lease.lease,
            gpu_uuid: uuid.clone(),
            seq: chain.seq + 1,
            start_ms,
            end_ms,
            available_ms: (end_ms - start_ms) * available_percent / 100,
            utilisation_percent: 90,
            memory_used_mib_max: 1_000,
            unhealthy_samples: 0,
            prev_hash: chain.last_hash.clone().unwrap_or_else(genesis_hash),
            readings: None,
        };
        let signer = if forged { SigningKey::from_bytes(&[99; 32]) } else { supplier_key(lease.supplier) };
        let report = UsageReport::sign(body.clone(), &signer);
        let terms = LeaseTerms {
            lease: lease.lease,
            supplier: lease.supplier,
            gpu_uuids: vec![uuid],
            start_ms: lease.start_ms,
            end_ms: lease_end,
            price_minor_per_gpu_hour: lease.price_minor_per_gpu_hour,
            billing_closed: lease.billing_closed,
        };
        let key = supplier_key(lease.supplier).verifying_key().to_bytes();
        let before = (self.engine.state_hash(), self.ledger.transfer_count());
        let outcome = self.settlement.report(lease.supplier, &key, Some(&terms), &report, self.now);
        if forged {
            assert_eq!(outcome, Err(gpux_protocol::UsageRejectCode::Forged));
            assert_eq!((self.engine.state_hash(), self.ledger.transfer_count()), before, "a forged report moves nothing");
            return;
        }
        let Ok(UsageOutcome::Accepted { verified_ms, charge_minor }) = outcome else { panic!("an honest report is accepted: {outcome:?}") };
        let chain = self.chains.get_mut(&lease.lease).expect("chain");
        chain.seq += 1;
        chain.last_hash = Some(report.hash());
        chain.last_end_ms = Some(end_ms);
        // The reference meter: the share of the available time inside the lease.
        let inside = lease_end.map_or(end_ms, |end| end.min(end_ms)) - start_ms;
        let reference_ms = body.available_ms * inside / (end_ms - start_ms);
        assert_eq!(verified_ms, reference_ms, "verified time");
        let total_ms = self.verified_ms.entry(lease.lease).or_default();
        let before_total = lease.price_minor_per_gpu_hour as u128 * *total_ms as u128 / 3_600_000;
        *total_ms += reference_ms;
        let after_total = lease.price_minor_per_gpu_hour as u128 * *total_ms as u128 / 3_600_000;
        assert_eq!(charge_minor as u128, after_total - before_total, "the charge is the metered difference");
        if charge_minor > 0 || verified_ms > 0 {
            let events = self.apply(Command::SettleUsage { lease: lease.lease, amount_minor: charge_minor, verified_gpu_ms: verified_ms });
            assert!(!events.iter().any(|e| matches!(e.kind, EventKind::Rejected { .. })), "{events:?}");
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
                Command::place(order)
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
                Command::place(order)
            }
            Op::EndLease(pick) if self.engine.lease_count() > 0 => {
                let lease = LeaseId(pick % self.engine.lease_count());
                let renter = self.engine.lease(lease).expect("lease").renter;
                Command::EndLease { account: renter, lease }
            }
            Op::Charge { lease, amount } if self.engine.lease_count() > 0 => {
                Command::SettleUsage { lease: LeaseId(lease % self.engine.lease_count()), amount_minor: amount, verified_gpu_ms: 0 }
            }
            Op::Withdraw { renter, amount } => Command::Withdraw { account: AccountId(renter), amount_minor: amount },
            Op::Deposit { renter, amount } => Command::Deposit { account: AccountId(renter), amount_minor: amount },
            Op::Payout { supplier, amount } => Command::Payout { account: AccountId(3 + supplier), amount_minor: amount },
            Op::Resell { lease, ticks } if self.engine.lease_count() > 0 => {
                let lease = LeaseId(lease % self.engine.lease_count());
                let renter = self.engine.lease(lease).expect("lease").renter;
                self.next_client_order_id += 1;
                Command::OfferLease {
                    account: renter,
                    lease,
                    client_order_id: self.next_client_order_id,
                    price_minor_per_gpu_hour: 1_100_000 + ticks * 200_000,
                    time_in_force: TimeInForce::Gtc,
                }
            }
            Op::ResaleBid { renter, ticks, quantity, hours } => {
                let Some(book) = self.engine.instruments().into_iter().find(|i| i.symbol.ends_with("/RESALE")) else { return };
                self.next_client_order_id += 1;
                let mut order = NewOrder::limit(
                    AccountId(renter),
                    self.next_client_order_id,
                    book.instrument,
                    Side::Buy,
                    1_100_000 + ticks * 200_000,
                    quantity,
                );
                order.duration = LeaseDuration::Hours(hours);
                Command::place(order)
            }
            Op::Move { to_sub_account, amount } => {
                Command::MoveFunds { parent: AccountId(0), sub_account: AccountId(2), amount_minor: amount, to_sub_account }
            }
            Op::Report { lease, span_ms, available_percent, forged } => {
                self.report(lease, span_ms, available_percent, forged);
                return;
            }
            _ => Command::Tick,
        };
        self.apply(command);
    }

    fn check(&self) {
        assert_eq!(self.ledger.sum(), 0, "double entry: balances sum to zero");
        for account in (0..5).map(AccountId) {
            let engine = self.engine.balances(account).expect("account");
            let ledger = |of: fn(AccountId) -> LedgerAccount| self.ledger.balance(of(account));
            assert_eq!(ledger(LedgerAccount::Available), engine.available_minor as i128, "available of {account}");
            assert_eq!(ledger(LedgerAccount::Held), engine.held_minor as i128, "held of {account}");
            assert_eq!(ledger(LedgerAccount::Payable), engine.payable_minor as i128, "payable of {account}");
            assert_eq!(-ledger(LedgerAccount::Debt), engine.debt_minor as i128, "debt of {account}");
        }
        assert_eq!(self.supplier_credited, self.usage_charged, "suppliers are credited exactly what usage charged, once");
        // The rulebook's fee: floor(all a lease charged x fee / 10000) per lease.
        let fees: u128 = self.charged_per_lease.values().map(|charged| charged * self.engine.config().fee_bps as u128 / 10_000).sum();
        assert_eq!(self.ledger.balance(LedgerAccount::Fees), fees as i128, "the fee on each lease's charges, once");
        assert_eq!(self.ledger.balance(LedgerAccount::SlaPool), 0, "SLA credits pass straight through the pool");
    }

    /// Each account's invoice over everything so far reconciles with the
    /// ledger, and its lines add up to the reference figures: renters'
    /// usage lines to what usage charged, suppliers' earnings to what they
    /// were credited, their fee lines to the fees account.
    fn check_invoices(&self) {
        use gpux_protocol::InvoiceItem;
        let (mut usage, mut earnings, mut fees) = (0i128, 0i128, 0i128);
        for account in (0..5).map(AccountId) {
            let transfers: Vec<_> = self.transfers.iter().filter(|t| t.involves(account)).copied().collect();
            let header = gpux_settlement::invoice::InvoiceHeader {
                account,
                parent: self.engine.parent_of(account),
                period: "2026-12".into(),
                period_start_ms: 0,
                period_end_ms: u64::MAX,
                issuer: "test".into(),
                currency: "USD".into(),
                minor_per_unit: 1_000_000,
                tax: Some(("VAT".into(), 2_000, "GB1".into())),
            };
            let invoice = gpux_settlement::invoice::build_invoice(header, &transfers, &BTreeMap::new());
            assert_eq!(gpux_settlement::invoice::reconcile(&invoice, &transfers), Ok(()), "invoice of {account}");
            let sum = |item: InvoiceItem| invoice.lines.iter().filter(|l| l.item == item).map(|l| l.amount_minor as i128).sum::<i128>();
            usage += sum(InvoiceItem::Usage);
            earnings += sum(InvoiceItem::Earnings);
            fees += sum(InvoiceItem::Fee);
            assert_eq!(sum(InvoiceItem::Unclassified), 0, "every transfer has its kind");
            let lines: i128 = invoice.lines.iter().map(|l| l.amount_minor as i128).sum();
            assert_eq!(lines, invoice.totals.amount_due_minor as i128);
        }
        assert_eq!(usage, self.usage_charged as i128, "renters' usage lines are what usage charged");
        assert_eq!(earnings, -(self.supplier_credited as i128), "suppliers' earnings lines are what they were credited");
        assert_eq!(fees, self.ledger.balance(LedgerAccount::Fees), "fee lines are the fees account");
    }

    /// A fresh ledger fed the same events reaches the same balances.
    fn check_replay(&self) {
        let mut replayed = Ledger::new();
        for event in &self.events {
            replayed.apply(event).expect("replay posts cleanly");
        }
        assert_eq!(format!("{replayed:?}"), format!("{:?}", self.ledger));
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 192, ..ProptestConfig::default() })]

    #[test]
    fn the_ledger_agrees_with_the_engine_and_balances_to_zero(ops in prop::collection::vec(op(), 1..120)) {
        let mut world = World::new();
        for op in ops {
            world.run(op);
            world.check();
        }
        world.run(Op::Advance(3 * 3_600_000));
        world.check();
        world.check_replay();
        world.check_invoices();
    }
}

#[test]
fn a_usage_charge_pays_the_supplier_less_the_fee() {
    let mut world = World::new();
    world.run(Op::Ask { supplier: 0, market: 0, ticks: 0, mask: 1 });
    world.run(Op::Bid { renter: 0, market: 0, ticks: 0, quantity: 1, hours: 1 });
    world.apply(Command::SettleUsage { lease: LeaseId(0), amount_minor: 1_000_000, verified_gpu_ms: 1_800_000 });
    // 2.5% of 1.000000 to the exchange, the rest owed to the supplier.
    assert_eq!(world.ledger.balance(LedgerAccount::Fees), 25_000);
    assert_eq!(world.ledger.balance(LedgerAccount::Payable(AccountId(3))), 975_000);
    world.check();
}

#[test]
fn a_transfer_is_never_applied_twice() {
    let mut ledger = Ledger::new();
    let deposit = Event { seq: 7, at_ms: T0, kind: EventKind::FundsDeposited { account: AccountId(0), amount_minor: 5 } };
    ledger.apply(&deposit).expect("first time");
    assert!(ledger.apply(&deposit).is_err(), "the same event again is refused");
    assert_eq!(ledger.balance(LedgerAccount::Available(AccountId(0))), 5);
}
