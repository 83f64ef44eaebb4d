//! Three replicas on openraft in one process, their RPCs through an
//! in-memory router that can cut a node off (a partition): batches of
//! journal entries written through the leader are applied by every node to
//! the same market state hash as the single-node apply path gives; the
//! leader killed, the others elect a new one and go on; the old leader
//! restarted from its redb files catches up; a partitioned leader cannot
//! commit, and what it could not commit is never applied anywhere.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use gpux_engine::{AccountId, Command, EngineConfig, Input, Role};
use gpux_market::{JournalEntry, MarketState};
use gpux_replica::log_store::LogStore;
use gpux_replica::state_machine::MarketMachine;
use gpux_replica::{Batch, NodeId, Raft, TypeConfig};
use openraft::error::{InstallSnapshotError, NetworkError, RPCError, RaftError, RemoteError, Unreachable};
use openraft::network::{RPCOption, RaftNetwork, RaftNetworkFactory};
use openraft::raft::{
    AppendEntriesRequest, AppendEntriesResponse, InstallSnapshotRequest, InstallSnapshotResponse, VoteRequest, VoteResponse,
};
use openraft::{AnyError, BasicNode, Config};

/// Every node's Raft handle, and the nodes cut off from the rest.
#[derive(Clone, Default)]
struct Net {
    nodes: Arc<Mutex<BTreeMap<NodeId, Raft>>>,
    cut: Arc<Mutex<BTreeSet<NodeId>>>,
}

impl Net {
    /// The target's handle, if a message from `from` can reach it now.
    fn reach(&self, from: NodeId, to: NodeId) -> Result<Raft, Unreachable> {
        let cut = self.cut.lock().expect("lock");
        if cut.contains(&from) || cut.contains(&to) {
            return Err(Unreachable::new(&AnyError::error("partitioned")));
        }
        self.nodes.lock().expect("lock").get(&to).cloned().ok_or_else(|| Unreachable::new(&AnyError::error("down")))
    }
}

/// One node's view of the network.
struct Factory {
    net: Net,
    from: NodeId,
}

struct PeerLink {
    net: Net,
    from: NodeId,
    to: NodeId,
}

impl RaftNetworkFactory<TypeConfig> for Factory {
    type Network = PeerLink;

    async fn new_client(&mut self, target: NodeId, _node: &BasicNode) -> PeerLink {
        PeerLink { net: self.net.clone(), from: self.from, to: target }
    }
}

impl RaftNetwork<TypeConfig> for PeerLink {
    async fn append_entries(
        &mut self,
        rpc: AppendEntriesRequest<TypeConfig>,
        _option: RPCOption,
    ) -> Result<AppendEntriesResponse<NodeId>, RPCError<NodeId, BasicNode, RaftError<NodeId>>> {
        let raft = self.net.reach(self.from, self.to).map_err(RPCError::Unreachable)?;
        // Over the wire in the real network: the request must survive bincode.
        let rpc = roundtrip(&rpc);
        raft.append_entries(rpc).await.map_err(|e| RPCError::RemoteError(RemoteError::new(self.to, e)))
    }

    async fn install_snapshot(
        &mut self,
        rpc: InstallSnapshotRequest<TypeConfig>,
        _option: RPCOption,
    ) -> Result<InstallSnapshotResponse<NodeId>, RPCError<NodeId, BasicNode, RaftError<NodeId, InstallSnapshotError>>> {
        let raft = self.net.reach(self.from, self.to).map_err(RPCError::Unreachable)?;
        raft.install_snapshot(rpc).await.map_err(|e| RPCError::RemoteError(RemoteError::new(self.to, e)))
    }

    async fn vote(
        &mut self,
        rpc: VoteRequest<NodeId>,
        _option: RPCOption,
    ) -> Result<VoteResponse<NodeId>, RPCError<NodeId, BasicNode, RaftError<NodeId>>> {
        let raft = self.net.reach(self.from, self.to).map_err(RPCError::Unreachable)?;
        raft.vote(roundtrip(&rpc)).await.map_err(|e| RPCError::RemoteError(RemoteError::new(self.to, e)))
    }
}

fn roundtrip<T: serde::Serialize + serde::de::DeserializeOwned>(value: &T) -> T {
    let bytes = bincode::serde::encode_to_vec(value, bincode::config::standard()).expect("encodes");
    bincode::serde::decode_from_slice(&bytes, bincode::config::standard()).expect("decodes").0
}

#[allow(dead_code)]
fn network_error(message: &str) -> NetworkError {
    NetworkError::new(&AnyError::error(message))
}

struct Node {
    raft: Raft,
    machine: MarketMachine,
}

fn config() -> Arc<Config> {
    let config = Config {
        heartbeat_interval: 50,
        election_timeout_min: 300,
        election_timeout_max: 600,
        snapshot_policy: openraft::SnapshotPolicy::LogsSinceLast(8),
        ..Default::default()
    };
    Arc::new(config.validate().expect("a valid config"))
}

/// Starts (or restarts, from its files) node `id`.
async fn start(net: &Net, dir: &std::path::Path, id: NodeId) -> Node {
    // A shut-down Raft's tasks let go of its files shortly after (a new
    // process would find them free at once).
    let mut tries = 0;
    let (log, machine) = loop {
        let log = LogStore::open(&dir.join(format!("node-{id}-log.redb")));
        let machine = MarketMachine::open(&dir.join(format!("node-{id}-machine.redb")), EngineConfig::demo());
        match (log, machine) {
            (Ok(log), Ok(machine)) => break (log, machine),
            (log, machine) => {
                tries += 1;
                assert!(tries < 100, "node {id}'s files open: {:?} {:?}", log.err(), machine.err());
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    };
    let raft = Raft::new(id, config(), Factory { net: net.clone(), from: id }, log, machine.clone()).await.expect("raft starts");
    net.nodes.lock().expect("lock").insert(id, raft.clone());
    Node { raft, machine }
}

async fn leader_of(nodes: &BTreeMap<NodeId, Node>) -> NodeId {
    for _ in 0..200 {
        for node in nodes.values() {
            let metrics = node.raft.metrics().borrow().clone();
            if metrics.current_leader == Some(metrics.id) && metrics.state.is_leader() {
                return metrics.id;
            }
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("no leader within 10 s");
}

/// A batch: an account opened and funded (amounts differ per batch, so
/// every batch changes the state hash).
fn batch(at_ms: u64, account: u32) -> Batch {
    Batch {
        entries: vec![
            JournalEntry::Engine(Input { at_ms, command: Command::OpenAccount { role: Role::Renter } }),
            JournalEntry::Engine(Input {
                at_ms,
                command: Command::Deposit { account: AccountId(account), amount_minor: 1_000 + account as u64 },
            }),
        ],
    }
}

/// Waits until every node in `ids` applied the log up to `index`.
async fn applied(nodes: &BTreeMap<NodeId, Node>, ids: &[NodeId], index: u64) {
    for id in ids {
        nodes[id].raft.wait(Some(Duration::from_secs(10))).applied_index_at_least(Some(index), "applied").await.expect("applies");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_replicas_apply_the_same_market_through_failover_restart_and_partition() {
    let dir = tempfile::tempdir().expect("temp dir");
    let net = Net::default();
    let mut nodes = BTreeMap::new();
    for id in 1..=3 {
        nodes.insert(id, start(&net, dir.path(), id).await);
    }
    let members: BTreeMap<NodeId, BasicNode> = (1..=3).map(|id| (id, BasicNode::new(format!("node-{id}")))).collect();
    nodes[&1].raft.initialize(members).await.expect("initialized");

    // The single-node apply path, for reference.
    let mut reference = MarketState::new(EngineConfig::demo()).expect("demo listing");
    let mut written = 0u32;
    let mut write = |reference: &mut MarketState, raft: Raft| {
        let batch = batch(1_800_000_000_000 + written as u64, written);
        for entry in &batch.entries {
            reference.apply(entry).expect("applies");
        }
        written += 1;
        async move { raft.client_write(batch).await }
    };

    // Ten batches through the leader: acknowledged, applied everywhere alike.
    let leader = leader_of(&nodes).await;
    let mut last = 0;
    for _ in 0..10 {
        let response = write(&mut reference, nodes[&leader].raft.clone()).await.expect("committed on a majority");
        assert!(response.data.refused.is_empty(), "{:?}", response.data);
        assert_eq!(response.data.applied, 2);
        last = response.log_id.index;
    }
    applied(&nodes, &[1, 2, 3], last).await;
    for node in nodes.values() {
        assert_eq!(node.machine.read(|m| m.state_hash()), reference.state_hash(), "every replica, the single-node state");
    }

    // The leader dies: the other two elect a new one and keep committing.
    let old = leader;
    nodes.remove(&old).expect("running").raft.shutdown().await.expect("shuts down");
    net.nodes.lock().expect("lock").remove(&old);
    let leader = leader_of(&nodes).await;
    assert_ne!(leader, old);
    for _ in 0..5 {
        last = write(&mut reference, nodes[&leader].raft.clone()).await.expect("committed by the two left").log_id.index;
    }
    let alive: Vec<NodeId> = nodes.keys().copied().collect();
    applied(&nodes, &alive, last).await;

    // The old leader restarts from its redb files and catches up.
    nodes.insert(old, start(&net, dir.path(), old).await);
    applied(&nodes, &[1, 2, 3], last).await;
    for node in nodes.values() {
        assert_eq!(node.machine.read(|m| m.state_hash()), reference.state_hash(), "the restarted replica too");
    }

    // The leader is cut off: it cannot commit (no acknowledgement), the
    // majority elects another and commits; after healing, the cut-off
    // leader's write is nowhere, and every replica holds the same state.
    let isolated = leader_of(&nodes).await;
    net.cut.lock().expect("lock").insert(isolated);
    let stranded = nodes[&isolated].raft.clone();
    let lost = tokio::time::timeout(Duration::from_secs(2), stranded.client_write(batch(1_900_000_000_000, 999))).await;
    assert!(lost.is_err() || lost.is_ok_and(|r| r.is_err()), "a partitioned leader acknowledges nothing");
    let majority: BTreeMap<NodeId, &Node> = nodes.iter().filter(|(id, _)| **id != isolated).map(|(id, n)| (*id, n)).collect();
    let new_leader = loop {
        let found = majority.values().find_map(|n| {
            let m = n.raft.metrics().borrow().clone();
            (m.state.is_leader()).then_some(m.id)
        });
        if let Some(found) = found {
            break found;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    for _ in 0..3 {
        last = write(&mut reference, nodes[&new_leader].raft.clone()).await.expect("the majority commits").log_id.index;
    }
    net.cut.lock().expect("lock").clear();
    applied(&nodes, &[1, 2, 3], last).await;
    for node in nodes.values() {
        assert_eq!(node.machine.read(|m| m.state_hash()), reference.state_hash(), "healed: one history, without the stranded write");
    }

    // Snapshots are built every 8 entries (the config's policy): the
    // leader has one, and a replica restarted from it has the same state.
    let node = nodes[&new_leader].raft.clone();
    node.wait(Some(Duration::from_secs(10))).metrics(|m| m.snapshot.is_some(), "a snapshot").await.expect("a snapshot was built");
    for node in nodes.into_values() {
        node.raft.shutdown().await.expect("shuts down");
    }
    net.nodes.lock().expect("lock").clear();
    let restarted = start(&net, dir.path(), new_leader).await;
    assert_eq!(restarted.machine.read(|m| m.state_hash()), reference.state_hash(), "restored from its snapshot");
    restarted.raft.shutdown().await.expect("shuts down");
}
