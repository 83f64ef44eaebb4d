//! What a command (or a timer) sets off after its own matching: stop orders
//! its trades triggered, and all-or-none bids that the liquidity it added
//! (or time passing) may now fill whole. Both run before the command ends, in a fixed order,
//! so the same journal always gives the same events.

use super::{ArmedStop, Engine};
use crate::book::NIL;
use crate::command::{NewOrder, OrderOptions, Side};
use crate::event::{EventKind, OrderCloseReason};
use crate::ids::{InstrumentId, OrderId};
use crate::limits;

/// How often a book's crossing all-or-none bids are re-checked while it has any.
const ALL_OR_NONE_RECHECK_MS: u64 = 1_000;

impl Engine {
    /// Runs follow-ons until none is left: first every due all-or-none
    /// sweep, then the oldest triggered stop (whose trades may trigger more
    /// stops, and whose resting ask may make more sweeps due).
    pub(super) fn run_follow_ons(&mut self) {
        loop {
            if !self.all_or_none_due.is_empty() {
                let instrument = self.all_or_none_due.remove(0);
                self.sweep_all_or_none(instrument);
            } else if let Some(stop) = self.stops_triggered.pop_front() {
                self.enter_triggered_stop(stop);
            } else {
                return;
            }
        }
    }

    /// Marks `instrument`'s all-or-none bids for a re-check before the command ends.
    pub(crate) fn all_or_none_due_in(&mut self, instrument: InstrumentId) {
        if !self.all_or_none_due.contains(&instrument) {
            self.all_or_none_due.push(instrument);
        }
    }

    /// Schedules a re-check of `instrument`'s all-or-none bids a second
    /// from now, unless one is pending.
    pub(crate) fn schedule_all_or_none_recheck(&mut self, instrument: InstrumentId) {
        if self.all_or_none_recheck.insert(instrument) {
            self.schedule(self.now_ms + ALL_OR_NONE_RECHECK_MS, super::TimerKind::AllOrNoneRecheck(instrument));
        }
    }

    /// The re-check timer fired: sweep the book if an all-or-none bid
    /// still crosses its best ask (and check again a second later).
    pub(super) fn recheck_all_or_none(&mut self, instrument: InstrumentId) {
        self.all_or_none_recheck.remove(&instrument);
        if !self.crossing_all_or_none(instrument, 1).is_empty() {
            self.all_or_none_due_in(instrument);
        }
    }

    /// Up to `max` resting all-or-none bids that cross the best ask, best first.
    fn crossing_all_or_none(&self, instrument: InstrumentId, max: usize) -> Vec<OrderId> {
        let book = &self.books[instrument.0 as usize];
        let Some(best_ask) = book.side(Side::Sell).best_price() else { return Vec::new() };
        let bids = book.side(Side::Buy);
        let mut found = Vec::new();
        for position in (0..bids.level_count()).rev() {
            let level = bids.level(bids.level_at(position));
            if level.price < best_ask {
                break;
            }
            let mut cursor = level.head;
            while cursor != NIL {
                let order = self.orders.at(cursor);
                if order.all_or_none {
                    found.push(self.orders.id_at(cursor));
                    if found.len() == max {
                        return found;
                    }
                }
                cursor = order.next;
            }
        }
        found
    }

    /// The resting all-or-none bids that cross the best ask, best first (at
    /// most `ALL_OR_NONE_SWEEP_MAX`), each trades whole if it now can, as
    /// the taker at the asks' prices.
    fn sweep_all_or_none(&mut self, instrument: InstrumentId) {
        let mut left = false;
        for id in self.crossing_all_or_none(instrument, limits::ALL_OR_NONE_SWEEP_MAX) {
            let Some(order) = self.orders.get(id) else { continue };
            let quantity = order.quantity;
            if order.nodes > 0 {
                match self.cluster_plan(id) {
                    Some(plan) => self.fill_cluster(id, plan),
                    None => left = true,
                }
            } else if self.fillable_quantity(id, quantity) >= quantity
                && self.match_order(id)
                && self.orders.get(id).is_some_and(|o| o.quantity == 0)
            {
                self.close_order(id, OrderCloseReason::Filled);
            } else {
                left = true;
            }
        }
        if left {
            self.schedule_all_or_none_recheck(instrument);
        }
    }

    /// Arms a stop order just accepted and backed (a bid's funds held, an
    /// ask's GPUs or contracts locked, as the order it would become): it is
    /// off the book; it expires like any order with a GTT.
    pub(super) fn arm_stop(&mut self, id: OrderId, new: &NewOrder, options: &OrderOptions, stop_price: u64) {
        self.accounts[new.account.0 as usize].armed_stops += 1;
        self.stop_seq += 1;
        let seq = self.stop_seq;
        self.armed_stops.insert(id, ArmedStop { seq, order: new.clone(), options: *options });
        self.stop_index.insert((new.instrument, new.side, stop_price, seq, id));
        self.emit(EventKind::StopArmed { order: id, account: new.account, stop_price_minor_per_gpu_hour: stop_price });
        if let Some(expire_at_ms) = self.orders.get(id).expect("just accepted").expire_at_ms {
            self.schedule(expire_at_ms, super::TimerKind::OrderExpiry(id));
        }
    }

    /// A trade at `price` in `instrument`: records it as the last price and
    /// queues the stops it reaches, in arming order.
    pub(crate) fn note_trade(&mut self, instrument: InstrumentId, price: u64) {
        self.last_trade.insert(instrument, price);
        if self.stop_index.is_empty() {
            return;
        }
        let lowest = OrderId(0);
        let highest = OrderId(u64::MAX);
        let mut reached: Vec<(u64, OrderId, u64, Side)> = self
            .stop_index
            .range((instrument, Side::Buy, 0, 0, lowest)..=(instrument, Side::Buy, price, u64::MAX, highest))
            .chain(
                self.stop_index.range((instrument, Side::Sell, price, 0, lowest)..=(instrument, Side::Sell, u64::MAX, u64::MAX, highest)),
            )
            .map(|&(_, side, stop_price, seq, id)| (seq, id, stop_price, side))
            .collect();
        reached.sort_unstable();
        for (seq, id, stop_price, side) in reached {
            self.stop_index.remove(&(instrument, side, stop_price, seq, id));
            self.stops_triggered.push_back(id);
        }
    }

    /// Takes an armed stop out of the stop book (it closed while armed).
    pub(crate) fn disarm_stop(&mut self, id: OrderId, instrument: InstrumentId, side: Side, stop_price: u64) {
        if let Some(stop) = self.armed_stops.remove(&id) {
            self.stop_index.remove(&(instrument, side, stop_price, stop.seq, id));
            self.accounts[stop.order.account.0 as usize].armed_stops -= 1;
        }
        self.stops_triggered.retain(|&queued| queued != id);
    }

    /// A triggered stop enters the market as newly arrived, after every
    /// check a new order passes (it may fail one it passed when armed).
    fn enter_triggered_stop(&mut self, id: OrderId) {
        let Some(mut stop) = self.armed_stops.remove(&id) else { return };
        let order = self.orders.get_mut(id).expect("an armed stop is a live order");
        order.stop_price = None;
        let armed = *order;
        let (account, instrument) = (armed.account, armed.instrument);
        self.accounts[account.0 as usize].armed_stops -= 1;
        let last = self.last_trade[&instrument];
        self.emit(EventKind::StopTriggered { order: id, account, last_trade_price_minor_per_gpu_hour: last });
        // What held it while armed goes back, and the order is admitted and
        // backed anew as it stands now (GPUs leased elsewhere meanwhile have
        // left it).
        self.unback(id, &armed);
        stop.order.quantity = armed.quantity;
        stop.order.min_quantity = stop.order.min_quantity.min(armed.quantity);
        stop.order.supply = armed.supply;
        let order = self.orders.get_mut(id).expect("live");
        order.hold_per_gpu_minor = 0;
        order.budget_left_minor = None;
        match self.admit(&stop.order, &stop.options, true) {
            Ok(admission) => self.enter(id, &stop.order, admission),
            Err(code) => {
                self.emit(EventKind::StopRefused { order: id, account, code });
                self.close_order(id, OrderCloseReason::StopRefused);
            }
        }
    }
}
