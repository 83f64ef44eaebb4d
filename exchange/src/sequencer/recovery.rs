//! Restart: the newest valid snapshot plus the journal entries after it,
//! replayed through the same `MarketState::apply` the live sequencer uses;
//! and the snapshots the sequencer takes while it runs.

use std::collections::BTreeSet;
use std::sync::Arc;

use gpux_engine::Command;
use gpux_market::{JournalEntry, MarketState};

use super::Sequencer;
use crate::metrics::Metrics;
use crate::snapshots::{SnapshotGuard, SnapshotStorage, SnapshotWriter, SNAPSHOT_RESERVE_BYTES};
use gpux_gateway::link::{Clock, FEED_FRAMES_MAX};
use gpux_journal::JournalStore;

/// The operator's billing settings (flags); applied as journaled commands
/// when they differ from the engine's.
#[derive(Clone, Copy, Debug)]
pub struct BillingPolicy {
    pub fee_bps: u32,
    pub grace_ms: u64,
    /// How long after the grace a provisional bill still takes late reports.
    pub late_window_ms: u64,
    /// The price of volumes' storage, minor units per GiB-month
    /// (`--storage-price-minor-per-gib-month`; docs/storage.md "Prices").
    pub storage_minor_per_gib_month: u64,
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
    // Each argument is a separate input of recovery (what to replay onto,
    // what the operator lists, where from, who operates, what to measure,
    // what billing and what clock); bundling them would only rename them.
    #[allow(clippy::too_many_arguments)]
    pub fn recover(
        market: MarketState,
        listing: Option<crate::listing::Listing>,
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
        let (market, archived, count) = replay(snapshot.map_or(market, |snapshot| snapshot.market), journal.as_ref(), snapshot_seq)?;
        // The snapshot replica starts from the recovered state (one copy, at start).
        let snapshot_writer = if snapshots.takes_snapshots() {
            let guard =
                SnapshotGuard { every: snapshots.every(), reserve_bytes: SNAPSHOT_RESERVE_BYTES, counters: metrics.snapshots.clone() };
            SnapshotWriter::spawn(snapshots, market.clone(), journal.next_seq() - 1, snapshot_seq, guard)?
        } else {
            SnapshotWriter::disabled()
        };
        let batch = super::Batch { first_seq: journal.next_seq(), archived, ..Default::default() };
        let mut sequencer = Sequencer {
            market,
            clock,
            batch,
            commit: super::commit::Commit::new(journal),
            sessions: super::session_table::Sessions::default(),
            fanout: super::fanout::FanOut::new(FEED_FRAMES_MAX),
            snapshots: snapshot_writer,
            metrics,
            depth_refreshed_ms: 0,
            host_waits: Default::default(),
            challenges: Default::default(),
            job_silence_ms: super::jobs::JOB_SILENCE_MS_DEFAULT,
            storage_minor_per_gib_month: gpux_protocol::volumes::limits::STORAGE_PRICE_DEFAULT,
            operator_keys,
            openings: Default::default(),
            job_store: None,
            invoices: None,
            disk: None,
            stop: Arc::default(),
        };
        sequencer.set_challenge_interval_ms(super::CHALLENGE_INTERVAL_MS_DEFAULT);
        if let Some(listing) = listing {
            sequencer.adopt_listing(listing, snapshot_seq == 0 && count == 0)?;
        }
        sequencer.market.advance_clock(clock.now_ms());
        sequencer.journal_policy(billing);
        sequencer.batch.pending.clear();
        if let Some(fatal) = sequencer.batch.fatal.take() {
            return Err(fatal.into());
        }
        let state_hash = sequencer.market.state_hash();
        Ok((sequencer, Recovery { snapshot_seq, entries: count, state_hash }))
    }

    /// The fee, the billing grace and the late-report window are engine
    /// state, changed only by journaled commands, so a replay from any point
    /// reaches the same charges whatever the flags say then: those the
    /// flags change are journaled here, committed with the first batch.
    fn journal_policy(&mut self, billing: BillingPolicy) {
        let config = self.market.engine().config().clone();
        if config.fee_bps != billing.fee_bps {
            self.apply_command(None, 0, Command::SetFee { fee_bps: billing.fee_bps });
        }
        if config.billing_grace_ms != billing.grace_ms {
            self.apply_command(None, 0, Command::SetBillingGrace { grace_ms: billing.grace_ms });
        }
        // Storage's price: journaled now where volumes exist, else with
        // the first volume (an exchange without volumes journals nothing).
        self.storage_minor_per_gib_month = billing.storage_minor_per_gib_month;
        if !self.market.volumes().is_empty() {
            self.journal_storage_price();
        }
        if self.market.engine().late_report_window_ms() != billing.late_window_ms {
            self.apply_command(None, 0, Command::SetLateReportWindow { window_ms: billing.late_window_ms });
        }
        // Usage reports are checked by ZIP-215 from here on (the gateway
        // verifies them off this thread); a journal that began under the
        // legacy rule keeps it for the reports before this entry.
        if self.market.signature_rule() != gpux_settlement::SignatureRule::Zip215 {
            self.journal(JournalEntry::SignatureRule { rule: gpux_settlement::SignatureRule::Zip215 });
        }
        // Sub-accounts share their parent's room in the shared tables, and
        // host names are each supplier's own, from here on.
        if self.market.engine().share_rules() < gpux_engine::limits::SHARE_RULES {
            self.apply_command(None, 0, Command::SetShareRules { version: gpux_engine::limits::SHARE_RULES });
        }
        // Jobs follow this build's rules from here on (the entries before
        // replay under the rules they ran under).
        if self.market.jobs().rules() < gpux_market::jobs::JOB_RULES {
            self.journal(JournalEntry::JobRules { version: gpux_market::jobs::JOB_RULES });
        }
    }

    /// Makes the operator's listing the market's (docs/market-rules.md
    /// "The listing"): a new journal starts with it (its genesis entry); a
    /// journal whose listing differs gets a `ChangeListing`, committed
    /// with the first batch like the fee flags, or, when the change is one
    /// the listing cannot take, the exchange does not start. The classes'
    /// cluster terms follow as a `SetClusterRules` when they changed.
    fn adopt_listing(&mut self, listing: crate::listing::Listing, new_journal: bool) -> anyhow::Result<()> {
        let crate::listing::Listing { config: listing, cluster_rules } = listing;
        if new_journal {
            self.journal(JournalEntry::Genesis { listing: Box::new(listing) });
        } else if self.market.engine().config() != &listing {
            self.market.engine().check_listing_change(&listing).map_err(|error| {
                anyhow::anyhow!("the listing file cannot replace the journal's listing: {error} (docs/market-rules.md \"The listing\")")
            })?;
            self.market.advance_clock(self.clock.now_ms());
            self.apply_command(None, 0, Command::ChangeListing { listing: Box::new(listing) });
        }
        // The classes' cluster terms, journaled when they change (a new
        // journal's, when it names any).
        if self.batch.fatal.is_none() && self.market.engine().cluster_rules() != cluster_rules {
            self.market.advance_clock(self.clock.now_ms());
            self.apply_command(None, 0, Command::SetClusterRules { rules: cluster_rules });
        }
        if let Some(fatal) = self.batch.fatal.take() {
            return Err(fatal.into());
        }
        Ok(())
    }
}

/// The journal's entries after `snapshot_seq` applied to `market`: the
/// market, what the replay archived and how many entries it applied. What
/// the replay archives is in the journal's archive already (written in its
/// entry's commit), unless the journal predates the archive: it is written
/// again with the first commit (same key, same value).
fn replay(
    mut market: MarketState,
    journal: &dyn JournalStore,
    snapshot_seq: u64,
) -> anyhow::Result<(MarketState, gpux_market::Archived, u64)> {
    let entries = journal.entries_after(snapshot_seq)?;
    let mut archived = gpux_market::Archived::default();
    for (offset, entry) in entries.iter().enumerate() {
        // What an entry sent went out when it was first applied; replay
        // only rebuilds the state.
        let mut applied = market
            .apply(entry)
            .map_err(|error| anyhow::anyhow!("replaying journal entry {}: {error}", snapshot_seq + 1 + offset as u64))?;
        archived.append(&mut applied.archived);
    }
    Ok((market, archived, entries.len() as u64))
}
