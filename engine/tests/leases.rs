//! Leases and reserved windows (docs/market-rules.md, "Leases" and "Reserved
//! windows"): what a match creates, preemption with notice, lease ends, and
//! the life of a window from listing to delivery and expiry.

mod common;

use common::*;
use gpux_engine::*;

fn market() -> (Market, AccountId, HostId, AccountId) {
    let mut market = Market::new();
    let supplier = market.supplier();
    let host = market.h100_host(supplier, "host-a", 2);
    let renter = market.renter(10_000_000_000);
    (market, supplier, host, renter)
}

fn events_of(events: &[Event], lease: LeaseId) -> impl Iterator<Item = &EventKind> {
    events.iter().map(|e| &e.kind).filter(move |kind| match kind {
        EventKind::PreemptionNotice { lease: l, .. } | EventKind::LeaseEnded { lease: l, .. } => *l == lease,
        _ => false,
    })
}

#[test]
fn a_spot_lease_runs_for_its_hours_then_frees_the_gpu() {
    let (mut m, supplier, host, renter) = market();
    m.ask(supplier, host, 0b1, H100_SPOT, USD_2);
    let (_, events) = m.bid(renter, H100_SPOT, USD_2, 1);
    let (lease, kind, mask, start, end) = leases(&events)[0];
    assert_eq!((kind, mask, start, end), (LeaseKind::Spot, 0b1, T0, Some(T0 + HOUR)));
    let gpu = m.engine.host_gpu(host, 0).expect("gpu");
    assert_eq!(m.engine.gpu_leases(gpu), Some((Some(lease), None)));

    let events = m.advance(HOUR);
    assert_eq!(events_of(&events, lease).collect::<Vec<_>>(), [&EventKind::LeaseEnded { lease, reason: LeaseEndReason::DurationElapsed }]);
    assert_eq!(m.engine.gpu_leases(gpu), Some((None, None)));
    assert_eq!(m.engine.funds(renter), Some((10_000_000_000 - USD_2, USD_2)), "escrow covers late reports until billing closes");
    m.advance(EngineConfig::demo().billing_grace_ms);
    assert_eq!(m.engine.funds(renter), Some((10_000_000_000, 0)), "unsettled escrow is released when billing closes");
    m.ask(supplier, host, 0b1, H100_SPOT, USD_2);
}

#[test]
fn a_lease_of_ninety_minutes_holds_an_hour_and_a_half_and_ends_on_the_minute() {
    let (mut m, supplier, host, renter) = market();
    m.ask(supplier, host, 0b1, H100_SPOT, USD_2);
    let mut order = m.order(renter, H100_SPOT, Side::Buy, USD_2, 1);
    order.duration = LeaseDuration::Minutes(90);
    let events = m.place(order);
    let (lease, _, _, start, end) = leases(&events)[0];
    assert_eq!((start, end), (T0, Some(T0 + 90 * 60_000)));
    assert_eq!(m.engine.funds(renter), Some((10_000_000_000 - USD_2 * 3 / 2, USD_2 * 3 / 2)), "escrow: 1.5 h at the price");

    let events = m.advance(90 * 60_000);
    assert_eq!(events_of(&events, lease).collect::<Vec<_>>(), [&EventKind::LeaseEnded { lease, reason: LeaseEndReason::DurationElapsed }]);
}

#[test]
fn a_lease_length_in_minutes_is_one_minute_to_the_longest_lease() {
    let (mut m, _supplier, _host, renter) = market();
    for (minutes, accepted_) in
        [(0, false), (1, true), (limits::DURATION_HOURS_MAX * 60, true), (limits::DURATION_HOURS_MAX * 60 + 1, false)]
    {
        let mut order = m.order(renter, H100_SPOT, Side::Buy, USD_2, 1);
        order.duration = LeaseDuration::Minutes(minutes);
        let events = m.place(order);
        assert_eq!(rejection(&events).is_none(), accepted_, "{minutes} minutes");
        if accepted_ {
            m.apply(Command::MassCancel { account: renter, instrument: None });
        }
    }
}

#[test]
fn a_renter_may_end_a_lease_early_and_settled_usage_is_kept() {
    let (mut m, supplier, host, renter) = market();
    m.ask(supplier, host, 0b1, H100_SPOT, USD_2);
    let (_, events) = m.bid(renter, H100_SPOT, USD_2, 1);
    let lease = leases(&events)[0].0;
    m.now_ms += 30 * 60_000;
    m.apply(Command::SettleUsage { lease, amount_minor: 1_000_000, verified_gpu_ms: 30 * 60_000 });
    let events = m.apply(Command::EndLease { account: renter, lease });
    assert!(events.iter().any(|e| e.kind == EventKind::LeaseEnded { lease, reason: LeaseEndReason::EndedByRenter }));
    m.advance(EngineConfig::demo().billing_grace_ms);
    assert_eq!(m.engine.funds(renter), Some((10_000_000_000 - 1_000_000, 0)));
}

#[test]
fn a_spot_buyer_preempts_a_preemptible_lease_after_the_notice_period() {
    let (mut m, supplier, host, renter) = market();
    let spot_renter = m.renter(10_000_000_000);
    m.ask(supplier, host, 0b1, H100_PREEMPT, 800_000);
    m.ask(supplier, host, 0b1, H100_SPOT, USD_2);
    let mut preemptible = m.order(renter, H100_PREEMPT, Side::Buy, 800_000, 1);
    preemptible.duration = LeaseDuration::UntilCancelled;
    let events = m.place(preemptible);
    let (cheap_lease, kind, ..) = leases(&events)[0];
    assert_eq!(kind, LeaseKind::Preemptible);

    m.now_ms += 60_000;
    let (_, events) = m.bid(spot_renter, H100_SPOT, USD_2, 1);
    let notice_at = m.now_ms + 30_000;
    assert_eq!(
        events_of(&events, cheap_lease).collect::<Vec<_>>(),
        [&EventKind::PreemptionNotice { lease: cheap_lease, ends_at_ms: notice_at }]
    );
    let (spot_lease, _, _, start, _) = leases(&events)[0];
    assert_eq!(start, notice_at, "the spot lease starts when the notice ends");

    let events = m.advance(29_999);
    assert_eq!(events_of(&events, cheap_lease).count(), 0, "the notice period is honoured");
    let events = m.advance(1);
    assert_eq!(
        events_of(&events, cheap_lease).collect::<Vec<_>>(),
        [&EventKind::LeaseEnded { lease: cheap_lease, reason: LeaseEndReason::Preempted }]
    );
    let gpu = m.engine.host_gpu(host, 0).expect("gpu");
    assert_eq!(m.engine.gpu_leases(gpu), Some((Some(spot_lease), None)));
}

#[test]
fn a_gpu_leased_on_spot_leaves_its_preemptible_ask() {
    let (mut m, supplier, host, renter) = market();
    let preemptible_ask = m.ask(supplier, host, 0b11, H100_PREEMPT, 800_000);
    m.ask(supplier, host, 0b01, H100_SPOT, USD_2);
    let (_, events) = m.bid(renter, H100_SPOT, USD_2, 1);
    assert!(events.iter().any(|e| e.kind
        == EventKind::OrderReduced {
            order: preemptible_ask,
            account: supplier,
            quantity_left: 1,
            reason: ReduceReason::GpuLeasedElsewhere
        }));
    assert_eq!(m.engine.depth(H100_PREEMPT, Side::Sell), [(800_000, 1)]);
}

#[test]
fn a_gpu_going_offline_leaves_every_ask_that_offered_it() {
    let (mut m, supplier, host, _) = market();
    let ask = m.ask(supplier, host, 0b1, H100_SPOT, USD_2);
    let gpu = m.engine.host_gpu(host, 0).expect("gpu");
    let events = m.apply(Command::SetGpuOnline { account: supplier, gpu, online: false });
    assert_eq!(closed(&events, ask), Some(OrderCloseReason::SupplyGone));
    assert!(m.engine.depth(H100_SPOT, Side::Sell).is_empty());
    let mut again = m.order(supplier, H100_SPOT, Side::Sell, USD_2, 1);
    again.supply = Some(GpuSet { host, gpu_mask: 1 });
    assert_eq!(rejection(&m.place(again)), Some(RejectCode::InsufficientCapacity), "an offline GPU cannot be offered");
}

#[test]
fn windows_are_listed_hourly_and_daily_ahead_and_stop_trading_before_they_start() {
    let (mut m, supplier, host, renter) = market();
    let symbols: Vec<String> = m.engine.instruments().into_iter().map(|i| i.symbol).filter(|s| s.starts_with("H100-SXM-80G/R/")).collect();
    assert_eq!(symbols.first().map(String::as_str), Some("H100-SXM-80G/R/2026-12-02T16/1H"), "the next tradable hour");
    assert_eq!(symbols.iter().filter(|s| s.ends_with("/1H")).count(), 24);
    assert_eq!(symbols.iter().filter(|s| s.ends_with("/1D")).count(), 7);
    assert!(symbols.contains(&"H100-SXM-80G/R/2026-12-03T00/1D".to_string()));

    let window = m.window("H100-SXM-80G/R/2026-12-02T16/1H");
    let mut ask = m.order(supplier, window, Side::Sell, 3_000_000, 1);
    ask.supply = Some(GpuSet { host, gpu_mask: 1 });
    let ask = accepted(&m.place(ask)).expect("accepted");
    let bid = accepted(&m.buy(renter, window, 1_000_000, 1)).expect("accepted");
    let events = m.advance(44 * 60_000); // 15:45, 15 minutes before the window
    assert_eq!(closed(&events, ask), Some(OrderCloseReason::TradingStopped));
    assert_eq!(closed(&events, bid), Some(OrderCloseReason::TradingStopped));
    assert_eq!(m.engine.instrument(window).map(|i| i.state), Some(InstrumentState::Stopped));
    let later: Vec<String> = m.engine.instruments().into_iter().map(|i| i.symbol).filter(|s| s.ends_with("T16/1H")).collect();
    assert_eq!(later.len(), 3, "one 16:00 window per class with a calendar");
}

/// Long reservations: weekly windows (Monday to Monday) four weeks ahead
/// and monthly windows (UTC calendar months) six months ahead, sold whole
/// (the month's hours escrowed), resold before they start and delivered as
/// one lease for the month; the calendar rolls a month on at each month's start.
#[test]
fn a_monthly_window_is_sold_resold_and_delivered() {
    let (mut m, supplier, host, renter) = market();
    let symbols: Vec<String> = m.engine.instruments().into_iter().map(|i| i.symbol).filter(|s| s.starts_with("H100-SXM-80G/R/")).collect();
    let of = |label: &str| symbols.iter().filter(|s| s.ends_with(label)).cloned().collect::<Vec<_>>();
    assert_eq!(
        of("/1W"),
        ["2026-12-07T00", "2026-12-14T00", "2026-12-21T00", "2026-12-28T00"].map(|d| format!("H100-SXM-80G/R/{d}/1W")),
        "Mondays, four weeks ahead"
    );
    assert_eq!(
        of("/1M"),
        ["2027-01", "2027-02", "2027-03", "2027-04", "2027-05", "2027-06"].map(|d| format!("H100-SXM-80G/R/{d}-01T00/1M")),
        "the next six months"
    );
    let window = m.window("H100-SXM-80G/R/2027-01-01T00/1M");
    let (start, end) = match m.engine.instrument(window).map(|i| i.contract) {
        Some(ContractKind::Reserved { window_start_ms, window_end_ms }) => (window_start_ms, window_end_ms),
        other => panic!("not a window: {other:?}"),
    };
    assert_eq!((end - start) / HOUR, 31 * 24, "January's hours");

    let aggregator = m.open(Role::Aggregator);
    m.apply(Command::Deposit { account: aggregator, amount_minor: 10_000_000_000 });
    let mut ask = m.order(supplier, window, Side::Sell, USD_2, 1);
    ask.supply = Some(GpuSet { host, gpu_mask: 0b1 });
    m.place(ask);
    assert_eq!(trades(&m.buy(aggregator, window, USD_2, 1)), [(USD_2, 1)]);
    let month_value = USD_2 * 31 * 24;
    assert_eq!(m.engine.funds(aggregator), Some((10_000_000_000 - month_value, month_value)), "the whole month is prepaid");

    // The GPU is committed for January: a weekly window overlapping it cannot
    // be offered on it, an earlier one can.
    let overlapping = m.window("H100-SXM-80G/R/2026-12-28T00/1W");
    let mut ask = m.order(supplier, overlapping, Side::Sell, USD_2, 1);
    ask.supply = Some(GpuSet { host, gpu_mask: 0b1 });
    assert_eq!(rejection(&m.place(ask)), Some(RejectCode::InsufficientCapacity));
    let before = m.window("H100-SXM-80G/R/2026-12-21T00/1W");
    let mut ask = m.order(supplier, before, Side::Sell, USD_2, 1);
    ask.supply = Some(GpuSet { host, gpu_mask: 0b1 });
    accepted(&m.place(ask)).expect("the week before January is free");

    // Resold at a profit a week on.
    m.advance(7 * 24 * HOUR);
    let resale = m.order(aggregator, window, Side::Sell, 2_100_000, 1);
    accepted(&m.place(resale)).expect("a held month can be offered");
    assert_eq!(trades(&m.buy(renter, window, 2_100_000, 1)), [(2_100_000, 1)]);
    assert_eq!(m.engine.contracts_held(renter, window), 1);
    assert_eq!(m.engine.funds(aggregator), Some((10_000_000_000 + 100_000 * 31 * 24, 0)), "the aggregator keeps the spread");
    assert!(m.engine.instrument_by_symbol("H100-SXM-80G/R/2027-01-04T00/1W").is_some(), "weeks roll on");

    // Trading stops 15 minutes before the month, then it is delivered whole.
    m.advance(start - 15 * 60_000 - m.now_ms);
    assert_eq!(m.engine.instrument(window).map(|i| i.state), Some(InstrumentState::Stopped));
    let events = m.advance(15 * 60_000);
    let (lease, kind, mask, lease_start, lease_end) = leases(&events)[0];
    assert_eq!((kind, mask, lease_start, lease_end), (LeaseKind::Reserved, 0b1, start, Some(end)));
    assert_eq!(m.engine.lease(lease).map(|l| l.renter), Some(renter));
    assert!(m.engine.instrument_by_symbol("H100-SXM-80G/R/2027-07-01T00/1M").is_some(), "July lists on January 1st");

    let events = m.advance(end - m.now_ms);
    assert!(events.iter().any(|e| e.kind == EventKind::LeaseEnded { lease, reason: LeaseEndReason::WindowEnded }));
    assert_eq!(m.engine.instrument(window).map(|i| i.state), Some(InstrumentState::Expired));
}

/// The aggregator use case end to end: a supplier sells a window, an
/// aggregator buys it and resells it at a profit, the final holder gets a
/// lease on the concrete GPU when the window starts, and the window expires.
#[test]
fn a_reserved_window_is_sold_resold_and_delivered_as_a_lease() {
    let (mut m, supplier, host, renter) = market();
    let aggregator = m.open(Role::Aggregator);
    m.apply(Command::Deposit { account: aggregator, amount_minor: 1_000_000_000 });
    let window = m.window("H100-SXM-80G/R/2026-12-02T18/1H");

    let mut ask = m.order(supplier, window, Side::Sell, USD_2, 1);
    ask.supply = Some(GpuSet { host, gpu_mask: 0b1 });
    m.place(ask);
    let events = m.buy(aggregator, window, USD_2, 1);
    assert_eq!(trades(&events), [(USD_2, 1)]);
    assert_eq!(m.engine.contracts_held(aggregator, window), 1);
    assert_eq!(m.engine.funds(aggregator), Some((1_000_000_000 - USD_2, USD_2)), "the whole window is escrowed");

    // The GPU is committed 18:00-19:00: a 4 h spot lease from now would overlap it.
    m.ask(supplier, host, 0b1, H100_SPOT, USD_2);
    let mut long_spot = m.order(renter, H100_SPOT, Side::Buy, USD_2, 1);
    long_spot.duration = LeaseDuration::Hours(4);
    long_spot.time_in_force = TimeInForce::Ioc;
    assert!(trades(&m.place(long_spot)).is_empty());

    let resale = m.order(aggregator, window, Side::Sell, 2_600_000, 1);
    accepted(&m.place(resale)).expect("a held contract can be offered");
    let events = m.buy(renter, window, 2_600_000, 1);
    assert_eq!(trades(&events), [(2_600_000, 1)]);
    assert_eq!(m.engine.contracts_held(renter, window), 1);
    assert_eq!(m.engine.funds(aggregator), Some((1_000_000_000 + 600_000, 0)), "the aggregator keeps the spread");
    assert_eq!(m.engine.funds(renter), Some((10_000_000_000 - 2_600_000, USD_2)), "the supplier's price stays escrowed");

    let events = m.advance(3 * HOUR - 60_000); // 18:00
    let (lease, kind, mask, start, end) = leases(&events)[0];
    assert_eq!((kind, mask, start, end), (LeaseKind::Reserved, 0b1, T0 + 3 * HOUR - 60_000, Some(T0 + 4 * HOUR - 60_000)));
    assert_eq!(m.engine.lease(lease).map(|l| l.renter), Some(renter));

    let events = m.advance(HOUR);
    assert!(events.iter().any(|e| e.kind == EventKind::LeaseEnded { lease, reason: LeaseEndReason::WindowEnded }));
    assert!(events.iter().any(|e| e.kind == EventKind::InstrumentExpired { instrument: window }));
    assert_eq!(m.engine.instrument(window).map(|i| i.state), Some(InstrumentState::Expired));

    // Archived an hour later: the window keeps its listing, its contracts leave.
    let contracts = m.engine.contracts_held_total();
    assert!(m.engine.archive_windows(m.now_ms - HOUR).is_empty(), "expired too recently");
    let before = m.engine.state_hash();
    let mut twin = m.engine.clone();
    let archived = m.engine.archive_windows(m.now_ms);
    let expected = ContractInfo {
        contract: archived[0].contract,
        instrument: window,
        gpu: archived[0].gpu,
        holder: renter,
        supplier,
        price_minor_per_gpu_hour: USD_2,
        outcome: ContractOutcome::Delivered { lease },
    };
    assert_eq!(archived, vec![expected], "the window's one contract, last held by the renter, paid at the primary price");
    assert_eq!(twin.archive_windows(m.now_ms), archived);
    assert_ne!(m.engine.state_hash(), before);
    assert_eq!(m.engine.state_hash(), twin.state_hash());
    assert_eq!(m.engine.contracts_held_total(), contracts - 1);
    assert_eq!(m.engine.contracts_held(renter, window), 0);
    assert_eq!(m.engine.instrument(window).map(|i| i.state), Some(InstrumentState::Expired), "still listed");
    m.advance(2 * HOUR);
    twin.apply(&Input { at_ms: m.now_ms, command: Command::Tick });
    assert_eq!(m.engine.state_hash(), twin.state_hash(), "the calendar goes on the same");

    // A day on, the window retires whole, but only once its lease left;
    // older windows without leases retire before it, younger ones wait.
    m.advance(24 * HOUR);
    let window_end = |i: &InstrumentInfo| match i.contract {
        ContractKind::Reserved { window_end_ms, .. } => window_end_ms,
        _ => u64::MAX,
    };
    let ours = window_end(&m.engine.instrument(window).expect("held"));
    let older = m.engine.retire_windows(m.now_ms);
    assert!(!older.is_empty() && older.iter().all(|i| i.instrument != window && window_end(i) <= ours), "{older:?}");
    assert!(m.engine.instrument(window).is_some(), "its lease is still held");
    assert!(m.engine.lease(lease).expect("held").billing_closed);
    assert_eq!(m.engine.archive_leases(m.now_ms).iter().map(|l| l.lease).collect::<Vec<_>>(), vec![lease]);
    assert!(m.engine.retire_windows(m.now_ms - 30 * HOUR).is_empty(), "expired too recently for that cut");
    let held = m.engine.instruments_held();
    let listed = m.engine.instrument(window).expect("still held");
    let mut twin = m.engine.clone();
    let retired = m.engine.retire_windows(m.now_ms);
    assert_eq!(retired.first(), Some(&listed), "the oldest window first, as it was listed: {retired:?}");
    assert_eq!(twin.retire_windows(m.now_ms), retired);
    assert_eq!(m.engine.state_hash(), twin.state_hash(), "retiring is deterministic");
    assert_eq!(m.engine.instruments_held(), held - retired.len());
    assert_eq!(m.engine.instrument(window), None);
    assert!(m.engine.instruments().iter().all(|i| i.instrument != window));
    assert_eq!(m.engine.instrument_by_symbol("H100-SXM-80G/R/2026-12-02T18/1H"), None);
    let late_bid = m.order(renter, window, Side::Buy, USD_2, 1);
    assert_eq!(rejection(&m.place(late_bid)), Some(RejectCode::UnknownInstrument));
    let restored: Engine = serde_json::from_str(&serde_json::to_string(&m.engine).expect("encodes")).expect("decodes");
    assert_eq!(restored.state_hash(), m.engine.state_hash(), "a snapshot keeps the retired ids taken");
    assert_eq!(restored.instruments_listed_total(), m.engine.instruments_listed_total());
}

/// docs/agent.md's own set-up: one GPU in a spot ask and in the next hourly
/// window's ask. A one-hour spot bid overlapping that window fills (an
/// offered window does not hold the GPU back), and the window ask loses the
/// GPU; once a window is sold, spot leases overlapping it are refused.
#[test]
fn an_unsold_window_ask_gives_its_gpu_up_to_a_spot_lease_and_a_sold_one_does_not() {
    let (mut m, supplier, host, renter) = market();
    let window = m.window("H100-SXM-80G/R/2026-12-02T16/1H"); // 16:00, the lease runs 15:01-16:01
    let mut window_ask = m.order(supplier, window, Side::Sell, USD_2, 2);
    window_ask.supply = Some(GpuSet { host, gpu_mask: 0b11 });
    let window_ask = accepted(&m.place(window_ask)).expect("window ask");
    m.ask(supplier, host, 0b11, H100_SPOT, USD_2);

    let (_, events) = m.bid(renter, H100_SPOT, USD_2, 1);
    assert_eq!(trades(&events), [(USD_2, 1)], "the spot bid fills");
    let (_, _, leased, _, _) = leases(&events)[0];
    assert!(
        events.iter().any(|e| matches!(e.kind, EventKind::OrderReduced { order, quantity_left: 1, reason: ReduceReason::GpuLeasedElsewhere, .. } if order == window_ask)),
        "the window ask drops the leased GPU: {events:?}"
    );
    // The other GPU is sold in the window: a spot lease overlapping it is refused.
    let events = m.buy(renter, window, USD_2, 1);
    assert_eq!(trades(&events), [(USD_2, 1)]);
    let mut overlapping = m.order(renter, H100_SPOT, Side::Buy, USD_2, 1);
    overlapping.time_in_force = TimeInForce::Ioc;
    assert!(trades(&m.place(overlapping)).is_empty(), "the sold window holds GPU {:b} back", 0b11 & !leased);
}

#[test]
fn a_window_whose_gpu_is_offline_at_its_start_is_a_recorded_delivery_failure() {
    let (mut m, supplier, host, renter) = market();
    let window = m.window("H100-SXM-80G/R/2026-12-02T17/1H");
    let mut ask = m.order(supplier, window, Side::Sell, USD_2, 1);
    ask.supply = Some(GpuSet { host, gpu_mask: 0b1 });
    m.place(ask);
    m.buy(renter, window, USD_2, 1);
    let gpu = m.engine.host_gpu(host, 0).expect("gpu");
    m.now_ms += HOUR;
    m.apply(Command::SetGpuOnline { account: supplier, gpu, online: false });
    let events = m.advance(HOUR);
    assert!(events.iter().any(|e| matches!(e.kind, EventKind::DeliveryFailed { supplier: s, gpu: g, .. } if s == supplier && g == gpu)));
    assert!(leases(&events).is_empty());
    // The escrow comes back, and the SLA credit for 0% availability (50% of
    // the window's US$2.00 at the supplier's price), paid by the supplier:
    // it has no earnings or funds here, so it owes it.
    let credit = USD_2 / 2;
    let credited = events.iter().find_map(|e| match e.kind {
        EventKind::DeliveryCredited { holder, supplier: s, amount_minor, from_payable, from_available, from_debt, .. } => {
            Some((holder, s, amount_minor, from_payable, from_available, from_debt))
        }
        _ => None,
    });
    assert_eq!(credited, Some((renter, supplier, credit, 0, 0, credit)));
    assert_eq!(m.engine.funds(renter), Some((10_000_000_000 + credit, 0)), "escrow back plus the credit");
    assert_eq!(m.engine.balances(supplier).map(|b| b.debt_minor), Some(credit));
}

/// The renter of a leased GPU hears when its host takes the GPU offline
/// (unhealthy) and when it comes back; the lease goes on.
#[test]
fn the_renter_is_told_when_its_leased_gpu_goes_offline_and_back() {
    let (mut m, supplier, host, renter) = market();
    m.ask(supplier, host, 0b1, H100_SPOT, USD_2);
    let (_, events) = m.bid(renter, H100_SPOT, USD_2, 1);
    let (lease, _, _, _, _) = leases(&events)[0];
    let gpu = m.engine.host_gpu(host, 0).expect("gpu");
    let told = |events: &[Event]| {
        events
            .iter()
            .filter_map(|e| match e.kind {
                EventKind::LeasedGpuStatusChanged { lease, renter, gpu, online } => Some((lease, renter, gpu, online)),
                _ => None,
            })
            .collect::<Vec<_>>()
    };
    let offline = m.apply(Command::SetGpuOnline { account: supplier, gpu, online: false });
    assert_eq!(told(&offline), [(lease, renter, gpu, false)]);
    assert!(m.engine.lease(lease).expect("held").active, "the lease goes on");
    let back = m.apply(Command::SetGpuOnline { account: supplier, gpu, online: true });
    assert_eq!(told(&back), [(lease, renter, gpu, true)]);
    // A GPU without a lease: its owner hears, nobody else.
    let idle = m.engine.host_gpu(host, 1).expect("gpu");
    assert!(told(&m.apply(Command::SetGpuOnline { account: supplier, gpu: idle, online: false })).is_empty());
}

#[test]
fn a_preemptible_lease_is_preempted_with_notice_before_a_sold_window() {
    let (mut m, supplier, host, renter) = market();
    let holder = m.renter(10_000_000_000);
    let window = m.window("H100-SXM-80G/R/2026-12-02T17/1H");
    m.ask(supplier, host, 0b1, H100_PREEMPT, 800_000);
    let mut preemptible = m.order(renter, H100_PREEMPT, Side::Buy, 800_000, 1);
    preemptible.duration = LeaseDuration::UntilCancelled;
    let lease = leases(&m.place(preemptible))[0].0;

    let mut ask = m.order(supplier, window, Side::Sell, USD_2, 1);
    ask.supply = Some(GpuSet { host, gpu_mask: 0b1 });
    accepted(&m.place(ask)).expect("a window can be sold under a preemptible lease");
    m.buy(holder, window, USD_2, 1);

    let window_start = T0 + 2 * HOUR - 60_000;
    let events = m.advance(window_start - 30_000 - m.now_ms);
    assert_eq!(events_of(&events, lease).collect::<Vec<_>>(), [&EventKind::PreemptionNotice { lease, ends_at_ms: window_start }]);
    let events = m.advance(30_000);
    assert_eq!(events_of(&events, lease).collect::<Vec<_>>(), [&EventKind::LeaseEnded { lease, reason: LeaseEndReason::Preempted }]);
    assert_eq!(leases(&events).len(), 1, "the window is delivered on the freed GPU");
}

#[test]
fn a_mig_slice_is_offered_in_its_fractional_class_only() {
    let mut m = Market::new();
    let supplier = m.supplier();
    let events = m.apply(Command::Register {
        account: supplier,
        host: "mig-host".into(),
        gpu_uuid: "MIG-1".into(),
        spec: GpuSpec { memory_mib: 9_856, mig_profile: Some("1g.10gb".into()), ..h100_spec() },
        region: None,
        zone: String::new(),
        fabric: None,
    });
    let EventKind::GpuRegistered { host, classes_mask, .. } = events.last().expect("event").kind else { panic!("not registered") };
    assert_eq!(classes_mask, 1 << 4);
    let mig_spot = m.engine.instrument_by_symbol("H100-1g.10gb/SPOT").expect("listed");
    m.ask(supplier, host, 0b1, mig_spot, 300_000);
    let mut whole = m.order(supplier, H100_SPOT, Side::Sell, USD_2, 1);
    whole.supply = Some(GpuSet { host, gpu_mask: 1 });
    assert_eq!(rejection(&m.place(whole)), Some(RejectCode::InsufficientCapacity));
}
