//! A gateway in its own process (issue 19): `gpux-gateway` linked to a real
//! exchange's `--link-listen` serves clients of the same market as the
//! exchange's own listener. Orders, private events and the book feed cross
//! the link (the gateway skipping a first address that answers nothing);
//! a gateway without the exchange's link secret is refused; when
//! the exchange goes away the gateway closes its clients
//! `sequencer_unavailable`, and serves again once the exchange is back.

mod common;

use std::time::{Duration, Instant};

use common::*;
use gpux_engine::*;
use gpux_protocol::*;

const USD_2: u64 = 2_000_000;

/// Logs in on `addr`, retrying while the gateway's link is not up yet (a
/// try then ends in a closed connection, which panics the try's task).
async fn login_when_linked(addr: &str, key: &ed25519_dalek::SigningKey, role: Role) -> (Client, AccountId) {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let (addr, key) = (addr.to_string(), key.clone());
        let attempt = tokio::spawn(async move {
            let mut client = Client::connect(&addr).await;
            let auth = client.auth_message(&key, Some(role));
            client.send(&auth).await;
            match client.recv().await {
                ServerMessage::Authenticated { account, .. } => Some((client, account)),
                _ => None,
            }
        });
        if let Ok(Some(logged_in)) = attempt.await {
            return logged_in;
        }
        assert!(Instant::now() < deadline, "no login through the gateway within 20 s");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Connects and reads until the gateway closes the connection; its reason.
async fn close_reason_of_a_new_connection(addr: &str) -> String {
    use futures_util::StreamExt;
    use tokio_tungstenite::tungstenite::Message;
    let (mut socket, _) = tokio_tungstenite::connect_async(format!("ws://{addr}")).await.expect("websocket connects");
    loop {
        match tokio::time::timeout(Duration::from_secs(5), socket.next()).await.expect("closed within 5 s") {
            Some(Ok(Message::Close(Some(frame)))) => return frame.reason.to_string(),
            Some(Ok(Message::Close(None))) | None | Some(Err(_)) => return String::new(),
            Some(Ok(_)) => continue,
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gateway_in_its_own_process_serves_the_same_market() {
    let dir = tempfile::tempdir().expect("temp dir");
    let operator_key = key(1);
    let mut exchange = Exchange::start_with(dir.path(), Some(&operator_key), &["--link-listen", "127.0.0.1:0"]);
    assert!(!exchange.link_addr.is_empty(), "the exchange says where links go");
    let secret = dir.path().join("link.secret");
    // Its first address answers nothing: it links to the second.
    let dead = std::net::TcpListener::bind("127.0.0.1:0").expect("binds").local_addr().expect("addr").to_string();
    let gateway = Gateway::start(&[&dead, &exchange.link_addr], &secret);

    // The renter and a market-data reader on the remote gateway; the
    // operator and the supplier on the exchange's own listener.
    let (mut renter, renter_account) = login_when_linked(&gateway.addr, &key(3), Role::Renter).await;
    let (mut operator, _) = Client::login(&exchange.addr, &operator_key, Role::Operator).await;
    let (mut supplier, supplier_account) = Client::login(&exchange.addr, &key(2), Role::Supplier).await;
    let mut watcher = Client::connect(&gateway.addr).await;
    let id = watcher.id();
    watcher.send(&ClientMessage::Subscribe { id, channel: Channel::Book, instrument: InstrumentId(0) }).await;
    assert!(matches!(watcher.recv().await, ServerMessage::Subscribed { .. }));
    let ServerMessage::BookSnapshot { seq, asks, .. } = watcher.recv().await else { panic!("a snapshot through the link") };
    assert!(asks.is_empty());

    let id = operator.id();
    let deposit = operator.request(ClientMessage::Deposit { id, account: renter_account, amount_minor: 1_000_000_000 }).await;
    assert!(matches!(deposit, ServerMessage::Ack { .. }), "{deposit:?}");
    let id = supplier.id();
    let spec = h100_spec();
    let registered = supplier
        .request(ClientMessage::RegisterGpu {
            id,
            host: "node-1".into(),
            gpu_uuid: "GPU-1".into(),
            spec,
            region: None,
            zone: None,
            fabric: None,
        })
        .await;
    assert!(matches!(registered, ServerMessage::Ack { .. }), "{registered:?}");
    let mut ask = ticket(1, Side::Sell, USD_2, 1);
    ask.supply = Some(GpuSet { host: HostId(0), gpu_mask: 1 });
    assert!(matches!(supplier.place(ask).await, ServerMessage::Ack { order: Some(_), .. }));

    // The supplier's ask reaches the remote reader in order, once.
    let update = watcher.recv().await;
    assert_eq!(
        update,
        ServerMessage::BookUpdate {
            instrument: InstrumentId(0),
            seq: seq + 1,
            side: Side::Sell,
            price_minor_per_gpu_hour: USD_2,
            quantity: 1
        }
    );

    // The renter's bid through the remote gateway trades with it; its fill
    // comes back as a private event, and the book update reaches the reader.
    let placed = renter.place(ticket(7, Side::Buy, USD_2, 1)).await;
    assert!(matches!(placed, ServerMessage::Ack { order: Some(_), .. }), "{placed:?}");
    let fill = renter
        .recv_until(|m| match m {
            ServerMessage::Private { event, .. } => match &event.kind {
                EventKind::LeaseCreated { renter, supplier, .. } => Some((*renter, *supplier)),
                _ => None,
            },
            _ => None,
        })
        .await;
    assert_eq!(fill, (renter_account, supplier_account));
    let emptied = watcher
        .recv_until(|m| match m {
            ServerMessage::BookUpdate { seq: s, side: Side::Sell, quantity: 0, .. } => Some(*s),
            _ => None,
        })
        .await;
    assert_eq!(emptied, seq + 2, "no update lost or repeated across the link");
    let id = renter.id();
    let ServerMessage::Leases { leases, .. } = renter.request(ClientMessage::Leases { id, after: None }).await else { panic!("leases") };
    assert_eq!(leases.len(), 1);

    // A gateway that does not hold the exchange's secret gets no link: its
    // clients are closed sequencer_unavailable.
    let wrong = dir.path().join("wrong.secret");
    write_secret(&wrong, "not the secret");
    let impostor = Gateway::start(&[&exchange.link_addr], &wrong);
    assert_eq!(close_reason_of_a_new_connection(&impostor.addr).await, "sequencer_unavailable");
    // Its clients may be told before the exchange has counted the refusal.
    let metrics = await_metric_at_least(&exchange.metrics_addr, "gpux_links_ended_total{cause=\"token\"}", 1.0).await;
    assert_eq!(metric(&metrics, "gpux_links"), 1.0, "the real gateway's link is open: {metrics}");

    // The exchange goes away: the gateway's clients are closed with the reason.
    exchange.kill();
    assert_eq!(renter.closed_reason().await, "sequencer_unavailable");
    assert_eq!(watcher.closed_reason().await, "sequencer_unavailable");

    // Back on the same link address: the gateway links again, and the
    // renter finds its lease through it.
    let exchange = Exchange::start_with(dir.path(), Some(&operator_key), &["--link-listen", &exchange.link_addr]);
    let (mut renter, again) = login_when_linked(&gateway.addr, &key(3), Role::Renter).await;
    assert_eq!(again, renter_account);
    let id = renter.id();
    let ServerMessage::Leases { leases, .. } = renter.request(ClientMessage::Leases { id, after: None }).await else { panic!("leases") };
    assert_eq!(leases.len(), 1, "the same market through the same gateway after the exchange's restart");
    drop(exchange);
}

/// The link port under a flood of connections that never handshake (more
/// than `LINKS_MAX`): they fill only the handshakes' pool, the oldest of
/// which each newcomer displaces, so a real gateway links at once, not
/// after the silent ones time out (5 s); the refusals are not logged one by
/// one (`gpux_links_ended_total` counts them).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn silent_connections_to_the_link_port_never_keep_a_gateway_out() {
    let dir = tempfile::tempdir().expect("temp dir");
    let exchange = Exchange::start_with(dir.path(), Some(&key(1)), &["--link-listen", "127.0.0.1:0"]);
    let silent: Vec<tokio::net::TcpStream> = {
        let mut streams = Vec::new();
        for _ in 0..gpux_exchange::link_server::LINKS_MAX + 16 {
            streams.push(tokio::net::TcpStream::connect(&exchange.link_addr).await.expect("connects"));
        }
        streams
    };
    tokio::time::sleep(Duration::from_millis(300)).await;
    let started = Instant::now();
    let gateway = Gateway::start(&[&exchange.link_addr], &dir.path().join("link.secret"));
    let (_renter, _) = login_when_linked(&gateway.addr, &key(3), Role::Renter).await;
    assert!(
        started.elapsed() < Duration::from_secs(4),
        "linked {:?} after the flood (the silent connections hold their handshakes for 5 s)",
        started.elapsed()
    );
    drop(silent);
}

/// docs/operations.md "Ports and secrets": with `--link-tls-cert` the link
/// port speaks TLS only; a gateway given the certificate to trust links
/// and serves, one without TLS never links.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_link_over_tls_serves_and_a_plain_gateway_is_refused() {
    let dir = tempfile::tempdir().expect("temp dir");
    let identity = rcgen::generate_simple_self_signed(vec!["127.0.0.1".to_string(), "localhost".to_string()]).expect("certificate");
    let (cert, key_file) = (dir.path().join("link.pem"), dir.path().join("link.key"));
    std::fs::write(&cert, identity.cert.pem()).expect("write cert");
    write_secret(&key_file, identity.signing_key.serialize_pem());
    let data = dir.path().join("data");
    let exchange = Exchange::start_with(
        &data,
        Some(&key(1)),
        &[
            "--link-listen",
            "127.0.0.1:0",
            "--link-tls-cert",
            cert.to_str().expect("utf-8"),
            "--link-tls-key",
            key_file.to_str().expect("utf-8"),
        ],
    );
    let secret = data.join("link.secret");
    let secured = Gateway::start_with(&[&exchange.link_addr], &secret, &["--link-tls-ca", cert.to_str().expect("utf-8")]);
    let (mut renter, _) = login_when_linked(&secured.addr, &key(3), Role::Renter).await;
    assert!(matches!(renter.request(ClientMessage::Ping { id: 2 }).await, ServerMessage::Pong { .. }));

    // Without TLS (the same secret): no link, so its clients are told.
    let plain = Gateway::start(&[&exchange.link_addr], &secret);
    tokio::time::sleep(Duration::from_millis(1_500)).await;
    assert_eq!(close_reason_of_a_new_connection(&plain.addr).await, "sequencer_unavailable");
}
