//! `gpux-audit`: replays a command stream or an exchange journal through the
//! market's one apply path (`gpux_market::MarketState::apply`, the code the
//! exchange runs) and writes every event it produces, so anyone can audit a
//! day's trading and its billing, and tools outside the Rust code can drive
//! the engine.
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
use gpux_audit::{write_archived, write_events};
use gpux_engine::{EngineConfig, Input};
use gpux_market::{JournalEntry, MarketState};

/// The longest input line accepted (a command is a few hundred bytes).
const LINE_BYTES_MAX: usize = 64 * 1024;

#[derive(Parser)]
#[command(name = "gpux-audit", version, about = "Replay gpux engine commands (JSON lines) and print the events (JSON lines)")]
struct Args {
    /// Command stream to replay; standard input when absent.
    input: Option<PathBuf>,
    /// Engine configuration (JSON `EngineConfig`, also as older builds wrote
    /// it); the demo listing when absent.
    #[arg(long)]
    config: Option<PathBuf>,
    /// Replay the built-in demo session instead of reading input.
    #[arg(long, conflicts_with = "input")]
    demo: bool,
    /// Print the demo session's commands (JSON lines) instead of replaying.
    #[arg(long, conflicts_with_all = ["input", "demo"])]
    print_demo_commands: bool,
    /// Replay the engine inputs of an exchange journal (`journal.redb` in the
    /// exchange's data directory; stop the exchange first, redb allows one
    /// process). Repeat it to name the archives `gpux-exchange journal
    /// archive` wrote, oldest first, then the journal.
    #[arg(long, conflicts_with_all = ["input", "demo", "print_demo_commands"])]
    journal: Vec<PathBuf>,
    /// With --journal: print the journal's commands as JSON lines instead of replaying.
    #[arg(long, requires = "journal")]
    commands_only: bool,
    /// After the replay, print every supplier's reliability record and score
    /// as of the last entry, one `{"supplier_score": ..}` line each (the
    /// exchange's `supplier_stats` answers the same).
    #[arg(long, conflicts_with_all = ["print_demo_commands", "commands_only"])]
    scores: bool,
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
            gpux_audit::parse_config(&text).with_context(|| format!("parsing config {}", path.display()))?
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
    // The one apply path the exchange and the simulator use.
    let mut market = MarketState::new(config).context("engine config")?;
    let mut replayed = 0u64;
    if !args.journal.is_empty() {
        let paths: Vec<&std::path::Path> = args.journal.iter().map(PathBuf::as_path).collect();
        replayed = gpux_audit::replay_journals(&paths, &mut market, &mut out, args.commands_only)?;
        if args.commands_only {
            return Ok(out.flush()?);
        }
    } else if args.demo {
        for input in demo::inputs() {
            let applied = market.apply(&JournalEntry::Engine(input))?;
            write_events(&mut out, &applied.events)?;
            write_archived(&mut out, &applied.archived)?;
            replayed += 1;
        }
    } else {
        let reader: Box<dyn BufRead> = match &args.input {
            Some(path) => Box::new(BufReader::new(File::open(path).with_context(|| format!("opening {}", path.display()))?)),
            None => Box::new(BufReader::new(io::stdin())),
        };
        replayed = replay(reader, &mut market, &mut out)?;
    }
    if args.scores {
        gpux_audit::write_scores(&mut out, &market)?;
    }
    out.flush()?;
    eprintln!(
        "gpux-audit: replayed {replayed} entries, {} events, state hash {:016x}",
        market.engine().next_event_seq() - 1,
        market.state_hash()
    );
    Ok(())
}

fn replay(reader: impl BufRead, market: &mut MarketState, out: &mut impl Write) -> Result<u64> {
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
        let applied = market.apply(&JournalEntry::Engine(input)).with_context(|| format!("line {line_number}"))?;
        write_events(out, &applied.events)?;
        write_archived(out, &applied.archived)?;
        replayed += 1;
    }
    Ok(replayed)
}

#[cfg(test)]
#[path = "../../support/clap_help.rs"]
mod clap_help;

/// What `clap_help`'s test walks.
#[cfg(test)]
type CliRoot = Args;
