//! The operator's calls to a node (`gpux-exchange cluster ...`), carried on
//! the Raft port after the cluster token, so only a holder of the cluster
//! secret administers the cluster: start it, add and remove nodes, move
//! the leadership, read a node's status.
//!
//! Membership changes go to the leader; a node that is not the leader
//! answers [`AdminReply::NotLeader`] with the leader it knows, and
//! [`call_leader`] follows that once.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use openraft::{BasicNode, ChangeMembers};
use serde::{Deserialize, Serialize};
use tokio::sync::watch;

use crate::network::{cluster_token, connect, read_frame, write_frame, Call, FrameError, Reply};
use crate::{NodeId, Raft};
use tokio_rustls::rustls::ClientConfig;

/// What an operator asks a node.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub enum AdminRequest {
    /// Starts a new cluster with these voters (id and Raft address), once,
    /// on one node; every named node must be running.
    Initialize { members: BTreeMap<NodeId, String> },
    /// Adds a node: it catches up as a learner, then becomes a voter.
    Join { id: NodeId, addr: String },
    /// Removes a voter from the cluster.
    Leave { id: NodeId },
    /// Makes this node the leader (a leader transfer before maintenance of
    /// the current one): it asks the leader to yield, then campaigns until
    /// it wins (10 s at most).
    Lead,
    /// Asks the leader to hand its leadership over: it stops serving and
    /// sends no heartbeats, so the followers' leases run out and one of
    /// them (the one campaigning) takes over; it takes part again once
    /// another node leads, or after 10 s.
    Yield,
    /// This node's view of the cluster.
    Status,
}

/// A node's view of the cluster, from its Raft metrics.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeStatus {
    pub id: NodeId,
    /// `leader`, `follower`, `candidate` or `learner`.
    pub state: String,
    pub term: u64,
    /// The leader this node knows, with its Raft address.
    pub leader: Option<(NodeId, String)>,
    /// The last log index this node holds, and the last it applied.
    pub last_log_index: u64,
    pub last_applied: u64,
    pub voters: BTreeSet<NodeId>,
    pub learners: BTreeSet<NodeId>,
    /// On a leader: each node's replication lag in log entries (the
    /// leader's last index minus the last index it matched).
    pub lag: BTreeMap<NodeId, u64>,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
pub enum AdminReply {
    Done,
    Status(NodeStatus),
    /// Membership changes go to the leader: this one, if known.
    NotLeader {
        leader: Option<(NodeId, String)>,
    },
    Failed(String),
}

/// Why an operator's call got no answer.
#[derive(Debug, thiserror::Error)]
pub enum AdminError {
    #[error("cannot reach {addr}: {source}")]
    Unreachable { addr: String, source: std::io::Error },
    #[error("{addr} did not answer within {0:?}", ADMIN_TIMEOUT)]
    Timeout { addr: String },
    #[error("{addr}: {0}", .source)]
    Frame { addr: String, source: FrameError },
    #[error("{addr} answered something else than an operator's reply (not a gpux-exchange Raft port?)")]
    Unexpected { addr: String },
}

/// How long an operator's call may take (a join waits for the new node to
/// catch up).
pub const ADMIN_TIMEOUT: Duration = Duration::from_secs(60);

/// How long a leader yields, and a node asked to lead campaigns, at most.
pub const HANDOVER_TIMEOUT: Duration = Duration::from_secs(10);

/// Whether this node is handing its leadership over ([`AdminRequest::Yield`]):
/// the exchange stops serving then, and does not serve again until it ends.
#[derive(Clone)]
pub struct Handover(Arc<watch::Sender<bool>>);

impl Default for Handover {
    fn default() -> Handover {
        Handover(Arc::new(watch::channel(false).0))
    }
}

impl Handover {
    pub fn subscribe(&self) -> watch::Receiver<bool> {
        self.0.subscribe()
    }
}

/// This node's status.
pub fn status(raft: &Raft) -> NodeStatus {
    let metrics = raft.metrics().borrow().clone();
    let membership = metrics.membership_config.membership();
    let leader = metrics.current_leader.map(|id| (id, membership.get_node(&id).map_or_else(String::new, |node| node.addr.clone())));
    let last_log_index = metrics.last_log_index.unwrap_or(0);
    let voters: BTreeSet<NodeId> = membership.voter_ids().collect();
    let learners: BTreeSet<NodeId> = membership.learner_ids().collect();
    let lag = metrics
        .replication
        .as_ref()
        .map(|replication| {
            replication.iter().map(|(id, matched)| (*id, last_log_index.saturating_sub(matched.map_or(0, |log_id| log_id.index)))).collect()
        })
        .unwrap_or_default();
    let state = match metrics.state {
        openraft::ServerState::Leader => "leader",
        openraft::ServerState::Follower => "follower",
        openraft::ServerState::Candidate => "candidate",
        openraft::ServerState::Learner => "learner",
        openraft::ServerState::Shutdown => "shutdown",
    };
    NodeStatus {
        id: metrics.id,
        state: state.to_string(),
        term: metrics.current_term,
        leader,
        last_log_index,
        last_applied: metrics.last_applied.map_or(0, |log_id| log_id.index),
        voters,
        learners,
        lag,
    }
}

/// Answers an operator's call on this node.
pub(crate) async fn handle(raft: &Raft, secret: &[u8], handover: &Handover, request: AdminRequest) -> AdminReply {
    fn written<T>(
        result: Result<T, openraft::error::RaftError<NodeId, openraft::error::ClientWriteError<NodeId, BasicNode>>>,
    ) -> AdminReply {
        match result {
            Ok(_) => AdminReply::Done,
            Err(error) => match error.forward_to_leader::<BasicNode>() {
                Some(forward) => AdminReply::NotLeader {
                    leader: forward.leader_id.map(|id| (id, forward.leader_node.as_ref().map_or_else(String::new, |n| n.addr.clone()))),
                },
                None => AdminReply::Failed(error.to_string()),
            },
        }
    }
    match request {
        AdminRequest::Initialize { members } => {
            if members.is_empty() || members.contains_key(&0) {
                return AdminReply::Failed("a cluster needs at least one member, and node ids start at 1".into());
            }
            let members: BTreeMap<NodeId, BasicNode> = members.into_iter().map(|(id, addr)| (id, BasicNode::new(addr))).collect();
            match raft.initialize(members).await {
                Ok(()) => AdminReply::Done,
                Err(error) => AdminReply::Failed(error.to_string()),
            }
        }
        AdminRequest::Join { id, addr } => {
            if id == 0 {
                return AdminReply::Failed("node ids start at 1".into());
            }
            match raft.add_learner(id, BasicNode::new(addr), true).await {
                Ok(_) => written(raft.change_membership(ChangeMembers::AddVoterIds(BTreeSet::from([id])), false).await),
                Err(error) => written::<()>(Err(error)),
            }
        }
        AdminRequest::Leave { id } => written(raft.change_membership(ChangeMembers::RemoveVoters(BTreeSet::from([id])), false).await),
        AdminRequest::Lead => lead(raft, secret).await,
        AdminRequest::Yield => {
            if !raft.metrics().borrow().state.is_leader() {
                return AdminReply::Done;
            }
            handover.0.send_replace(true);
            raft.runtime_config().heartbeat(false);
            raft.runtime_config().elect(false);
            let (raft, handover) = (raft.clone(), handover.clone());
            tokio::spawn(async move {
                let mut metrics = raft.metrics();
                let _ = tokio::time::timeout(HANDOVER_TIMEOUT, metrics.wait_for(|m| !m.state.is_leader())).await;
                raft.runtime_config().heartbeat(true);
                raft.runtime_config().elect(true);
                handover.0.send_replace(false);
            });
            AdminReply::Done
        }
        AdminRequest::Status => AdminReply::Status(status(raft)),
    }
}

/// Takes the leadership: the leader yields, this node campaigns until it
/// wins (its log is as long as the leader's once the leader stops writing).
async fn lead(raft: &Raft, secret: &[u8]) -> AdminReply {
    let me = raft.metrics().borrow().id;
    let started = tokio::time::Instant::now();
    while started.elapsed() < HANDOVER_TIMEOUT {
        let now = status(raft);
        if now.state == "leader" {
            return AdminReply::Done;
        }
        if let Some((leader, addr)) = now.leader.filter(|(leader, _)| *leader != me) {
            match call(&addr, secret, AdminRequest::Yield).await {
                Ok(AdminReply::Done) => {}
                Ok(other) => return AdminReply::Failed(format!("node {leader} did not yield: {other:?}")),
                Err(error) => return AdminReply::Failed(format!("node {leader} did not yield: {error}")),
            }
        }
        if let Err(error) = raft.trigger().elect().await {
            return AdminReply::Failed(error.to_string());
        }
        tokio::time::sleep(Duration::from_millis(150)).await;
    }
    AdminReply::Failed(format!("node {me} did not win an election within {HANDOVER_TIMEOUT:?}"))
}

/// Sends one operator's call to the node whose Raft port is `addr`.
pub async fn call(addr: &str, secret: &[u8], request: AdminRequest) -> Result<AdminReply, AdminError> {
    call_with(addr, secret, None, request).await
}

/// [`call`] over TLS when `tls` is given (the cluster's `--raft-tls-ca`).
pub async fn call_with(
    addr: &str,
    secret: &[u8],
    tls: Option<&Arc<ClientConfig>>,
    request: AdminRequest,
) -> Result<AdminReply, AdminError> {
    let exchanged = tokio::time::timeout(ADMIN_TIMEOUT, async {
        let frame = |source: FrameError| AdminError::Frame { addr: addr.to_string(), source };
        let mut stream = match connect(addr, tls, &cluster_token(secret), 0).await {
            Ok(stream) => stream,
            Err(FrameError::Io(source)) => return Err(AdminError::Unreachable { addr: addr.to_string(), source }),
            Err(error) => return Err(frame(error)),
        };
        write_frame(&mut stream, &Call::Admin(request)).await.map_err(frame)?;
        match read_frame::<_, Reply>(&mut stream).await.map_err(frame)? {
            Reply::Admin(reply) => Ok(reply),
            _ => Err(AdminError::Unexpected { addr: addr.to_string() }),
        }
    })
    .await;
    exchanged.unwrap_or_else(|_| Err(AdminError::Timeout { addr: addr.to_string() }))
}

/// [`call`], sent again to the leader once when the node answers that it
/// is not the leader and names one.
pub async fn call_leader(
    addr: &str,
    secret: &[u8],
    tls: Option<&Arc<ClientConfig>>,
    request: AdminRequest,
) -> Result<AdminReply, AdminError> {
    match call_with(addr, secret, tls, request.clone()).await? {
        AdminReply::NotLeader { leader: Some((_, leader_addr)) } if !leader_addr.is_empty() && leader_addr != addr => {
            call_with(&leader_addr, secret, tls, request).await
        }
        reply => Ok(reply),
    }
}
