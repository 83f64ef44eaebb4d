//! Billing end to end (issue 6's acceptance test): a renter buys a reserved
//! window, spot and preemptible capacity from a real supplier agent (fake
//! GPU backend) on the real exchange binary; usage reports flow, a forged and
//! a replayed one among them; the exchange is killed with SIGKILL and
//! restarted (its clock moved on to the window's start); the leases end and
//! their billing closes. The renter's and supplier's statements, balances
//! and the fees are then checked, to the minor unit, against figures the test
//! computes itself from the rulebook: the metering rule, the reserved
//! window's rest, the fee per lease and the SLA tiers.

mod common;

use std::collections::BTreeMap;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use common::*;
use gpux_engine::*;
use gpux_protocol::*;

const HOUR: u64 = 3_600_000;
const DEPOSIT: u64 = 1_000_000_000;
const SPOT_FLOOR: u64 = 2_100_000;
const WINDOW_FLOOR: u64 = 1_800_000;
const FEE_BPS: u128 = 250;

const HOST: &str = r#"{"gpus": [
    {"uuid": "GPU-a", "vendor": "nvidia", "model": "NVIDIA H100 80GB HBM3", "memory_mib": 81559, "interconnect": "nv_link"},
    {"uuid": "GPU-b", "vendor": "nvidia", "model": "NVIDIA H100 80GB HBM3", "memory_mib": 81559, "interconnect": "nv_link"},
    {"uuid": "GPU-c", "vendor": "nvidia", "model": "NVIDIA H100 80GB HBM3", "memory_mib": 81559, "interconnect": "nv_link"}],
  "utilisation_percent": 80, "faults": []}"#;

fn now_ms() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).expect("clock").as_millis() as u64
}

/// What the renter's private feed told about one lease.
#[derive(Debug, Default, Clone)]
struct Seen {
    kind: Option<LeaseKind>,
    price: u64,
    gpus: u64,
    start_ms: u64,
    end_ms: Option<u64>,
    ended: Option<(u64, LeaseEndReason)>,
    closed: Option<(u64, u64, u64)>,
    sla_credit: u64,
}

/// The renter's view: its leases, and how many of its bids traded.
#[derive(Debug, Default)]
struct Feed {
    leases: BTreeMap<LeaseId, Seen>,
    bought: u32,
}

fn observe(feed: &mut Feed, message: &ServerMessage) {
    let ServerMessage::Private { event, .. } = message else { return };
    let leases = &mut feed.leases;
    match event.kind {
        EventKind::OrderClosed { reason: OrderCloseReason::Filled, .. } => feed.bought += 1,
        EventKind::LeaseCreated { lease, kind, gpu_mask, price_minor_per_gpu_hour, start_ms, end_ms, .. } => {
            let seen = leases.entry(lease).or_default();
            seen.kind = Some(kind);
            seen.price = price_minor_per_gpu_hour;
            seen.gpus = gpu_mask.count_ones() as u64;
            seen.start_ms = start_ms;
            seen.end_ms = end_ms;
        }
        EventKind::LeaseEnded { lease, reason } => leases.entry(lease).or_default().ended = Some((event.at_ms, reason)),
        EventKind::LeaseBillingClosed { lease, leased_gpu_ms, verified_gpu_ms, usage_charged_minor, .. } => {
            leases.entry(lease).or_default().closed = Some((leased_gpu_ms, verified_gpu_ms, usage_charged_minor))
        }
        EventKind::SlaCredited { lease, amount_minor, .. } => leases.entry(lease).or_default().sla_credit = amount_minor,
        _ => {}
    }
}

/// Reads whatever arrives for `duration`, recording lease events.
async fn watch(client: &mut Client, leases: &mut Feed, duration: Duration) {
    let until = Instant::now() + duration;
    while Instant::now() < until {
        if let Ok(message) = tokio::time::timeout(Duration::from_millis(200), client.recv()).await {
            observe(leases, &message);
        }
    }
}

async fn request(client: &mut Client, leases: &mut Feed, message: ClientMessage) -> ServerMessage {
    let id = message.id();
    client.send(&message).await;
    loop {
        let reply = client.recv().await;
        observe(leases, &reply);
        let is_reply = match &reply {
            ServerMessage::Ack { id: i, .. }
            | ServerMessage::Reject { id: i, .. }
            | ServerMessage::Balance { id: i, .. }
            | ServerMessage::Statement { id: i, .. }
            | ServerMessage::Instruments { id: i, .. }
            | ServerMessage::Leases { id: i, .. }
            | ServerMessage::UsageAccepted { id: i, .. }
            | ServerMessage::UsageRejected { id: i, .. } => *i == id,
            ServerMessage::Error { id: i, .. } => *i == Some(id),
            _ => false,
        };
        if is_reply {
            return reply;
        }
    }
}

/// Every statement line of the client's account, all pages.
async fn statement(client: &mut Client, leases: &mut Feed) -> Vec<StatementLine> {
    let mut lines = Vec::new();
    let mut after = None;
    loop {
        let id = client.id();
        let ServerMessage::Statement { lines: page, next_after, .. } =
            request(client, leases, ClientMessage::Statement { id, after }).await
        else {
            panic!("a statement")
        };
        lines.extend(page);
        match next_after {
            Some(next) => after = Some(next),
            None => return lines,
        }
    }
}

async fn balance(client: &mut Client, leases: &mut Feed) -> (u64, u64, u64, u64) {
    let id = client.id();
    let ServerMessage::Balance { available_minor, held_minor, payable_minor, debt_minor, .. } =
        request(client, leases, ClientMessage::Balance { id }).await
    else {
        panic!("a balance")
    };
    (available_minor, held_minor, payable_minor, debt_minor)
}

/// Every lease of the client's account (the `leases` request, all pages).
async fn my_leases(client: &mut Client, feed: &mut Feed) -> Vec<gpux_protocol::views::Lease> {
    let mut all = Vec::new();
    let mut after = None;
    loop {
        let id = client.id();
        let ServerMessage::Leases { leases, next_after, .. } = request(client, feed, ClientMessage::Leases { id, after }).await else {
            panic!("leases")
        };
        all.extend(leases);
        match next_after {
            Some(next) => after = Some(next),
            None => return all,
        }
    }
}

/// The rulebook's SLA credit on a lease's usage for its availability.
fn sla_credit(usage_minor: u64, availability_bps: u128) -> u64 {
    let credit_bps: u128 = match availability_bps {
        a if a >= 9_900 => 0,
        a if a >= 9_500 => 1_000,
        a if a >= 9_000 => 2_500,
        _ => 5_000,
    };
    (usage_minor as u128 * credit_bps / 10_000) as u64
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn spot_reserved_and_preemptible_leases_are_billed_exactly_through_a_kill_and_restart() {
    let dir = tempfile::tempdir().expect("temp dir");
    let data = dir.path().join("exchange");
    let port = std::net::TcpListener::bind("127.0.0.1:0").expect("port").local_addr().expect("addr").port();
    let listen = format!("127.0.0.1:{port}");

    // Exchange time starts 74 minutes before an hour boundary: the window
    // starting then is the next one trading (the one before stopped a
    // minute ago), and a one-hour spot lease ends before it.
    let wall = now_ms();
    let window_start = (wall + 75 * 60_000).div_ceil(HOUR) * HOUR;
    let offset = (window_start - 74 * 60_000) as i64 - wall as i64;
    // Reports missing at the grace are waited for 5 s more (docs/market-rules.md "Late reports").
    let flags = |offset: i64| {
        vec![format!("--clock-offset-ms={offset}"), "--billing-grace-ms=3000".to_string(), "--late-report-window-ms=5000".to_string()]
    };
    let start = |offset: i64| {
        let flags = flags(offset);
        let flags: Vec<&str> = flags.iter().map(String::as_str).collect();
        Exchange::start_on(&data, Some(&key(1)), &listen, &flags)
    };
    let mut exchange = start(offset);

    // The supplier's agent: three GPUs offered on spot, preemptible and the next hourly window.
    let key_file = dir.path().join("host.key");
    let host_key = gpux_supplier_agent::keys::load_or_create(&key_file).expect("host key");
    let config = gpux_supplier_agent::config::AgentConfig::parse(&format!(
        "exchange = \"ws://{listen}\"\nhost = \"node-1\"\nkey_file = \"{}\"\nsample_interval_ms = 1000\nreport_interval_ms = 1000\n\n\
         [[offer]]\ncontract = \"spot\"\nprice_floor_minor_per_gpu_hour = {SPOT_FLOOR}\n\n\
         [[offer]]\ncontract = \"preemptible\"\nprice_floor_minor_per_gpu_hour = 900000\n\n\
         [[offer]]\ncontract = \"hourly_window\"\nprice_floor_minor_per_gpu_hour = {WINDOW_FLOOR}\nwindows_ahead = 1\n",
        key_file.display()
    ))
    .expect("agent config");
    let (stop_agent, agent_stopped) = tokio::sync::oneshot::channel::<()>();
    let agent_key = host_key.clone();
    // The agent runs as its binary does: its own thread and runtime.
    let agent = std::thread::spawn(move || {
        let backend = gpux_supplier_agent::fake::FakeBackend::new(serde_json::from_str(HOST).expect("host json")).expect("fake host");
        let agent = gpux_supplier_agent::session::Agent::new(config, agent_key, Box::new(backend)).expect("agent");
        let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
        runtime.block_on(agent.run(async {
            let _ = agent_stopped.await;
        }))
    });

    let mut leases = Feed::default();
    let (mut operator, _) = Client::login(&exchange.addr, &key(1), Role::Operator).await;
    let (mut renter, renter_account) = Client::login(&exchange.addr, &key(3), Role::Renter).await;
    let id = operator.id();
    assert!(matches!(
        request(&mut operator, &mut leases, ClientMessage::Deposit { id, account: renter_account, amount_minor: DEPOSIT }).await,
        ServerMessage::Ack { .. }
    ));

    // Wait for the agent's three kinds of offers, then buy one GPU of each.
    let id = renter.id();
    let ServerMessage::Instruments { instruments, .. } = request(&mut renter, &mut leases, ClientMessage::Instruments { id }).await else {
        panic!("instruments")
    };
    let window = instruments
        .iter()
        .find(|i| {
            i.class == "H100-SXM-80G"
                && i.contract == ContractKind::Reserved { window_start_ms: window_start, window_end_ms: window_start + HOUR }
        })
        .expect("the window is listed")
        .instrument;
    let (spot, preemptible) = (InstrumentId(0), InstrumentId(1));
    let deadline = Instant::now() + Duration::from_secs(25);
    for (n, (instrument, price, duration)) in [
        (window, WINDOW_FLOOR, LeaseDuration::Hours(1)),
        (spot, SPOT_FLOOR, LeaseDuration::Hours(1)),
        (preemptible, 900_000, LeaseDuration::UntilCancelled),
    ]
    .into_iter()
    .enumerate()
    {
        loop {
            let id = renter.id();
            let mut order = OrderTicket::limit(100 + id, instrument, Side::Buy, price, 1);
            order.time_in_force = TimeInForce::Ioc;
            order.duration = duration;
            let reply = request(&mut renter, &mut leases, ClientMessage::NewOrder { id, order, workload: None }).await;
            assert!(matches!(reply, ServerMessage::Ack { .. }), "{reply:?}");
            // An IOC that traded shows a trade on the private feed right after its ack.
            tokio::time::sleep(Duration::from_millis(300)).await;
            let (available, held, _, _) = balance(&mut renter, &mut leases).await;
            let _ = (available, held);
            if leases.bought > n as u32 {
                break;
            }
            assert!(Instant::now() < deadline, "the agent's offer {n} is in the book in time");
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    }
    watch(&mut renter, &mut leases, Duration::from_secs(4)).await;
    let running: Vec<LeaseId> = leases.leases.iter().filter(|(_, s)| s.kind.is_some()).map(|(l, _)| *l).collect();
    assert_eq!(running.len(), 2, "spot and preemptible leases run before the window: {leases:?}");
    assert_eq!(leases.bought, 3, "the window, spot and preemptible bids all traded");

    // A forged and a replayed report, sent by the supplier's account itself.
    let (mut supplier, _) = Client::login(&exchange.addr, &host_key, Role::Supplier).await;
    let spot_lease = *leases.leases.iter().find(|(_, s)| s.kind == Some(LeaseKind::Spot)).expect("spot lease").0;
    let gpus = {
        let id = supplier.id();
        supplier.send(&ClientMessage::MyGpus { id, offset: 0 }).await;
        supplier.recv_until(|m| matches!(m, ServerMessage::Gpus { id: i, .. } if *i == id).then(|| m.clone())).await
    };
    let ServerMessage::Gpus { gpus, .. } = gpus else { unreachable!() };
    let start_ms = leases.leases[&spot_lease].start_ms;
    let mut forged_and_replayed = Vec::new();
    for uuid in gpus.iter().map(|g| g.uuid.clone()) {
        let body = UsageBody {
            lease: spot_lease,
            gpu_uuid: uuid,
            seq: 1,
            start_ms,
            end_ms: start_ms + 900,
            available_ms: 900,
            utilisation_percent: 99,
            memory_used_mib_max: 1,
            unhealthy_samples: 0,
            prev_hash: genesis_hash(),
            readings: None,
        };
        let forged = UsageReport::sign(body.clone(), &key(77));
        let replayed = UsageReport::sign(body, &host_key);
        for report in [forged, replayed] {
            let id = supplier.id();
            forged_and_replayed.push(request(&mut supplier, &mut leases, ClientMessage::UsageReport { id, report }).await);
        }
    }
    let codes: Vec<UsageRejectCode> = forged_and_replayed
        .iter()
        .filter_map(|m| match m {
            ServerMessage::UsageRejected { code, .. } => Some(*code),
            _ => None,
        })
        .collect();
    assert!(codes.contains(&UsageRejectCode::Forged), "{forged_and_replayed:?}");
    assert!(codes.contains(&UsageRejectCode::Replayed), "a different report at an accepted position: {forged_and_replayed:?}");

    // SIGKILL, then a restart with the clock 5 s before the window's start.
    let renter_before = statement(&mut renter, &mut leases).await;
    let supplier_before = statement(&mut supplier, &mut leases).await;
    exchange.kill();
    drop((renter, supplier, operator));
    let wall = now_ms();
    exchange = start((window_start - 5_000) as i64 - wall as i64);
    let (mut renter, _) = Client::login(&exchange.addr, &key(3), Role::Renter).await;
    let (mut supplier, _) = Client::login(&exchange.addr, &host_key, Role::Supplier).await;
    let renter_after = statement(&mut renter, &mut leases).await;
    let supplier_after = statement(&mut supplier, &mut leases).await;
    assert_eq!(renter_after[..renter_before.len()], renter_before[..], "the renter's acknowledged transfers survive SIGKILL");
    assert_eq!(supplier_after[..supplier_before.len()], supplier_before[..], "the supplier's too");

    // The spot lease ended while the exchange was down (its hour passed);
    // the window is delivered at its start; reports flow; then the renter
    // ends every lease still running, the reserved one an hour early.
    watch(&mut renter, &mut leases, Duration::from_secs(12)).await;
    let running = my_leases(&mut renter, &mut leases).await;
    assert!(running.iter().any(|l| l.kind == LeaseKind::Reserved && l.active), "the window was delivered: {running:?}");
    for lease in running.iter().filter(|l| l.active) {
        let id = renter.id();
        let ended = request(&mut renter, &mut leases, ClientMessage::EndLease { id, lease: lease.lease }).await;
        assert!(matches!(ended, ServerMessage::Ack { .. }), "{ended:?}");
    }
    let deadline = Instant::now() + Duration::from_secs(20);
    let closed = loop {
        let all = my_leases(&mut renter, &mut leases).await;
        if all.iter().all(|l| l.billing_closed) {
            break all;
        }
        assert!(Instant::now() < deadline, "every lease's billing closes: {all:?}");
        watch(&mut renter, &mut leases, Duration::from_millis(500)).await;
    };
    assert_eq!(closed.len(), 3);
    // The spot lease's hour passed while the exchange was down, so no report
    // covered most of it: its bill was provisional at the grace (what the
    // missing time could cost kept) and final after the window, when what
    // was kept went back to the renter.
    let spot = closed.iter().find(|l| l.kind == LeaseKind::Spot).expect("the spot lease").lease;
    let kinds: Vec<String> =
        statement(&mut renter, &mut leases).await.into_iter().filter(|l| l.lease == Some(spot)).map(|l| l.kind).collect();
    assert!(kinds.iter().any(|k| k == "final_release"), "{kinds:?}");

    // The test's own figures, from the rulebook.
    let mut charged_total = 0u64;
    let mut fees_total = 0u64;
    let mut credits_total = 0u64;
    let renter_lines = statement(&mut renter, &mut leases).await;
    let supplier_lines = statement(&mut supplier, &mut leases).await;
    for lease in &closed {
        let id = lease.lease;
        let gpus = lease.gpus.len() as u64;
        let ended_at = lease.ended_at_ms.expect("ended");
        let leased_gpu_ms = gpus * ended_at.saturating_sub(lease.start_ms);
        assert!(lease.verified_gpu_ms > 0 && lease.verified_gpu_ms <= leased_gpu_ms, "lease {id}: {lease:?}");
        let usage = (lease.price_minor_per_gpu_hour as u128 * lease.verified_gpu_ms as u128 / HOUR as u128) as u64;
        assert_eq!(lease.usage_charged_minor, usage, "lease {id}: the metering rule");
        let rest = if lease.kind == LeaseKind::Reserved {
            let window_end = lease.end_ms.expect("a window has an end");
            assert!(ended_at < window_end, "the renter ended the window early");
            (lease.price_minor_per_gpu_hour as u128 * gpus as u128 * (window_end - ended_at) as u128 / HOUR as u128) as u64
        } else {
            0
        };
        let charged = usage + rest;
        let fee = (charged as u128 * FEE_BPS / 10_000) as u64;
        let credit = match lease.kind {
            LeaseKind::Preemptible => 0,
            _ => sla_credit(usage, lease.verified_gpu_ms as u128 * 10_000 / leased_gpu_ms as u128),
        };
        let of_lease = |lines: &[StatementLine], from: &dyn Fn(&str) -> bool, to: &dyn Fn(&str) -> bool| -> u64 {
            lines.iter().filter(|l| l.lease == Some(id) && from(&l.from) && to(&l.to)).map(|l| l.amount_minor).sum()
        };
        let renter_suffix = format!(":{renter_account}");
        let renter_paid = of_lease(&renter_lines, &|from| from.ends_with(&renter_suffix), &|to| to.starts_with("payable:"));
        assert_eq!(renter_paid, charged, "lease {id}: the renter's statement");
        let credited = of_lease(&renter_lines, &|from| from == "sla_pool", &|to| to.ends_with(&renter_suffix));
        assert_eq!(credited, credit, "lease {id}: the SLA credit");
        assert_eq!(of_lease(&supplier_lines, &|_| true, &|to| to == "fees"), fee, "lease {id}: the fee");
        eprintln!(
            "lease {id} {:?}: verified {} of {leased_gpu_ms} GPU-ms, usage {usage}, rest {rest}, fee {fee}, SLA credit {credit}",
            lease.kind, lease.verified_gpu_ms
        );
        charged_total += charged;
        fees_total += fee;
        credits_total += credit;
    }
    assert_eq!(balance(&mut renter, &mut leases).await, (DEPOSIT - charged_total + credits_total, 0, 0, 0), "the renter's balances");
    let (_, _, payable, debt) = balance(&mut supplier, &mut leases).await;
    assert_eq!((payable, debt), (charged_total - fees_total - credits_total, 0), "the supplier's balances");

    // A payout of everything earned leaves the exchange.
    let id = supplier.id();
    let paid = request(&mut supplier, &mut leases, ClientMessage::Payout { id, account: None, amount_minor: payable }).await;
    assert!(matches!(paid, ServerMessage::Ack { .. }), "{paid:?}");
    assert_eq!(balance(&mut supplier, &mut leases).await.2, 0);

    let _ = stop_agent.send(());
    agent.join().expect("agent thread").expect("the agent stops cleanly");
}
