//! `gpux-sim`: runs a seeded market simulation and writes its report
//! (Markdown and SVG plots) to a folder. Exits non-zero when an invariant
//! broke, so a run doubles as a check.

use std::path::PathBuf;
use std::time::Instant;

use anyhow::Context;
use clap::Parser;
use gpux_sim::{config::MS_PER_HOUR, report, Sim, SimConfig};
use indicatif::{ProgressBar, ProgressStyle};

#[derive(Parser)]
#[command(
    name = "gpux-sim",
    version,
    about = "Deterministic gpux market simulator: the real engine and settlement, simulated participants"
)]
struct Args {
    /// The random seed: the same seed and flags give the same run, event for event.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Suppliers in the population (each with one to many hosts).
    #[arg(long, default_value_t = 10_000)]
    suppliers: u32,
    /// Renters in the population.
    #[arg(long, default_value_t = 50_000)]
    renters: u32,
    /// Aggregators (buy reserved windows, resell them).
    #[arg(long, default_value_t = 50)]
    aggregators: u32,
    /// Simulated days.
    #[arg(long, default_value_t = 7)]
    days: u32,
    /// Minutes between an agent's usage reports for each leased GPU.
    #[arg(long, default_value_t = 240)]
    report_interval_min: u64,
    /// Share of suppliers that cheat, in basis points (half as many renters try to underpay).
    #[arg(long, default_value_t = 100)]
    cheaters_bps: u32,
    /// Hosts per thousand that crash, and per thousand that lose their network, each day.
    #[arg(long, default_value_t = 20)]
    faults_per_mille: u32,
    /// Multiplies every renter's job rate.
    #[arg(long, default_value_t = 1.3)]
    demand: f64,
    /// Share of renters' bids, in basis points, placed as budget, all-or-none or stop orders.
    #[arg(long, default_value_t = 0)]
    order_types_bps: u32,
    /// Regions: hosts declare one (owners' costs differ by region) and this share of renters, in basis points, bid only in their home region; 0: no regions.
    #[arg(long, default_value_t = 0)]
    regional_renters_bps: u32,
    /// Share of training renters' work, in basis points, submitted as gpux jobs (resumed from checkpoints when a host fails); 0: none.
    #[arg(long, default_value_t = 0)]
    managed_jobs_bps: u32,
    /// Share of training renters' jobs, in basis points, bought as cluster bids (2 to 4 whole 8-GPU hosts on one fabric); data-centre owners then run fabric groups; 0: none.
    #[arg(long, default_value_t = 0)]
    cluster_bids_bps: u32,
    /// Share of inference renters, in basis points, that run a gpux service (autoscaled on a daily traffic curve, replicas replaced) instead of buying leases; 0: none.
    #[arg(long, default_value_t = 0)]
    service_renters_bps: u32,
    /// Exchange restarts (snapshot + journal replay) during the run.
    #[arg(long, default_value_t = 2)]
    restarts: u32,
    /// Where the report goes.
    #[arg(long, default_value = "sim-report")]
    out: PathBuf,
    /// No progress bar.
    #[arg(long)]
    quiet: bool,
    #[command(subcommand)]
    mode: Option<Mode>,
}

#[derive(clap::Subcommand)]
enum Mode {
    /// Trade on a running exchange in real time, as WebSocket clients
    /// (what `gpux-exchange --sim` starts): suppliers keep asks up and report
    /// usage, renters bid; it runs until the exchange goes away.
    Live {
        /// The exchange's gateway, e.g. ws://127.0.0.1:7300.
        #[arg(long)]
        url: String,
        /// 64 hex digits: the seed of the market's operator key (which the
        /// exchange must accept, `--operator-key`) and of its traders' keys.
        #[arg(long)]
        secret_file: PathBuf,
        /// Simulated suppliers keeping asks up.
        #[arg(long, default_value_t = 8)]
        suppliers: u32,
        /// Simulated renters bidding.
        #[arg(long, default_value_t = 16)]
        renters: u32,
    },
}

/// The live market: its keys come from the secret, so a restart on the same
/// secret brings back the same traders.
fn live(url: String, secret_file: &std::path::Path, suppliers: u32, renters: u32) -> anyhow::Result<()> {
    let secret = gpux_protocol::secret_file::read_key(secret_file).map_err(|e| anyhow::anyhow!("the live market's secret: {e}"))?;
    let operator_key = ed25519_dalek::SigningKey::from_bytes(&secret);
    let seed = u64::from_le_bytes(secret[..8].try_into().expect("8 bytes"));
    let options = gpux_sim::live::LiveOptions { url, operator_key, suppliers, renters, seed };
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().context("a runtime for the live market")?;
    runtime.block_on(gpux_sim::live::run(options)).context("live simulated market stopped")
}

/// The simulation the flags ask for.
fn config_of(args: &Args) -> SimConfig {
    SimConfig {
        seed: args.seed,
        suppliers: args.suppliers,
        renters: args.renters,
        aggregators: args.aggregators,
        days: args.days,
        report_interval_ms: args.report_interval_min.max(1) * 60_000,
        cheater_share_bps: args.cheaters_bps,
        fault_per_mille: args.faults_per_mille,
        demand_scale: args.demand,
        restarts: args.restarts,
        order_types_bps: args.order_types_bps,
        regional_renters_bps: args.regional_renters_bps,
        managed_jobs_bps: args.managed_jobs_bps,
        cluster_bids_bps: args.cluster_bids_bps,
        service_renters_bps: args.service_renters_bps,
        ..SimConfig::full()
    }
}

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    if let Some(Mode::Live { url, secret_file, suppliers, renters }) = args.mode {
        // One line, no backtrace: the usual end is the exchange stopping.
        if let Err(error) = live(url, &secret_file, suppliers, renters) {
            eprintln!("gpux-sim: {error:#}");
            std::process::exit(1);
        }
        return Ok(());
    }
    let config = config_of(&args);
    let started = Instant::now();
    let bar = if args.quiet { ProgressBar::hidden() } else { ProgressBar::new(args.days as u64 * 24) };
    bar.set_style(
        ProgressStyle::with_template("{spinner} simulating [{bar:40}] {pos}/{len} h  {elapsed_precise} (eta {eta}) {msg}")
            .expect("the template is valid")
            .progress_chars("=> "),
    );
    bar.set_message("opening accounts and registering GPUs");
    let mut sim = Sim::new(config);
    bar.set_message("");
    sim.run(|simulated_ms| bar.set_position(simulated_ms / MS_PER_HOUR));
    bar.finish_and_clear();
    let elapsed = started.elapsed().as_secs_f64();
    let events = sim.exchange.events_applied + sim.metrics.sim_actions;
    eprintln!(
        "simulated {} days in {elapsed:.1} s: {} engine events + {} simulator actions = {:.0} events/s; \
         {:.1} s of it signing and settling {} usage reports, {:.1} s the renters' {} signed observations",
        args.days,
        sim.exchange.events_applied,
        sim.metrics.sim_actions,
        events as f64 / elapsed,
        sim.report_wall.as_secs_f64(),
        sim.exchange.reports_settled,
        sim.evidence_wall.as_secs_f64(),
        sim.observations
    );
    // What a snapshot would cost a sequencer that copied its state (the
    // exchange's snapshot replica avoids it; docs/PERFORMANCE.md).
    let copying = Instant::now();
    let copy = sim.exchange.market().clone();
    let copy_ms = copying.elapsed().as_secs_f64() * 1e3;
    drop(copy);
    eprintln!("copying the final state: {copy_ms:.2} ms");
    let files = report::render(&sim);
    std::fs::create_dir_all(&args.out).with_context(|| format!("creating {}", args.out.display()))?;
    for (name, contents) in &files.files {
        let path = args.out.join(name);
        std::fs::write(&path, contents).with_context(|| format!("writing {}", path.display()))?;
    }
    eprintln!("report: {}", args.out.join("report.md").display());
    if !files.invariants_hold {
        eprintln!("an invariant broke: see the report's first table");
        std::process::exit(1);
    }
    Ok(())
}

#[cfg(test)]
#[path = "../../support/clap_help.rs"]
mod clap_help;

/// What `clap_help`'s test walks.
#[cfg(test)]
type CliRoot = Args;
