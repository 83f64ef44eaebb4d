//! Re-match: a spot bid may ask the exchange to replace a lease whose host
//! fails it (docs/market-rules.md "Re-match"). When such a lease ends
//! `delivery_failed`, the market calls for a fill-or-kill bid by the renter
//! in the same instrument, for the same GPUs (on one host if the lease was),
//! at no more than the opted-in bid's limit price, for the lease's remaining hours; the
//! lease it fills replaces the failed one, takes over its workload and may
//! be replaced in turn.

use std::collections::BTreeMap;

use gpux_engine::{
    AccountId, Event, EventKind, InstrumentId, LeaseDuration, LeaseEndReason, LeaseId, LeaseKind, NewOrder, OrderCloseReason, OrderId,
    SelfTradePrevention, Side, TimeInForce,
};
use serde::{Deserialize, Serialize};

/// Client order ids from here up are the exchange's own replacement bids
/// (this plus the failed lease's id).
pub const REPLACEMENT_CLIENT_ORDER_ID_BASE: u64 = 1 << 63;

use gpux_engine::time::MS_PER_HOUR;

/// A lease that is replaced if its host fails it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
struct Covered {
    renter: AccountId,
    instrument: InstrumentId,
    /// The limit price of the bid that opted in: what a replacement may pay.
    limit: u64,
    gpus: u32,
    end_ms: Option<u64>,
    /// The regions the bid required (empty: any); its replacement keeps them.
    regions: Vec<String>,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Rematch {
    /// The opt-in journaled just before its bid's `place_order` entry.
    pending_bid: Option<(AccountId, u64)>,
    /// The regions that bid requires (seen in its entry before it applies).
    pending_regions: Vec<String>,
    /// Open spot bids that opted in, with the regions each requires and its limit price.
    bids: BTreeMap<OrderId, (Vec<String>, u64)>,
    /// Leases covered, until they leave the hot state.
    leases: BTreeMap<LeaseId, Covered>,
    /// Replacement bids by their order id: the lease each replaces.
    replacing: BTreeMap<OrderId, LeaseId>,
}

/// What re-match did with one entry's events.
#[derive(Debug, Default)]
pub struct Outcome {
    /// The replacement bid to place next (journaled as its own entry), and
    /// the regions it keeps from the bid it replaces (empty: any).
    pub replacement: Option<(NewOrder, Vec<String>)>,
    /// `(failed lease, replacement lease or none, renter)`: a replacement
    /// bid filled or was killed.
    pub replaced: Vec<(LeaseId, Option<LeaseId>, AccountId)>,
}

impl Rematch {
    /// A bid's opt-in, journaled right before the bid itself.
    pub fn bid_rematch(&mut self, account: AccountId, client_order_id: u64) {
        self.pending_bid = Some((account, client_order_id));
        self.pending_regions.clear();
    }

    /// The regions the bid in the entry about to apply requires, if it is
    /// the one that opted in.
    pub fn bid_regions(&mut self, account: AccountId, client_order_id: u64, regions: &[String]) {
        if self.pending_bid == Some((account, client_order_id)) {
            self.pending_regions = regions.to_vec();
        }
    }

    /// Follows one engine entry's events.
    pub fn observe(&mut self, events: &[Event]) -> Outcome {
        let mut outcome = Outcome::default();
        let mut buy_order = None;
        for event in events {
            match event.kind {
                EventKind::OrderAccepted { order, account, client_order_id, price_minor_per_gpu_hour, .. } => {
                    self.accepted(order, account, client_order_id, price_minor_per_gpu_hour)
                }
                EventKind::Trade { buy_order: order, .. } => buy_order = Some(order),
                EventKind::LeaseCreated {
                    lease,
                    kind: LeaseKind::Spot,
                    instrument,
                    renter,
                    gpu_mask,
                    price_minor_per_gpu_hour,
                    end_ms,
                    ..
                } => {
                    let Some((order, (regions, limit))) = buy_order.and_then(|order| Some((order, self.bids.get(&order)?.clone()))) else {
                        continue;
                    };
                    let gpus = gpu_mask.count_ones();
                    let limit = limit.max(price_minor_per_gpu_hour);
                    self.leases.insert(lease, Covered { renter, instrument, limit, gpus, end_ms, regions });
                    if let Some(failed) = self.replacing.remove(&order) {
                        outcome.replaced.push((failed, Some(lease), renter));
                    }
                }
                EventKind::OrderClosed { order, account, reason, .. } => {
                    self.bids.remove(&order);
                    if let Some(failed) = self.replacing.remove(&order) {
                        // Filled: its lease was reported above. Anything else: no replacement.
                        if reason != OrderCloseReason::Filled {
                            outcome.replaced.push((failed, None, account));
                        }
                    }
                }
                // A replacement bid refused on admission (the renter's funds
                // do not cover it, say): no replacement.
                EventKind::Rejected { account: Some(account), client_order_id, .. }
                    if client_order_id >= REPLACEMENT_CLIENT_ORDER_ID_BASE =>
                {
                    let failed = LeaseId(client_order_id - REPLACEMENT_CLIENT_ORDER_ID_BASE);
                    if self.leases.get(&failed).is_some_and(|c| c.renter == account) {
                        outcome.replaced.push((failed, None, account));
                    }
                }
                EventKind::LeaseEnded { lease, reason: LeaseEndReason::DeliveryFailed } => {
                    if let Some(covered) = self.leases.get(&lease) {
                        outcome.replacement = Some((replacement_bid(lease, covered, event.at_ms), covered.regions.clone()));
                    }
                }
                _ => {}
            }
        }
        self.pending_bid = None;
        self.pending_regions.clear();
        outcome
    }

    /// A bid accepted: a covered bid (the one just placed) or a replacement
    /// bid for a failed lease (its client order id names the lease).
    fn accepted(&mut self, order: OrderId, account: AccountId, client_order_id: u64, price_minor_per_gpu_hour: u64) {
        if self.pending_bid == Some((account, client_order_id)) {
            self.pending_bid = None;
            self.bids.insert(order, (std::mem::take(&mut self.pending_regions), price_minor_per_gpu_hour));
        }
        if client_order_id >= REPLACEMENT_CLIENT_ORDER_ID_BASE {
            let failed = LeaseId(client_order_id - REPLACEMENT_CLIENT_ORDER_ID_BASE);
            if let Some(covered) = self.leases.get(&failed).filter(|c| c.renter == account) {
                let kept = (covered.regions.clone(), covered.limit);
                self.replacing.insert(order, failed);
                self.bids.insert(order, kept);
            }
        }
    }

    /// A lease left the hot state: nothing can fail it any more.
    pub fn forget_lease(&mut self, lease: LeaseId) {
        self.leases.remove(&lease);
    }

    /// Whether a lease is covered.
    pub fn covers(&self, lease: LeaseId) -> bool {
        self.leases.contains_key(&lease)
    }
}

/// The renter's fill-or-kill bid for what the failed lease had left, at the
/// limit the renter set on the bid that opted in (the failed lease's price
/// may be well below what the market asks now).
fn replacement_bid(failed: LeaseId, covered: &Covered, now_ms: u64) -> NewOrder {
    let duration = match covered.end_ms {
        Some(end_ms) => LeaseDuration::Hours(end_ms.saturating_sub(now_ms).div_ceil(MS_PER_HOUR).max(1) as u32),
        None => LeaseDuration::UntilCancelled,
    };
    NewOrder {
        time_in_force: TimeInForce::Fok,
        self_trade_prevention: SelfTradePrevention::CancelNewest,
        one_host: covered.gpus > 1,
        duration,
        ..NewOrder::limit(
            covered.renter,
            REPLACEMENT_CLIENT_ORDER_ID_BASE + failed.0,
            covered.instrument,
            Side::Buy,
            covered.limit,
            covered.gpus,
        )
    }
}
