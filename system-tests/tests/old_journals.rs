//! Journals written by an older build stay readable (docs/operations.md
//! "Formats and upgrades"): a journal file an older build wrote, kept in
//! `tests/fixtures/`, replays in this build, through the audit and through
//! the exchange's recovery, to the balances that build recorded beside it;
//! and this build marks the file with its format version as it opens it.
//!
//! The fixture is a simulated day (trades, every order type, regional bids,
//! managed jobs, leases, signed usage reports, cheats and restarts) written
//! by `write_the_fixture` below, run with the build whose journals are to
//! stay readable:
//!
//! ```sh
//! cargo test -p gpux-system-tests --test old_journals -- --ignored write_the_fixture
//! ```
//!
//! A rule change that changes what an old journal replays to breaks this
//! test: that is the point (an exchange's history must not change when it
//! upgrades). Such a change needs its own journal entry or a format version
//! with an upcast, never a silent difference.

mod common;

use std::path::{Path, PathBuf};

use gpux_engine::{AccountId, EngineConfig};
use gpux_journal::{Journal, JournalReader, FORMAT_VERSION};
use gpux_market::MarketState;
use gpux_sim::{Sim, SimConfig};
use serde_json::{json, Value};

/// The fixture: a journal file written on 2026-12-06 (format 1, before the
/// format version was recorded), and what it replays to.
const FIXTURE: &str = "journal-2026-12-06";

fn fixture(ext: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures").join(format!("{FIXTURE}.{ext}"))
}

/// What a market's accounts hold, account by account, and its counts.
fn facts(market: &MarketState, entries: usize) -> Value {
    let engine = market.engine();
    let balances: Vec<Value> = (0..engine.account_count())
        .map(|account| {
            let b = engine.balances(AccountId(account)).expect("an account below the count");
            json!([b.available_minor, b.held_minor, b.payable_minor, b.debt_minor])
        })
        .collect();
    json!({ "entries": entries, "accounts": engine.account_count(), "balances": balances })
}

#[test]
#[ignore = "writes the fixture: run with the build whose journals are to stay readable"]
fn write_the_fixture() {
    let config = SimConfig {
        suppliers: 8,
        renters: 30,
        days: 1,
        record_journal: true,
        order_types_bps: 2_000,
        regional_renters_bps: 2_000,
        managed_jobs_bps: 1_000,
        ..SimConfig::small(11)
    };
    let mut sim = Sim::new(config);
    sim.run(|_| {});
    let entries = sim.exchange.journal();
    let path = fixture("redb");
    let _ = std::fs::remove_file(&path);
    {
        let mut journal = Journal::open(&path).expect("journal");
        for batch in entries.chunks(4_096) {
            journal.append(batch).expect("append");
        }
    }
    let facts = facts(sim.exchange.market(), entries.len());
    std::fs::write(fixture("json"), serde_json::to_string(&facts).expect("JSON") + "\n").expect("facts");
}

#[test]
fn a_journal_an_older_build_wrote_replays_to_the_balances_it_recorded() {
    let expected: Value = serde_json::from_str(&std::fs::read_to_string(fixture("json")).expect("the fixture's facts")).expect("JSON");
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("journal.redb");
    std::fs::copy(fixture("redb"), &path).expect("a copy of the fixture");

    // The audit, read-only: the file is not changed.
    let entries = JournalReader::open(&path).expect("opens read-only").entries_after(0).expect("every entry decodes");
    assert_eq!(entries.len() as u64, expected["entries"].as_u64().expect("a count"));
    let mut audited = MarketState::new(EngineConfig::demo()).expect("demo config");
    gpux_audit::replay_journal(&path, &mut audited, &mut std::io::sink(), false).expect("the audit replays it");
    assert_eq!(facts(&audited, entries.len()), expected, "the audit's replay reaches the recorded balances");
    assert_eq!(JournalReader::open(&path).expect("opens").format_version().expect("reads"), None, "an older build's file has no version");

    // The exchange's recovery: the same balances, and the file is marked.
    // It recovers as of the journal's last entry: the recorded balances are
    // the market's then, and at the machine's today the leases and bids
    // of a journal written days ago have run out (the test failed from the
    // day after the fixture's market ended, whatever the build).
    let last_ms = entries.iter().filter_map(|entry| entry.at_ms()).max().expect("timed entries");
    let wall_ms = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).expect("clock").as_millis() as i64;
    let clock = gpux_exchange::gateway::link::Clock { offset_ms: last_ms as i64 - wall_ms };
    let journal = Journal::open(&path).expect("opens");
    let sequencer = common::recover_at(journal, dir.path(), clock).expect("the exchange recovers");
    assert_eq!(facts(sequencer.market(), entries.len()), expected, "the recovery reaches the recorded balances");
    drop(sequencer);
    assert_eq!(JournalReader::open(&path).expect("opens").format_version().expect("reads"), Some(FORMAT_VERSION));
}
