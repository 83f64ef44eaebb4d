//! The fabric's firewall against the real nftables (docs/agent.md
//! "Firewall"): addresses on the loopback interface stand for three hosts'
//! fabric addresses and a stranger's; the host's table admits new
//! connections to its fabric address from itself and its clusters' members
//! only, keeps them across an agent restart, and closes again when the
//! lease ends. Needs root (nft, ip); skipped without it unless
//! `GPUX_REQUIRE_FIREWALL` is set (scripts/test sets it where nft works).

use std::net::{IpAddr, SocketAddr};
use std::process::Command;
use std::time::Duration;

use gpux_engine::LeaseId;
use gpux_supplier_agent::firewall::Firewall;
use tokio::net::{TcpListener, TcpSocket};

const HOST: &str = "10.250.0.1";
const PEER: &str = "10.250.0.2";
const STRANGER: &str = "10.250.0.9";

fn ip(text: &str) -> IpAddr {
    text.parse().expect("an address")
}

fn usable() -> bool {
    let nft = Command::new("nft").args(["list", "tables"]).output().is_ok_and(|o| o.status.success());
    let ip = Command::new("ip").args(["addr", "show", "lo"]).output().is_ok_and(|o| o.status.success());
    nft && ip
}

/// The test's addresses on `lo`, removed when dropped.
struct Addresses;

impl Addresses {
    fn add() -> Addresses {
        for address in [HOST, PEER, STRANGER] {
            let _ = Command::new("ip").args(["addr", "del", &format!("{address}/32"), "dev", "lo"]).output();
            let added = Command::new("ip").args(["addr", "add", &format!("{address}/32"), "dev", "lo"]).output().expect("ip runs");
            assert!(added.status.success(), "adding {address}: {}", String::from_utf8_lossy(&added.stderr));
        }
        Addresses
    }
}

impl Drop for Addresses {
    fn drop(&mut self) {
        for address in [HOST, PEER, STRANGER] {
            let _ = Command::new("ip").args(["addr", "del", &format!("{address}/32"), "dev", "lo"]).output();
        }
    }
}

/// Whether a connection from `source` to `to` opens within a second (a
/// dropped SYN never answers).
async fn connects(source: &str, to: SocketAddr) -> bool {
    let socket = TcpSocket::new_v4().expect("socket");
    socket.bind(SocketAddr::new(ip(source), 0)).expect("bind the source");
    matches!(tokio::time::timeout(Duration::from_secs(1), socket.connect(to)).await, Ok(Ok(_)))
}

#[tokio::test]
async fn the_fabric_admits_the_host_and_its_clusters_members_only_and_closes_when_the_lease_ends() {
    if !usable() {
        assert!(std::env::var_os("GPUX_REQUIRE_FIREWALL").is_none(), "GPUX_REQUIRE_FIREWALL is set but nft or ip cannot be used");
        eprintln!("SKIP: nft and ip (root) are needed for the firewall test");
        return;
    }
    let _addresses = Addresses::add();
    let dir = tempfile::tempdir().expect("dir");
    let state = dir.path().join("firewall.json");
    let host = format!("fw-test-{}", std::process::id());
    let mut firewall = Firewall::new(&host, ip(HOST), state.clone()).expect("a firewall");
    firewall.apply().expect("nft takes the table");
    let listener = TcpListener::bind((ip(HOST), 0)).await.expect("listen on the fabric address");
    let to = listener.local_addr().expect("address");
    let accepting = tokio::spawn(async move {
        loop {
            let _ = listener.accept().await;
        }
    });

    // No cluster: only the host itself reaches its fabric address.
    assert!(connects(HOST, to).await, "the host itself");
    assert!(!connects(PEER, to).await, "no cluster yet: a peer is dropped");
    assert!(!connects(STRANGER, to).await);

    // A cluster with the peer: admitted; the stranger still dropped.
    firewall.admit(LeaseId(7), vec![ip(HOST), ip(PEER)]).expect("admits");
    assert!(connects(PEER, to).await, "a member of the host's cluster");
    assert!(!connects(STRANGER, to).await, "not a member");

    // A restarted agent keeps what its running cluster needs.
    drop(firewall);
    let mut firewall = Firewall::new(&host, ip(HOST), state).expect("a firewall again");
    assert_eq!(firewall.leases(), [LeaseId(7)]);
    firewall.apply().expect("nft takes the table");
    assert!(connects(PEER, to).await, "still admitted after the restart");

    // The lease ends: closed to the peer again.
    firewall.forget(&[LeaseId(7)]).expect("forgets");
    assert!(!connects(PEER, to).await, "the lease ended");
    assert!(connects(HOST, to).await);

    firewall.remove().expect("the table removed");
    assert!(connects(STRANGER, to).await, "without the table nothing is dropped");
    accepting.abort();
}
