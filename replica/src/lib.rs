//! gpux-replica: the market replicated with openraft (issue 19, part 2;
//! ../shared/design/replication-openraft.md). The journal is the Raft log
//! and the state machine is `gpux-market`'s one apply path:
//!
//! - [`log_store::LogStore`]: the Raft log, vote, committed id and purge
//!   point on redb; an append returns (and tells Raft it is flushed) only
//!   once its write transaction committed, which redb makes durable
//!   (`Durability::Immediate`), so a majority's acknowledgement is a
//!   majority's disk.
//! - [`state_machine::MarketMachine`]: applies each committed batch of
//!   journal entries with `MarketState::apply`, in log order, exactly as
//!   the single-node exchange and `gpux-audit` do; snapshots are the
//!   market's bytes (as the exchange's own snapshots), kept on redb; with a
//!   journal sink it also writes every applied batch into the node's own
//!   journal, once.
//!
//! A log entry is a [`Batch`]: the journal entries one sequencer batch
//! committed (the leader's sequencer proposes them; followers apply them).
//! - [`network`]: Raft between nodes over TCP, length-prefixed bincode,
//!   admitted by the cluster's token.
//! - [`journal::ReplicatedJournal`]: the journal a leader's sequencer
//!   writes through Raft (an append returns once committed on a majority
//!   and in this node's journal).
//! - [`admin`]: the operator's calls (`gpux-exchange cluster ...`) on the
//!   Raft port.
//!
//! `gpux-exchange --node-id` runs a node (exchange/src/cluster.rs).

// openraft's traits return its `StorageError` (over 200 bytes); the
// helpers that build one return it as the traits do.
#![allow(clippy::result_large_err)]

use std::io::Cursor;

use gpux_market::JournalEntry;
use serde::{Deserialize, Serialize};

pub mod admin;
pub mod journal;
pub mod log_store;
pub mod network;
pub mod state_machine;

/// The journal entries one sequencer batch committed: one Raft log entry.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Batch {
    pub entries: Vec<JournalEntry>,
}

/// What applying a batch did, as the leader answers its proposer.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct BatchOutcome {
    /// Entries the market applied.
    pub applied: u32,
    /// Entries it refused, by position in the batch, with why (the
    /// sequencer checks entries before proposing, so none is expected).
    pub refused: Vec<(u32, String)>,
    /// The journal sequence number the batch's first entry got on the
    /// node that applied it (its proposer checks it is the one it expected).
    pub first_seq: u64,
}

openraft::declare_raft_types!(
    /// The Raft types of the replicated market.
    pub TypeConfig:
        D = Batch,
        R = BatchOutcome,
        Node = openraft::BasicNode,
        SnapshotData = Cursor<Vec<u8>>,
);

pub type NodeId = u64;
pub type LogId = openraft::LogId<NodeId>;
pub type StorageError = openraft::StorageError<NodeId>;
pub type Raft = openraft::Raft<TypeConfig>;

/// bincode (the records' standard configuration) for what the replica
/// stores: log entries, votes, snapshots.
pub(crate) fn encode<T: Serialize>(value: &T) -> Result<Vec<u8>, bincode::error::EncodeError> {
    bincode::serde::encode_to_vec(value, bincode::config::standard())
}

/// The largest stored value the replica decodes (a snapshot of a big
/// market is the largest).
const STORED_BYTES_MAX: usize = 1 << 32;

pub(crate) fn decode<T: serde::de::DeserializeOwned>(bytes: &[u8]) -> Result<T, bincode::error::DecodeError> {
    let config = bincode::config::standard().with_limit::<STORED_BYTES_MAX>();
    bincode::serde::decode_from_slice(bytes, config).map(|(value, _)| value)
}
