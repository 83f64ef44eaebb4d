//! Regions over the wire, against the real binary (docs/market-rules.md
//! "Regions", docs/protocol.md "Listing"): the listing names the regions;
//! hosts register in one (with a zone); the book's offers and the supplier's
//! GPUs show it; a region-restricted bid trades only there, its open order
//! says so, and the mistakes come back with their codes. The journal then
//! replays to the same market after a restart.

mod common;

use common::*;
use gpux_engine::*;
use gpux_protocol::*;

async fn register(supplier: &mut Client, host: &str, gpu: &str, region: Option<&str>, zone: Option<&str>) -> ServerMessage {
    let id = supplier.id();
    let message = ClientMessage::RegisterGpu {
        id,
        host: host.into(),
        gpu_uuid: gpu.into(),
        spec: h100_spec(),
        region: region.map(str::to_string),
        zone: zone.map(str::to_string),
        fabric: None,
    };
    supplier.request(message).await
}

fn reject_code(answer: &ServerMessage) -> Option<RejectCode> {
    match answer {
        ServerMessage::Reject { code, .. } => Some(*code),
        _ => None,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_region_restricted_bid_trades_only_with_hosts_in_its_regions_over_the_wire() {
    let dir = tempfile::tempdir().expect("temp dir");
    let mut exchange = Exchange::start(dir.path(), Some(&key(1)));
    let (mut operator, _) = Client::login(&exchange.addr, &key(1), Role::Operator).await;
    let (mut renter, renter_account) = Client::login(&exchange.addr, &key(3), Role::Renter).await;
    let (mut supplier, _) = Client::login(&exchange.addr, &key(2), Role::Supplier).await;
    let id = operator.id();
    let deposit = operator.request(ClientMessage::Deposit { id, account: renter_account, amount_minor: 100_000_000 }).await;
    assert!(matches!(deposit, ServerMessage::Ack { .. }), "{deposit:?}");

    // The listing is public: a connection that has not logged in reads it.
    let mut stranger = Client::connect(&exchange.addr).await;
    let ServerMessage::Listing { listing, .. } = stranger.request(ClientMessage::Listing { id: 1 }).await else { panic!("listing") };
    assert_eq!(listing.regions, ["us-east", "us-west", "eu-central", "cn-east", "cn-west"]);
    assert_eq!((listing.currency.code.as_str(), listing.currency.decimals), ("USD", 6));

    // A cheap host in us-east, a dearer one in cn-east.
    for (host, gpu, region, zone) in [("virginia", "GPU-va", "us-east", "use1-az2"), ("shanghai", "GPU-sh", "cn-east", "sh-2")] {
        let answer = register(&mut supplier, host, gpu, Some(region), Some(zone)).await;
        assert!(matches!(answer, ServerMessage::Ack { .. }), "{answer:?}");
    }
    let id = supplier.id();
    let ServerMessage::Gpus { gpus, .. } = supplier.request(ClientMessage::MyGpus { id, offset: 0 }).await else { panic!("gpus") };
    let shown: Vec<(Option<&str>, &str)> = gpus.iter().map(|g| (g.region.as_deref(), g.zone.as_str())).collect();
    assert_eq!(shown, [(Some("us-east"), "use1-az2"), (Some("cn-east"), "sh-2")]);
    for (n, gpu) in gpus.iter().enumerate() {
        let mut ask = ticket(n as u64 + 1, Side::Sell, [1_500_000, 2_500_000][n], 1);
        ask.supply = Some(GpuSet { host: gpu.host, gpu_mask: 1 << gpu.index_on_host });
        assert!(matches!(supplier.place(ask).await, ServerMessage::Ack { order: Some(_), .. }));
    }
    let ServerMessage::BookOffers { offers, .. } =
        stranger.request(ClientMessage::BookOffers { id: 2, instrument: InstrumentId(0), offset: 0, after: None }).await
    else {
        panic!("offers")
    };
    let regions: Vec<Option<&str>> = offers.iter().map(|o| o.region.as_deref()).collect();
    assert_eq!(regions, [Some("us-east"), Some("cn-east")], "best first, each with its host's region");

    // The mistakes, each with its code.
    let answer = register(&mut supplier, "shanghai", "GPU-sh-2", Some("us-west"), None).await;
    assert_eq!(reject_code(&answer), Some(RejectCode::RegionMismatch), "{answer:?}");
    let answer = register(&mut supplier, "moon-base", "GPU-moon", Some("moon"), None).await;
    assert_eq!(reject_code(&answer), Some(RejectCode::UnknownRegion), "{answer:?}");
    let mut bad = ticket(9, Side::Buy, 3_000_000, 1);
    bad.regions = vec!["atlantis".into()];
    assert_eq!(reject_code(&renter.place(bad).await), Some(RejectCode::UnknownRegion));

    // The bid for cn-east passes the cheaper us-east GPU by.
    let mut bid = ticket(10, Side::Buy, 3_000_000, 2);
    bid.regions = vec!["cn-east".into()];
    let ServerMessage::Ack { order: Some(bid_order), .. } = renter.place(bid).await else { panic!("bid refused") };
    let (price, host) = renter
        .recv_until(|m| match m {
            ServerMessage::Private {
                event: Event { kind: EventKind::LeaseCreated { price_minor_per_gpu_hour, host, .. }, .. }, ..
            } => Some((*price_minor_per_gpu_hour, *host)),
            _ => None,
        })
        .await;
    assert_eq!((price, host), (2_500_000, gpus[1].host), "the cn-east GPU, at its ask");
    let open = renter.open_orders().await;
    assert_eq!(open.len(), 1, "one GPU left to buy: {open:?}");
    assert_eq!((open[0].order, open[0].quantity, open[0].regions.clone()), (bid_order, 1, vec!["cn-east".to_string()]));

    // A restart replays the journal to the same market: the host keeps its
    // region, the bid its regions.
    drop((operator, renter, supplier, stranger));
    exchange.terminate();
    let exchange = Exchange::start(dir.path(), Some(&key(1)));
    let (mut renter, _) = Client::login(&exchange.addr, &key(3), Role::Renter).await;
    assert_eq!(renter.open_orders().await[0].regions, ["cn-east"]);
    let (mut supplier, _) = Client::login(&exchange.addr, &key(2), Role::Supplier).await;
    let answer = register(&mut supplier, "shanghai", "GPU-sh-3", Some("us-west"), None).await;
    assert_eq!(reject_code(&answer), Some(RejectCode::RegionMismatch), "{answer:?}");
}
