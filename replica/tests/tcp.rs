//! Three replicas over real TCP on loopback (the network nodes use):
//! batches committed through the leader reach every node; the leader's
//! process gone (its Raft shut down, its port closed), the others elect a
//! new leader and keep committing; a peer without the cluster's token gets
//! no answer and changes nothing.

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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_replicas_over_tcp_commit_and_fail_over() {
    let dir = tempfile::tempdir().expect("temp dir");
    let config = Arc::new(
        Config { heartbeat_interval: 50, election_timeout_min: 300, election_timeout_max: 600, ..Default::default() }
            .validate()
            .expect("valid"),
    );
    let (members, listeners) = common::listeners(3).await;
    let mut nodes = BTreeMap::new();
    for (id, listener) in listeners {
        let log = LogStore::open(&dir.path().join(format!("{id}-log.redb"))).expect("log");
        let machine = MarketMachine::open(&dir.path().join(format!("{id}-machine.redb")), EngineConfig::demo()).expect("machine");
        let raft = Raft::new(id, config.clone(), TcpNetwork::new(SECRET, id), log, machine.clone()).await.expect("raft");
        let server = tokio::spawn(network::serve(listener, raft.clone(), Arc::from(SECRET), Default::default()));
        nodes.insert(id, Node { raft, machine, server });
    }
    nodes[&1].raft.initialize(members.clone()).await.expect("initialized");

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
    stranger.write_all(&[7u8; 32]).await.expect("writes");
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
