//! What the system tests share: the exchange's recovery of a journal, as
//! `gpux-exchange` runs it at start with the demo listing.
#![allow(dead_code)]

use std::collections::BTreeSet;
use std::path::Path;
use std::sync::Arc;

use gpux_engine::EngineConfig;
use gpux_exchange::gateway::link::Clock;
use gpux_exchange::metrics::Metrics;
use gpux_exchange::sequencer::{BillingPolicy, Sequencer};
use gpux_exchange::snapshots::SnapshotStore;
use gpux_journal::Journal;
use gpux_market::MarketState;

/// The demo listing's billing terms and the default late-report window.
pub fn demo_billing() -> BillingPolicy {
    let config = EngineConfig::demo();
    BillingPolicy {
        fee_bps: config.fee_bps,
        grace_ms: config.billing_grace_ms,
        late_window_ms: gpux_exchange::LATE_REPORT_WINDOW_MS_DEFAULT,
        storage_minor_per_gib_month: gpux_exchange::STORAGE_PRICE_DEFAULT,
    }
}

/// The exchange's recovery of `journal` with the snapshots of `data_dir`
/// (none there: the whole journal is replayed). The error is the
/// recovery's, with its causes, for tests of a refusal.
pub fn recover(journal: Journal, data_dir: &Path) -> Result<Sequencer, String> {
    recover_at(journal, data_dir, Clock::default())
}

/// [`recover`] with the exchange's clock at `clock` (a journal written at
/// another time recovers as of its own time, not the machine's today).
pub fn recover_at(journal: Journal, data_dir: &Path, clock: Clock) -> Result<Sequencer, String> {
    let snapshots = SnapshotStore::open(&data_dir.join("snapshots.redb")).expect("snapshots");
    let market = MarketState::new(EngineConfig::demo()).expect("demo config");
    let metrics = Arc::new(Metrics::default());
    let (sequencer, _) = Sequencer::recover(market, None, Box::new(journal), snapshots, BTreeSet::new(), metrics, demo_billing(), clock)
        .map_err(|error| format!("{error:#}"))?;
    Ok(sequencer)
}
