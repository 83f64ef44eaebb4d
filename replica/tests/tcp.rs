//! Three replicas over real TCP on loopback (the network nodes use):
//! batches committed through the leader reach every node; the leader's
//! process gone (its Raft shut down, its port closed), the others elect a
//! new leader and keep committing; a peer without the cluster's secret gets
//! no answer and changes nothing, a recorded handshake replayed opens
//! nothing, and silent connections do not keep the cluster's own out.

mod common;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use gpux_engine::EngineConfig;
use gpux_replica::log_store::LogStore;
use gpux_replica::network::{self, TcpNetwork};
use gpux_replica::state_machine::MarketMachine;
use gpux_replica::Raft;
use openraft::Config;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

struct Node {
    raft: Raft,
    machine: MarketMachine,
    server: tokio::task::JoinHandle<()>,
}

const SECRET: &[u8] = b"the cluster's secret";

type Tls = (Arc<tokio_rustls::rustls::ServerConfig>, Arc<tokio_rustls::rustls::ClientConfig>);

/// Three nodes on loopback (over TLS with `tls`), initialized as a cluster.
async fn three_nodes(dir: &std::path::Path, tls: Option<Tls>) -> (BTreeMap<u64, openraft::BasicNode>, BTreeMap<u64, Node>) {
    let config = Arc::new(
        Config { heartbeat_interval: 50, election_timeout_min: 300, election_timeout_max: 600, ..Default::default() }
            .validate()
            .expect("valid"),
    );
    let (members, listeners) = common::listeners(3).await;
    let mut nodes = BTreeMap::new();
    for (id, listener) in listeners {
        let log = LogStore::open(&dir.join(format!("{id}-log.redb"))).expect("log");
        let machine = MarketMachine::open(&dir.join(format!("{id}-machine.redb")), EngineConfig::demo()).expect("machine");
        let mut net = TcpNetwork::new(SECRET, id);
        if let Some((_, trust)) = &tls {
            net = net.with_tls(trust.clone());
        }
        let raft = Raft::new(id, config.clone(), net, log, machine.clone()).await.expect("raft");
        let identity = tls.as_ref().map(|(identity, _)| identity.clone());
        let server = tokio::spawn(network::serve_tls(listener, raft.clone(), Arc::from(SECRET), Default::default(), identity));
        nodes.insert(id, Node { raft, machine, server });
    }
    nodes[&1].raft.initialize(members.clone()).await.expect("initialized");
    (members, nodes)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_replicas_over_tcp_commit_and_fail_over() {
    let dir = tempfile::tempdir().expect("temp dir");
    let (members, mut nodes) = three_nodes(dir.path(), None).await;

    let first = common::leader(nodes.values().map(|n| &n.raft)).await;
    let mut last = 0;
    for account in 0..5 {
        let response = nodes[&first].raft.client_write(common::batch(account)).await.expect("committed");
        assert!(response.data.refused.is_empty());
        last = response.log_id.index;
    }
    for node in nodes.values() {
        node.raft.wait(Some(Duration::from_secs(10))).applied_index_at_least(Some(last), "applied").await.expect("applied");
    }
    let hashes: Vec<u64> = nodes.values().map(|n| n.machine.read(|m| m.state_hash())).collect();
    assert!(hashes.windows(2).all(|pair| pair[0] == pair[1]), "{hashes:?}");

    // A stranger on a node's Raft port: dropped without an answer.
    let mut stranger = tokio::net::TcpStream::connect(&members[&2].addr).await.expect("connects");
    stranger.write_all(&[7u8; network::HELLO_BYTES]).await.expect("writes");
    stranger.write_all(&[9, 0, 0, 0, 1, 2, 3, 4, 5, 6, 7, 8, 9]).await.expect("writes");
    let mut buffer = [0u8; 16];
    let read = tokio::time::timeout(Duration::from_secs(5), stranger.read(&mut buffer)).await.expect("closed in time");
    assert!(matches!(read, Ok(0) | Err(_)), "no answer to a stranger: {read:?}");

    // The leader's process goes away: port closed, Raft stopped.
    let gone = nodes.remove(&first).expect("running");
    gone.server.abort();
    gone.raft.shutdown().await.expect("shuts down");
    let second = common::leader(nodes.values().map(|n| &n.raft)).await;
    assert_ne!(second, first);
    for account in 5..8 {
        last = nodes[&second].raft.client_write(common::batch(account)).await.expect("the two left commit").log_id.index;
    }
    for node in nodes.values() {
        node.raft.wait(Some(Duration::from_secs(10))).applied_index_at_least(Some(last), "applied").await.expect("applied");
    }
    let hashes: Vec<u64> = nodes.values().map(|n| n.machine.read(|m| m.state_hash())).collect();
    assert!(hashes.windows(2).all(|pair| pair[0] == pair[1]), "{hashes:?}");
    assert_eq!(nodes[&second].machine.read(|m| m.engine().account_count()), 8, "every committed batch applied once");
    for node in nodes.into_values() {
        node.server.abort();
        node.raft.shutdown().await.expect("shuts down");
    }
}

/// One node serving its Raft port: its Raft, the server task, its address.
async fn one_node(dir: &std::path::Path) -> (Raft, tokio::task::JoinHandle<()>, String) {
    let (members, listeners) = common::listeners(1).await;
    let (id, listener) = listeners.into_iter().next().expect("one");
    let log = LogStore::open(&dir.join("log.redb")).expect("log");
    let machine = MarketMachine::open(&dir.join("machine.redb"), EngineConfig::demo()).expect("machine");
    let config = Arc::new(Config::default().validate().expect("valid"));
    let raft = Raft::new(id, config, TcpNetwork::new(SECRET, id), log, machine).await.expect("raft");
    let server = tokio::spawn(network::serve(listener, raft.clone(), Arc::from(SECRET), Default::default()));
    (raft, server, members[&id].addr.clone())
}

/// Issue 41: the Raft port's hello was a fixed hash of the secret, so one
/// captured handshake worked for ever, and unauthenticated connections had
/// no bound.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replayed_or_wrong_handshake_opens_nothing_and_silent_connections_keep_no_peer_out() {
    use gpux_protocol::peer_auth::{self, Role};
    use gpux_replica::admin::{self, AdminReply, AdminRequest};
    let dir = tempfile::tempdir().expect("temp dir");
    let (raft, server, addr) = one_node(dir.path()).await;

    // The operator's call proves the secret; a wrong secret gets nothing.
    assert!(matches!(admin::call(&addr, SECRET, AdminRequest::Status).await, Ok(AdminReply::Status(_))));
    assert!(admin::call(&addr, b"a guess", AdminRequest::Status).await.is_err());

    // A genuine handshake, recorded, then replayed word for word.
    let key = network::cluster_token(SECRET);
    let mut hello = [0u8; network::HELLO_BYTES];
    hello[..8].copy_from_slice(b"gpuxraft");
    hello[8..10].copy_from_slice(&network::RAFT_VERSION.to_le_bytes());
    hello[10..42].copy_from_slice(&[5; 32]);
    hello[network::HELLO_BYTES - 8..].copy_from_slice(&9u64.to_le_bytes());
    let handshake = |proof: Option<[u8; 32]>| {
        let addr = addr.clone();
        async move {
            let mut stream = tokio::net::TcpStream::connect(&addr).await.expect("connects");
            stream.write_all(&hello).await.expect("writes");
            let mut answer = [0u8; 64];
            stream.read_exact(&mut answer).await.expect("the node answers");
            let theirs: [u8; 32] = answer[..32].try_into().expect("32");
            let proof =
                proof.unwrap_or_else(|| peer_auth::proof(&key, b"gpux-raft-v2", Role::Initiator, &[5; 32], &theirs, &9u64.to_le_bytes()));
            stream.write_all(&proof).await.expect("writes");
            (stream, proof)
        }
    };
    let (stream, recorded) = handshake(None).await;
    assert!(stays_open(stream).await, "the genuine handshake is served (the node waits for a call)");
    let (stream, _) = handshake(Some(recorded)).await;
    assert!(!stays_open(stream).await, "the replayed proof is refused: the node's nonce is new");

    // 64 silent connections: the pool of handshakes keeps 16, newest first,
    // and a peer's handshake still goes through at once.
    let mut silent = Vec::new();
    for _ in 0..64 {
        silent.push(tokio::net::TcpStream::connect(&addr).await.expect("connects"));
    }
    let started = std::time::Instant::now();
    assert!(matches!(admin::call(&addr, SECRET, AdminRequest::Status).await, Ok(AdminReply::Status(_))));
    assert!(started.elapsed() < Duration::from_secs(2), "served in {:?}", started.elapsed());
    server.abort();
    raft.shutdown().await.expect("shuts down");
}

/// Whether the node keeps the connection open (a proven peer's, waiting
/// for its call) rather than closing it (a refused handshake).
async fn stays_open(mut stream: tokio::net::TcpStream) -> bool {
    let mut byte = [0u8; 1];
    tokio::time::timeout(Duration::from_secs(1), stream.read(&mut byte)).await.is_err()
}

/// docs/operations.md "Ports and secrets": with TLS on the Raft port the
/// nodes commit as before, an operator's call over TLS is answered, and a
/// caller without TLS gets nothing even with the secret.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_replicas_commit_over_tls_and_a_plain_caller_is_refused() {
    use gpux_replica::admin::{self, AdminReply, AdminRequest};
    let dir = tempfile::tempdir().expect("temp dir");
    let identity = rcgen::generate_simple_self_signed(vec!["127.0.0.1".to_string()]).expect("certificate");
    let (cert, key) = (dir.path().join("raft.pem"), dir.path().join("raft.key"));
    std::fs::write(&cert, identity.cert.pem()).expect("write cert");
    std::fs::write(&key, identity.signing_key.serialize_pem()).expect("write key");
    // A TLS key is a secret file: refused while others may read it.
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o644)).expect("chmod");
    let exposed = gpux_protocol::tls::server_config(&cert, &key).map(|_| ()).expect_err("a world-readable key");
    assert!(exposed.to_string().contains("chmod 600"), "{exposed}");
    std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o600)).expect("chmod");
    let server = gpux_protocol::tls::server_config(&cert, &key).expect("identity");
    let trust = gpux_protocol::tls::client_config(&cert).expect("trust");
    let (members, nodes) = three_nodes(dir.path(), Some((server, trust.clone()))).await;
    let leader = common::leader(nodes.values().map(|n| &n.raft)).await;
    let last = nodes[&leader].raft.client_write(common::batch(0)).await.expect("committed").log_id.index;
    for node in nodes.values() {
        node.raft.wait(Some(Duration::from_secs(10))).applied_index_at_least(Some(last), "applied").await.expect("applied");
    }
    let addr = &members[&2].addr;
    let answered = admin::call_with(addr, SECRET, Some(&trust), AdminRequest::Status).await;
    assert!(matches!(answered, Ok(AdminReply::Status(_))), "{answered:?}");
    assert!(admin::call(addr, SECRET, AdminRequest::Status).await.is_err(), "no TLS, no answer");
    for node in nodes.into_values() {
        node.server.abort();
        node.raft.shutdown().await.expect("shuts down");
    }
}

/// A one-connection TCP relay on `127.0.0.1` that reaches `to` from
/// `from` (a loopback address) and holds each chunk `delay` each way: a
/// peer that far away. Returns its address.
async fn distant_relay(to: String, from: &'static str, delay: Duration) -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("relay");
    let addr = listener.local_addr().expect("addr").to_string();
    tokio::spawn(async move {
        while let Ok((inbound, _)) = listener.accept().await {
            let socket = tokio::net::TcpSocket::new_v4().expect("socket");
            socket.bind(format!("{from}:0").parse().expect("addr")).expect("bind");
            let Ok(outbound) = socket.connect(to.parse().expect("addr")).await else { continue };
            let (in_read, in_write) = inbound.into_split();
            let (out_read, out_write) = outbound.into_split();
            let pump = |mut read: tokio::net::tcp::OwnedReadHalf, mut write: tokio::net::tcp::OwnedWriteHalf| async move {
                let mut buffer = vec![0u8; 64 << 10];
                while let Ok(n) = read.read(&mut buffer).await {
                    if n == 0 {
                        break;
                    }
                    tokio::time::sleep(delay).await;
                    if write.write_all(&buffer[..n]).await.is_err() {
                        break;
                    }
                }
            };
            tokio::spawn(pump(in_read, out_write));
            tokio::spawn(pump(out_read, in_write));
        }
    });
    addr
}

/// Issue 61: silent connections from one process made every `cluster
/// status` from 25 ms away fail (each newcomer displaced the oldest
/// handshake, the distant operator's among them). A flood from one address
/// now churns only its own places: every call from another address 25 ms
/// away is served while the flood goes on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flood_of_silent_connections_from_one_address_keeps_no_distant_operator_out() {
    use gpux_replica::admin::{self, AdminReply, AdminRequest};
    let dir = tempfile::tempdir().expect("temp dir");
    let (raft, server, addr) = one_node(dir.path()).await;

    let flooding = Arc::new(std::sync::atomic::AtomicBool::new(true));
    let flood = tokio::spawn({
        let (addr, flooding) = (addr.clone(), flooding.clone());
        async move {
            let mut silent = std::collections::VecDeque::new();
            let mut opened = 0u64;
            while flooding.load(std::sync::atomic::Ordering::Relaxed) {
                let socket = tokio::net::TcpSocket::new_v4().expect("socket");
                socket.bind("127.0.0.3:0".parse().expect("addr")).expect("bind");
                if let Ok(stream) = socket.connect(addr.parse().expect("addr")).await {
                    silent.push_back(stream);
                    opened += 1;
                }
                if silent.len() > 512 {
                    silent.pop_front();
                }
                tokio::task::yield_now().await;
            }
            opened
        }
    });
    tokio::time::sleep(Duration::from_millis(200)).await;
    let mut served = 0;
    for _ in 0..10 {
        let relay = distant_relay(addr.clone(), "127.0.0.2", Duration::from_millis(25)).await;
        if matches!(admin::call(&relay, SECRET, AdminRequest::Status).await, Ok(AdminReply::Status(_))) {
            served += 1;
        }
    }
    flooding.store(false, std::sync::atomic::Ordering::Relaxed);
    let opened = flood.await.expect("flood");
    assert!(opened > 100, "the flood ran: {opened} connections");
    assert_eq!(served, 10, "every distant call is served during a flood of {opened} silent connections");
    server.abort();
    raft.shutdown().await.expect("shuts down");
}
