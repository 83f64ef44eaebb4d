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
#[command(name = "gpux-sim", about = "Deterministic gpux market simulator: the real engine and settlement, simulated participants")]
struct Args {
    #[arg(long, default_value_t = 1)]
    seed: u64,
    #[arg(long, default_value_t = 10_000)]
    suppliers: u32,
    #[arg(long, default_value_t = 50_000)]
    renters: u32,
    #[arg(long, default_value_t = 50)]
    aggregators: u32,
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
    /// Exchange restarts (snapshot + journal replay) during the run.
    #[arg(long, default_value_t = 2)]
    restarts: u32,
    /// Where the report goes.
    #[arg(long, default_value = "sim-report")]
    out: PathBuf,
    /// No progress bar.
    #[arg(long)]
    quiet: bool,
}

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let config = SimConfig {
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
        ..SimConfig::full()
    };
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
         {:.1} s of it signing and settling {} usage reports",
        args.days,
        sim.exchange.events_applied,
        sim.metrics.sim_actions,
        events as f64 / elapsed,
        sim.report_wall.as_secs_f64(),
        sim.exchange.reports_settled
    );
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
