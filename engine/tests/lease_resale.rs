//! Resale of fixed-duration spot leases (docs/market-rules.md "Lease
//! resale"): the renter offers the rest of its lease on the class's resale
//! book; a bid there takes it whole; the reseller's lease ends `resold` and
//! the buyer's goes on to the same end on the same GPUs at the lease's
//! price (the supplier is paid as before), and the difference between the
//! resale price and the lease's price settles between the two at once.

mod common;

use common::*;
use gpux_engine::*;

const USD_3: u64 = 3_000_000;
const USD_1_50: u64 = 1_500_000;

struct Fixture {
    m: Market,
    supplier: AccountId,
    reseller: AccountId,
    buyer: AccountId,
    lease: LeaseId,
}

/// The reseller rents 2 H100s for 4 hours at $2; an hour passes.
fn fixture() -> Fixture {
    let mut m = Market::new();
    let supplier = m.supplier();
    let host = m.h100_host(supplier, "host-a", 2);
    let reseller = m.renter(100_000_000);
    let buyer = m.renter(100_000_000);
    m.ask(supplier, host, 0b11, H100_SPOT, USD_2);
    let mut bid = m.order(reseller, H100_SPOT, Side::Buy, USD_2, 2);
    bid.duration = LeaseDuration::Hours(4);
    let events = m.place(bid);
    let lease = leases(&events).first().map(|l| l.0).expect("a lease");
    m.advance(HOUR);
    Fixture { m, supplier, reseller, buyer, lease }
}

impl Fixture {
    fn offer(&mut self, who: AccountId, lease: LeaseId, price: u64, time_in_force: TimeInForce) -> Vec<Event> {
        let client_order_id = 9_000 + self.m.log.len() as u64;
        self.m.apply(Command::OfferLease { account: who, lease, client_order_id, price_minor_per_gpu_hour: price, time_in_force })
    }

    fn resale_book(&self) -> InstrumentId {
        self.m.engine.instruments().into_iter().find(|i| i.symbol == "H100-SXM-80G/RESALE").expect("listed").instrument
    }

    fn bid(&mut self, price: u64, quantity: u32, hours: u32, time_in_force: TimeInForce) -> Vec<Event> {
        let book = self.resale_book();
        let mut bid = self.m.order(self.buyer, book, Side::Buy, price, quantity);
        bid.duration = LeaseDuration::Hours(hours);
        bid.time_in_force = time_in_force;
        self.m.place(bid)
    }

    fn balances(&self, account: AccountId) -> Balances {
        self.m.engine.balances(account).expect("an account")
    }
}

fn ended(events: &[Event]) -> Vec<(LeaseId, LeaseEndReason)> {
    events
        .iter()
        .filter_map(|e| match e.kind {
            EventKind::LeaseEnded { lease, reason } => Some((lease, reason)),
            _ => None,
        })
        .collect()
}

#[test]
fn a_lease_sold_above_its_price_goes_on_for_the_buyer_and_the_reseller_keeps_the_difference() {
    let mut f = fixture();
    let before = f.balances(f.reseller);
    let offered = f.offer(f.reseller, f.lease, USD_3, TimeInForce::Gtc);
    assert!(offered.iter().any(|e| matches!(e.kind, EventKind::InstrumentListed { .. })), "the resale book is listed at the first offer");
    assert!(accepted(&offered).is_some(), "{:?}", rejection(&offered));
    let book = f.resale_book();
    assert_eq!(f.m.engine.depth(book, Side::Sell), vec![(USD_3, 2)]);

    let events = f.bid(USD_3, 2, 3, TimeInForce::Ioc);
    assert_eq!(trades(&events), vec![(USD_3, 2)]);
    assert_eq!(ended(&events), vec![(f.lease, LeaseEndReason::Resold)]);
    let (new_lease, kind, gpu_mask, start_ms, end_ms) = leases(&events)[0];
    let old = f.m.engine.lease(f.lease).expect("the reseller's lease");
    assert_eq!((kind, gpu_mask, start_ms, end_ms), (LeaseKind::Spot, 0b11, f.m.now_ms, old.end_ms), "the rest of the lease");
    let info = f.m.engine.lease(new_lease).expect("the buyer's lease");
    assert_eq!((info.renter, info.supplier, &info.gpus), (f.buyer, f.supplier, &old.gpus), "same GPUs, same supplier");
    assert_eq!(info.price_minor_per_gpu_hour, USD_2, "at the lease's own price: the supplier is paid as before");
    // Three hours left: the buyer escrows $2 x 2 x 3 h and pays the reseller ($3 - $2) x 2 x 3 h.
    assert_eq!(f.balances(f.buyer).held_minor, 12_000_000);
    assert_eq!(f.balances(f.buyer).available_minor, 100_000_000 - 12_000_000 - 6_000_000);
    assert_eq!(f.balances(f.reseller).available_minor, before.available_minor + 6_000_000);
    // The supplier is billed to the new lease; the reseller's escrow comes back at billing close.
    let charged = f.m.apply(Command::SettleUsage { lease: new_lease, amount_minor: 1_000_000, verified_gpu_ms: HOUR });
    assert!(rejection(&charged).is_none());
    assert!(f.m.engine.balances(f.supplier).expect("supplier").payable_minor > 0);
    f.m.advance(HOUR);
    assert_eq!(f.balances(f.reseller).held_minor, 0, "the ended lease's escrow is released at billing close");
    assert_eq!(f.m.engine.depth(book, Side::Sell), vec![], "sold");
}

#[test]
fn a_lease_sold_below_its_price_costs_the_reseller_the_difference_it_held_when_offering() {
    let mut f = fixture();
    let available = f.balances(f.reseller).available_minor;
    assert!(accepted(&f.offer(f.reseller, f.lease, USD_1_50, TimeInForce::Gtc)).is_some());
    // ($2 - $1.50) x 2 GPUs x 3 h held at the offer.
    assert_eq!(f.balances(f.reseller).available_minor, available - 3_000_000);
    let events = f.bid(USD_1_50, 2, 3, TimeInForce::Ioc);
    assert_eq!(trades(&events), vec![(USD_1_50, 2)]);
    assert_eq!(f.balances(f.reseller).available_minor, available - 3_000_000, "the hold paid the buyer");
    // The buyer escrows $12 at the lease's price, $3 of it from the reseller: it pays $9.
    assert_eq!(f.balances(f.buyer).held_minor, 12_000_000);
    assert_eq!(f.balances(f.buyer).available_minor, 100_000_000 - 9_000_000);
}

#[test]
fn a_bid_takes_a_lease_whole_and_only_when_its_hours_cover_the_time_left() {
    let mut f = fixture();
    f.offer(f.reseller, f.lease, USD_2, TimeInForce::Gtc);
    // (price, GPUs, hours): 3 h left on 2 GPUs.
    for (quantity, hours) in [(1, 3), (2, 2)] {
        let events = f.bid(USD_3, quantity, hours, TimeInForce::Ioc);
        assert!(trades(&events).is_empty(), "{quantity} GPUs for {hours} h takes nothing");
    }
    let events = f.bid(USD_3, 4, 3, TimeInForce::Ioc);
    assert_eq!(trades(&events), vec![(USD_2, 2)], "a bid for more takes the lease whole at the ask's price");
}

#[test]
fn what_cannot_be_resold_is_refused_and_a_refusal_lists_no_book() {
    let mut f = fixture();
    let hash = f.m.engine.state_hash();
    // (who, lease, price, refusal)
    let cases = [
        (f.buyer, f.lease, USD_3, RejectCode::NotYourLease),
        (f.reseller, LeaseId(99), USD_3, RejectCode::UnknownLease),
        (f.reseller, f.lease, USD_3 + 1, RejectCode::PriceOffTick),
    ];
    for (who, lease, price, code) in cases {
        let events = f.offer(who, lease, price, TimeInForce::Gtc);
        assert_eq!(rejection(&events), Some(code));
    }
    assert!(f.m.engine.instruments().iter().all(|i| !i.symbol.ends_with("/RESALE")), "nothing listed by a refusal");
    assert_eq!(f.m.engine.state_hash(), hash, "refusals change nothing");
    assert!(accepted(&f.offer(f.reseller, f.lease, USD_3, TimeInForce::Gtc)).is_some());
    assert_eq!(rejection(&f.offer(f.reseller, f.lease, USD_3, TimeInForce::Gtc)), Some(RejectCode::LeaseAlreadyOffered));
    let book = f.resale_book();
    let plain = f.m.order(f.reseller, book, Side::Sell, USD_3, 2);
    assert_eq!(rejection(&f.m.place(plain)), Some(RejectCode::LeaseNotResellable), "a plain ask there offers nothing");
    let mut forever = f.m.order(f.buyer, book, Side::Buy, USD_3, 2);
    forever.duration = LeaseDuration::UntilCancelled;
    assert_eq!(rejection(&f.m.place(forever)), Some(RejectCode::DurationInvalid));
    let ask = f.m.engine.open_orders(f.reseller).into_iter().find(|o| o.instrument == book).expect("the resale ask").order;
    let replace = Command::ReplaceOrder { account: f.reseller, order: ask, price_minor_per_gpu_hour: USD_2, quantity: 2 };
    assert_eq!(rejection(&f.m.apply(replace)), Some(RejectCode::ReplaceInvalid));
    // Less than 15 minutes left: nothing to sell.
    f.m.advance(3 * HOUR - 10 * 60_000);
    assert!(rejection(&f.m.apply(Command::CancelOrder { account: f.reseller, order: ask })).is_some(), "it expired already");
    assert_eq!(rejection(&f.offer(f.reseller, f.lease, USD_3, TimeInForce::Gtc)), Some(RejectCode::LeaseNotResellable));
}

#[test]
fn preemptible_and_open_ended_leases_are_not_resold() {
    let mut m = Market::new();
    let supplier = m.supplier();
    let host = m.h100_host(supplier, "host-a", 2);
    let renter = m.renter(100_000_000);
    m.ask(supplier, host, 0b01, H100_PREEMPT, USD_2);
    let preemptible = leases(&m.buy(renter, H100_PREEMPT, USD_2, 1))[0].0;
    m.ask(supplier, host, 0b10, H100_SPOT, USD_2);
    let mut open = m.order(renter, H100_SPOT, Side::Buy, USD_2, 1);
    open.duration = LeaseDuration::UntilCancelled;
    let open_ended = leases(&m.place(open))[0].0;
    for lease in [preemptible, open_ended] {
        let events = m.apply(Command::OfferLease {
            account: renter,
            lease,
            client_order_id: 77,
            price_minor_per_gpu_hour: USD_2,
            time_in_force: TimeInForce::Gtc,
        });
        assert_eq!(rejection(&events), Some(RejectCode::LeaseNotResellable), "{lease:?}");
    }
}

#[test]
fn an_offer_goes_when_its_lease_ends_or_fifteen_minutes_before_and_gives_its_hold_back() {
    let mut f = fixture();
    let available = f.balances(f.reseller).available_minor;
    f.offer(f.reseller, f.lease, USD_1_50, TimeInForce::Gtc);
    let ask = f.m.engine.open_orders(f.reseller).into_iter().find(|o| o.instrument == f.resale_book()).expect("the ask").order;
    let events = f.m.apply(Command::EndLease { account: f.reseller, lease: f.lease });
    assert_eq!(closed(&events, ask), Some(OrderCloseReason::LeaseEnded));
    assert_eq!(f.balances(f.reseller).available_minor, available, "the hold for the difference is back");

    let mut g = fixture();
    g.offer(g.reseller, g.lease, USD_3, TimeInForce::Gtc);
    let ask = g.m.engine.open_orders(g.reseller).into_iter().find(|o| o.instrument == g.resale_book()).expect("the ask").order;
    let events = g.m.advance(3 * HOUR - 15 * 60_000);
    assert_eq!(closed(&events, ask), Some(OrderCloseReason::Expired), "a GTC offer expires 15 minutes before the lease ends");
    assert!(g.m.engine.lease(g.lease).expect("lease").active, "the lease itself goes on");
}

#[test]
fn resales_replay_to_the_same_state() {
    let mut f = fixture();
    f.offer(f.reseller, f.lease, USD_3, TimeInForce::Gtc);
    f.bid(USD_3, 2, 3, TimeInForce::Gtc);
    f.m.advance(HOUR);
    let mut replay = Engine::new(EngineConfig::demo()).expect("valid");
    for input in &f.m.inputs {
        replay.apply(input);
    }
    assert_eq!(replay.state_hash(), f.m.engine.state_hash());
}
