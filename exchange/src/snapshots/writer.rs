//! The snapshot replica: a market on its own thread, fed every committed
//! batch, that writes itself as the snapshot every so many entries.

use std::time::{Duration, Instant};

use anyhow::Result;
use gpux_market::{JournalEntry, MarketState};

use super::{stored_bytes, Snapshot, SnapshotStorage};

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
