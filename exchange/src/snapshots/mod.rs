//! State snapshots, so a restart replays only the journal's tail.
//!
//! A snapshot is the whole market state (`gpux_market::MarketState`), taken
//! between batches and tagged with the last journal entry it includes. Each
//! is stored with a checksum of its bytes and the market's state hash
//! (computed on the writer thread); a snapshot that fails either check
//! is skipped for an older one, and with none left the journal is replayed
//! from the start. Snapshots live in their own redb file so that writing one
//! never holds up a journal commit.
//!
//! A snapshot never takes the journal's room (docs/operations.md "Disk
//! space"): it is written only when the data directory's file system keeps
//! [`SnapshotGuard::reserve_bytes`] free after twice its size (redb copies
//! on write), else skipped with a warning, counted and tried again a
//! minute later. A write that fails closes the store (redb refuses every
//! write after an I/O error until it is reopened) and the next try, which
//! reopens it, waits 1 s, doubling to 5 min while writes keep failing.

#[cfg(test)]
mod tests;
mod writer;

pub use writer::{SnapshotCounters, SnapshotGuard, SnapshotWriter};

use std::path::{Path, PathBuf};
use std::sync::Mutex;

use anyhow::{Context, Result};
use gpux_engine::state_hash::StateHasher;
use gpux_market::MarketState;
use gpux_protocol::{decode_snapshot, encode_record};
use redb::{Database, Durability, ReadableDatabase, ReadableTable, TableDefinition};
use serde::{Deserialize, Serialize};

const SNAPSHOTS: TableDefinition<u64, &[u8]> = TableDefinition::new("snapshots");
/// Journal entries between two periodic snapshots.
pub const SNAPSHOT_EVERY_ENTRIES: u64 = 100_000;
pub use crate::limits::SNAPSHOTS_KEPT;
pub use crate::limits::SNAPSHOT_RESERVE_BYTES;

/// The layout of a stored snapshot's record: the bincode encoding of
/// [`Snapshot`], so of every type in `MarketState`. Raise it with any change
/// to those types' encoding: a snapshot of another format is skipped (the
/// journal rebuilds the same state), never decoded as this one. 1 was the
/// unversioned layout before 2026-12-06, which carried no format field; 3
/// added the jobs' preemption notices and cluster members' exits, 4 their
/// recovery (restarts, books, held exits, preemptions ahead), 5 the share
/// rules and hosts by owner, and jobs by participant (2026-12-07), 6 services, 7
/// volumes, 8 every lease of a service kept (its bill) and replicas noticed
/// of a preemption, 9 services' floors and volumes carried to a re-match.
pub const SNAPSHOT_FORMAT: u32 = 9;

/// The market as of a journal entry.
#[derive(Clone, Serialize, Deserialize)]
pub struct Snapshot {
    /// The last journal entry the snapshot includes.
    pub journal_seq: u64,
    /// Everything the journal rebuilds (workload secrets stay sealed in it).
    pub market: MarketState,
}

pub struct SnapshotStore {
    path: PathBuf,
    /// Opens the database (on the file, or on a test's backend).
    opener: Box<dyn Fn() -> Result<Database> + Send + Sync>,
    /// `None` after a failed write: the next one opens it again.
    db: Mutex<Option<Database>>,
    /// Journal entries between two periodic snapshots.
    every: u64,
}

fn checksum(bytes: &[u8]) -> u64 {
    let mut hasher = StateHasher::new();
    hasher.bytes(bytes);
    hasher.finish()
}

impl SnapshotStore {
    pub fn open(path: &Path) -> Result<Self> {
        let file = path.to_path_buf();
        Self::open_with(path, move || Database::create(&file).with_context(|| format!("opening snapshots {}", file.display())))
    }

    /// Opens the store with `opener`, and again with it after a failed
    /// write (tests open it on a backend that injects faults); `path` is
    /// where its file lives (free space is measured there).
    pub fn open_with(path: &Path, opener: impl Fn() -> Result<Database> + Send + Sync + 'static) -> Result<Self> {
        let store =
            SnapshotStore { path: path.to_path_buf(), opener: Box::new(opener), db: Mutex::new(None), every: SNAPSHOT_EVERY_ENTRIES };
        drop(store.db()?);
        Ok(store)
    }

    /// Snapshots every `every` journal entries instead (tests).
    pub fn with_every(self, every: u64) -> Self {
        SnapshotStore { every, ..self }
    }

    fn open_db(&self) -> Result<Database> {
        let db = (self.opener)()?;
        let setup = db.begin_write()?;
        setup.open_table(SNAPSHOTS)?;
        setup.commit()?;
        Ok(db)
    }

    /// The open database, opened again after a failed write.
    fn db(&self) -> Result<std::sync::MutexGuard<'_, Option<Database>>> {
        let mut db = self.db.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        if db.is_none() {
            *db = Some(self.open_db()?);
            tracing::info!(path = %self.path.display(), "snapshot store reopened");
        }
        Ok(db)
    }

    /// Stores a snapshot durably and prunes the oldest beyond `SNAPSHOTS_KEPT`.
    /// Stored as `checksum (8 bytes LE) | format (4 bytes LE) | state hash
    /// (8 bytes LE) | record`; the checksum covers the rest.
    pub fn write(&self, snapshot: &Snapshot) -> Result<()> {
        self.put_raw(snapshot.journal_seq, &stored_bytes(snapshot))
    }

    /// Stores bytes as the snapshot at `journal_seq` (tests use it to plant
    /// corruption). A failure closes the database: the next write opens it
    /// again.
    pub fn put_raw(&self, journal_seq: u64, value: &[u8]) -> Result<()> {
        let mut guard = self.db()?;
        let result = Self::put_in(guard.as_ref().expect("opened"), journal_seq, value);
        if result.is_err() {
            *guard = None;
        }
        result
    }

    fn put_in(db: &Database, journal_seq: u64, value: &[u8]) -> Result<()> {
        let mut transaction = db.begin_write()?;
        transaction.set_durability(Durability::Immediate)?;
        {
            let mut table = transaction.open_table(SNAPSHOTS)?;
            table.insert(journal_seq, value)?;
            let keys: Vec<u64> = table.iter()?.map(|row| row.map(|(key, _)| key.value())).collect::<Result<_, _>>()?;
            for old in keys.iter().rev().skip(SNAPSHOTS_KEPT) {
                table.remove(old)?;
            }
        }
        transaction.commit()?;
        Ok(())
    }

    /// The newest snapshot whose checksum and state hash both verify.
    pub fn latest_valid(&self) -> Result<Option<Snapshot>> {
        let guard = self.db()?;
        let read = guard.as_ref().expect("opened").begin_read()?;
        let table = read.open_table(SNAPSHOTS)?;
        for row in table.iter()?.rev() {
            let (key, value) = row?;
            match verify(value.value()) {
                Ok(snapshot) => return Ok(Some(snapshot)),
                Err(reason) => tracing::warn!(journal_seq = key.value(), %reason, "skipping an unusable snapshot"),
            }
        }
        Ok(None)
    }
}

/// Where snapshots are kept: the redb file ([`SnapshotStore`]) in the
/// exchange, memory ([`MemorySnapshots`]) in tests of the sequencer.
pub trait SnapshotStorage: Send + 'static {
    /// Stores a snapshot durably.
    fn write(&self, snapshot: &Snapshot) -> Result<()> {
        self.put(snapshot.journal_seq, &stored_bytes(snapshot))
    }
    /// Stores a snapshot's bytes ([`stored_bytes`]) durably.
    fn put(&self, journal_seq: u64, bytes: &[u8]) -> Result<()>;
    /// The newest snapshot that verifies.
    fn latest_valid(&self) -> Result<Option<Snapshot>>;
    /// Journal entries between two periodic snapshots.
    fn every(&self) -> u64 {
        SNAPSHOT_EVERY_ENTRIES
    }
    /// Free bytes where it writes (`None`: not measured).
    fn free_bytes(&self) -> Option<std::io::Result<u64>> {
        None
    }
    /// Whether the sequencer takes snapshots into it (a cluster node's
    /// state machine takes its own: no replica market is kept for this).
    fn takes_snapshots(&self) -> bool {
        true
    }
}

impl SnapshotStorage for SnapshotStore {
    fn put(&self, journal_seq: u64, bytes: &[u8]) -> Result<()> {
        self.put_raw(journal_seq, bytes)
    }
    fn free_bytes(&self) -> Option<std::io::Result<u64>> {
        Some(free_bytes(self.path.parent().unwrap_or(Path::new("."))))
    }
    fn every(&self) -> u64 {
        self.every
    }
    fn latest_valid(&self) -> Result<Option<Snapshot>> {
        SnapshotStore::latest_valid(self)
    }
}

/// Snapshots in memory, stored in the same bytes as on disk (checksum,
/// state hash, record) and verified the same way when read. Clones share
/// them, so a test restarts a sequencer on what the last one wrote.
#[derive(Clone, Default)]
pub struct MemorySnapshots {
    stored: std::sync::Arc<std::sync::Mutex<std::collections::BTreeMap<u64, Vec<u8>>>>,
    /// Writes to fail from now on (tests of a failing store), and writes tried.
    failing: std::sync::Arc<std::sync::atomic::AtomicU32>,
    tried: std::sync::Arc<std::sync::atomic::AtomicU32>,
    /// The free space it says it has (`u64::MAX`, the default: not measured).
    free: std::sync::Arc<std::sync::atomic::AtomicU64>,
}

impl MemorySnapshots {
    fn stored(&self) -> std::sync::MutexGuard<'_, std::collections::BTreeMap<u64, Vec<u8>>> {
        self.stored.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// The journal entries the stored snapshots include.
    pub fn journal_seqs(&self) -> Vec<u64> {
        self.stored().keys().copied().collect()
    }

    /// Fails the next `writes` writes, as a disk with an I/O error would.
    pub fn fail_next(&self, writes: u32) {
        self.failing.store(writes, std::sync::atomic::Ordering::SeqCst);
    }

    /// Says it has `bytes` free from now on.
    pub fn set_free_bytes(&self, bytes: u64) {
        self.free.store(bytes, std::sync::atomic::Ordering::SeqCst);
    }

    /// Writes tried so far, failed ones included.
    pub fn writes_tried(&self) -> u32 {
        self.tried.load(std::sync::atomic::Ordering::SeqCst)
    }
}

impl SnapshotStorage for MemorySnapshots {
    fn free_bytes(&self) -> Option<std::io::Result<u64>> {
        // Zero (the default) and the maximum both mean "not measured".
        let free = self.free.load(std::sync::atomic::Ordering::SeqCst);
        (free != 0 && free != u64::MAX).then_some(Ok(free))
    }
    fn put(&self, journal_seq: u64, bytes: &[u8]) -> Result<()> {
        use std::sync::atomic::Ordering;
        self.tried.fetch_add(1, Ordering::SeqCst);
        if self.failing.fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1)).is_ok() {
            anyhow::bail!("injected I/O error");
        }
        let mut stored = self.stored();
        stored.insert(journal_seq, bytes.to_vec());
        while stored.len() > SNAPSHOTS_KEPT {
            stored.pop_first();
        }
        Ok(())
    }
    fn latest_valid(&self) -> Result<Option<Snapshot>> {
        Ok(self.stored().values().rev().find_map(|bytes| verify(bytes).ok()))
    }
}

/// Free bytes for an unprivileged writer on the file system holding `dir`.
pub fn free_bytes(dir: &Path) -> std::io::Result<u64> {
    let stats = nix::sys::statvfs::statvfs(dir).map_err(std::io::Error::from)?;
    Ok((stats.blocks_available() as u64).saturating_mul(stats.fragment_size() as u64))
}

/// A snapshot as stored: `checksum | state hash | record` (see
/// [`SnapshotStore::write`]).
pub fn stored_bytes(snapshot: &Snapshot) -> Vec<u8> {
    let mut body = SNAPSHOT_FORMAT.to_le_bytes().to_vec();
    body.extend_from_slice(&snapshot.market.state_hash().to_le_bytes());
    body.extend_from_slice(&encode_record(snapshot));
    let mut value = checksum(&body).to_le_bytes().to_vec();
    value.extend_from_slice(&body);
    value
}

fn verify(value: &[u8]) -> std::result::Result<Snapshot, String> {
    let (stored, body) = value.split_at_checked(8).ok_or("shorter than its checksum")?;
    let stored = u64::from_le_bytes(stored.try_into().map_err(|_| "checksum width")?);
    if checksum(body) != stored {
        return Err("checksum mismatch".into());
    }
    let (format, body) = body.split_at_checked(4).ok_or("shorter than its format")?;
    let format = u32::from_le_bytes(format.try_into().map_err(|_| "format width")?);
    if format != SNAPSHOT_FORMAT {
        // Another build's layout of the market (the unversioned snapshots
        // before 2026-12-06 read as an arbitrary number here): replaying the
        // journal rebuilds the same state.
        return Err(format!("written in snapshot format {format}; this build reads format {SNAPSHOT_FORMAT} only"));
    }
    let (state_hash, payload) = body.split_at_checked(8).ok_or("shorter than its state hash")?;
    let state_hash = u64::from_le_bytes(state_hash.try_into().map_err(|_| "state hash width")?);
    let snapshot: Snapshot = decode_snapshot(payload).map_err(|e| e.message)?;
    if snapshot.market.state_hash() != state_hash {
        return Err("state hash mismatch after decoding".into());
    }
    Ok(snapshot)
}
