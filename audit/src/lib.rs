//! The audit's replay of an exchange journal, as a library so that tests
//! can prove the exchange, the simulator and the audit reach the same state
//! from the same journal (they share `gpux_market::MarketState::apply`).

use std::io::Write;
use std::path::Path;

use anyhow::{Context, Result};
use gpux_engine::{Event, EventKind};
use gpux_market::{JournalEntry, MarketState};

/// Replays every entry of the journal at `path` (opened read-only) through
/// `market`, writing the events as JSON lines to `out` (delivery records
/// too, secrets sealed); with `commands_only`, writes the engine commands
/// instead and applies nothing. Returns the entries read.
pub fn replay_journal(path: &Path, market: &mut MarketState, out: &mut impl Write, commands_only: bool) -> Result<u64> {
    replay_journals(&[path], market, out, commands_only)
}

/// An engine configuration (`gpux-audit --config`, JSON `EngineConfig`),
/// from this build or an older one: fields added since are filled as the
/// engine behaved before them (`currency`: US$ in millionths, as every
/// journal before currencies; a class's `sla_credit_tiers`: the schedule
/// then fixed in the engine, `default_credit_tiers` of its SLA level).
/// Fields the engine added with `#[serde(default)]` need nothing here.
pub fn parse_config(text: &str) -> Result<gpux_engine::EngineConfig> {
    let mut value: serde_json::Value = serde_json::from_str(text).context("not JSON")?;
    let object = value.as_object_mut().context("an engine configuration is a JSON object")?;
    if !object.contains_key("currency") {
        object.insert("currency".into(), serde_json::to_value(gpux_engine::config::Currency::usd_micro())?);
    }
    for class in object.get_mut("classes").and_then(|c| c.as_array_mut()).into_iter().flatten() {
        let Some(class) = class.as_object_mut() else { continue };
        if !class.contains_key("sla_credit_tiers") {
            let sla = class.get("sla_availability_bps").and_then(|v| v.as_u64()).context("a class without sla_availability_bps")?;
            let tiers = gpux_engine::config::default_credit_tiers(u32::try_from(sla).context("sla_availability_bps")?);
            class.insert("sla_credit_tiers".into(), serde_json::to_value(tiers)?);
        }
    }
    Ok(serde_json::from_value(value)?)
}

/// Entries read from a journal file at a time.
const REPLAY_CHUNK: usize = 65_536;

/// [`replay_journal`] over several files read as one journal: the
/// archives `gpux-exchange journal archive` wrote, oldest first, then the
/// journal itself. Each must start where the one before it ended (the
/// first at entry 1).
pub fn replay_journals(paths: &[&Path], market: &mut MarketState, out: &mut impl Write, commands_only: bool) -> Result<u64> {
    let mut next = 1;
    for path in paths {
        let journal = gpux_journal::JournalReader::open(path)?;
        let first = journal.first_seq()?;
        anyhow::ensure!(
            first == next,
            "{} starts at entry {first}, not {next}: name the archives that hold the entries before it first, oldest first",
            path.display()
        );
        loop {
            let entries = journal.entries_range(next - 1, REPLAY_CHUNK).with_context(|| format!("reading {}", path.display()))?;
            if entries.is_empty() {
                break;
            }
            for entry in entries {
                replay_entry(next, entry, market, out, commands_only)?;
                next += 1;
            }
        }
    }
    Ok(next - 1)
}

fn replay_entry(seq: u64, entry: JournalEntry, market: &mut MarketState, out: &mut impl Write, commands_only: bool) -> Result<()> {
    if commands_only {
        if let JournalEntry::Engine(input) = &entry {
            writeln!(out, "{}", serde_json::to_string(input)?)?;
        }
        return Ok(());
    }
    let applied = market.apply(&entry).with_context(|| format!("journal entry {seq}"))?;
    // Delivery records move no money (a host's failure ends its lease
    // through its own engine entry); they are written as they are,
    // secrets sealed, so the audit trail shows every delivery step.
    if matches!(
        entry,
        JournalEntry::BidWorkload { .. }
            | JournalEntry::LeaseWorkload { .. }
            | JournalEntry::EncryptionKey { .. }
            | JournalEntry::DeliveryStatus { .. }
    ) {
        writeln!(out, "{}", serde_json::to_string(&entry)?)?;
    }
    // Usage reports charge leases through settlement, exactly as the exchange did.
    write_events(out, &applied.events)?;
    write_archived(out, &applied.archived)?;
    Ok(())
}

/// Writes events as JSON lines, with the message of each rejection added.
pub fn write_events(out: &mut impl Write, events: &[Event]) -> Result<()> {
    for event in events {
        let mut value = serde_json::to_value(event)?;
        if let EventKind::Rejected { code, .. } = event.kind {
            value["kind"]["rejected"]["message"] = code.message().into();
        }
        writeln!(out, "{value}")?;
    }
    Ok(())
}

/// Writes what an entry archived (left the market's hot state), one JSON
/// line each: `{"lease_archived": {..the lease as it ended..}}`,
/// `{"contract_archived": {..}}` and `{"instrument_archived": {..the window
/// as it was listed..}}`.
pub fn write_archived(out: &mut impl Write, archived: &gpux_market::Archived) -> Result<()> {
    for lease in &archived.leases {
        writeln!(out, "{}", serde_json::json!({ "lease_archived": lease.info }))?;
    }
    for contract in &archived.contracts {
        writeln!(out, "{}", serde_json::json!({ "contract_archived": contract }))?;
    }
    for instrument in &archived.instruments {
        writeln!(out, "{}", serde_json::json!({ "instrument_archived": instrument }))?;
    }
    Ok(())
}

/// Writes every supplier's reliability record and score as of the market's
/// clock, one line each, in account order: `{"supplier_score": {"supplier":
/// .., "record": {..}}}` (the `record` of the exchange's `supplier_stats`
/// answer; a supplier without facts yet has an empty, unrated record).
pub fn write_scores(out: &mut impl Write, market: &gpux_market::MarketState) -> Result<()> {
    let (engine, reliability) = (market.engine(), market.reliability());
    let suppliers = (0..engine.account_count()).map(gpux_engine::AccountId).filter(|a| engine.role(*a).is_some_and(|r| r.may_supply()));
    for supplier in suppliers {
        let record = reliability.supplier(supplier, market.clock_ms());
        writeln!(out, "{}", serde_json::json!({ "supplier_score": { "supplier": supplier, "record": record } }))?;
    }
    Ok(())
}
