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
use gpux_journal::{JournalAppend, JournalError, JournalQuery, JournalRead, JournalStore, Op, Result};
use gpux_market::{Archived, ArchivedLease, JournalEntry};
use gpux_protocol::history::{Candle, CandleInterval, Fill, FillCursor, TradeRecord};
use gpux_settlement::ledger::Transfer;

use crate::state_machine::JournalSink;
use crate::{Batch, Raft};

/// How long an append waits for its batch to commit: a leader cut off from
/// its majority never commits, and its sequencer must stop, not hang.
pub const COMMIT_TIMEOUT: Duration = Duration::from_secs(5);

/// The leader's journal: appends through Raft, reads from the local
/// journal the state machine writes.
pub struct ReplicatedJournal {
    raft: Raft,
    runtime: tokio::runtime::Handle,
    local: JournalSink,
    fence: Arc<AtomicBool>,
}

impl ReplicatedJournal {
    /// `local` is the sink the node's state machine writes; appends block
    /// on `runtime` (call them from a thread outside it: the sequencer's).
    pub fn new(raft: Raft, runtime: tokio::runtime::Handle, local: JournalSink) -> ReplicatedJournal {
        ReplicatedJournal { raft, runtime, local, fence: Arc::default() }
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

    /// Proposes the batch to Raft and waits for its commit and this
    /// node's apply, and checks that the batch starts in the local journal
    /// where the sequencer counted it would. One batch at a time: the
    /// sequencer hands over the next only once this returned (a deeper
    /// pipeline gained nothing and lengthened the failover tail:
    /// docs/PERFORMANCE.md "Replicated market"). The transfers and archive
    /// are not sent: every node's machine derives the same ones from the
    /// entries.
    fn append_with_transfers(&mut self, entries: &[JournalEntry], transfers: &[Transfer], archived: &Archived) -> Result<u64> {
        let _ = (transfers, archived);
        if self.fence.load(Ordering::SeqCst) {
            return Err(replication("this node stopped sequencing (it is not the serving leader any more)".into()));
        }
        let first = self.local().next_seq();
        let batch = Batch { entries: entries.to_vec() };
        let raft = self.raft.clone();
        let written = self.runtime.block_on(async move { tokio::time::timeout(COMMIT_TIMEOUT, raft.client_write(batch)).await });
        let written = written.map_err(|_| replication(format!("the batch was not committed through Raft within {COMMIT_TIMEOUT:?}")))?;
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
    }
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
