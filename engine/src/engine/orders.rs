//! Order entry: validation, acceptance, cancel, cancel-replace, mass cancel
//! and expiry, and the bookkeeping every order carries with it (its funds hold
//! for a bid, the GPUs or contracts it locks for an ask).

use super::{Checked, ContractKind, Engine, InstrumentState, TimerKind};
use crate::book::{crosses, Order, NIL};
use crate::command::{GpuSet, LeaseDuration, NewOrder, OrderOptions, OrderType, Side, TimeInForce};
use crate::event::{EventKind, HoldReason, OrderCloseReason, ReduceReason, RejectCode};
use crate::gpus::{highest_bits, mask_bits, Commitment, CommitmentHolder};
use crate::ids::{AccountId, InstrumentId, OrderId};
use crate::limits;
use crate::time::MS_PER_HOUR;

/// What the validated order will do once accepted.
pub(super) struct Admission {
    price: u64,
    hold_per_gpu_minor: u64,
    no_liquidity: bool,
    /// A budget bid's lump hold: its budget, or less when `quantity` GPUs
    /// at the limit price cost less.
    budget_minor: Option<u64>,
}

impl Engine {
    pub(super) fn place_order(&mut self, new: &NewOrder, options: &OrderOptions) -> Checked<()> {
        self.place_order_in(new, options, 0)
    }

    /// The mask of the listing's regions a bid names (bit `i`: region `i`).
    pub(super) fn region_mask(&self, new: &NewOrder, regions: &[String]) -> Checked<u32> {
        if new.side != Side::Buy || regions.is_empty() || regions.len() > self.config.regions.len() {
            return Err(RejectCode::RegionFilterInvalid);
        }
        regions.iter().try_fold(0u32, |mask, name| Ok(mask | 1u32 << self.config.region_index(name).ok_or(RejectCode::UnknownRegion)?))
    }

    /// Places an order; `regions` (a mask of the listing's regions, 0: any)
    /// restricts a bid to GPUs of hosts in those regions.
    pub(super) fn place_order_in(&mut self, new: &NewOrder, options: &OrderOptions, regions: u32) -> Checked<()> {
        check_options(new, options)?;
        let mut admission = self.admit(new, options, false)?;
        let stop_price = (options.stop_price_minor_per_gpu_hour > 0).then_some(options.stop_price_minor_per_gpu_hour);
        if let Some(stop_price) = stop_price {
            self.check_stop(new, stop_price)?;
            if new.side == Side::Buy {
                admission = self.stop_hold(new, options, admission, stop_price)?;
            }
        }
        let order = Order {
            instrument: new.instrument,
            account: new.account,
            client_order_id: new.client_order_id,
            side: new.side,
            price: admission.price,
            quantity: new.quantity,
            duration: new.duration,
            self_trade: new.self_trade_prevention,
            one_host: new.one_host,
            post_only: new.post_only,
            supply: new.supply,
            hold_per_gpu_minor: 0,
            expire_at_ms: match new.time_in_force {
                TimeInForce::Gtt { expire_at_ms } => Some(expire_at_ms),
                _ => None,
            },
            min_supplier_score_bps: options.min_supplier_score_bps,
            verified_only: options.verified_only,
            all_or_none: options.all_or_none,
            stop_price,
            regions,
            needs_delivery: self.workload_expected == Some((new.account, new.client_order_id)),
            nodes: self.pending_cluster.map_or(0, |(nodes, _)| nodes),
            min_fabric_gbps: self.pending_cluster.map_or(0, |(_, gbps)| gbps),
            ..Order::vacant()
        };
        let id = self.orders.insert(order);
        self.client_ids.open(new.account, new.client_order_id, id);
        self.accounts[new.account.0 as usize].open_orders += 1;
        self.emit(EventKind::OrderAccepted {
            order: id,
            account: new.account,
            client_order_id: new.client_order_id,
            instrument: new.instrument,
            side: new.side,
            price_minor_per_gpu_hour: admission.price,
            quantity: new.quantity,
        });
        match stop_price {
            Some(stop_price) => {
                self.back(id, new, &admission);
                self.arm_stop(id, new, options, stop_price)
            }
            None => self.enter(id, new, admission),
        }
        Ok(())
    }

    /// What an armed stop bid holds: the funds of the order it would become,
    /// priced at its limit (a stop-market at its stop price, the price that
    /// triggers it), checked against the account's funds and limits.
    fn stop_hold(&self, new: &NewOrder, options: &OrderOptions, admission: Admission, stop_price: u64) -> Checked<Admission> {
        let price = match new.order_type {
            OrderType::Limit => new.price_minor_per_gpu_hour,
            OrderType::Market => stop_price,
        };
        let (hold_per_gpu_minor, budget_minor) = self.hold_for(new, options, price, false)?;
        Ok(Admission { hold_per_gpu_minor, budget_minor, ..admission })
    }

    /// Takes what backs an accepted order: a bid's funds, an ask's GPUs or
    /// contracts. `close_order` (through `unback`) gives them back.
    fn back(&mut self, id: OrderId, new: &NewOrder, admission: &Admission) {
        {
            let order = self.orders.get_mut(id).expect("an accepted order");
            order.price = admission.price;
            order.hold_per_gpu_minor = admission.hold_per_gpu_minor;
            order.budget_left_minor = admission.budget_minor;
        }
        if new.side == Side::Buy {
            let held = admission.budget_minor.unwrap_or(admission.hold_per_gpu_minor * new.quantity as u64);
            self.hold(new.account, held, HoldReason::Order(id));
        } else {
            self.lock_supply(id, new.quantity);
        }
    }

    /// Gives back what backs a live order (its funds hold, its GPUs or
    /// contracts), as `order` stands now.
    pub(super) fn unback(&mut self, id: OrderId, order: &Order) {
        match (order.side, order.supply) {
            (Side::Buy, _) => {
                let held = order.hold_per_gpu_minor * order.quantity as u64 + order.budget_left_minor.unwrap_or(0);
                self.release(order.account, held, HoldReason::Order(id));
            }
            (Side::Sell, Some(set)) => self.detach_gpus(id, set, set.gpu_mask, order.instrument),
            (Side::Sell, None) => {
                if !self.unlock_lease_offer(id, order.account) {
                    self.unlock_contracts(id, order.instrument, u32::MAX)
                }
            }
        }
    }

    /// An accepted order (new, or a stop just triggered) takes what backs
    /// it, trades what it can and rests or closes.
    pub(super) fn enter(&mut self, id: OrderId, new: &NewOrder, admission: Admission) {
        self.back(id, new, &admission);
        if admission.no_liquidity {
            self.close_order(id, OrderCloseReason::NoLiquidity);
            return;
        }
        let fok = new.time_in_force == TimeInForce::Fok;
        let all_or_none = self.orders.get(id).expect("live").all_or_none;
        let needed = if fok || all_or_none { new.quantity } else { new.min_quantity };
        let rests = new.order_type == OrderType::Limit && matches!(new.time_in_force, TimeInForce::Gtc | TimeInForce::Gtt { .. });
        if self.orders.get(id).expect("live").nodes > 0 {
            self.enter_cluster(id, rests);
            return;
        }
        if needed > 0 && self.fillable_quantity(id, needed) < needed {
            if all_or_none && rests {
                // It waits on the book, untraded, until it can fill whole.
                self.rest_or_close(id, true);
                return;
            }
            let reason = if fok || all_or_none { OrderCloseReason::Killed } else { OrderCloseReason::MinQuantityNotMet };
            self.close_order(id, reason);
            return;
        }
        self.match_and_settle(id, rests);
    }

    /// Every check of a new order, in the order the rulebook lists them.
    /// Reads only. `triggered`: a stop that was armed, whose client id and
    /// open-order slot are its own already.
    pub(super) fn admit(&self, new: &NewOrder, options: &OrderOptions, triggered: bool) -> Checked<Admission> {
        let role = self.account(new.account)?.role;
        let instrument = self.instruments.get(new.instrument.0 as usize).ok_or(RejectCode::UnknownInstrument)?;
        if instrument.state != InstrumentState::Trading {
            return Err(RejectCode::InstrumentNotTrading);
        }
        let reserved = matches!(instrument.kind, ContractKind::Reserved { .. });
        let resale = instrument.kind == ContractKind::LeaseResale;
        self.check_side(new, role, reserved, resale)?;
        self.check_terms(new, options, instrument.class, reserved)?;
        self.check_room_and_supply(new, triggered, resale)?;
        let (price, no_liquidity) = match new.order_type {
            OrderType::Limit => (new.price_minor_per_gpu_hour, false),
            OrderType::Market => match self.protected_price(new.instrument, new.side) {
                Some(price) => (price, false),
                None => (0, true),
            },
        };
        let opposite_best = self.books[new.instrument.0 as usize].side(new.side.opposite()).best_price();
        if new.post_only && opposite_best.is_some_and(|best| crosses(new.side, price, best)) {
            return Err(RejectCode::PostOnlyWouldCross);
        }
        let (hold_per_gpu_minor, budget_minor) = self.hold_for(new, options, price, triggered)?;
        Ok(Admission { price, hold_per_gpu_minor, no_liquidity, budget_minor })
    }

    /// Who may place the order's side on this book, and with what supply.
    fn check_side(&self, new: &NewOrder, role: crate::Role, reserved: bool, resale: bool) -> Checked<()> {
        match (new.side, new.supply) {
            (Side::Buy, Some(_)) => return Err(RejectCode::SupplyNotAllowed),
            (Side::Buy, None) if !role.may_buy() => return Err(RejectCode::RoleNotPermitted),
            (Side::Sell, Some(_)) if resale => return Err(RejectCode::SupplyNotAllowed),
            (Side::Sell, Some(_)) if !role.may_supply() => return Err(RejectCode::RoleNotPermitted),
            // A resale book's asks are leases, offered with OfferLease only.
            (Side::Sell, None) if resale && self.pending_lease_offer.is_none() => return Err(RejectCode::LeaseNotResellable),
            (Side::Sell, None) if !reserved && !resale => return Err(RejectCode::SupplyRequired),
            _ => {}
        }
        // A bid for what is left of a lease says the most hours it pays for.
        if resale && new.side == Side::Buy && new.duration == LeaseDuration::UntilCancelled {
            return Err(RejectCode::DurationInvalid);
        }
        Ok(())
    }

    /// The order's own terms: quantity, price, duration, budget, expiry,
    /// post-only.
    fn check_terms(&self, new: &NewOrder, options: &OrderOptions, class: u16, reserved: bool) -> Checked<()> {
        check_quantity(new.quantity)?;
        if new.min_quantity > new.quantity {
            return Err(RejectCode::MinQuantityInvalid);
        }
        if new.order_type == OrderType::Limit {
            self.check_price(class, new.price_minor_per_gpu_hour)?;
        }
        if new.side == Side::Buy && !reserved {
            check_duration(new.duration)?;
            if options.budget_minor > 0 && new.duration == LeaseDuration::UntilCancelled {
                return Err(RejectCode::BudgetInvalid);
            }
        }
        if let TimeInForce::Gtt { expire_at_ms } = new.time_in_force {
            if expire_at_ms <= self.now_ms {
                return Err(RejectCode::ExpiryInPast);
            }
        }
        let may_rest = matches!(new.time_in_force, TimeInForce::Gtc | TimeInForce::Gtt { .. });
        if new.post_only && (new.order_type != OrderType::Limit || !may_rest) {
            return Err(RejectCode::PostOnlyNotLimit);
        }
        Ok(())
    }

    /// The client order id free, an open-order slot, and what an ask
    /// offers: its GPUs, or contracts the account holds.
    fn check_room_and_supply(&self, new: &NewOrder, triggered: bool, resale: bool) -> Checked<()> {
        if !triggered && self.client_order_id_taken(new.account, new.client_order_id) {
            return Err(RejectCode::DuplicateClientOrderId);
        }
        if !triggered
            && (self.account(new.account)?.open_orders >= self.config.orders_per_account_max
                || self.orders.live_count() >= limits::ORDERS_LIVE_MAX)
        {
            return Err(RejectCode::TooManyOpenOrders);
        }
        if !triggered && self.shared_use(new.account).is_some_and(|used| used.open_orders >= limits::ORDERS_PER_PARTICIPANT_MAX) {
            return Err(RejectCode::TooManyOpenOrders);
        }
        match new.supply {
            Some(set) => self.check_supply(new.account, new.instrument, set, new.quantity),
            None if new.side == Side::Sell && !resale && self.unoffered_contracts(new.account, new.instrument) < new.quantity => {
                Err(RejectCode::InsufficientContracts)
            }
            None => Ok(()),
        }
    }

    /// What a bid holds at `price` (per GPU, or its budget) within the
    /// account's funds and limits; `(0, None)` for an ask. Returns the hold
    /// per GPU and the budget held.
    fn hold_for(&self, new: &NewOrder, options: &OrderOptions, price: u64, triggered: bool) -> Checked<(u64, Option<u64>)> {
        if new.side != Side::Buy {
            self.check_sub_account_limits(new.account, 0, !triggered)?;
            return Ok((0, None));
        }
        let per_gpu = self.hold_per_gpu(new.instrument, price, new.duration)?;
        let total = per_gpu.checked_mul(new.quantity as u64).ok_or(RejectCode::InsufficientFunds)?;
        let (hold_per_gpu_minor, budget_minor, total) = if options.budget_minor > 0 {
            // A market order's budget is checked at its protected price.
            if per_gpu > options.budget_minor {
                return Err(RejectCode::BudgetTooSmall);
            }
            (0, Some(total.min(options.budget_minor)), total.min(options.budget_minor))
        } else {
            (per_gpu, None, total)
        };
        if total > self.account(new.account)?.available_minor {
            return Err(RejectCode::InsufficientFunds);
        }
        self.check_sub_account_limits(new.account, total, !triggered)?;
        self.check_spend_limits(new.account, total)?;
        Ok((hold_per_gpu_minor, budget_minor))
    }

    /// A stop's own checks: its price, that it has not triggered already, the bound.
    fn check_stop(&self, new: &NewOrder, stop_price: u64) -> Checked<()> {
        let class = self.instruments[new.instrument.0 as usize].class;
        if self.check_price(class, stop_price).is_err() {
            return Err(RejectCode::StopPriceInvalid);
        }
        if self.last_trade.get(&new.instrument).is_some_and(|&last| stop_reached(new.side, stop_price, last)) {
            return Err(RejectCode::StopWouldTrigger);
        }
        if self.armed_stops.len() >= limits::STOPS_ARMED_MAX
            || self.account(new.account)?.armed_stops >= limits::STOPS_ARMED_PER_ACCOUNT_MAX
            || self.shared_use(new.account).is_some_and(|used| used.armed_stops >= limits::STOPS_ARMED_PER_PARTICIPANT_MAX)
        {
            return Err(RejectCode::TooManyStops);
        }
        Ok(())
    }

    pub(crate) fn check_price(&self, class: u16, price: u64) -> Checked<()> {
        let class = &self.config.classes[class as usize];
        if price == 0 {
            return Err(RejectCode::PriceNotPositive);
        }
        if !price.is_multiple_of(class.tick_minor) {
            return Err(RejectCode::PriceOffTick);
        }
        if price < class.price_min_minor_per_gpu_hour || price > class.price_max_minor_per_gpu_hour {
            return Err(RejectCode::PriceOutOfBand);
        }
        Ok(())
    }

    /// Funds a bid holds per GPU: its price for the lease's hours (the window
    /// for reserved contracts, the prepaid horizon for open-ended leases).
    /// What a bid would hold if placed now (its price x GPUs x billable
    /// hours, a market bid at its protected price, capped by its budget):
    /// the `needed` an `insufficient_funds` refusal names. `None` for an
    /// ask, or a bid whose price or book gives none.
    pub fn bid_hold(&self, new: &NewOrder, options: &OrderOptions) -> Option<u64> {
        if new.side != Side::Buy {
            return None;
        }
        let price = match new.order_type {
            OrderType::Limit => new.price_minor_per_gpu_hour,
            OrderType::Market => self.protected_price(new.instrument, new.side)?,
        };
        let total = self.hold_per_gpu(new.instrument, price, new.duration).ok()?.checked_mul(u64::from(new.quantity))?;
        Some(if options.budget_minor > 0 { total.min(options.budget_minor) } else { total })
    }

    pub(crate) fn hold_per_gpu(&self, instrument: InstrumentId, price: u64, duration: LeaseDuration) -> Checked<u64> {
        let cost = (price as u128 * self.billable_ms(instrument, duration) as u128).div_ceil(MS_PER_HOUR as u128);
        u64::try_from(cost).map_err(|_| RejectCode::InsufficientFunds)
    }

    /// What one GPU costs at `price` for the time a bid of `duration` pays
    /// up front, rounded up to the minor unit (whole hours are exact).
    /// Orders passed `hold_per_gpu`, so this cannot overflow for them.
    pub(crate) fn cost_per_gpu(&self, instrument: InstrumentId, price: u64, duration: LeaseDuration) -> u64 {
        (price as u128 * self.billable_ms(instrument, duration) as u128).div_ceil(MS_PER_HOUR as u128) as u64
    }

    /// The time a bid of `duration` pays for up front: a window's whole
    /// hours, a fixed length, or an open-ended lease's prepaid horizon.
    fn billable_ms(&self, instrument: InstrumentId, duration: LeaseDuration) -> u64 {
        match (self.instruments[instrument.0 as usize].kind, duration.length_ms()) {
            (ContractKind::Reserved { window_start_ms, window_end_ms }, _) => (window_end_ms - window_start_ms) / MS_PER_HOUR * MS_PER_HOUR,
            (_, Some(length_ms)) => length_ms,
            (_, None) => self.config.prepaid_horizon_hours as u64 * MS_PER_HOUR,
        }
    }

    /// The worst price a market order may trade at: the best opposite price
    /// moved by the protection band, on tick and within the price band.
    fn protected_price(&self, instrument: InstrumentId, side: Side) -> Option<u64> {
        let best = self.books[instrument.0 as usize].side(side.opposite()).best_price()?;
        let class = &self.config.classes[self.instruments[instrument.0 as usize].class as usize];
        let bps = self.config.market_protection_bps as u128;
        let tick = class.tick_minor as u128;
        let price = match side {
            Side::Buy => (best as u128 * (10_000 + bps) / 10_000) / tick * tick,
            Side::Sell => (best as u128 * (10_000 - bps)).div_ceil(10_000).div_ceil(tick) * tick,
        };
        Some((price as u64).clamp(class.price_min_minor_per_gpu_hour, class.price_max_minor_per_gpu_hour))
    }

    /// Every GPU named by an ask must be the account's, online, qualified for
    /// the class, and free of anything that would overlap what the book sells.
    fn check_supply(&self, account: AccountId, instrument_id: InstrumentId, set: GpuSet, quantity: u32) -> Checked<()> {
        let host = self.hosts.get(set.host.0 as usize).ok_or(RejectCode::UnknownHost)?;
        if host.owner != account {
            return Err(RejectCode::NotYourHost);
        }
        let host_mask = if host.gpus.len() >= 64 { u64::MAX } else { (1u64 << host.gpus.len()) - 1 };
        if set.gpu_mask & !host_mask != 0 || set.gpu_mask.count_ones() != quantity {
            return Err(RejectCode::InsufficientCapacity);
        }
        let instrument = &self.instruments[instrument_id.0 as usize];
        let all_free = mask_bits(set.gpu_mask).all(|bit| {
            let gpu = &self.gpus[host.gpus[bit as usize].0 as usize];
            gpu.online
                && gpu.qualifies_for(instrument.class)
                && gpu.exclusive_lease.get().is_none_or(|lease| {
                    // Only a window can be sold under a running lease, and only after it ends.
                    let lease = &self.leases[lease.0 as usize];
                    matches!(instrument.kind, ContractKind::Reserved { window_start_ms, .. }
                        if lease.end_ms.is_some_and(|end| end <= window_start_ms))
                })
                && match instrument.kind {
                    ContractKind::Spot => gpu.spot_ask.is_none(),
                    ContractKind::Preemptible => gpu.preemptible_ask.is_none() && gpu.preemptible_lease.is_none(),
                    ContractKind::Reserved { window_start_ms, window_end_ms } => {
                        gpu.commitments().len() < limits::COMMITMENTS_PER_GPU_MAX
                            && !gpu.committed_during(window_start_ms, Some(window_end_ms))
                    }
                    // Refused earlier: a resale book's asks name no GPUs.
                    ContractKind::LeaseResale => false,
                }
        });
        if all_free {
            Ok(())
        } else {
            Err(RejectCode::InsufficientCapacity)
        }
    }

    fn unoffered_contracts(&self, account: AccountId, instrument: InstrumentId) -> u32 {
        self.instruments[instrument.0 as usize]
            .contracts
            .iter()
            .map(|c| &self.contracts[c.0 as usize])
            .filter(|c| c.holder == account && c.offered_by.is_none())
            .count() as u32
    }

    /// Marks what backs a new ask as offered by it: its GPUs, or `quantity`
    /// of the seller's contracts for a resale.
    fn lock_supply(&mut self, id: OrderId, quantity: u32) {
        let order = *self.orders.get(id).expect("the order was just inserted");
        let instrument = order.instrument;
        let Some(set) = order.supply else {
            if self.instruments[instrument.0 as usize].kind == ContractKind::LeaseResale {
                self.lock_lease_offer(id);
            } else {
                self.lock_more_contracts(id, instrument, quantity);
            }
            return;
        };
        let kind = self.instruments[instrument.0 as usize].kind;
        for bit in mask_bits(set.gpu_mask) {
            let gpu_id = self.hosts[set.host.0 as usize].gpus[bit as usize];
            let gpu = &mut self.gpus[gpu_id.0 as usize];
            match kind {
                ContractKind::Spot => gpu.spot_ask.set(Some(id)),
                ContractKind::Preemptible => gpu.preemptible_ask.set(Some(id)),
                ContractKind::Reserved { window_start_ms, window_end_ms } => gpu.commit(Commitment {
                    start_ms: window_start_ms,
                    end_ms: window_end_ms,
                    instrument,
                    holder: CommitmentHolder::Offered(id),
                }),
                ContractKind::LeaseResale => unreachable!("a resale book's asks name no GPUs"),
            }
        }
    }

    /// Undoes `lock_supply` for the GPUs in `mask` of an ask.
    pub(crate) fn detach_gpus(&mut self, id: OrderId, set: GpuSet, mask: u64, instrument: InstrumentId) {
        let kind = self.instruments[instrument.0 as usize].kind;
        for bit in mask_bits(mask) {
            let gpu_id = self.hosts[set.host.0 as usize].gpus[bit as usize];
            let gpu = &mut self.gpus[gpu_id.0 as usize];
            match kind {
                ContractKind::Spot if gpu.spot_ask == Some(id) => gpu.spot_ask.set(None),
                ContractKind::Preemptible if gpu.preemptible_ask == Some(id) => gpu.preemptible_ask.set(None),
                ContractKind::Reserved { .. } => gpu.remove_commitment(instrument, CommitmentHolder::Offered(id)),
                _ => {}
            }
        }
    }

    /// Unlocks up to `count` contracts a resale ask holds, newest first.
    fn unlock_contracts(&mut self, id: OrderId, instrument: InstrumentId, count: u32) {
        let mut left = count;
        for index in (0..self.instruments[instrument.0 as usize].contracts.len()).rev() {
            let contract_id = self.instruments[instrument.0 as usize].contracts[index];
            let contract = &mut self.contracts[contract_id.0 as usize];
            if left > 0 && contract.offered_by == Some(id) {
                contract.offered_by = None;
                left -= 1;
            }
        }
    }

    /// Lowers an order's open quantity by `by` (and its ask mask by
    /// `removed_mask`), keeping its place in the book; releases the matching
    /// part of a bid's hold. GPU and contract state is the caller's.
    pub(crate) fn shrink_quantity(&mut self, id: OrderId, by: u32, removed_mask: u64) {
        let order = self.orders.get_mut(id).expect("shrinking a live order");
        assert!(order.quantity >= by, "an order cannot shrink below zero");
        if let Some(set) = order.supply.as_mut() {
            assert_eq!(set.gpu_mask & removed_mask, removed_mask);
            assert_eq!(removed_mask.count_ones(), by, "a GPU ask's quantity is its mask");
            set.gpu_mask &= !removed_mask;
        }
        let order = *order;
        if order.resting {
            let book = &mut self.books[order.instrument.0 as usize];
            let quantity = book.side_mut(order.side).reduce(&mut self.orders, id.slot(), by);
            self.emit(EventKind::BookLevel {
                instrument: order.instrument,
                side: order.side,
                price_minor_per_gpu_hour: order.price,
                quantity,
            });
        } else {
            self.orders.get_mut(id).expect("live").quantity -= by;
        }
        if order.side == Side::Buy {
            self.release(order.account, order.hold_per_gpu_minor * by as u64, HoldReason::Order(id));
        }
    }

    /// Reduces an order by `by` for a reason other than a fill (self-trade
    /// decrement, a GPU gone elsewhere), freeing what backed the removed part;
    /// closes the order when nothing is left.
    pub(crate) fn reduce_order(&mut self, id: OrderId, by: u32, removed_mask: Option<u64>, reason: ReduceReason) {
        let order = *self.orders.get(id).expect("reducing a live order");
        self.shrink_and_free(id, order, by, removed_mask);
        let quantity_left = order.quantity - by;
        if quantity_left == 0 {
            let close = match reason {
                ReduceReason::SelfTradeDecrement => OrderCloseReason::SelfTradePrevented,
                ReduceReason::BudgetLimit => OrderCloseReason::BudgetSpent,
                ReduceReason::GpuOffline | ReduceReason::GpuLeasedElsewhere | ReduceReason::GpuDisqualified => OrderCloseReason::SupplyGone,
            };
            self.close_order(id, close);
        } else {
            self.emit(EventKind::OrderReduced { order: id, account: order.account, quantity_left, reason });
        }
    }

    /// Takes the GPUs in `bits` out of an ask (they went offline or were leased
    /// through another book). A no-op when the ask no longer offers them.
    pub(crate) fn remove_gpus_from_ask(&mut self, id: OrderId, bits: u64, reason: ReduceReason) {
        let Some(order) = self.orders.get(id) else { return };
        let Some(set) = order.supply else { return };
        let removed = set.gpu_mask & bits;
        if removed != 0 {
            self.reduce_order(id, removed.count_ones(), Some(removed), reason);
        }
    }

    /// Ends an order: takes it off the book, releases what it held and locked.
    pub(crate) fn close_order(&mut self, id: OrderId, reason: OrderCloseReason) {
        let order = *self.orders.get(id).expect("closing a live order");
        if order.resting {
            let book = &mut self.books[order.instrument.0 as usize];
            let quantity = book.side_mut(order.side).unlink(&mut self.orders, id.slot());
            self.emit(EventKind::BookLevel {
                instrument: order.instrument,
                side: order.side,
                price_minor_per_gpu_hour: order.price,
                quantity,
            });
        }
        if let Some(stop_price) = order.stop_price {
            self.disarm_stop(id, order.instrument, order.side, stop_price);
        }
        self.unback(id, &order);
        self.client_ids.close(self.now_ms, order.account, order.client_order_id);
        self.accounts[order.account.0 as usize].open_orders -= 1;
        self.orders.remove(id);
        self.emit(EventKind::OrderClosed { order: id, account: order.account, reason, quantity_left: order.quantity });
    }

    /// Puts what is left of a matched order on the book, or closes it.
    pub(crate) fn rest_or_close(&mut self, id: OrderId, rests: bool) {
        let mut order = *self.orders.get(id).expect("a live taker");
        if let (Some(left), true, true) = (order.budget_left_minor, rests, order.quantity > 0) {
            // A budget bid rests as a plain bid for what the rest of its
            // budget buys at its limit price; the remainder goes back.
            let per_gpu = self.hold_per_gpu(order.instrument, order.price, order.duration).expect("admitted at this price");
            let keep = order.quantity.min((left / per_gpu) as u32);
            if keep == 0 {
                self.close_order(id, OrderCloseReason::BudgetSpent);
                return;
            }
            self.release(order.account, left - per_gpu * keep as u64, HoldReason::Order(id));
            let stored = self.orders.get_mut(id).expect("live");
            stored.budget_left_minor = None;
            stored.hold_per_gpu_minor = per_gpu;
            if keep < order.quantity {
                stored.quantity = keep;
                self.emit(EventKind::OrderReduced {
                    order: id,
                    account: order.account,
                    quantity_left: keep,
                    reason: ReduceReason::BudgetLimit,
                });
            }
            order = *self.orders.get(id).expect("live");
        }
        if order.quantity == 0 {
            self.close_order(id, OrderCloseReason::Filled);
        } else if !rests {
            self.close_order(id, OrderCloseReason::Killed);
        } else {
            let book = &mut self.books[order.instrument.0 as usize];
            let quantity = book.side_mut(order.side).push_back(&mut self.orders, id.slot());
            self.emit(EventKind::BookLevel {
                instrument: order.instrument,
                side: order.side,
                price_minor_per_gpu_hour: order.price,
                quantity,
            });
            if let Some(expire_at_ms) = order.expire_at_ms {
                self.schedule(expire_at_ms, TimerKind::OrderExpiry(id));
            }
            if order.side == Side::Sell {
                self.all_or_none_due_in(order.instrument);
            } else if order.all_or_none {
                self.schedule_all_or_none_recheck(order.instrument);
            }
        }
    }

    fn owned_order(&self, account: AccountId, id: OrderId) -> Checked<Order> {
        self.account(account)?;
        let order = self.orders.get(id).ok_or(RejectCode::UnknownOrder)?;
        if order.account != account {
            return Err(RejectCode::NotYourOrder);
        }
        Ok(*order)
    }

    pub(super) fn cancel_order(&mut self, account: AccountId, id: OrderId) -> Checked<()> {
        self.owned_order(account, id)?;
        self.close_order(id, OrderCloseReason::Cancelled);
        Ok(())
    }

    pub(super) fn mass_cancel(&mut self, account: AccountId, instrument: Option<InstrumentId>) -> Checked<()> {
        self.account(account)?;
        if let Some(instrument) = instrument {
            if instrument.0 as usize >= self.instruments.len() {
                return Err(RejectCode::UnknownInstrument);
            }
        }
        // In slot order, as a scan of the order slab visits them.
        let mut ids: Vec<OrderId> = self
            .client_ids
            .open_orders(account)
            .filter(|&id| instrument.is_none_or(|i| self.orders.get(id).is_some_and(|o| o.instrument == i)))
            .collect();
        ids.sort_unstable_by_key(|id| id.slot());
        for id in ids {
            self.close_order(id, OrderCloseReason::MassCancelled);
        }
        Ok(())
    }

    pub(super) fn expire_order(&mut self, id: OrderId) {
        if self.orders.get(id).is_some() {
            self.close_order(id, OrderCloseReason::Expired);
        }
    }

    pub(super) fn replace_order(&mut self, account: AccountId, id: OrderId, price: u64, quantity: u32) -> Checked<()> {
        let order = self.owned_order(account, id)?;
        let new_hold_per_gpu = self.check_replace(account, id, &order, price, quantity)?;
        if price == order.price && quantity <= order.quantity {
            if quantity < order.quantity {
                self.reduce_quantity_for_replace(id, order, quantity);
            }
            self.emit(EventKind::OrderReplaced { order: id, account, price_minor_per_gpu_hour: price, quantity, priority_kept: true });
            if order.all_or_none && quantity < order.quantity {
                // Smaller, it may fill whole now.
                self.all_or_none_due_in(order.instrument);
            }
            return Ok(());
        }
        self.requeue_replaced(account, id, order, price, quantity, new_hold_per_gpu);
        Ok(())
    }

    /// A replace's checks (reads only): what may be replaced, the new
    /// price and quantity, what they hold. Returns the new hold per GPU.
    fn check_replace(&self, account: AccountId, id: OrderId, order: &Order, price: u64, quantity: u32) -> Checked<u64> {
        // A stop, and a resale ask (its lease's price difference is held for
        // the price it was offered at): cancel and place again instead.
        if order.stop_price.is_some() || self.lease_offers.contains_key(&id) {
            return Err(RejectCode::ReplaceInvalid);
        }
        self.check_price(self.instruments[order.instrument.0 as usize].class, price)?;
        check_quantity(quantity)?;
        // A cluster bid keeps its shape: only its price is replaced.
        if order.nodes > 0 && quantity != order.quantity {
            return Err(RejectCode::ReplaceInvalid);
        }
        let new_hold_per_gpu = match (order.side, order.supply) {
            (Side::Sell, Some(_)) if quantity > order.quantity => return Err(RejectCode::ReplaceInvalid),
            (Side::Sell, None) if quantity > order.quantity => {
                if self.unoffered_contracts(account, order.instrument) < quantity - order.quantity {
                    return Err(RejectCode::InsufficientContracts);
                }
                0
            }
            (Side::Sell, _) => 0,
            (Side::Buy, _) => {
                let per_gpu = self.hold_per_gpu(order.instrument, price, order.duration)?;
                let total = per_gpu.checked_mul(quantity as u64).ok_or(RejectCode::InsufficientFunds)?;
                let current = order.hold_per_gpu_minor * order.quantity as u64;
                if total > current + self.account(account)?.available_minor {
                    return Err(RejectCode::InsufficientFunds);
                }
                per_gpu
            }
        };
        let opposite_best = self.books[order.instrument.0 as usize].side(order.side.opposite()).best_price();
        if order.post_only && opposite_best.is_some_and(|best| crosses(order.side, price, best)) {
            return Err(RejectCode::PostOnlyWouldCross);
        }
        Ok(new_hold_per_gpu)
    }

    /// A replace that loses priority: off the book, re-priced and held
    /// anew, then treated as newly arrived.
    fn requeue_replaced(&mut self, account: AccountId, id: OrderId, order: Order, price: u64, quantity: u32, new_hold_per_gpu: u64) {
        if order.resting {
            let book = &mut self.books[order.instrument.0 as usize];
            let level_quantity = book.side_mut(order.side).unlink(&mut self.orders, id.slot());
            self.emit(EventKind::BookLevel {
                instrument: order.instrument,
                side: order.side,
                price_minor_per_gpu_hour: order.price,
                quantity: level_quantity,
            });
        }
        if quantity < order.quantity {
            self.reduce_quantity_for_replace(id, order, quantity);
        }
        if order.side == Side::Buy {
            let held = order.hold_per_gpu_minor * quantity.min(order.quantity) as u64;
            self.release(account, held, HoldReason::Order(id));
            self.hold(account, new_hold_per_gpu * quantity as u64, HoldReason::Order(id));
        }
        {
            let stored = self.orders.get_mut(id).expect("live");
            stored.price = price;
            stored.quantity = quantity;
            stored.hold_per_gpu_minor = new_hold_per_gpu;
            stored.prev = NIL;
            stored.next = NIL;
        }
        if order.side == Side::Sell && order.supply.is_none() && quantity > order.quantity {
            self.lock_more_contracts(id, order.instrument, quantity - order.quantity);
        }
        self.emit(EventKind::OrderReplaced { order: id, account, price_minor_per_gpu_hour: price, quantity, priority_kept: false });
        if order.nodes > 0 {
            self.enter_cluster(id, true);
        } else if order.all_or_none && self.fillable_quantity(id, quantity) < quantity {
            self.rest_or_close(id, true);
        } else {
            self.match_and_settle(id, true);
        }
    }

    fn reduce_quantity_for_replace(&mut self, id: OrderId, order: Order, quantity: u32) {
        self.shrink_and_free(id, order, order.quantity - quantity, None);
    }

    /// Lowers an order by `by` and frees what backed that part: the given
    /// GPUs (or the ask's highest ones), or `by` of a resale's contracts.
    fn shrink_and_free(&mut self, id: OrderId, order: Order, by: u32, removed_mask: Option<u64>) {
        let removed = match order.supply {
            Some(set) => {
                let removed = removed_mask.unwrap_or_else(|| highest_bits(set.gpu_mask, by));
                self.detach_gpus(id, set, removed, order.instrument);
                removed
            }
            None => {
                if order.side == Side::Sell {
                    self.unlock_contracts(id, order.instrument, by);
                }
                0
            }
        };
        self.shrink_quantity(id, by, removed);
    }

    fn lock_more_contracts(&mut self, id: OrderId, instrument: InstrumentId, count: u32) {
        let account = self.orders.get(id).expect("live").account;
        let mut left = count;
        for index in 0..self.instruments[instrument.0 as usize].contracts.len() {
            let contract_id = self.instruments[instrument.0 as usize].contracts[index];
            let contract = &mut self.contracts[contract_id.0 as usize];
            if left > 0 && contract.holder == account && contract.offered_by.is_none() {
                contract.offered_by = Some(id);
                left -= 1;
            }
        }
        assert_eq!(left, 0, "admission checked the seller's contracts");
    }
}

/// Whether a trade at `last` reaches a stop of `side` at `stop_price`: a
/// bid's stop at or above it, an ask's at or below.
pub(crate) fn stop_reached(side: Side, stop_price: u64, last: u64) -> bool {
    match side {
        Side::Buy => last >= stop_price,
        Side::Sell => last <= stop_price,
    }
}

/// The checks of an order's options that need no state, in the rulebook's order.
fn check_options(new: &NewOrder, options: &OrderOptions) -> Checked<()> {
    let bid = new.side == Side::Buy;
    if (options.min_supplier_score_bps > 0 || options.verified_only) && !bid || options.min_supplier_score_bps > 10_000 {
        return Err(RejectCode::ScoreFilterInvalid);
    }
    if options.all_or_none && (!bid || new.min_quantity > 0) {
        return Err(RejectCode::AllOrNoneInvalid);
    }
    if options.budget_minor > 0 && (!bid || options.all_or_none || new.one_host) {
        return Err(RejectCode::BudgetInvalid);
    }
    Ok(())
}

fn check_quantity(quantity: u32) -> Checked<()> {
    if quantity == 0 {
        return Err(RejectCode::QuantityZero);
    }
    if quantity > limits::QUANTITY_MAX {
        return Err(RejectCode::QuantityTooLarge);
    }
    Ok(())
}

fn check_duration(duration: LeaseDuration) -> Checked<()> {
    match duration {
        LeaseDuration::Hours(hours) if hours == 0 || hours > limits::DURATION_HOURS_MAX => Err(RejectCode::DurationInvalid),
        LeaseDuration::Minutes(minutes) if minutes == 0 || minutes > limits::DURATION_HOURS_MAX * 60 => Err(RejectCode::DurationInvalid),
        _ => Ok(()),
    }
}
