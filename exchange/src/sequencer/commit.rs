//! The commit stage: the journal thread (`Committer`) and the one batch on
//! its way to disk, released once it is there.
//!
//! While batch k is written and fsynced on the journal thread, the
//! sequencer applies batch k+1; it waits for k's commit before it hands
//! k+1 over, and releases k's output only then. So at most one batch is on
//! its way to disk while the next is applied, and nothing of a batch leaves
//! before its own commit. (A deeper pipeline, several batches proposed to
//! Raft at once, gained nothing and lengthened the failover tail: git keeps
//! it, docs/PERFORMANCE.md "Replicated market" the measurement.)

use std::sync::{Arc, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crossbeam_channel::{Receiver, Sender};
use gpux_journal::JournalStore;
use gpux_market::{Archived, JournalEntry};
use gpux_settlement::ledger::Transfer;

use super::{Pending, Sequencer, SequencerError, Target};

/// The journal, the thread that commits to it, and the batch on its way.
pub(super) struct Commit {
    /// The journal, shared with the journal thread.
    journal: Arc<Mutex<Box<dyn JournalStore>>>,
    /// The journal thread (started at the first commit).
    committer: Option<Committer>,
    /// The batch handed to the journal thread and not yet known durable.
    in_flight: Option<InFlight>,
    /// The last entry known to be on disk.
    committed_seq: u64,
}

impl Commit {
    pub(super) fn new(journal: Box<dyn JournalStore>) -> Commit {
        let committed_seq = journal.next_seq() - 1;
        Commit { journal: Arc::new(Mutex::new(journal)), committer: None, in_flight: None, committed_seq }
    }

    /// Whether a batch is on its way to disk.
    pub(super) fn in_flight(&self) -> bool {
        self.in_flight.is_some()
    }

    /// What says when the batch in flight is on disk.
    pub(super) fn done(&self) -> Option<Receiver<Committed>> {
        self.in_flight.as_ref().map(|in_flight| in_flight.done.clone())
    }

    /// Queues what a batch without journal entries produced behind the
    /// batch in flight (it must not overtake it); gives it back when none is.
    pub(super) fn queue_behind(&mut self, pending: &mut Vec<(Target, Pending)>) -> bool {
        let Some(in_flight) = &mut self.in_flight else { return false };
        in_flight.pending.append(pending);
        true
    }
}

/// A batch for the journal thread: its entries, transfers and archive,
/// and where to say how its commit went.
struct CommitJob {
    entries: Vec<JournalEntry>,
    transfers: Vec<Transfer>,
    archived: Archived,
    done: Sender<Committed>,
}

/// How a batch's commit went: its first entry's sequence number, or why
/// not; its entries (for the snapshot replica) and how long it took.
pub(super) struct Committed {
    first_seq: gpux_journal::Result<u64>,
    entries: Vec<JournalEntry>,
    elapsed: Duration,
}

/// The batch handed to the journal thread and not yet known durable.
struct InFlight {
    /// What it produced, and what batches without entries produced since
    /// (they must not overtake it), released in that order once it is on disk.
    pending: Vec<(Target, Pending)>,
    done: Receiver<Committed>,
}

/// The journal thread: commits each batch it is handed, in order, and says
/// how it went. Dropped, it ends the thread and waits for it, so the
/// journal is closed (its file left clean) when the sequencer is gone.
struct Committer {
    jobs: Option<Sender<CommitJob>>,
    thread: Option<JoinHandle<()>>,
}

impl Committer {
    fn start(journal: Arc<Mutex<Box<dyn JournalStore>>>) -> Committer {
        let (jobs, jobs_rx) = crossbeam_channel::bounded::<CommitJob>(1);
        let thread = std::thread::Builder::new()
            .name("gpux-journal".into())
            .spawn(move || {
                for job in jobs_rx {
                    let started = Instant::now();
                    let first_seq = lock(&journal).append_with_transfers(&job.entries, &job.transfers, &job.archived);
                    let _ = job.done.send(Committed { first_seq, entries: job.entries, elapsed: started.elapsed() });
                }
            })
            .expect("the journal thread starts");
        Committer { jobs: Some(jobs), thread: Some(thread) }
    }
}

impl Drop for Committer {
    fn drop(&mut self) {
        drop(self.jobs.take());
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// The journal, locked (a panic while it was held does not make it unusable:
/// the journal's own transactions keep it whole).
fn lock(journal: &Mutex<Box<dyn JournalStore>>) -> MutexGuard<'_, Box<dyn JournalStore>> {
    journal.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

impl Sequencer {
    /// Hands the batch to the journal thread (starting it the first time),
    /// once the batch before it is on disk and released.
    pub(super) fn submit(&mut self) -> Result<(), SequencerError> {
        self.settle()?;
        let (done, done_rx) = crossbeam_channel::bounded(1);
        let batch = &mut self.batch;
        let entries = std::mem::take(&mut batch.entries);
        batch.first_seq += entries.len() as u64;
        let job =
            CommitJob { entries, transfers: std::mem::take(&mut batch.transfers), archived: std::mem::take(&mut batch.archived), done };
        let commit = &mut self.commit;
        let committer = commit.committer.get_or_insert_with(|| Committer::start(commit.journal.clone()));
        // A journal thread that is gone answers nothing: `settle` says so.
        if let Some(jobs) = &committer.jobs {
            let _ = jobs.send(job);
        }
        commit.in_flight = Some(InFlight { pending: std::mem::take(&mut batch.pending), done: done_rx });
        Ok(())
    }

    /// Waits for the batch in flight to be on disk, then releases what it
    /// produced and feeds it to the snapshot replica. A failed commit stops
    /// the sequencer: nothing of that batch, or of any after it, was sent.
    pub(super) fn settle(&mut self) -> Result<(), SequencerError> {
        let Some(done) = self.commit.done() else { return Ok(()) };
        let committed = done.recv().ok();
        self.finish_commit(committed)
    }

    /// The batch in flight's commit came back (`None`: the journal thread
    /// is gone): releases it, or stops the sequencer.
    pub(super) fn finish_commit(&mut self, committed: Option<Committed>) -> Result<(), SequencerError> {
        let Some(in_flight) = self.commit.in_flight.take() else { return Ok(()) };
        let committed = committed.unwrap_or_else(|| Committed {
            first_seq: Err(gpux_journal::JournalError::Stopped),
            entries: Vec::new(),
            elapsed: Duration::ZERO,
        });
        let first_seq = match committed.first_seq {
            Ok(first_seq) => first_seq,
            Err(source) => {
                // The replica holds the committed state: its hash says
                // what a restart will recover.
                let committed_seq = self.commit.committed_seq;
                let finished = self.snapshots.finish_failed(committed.entries).filter(|((seq, _), _)| *seq == committed_seq);
                let state_hash = finished.map(|((_, hash), _)| hash);
                let unanswered = finished.and_then(|(_, with_failed)| with_failed).filter(|(seq, _)| *seq > committed_seq);
                return Err(SequencerError::Journal { committed: committed_seq, state_hash, unanswered, source });
            }
        };
        self.metrics.observe_commit(committed.elapsed);
        self.metrics.journal_entries.inc_by(committed.entries.len() as u64);
        self.commit.committed_seq = first_seq + committed.entries.len() as u64 - 1;
        // The snapshot replica applies the batch on its own thread.
        self.snapshots.committed(first_seq, committed.entries);
        self.release(in_flight.pending);
        Ok(())
    }

    /// The journal, for the queries that read it (after `settle`: they see
    /// every commit before them).
    pub(super) fn store(&self) -> MutexGuard<'_, Box<dyn JournalStore>> {
        lock(&self.commit.journal)
    }
}
