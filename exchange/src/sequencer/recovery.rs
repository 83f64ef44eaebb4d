//! Restart: the newest valid snapshot plus the journal entries after it,
//! replayed through the same `MarketState::apply` the live sequencer uses;
//! and the snapshots the sequencer takes while it runs.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;

use gpux_engine::Command;
use gpux_market::MarketState;

use super::Sequencer;
use crate::metrics::Metrics;
use crate::snapshots::{Snapshot, SnapshotStorage, SnapshotWriter};
use gpux_gateway::link::{Clock, FEED_FRAMES_MAX};
use gpux_journal::JournalStore;

/// The operator's billing settings (flags); applied as journaled commands
/// when they differ from the engine's.
#[derive(Clone, Copy, Debug)]
pub struct BillingPolicy {
    pub fee_bps: u32,
    pub grace_ms: u64,
}

/// What a recovered exchange looks like, for the operator's log and tests.
pub struct Recovery {
    /// The journal entry the snapshot used includes (0: none).
    pub snapshot_seq: u64,
    /// Journal entries replayed after the snapshot.
    pub entries: u64,
    pub state_hash: u64,
}

impl Sequencer {
    /// Rebuilds the market from the newest valid snapshot (or `market`, new,
    /// without one) and the journal entries after it.
    pub fn recover(
        market: MarketState,
        journal: Box<dyn JournalStore>,
        snapshots: impl SnapshotStorage,
        operator_keys: BTreeSet<[u8; 32]>,
        metrics: Arc<Metrics>,
        billing: BillingPolicy,
        clock: Clock,
    ) -> anyhow::Result<(Self, Recovery)> {
        let snapshot = snapshots.latest_valid()?;
        anyhow::ensure!(
            snapshot.as_ref().is_none_or(|s| s.journal_seq < journal.next_seq()),
            "the newest snapshot is ahead of the journal: the journal file does not belong to these snapshots"
        );
        let snapshot_seq = snapshot.as_ref().map_or(0, |s| s.journal_seq);
        let mut market = snapshot.map_or(market, |snapshot| snapshot.market);
        let entries = journal.entries_after(snapshot_seq)?;
        let count = entries.len() as u64;
        // Leases the replay archives are in the journal's archive already
        // (written in their entry's commit), unless the journal predates the
        // archive: they are written again with the first commit (same key,
        // same value).
        let mut archived = Vec::new();
        for (offset, entry) in entries.iter().enumerate() {
            // What an entry sent went out when it was first applied; replay
            // only rebuilds the state.
            let applied = market
                .apply(entry)
                .map_err(|error| anyhow::anyhow!("replaying journal entry {}: {error}", snapshot_seq + 1 + offset as u64))?;
            archived.extend(applied.archived);
        }
        let mut sequencer = Sequencer {
            market,
            journal,
            clock,
            operator_keys,
            entries: Vec::new(),
            transfers: Vec::new(),
            archived,
            pending: Vec::new(),
            fatal: None,
            connections: BTreeMap::new(),
            connections_of: HashMap::new(),
            feeds: HashMap::new(),
            feed_frames_max: FEED_FRAMES_MAX,
            metrics,
            depth_refreshed_ms: 0,
            snapshots: SnapshotWriter::spawn(snapshots)?,
            snapshot_seq,
            logs_pending: BTreeMap::new(),
            next_logs_request: 1,
        };
        // The fee and the billing grace are engine state, changed only by
        // journaled commands, so a replay from any point reaches the same
        // charges whatever the flags say then. These commands are committed
        // with the first batch.
        sequencer.market.advance_clock(clock.now_ms());
        let config = sequencer.market.engine().config().clone();
        if config.fee_bps != billing.fee_bps {
            sequencer.apply_command(None, 0, Command::SetFee { fee_bps: billing.fee_bps });
        }
        if config.billing_grace_ms != billing.grace_ms {
            sequencer.apply_command(None, 0, Command::SetBillingGrace { grace_ms: billing.grace_ms });
        }
        sequencer.pending.clear();
        if let Some(fatal) = sequencer.fatal.take() {
            return Err(fatal.into());
        }
        let state_hash = sequencer.market.state_hash();
        Ok((sequencer, Recovery { snapshot_seq, entries: count, state_hash }))
    }

    /// A copy of everything committed so far, or none if the newest
    /// snapshot taken already has it.
    pub(super) fn take_snapshot(&self) -> Option<Snapshot> {
        let journal_seq = self.journal.next_seq() - 1;
        if journal_seq == self.snapshot_seq {
            return None;
        }
        Some(Snapshot { journal_seq, market: self.market.clone() })
    }

    /// Offers a snapshot to the writer thread: the sequencer copies its
    /// state and goes on; hashing, encoding and the fsync happen on that thread.
    pub(super) fn snapshot(&mut self) {
        if let Some(snapshot) = self.take_snapshot() {
            let journal_seq = snapshot.journal_seq;
            if self.snapshots.offer(snapshot) {
                self.snapshot_seq = journal_seq;
            }
        }
    }
}
