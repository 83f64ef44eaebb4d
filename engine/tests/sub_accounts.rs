//! Sub-accounts (docs/market-rules.md "Sub-accounts"): who may open them,
//! funds moving only between parent and sub-account, the limits a parent
//! sets checked at admission, and a sub-account trading like any account.

mod common;

use common::*;
use gpux_engine::*;

fn open_sub(m: &mut Market, parent: AccountId) -> Result<AccountId, RejectCode> {
    let events = m.apply(Command::OpenSubAccount { parent });
    if let Some(code) = rejection(&events) {
        return Err(code);
    }
    let opened = events.iter().find_map(|e| match e.kind {
        EventKind::SubAccountOpened { parent: p, account } if p == parent => Some(account),
        _ => None,
    });
    Ok(opened.expect("a sub-account opened event"))
}

fn move_funds(m: &mut Market, parent: AccountId, sub_account: AccountId, amount_minor: u64, to_sub_account: bool) -> Vec<Event> {
    m.apply(Command::MoveFunds { parent, sub_account, amount_minor, to_sub_account })
}

fn available(m: &Market, account: AccountId) -> u64 {
    m.engine.balances(account).expect("account exists").available_minor
}

#[test]
fn renters_and_aggregators_open_sub_accounts_of_their_role_and_others_are_refused() {
    let mut m = Market::new();
    let renter = m.renter(0);
    let aggregator = m.open(Role::Aggregator);
    let supplier = m.supplier();
    let operator = m.open(Role::Operator);
    let sub = open_sub(&mut m, renter).expect("a renter opens one");
    assert_eq!(m.engine.role(sub), Some(Role::Renter));
    let resale = open_sub(&mut m, aggregator).expect("an aggregator opens one");
    assert_eq!(m.engine.role(resale), Some(Role::Aggregator));
    assert_eq!(m.engine.parent_of(sub), Some(renter));
    assert_eq!(m.engine.parent_of(renter), None);
    assert_eq!(open_sub(&mut m, supplier), Err(RejectCode::SubAccountRoleNotPermitted));
    assert_eq!(open_sub(&mut m, operator), Err(RejectCode::SubAccountRoleNotPermitted));
    assert_eq!(open_sub(&mut m, sub), Err(RejectCode::SubAccountNested));
    assert_eq!(open_sub(&mut m, AccountId(999)), Err(RejectCode::UnknownAccount));
    let listed: Vec<AccountId> = m.engine.sub_accounts_of(renter, 0, 100).iter().map(|s| s.account).collect();
    assert_eq!(listed, vec![sub]);
}

#[test]
fn funds_move_between_parent_and_sub_account_only_and_never_leave_from_the_sub_account() {
    let mut m = Market::new();
    let parent = m.renter(10_000_000);
    let other = m.renter(10_000_000);
    let sub = open_sub(&mut m, parent).expect("opened");
    let events = move_funds(&mut m, parent, sub, 4_000_000, true);
    assert!(events.iter().any(|e| e.kind == EventKind::FundsMoved { from: parent, to: sub, amount_minor: 4_000_000 }));
    assert_eq!((available(&m, parent), available(&m, sub)), (6_000_000, 4_000_000));
    move_funds(&mut m, parent, sub, 1_000_000, false);
    assert_eq!((available(&m, parent), available(&m, sub)), (7_000_000, 3_000_000));

    // (who, sub-account named, amount, to the sub-account, refusal)
    let cases = [
        (other, sub, 1, true, RejectCode::NotYourSubAccount),
        (sub, sub, 1, true, RejectCode::NotYourSubAccount),
        (parent, other, 1, true, RejectCode::NotYourSubAccount),
        (parent, sub, 0, true, RejectCode::AmountInvalid),
        (parent, sub, 7_000_001, true, RejectCode::InsufficientFunds),
        (parent, sub, 3_000_001, false, RejectCode::InsufficientFunds),
    ];
    for (who, named, amount, to_sub, code) in cases {
        let events = move_funds(&mut m, who, named, amount, to_sub);
        assert_eq!(rejection(&events), Some(code), "{who:?} moving {amount} with {named:?}");
    }
    assert_eq!(rejection(&m.apply(Command::Withdraw { account: sub, amount_minor: 1 })), Some(RejectCode::SubAccountFundsStay));
    assert_eq!(rejection(&m.apply(Command::Payout { account: sub, amount_minor: 1 })), Some(RejectCode::SubAccountFundsStay));
    assert_eq!((available(&m, parent), available(&m, sub)), (7_000_000, 3_000_000), "refusals moved nothing");
}

#[test]
fn a_sub_account_trades_with_its_own_funds_and_its_parent_pays_nothing() {
    let mut m = Market::new();
    let supplier = m.supplier();
    let host = m.h100_host(supplier, "host-a", 2);
    let parent = m.renter(20_000_000);
    let sub = open_sub(&mut m, parent).expect("opened");
    move_funds(&mut m, parent, sub, 5_000_000, true);
    m.ask(supplier, host, 0b11, H100_SPOT, USD_2);
    let events = m.buy(sub, H100_SPOT, USD_2, 2);
    assert_eq!(trades(&events), vec![(USD_2, 2)]);
    let held = m.engine.balances(sub).expect("exists").held_minor;
    assert_eq!(held, 2 * USD_2, "the lease's escrow is the sub-account's");
    assert_eq!(available(&m, parent), 15_000_000, "the parent's own money is untouched");
    let subs = m.engine.sub_accounts_of(parent, 0, 10);
    assert_eq!(subs[0].balances.held_minor, 2 * USD_2);
}

#[test]
fn limits_a_parent_sets_refuse_orders_beyond_them_and_only_the_parent_sets_them() {
    let mut m = Market::new();
    let parent = m.renter(100_000_000);
    let sub = open_sub(&mut m, parent).expect("opened");
    move_funds(&mut m, parent, sub, 50_000_000, true);
    let set = |m: &mut Market, who: AccountId, limits: AccountLimits| {
        rejection(&m.apply(Command::SetAccountLimits { parent: who, sub_account: sub, limits }))
    };
    assert_eq!(set(&mut m, sub, AccountLimits::default()), Some(RejectCode::NotYourSubAccount));

    // One bid for 3 GPUs at $2 for an hour holds $6.
    let limits = AccountLimits { max_order_minor: Some(5_000_000), ..AccountLimits::default() };
    assert_eq!(set(&mut m, parent, limits), None);
    assert_eq!(rejection(&m.buy(sub, H100_SPOT, USD_2, 3)), Some(RejectCode::SubAccountLimit));
    assert!(accepted(&m.buy(sub, H100_SPOT, USD_2, 2)).is_some(), "$4 is within $5");

    let limits = AccountLimits { max_held_minor: Some(7_000_000), ..AccountLimits::default() };
    set(&mut m, parent, limits);
    assert_eq!(rejection(&m.buy(sub, H100_SPOT, USD_2, 2)), Some(RejectCode::SubAccountLimit), "$4 held + $4 > $7");
    assert!(accepted(&m.buy(sub, H100_SPOT, USD_2, 1)).is_some(), "$4 held + $2 <= $7");

    let limits = AccountLimits { max_open_orders: Some(2), ..AccountLimits::default() };
    set(&mut m, parent, limits);
    assert_eq!(rejection(&m.buy(sub, H100_SPOT, USD_2, 1)), Some(RejectCode::SubAccountLimit), "two open already");

    set(&mut m, parent, AccountLimits::default());
    assert!(accepted(&m.buy(sub, H100_SPOT, USD_2, 1)).is_some(), "no limits: the exchange's own apply");
    assert!(accepted(&m.buy(parent, H100_SPOT, USD_2, 20)).is_some(), "the parent itself is never limited");
}

#[test]
fn money_moved_to_a_sub_account_in_debt_repays_the_debt_first() {
    // A renter sub-account whose lease ran past its funds owes the rest:
    // the next move into it repays that first, like a deposit.
    let mut m = Market::new();
    let supplier = m.supplier();
    let host = m.h100_host(supplier, "host-a", 1);
    let parent = m.renter(50_000_000);
    let sub = open_sub(&mut m, parent).expect("opened");
    move_funds(&mut m, parent, sub, USD_2, true);
    m.ask(supplier, host, 0b1, H100_SPOT, USD_2);
    let events = m.buy(sub, H100_SPOT, USD_2, 1);
    let lease = leases(&events).first().map(|l| l.0).expect("a lease");
    // Usage beyond the escrow: $3 for the hour's $2 escrow leaves $1 unpaid.
    m.apply(Command::SettleUsage { lease, amount_minor: 3_000_000, verified_gpu_ms: HOUR });
    let debt = m.engine.balances(sub).expect("exists").debt_minor;
    assert!(debt > 0, "the sub-account owes the rest");
    let events = move_funds(&mut m, parent, sub, 5_000_000, true);
    assert!(events.iter().any(|e| e.kind == EventKind::DebtRepaid { account: sub, amount_minor: debt, from_payable: false }));
    assert_eq!(m.engine.balances(sub).expect("exists").debt_minor, 0);
}

#[test]
fn sub_accounts_replay_to_the_same_state() {
    let mut m = Market::new();
    let parent = m.renter(10_000_000);
    let sub = open_sub(&mut m, parent).expect("opened");
    move_funds(&mut m, parent, sub, 3_000_000, true);
    m.apply(Command::SetAccountLimits {
        parent,
        sub_account: sub,
        limits: AccountLimits { max_open_orders: Some(1), max_order_minor: None, max_held_minor: Some(2_000_000) },
    });
    m.buy(sub, H100_SPOT, USD_2, 1);
    let mut replay = Engine::new(EngineConfig::demo()).expect("valid");
    for input in &m.inputs {
        replay.apply(input);
    }
    assert_eq!(replay.state_hash(), m.engine.state_hash());
    assert_eq!(replay.sub_accounts_of(parent, 0, 10), m.engine.sub_accounts_of(parent, 0, 10));
    let mut changed = replay.clone();
    changed.apply(&Input {
        at_ms: m.now_ms,
        command: Command::SetAccountLimits { parent, sub_account: sub, limits: AccountLimits::default() },
    });
    assert_ne!(changed.state_hash(), m.engine.state_hash(), "limits are part of the state hash");
}

/// Issue 61: one aggregator filled the exchange-wide tables through its
/// sub-accounts, each with a whole account's share. From share rules 1 an
/// account and its sub-accounts hold one account's share together
/// (docs/market-rules.md "Shared limits"), and another participant keeps
/// its own.
fn aggregator_with_subs(m: &mut Market, subs: usize) -> (AccountId, Vec<AccountId>) {
    m.apply(Command::SetShareRules { version: limits::SHARE_RULES });
    let parent = m.open(Role::Aggregator);
    m.apply(Command::Deposit { account: parent, amount_minor: 1 << 50 });
    let subs = (0..subs)
        .map(|_| {
            let sub = open_sub(m, parent).expect("opened");
            move_funds(m, parent, sub, 1 << 45, true);
            sub
        })
        .collect();
    (parent, subs)
}

fn arm_stop(m: &mut Market, account: AccountId) -> Vec<Event> {
    let mut order = m.order(account, H100_SPOT, Side::Buy, USD_2, 1);
    order.time_in_force = TimeInForce::Gtc;
    m.apply(Command::Place {
        order,
        options: OrderOptions { stop_price_minor_per_gpu_hour: USD_2, ..OrderOptions::default() },
        regions: Vec::new(),
        cluster: None,
    })
}

#[test]
fn a_parent_and_its_sub_accounts_hold_one_accounts_share_of_armed_stops() {
    let mut m = Market::new();
    let (parent, subs) = aggregator_with_subs(&mut m, 2);
    let share = limits::STOPS_ARMED_PER_PARTICIPANT_MAX;
    for i in 0..share {
        let events = arm_stop(&mut m, subs[(i % 2) as usize]);
        assert!(accepted(&events).is_some(), "stop {i}: {:?}", rejection(&events));
    }
    assert_eq!(m.engine.participant_use(subs[1]).armed_stops, share);
    for account in [subs[0], subs[1], parent] {
        assert_eq!(rejection(&arm_stop(&mut m, account)), Some(RejectCode::TooManyStops), "{account:?}");
    }
    let other = m.renter(1 << 40);
    assert!(accepted(&arm_stop(&mut m, other)).is_some(), "another participant arms its own");
}

#[test]
fn a_parent_and_its_sub_accounts_hold_one_participants_share_of_open_orders() {
    let mut m = Market::new();
    let per_account = EngineConfig::demo().orders_per_account_max;
    let share = limits::ORDERS_PER_PARTICIPANT_MAX;
    let needed = share.div_ceil(per_account) as usize + 1;
    let (_, subs) = aggregator_with_subs(&mut m, needed);
    let mut placed = 0;
    'fill: for &sub in &subs {
        for _ in 0..per_account {
            if placed == share {
                break 'fill;
            }
            let events = m.bid(sub, H100_SPOT, 1_000_000, 1).1;
            assert!(accepted(&events).is_some(), "order {placed}: {:?}", rejection(&events));
            placed += 1;
        }
    }
    let last = *subs.last().expect("subs");
    assert!(m.engine.balances(last).is_some());
    let order = m_order(&mut m, last);
    let events = m.place(order);
    assert_eq!(rejection(&events), Some(RejectCode::TooManyOpenOrders), "the participant's share is full");
    let other = m.renter(1 << 40);
    assert!(accepted(&m.bid(other, H100_SPOT, 1_000_000, 1).1).is_some(), "another participant bids");
}

fn m_order(m: &mut Market, account: AccountId) -> NewOrder {
    let mut order = m.order(account, H100_SPOT, Side::Buy, 1_000_000, 1);
    order.time_in_force = TimeInForce::Gtc;
    order
}

#[test]
fn a_parent_and_its_sub_accounts_hold_one_accounts_share_of_unproven_gpus() {
    let mut m = Market::new();
    let (parent, subs) = aggregator_with_subs(&mut m, 3);
    let share = limits::GPUS_UNPROVEN_PER_PARTICIPANT_MAX;
    m.h100_host(subs[0], "a", share / 2);
    m.h100_host(subs[1], "b", share / 2);
    let register = |m: &mut Market, account, host: &str| m.apply(Command::register(account, host, &format!("GPU-{host}-x"), h100_spec()));
    assert_eq!(rejection(&register(&mut m, subs[2], "c")), Some(RejectCode::GpusAwaitingChallenge));
    assert_eq!(rejection(&register(&mut m, parent, "p")), Some(RejectCode::GpusAwaitingChallenge));
    let honest = m.supplier();
    assert!(rejection(&register(&mut m, honest, "h")).is_none(), "another supplier registers");
    // A correct answer frees a place for any account of the participant.
    m.apply(Command::RecordChallenge { gpu: GpuId(0), answer: ChallengeAnswer::Correct { n: 256, elapsed_ms: 10 } });
    assert!(rejection(&register(&mut m, subs[2], "c")).is_none());
}

#[test]
fn a_parent_and_its_sub_accounts_hold_one_accounts_share_of_the_gpu_table() {
    let mut m = Market::new();
    let (_, subs) = aggregator_with_subs(&mut m, 2);
    let per_host = limits::GPUS_PER_HOST_MAX;
    let hosts = limits::GPUS_PER_PARTICIPANT_MAX / per_host;
    let mut gpu = 0u32;
    for host in 0..hosts {
        m.h100_host(subs[(host % 2) as usize], &format!("h{host}"), per_host);
        for _ in 0..per_host {
            m.apply(Command::RecordChallenge { gpu: GpuId(gpu), answer: ChallengeAnswer::Correct { n: 256, elapsed_ms: 10 } });
            gpu += 1;
        }
    }
    let events = m.apply(Command::register(subs[0], "more", "GPU-more", h100_spec()));
    assert_eq!(rejection(&events), Some(RejectCode::TooManyGpus));
    let other = m.supplier();
    assert!(rejection(&m.apply(Command::register(other, "more", "GPU-other", h100_spec()))).is_none(), "another supplier's host");
}

/// A host name is its supplier's own from share rules 1: another account's
/// host of the same name no longer refuses it (`not_your_host` before).
#[test]
fn host_names_are_each_suppliers_own_from_share_rules_1_and_first_come_before() {
    for (rules, refused) in [(0, Some(RejectCode::NotYourHost)), (limits::SHARE_RULES, None)] {
        let mut m = Market::new();
        m.apply(Command::SetShareRules { version: rules });
        let (a, b) = (m.supplier(), m.supplier());
        let first = m.h100_host(a, "rack-1", 1);
        let events = m.apply(Command::register(b, "rack-1", "GPU-b-0", h100_spec()));
        assert_eq!(rejection(&events), refused, "rules {rules}");
        if refused.is_none() {
            let second = events.iter().find_map(|e| match e.kind {
                EventKind::GpuRegistered { host, .. } => Some(host),
                _ => None,
            });
            assert!(second.is_some_and(|host| host != first), "another host");
            // Each supplier's next GPU of that name joins its own host.
            let again = m.apply(Command::register(a, "rack-1", "GPU-a-1", h100_spec()));
            let joined = again.iter().find_map(|e| match e.kind {
                EventKind::GpuRegistered { host, .. } => Some(host),
                _ => None,
            });
            assert_eq!(joined, Some(first));
        }
    }
}

/// The rules a journal ran under replay unchanged: before share rules 1 a
/// sub-account held a whole account's share of its own; the rules only
/// move forward.
#[test]
fn share_rules_apply_from_their_entry_on_and_never_go_back() {
    let mut m = Market::new();
    let parent = m.open(Role::Aggregator);
    m.apply(Command::Deposit { account: parent, amount_minor: 1 << 50 });
    let subs: Vec<AccountId> = (0..2).map(|_| open_sub(&mut m, parent).expect("opened")).collect();
    for &sub in &subs {
        move_funds(&mut m, parent, sub, 1 << 45, true);
    }
    for _ in 0..limits::STOPS_ARMED_PER_ACCOUNT_MAX {
        assert!(accepted(&arm_stop(&mut m, subs[0])).is_some());
    }
    assert!(accepted(&arm_stop(&mut m, subs[1])).is_some(), "rules 0: each sub-account its own share");
    assert!(rejection(&m.apply(Command::SetShareRules { version: limits::SHARE_RULES })).is_none());
    assert_eq!(rejection(&arm_stop(&mut m, subs[1])), Some(RejectCode::TooManyStops), "rules 1: one share");
    assert_eq!(m.engine.share_rules(), limits::SHARE_RULES);
    assert_eq!(rejection(&m.apply(Command::SetShareRules { version: 0 })), Some(RejectCode::ListingIncompatible));
    assert_eq!(rejection(&m.apply(Command::SetShareRules { version: limits::SHARE_RULES + 1 })), Some(RejectCode::ListingIncompatible));
    let mut replay = Engine::new(EngineConfig::demo()).expect("config");
    for input in &m.inputs {
        replay.apply(input);
    }
    assert_eq!(replay.state_hash(), m.engine.state_hash());
}
