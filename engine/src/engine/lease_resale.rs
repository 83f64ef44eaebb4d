//! Resale of fixed-duration spot leases (docs/market-rules.md "Lease
//! resale"). The renter offers what is left of its lease, whole, on its
//! class's resale book (`CLASS/RESALE`, listed at the class's first offer);
//! a bid there takes the rest of one lease for at most its hours. When one
//! trades, the reseller's lease ends (`resold`: it is billed for its time
//! so far, and its escrow comes back at billing close) and a new lease for
//! the buyer goes on from now to the same end, on the same GPUs, at the
//! lease's own price: the supplier is paid as before. The buyer holds that
//! escrow, and buyer and reseller settle the difference between the resale
//! price and the lease's price for the time left at once, as a resold
//! window's contract does.

use super::{Checked, ContractKind, Engine, Lease, LeaseBilling, LeaseEndReasonKey, LeaseOffer, TimerKind};
use crate::book::Order;
use crate::command::{NewOrder, OrderOptions, Side, TimeInForce};
use crate::event::{EventKind, HoldReason, LeaseEndReason, LeaseKind, OrderCloseReason, RejectCode};
use crate::ids::{AccountId, InstrumentId, LeaseId, OrderId};
use crate::time::MS_PER_HOUR;

/// A lease is offered only with this much left, and its ask expires this
/// long before the lease ends: the buyer gets time to start a workload.
pub const RESALE_MIN_MS: u64 = 15 * 60_000;

/// `price x gpus x ms` in minor units (rounded down).
fn cost(price: u64, gpus: u32, ms: u64) -> u64 {
    (price as u128 * gpus as u128 * ms as u128 / MS_PER_HOUR as u128) as u64
}

impl Engine {
    pub(super) fn offer_lease(
        &mut self,
        account: AccountId,
        lease_id: LeaseId,
        client_order_id: u64,
        price: u64,
        time_in_force: TimeInForce,
    ) -> Checked<()> {
        let funds = self.account(account)?;
        let lease = self.leases.get(lease_id.0 as usize).ok_or(RejectCode::UnknownLease)?;
        if lease.renter != account {
            return Err(RejectCode::NotYourLease);
        }
        if !lease.active {
            return Err(RejectCode::LeaseNotActive);
        }
        let end_ms = match (lease.kind, lease.end_ms) {
            (LeaseKind::Spot, Some(end_ms)) if end_ms.saturating_sub(self.now_ms) >= RESALE_MIN_MS => end_ms,
            _ => return Err(RejectCode::LeaseNotResellable),
        };
        if self.offered_leases.contains_key(&lease_id) {
            return Err(RejectCode::LeaseAlreadyOffered);
        }
        let class = self.instruments[lease.instrument.0 as usize].class;
        // Every check that could refuse the ask runs before the resale book
        // is listed: a refused command changes nothing.
        self.check_price(class, price)?;
        if let TimeInForce::Gtt { expire_at_ms } = time_in_force {
            if expire_at_ms <= self.now_ms {
                return Err(RejectCode::ExpiryInPast);
            }
        }
        if self.client_order_id_taken(account, client_order_id) {
            return Err(RejectCode::DuplicateClientOrderId);
        }
        if funds.open_orders >= self.config.orders_per_account_max
            || self.orders.live_count() >= crate::limits::ORDERS_LIVE_MAX
            || self.shared_use(account).is_some_and(|used| used.open_orders >= crate::limits::ORDERS_PER_PARTICIPANT_MAX)
        {
            return Err(RejectCode::TooManyOpenOrders);
        }
        self.check_sub_account_limits(account, 0, true)?;
        let gpus = lease.gpu_mask.count_ones();
        // Selling below the lease's price, the reseller pays the buyer the
        // difference for the time left: held now, for the time left now.
        let left_ms = end_ms - lease.start_ms.max(self.now_ms);
        let hold_minor = cost(lease.price.saturating_sub(price), gpus, left_ms);
        if hold_minor > funds.available_minor {
            return Err(RejectCode::InsufficientFunds);
        }
        let book = self.resale_book(class);
        let expires = end_ms - RESALE_MIN_MS;
        let time_in_force = match time_in_force {
            TimeInForce::Gtc => TimeInForce::Gtt { expire_at_ms: expires },
            TimeInForce::Gtt { expire_at_ms } => TimeInForce::Gtt { expire_at_ms: expire_at_ms.min(expires) },
            other => other,
        };
        let order = NewOrder { time_in_force, ..NewOrder::limit(account, client_order_id, book, Side::Sell, price, gpus) };
        self.pending_lease_offer = Some(LeaseOffer { lease: lease_id, hold_minor });
        let placed = self.place_order(&order, &OrderOptions::default());
        self.pending_lease_offer = None;
        placed
    }

    /// The class's resale book, listed now if it is not yet.
    fn resale_book(&mut self, class: u16) -> InstrumentId {
        if let Some(book) = self.resale_books.get(&class) {
            return *book;
        }
        let name = self.config.classes[class as usize].name.clone();
        let book = self.add_instrument(format!("{name}/RESALE"), class, ContractKind::LeaseResale);
        self.resale_books.insert(class, book);
        self.emit(EventKind::InstrumentListed { instrument: book });
        book
    }

    /// An accepted resale ask takes its lease (and the reseller's hold).
    pub(super) fn lock_lease_offer(&mut self, id: OrderId) {
        let offer = self.pending_lease_offer.take().expect("a resale ask comes from offer_lease");
        let account = self.orders.get(id).expect("the order was just inserted").account;
        self.hold(account, offer.hold_minor, HoldReason::Order(id));
        self.lease_offers.insert(id, offer);
        self.offered_leases.insert(offer.lease, id);
    }

    /// Undoes `lock_lease_offer` when the ask closes unsold; `false` if the
    /// order is no resale ask.
    pub(super) fn unlock_lease_offer(&mut self, id: OrderId, account: AccountId) -> bool {
        let Some(offer) = self.lease_offers.remove(&id) else { return false };
        self.offered_leases.remove(&offer.lease);
        self.release(account, offer.hold_minor, HoldReason::Order(id));
        true
    }

    /// A lease that ends while on offer takes its ask with it.
    pub(super) fn close_offer_of(&mut self, lease_id: LeaseId) {
        if let Some(order) = self.offered_leases.get(&lease_id).copied() {
            self.close_order(order, OrderCloseReason::LeaseEnded);
        }
    }

    /// How many GPUs resale ask `sell_id` can give bid `buy`: the lease
    /// whole, if the bid wants at least that many and its hours cover the
    /// time left; else none (the ask keeps its place).
    pub(super) fn resale_capacity(&self, buy: &Order, sell_id: OrderId) -> u32 {
        let Some(offer) = self.lease_offers.get(&sell_id) else { return 0 };
        let Some(lease) = self.leases.get(offer.lease.0 as usize) else { return 0 };
        let gpus = lease.gpu_mask.count_ones();
        let left_ms = lease.end_ms.unwrap_or(0).saturating_sub(self.now_ms.max(lease.start_ms));
        let Some(length_ms) = buy.duration.length_ms() else { return 0 };
        // A lease names its GPUs: a bid for verified ones checks them.
        let unverified = buy.verified_only && !self.lease_gpus_verified(lease);
        let elsewhere = !super::matching::host_in_regions(self.hosts[lease.host.0 as usize].region, buy.regions);
        if unverified || elsewhere || buy.quantity < gpus || (buy.one_host && buy.quantity != gpus) || length_ms < left_ms {
            return 0;
        }
        gpus
    }

    fn lease_gpus_verified(&self, lease: &Lease) -> bool {
        crate::gpus::mask_bits(lease.gpu_mask)
            .all(|bit| self.gpus[self.hosts[lease.host.0 as usize].gpus[bit as usize].0 as usize].verified)
    }

    /// A resale ask traded at `price`: the reseller's lease ends and the
    /// buyer's goes on, with the money described at the top of this file.
    pub(super) fn resell_lease(&mut self, buy: &Order, sell_id: OrderId, seller: AccountId, price: u64) {
        let offer = self.lease_offers.remove(&sell_id).expect("a resale ask offers a lease");
        self.offered_leases.remove(&offer.lease);
        let old = self.leases[offer.lease.0 as usize].clone();
        let end_ms = old.end_ms.expect("only fixed-duration leases are offered");
        let start_ms = old.start_ms.max(self.now_ms);
        let gpus = old.gpu_mask.count_ones();
        let left_ms = end_ms - start_ms;
        self.end_lease(offer.lease, LeaseEndReason::Resold);
        self.release(seller, offer.hold_minor, HoldReason::Order(sell_id));
        let lease_id = LeaseId(self.leases.len() as u64);
        let escrow_minor = cost(old.price, gpus, left_ms);
        self.instruments[old.instrument.0 as usize].leases_held += 1;
        self.leases.push(Lease {
            kind: LeaseKind::Spot,
            instrument: old.instrument,
            renter: buy.account,
            supplier: old.supplier,
            host: old.host,
            gpu_mask: old.gpu_mask,
            price: old.price,
            start_ms,
            end_ms: Some(end_ms),
            escrow_minor,
            active: true,
            preempt_at_ms: None,
            ended_at_ms: None,
            billing: LeaseBilling::default(),
        });
        let reason = HoldReason::Lease(lease_id);
        if price >= old.price {
            self.hold(buy.account, escrow_minor, reason);
            self.transfer_available(buy.account, seller, cost(price - old.price, gpus, left_ms), reason);
        } else {
            self.transfer_available(seller, buy.account, cost(old.price - price, gpus, left_ms), reason);
            self.hold(buy.account, escrow_minor, reason);
        }
        self.occupy_gpus(lease_id, LeaseKind::Spot, old.host, old.gpu_mask);
        self.emit(EventKind::LeaseCreated {
            lease: lease_id,
            kind: LeaseKind::Spot,
            instrument: old.instrument,
            renter: buy.account,
            supplier: old.supplier,
            host: old.host,
            gpu_mask: old.gpu_mask,
            price_minor_per_gpu_hour: old.price,
            start_ms,
            end_ms: Some(end_ms),
        });
        self.schedule(end_ms, TimerKind::LeaseEnd(lease_id, LeaseEndReasonKey::DurationElapsed));
    }
}
