//! Every replica writes what it applies into its own journal (the
//! exchange's redb journal), so statements, history and a restart's
//! recovery read the same journal on every node: after batches through the
//! leader, every node's journal holds the same entries in the same order
//! with the same ledger transfers; a node restarted from its log (no
//! snapshot here) applies every committed entry again without writing any
//! of them a second time, then writes the next batch.

mod common;

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use gpux_engine::{AccountId, EngineConfig};
use gpux_journal::{Journal, JournalAppend, JournalStore};
use gpux_market::JournalEntry;
use gpux_replica::log_store::LogStore;
use gpux_replica::network::{self, TcpNetwork};
use gpux_replica::state_machine::{journal_config, JournalSink, MarketMachine};
use gpux_replica::{NodeId, Raft};
use openraft::{BasicNode, Config};

const SECRET: &[u8] = b"journal test";

struct Node {
    raft: Raft,
    machine: MarketMachine,
    journal: JournalSink,
    server: tokio::task::JoinHandle<()>,
}

fn config() -> Arc<Config> {
    let config = Config {
        heartbeat_interval: 50,
        election_timeout_min: 300,
        election_timeout_max: 600,
        // No snapshot: a restart applies the whole log again.
        snapshot_policy: openraft::SnapshotPolicy::Never,
        ..Default::default()
    };
    Arc::new(journal_config(config).validate().expect("valid"))
}

/// A snapshot every 10 log entries, and every log entry a snapshot covers
/// purged but the last 2 (the exchange's policy, scaled down).
fn purging_config() -> Arc<Config> {
    let config = Config {
        heartbeat_interval: 50,
        election_timeout_min: 300,
        election_timeout_max: 600,
        snapshot_policy: openraft::SnapshotPolicy::LogsSinceLast(10),
        max_in_snapshot_log_to_keep: 2,
        purge_batch_size: 5,
        ..Default::default()
    };
    Arc::new(journal_config(config).validate().expect("valid"))
}

async fn start(dir: &std::path::Path, id: NodeId, listener: tokio::net::TcpListener) -> Node {
    start_with(dir, id, listener, config()).await
}

async fn start_with(dir: &std::path::Path, id: NodeId, listener: tokio::net::TcpListener, config: Arc<Config>) -> Node {
    let mut tries = 0;
    let (log, machine, journal) = loop {
        let opened = (
            LogStore::open(&dir.join(format!("{id}-log.redb"))),
            MarketMachine::open(&dir.join(format!("{id}-machine.redb")), EngineConfig::demo()),
            Journal::open(&dir.join(format!("{id}-journal.redb"))),
        );
        match opened {
            (Ok(log), Ok(machine), Ok(journal)) => break (log, machine, journal),
            _ => {
                tries += 1;
                assert!(tries < 100, "node {id}'s files open");
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    };
    let reader: Arc<dyn gpux_journal::JournalRead> = Arc::new(journal.reader());
    let journal: JournalSink = Arc::new(Mutex::new(Box::new(journal) as Box<dyn JournalStore>));
    let machine = machine.with_journal(journal.clone()).with_peers(TcpNetwork::new(SECRET, id));
    let raft = Raft::new(id, config, TcpNetwork::new(SECRET, id), log, machine.clone()).await.expect("raft");
    let services = network::Services { journal: Some(reader), ..Default::default() };
    let server = tokio::spawn(network::serve(listener, raft.clone(), Arc::from(SECRET), services));
    Node { raft, machine, journal, server }
}

/// Three nodes with journals on loopback, not yet initialized.
async fn cluster(dir: &std::path::Path) -> (BTreeMap<NodeId, BasicNode>, BTreeMap<NodeId, Node>) {
    let (members, listeners) = common::listeners(3).await;
    let mut nodes = BTreeMap::new();
    for (id, listener) in listeners {
        nodes.insert(id, start(dir, id, listener).await);
    }
    (members, nodes)
}

fn journal_of(node: &Node) -> (u64, Vec<JournalEntry>, usize) {
    let journal = node.journal.lock().expect("lock");
    let statement = journal.statement(AccountId(3), None, 100).expect("statement").len();
    (journal.next_seq(), journal.entries_after(0).expect("entries"), statement)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_replica_writes_the_same_journal_once() {
    let dir = tempfile::tempdir().expect("temp dir");
    let (members, mut nodes) = cluster(dir.path()).await;
    nodes[&1].raft.initialize(members.clone()).await.expect("initialized");
    let leader = common::leader(nodes.values().map(|n| &n.raft)).await;
    let mut written = Vec::new();
    let mut last = 0;
    for account in 0..10 {
        let batch = common::batch(account);
        written.extend(batch.entries.clone());
        last = nodes[&leader].raft.client_write(batch).await.expect("committed").log_id.index;
    }
    for node in nodes.values() {
        node.raft.wait(Some(Duration::from_secs(10))).applied_index_at_least(Some(last), "applied").await.expect("applied");
    }
    for node in nodes.values() {
        let (next, entries, statement) = journal_of(node);
        assert_eq!(next, written.len() as u64 + 1);
        assert_eq!(entries, written, "the same entries in the same order on every node");
        assert_eq!(statement, 1, "account 3's deposit, with its ledger transfer");
        assert_eq!(node.machine.journal_next(), next);
    }

    // A follower restarts from its log: it applies every entry again and
    // writes none of them twice.
    let follower = *nodes.keys().find(|id| **id != leader).expect("a follower");
    let node = nodes.remove(&follower).expect("running");
    node.server.abort();
    node.raft.shutdown().await.expect("shuts down");
    drop(node);
    let listener = loop {
        match tokio::net::TcpListener::bind(&members[&follower].addr).await {
            Ok(listener) => break listener,
            Err(_) => tokio::time::sleep(Duration::from_millis(50)).await,
        }
    };
    nodes.insert(follower, start(dir.path(), follower, listener).await);
    let batch = common::batch(10);
    written.extend(batch.entries.clone());
    last = nodes[&leader].raft.client_write(batch).await.expect("committed").log_id.index;
    nodes[&follower].raft.wait(Some(Duration::from_secs(10))).applied_index_at_least(Some(last), "applied").await.expect("applied");
    assert!(nodes[&follower].raft.metrics().borrow().snapshot.is_none(), "it re-applied its log, not a snapshot");
    let (next, entries, _) = journal_of(&nodes[&follower]);
    assert_eq!(entries, written, "nothing written twice, nothing missing");
    assert_eq!(next, written.len() as u64 + 1);
    let hashes: Vec<u64> = nodes.values().map(|n| n.machine.read(|m| m.state_hash())).collect();
    assert!(hashes.windows(2).all(|pair| pair[0] == pair[1]), "{hashes:?}");
    for node in nodes.into_values() {
        node.server.abort();
        node.raft.shutdown().await.expect("shuts down");
    }
}

/// The journal a leader's sequencer writes through: an append returns its
/// first sequence number once the batch is committed and in the leader's
/// journal (and the followers' once they apply it); on a follower it fails
/// (not the leader) and nothing is written anywhere.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_leaders_sequencer_journal_appends_through_raft() {
    use gpux_replica::journal::ReplicatedJournal;
    let dir = tempfile::tempdir().expect("temp dir");
    let (members, nodes) = cluster(dir.path()).await;
    nodes[&1].raft.initialize(members.clone()).await.expect("initialized");
    let leader = common::leader(nodes.values().map(|n| &n.raft)).await;
    let follower = *nodes.keys().find(|id| **id != leader).expect("a follower");
    let runtime = tokio::runtime::Handle::current();
    let (on_leader, on_follower) = (
        ReplicatedJournal::new(nodes[&leader].raft.clone(), runtime.clone(), nodes[&leader].journal.clone()),
        ReplicatedJournal::new(nodes[&follower].raft.clone(), runtime, nodes[&follower].journal.clone()),
    );
    // The sequencer's thread is outside the runtime: append from one.
    let appended = tokio::task::spawn_blocking(move || {
        let (mut on_leader, mut on_follower) = (on_leader, on_follower);
        let none = gpux_market::Archived::default();
        let firsts: Vec<u64> = (0..3)
            .map(|account| on_leader.append_with_transfers(&common::batch(account).entries, &[], &none).expect("committed"))
            .collect();
        let refused = on_follower.append_with_transfers(&common::batch(9).entries, &[], &none);
        (firsts, refused.is_err(), on_leader.next_seq(), on_leader.entries_after(0).expect("entries").len())
    })
    .await
    .expect("the appending thread");
    assert_eq!(appended, (vec![1, 3, 5], true, 7, 6), "(first seqs, follower refused, next seq, entries)");
    let written: Vec<JournalEntry> = (0..3).flat_map(|account| common::batch(account).entries).collect();
    // Every node writes the three batches (the followers once they apply
    // them: Raft's metrics may lag what is applied, so the journal itself is
    // what is waited for).
    for node in nodes.values() {
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while journal_of(node).1.len() < written.len() {
            assert!(std::time::Instant::now() < deadline, "a node applies the committed batches");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        assert_eq!(journal_of(node).1, written, "every node's journal, nothing of the follower's refused append");
    }
    for node in nodes.into_values() {
        node.server.abort();
        node.raft.shutdown().await.expect("shuts down");
    }
}

/// The leader purges the log its snapshot covers while a follower is down:
/// the follower, back, is sent the snapshot, copies the journal entries it
/// covers from a peer's journal (applying them itself, so its transfers are
/// its own), and ends with the same journal, statements and market as the
/// others; then takes new batches from the log as before.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_behind_a_purged_log_takes_a_snapshot_and_copies_the_journal_from_a_peer() {
    let dir = tempfile::tempdir().expect("temp dir");
    let (members, listeners) = common::listeners(3).await;
    let mut nodes = BTreeMap::new();
    for (id, listener) in listeners {
        nodes.insert(id, start_with(dir.path(), id, listener, purging_config()).await);
    }
    nodes[&1].raft.initialize(members.clone()).await.expect("initialized");
    let leader = common::leader(nodes.values().map(|n| &n.raft)).await;
    let mut written = Vec::new();
    for account in 0..3 {
        let batch = common::batch(account);
        written.extend(batch.entries.clone());
        nodes[&leader].raft.client_write(batch).await.expect("committed");
    }

    // A follower stops; the others go on, snapshot and purge their logs.
    let follower = *nodes.keys().find(|id| **id != leader).expect("a follower");
    let node = nodes.remove(&follower).expect("running");
    node.server.abort();
    node.raft.shutdown().await.expect("shuts down");
    drop(node);
    let mut last = 0;
    for account in 3..40 {
        let batch = common::batch(account);
        written.extend(batch.entries.clone());
        last = nodes[&leader].raft.client_write(batch).await.expect("committed").log_id.index;
    }
    // Both running nodes snapshot and purge by the policy: the log keeps
    // at most the last snapshot's 10 entries, 2 behind it and a purge batch.
    for node in nodes.values() {
        let wait = node.raft.wait(Some(Duration::from_secs(10)));
        let purged = wait.metrics(|m| m.purged.is_some_and(|p| p.index >= last - 10 - 2 - 5), "the log purged").await.expect("purged");
        let kept = purged.last_log_index.expect("a log") - purged.purged.expect("purged").index;
        assert!(kept <= 10 + 2 + 5, "{kept} log entries kept");
    }

    // Back: the log it needs is gone, so it takes the snapshot.
    let listener = loop {
        match tokio::net::TcpListener::bind(&members[&follower].addr).await {
            Ok(listener) => break listener,
            Err(_) => tokio::time::sleep(Duration::from_millis(50)).await,
        }
    };
    nodes.insert(follower, start_with(dir.path(), follower, listener, purging_config()).await);
    let back = &nodes[&follower];
    back.raft.wait(Some(Duration::from_secs(20))).applied_index_at_least(Some(last), "applied").await.expect("caught up");
    let snapshot = back.raft.metrics().borrow().snapshot;
    // It left at index 4, before any snapshot, and the log after it is gone.
    assert!(snapshot.is_some(), "it took a peer's snapshot");
    let (next, entries, statement) = journal_of(back);
    assert_eq!(entries, written, "the journal holds every entry, none twice, in order");
    assert_eq!(next, written.len() as u64 + 1);
    assert_eq!(statement, 1, "account 3's deposit, with the transfer this node derived");
    assert_eq!(back.machine.journal_next(), next);

    // The log goes on from there.
    let batch = common::batch(40);
    written.extend(batch.entries.clone());
    last = nodes[&leader].raft.client_write(batch).await.expect("committed").log_id.index;
    for node in nodes.values() {
        node.raft.wait(Some(Duration::from_secs(10))).applied_index_at_least(Some(last), "applied").await.expect("applied");
        assert_eq!(journal_of(node).1, written, "every node's journal");
    }
    let hashes: Vec<u64> = nodes.values().map(|n| n.machine.read(|m| m.state_hash())).collect();
    assert!(hashes.windows(2).all(|pair| pair[0] == pair[1]), "{hashes:?}");
    for node in nodes.into_values() {
        node.server.abort();
        node.raft.shutdown().await.expect("shuts down");
    }
}
