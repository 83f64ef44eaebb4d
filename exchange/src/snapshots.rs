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

use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use gpux_engine::state_hash::StateHasher;
use gpux_market::{JournalEntry, MarketState};
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
/// rules and hosts by owner, and jobs by participant (2026-12-07).
pub const SNAPSHOT_FORMAT: u32 = 5;

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

/// Takes and stores snapshots without the sequencer copying its state: a
/// replica of the market on a thread of its own is fed every committed
/// journal entry and applies it through the same `MarketState::apply` (a
/// forked state kept up to date by replay), and every `every` entries it
/// writes itself as the snapshot. The sequencer only hands over the batch it
/// just committed (moved, not copied).
pub struct SnapshotWriter {
    batches: Option<crossbeam_channel::Sender<Batch>>,
    /// Ends with the replica's last entry and state hash (`None`: it
    /// stopped out of step), and, after a failed commit, those with the
    /// failed batch applied too.
    thread: Option<std::thread::JoinHandle<Option<Finished>>>,
}

/// What the writer thread is handed.
enum Batch {
    /// Entries `first_seq..`, durable.
    Committed(u64, Vec<JournalEntry>),
    /// A batch whose commit failed: never in a snapshot, only its state
    /// hash is wanted (a restart recovers it when the disk kept it anyway).
    Failed(Vec<JournalEntry>),
    /// What must stay free after a snapshot from now on.
    Reserve(u64),
}

/// The replica's last committed entry and state hash, and the same with
/// the failed batch, if one was handed over.
type Finished = ((u64, u64), Option<(u64, u64)>);

/// When a snapshot is taken and what guards the journal's room.
pub struct SnapshotGuard {
    /// Journal entries between two periodic snapshots.
    pub every: u64,
    /// What must stay free after a snapshot of twice its size.
    pub reserve_bytes: u64,
    pub counters: SnapshotCounters,
}

/// The writer's counts (`gpux_snapshots_*_total`).
#[derive(Clone)]
pub struct SnapshotCounters {
    pub written: prometheus::IntCounter,
    pub failed: prometheus::IntCounter,
    pub skipped_low_space: prometheus::IntCounter,
}

impl Default for SnapshotCounters {
    fn default() -> Self {
        let counter = |name: &str| prometheus::IntCounter::new(name, name).expect("a valid metric");
        SnapshotCounters { written: counter("written"), failed: counter("failed"), skipped_low_space: counter("skipped") }
    }
}

impl SnapshotGuard {
    /// Every `every` entries, no reserve, uncounted (tests).
    pub fn every(every: u64) -> SnapshotGuard {
        SnapshotGuard { every, reserve_bytes: 0, counters: SnapshotCounters::default() }
    }
}

/// After a skip for space, the next try waits this long.
const LOW_SPACE_RETRY: Duration = Duration::from_secs(60);
/// A failed write's back-off: from the first, doubling to the last.
const FAILED_RETRY_FIRST: Duration = Duration::from_secs(1);
const FAILED_RETRY_MAX: Duration = Duration::from_secs(300);

/// The writer thread's side: the store, the guard, and when it may try again.
struct Writing<S> {
    store: S,
    guard: SnapshotGuard,
    written: u64,
    retry_at: Option<Instant>,
    backoff: Duration,
}

impl<S: SnapshotStorage> Writing<S> {
    /// Writes `replica` unless a back-off holds it (`at_stop` ignores it)
    /// or the free space would fall under the reserve.
    fn attempt(&mut self, replica: &Snapshot, at_stop: bool) {
        if !at_stop && self.retry_at.is_some_and(|at| Instant::now() < at) {
            return;
        }
        let bytes = stored_bytes(replica);
        if let Some(free_bytes) = self.store.free_bytes() {
            let needed = 2 * bytes.len() as u64 + self.guard.reserve_bytes;
            match free_bytes {
                Ok(free) if free >= needed => {}
                outcome => {
                    self.guard.counters.skipped_low_space.inc();
                    self.retry_at = Some(Instant::now() + LOW_SPACE_RETRY);
                    let free = outcome.as_ref().ok().copied();
                    tracing::warn!(
                        journal_seq = replica.journal_seq,
                        ?free,
                        needed,
                        "snapshot skipped: the data directory would keep less than its reserve free (docs/operations.md \"Disk space\"); the journal still holds every entry"
                    );
                    return;
                }
            }
        }
        match self.store.put(replica.journal_seq, &bytes) {
            Ok(()) => {
                self.written = replica.journal_seq;
                self.retry_at = None;
                self.backoff = Duration::ZERO;
                self.guard.counters.written.inc();
                tracing::debug!(journal_seq = replica.journal_seq, "snapshot written");
            }
            Err(error) => {
                self.guard.counters.failed.inc();
                self.backoff = (self.backoff * 2).clamp(FAILED_RETRY_FIRST, FAILED_RETRY_MAX);
                self.retry_at = Some(Instant::now() + self.backoff);
                tracing::warn!(
                    error = %format!("{error:#}"),
                    retry_in_s = self.backoff.as_secs(),
                    "snapshot failed; the store is reopened for the next try; the journal still holds every entry"
                );
            }
        }
    }
}

impl SnapshotWriter {
    /// A replica starting from `market` as of journal entry `journal_seq`,
    /// whose newest stored snapshot is at `snapshot_seq`.
    pub fn spawn(
        store: impl SnapshotStorage,
        market: MarketState,
        journal_seq: u64,
        snapshot_seq: u64,
        guard: SnapshotGuard,
    ) -> Result<SnapshotWriter> {
        let (batches, committed) = crossbeam_channel::unbounded::<Batch>();
        let thread = std::thread::Builder::new().name("snapshots".into()).spawn(move || {
            let mut replica = Snapshot { journal_seq, market };
            let every = guard.every;
            let mut writing = Writing { store, guard, written: snapshot_seq, retry_at: None, backoff: Duration::ZERO };
            let mut failed = None;
            for batch in committed {
                let (first_seq, entries) = match batch {
                    Batch::Committed(first_seq, entries) => (first_seq, entries),
                    Batch::Failed(entries) => {
                        failed = Some(entries);
                        break;
                    }
                    Batch::Reserve(bytes) => {
                        writing.guard.reserve_bytes = bytes;
                        continue;
                    }
                };
                if first_seq != replica.journal_seq + 1 {
                    tracing::error!(first_seq, replica = replica.journal_seq, "snapshot replica out of step; no more snapshots");
                    return None;
                }
                for entry in &entries {
                    if let Err(error) = replica.market.apply(entry) {
                        tracing::error!(%error, "snapshot replica failed; no more snapshots");
                        return None;
                    }
                }
                replica.journal_seq += entries.len() as u64;
                if replica.journal_seq >= writing.written + every {
                    writing.attempt(&replica, false);
                }
            }
            // The sequencer stopped: a last snapshot of everything.
            if replica.journal_seq > writing.written {
                writing.attempt(&replica, true);
            }
            let last = (replica.journal_seq, replica.market.state_hash());
            // A failed batch in memory only: what a restart recovers if the
            // disk kept it after all (an fsync that failed after its write).
            let with_failed = failed.and_then(|entries| {
                entries.iter().try_for_each(|entry| replica.market.apply(entry).map(|_| ())).ok()?;
                Some((replica.journal_seq + entries.len() as u64, replica.market.state_hash()))
            });
            Some((last, with_failed))
        })?;
        Ok(SnapshotWriter { batches: Some(batches), thread: Some(thread) })
    }

    /// A writer that takes no snapshot and keeps no replica.
    pub fn disabled() -> SnapshotWriter {
        SnapshotWriter { batches: None, thread: None }
    }

    /// Hands over a committed batch: entries `first_seq..`, in order.
    pub fn committed(&self, first_seq: u64, entries: Vec<JournalEntry>) {
        if let Some(batches) = &self.batches {
            let _ = batches.send(Batch::Committed(first_seq, entries));
        }
    }

    /// Stops the replica once it applied everything it was handed and wrote
    /// a last snapshot of it (durable when this returns). Returns its last
    /// entry and the state hash as of it, the first time, when it kept up.
    pub fn finish(&mut self) -> Option<(u64, u64)> {
        self.batches = None;
        self.thread.take().and_then(|thread| thread.join().ok().flatten()).map(|(last, _)| last)
    }

    /// Keeps `bytes` free after every snapshot from now on.
    pub fn set_reserve(&self, bytes: u64) {
        if let Some(batches) = &self.batches {
            let _ = batches.send(Batch::Reserve(bytes));
        }
    }

    /// `finish` after the commit of `failed` failed: also the last entry
    /// and state hash with that batch applied (in memory, never snapshot).
    pub fn finish_failed(&mut self, failed: Vec<JournalEntry>) -> Option<Finished> {
        if let Some(batches) = self.batches.take() {
            let _ = batches.send(Batch::Failed(failed));
        }
        self.thread.take().and_then(|thread| thread.join().ok().flatten())
    }
}

impl Drop for SnapshotWriter {
    fn drop(&mut self) {
        self.finish();
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

#[cfg(test)]
mod tests {
    use super::*;
    use gpux_engine::{Command, Engine, EngineConfig, Input, Role};

    fn snapshot_at(journal_seq: u64, accounts: u32) -> Snapshot {
        let mut engine = Engine::new(EngineConfig::demo()).expect("valid config");
        for _ in 0..accounts {
            engine.apply(&Input { at_ms: 1_796_223_600_000, command: Command::OpenAccount { role: Role::Renter } });
        }
        Snapshot { journal_seq, market: MarketState::from_engine(engine) }
    }

    /// The replica applies the committed batches, writes a snapshot every
    /// `every` entries, and `finish` writes the last one, durable when it
    /// returns (what a clean stop relies on). Its state is the sequencer's.
    #[test]
    fn the_replica_snapshots_every_so_many_entries_and_at_finish() {
        let open = |at_ms| JournalEntry::Engine(Input { at_ms, command: Command::OpenAccount { role: Role::Renter } });
        let store = MemorySnapshots::default();
        let start = MarketState::new(EngineConfig::demo()).expect("valid config");
        let mut live = start.clone();
        let mut writer = SnapshotWriter::spawn(store.clone(), start, 0, 0, SnapshotGuard::every(3)).expect("writer");
        let mut seq = 1;
        for batch in [vec![open(1_796_223_600_000), open(1_796_223_600_001)], vec![open(1_796_223_600_002)], vec![open(1_796_223_600_003)]]
        {
            for entry in &batch {
                live.apply(entry).expect("applies");
            }
            let len = batch.len() as u64;
            writer.committed(seq, batch);
            seq += len;
        }
        writer.finish();
        assert_eq!(store.journal_seqs(), [3, 4], "at 3 entries, then the last at finish");
        let last = store.latest_valid().expect("reads").expect("a snapshot");
        assert_eq!((last.journal_seq, last.market.state_hash()), (4, live.state_hash()));
    }

    /// Feeds `batches` one-entry batches to a writer that snapshots every
    /// entry, then finishes it.
    fn run_writer(store: &MemorySnapshots, guard: SnapshotGuard, batches: u64) {
        let open = |at_ms| JournalEntry::Engine(Input { at_ms, command: Command::OpenAccount { role: Role::Renter } });
        let start = MarketState::new(EngineConfig::demo()).expect("valid config");
        let mut writer = SnapshotWriter::spawn(store.clone(), start, 0, 0, guard).expect("writer");
        for seq in 1..=batches {
            writer.committed(seq, vec![open(1_796_223_600_000 + seq)]);
        }
        writer.finish();
    }

    /// A snapshot that would leave the file system under its reserve is not
    /// written (the journal keeps the room), not even at the stop; counted.
    #[test]
    fn a_snapshot_that_would_eat_the_reserve_is_skipped_and_counted() {
        let store = MemorySnapshots::default();
        let guard = |reserve_bytes| SnapshotGuard { reserve_bytes, ..SnapshotGuard::every(1) };
        store.set_free_bytes(100 << 20);
        let skipped = SnapshotGuard { reserve_bytes: 100 << 20, ..SnapshotGuard::every(1) };
        let counters = skipped.counters.clone();
        run_writer(&store, skipped, 5);
        assert_eq!((store.writes_tried(), store.journal_seqs().len()), (0, 0), "nothing written into the reserve");
        assert_eq!(counters.skipped_low_space.get(), 2, "the first try, then the stop's (the retry waits a minute)");
        // With the room, it writes.
        run_writer(&store, guard(1 << 20), 1);
        assert_eq!(store.journal_seqs(), [1]);
    }

    /// A failing store is tried again after a back-off, never per batch; the
    /// stop tries once more; once writes succeed, snapshots follow.
    #[test]
    fn a_failing_store_is_retried_with_back_off_not_per_batch() {
        let store = MemorySnapshots::default();
        store.fail_next(2);
        let guard = SnapshotGuard::every(1);
        let counters = guard.counters.clone();
        run_writer(&store, guard, 50);
        assert_eq!(store.writes_tried(), 2, "the first batch's try and the stop's; the 49 batches between waited");
        assert_eq!((counters.failed.get(), counters.written.get()), (2, 0));
        run_writer(&store, SnapshotGuard::every(1), 3);
        assert!(!store.journal_seqs().is_empty(), "writes succeed again");
    }

    /// A store on a failing disk: the failed write is an error and closes
    /// the database; the next write, once the disk is healthy, opens it
    /// again and succeeds; the snapshot written before is still there.
    #[test]
    fn a_store_reopens_after_each_kind_of_storage_fault() {
        use gpux_journal::faults::{Fault, Faults, FaultyBackend};
        for fault in [Fault::NoSpace, Fault::WriteError, Fault::SyncError, Fault::TornWrite] {
            let dir = tempfile::tempdir().expect("temp dir");
            let path = dir.path().join("snapshots.redb");
            let faults = Faults::default();
            let (file, switch) = (path.clone(), faults.clone());
            let opens = std::sync::Arc::new(std::sync::atomic::AtomicU32::new(0));
            let counted = opens.clone();
            let store = SnapshotStore::open_with(&path, move || {
                counted.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                let handle = std::fs::OpenOptions::new().read(true).write(true).create(true).truncate(false).open(&file)?;
                Ok(redb::Builder::new().create_with_backend(FaultyBackend::new(handle, switch.clone())?)?)
            })
            .expect("open");
            store.write(&snapshot_at(10, 1)).expect("a healthy disk");
            faults.set(fault);
            assert!(store.write(&snapshot_at(20, 2)).is_err(), "{fault:?}: the write fails");
            faults.set(Fault::None);
            store.write(&snapshot_at(30, 3)).unwrap_or_else(|e| panic!("{fault:?}: reopened, it writes: {e:#}"));
            assert_eq!(opens.load(std::sync::atomic::Ordering::SeqCst), 2, "{fault:?}: opened once more after the failure");
            drop(store);
            let store = SnapshotStore::open(&path).expect("reopen");
            let latest = store.latest_valid().expect("read").expect("a snapshot");
            assert_eq!(latest.journal_seq, 30, "{fault:?}");
        }
    }

    #[test]
    fn free_space_is_measured_on_the_data_directory() {
        let dir = tempfile::tempdir().expect("temp dir");
        assert!(free_bytes(dir.path()).expect("statvfs") > 0);
        let store = SnapshotStore::open(&dir.path().join("snapshots.redb")).expect("open");
        assert!(matches!(store.free_bytes(), Some(Ok(free)) if free > 0));
    }

    #[test]
    fn the_newest_valid_snapshot_is_used_and_a_corrupt_one_is_skipped() {
        let dir = tempfile::tempdir().expect("temp dir");
        let store = SnapshotStore::open(&dir.path().join("snapshots.redb")).expect("open");
        assert!(store.latest_valid().expect("read").is_none());
        store.write(&snapshot_at(10, 1)).expect("write");
        let newer = snapshot_at(20, 2);
        store.write(&newer).expect("write");
        let loaded = store.latest_valid().expect("read").expect("a snapshot");
        assert_eq!((loaded.journal_seq, loaded.market.state_hash()), (20, newer.market.state_hash()));

        let mut corrupt = stored_bytes(&snapshot_at(30, 3));
        let last = corrupt.len() - 1;
        corrupt[last] ^= 0xff;
        store.put_raw(30, &corrupt).expect("plant corruption");
        assert_eq!(store.latest_valid().expect("read").map(|s| s.journal_seq), Some(20), "falls back to the older one");
    }

    /// A snapshot written by a build of another format, the unversioned
    /// layout before formats (`checksum | state hash | record`) among
    /// them, is skipped, never decoded as this build's.
    #[test]
    fn a_snapshot_of_another_format_is_skipped() {
        let dir = tempfile::tempdir().expect("temp dir");
        let store = SnapshotStore::open(&dir.path().join("snapshots.redb")).expect("open");
        store.write(&snapshot_at(10, 1)).expect("write");
        let newer = snapshot_at(20, 2);
        let unversioned = {
            let mut body = newer.market.state_hash().to_le_bytes().to_vec();
            body.extend_from_slice(&encode_record(&newer));
            let mut value = checksum(&body).to_le_bytes().to_vec();
            value.extend_from_slice(&body);
            value
        };
        store.put_raw(20, &unversioned).expect("an older build's snapshot");
        let reason = verify(&unversioned).err().expect("refused");
        assert!(reason.contains(&format!("reads format {SNAPSHOT_FORMAT} only")), "{reason}");
        assert_eq!(store.latest_valid().expect("read").map(|s| s.journal_seq), Some(10), "the older build's is skipped");
        let mut next_format = stored_bytes(&snapshot_at(30, 3));
        next_format[8..12].copy_from_slice(&(SNAPSHOT_FORMAT + 1).to_le_bytes());
        let sum = checksum(&next_format[8..]).to_le_bytes();
        next_format[..8].copy_from_slice(&sum);
        store.put_raw(30, &next_format).expect("a newer build's snapshot");
        assert_eq!(SNAPSHOTS_KEPT, 2, "the third write pruned the one at 10");
        assert!(store.latest_valid().expect("read").is_none(), "a newer build's is skipped too");
    }

    /// A restored engine is the same state machine: same hash, and the same
    /// events for the same next inputs (here: a running lease's end).
    #[test]
    fn a_restored_engine_continues_exactly_like_the_original() {
        use gpux_engine::*;
        let at = |minutes: u64| 1_796_223_660_000 + minutes * 60_000;
        let mut engine = Engine::new(EngineConfig::demo()).expect("valid config");
        let spec = GpuSpec::h100_sxm();
        let order = |account, side, supply| NewOrder {
            duration: LeaseDuration::Hours(2),
            supply,
            ..NewOrder::limit(AccountId(account), 1, InstrumentId(0), side, 2_000_000, 1)
        };
        for command in [
            Command::OpenAccount { role: Role::Supplier },
            Command::OpenAccount { role: Role::Renter },
            Command::Deposit { account: AccountId(1), amount_minor: 100_000_000 },
            Command::register(AccountId(0), "h", "GPU-1", spec),
            Command::place(order(0, Side::Sell, Some(GpuSet { host: HostId(0), gpu_mask: 1 }))),
            Command::place(order(1, Side::Buy, None)),
        ] {
            engine.apply(&Input { at_ms: at(0), command });
        }
        let restored: Engine = decode_snapshot(&encode_record(&engine)).expect("round trip");
        assert_eq!(restored.state_hash(), engine.state_hash());
        let mut restored = restored;
        let later = Input { at_ms: at(180), command: Command::Tick };
        let expected = engine.apply(&later).to_vec();
        assert!(expected.iter().any(|e| matches!(e.kind, EventKind::LeaseEnded { .. })));
        assert_eq!(restored.apply(&later), expected.as_slice());
        assert_eq!(restored.state_hash(), engine.state_hash());
    }

    #[test]
    fn only_the_newest_snapshots_are_kept() {
        let dir = tempfile::tempdir().expect("temp dir");
        let store = SnapshotStore::open(&dir.path().join("snapshots.redb")).expect("open");
        for seq in 1..=5 {
            store.write(&snapshot_at(seq, 0)).expect("write");
        }
        let db = store.db().expect("open");
        let read = db.as_ref().expect("open").begin_read().expect("read");
        let keys: Vec<u64> =
            read.open_table(SNAPSHOTS).expect("table").iter().expect("iter").map(|row| row.expect("row").0.value()).collect();
        assert_eq!(keys, [4, 5]);
    }
}
