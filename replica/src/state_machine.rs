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
        Ok(MarketMachine { applied: Arc::new(Mutex::new(applied)), db: Arc::new(db), journal: None })
    }

    /// Also writes every applied batch into `journal` (entries, transfers,
    /// archive), exactly once: a batch re-applied after a restart, which
    /// the journal already holds, is not written again. The journal must
    /// start where the machine does (empty for a new node), and Raft must
    /// then never purge the log nor send this node a snapshot instead of
    /// entries (it would leave a hole in the journal): see [`journal_config`].
    /// The journal may commit lazily (`Journal::durable_every`): a snapshot
    /// syncs it before it is stored, so a restart from the snapshot finds
    /// every entry it will not apply again, and writes again from the log
    /// the batches a crash took from the journal.
    pub fn with_journal(mut self, journal: JournalSink) -> MarketMachine {
        self.journal = Some(journal);
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
        Ok(Snapshot { meta, snapshot: Box::new(Cursor::new(stored.data)) })
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
        // A node that keeps a journal takes entries, never a snapshot (its
        // journal would miss what the snapshot covers): `journal_config`
        // keeps Raft from sending one; should one come, it is refused.
        if self.journal.is_some() {
            return Err(io(ErrorVerb::Write, "a snapshot for a node that keeps a journal (it takes entries only)"));
        }
        let data = snapshot.into_inner();
        let market: MarketState = decode(&data).map_err(|e| io(ErrorVerb::Read, e))?;
        let mut applied = self.applied.lock().expect("the machine's lock");
        self.store(&Stored { meta: meta.clone(), data, journal_next: applied.journal_next })?;
        applied.market = market;
        applied.last_applied = meta.last_log_id;
        applied.membership = meta.last_membership.clone();
        Ok(())
    }

    async fn get_current_snapshot(&mut self) -> Result<Option<Snapshot<TypeConfig>>, StorageError> {
        Ok(self.stored()?.map(|stored| Snapshot { meta: stored.meta, snapshot: Box::new(Cursor::new(stored.data)) }))
    }
}

/// A Raft config for nodes that keep a journal: the log is never purged,
/// and a lagging node is always sent entries, never a snapshot (every
/// node's journal holds every entry); snapshots still speed up restarts.
pub fn journal_config(mut config: openraft::Config) -> openraft::Config {
    config.max_in_snapshot_log_to_keep = 1 << 48;
    config.replication_lag_threshold = 1 << 48;
    config
}
