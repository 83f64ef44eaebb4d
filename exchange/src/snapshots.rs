//! State snapshots, so a restart replays only the journal's tail.
//!
//! A snapshot is the whole market state (`gpux_market::MarketState`), taken
//! between batches and tagged with the last journal entry it includes. Each
//! is stored with a checksum of its bytes and the market's state hash
//! (computed on the writer thread); a snapshot that fails either check
//! is skipped for an older one, and with none left the journal is replayed
//! from the start. Snapshots live in their own redb file so that writing one
//! never holds up a journal commit.

use std::path::Path;

use anyhow::{Context, Result};
use gpux_engine::state_hash::StateHasher;
use gpux_market::{JournalEntry, MarketState};
use gpux_protocol::{decode_snapshot, encode_record};
use redb::{Database, Durability, ReadableDatabase, ReadableTable, TableDefinition};
use serde::{Deserialize, Serialize};

const SNAPSHOTS: TableDefinition<u64, &[u8]> = TableDefinition::new("snapshots");
/// Journal entries between two periodic snapshots.
pub const SNAPSHOT_EVERY_ENTRIES: u64 = 100_000;
/// Snapshots kept (older ones are deleted when a new one is written).
pub const SNAPSHOTS_KEPT: usize = 2;

/// The market as of a journal entry.
#[derive(Clone, Serialize, Deserialize)]
pub struct Snapshot {
    /// The last journal entry the snapshot includes.
    pub journal_seq: u64,
    /// Everything the journal rebuilds (workload secrets stay sealed in it).
    pub market: MarketState,
}

pub struct SnapshotStore {
    db: Database,
}

fn checksum(bytes: &[u8]) -> u64 {
    let mut hasher = StateHasher::new();
    hasher.bytes(bytes);
    hasher.finish()
}

impl SnapshotStore {
    pub fn open(path: &Path) -> Result<Self> {
        let db = Database::create(path).with_context(|| format!("opening snapshots {}", path.display()))?;
        let setup = db.begin_write()?;
        setup.open_table(SNAPSHOTS)?;
        setup.commit()?;
        Ok(SnapshotStore { db })
    }

    /// Stores a snapshot durably and prunes the oldest beyond `SNAPSHOTS_KEPT`.
    /// Stored as `checksum (8 bytes LE) | state hash (8 bytes LE) | record`;
    /// the checksum covers the state hash and the record.
    pub fn write(&self, snapshot: &Snapshot) -> Result<()> {
        self.put_raw(snapshot.journal_seq, &stored_bytes(snapshot))
    }

    /// Stores bytes as the snapshot at `journal_seq` (tests use it to plant corruption).
    pub fn put_raw(&self, journal_seq: u64, value: &[u8]) -> Result<()> {
        let mut transaction = self.db.begin_write()?;
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
        let read = self.db.begin_read()?;
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
    fn write(&self, snapshot: &Snapshot) -> Result<()>;
    /// The newest snapshot that verifies.
    fn latest_valid(&self) -> Result<Option<Snapshot>>;
    /// Whether the sequencer takes snapshots into it (a cluster node's
    /// state machine takes its own: no replica market is kept for this).
    fn takes_snapshots(&self) -> bool {
        true
    }
}

impl SnapshotStorage for SnapshotStore {
    fn write(&self, snapshot: &Snapshot) -> Result<()> {
        SnapshotStore::write(self, snapshot)
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
}

impl MemorySnapshots {
    fn stored(&self) -> std::sync::MutexGuard<'_, std::collections::BTreeMap<u64, Vec<u8>>> {
        self.stored.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// The journal entries the stored snapshots include.
    pub fn journal_seqs(&self) -> Vec<u64> {
        self.stored().keys().copied().collect()
    }
}

impl SnapshotStorage for MemorySnapshots {
    fn write(&self, snapshot: &Snapshot) -> Result<()> {
        let mut stored = self.stored();
        stored.insert(snapshot.journal_seq, stored_bytes(snapshot));
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
    batches: Option<crossbeam_channel::Sender<(u64, Vec<JournalEntry>)>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl SnapshotWriter {
    /// A replica starting from `market` as of journal entry `journal_seq`,
    /// whose newest stored snapshot is at `snapshot_seq`.
    pub fn spawn(
        store: impl SnapshotStorage,
        market: MarketState,
        journal_seq: u64,
        snapshot_seq: u64,
        every: u64,
    ) -> Result<SnapshotWriter> {
        let (batches, committed) = crossbeam_channel::unbounded::<(u64, Vec<JournalEntry>)>();
        let thread = std::thread::Builder::new().name("snapshots".into()).spawn(move || {
            let mut replica = Snapshot { journal_seq, market };
            let mut written = snapshot_seq;
            let write = |replica: &Snapshot, written: &mut u64| {
                // A failed snapshot costs only restart time: the journal has everything.
                match store.write(replica) {
                    Ok(()) => {
                        *written = replica.journal_seq;
                        tracing::debug!(journal_seq = replica.journal_seq, "snapshot written");
                    }
                    Err(error) => tracing::warn!(%error, "snapshot failed; the journal still holds every entry"),
                }
            };
            for (first_seq, entries) in committed {
                if first_seq != replica.journal_seq + 1 {
                    tracing::error!(first_seq, replica = replica.journal_seq, "snapshot replica out of step; no more snapshots");
                    return;
                }
                for entry in &entries {
                    if let Err(error) = replica.market.apply(entry) {
                        tracing::error!(%error, "snapshot replica failed; no more snapshots");
                        return;
                    }
                }
                replica.journal_seq += entries.len() as u64;
                if replica.journal_seq >= written + every {
                    write(&replica, &mut written);
                }
            }
            // The sequencer stopped: a last snapshot of everything.
            if replica.journal_seq > written {
                write(&replica, &mut written);
            }
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
            let _ = batches.send((first_seq, entries));
        }
    }

    /// Stops the replica once it applied everything it was handed and wrote
    /// a last snapshot of it (durable when this returns).
    pub fn finish(&mut self) {
        self.batches = None;
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

impl Drop for SnapshotWriter {
    fn drop(&mut self) {
        self.finish();
    }
}

fn stored_bytes(snapshot: &Snapshot) -> Vec<u8> {
    let mut body = snapshot.market.state_hash().to_le_bytes().to_vec();
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
        let mut writer = SnapshotWriter::spawn(store.clone(), start, 0, 0, 3).expect("writer");
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
            Command::RegisterGpu { account: AccountId(0), host: "h".into(), gpu_uuid: "GPU-1".into(), spec },
            Command::PlaceOrder(order(0, Side::Sell, Some(GpuSet { host: HostId(0), gpu_mask: 1 }))),
            Command::PlaceOrder(order(1, Side::Buy, None)),
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
        let read = store.db.begin_read().expect("read");
        let keys: Vec<u64> =
            read.open_table(SNAPSHOTS).expect("table").iter().expect("iter").map(|row| row.expect("row").0.value()).collect();
        assert_eq!(keys, [4, 5]);
    }
}
