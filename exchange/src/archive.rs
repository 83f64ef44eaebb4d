//! `gpux-exchange journal archive` and `journal restore` (docs/operations.md
//! "Archiving the journal"): the journal's oldest entries moved to a file of
//! their own, and back. Run with the exchange stopped (redb admits one
//! process per file: a running exchange's files refuse to open).
//!
//! An archive may take only what a restart does not replay: entries up to
//! the newest snapshot that verifies (a single exchange's `snapshots.redb`)
//! or that the node's Raft state machine stored (`raft-machine.redb`).

use std::path::Path;

use anyhow::{Context, Result};
use gpux_journal::{ArchiveOutcome, Journal};

/// Why the journal was not archived. Callers branch on it (the command
/// line names the remedy).
#[derive(Debug, thiserror::Error)]
pub enum ArchiveRefused {
    #[error("no snapshot to restart from: the exchange would need every entry (let it run until it writes one)")]
    NoSnapshot,
    #[error("entry {before} is after the newest snapshot (entry {snapshot}): a restart would need what is archived; archive before {limit} at most", limit = snapshot + 1)]
    AfterTheSnapshot { before: u64, snapshot: u64 },
}

/// The last journal entry a restart of the exchange in `data_dir` does not
/// replay (its newest usable snapshot's).
pub fn snapshot_seq(data_dir: &Path) -> Result<Option<u64>> {
    let machine = data_dir.join("raft-machine.redb");
    if machine.exists() {
        // A cluster node: its state machine's stored snapshot.
        let machine = gpux_replica::state_machine::MarketMachine::open(&machine, gpux_engine::EngineConfig::demo())
            .context("opening raft-machine.redb")?;
        return Ok(machine.journal_next().checked_sub(1).filter(|seq| *seq > 0));
    }
    let snapshots = data_dir.join("snapshots.redb");
    if !snapshots.exists() {
        return Ok(None);
    }
    let store = crate::snapshots::SnapshotStore::open(&snapshots)?;
    Ok(store.latest_valid()?.map(|snapshot| snapshot.journal_seq))
}

/// Moves the journal's entries before `before` (default: every entry the
/// newest snapshot includes) to the journal file `to`, and gives back the
/// space they took in `journal.redb`.
pub fn archive(data_dir: &Path, before: Option<u64>, to: &Path) -> Result<ArchiveOutcome> {
    let snapshot = snapshot_seq(data_dir)?.ok_or(ArchiveRefused::NoSnapshot)?;
    let before = before.unwrap_or(snapshot + 1);
    if before > snapshot + 1 {
        return Err(ArchiveRefused::AfterTheSnapshot { before, snapshot }.into());
    }
    let mut journal = Journal::open(&data_dir.join("journal.redb"))?;
    let outcome = journal.archive_before(before, to)?;
    journal.compact().context("compacting journal.redb")?;
    Ok(outcome)
}

/// Puts the entries of the archive `from` back in front of the journal
/// (the newest archive first): what a restart needs when no snapshot
/// serves (one written by an older version that this one cannot read).
pub fn restore(data_dir: &Path, from: &Path) -> Result<u64> {
    let mut journal = Journal::open(&data_dir.join("journal.redb"))?;
    Ok(journal.restore_from(from)?)
}
