//! Billing in the engine (docs/market-rules.md, "Billing", "Escrow", "SLA
//! credits", "Payouts"): usage pays the supplier less the fee, open-ended
//! leases top their escrow up or end after notice, billing closes after the
//! grace period with an SLA credit when availability fell short, reserved
//! windows ended early are paid whole, and payouts and debt.

mod common;

use common::*;
use gpux_engine::*;

const GRACE: u64 = 10 * 60_000;
const FEE_BPS: u64 = 250;

fn market(renter_deposit: u64) -> (Market, AccountId, HostId, AccountId) {
    let mut market = Market::new();
    let supplier = market.supplier();
    let host = market.h100_host(supplier, "host-a", 2);
    let renter = market.renter(renter_deposit);
    (market, supplier, host, renter)
}

fn balances(m: &Market, account: AccountId) -> Balances {
    m.engine.balances(account).expect("account")
}

fn spot_lease(m: &mut Market, supplier: AccountId, host: HostId, renter: AccountId, duration: LeaseDuration) -> LeaseId {
    m.ask(supplier, host, 0b1, H100_SPOT, USD_2);
    let mut bid = m.order(renter, H100_SPOT, Side::Buy, USD_2, 1);
    bid.duration = duration;
    leases(&m.place(bid))[0].0
}

fn settle(m: &mut Market, lease: LeaseId, verified_gpu_ms: u64) -> Vec<Event> {
    let amount_minor = USD_2 * verified_gpu_ms / HOUR;
    m.apply(Command::SettleUsage { lease, amount_minor, verified_gpu_ms })
}

fn find<T>(events: &[Event], pick: impl Fn(&EventKind) -> Option<T>) -> Option<T> {
    events.iter().find_map(|e| pick(&e.kind))
}

#[test]
fn usage_pays_the_supplier_less_the_fee_and_a_payout_sends_it_out() {
    let (mut m, supplier, host, renter) = market(10_000_000_000);
    let lease = spot_lease(&mut m, supplier, host, renter, LeaseDuration::Hours(1));
    settle(&mut m, lease, HOUR / 2);
    let fee = 1_000_000 * FEE_BPS / 10_000;
    assert_eq!(balances(&m, supplier).payable_minor, 1_000_000 - fee);
    assert_eq!(balances(&m, renter).held_minor, USD_2 - 1_000_000, "the charge came out of escrow");

    let events = m.apply(Command::Payout { account: supplier, amount_minor: 1_000_000 - fee });
    assert_eq!(find(&events, |k| matches!(k, EventKind::PayoutSent { .. }).then_some(())), Some(()));
    assert_eq!(balances(&m, supplier).payable_minor, 0);
}

#[test]
fn usage_nothing_covers_is_the_renters_debt_repaid_from_its_next_deposit() {
    let (mut m, supplier, host, renter) = market(USD_2);
    let lease = spot_lease(&mut m, supplier, host, renter, LeaseDuration::Hours(1));
    settle(&mut m, lease, HOUR);
    let events = m.apply(Command::SettleUsage { lease, amount_minor: 500_000, verified_gpu_ms: 0 });
    assert_eq!(
        find(&events, |k| match k {
            EventKind::UsageUnpaid { amount_minor, .. } => Some(*amount_minor),
            _ => None,
        }),
        Some(500_000)
    );
    assert_eq!(balances(&m, renter), Balances { available_minor: 0, held_minor: 0, payable_minor: 0, debt_minor: 500_000 });
    assert_eq!(balances(&m, supplier).payable_minor, (USD_2 + 500_000) * (10_000 - FEE_BPS) / 10_000, "the supplier is paid regardless");

    m.apply(Command::Deposit { account: renter, amount_minor: 800_000 });
    assert_eq!(balances(&m, renter), Balances { available_minor: 300_000, held_minor: 0, payable_minor: 0, debt_minor: 0 });
}

#[test]
fn an_open_ended_lease_tops_its_escrow_up_every_half_horizon() {
    let (mut m, supplier, host, renter) = market(10_000_000_000);
    let lease = spot_lease(&mut m, supplier, host, renter, LeaseDuration::UntilCancelled);
    assert_eq!(balances(&m, renter).held_minor, USD_2, "one prepaid hour");
    m.now_ms += HOUR / 2 - 1;
    settle(&mut m, lease, HOUR / 2);
    assert_eq!(balances(&m, renter).held_minor, USD_2 / 2);
    m.advance(1);
    assert_eq!(balances(&m, renter).held_minor, USD_2, "topped back up to the horizon");
    assert!(m.engine.lease(lease).expect("lease").active);
}

#[test]
fn a_renter_who_cannot_fund_the_top_up_gets_notice_and_the_lease_ends_at_the_next_check() {
    let (mut m, supplier, host, renter) = market(USD_2);
    let lease = spot_lease(&mut m, supplier, host, renter, LeaseDuration::UntilCancelled);
    m.now_ms += HOUR / 2 - 1;
    settle(&mut m, lease, HOUR / 2);
    let events = m.advance(1);
    let notice = find(&events, |k| match k {
        EventKind::PaymentNotice { lease: l, ends_at_ms, shortfall_minor, .. } if *l == lease => Some((*ends_at_ms, *shortfall_minor)),
        _ => None,
    });
    assert_eq!(notice, Some((T0 + HOUR, USD_2 / 2)));

    let events = m.advance(HOUR / 2);
    assert!(events.iter().any(|e| e.kind == EventKind::LeaseEnded { lease, reason: LeaseEndReason::Unfunded }));
}

/// Found by the simulator: with reports lagging an hour, the escrow looked
/// full at every check while the renter ran on. The escrow must also cover
/// time used but not yet billed, so a renter with no more funds is ended when
/// the prepaid hour is used up, however late the reports come, and owes nothing.
#[test]
fn lagging_reports_do_not_let_an_unfunded_renter_run_past_its_escrow() {
    let (mut m, supplier, host, renter) = market(USD_2);
    let lease = spot_lease(&mut m, supplier, host, renter, LeaseDuration::UntilCancelled);
    let events = m.advance(HOUR / 2);
    let notice = find(&events, |k| match k {
        EventKind::PaymentNotice { lease: l, shortfall_minor, .. } if *l == lease => Some(*shortfall_minor),
        _ => None,
    });
    assert_eq!(notice, Some(USD_2 / 2), "half an hour used and unbilled: the escrow covers only the half hour ahead");
    let events = m.advance(HOUR / 2);
    assert!(events.iter().any(|e| e.kind == EventKind::LeaseEnded { lease, reason: LeaseEndReason::Unfunded }));
    settle(&mut m, lease, HOUR);
    assert_eq!(balances(&m, renter).debt_minor, 0, "the hour used was the hour prepaid");
}

#[test]
fn a_deposit_before_the_deadline_keeps_the_lease_running() {
    let (mut m, supplier, host, renter) = market(USD_2);
    let lease = spot_lease(&mut m, supplier, host, renter, LeaseDuration::UntilCancelled);
    m.now_ms += HOUR / 2 - 1;
    settle(&mut m, lease, HOUR / 2);
    m.advance(1);
    m.apply(Command::Deposit { account: renter, amount_minor: 10 * USD_2 });
    let events = m.advance(HOUR / 2);
    assert!(!events.iter().any(|e| matches!(e.kind, EventKind::LeaseEnded { .. })));
    assert!(m.engine.lease(lease).expect("lease").active);
}

#[test]
fn billing_closes_after_the_grace_period_and_releases_what_escrow_is_left() {
    let (mut m, supplier, host, renter) = market(10_000_000_000);
    let lease = spot_lease(&mut m, supplier, host, renter, LeaseDuration::Hours(1));
    m.advance(HOUR);
    let late = settle(&mut m, lease, HOUR);
    assert!(rejection(&late).is_none(), "a report arriving after the end is billed within the grace");
    let events = m.advance(GRACE);
    let closed = find(&events, |k| match k {
        EventKind::LeaseBillingClosed { lease: l, availability_bps, usage_charged_minor, .. } if *l == lease => {
            Some((*availability_bps, *usage_charged_minor))
        }
        _ => None,
    });
    assert_eq!(closed, Some((10_000, USD_2)));
    assert_eq!(balances(&m, renter), Balances { available_minor: 10_000_000_000 - USD_2, held_minor: 0, payable_minor: 0, debt_minor: 0 });
    assert_eq!(rejection(&settle(&mut m, lease, 1_000)), Some(RejectCode::LeaseBillingClosed));
}

fn credit_for(verified_gpu_ms: u64) -> Option<u64> {
    let (mut m, supplier, host, renter) = market(10_000_000_000);
    let lease = spot_lease(&mut m, supplier, host, renter, LeaseDuration::Hours(1));
    m.advance(HOUR);
    settle(&mut m, lease, verified_gpu_ms);
    let events = m.advance(GRACE);
    find(&events, |k| match k {
        EventKind::SlaCredited { amount_minor, renter: r, supplier: s, .. } if *r == renter && *s == supplier => Some(*amount_minor),
        _ => None,
    })
}

#[test]
fn sla_credits_follow_the_availability_tiers_of_the_rulebook() {
    let charge = |ms: u64| USD_2 * ms / HOUR;
    assert_eq!(credit_for(HOUR), None, "100% delivered");
    assert_eq!(credit_for(HOUR * 99 / 100), None, "exactly the 99% SLA");
    assert_eq!(credit_for(HOUR * 98 / 100), Some(charge(HOUR * 98 / 100) / 10), "below 99%: 10%");
    assert_eq!(credit_for(HOUR * 94 / 100), Some(charge(HOUR * 94 / 100) / 4), "below 95%: 25%");
    assert_eq!(credit_for(HOUR / 2), Some(charge(HOUR / 2) / 2), "below 90%: 50%");
}

#[test]
fn the_supplier_pays_the_sla_credit_from_earnings_then_funds_then_as_debt() {
    let (mut m, supplier, host, renter) = market(10_000_000_000);
    let lease = spot_lease(&mut m, supplier, host, renter, LeaseDuration::Hours(1));
    m.advance(HOUR);
    settle(&mut m, lease, HOUR / 2);
    let earned = balances(&m, supplier).payable_minor;
    m.apply(Command::Payout { account: supplier, amount_minor: earned - 100_000 });
    m.apply(Command::Deposit { account: supplier, amount_minor: 200_000 });
    let events = m.advance(GRACE);
    let credit = find(&events, |k| match k {
        EventKind::SlaCredited { amount_minor, from_payable, from_available, from_debt, .. } => {
            Some((*amount_minor, *from_payable, *from_available, *from_debt))
        }
        _ => None,
    });
    assert_eq!(credit, Some((500_000, 100_000, 200_000, 200_000)));
    assert_eq!(balances(&m, supplier), Balances { available_minor: 0, held_minor: 0, payable_minor: 0, debt_minor: 200_000 });
    assert_eq!(balances(&m, renter).available_minor, 10_000_000_000 - 1_000_000 + 500_000);
}

#[test]
fn preemptible_leases_carry_no_sla() {
    let (mut m, supplier, host, renter) = market(10_000_000_000);
    m.ask(supplier, host, 0b1, H100_PREEMPT, 800_000);
    let lease = leases(&m.buy(renter, H100_PREEMPT, 800_000, 1))[0].0;
    m.advance(HOUR);
    m.apply(Command::SettleUsage { lease, amount_minor: 100_000, verified_gpu_ms: HOUR / 8 });
    let events = m.advance(GRACE);
    assert!(!events.iter().any(|e| matches!(e.kind, EventKind::SlaCredited { .. })));
    assert!(events.iter().any(|e| matches!(e.kind, EventKind::LeaseBillingClosed { availability_bps: 1_250, .. })));
}

fn reserved_lease(m: &mut Market, supplier: AccountId, host: HostId, renter: AccountId) -> LeaseId {
    let window = m.window("H100-SXM-80G/R/2026-12-02T18/1H");
    let mut ask = m.order(supplier, window, Side::Sell, USD_2, 1);
    ask.supply = Some(GpuSet { host, gpu_mask: 0b1 });
    m.place(ask);
    m.buy(renter, window, USD_2, 1);
    let events = m.advance(3 * HOUR - 60_000);
    leases(&events)[0].0
}

#[test]
fn a_renter_ending_a_reserved_window_early_pays_the_rest_of_the_window() {
    let (mut m, supplier, host, renter) = market(10_000_000_000);
    let lease = reserved_lease(&mut m, supplier, host, renter);
    m.now_ms += HOUR / 4;
    settle(&mut m, lease, HOUR / 4);
    let events = m.apply(Command::EndLease { account: renter, lease });
    let rest = find(&events, |k| match k {
        EventKind::FundsCharged { amount_minor, reason: HoldReason::Lease(l), .. } if *l == lease => Some(*amount_minor),
        _ => None,
    });
    assert_eq!(rest, Some(USD_2 * 3 / 4));
    m.advance(GRACE);
    assert_eq!(balances(&m, renter).available_minor, 10_000_000_000 - USD_2, "the whole window is paid");
    assert_eq!(balances(&m, supplier).payable_minor, USD_2 * (10_000 - FEE_BPS) / 10_000);
}

#[test]
fn ending_a_reserved_window_whose_gpu_is_down_costs_only_what_was_delivered() {
    let (mut m, supplier, host, renter) = market(10_000_000_000);
    let lease = reserved_lease(&mut m, supplier, host, renter);
    m.now_ms += HOUR / 4;
    settle(&mut m, lease, HOUR / 4);
    let gpu = m.engine.host_gpu(host, 0).expect("gpu");
    m.apply(Command::SetGpuOnline { account: supplier, gpu, online: false });
    m.apply(Command::EndLease { account: renter, lease });
    m.advance(GRACE);
    assert_eq!(balances(&m, renter).available_minor, 10_000_000_000 - USD_2 / 4, "only the delivered quarter is paid");
}

#[test]
fn a_fee_change_applies_to_charges_from_then_on() {
    let (mut m, supplier, host, renter) = market(10_000_000_000);
    let lease = spot_lease(&mut m, supplier, host, renter, LeaseDuration::Hours(1));
    m.apply(Command::SetFee { fee_bps: 0 });
    settle(&mut m, lease, HOUR / 2);
    assert_eq!(balances(&m, supplier).payable_minor, 1_000_000);
}

#[test]
fn a_payout_repays_the_suppliers_debt_first() {
    let (mut m, supplier, host, renter) = market(10_000_000_000);
    let lease = spot_lease(&mut m, supplier, host, renter, LeaseDuration::Hours(1));
    m.advance(HOUR);
    settle(&mut m, lease, HOUR / 2);
    let earned = balances(&m, supplier).payable_minor;
    m.apply(Command::Payout { account: supplier, amount_minor: earned });
    m.advance(GRACE); // 50% credit of 1_000_000, all as debt
    assert_eq!(balances(&m, supplier).debt_minor, 500_000);

    let lease = spot_lease(&mut m, supplier, host, renter, LeaseDuration::Hours(1));
    settle(&mut m, lease, HOUR);
    let payable = balances(&m, supplier).payable_minor;
    assert_eq!(rejection(&m.apply(Command::Payout { account: supplier, amount_minor: payable })), Some(RejectCode::InsufficientFunds));
    let events = m.apply(Command::Payout { account: supplier, amount_minor: payable - 500_000 });
    assert!(events.iter().any(|e| e.kind == EventKind::DebtRepaid { account: supplier, amount_minor: 500_000, from_payable: true }));
    assert_eq!(balances(&m, supplier), Balances::default());
}

/// A lease whose bill is final leaves the engine when archived: `lease`
/// and `leases_of` no longer see it, commands about it are refused
/// `unknown_lease`, its spent timers fire as nothing, and two engines that
/// archive at the same points stay equal. Leases still billing stay.
#[test]
fn an_archived_lease_leaves_the_engine_and_nothing_else_changes() {
    let (mut m, supplier, host, renter) = market(100_000_000);
    let done = spot_lease(&mut m, supplier, host, renter, LeaseDuration::Hours(1));
    let running = {
        m.ask(supplier, host, 0b10, H100_SPOT, USD_2);
        let mut bid = m.order(renter, H100_SPOT, Side::Buy, USD_2, 1);
        bid.duration = LeaseDuration::UntilCancelled;
        leases(&m.place(bid))[0].0
    };
    m.advance(HOUR + GRACE + 1);
    let closed = m.engine.lease(done).expect("still held");
    assert!(closed.billing_closed && !m.engine.lease(running).expect("running").billing_closed);
    assert!(m.engine.archive_leases(m.now_ms - HOUR).is_empty(), "closed too recently");
    let mut twin = m.engine.clone();
    let archived = m.engine.archive_leases(m.now_ms);
    assert_eq!(archived, vec![closed], "the closed lease, as it was");
    assert_eq!(twin.archive_leases(m.now_ms), archived);
    assert_eq!(m.engine.lease(done), None);
    assert_eq!(m.engine.leases_held(), 1);
    assert_eq!(m.engine.leases_of(renter, None, 10).0.iter().map(|l| l.lease).collect::<Vec<_>>(), vec![running]);
    assert_eq!(rejection(&m.apply(Command::EndLease { account: renter, lease: done })), Some(RejectCode::UnknownLease));
    let settle = Command::SettleUsage { lease: done, amount_minor: 1, verified_gpu_ms: 1 };
    assert_eq!(rejection(&m.apply(settle)), Some(RejectCode::UnknownLease));
    twin.apply(&Input { at_ms: m.now_ms, command: Command::EndLease { account: renter, lease: done } });
    twin.apply(&Input { at_ms: m.now_ms, command: Command::SettleUsage { lease: done, amount_minor: 1, verified_gpu_ms: 1 } });
    // Days later: the running lease's top-ups go on; nothing else stirs.
    m.advance(24 * HOUR);
    twin.apply(&Input { at_ms: m.now_ms, command: Command::Tick });
    assert!(m.engine.lease(running).expect("running").active);
    assert_eq!(m.engine.state_hash(), twin.state_hash(), "archiving is deterministic");
    let restored: Engine = serde_json::from_str(&serde_json::to_string(&m.engine).expect("encodes")).expect("decodes");
    assert_eq!(restored.state_hash(), m.engine.state_hash(), "a snapshot keeps the archive's holes");
}

/// Settles usage as the market does for an accepted report: its covered
/// time noted first, then the charge.
fn report(m: &mut Market, lease: LeaseId, covered_gpu_ms: u64, verified_gpu_ms: u64) -> Vec<Event> {
    m.engine.note_reported(lease, covered_gpu_ms);
    settle(m, lease, verified_gpu_ms)
}

fn provisional(events: &[Event]) -> Option<(u64, u64, u64, u64)> {
    find(events, |k| match k {
        EventKind::LeaseBillProvisional { unreported_gpu_ms, released_minor, kept_minor, final_at_ms, .. } => {
            Some((*unreported_gpu_ms, *released_minor, *kept_minor, *final_at_ms))
        }
        _ => None,
    })
}

fn billing_closed(events: &[Event]) -> Option<(u64, u32)> {
    find(events, |k| match k {
        EventKind::LeaseBillingClosed { usage_charged_minor, availability_bps, .. } => Some((*usage_charged_minor, *availability_bps)),
        _ => None,
    })
}

const WINDOW: u64 = 24 * HOUR;

#[test]
fn reports_missing_at_the_grace_make_the_bill_provisional_and_late_ones_are_billed_until_it_is_final() {
    let (mut m, supplier, host, renter) = market(10_000_000_000);
    m.apply(Command::SetLateReportWindow { window_ms: WINDOW });
    let lease = spot_lease(&mut m, supplier, host, renter, LeaseDuration::Hours(2));
    // Its first hour reported; the second's reports wait on a host that is down.
    report(&mut m, lease, HOUR, HOUR);
    m.advance(2 * HOUR);
    let events = m.advance(GRACE);
    let ended_at = 2 * HOUR;
    assert_eq!(billing_closed(&events), None, "not final: an hour of reports is missing");
    let at_grace = m.engine.now_ms();
    // Escrow was two hours (US$4); one hour charged; the missing hour's
    // worth (US$2) stays held, nothing else was left to release.
    assert_eq!(provisional(&events), Some((HOUR, 0, USD_2, at_grace + WINDOW)));
    assert_eq!(balances(&m, renter).held_minor, USD_2);
    assert!(at_grace >= ended_at);

    // The late report, 6 hours on, is billed from what was kept; the bill
    // is then complete, so it is final at once with full availability.
    m.advance(6 * HOUR);
    let events = report(&mut m, lease, HOUR, HOUR);
    assert!(rejection(&events).is_none(), "a late report within the window is billed: {events:?}");
    assert_eq!(billing_closed(&events), Some((2 * USD_2, 10_000)));
    assert_eq!(
        balances(&m, renter),
        Balances { available_minor: 10_000_000_000 - 2 * USD_2, held_minor: 0, payable_minor: 0, debt_minor: 0 }
    );
    let fee = 2 * USD_2 * FEE_BPS / 10_000;
    assert_eq!(balances(&m, supplier).payable_minor, 2 * USD_2 - fee, "the supplier is paid for both hours");
    assert_eq!(rejection(&settle(&mut m, lease, 1_000)), Some(RejectCode::LeaseBillingClosed));
}

#[test]
fn a_provisional_bill_is_final_at_the_end_of_the_window_and_releases_what_it_kept() {
    let (mut m, supplier, host, renter) = market(10_000_000_000);
    m.apply(Command::SetLateReportWindow { window_ms: WINDOW });
    let lease = spot_lease(&mut m, supplier, host, renter, LeaseDuration::Hours(3));
    report(&mut m, lease, HOUR, HOUR);
    m.advance(3 * HOUR + GRACE);
    // Two hours missing: US$4 of the US$4 left in escrow kept; none released.
    assert_eq!(balances(&m, renter).held_minor, 2 * USD_2);
    // Half an hour of it comes in late; the rest never does.
    m.advance(HOUR);
    let events = report(&mut m, lease, HOUR / 2, HOUR / 2);
    assert_eq!(billing_closed(&events), None, "still missing an hour and a half");
    let events = m.advance(WINDOW);
    let (charged, availability) = billing_closed(&events).expect("final at the window's end");
    assert_eq!(charged, USD_2 + USD_2 / 2);
    assert_eq!(availability, 5_000, "the SLA is settled on what was verified by the final bill");
    assert_eq!(balances(&m, renter).held_minor, 0, "what was kept and not charged went back");
    assert_eq!(
        rejection(&report(&mut m, lease, HOUR, HOUR)),
        Some(RejectCode::LeaseBillingClosed),
        "after the window, reports are refused"
    );
}

#[test]
fn a_lease_whose_reports_all_arrived_is_final_at_the_grace_and_without_a_window_every_bill_is() {
    for window_ms in [WINDOW, 0] {
        let (mut m, supplier, host, renter) = market(10_000_000_000);
        m.apply(Command::SetLateReportWindow { window_ms });
        let lease = spot_lease(&mut m, supplier, host, renter, LeaseDuration::Hours(1));
        // Reports stop 0.8 s short of the end: within the allowance.
        let covered = HOUR - 800;
        report(&mut m, lease, if window_ms > 0 { covered } else { HOUR / 2 }, covered);
        let events = m.advance(HOUR + GRACE);
        assert_eq!(provisional(&events), None, "window {window_ms}");
        assert!(billing_closed(&events).is_some(), "window {window_ms}: final at the grace");
        assert_eq!(balances(&m, renter).held_minor, 0);
    }
}

#[test]
fn an_open_ended_lease_keeps_what_its_missing_time_is_worth_and_releases_the_rest_of_its_escrow() {
    let (mut m, supplier, host, renter) = market(10_000_000_000);
    m.apply(Command::SetLateReportWindow { window_ms: WINDOW });
    let lease = spot_lease(&mut m, supplier, host, renter, LeaseDuration::UntilCancelled);
    m.advance(3 * HOUR);
    m.apply(Command::EndLease { account: renter, lease });
    let escrow = balances(&m, renter).held_minor;
    let events = m.advance(GRACE);
    let (unreported, released, kept, _) = provisional(&events).expect("provisional: nothing reported");
    assert_eq!((unreported, kept, released), (3 * HOUR, 3 * USD_2, escrow - 3 * USD_2));
    let available = balances(&m, renter).available_minor;
    let events = report(&mut m, lease, 3 * HOUR, 3 * HOUR - 60_000);
    let charged = USD_2 * (3 * HOUR - 60_000) / HOUR;
    assert_eq!(billing_closed(&events).map(|c| c.0), Some(charged));
    assert_eq!(balances(&m, renter).available_minor, available + 3 * USD_2 - charged, "what was kept and not charged went back");
    assert_eq!(balances(&m, renter).held_minor, 0);
}

#[test]
fn a_late_report_window_above_a_week_is_refused() {
    let (mut m, ..) = market(0);
    let events = m.apply(Command::SetLateReportWindow { window_ms: limits::LATE_REPORT_WINDOW_MS_MAX + 1 });
    assert_eq!(rejection(&events), Some(RejectCode::LateReportWindowInvalid));
    assert!(rejection(&m.apply(Command::SetLateReportWindow { window_ms: limits::LATE_REPORT_WINDOW_MS_MAX })).is_none());
}
