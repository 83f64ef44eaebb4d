//! Cluster bids (docs/market-rules.md "Cluster bids"): `nodes` hosts with
//! the same number of GPUs each, all in one fabric group (one supplier's
//! hosts that declared the same fabric in the same zone) with at least the
//! bid's bandwidth, all or none. Scenarios first, then a property test
//! against a reference model written with sorting and linear scans.

mod common;

use std::collections::BTreeMap;

use common::*;
use gpux_engine::*;
use proptest::prelude::*;

fn claim(group: &str, gbps: u32, port_base: u16) -> FabricClaim {
    FabricClaim { group: group.into(), gbps, address: "10.0.0.1".into(), port_base }
}

/// Registers `gpus` H100s on a new host in us-east, zone `zone`, on
/// `fabric` (`None`: no fabric).
fn host(m: &mut Market, supplier: AccountId, name: &str, gpus: u32, zone: &str, fabric: Option<(&str, u32)>) -> HostId {
    let Some((group, gbps)) = fabric else { return m.h100_host_in(supplier, name, gpus, Some(("us-east", zone))) };
    let mut host = None;
    for index in 0..gpus {
        let events = m.apply(Command::Register {
            account: supplier,
            host: name.into(),
            gpu_uuid: format!("GPU-{name}-{index}"),
            spec: h100_spec(),
            region: Some("us-east".into()),
            zone: zone.into(),
            fabric: Some(Box::new(claim(group, gbps, 40_000))),
        });
        host = events.iter().find_map(|e| match e.kind {
            EventKind::GpuRegistered { host, .. } => Some(host),
            _ => None,
        });
        assert!(host.is_some(), "not registered: {:?}", rejection(&events));
    }
    host.expect("a GPU")
}

fn cluster_bid(m: &mut Market, renter: AccountId, price: u64, nodes: u32, per_node: u32, min_gbps: u32) -> Vec<Event> {
    let order = m.order(renter, H100_SPOT, Side::Buy, price, nodes * per_node);
    m.apply(Command::Place {
        order,
        options: OrderOptions::default(),
        regions: Vec::new(),
        cluster: Some(ClusterTerms { nodes, min_fabric_gbps: min_gbps }),
    })
}

/// `(host, GPUs, price)` of every lease the events created.
fn members(events: &[Event]) -> Vec<(HostId, u32, u64)> {
    events
        .iter()
        .filter_map(|e| match e.kind {
            EventKind::LeaseCreated { host, gpu_mask, price_minor_per_gpu_hour, .. } => {
                Some((host, gpu_mask.count_ones(), price_minor_per_gpu_hour))
            }
            _ => None,
        })
        .collect()
}

#[test]
fn a_cluster_bid_fills_whole_hosts_of_one_fabric_group_at_each_asks_price() {
    let mut m = Market::new();
    let supplier = m.supplier();
    let a = host(&mut m, supplier, "ib-a", 8, "z1", Some(("ib0", 400)));
    let b = host(&mut m, supplier, "ib-b", 8, "z1", Some(("ib0", 400)));
    let lone = host(&mut m, supplier, "lone", 8, "z1", None);
    m.ask(supplier, lone, 0xff, H100_SPOT, 1_000_000);
    m.ask(supplier, a, 0xff, H100_SPOT, 1_200_000);
    m.ask(supplier, b, 0xff, H100_SPOT, 1_300_000);
    let renter = m.renter(1_000_000_000_000);
    let events = cluster_bid(&mut m, renter, 2_000_000, 2, 4, 0);
    let bid = accepted(&events).expect("accepted");
    assert_eq!(members(&events), [(a, 4, 1_200_000), (b, 4, 1_300_000)], "the cheaper host without a fabric is passed over");
    assert_eq!(closed(&events, bid), Some(OrderCloseReason::Filled));
    // The host without a fabric kept its place for a plain bid.
    let (_, events) = m.bid(renter, H100_SPOT, 2_000_000, 1);
    assert_eq!(members(&events), [(lone, 1, 1_000_000)]);
}

#[test]
fn a_cluster_bid_rests_until_one_group_has_enough_hosts_and_passes_over_the_others() {
    let mut m = Market::new();
    let supplier = m.supplier();
    let other = m.supplier();
    // Two hosts on ib0 in z1; one on ib0 in z2 (another group: another zone);
    // one of another supplier named ib0 (another group); one on slow ib0.
    let a = host(&mut m, supplier, "a", 2, "z1", Some(("ib0", 400)));
    let b = host(&mut m, supplier, "b", 2, "z1", Some(("ib0", 400)));
    let far = host(&mut m, supplier, "far", 2, "z2", Some(("ib0", 400)));
    let theirs = host(&mut m, other, "theirs", 2, "z1", Some(("ib0", 400)));
    let slow = host(&mut m, supplier, "slow", 2, "z1", Some(("ib1", 100)));
    let slow2 = host(&mut m, supplier, "slow2", 2, "z1", Some(("ib1", 100)));
    let c = host(&mut m, supplier, "c", 2, "z1", Some(("ib0", 400)));
    for h in [a, far, theirs, slow, slow2] {
        m.ask(if h == theirs { other } else { supplier }, h, 0b11, H100_SPOT, 1_000_000);
    }
    let renter = m.renter(1_000_000_000_000);
    let events = cluster_bid(&mut m, renter, 2_000_000, 3, 2, 200);
    let bid = accepted(&events).expect("accepted");
    assert!(members(&events).is_empty(), "no group of 3 hosts at 200 Gb/s yet: {:?}", members(&events));
    assert_eq!(closed(&events, bid), None, "a GTC cluster bid rests");
    m.ask(supplier, b, 0b11, H100_SPOT, 1_500_000);
    assert!(members(&m.log).is_empty(), "two of three hosts on ib0 in z1");
    // The ask that completes the group fills the bid in the same command.
    m.ask(supplier, c, 0b11, H100_SPOT, 1_800_000);
    assert_eq!(members(&m.log), [(a, 2, 1_000_000), (b, 2, 1_500_000), (c, 2, 1_800_000)]);
}

#[test]
fn the_first_group_to_complete_in_price_time_order_fills() {
    let mut m = Market::new();
    let supplier = m.supplier();
    let x1 = host(&mut m, supplier, "x1", 1, "z1", Some(("x", 400)));
    let y1 = host(&mut m, supplier, "y1", 1, "z1", Some(("y", 400)));
    let y2 = host(&mut m, supplier, "y2", 1, "z1", Some(("y", 400)));
    let x2 = host(&mut m, supplier, "x2", 1, "z1", Some(("x", 400)));
    m.ask(supplier, x1, 1, H100_SPOT, 1_000_000);
    m.ask(supplier, y1, 1, H100_SPOT, 1_100_000);
    m.ask(supplier, y2, 1, H100_SPOT, 1_200_000);
    m.ask(supplier, x2, 1, H100_SPOT, 1_300_000);
    let renter = m.renter(1_000_000_000_000);
    let events = cluster_bid(&mut m, renter, 2_000_000, 2, 1, 0);
    assert_eq!(members(&events), [(y1, 1, 1_100_000), (y2, 1, 1_200_000)], "y is whole at 1.20, x only at 1.30");
}

#[test]
fn an_ask_fills_an_earlier_plain_bid_while_a_better_cluster_bid_waits_for_its_group() {
    let mut m = Market::new();
    let supplier = m.supplier();
    let a = host(&mut m, supplier, "a", 1, "z1", Some(("ib0", 400)));
    let b = host(&mut m, supplier, "b", 1, "z1", Some(("ib0", 400)));
    let renter = m.renter(1_000_000_000_000);
    let cluster = accepted(&cluster_bid(&mut m, renter, 3_000_000, 2, 1, 0)).expect("accepted");
    let (plain, _) = m.bid(renter, H100_SPOT, 2_000_000, 1);
    // One host alone cannot serve the cluster bid: the plain bid behind it trades.
    let ask = m.ask(supplier, a, 1, H100_SPOT, 1_000_000);
    assert_eq!(closed(&m.log, plain), Some(OrderCloseReason::Filled));
    assert_eq!(closed(&m.log, ask), Some(OrderCloseReason::Filled));
    m.ask(supplier, b, 1, H100_SPOT, 1_000_000);
    assert_eq!(closed(&m.log, cluster), None, "one host left in the group");
    // The first lease ends: its GPU is offered again and the cluster fills.
    m.advance(HOUR);
    m.ask(supplier, a, 1, H100_SPOT, 1_100_000);
    assert_eq!(closed(&m.log, cluster), Some(OrderCloseReason::Filled));
}

#[test]
fn a_cluster_bid_keeps_its_shape_in_a_replace_and_refills_at_a_new_price() {
    let mut m = Market::new();
    let supplier = m.supplier();
    let a = host(&mut m, supplier, "a", 2, "z1", Some(("ib0", 400)));
    let b = host(&mut m, supplier, "b", 2, "z1", Some(("ib0", 400)));
    m.ask(supplier, a, 0b11, H100_SPOT, 1_500_000);
    m.ask(supplier, b, 0b11, H100_SPOT, 1_500_000);
    let renter = m.renter(1_000_000_000_000);
    let bid = accepted(&cluster_bid(&mut m, renter, 1_000_000, 2, 2, 0)).expect("accepted");
    assert_eq!(m.engine.order_cluster(bid), Some((2, 0)));
    let events = m.apply(Command::ReplaceOrder { account: renter, order: bid, price_minor_per_gpu_hour: 1_000_000, quantity: 2 });
    assert_eq!(rejection(&events), Some(RejectCode::ReplaceInvalid), "a cluster bid's size stays nodes x GPUs");
    let events = m.apply(Command::ReplaceOrder { account: renter, order: bid, price_minor_per_gpu_hour: 1_600_000, quantity: 4 });
    assert_eq!(members(&events), [(a, 2, 1_500_000), (b, 2, 1_500_000)]);
}

#[test]
fn malformed_cluster_bids_and_fabric_claims_are_refused_with_their_codes() {
    let mut m = Market::new();
    let supplier = m.supplier();
    let renter = m.renter(1_000_000_000_000);
    for (what, nodes, per_node) in [("one node", 1, 2), ("too many nodes", 65, 1), ("more GPUs than a host has", 2, 65)] {
        assert_eq!(rejection(&cluster_bid(&mut m, renter, 2_000_000, nodes, per_node, 0)), Some(RejectCode::ClusterInvalid), "{what}");
    }
    let odd = m.order(renter, H100_SPOT, Side::Buy, 2_000_000, 5);
    let events = m.apply(Command::Place {
        order: odd,
        options: OrderOptions::default(),
        regions: vec![],
        cluster: Some(ClusterTerms { nodes: 2, min_fabric_gbps: 0 }),
    });
    assert_eq!(rejection(&events), Some(RejectCode::ClusterInvalid), "5 GPUs on 2 nodes");
    let mut ask = m.order(supplier, H100_SPOT, Side::Sell, 2_000_000, 2);
    ask.one_host = false;
    let events = m.apply(Command::Place {
        order: ask,
        options: OrderOptions::default(),
        regions: vec![],
        cluster: Some(ClusterTerms { nodes: 2, min_fabric_gbps: 0 }),
    });
    assert_eq!(rejection(&events), Some(RejectCode::ClusterInvalid), "an ask");
    let order = m.order(renter, H100_SPOT, Side::Buy, 2_000_000, 4);
    let budget = OrderOptions { budget_minor: 10_000_000, ..OrderOptions::default() };
    let events =
        m.apply(Command::Place { order, options: budget, regions: vec![], cluster: Some(ClusterTerms { nodes: 2, min_fabric_gbps: 0 }) });
    assert_eq!(rejection(&events), Some(RejectCode::ClusterInvalid), "a budget");

    let register = |m: &mut Market, uuid: &str, host: &str, fabric: FabricClaim| {
        rejection(&m.apply(Command::Register {
            account: supplier,
            host: host.into(),
            gpu_uuid: uuid.into(),
            spec: h100_spec(),
            region: Some("us-east".into()),
            zone: "z1".into(),
            fabric: Some(Box::new(fabric)),
        }))
    };
    for (what, bad) in [
        ("an empty group", claim("", 400, 40_000)),
        ("a group with a space", claim("ib 0", 400, 40_000)),
        ("no bandwidth", claim("ib0", 0, 40_000)),
        ("too much bandwidth", claim("ib0", 100_001, 40_000)),
        ("a privileged port", claim("ib0", 400, 80)),
        ("ports past 65535", claim("ib0", 400, 65_500)),
        ("a host name for an address", FabricClaim { address: "node-1".into(), ..claim("ib0", 400, 40_000) }),
    ] {
        assert_eq!(register(&mut m, "GPU-x", "x", bad), Some(RejectCode::FabricInvalid), "{what}");
    }
    assert_eq!(register(&mut m, "GPU-y0", "y", claim("ib0", 400, 40_000)), None);
    assert_eq!(register(&mut m, "GPU-y1", "y", claim("ib0", 400, 40_000)), None, "the same claim again");
    assert_eq!(register(&mut m, "GPU-y2", "y", claim("ib1", 400, 40_000)), Some(RejectCode::FabricMismatch));
    assert_eq!(register(&mut m, "GPU-y3", "y", claim("ib0", 200, 40_000)), Some(RejectCode::FabricMismatch));
    let y = m.engine.gpu(GpuId(0)).expect("registered").host;
    assert_eq!(m.engine.host_fabric(y).map(|f| (f.name, f.zone, f.gbps, f.hosts)), Some(("ib0".into(), "z1".into(), 400, 1)));
}

#[test]
fn a_members_address_is_its_hosts_fabric_address_and_the_port_of_its_lowest_gpu() {
    let mut m = Market::new();
    let supplier = m.supplier();
    let a = host(&mut m, supplier, "a", 4, "z1", Some(("ib0", 400)));
    let b = host(&mut m, supplier, "b", 4, "z1", Some(("ib0", 400)));
    m.ask(supplier, a, 0b1100, H100_SPOT, 1_000_000);
    m.ask(supplier, b, 0b0011, H100_SPOT, 1_000_000);
    let renter = m.renter(1_000_000_000_000);
    let events = cluster_bid(&mut m, renter, 2_000_000, 2, 2, 0);
    let addresses: Vec<MemberAddress> = leases(&events).iter().map(|l| m.engine.member_address(l.0).expect("on a fabric")).collect();
    assert_eq!(addresses.iter().map(|a| a.port).collect::<Vec<_>>(), [40_002, 40_000]);
    assert!(addresses.iter().all(|a| a.address == "10.0.0.1"));
}

#[test]
fn a_probe_that_does_not_bear_out_a_claim_counts_the_host_at_what_it_measured_until_one_does() {
    let mut m = Market::new();
    let supplier = m.supplier();
    let a = host(&mut m, supplier, "a", 2, "z1", Some(("ib0", 400)));
    let b = host(&mut m, supplier, "b", 2, "z1", Some(("ib0", 400)));
    m.ask(supplier, a, 0b11, H100_SPOT, 1_000_000);
    m.ask(supplier, b, 0b11, H100_SPOT, 1_000_000);
    let renter = m.renter(1_000_000_000_000);
    let first = leases(&cluster_bid(&mut m, renter, 2_000_000, 2, 1, 400));
    assert_eq!(first.len(), 2, "the claims stand before any probe");

    // Host a's ring measured 40 Gb/s: under a quarter of its 400.
    let events = m.apply(Command::RecordFabricProbe { lease: first[0].0, ranks: 2, mbps: 40_000 });
    let probed = events.iter().find_map(|e| match e.kind {
        EventKind::FabricProbed { host, owner, claimed_gbps, mbps, borne_out, .. } => Some((host, owner, claimed_gbps, mbps, borne_out)),
        _ => None,
    });
    assert_eq!(probed, Some((a, supplier, 400, 40_000, false)));
    // Host b's bore its claim out (150 Gb/s is at least 25% of 400).
    m.apply(Command::RecordFabricProbe { lease: first[1].0, ranks: 2, mbps: 150_000 });
    let fabric = |m: &Market, host| m.engine.host_fabric(host).expect("a fabric").probe.expect("probed");
    assert!(!fabric(&m, a).borne_out && fabric(&m, b).borne_out);
    assert_eq!(fabric(&m, a).mbps, 40_000, "published with the host's fabric");
    let refused = m.apply(Command::RecordFabricProbe { lease: first[0].0, ranks: 2, mbps: 400_000 });
    assert_eq!(rejection(&refused), Some(RejectCode::FabricInvalid), "one probe per lease");

    // Host a now counts at 40 Gb/s: a 400 Gb/s cluster bid passes it over,
    // one for 40 Gb/s fills it.
    let events = cluster_bid(&mut m, renter, 2_000_000, 2, 1, 400);
    assert!(leases(&events).is_empty(), "host a no longer counts at 400 Gb/s");
    let events = cluster_bid(&mut m, renter, 2_000_000, 2, 1, 40);
    assert_eq!(members(&events).len(), 2, "both hosts fill a bid for what a measured");
    let on_a = events.iter().find_map(|e| match e.kind {
        EventKind::LeaseCreated { lease, host, .. } if host == a => Some(lease),
        _ => None,
    });
    // A later probe that bears the claim out restores it.
    m.apply(Command::RecordFabricProbe { lease: on_a.expect("a lease on a"), ranks: 2, mbps: 380_000 });
    assert!(fabric(&m, a).borne_out);
}

#[test]
fn the_listings_cluster_rule_raises_every_later_cluster_bids_bandwidth_in_its_class() {
    let mut m = Market::new();
    let supplier = m.supplier();
    let slow = [host(&mut m, supplier, "s1", 1, "z1", Some(("eth0", 100))), host(&mut m, supplier, "s2", 1, "z1", Some(("eth0", 100)))];
    let fast = [host(&mut m, supplier, "f1", 1, "z1", Some(("ib0", 400))), host(&mut m, supplier, "f2", 1, "z1", Some(("ib0", 400)))];
    for host in slow {
        m.ask(supplier, host, 0b1, H100_SPOT, 1_000_000);
    }
    for host in fast {
        m.ask(supplier, host, 0b1, H100_SPOT, 1_500_000);
    }
    let rule = |class: &str, gbps| ClusterRule { class: class.into(), min_fabric_gbps: gbps };
    for bad in [vec![rule("NOPE", 200)], vec![rule("H100-SXM-80G", 0)], vec![rule("H100-SXM-80G", 200), rule("H100-SXM-80G", 300)]] {
        assert_eq!(rejection(&m.apply(Command::SetClusterRules { rules: bad })), Some(RejectCode::ListingIncompatible));
    }
    m.apply(Command::SetClusterRules { rules: vec![rule("H100-SXM-80G", 200)] });
    assert_eq!(m.engine.cluster_rules(), [rule("H100-SXM-80G", 200)]);
    // A bid asking for no bandwidth of its own gets the class's 200 Gb/s:
    // the cheaper 100 Gb/s group is passed over.
    let renter = m.renter(1_000_000_000_000);
    let events = cluster_bid(&mut m, renter, 2_000_000, 2, 1, 0);
    let hosts: Vec<HostId> = members(&events).iter().map(|m| m.0).collect();
    assert_eq!(hosts, fast);
    // Without the rule, the next one takes the cheaper group.
    m.apply(Command::SetClusterRules { rules: Vec::new() });
    let events = cluster_bid(&mut m, renter, 2_000_000, 2, 1, 0);
    let hosts: Vec<HostId> = members(&events).iter().map(|m| m.0).collect();
    assert_eq!(hosts, slow);
}

// ---- property test against a reference model ----

#[derive(Clone, Debug)]
struct HostSpec {
    supplier: usize,
    /// 0, 1: fabric x, y; 2: none.
    fabric: u8,
    gbps: u32,
    gpus: u32,
}

#[derive(Clone, Debug)]
struct AskSpec {
    host: usize,
    /// GPUs of the host it offers (its lowest ones not offered already).
    gpus: u32,
    ticks: u64,
}

#[derive(Clone, Debug)]
struct BidSpec {
    nodes: u32,
    per_node: u32,
    ticks: u64,
    min_gbps: u32,
    /// The bid arrives after this many of the asks.
    after: usize,
}

const TICK: u64 = 100_000;
const BASE: u64 = 1_000_000;

fn host_spec() -> impl Strategy<Value = HostSpec> {
    (prop::sample::select(vec![0usize, 0, 0, 1]), 0..3u8, prop::sample::select(vec![100u32, 400, 400]), 1..=4u32)
        .prop_map(|(supplier, fabric, gbps, gpus)| HostSpec { supplier, fabric, gbps, gpus })
}

/// The reference: after each ask (from the bid's arrival on), walk the asks
/// so far in (price, arrival) order; an ask that qualifies joins its host's
/// group unless the host is in already; the first group to reach `nodes`
/// members fills. `None`: it never fills.
fn reference(hosts: &[HostSpec], asks: &[AskSpec], bid: &BidSpec) -> Option<Vec<(usize, u64)>> {
    for arrived in bid.after..=asks.len() {
        let mut order: Vec<(u64, usize)> = asks[..arrived].iter().enumerate().map(|(i, a)| (a.ticks, i)).collect();
        order.sort();
        let mut groups: BTreeMap<(usize, u8), Vec<(usize, u64)>> = BTreeMap::new();
        for (ticks, i) in order {
            let ask = &asks[i];
            let host = &hosts[ask.host];
            if ticks > bid.ticks || host.fabric == 2 || host.gbps < bid.min_gbps || ask.gpus < bid.per_node {
                continue;
            }
            let group = groups.entry((host.supplier, host.fabric)).or_default();
            if group.iter().any(|&(h, _)| h == ask.host) {
                continue;
            }
            group.push((ask.host, BASE + ticks * TICK));
            if group.len() == bid.nodes as usize {
                return Some(group.clone());
            }
        }
    }
    None
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn cluster_fills_match_the_reference_model(
        hosts in prop::collection::vec(host_spec(), 2..10),
        raw_asks in prop::collection::vec((0..64usize, 1..=2u32, 0..8u64), 2..24),
        nodes in 2..=3u32,
        per_node in 1..=2u32,
        bid_ticks in 3..10u64,
        min_gbps in prop::sample::select(vec![0u32, 0, 400]),
        after in 0..24usize,
    ) {
        let mut m = Market::new();
        let suppliers = [m.supplier(), m.supplier()];
        let renter = m.renter(1_000_000_000_000);
        let ids: Vec<HostId> = hosts
            .iter()
            .enumerate()
            .map(|(i, h)| {
                let fabric = ["x", "y"].get(h.fabric as usize).map(|g| (*g, h.gbps));
                host(&mut m, suppliers[h.supplier], &format!("h{i}"), h.gpus, "z1", fabric)
            })
            .collect();
        // Asks take each host's lowest GPUs not offered yet; an ask wanting
        // more than are left is dropped.
        let mut offered = vec![0u32; hosts.len()];
        let mut asks = Vec::new();
        for (host, gpus, ticks) in raw_asks {
            let host = host % hosts.len();
            if offered[host] + gpus > hosts[host].gpus {
                continue;
            }
            asks.push((AskSpec { host, gpus, ticks }, ((1u64 << gpus) - 1) << offered[host]));
            offered[host] += gpus;
        }
        let specs: Vec<AskSpec> = asks.iter().map(|(a, _)| a.clone()).collect();
        let bid = BidSpec { nodes, per_node, ticks: bid_ticks, min_gbps, after: after.min(asks.len()) };
        let expected = reference(&hosts, &specs, &bid);
        let mut placed = false;
        for index in 0..=asks.len() {
            if index == bid.after && !placed {
                let events = cluster_bid(&mut m, renter, BASE + bid.ticks * TICK, nodes, per_node, min_gbps);
                prop_assert!(accepted(&events).is_some(), "refused: {:?}", rejection(&events));
                placed = true;
            }
            if let Some((ask, mask)) = asks.get(index) {
                let supplier = suppliers[hosts[ask.host].supplier];
                m.ask(supplier, ids[ask.host], *mask, H100_SPOT, BASE + ask.ticks * TICK);
            }
        }
        let got: Vec<(usize, u32, u64)> = members(&m.log)
            .into_iter()
            .map(|(host, gpus, price)| (ids.iter().position(|&h| h == host).expect("a known host"), gpus, price))
            .collect();
        let want: Vec<(usize, u32, u64)> = expected.unwrap_or_default().into_iter().map(|(h, price)| (h, per_node, price)).collect();
        prop_assert_eq!(got, want);
    }
}
