//! What the replica tests share: batches of real journal entries, loopback
//! listeners for a cluster, and finding the leader.

#![allow(dead_code)]

use std::collections::BTreeMap;
use std::time::Duration;

use gpux_engine::{AccountId, Command, Input, Role};
use gpux_market::JournalEntry;
use gpux_replica::{Batch, NodeId, Raft};
use openraft::BasicNode;

/// A batch: an account opened and funded (the amount differs per account,
/// so every batch changes the state hash).
pub fn batch(account: u32) -> Batch {
    Batch {
        entries: vec![
            JournalEntry::Engine(Input { at_ms: 1_800_000_000_000, command: Command::OpenAccount { role: Role::Renter } }),
            JournalEntry::Engine(Input {
                at_ms: 1_800_000_000_000,
                command: Command::Deposit { account: AccountId(account), amount_minor: 5_000 + account as u64 },
            }),
        ],
    }
}

/// A loopback listener for each of `count` nodes (ids from 1), and the
/// membership naming their addresses.
pub async fn listeners(count: u64) -> (BTreeMap<NodeId, BasicNode>, BTreeMap<NodeId, tokio::net::TcpListener>) {
    let mut members = BTreeMap::new();
    let mut listeners = BTreeMap::new();
    for id in 1..=count {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("binds");
        members.insert(id, BasicNode::new(listener.local_addr().expect("addr").to_string()));
        listeners.insert(id, listener);
    }
    (members, listeners)
}

/// The node that is leader now (waiting up to 10 s for one).
pub async fn leader<'a>(rafts: impl Iterator<Item = &'a Raft> + Clone) -> NodeId {
    for _ in 0..200 {
        let found = rafts.clone().find_map(|raft| {
            let metrics = raft.metrics().borrow().clone();
            metrics.state.is_leader().then_some(metrics.id)
        });
        if let Some(id) = found {
            return id;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("no leader within 10 s");
}
