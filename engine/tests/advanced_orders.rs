//! All-or-none, budget and stop orders (docs/market-rules.md "All-or-none",
//! "Budget orders", "Stop orders"): table-driven scenarios per type on the
//! spot book, and the interactions the rulebook names (all-or-none against
//! a minimum quantity, a stop triggered inside a matching pass, budgets
//! rounded to whole GPUs over several hours).

mod common;

use common::*;
use gpux_engine::*;

const USD_1_90: u64 = 1_900_000;
const USD_2_10: u64 = 2_100_000;
const USD_2_20: u64 = 2_200_000;

/// A supplier with four 4-GPU hosts and a well-funded renter.
struct Fixture {
    m: Market,
    supplier: AccountId,
    hosts: Vec<HostId>,
    renter: AccountId,
}

fn fixture() -> Fixture {
    let mut m = Market::new();
    let supplier = m.supplier();
    let hosts = (0..4).map(|i| m.h100_host(supplier, &format!("host-{i}"), 4)).collect();
    let renter = m.renter(1_000_000_000);
    Fixture { m, supplier, hosts, renter }
}

impl Fixture {
    fn with(&mut self, order: NewOrder, options: OrderOptions) -> Vec<Event> {
        self.m.apply(Command::Place { order, options, regions: Vec::new(), cluster: None })
    }

    fn aon_bid(&mut self, price: u64, quantity: u32) -> (OrderId, Vec<Event>) {
        let order = self.m.order(self.renter, H100_SPOT, Side::Buy, price, quantity);
        let events = self.with(order, OrderOptions { all_or_none: true, ..OrderOptions::default() });
        (accepted(&events).unwrap_or_else(|| panic!("{:?}", rejection(&events))), events)
    }

    /// An ask of the first `gpus` GPUs of host `host`.
    fn ask(&mut self, host: usize, gpus: u32, price: u64) -> OrderId {
        self.m.ask(self.supplier, self.hosts[host], (1u64 << gpus) - 1, H100_SPOT, price)
    }
}

fn event_names(events: &[Event]) -> Vec<&'static str> {
    events
        .iter()
        .filter_map(|e| match e.kind {
            EventKind::Trade { .. } => Some("trade"),
            EventKind::StopArmed { .. } => Some("stop_armed"),
            EventKind::StopTriggered { .. } => Some("stop_triggered"),
            EventKind::StopRefused { .. } => Some("stop_refused"),
            _ => None,
        })
        .collect()
}

// ---------------------------------------------------------------- all-or-none

#[test]
fn an_all_or_none_bid_fills_whole_across_hosts_or_rests_untraded() {
    // (ask GPUs on successive hosts, bid quantity, trades expected, bid rests with)
    type Case = (&'static [u32], u32, &'static [(u64, u32)], Option<u32>);
    let cases: &[Case] = &[
        (&[2, 2], 4, &[(USD_2, 2), (USD_2, 2)], None),
        (&[3], 4, &[], Some(4)),
        (&[1, 1, 1], 4, &[], Some(4)),
        (&[4, 1], 4, &[(USD_2, 4)], None),
        (&[], 1, &[], Some(1)),
    ];
    for (asks, quantity, expected, rests) in cases {
        let mut f = fixture();
        for (host, &gpus) in asks.iter().enumerate() {
            f.ask(host, gpus, USD_2);
        }
        let (bid, events) = f.aon_bid(USD_2, *quantity);
        assert_eq!(trades(&events), *expected, "asks {asks:?}, bid {quantity}");
        assert_eq!(f.m.engine.order(bid).map(|o| o.quantity), *rests, "asks {asks:?}, bid {quantity}");
    }
}

#[test]
fn a_resting_all_or_none_bid_fills_once_an_ask_makes_it_whole_at_the_asks_prices() {
    let mut f = fixture();
    f.ask(0, 2, USD_1_90);
    let (bid, events) = f.aon_bid(USD_2, 4);
    assert!(trades(&events).is_empty());
    assert_eq!(f.m.engine.depth(H100_SPOT, Side::Buy), [(USD_2, 4)]);
    // Two more GPUs rest on another host: the bid now fills whole, as the
    // taker, at each ask's price.
    let mut order = f.m.order(f.supplier, H100_SPOT, Side::Sell, USD_2, 2);
    order.supply = Some(GpuSet { host: f.hosts[1], gpu_mask: 0b11 });
    let events = f.m.place(order);
    assert_eq!(trades(&events), [(USD_1_90, 2), (USD_2, 2)]);
    assert!(events.iter().any(|e| matches!(e.kind, EventKind::Trade { aggressor: Side::Buy, .. })));
    assert_eq!(closed(&events, bid), Some(OrderCloseReason::Filled));
    assert!(f.m.engine.depth(H100_SPOT, Side::Buy).is_empty());
}

#[test]
fn an_ask_passes_over_an_all_or_none_bid_it_cannot_fill_and_trades_with_the_bid_behind() {
    let mut f = fixture();
    let (aon, _) = f.aon_bid(USD_2_10, 4);
    let (plain, _) = f.m.bid(f.renter, H100_SPOT, USD_2, 2);
    let events = {
        let mut order = f.m.order(f.supplier, H100_SPOT, Side::Sell, USD_2, 2);
        order.supply = Some(GpuSet { host: f.hosts[0], gpu_mask: 0b11 });
        f.m.place(order)
    };
    assert_eq!(trades(&events), [(USD_2, 2)], "the plain bid behind trades at its price");
    assert_eq!(closed(&events, plain), Some(OrderCloseReason::Filled));
    assert_eq!(f.m.engine.order(aon).map(|o| o.quantity), Some(4), "the all-or-none bid keeps its place, untraded");
}

#[test]
fn a_minimum_quantity_ask_does_not_count_an_all_or_none_bid_it_cannot_fill_whole() {
    // (ask GPUs, its min quantity, trades expected)
    type Case = (u32, u32, &'static [(u64, u32)]);
    let cases: &[Case] = &[(3, 3, &[]), (4, 4, &[(USD_2, 4)]), (4, 1, &[(USD_2, 4)])];
    for &(gpus, min_quantity, expected) in cases {
        let mut f = fixture();
        f.aon_bid(USD_2, 4);
        let mut order = f.m.order(f.supplier, H100_SPOT, Side::Sell, USD_2, gpus);
        order.supply = Some(GpuSet { host: f.hosts[0], gpu_mask: (1 << gpus) - 1 });
        order.min_quantity = min_quantity;
        let events = f.m.place(order);
        let ask = accepted(&events).expect("accepted");
        assert_eq!(trades(&events), expected, "ask of {gpus}, min {min_quantity}");
        if expected.is_empty() {
            assert_eq!(closed(&events, ask), Some(OrderCloseReason::MinQuantityNotMet));
        }
    }
}

#[test]
fn an_all_or_none_bid_that_cannot_rest_is_killed_whole() {
    let mut f = fixture();
    f.ask(0, 2, USD_2);
    let mut order = f.m.order(f.renter, H100_SPOT, Side::Buy, USD_2, 3);
    order.time_in_force = TimeInForce::Ioc;
    let events = f.with(order, OrderOptions { all_or_none: true, ..OrderOptions::default() });
    let id = accepted(&events).expect("accepted");
    assert!(trades(&events).is_empty());
    assert_eq!(closed(&events, id), Some(OrderCloseReason::Killed));
}

#[test]
fn shrinking_a_resting_all_or_none_bid_fills_it_if_it_now_fits() {
    let mut f = fixture();
    f.ask(0, 2, USD_2);
    let (bid, _) = f.aon_bid(USD_2, 4);
    let events = f.m.apply(Command::ReplaceOrder { account: f.renter, order: bid, price_minor_per_gpu_hour: USD_2, quantity: 2 });
    assert_eq!(trades(&events), [(USD_2, 2)]);
    assert_eq!(closed(&events, bid), Some(OrderCloseReason::Filled));
}

#[test]
fn a_second_later_an_all_or_none_bid_that_a_verification_made_whole_fills() {
    let mut f = fixture();
    f.ask(0, 2, USD_2);
    f.ask(1, 2, USD_2);
    let order = f.m.order(f.renter, H100_SPOT, Side::Buy, USD_2, 4);
    let events = f.with(order, OrderOptions { all_or_none: true, verified_only: true, ..OrderOptions::default() });
    let bid = accepted(&events).expect("accepted");
    assert!(trades(&events).is_empty(), "no GPU is verified yet");
    for host in [f.hosts[0], f.hosts[1]] {
        for index in 0..2 {
            let gpu = f.m.engine.host_gpu(host, index).expect("registered");
            f.m.apply(Command::RecordChallenge { gpu, answer: ChallengeAnswer::Correct { n: 256, elapsed_ms: 10 } });
            let memory = ChallengeAnswer::MemoryCorrect { words_log2: 16, passes: 8, elapsed_ms: 10 };
            f.m.apply(Command::RecordChallenge { gpu, answer: memory });
        }
    }
    assert!(f.m.engine.order(bid).is_some(), "verification alone adds no ask: nothing re-checks the bid yet");
    let events = f.m.advance(1_000);
    assert_eq!(trades(&events), [(USD_2, 2), (USD_2, 2)]);
    assert_eq!(closed(&events, bid), Some(OrderCloseReason::Filled));
}

// --------------------------------------------------------------------- budget

#[test]
fn a_budget_buys_whole_gpus_walking_the_book_within_its_limit() {
    // (ask prices, one GPU each on its own host; limit; budget; hours; trades; rests with; released on close)
    struct Case {
        asks: &'static [u64],
        limit: u64,
        budget: u64,
        hours: u32,
        tif: TimeInForce,
        trades: &'static [(u64, u32)],
        rests: Option<u32>,
    }
    let cases = [
        // 1.90 + 2.00 = 3.90 of 4.00; 0.10 left buys nothing more: IOC ends.
        Case {
            asks: &[USD_1_90, USD_2, USD_2_10],
            limit: USD_2_10,
            budget: 4_000_000,
            hours: 1,
            tif: TimeInForce::Ioc,
            trades: &[(USD_1_90, 1), (USD_2, 1)],
            rests: None,
        },
        // The rest (3.10) rests for what it buys at the 2.00 limit: one GPU.
        Case {
            asks: &[USD_1_90],
            limit: USD_2,
            budget: 5_000_000,
            hours: 1,
            tif: TimeInForce::Gtc,
            trades: &[(USD_1_90, 1)],
            rests: Some(1),
        },
        // Three hours: a GPU costs 3 x the price; 12.00 buys two at 2.00.
        Case {
            asks: &[USD_2, USD_2, USD_2],
            limit: USD_2,
            budget: 12_000_000,
            hours: 3,
            tif: TimeInForce::Gtc,
            trades: &[(USD_2, 1), (USD_2, 1)],
            rests: None,
        },
        // Cheaper asks make the budget buy more GPUs than at the limit.
        Case {
            asks: &[1_000_000, 1_000_000, 1_000_000],
            limit: USD_2,
            budget: 3_000_000,
            hours: 1,
            tif: TimeInForce::Ioc,
            trades: &[(1_000_000, 1), (1_000_000, 1), (1_000_000, 1)],
            rests: None,
        },
        // FOK: the whole quantity within the budget, or nothing.
        Case { asks: &[USD_2, USD_2], limit: USD_2, budget: 3_999_999, hours: 1, tif: TimeInForce::Fok, trades: &[], rests: None },
    ];
    for (index, case) in cases.iter().enumerate() {
        let mut f = fixture();
        for (host, &price) in case.asks.iter().enumerate() {
            f.ask(host, 1, price);
        }
        let (available_before, _) = f.m.engine.funds(f.renter).expect("renter");
        let mut order = f.m.order(f.renter, H100_SPOT, Side::Buy, case.limit, if case.tif == TimeInForce::Fok { 2 } else { 10 });
        order.time_in_force = case.tif;
        order.duration = LeaseDuration::Hours(case.hours);
        let events = f.with(order, OrderOptions { budget_minor: case.budget, ..OrderOptions::default() });
        let id = accepted(&events).unwrap_or_else(|| panic!("case {index}: {:?}", rejection(&events)));
        assert_eq!(trades(&events), case.trades, "case {index}");
        assert_eq!(f.m.engine.order(id).map(|o| o.quantity), case.rests, "case {index}");
        // Held: each lease's escrow, plus the resting rest at its limit; never more than the budget.
        let spent: u64 = case.trades.iter().map(|(price, quantity)| price * *quantity as u64 * case.hours as u64).sum();
        let resting_hold = case.rests.map_or(0, |q| q as u64 * case.limit * case.hours as u64);
        let (available, held) = f.m.engine.funds(f.renter).expect("renter");
        assert_eq!(held, spent + resting_hold, "case {index}");
        assert_eq!(available + held, available_before, "case {index}");
        assert!(spent + resting_hold <= case.budget, "case {index}");
    }
}

#[test]
fn a_budget_bid_resting_rest_is_cut_to_whole_gpus_and_says_so() {
    let mut f = fixture();
    f.ask(0, 1, USD_1_90);
    let mut order = f.m.order(f.renter, H100_SPOT, Side::Buy, USD_2, 10);
    order.duration = LeaseDuration::Hours(1);
    let events = f.with(order, OrderOptions { budget_minor: 6_500_000, ..OrderOptions::default() });
    let id = accepted(&events).expect("accepted");
    // 6.50 - 1.90 = 4.60 buys two GPUs at 2.00; 0.60 goes back.
    assert!(events.iter().any(
        |e| matches!(e.kind, EventKind::OrderReduced { order, quantity_left: 2, reason: ReduceReason::BudgetLimit, .. } if order == id)
    ));
    assert_eq!(f.m.engine.depth(H100_SPOT, Side::Buy), [(USD_2, 2)]);
    // It is a plain bid now: a new ask fills it at its limit.
    f.ask(1, 2, USD_2);
    assert!(f.m.engine.order(id).is_none());
}

#[test]
fn a_budget_spent_below_one_gpu_closes_the_bid() {
    let mut f = fixture();
    f.ask(0, 1, USD_2);
    let order = f.m.order(f.renter, H100_SPOT, Side::Buy, USD_2, 5);
    let events = f.with(order, OrderOptions { budget_minor: 3_000_000, ..OrderOptions::default() });
    let id = accepted(&events).expect("accepted");
    assert_eq!(trades(&events), [(USD_2, 1)]);
    assert_eq!(closed(&events, id), Some(OrderCloseReason::BudgetSpent));
    assert_eq!(f.m.engine.funds(f.renter).expect("renter").1, USD_2, "only the lease's escrow is held");
}

#[test]
fn a_market_budget_order_spends_at_the_books_prices() {
    let mut f = fixture();
    f.ask(0, 1, USD_2);
    f.ask(1, 1, USD_2_10);
    let mut order = f.m.order(f.renter, H100_SPOT, Side::Buy, 0, 5);
    order.order_type = OrderType::Market;
    order.time_in_force = TimeInForce::Ioc;
    let events = f.with(order, OrderOptions { budget_minor: 4_100_000, ..OrderOptions::default() });
    assert_eq!(trades(&events), [(USD_2, 1), (USD_2_10, 1)]);
}

#[test]
fn invalid_budgets_all_or_none_and_stops_have_their_codes() {
    let mut f = fixture();
    f.ask(0, 1, USD_2);
    f.m.bid(f.renter, H100_SPOT, USD_2, 1); // a trade at 2.00: the last price
    let renter = f.renter;
    type Build = fn(&mut NewOrder, &mut OrderOptions);
    let cases: &[(&str, Side, Build, RejectCode)] = &[
        ("budget below one GPU", Side::Buy, |_, o| o.budget_minor = USD_2 - 1, RejectCode::BudgetTooSmall),
        (
            "budget with all-or-none",
            Side::Buy,
            |_, o| {
                o.budget_minor = 9_000_000;
                o.all_or_none = true
            },
            RejectCode::BudgetInvalid,
        ),
        (
            "budget on one host",
            Side::Buy,
            |n, o| {
                o.budget_minor = 9_000_000;
                n.one_host = true
            },
            RejectCode::BudgetInvalid,
        ),
        (
            "budget open-ended",
            Side::Buy,
            |n, o| {
                o.budget_minor = 9_000_000;
                n.duration = LeaseDuration::UntilCancelled
            },
            RejectCode::BudgetInvalid,
        ),
        ("budget on an ask", Side::Sell, |_, o| o.budget_minor = 9_000_000, RejectCode::BudgetInvalid),
        ("all-or-none on an ask", Side::Sell, |_, o| o.all_or_none = true, RejectCode::AllOrNoneInvalid),
        (
            "all-or-none with a minimum",
            Side::Buy,
            |n, o| {
                o.all_or_none = true;
                n.min_quantity = 1
            },
            RejectCode::AllOrNoneInvalid,
        ),
        ("stop off tick", Side::Buy, |_, o| o.stop_price_minor_per_gpu_hour = USD_2_10 + 1, RejectCode::StopPriceInvalid),
        ("stop reached already", Side::Buy, |_, o| o.stop_price_minor_per_gpu_hour = USD_1_90, RejectCode::StopWouldTrigger),
        ("sell stop reached already", Side::Sell, |_, o| o.stop_price_minor_per_gpu_hour = USD_2_10, RejectCode::StopWouldTrigger),
        ("score filter on an ask", Side::Sell, |_, o| o.verified_only = true, RejectCode::ScoreFilterInvalid),
    ];
    for (name, side, build, code) in cases {
        let mut order = f.m.order(if *side == Side::Buy { renter } else { f.supplier }, H100_SPOT, *side, USD_2_20, 1);
        if *side == Side::Sell {
            order.supply = Some(GpuSet { host: f.hosts[1], gpu_mask: 1 });
        }
        let mut options = OrderOptions::default();
        build(&mut order, &mut options);
        let before = f.m.engine.state_hash();
        let events = f.with(order, options);
        assert_eq!(rejection(&events), Some(*code), "{name}");
        assert_eq!(events.len(), 1, "{name}");
        assert_eq!(f.m.engine.state_hash(), before, "{name}: state changed");
    }
}

// ---------------------------------------------------------------------- stops

#[test]
fn a_stop_waits_off_the_book_and_enters_after_the_pass_that_reached_it() {
    // (stop price, trade that happens, triggers?)
    let cases: &[(Side, u64, u64, bool)] = &[
        (Side::Buy, USD_2_10, USD_2, false),
        (Side::Buy, USD_2_10, USD_2_10, true),
        (Side::Buy, USD_2_10, USD_2_20, true),
        (Side::Sell, USD_1_90, USD_2, false),
        (Side::Sell, USD_2, USD_2, true),
        (Side::Sell, USD_2, USD_1_90, true),
    ];
    for &(side, stop, trade_at, triggers) in cases {
        let mut f = fixture();
        // An opening trade at 2.05 sets the last price between the stops.
        f.ask(0, 1, 2_050_000);
        f.m.bid(f.renter, H100_SPOT, 2_050_000, 1);
        let mut order = match side {
            Side::Buy => f.m.order(f.renter, H100_SPOT, Side::Buy, USD_2_20, 1),
            Side::Sell => {
                let mut order = f.m.order(f.supplier, H100_SPOT, Side::Sell, USD_1_90, 1);
                order.supply = Some(GpuSet { host: f.hosts[3], gpu_mask: 1 });
                order
            }
        };
        order.time_in_force = TimeInForce::Gtc;
        let events = f.with(order, OrderOptions { stop_price_minor_per_gpu_hour: stop, ..OrderOptions::default() });
        let id = accepted(&events).unwrap_or_else(|| panic!("{side:?} stop {stop}: {:?}", rejection(&events)));
        assert_eq!(event_names(&events), ["stop_armed"]);
        assert!(f.m.engine.depth(H100_SPOT, side).is_empty(), "an armed stop is not on the book");
        // The trade: an ask and a bid at `trade_at` from other GPUs.
        f.ask(1, 1, trade_at);
        let events = f.m.buy(f.renter, H100_SPOT, trade_at, 1);
        let names = event_names(&events);
        if triggers {
            assert_eq!(names[..2], ["trade", "stop_triggered"], "{side:?} stop {stop} at {trade_at}");
            assert!(f.m.engine.order(id).is_none_or(|o| o.resting), "it entered the market");
        } else {
            assert_eq!(names, ["trade"], "{side:?} stop {stop} at {trade_at}");
            assert!(f.m.engine.order(id).is_some_and(|o| !o.resting));
        }
    }
}

#[test]
fn a_stop_triggered_inside_a_pass_enters_behind_the_order_that_triggered_it() {
    let mut f = fixture();
    let other = f.m.renter(1_000_000_000);
    f.ask(0, 1, USD_2);
    // A buy stop at 2.00, limit 2.00: armed below no trade yet.
    let order = f.m.order(other, H100_SPOT, Side::Buy, USD_2, 1);
    let stop = accepted(&f.with(order, OrderOptions { stop_price_minor_per_gpu_hour: USD_2, ..OrderOptions::default() })).expect("armed");
    // The renter bids for 2 at 2.00: one trades (2.00 reaches the stop), one rests.
    let (first, events) = f.m.bid(f.renter, H100_SPOT, USD_2, 2);
    assert_eq!(event_names(&events), ["trade", "stop_triggered"]);
    assert_eq!(f.m.engine.depth(H100_SPOT, Side::Buy), [(USD_2, 2)]);
    // The next GPU offered goes to the renter's rest, which was there first.
    f.ask(1, 1, USD_2);
    assert!(f.m.engine.order(first).is_none(), "the triggering bid's rest filled first");
    assert_eq!(f.m.engine.order(stop).map(|o| o.quantity), Some(1));
}

#[test]
fn stops_cascade_in_arming_order() {
    let mut f = fixture();
    let (a, b) = (f.m.renter(1_000_000_000), f.m.renter(1_000_000_000));
    f.ask(0, 1, USD_2);
    f.ask(1, 1, USD_2_10);
    f.ask(2, 1, USD_2_20);
    // A triggers at 2.00 and buys at 2.10; that trade triggers B, which buys at 2.20.
    let order = f.m.order(a, H100_SPOT, Side::Buy, USD_2_10, 1);
    let stop_a = accepted(&f.with(order, OrderOptions { stop_price_minor_per_gpu_hour: USD_2, ..OrderOptions::default() })).expect("armed");
    let order = f.m.order(b, H100_SPOT, Side::Buy, USD_2_20, 1);
    let stop_b =
        accepted(&f.with(order, OrderOptions { stop_price_minor_per_gpu_hour: USD_2_10, ..OrderOptions::default() })).expect("armed");
    let events = f.m.buy(f.renter, H100_SPOT, USD_2, 1);
    assert_eq!(trades(&events), [(USD_2, 1), (USD_2_10, 1), (USD_2_20, 1)]);
    assert_eq!(event_names(&events), ["trade", "stop_triggered", "trade", "stop_triggered", "trade"]);
    assert_eq!(closed(&events, stop_a), Some(OrderCloseReason::Filled));
    assert_eq!(closed(&events, stop_b), Some(OrderCloseReason::Filled));
}

#[test]
fn a_stop_market_order_trades_at_the_protected_price_when_triggered() {
    let mut f = fixture();
    f.ask(0, 1, USD_2);
    f.ask(1, 1, USD_2_10);
    let mut order = f.m.order(f.renter, H100_SPOT, Side::Buy, 0, 1);
    order.order_type = OrderType::Market;
    order.time_in_force = TimeInForce::Ioc;
    let stop = accepted(&f.with(order, OrderOptions { stop_price_minor_per_gpu_hour: USD_2, ..OrderOptions::default() })).expect("armed");
    let events = f.m.buy(f.renter, H100_SPOT, USD_2, 1);
    assert_eq!(trades(&events), [(USD_2, 1), (USD_2_10, 1)]);
    assert_eq!(closed(&events, stop), Some(OrderCloseReason::Filled));
}

#[test]
fn an_armed_stop_cancels_expires_is_not_replaced_and_is_refused_when_it_no_longer_passes() {
    let mut f = fixture();
    let (plain, _) = f.m.bid(f.renter, H100_SPOT, USD_2, 1);
    let (_, plain_held) = f.m.engine.funds(f.renter).expect("renter");
    f.m.apply(Command::CancelOrder { account: f.renter, order: plain });
    let order = f.m.order(f.renter, H100_SPOT, Side::Buy, USD_2, 1);
    let stop = accepted(&f.with(order, OrderOptions { stop_price_minor_per_gpu_hour: USD_2, ..OrderOptions::default() })).expect("armed");
    let (_, held) = f.m.engine.funds(f.renter).expect("renter");
    assert!(plain_held > 0);
    assert_eq!(held, plain_held, "an armed stop holds what the order it would become holds");
    let events = f.m.apply(Command::ReplaceOrder { account: f.renter, order: stop, price_minor_per_gpu_hour: USD_2_10, quantity: 1 });
    assert_eq!(rejection(&events), Some(RejectCode::ReplaceInvalid));
    let events = f.m.apply(Command::CancelOrder { account: f.renter, order: stop });
    assert_eq!(closed(&events, stop), Some(OrderCloseReason::Cancelled));
    assert_eq!(f.m.engine.funds(f.renter).expect("renter").1, 0, "a cancelled stop's hold is released");

    // GTT: it expires while armed.
    let mut order = f.m.order(f.renter, H100_SPOT, Side::Buy, USD_2, 1);
    order.time_in_force = TimeInForce::Gtt { expire_at_ms: f.m.now_ms + 1_000 };
    let stop = accepted(&f.with(order, OrderOptions { stop_price_minor_per_gpu_hour: USD_2, ..OrderOptions::default() })).expect("armed");
    let events = f.m.advance(1_000);
    assert_eq!(closed(&events, stop), Some(OrderCloseReason::Expired));
    assert_eq!(f.m.engine.funds(f.renter).expect("renter").1, 0, "an expired stop's hold is released");

    // Refused at its trigger: a stop-market holds at its stop price; when it
    // triggers, the book's protected price needs more than the account has.
    f.ask(0, 1, USD_2);
    f.ask(1, 1, USD_2_20);
    let mut order = f.m.order(f.renter, H100_SPOT, Side::Buy, 0, 1);
    order.order_type = OrderType::Market;
    order.time_in_force = TimeInForce::Ioc;
    let stop = accepted(&f.with(order, OrderOptions { stop_price_minor_per_gpu_hour: USD_2, ..OrderOptions::default() })).expect("armed");
    let (available, held) = f.m.engine.funds(f.renter).expect("renter");
    assert_eq!(held, plain_held, "a stop-market holds at its stop price");
    f.m.apply(Command::Withdraw { account: f.renter, amount_minor: available });
    let other = f.m.renter(1_000_000_000);
    let events = f.m.buy(other, H100_SPOT, USD_2, 1);
    assert_eq!(event_names(&events), ["trade", "stop_triggered", "stop_refused"]);
    assert!(events.iter().any(|e| matches!(e.kind, EventKind::StopRefused { code: RejectCode::InsufficientFunds, .. })));
    assert_eq!(closed(&events, stop), Some(OrderCloseReason::StopRefused));
    assert_eq!(f.m.engine.funds(f.renter).expect("renter"), (plain_held, 0), "the refused stop's hold went back to available");
    assert_eq!(f.m.engine.order(stop).map(|o| o.quantity), None);
}

/// Issue 41: armed stops once held nothing, so one account could arm stops
/// without limit, and sell stops could name the same GPU twice.
#[test]
fn armed_stops_need_funds_or_gpus_and_each_account_has_a_share_of_the_stops_table() {
    let mut f = fixture();
    // A bid stop the account cannot pay for is refused, as the order would be.
    let poor = f.m.renter(1_000);
    let order = f.m.order(poor, H100_SPOT, Side::Buy, USD_2, 1);
    let events = f.with(order, OrderOptions { stop_price_minor_per_gpu_hour: USD_2, ..OrderOptions::default() });
    assert_eq!(rejection(&events), Some(RejectCode::InsufficientFunds));

    // A sell stop locks its GPUs: a second stop or ask naming them is refused.
    let f_host = f.hosts[0];
    let mut order = f.m.order(f.supplier, H100_SPOT, Side::Sell, USD_1_90, 1);
    order.supply = Some(GpuSet { host: f_host, gpu_mask: 0b1 });
    let stop = accepted(&f.with(order.clone(), OrderOptions { stop_price_minor_per_gpu_hour: USD_1_90, ..OrderOptions::default() }))
        .expect("armed");
    order.client_order_id += 1;
    let events = f.with(order.clone(), OrderOptions { stop_price_minor_per_gpu_hour: USD_1_90, ..OrderOptions::default() });
    assert_eq!(rejection(&events), Some(RejectCode::InsufficientCapacity));
    order.client_order_id += 1;
    assert_eq!(rejection(&f.m.place(order.clone())), Some(RejectCode::InsufficientCapacity));
    // Cancelled, it frees the GPU.
    f.m.apply(Command::CancelOrder { account: f.supplier, order: stop });
    order.client_order_id += 1;
    assert!(accepted(&f.m.place(order)).is_some());

    // An account's share of the stops table: past it, `too_many_stops`,
    // while another account still arms its own.
    let rich = f.m.renter(1 << 50);
    let stop_at = |f: &mut Fixture, account| {
        let order = f.m.order(account, H100_SPOT, Side::Buy, USD_1_90, 1);
        f.with(order, OrderOptions { stop_price_minor_per_gpu_hour: USD_2_20, ..OrderOptions::default() })
    };
    for _ in 0..limits::STOPS_ARMED_PER_ACCOUNT_MAX {
        assert!(accepted(&stop_at(&mut f, rich)).is_some());
    }
    assert_eq!(rejection(&stop_at(&mut f, rich)), Some(RejectCode::TooManyStops));
    let victim = f.renter;
    assert!(accepted(&stop_at(&mut f, victim)).is_some(), "another account is served");
}

#[test]
fn a_journal_with_every_new_order_type_replays_to_the_same_state() {
    let mut f = fixture();
    f.ask(0, 2, USD_1_90);
    f.aon_bid(USD_2, 4);
    let order = f.m.order(f.renter, H100_SPOT, Side::Buy, USD_2_20, 1);
    f.with(order, OrderOptions { stop_price_minor_per_gpu_hour: USD_2, ..OrderOptions::default() });
    f.ask(1, 2, USD_2);
    f.ask(2, 2, USD_2_20);
    let order = f.m.order(f.renter, H100_SPOT, Side::Buy, USD_2_20, 3);
    f.with(order, OrderOptions { budget_minor: 3_000_000, ..OrderOptions::default() });
    f.m.advance(1_000);
    let journal: Vec<Input> = f.m.inputs.clone();
    let mut replay = Engine::new(EngineConfig::demo()).expect("config");
    let mut events = Vec::new();
    for input in &journal {
        events.extend_from_slice(replay.apply(input));
    }
    assert_eq!(replay.state_hash(), f.m.engine.state_hash());
    assert_eq!(events, f.m.log);
    assert!(events.iter().any(|e| matches!(e.kind, EventKind::StopTriggered { .. })));
}
