//! The exchange over real sockets: authentication, order entry acknowledged
//! after the journal, private feeds, the public book feed with sequence
//! numbers, every class of bad input, and state surviving a restart.

mod common;

use common::*;
use gpux_engine::*;
use gpux_protocol::*;
use tokio_tungstenite::tungstenite::Message;

const USD_2: u64 = 2_000_000;

/// An exchange with an operator, a supplier who offered one H100 on spot
/// at 2.00, and a funded renter.
struct Market {
    exchange: Exchange,
    _dir: tempfile::TempDir,
    operator: Client,
    supplier: Client,
    renter: Client,
    renter_account: AccountId,
}

async fn market() -> Market {
    let dir = tempfile::tempdir().expect("temp dir");
    let exchange = Exchange::start(dir.path(), Some(&key(1)));
    let (mut operator, _) = Client::login(&exchange.addr, &key(1), Role::Operator).await;
    let (mut supplier, _) = Client::login(&exchange.addr, &key(2), Role::Supplier).await;
    let (renter, renter_account) = Client::login(&exchange.addr, &key(3), Role::Renter).await;
    let id = operator.id();
    let deposit = operator.request(ClientMessage::Deposit { id, account: renter_account, amount_minor: 1_000_000_000 }).await;
    assert!(matches!(deposit, ServerMessage::Ack { .. }), "{deposit:?}");
    supplier.register_h100("node-1", "GPU-1").await;
    let mut ask = ticket(1, Side::Sell, USD_2, 1);
    ask.supply = Some(GpuSet { host: HostId(0), gpu_mask: 1 });
    assert!(matches!(supplier.place(ask).await, ServerMessage::Ack { order: Some(_), .. }));
    Market { exchange, _dir: dir, operator, supplier, renter, renter_account }
}

#[tokio::test]
async fn a_new_key_opens_an_account_only_with_a_role() {
    let dir = tempfile::tempdir().expect("temp dir");
    let exchange = Exchange::start(dir.path(), None);
    let mut client = Client::connect(&exchange.addr).await;
    let auth = client.auth_message(&key(9), None);
    client.send(&auth).await;
    assert!(matches!(client.recv().await, ServerMessage::Error { code: ErrorCode::AuthFailed, .. }));
    // A refusal burns the nonce and brings a new challenge.
    let ServerMessage::Challenge { nonce, .. } = client.recv().await else { panic!("a new challenge") };
    client.nonce = hex::decode(nonce).expect("hex").try_into().expect("32 bytes");
    let auth = client.auth_message(&key(9), Some(Role::Renter));
    client.send(&auth).await;
    assert!(matches!(client.recv_reply().await, ServerMessage::Authenticated { role: Role::Renter, .. }));
    let again = client.auth_message(&key(9), None);
    client.send(&again).await;
    assert!(matches!(client.recv_reply().await, ServerMessage::Error { code: ErrorCode::AlreadyAuthenticated, .. }));

    // The same key later logs in to the same account without a role.
    let (_, first) = Client::login(&exchange.addr, &key(10), Role::Supplier).await;
    let mut other = Client::connect(&exchange.addr).await;
    let auth = other.auth_message(&key(10), None);
    other.send(&auth).await;
    assert!(matches!(other.recv().await, ServerMessage::Authenticated { account, role: Role::Supplier, .. } if account == first));
}

#[tokio::test]
async fn a_signature_over_another_connections_challenge_is_refused() {
    let dir = tempfile::tempdir().expect("temp dir");
    let exchange = Exchange::start(dir.path(), None);
    let mut victim = Client::connect(&exchange.addr).await;
    let stolen = victim.auth_message(&key(4), Some(Role::Renter));
    let mut attacker = Client::connect(&exchange.addr).await;
    attacker.send(&stolen).await;
    assert!(matches!(attacker.recv().await, ServerMessage::Error { code: ErrorCode::AuthFailed, .. }));
    // Nor may anyone claim the operator role without a configured key.
    let claim = attacker.recv().await;
    let ServerMessage::Challenge { nonce, .. } = claim else { panic!("a new challenge") };
    attacker.nonce = hex::decode(nonce).expect("hex").try_into().expect("32 bytes");
    let operator_claim = attacker.auth_message(&key(5), Some(Role::Operator));
    attacker.send(&operator_claim).await;
    assert!(matches!(attacker.recv().await, ServerMessage::Error { code: ErrorCode::AuthFailed, .. }));
}

#[tokio::test]
async fn an_order_is_acknowledged_and_both_sides_see_the_fill_and_the_lease() {
    let mut m = market().await;
    let placed = m.renter.place(ticket(7, Side::Buy, USD_2, 1)).await;
    let ServerMessage::Ack { order: Some(order), journal_seq, .. } = placed else { panic!("ack: {placed:?}") };
    assert!(journal_seq > 0);
    let lease = m
        .renter
        .recv_until(|message| match message {
            ServerMessage::Private { event: Event { kind: EventKind::LeaseCreated { lease, renter, .. }, .. }, .. } => {
                Some((*lease, *renter))
            }
            _ => None,
        })
        .await;
    assert_eq!(lease.1, m.renter_account);
    let trade = m
        .supplier
        .recv_until(|message| match message {
            ServerMessage::Private { event: Event { kind: EventKind::Trade { buy_order, price_minor_per_gpu_hour, .. }, .. }, .. } => {
                Some((*buy_order, *price_minor_per_gpu_hour))
            }
            _ => None,
        })
        .await;
    assert_eq!(trade, (order, USD_2));
}

#[tokio::test]
async fn engine_refusals_come_back_as_rejects_with_their_code() {
    let mut m = market().await;
    let off_tick = m.renter.place(ticket(8, Side::Buy, 2_000_500, 1)).await;
    assert!(matches!(off_tick, ServerMessage::Reject { code: RejectCode::PriceOffTick, .. }), "{off_tick:?}");
    let id = m.renter.id();
    let not_yours = m.renter.request(ClientMessage::CancelOrder { id, order: OrderId(0) }).await;
    assert!(matches!(not_yours, ServerMessage::Reject { code: RejectCode::NotYourOrder, .. }), "{not_yours:?}");
    // The private feed's rejected events carry the same reason as the answers.
    let reason = m
        .renter
        .recv_until(|message| match message {
            ServerMessage::Private { event: Event { kind: EventKind::Rejected { code: RejectCode::PriceOffTick, .. }, .. }, reason } => {
                Some(reason.clone())
            }
            _ => None,
        })
        .await;
    assert_eq!(reason.as_deref(), Some(RejectCode::PriceOffTick.message()));
}

#[tokio::test]
async fn a_book_subscription_gets_a_snapshot_then_numbered_updates() {
    let mut m = market().await;
    let id = m.operator.id();
    m.operator.send(&ClientMessage::Subscribe { id, channel: Channel::Book, instrument: InstrumentId(0) }).await;
    assert!(matches!(m.operator.recv().await, ServerMessage::Subscribed { .. }));
    let ServerMessage::BookSnapshot { seq, asks, bids, .. } = m.operator.recv().await else { panic!("snapshot") };
    assert_eq!(asks, vec![(USD_2, 1)]);
    assert!(bids.is_empty());
    m.renter.place(ticket(9, Side::Buy, 1_500_000, 2)).await;
    let update = m.operator.recv().await;
    assert_eq!(
        update,
        ServerMessage::BookUpdate {
            instrument: InstrumentId(0),
            seq: seq + 1,
            side: Side::Buy,
            price_minor_per_gpu_hour: 1_500_000,
            quantity: 2
        }
    );
    let id = m.operator.id();
    m.operator.send(&ClientMessage::Subscribe { id, channel: Channel::Book, instrument: InstrumentId(999) }).await;
    assert!(matches!(m.operator.recv().await, ServerMessage::Error { code: ErrorCode::UnknownInstrument, .. }));
}

#[tokio::test]
async fn every_class_of_bad_frame_gets_its_code_and_the_connection_stays_usable() {
    let mut m = market().await;
    let cases: Vec<(Message, ErrorCode)> = vec![
        (Message::Text("{not json".into()), ErrorCode::MalformedJson),
        (Message::Text(r#"{"ping":{"id":"seven"}}"#.into()), ErrorCode::WrongType),
        (Message::Text(r#"{"launch_rocket":{"id":1}}"#.into()), ErrorCode::UnknownMessage),
        (Message::Binary(vec![0xde, 0xad, 0xbe, 0xef].into()), ErrorCode::MalformedBinary),
    ];
    for (frame, code) in cases {
        m.renter.send_raw(frame).await;
        let reply = m.renter.recv_reply().await;
        assert!(matches!(reply, ServerMessage::Error { code: c, .. } if c == code), "{code:?}: {reply:?}");
    }
    let id = m.renter.id();
    let forbidden = m.renter.request(ClientMessage::Deposit { id, account: m.renter_account, amount_minor: 5 }).await;
    assert!(matches!(forbidden, ServerMessage::Error { code: ErrorCode::Forbidden, .. }));
    let id = m.renter.id();
    m.renter.send(&ClientMessage::Ping { id }).await;
    assert!(matches!(m.renter.recv_reply().await, ServerMessage::Pong { .. }), "still usable");

    let mut anonymous = Client::connect(&m.exchange.addr).await;
    anonymous.send(&ClientMessage::NewOrder { id: 1, order: ticket(1, Side::Buy, USD_2, 1), workload: None }).await;
    assert!(matches!(anonymous.recv().await, ServerMessage::Error { code: ErrorCode::NotAuthenticated, .. }));
    anonymous.send(&ClientMessage::Instruments { id: 2 }).await;
    assert!(matches!(anonymous.recv().await, ServerMessage::Instruments { id: 2, .. }), "public market data needs no login");
}

#[tokio::test]
async fn binary_frames_work_like_text_frames() {
    let mut m = market().await;
    m.renter.binary = true;
    let placed = m.renter.place(ticket(11, Side::Buy, 1_000_000, 1)).await;
    assert!(matches!(placed, ServerMessage::Ack { order: Some(_), .. }), "{placed:?}");
}

#[tokio::test]
async fn an_oversize_frame_closes_the_connection_with_its_reason() {
    let mut m = market().await;
    m.renter.send_raw(Message::Text("x".repeat(FRAME_BYTES_MAX + 1).into())).await;
    assert_eq!(m.renter.closed_reason().await, "frame_too_large");
}

#[tokio::test]
async fn the_state_after_a_restart_equals_the_state_before() {
    let mut m = market().await;
    m.renter.place(ticket(12, Side::Buy, USD_2, 1)).await;
    m.renter.place(ticket(13, Side::Buy, 1_000_000, 2)).await;
    let before = m.exchange.terminate();
    let restarted = Exchange::start(m._dir.path(), Some(&key(1)));
    assert_eq!(restarted.recovered_hash, before);
    assert!(restarted.recovered_line.contains("plus 0 journal entries"), "a clean stop leaves a snapshot: {}", restarted.recovered_line);
    let (mut renter, account) = Client::login(&restarted.addr, &key(3), Role::Renter).await;
    assert_eq!(account, m.renter_account, "the key still maps to its account");
    let orders = renter.open_orders().await;
    assert_eq!(orders.iter().map(|o| o.client_order_id).collect::<Vec<_>>(), [13]);
}

#[tokio::test]
async fn a_connection_over_its_message_rate_is_told_so_and_stays_open() {
    let m = market().await;
    let mut renter = m.renter;
    // Twice the burst: even a slow sender (the bucket refills 5 000/s while
    // it sends) goes over the limit unless sending takes over 4 s.
    const PINGS: u64 = 30_000;
    for id in 0..PINGS {
        renter.send_nowait(&ClientMessage::Ping { id }).await;
    }
    renter.flush().await;
    let mut limited = 0;
    let mut pongs = 0;
    while limited + pongs < PINGS {
        match renter.recv_reply().await {
            ServerMessage::Error { code: ErrorCode::RateLimited, .. } => limited += 1,
            ServerMessage::Pong { .. } => pongs += 1,
            other => panic!("{other:?}"),
        }
    }
    assert!(limited > 0 && pongs >= 10_000, "{limited} limited, {pongs} answered");
}

/// A scripted session moves every metric an operator watches: orders,
/// refusals by code, trades and volume, leases opened and closed, usage
/// reports refused by code, refused logins by reason, delivery statuses,
/// connections by state and the book's depth.
#[tokio::test]
async fn the_operator_reads_prometheus_metrics_over_http() {
    let mut m = market().await;
    m.renter.place(ticket(21, Side::Buy, 1_500_000, 3)).await;
    m.renter.place(ticket(22, Side::Buy, 2_000_500, 1)).await;
    m.renter.place(ticket(23, Side::Buy, USD_2, 1)).await;
    let lease = m
        .supplier
        .recv_until(|msg| match msg {
            ServerMessage::Private { event: Event { kind: EventKind::LeaseCreated { lease, .. }, .. }, .. } => Some(*lease),
            _ => None,
        })
        .await;
    let id = m.supplier.id();
    let status = ClientMessage::DeliveryStatus { id, lease, state: DeliveryState::Starting };
    assert!(matches!(m.supplier.request(status).await, ServerMessage::Ack { .. }));
    let body = UsageBody {
        lease,
        gpu_uuid: "GPU-1".into(),
        seq: 1,
        start_ms: 1,
        end_ms: 2,
        available_ms: 1,
        utilisation_percent: 90,
        memory_used_mib_max: 1,
        unhealthy_samples: 0,
        prev_hash: genesis_hash(),
        readings: None,
    };
    let id = m.supplier.id();
    let forged = ClientMessage::UsageReport { id, report: UsageReport::sign(body, &key(9)) };
    assert!(matches!(m.supplier.request(forged).await, ServerMessage::UsageRejected { .. }));
    let id = m.renter.id();
    assert!(matches!(m.renter.request(ClientMessage::EndLease { id, lease }).await, ServerMessage::Ack { .. }));
    // A login with another key's signature, left open: refused, not logged in.
    let mut stranger = Client::connect(&m.exchange.addr).await;
    let mut auth = stranger.auth_message(&key(8), Some(Role::Renter));
    if let ClientMessage::Auth { public_key, .. } = &mut auth {
        *public_key = hex::encode(key(7).verifying_key().to_bytes());
    }
    stranger.send(&auth).await;
    assert!(matches!(stranger.recv_reply().await, ServerMessage::Error { code: ErrorCode::AuthFailed, .. }));

    let scrape = || async {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let mut stream = tokio::net::TcpStream::connect(&m.exchange.metrics_addr).await.expect("metrics port");
        stream.write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n").await.expect("request");
        let mut response = String::new();
        stream.read_to_string(&mut response).await.expect("response");
        response
    };
    let value = |body: &str, name: &str| -> f64 {
        body.lines()
            .find_map(|line| line.strip_prefix(name).and_then(|rest| rest.strip_prefix(' ')).and_then(|rest| rest.trim().parse().ok()))
            .unwrap_or_else(|| panic!("{name} in {body}"))
    };
    // The depth gauges are refreshed once a second.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    let body = loop {
        let body = scrape().await;
        if body.contains("gpux_book_quantity{instrument=\"H100-SXM-80G/SPOT\",side=\"bid\"} 3") {
            break body;
        }
        assert!(std::time::Instant::now() < deadline, "no book depth: {body}");
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    };
    assert!(body.starts_with("HTTP/1.1 200 OK"), "{body}");
    for (name, expected) in [
        ("gpux_orders_total", 4.0),
        ("gpux_rejects_total{code=\"price_off_tick\"}", 1.0),
        ("gpux_trades_total", 1.0),
        ("gpux_traded_gpus_total", 1.0),
        ("gpux_leases_opened_total{kind=\"spot\"}", 1.0),
        ("gpux_leases_closed_total{reason=\"ended_by_renter\"}", 1.0),
        ("gpux_usage_reports_refused_total{code=\"forged\"}", 1.0),
        ("gpux_auth_failures_total{reason=\"signature\"}", 1.0),
        ("gpux_errors_total{code=\"auth_failed\"}", 1.0),
        ("gpux_delivery_statuses_total{state=\"starting\"}", 1.0),
        ("gpux_connections", 4.0),
        ("gpux_connections_unauthenticated", 1.0),
    ] {
        assert_eq!(value(&body, name), expected, "{name}");
    }
    assert!(value(&body, "gpux_journal_commit_seconds_count") >= 1.0);
    assert!(body.contains("gpux_journal_commit_seconds_bucket{le=\"+Inf\"}"));
}

#[tokio::test]
async fn stats_show_the_last_24_hours_of_trades_and_a_resubscribe_resynchronises() {
    let mut m = market().await;
    let id = m.operator.id();
    m.operator.request_subscribe(id, Channel::Trades, InstrumentId(0)).await;
    m.renter.place(ticket(31, Side::Buy, USD_2, 1)).await;
    let trade = m.operator.recv_until(|msg| if let ServerMessage::Trade { seq, .. } = msg { Some(*seq) } else { None }).await;
    assert_eq!(trade, 1, "the first trade of the instrument");
    let id = m.operator.id();
    m.operator.send(&ClientMessage::Stats { id, instrument: InstrumentId(0) }).await;
    let stats = m.operator.recv_until(|msg| matches!(msg, ServerMessage::Stats { .. }).then(|| msg.clone())).await;
    let ServerMessage::Stats { open, high, low, last, volume, trades, .. } = stats else { unreachable!() };
    assert_eq!((open, high, low, last, volume, trades), (Some(USD_2), Some(USD_2), Some(USD_2), Some(USD_2), 1, 1));

    // A client that suspects a gap subscribes again and gets a fresh snapshot.
    let id = m.operator.id();
    m.operator.send(&ClientMessage::Subscribe { id, channel: Channel::Book, instrument: InstrumentId(0) }).await;
    let first = m.operator.recv_until(|msg| if let ServerMessage::BookSnapshot { seq, .. } = msg { Some(*seq) } else { None }).await;
    m.renter.place(ticket(32, Side::Buy, 1_000_000, 1)).await;
    let id = m.operator.id();
    m.operator.send(&ClientMessage::Subscribe { id, channel: Channel::Book, instrument: InstrumentId(0) }).await;
    let (second, bids) = m
        .operator
        .recv_until(|msg| if let ServerMessage::BookSnapshot { seq, bids, .. } = msg { Some((*seq, bids.clone())) } else { None })
        .await;
    assert!(second > first);
    assert_eq!(bids, vec![(1_000_000, 1)]);
}

/// Usage reports over the wire: an honest report is verified, journaled and
/// charged to the renter's escrow; a resent one is a harmless duplicate; a
/// forged or overlapping one is refused with its code; and a restart replays
/// the reports to the same state.
#[tokio::test]
async fn usage_reports_are_verified_charged_and_survive_a_restart() {
    let mut m = market().await;
    m.renter.place(ticket(41, Side::Buy, USD_2, 1)).await;
    let (lease, start_ms) = m
        .supplier
        .recv_until(|msg| match msg {
            ServerMessage::Private { event: Event { kind: EventKind::LeaseCreated { lease, start_ms, .. }, .. }, .. } => {
                Some((*lease, *start_ms))
            }
            _ => None,
        })
        .await;
    let body = |seq, start_ms, end_ms, prev_hash| UsageBody {
        lease,
        gpu_uuid: "GPU-1".into(),
        seq,
        start_ms,
        end_ms,
        available_ms: end_ms - start_ms,
        utilisation_percent: 90,
        memory_used_mib_max: 40_000,
        unhealthy_samples: 0,
        prev_hash,
        readings: None,
    };
    let first = UsageReport::sign(body(1, start_ms, start_ms + 1_800, genesis_hash()), &key(2));
    let id = m.supplier.id();
    let accepted = m.supplier.request(ClientMessage::UsageReport { id, report: first.clone() }).await;
    // 1.8 s at US$2.00 per GPU-hour is 1 000 minor units.
    assert!(matches!(accepted, ServerMessage::UsageAccepted { duplicate: false, charged_minor: 1_000, .. }), "{accepted:?}");
    let charged = m
        .renter
        .recv_until(|msg| match msg {
            ServerMessage::Private { event: Event { kind: EventKind::FundsCharged { amount_minor, .. }, .. }, .. } => Some(*amount_minor),
            _ => None,
        })
        .await;
    assert_eq!(charged, 1_000, "the renter sees the charge on its private feed");
    let credited = m
        .supplier
        .recv_until(|msg| match msg {
            ServerMessage::Private {
                event: Event { kind: EventKind::FundsCharged { amount_minor, to: None, reason, .. }, .. }, ..
            } => Some((*amount_minor, *reason)),
            _ => None,
        })
        .await;
    assert_eq!(credited, (1_000, HoldReason::Lease(lease)), "the supplier sees the money coming in on its feed");

    let id = m.supplier.id();
    let again = m.supplier.request(ClientMessage::UsageReport { id, report: first.clone() }).await;
    assert!(matches!(again, ServerMessage::UsageAccepted { duplicate: true, charged_minor: 0, .. }), "{again:?}");
    let forged = UsageReport::sign(body(2, start_ms + 1_800, start_ms + 2_000, first.hash()), &key(9));
    let id = m.supplier.id();
    let refused = m.supplier.request(ClientMessage::UsageReport { id, report: forged }).await;
    assert!(matches!(refused, ServerMessage::UsageRejected { code: UsageRejectCode::Forged, .. }), "{refused:?}");
    let overlapping = UsageReport::sign(body(2, start_ms + 1_000, start_ms + 2_000, first.hash()), &key(2));
    let id = m.supplier.id();
    let refused = m.supplier.request(ClientMessage::UsageReport { id, report: overlapping }).await;
    assert!(matches!(refused, ServerMessage::UsageRejected { code: UsageRejectCode::Overlapping, .. }), "{refused:?}");

    let before = m.exchange.terminate();
    std::fs::remove_file(m._dir.path().join("snapshots.redb")).expect("force a full journal replay");
    let restarted = Exchange::start(m._dir.path(), Some(&key(1)));
    assert_eq!(restarted.recovered_hash, before, "replaying the reports reaches the same state");
}

/// The ledger over the wire and on disk: after a usage charge, the renter's
/// statement shows the deposit, the escrow and the charge to the supplier,
/// the supplier's shows the charge credited and the exchange's 2.5% fee taken
/// from it, and the CSV the `statement` tool prints after a stop says the same.
#[tokio::test]
async fn statements_show_every_transfer_and_the_fee() {
    let mut m = market().await;
    m.renter.place(ticket(51, Side::Buy, USD_2, 1)).await;
    let (lease, start_ms) = m
        .supplier
        .recv_until(|msg| match msg {
            ServerMessage::Private { event: Event { kind: EventKind::LeaseCreated { lease, start_ms, .. }, .. }, .. } => {
                Some((*lease, *start_ms))
            }
            _ => None,
        })
        .await;
    let body = UsageBody {
        lease,
        gpu_uuid: "GPU-1".into(),
        seq: 1,
        start_ms,
        end_ms: start_ms + 1_800,
        available_ms: 1_800,
        utilisation_percent: 90,
        memory_used_mib_max: 1,
        unhealthy_samples: 0,
        prev_hash: genesis_hash(),
        readings: None,
    };
    let id = m.supplier.id();
    m.supplier.request(ClientMessage::UsageReport { id, report: UsageReport::sign(body, &key(2)) }).await;

    let lines = |client: &mut Client| {
        let id = client.id();
        (id, ClientMessage::Statement { id, after: None })
    };
    let (id, request) = lines(&mut m.supplier);
    m.supplier.send(&request).await;
    let supplier =
        m.supplier.recv_until(|msg| matches!(msg, ServerMessage::Statement { id: i, .. } if *i == id).then(|| msg.clone())).await;
    let ServerMessage::Statement { lines: supplier_lines, .. } = supplier else { unreachable!() };
    let owed: Vec<(String, String, u64)> = supplier_lines.iter().map(|l| (l.from.clone(), l.to.clone(), l.amount_minor)).collect();
    let renter = m.renter_account;
    assert!(owed.contains(&(format!("held:{renter}"), "payable:1".into(), 1_000)), "{owed:?}");
    assert!(owed.contains(&("payable:1".into(), "fees".into(), 25)), "{owed:?}");

    let (id, request) = lines(&mut m.renter);
    m.renter.send(&request).await;
    let statement = m.renter.recv_until(|msg| matches!(msg, ServerMessage::Statement { id: i, .. } if *i == id).then(|| msg.clone())).await;
    let ServerMessage::Statement { lines: renter_lines, .. } = statement else { unreachable!() };
    let moves: Vec<(String, String, u64)> = renter_lines.iter().map(|l| (l.from.clone(), l.to.clone(), l.amount_minor)).collect();
    for expected in [
        ("external".to_string(), format!("available:{renter}"), 1_000_000_000),
        (format!("available:{renter}"), format!("held:{renter}"), 2_000_000),
        (format!("held:{renter}"), "payable:1".to_string(), 1_000),
    ] {
        assert!(moves.contains(&expected), "{expected:?} in {moves:?}");
    }

    m.exchange.terminate();
    let output = std::process::Command::new(env!("CARGO_BIN_EXE_gpux-exchange"))
        .arg("--data-dir")
        .arg(m._dir.path())
        .arg("statement")
        .arg("--account")
        .arg(renter.to_string())
        .output()
        .expect("statement tool runs");
    let csv = String::from_utf8(output.stdout).expect("utf-8");
    assert!(csv.starts_with("transfer,at_ms,from,to,amount_minor,lease"), "{csv}");
    assert_eq!(csv.lines().count() - 1, renter_lines.len(), "the CSV lists the same transfers");
    assert!(csv.contains(&format!(",held:{renter},payable:1,1000,{lease}")), "{csv}");
    assert!(csv.lines().skip(1).all(|line| line.contains("Z,") && line.contains("T")), "each line's time also in ISO 8601: {csv}");
    assert!(csv.contains(&format!(",usage_charge,\"verified usage of lease {lease}\"")), "each line says what it was: {csv}");
}

/// An agent's asks must not outlive the agent: a session that logs in with
/// `cancel_on_disconnect` takes the account's open orders with it when it was
/// the account's last session (and not before); a session without it leaves
/// them resting.
#[tokio::test]
async fn cancel_on_disconnect_cancels_the_accounts_orders_when_its_last_session_ends() {
    let mut m = market().await;
    let login = |flag: bool| {
        let addr = m.exchange.addr.clone();
        async move {
            let mut client = Client::connect(&addr).await;
            let ClientMessage::Auth { id, public_key, signature, role, .. } = client.auth_message(&key(2), None) else { unreachable!() };
            client
                .send(&ClientMessage::Auth {
                    id,
                    public_key,
                    signature,
                    role,
                    cancel_on_disconnect: flag,
                    invite: None,
                    market_data_version: None,
                })
                .await;
            assert!(matches!(client.recv_reply().await, ServerMessage::Authenticated { .. }));
            client
        }
    };
    // The supplier's ask from `market()` rests; two more sessions of the same account log in.
    let careful = login(true).await;
    let plain = login(false).await;
    drop(plain);
    let mut watcher = Client::connect(&m.exchange.addr).await;
    let id = watcher.id();
    watcher.request_subscribe(id, Channel::Book, InstrumentId(0)).await;
    drop(careful);
    // The original session (no flag) is still open: nothing is cancelled yet.
    tokio::time::sleep(std::time::Duration::from_millis(300)).await;
    assert_eq!(m.supplier.open_orders().await.len(), 1, "another session of the account is still open");

    // Now the account's last session is one that asked for it.
    let last = login(true).await;
    drop(std::mem::replace(&mut m.supplier, last));
    tokio::time::sleep(std::time::Duration::from_millis(300)).await;
    assert_eq!(m.supplier.open_orders().await.len(), 1, "the flagged session is open");
    let Market { supplier, .. } = m;
    drop(supplier);
    let update = watcher.recv_until(|msg| match msg {
        ServerMessage::BookUpdate { side: Side::Sell, quantity: 0, .. } => Some(()),
        _ => None,
    });
    tokio::time::timeout(std::time::Duration::from_secs(5), update).await.expect("the ask left the book when the last session ended");
}

/// A supplier's hosts may run agents under one account (docs/agent.md
/// "Clusters"): when one host's session ends, the asks that session placed
/// leave the book and the other host's stay, since another session of the
/// account is still open.
#[tokio::test]
async fn a_session_that_ends_takes_its_own_asks_while_the_accounts_other_sessions_go_on() {
    let dir = tempfile::tempdir().expect("temp dir");
    let exchange = Exchange::start_with(dir.path(), Some(&key(1)), &[]);
    let mut hosts = Vec::new();
    for (index, price) in [(0u32, USD_2), (1, USD_2 + 10_000)] {
        let mut agent = Client::connect(&exchange.addr).await;
        let ClientMessage::Auth { id, public_key, signature, role, .. } = agent.auth_message(&key(2), Some(Role::Supplier)) else {
            unreachable!()
        };
        agent
            .send(&ClientMessage::Auth {
                id,
                public_key,
                signature,
                role,
                cancel_on_disconnect: true,
                invite: None,
                market_data_version: None,
            })
            .await;
        assert!(matches!(agent.recv_reply().await, ServerMessage::Authenticated { .. }));
        let id = agent.id();
        let registered = agent
            .request(ClientMessage::RegisterGpu {
                id,
                host: format!("node-{index}"),
                gpu_uuid: format!("GPU-{index}"),
                spec: h100_spec(),
                region: None,
                zone: None,
                fabric: None,
            })
            .await;
        assert!(matches!(registered, ServerMessage::Ack { .. }), "{registered:?}");
        let mut ask = ticket(10 + index as u64, Side::Sell, price, 1);
        ask.supply = Some(GpuSet { host: HostId(index), gpu_mask: 1 });
        assert!(matches!(agent.place(ask).await, ServerMessage::Ack { order: Some(_), .. }));
        hosts.push(agent);
    }
    let mut watcher = Client::connect(&exchange.addr).await;
    let id = watcher.id();
    watcher.request_subscribe(id, Channel::Book, InstrumentId(0)).await;
    drop(hosts.remove(0));
    let gone = watcher.recv_until(|message| match message {
        ServerMessage::BookUpdate { side: Side::Sell, price_minor_per_gpu_hour, quantity: 0, .. } => Some(*price_minor_per_gpu_hour),
        _ => None,
    });
    let price = tokio::time::timeout(std::time::Duration::from_secs(5), gone).await.expect("the ended session's ask left the book");
    assert_eq!(price, USD_2, "the first host's ask");
    let orders = hosts[0].open_orders().await;
    assert_eq!(orders.len(), 1, "the other host's ask rests: {orders:?}");
    assert_eq!(orders[0].supply, Some(GpuSet { host: HostId(1), gpu_mask: 1 }));
}

/// A peer that goes silent (a host that lost power leaves a half-open
/// socket) answers none of the gateway's pings: after the idle timeout its
/// connection is closed `idle_timeout`, its session ends, and with
/// `cancel_on_disconnect` its ask leaves the book. A peer that keeps reading
/// answers the pings on its own and stays.
#[tokio::test]
async fn a_silent_connection_is_closed_and_its_orders_cancelled() {
    let dir = tempfile::tempdir().expect("temp dir");
    let exchange = Exchange::start_with(dir.path(), Some(&key(1)), &["--idle-timeout-ms", "1500"]);
    let mut supplier = Client::connect(&exchange.addr).await;
    let ClientMessage::Auth { id, public_key, signature, role, .. } = supplier.auth_message(&key(2), Some(Role::Supplier)) else {
        unreachable!()
    };
    supplier
        .send(&ClientMessage::Auth { id, public_key, signature, role, cancel_on_disconnect: true, invite: None, market_data_version: None })
        .await;
    assert!(matches!(supplier.recv_reply().await, ServerMessage::Authenticated { .. }));
    supplier.register_h100("node-1", "GPU-1").await;
    let mut ask = ticket(1, Side::Sell, USD_2, 1);
    ask.supply = Some(GpuSet { host: HostId(0), gpu_mask: 1 });
    assert!(matches!(supplier.place(ask).await, ServerMessage::Ack { order: Some(_), .. }));

    let mut watcher = Client::connect(&exchange.addr).await;
    let id = watcher.id();
    watcher.request_subscribe(id, Channel::Book, InstrumentId(0)).await;
    // From here the supplier reads nothing, so it answers no ping.
    let gone = watcher.recv_until(|message| match message {
        ServerMessage::BookUpdate { side: Side::Sell, quantity: 0, .. } => Some(()),
        _ => None,
    });
    tokio::time::timeout(std::time::Duration::from_secs(10), gone).await.expect("the silent supplier's ask left the book");
    // The connection is closed (reading it now ends within 5 s). The close
    // frame says `idle_timeout`, but this client may see a reset first: on
    // reading it answers the queued pings on a socket the exchange closed.
    let reason = supplier.closed_reason().await;
    assert!(reason == "idle_timeout" || reason.is_empty(), "{reason}");
    let id = watcher.id();
    watcher.send(&ClientMessage::Ping { id }).await;
    assert!(matches!(watcher.recv_reply().await, ServerMessage::Pong { .. }), "the reading watcher is still connected");
}

/// A supplier with more GPUs than fit one frame lists them page by page:
/// each page fits a frame, and following `next_offset` yields every GPU once.
/// (On a listing that challenges no class: past 64, GPUs register only as
/// earlier ones pass their hardware challenges, docs/market-rules.md
/// "Shared limits".)
#[tokio::test]
async fn a_big_suppliers_gpus_come_in_pages_that_fit_a_frame() {
    let dir = tempfile::tempdir().expect("temp dir");
    let demo = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../listing/demo.toml")).expect("the demo listing");
    let unchallenged: String = demo
        .lines()
        .filter(|line| !line.starts_with("challenge =") && !line.starts_with("memory_challenge ="))
        .map(|line| format!("{line}\n"))
        .collect();
    let listing = dir.path().join("listing.toml");
    std::fs::write(&listing, unchallenged).expect("writes");
    let exchange = Exchange::start_with(&dir.path().join("data"), None, &["--listing", listing.to_str().expect("utf-8")]);
    let (mut supplier, _) = Client::login(&exchange.addr, &key(2), Role::Supplier).await;
    for n in 0..251u32 {
        let id = supplier.id();
        let host = format!("rack-{}", n / 50);
        let registered = supplier
            .request(ClientMessage::RegisterGpu {
                id,
                host,
                gpu_uuid: format!("GPU-page-{n:04}"),
                spec: h100_spec(),
                region: None,
                zone: None,
                fabric: None,
            })
            .await;
        assert!(matches!(registered, ServerMessage::Ack { .. }), "{registered:?}");
    }
    let (mut seen, mut offset, mut pages) = (Vec::new(), 0, 0);
    loop {
        let id = supplier.id();
        let ServerMessage::Gpus { gpus, next_offset, .. } = supplier.request(ClientMessage::MyGpus { id, offset }).await else {
            panic!("gpus");
        };
        let frame = encode_server_text(&ServerMessage::Gpus { id, gpus: gpus.clone(), next_offset });
        assert!(frame.len() <= FRAME_BYTES_MAX, "a page of {} bytes", frame.len());
        pages += 1;
        seen.extend(gpus.into_iter().map(|g| g.uuid));
        match next_offset {
            Some(next) => offset = next,
            None => break,
        }
    }
    assert!(pages >= 2, "251 GPUs take more than one page");
    let unique: std::collections::BTreeSet<_> = seen.iter().collect();
    assert_eq!((seen.len(), unique.len()), (251, 251), "every GPU once");
}
