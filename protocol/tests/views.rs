//! The wire's views of the engine's records (`gpux_protocol::views`) encode
//! exactly as the engine's types did when they were on the wire: the same
//! JSON (clients read fields by name) and the same bincode bytes (binary
//! clients read them by position). Taken from a live engine's own answers,
//! so a field the engine adds shows here as the question "does the wire
//! show it?", never as a silent change of the wire.

use gpux_engine::*;
use gpux_protocol::{encode_record, views};
use serde::Serialize;

/// One engine record and its view encode alike, in both encodings.
fn same_encoding<E: Serialize + std::fmt::Debug, V: Serialize>(engine: &E, view: &V) {
    assert_eq!(serde_json::to_value(engine).expect("json"), serde_json::to_value(view).expect("json"), "{engine:?}");
    assert_eq!(encode_record(engine), encode_record(view), "{engine:?}");
}

const T0: u64 = 1_796_223_660_000;

/// A small market with every record's optional parts set: a host on a
/// fabric in a region, a verified GPU, a lease, a resting bid in regions,
/// an ask, a sub-account with limits and spend limits.
fn market() -> (Engine, AccountId, AccountId, AccountId) {
    let mut engine = Engine::new(EngineConfig::demo()).expect("demo");
    let at = |engine: &mut Engine, command: Command| engine.apply(&Input { at_ms: T0, command }).to_vec();
    let account = |events: Vec<Event>| {
        events
            .iter()
            .find_map(|e| match e.kind {
                EventKind::AccountOpened { account, .. } => Some(account),
                _ => None,
            })
            .expect("opened")
    };
    let supplier = account(at(&mut engine, Command::OpenAccount { role: Role::Supplier }));
    let renter = account(at(&mut engine, Command::OpenAccount { role: Role::Renter }));
    at(&mut engine, Command::Deposit { account: renter, amount_minor: 1_000_000_000 });
    let spec = GpuSpec {
        vendor: Vendor::Nvidia,
        model: "NVIDIA H100 80GB HBM3".into(),
        memory_mib: 81_559,
        interconnect: Interconnect::NvLink,
        mig_profile: None,
    };
    for index in 0..2 {
        let fabric = FabricClaim { group: "ib0".into(), gbps: 400, address: "10.0.0.1".into(), port_base: 40_000 };
        at(
            &mut engine,
            Command::Register {
                account: supplier,
                host: "dc1-node-01".into(),
                gpu_uuid: format!("GPU-{index}"),
                spec: spec.clone(),
                region: Some("us-east".into()),
                zone: "use1-az2".into(),
                fabric: Some(Box::new(fabric)),
            },
        );
    }
    let mut ask = NewOrder::limit(supplier, 1, InstrumentId(0), Side::Sell, 2_000_000, 1);
    ask.supply = Some(GpuSet { host: HostId(0), gpu_mask: 0b1 });
    at(&mut engine, Command::place(ask));
    let bid = NewOrder::limit(renter, 2, InstrumentId(0), Side::Buy, 2_000_000, 1);
    at(&mut engine, Command::place(bid));
    let mut second = NewOrder::limit(supplier, 3, InstrumentId(0), Side::Sell, 2_500_000, 1);
    second.supply = Some(GpuSet { host: HostId(0), gpu_mask: 0b10 });
    at(&mut engine, Command::place(second));
    let resting = NewOrder::limit(renter, 4, InstrumentId(0), Side::Buy, 1_000_000, 1);
    let regions = vec!["us-east".to_string()];
    at(&mut engine, Command::Place { order: resting, options: OrderOptions::default(), regions, cluster: None });
    let parent = account(at(&mut engine, Command::OpenAccount { role: Role::Renter }));
    at(&mut engine, Command::Deposit { account: parent, amount_minor: 50_000_000 });
    let sub = account(at(&mut engine, Command::OpenSubAccount { parent }));
    let limits = AccountLimits { max_open_orders: Some(3), max_order_minor: None, max_held_minor: Some(9) };
    at(&mut engine, Command::SetAccountLimits { parent, sub_account: sub, limits });
    let spend = SpendLimits { daily_minor: Some(5), total_minor: None, max_held_minor: Some(7) };
    at(&mut engine, Command::SetSpendLimits { account: renter, limits: spend });
    (engine, supplier, renter, parent)
}

#[test]
fn every_view_encodes_as_the_engines_record_did() {
    let (engine, supplier, renter, parent) = market();
    let instruments = engine.instruments();
    assert!(instruments.len() > 10);
    for info in &instruments {
        same_encoding(info, &views::Instrument::from(info));
    }
    let (orders, _) = engine.open_orders_after(renter, None, 100);
    assert!(orders.iter().any(|o| !o.regions.is_empty()), "{orders:?}");
    let (asks, _) = engine.open_orders_after(supplier, None, 100);
    assert!(asks.iter().any(|o| o.supply.is_some()), "{asks:?}");
    for info in orders.iter().chain(&asks) {
        same_encoding(info, &views::Order::from(info));
    }
    let (leases, _) = engine.leases_of(renter, None, 100);
    assert!(!leases.is_empty());
    for info in &leases {
        same_encoding(info, &views::Lease::from(info));
    }
    let (offers, _) = engine.offers_after(InstrumentId(0), None, 100);
    assert!(offers.iter().any(|(_, o)| o.fabric.is_some() && o.region.is_some()), "{offers:?}");
    for (cursor, info) in &offers {
        same_encoding(info, &views::Offer::from(info));
        same_encoding(cursor, &views::OfferCursor::from(*cursor));
        assert_eq!(gpux_engine::OfferCursor::from(views::OfferCursor::from(*cursor)), *cursor);
    }
    let gpus = engine.gpus_of(supplier);
    assert!(gpus.iter().all(|g| g.fabric.is_some() && g.region.is_some()), "{gpus:?}");
    for info in &gpus {
        same_encoding(info, &views::Gpu::from(info));
    }
    let subs = engine.sub_accounts_of(parent, 0, 100);
    assert!(subs.iter().any(|s| s.limits.max_open_orders.is_some()), "{subs:?}");
    for info in &subs {
        same_encoding(info, &views::SubAccount::from(info));
    }
    let spend = engine.spend_status(renter).expect("limits set");
    same_encoding(&spend, &views::Spend::from(&spend));
}

#[test]
fn the_optional_parts_a_view_has_encode_alike_when_set() {
    // The challenge results and a fabric's probe, which the small market
    // above does not reach (they follow a challenge and a cluster lease).
    let mut gpu = market().0.gpus_of(AccountId(0)).remove(0);
    gpu.verified = true;
    gpu.challenge = Some(GpuVerification { at_ms: 1, outcome: ChallengeOutcome::Passed, mflops: 1_342, rejected: false });
    gpu.memory = Some(MemoryVerification { at_ms: 2, outcome: ChallengeOutcome::TooSlow, mbps: 9 });
    if let Some(fabric) = gpu.fabric.as_mut() {
        fabric.probe = Some(FabricProbe { at_ms: 3, lease: LeaseId(17), ranks: 4, mbps: 40_265, borne_out: true });
    }
    same_encoding(&gpu, &views::Gpu::from(&gpu));
}

#[test]
fn the_listing_encodes_as_the_engines_configuration_did() {
    // The demo listing, and one with every optional part a class has set
    // (a calendar with weekly and monthly windows, both challenges,
    // regions) and every optional part unset.
    let demo = EngineConfig::demo();
    assert!(demo.classes.iter().any(|c| c.calendar.is_some() && c.challenge.is_some() && c.memory_challenge.is_some()));
    same_encoding(&demo, &views::Listing::from(&demo));
    let mut full = demo.clone();
    full.regions = vec!["us-east".into(), "cn-east".into()];
    if let Some(calendar) = full.classes[0].calendar.as_mut() {
        calendar.weekly_windows_ahead = 2;
        calendar.monthly_windows_ahead = 1;
    }
    full.classes[1].calendar = None;
    full.classes[1].challenge = None;
    full.classes[1].memory_challenge = None;
    same_encoding(&full, &views::Listing::from(&full));
    // And a client reads the listing back as the exchange sent it.
    let json = serde_json::to_string(&views::Listing::from(&full)).expect("json");
    let back: views::Listing = serde_json::from_str(&json).expect("reads");
    assert_eq!(back, views::Listing::from(&full));
}
