//! What the exchange knows about lease delivery: the workloads of open bids
//! and of leases, each host's published encryption key, and each lease's
//! last delivery status. Pure state, changed only by journal entries and
//! engine events, so replay rebuilds it exactly; it is part of snapshots.
//!
//! The exchange never holds a workload's secrets in clear: the secret part
//! travels sealed to the host's key (`gpux_protocol::delivery`).

use std::collections::BTreeMap;

use gpux_engine::{AccountId, Event, EventKind, LeaseId, OrderId};
use gpux_protocol::{DeliveryState, Workload};
use serde::{Deserialize, Serialize};

/// A host's X25519 key for sealed workloads and its identity key's signature over it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct HostEncryptionKey {
    pub key: [u8; 32],
    pub signature: String,
}

/// One lease's delivery as the exchange follows it.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct LeaseDelivery {
    pub supplier: Option<AccountId>,
    pub workload: Option<Box<Workload>>,
    /// The last status its host reported, and when (exchange time).
    pub state: Option<(DeliveryState, u64)>,
    /// Whether its workload reached `running` once (time to running is counted once).
    pub ran: bool,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Deliveries {
    /// The workload journaled just before its bid's `place_order` entry,
    /// keyed by the bid's account and client order id; claimed by the bid's
    /// `order_accepted` event and dropped after that entry either way.
    pending_bid: Option<(AccountId, u64, Box<Workload>)>,
    /// Workloads of open bids.
    bids: BTreeMap<OrderId, Box<Workload>>,
    /// Leases with a workload or a status, until they leave the hot state.
    leases: BTreeMap<LeaseId, LeaseDelivery>,
    encryption_keys: BTreeMap<AccountId, HostEncryptionKey>,
}

/// A workload that a lease just received, to hand to its host.
pub struct Assigned {
    pub lease: LeaseId,
    pub supplier: AccountId,
    pub workload: Box<Workload>,
}

impl Deliveries {
    /// A bid's workload, journaled right before the bid itself.
    pub fn bid_workload(&mut self, account: AccountId, client_order_id: u64, workload: Box<Workload>) {
        self.pending_bid = Some((account, client_order_id, workload));
    }

    /// Follows one engine entry's events: a bid with a workload hands it to
    /// every lease it fills; closed bids are dropped (a lease's record leaves
    /// with the lease, see [`forget_lease`](Self::forget_lease)).
    /// Returns the workloads that leases received.
    pub fn observe(&mut self, events: &[Event]) -> Vec<Assigned> {
        let mut assigned = Vec::new();
        let mut buy_order = None;
        for event in events {
            match event.kind {
                EventKind::OrderAccepted { order, account, client_order_id, .. } => {
                    if let Some((pending_account, pending_id, _)) = &self.pending_bid {
                        if (*pending_account, *pending_id) == (account, client_order_id) {
                            let (_, _, workload) = self.pending_bid.take().expect("checked above");
                            self.bids.insert(order, workload);
                        }
                    }
                }
                EventKind::Trade { buy_order: order, .. } => buy_order = Some(order),
                EventKind::LeaseCreated { lease, supplier, .. } => {
                    if let Some(workload) = buy_order.and_then(|order| self.bids.get(&order)) {
                        let entry = self.leases.entry(lease).or_default();
                        entry.supplier = Some(supplier);
                        entry.workload = Some(workload.clone());
                        assigned.push(Assigned { lease, supplier, workload: workload.clone() });
                    }
                }
                EventKind::OrderClosed { order, .. } => {
                    self.bids.remove(&order);
                }
                _ => {}
            }
        }
        self.pending_bid = None;
        assigned
    }

    pub fn set_lease_workload(&mut self, lease: LeaseId, supplier: AccountId, workload: Box<Workload>) {
        let entry = self.leases.entry(lease).or_default();
        entry.supplier = Some(supplier);
        entry.workload = Some(workload);
    }

    /// Whether the bid about to be placed carries a workload (journaled right before it).
    pub fn bid_has_workload(&self, account: AccountId, client_order_id: u64) -> bool {
        self.pending_bid.as_ref().is_some_and(|(a, c, _)| (*a, *c) == (account, client_order_id))
    }

    pub fn set_encryption_key(&mut self, account: AccountId, key: HostEncryptionKey) {
        self.encryption_keys.insert(account, key);
    }

    pub fn encryption_key(&self, account: AccountId) -> Option<&HostEncryptionKey> {
        self.encryption_keys.get(&account)
    }

    /// Records a status; returns true when the lease reached `running` for
    /// the first time.
    pub fn record_status(&mut self, lease: LeaseId, supplier: AccountId, state: DeliveryState, at_ms: u64) -> bool {
        let entry = self.leases.entry(lease).or_default();
        entry.supplier = Some(supplier);
        let first_run = matches!(state, DeliveryState::Running { .. }) && !entry.ran;
        entry.ran |= first_run;
        entry.state = Some((state, at_ms));
        first_run
    }

    /// Takes a lease's record out (the lease left the hot state).
    pub fn forget_lease(&mut self, lease: LeaseId) -> Option<LeaseDelivery> {
        self.leases.remove(&lease)
    }

    pub fn lease(&self, lease: LeaseId) -> Option<&LeaseDelivery> {
        self.leases.get(&lease)
    }

    /// Bids with a workload and leases followed (for metrics and tests).
    pub fn sizes(&self) -> (usize, usize) {
        (self.bids.len(), self.leases.len())
    }
}
