//! The journal a leader's sequencer writes through Raft (issue 19): a
//! [`JournalStore`] whose append proposes the batch to the cluster and
//! returns once a majority has it on disk and this node applied it. The
//! node's [`MarketMachine`](crate::state_machine::MarketMachine), with this
//! journal as its sink, writes the entries (with the transfers and archive
//! its own apply produced) into the local journal, as every follower's
//! machine does into theirs; everything read goes to that local journal.
//!
//! So an acknowledgement the sequencer sends after `append_with_transfers`
//! means: committed on a majority, and in this node's journal. An error
//! (this node is no longer the leader, Raft stopped, a batch refused by the
//! market) is the sequencer's journal failure: it stops sequencing.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use gpux_engine::{AccountId, ContractId, ContractInfo, InstrumentId, InstrumentInfo, LeaseId, LeaseInfo};
use gpux_journal::{JournalAppend, JournalError, JournalQuery, JournalRead, JournalStore, Op, Proposed, Result};
use gpux_market::{Archived, ArchivedLease, JournalEntry};
use gpux_protocol::history::{Candle, CandleInterval, Fill, FillCursor, TradeRecord};
use gpux_settlement::ledger::Transfer;

use crate::state_machine::JournalSink;
use crate::{Batch, Raft};

/// How long an append waits for its batch to commit: a leader cut off from
/// its majority never commits, and its sequencer must stop, not hang.
pub const COMMIT_TIMEOUT: Duration = Duration::from_secs(5);

/// Batches a leader's sequencer may have proposed and not yet seen
/// committed (docs/PERFORMANCE.md "Replicated market"). Above 1, Raft
/// replicates and commits them in order while the sequencer applies the
/// next; a batch's answers still leave only after its own commit, and a
/// failed commit stops the sequencer with every batch after it unanswered.
/// 1 for now: on the 2-core test machine 4 in flight gained no throughput
/// and the failover benchmark's p99 went from 1.1 s to 2.6-2.7 s. The
/// cause is openraft 0.9.25's core: it awaits each append's flush
/// (`RaftCore::append_to_log`, "a temp wrapper to make non-blocking
/// `append_to_log` a blocking") before it replicates the entries, so the
/// leader's fsync and a follower's stay in series and batches in flight
/// queue in the core (docs/PERFORMANCE.md "Replicated market"). To be
/// raised with a Raft whose leader writes its log while it replicates.
pub const PIPELINE_DEPTH: usize = 1;

/// The leader's journal: appends through Raft, reads from the local
/// journal the state machine writes.
pub struct ReplicatedJournal {
    raft: Raft,
    runtime: tokio::runtime::Handle,
    local: JournalSink,
    fence: Arc<AtomicBool>,
    /// The sequence number the next proposed batch will start at: the local
    /// journal's next, plus the batches proposed and not yet applied.
    proposed_next: Option<u64>,
}

impl ReplicatedJournal {
    /// `local` is the sink the node's state machine writes; appends block
    /// on `runtime` (call them from a thread outside it: the sequencer's).
    pub fn new(raft: Raft, runtime: tokio::runtime::Handle, local: JournalSink) -> ReplicatedJournal {
        ReplicatedJournal { raft, runtime, local, fence: Arc::default(), proposed_next: None }
    }

    /// Once set, every append fails before it proposes anything: the node
    /// stopped serving (it lost the leadership, or its majority), and its
    /// sequencer must never write again, even should the node lead again
    /// (a new sequencer recovers then, from the journal).
    pub fn fence(&self) -> Arc<AtomicBool> {
        self.fence.clone()
    }

    fn local(&self) -> std::sync::MutexGuard<'_, Box<dyn JournalStore>> {
        self.local.lock().expect("the journal's lock")
    }
}

/// An append the cluster did not commit.
fn replication(message: String) -> JournalError {
    JournalError::Replication { op: Op::Append, message }
}

impl JournalAppend for ReplicatedJournal {
    fn next_seq(&self) -> u64 {
        self.local().next_seq()
    }

    fn entries_after(&self, seq: u64) -> Result<Vec<JournalEntry>> {
        self.local().entries_after(seq)
    }

    /// Proposes the batch and waits for its commit and apply. The
    /// transfers and archive are not sent: every node's machine derives the
    /// same ones from the entries (checked here by their count).
    fn append_with_transfers(&mut self, entries: &[JournalEntry], transfers: &[Transfer], archived: &Archived) -> Result<u64> {
        self.propose(entries, transfers, archived)()
    }

    fn pipeline_depth(&self) -> usize {
        PIPELINE_DEPTH
    }

    /// Hands the batch to Raft (which appends it to the log after the
    /// batches proposed before it) and returns what waits for its commit
    /// and this node's apply, and checks that the batch starts in the local
    /// journal where the proposer counted it would.
    fn propose(&mut self, entries: &[JournalEntry], transfers: &[Transfer], archived: &Archived) -> Proposed {
        let _ = (transfers, archived);
        if self.fence.load(Ordering::SeqCst) {
            return failed("this node stopped sequencing (it is not the serving leader any more)".into());
        }
        let first = *self.proposed_next.get_or_insert_with(|| self.local.lock().expect("the journal's lock").next_seq());
        let count = entries.len() as u64;
        let batch = Batch { entries: entries.to_vec() };
        let raft = self.raft.clone();
        // Sent to Raft before this returns: batches reach the log in the
        // order they are proposed.
        let sent = self.runtime.block_on(async move { raft.client_write_ff(batch).await });
        let responder = match sent {
            Ok(responder) => responder,
            Err(fatal) => return failed(format!("Raft stopped: {fatal}")),
        };
        self.proposed_next = Some(first + count);
        let runtime = self.runtime.clone();
        Box::new(move || {
            let written = runtime.block_on(async move { tokio::time::timeout(COMMIT_TIMEOUT, responder).await });
            let written =
                written.map_err(|_| replication(format!("the batch was not committed through Raft within {COMMIT_TIMEOUT:?}")))?;
            let written =
                written.map_err(|_| replication("Raft dropped the batch before answering (it stopped, or lost the leadership)".into()))?;
            let response = written.map_err(|error| replication(format!("the batch was not committed through Raft: {error}")))?;
            if let Some((position, why)) = response.data.refused.first() {
                return Err(replication(format!("the market refused entry {position} of a committed batch: {why}")));
            }
            if response.data.first_seq != first {
                return Err(replication(format!(
                    "the batch committed at journal entry {}, not at {first} where it was proposed",
                    response.data.first_seq
                )));
            }
            Ok(first)
        })
    }
}

/// A proposal that failed before it reached Raft.
fn failed(message: String) -> Proposed {
    let error = replication(message);
    Box::new(move || Err(error))
}

impl JournalQuery for ReplicatedJournal {
    fn statement(&self, account: AccountId, after: Option<u64>, limit: usize) -> Result<Vec<Transfer>> {
        self.local().statement(account, after, limit)
    }

    fn recent_statement(&self, account: AccountId, before: Option<u64>, limit: usize) -> Result<Vec<Transfer>> {
        self.local().recent_statement(account, before, limit)
    }

    fn archived_leases_of(&self, account: AccountId, before: Option<LeaseId>, limit: usize) -> Result<(Vec<LeaseInfo>, bool)> {
        self.local().archived_leases_of(account, before, limit)
    }

    fn archived_lease(&self, lease: LeaseId) -> Result<Option<ArchivedLease>> {
        self.local().archived_lease(lease)
    }

    fn archived_contract(&self, contract: ContractId) -> Result<Option<ContractInfo>> {
        self.local().archived_contract(contract)
    }

    fn archived_instrument(&self, instrument: InstrumentId) -> Result<Option<InstrumentInfo>> {
        self.local().archived_instrument(instrument)
    }

    fn shared_reader(&self) -> Arc<dyn JournalRead> {
        self.local().shared_reader()
    }

    fn trades(&self, instrument: InstrumentId, before_seq: Option<u64>, limit: usize) -> Result<Vec<TradeRecord>> {
        self.local().trades(instrument, before_seq, limit)
    }

    fn candles(&self, instrument: InstrumentId, interval: CandleInterval, before_ms: u64, limit: usize) -> Result<(Vec<Candle>, bool)> {
        self.local().candles(instrument, interval, before_ms, limit)
    }

    fn fills(&self, account: AccountId, before: Option<FillCursor>, limit: usize) -> Result<Vec<Fill>> {
        self.local().fills(account, before, limit)
    }
}
