//! Spend control (docs/market-rules.md "Spend control"): an account's own
//! daily, total and held limits refuse bids that would pass them, never the
//! usage of leases already running, and raise alerts as spending crosses
//! half, four fifths and all of a limit.

mod common;

use common::*;
use gpux_engine::*;

fn limits(m: &mut Market, account: AccountId, daily: Option<u64>, total: Option<u64>, held: Option<u64>) -> Vec<Event> {
    m.apply(Command::SetSpendLimits { account, limits: SpendLimits { daily_minor: daily, total_minor: total, max_held_minor: held } })
}

fn alerts(events: &[Event]) -> Vec<(bool, u32)> {
    events
        .iter()
        .filter_map(|e| match e.kind {
            EventKind::SpendAlert { daily, threshold_bps, .. } => Some((daily, threshold_bps)),
            _ => None,
        })
        .collect()
}

/// A renter with a 1-GPU, 4-hour lease at $2 ($8 held), on a supplier with more GPUs on offer.
fn leased() -> (Market, AccountId, LeaseId) {
    let mut m = Market::new();
    let supplier = m.supplier();
    let host = m.h100_host(supplier, "host-a", 4);
    m.ask(supplier, host, 0b1111, H100_SPOT, USD_2);
    let renter = m.renter(100_000_000);
    let mut bid = m.order(renter, H100_SPOT, Side::Buy, USD_2, 1);
    bid.duration = LeaseDuration::Hours(4);
    let lease = leases(&m.place(bid))[0].0;
    (m, renter, lease)
}

#[test]
fn a_bid_past_the_held_the_daily_or_the_total_limit_is_refused() {
    let (mut m, renter, _) = leased();
    // $8 held already; a bid for 1 GPU-hour at $1 (under the $2 ask: it rests) holds $1 more.
    for (daily, total, held, refused) in [
        (None, None, Some(8_999_999), true),
        (None, None, Some(9_000_000), false),
        (Some(8_999_999), None, None, true),
        (None, Some(8_999_999), None, true),
        (Some(9_000_000), Some(9_000_000), Some(9_000_000), false),
    ] {
        limits(&mut m, renter, daily, total, held);
        let order = m.order(renter, H100_SPOT, Side::Buy, 1_000_000, 1);
        let events = m.place(order);
        assert_eq!(rejection(&events) == Some(RejectCode::SpendLimit), refused, "limits {daily:?} {total:?} {held:?}");
        if let Some(order) = accepted(&events) {
            m.apply(Command::CancelOrder { account: renter, order });
        }
    }
    limits(&mut m, renter, None, None, None);
    assert!(m.engine.spend_status(renter).is_none(), "no limits: nothing kept");
}

#[test]
fn usage_of_a_running_lease_is_never_refused_and_raises_alerts_once_per_threshold() {
    let (mut m, renter, lease) = leased();
    limits(&mut m, renter, Some(10_000_000), Some(40_000_000), None);
    let mut seen = Vec::new();
    // $1 charges: the daily limit is $10.
    for _ in 0..10 {
        let events = m.apply(Command::SettleUsage { lease, amount_minor: 1_000_000, verified_gpu_ms: 60_000 });
        assert!(rejection(&events).is_none(), "usage is charged whatever the limits");
        seen.extend(alerts(&events));
    }
    assert_eq!(seen, vec![(true, 5_000), (true, 8_000), (true, 10_000)], "half, four fifths, all of the daily limit, once each");
    let status = m.engine.spend_status(renter).expect("limits");
    assert_eq!((status.spent_today_minor, status.spent_total_minor), (10_000_000, 10_000_000));
    // A new UTC day: today's count starts again, the total goes on.
    m.advance(MS_PER_DAY_TEST);
    let status = m.engine.spend_status(renter).expect("limits");
    assert_eq!((status.spent_today_minor, status.spent_total_minor), (0, 10_000_000));
}

const MS_PER_DAY_TEST: u64 = 24 * HOUR;

#[test]
fn spend_limits_replay_to_the_same_state() {
    let (mut m, renter, lease) = leased();
    limits(&mut m, renter, Some(5_000_000), None, Some(20_000_000));
    m.apply(Command::SettleUsage { lease, amount_minor: 3_000_000, verified_gpu_ms: HOUR });
    let order = m.order(renter, H100_SPOT, Side::Buy, USD_2, 1);
    m.place(order);
    let mut replay = Engine::new(EngineConfig::demo()).expect("valid");
    for input in &m.inputs {
        replay.apply(input);
    }
    assert_eq!(replay.state_hash(), m.engine.state_hash());
    assert_eq!(replay.spend_status(renter), m.engine.spend_status(renter));
}
