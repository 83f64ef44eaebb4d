//! Property test: on random streams of bids, asks, cancels and replaces in
//! one spot book, the engine produces the same trades, the same book and the
//! same open quantities as a small reference model written with a vector and
//! linear scans. Every ask sits on a fresh host of its own, so GPU
//! eligibility never interferes and the engine must behave as a plain
//! price-time limit order book, with all of its order types and self-trade
//! prevention modes. Traders have fixed reliability scores (one unrated),
//! and some bids ask for a minimum: the model skips makers that do not
//! qualify, as the rulebook says. Some asks' GPUs passed a hardware
//! challenge (verified) and some bids ask for verified GPUs only: the model
//! skips unverified makers for those bids likewise. Some bids are
//! all-or-none (they rest untraded until the book can fill them whole, and
//! are re-checked whenever an ask rests), some carry a budget (each fill
//! buys what the money left pays for at the maker's price; the rest rests
//! for what it buys at the limit), and some orders are stops (armed off the
//! book until a trade reaches their price, then entered in arming order
//! once the pass that triggered them is done).

mod common;

use common::*;
use gpux_engine::*;
use proptest::prelude::*;

const TICK: u64 = 1_000;
const BASE: u64 = 2_000_000;

#[derive(Clone, Debug)]
struct Placement {
    trader: usize,
    side: Side,
    ticks: u64,
    quantity: u32,
    /// 0, 1: GTC; 2: IOC; 3: FOK.
    tif: u8,
    post_only: bool,
    /// 0: cancel newest; 1: cancel oldest; 2: decrement.
    stp: u8,
    /// Bids: 0 (any seller) or a minimum seller score.
    min_score: u32,
    /// Asks: the GPUs are verified; bids: verified GPUs only.
    verified: bool,
    /// Bids: all-or-none.
    aon: bool,
    /// Bids: a budget in minor units (0: none).
    budget: u64,
    /// A stop price in ticks above `BASE` (`None`: not a stop).
    stop: Option<u64>,
}

/// Each trader's score as the market would have set it (`None`: unrated).
const SCORES: [Option<u32>; 3] = [Some(9_950), None, Some(9_000)];

/// Whether `bid` may trade with a sell of `seller`.
fn qualifies(bid_min_score: u32, seller: usize) -> bool {
    bid_min_score == 0 || SCORES[seller].is_some_and(|score| score >= bid_min_score)
}

#[derive(Clone, Debug)]
enum Op {
    Place(Placement),
    Cancel { pick: usize },
    Replace { pick: usize, ticks: u64, quantity: u32 },
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        6 => (
            (0..3usize, any::<bool>(), 0..8u64, 1..5u32, 0..4u8, prop::bool::weighted(0.15), 0..4u8, prop::sample::select(vec![0u32, 0, 9_000, 9_500]), prop::bool::weighted(0.4)),
            (0..7u8, prop::sample::select(vec![0u64, 0, 0, 0, 1_000_000, 2_003_000, 4_009_999, 6_030_000, 9_000_000]), prop::option::weighted(0.15, 0..8u64)),
        ).prop_map(
            |((trader, buy, ticks, quantity, tif, post_only, stp, min_score, verified), (aon, budget, stop))| {
                // All-or-none and a budget do not combine (the engine refuses it).
                let aon = buy && aon == 0;
                Op::Place(Placement {
                    trader,
                    side: if buy { Side::Buy } else { Side::Sell },
                    ticks,
                    quantity,
                    tif,
                    post_only,
                    stp,
                    min_score: if buy { min_score } else { 0 },
                    verified,
                    aon,
                    budget: if buy && !aon { budget } else { 0 },
                    stop,
                })
            }
        ),
        2 => any::<usize>().prop_map(|pick| Op::Cancel { pick }),
        2 => (any::<usize>(), 0..8u64, 1..5u32).prop_map(|(pick, ticks, quantity)| Op::Replace { pick, ticks, quantity }),
    ]
}

#[derive(Clone, Debug)]
struct RefOrder {
    key: usize,
    trader: usize,
    side: Side,
    price: u64,
    quantity: u32,
    priority: u64,
    post_only: bool,
    min_score: u32,
    verified: bool,
    aon: bool,
    /// A budget bid's money left while it takes (hours are 1: the cost of a GPU is its price).
    budget_left: Option<u64>,
}

/// A stop waiting for its trigger, with what it enters as.
#[derive(Clone, Debug)]
struct RefStop {
    order: RefOrder,
    stop_price: u64,
    stp: u8,
    tif: u8,
    triggered: bool,
}

/// The obviously-correct book: a vector of resting orders, best maker found by scanning.
#[derive(Default)]
struct Reference {
    resting: Vec<RefOrder>,
    clock: u64,
    /// `(price, quantity, buy key, sell key)`
    trades: Vec<(u64, u32, usize, usize)>,
    last_trade: Option<u64>,
    /// Armed stops in arming order (triggered ones until they enter).
    stops: Vec<RefStop>,
    /// Keys of triggered stops, in the order they enter.
    triggered: std::collections::VecDeque<usize>,
    /// An ask rested (or an all-or-none bid shrank): re-check all-or-none bids.
    sweep_due: bool,
}

impl Reference {
    fn crosses(side: Side, limit: u64, price: u64) -> bool {
        if side == Side::Buy {
            price <= limit
        } else {
            price >= limit
        }
    }

    /// Resting orders of the opposite side that cross, best price then oldest first.
    fn makers(&self, side: Side, limit: u64) -> Vec<usize> {
        let mut indices: Vec<usize> = (0..self.resting.len())
            .filter(|&i| self.resting[i].side != side && Self::crosses(side, limit, self.resting[i].price))
            .collect();
        indices.sort_by_key(|&i| {
            let order = &self.resting[i];
            let price_rank = if side == Side::Buy { order.price } else { u64::MAX - order.price };
            (price_rank, order.priority)
        });
        indices
    }

    /// Whether `taker` and `maker` (of different traders) may trade, with
    /// `remaining` of the taker still open: a resting all-or-none bid
    /// trades only when the taker fills it whole.
    fn may_trade(taker: &RefOrder, maker: &RefOrder, remaining: u32) -> bool {
        let (bid, ask) = if taker.side == Side::Buy { (taker, maker) } else { (maker, taker) };
        let whole = !(maker.side == Side::Buy && maker.aon && maker.quantity > remaining);
        qualifies(bid.min_score, ask.trader) && (!bid.verified || ask.verified) && whole
    }

    /// How much of `needed` the taker could trade at once.
    fn fillable(&self, taker: &RefOrder, needed: u32) -> u32 {
        let mut found = 0;
        let mut budget_left = taker.budget_left;
        for index in self.makers(taker.side, taker.price) {
            let maker = &self.resting[index];
            if maker.trader == taker.trader {
                break;
            }
            if let Some(left) = budget_left {
                if left / maker.price == 0 {
                    break;
                }
            }
            if Self::may_trade(taker, maker, taker.quantity - found) {
                let mut take = maker.quantity.min(taker.quantity - found).min(needed - found);
                if let Some(left) = budget_left.as_mut() {
                    take = take.min((*left / maker.price) as u32);
                    *left -= take as u64 * maker.price;
                }
                found += take;
                if found >= needed {
                    break;
                }
            }
        }
        found
    }

    /// A new (or triggered) order arriving: the all-or-none and FOK checks,
    /// then matching. `rests`: GTC.
    fn enter(&mut self, taker: RefOrder, stp: u8, tif: u8) {
        let rests = tif < 2;
        if (taker.aon || tif == 3) && self.fillable(&taker, taker.quantity) < taker.quantity {
            if taker.aon && rests {
                self.resting.push(taker);
            }
            return;
        }
        self.run(taker, stp, rests);
    }

    /// Resting all-or-none bids crossing the best ask, best first: each
    /// trades whole if it can.
    fn sweep(&mut self) {
        let Some(best_ask) = self.resting.iter().filter(|o| o.side == Side::Sell).map(|o| o.price).min() else { return };
        let mut candidates: Vec<&RefOrder> = self.resting.iter().filter(|o| o.side == Side::Buy && o.aon && o.price >= best_ask).collect();
        candidates.sort_by_key(|o| (u64::MAX - o.price, o.priority));
        let keys: Vec<usize> = candidates.iter().take(32).map(|o| o.key).collect();
        for key in keys {
            let Some(index) = self.resting.iter().position(|o| o.key == key) else { continue };
            let order = self.resting[index].clone();
            if self.fillable(&order, order.quantity) >= order.quantity {
                self.resting.remove(index);
                self.run(order, 0, true);
            }
        }
    }

    /// Runs what the command set off: sweeps first, then triggered stops in order.
    fn follow_ons(&mut self) {
        loop {
            if self.sweep_due {
                self.sweep_due = false;
                self.sweep();
            } else if let Some(key) = self.triggered.pop_front() {
                let index = self.stops.iter().position(|s| s.order.key == key).expect("a triggered stop");
                let stop = self.stops.remove(index);
                let mut order = stop.order;
                order.priority = self.clock;
                self.clock += 1;
                let best_opposite = self.makers(order.side, order.price).first().copied();
                if order.post_only && best_opposite.is_some() {
                    continue; // refused at its trigger: it would cross
                }
                if order.budget_left.is_some_and(|budget| budget < order.price) {
                    continue;
                }
                self.enter(order, stop.stp, stop.tif);
            } else {
                return;
            }
        }
    }

    fn note_trade(&mut self, price: u64) {
        self.last_trade = Some(price);
        for stop in self.stops.iter_mut().filter(|s| !s.triggered) {
            let reached = if stop.order.side == Side::Buy { price >= stop.stop_price } else { price <= stop.stop_price };
            if reached {
                stop.triggered = true;
                self.triggered.push_back(stop.order.key);
            }
        }
    }

    /// Matches and rests `taker`; mirrors the rulebook step by step.
    fn run(&mut self, mut taker: RefOrder, stp: u8, rests: bool) {
        loop {
            if taker.quantity == 0 {
                return;
            }
            // The first maker that is the taker's own (self-trade prevention
            // applies) or may trade with it; others are skipped.
            // In priority order: the taker's own order (self-trade
            // prevention applies); a maker a budget taker cannot pay for
            // ends the pass (later ones cost no less); one it may trade with.
            let mut eligible = None;
            for i in self.makers(taker.side, taker.price) {
                let maker = &self.resting[i];
                if maker.trader == taker.trader {
                    eligible = Some(i);
                    break;
                }
                if taker.budget_left.is_some_and(|left| left / maker.price == 0) {
                    break;
                }
                if Self::may_trade(&taker, maker, taker.quantity) {
                    eligible = Some(i);
                    break;
                }
            }
            let Some(index) = eligible else { break };
            let maker = self.resting[index].clone();
            if maker.trader == taker.trader {
                match stp {
                    0 => return,
                    1 => {
                        self.resting.remove(index);
                        continue;
                    }
                    3 => {
                        // Cancel both: the resting order and the taker close.
                        self.resting.remove(index);
                        return;
                    }
                    _ => {
                        let by = maker.quantity.min(taker.quantity);
                        self.resting[index].quantity -= by;
                        if self.resting[index].quantity == 0 {
                            self.resting.remove(index);
                        }
                        taker.quantity -= by;
                        continue;
                    }
                }
            }
            let mut quantity = maker.quantity.min(taker.quantity);
            if let Some(left) = taker.budget_left.as_mut() {
                quantity = quantity.min((*left / maker.price) as u32);
                *left -= quantity as u64 * maker.price;
            }
            let (buy, sell) = if taker.side == Side::Buy { (taker.key, maker.key) } else { (maker.key, taker.key) };
            self.trades.push((maker.price, quantity, buy, sell));
            self.note_trade(maker.price);
            taker.quantity -= quantity;
            self.resting[index].quantity -= quantity;
            if self.resting[index].quantity == 0 {
                self.resting.remove(index);
            }
            if taker.budget_left.is_some_and(|left| left < maker.price) {
                break;
            }
        }
        if let Some(left) = taker.budget_left.take() {
            // It rests as a plain bid for what the rest of its budget buys at its limit.
            taker.quantity = taker.quantity.min((left / taker.price) as u32);
        }
        if rests && taker.quantity > 0 {
            if taker.side == Side::Sell {
                self.sweep_due = true;
            }
            self.resting.push(taker);
        }
    }

    fn depth(&self, side: Side) -> Vec<(u64, u64)> {
        let mut levels: std::collections::BTreeMap<u64, u64> = Default::default();
        for order in self.resting.iter().filter(|o| o.side == side) {
            *levels.entry(order.price).or_default() += order.quantity as u64;
        }
        let mut depth: Vec<(u64, u64)> = levels.into_iter().collect();
        if side == Side::Buy {
            depth.reverse();
        }
        depth
    }
}

struct Harness {
    market: Market,
    reference: Reference,
    traders: Vec<AccountId>,
    /// Engine ids of every order placed, by key.
    placed: Vec<Option<OrderId>>,
    hosts_made: u32,
    stp_by_key: Vec<u8>,
}

impl Harness {
    fn new() -> Self {
        let mut market = Market::new();
        let traders = (0..3)
            .map(|_| {
                let account = market.open(Role::Aggregator);
                market.apply(Command::Deposit { account, amount_minor: 1 << 50 });
                account
            })
            .collect::<Vec<_>>();
        for (trader, score) in traders.iter().zip(SCORES) {
            market.engine.set_supplier_score(*trader, score);
        }
        Harness { market, reference: Reference::default(), traders, placed: Vec::new(), hosts_made: 0, stp_by_key: Vec::new() }
    }

    fn place(&mut self, placement: Placement) {
        let Placement { trader, side, ticks, quantity, tif, post_only, stp, min_score, verified, aon, budget, stop } = placement;
        let key = self.placed.len();
        let price = BASE + ticks * TICK;
        let account = self.traders[trader];
        let mut order = self.market.order(account, H100_SPOT, side, price, quantity);
        order.time_in_force = match tif {
            0 | 1 => TimeInForce::Gtc,
            2 => TimeInForce::Ioc,
            _ => TimeInForce::Fok,
        };
        order.post_only = post_only;
        order.self_trade_prevention = [
            SelfTradePrevention::CancelNewest,
            SelfTradePrevention::CancelOldest,
            SelfTradePrevention::Decrement,
            SelfTradePrevention::CancelBoth,
        ][stp as usize];
        if side == Side::Sell {
            self.hosts_made += 1;
            let host = self.market.h100_host(account, &format!("h{}", self.hosts_made), quantity);
            order.supply = Some(GpuSet { host, gpu_mask: (1u64 << quantity) - 1 });
            if verified {
                // A fast, correct answer to the challenge (the demo class's n).
                for index in 0..quantity {
                    let gpu = self.market.engine.host_gpu(host, index).expect("registered");
                    let answer = ChallengeAnswer::Correct { n: 256, elapsed_ms: 10 };
                    self.market.apply(Command::RecordChallenge { gpu, answer });
                    let answer = ChallengeAnswer::MemoryCorrect { words_log2: 16, passes: 8, elapsed_ms: 10 };
                    self.market.apply(Command::RecordChallenge { gpu, answer });
                    assert!(self.market.engine.gpu(gpu).expect("registered").verified);
                }
            }
        }
        let options = OrderOptions {
            min_supplier_score_bps: min_score,
            verified_only: side == Side::Buy && verified,
            all_or_none: aon,
            budget_minor: budget,
            stop_price_minor_per_gpu_hour: stop.map_or(0, |ticks| BASE + ticks * TICK),
        };
        let events = match (min_score, side == Side::Buy && verified) {
            _ if aon || budget > 0 || stop.is_some() => {
                self.market.apply(Command::Place { order: order.clone(), options, regions: Vec::new(), cluster: None })
            }
            (0, false) => self.market.place(order.clone()),
            (min_supplier_score_bps, false) => self.market.apply(Command::Place {
                order: order.clone(),
                options: OrderOptions { min_supplier_score_bps, ..OrderOptions::default() },
                regions: Vec::new(),
                cluster: None,
            }),
            (min_supplier_score_bps, true) => self.market.apply(Command::Place {
                order: order.clone(),
                options: OrderOptions { min_supplier_score_bps, verified_only: true, ..OrderOptions::default() },
                regions: Vec::new(),
                cluster: None,
            }),
        };
        self.placed.push(accepted(&events));
        self.stp_by_key.push(stp);

        let budget_left = (budget > 0).then(|| budget.min(price * quantity as u64));
        let taker = RefOrder {
            key,
            trader,
            side,
            price,
            quantity,
            priority: self.reference.clock,
            post_only,
            min_score,
            verified,
            aon,
            budget_left,
        };
        self.reference.clock += 1;
        let best_opposite = self.reference.makers(side, price).first().map(|&i| self.reference.resting[i].price);
        if post_only && tif < 2 && best_opposite.is_some() {
            assert_eq!(rejection(&events), Some(RejectCode::PostOnlyWouldCross));
            return;
        }
        if post_only && tif >= 2 {
            assert_eq!(rejection(&events), Some(RejectCode::PostOnlyNotLimit));
            return;
        }
        if budget > 0 && budget < price {
            assert_eq!(rejection(&events), Some(RejectCode::BudgetTooSmall));
            return;
        }
        if let Some(stop_ticks) = stop {
            let stop_price = BASE + stop_ticks * TICK;
            let reached =
                self.reference.last_trade.is_some_and(|last| if side == Side::Buy { last >= stop_price } else { last <= stop_price });
            if reached {
                assert_eq!(rejection(&events), Some(RejectCode::StopWouldTrigger));
                return;
            }
            assert!(accepted(&events).is_some(), "{:?}", rejection(&events));
            self.reference.stops.push(RefStop { order: taker, stop_price, stp, tif, triggered: false });
            return;
        }
        assert!(accepted(&events).is_some(), "{:?}", rejection(&events));
        self.reference.enter(taker, stp, tif);
    }

    fn cancel(&mut self, pick: usize) {
        if self.placed.is_empty() {
            return;
        }
        let key = pick % self.placed.len();
        let Some(id) = self.placed[key] else { return };
        let account = self.market.engine.order(id).map(|o| o.account);
        let events = match account {
            Some(account) => self.market.apply(Command::CancelOrder { account, order: id }),
            None => self.market.apply(Command::CancelOrder { account: self.traders[0], order: id }),
        };
        let armed = self.reference.stops.iter().position(|s| s.order.key == key);
        match (self.reference.resting.iter().position(|o| o.key == key), armed) {
            (Some(index), _) => {
                assert_eq!(closed(&events, id), Some(OrderCloseReason::Cancelled));
                self.reference.resting.remove(index);
            }
            (None, Some(index)) => {
                assert_eq!(closed(&events, id), Some(OrderCloseReason::Cancelled));
                self.reference.stops.remove(index);
            }
            (None, None) => assert_eq!(rejection(&events), Some(RejectCode::UnknownOrder)),
        }
    }

    fn replace(&mut self, pick: usize, ticks: u64, quantity: u32) {
        let Some(index) = (!self.reference.resting.is_empty()).then(|| pick % self.reference.resting.len()) else { return };
        let old = self.reference.resting[index].clone();
        let id = self.placed[old.key].expect("resting orders were accepted");
        let price = BASE + ticks * TICK;
        let account = self.traders[old.trader];
        let events = self.market.apply(Command::ReplaceOrder { account, order: id, price_minor_per_gpu_hour: price, quantity });
        if old.side == Side::Sell && quantity > old.quantity {
            assert_eq!(rejection(&events), Some(RejectCode::ReplaceInvalid));
            return;
        }
        let crossing = !self.reference.makers(old.side, price).is_empty();
        if old.post_only && crossing {
            assert_eq!(rejection(&events), Some(RejectCode::PostOnlyWouldCross));
            return;
        }
        assert_eq!(rejection(&events), None);
        if price == old.price && quantity <= old.quantity {
            self.reference.resting[index].quantity = quantity;
            if old.aon && quantity < old.quantity {
                self.reference.sweep_due = true;
            }
            return;
        }
        let mut order = self.reference.resting.remove(index);
        order.price = price;
        order.quantity = quantity;
        order.priority = self.reference.clock;
        self.reference.clock += 1;
        let stp = self.stp_by_key[old.key];
        if order.aon && self.reference.fillable(&order, quantity) < quantity {
            self.reference.resting.push(order);
            return;
        }
        self.reference.run(order, stp, true);
    }

    fn engine_trades(&self) -> Vec<(u64, u32, usize, usize)> {
        let key_of = |id: OrderId| self.placed.iter().position(|p| *p == Some(id)).expect("known order");
        self.market
            .log
            .iter()
            .filter_map(|e| match e.kind {
                EventKind::Trade { price_minor_per_gpu_hour, quantity, buy_order, sell_order, .. } => {
                    Some((price_minor_per_gpu_hour, quantity, key_of(buy_order), key_of(sell_order)))
                }
                _ => None,
            })
            .collect()
    }

    fn check(&self) {
        assert_eq!(self.engine_trades(), self.reference.trades, "trades differ");
        for side in [Side::Buy, Side::Sell] {
            assert_eq!(self.market.engine.depth(H100_SPOT, side), self.reference.depth(side), "{side:?} book differs");
        }
        for order in &self.reference.resting {
            let id = self.placed[order.key].expect("accepted");
            assert_eq!(self.market.engine.order(id).map(|o| o.quantity), Some(order.quantity), "open quantity differs");
        }
        assert_eq!(self.market.engine.open_order_count() as usize, self.reference.resting.len() + self.reference.stops.len());
        // Funds are conserved: every renter's available + held equals its deposit.
        for &account in &self.traders {
            let (available, held) = self.market.engine.funds(account).expect("account");
            assert!(available + held <= 1 << 50);
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    #[test]
    fn the_engine_matches_the_reference_model(ops in prop::collection::vec(op(), 1..120)) {
        let mut harness = Harness::new();
        for op in ops {
            match op {
                Op::Place(placement) => harness.place(placement),
                Op::Cancel { pick } => harness.cancel(pick),
                Op::Replace { pick, ticks, quantity } => harness.replace(pick, ticks, quantity),
            }
            harness.reference.follow_ons();
            harness.check();
        }
    }
}
