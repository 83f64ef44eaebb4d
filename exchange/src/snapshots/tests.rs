use super::*;
use gpux_engine::{Command, Engine, EngineConfig, Input, Role};
use gpux_market::JournalEntry;

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
    for batch in [vec![open(1_796_223_600_000), open(1_796_223_600_001)], vec![open(1_796_223_600_002)], vec![open(1_796_223_600_003)]] {
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
    let keys: Vec<u64> = read.open_table(SNAPSHOTS).expect("table").iter().expect("iter").map(|row| row.expect("row").0.value()).collect();
    assert_eq!(keys, [4, 5]);
}
