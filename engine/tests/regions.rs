//! Regions (docs/market-rules.md "Regions"): hosts declare one of the
//! listing's regions with their first GPU that names one; a bid may require
//! a set of regions and then trades only with GPUs of hosts there, passing
//! over the others, which keep their place.

mod common;

use common::*;
use gpux_engine::*;

/// Registers `gpus` H100s on a new host in `region` (and `zone`).
fn regional_host(m: &mut Market, supplier: AccountId, name: &str, gpus: u32, region: &str, zone: &str) -> HostId {
    m.h100_host_in(supplier, name, gpus, Some((region, zone)))
}

fn regional_bid(m: &mut Market, renter: AccountId, price: u64, quantity: u32, regions: &[&str]) -> Vec<Event> {
    let order = m.order(renter, H100_SPOT, Side::Buy, price, quantity);
    let regions = regions.iter().map(|r| r.to_string()).collect();
    m.apply(Command::Place { order, options: OrderOptions::default(), regions, cluster: None })
}

/// The seller account of each lease the events created, in order.
fn lease_hosts(events: &[Event]) -> Vec<HostId> {
    events
        .iter()
        .filter_map(|e| match e.kind {
            EventKind::LeaseCreated { host, .. } => Some(host),
            _ => None,
        })
        .collect()
}

struct Fixture {
    m: Market,
    us_east: HostId,
    cn_east: HostId,
    cn_west: HostId,
    undeclared: HostId,
    renter: AccountId,
}

/// Four one-GPU hosts asking, cheapest first: undeclared $1.00, us-east
/// $1.50, cn-west $1.80, cn-east $2.50.
fn fixture() -> Fixture {
    let mut m = Market::new();
    let supplier = m.supplier();
    let undeclared = m.h100_host(supplier, "plain", 1);
    let us_east = regional_host(&mut m, supplier, "virginia", 1, "us-east", "use1-az2");
    let cn_west = regional_host(&mut m, supplier, "guizhou", 1, "cn-west", "");
    let cn_east = regional_host(&mut m, supplier, "shanghai", 1, "cn-east", "sh-2");
    m.ask(supplier, undeclared, 0b1, H100_SPOT, 1_000_000);
    m.ask(supplier, us_east, 0b1, H100_SPOT, 1_500_000);
    m.ask(supplier, cn_west, 0b1, H100_SPOT, 1_800_000);
    m.ask(supplier, cn_east, 0b1, H100_SPOT, 2_500_000);
    let renter = m.renter(100_000_000_000);
    Fixture { m, us_east, cn_east, cn_west, undeclared, renter }
}

#[test]
fn a_region_restricted_bid_passes_over_cheaper_asks_elsewhere_and_they_keep_their_place() {
    let Fixture { mut m, us_east, cn_east, undeclared, renter, .. } = fixture();
    let events = regional_bid(&mut m, renter, 3_000_000, 1, &["cn-east"]);
    assert_eq!(lease_hosts(&events), [cn_east], "only the cn-east GPU serves it, at its own (maker's) price");
    assert_eq!(trades(&events), [(2_500_000, 1)]);
    // The asks it passed over are still first in line for anyone else.
    let (_, events) = m.bid(renter, H100_SPOT, 3_000_000, 2);
    assert_eq!(lease_hosts(&events), [undeclared, us_east]);
    assert_eq!(trades(&events), [(1_000_000, 1), (1_500_000, 1)]);
}

#[test]
fn a_bid_for_several_regions_takes_the_best_asks_among_them_and_rests_for_the_rest() {
    let Fixture { mut m, cn_east, cn_west, renter, .. } = fixture();
    let events = regional_bid(&mut m, renter, 3_000_000, 3, &["cn-west", "cn-east"]);
    assert_eq!(lease_hosts(&events), [cn_west, cn_east], "price order within the regions");
    let bid = accepted(&events).expect("accepted");
    let open = m.engine.open_orders(renter);
    assert_eq!(open.len(), 1, "the third GPU rests");
    assert_eq!((open[0].order, open[0].quantity, open[0].regions.clone()), (bid, 1, vec!["cn-east".to_string(), "cn-west".into()]));

    // A resting regional bid is passed over by an ask from elsewhere, and
    // taken by one from its regions.
    let supplier = m.supplier();
    let frankfurt = regional_host(&mut m, supplier, "frankfurt", 1, "eu-central", "");
    let mut ask = m.order(supplier, H100_SPOT, Side::Sell, 2_000_000, 1);
    ask.supply = Some(GpuSet { host: frankfurt, gpu_mask: 0b1 });
    let events = m.place(ask);
    assert!(trades(&events).is_empty(), "eu-central does not serve a cn-* bid");
    let chengdu = regional_host(&mut m, supplier, "chengdu", 1, "cn-west", "");
    let mut ask = m.order(supplier, H100_SPOT, Side::Sell, 2_000_000, 1);
    ask.supply = Some(GpuSet { host: chengdu, gpu_mask: 0b1 });
    let events = m.place(ask);
    assert_eq!(lease_hosts(&events), [chengdu]);
    assert_eq!(closed(&events, bid), Some(OrderCloseReason::Filled));
}

#[test]
fn an_undeclared_host_serves_only_bids_for_any_region() {
    let mut m = Market::new();
    let supplier = m.supplier();
    let plain = m.h100_host(supplier, "plain", 1);
    m.ask(supplier, plain, 0b1, H100_SPOT, USD_2);
    let renter = m.renter(10_000_000_000);
    let events = regional_bid(&mut m, renter, USD_2, 1, &["us-east", "us-west", "eu-central", "cn-east", "cn-west"]);
    assert!(trades(&events).is_empty(), "a host in no region is in none of them");
    let offers = m.engine.offers(H100_SPOT, 0, 10).0;
    assert_eq!(offers.len(), 1);
    assert_eq!(offers[0].region, None);
}

#[test]
fn a_host_declares_its_region_once_with_its_first_gpu_and_keeps_it() {
    let mut m = Market::new();
    let supplier = m.supplier();
    let host = regional_host(&mut m, supplier, "rack-7", 2, "eu-central", "fra-1");
    let gpu = m.engine.host_gpu(host, 1).expect("second GPU");
    let info = m.engine.gpu(gpu).expect("registered");
    assert_eq!((info.region.as_deref(), info.zone.as_str()), (Some("eu-central"), "fra-1"));
    // A GPU that names no region joins the host's; another region is refused.
    let events = m.apply(Command::register(supplier, "rack-7", "GPU-x", h100_spec()));
    assert_eq!(rejection(&events), None);
    let before = m.engine.state_hash();
    let events = m.apply(Command::Register {
        account: supplier,
        host: "rack-7".into(),
        gpu_uuid: "GPU-y".into(),
        spec: h100_spec(),
        region: Some("us-west".into()),
        zone: String::new(),
        fabric: None,
    });
    assert_eq!(rejection(&events), Some(RejectCode::RegionMismatch));
    assert_eq!(m.engine.state_hash(), before, "a refusal changes nothing");
    m.ask(supplier, host, 0b111, H100_SPOT, USD_2);
    let offers = m.engine.offers(H100_SPOT, 0, 10).0;
    assert_eq!((offers[0].host, offers[0].region.as_deref()), (Some(host), Some("eu-central")));
}

#[test]
fn region_mistakes_are_refused_with_their_codes_and_change_nothing() {
    let Fixture { mut m, renter, us_east, .. } = fixture();
    let supplier = m.supplier();
    let register = |region: &str, zone: &str| Command::Register {
        account: supplier,
        host: "new-host".into(),
        gpu_uuid: "GPU-new".into(),
        spec: h100_spec(),
        region: Some(region.into()),
        zone: zone.into(),
        fabric: None,
    };
    let mut ask = m.order(supplier, H100_SPOT, Side::Sell, USD_2, 1);
    ask.supply = Some(GpuSet { host: us_east, gpu_mask: 0b1 });
    let bid = m.order(renter, H100_SPOT, Side::Buy, USD_2, 1);
    let in_regions = |order: &NewOrder, regions: &[&str]| Command::Place {
        order: order.clone(),
        options: OrderOptions::default(),
        regions: regions.iter().map(|r| r.to_string()).collect(),
        cluster: None,
    };
    let cases = [
        ("a region the listing does not name", register("mars-north", ""), RejectCode::UnknownRegion),
        ("no region at all", register("", "zone-a"), RejectCode::UnknownRegion),
        ("a zone with a capital letter", register("us-east", "Zone-A"), RejectCode::NameInvalid),
        ("a bid for an unknown region", in_regions(&bid, &["us-east", "atlantis"]), RejectCode::UnknownRegion),
        (
            "a zone without a region",
            Command::Register {
                account: supplier,
                host: "new-host".into(),
                gpu_uuid: "GPU-new".into(),
                spec: h100_spec(),
                region: None,
                zone: "zone-a".into(),
                fabric: None,
            },
            RejectCode::UnknownRegion,
        ),
        (
            "an older journal's bid for no region (a current one means any)",
            Command::from(gpux_engine::stored::StoredCommand::PlaceOrderInRegions {
                order: bid.clone(),
                options: OrderOptions::default(),
                regions: Vec::new(),
            }),
            RejectCode::RegionFilterInvalid,
        ),
        (
            "a bid naming more regions than listed",
            in_regions(&bid, &["us-east", "us-west", "eu-central", "cn-east", "cn-west", "us-east"]),
            RejectCode::RegionFilterInvalid,
        ),
        ("an ask with a region filter", in_regions(&ask, &["us-east"]), RejectCode::RegionFilterInvalid),
    ];
    for (what, command, code) in cases {
        let before = m.engine.state_hash();
        let events = m.apply(command);
        assert_eq!(rejection(&events), Some(code), "{what}");
        assert_eq!(m.engine.state_hash(), before, "{what}: nothing changed");
    }
}

#[test]
fn regions_are_only_appended_to_the_listing() {
    let Fixture { mut m, renter, .. } = fixture();
    let mut moved = EngineConfig::demo();
    moved.regions.swap(0, 1);
    assert!(matches!(m.engine.check_listing_change(&moved), Err(ListingChangeError::RegionRemoved(r)) if r == "us-east"));
    let mut dropped = EngineConfig::demo();
    dropped.regions.pop();
    let events = m.apply(Command::ChangeListing { listing: Box::new(dropped) });
    assert_eq!(rejection(&events), Some(RejectCode::ListingIncompatible));

    let mut appended = EngineConfig::demo();
    appended.regions.push("ap-south".into());
    let events = m.apply(Command::ChangeListing { listing: Box::new(appended) });
    assert_eq!(rejection(&events), None);
    let supplier = m.supplier();
    let mumbai = regional_host(&mut m, supplier, "mumbai", 1, "ap-south", "");
    m.ask(supplier, mumbai, 0b1, H100_SPOT, 900_000);
    let events = regional_bid(&mut m, renter, USD_2, 1, &["ap-south"]);
    assert_eq!(lease_hosts(&events), [mumbai]);
}

#[test]
fn a_market_with_regions_replays_to_the_same_state() {
    let Fixture { mut m, renter, .. } = fixture();
    regional_bid(&mut m, renter, 3_000_000, 2, &["cn-east", "us-east"]);
    regional_bid(&mut m, renter, 3_000_000, 1, &["eu-central"]);
    m.advance(HOUR / 2);
    let mut replay = Engine::new(EngineConfig::demo()).expect("valid");
    for input in &m.inputs {
        replay.apply(input);
    }
    assert_eq!(replay.state_hash(), m.engine.state_hash());
    assert_eq!(replay.open_orders(renter)[0].regions, ["eu-central"]);
}
