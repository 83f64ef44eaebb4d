//! `gpux-audit`: replays a command stream through the real engine and writes
//! every event it produces, so anyone can audit the matching of a day's
//! trading, and tools outside the Rust code can drive the engine.
//!
//! Input is JSON lines, one `Input` per line (`{"at_ms":..,"command":{..}}`,
//! format in docs/market-rules.md, "Audit replay"); output is JSON lines, one
//! event per line, with the rejection message added to `rejected` events. A
//! line that does not parse stops the replay with its line number: an audit
//! that skipped input would prove nothing.

mod demo;

use std::fs::File;
use std::io::{self, BufRead, BufReader, BufWriter, Write};
use std::path::PathBuf;

use anyhow::{bail, Context, Result};
use clap::Parser;
use gpux_engine::{Engine, EngineConfig, Event, EventKind, Input};

/// The longest input line accepted (a command is a few hundred bytes).
const LINE_BYTES_MAX: usize = 64 * 1024;

#[derive(Parser)]
#[command(name = "gpux-audit", about = "Replay gpux engine commands (JSON lines) and print the events (JSON lines)")]
struct Args {
    /// Command stream to replay; standard input when absent.
    input: Option<PathBuf>,
    /// Engine configuration (JSON `EngineConfig`); the demo listing when absent.
    #[arg(long)]
    config: Option<PathBuf>,
    /// Replay the built-in demo session instead of reading input.
    #[arg(long, conflicts_with = "input")]
    demo: bool,
    /// Print the demo session's commands (JSON lines) instead of replaying.
    #[arg(long, conflicts_with_all = ["input", "demo"])]
    print_demo_commands: bool,
    /// Replay the engine inputs of an exchange journal (`journal.redb` in the
    /// exchange's data directory; stop the exchange first, redb allows one process).
    #[arg(long, conflicts_with_all = ["input", "demo", "print_demo_commands"])]
    journal: Option<PathBuf>,
    /// With --journal: print the journal's commands as JSON lines instead of replaying.
    #[arg(long, requires = "journal")]
    commands_only: bool,
}

fn main() {
    if let Err(error) = run(Args::parse()) {
        // A reader that stopped reading (`gpux-audit --demo | head`) is not an error.
        let closed_pipe =
            error.chain().any(|cause| cause.downcast_ref::<io::Error>().is_some_and(|e| e.kind() == io::ErrorKind::BrokenPipe));
        if closed_pipe {
            return;
        }
        eprintln!("gpux-audit: {error:#}");
        std::process::exit(2);
    }
}

fn run(args: Args) -> Result<()> {
    let config = match &args.config {
        Some(path) => {
            let text = std::fs::read_to_string(path).with_context(|| format!("reading config {}", path.display()))?;
            serde_json::from_str(&text).with_context(|| format!("parsing config {}", path.display()))?
        }
        None => EngineConfig::demo(),
    };
    let stdout = io::stdout();
    let mut out = BufWriter::new(stdout.lock());
    if args.print_demo_commands {
        for input in demo::inputs() {
            writeln!(out, "{}", serde_json::to_string(&input)?)?;
        }
        return Ok(out.flush()?);
    }
    let mut engine = Engine::new(config).context("engine config")?;
    let mut replayed = 0u64;
    if let Some(path) = &args.journal {
        use gpux_exchange::journal::JournalEntry;
        let journal = gpux_exchange::journal::JournalReader::open(path)?;
        let mut account_keys = std::collections::HashMap::new();
        let mut settlement = gpux_settlement::Settlement::default();
        for entry in journal.entries_after(0)? {
            match entry {
                JournalEntry::Engine(input) if args.commands_only => writeln!(out, "{}", serde_json::to_string(&input)?)?,
                JournalEntry::Engine(input) => write_events(&mut out, engine.apply(&input))?,
                JournalEntry::BindKey { public_key, account } => {
                    account_keys.insert(account, public_key);
                }
                // Usage reports charge leases through settlement, exactly as the exchange did.
                JournalEntry::UsageReport { at_ms, account, report } if !args.commands_only => {
                    let (_, events) = gpux_settlement::settle_report(
                        &mut engine,
                        &mut settlement,
                        &account_keys.get(&account).copied().unwrap_or([0; 32]),
                        at_ms,
                        account,
                        &report,
                    );
                    write_events(&mut out, &events)?;
                }
                JournalEntry::UsageReport { .. } => {}
                // Delivery records move no money (a host's failure ends its lease
                // through its own engine entry); they are written as they are,
                // secrets sealed, so the audit trail shows every delivery step.
                delivery @ (JournalEntry::BidWorkload { .. }
                | JournalEntry::LeaseWorkload { .. }
                | JournalEntry::EncryptionKey { .. }
                | JournalEntry::DeliveryStatus { .. }) => {
                    if !args.commands_only {
                        writeln!(out, "{}", serde_json::to_string(&delivery)?)?;
                    }
                }
            }
            replayed += 1;
        }
        if args.commands_only {
            return Ok(out.flush()?);
        }
    } else if args.demo {
        for input in demo::inputs() {
            write_events(&mut out, engine.apply(&input))?;
            replayed += 1;
        }
    } else {
        let reader: Box<dyn BufRead> = match &args.input {
            Some(path) => Box::new(BufReader::new(File::open(path).with_context(|| format!("opening {}", path.display()))?)),
            None => Box::new(BufReader::new(io::stdin())),
        };
        replayed = replay(reader, &mut engine, &mut out)?;
    }
    out.flush()?;
    eprintln!("gpux-audit: replayed {replayed} commands, {} events, state hash {:016x}", engine.next_event_seq() - 1, engine.state_hash());
    Ok(())
}

fn replay(reader: impl BufRead, engine: &mut Engine, out: &mut impl Write) -> Result<u64> {
    let mut replayed = 0;
    for (index, line) in reader.lines().enumerate() {
        let line_number = index + 1;
        let line = line.with_context(|| format!("line {line_number}: reading"))?;
        if line.len() > LINE_BYTES_MAX {
            bail!("line {line_number}: longer than {LINE_BYTES_MAX} bytes");
        }
        if line.trim().is_empty() {
            continue;
        }
        let input: Input = serde_json::from_str(&line).with_context(|| format!("line {line_number}: not a valid command"))?;
        write_events(out, engine.apply(&input))?;
        replayed += 1;
    }
    Ok(replayed)
}

fn write_events(out: &mut impl Write, events: &[Event]) -> Result<()> {
    for event in events {
        let mut value = serde_json::to_value(event)?;
        if let EventKind::Rejected { code, .. } = event.kind {
            value["kind"]["rejected"]["message"] = code.message().into();
        }
        writeln!(out, "{value}")?;
    }
    Ok(())
}
