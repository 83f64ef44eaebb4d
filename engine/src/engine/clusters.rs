//! Cluster bids: `nodes` hosts with `quantity / nodes` GPUs each, every host
//! in one fabric group (one supplier's hosts that declared the same fabric
//! in the same zone) with at least the bid's fabric bandwidth, all of it or
//! none (docs/market-rules.md "Cluster bids").
//!
//! A cluster bid never trades with one ask at a time: an arriving ask
//! passes it over (it keeps its place in the bids' price-time order), and
//! the all-or-none sweep that follows every ask that rests (and the re-check
//! each second while it crosses) plans it whole. Planning walks the asks in
//! price-time priority; each ask that could give its host's `quantity /
//! nodes` GPUs becomes a member of its host's group (one ask, one member,
//! one host once), and the first group to reach `nodes` members fills, each
//! member at its own ask's price. Groups with fewer hosts than the bid asks
//! for are not looked at (`Engine::fabric_hosts`).

use std::collections::BTreeMap;

use super::{Checked, Engine};
use crate::book::{crosses, NIL};
use crate::command::{ClusterRule, FabricClaim, NewOrder, OrderOptions, Side};
use crate::event::{EventKind, OrderCloseReason, RejectCode};
use crate::gpus::lowest_bits;
use crate::ids::{AccountId, HostId, LeaseId, OrderId};
use crate::limits;

/// A fabric group: its index in the engine's table.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, serde::Serialize, serde::Deserialize)]
pub struct FabricId(pub u32);

/// One supplier's hosts wired to one fabric in one zone.
#[derive(Clone, Debug, serde::Serialize, serde::Deserialize)]
pub(crate) struct FabricGroup {
    pub owner: AccountId,
    pub zone: String,
    pub name: String,
    /// Hosts that declared it.
    pub hosts: u32,
}

/// What a host declared of its fabric (fixed with its first GPU that names one).
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub(crate) struct HostFabric {
    pub group: FabricId,
    pub gbps: u32,
    pub address: String,
    pub port_base: u16,
    /// Its last interconnect probe, if a cluster it served ran one.
    pub probe: Option<FabricProbe>,
}

/// A host's last interconnect probe (docs/market-rules.md "Interconnect
/// probe"): the bus bandwidth a ring all-reduce among a cluster's members
/// measured, as its agent signed it.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct FabricProbe {
    pub at_ms: u64,
    /// The cluster lease it was measured for (one probe per lease).
    pub lease: LeaseId,
    /// Hosts in the ring.
    pub ranks: u32,
    /// Bus bandwidth, Mb/s (0: the probe did not complete).
    pub mbps: u64,
    /// Whether it bears the host's claim out: at least
    /// [`limits::FABRIC_PROBE_MIN_PERCENT`] of the claimed Gb/s.
    pub borne_out: bool,
}

impl HostFabric {
    /// The bandwidth matching counts: the claim, or what the last probe
    /// measured when it did not bear the claim out.
    pub fn effective_gbps(&self) -> u32 {
        match &self.probe {
            Some(probe) if !probe.borne_out => (probe.mbps / 1_000).min(self.gbps as u64) as u32,
            _ => self.gbps,
        }
    }
}

/// Whether `mbps` measured bears out a claim of `gbps`.
pub fn probe_bears_out(gbps: u32, mbps: u64) -> bool {
    mbps.saturating_mul(100) >= gbps as u64 * 1_000 * limits::FABRIC_PROBE_MIN_PERCENT
}

/// Where a cluster member's peers reach it: its host's fabric address and
/// the port its lease's lowest GPU gives (`port_base` + that GPU's index on
/// the host, so two leases on one host never share a port).
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct MemberAddress {
    pub address: String,
    pub port: u16,
}

/// A host's fabric as the public sees it (no address).
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct FabricInfo {
    /// The group's name as its supplier declared it.
    pub name: String,
    pub zone: String,
    pub gbps: u32,
    /// Hosts of its supplier in the group.
    pub hosts: u32,
    /// The host's last interconnect probe, if any (always encoded, null
    /// before the first: binary frames have no optional fields).
    pub probe: Option<FabricProbe>,
}

/// The checks of a cluster bid that need no state (docs/market-rules.md
/// "Cluster bids").
pub(super) fn check_cluster(new: &NewOrder, options: &OrderOptions, nodes: u32) -> Result<(), RejectCode> {
    let shape_ok = (2..=limits::CLUSTER_NODES_MAX).contains(&nodes)
        && new.quantity.is_multiple_of(nodes)
        && new.quantity / nodes <= limits::GPUS_PER_HOST_MAX;
    let plain = new.side == Side::Buy
        && !new.one_host
        && new.min_quantity == 0
        && options.budget_minor == 0
        && options.stop_price_minor_per_gpu_hour == 0;
    if shape_ok && plain && new.quantity > 0 {
        Ok(())
    } else {
        Err(RejectCode::ClusterInvalid)
    }
}

impl Engine {
    /// Whether `claim` may be made for `host`: it declared none, or this one.
    pub(super) fn fabric_fits(&self, host: HostId, claim: &FabricClaim) -> bool {
        let Some(existing) = &self.hosts[host.0 as usize].fabric else { return true };
        self.fabrics[existing.group.0 as usize].name == claim.group
            && existing.gbps == claim.gbps
            && existing.address == claim.address
            && existing.port_base == claim.port_base
    }

    /// Records a host's fabric claim with its GPU's registration (checked by
    /// the caller: well formed, and `fabric_fits`): a host's first claim
    /// fixes it, in the zone it declared with its region.
    pub(super) fn declare_fabric(&mut self, host: HostId, claim: &FabricClaim) {
        let record = &self.hosts[host.0 as usize];
        if record.fabric.is_some() {
            return;
        }
        let key = (record.owner, record.zone.clone(), claim.group.clone());
        let group = match self.fabric_by_key.get(&key) {
            Some(&group) => group,
            None => {
                let group = FabricId(self.fabrics.len() as u32);
                self.fabrics.push(FabricGroup { owner: key.0, zone: key.1.clone(), name: key.2.clone(), hosts: 0 });
                self.fabric_by_key.insert(key, group);
                group
            }
        };
        let hosts = &mut self.fabrics[group.0 as usize].hosts;
        *hosts += 1;
        self.fabric_hosts_max = self.fabric_hosts_max.max(*hosts);
        self.hosts[host.0 as usize].fabric =
            Some(HostFabric { group, gbps: claim.gbps, address: claim.address.clone(), port_base: claim.port_base, probe: None });
    }

    /// Places a cluster bid: checked, then entered as an all-or-none bid
    /// that carries its shape.
    pub(super) fn place_cluster_order(
        &mut self,
        new: &NewOrder,
        options: &OrderOptions,
        regions: &[String],
        nodes: u32,
        min_fabric_gbps: u32,
    ) -> Result<(), RejectCode> {
        check_cluster(new, options, nodes)?;
        if self.instruments.get(new.instrument.0 as usize).is_some_and(|i| i.kind == super::ContractKind::LeaseResale) {
            return Err(RejectCode::ClusterInvalid);
        }
        let regions = if regions.is_empty() { 0 } else { self.region_mask(new, regions)? };
        // The class's rule raises the bid's own minimum (it is stored with the bid).
        let class = self.instruments.get(new.instrument.0 as usize).map_or(usize::MAX, |i| i.class as usize);
        let min_fabric_gbps = min_fabric_gbps.max(self.cluster_min_gbps.get(class).copied().unwrap_or(0));
        self.pending_cluster = Some((nodes as u16, min_fabric_gbps));
        let options = OrderOptions { all_or_none: true, ..*options };
        let placed = self.place_order_in(new, &options, regions);
        self.pending_cluster = None;
        placed
    }

    /// The asks a cluster bid would fill now, each with the GPUs it gives,
    /// in the asks' price-time order; `None` while no fabric group can
    /// fill it whole.
    pub(crate) fn cluster_plan(&self, bid_id: OrderId) -> Option<Vec<(OrderId, u64)>> {
        let bid = *self.orders.get(bid_id)?;
        let nodes = bid.nodes as usize;
        if nodes == 0 || (self.fabric_hosts_max as usize) < nodes {
            return None;
        }
        let per_node = bid.quantity / bid.nodes as u32;
        let asks = self.books[bid.instrument.0 as usize].side(Side::Sell);
        let mut members: BTreeMap<FabricId, Vec<(OrderId, HostId, u64)>> = BTreeMap::new();
        for position in (0..asks.level_count()).rev() {
            let level = asks.level(asks.level_at(position));
            if !crosses(Side::Buy, bid.price, level.price) {
                break;
            }
            let mut cursor = level.head;
            while cursor != NIL {
                let maker = *self.orders.at(cursor);
                let maker_id = self.orders.id_at(cursor);
                cursor = maker.next;
                // Its own account's asks are passed over (no self-trade).
                if maker.account == bid.account {
                    continue;
                }
                let Some(set) = maker.supply else { continue };
                let Some(fabric) = &self.hosts[set.host.0 as usize].fabric else { continue };
                if fabric.effective_gbps() < bid.min_fabric_gbps || (self.fabrics[fabric.group.0 as usize].hosts as usize) < nodes {
                    continue;
                }
                let group = members.entry(fabric.group).or_default();
                if group.iter().any(|&(_, host, _)| host == set.host) {
                    continue;
                }
                let (capacity, usable) = self.fill_capacity(&bid, &maker, maker_id);
                if capacity < per_node {
                    continue;
                }
                group.push((maker_id, set.host, lowest_bits(usable, per_node)));
                if group.len() == nodes {
                    return Some(group.iter().map(|&(id, _, mask)| (id, mask)).collect());
                }
            }
        }
        None
    }

    /// Fills a cluster bid whole from its plan, one lease (or set of
    /// contracts) per member, each at its ask's price.
    pub(crate) fn fill_cluster(&mut self, bid_id: OrderId, plan: Vec<(OrderId, u64)>) {
        let bid = *self.orders.get(bid_id).expect("a planned bid is live");
        let per_node = bid.quantity / bid.nodes as u32;
        for (maker_id, mask) in plan {
            let price = self.orders.get(maker_id).expect("a planned ask is live").price;
            self.execute_fill(bid_id, maker_id, per_node, mask, price, Side::Buy);
            if self.orders.get(maker_id).is_some_and(|m| m.quantity == 0) {
                self.close_order(maker_id, OrderCloseReason::Filled);
            }
        }
        if self.orders.get(bid_id).is_some_and(|b| b.quantity == 0) {
            self.close_order(bid_id, OrderCloseReason::Filled);
        }
    }

    /// A cluster bid that just arrived (or lost its place in a replace):
    /// fills whole now, or rests until it can (GTC, GTT), or is killed.
    pub(crate) fn enter_cluster(&mut self, id: OrderId, rests: bool) {
        match self.cluster_plan(id) {
            Some(plan) => self.fill_cluster(id, plan),
            None if rests => self.rest_or_close(id, true),
            None => self.close_order(id, OrderCloseReason::Killed),
        }
    }

    /// Where a cluster member's peers reach it (see [`MemberAddress`]);
    /// `None` for a lease whose host declared no fabric.
    pub fn member_address(&self, lease: LeaseId) -> Option<MemberAddress> {
        let lease = self.leases.get(lease.0 as usize)?;
        let fabric = self.hosts[lease.host.0 as usize].fabric.as_ref()?;
        let lowest = lease.gpu_mask.trailing_zeros().min(63) as u16;
        Some(MemberAddress { address: fabric.address.clone(), port: fabric.port_base.saturating_add(lowest) })
    }

    /// Replaces the listing's cluster rules (see `Command::SetClusterRules`).
    pub(super) fn set_cluster_rules(&mut self, rules: &[ClusterRule]) -> Checked<()> {
        let mut by_class = vec![0u32; self.config.classes.len()];
        for rule in rules {
            let class = self.config.classes.iter().position(|c| c.name == rule.class).ok_or(RejectCode::ListingIncompatible)?;
            if by_class[class] != 0 || !(1..=limits::FABRIC_GBPS_MAX).contains(&rule.min_fabric_gbps) {
                return Err(RejectCode::ListingIncompatible);
            }
            by_class[class] = rule.min_fabric_gbps;
        }
        self.cluster_min_gbps = by_class;
        Ok(())
    }

    /// The listing's cluster rules in force, in class order.
    pub fn cluster_rules(&self) -> Vec<ClusterRule> {
        self.cluster_min_gbps
            .iter()
            .enumerate()
            .filter(|(_, gbps)| **gbps > 0)
            .map(|(class, gbps)| ClusterRule { class: self.config.classes[class].name.clone(), min_fabric_gbps: *gbps })
            .collect()
    }

    /// The fabric of a lease's host, as the public sees it.
    pub fn lease_fabric(&self, lease: LeaseId) -> Option<FabricInfo> {
        self.host_fabric(self.leases.get(lease.0 as usize)?.host)
    }

    /// A host's fabric as the public sees it.
    pub fn host_fabric(&self, host: HostId) -> Option<FabricInfo> {
        let fabric = self.hosts.get(host.0 as usize)?.fabric.as_ref()?;
        let group = &self.fabrics[fabric.group.0 as usize];
        Some(FabricInfo {
            name: group.name.clone(),
            zone: group.zone.clone(),
            gbps: fabric.gbps,
            hosts: group.hosts,
            probe: fabric.probe.clone(),
        })
    }

    /// Records a cluster member's interconnect probe on its lease's host
    /// (checked by the market: the lease's supplier signed it, once per
    /// lease). A probe that does not bear the claim out is told to the
    /// owner like a challenge that was too slow, and the host counts in
    /// cluster bids at what was measured until a later probe bears it out.
    pub(super) fn record_fabric_probe(&mut self, lease: LeaseId, ranks: u32, mbps: u64) -> Checked<()> {
        let record = self.leases.get(lease.0 as usize).ok_or(RejectCode::UnknownLease)?;
        let host = record.host;
        let at_ms = self.now_ms;
        let owner = self.hosts[host.0 as usize].owner;
        let Some(fabric) = self.hosts[host.0 as usize].fabric.as_mut() else { return Err(RejectCode::FabricInvalid) };
        if fabric.probe.as_ref().is_some_and(|p| p.lease == lease) {
            return Err(RejectCode::FabricInvalid);
        }
        let borne_out = probe_bears_out(fabric.gbps, mbps);
        let claimed_gbps = fabric.gbps;
        fabric.probe = Some(FabricProbe { at_ms, lease, ranks, mbps, borne_out });
        self.emit(EventKind::FabricProbed { lease, host, owner, claimed_gbps, ranks, mbps, borne_out });
        Ok(())
    }

    /// A cluster bid's shape: `(nodes, min_fabric_gbps)`, `None` for other orders.
    pub fn order_cluster(&self, order: OrderId) -> Option<(u32, u32)> {
        self.orders.get(order).filter(|o| o.nodes > 0).map(|o| (o.nodes as u32, o.min_fabric_gbps))
    }
}
