//! Lease resale against the real binary (docs/market-rules.md "Lease
//! resale"): a renter offers the rest of its 4-hour lease; a buyer bids on
//! the class's resale book with a workload; the supplier's session is told
//! the reseller's lease ended `resold`, of the buyer's new lease on the same
//! GPUs at the lease's price, and is handed the buyer's workload for it.

mod common;

use common::*;
use gpux_engine::*;
use gpux_protocol::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_resold_lease_goes_on_for_the_buyer_with_the_buyers_workload() {
    let dir = tempfile::tempdir().expect("temp dir");
    let exchange = Exchange::start(dir.path(), Some(&key(1)));
    let (mut operator, _) = Client::login(&exchange.addr, &key(1), Role::Operator).await;
    let (mut reseller, reseller_account) = Client::login(&exchange.addr, &key(3), Role::Renter).await;
    let (mut buyer, buyer_account) = Client::login(&exchange.addr, &key(4), Role::Renter).await;
    let (mut supplier, _) = Client::login(&exchange.addr, &key(2), Role::Supplier).await;
    for account in [reseller_account, buyer_account] {
        let id = operator.id();
        assert!(matches!(
            operator.request(ClientMessage::Deposit { id, account, amount_minor: 100_000_000 }).await,
            ServerMessage::Ack { .. }
        ));
    }
    for gpu in ["GPU-r0", "GPU-r1"] {
        let id = supplier.id();
        let register = ClientMessage::RegisterGpu {
            id,
            host: "resale-host".into(),
            gpu_uuid: gpu.into(),
            spec: h100_spec(),
            region: None,
            zone: None,
            fabric: None,
        };
        assert!(matches!(supplier.request(register).await, ServerMessage::Ack { .. }));
    }
    let mut ask = ticket(1, Side::Sell, 2_000_000, 2);
    ask.supply = Some(GpuSet { host: HostId(0), gpu_mask: 0b11 });
    assert!(matches!(supplier.place(ask).await, ServerMessage::Ack { .. }));
    let mut bid = ticket(2, Side::Buy, 2_000_000, 2);
    bid.duration = LeaseDuration::Hours(4);
    assert!(matches!(reseller.place(bid).await, ServerMessage::Ack { .. }));
    let lease = reseller
        .recv_until(|m| match m {
            ServerMessage::Private { event: Event { kind: EventKind::LeaseCreated { lease, .. }, .. }, .. } => Some(*lease),
            _ => None,
        })
        .await;

    let id = reseller.id();
    let offer =
        ClientMessage::OfferLease { id, lease, price_minor_per_gpu_hour: 3_000_000, client_order_id: 7, time_in_force: TimeInForce::Gtc };
    let answer = reseller.request(offer).await;
    assert!(matches!(answer, ServerMessage::Ack { order: Some(_), .. }), "{answer:?}");
    let id = buyer.id();
    let ServerMessage::Instruments { instruments, .. } = buyer.request(ClientMessage::Instruments { id }).await else {
        panic!("instruments")
    };
    let book = instruments.iter().find(|i| i.symbol == "H100-SXM-80G/RESALE").expect("the resale book is listed");
    assert_eq!(book.contract, ContractKind::LeaseResale);

    let mut take = OrderTicket::limit(3, book.instrument, Side::Buy, 3_000_000, 2);
    take.duration = LeaseDuration::Hours(4);
    take.time_in_force = TimeInForce::Ioc;
    let workload = Workload::image("docker.io/library/busybox:1.36");
    let id = buyer.id();
    let answer = buyer.request(ClientMessage::NewOrder { id, order: take, workload: Some(Box::new(workload.clone())) }).await;
    assert!(matches!(answer, ServerMessage::Ack { .. }), "{answer:?}");

    // The supplier: the old lease resold, a new one for the buyer, and the buyer's workload for it.
    let mut resold = false;
    let mut new_lease = None;
    let mut handed = None;
    while !(resold && new_lease.is_some() && handed.is_some()) {
        match supplier.recv().await {
            ServerMessage::Private { event: Event { kind: EventKind::LeaseEnded { lease: ended, reason }, .. }, .. } if ended == lease => {
                assert_eq!(reason, LeaseEndReason::Resold);
                resold = true;
            }
            ServerMessage::Private {
                event: Event { kind: EventKind::LeaseCreated { lease: created, renter, price_minor_per_gpu_hour, gpu_mask, .. }, .. },
                ..
            } if created != lease => {
                assert_eq!((renter, price_minor_per_gpu_hour, gpu_mask), (buyer_account, 2_000_000, 0b11), "same GPUs, the lease's price");
                new_lease = Some(created);
            }
            ServerMessage::Workload { lease, workload: given } => handed = Some((lease, given)),
            _ => {}
        }
    }
    let (workload_lease, given) = handed.expect("a workload");
    assert_eq!(Some(workload_lease), new_lease, "the buyer's workload goes to the buyer's lease");
    assert_eq!(given.image, workload.image);
    // The reseller earned the difference for the time left (just under 4 hours on 2 GPUs at $1).
    let id = reseller.id();
    let ServerMessage::Balance { available_minor, .. } = reseller.request(ClientMessage::Balance { id }).await else { panic!("balance") };
    let gained = available_minor - (100_000_000 - 16_000_000);
    assert!((7_990_000..=8_000_000).contains(&gained), "{gained}");
}
