//! Order storage and the price ladder of one book.
//!
//! Orders live in one slab shared by all books; an [`OrderId`] carries its slab
//! slot, so lookup is an index. Each price level keeps its orders in an
//! intrusive doubly linked list threaded through the slab (time priority, O(1)
//! unlink on cancel). Levels live in a per-side slab, and a ladder of
//! `(key, level)` pairs sorted so that the best price is the last element: the
//! best price is O(1), a fill that empties the best level pops the ladder, and
//! only a new or emptied level away from the top moves ladder entries. Nothing
//! here allocates once the slabs and ladders have grown to the book's working size.

use crate::command::{GpuSet, LeaseDuration, SelfTradePrevention, Side};
use crate::ids::{AccountId, InstrumentId, OrderId};

pub(crate) const NIL: u32 = u32::MAX;

/// One order as the engine keeps it while it is open.
#[derive(Clone, Copy, Debug, serde::Serialize, serde::Deserialize)]
pub(crate) struct Order {
    pub generation: u32,
    pub live: bool,
    pub prev: u32,
    pub next: u32,
    pub level: u32,
    pub resting: bool,
    pub instrument: InstrumentId,
    pub account: AccountId,
    pub client_order_id: u64,
    pub side: Side,
    pub price: u64,
    /// Open quantity. For a GPU-backed ask it always equals the mask's popcount.
    pub quantity: u32,
    pub duration: LeaseDuration,
    pub self_trade: SelfTradePrevention,
    pub one_host: bool,
    pub post_only: bool,
    pub supply: Option<GpuSet>,
    /// Funds held per open GPU of a bid (limit price x hours).
    pub hold_per_gpu_minor: u64,
    pub expire_at_ms: Option<u64>,
    /// A bid's minimum seller score (0: any seller).
    pub min_supplier_score_bps: u32,
    /// A bid that trades with verified GPUs only.
    pub verified_only: bool,
    /// A bid that trades all of its quantity in one pass or nothing.
    pub all_or_none: bool,
    /// A budget bid while it takes liquidity: what it may still spend (held
    /// as one lump, `hold_per_gpu_minor` is 0). Once it rests it is a plain
    /// bid and this is `None`.
    pub budget_left_minor: Option<u64>,
    /// An armed stop order's trigger price: it is off the book, holds and
    /// locks nothing, until the last trade price reaches it.
    pub stop_price: Option<u64>,
    /// A bid's regions (bit `i`: the listing's region `i`; 0: any region).
    pub regions: u32,
    /// A bid that carries a workload: it trades only with suppliers that
    /// can deliver one (`Engine::set_delivering`).
    pub needs_delivery: bool,
    /// A cluster bid's hosts (0: not a cluster bid) and the least fabric
    /// bandwidth each must have declared, Gb/s.
    pub nodes: u16,
    pub min_fabric_gbps: u32,
    /// When it joined its price level's queue (`BookSide::push_back`):
    /// within a level orders stand in ascending `priority`, so `(price,
    /// priority)` marks a place in the side's price-time order that stays
    /// meaningful when the orders around it leave (`book_offers` pages).
    pub priority: u64,
}

impl Order {
    pub fn vacant() -> Self {
        Order {
            generation: 0,
            live: false,
            prev: NIL,
            next: NIL,
            level: NIL,
            resting: false,
            instrument: InstrumentId(0),
            account: AccountId(0),
            client_order_id: 0,
            side: Side::Buy,
            price: 0,
            quantity: 0,
            duration: LeaseDuration::UntilCancelled,
            self_trade: SelfTradePrevention::CancelNewest,
            one_host: false,
            post_only: false,
            supply: None,
            hold_per_gpu_minor: 0,
            expire_at_ms: None,
            min_supplier_score_bps: 0,
            verified_only: false,
            needs_delivery: false,
            nodes: 0,
            min_fabric_gbps: 0,
            all_or_none: false,
            budget_left_minor: None,
            stop_price: None,
            regions: 0,
            priority: 0,
        }
    }
}

#[derive(Clone, Default, serde::Serialize, serde::Deserialize)]
pub(crate) struct OrderSlab {
    orders: Vec<Order>,
    free: Vec<u32>,
    live: u32,
}

impl OrderSlab {
    pub fn live_count(&self) -> u32 {
        self.live
    }

    /// Stores a new order and returns its id. The caller checks the live bound.
    pub fn insert(&mut self, mut order: Order) -> OrderId {
        order.live = true;
        self.live += 1;
        match self.free.pop() {
            Some(slot) => {
                let generation = self.orders[slot as usize].generation;
                order.generation = generation;
                self.orders[slot as usize] = order;
                OrderId::from_parts(slot, generation)
            }
            None => {
                let slot = self.orders.len() as u32;
                order.generation = 0;
                self.orders.push(order);
                OrderId::from_parts(slot, 0)
            }
        }
    }

    pub fn remove(&mut self, id: OrderId) {
        let order = &mut self.orders[id.slot() as usize];
        assert!(order.live && order.generation == id.generation(), "removing a dead order");
        order.live = false;
        order.generation = order.generation.wrapping_add(1);
        self.live -= 1;
        self.free.push(id.slot());
    }

    pub fn get(&self, id: OrderId) -> Option<&Order> {
        self.orders.get(id.slot() as usize).filter(|order| order.live && order.generation == id.generation())
    }

    pub fn get_mut(&mut self, id: OrderId) -> Option<&mut Order> {
        self.orders.get_mut(id.slot() as usize).filter(|order| order.live && order.generation == id.generation())
    }

    pub fn at(&self, slot: u32) -> &Order {
        &self.orders[slot as usize]
    }

    pub fn at_mut(&mut self, slot: u32) -> &mut Order {
        &mut self.orders[slot as usize]
    }

    pub fn id_at(&self, slot: u32) -> OrderId {
        OrderId::from_parts(slot, self.orders[slot as usize].generation)
    }

    /// Live orders in slot order (deterministic), for snapshots and hashing.
    pub fn iter_live(&self) -> impl Iterator<Item = (OrderId, &Order)> {
        self.orders
            .iter()
            .enumerate()
            .filter(|(_, order)| order.live)
            .map(|(slot, order)| (OrderId::from_parts(slot as u32, order.generation), order))
    }
}

#[derive(Clone, Copy, Debug, serde::Serialize, serde::Deserialize)]
pub(crate) struct Level {
    pub price: u64,
    pub quantity: u64,
    pub head: u32,
    pub tail: u32,
}

#[derive(Clone, Default, serde::Serialize, serde::Deserialize)]
pub(crate) struct BookSide {
    levels: Vec<Level>,
    free_levels: Vec<u32>,
    /// `(key, level)`, sorted by descending key; the best price is last.
    ladder: Vec<(u64, u32)>,
    side_is_bid: bool,
    /// The last `Order::priority` given on this side.
    last_priority: u64,
}

impl BookSide {
    fn new(side: Side) -> Self {
        BookSide { side_is_bid: side == Side::Buy, ..Default::default() }
    }

    /// Bids sort by descending price, asks by ascending, both via one key.
    fn key(&self, price: u64) -> u64 {
        if self.side_is_bid {
            !price
        } else {
            price
        }
    }

    fn position(&self, price: u64) -> Result<usize, usize> {
        let key = self.key(price);
        self.ladder.binary_search_by(|&(other, _)| key.cmp(&other))
    }

    pub fn best_price(&self) -> Option<u64> {
        self.ladder.last().map(|&(_, level)| self.levels[level as usize].price)
    }

    pub fn level_count(&self) -> usize {
        self.ladder.len()
    }

    /// The level at a ladder position; the best is at `level_count() - 1`.
    pub fn level_at(&self, position: usize) -> u32 {
        self.ladder[position].1
    }

    pub fn level(&self, level: u32) -> &Level {
        &self.levels[level as usize]
    }

    /// Levels from best to worst as `(price, quantity)`.
    pub fn depth(&self) -> impl Iterator<Item = (u64, u64)> + '_ {
        self.ladder.iter().rev().map(|&(_, level)| {
            let level = &self.levels[level as usize];
            (level.price, level.quantity)
        })
    }

    /// The slots of resting orders from the best price to the worst, in
    /// time order within a price: `take` of them after the first `skip`.
    pub fn slots(&self, slab: &OrderSlab, skip: usize, take: usize) -> Vec<u32> {
        let mut slots = Vec::with_capacity(take.min(256));
        let mut seen = 0;
        for &(_, level) in self.ladder.iter().rev() {
            let mut slot = self.levels[level as usize].head;
            while slot != NIL {
                if seen >= skip {
                    if slots.len() == take {
                        return slots;
                    }
                    slots.push(slot);
                }
                seen += 1;
                slot = slab.at(slot).next;
            }
        }
        slots
    }

    /// The slots of resting orders after the place `(price, priority)` in
    /// price-time order (all of them without one), best first: `take` at
    /// most. A place whose order has left still marks where it stood.
    pub fn slots_after(&self, slab: &OrderSlab, after: Option<(u64, u64)>, take: usize) -> Vec<u32> {
        let mut slots = Vec::with_capacity(take.min(256));
        // The ladder is worst first: the levels below `start` are the
        // place's own and the worse ones.
        let start = match after {
            Some((price, _)) => match self.position(price) {
                Ok(position) => position + 1,
                Err(position) => position,
            },
            None => self.ladder.len(),
        };
        for &(_, level) in self.ladder[..start].iter().rev() {
            let mut slot = self.levels[level as usize].head;
            while slot != NIL {
                let order = slab.at(slot);
                let passed = after.is_some_and(|(price, priority)| order.price == price && order.priority <= priority);
                if !passed {
                    if slots.len() == take {
                        return slots;
                    }
                    slots.push(slot);
                }
                slot = order.next;
            }
        }
        slots
    }

    /// Appends the order at `slot` to the tail of its price level; returns
    /// the level's new total quantity.
    pub fn push_back(&mut self, slab: &mut OrderSlab, slot: u32) -> u64 {
        let (price, quantity) = {
            let order = slab.at(slot);
            (order.price, order.quantity as u64)
        };
        let level_index = match self.position(price) {
            Ok(position) => self.ladder[position].1,
            Err(position) => {
                let level = Level { price, quantity: 0, head: NIL, tail: NIL };
                let index = match self.free_levels.pop() {
                    Some(index) => {
                        self.levels[index as usize] = level;
                        index
                    }
                    None => {
                        self.levels.push(level);
                        (self.levels.len() - 1) as u32
                    }
                };
                self.ladder.insert(position, (self.key(price), index));
                index
            }
        };
        let level = &mut self.levels[level_index as usize];
        let old_tail = level.tail;
        level.tail = slot;
        if old_tail == NIL {
            level.head = slot;
        } else {
            slab.at_mut(old_tail).next = slot;
        }
        level.quantity += quantity;
        let total = level.quantity;
        self.last_priority += 1;
        let order = slab.at_mut(slot);
        order.prev = old_tail;
        order.next = NIL;
        order.level = level_index;
        order.resting = true;
        order.priority = self.last_priority;
        total
    }

    /// Unlinks the order at `slot`; returns its level's remaining quantity.
    pub fn unlink(&mut self, slab: &mut OrderSlab, slot: u32) -> u64 {
        let (prev, next, level_index, quantity, price) = {
            let order = slab.at_mut(slot);
            debug_assert!(order.resting);
            order.resting = false;
            (order.prev, order.next, order.level, order.quantity as u64, order.price)
        };
        if prev != NIL {
            slab.at_mut(prev).next = next;
        }
        if next != NIL {
            slab.at_mut(next).prev = prev;
        }
        let level = &mut self.levels[level_index as usize];
        if level.head == slot {
            level.head = next;
        }
        if level.tail == slot {
            level.tail = prev;
        }
        level.quantity -= quantity;
        let left = level.quantity;
        if level.head == NIL {
            assert_eq!(left, 0, "an empty level must hold no quantity");
            self.remove_level(price, level_index);
        }
        left
    }

    /// Lowers a resting order's quantity in place (priority kept); returns the
    /// level's remaining quantity.
    pub fn reduce(&mut self, slab: &mut OrderSlab, slot: u32, by: u32) -> u64 {
        let order = slab.at_mut(slot);
        debug_assert!(order.resting && order.quantity >= by);
        order.quantity -= by;
        let level = &mut self.levels[order.level as usize];
        level.quantity -= by as u64;
        level.quantity
    }

    fn remove_level(&mut self, price: u64, level_index: u32) {
        let position = self.position(price).expect("a level with orders is on the ladder");
        // The best level is last, so emptying it by trading is a pop.
        self.ladder.remove(position);
        self.free_levels.push(level_index);
    }
}

#[derive(Clone, serde::Serialize, serde::Deserialize)]
pub(crate) struct Book {
    pub bids: BookSide,
    pub asks: BookSide,
}

impl Book {
    pub fn new() -> Self {
        Book { bids: BookSide::new(Side::Buy), asks: BookSide::new(Side::Sell) }
    }

    pub fn side(&self, side: Side) -> &BookSide {
        match side {
            Side::Buy => &self.bids,
            Side::Sell => &self.asks,
        }
    }

    pub fn side_mut(&mut self, side: Side) -> &mut BookSide {
        match side {
            Side::Buy => &mut self.bids,
            Side::Sell => &mut self.asks,
        }
    }
}

/// Whether a buy at `bid` and a sell at `ask` cross.
pub(crate) fn crosses(taker_side: Side, taker_price: u64, maker_price: u64) -> bool {
    match taker_side {
        Side::Buy => maker_price <= taker_price,
        Side::Sell => maker_price >= taker_price,
    }
}
