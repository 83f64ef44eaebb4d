//! The order types and safeguards of the rulebook (docs/market-rules.md,
//! "Orders"), each proven by a small scenario on the spot book.

mod common;

use common::*;
use gpux_engine::*;

/// A market with one supplier whose 8-GPU host is registered, and one renter.
fn market() -> (Market, AccountId, HostId, AccountId) {
    let mut market = Market::new();
    let supplier = market.supplier();
    let host = market.h100_host(supplier, "host-a", 8);
    let renter = market.renter(10_000_000_000);
    (market, supplier, host, renter)
}

#[test]
fn better_prices_fill_first_and_equal_prices_fill_in_time_order() {
    let (mut m, supplier, host, renter) = market();
    let late_cheap = m.ask(supplier, host, 0b0001, H100_SPOT, 1_900_000);
    let first_at_two = m.ask(supplier, host, 0b0010, H100_SPOT, USD_2);
    let second_at_two = m.ask(supplier, host, 0b0100, H100_SPOT, USD_2);
    let (_, events) = m.bid(renter, H100_SPOT, USD_2, 2);
    assert_eq!(trades(&events), [(1_900_000, 1), (USD_2, 1)]);
    assert_eq!(closed(&events, late_cheap), Some(OrderCloseReason::Filled));
    assert_eq!(closed(&events, first_at_two), Some(OrderCloseReason::Filled));
    assert!(m.engine.order(second_at_two).is_some(), "the later ask at 2.00 keeps resting");
}

#[test]
fn a_partly_filled_limit_order_rests_with_its_remainder() {
    let (mut m, supplier, host, renter) = market();
    m.ask(supplier, host, 0b11, H100_SPOT, USD_2);
    let (bid, events) = m.bid(renter, H100_SPOT, USD_2, 5);
    assert_eq!(trades(&events), [(USD_2, 2)]);
    assert_eq!(m.engine.order(bid).map(|o| o.quantity), Some(3));
    assert_eq!(m.engine.depth(H100_SPOT, Side::Buy), [(USD_2, 3)]);
    assert!(m.engine.depth(H100_SPOT, Side::Sell).is_empty());
}

#[test]
fn an_ioc_order_trades_what_it_can_and_the_rest_is_killed() {
    let (mut m, supplier, host, renter) = market();
    m.ask(supplier, host, 0b1, H100_SPOT, USD_2);
    let mut order = m.order(renter, H100_SPOT, Side::Buy, USD_2, 3);
    order.time_in_force = TimeInForce::Ioc;
    let events = m.place(order);
    let id = accepted(&events).expect("accepted");
    assert_eq!(trades(&events), [(USD_2, 1)]);
    assert_eq!(closed(&events, id), Some(OrderCloseReason::Killed));
    assert!(m.engine.depth(H100_SPOT, Side::Buy).is_empty());
}

#[test]
fn a_fok_order_fills_completely_or_not_at_all() {
    let (mut m, supplier, host, renter) = market();
    m.ask(supplier, host, 0b11, H100_SPOT, USD_2);
    let mut too_big = m.order(renter, H100_SPOT, Side::Buy, USD_2, 3);
    too_big.time_in_force = TimeInForce::Fok;
    let events = m.place(too_big);
    assert!(trades(&events).is_empty());
    assert_eq!(closed(&events, accepted(&events).expect("accepted")), Some(OrderCloseReason::Killed));
    assert_eq!(m.engine.funds(renter), Some((10_000_000_000, 0)), "the hold is released");

    let mut fits = m.order(renter, H100_SPOT, Side::Buy, USD_2, 2);
    fits.time_in_force = TimeInForce::Fok;
    let events = m.place(fits);
    assert_eq!(trades(&events), [(USD_2, 2)]);
}

#[test]
fn a_post_only_order_rests_when_it_does_not_cross() {
    let (mut m, supplier, host, renter) = market();
    m.ask(supplier, host, 0b1, H100_SPOT, USD_2);
    let mut order = m.order(renter, H100_SPOT, Side::Buy, 1_999_000, 1);
    order.post_only = true;
    let events = m.place(order);
    assert!(trades(&events).is_empty());
    assert_eq!(m.engine.best_price(H100_SPOT, Side::Buy), Some(1_999_000));
}

#[test]
fn a_market_order_trades_only_within_the_protection_band() {
    let (mut m, supplier, host, renter) = market();
    m.ask(supplier, host, 0b001, H100_SPOT, USD_2);
    m.ask(supplier, host, 0b010, H100_SPOT, 2_090_000);
    m.ask(supplier, host, 0b100, H100_SPOT, 2_200_000);
    let mut order = m.order(renter, H100_SPOT, Side::Buy, 0, 3);
    order.order_type = OrderType::Market;
    order.time_in_force = TimeInForce::Ioc;
    let events = m.place(order);
    // The band is 5% over the best ask of 2.00: 2.10.
    assert_eq!(trades(&events), [(USD_2, 1), (2_090_000, 1)]);
    assert_eq!(closed(&events, accepted(&events).expect("accepted")), Some(OrderCloseReason::Killed));
    assert_eq!(m.engine.best_price(H100_SPOT, Side::Sell), Some(2_200_000));
}

#[test]
fn a_market_order_into_an_empty_book_closes_for_lack_of_liquidity() {
    let (mut m, _, _, renter) = market();
    let mut order = m.order(renter, H100_SPOT, Side::Buy, 0, 1);
    order.order_type = OrderType::Market;
    order.time_in_force = TimeInForce::Ioc;
    let events = m.place(order);
    assert_eq!(closed(&events, accepted(&events).expect("accepted")), Some(OrderCloseReason::NoLiquidity));
}

#[test]
fn a_good_till_time_order_expires_at_its_time() {
    let (mut m, _, _, renter) = market();
    let mut order = m.order(renter, H100_SPOT, Side::Buy, USD_2, 1);
    order.time_in_force = TimeInForce::Gtt { expire_at_ms: T0 + 60_000 };
    let id = accepted(&m.place(order)).expect("accepted");
    assert!(m.advance(59_999).iter().all(|e| !matches!(e.kind, EventKind::OrderClosed { .. })));
    let events = m.advance(1);
    assert_eq!(closed(&events, id), Some(OrderCloseReason::Expired));
    assert_eq!(m.engine.funds(renter), Some((10_000_000_000, 0)));
}

#[test]
fn replace_keeps_priority_only_when_the_size_goes_down_at_the_same_price() {
    let (mut m, supplier, host, renter) = market();
    let other = m.renter(10_000_000_000);
    let (first, _) = m.bid(renter, H100_SPOT, USD_2, 3);
    let (second, _) = m.bid(other, H100_SPOT, USD_2, 1);

    let events = m.apply(Command::ReplaceOrder { account: renter, order: first, price_minor_per_gpu_hour: USD_2, quantity: 2 });
    assert!(events.iter().any(|e| matches!(e.kind, EventKind::OrderReplaced { priority_kept: true, .. })));
    m.ask(supplier, host, 0b1, H100_SPOT, USD_2);
    assert_eq!(m.engine.order(first).map(|o| o.quantity), Some(1), "still first in line");

    let events = m.apply(Command::ReplaceOrder { account: renter, order: first, price_minor_per_gpu_hour: USD_2, quantity: 4 });
    assert!(events.iter().any(|e| matches!(e.kind, EventKind::OrderReplaced { priority_kept: false, .. })));
    let events = {
        m.ask(supplier, host, 0b10, H100_SPOT, USD_2);
        m.log.clone()
    };
    assert_eq!(closed(&events, second), Some(OrderCloseReason::Filled), "the bigger order went to the back");
}

#[test]
fn a_replace_to_a_crossing_price_trades_at_once() {
    let (mut m, supplier, host, renter) = market();
    m.ask(supplier, host, 0b1, H100_SPOT, USD_2);
    let (bid, _) = m.bid(renter, H100_SPOT, 1_500_000, 1);
    let events = m.apply(Command::ReplaceOrder { account: renter, order: bid, price_minor_per_gpu_hour: USD_2, quantity: 1 });
    assert_eq!(trades(&events), [(USD_2, 1)]);
}

#[test]
fn mass_cancel_closes_every_open_order_of_the_account_only() {
    let (mut m, supplier, host, renter) = market();
    let other = m.renter(10_000_000_000);
    m.bid(renter, H100_SPOT, 1_000_000, 1);
    m.bid(renter, A100_SPOT, 1_000_000, 1);
    let (others, _) = m.bid(other, H100_SPOT, 1_000_000, 1);
    m.ask(supplier, host, 0b1, H100_SPOT, USD_2);
    let events = m.apply(Command::MassCancel { account: renter, instrument: None });
    let cancelled =
        events.iter().filter(|e| matches!(e.kind, EventKind::OrderClosed { reason: OrderCloseReason::MassCancelled, .. })).count();
    assert_eq!(cancelled, 2);
    assert!(m.engine.order(others).is_some());
    assert!(m.engine.open_orders(renter).is_empty());
}

#[test]
fn self_trade_prevention_cancel_newest_cancels_the_incoming_order() {
    let (mut m, _, _, _) = market();
    let aggregator = m.open(Role::Aggregator);
    m.apply(Command::Deposit { account: aggregator, amount_minor: 1_000_000_000 });
    let host = m.h100_host(aggregator, "agg-host", 1);
    let ask = m.ask(aggregator, host, 0b1, H100_SPOT, USD_2);
    let order = m.order(aggregator, H100_SPOT, Side::Buy, USD_2, 1);
    let events = m.place(order);
    assert!(trades(&events).is_empty());
    assert_eq!(closed(&events, accepted(&events).expect("accepted")), Some(OrderCloseReason::SelfTradePrevented));
    assert!(m.engine.order(ask).is_some());
}

#[test]
fn self_trade_prevention_cancel_oldest_cancels_the_resting_order_and_goes_on() {
    let (mut m, supplier, host, _) = market();
    let aggregator = m.open(Role::Aggregator);
    m.apply(Command::Deposit { account: aggregator, amount_minor: 1_000_000_000 });
    let own_host = m.h100_host(aggregator, "agg-host", 1);
    let own_ask = m.ask(aggregator, own_host, 0b1, H100_SPOT, USD_2);
    m.ask(supplier, host, 0b1, H100_SPOT, USD_2);
    let mut order = m.order(aggregator, H100_SPOT, Side::Buy, USD_2, 1);
    order.self_trade_prevention = SelfTradePrevention::CancelOldest;
    let events = m.place(order);
    assert_eq!(closed(&events, own_ask), Some(OrderCloseReason::SelfTradePrevented));
    assert_eq!(trades(&events), [(USD_2, 1)]);
}

#[test]
fn self_trade_prevention_decrement_shrinks_both_orders_without_a_trade() {
    let (mut m, _, _, _) = market();
    let aggregator = m.open(Role::Aggregator);
    m.apply(Command::Deposit { account: aggregator, amount_minor: 1_000_000_000 });
    let own_host = m.h100_host(aggregator, "agg-host", 3);
    let own_ask = m.ask(aggregator, own_host, 0b111, H100_SPOT, USD_2);
    let mut order = m.order(aggregator, H100_SPOT, Side::Buy, USD_2, 2);
    order.self_trade_prevention = SelfTradePrevention::Decrement;
    let events = m.place(order);
    assert!(trades(&events).is_empty());
    assert_eq!(m.engine.order(own_ask).map(|o| o.quantity), Some(1));
    assert_eq!(closed(&events, accepted(&events).expect("accepted")), Some(OrderCloseReason::SelfTradePrevented));
    assert_eq!(m.engine.funds(aggregator), Some((1_000_000_000, 0)));
}

/// Cancel both: the own resting ask and the incoming bid both close, even
/// with another seller's ask behind the own one at the same price (matching
/// stops), and nothing stays held.
#[test]
fn self_trade_prevention_cancel_both_closes_the_resting_and_the_incoming_order() {
    let (mut m, supplier, host, _) = market();
    let aggregator = m.open(Role::Aggregator);
    m.apply(Command::Deposit { account: aggregator, amount_minor: 1_000_000_000 });
    let own_host = m.h100_host(aggregator, "agg-host", 1);
    let own_ask = m.ask(aggregator, own_host, 0b1, H100_SPOT, USD_2);
    let other_ask = m.ask(supplier, host, 0b1, H100_SPOT, USD_2);
    let mut order = m.order(aggregator, H100_SPOT, Side::Buy, USD_2, 1);
    order.self_trade_prevention = SelfTradePrevention::CancelBoth;
    let events = m.place(order);
    assert!(trades(&events).is_empty(), "matching stops at the own order");
    assert_eq!(closed(&events, own_ask), Some(OrderCloseReason::SelfTradePrevented));
    assert_eq!(closed(&events, accepted(&events).expect("accepted")), Some(OrderCloseReason::SelfTradePrevented));
    assert!(m.engine.order(other_ask).is_some(), "the other seller's ask still rests");
    assert_eq!(m.engine.funds(aggregator), Some((1_000_000_000, 0)), "the bid's hold is released");
}

#[test]
fn a_gang_bid_takes_all_its_gpus_from_one_host_or_waits() {
    let (mut m, supplier, host, renter) = market();
    let small_host = m.h100_host(supplier, "small", 2);
    m.ask(supplier, small_host, 0b11, H100_SPOT, 1_500_000);
    let mut gang = m.order(renter, H100_SPOT, Side::Buy, USD_2, 4);
    gang.one_host = true;
    let events = m.place(gang);
    let gang_id = accepted(&events).expect("accepted");
    assert!(trades(&events).is_empty(), "two GPUs on one host are not enough");

    let events = {
        m.ask(supplier, host, 0b1111, H100_SPOT, USD_2);
        m.log.clone()
    };
    assert_eq!(closed(&events, gang_id), Some(OrderCloseReason::Filled));
    let created = leases(&events);
    assert_eq!(created.last().map(|l| l.2), Some(0b1111), "one lease of four GPUs on one host");
}

#[test]
fn min_quantity_cancels_an_order_that_cannot_trade_that_much_at_once() {
    let (mut m, supplier, host, renter) = market();
    m.ask(supplier, host, 0b1, H100_SPOT, USD_2);
    let mut order = m.order(renter, H100_SPOT, Side::Buy, USD_2, 4);
    order.min_quantity = 2;
    let events = m.place(order);
    assert!(trades(&events).is_empty());
    assert_eq!(closed(&events, accepted(&events).expect("accepted")), Some(OrderCloseReason::MinQuantityNotMet));

    m.ask(supplier, host, 0b10, H100_SPOT, USD_2);
    let mut order = m.order(renter, H100_SPOT, Side::Buy, USD_2, 4);
    order.min_quantity = 2;
    let events = m.place(order);
    assert_eq!(trades(&events), [(USD_2, 1), (USD_2, 1)]);
    assert_eq!(m.engine.order(accepted(&events).expect("accepted")).map(|o| o.quantity), Some(2), "the rest rests");
}

#[test]
fn a_bid_holds_its_limit_for_its_hours_and_a_lease_escrows_the_trade_price() {
    let (mut m, supplier, host, renter) = market();
    m.ask(supplier, host, 0b1, H100_SPOT, USD_2);
    let mut order = m.order(renter, H100_SPOT, Side::Buy, 2_500_000, 2);
    order.duration = LeaseDuration::Hours(3);
    let id = accepted(&m.place(order)).expect("accepted");
    // One GPU traded at 2.00 for 3 h: 6.00 escrowed; the other still holds 2.50 x 3 h.
    assert_eq!(m.engine.funds(renter), Some((10_000_000_000 - 13_500_000, 13_500_000)));
    m.apply(Command::CancelOrder { account: renter, order: id });
    assert_eq!(m.engine.funds(renter), Some((10_000_000_000 - 6_000_000, 6_000_000)));
}

#[test]
fn an_ask_arriving_at_a_better_price_trades_at_the_resting_bid_price() {
    let (mut m, supplier, host, renter) = market();
    m.bid(renter, H100_SPOT, 2_500_000, 1);
    let mut ask = m.order(supplier, H100_SPOT, Side::Sell, USD_2, 1);
    ask.supply = Some(GpuSet { host, gpu_mask: 1 });
    let events = m.place(ask);
    assert_eq!(trades(&events), [(2_500_000, 1)]);
}

/// A bid with a minimum supplier score trades only with sellers the market
/// rated at least that high: cheaper asks of others are skipped and keep
/// their place; a resting filtered bid ignores an unqualified incoming ask
/// and takes a qualified one; the filter goes on bids only.
#[test]
fn a_bid_with_a_minimum_score_skips_sellers_below_it() {
    let (mut m, reliable, reliable_host, renter) = market();
    let unrated = m.supplier();
    let unrated_host = m.h100_host(unrated, "unrated-host", 4);
    let low = m.supplier();
    let low_host = m.h100_host(low, "low-host", 4);
    m.engine.set_supplier_score(reliable, Some(9_950));
    m.engine.set_supplier_score(low, Some(9_000));
    m.engine.set_supplier_score(unrated, None);
    let cheap_unrated = m.ask(unrated, unrated_host, 0b1, H100_SPOT, 1_800_000);
    let cheap_low = m.ask(low, low_host, 0b1, H100_SPOT, 1_900_000);
    m.ask(reliable, reliable_host, 0b1, H100_SPOT, USD_2);

    let filtered = |m: &mut Market, price, quantity| {
        let order = m.order(renter, H100_SPOT, Side::Buy, price, quantity);
        m.apply(Command::Place {
            order,
            options: OrderOptions { min_supplier_score_bps: 9_900, ..OrderOptions::default() },
            regions: Vec::new(),
            cluster: None,
        })
    };
    let events = filtered(&mut m, USD_2, 1);
    assert_eq!(trades(&events), [(USD_2, 1)], "only the reliable seller's dearer ask");
    assert!(m.engine.order(cheap_unrated).is_some() && m.engine.order(cheap_low).is_some(), "skipped asks keep resting");
    // An unfiltered bid takes the cheapest, as always.
    let (_, events) = m.bid(renter, H100_SPOT, USD_2, 1);
    assert_eq!(trades(&events), [(1_800_000, 1)]);

    // A filtered bid rests: the low seller's new ask does not fill it, the reliable one's does.
    let events = filtered(&mut m, 2_100_000, 1);
    let resting = accepted(&events).expect("accepted");
    assert!(trades(&events).is_empty(), "the low-scored ask at 1.90 does not qualify");
    let low_host_2 = m.h100_host(low, "low-host-2", 1);
    m.ask(low, low_host_2, 0b1, H100_SPOT, 2_000_000);
    assert!(m.engine.order(resting).is_some(), "still resting");
    m.engine.set_supplier_score(low, Some(9_900));
    let low_host_3 = m.h100_host(low, "low-host-3", 1);
    let mut ask = m.order(low, H100_SPOT, Side::Sell, 2_000_000, 1);
    ask.supply = Some(GpuSet { host: low_host_3, gpu_mask: 0b1 });
    assert_eq!(trades(&m.place(ask)), [(2_100_000, 1)], "a score raised to the minimum qualifies");

    // A fill-or-kill filtered bid counts qualified sellers only.
    let mut fok = m.order(renter, H100_SPOT, Side::Buy, USD_2, 2);
    fok.time_in_force = TimeInForce::Fok;
    m.engine.set_supplier_score(low, Some(9_000));
    let events = m.apply(Command::Place {
        order: fok,
        options: OrderOptions { min_supplier_score_bps: 9_900, ..OrderOptions::default() },
        regions: Vec::new(),
        cluster: None,
    });
    assert!(trades(&events).is_empty());
    assert_eq!(closed(&events, accepted(&events).expect("accepted")), Some(OrderCloseReason::Killed));

    // On an ask, or outside 1..=10 000: refused.
    let mut ask = m.order(reliable, H100_SPOT, Side::Sell, USD_2, 1);
    ask.supply = Some(GpuSet { host: reliable_host, gpu_mask: 0b10 });
    let refused = m.apply(Command::Place {
        order: ask,
        options: OrderOptions { min_supplier_score_bps: 9_000, ..OrderOptions::default() },
        regions: Vec::new(),
        cluster: None,
    });
    assert_eq!(rejection(&refused), Some(RejectCode::ScoreFilterInvalid));
    let bid = m.order(renter, H100_SPOT, Side::Buy, USD_2, 1);
    let refused = m.apply(Command::Place {
        order: bid,
        options: OrderOptions { min_supplier_score_bps: 10_001, ..OrderOptions::default() },
        regions: Vec::new(),
        cluster: None,
    });
    assert_eq!(rejection(&refused), Some(RejectCode::ScoreFilterInvalid));
}

fn challenged(events: &[Event]) -> Option<(ChallengeOutcome, u64, u64, bool)> {
    events.iter().find_map(|e| match e.kind {
        EventKind::GpuChallenged { outcome, mflops, classes_mask, verified, .. } => Some((outcome, mflops, classes_mask, verified)),
        _ => None,
    })
}

fn memory_challenged(events: &[Event]) -> Option<(ChallengeOutcome, u64, u64, bool)> {
    events.iter().find_map(|e| match e.kind {
        EventKind::GpuMemoryChallenged { outcome, mbps, classes_mask, verified, .. } => Some((outcome, mbps, classes_mask, verified)),
        _ => None,
    })
}

/// The demo class's memory challenge (2^16 words, 8 passes: 6.55 MB moved)
/// answered in 10 ms: 655 MB/s, above its 10.
const FAST_MEMORY: ChallengeAnswer = ChallengeAnswer::MemoryCorrect { words_log2: 16, passes: 8, elapsed_ms: 10 };

/// The memory-bandwidth challenge (docs/market-rules.md "Verified
/// hardware"): a GPU is verified only once both kinds its class asks for
/// were answered right; memory too slow for the class takes it out of the
/// class (and its ask) until a later answer shows the bandwidth, whatever
/// its compute rate; a wrong memory answer rejects it for good, and the
/// two kinds alternate (the target says which is next).
#[test]
fn the_memory_challenge_verifies_disqualifies_or_rejects_with_the_compute_one() {
    let (mut m, supplier, host, _renter) = market();
    let h100 = 1u64 << 0;
    let gpu = |m: &Market, index| m.engine.host_gpu(host, index).expect("registered");
    let (g0, g1) = (gpu(&m, 0), gpu(&m, 1));
    let fast_compute = ChallengeAnswer::Correct { n: 256, elapsed_ms: 100 };
    let target = m.engine.challenge_target(g0).expect("registered");
    assert_eq!((target.n, target.memory, target.memory_next), (Some(256), Some((16, 8)), false), "compute first");

    // Compute alone does not verify; memory next, then both: verified.
    let events = m.apply(Command::RecordChallenge { gpu: g0, answer: fast_compute });
    assert_eq!(challenged(&events), Some((ChallengeOutcome::Passed, 335, h100, false)));
    assert!(m.engine.challenge_target(g0).expect("registered").memory_next, "memory next");
    m.advance(1);
    let events = m.apply(Command::RecordChallenge { gpu: g0, answer: FAST_MEMORY });
    assert_eq!(memory_challenged(&events), Some((ChallengeOutcome::Passed, 655, h100, true)));
    let info = m.engine.gpu(g0).expect("gpu");
    assert_eq!(info.memory.map(|v| (v.outcome, v.mbps)), Some((ChallengeOutcome::Passed, 655)));
    assert!(!m.engine.challenge_target(g0).expect("registered").memory_next, "compute next: they alternate");

    // Memory too slow (6.55 MB in 1 s: 6 MB/s, under 10): out of the class
    // and its ask, though its compute is fast.
    m.apply(Command::RecordChallenge { gpu: g1, answer: fast_compute });
    let ask = m.ask(supplier, host, 0b010, H100_SPOT, USD_2);
    let slow = ChallengeAnswer::MemoryCorrect { words_log2: 16, passes: 8, elapsed_ms: 1_000 };
    let events = m.apply(Command::RecordChallenge { gpu: g1, answer: slow });
    assert_eq!(memory_challenged(&events), Some((ChallengeOutcome::TooSlow, 6, 0, false)));
    assert_eq!(closed(&events, ask), Some(OrderCloseReason::SupplyGone));
    // A later fast compute answer does not bring it back: memory still too slow.
    let events = m.apply(Command::RecordChallenge { gpu: g1, answer: fast_compute });
    assert_eq!(challenged(&events), Some((ChallengeOutcome::Passed, 335, 0, false)));
    // A fast memory answer does.
    let events = m.apply(Command::RecordChallenge { gpu: g1, answer: FAST_MEMORY });
    assert_eq!(memory_challenged(&events), Some((ChallengeOutcome::Passed, 655, h100, true)));
    // Unanswered: still in the class, no longer verified.
    let events = m.apply(Command::RecordChallenge { gpu: g1, answer: ChallengeAnswer::MemoryUnanswered });
    assert_eq!(memory_challenged(&events), Some((ChallengeOutcome::Unanswered, 0, h100, false)));
    // Wrong: rejected for good, from both kinds.
    let events = m.apply(Command::RecordChallenge { gpu: g1, answer: ChallengeAnswer::MemoryWrong });
    assert_eq!(memory_challenged(&events), Some((ChallengeOutcome::WrongAnswer, 0, 0, false)));
    let events = m.apply(Command::RecordChallenge { gpu: g1, answer: fast_compute });
    assert_eq!(challenged(&events).map(|c| (c.2, c.3)), Some((0, false)));
    let target = m.engine.challenge_target(g1).expect("registered");
    assert_eq!((target.n, target.memory), (None, None), "a rejected GPU is not challenged again");
}

/// A hardware challenge's result (docs/market-rules.md "Verified hardware"):
/// a fast correct answer verifies the GPU; a slow one takes it out of the
/// class (and its ask) until a later answer shows the rate; no answer
/// drops the verification only; a wrong answer rejects the GPU for good.
/// A bid for verified GPUs skips unverified ones, resold contracts too.
#[test]
fn challenges_verify_disqualify_or_reject_a_gpu_and_verified_only_bids_follow() {
    let (mut m, supplier, host, renter) = market();
    let h100 = 1u64 << 0; // the H100-SXM-80G class's bit in the demo config
    let gpu = |m: &Market, index| m.engine.host_gpu(host, index).expect("registered");
    let (g0, g1, g2) = (gpu(&m, 0), gpu(&m, 1), gpu(&m, 2));
    assert!(!m.engine.gpu(g0).expect("gpu").verified, "unverified until a challenge passes");
    // Their memory bandwidth is measured and fast enough (the class asks
    // for both; see the memory test below): what follows is the compute
    // challenge's part.
    for gpu in [g0, g1, g2] {
        let events = m.apply(Command::RecordChallenge { gpu, answer: FAST_MEMORY });
        assert_eq!(memory_challenged(&events), Some((ChallengeOutcome::Passed, 655, h100, false)), "not verified by one kind alone");
    }

    // 2 x 256^3 = 33.55 MFLOP in 100 ms: 335 MFLOP/s, above the class's 10.
    let fast = ChallengeAnswer::Correct { n: 256, elapsed_ms: 100 };
    let events = m.apply(Command::RecordChallenge { gpu: g0, answer: fast });
    assert_eq!(challenged(&events), Some((ChallengeOutcome::Passed, 335, h100, true)));
    let info = m.engine.gpu(g0).expect("gpu");
    assert!(info.verified);
    assert_eq!(info.challenge.map(|c| (c.outcome, c.mflops, c.rejected)), Some((ChallengeOutcome::Passed, 335, false)));

    // A verified-only bid skips the cheaper unverified GPU and takes the verified one.
    let unverified_ask = m.ask(supplier, host, 0b010, H100_SPOT, 1_900_000);
    m.ask(supplier, host, 0b001, H100_SPOT, USD_2);
    let bid = m.order(renter, H100_SPOT, Side::Buy, USD_2, 1);
    let events = m.apply(Command::Place {
        order: bid,
        options: OrderOptions { min_supplier_score_bps: 0, verified_only: true, ..OrderOptions::default() },
        regions: Vec::new(),
        cluster: None,
    });
    assert_eq!(trades(&events), [(USD_2, 1)]);
    assert!(m.engine.order(unverified_ask).is_some(), "the unverified ask keeps its place");

    // Too slow (4 s: 8 MFLOP/s): out of the class and its ask.
    let slow = ChallengeAnswer::Correct { n: 256, elapsed_ms: 4_000 };
    let events = m.apply(Command::RecordChallenge { gpu: g1, answer: slow });
    assert_eq!(challenged(&events), Some((ChallengeOutcome::TooSlow, 8, 0, false)));
    assert_eq!(closed(&events, unverified_ask), Some(OrderCloseReason::SupplyGone));
    let mut ask = m.order(supplier, H100_SPOT, Side::Sell, USD_2, 1);
    ask.supply = Some(GpuSet { host, gpu_mask: 0b010 });
    assert_eq!(rejection(&m.place(ask.clone())), Some(RejectCode::InsufficientCapacity), "not a GPU of the class now");
    // A later fast answer brings it back.
    let events = m.apply(Command::RecordChallenge { gpu: g1, answer: fast });
    assert_eq!(challenged(&events), Some((ChallengeOutcome::Passed, 335, h100, true)));
    assert!(accepted(&m.place(ask)).is_some());

    // No answer: still listed, no longer verified.
    let events = m.apply(Command::RecordChallenge { gpu: g1, answer: ChallengeAnswer::Unanswered });
    assert_eq!(challenged(&events), Some((ChallengeOutcome::Unanswered, 0, h100, false)));

    // A wrong answer: rejected for good, a later right answer does not bring it back.
    let events = m.apply(Command::RecordChallenge { gpu: g2, answer: ChallengeAnswer::Wrong });
    assert_eq!(challenged(&events), Some((ChallengeOutcome::WrongAnswer, 0, 0, false)));
    let events = m.apply(Command::RecordChallenge { gpu: g2, answer: fast });
    assert_eq!(challenged(&events).map(|c| (c.2, c.3)), Some((0, false)));
    assert_eq!(m.engine.gpu(g2).and_then(|g| g.challenge).map(|c| c.rejected), Some(true));

    // A verified-only bid is refused on an ask, or with a score above 10 000.
    let mut ask = m.order(supplier, H100_SPOT, Side::Sell, USD_2, 1);
    ask.supply = Some(GpuSet { host, gpu_mask: 0b1000 });
    let refused = m.apply(Command::Place {
        order: ask,
        options: OrderOptions { min_supplier_score_bps: 0, verified_only: true, ..OrderOptions::default() },
        regions: Vec::new(),
        cluster: None,
    });
    assert_eq!(rejection(&refused), Some(RejectCode::ScoreFilterInvalid));
    let bid = m.order(renter, H100_SPOT, Side::Buy, USD_2, 1);
    let refused = m.apply(Command::Place {
        order: bid,
        options: OrderOptions { min_supplier_score_bps: 10_001, verified_only: true, ..OrderOptions::default() },
        regions: Vec::new(),
        cluster: None,
    });
    assert_eq!(rejection(&refused), Some(RejectCode::ScoreFilterInvalid));
    let unknown = m.apply(Command::RecordChallenge { gpu: GpuId(999), answer: fast });
    assert_eq!(rejection(&unknown), Some(RejectCode::UnknownGpu));
}

/// The public list of offers: every resting ask one by one, best price
/// first and in time order within a price, with its seller's score and how
/// many of its GPUs a hardware challenge verified; paged.
#[test]
fn offers_list_each_ask_in_price_time_order_with_its_sellers_score() {
    let (mut m, reliable, reliable_host, _renter) = market();
    let other = m.supplier();
    let other_host = m.h100_host(other, "other-host", 4);
    m.engine.set_supplier_score(reliable, Some(9_950));
    let first_at_two = m.ask(other, other_host, 0b11, H100_SPOT, USD_2);
    let cheapest = m.ask(reliable, reliable_host, 0b1, H100_SPOT, 1_900_000);
    let second_at_two = m.ask(reliable, reliable_host, 0b10, H100_SPOT, USD_2);
    let gpu = m.engine.host_gpu(reliable_host, 0).expect("GPU 0 of the host");
    m.apply(Command::RecordChallenge { gpu, answer: ChallengeAnswer::Correct { n: 256, elapsed_ms: 10 } });
    m.apply(Command::RecordChallenge { gpu, answer: FAST_MEMORY });
    assert!(m.engine.gpu(gpu).expect("gpu").verified);

    let (offers, next) = m.engine.offers(H100_SPOT, 0, 10);
    assert_eq!(next, None);
    let seen: Vec<_> = offers
        .iter()
        .map(|o| (o.price_minor_per_gpu_hour, o.quantity, o.supplier, o.host, o.gpus_verified, o.supplier_score_bps))
        .collect();
    assert_eq!(
        seen,
        [
            (1_900_000, 1, reliable, Some(reliable_host), 1, Some(9_950)),
            (USD_2, 2, other, Some(other_host), 0, None),
            (USD_2, 1, reliable, Some(reliable_host), 0, Some(9_950)),
        ],
        "best price first, then time order: {cheapest:?} {first_at_two:?} {second_at_two:?}"
    );
    let (page, next) = m.engine.offers(H100_SPOT, 1, 1);
    assert_eq!((page.len(), page[0].supplier, next), (1, other, Some(2)), "a page of one after the first");
    let (page, next) = m.engine.offers(H100_SPOT, 2, 1);
    assert_eq!((page[0].supplier, next), (reliable, None), "the last page");
    assert!(m.engine.offers(H100_SPOT, 3, 10).0.is_empty());
    assert!(m.engine.offers(InstrumentId(9_999), 0, 10).0.is_empty(), "no such instrument");
}

/// A closed order's client id stays taken for a day (docs/market-rules.md
/// "Client order ids"): an order resent after a lost connection is placed
/// at most once, whether the first traded out, was cancelled or rests.
#[test]
fn a_client_order_id_stays_taken_for_a_day_after_its_order_closed() {
    let (mut m, supplier, host, renter) = market();
    m.ask(supplier, host, 0b1, H100_SPOT, USD_2);
    let filled = m.order(renter, H100_SPOT, Side::Buy, USD_2, 1);
    let events = m.place(filled.clone());
    assert_eq!(trades(&events), [(USD_2, 1)], "the first traded out");
    assert_eq!(rejection(&m.place(filled.clone())), Some(RejectCode::DuplicateClientOrderId), "resent: refused");
    let cancelled = m.order(renter, H100_SPOT, Side::Buy, 1_000_000, 1);
    let order = accepted(&m.place(cancelled.clone())).expect("rests");
    m.apply(Command::CancelOrder { account: renter, order });
    assert_eq!(rejection(&m.place(cancelled.clone())), Some(RejectCode::DuplicateClientOrderId), "cancelled, resent: refused");
    m.advance(24 * 3_600_000 - 1);
    assert_eq!(rejection(&m.place(cancelled.clone())), Some(RejectCode::DuplicateClientOrderId), "a day less 1 ms later: still taken");
    m.advance(1);
    assert!(accepted(&m.place(cancelled)).is_some(), "a day later the id is free again");
    assert!(accepted(&m.place(filled)).is_some());
}

/// Issue 41: one unfunded supplier registered 20 000 fake GPUs in seconds,
/// filling the exchange's GPU table for everyone. A supplier holds at most
/// one host's worth of GPUs that never answered a hardware challenge; more
/// register as those prove themselves, and another supplier is not held up.
#[test]
fn a_supplier_registers_past_one_hosts_worth_only_as_its_gpus_pass_their_challenges() {
    let mut m = Market::new();
    let faker = m.supplier();
    let unproven = limits::GPUS_UNPROVEN_PER_ACCOUNT_MAX;
    m.h100_host(faker, "fake-0", unproven);
    let register = |m: &mut Market, account, host: &str, uuid: &str| m.apply(Command::register(account, host, uuid, h100_spec()));
    assert_eq!(rejection(&register(&mut m, faker, "fake-1", "GPU-fake-1-0")), Some(RejectCode::GpusAwaitingChallenge));
    // A wrong answer proves nothing: the GPU still holds its place.
    m.apply(Command::RecordChallenge { gpu: GpuId(0), answer: ChallengeAnswer::Wrong });
    assert_eq!(rejection(&register(&mut m, faker, "fake-1", "GPU-fake-1-0")), Some(RejectCode::GpusAwaitingChallenge));
    // Nor does none.
    m.apply(Command::RecordChallenge { gpu: GpuId(1), answer: ChallengeAnswer::Unanswered });
    assert_eq!(rejection(&register(&mut m, faker, "fake-1", "GPU-fake-1-0")), Some(RejectCode::GpusAwaitingChallenge));
    // Another supplier registers a whole host meanwhile.
    let honest = m.supplier();
    m.h100_host(honest, "honest-0", unproven);
    // A correct answer (fast enough or not) frees one place, once.
    for _ in 0..2 {
        m.apply(Command::RecordChallenge { gpu: GpuId(2), answer: ChallengeAnswer::Correct { n: 256, elapsed_ms: 1_000_000 } });
    }
    assert!(rejection(&register(&mut m, faker, "fake-1", "GPU-fake-1-0")).is_none());
    assert_eq!(rejection(&register(&mut m, faker, "fake-1", "GPU-fake-1-1")), Some(RejectCode::GpusAwaitingChallenge));
    // The state hash covers the counts: a replay reaches the same.
    let mut replay = Engine::new(EngineConfig::demo()).expect("config");
    for input in &m.inputs {
        replay.apply(input);
    }
    assert_eq!(replay.state_hash(), m.engine.state_hash());
}

/// The share of the exchange's GPU table one supplier may hold, proven or not.
#[test]
fn a_supplier_holds_at_most_its_share_of_the_gpu_table() {
    let mut m = Market::new();
    let supplier = m.supplier();
    let per_host = limits::GPUS_PER_HOST_MAX;
    let mut gpu = 0u32;
    for host in 0..limits::GPUS_PER_ACCOUNT_MAX / per_host {
        m.h100_host(supplier, &format!("h{host}"), per_host);
        for _ in 0..per_host {
            m.apply(Command::RecordChallenge { gpu: GpuId(gpu), answer: ChallengeAnswer::Correct { n: 256, elapsed_ms: 10 } });
            gpu += 1;
        }
    }
    let events = m.apply(Command::register(supplier, "last", "GPU-last", h100_spec()));
    assert_eq!(rejection(&events), Some(RejectCode::TooManyGpus));
    let other = m.supplier();
    m.h100_host(other, "other", 1);
}
