//! Volumes (docs/storage.md "Volumes"): a renter's named, sized folders in
//! the exchange's store, and which leases and bids hold them.
//!
//! A bid that mounts volumes journals them right before itself
//! (`JournalEntry::BidVolumes`); each lease it fills gets them attached,
//! and its host is told (`volumes_attached`) before the workload. At most
//! one holder writes a volume: the lease it is attached to read-write, or
//! the resting bid that would fill one. A second lease filled by that bid
//! reads a copy. Any number of leases read one. A lease's volumes are
//! detached when it ends; a bid's claim is let go when it closes.
//!
//! The files themselves are the store's (the exchange's `job_store`):
//! `<owner>/volumes/<volume>/<path>`. The market numbers volumes, checks
//! the rules and says when one was deleted (its files are then removed).

use std::collections::{BTreeMap, BTreeSet};

use gpux_engine::{AccountId, Event, EventKind, LeaseId, OrderId};
use gpux_protocol::volumes::limits::{STORAGE_CHARGE_EVERY_MS, STORAGE_GRACE_MS, STORAGE_NOTICE_MS};
use gpux_protocol::volumes::{limits, name_valid, VolumeAttachment, VolumeId, VolumeInfo, VolumeMount, VolumeState, GIB};
use gpux_protocol::ErrorCode;
use serde::{Deserialize, Serialize};

/// Who writes a volume.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
enum Holder {
    /// The bid journaled just now, before the engine numbered it.
    Pending,
    Bid(OrderId),
    Lease(LeaseId),
    /// A lease its host failed, whose replacement bid (re-match) is on its
    /// way: the replacement takes the volume over.
    Carried(LeaseId),
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
struct Volume {
    owner: AccountId,
    name: String,
    size_gib: u32,
    created_at_ms: u64,
    writer: Option<Holder>,
    readers: BTreeSet<LeaseId>,
    /// When its storage began to accrue at the price in force, and what
    /// was charged of it since (docs/storage.md "Prices").
    billed_from_ms: u64,
    charged_minor: u64,
}

/// A month of storage, ms (30 days).
pub const MS_PER_MONTH: u64 = 30 * 24 * 3_600_000;

/// A volume as a bid or lease mounts it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
struct Mount {
    volume: VolumeId,
    mount: String,
    read_only: bool,
}

/// What a lease the entry created was given: its host hears it before the
/// lease's workload.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Attached {
    pub lease: LeaseId,
    pub supplier: AccountId,
    pub renter: AccountId,
    pub volumes: Vec<VolumeAttachment>,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Volumes {
    volumes: BTreeMap<VolumeId, Volume>,
    by_name: BTreeMap<(AccountId, String), VolumeId>,
    next: u64,
    /// The bid journaled just now with its mounts, until the engine takes it.
    pending_bid: Option<(AccountId, u64, Vec<Mount>)>,
    bids: BTreeMap<OrderId, Vec<Mount>>,
    leases: BTreeMap<LeaseId, Vec<Mount>>,
    /// A failed lease's mounts until its replacement bid is accepted (it
    /// takes them) or refused (they are let go): the next entry.
    carried: BTreeMap<LeaseId, Vec<Mount>>,
    /// The storage price, minor units per GiB-month (`StorageRules`; 0:
    /// free), and when storage was last charged.
    price_minor_per_gib_month: u64,
    last_charge_ms: u64,
    /// Accounts whose storage a charge left unpaid, since when.
    unpaid: BTreeMap<AccountId, u64>,
}

impl Volumes {
    pub fn is_empty(&self) -> bool {
        self.volumes.is_empty() && self.next == 0
    }

    /// A new volume of `account`.
    pub fn create(&mut self, account: AccountId, name: &str, size_gib: u32, at_ms: u64) -> Result<VolumeId, ErrorCode> {
        if !name_valid(name) || size_gib == 0 || size_gib > limits::SIZE_GIB_MAX {
            return Err(ErrorCode::VolumeInvalid);
        }
        if self.by_name.contains_key(&(account, name.to_string())) {
            return Err(ErrorCode::VolumeExists);
        }
        let own: Vec<&Volume> = self.volumes.values().filter(|v| v.owner == account).collect();
        let gib: u64 = own.iter().map(|v| u64::from(v.size_gib)).sum();
        if own.len() >= limits::VOLUMES_PER_ACCOUNT_MAX
            || gib + u64::from(size_gib) > limits::ACCOUNT_GIB_MAX
            || self.volumes.len() >= limits::VOLUMES_LIVE_MAX
        {
            return Err(ErrorCode::TooManyVolumes);
        }
        let id = VolumeId(self.next);
        self.next += 1;
        let volume = Volume {
            owner: account,
            name: name.to_string(),
            size_gib,
            created_at_ms: at_ms,
            writer: None,
            readers: BTreeSet::new(),
            billed_from_ms: at_ms,
            charged_minor: 0,
        };
        self.volumes.insert(id, volume);
        self.by_name.insert((account, name.to_string()), id);
        Ok(id)
    }

    /// Deletes `account`'s volume `name` when nothing holds it; its files
    /// are then the exchange's to remove. Returns what it was and its
    /// storage still to charge (to `at_ms`).
    pub fn delete(&mut self, account: AccountId, name: &str, at_ms: u64) -> Result<(VolumeInfo, u64), ErrorCode> {
        let id = *self.by_name.get(&(account, name.to_string())).ok_or(ErrorCode::UnknownVolume)?;
        if self.held(id) {
            return Err(ErrorCode::VolumeInUse);
        }
        Ok(self.remove(id, at_ms))
    }

    fn held(&self, id: VolumeId) -> bool {
        self.volumes.get(&id).is_some_and(|v| v.writer.is_some() || !v.readers.is_empty())
            || self.bids.values().flatten().any(|m| m.volume == id)
    }

    /// Removes a volume nothing holds: what it was (state `deleted`) and
    /// its storage still to charge.
    fn remove(&mut self, id: VolumeId, at_ms: u64) -> (VolumeInfo, u64) {
        let due = self.volumes.get(&id).map_or(0, |v| self.due(v, at_ms));
        let mut info = self.info(id).expect("a volume to remove");
        info.state = VolumeState::Deleted;
        if let Some(volume) = self.volumes.remove(&id) {
            self.by_name.remove(&(volume.owner, volume.name));
        }
        (info, due)
    }

    /// What `volume` owes at the price in force from when it began to
    /// accrue to `at_ms`, less what was charged: size x price x time over a
    /// 30-day month, rounded down (what rounding leaves is charged with
    /// the next hour's, never lost).
    fn due(&self, volume: &Volume, at_ms: u64) -> u64 {
        let elapsed = u128::from(at_ms.saturating_sub(volume.billed_from_ms));
        let accrued = u128::from(volume.size_gib) * u128::from(self.price_minor_per_gib_month) * elapsed / u128::from(MS_PER_MONTH);
        (accrued.min(u128::from(u64::MAX)) as u64).saturating_sub(volume.charged_minor)
    }

    /// Whether storage is due to be charged at `now_ms` (hourly, while a
    /// priced volume exists).
    pub fn charge_due(&self, now_ms: u64) -> bool {
        !self.volumes.is_empty()
            && self.price_minor_per_gib_month > 0
            && now_ms >= self.last_charge_ms.saturating_add(STORAGE_CHARGE_EVERY_MS)
    }

    /// Charges every volume's storage to `at_ms`: what each account owes.
    pub fn charge(&mut self, at_ms: u64) -> BTreeMap<AccountId, u64> {
        let mut owed = BTreeMap::new();
        let ids: Vec<VolumeId> = self.volumes.keys().copied().collect();
        for id in ids {
            let due = self.due(&self.volumes[&id], at_ms);
            let volume = self.volumes.get_mut(&id).expect("listed above");
            volume.charged_minor = volume.charged_minor.saturating_add(due);
            *owed.entry(volume.owner).or_insert(0u64) += due;
        }
        self.last_charge_ms = at_ms;
        owed.retain(|_, amount| *amount > 0);
        owed
    }

    /// The price from `at_ms` on: storage until then charged at the old one.
    pub fn set_price(&mut self, minor_per_gib_month: u64, at_ms: u64) -> BTreeMap<AccountId, u64> {
        let owed = self.charge(at_ms);
        self.price_minor_per_gib_month = minor_per_gib_month;
        for volume in self.volumes.values_mut() {
            volume.billed_from_ms = at_ms;
            volume.charged_minor = 0;
        }
        owed
    }

    pub fn price_minor_per_gib_month(&self) -> u64 {
        self.price_minor_per_gib_month
    }

    /// A storage charge left `account` owing: its grace starts (if it had
    /// not). True when it starts now.
    pub fn note_unpaid(&mut self, account: AccountId, at_ms: u64) -> bool {
        let fresh = !self.unpaid.contains_key(&account);
        self.unpaid.entry(account).or_insert(at_ms);
        fresh
    }

    /// The accounts whose storage is unpaid.
    pub fn unpaid_accounts(&self) -> Vec<AccountId> {
        self.unpaid.keys().copied().collect()
    }

    /// `account` owes nothing any more: its volumes are writable again.
    pub fn paid_up(&mut self, account: AccountId) -> bool {
        self.unpaid.remove(&account).is_some()
    }

    /// Whether `account`'s volumes are read-only at `at_ms` (its storage
    /// unpaid for longer than the grace).
    pub fn read_only(&self, account: AccountId, at_ms: u64) -> bool {
        self.unpaid.get(&account).is_some_and(|since| at_ms >= since.saturating_add(STORAGE_GRACE_MS))
    }

    /// Removes the volumes unpaid past the grace and the notice that
    /// nothing holds (a held one waits for its holders to let it go):
    /// what each was and its storage still to charge.
    pub fn delete_unpaid(&mut self, at_ms: u64) -> Vec<(VolumeInfo, u64)> {
        let due: Vec<VolumeId> = self
            .volumes
            .iter()
            .filter(|(_, v)| {
                self.unpaid.get(&v.owner).is_some_and(|since| at_ms >= since.saturating_add(STORAGE_GRACE_MS + STORAGE_NOTICE_MS))
            })
            .map(|(id, _)| *id)
            .filter(|id| !self.held(*id))
            .collect();
        due.into_iter().map(|id| self.remove(id, at_ms)).collect()
    }

    /// The volumes of `account` (for its notices).
    pub fn of(&self, account: AccountId) -> Vec<VolumeInfo> {
        self.list(account)
    }

    /// Whether `account` may place a bid with these mounts now: each names
    /// one of its volumes, and none mounted read-write is written by
    /// another holder. The shapes are checked before (`VolumeMount::check_all`).
    pub fn check_mounts(&self, account: AccountId, mounts: &[VolumeMount], at_ms: u64) -> Result<(), ErrorCode> {
        for mount in mounts {
            let id = self.by_name.get(&(account, mount.volume.clone())).ok_or(ErrorCode::UnknownVolume)?;
            if !mount.read_only && self.read_only(account, at_ms) {
                return Err(ErrorCode::VolumeUnpaid);
            }
            if !mount.read_only && self.volumes.get(id).is_some_and(|v| v.writer.is_some()) {
                return Err(ErrorCode::VolumeInUse);
            }
        }
        Ok(())
    }

    /// A bid's mounts, journaled right before it: a read-write mount
    /// claims its volume's writer at once (checked free by the sequencer;
    /// on replay the same journal finds it free again).
    pub fn bid_volumes(&mut self, account: AccountId, client_order_id: u64, mounts: &[VolumeMount], at_ms: u64) -> Result<(), ErrorCode> {
        self.check_mounts(account, mounts, at_ms)?;
        let mut resolved = Vec::new();
        for mount in mounts {
            let id = self.by_name[&(account, mount.volume.clone())];
            if !mount.read_only {
                if let Some(volume) = self.volumes.get_mut(&id) {
                    volume.writer = Some(Holder::Pending);
                }
            }
            resolved.push(Mount { volume: id, mount: mount.mount.clone(), read_only: mount.read_only });
        }
        self.pending_bid = Some((account, client_order_id, resolved));
        Ok(())
    }

    /// Follows the engine's events: the pending bid numbered, its leases
    /// given its volumes, closed bids' claims and ended leases' volumes let
    /// go; a lease its host failed that re-match replaces (`replaced`) has
    /// its volumes carried to the replacement bid, then to its lease.
    pub fn observe(&mut self, events: &[Event], replaced: impl Fn(LeaseId) -> bool) -> Vec<Attached> {
        let mut attached = Vec::new();
        let mut buy_order = None;
        for event in events {
            match event.kind {
                EventKind::OrderAccepted { order, account, client_order_id, .. }
                    if client_order_id >= crate::rematch::REPLACEMENT_CLIENT_ORDER_ID_BASE =>
                {
                    let failed = LeaseId(client_order_id - crate::rematch::REPLACEMENT_CLIENT_ORDER_ID_BASE);
                    let Some(mounts) = self.carried.remove(&failed) else { continue };
                    for mount in &mounts {
                        if let Some(volume) = self.volumes.get_mut(&mount.volume).filter(|v| v.owner == account) {
                            if volume.writer == Some(Holder::Carried(failed)) {
                                volume.writer = Some(Holder::Bid(order));
                            }
                        }
                    }
                    self.bids.insert(order, mounts);
                }
                EventKind::Rejected { client_order_id, .. } if client_order_id >= crate::rematch::REPLACEMENT_CLIENT_ORDER_ID_BASE => {
                    let failed = LeaseId(client_order_id - crate::rematch::REPLACEMENT_CLIENT_ORDER_ID_BASE);
                    for mount in self.carried.remove(&failed).unwrap_or_default() {
                        if let Some(volume) = self.volumes.get_mut(&mount.volume) {
                            if volume.writer == Some(Holder::Carried(failed)) {
                                volume.writer = None;
                            }
                        }
                    }
                }
                EventKind::LeaseEnded { lease, reason: gpux_engine::LeaseEndReason::DeliveryFailed } if replaced(lease) => {
                    let mounts = self.leases.remove(&lease).unwrap_or_default();
                    for mount in &mounts {
                        if let Some(volume) = self.volumes.get_mut(&mount.volume) {
                            volume.readers.remove(&lease);
                            if volume.writer == Some(Holder::Lease(lease)) {
                                volume.writer = Some(Holder::Carried(lease));
                            }
                        }
                    }
                    if !mounts.is_empty() {
                        self.carried.insert(lease, mounts);
                    }
                }
                EventKind::OrderAccepted { order, account, client_order_id, .. }
                    if self.pending_bid.as_ref().is_some_and(|(a, c, _)| (*a, *c) == (account, client_order_id)) =>
                {
                    let (_, _, mounts) = self.pending_bid.take().expect("checked above");
                    for mount in mounts.iter().filter(|m| !m.read_only) {
                        if let Some(volume) = self.volumes.get_mut(&mount.volume) {
                            volume.writer = Some(Holder::Bid(order));
                        }
                    }
                    self.bids.insert(order, mounts);
                }
                EventKind::Trade { buy_order: order, .. } => buy_order = Some(order),
                EventKind::LeaseCreated { lease, supplier, .. } => {
                    let Some(mounts) = buy_order.and_then(|order| self.bids.get(&order).map(|m| (order, m.clone()))) else { continue };
                    let (order, mounts) = mounts;
                    let mut given = Vec::new();
                    let mut renter = None;
                    for mut mount in mounts {
                        let Some(volume) = self.volumes.get_mut(&mount.volume) else { continue };
                        renter = Some(volume.owner);
                        // The bid's first lease writes; any later one reads.
                        if !mount.read_only && volume.writer == Some(Holder::Bid(order)) {
                            volume.writer = Some(Holder::Lease(lease));
                        } else {
                            mount.read_only = true;
                            volume.readers.insert(lease);
                        }
                        given.push(VolumeAttachment {
                            volume: mount.volume,
                            name: volume.name.clone(),
                            mount: mount.mount.clone(),
                            read_only: mount.read_only,
                            bytes_max: u64::from(volume.size_gib) * GIB,
                        });
                        self.leases.entry(lease).or_default().push(mount);
                    }
                    if let Some(renter) = renter {
                        attached.push(Attached { lease, supplier, renter, volumes: given });
                    }
                }
                EventKind::OrderClosed { order, .. } => {
                    for mount in self.bids.remove(&order).unwrap_or_default() {
                        if let Some(volume) = self.volumes.get_mut(&mount.volume) {
                            if volume.writer == Some(Holder::Bid(order)) {
                                volume.writer = None;
                            }
                        }
                    }
                }
                EventKind::LeaseEnded { lease, .. } => {
                    for mount in self.leases.remove(&lease).unwrap_or_default() {
                        if let Some(volume) = self.volumes.get_mut(&mount.volume) {
                            volume.readers.remove(&lease);
                            if volume.writer == Some(Holder::Lease(lease)) {
                                volume.writer = None;
                            }
                        }
                    }
                }
                _ => {}
            }
        }
        // A bid the engine refused claims nothing.
        if let Some((_, _, mounts)) = self.pending_bid.take() {
            for mount in mounts {
                if let Some(volume) = self.volumes.get_mut(&mount.volume) {
                    if volume.writer == Some(Holder::Pending) {
                        volume.writer = None;
                    }
                }
            }
        }
        attached
    }

    pub fn info(&self, id: VolumeId) -> Option<VolumeInfo> {
        let v = self.volumes.get(&id)?;
        Some(VolumeInfo {
            volume: id,
            owner: v.owner,
            name: v.name.clone(),
            size_gib: v.size_gib,
            state: VolumeState::Ready,
            created_at_ms: v.created_at_ms,
            writer: match v.writer {
                Some(Holder::Lease(lease)) => Some(lease),
                _ => None,
            },
            writer_bid: match v.writer {
                Some(Holder::Bid(order)) => Some(order.0),
                _ => None,
            },
            readers: v.readers.iter().copied().collect(),
            unpaid_since_ms: self.unpaid.get(&v.owner).copied(),
            read_only_from_ms: self.unpaid.get(&v.owner).map(|since| since.saturating_add(STORAGE_GRACE_MS)),
            delete_from_ms: self.unpaid.get(&v.owner).map(|since| since.saturating_add(STORAGE_GRACE_MS + STORAGE_NOTICE_MS)),
            charged_minor: v.charged_minor,
        })
    }

    /// `account`'s volume called `name`.
    pub fn named(&self, account: AccountId, name: &str) -> Option<VolumeInfo> {
        self.by_name.get(&(account, name.to_string())).and_then(|id| self.info(*id))
    }

    /// `account`'s volumes, by name.
    pub fn list(&self, account: AccountId) -> Vec<VolumeInfo> {
        self.by_name
            .range((account, String::new())..)
            .take_while(|((a, _), _)| *a == account)
            .filter_map(|(_, id)| self.info(*id))
            .collect()
    }

    /// The volumes attached to `lease`, as its host was told.
    pub fn attachments(&self, lease: LeaseId) -> Vec<VolumeAttachment> {
        self.leases
            .get(&lease)
            .into_iter()
            .flatten()
            .filter_map(|m| {
                let volume = self.volumes.get(&m.volume)?;
                Some(VolumeAttachment {
                    volume: m.volume,
                    name: volume.name.clone(),
                    mount: m.mount.clone(),
                    read_only: m.read_only,
                    bytes_max: u64::from(volume.size_gib) * GIB,
                })
            })
            .collect()
    }

    /// The leases that hold volumes now (their hosts' store tokens hold
    /// while they run).
    pub fn leases(&self) -> impl Iterator<Item = LeaseId> + '_ {
        self.leases.keys().copied()
    }

    /// Whether `lease` holds volumes.
    pub fn holds(&self, lease: LeaseId) -> bool {
        self.leases.contains_key(&lease)
    }
}
