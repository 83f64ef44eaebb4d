//! The autoscaling rule (market/src/scaling.rs) against scripted loads, and
//! a property test against a reference that keeps every sample.

use gpux_market::scaling::{Decision, Load, Policy, PolicyError, Reason, Scaler, Target};
use proptest::prelude::*;

/// 2 rps per replica, up after 30 s, down after 120 s.
fn policy(min_replicas: u32, max_replicas: u32) -> Policy {
    Policy { min_replicas, max_replicas, target: Target::RequestsPerSecondMilli(2_000), up_window_ms: 30_000, down_window_ms: 120_000 }
}

fn rps(at_s: u64, rps_milli: u64) -> Load {
    Load { at_ms: at_s * 1_000, requests_per_second_milli: rps_milli, in_flight: 0, queued: 0 }
}

/// Feeds one sample a second from `from_s` to `to_s` (inclusive) at a
/// constant load, applying each decision; the decisions taken.
fn run(scaler: &mut Scaler, policy: &Policy, running: &mut u32, (from_s, to_s): (u64, u64), rps_milli: u64) -> Vec<(u64, Decision)> {
    let mut taken = Vec::new();
    for at in from_s..=to_s {
        if let Some(decision) = scaler.observe(policy, rps(at, rps_milli), *running, u32::MAX) {
            assert_eq!(decision.from, *running);
            *running = decision.to;
            taken.push((at, decision));
        }
    }
    taken
}

#[test]
fn a_load_held_for_the_up_window_adds_replicas_and_a_shorter_spike_adds_none() {
    let (policy, mut scaler, mut running) = (policy(1, 10), Scaler::default(), 1);
    // 1 rps: one replica is enough.
    assert!(run(&mut scaler, &policy, &mut running, (0, 60), 1_000).is_empty());
    // A 20 s spike to 10 rps (5 replicas' worth): shorter than the window.
    assert!(run(&mut scaler, &policy, &mut running, (61, 80), 10_000).is_empty(), "a spike shorter than the up window");
    assert!(run(&mut scaler, &policy, &mut running, (81, 150), 1_000).is_empty());
    // 5 rps held: 3 replicas once it has lasted 30 s.
    let taken = run(&mut scaler, &policy, &mut running, (151, 200), 5_000);
    assert_eq!(taken, [(181, Decision { from: 1, to: 3, reason: Reason::LoadAbove })]);
    // A burst inside a later window does not overshoot: the fewest the window wanted.
    let taken = run(&mut scaler, &policy, &mut running, (201, 210), 20_000);
    assert!(taken.is_empty(), "{taken:?}");
}

#[test]
fn replicas_go_only_after_the_longer_down_window_and_never_below_the_minimum() {
    let (policy, mut scaler, mut running) = (policy(2, 10), Scaler::default(), 2);
    let taken = run(&mut scaler, &policy, &mut running, (0, 60), 12_000);
    assert_eq!(taken, [(30, Decision { from: 2, to: 6, reason: Reason::LoadAbove })]);
    // The load falls to 3 rps (2 replicas' worth): nothing for 119 s, then down.
    let taken = run(&mut scaler, &policy, &mut running, (61, 300), 3_000);
    assert_eq!(taken, [(181, Decision { from: 6, to: 2, reason: Reason::LoadBelow })]);
    // Idle: the minimum stays.
    assert!(run(&mut scaler, &policy, &mut running, (301, 700), 0).is_empty());
    assert_eq!(running, 2);
    // A replica lost under the minimum is replaced at once.
    assert_eq!(scaler.observe(&policy, rps(701, 0), 1, u32::MAX), Some(Decision { from: 1, to: 2, reason: Reason::BelowMin }));
}

#[test]
fn the_maximum_and_the_budget_bound_every_decision() {
    let (policy, mut scaler, mut running) = (policy(1, 4), Scaler::default(), 1);
    let taken = run(&mut scaler, &policy, &mut running, (0, 40), 100_000);
    assert_eq!(taken, [(30, Decision { from: 1, to: 4, reason: Reason::LoadAbove })], "50 wanted, 4 at most");
    // The budget affords 2: down to 2 at once whatever the load.
    assert_eq!(scaler.observe(&policy, rps(41, 100_000), 4, 2), Some(Decision { from: 4, to: 2, reason: Reason::Budget }));
    assert_eq!(scaler.observe(&policy, rps(42, 100_000), 2, 2), None, "at the budget's bound");
    // The policy lowered under what runs.
    let lowered = Policy { max_replicas: 3, ..policy };
    assert_eq!(scaler.observe(&lowered, rps(43, 100_000), 4, u32::MAX), Some(Decision { from: 4, to: 3, reason: Reason::AboveMax }));
}

#[test]
fn an_idle_service_scales_to_zero_and_a_waiting_request_wakes_it() {
    let policy = Policy { target: Target::InFlight(4), ..policy(0, 5) };
    let (mut scaler, mut running) = (Scaler::default(), 1);
    let busy = |at_s: u64, in_flight: u32| Load { at_ms: at_s * 1_000, in_flight, ..Load::default() };
    for at in 0..=60 {
        assert_eq!(scaler.observe(&policy, busy(at, 3), running, u32::MAX), None, "3 in flight, 4 per replica");
    }
    // Nothing for the down window: to zero, not before.
    let mut taken = Vec::new();
    for at in 61..=200 {
        if let Some(decision) = scaler.observe(&policy, busy(at, 0), running, u32::MAX) {
            running = decision.to;
            taken.push((at, decision));
        }
    }
    assert_eq!(taken, [(181, Decision { from: 1, to: 0, reason: Reason::Idle })]);
    // At zero, idle: stays there.
    assert_eq!(scaler.observe(&policy, busy(201, 0), 0, u32::MAX), None);
    // A request queues: the first replica at once (more when more wait).
    let queued = Load { at_ms: 202_000, queued: 9, ..Load::default() };
    assert_eq!(scaler.observe(&policy, queued, 0, u32::MAX), Some(Decision { from: 0, to: 1, reason: Reason::Woken }));
    let waiting = Load { at_ms: 202_000, in_flight: 9, ..Load::default() };
    assert_eq!(Scaler::default().observe(&policy, waiting, 0, u32::MAX), Some(Decision { from: 0, to: 3, reason: Reason::Woken }));
    // With no budget left nothing starts.
    assert_eq!(Scaler::default().observe(&policy, queued, 0, 0), None);
}

#[test]
fn a_policy_is_checked_whole() {
    assert_eq!(policy(1, 4).check(), Ok(()));
    assert_eq!(policy(5, 4).check(), Err(PolicyError::Bounds));
    assert_eq!(policy(0, 0).check(), Err(PolicyError::Bounds));
    assert_eq!(Policy { target: Target::InFlight(0), ..policy(1, 4) }.check(), Err(PolicyError::Target));
    assert_eq!(Policy { down_window_ms: 10_000, ..policy(1, 4) }.check(), Err(PolicyError::Windows));
    assert_eq!(Policy { up_window_ms: 999, down_window_ms: 999, ..policy(1, 4) }.check(), Err(PolicyError::Windows));
    let names: Vec<&str> =
        [Reason::LoadAbove, Reason::LoadBelow, Reason::Idle, Reason::Woken, Reason::BelowMin, Reason::AboveMax, Reason::Budget]
            .iter()
            .map(|r| r.name())
            .collect();
    assert_eq!(names, ["load_above", "load_below", "idle", "woken", "below_min", "above_max", "budget"]);
}

/// The rule restated over every sample ever taken (no trimming, no
/// incremental state): what `Scaler` must decide.
fn reference(policy: &Policy, history: &[Load], running: u32, affordable: u32) -> Option<Decision> {
    let now = history.last()?;
    let ceiling = policy.max_replicas.min(affordable);
    let decide = |to: u32, reason| (to != running).then_some(Decision { from: running, to, reason });
    if running > ceiling {
        return decide(ceiling, if running > policy.max_replicas { Reason::AboveMax } else { Reason::Budget });
    }
    let floor = policy.min_replicas.min(ceiling);
    if running < floor {
        return decide(floor, Reason::BelowMin);
    }
    if running == 0 {
        return (now.queued > 0 || now.in_flight > 0).then(|| decide(policy.wanted(now).max(1).min(ceiling), Reason::Woken)).flatten();
    }
    // The samples since the last restart of the window (time went back).
    let restart = history.windows(2).rposition(|w| w[1].at_ms < w[0].at_ms).map_or(0, |i| i + 1);
    let history = &history[restart..];
    let window = |window_ms: u64| {
        let since = now.at_ms.checked_sub(window_ms)?;
        let start = history.iter().rposition(|l| l.at_ms <= since)?;
        let seen = &history[start..];
        let wanted: Vec<u32> = seen.iter().map(|l| policy.wanted(l)).collect();
        let busy = seen.iter().any(|l| l.requests_per_second_milli > 0 || l.in_flight > 0 || l.queued > 0);
        Some((*wanted.iter().min()?, *wanted.iter().max()?, busy))
    };
    if let Some((least, _, _)) = window(policy.up_window_ms).filter(|(least, _, _)| *least > running) {
        return decide(least.min(ceiling), Reason::LoadAbove);
    }
    if let Some((_, most, busy)) = window(policy.down_window_ms) {
        if !busy && policy.min_replicas == 0 {
            return decide(0, Reason::Idle);
        }
        if most < running {
            return decide(most.max(floor).max(1), Reason::LoadBelow);
        }
    }
    None
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    /// Against the reference, over random loads, policies, budgets and
    /// replica counts (samples a second or so apart, now and then one back
    /// in time); every decision within its bounds and moving the right way.
    #[test]
    fn the_scaler_decides_as_the_rule_over_every_sample(
        min_replicas in 0..4u32,
        extra in 0..6u32,
        in_flight_target in proptest::bool::ANY,
        up_s in 1..20u64,
        more_down_s in 0..40u64,
        steps in proptest::collection::vec((0..3_000u64, 0..30_000u64, 0..12u32, 0..3u32, 0..8u32, 0..20u32), 1..300),
    ) {
        let policy = Policy {
            min_replicas,
            max_replicas: min_replicas.max(1) + extra,
            target: if in_flight_target { Target::InFlight(3) } else { Target::RequestsPerSecondMilli(2_500) },
            up_window_ms: up_s * 1_000,
            down_window_ms: (up_s + more_down_s) * 1_000,
        };
        prop_assert!(policy.check().is_ok());
        let (mut scaler, mut history, mut at_ms, mut running) = (Scaler::default(), Vec::new(), 10_000_000u64, 1u32);
        for (step_ms, rps_milli, in_flight, queued, affordable, running_now) in steps {
            // Mostly forward a second or so; one step in 50 goes back.
            at_ms = if step_ms == 0 { at_ms.saturating_sub(5_000) } else { at_ms + step_ms };
            let load = Load { at_ms, requests_per_second_milli: rps_milli, in_flight, queued };
            history.push(load);
            // Now and then the count changes under the rule (a replica lost).
            if running_now == 0 { running = running.saturating_sub(1); }
            let affordable = if affordable == 7 { u32::MAX } else { affordable };
            let decided = scaler.observe(&policy, load, running, affordable);
            prop_assert_eq!(decided, reference(&policy, &history, running, affordable));
            if let Some(decision) = decided {
                prop_assert_ne!(decision.to, decision.from);
                prop_assert!(decision.to <= policy.max_replicas.min(affordable));
                match decision.reason {
                    Reason::LoadAbove | Reason::Woken | Reason::BelowMin => prop_assert!(decision.to > decision.from),
                    _ => prop_assert!(decision.to < decision.from),
                }
                running = decision.to;
            }
        }
    }
}
