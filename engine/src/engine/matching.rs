//! Crossing an incoming order with the book in price-time priority, and what
//! a fill creates: a lease (spot, preemptible), contracts (a reserved window
//! sold by a supplier) or a contract transfer (a reserved window resold).
//!
//! GPU capacity is not fungible, so a resting ask can cross by price and still
//! be unable to serve a bid: its GPUs may be sold in a window the lease
//! would overlap, or a gang bid may need more GPUs on one host than the ask
//! has. Such makers are skipped and keep their place; the next maker in time
//! priority is tried. This is the one departure from a plain price-time book
//! and the rulebook states it.

use super::{ContractKind, Engine};
use crate::book::{crosses, Order, NIL};
use crate::command::{LeaseDuration, SelfTradePrevention, Side};
use crate::event::{EventKind, HoldReason, LeaseKind, OrderCloseReason, ReduceReason};
use crate::gpus::{lowest_bits, mask_bits, Gpu};
use crate::ids::OrderId;

enum Step {
    Continue,
    TakerClosed,
    /// A budget taker cannot pay for one more GPU at this maker's price,
    /// nor at any later one (they are no better).
    BudgetSpent,
}

impl Engine {
    /// Matches an order that just arrived (or lost priority in a replace),
    /// then rests or closes what is left of it.
    pub(crate) fn match_and_settle(&mut self, taker: OrderId, rests: bool) {
        if self.match_order(taker) {
            self.rest_or_close(taker, rests);
        }
    }

    /// Returns false when self-trade prevention closed the taker.
    pub(super) fn match_order(&mut self, taker_id: OrderId) -> bool {
        let taker = *self.orders.get(taker_id).expect("a live taker");
        let instrument = taker.instrument.0 as usize;
        let maker_side = taker.side.opposite();
        let mut position = self.books[instrument].side(maker_side).level_count();
        while position > 0 {
            let book_side = self.books[instrument].side(maker_side);
            let level = book_side.level(book_side.level_at(position - 1));
            if !crosses(taker.side, taker.price, level.price) {
                break;
            }
            let mut cursor = level.head;
            while cursor != NIL {
                let next = self.orders.at(cursor).next;
                let maker_id = self.orders.id_at(cursor);
                match self.try_match(taker_id, maker_id) {
                    Step::TakerClosed => return false,
                    Step::BudgetSpent => return true,
                    Step::Continue => {}
                }
                if self.orders.get(taker_id).expect("live taker").quantity == 0 {
                    return true;
                }
                cursor = next;
            }
            position -= 1;
        }
        true
    }

    fn try_match(&mut self, taker_id: OrderId, maker_id: OrderId) -> Step {
        let taker = *self.orders.get(taker_id).expect("live taker");
        let maker = *self.orders.get(maker_id).expect("a maker on the book is live");
        if maker.account == taker.account {
            return self.prevent_self_trade(taker_id, taker, maker_id, maker);
        }
        let (buy_id, buy, sell_id, sell) = match taker.side {
            Side::Buy => (taker_id, taker, maker_id, maker),
            Side::Sell => (maker_id, maker, taker_id, taker),
        };
        if buy.nodes > 0 {
            // A cluster bid trades whole through its plan only
            // (`cluster_plan`); an ask passes it over and it keeps its place.
            return Step::Continue;
        }
        let (capacity, usable_mask) = self.fill_capacity(&buy, &sell, sell_id);
        let mut quantity = capacity.min(buy.quantity).min(sell.quantity);
        if let Some(left) = buy.budget_left_minor {
            let affordable = left / self.cost_per_gpu(buy.instrument, maker.price, buy.duration);
            if affordable == 0 {
                return Step::BudgetSpent;
            }
            quantity = quantity.min(affordable.min(u32::MAX as u64) as u32);
        }
        if buy.all_or_none && taker.side == Side::Sell && quantity < buy.quantity {
            // A resting all-or-none bid this ask cannot fill whole keeps its
            // place. (As the taker, it entered only once it could fill whole.)
            return Step::Continue;
        }
        if quantity > 0 {
            self.execute_fill(buy_id, sell_id, quantity, usable_mask, maker.price, taker.side);
            if self.orders.get(maker_id).is_some_and(|m| m.quantity == 0) {
                self.close_order(maker_id, OrderCloseReason::Filled);
            }
            let budget_left = self.orders.get(buy_id).and_then(|b| b.budget_left_minor);
            if budget_left.is_some_and(|left| left < self.cost_per_gpu(buy.instrument, maker.price, buy.duration)) {
                // What is left pays for no GPU at this price, nor at any later one.
                return Step::BudgetSpent;
            }
        }
        Step::Continue
    }

    fn prevent_self_trade(&mut self, taker_id: OrderId, taker: Order, maker_id: OrderId, maker: Order) -> Step {
        match taker.self_trade {
            SelfTradePrevention::CancelNewest => {
                self.close_order(taker_id, OrderCloseReason::SelfTradePrevented);
                Step::TakerClosed
            }
            SelfTradePrevention::CancelOldest => {
                self.close_order(maker_id, OrderCloseReason::SelfTradePrevented);
                Step::Continue
            }
            SelfTradePrevention::CancelBoth => {
                self.close_order(maker_id, OrderCloseReason::SelfTradePrevented);
                self.close_order(taker_id, OrderCloseReason::SelfTradePrevented);
                Step::TakerClosed
            }
            SelfTradePrevention::Decrement => {
                let by = taker.quantity.min(maker.quantity);
                self.reduce_order(maker_id, by, None, ReduceReason::SelfTradeDecrement);
                self.reduce_order(taker_id, by, None, ReduceReason::SelfTradeDecrement);
                if self.orders.get(taker_id).is_some() {
                    Step::Continue
                } else {
                    Step::TakerClosed
                }
            }
        }
    }

    /// How many GPUs `sell` (order `sell_id`) can deliver to `buy` now, and
    /// which (for a GPU-backed ask).
    pub(super) fn fill_capacity(&self, buy: &Order, sell: &Order, sell_id: OrderId) -> (u32, u64) {
        // A bid that asks for reliable sellers skips the others (they keep their place).
        if buy.min_supplier_score_bps > 0 && self.supplier_scores.get(&sell.account).is_none_or(|s| *s < buy.min_supplier_score_bps) {
            return (0, 0);
        }
        if self.instruments[buy.instrument.0 as usize].kind == ContractKind::LeaseResale {
            return (self.resale_capacity(buy, sell_id), 0);
        }
        let Some(set) = sell.supply else {
            // A resale of contracts: any quantity, but never a gang bid's one
            // host, nor a bid for verified GPUs or for regions (a contract
            // names no GPU, nor host, the buyer can check before the window).
            return if buy.one_host || buy.verified_only || buy.regions != 0 { (0, 0) } else { (sell.quantity, 0) };
        };
        // A bid with a workload skips suppliers that cannot deliver one (they keep their place).
        if buy.needs_delivery && !self.delivering.contains(&sell.account) {
            return (0, 0);
        }
        let kind = self.instruments[buy.instrument.0 as usize].kind;
        let notice_ms = self.notice_ms(buy.instrument);
        let host = &self.hosts[set.host.0 as usize];
        // A bid for some regions skips hosts elsewhere (they keep their place).
        if !host_in_regions(host.region, buy.regions) {
            return (0, 0);
        }
        let usable = mask_bits(set.gpu_mask)
            .filter(|&bit| {
                let gpu = &self.gpus[host.gpus[bit as usize].0 as usize];
                if buy.verified_only && !gpu.verified {
                    return false;
                }
                match kind {
                    ContractKind::Reserved { .. } => true,
                    ContractKind::Spot => spot_start_ms(gpu, self.now_ms, notice_ms, buy.duration).is_some(),
                    ContractKind::Preemptible => preemptible_fits(gpu, self.now_ms, notice_ms),
                    // Answered above: a resale book's asks are leases.
                    ContractKind::LeaseResale => false,
                }
            })
            .fold(0u64, |mask, bit| mask | (1u64 << bit));
        let count = usable.count_ones();
        if buy.one_host && count < buy.quantity {
            (0, 0)
        } else {
            (count, usable)
        }
    }

    /// How much of `needed` the taker could trade at once, counting makers in
    /// priority order up to the first resting order of its own account.
    pub(crate) fn fillable_quantity(&self, taker_id: OrderId, needed: u32) -> u32 {
        let taker = *self.orders.get(taker_id).expect("live taker");
        let book_side = self.books[taker.instrument.0 as usize].side(taker.side.opposite());
        let mut remaining_supply = taker.supply.map(|set| set.gpu_mask);
        let mut budget_left = taker.budget_left_minor;
        let mut found = 0u32;
        for position in (0..book_side.level_count()).rev() {
            let level = book_side.level(book_side.level_at(position));
            if !crosses(taker.side, taker.price, level.price) {
                break;
            }
            let mut cursor = level.head;
            while cursor != NIL {
                let maker = *self.orders.at(cursor);
                let maker_id = self.orders.id_at(cursor);
                if maker.account == taker.account {
                    return found;
                }
                let capacity = match taker.side {
                    Side::Buy => {
                        let (capacity, _) = self.fill_capacity(&taker, &maker, maker_id);
                        if taker.one_host && capacity >= taker.quantity {
                            return taker.quantity;
                        }
                        let mut take = capacity.min(maker.quantity);
                        if let Some(left) = budget_left.as_mut() {
                            let cost_per_gpu = self.cost_per_gpu(taker.instrument, maker.price, taker.duration);
                            let affordable = (*left / cost_per_gpu).min(u32::MAX as u64) as u32;
                            if affordable == 0 {
                                return found;
                            }
                            take = take.min(affordable).min(needed - found);
                            *left -= take as u64 * cost_per_gpu;
                        }
                        take
                    }
                    // A cluster bid fills through its plan only.
                    Side::Sell if maker.nodes > 0 => 0,
                    Side::Sell => {
                        let mut seller = taker;
                        if let (Some(set), Some(mask)) = (seller.supply.as_mut(), remaining_supply) {
                            set.gpu_mask = mask;
                        }
                        let (capacity, usable) = self.fill_capacity(&maker, &seller, taker_id);
                        let whole = capacity.min(maker.quantity).min(taker.quantity - found);
                        // An all-or-none bid takes all of its quantity or is passed over.
                        let take = if maker.all_or_none && whole < maker.quantity { 0 } else { whole.min(needed - found) };
                        remaining_supply = remaining_supply.map(|mask| mask & !lowest_bits(usable, take));
                        take
                    }
                };
                found = found.saturating_add(capacity);
                if found >= needed {
                    return found;
                }
                cursor = maker.next;
            }
        }
        found
    }

    /// One fill of `quantity` between a bid and an ask at `price`.
    pub(super) fn execute_fill(&mut self, buy_id: OrderId, sell_id: OrderId, quantity: u32, usable_mask: u64, price: u64, aggressor: Side) {
        let buy = *self.orders.get(buy_id).expect("live bid");
        let sell = *self.orders.get(sell_id).expect("live ask");
        let instrument = buy.instrument;
        self.emit(EventKind::Trade {
            instrument,
            price_minor_per_gpu_hour: price,
            quantity,
            aggressor,
            buy_order: buy_id,
            sell_order: sell_id,
            buyer: buy.account,
            seller: sell.account,
        });
        self.note_trade(instrument, price);
        self.shrink_quantity(buy_id, quantity, 0);
        if let Some(left) = buy.budget_left_minor {
            // A budget bid pays from its lump: what these GPUs cost moves to their lease or contracts.
            let cost = self.cost_per_gpu(instrument, price, buy.duration) * quantity as u64;
            self.orders.get_mut(buy_id).expect("live bid").budget_left_minor = Some(left - cost);
            self.release(buy.account, cost, HoldReason::Order(buy_id));
        }
        let kind = self.instruments[instrument.0 as usize].kind;
        match sell.supply {
            Some(set) => {
                let taken = lowest_bits(usable_mask, quantity);
                self.detach_gpus(sell_id, set, taken, instrument);
                self.shrink_quantity(sell_id, quantity, taken);
                match kind {
                    ContractKind::Spot => self.create_lease(LeaseKind::Spot, &buy, sell.account, set.host, taken, price),
                    ContractKind::Preemptible => self.create_lease(LeaseKind::Preemptible, &buy, sell.account, set.host, taken, price),
                    ContractKind::Reserved { .. } => self.sell_contracts(&buy, sell.account, set.host, taken, price),
                    ContractKind::LeaseResale => unreachable!("a resale book's asks name no GPUs"),
                }
            }
            None if kind == ContractKind::LeaseResale => {
                self.shrink_quantity(sell_id, quantity, 0);
                self.resell_lease(&buy, sell_id, sell.account, price);
            }
            None => {
                self.shrink_quantity(sell_id, quantity, 0);
                self.resell_contracts(buy.account, sell_id, sell.account, instrument, quantity, price);
            }
        }
    }

    pub(crate) fn notice_ms(&self, instrument: crate::ids::InstrumentId) -> u64 {
        self.config.classes[self.instruments[instrument.0 as usize].class as usize].preemption_notice_ms
    }
}

/// When a spot lease of `duration` could start on `gpu`: now, or after the
/// notice of the preemptible lease it displaces. `None` when the GPU is
/// offline, exclusively leased, or sold in a window the lease would overlap
/// (a window only offered gives the GPU up to the lease).
pub(crate) fn spot_start_ms(gpu: &Gpu, now_ms: u64, notice_ms: u64, duration: LeaseDuration) -> Option<u64> {
    if !gpu.online || gpu.exclusive_lease.is_some() {
        return None;
    }
    let start_ms = if gpu.preemptible_lease.is_some() { now_ms + notice_ms } else { now_ms };
    let end_ms = duration.length_ms().map(|length| start_ms + length);
    (!gpu.sold_during(now_ms, end_ms)).then_some(start_ms)
}

/// A preemptible lease needs a GPU nobody uses and no window starting within
/// the notice period (a later window preempts it with full notice).
pub(crate) fn preemptible_fits(gpu: &Gpu, now_ms: u64, notice_ms: u64) -> bool {
    gpu.online
        && gpu.exclusive_lease.is_none()
        && gpu.preemptible_lease.is_none()
        && !gpu.committed_during(now_ms, Some(now_ms + notice_ms + 1))
}

/// Whether a host in `region` serves a bid for `regions` (0: any region;
/// an undeclared host serves only such bids).
pub(crate) fn host_in_regions(region: Option<u8>, regions: u32) -> bool {
    regions == 0 || region.is_some_and(|r| regions & (1u32 << r) != 0)
}
