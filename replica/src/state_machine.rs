//! The replicated state machine: `gpux-market` applying committed batches
//! in log order (the one apply path the single-node exchange, the
//! simulator and `gpux-audit` share), and its snapshots.
//!
//! A snapshot is the market's bytes (bincode, as the exchange's own
//! snapshots) with the Raft log id and membership it includes; the current
//! one is kept in a redb table (`raft_snapshot`) so a restarted node starts
//! from it, and Raft replays the committed log after it. The market and its
//! `last_applied` are read under one lock, so a snapshot's bytes never run
//! ahead of its `last_log_id`.

use std::io::Cursor;
use std::path::Path;
use std::sync::{Arc, Mutex};

use gpux_engine::EngineConfig;
use gpux_market::MarketState;
use openraft::storage::{RaftStateMachine, Snapshot, SnapshotMeta};
use openraft::{AnyError, BasicNode, Entry, EntryPayload, ErrorSubject, ErrorVerb, RaftSnapshotBuilder, StorageIOError, StoredMembership};
use redb::{Database, Durability, ReadableDatabase, TableDefinition};
use serde::{Deserialize, Serialize};

use crate::network::TcpNetwork;
use crate::{decode, encode, BatchOutcome, LogId, NodeId, StorageError, TypeConfig};

const SNAPSHOT: TableDefinition<&str, &[u8]> = TableDefinition::new("raft_snapshot");
const CURRENT: &str = "current";

fn io(verb: ErrorVerb, error: impl std::fmt::Display) -> StorageError {
    StorageIOError::new(ErrorSubject::StateMachine, verb, AnyError::error(error.to_string())).into()
}

/// What the machine holds: the market, and how far into the log it is.
struct Applied {
    market: MarketState,
    last_applied: Option<LogId>,
    membership: StoredMembership<NodeId, BasicNode>,
    /// The node's journal sequence after the last applied log entry.
    journal_next: u64,
}

/// A snapshot as stored.
#[derive(Serialize, Deserialize)]
struct Stored {
    meta: SnapshotMeta<NodeId, BasicNode>,
    data: Vec<u8>,
    /// The journal sequence after the entries the snapshot includes.
    journal_next: u64,
}

/// Where a node writes the journal entries it applies, with their ledger
/// transfers and what they archived: its own journal, so statements,
/// history and a restart's recovery read the same journal on every node.
pub type JournalSink = Arc<Mutex<Box<dyn gpux_journal::JournalStore>>>;

/// The market as a Raft state machine (cheap to clone: state is shared, so
/// the node keeps a handle to read the market while Raft owns the machine).
#[derive(Clone)]
pub struct MarketMachine {
    applied: Arc<Mutex<Applied>>,
    db: Arc<Database>,
    journal: Option<JournalSink>,
    /// How a node that keeps a journal reaches its peers' journals (a
    /// snapshot it takes is filled from them).
    peers: Option<TcpNetwork>,
}

impl MarketMachine {
    /// Opens the machine's snapshot store at `path` and starts from its
    /// current snapshot, or from an empty market under `listing`.
    pub fn open(path: &Path, listing: EngineConfig) -> anyhow::Result<MarketMachine> {
        let db = Database::create(path)?;
        let write = db.begin_write()?;
        write.open_table(SNAPSHOT)?;
        write.commit()?;
        let stored = {
            let read = db.begin_read()?;
            let table = read.open_table(SNAPSHOT)?;
            let bytes = table.get(CURRENT)?.map(|b| b.value().to_vec());
            bytes.map(|bytes| decode::<Stored>(&bytes)).transpose()?
        };
        let applied = match stored {
            Some(stored) => Applied {
                market: decode(&stored.data)?,
                last_applied: stored.meta.last_log_id,
                membership: stored.meta.last_membership,
                journal_next: stored.journal_next,
            },
            None => Applied {
                market: MarketState::new(listing)?,
                last_applied: None,
                membership: StoredMembership::default(),
                // A journal's first entry is number 1.
                journal_next: 1,
            },
        };
        Ok(MarketMachine { applied: Arc::new(Mutex::new(applied)), db: Arc::new(db), journal: None, peers: None })
    }

    /// Also writes every applied batch into `journal` (entries, transfers,
    /// archive), exactly once: a batch re-applied after a restart, which
    /// the journal already holds, is not written again. The journal must
    /// start where the machine does (empty for a new node). A snapshot sent
    /// by the leader (the log it needed was purged: a new or long-absent
    /// node) is filled first: the entries it covers are copied from a
    /// peer's journal through `peers` (see [`MarketMachine::with_peers`]).
    /// The journal may commit lazily (`Journal::durable_every`): a snapshot
    /// syncs it before it is stored, so a restart from the snapshot finds
    /// every entry it will not apply again, and writes again from the log
    /// the batches a crash took from the journal; Raft purges only log
    /// entries a snapshot covers.
    pub fn with_journal(mut self, journal: JournalSink) -> MarketMachine {
        self.journal = Some(journal);
        self
    }

    /// Copies the journal entries a snapshot it installs covers from the
    /// peers' journals (the cluster's network, as this node).
    pub fn with_peers(mut self, peers: TcpNetwork) -> MarketMachine {
        self.peers = Some(peers);
        self
    }

    /// The node's journal sequence after the last applied batch.
    pub fn journal_next(&self) -> u64 {
        self.applied.lock().expect("the machine's lock").journal_next
    }

    /// Reads the market as applied so far.
    pub fn read<T>(&self, read: impl FnOnce(&MarketState) -> T) -> T {
        read(&self.applied.lock().expect("the machine's lock").market)
    }

    /// A copy of the market as applied so far, with the journal sequence
    /// after it (read together: a sequencer recovers from them).
    pub fn market_and_journal_next(&self) -> (MarketState, u64) {
        let applied = self.applied.lock().expect("the machine's lock");
        (applied.market.clone(), applied.journal_next)
    }

    /// The last log id applied.
    pub fn last_applied(&self) -> Option<LogId> {
        self.applied.lock().expect("the machine's lock").last_applied
    }

    fn store(&self, stored: &Stored) -> Result<(), StorageError> {
        let bytes = encode(stored).map_err(|e| io(ErrorVerb::Write, e))?;
        let mut write = self.db.begin_write().map_err(|e| io(ErrorVerb::Write, e))?;
        write.set_durability(Durability::Immediate).map_err(|e| io(ErrorVerb::Write, e))?;
        write
            .open_table(SNAPSHOT)
            .map_err(|e| io(ErrorVerb::Write, e))?
            .insert(CURRENT, bytes.as_slice())
            .map_err(|e| io(ErrorVerb::Write, e))?;
        write.commit().map_err(|e| io(ErrorVerb::Write, e))
    }

    fn stored(&self) -> Result<Option<Stored>, StorageError> {
        let read = self.db.begin_read().map_err(|e| io(ErrorVerb::Read, e))?;
        let table = read.open_table(SNAPSHOT).map_err(|e| io(ErrorVerb::Read, e))?;
        match table.get(CURRENT).map_err(|e| io(ErrorVerb::Read, e))? {
            Some(bytes) => Ok(Some(decode(bytes.value()).map_err(|e| io(ErrorVerb::Read, e))?)),
            None => Ok(None),
        }
    }
}

impl RaftSnapshotBuilder<TypeConfig> for MarketMachine {
    async fn build_snapshot(&mut self) -> Result<Snapshot<TypeConfig>, StorageError> {
        let (data, last_log_id, last_membership, journal_next) = {
            let applied = self.applied.lock().expect("the machine's lock");
            let data = encode(&applied.market).map_err(|e| io(ErrorVerb::Read, e))?;
            (data, applied.last_applied, applied.membership.clone(), applied.journal_next)
        };
        // The journal must hold, durably, everything a restart from this
        // snapshot will not apply again (it may commit lazily: a cluster
        // node's journal is a copy of the Raft log).
        if let Some(journal) = &self.journal {
            journal.lock().expect("the journal's lock").sync().map_err(|e| io(ErrorVerb::Write, e))?;
        }
        let snapshot_id = last_log_id.map_or_else(|| "empty".to_string(), |id| format!("{}-{}", id.leader_id, id.index));
        let meta = SnapshotMeta { last_log_id, last_membership, snapshot_id };
        let stored = Stored { meta: meta.clone(), data, journal_next };
        self.store(&stored)?;
        Ok(Snapshot { meta, snapshot: Box::new(Cursor::new(sent(stored.journal_next, &stored.data))) })
    }
}

impl RaftStateMachine<TypeConfig> for MarketMachine {
    type SnapshotBuilder = MarketMachine;

    async fn applied_state(&mut self) -> Result<(Option<LogId>, StoredMembership<NodeId, BasicNode>), StorageError> {
        let applied = self.applied.lock().expect("the machine's lock");
        Ok((applied.last_applied, applied.membership.clone()))
    }

    async fn apply<I>(&mut self, entries: I) -> Result<Vec<BatchOutcome>, StorageError>
    where
        I: IntoIterator<Item = Entry<TypeConfig>> + Send,
        I::IntoIter: Send,
    {
        let mut applied = self.applied.lock().expect("the machine's lock");
        let mut outcomes = Vec::new();
        for entry in entries {
            applied.last_applied = Some(entry.log_id);
            let mut outcome = BatchOutcome::default();
            match entry.payload {
                EntryPayload::Blank => {}
                EntryPayload::Normal(batch) => {
                    outcome.first_seq = applied.journal_next;
                    let mut transfers = Vec::new();
                    let mut archived = gpux_market::Archived::default();
                    for (position, journal_entry) in batch.entries.iter().enumerate() {
                        match applied.market.apply(journal_entry) {
                            Ok(mut done) => {
                                outcome.applied += 1;
                                transfers.append(&mut done.transfers);
                                archived.append(&mut done.archived);
                            }
                            Err(refused) => outcome.refused.push((position as u32, refused.to_string())),
                        }
                    }
                    if let Some(journal) = &self.journal {
                        let mut journal = journal.lock().expect("the journal's lock");
                        let written = journal.next_seq();
                        let end = applied.journal_next + batch.entries.len() as u64;
                        if written == applied.journal_next {
                            journal
                                .append_with_transfers(&batch.entries, &transfers, &archived)
                                .map_err(|e| StorageIOError::apply(entry.log_id, AnyError::error(e.to_string())))?;
                        } else if written < end {
                            // Neither where this batch starts nor past it:
                            // not this machine's journal.
                            let error = format!("the journal is at {written}, the batch spans {}..{end}", applied.journal_next);
                            return Err(StorageIOError::apply(entry.log_id, AnyError::error(error)).into());
                        }
                        // Otherwise it was written before a restart: applied again, not written.
                    }
                    applied.journal_next += batch.entries.len() as u64;
                }
                EntryPayload::Membership(membership) => applied.membership = StoredMembership::new(Some(entry.log_id), membership),
            }
            // One outcome per entry, Blank and Membership ones included.
            outcomes.push(outcome);
        }
        Ok(outcomes)
    }

    async fn get_snapshot_builder(&mut self) -> Self::SnapshotBuilder {
        self.clone()
    }

    async fn begin_receiving_snapshot(&mut self) -> Result<Box<Cursor<Vec<u8>>>, StorageError> {
        Ok(Box::new(Cursor::new(Vec::new())))
    }

    async fn install_snapshot(
        &mut self,
        meta: &SnapshotMeta<NodeId, BasicNode>,
        snapshot: Box<Cursor<Vec<u8>>>,
    ) -> Result<(), StorageError> {
        let (journal_next, data) = received(snapshot.into_inner()).map_err(|e| io(ErrorVerb::Read, e))?;
        let market: MarketState = decode(&data).map_err(|e| io(ErrorVerb::Read, e))?;
        // A node that keeps a journal copies the entries the snapshot
        // covers and it lacks from a peer's journal first.
        if self.journal.is_some() {
            let (local, local_next) = self.market_and_journal_next();
            if local_next < journal_next {
                let peers: Vec<String> = meta
                    .last_membership
                    .membership()
                    .nodes()
                    .filter(|(id, _)| Some(**id) != self.peers.as_ref().map(TcpNetwork::id))
                    .map(|(_, node)| node.addr.clone())
                    .collect();
                self.fill_journal(local, local_next, journal_next, &peers, market.state_hash()).await?;
            }
        }
        let mut applied = self.applied.lock().expect("the machine's lock");
        self.store(&Stored { meta: meta.clone(), data, journal_next })?;
        applied.market = market;
        applied.last_applied = meta.last_log_id;
        applied.membership = meta.last_membership.clone();
        applied.journal_next = journal_next;
        Ok(())
    }

    async fn get_current_snapshot(&mut self) -> Result<Option<Snapshot<TypeConfig>>, StorageError> {
        Ok(self
            .stored()?
            .map(|stored| Snapshot { meta: stored.meta, snapshot: Box::new(Cursor::new(sent(stored.journal_next, &stored.data))) }))
    }
}

/// Applies `entries` (from `next` on) to `market` and writes those the
/// journal does not hold yet, with the transfers and archive they caused;
/// returns the sequence after them.
fn write_filled(
    journal: &JournalSink,
    market: &mut MarketState,
    next: u64,
    entries: &[gpux_market::JournalEntry],
) -> Result<u64, StorageError> {
    let mut journal = journal.lock().expect("the journal's lock");
    let written = journal.next_seq();
    if written < next {
        return Err(io(ErrorVerb::Write, format!("the journal is at {written}, the machine at {next}")));
    }
    let (mut transfers, mut archived) = (Vec::new(), gpux_market::Archived::default());
    for (seq, entry) in (next..).zip(entries) {
        if let Ok(mut done) = market.apply(entry) {
            if seq >= written {
                transfers.append(&mut done.transfers);
                archived.append(&mut done.archived);
            }
        }
    }
    let end = next + entries.len() as u64;
    if written < end {
        let fresh = &entries[(written - next) as usize..];
        journal.append_with_transfers(fresh, &transfers, &archived).map_err(|e| io(ErrorVerb::Write, e))?;
    }
    Ok(end)
}

/// A snapshot as sent to a peer: the journal sequence after it (8 bytes,
/// little-endian), then the market's bytes.
fn sent(journal_next: u64, market: &[u8]) -> Vec<u8> {
    let mut bytes = Vec::with_capacity(8 + market.len());
    bytes.extend_from_slice(&journal_next.to_le_bytes());
    bytes.extend_from_slice(market);
    bytes
}

fn received(mut bytes: Vec<u8>) -> Result<(u64, Vec<u8>), String> {
    if bytes.len() < 8 {
        return Err(format!("a snapshot of {} bytes (it starts with 8 of journal sequence)", bytes.len()));
    }
    let market = bytes.split_off(8);
    let journal_next = u64::from_le_bytes(bytes.try_into().expect("8 bytes"));
    Ok((journal_next, market))
}

/// How long a node that took a snapshot tries its peers for the journal
/// entries it lacks before it gives up (its Raft then stops: the
/// operator's log says why).
pub const JOURNAL_FILL_PATIENCE: std::time::Duration = std::time::Duration::from_secs(120);

impl MarketMachine {
    /// Copies journal entries `next..target` from the first of `peers`
    /// that has them, applying each to `market` (the node's own state at
    /// `next`) so the transfers and archive written with them are this
    /// node's own, as if it had applied them from the log; the market must
    /// then hash to `expected` (the snapshot's). Entries the journal
    /// already holds (written before a crash) are applied, not written
    /// again. Ends with the journal durable.
    async fn fill_journal(
        &self,
        mut market: MarketState,
        mut next: u64,
        target: u64,
        peers: &[String],
        expected: u64,
    ) -> Result<(), StorageError> {
        let (Some(journal), Some(network)) = (self.journal.clone(), self.peers.clone()) else {
            return Err(io(ErrorVerb::Write, "a snapshot for a node that keeps a journal and has no peers to copy it from"));
        };
        let deadline = tokio::time::Instant::now() + JOURNAL_FILL_PATIENCE;
        let mut peer = 0;
        let mut failures = 0;
        tracing::info!(from = next, to = target, "copying the journal entries a snapshot covers from a peer");
        while next < target {
            let wanted = (target - next).min(u64::from(crate::network::JOURNAL_CALL_ENTRIES_MAX)) as u32;
            let addr = peers.get(peer % peers.len().max(1)).cloned().unwrap_or_default();
            let entries = match network.journal_entries(&addr, next - 1, wanted).await {
                Ok(entries) if !entries.is_empty() => entries,
                answered => {
                    // This peer cannot give them (down, or its journal is
                    // not that far yet): the next one, a pause after each round.
                    tracing::warn!(peer = %addr, from = next, outcome = ?answered.map(|e| e.len()), "no journal entries from this peer");
                    peer += 1;
                    failures += 1;
                    if tokio::time::Instant::now() >= deadline {
                        return Err(io(
                            ErrorVerb::Read,
                            format!("no peer gave journal entries {next}..{target} within {JOURNAL_FILL_PATIENCE:?}"),
                        ));
                    }
                    if failures % peers.len().max(1) == 0 {
                        tokio::time::sleep(std::time::Duration::from_secs(1)).await;
                    }
                    continue;
                }
            };
            let entries = &entries[..entries.len().min((target - next) as usize)];
            next = write_filled(&journal, &mut market, next, entries)?;
        }
        journal.lock().expect("the journal's lock").sync().map_err(|e| io(ErrorVerb::Write, e))?;
        if market.state_hash() != expected {
            return Err(io(ErrorVerb::Read, "the journal copied from a peer does not lead to the snapshot's market"));
        }
        tracing::info!(to = target, "the journal holds every entry the snapshot covers");
        Ok(())
    }
}

/// A Raft config for nodes that keep a journal: an operator's `Join`
/// returns once the learner is added, however far behind it is (it
/// catches up as a voter: from entries, or from a snapshot and its peers'
/// journals where the log it needs was purged).
pub fn journal_config(mut config: openraft::Config) -> openraft::Config {
    config.replication_lag_threshold = 1 << 48;
    config
}
