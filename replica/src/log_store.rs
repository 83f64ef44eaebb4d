//! The Raft log on redb: `raft_log` (index -> bincode entry) and
//! `raft_meta` (vote, committed log id, last purged log id). Every write is
//! one redb write transaction, durable when `commit` returns; `append`
//! reports the entries flushed to Raft only after that. The log never has
//! holes: `truncate` removes a suffix, `purge` a prefix (recording how far
//! it purged in the same transaction).
//!
//! redb's calls block; they are short (one batch, one vote) and run on the
//! Raft task that asked for them.

use std::fmt::Debug;
use std::ops::RangeBounds;
use std::path::Path;
use std::sync::Arc;

use openraft::storage::{LogFlushed, LogState, RaftLogStorage};
use openraft::{AnyError, Entry, ErrorSubject, ErrorVerb, RaftLogReader, StorageIOError, Vote};
use redb::{Database, Durability, ReadableDatabase, ReadableTable, TableDefinition};

use crate::{decode, encode, LogId, NodeId, StorageError, TypeConfig};

const LOG: TableDefinition<u64, &[u8]> = TableDefinition::new("raft_log");
const META: TableDefinition<&str, &[u8]> = TableDefinition::new("raft_meta");

const VOTE: &str = "vote";
const COMMITTED: &str = "committed";
const LAST_PURGED: &str = "last_purged";

fn io(subject: ErrorSubject<NodeId>, verb: ErrorVerb, error: impl std::fmt::Display) -> StorageError {
    StorageIOError::new(subject, verb, AnyError::error(error.to_string())).into()
}

fn read_logs(error: impl std::fmt::Display) -> StorageError {
    io(ErrorSubject::Logs, ErrorVerb::Read, error)
}

fn write_logs(error: impl std::fmt::Display) -> StorageError {
    io(ErrorSubject::Logs, ErrorVerb::Write, error)
}

/// The Raft log of one node (cheap to clone: the database is shared).
#[derive(Clone)]
pub struct LogStore {
    db: Arc<Database>,
}

impl LogStore {
    /// Opens (or makes) the log at `path`.
    pub fn open(path: &Path) -> Result<LogStore, redb::Error> {
        let db = Database::create(path)?;
        let write = db.begin_write()?;
        write.open_table(LOG)?;
        write.open_table(META)?;
        write.commit()?;
        Ok(LogStore { db: Arc::new(db) })
    }

    fn read_meta<T: serde::de::DeserializeOwned>(&self, key: &str) -> Result<Option<T>, StorageError> {
        let read = self.db.begin_read().map_err(read_logs)?;
        let table = read.open_table(META).map_err(read_logs)?;
        match table.get(key).map_err(read_logs)? {
            Some(bytes) => Ok(Some(decode(bytes.value()).map_err(read_logs)?)),
            None => Ok(None),
        }
    }

    fn write_meta<T: serde::Serialize>(&self, key: &str, value: &T, subject: ErrorSubject<NodeId>) -> Result<(), StorageError> {
        let fail = |e: &dyn std::fmt::Display| io(subject.clone(), ErrorVerb::Write, e);
        let bytes = encode(value).map_err(|e| fail(&e))?;
        let write = self.db.begin_write().map_err(|e| fail(&e))?;
        write.open_table(META).map_err(|e| fail(&e))?.insert(key, bytes.as_slice()).map_err(|e| fail(&e))?;
        write.commit().map_err(|e| fail(&e))
    }

    /// The entries in `range` (those present), in index order.
    fn entries<RB: RangeBounds<u64>>(&self, range: RB) -> Result<Vec<Entry<TypeConfig>>, StorageError> {
        let read = self.db.begin_read().map_err(read_logs)?;
        let table = read.open_table(LOG).map_err(read_logs)?;
        let mut entries = Vec::new();
        for item in table.range(range).map_err(read_logs)? {
            let (_, bytes) = item.map_err(read_logs)?;
            entries.push(decode(bytes.value()).map_err(read_logs)?);
        }
        Ok(entries)
    }
}

impl RaftLogReader<TypeConfig> for LogStore {
    async fn try_get_log_entries<RB: RangeBounds<u64> + Clone + Debug + Send>(
        &mut self,
        range: RB,
    ) -> Result<Vec<Entry<TypeConfig>>, StorageError> {
        self.entries(range)
    }
}

impl RaftLogStorage<TypeConfig> for LogStore {
    type LogReader = LogStore;

    async fn get_log_state(&mut self) -> Result<LogState<TypeConfig>, StorageError> {
        let last_purged_log_id: Option<LogId> = self.read_meta(LAST_PURGED)?;
        let read = self.db.begin_read().map_err(read_logs)?;
        let table = read.open_table(LOG).map_err(read_logs)?;
        let last = match table.last().map_err(read_logs)? {
            Some((_, bytes)) => Some(decode::<Entry<TypeConfig>>(bytes.value()).map_err(read_logs)?.log_id),
            None => last_purged_log_id,
        };
        Ok(LogState { last_purged_log_id, last_log_id: last })
    }

    async fn get_log_reader(&mut self) -> Self::LogReader {
        self.clone()
    }

    async fn save_vote(&mut self, vote: &Vote<NodeId>) -> Result<(), StorageError> {
        self.write_meta(VOTE, vote, ErrorSubject::Vote)
    }

    async fn read_vote(&mut self) -> Result<Option<Vote<NodeId>>, StorageError> {
        self.read_meta(VOTE)
    }

    async fn save_committed(&mut self, committed: Option<LogId>) -> Result<(), StorageError> {
        self.write_meta(COMMITTED, &committed, ErrorSubject::Store)
    }

    async fn read_committed(&mut self) -> Result<Option<LogId>, StorageError> {
        Ok(self.read_meta::<Option<LogId>>(COMMITTED)?.flatten())
    }

    async fn append<I>(&mut self, entries: I, callback: LogFlushed<TypeConfig>) -> Result<(), StorageError>
    where
        I: IntoIterator<Item = Entry<TypeConfig>> + Send,
        I::IntoIter: Send,
    {
        let mut write = self.db.begin_write().map_err(write_logs)?;
        write.set_durability(Durability::Immediate).map_err(write_logs)?;
        {
            let mut table = write.open_table(LOG).map_err(write_logs)?;
            for entry in entries {
                let bytes = encode(&entry).map_err(write_logs)?;
                table.insert(entry.log_id.index, bytes.as_slice()).map_err(write_logs)?;
            }
        }
        // Durable once committed (redb's default durability): only then is
        // Raft told the entries are flushed, so a leader never counts an
        // acknowledgement the disk does not hold.
        let committed = write.commit().map_err(write_logs);
        match committed {
            Ok(()) => {
                callback.log_io_completed(Ok(()));
                Ok(())
            }
            Err(error) => {
                callback.log_io_completed(Err(std::io::Error::other(error.to_string())));
                Err(error)
            }
        }
    }

    async fn truncate(&mut self, log_id: LogId) -> Result<(), StorageError> {
        let write = self.db.begin_write().map_err(write_logs)?;
        write.open_table(LOG).map_err(write_logs)?.retain_in(log_id.index.., |_, _| false).map_err(write_logs)?;
        write.commit().map_err(write_logs)
    }

    async fn purge(&mut self, log_id: LogId) -> Result<(), StorageError> {
        let bytes = encode(&log_id).map_err(write_logs)?;
        let write = self.db.begin_write().map_err(write_logs)?;
        write.open_table(META).map_err(write_logs)?.insert(LAST_PURGED, bytes.as_slice()).map_err(write_logs)?;
        write.open_table(LOG).map_err(write_logs)?.retain_in(..=log_id.index, |_, _| false).map_err(write_logs)?;
        write.commit().map_err(write_logs)
    }
}
