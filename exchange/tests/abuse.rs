//! Hostile clients against the real binary (docs/protocol.md "Limits and
//! abuse"): sockets that never finish a handshake, never log in, or come in
//! hundreds from one address. The exchange must reap them within their
//! deadlines, refuse what is over a cap at once, keep serving logins and
//! /metrics, and stay cheap in CPU and in log lines while it does.

mod common;

use std::io::Read;
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::*;
use gpux_engine::{InstrumentId, Role};
use gpux_protocol::*;
use tokio_tungstenite::MaybeTlsStream;

/// A connection's fate as its client sees it: closed by the exchange or not.
fn closed_by_peer(mut stream: &std::net::TcpStream, within: Duration) -> bool {
    stream.set_read_timeout(Some(within)).expect("timeout");
    let mut buffer = [0u8; 256];
    loop {
        match stream.read(&mut buffer) {
            Ok(0) => return true,
            Ok(_) => continue, // a challenge or close frame: read on to the end
            Err(error) if error.kind() == std::io::ErrorKind::ConnectionReset => return true,
            Err(_) => return false,
        }
    }
}

/// A plain TCP connection from a given loopback address (Linux routes all
/// of 127.0.0.0/8 to lo), as a blocking std stream.
async fn connect_from(source: &str, to: &str) -> std::net::TcpStream {
    let socket = tokio::net::TcpSocket::new_v4().expect("socket");
    socket.bind(format!("{source}:0").parse().expect("an address")).expect("bind a loopback address");
    let stream = socket.connect(to.parse().expect("an address")).await.expect("the kernel accepts");
    let stream = stream.into_std().expect("std stream");
    stream.set_nonblocking(false).expect("blocking");
    stream
}

/// CPU time (user + system) of a process so far.
fn cpu_time(pid: u32) -> Duration {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).expect("stat");
    let fields: Vec<&str> = stat.rsplit(')').next().expect("fields").split_whitespace().collect();
    // Fields after the command name: utime and stime are the 12th and 13th (clock ticks, 100 Hz).
    let ticks: u64 = fields[11].parse::<u64>().expect("utime") + fields[12].parse::<u64>().expect("stime");
    Duration::from_millis(ticks * 10)
}

/// 400 sockets that never speak, against a process allowed 256 descriptors:
/// those over the cap are closed at once, the rest reaped at the handshake
/// deadline; a login then succeeds, /metrics answers, and the attack cost
/// little CPU and fewer than a hundred log lines.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn silent_sockets_are_reaped_and_logins_go_on_at_the_descriptor_limit() {
    let dir = tempfile::tempdir().expect("temp dir");
    let log = dir.path().join("exchange.log");
    let exchange = Exchange::start_limited(
        &dir.path().join("data"),
        256,
        &log,
        "info",
        &["--handshake-timeout-ms", "1000", "--connections-per-ip-max", "100000", "--unauthenticated-max", "100000"],
    );
    let cpu_before = cpu_time(exchange.child.id());
    let started = Instant::now();

    let attackers: Vec<std::net::TcpStream> =
        (0..400).map(|_| std::net::TcpStream::connect(&exchange.addr).expect("the kernel accepts the TCP connection")).collect();
    // Over the cap: closed at once, without waiting for any deadline.
    let refused_fast = attackers[300..].iter().filter(|s| closed_by_peer(s, Duration::from_millis(300))).count();
    assert!(refused_fast >= 50, "only {refused_fast} of the last 100 refused at once");
    // Admitted ones: reaped at the handshake deadline (1 s).
    let reaped = attackers[..100].iter().filter(|s| closed_by_peer(s, Duration::from_secs(3))).count();
    assert_eq!(reaped, 100, "every silent socket is closed by its deadline");

    // Every admitted attacker is reaped (the metrics port answers meanwhile);
    // then the exchange serves a login.
    let reaped_by = Instant::now() + Duration::from_secs(5);
    while metric(&scrape(&exchange.metrics_addr).await, "gpux_connections ") > 0.0 {
        assert!(Instant::now() < reaped_by, "silent sockets still held after 5 s");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let (mut renter, _) = Client::login(&exchange.addr, &key(9), Role::Renter).await;
    let id = renter.id();
    assert!(matches!(renter.request(ClientMessage::Balance { id }).await, ServerMessage::Balance { .. }));
    let body = scrape(&exchange.metrics_addr).await;
    // Every attacker is accounted for: refused at the cap or reaped at the
    // handshake deadline (how many of each depends on how fast the 400
    // connects came: slots freed by reaping admit later ones; seen 47 and
    // 353 on a loaded 2-core machine).
    let refused = metric(&body, "gpux_connections_refused_total{cap=\"connections_max\"}");
    let reaped = metric(&body, "gpux_connections_reaped_total{stage=\"handshake\"}");
    assert!(refused >= 1.0 && reaped >= 100.0 && refused + reaped >= 400.0, "refused {refused}, reaped {reaped}: {body}");

    let cpu = cpu_time(exchange.child.id()) - cpu_before;
    let wall = started.elapsed();
    assert!(cpu < wall / 2, "the attack cost {cpu:?} of CPU in {wall:?}");
    let log_text = std::fs::read_to_string(&log).expect("log");
    assert!(log_text.lines().count() < 100, "{} log lines:\n{}", log_text.lines().count(), &log_text[..log_text.len().min(4000)]);
    assert!(log_text.contains("at most 128 connections: the descriptor limit"), "the cap is announced");
    assert!(!log_text.contains('\x1b'), "no colour codes in a log file");
    drop(attackers);
}

/// An upgraded connection that neither logs in nor subscribes is closed
/// `login_timeout`; an anonymous subscriber reading market data stays.
#[tokio::test]
async fn a_connection_that_never_logs_in_is_closed_and_a_market_data_reader_stays() {
    let dir = tempfile::tempdir().expect("temp dir");
    let exchange = Exchange::start_with(&dir.path().join("data"), None, &["--login-timeout-ms", "500"]);
    let mut silent = Client::connect(&exchange.addr).await;
    let mut reader = Client::connect(&exchange.addr).await;
    let id = reader.id();
    reader.request_subscribe(id, Channel::Book, InstrumentId(0)).await;
    assert_eq!(silent.closed_reason().await, "login_timeout");
    tokio::time::sleep(Duration::from_millis(700)).await;
    let id = reader.id();
    reader.send(&ClientMessage::Ping { id }).await;
    let pong = reader.recv_until(|m| matches!(m, ServerMessage::Pong { .. }).then_some(())).await;
    assert_eq!(pong, (), "the subscriber is still served");
    let body = scrape(&exchange.metrics_addr).await;
    assert_eq!(metric(&body, "gpux_connections_reaped_total{stage=\"login\"}"), 1.0);
}

/// Over TLS the deadline covers the handshake and the upgrade: a client that
/// finishes TLS and then says nothing is closed all the same.
#[tokio::test]
async fn a_wss_socket_silent_after_the_tls_handshake_is_reaped() {
    use tokio::io::AsyncReadExt;
    use tokio_rustls::rustls;
    let dir = tempfile::tempdir().expect("temp dir");
    let identity = rcgen::generate_simple_self_signed(vec!["localhost".to_string()]).expect("certificate");
    let (certificate, key_file) = (dir.path().join("cert.pem"), dir.path().join("key.pem"));
    std::fs::write(&certificate, identity.cert.pem()).expect("write cert");
    write_secret(&key_file, identity.signing_key.serialize_pem());
    let exchange = Exchange::start_with(
        &dir.path().join("data"),
        None,
        &[
            "--tls-cert",
            certificate.to_str().expect("utf-8"),
            "--tls-key",
            key_file.to_str().expect("utf-8"),
            "--handshake-timeout-ms",
            "700",
        ],
    );
    let mut roots = rustls::RootCertStore::empty();
    roots.add(identity.cert.der().clone()).expect("trust");
    let config = rustls::ClientConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
        .with_safe_default_protocol_versions()
        .expect("versions")
        .with_root_certificates(roots)
        .with_no_client_auth();
    let tcp = tokio::net::TcpStream::connect(&exchange.addr).await.expect("tcp");
    let mut tls = tokio_rustls::TlsConnector::from(Arc::new(config))
        .connect(rustls::pki_types::ServerName::try_from("localhost").expect("name"), tcp)
        .await
        .expect("TLS handshake");
    let started = Instant::now();
    let mut buffer = [0u8; 64];
    let read = tokio::time::timeout(Duration::from_secs(3), tls.read(&mut buffer)).await.expect("closed within the deadline");
    assert!(matches!(read, Ok(0) | Err(_)), "{read:?}");
    assert!(started.elapsed() < Duration::from_secs(2));
    let body = scrape(&exchange.metrics_addr).await;
    assert_eq!(metric(&body, "gpux_connections_reaped_total{stage=\"handshake\"}"), 1.0);
}

/// One address holds at most `--connections-per-ip-max` connections; the
/// next is closed at once while other addresses are served.
#[tokio::test]
async fn one_address_is_capped_and_others_are_served() {
    let dir = tempfile::tempdir().expect("temp dir");
    let exchange = Exchange::start_with(&dir.path().join("data"), None, &["--connections-per-ip-max", "3"]);
    let held: Vec<Client> = futures_util::future::join_all((0..3).map(|_| Client::connect(&exchange.addr))).await;
    let fourth = std::net::TcpStream::connect(&exchange.addr).expect("tcp");
    assert!(closed_by_peer(&fourth, Duration::from_millis(500)), "the fourth from 127.0.0.1 is refused");

    // 127.0.0.2 is another address (all of 127/8 is loopback on Linux).
    let socket = tokio::net::TcpSocket::new_v4().expect("socket");
    socket.bind("127.0.0.2:0".parse().expect("addr")).expect("bind 127.0.0.2");
    let stream = socket.connect(exchange.addr.parse().expect("addr")).await.expect("connect");
    let (mut other, _) =
        tokio_tungstenite::client_async(format!("ws://{}", exchange.addr), MaybeTlsStream::Plain(stream)).await.expect("served");
    use futures_util::StreamExt;
    let challenge = other.next().await.expect("frame").expect("frame");
    assert!(challenge.to_text().expect("text").contains("challenge"));
    let body = scrape(&exchange.metrics_addr).await;
    assert_eq!(metric(&body, "gpux_connections_refused_total{cap=\"per_ip_max\"}"), 1.0);
    drop(held);
}

/// The metrics port against sockets that open and never finish a request:
/// 63 silent from four addresses and one trickling fill the cap of 64; a
/// fifth address's requests are answered at once, each taking the place of
/// the oldest connection of an address that holds the most (issue 61: 4
/// addresses x 16 silent connections took 8-9 of 10 reads from a fifth);
/// the rest are closed within the head timeout, and a scrape is answered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slow_http_requests_on_the_metrics_port_are_capped_and_timed_out() {
    let dir = tempfile::tempdir().expect("temp dir");
    let exchange = Exchange::start(&dir.path().join("data"), None);
    let started = Instant::now();
    // From four loopback addresses, under the per-address cap of 16.
    let mut silent = Vec::new();
    for index in 0..63u8 {
        silent.push(connect_from(&format!("127.0.0.{}", 2 + index / 16), &exchange.metrics_addr).await);
    }
    // A head that trickles in and never ends is cut off too.
    use std::io::Write;
    let mut trickle = connect_from("127.0.0.20", &exchange.metrics_addr).await;
    let _ = trickle.write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\n");
    // Every place is taken: a fifth address is answered all the same.
    for read in 0..10 {
        let mut reader = connect_from("127.0.0.21", &exchange.metrics_addr).await;
        reader.write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").expect("request");
        reader.set_read_timeout(Some(Duration::from_secs(5))).expect("timeout");
        let mut response = String::new();
        let _ = reader.read_to_string(&mut response);
        assert!(response.starts_with("HTTP/1.1 200"), "read {read} of the fifth address: {response}");
    }
    assert!(started.elapsed() < Duration::from_millis(1_900), "served before any head timeout: {:?}", started.elapsed());
    let closed_early = silent.iter().filter(|stream| closed_by_peer(stream, Duration::from_millis(20))).count();
    assert!((1..=10).contains(&closed_early), "the reads took the places of silent connections: {closed_early}");
    for stream in silent.iter().chain([&trickle]) {
        assert!(closed_by_peer(stream, Duration::from_secs(10)), "a silent HTTP connection is closed");
    }
    assert!(started.elapsed() < Duration::from_secs(8), "closed within the timeouts: {:?}", started.elapsed());
    let body = scrape(&exchange.metrics_addr).await;
    assert!(body.contains("gpux_connections "), "the scrape is answered again");
}

/// One address cannot take every HTTP slot: its 17th connection at once is
/// closed at accept, while another address is answered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_address_cannot_take_every_http_slot() {
    let dir = tempfile::tempdir().expect("temp dir");
    let exchange = Exchange::start(&dir.path().join("data"), None);
    let mut held = Vec::new();
    for _ in 0..16 {
        held.push(connect_from("127.0.0.30", &exchange.metrics_addr).await);
    }
    let seventeenth = connect_from("127.0.0.30", &exchange.metrics_addr).await;
    assert!(closed_by_peer(&seventeenth, Duration::from_secs(1)), "over the per-address cap: closed at once");
    use std::io::Write;
    let mut other = connect_from("127.0.0.31", &exchange.metrics_addr).await;
    other.write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").expect("request");
    other.set_read_timeout(Some(Duration::from_secs(5))).expect("timeout");
    let mut response = String::new();
    let _ = other.read_to_string(&mut response);
    assert!(response.starts_with("HTTP/1.1 200") && response.contains("gpux_connections "), "another address is served: {response}");
    drop(held);
}
