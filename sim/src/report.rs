//! The run's report: a Markdown summary with the invariants first, then what
//! the market did, and SVG plots (plotters, drawn without system fonts so the
//! bytes depend on the data alone). Money is printed from integer minor units
//! (1 minor unit = US$0.000001); ratios are computed here and nowhere else.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use plotters::prelude::*;

use crate::config::MS_PER_HOUR;
use crate::metrics::{JobStats, Metrics};
use crate::population::CLASSES;
use crate::Sim;

/// The report's files: name and contents.
pub struct ReportFiles {
    pub files: Vec<(String, String)>,
    pub invariants_hold: bool,
}

/// What a Raft log entry adds to the journal entries it carries (log id,
/// payload tag, length, as bincode encodes them), in bytes: measured 9 for
/// a one-entry batch at log index 123 456.
const RAFT_BATCH_OVERHEAD_BYTES: u64 = 10;

fn dollars(minor: u128) -> String {
    let cents = minor / 10_000;
    let whole = cents / 100;
    let mut grouped = String::new();
    let digits = whole.to_string();
    for (index, digit) in digits.chars().enumerate() {
        if index > 0 && (digits.len() - index).is_multiple_of(3) {
            grouped.push(',');
        }
        grouped.push(digit);
    }
    format!("${grouped}.{:02}", cents % 100)
}

fn percent(part: u64, whole: u64) -> String {
    if whole == 0 {
        "-".into()
    } else {
        format!("{:.1}%", part as f64 * 100.0 / whole as f64)
    }
}

fn quantile_duration(sorted: &[u64], q: f64) -> String {
    if sorted.is_empty() {
        return "-".into();
    }
    let index = ((sorted.len() - 1) as f64 * q).round() as usize;
    duration(sorted[index])
}

/// A duration a person reads at a glance: "at once" (under a second),
/// seconds, minutes or hours.
fn duration(ms: u64) -> String {
    match ms {
        0..1_000 => "at once (< 1 s)".into(),
        1_000..60_000 => format!("{} s", ms / 1_000),
        60_000..3_600_000 => format!("{:.1} min", ms as f64 / 60_000.0),
        _ => format!("{:.1} h", ms as f64 / 3_600_000.0),
    }
}

/// Codes counted by their Rust names (`InsufficientCapacity`), as the
/// protocol writes them: `insufficient_capacity 76, price_off_tick 2`.
fn code_counts(counts: &BTreeMap<String, u64>) -> String {
    if counts.is_empty() {
        return "none".into();
    }
    counts.iter().map(|(code, count)| format!("`{}` {count}", snake(code))).collect::<Vec<_>>().join(", ")
}

fn snake(name: &str) -> String {
    let mut out = String::new();
    for (index, c) in name.chars().enumerate() {
        if c.is_uppercase() {
            if index > 0 {
                out.push('_');
            }
            out.extend(c.to_lowercase());
        } else {
            out.push(c);
        }
    }
    out
}

fn check(ok: bool) -> &'static str {
    if ok {
        "holds"
    } else {
        "**BROKEN**"
    }
}

/// The invariants the issue names, each with what the run found.
pub fn invariants(sim: &Sim) -> Vec<(String, bool, String)> {
    let m = &sim.metrics;
    let b = &m.billing;
    let cheats_attempted: u64 = m.cheats.values().chain(m.renter_cheats.values()).map(|c| c.attempts).sum();
    let mut list = vec![
        ("No GPU leased twice at once".into(), m.double_bookings == 0, format!("{} overlapping lease intervals", m.double_bookings)),
        (
            "Ledger balanced and equal to the engine's balances".into(),
            sim.ledger_matches_engine(),
            format!("{} transfers, sum {}", sim.exchange.transfers_posted, sim.exchange.ledger().sum()),
        ),
        (
            "Every usage charge = floor(price x verified GPU-time / 1 h)".into(),
            b.charge_rule_violations == 0,
            format!("{} leases closed, {} off the rule", b.leases_closed, b.charge_rule_violations),
        ),
        (
            "Never billed for GPU-time not delivered (but by fake-availability hosts, see Disputes)".into(),
            b.overbilled_leases == 0,
            format!("{} leases over, by {} GPU-ms", b.overbilled_leases, b.overbilled_gpu_ms),
        ),
        (
            "Honest, on-time leases billed exactly what they delivered".into(),
            b.clean_mismatches == 0,
            format!("{} such leases, {} differ", b.clean_leases, b.clean_mismatches),
        ),
        ("Every injected cheat caught, no money moved".into(), m.every_cheat_caught(), format!("{cheats_attempted} attempts")),
        ("Every hardware cheater caught by a challenge, no honest GPU failed one".into(), m.hardware_cheats_caught_and_honest_spared(), {
            let caught: u64 = m.challenges.iter().filter(|(k, _)| k.is_some()).map(|(_, s)| s.suppliers_caught).sum();
            let issued: u64 = m.challenges.values().map(|s| s.issued).sum();
            format!("{issued} challenges, {caught} cheaters caught")
        }),
        (
            "Every watched fake-availability lease disputed, no truthful host disputed".into(),
            m.fake_availability_disputed_and_honest_spared(),
            {
                let disputed: u64 = m.disputes.values().map(|s| s.leases_disputed).sum();
                let observations: u64 = m.disputes.values().map(|s| s.observations).sum();
                format!("{observations} signed observations, {disputed} leases disputed")
            },
        ),
        (
            "Exchange restarts replay to the same state".into(),
            m.faults.restart_mismatches == 0,
            format!("{} restarts, {} journal entries replayed", m.faults.restarts, m.faults.restart_entries_replayed),
        ),
    ];
    if sim.config.regional_renters_bps > 0 {
        let regional: u64 = m.regions.values().map(|r| r.regional_leases).sum();
        list.push((
            "Renters who bid only in their region leased only there".into(),
            m.regional_leases_elsewhere == 0,
            format!("{regional} such leases, {} elsewhere", m.regional_leases_elsewhere),
        ));
    }
    list
}

/// Writes the Markdown report and its plots. Deterministic: no clock, no
/// paths, no hash-ordered iteration.
pub fn render(sim: &Sim) -> ReportFiles {
    let m = &sim.metrics;
    let c = &sim.config;
    let mut md = String::new();
    let invariants = invariants(sim);
    let invariants_hold = invariants.iter().all(|(_, ok, _)| *ok);
    let _ = writeln!(md, "# gpux market simulation\n");
    let _ = writeln!(
        md,
        "Seed {}, {} days, {} suppliers with {} GPUs, {} renters, {} aggregators. The real engine, settlement and ledger ran \
         in-process on simulated time: {} engine events, {} simulator actions, {} ledger transfers.\n",
        c.seed,
        c.days,
        c.suppliers,
        sim.gpu_count(),
        c.renters,
        c.aggregators,
        sim.exchange.events_applied,
        m.sim_actions,
        sim.exchange.transfers_posted
    );
    let days = c.days.max(1) as u64;
    let entry_bytes = sim.exchange.journal_entry_bytes / sim.exchange.journal_entries.max(1);
    // docs/operations.md "The Raft log": a cluster node keeps about 14 000
    // log entries (sequencer batches) behind its snapshot; a batch adds its
    // log id and framing.
    let raft_log_kept = 14_000 * (entry_bytes + RAFT_BATCH_OVERHEAD_BYTES);
    let _ = writeln!(
        md,
        "Journal growth: {} entries, {:.1} MiB as the journal encodes them ({:.1} MiB a day, {} bytes an entry on average); \
         the journal file adds redb's pages and the indexes of {} ledger transfers, trades and fills. A cluster node's Raft log \
         writes the same entries again (plus about {RAFT_BATCH_OVERHEAD_BYTES} bytes a batch) but keeps only about 14 000 \
         batches behind its snapshot: {:.1} MiB at one entry a batch, whatever the days (docs/operations.md \"Disk space\").\n",
        sim.exchange.journal_entries,
        sim.exchange.journal_entry_bytes as f64 / (1 << 20) as f64,
        sim.exchange.journal_entry_bytes as f64 / (1 << 20) as f64 / days as f64,
        entry_bytes,
        sim.exchange.transfers_posted,
        raft_log_kept as f64 / (1 << 20) as f64,
    );
    let _ = writeln!(md, "## Invariants\n\n| Invariant | Result | Found |\n|---|---|---|");
    for (name, ok, found) in &invariants {
        let _ = writeln!(md, "| {name} | {} | {found} |", check(*ok));
    }
    utilisation_section(&mut md, m);
    prices_section(&mut md, m);
    fills_section(&mut md, m);
    billing_section(&mut md, m);
    revenue_section(&mut md, m);
    cheats_section(&mut md, m);
    challenges_section(&mut md, m);
    disputes_section(&mut md, m, sim.config.report_interval_ms);
    scores_section(&mut md, m);
    faults_section(&mut md, m);
    hot_state_section(&mut md, m);
    let files = vec![
        ("report.md".to_string(), md),
        ("utilisation.svg".to_string(), plot_utilisation(m)),
        ("prices.svg".to_string(), plot_prices(m)),
        ("revenue.svg".to_string(), plot_revenue(m)),
    ];
    ReportFiles { files, invariants_hold }
}

fn utilisation_section(md: &mut String, m: &Metrics) {
    let _ = writeln!(
        md,
        "\n## Utilisation\n\nLeased GPUs over GPUs available to lease (registered, online, host up), sampled every 15 minutes.\n"
    );
    let _ = writeln!(md, "![utilisation](utilisation.svg)\n\n| Class | Mean | Busiest hour | Quietest hour |\n|---|---|---|---|");
    for (index, class) in CLASSES.iter().enumerate() {
        let hourly: Vec<f64> = m
            .hours
            .iter()
            .filter(|h| h[index].available_gpu_samples > 0)
            .map(|h| h[index].leased_gpu_samples as f64 / h[index].available_gpu_samples as f64 * 100.0)
            .collect();
        let leased: u64 = m.hours.iter().map(|h| h[index].leased_gpu_samples).sum();
        let available: u64 = m.hours.iter().map(|h| h[index].available_gpu_samples).sum();
        let max = hourly.iter().copied().fold(f64::NAN, f64::max);
        let min = hourly.iter().copied().fold(f64::NAN, f64::min);
        let _ = writeln!(md, "| {} | {} | {max:.1}% | {min:.1}% |", class.name, percent(leased, available));
    }
    let days: Vec<String> = m.preemptions_by_day.iter().enumerate().map(|(day, n)| format!("day {}: {n}", day + 1)).collect();
    let _ = writeln!(md, "\nPreemption notices: {}.", days.join(", "));
    let _ = writeln!(
        md,
        "\nLeases created: {} spot, {} preemptible, {} reserved-window.",
        m.leases_by_kind[0], m.leases_by_kind[1], m.leases_by_kind[2]
    );
}

fn prices_section(md: &mut String, m: &Metrics) {
    let _ =
        writeln!(md, "\n## Clearing prices\n\nVolume-weighted trade price per GPU-hour over the run, and the range of hourly prices.\n");
    let _ = writeln!(
        md,
        "![prices](prices.svg)\n\n| Class | Contract | GPUs traded | VWAP | Hourly low | Hourly high |\n|---|---|---|---|---|---|"
    );
    for (index, class) in CLASSES.iter().enumerate() {
        for (kind, label) in ["spot", "preemptible", "reserved window"].iter().enumerate() {
            let notional: u128 = m.trades.iter().map(|h| h[index][kind].notional_minor).sum();
            let gpus: u64 = m.trades.iter().map(|h| h[index][kind].gpus).sum();
            if gpus == 0 {
                continue;
            }
            let hourly: Vec<u128> = m
                .trades
                .iter()
                .filter(|h| h[index][kind].gpus > 0)
                .map(|h| h[index][kind].notional_minor / h[index][kind].gpus as u128)
                .collect();
            let low = hourly.iter().min().copied().unwrap_or(0);
            let high = hourly.iter().max().copied().unwrap_or(0);
            let _ = writeln!(
                md,
                "| {} | {label} | {gpus} | {} | {} | {} |",
                class.name,
                dollars(notional / gpus as u128),
                dollars(low),
                dollars(high)
            );
        }
    }
}

fn job_row(md: &mut String, label: &str, stats: &JobStats) {
    let mut sorted = stats.time_to_fill_ms.clone();
    sorted.sort_unstable();
    let _ = writeln!(
        md,
        "| {label} | {} | {} | {} | {} | {} | {} |",
        stats.placed,
        percent(stats.gpus_filled, stats.gpus_wanted),
        percent(stats.fully_filled, stats.placed),
        percent(stats.unfilled, stats.placed),
        quantile_duration(&sorted, 0.5),
        quantile_duration(&sorted, 0.9)
    );
}

/// Training work submitted as gpux jobs beside leases bought by hand.
fn managed_section(md: &mut String, m: &Metrics) {
    let j = &m.managed;
    if j.submitted == 0 {
        return;
    }
    let failed: u64 = j.failed.values().sum();
    let reasons: Vec<String> = j.failed.iter().map(|(reason, count)| format!("{reason} {count}")).collect();
    let mut waiting = j.waiting_ms.clone();
    waiting.sort_unstable();
    let mut finish = j.time_to_finish_ms.clone();
    finish.sort_unstable();
    let gpu_hours = |ms: u64| ms as f64 / MS_PER_HOUR as f64;
    let per_hour = |minor: u64, ms: u64| if ms == 0 { 0.0 } else { minor as f64 / 1e6 / gpu_hours(ms) };
    let _ = writeln!(
        md,
        "\n## Training as gpux jobs\n\nA share of training renters' work (`--managed-jobs-bps`) was submitted as jobs: the exchange bids, \
         fails a lease whose agent is gone (30 s after the last word, checked every 10 min here) or whose host says nothing for three report intervals, and the job resumes on another host from its last \
         checkpoint (every 30 min). Half of the jobs bid the preemptible book: at a notice the workload checkpoints and exits within 5 s and the job bids its next attempt.\n"
    );
    let _ = writeln!(md, "| | |\n|---|---|");
    let _ = writeln!(md, "| jobs submitted | {} |", j.submitted);
    let _ = writeln!(md, "| succeeded | {} ({}) |", j.succeeded, percent(j.succeeded, j.submitted));
    let _ = writeln!(md, "| failed | {failed}{} |", if reasons.is_empty() { String::new() } else { format!(" ({})", reasons.join(", ")) });
    let _ = writeln!(md, "| still bidding or running at the end | {} |", j.unfinished);
    let mut resumed = j.notice_to_resume_ms.clone();
    resumed.sort_unstable();
    let _ = writeln!(md, "| preemptible (bid a preemptible book) | {} |", j.preemptible);
    let _ = writeln!(md, "| attempts ended by a host (resumed elsewhere) | {} |", j.failovers);
    let _ = writeln!(md, "| attempts ended by a preemption (checkpointed at the notice, resumed elsewhere) | {} |", j.preemptions);
    let _ = writeln!(
        md,
        "| work lost to failures | {:.1} GPU-h (since the last checkpoint); by hand, with nothing to resume from: {:.1} GPU-h |",
        gpu_hours(j.lost_work_gpu_ms),
        gpu_hours(j.lost_work_by_hand_gpu_ms)
    );
    let _ = writeln!(
        md,
        "| time from a failure to the next attempt's lease | p50 {} · p90 {} |",
        quantile_duration(&waiting, 0.5),
        quantile_duration(&waiting, 0.9)
    );
    let _ = writeln!(
        md,
        "| time from a preemption notice to the next attempt's lease | p50 {} · p90 {} |",
        quantile_duration(&resumed, 0.5),
        quantile_duration(&resumed, 0.9)
    );
    let _ = writeln!(
        md,
        "| time from submission to success | p50 {} · p90 {} |",
        quantile_duration(&finish, 0.5),
        quantile_duration(&finish, 0.9)
    );
    let _ = writeln!(
        md,
        "| cost per GPU-hour of useful work (succeeded jobs, every attempt paid) | ${:.2}; training leases bought by hand: ${:.2} per verified GPU-hour (work lost to their failures not counted) |",
        per_hour(j.charged_minor, j.useful_gpu_ms),
        per_hour(j.by_hand_charged_minor, j.by_hand_gpu_ms)
    );
}

/// Inference served as gpux services beside a fleet bought by hand for the peak.
fn services_section(md: &mut String, m: &Metrics) {
    let s = &m.services;
    if s.created == 0 && s.refused == 0 {
        return;
    }
    let gpu_hours = |ms: u64| ms as f64 / MS_PER_HOUR as f64;
    let scalings: Vec<String> = s.scalings.iter().map(|(reason, count)| format!("{reason} {count}")).collect();
    let _ = writeln!(
        md,
        "\n## Inference as gpux services\n\nA share of inference renters (`--service-renters-bps`) ran one service each instead of buying leases: \
         1-GPU replicas on their class's spot book (a third on the preemptible book), scaled by the exchange on requests per second \
         (40 a replica; up after 10 min above, down after 30 min below, from 1 to the peak's need and one more). Traffic follows the day: \
         a tenth of the peak at night, the peak (40 to 300 requests a second) in the afternoon. The simulator plays the router (a load \
         report every 5 min) and each replica's host (running 90 s after its lease starts; a replica serves at most 50 requests a second). \
         A replica whose lease ends early (a host gone silent, a preemption) is replaced by the market.\n"
    );
    let _ = writeln!(md, "| | |\n|---|---|");
    let _ = writeln!(md, "| services created | {} (refused {}) |", s.created, s.refused);
    let _ = writeln!(md, "| requests served | {} of {} ({}) |", s.served, s.requests, percent(s.served, s.requests));
    let _ = writeln!(
        md,
        "| load reports that found no replica ready | {} of {} ({}) |",
        s.intervals_without_ready,
        s.intervals,
        percent(s.intervals_without_ready, s.intervals)
    );
    let _ = writeln!(md, "| scaling decisions | {} |", if scalings.is_empty() { "none".to_string() } else { scalings.join(", ") });
    let _ = writeln!(md, "| replicas replaced (lease ended early, bid again) | {} ({} bids in all) |", s.replaced, s.bids);
    let _ = writeln!(md, "| services not running at the end | {} |", s.not_running);
    let _ = writeln!(
        md,
        "| replica time ready | {:.1} GPU-h; verified and billed {:.1} GPU-h |",
        gpu_hours(s.ready_replica_ms),
        gpu_hours(s.verified_gpu_ms)
    );
    let saving = if s.by_hand_minor == 0 {
        "-".to_string()
    } else {
        format!("{:.0}%", (1.0 - s.charged_minor as f64 / s.by_hand_minor as f64) * 100.0)
    };
    let _ = writeln!(
        md,
        "| cost | ${:.2} charged; by hand, the peak's replicas leased all the while at the same price: ${:.2} for {:.1} GPU-h (autoscaling saved {saving}; by hand a replica lost with its host stays lost until its renter notices, which this does not count) |",
        s.charged_minor as f64 / 1e6,
        s.by_hand_minor as f64 / 1e6,
        gpu_hours(s.by_hand_gpu_ms)
    );
}

fn fills_section(md: &mut String, m: &Metrics) {
    let _ = writeln!(md, "\n## Fill rates and time to fill\n\nEach job is one bid, good for its patience (10 min to 2 h; window bids until the trading stop).\n");
    let _ =
        writeln!(md, "| Renters | Jobs | GPUs filled | Fully filled | Unfilled | Time to fill p50 | p90 |\n|---|---|---|---|---|---|---|");
    for (kind, stats) in &m.jobs {
        job_row(md, kind.label(), stats);
    }
    job_row(md, "training in reserved daily windows", &m.window_bids);
    if m.cluster_bids.placed > 0 {
        job_row(md, "training clusters (2-4 whole 8-GPU hosts on one fabric)", &m.cluster_bids);
    }
    if m.cluster_bids.placed > 0 || m.fabric_groups > 0 {
        let premium = if m.cluster_at_spot_minor == 0 {
            "-".to_string()
        } else {
            format!("{:+.1}%", (m.cluster_paid_minor as f64 / m.cluster_at_spot_minor as f64 - 1.0) * 100.0)
        };
        let _ = writeln!(
            md,
            "
Clusters (`--cluster-bids-bps`, docs/market-rules.md \"Cluster bids\"): {} fabric groups of one owner's 8-GPU hosts ({} hosts) \
             sell to cluster bids, all or none, each host at its own ask. What cluster fills paid against the class's last spot price when \
             they filled: {premium}. Of the cluster bids placed while a fabric group of their class had that many hosts up with every GPU \
             free, {} never filled ({} of {}).",
            m.fabric_groups,
            m.fabric_hosts,
            percent(m.cluster_with_supply_unfilled, m.cluster_with_supply),
            m.cluster_with_supply_unfilled,
            m.cluster_with_supply
        );
    }
    if !m.orders_rejected.is_empty() {
        let _ = writeln!(md, "\nOrders the engine refused (all participants), by code: {}.", code_counts(&m.orders_rejected));
    }
    if !m.order_types.is_empty() {
        let counts: Vec<String> = m.order_types.iter().map(|(label, count)| format!("{label} {count}")).collect();
        let _ = writeln!(md, "\nJob bids placed as other order types (`--order-types-bps`): {}.", counts.join(", "));
    }
    managed_section(md, m);
    services_section(md, m);
    if !m.regions.is_empty() {
        let _ = writeln!(
            md,
            "\n## Prices by region\n\nEach host declared a region; owners' floors follow its costs, and renters who must stay at home \
             (`--regional-renters-bps`) bid only there. Price level: GPUs' prices as a share of their class's list price.\n"
        );
        let _ = writeln!(md, "| Region | Leases | GPUs | Of them home-only renters' leases | Price level |\n|---|---|---|---|---|");
        for (region, stats) in &m.regions {
            let level = stats.price_bps_of_list_sum.checked_div(stats.gpus).unwrap_or(0);
            let _ = writeln!(
                md,
                "| {region} | {} | {} | {} | {}.{:02}% |",
                stats.leases,
                stats.gpus,
                stats.regional_leases,
                level / 100,
                level % 100
            );
        }
    }
}

fn billing_section(md: &mut String, m: &Metrics) {
    let (b, f) = (&m.billing, &m.faults);
    let hours = |ms: u64| ms as f64 / MS_PER_HOUR as f64;
    let share = |ms: u64| if b.delivered_gpu_ms == 0 { 0.0 } else { ms as f64 * 100.0 / b.delivered_gpu_ms as f64 };
    let unbilled = b.delivered_gpu_ms.saturating_sub(b.verified_gpu_ms);
    let _ = writeln!(md, "\n## Billing accuracy\n");
    let _ = writeln!(
        md,
        "Over the {} leases whose billing closed: delivered {:.1} GPU-h (the simulator's truth), verified {:.1} GPU-h, \
         usage charged {} against {} that the delivered time is worth at the leases' prices. Fees: {}. SLA credits: {} paying {}. \
         Usage left unpaid (renter debt): {}.\n",
        b.leases_closed,
        hours(b.delivered_gpu_ms),
        hours(b.verified_gpu_ms),
        dollars(b.usage_charged_minor as u128),
        dollars(b.delivered_value_minor as u128),
        dollars(b.fees_minor as u128),
        b.sla_credits,
        dollars(b.sla_credited_minor as u128),
        dollars(b.unpaid_usage_minor as u128),
    );
    let _ = writeln!(
        md,
        "Delivered but never billed: {:.1} GPU-h, {:.1}% of the delivered time. All of it comes from the injected faults, and it is \
         the supplier's loss, not the renter's (the exchange bills only what verified reports show):\n\n\
         | Cause | Leases | GPU-h | Share of delivered |\n|---|---|---|---|\n\
         | reports sent after the late-report window (a day after the billing grace) by agents that delayed them or whose host was down, refused `billing_closed` | {} | {:.1} | {:.1}% |\n\
         | agents that stopped reporting mid-lease (time no agent measured: not provable, so not billed; the supplier's loss, as a host that is down) | {} | {:.1} | {:.1}% |\n\
         | anything else (an honest, on-time lease billed less than it delivered) | {} | {:.1} | {:.1}% |\n\n\
         Provisional bills (docs/market-rules.md \"Late reports\"): {} leases had reports of {:.1} GPU-h missing at their billing grace; \
         late reports billed {:.1} GPU-h of it before the bills were final ({} final as their last report arrived, the rest at the end \
         of the day's window). Unpaid for causes an honest supplier recovers from (late reports, anything else): {:.2}% of the \
         delivered time.\n",
        hours(unbilled),
        share(unbilled),
        f.unbilled_late_leases,
        hours(f.unbilled_late_gpu_ms),
        share(f.unbilled_late_gpu_ms),
        f.unbilled_stopped_leases,
        hours(f.unbilled_stopped_gpu_ms),
        share(f.unbilled_stopped_gpu_ms),
        b.clean_mismatches,
        hours(unbilled.saturating_sub(f.unbilled_late_gpu_ms + f.unbilled_stopped_gpu_ms)),
        share(unbilled.saturating_sub(f.unbilled_late_gpu_ms + f.unbilled_stopped_gpu_ms)),
        f.provisional_bills,
        hours(f.provisional_unreported_gpu_ms),
        hours(f.late_billed_gpu_ms),
        f.provisional_final_early,
        share(unbilled.saturating_sub(f.unbilled_stopped_gpu_ms)),
    );
}

fn revenue_section(md: &mut String, m: &Metrics) {
    let _ = writeln!(
        md,
        "\n## Supplier revenue against a posted-price market\n\nThe baseline is a posted-price market that guessed the \
         average right: each class and contract priced all run long at this run's own volume-weighted clearing price, sold first come \
         first served to every job whose limit reaches it while the GPUs are free for all its hours (no auction, no preemption, no \
         windows). Exchange revenue is what suppliers were credited for usage and reserved rest, before the exchange fee.\n"
    );
    let days = m.preemptions_by_day.len();
    if days < 7 {
        let _ = writeln!(
            md,
            "**A {}-day run is too short to compare the two.** Reserved windows sold for later days earn nothing within it, \
             the first hours start from empty books, and one busy or quiet day moves the clearing price the baseline is \
             priced at. Compare runs of a week or more (the default is 7 days).\n",
            days
        );
    }
    let _ = writeln!(md, "![revenue](revenue.svg)\n\n| Class | Exchange | Posted-price baseline | Ratio |\n|---|---|---|---|");
    for (index, class) in CLASSES.iter().enumerate() {
        let (ours, posted) = (m.supplier_revenue_minor[index], m.posted_baseline_minor[index]);
        let ratio = if posted == 0 { "-".into() } else { format!("{:.2}x", ours as f64 / posted as f64) };
        let _ = writeln!(md, "| {} | {} | {} | {ratio} |", class.name, dollars(ours as u128), dollars(posted as u128));
    }
}

fn cheats_section(md: &mut String, m: &Metrics) {
    let _ = writeln!(md, "\n## Cheaters\n\n| Cheat | Attempts | Caught | Money moved | Refused with |\n|---|---|---|---|---|");
    for (cheat, stats) in &m.cheats {
        let _ = writeln!(
            md,
            "| {} | {} | {} | {} | {} |",
            cheat.label(),
            stats.attempts,
            stats.caught,
            dollars(stats.moved_minor as u128),
            code_counts(&stats.codes)
        );
    }
    for (label, stats) in &m.renter_cheats {
        let _ = writeln!(
            md,
            "| renter: {label} | {} | {} | {} | {} |",
            stats.attempts,
            stats.caught,
            dollars(stats.moved_minor as u128),
            code_counts(&stats.codes)
        );
    }
    let _ = writeln!(
        md,
        "\nAn unfunded open-ended lease is ended by the engine once its escrow runs out; the money moved is the debt such renters \
         still owed at the end ({}), which the supplier was paid regardless.",
        dollars(m.underpayer_debt_minor as u128)
    );
}

fn challenges_section(md: &mut String, m: &Metrics) {
    let _ = writeln!(
        md,
        "\n## Hardware challenges\n\nEvery GPU's compute is challenged as it is listed, its memory bandwidth a second after its \
         first answer, and the two in turn at random idle times (every 3 to 9 hours; docs/market-rules.md \"Verified hardware\"); \
         both kinds count below. The products and memory passes are real and checked as the exchange checks them; the round \
         trip is drawn: 1-4 ms for an honest GPU, 8-30 ms for a slower card than the model it claims, against the class's 6.5 ms \
         (the simulator's n of 32 at the demo class's 10 MFLOP/s) and 5.3 ms (2^10 words and 4 passes at its 10 MB/s). Caught: a GPU found wrong or too slow; the time is from the \
         run's start, when every GPU was listed. Unanswered: the host was down.\n\n\
         | Supplier kind | Suppliers | Challenged | Passed | Too slow | Wrong | Unanswered | Suppliers caught | Time to catch (median, max) |\n\
         |---|---|---|---|---|---|---|---|---|"
    );
    for (kind, stats) in &m.challenges {
        let label = kind.map_or("honest (or cheating at reports only)".to_string(), |cheat| format!("cheat: {}", cheat.label()));
        let mut times = stats.time_to_catch_ms.clone();
        times.sort_unstable();
        let time = match (times.get(times.len() / 2), times.last()) {
            (Some(median), Some(max)) => format!("{}, {}", duration(*median), duration(*max)),
            _ => "-".into(),
        };
        let caught = if kind.is_some() {
            format!("{} of {} answered", stats.suppliers_caught, stats.suppliers_answered)
        } else {
            stats.suppliers_caught.to_string()
        };
        let [passed, slow, wrong, unanswered] = stats.outcomes;
        let _ = writeln!(
            md,
            "| {label} | {} | {} | {passed} | {slow} | {wrong} | {unanswered} | {caught} | {time} |",
            stats.suppliers, stats.issued
        );
    }
}

fn disputes_section(md: &mut String, m: &Metrics, report_interval_ms: u64) {
    let _ = writeln!(
        md,
        "\n## Disputes\n\nEvery other renter watches its leases and signs what it sees, an hour at most per observation \
         (docs/market-rules.md \"Disputes\"): its liveness watcher unreachable where the host was down or the workload dead \
         throughout, its GPU probe (inside the container) each GPU present or absent while the host was up. Fake-availability \
         hosts take the workload's GPUs away 10 minutes to 2 hours into each lease and go on reporting every GPU available. \
         Disputed time is what a report claims beyond the time outside the renter's evidence; the host's share of it is held \
         until the lease's final bill, then what the probe proved goes back to the renter (with the fee on it) and the rest to \
         the host. Time to dispute: from the GPUs' loss to the lease's first dispute (the simulator's agents report every \
         {:.1} h, so it is about that).\n\n\
         | Supplier kind | Leases | Watched | Signed observations | Leases disputed | Billed, not delivered | Disputed | Proven | Held from the host | Refunded to renters | Paid to the host | Time to dispute (median, max) |\n\
         |---|---|---|---|---|---|---|---|---|---|---|---|",
        report_interval_ms as f64 / 3_600_000.0
    );
    for (kind, stats) in &m.disputes {
        let label = kind.map_or("truthful about availability".to_string(), |cheat| format!("cheat: {}", cheat.label()));
        let mut times = stats.time_to_dispute_ms.clone();
        times.sort_unstable();
        let time = match (times.get(times.len() / 2), times.last()) {
            (Some(median), Some(max)) => format!("{}, {}", duration(*median), duration(*max)),
            _ => "-".into(),
        };
        let disputed = match kind {
            Some(_) => format!(
                "{} ({} of {} watched, faked and closed)",
                stats.leases_disputed, stats.leases_watched_faked_disputed, stats.leases_watched_faked
            ),
            None => stats.leases_disputed.to_string(),
        };
        let hours = |ms: u64| format!("{:.1} GPU-h", ms as f64 / 3_600_000.0);
        let billed = if kind.is_some() { hours(stats.billed_undelivered_gpu_ms) } else { "-".into() };
        let _ = writeln!(
            md,
            "| {label} | {} | {} | {} | {disputed} | {billed} | {} | {} | {} | {} | {} | {time} |",
            stats.leases,
            stats.leases_watched,
            stats.observations,
            hours(stats.disputed_gpu_ms),
            hours(stats.proven_gpu_ms),
            dollars(stats.held_minor as u128),
            dollars(stats.refunded_minor as u128),
            dollars(stats.paid_to_host_minor as u128),
        );
    }
    let _ = writeln!(
        md,
        "\nWhat it does not catch: a lease whose renter does not watch is billed in full (its share of billed-not-delivered \
         time above); time only the liveness watcher disputes is paid to the host at the final bill (a port that does not \
         answer proves nothing alone)."
    );
}

fn scores_section(md: &mut String, m: &Metrics) {
    let _ = writeln!(
        md,
        "\n## Reliability scores\n\nEach supplier's public score at the end of the run (docs/market-rules.md \"Reliability score\": \
         verified over leased time, failed deliveries, forged and replayed reports; unrated under 10 GPU-hours), grouped by what \
         the simulator knows each supplier was. Cheats the exchange refuses outright move no money; the score is what renters see \
         of them.\n\n| Supplier kind | Suppliers | Rated | At 0% | Lowest | 10th percentile | Median | Highest |\n|---|---|---|---|---|---|---|---|"
    );
    let percent = |bps: u32| format!("{}.{:02}%", bps / 100, bps % 100);
    for (kind, scores) in &m.scores {
        let mut rated: Vec<u32> = scores.iter().flatten().copied().collect();
        rated.sort_unstable();
        let cell = |value: Option<&u32>| value.map_or("-".to_string(), |bps| percent(*bps));
        let _ = writeln!(
            md,
            "| {kind} | {} | {} | {} | {} | {} | {} | {} |",
            scores.len(),
            rated.len(),
            rated.iter().filter(|bps| **bps == 0).count(),
            cell(rated.first()),
            cell(rated.get(rated.len() / 10)),
            cell(rated.get(rated.len() / 2)),
            cell(rated.last())
        );
    }
}

fn faults_section(md: &mut String, m: &Metrics) {
    let f = &m.faults;
    let _ = writeln!(md, "\n## Faults\n");
    let _ = writeln!(
        md,
        "Host crashes {}, network losses {}, leases whose agent stopped reporting {}, leases started on a host that was down \
         (before its session was seen to be gone, 30 s, when cancel-on-disconnect withdraws its asks) {}. Honest reports refused, by code: {} \
         (`billing_closed`: sent after the billing grace, the late reports above; `from_future`, a report ending more than 5 s past the \
         exchange's clock, is expected from no honest host: 3% of hosts run clocks 6 to 20 s ahead, and their agents stamp reports \
         in the exchange's time). Exchange restarts {} (snapshot + journal replay, {} entries).",
        f.crashes,
        f.network_losses,
        f.agents_stopped_reporting,
        f.leases_on_down_hosts,
        code_counts(&f.honest_reports_refused),
        f.restarts,
        f.restart_entries_replayed
    );
}

fn hot_state_section(md: &mut String, m: &Metrics) {
    let _ = writeln!(
        md,
        "\n## Hot state\n\nThe exchange state a snapshot holds, encoded, at the end of each day. Settlement forgets the chains of \
         leases whose billing closed, and an hour later the lease leaves the engine and the ledger for the exchange's archive, \
         as do an expired window's contracts; a day after it expired the window itself retires (docs/ARCHITECTURE.md). \
         Reliability records keep a bucket per supplier and host per day for the score's 30-day window: they grow for \
         30 days, then stay.\n\n\
         | Day | Engine | Settlement | Ledger | Reliability | Total |\n|---|---|---|---|---|---|"
    );
    let mib = |bytes: u64| format!("{:.2} MiB", bytes as f64 / (1 << 20) as f64);
    for (day, state) in m.hot_state_by_day.iter().enumerate() {
        let _ = writeln!(
            md,
            "| {} | {} | {} | {} | {} | {} |",
            day + 1,
            mib(state.engine),
            mib(state.settlement),
            mib(state.ledger),
            mib(state.reliability),
            mib(state.engine + state.settlement + state.ledger + state.reliability)
        );
    }
    // Growth after the first day's warm-up, per day (what a flat state shows as about zero).
    let days = &m.hot_state_by_day;
    if days.len() >= 3 {
        let per_day = |field: fn(&crate::exchange::HotState) -> u64| {
            let (first, last) = (field(&days[1]) as f64, field(&days[days.len() - 1]) as f64);
            format!("{:+.1} KiB", (last - first) / (days.len() - 2) as f64 / 1024.0)
        };
        let _ = writeln!(
            md,
            "\nGrowth per day from day 2 to day {}: engine {}, settlement {}, ledger {}, reliability {}.",
            days.len(),
            per_day(|s| s.engine),
            per_day(|s| s.settlement),
            per_day(|s| s.ledger),
            per_day(|s| s.reliability)
        );
    }
}

const PALETTE: [RGBColor; 4] = [RGBColor(31, 119, 180), RGBColor(255, 127, 14), RGBColor(44, 160, 44), RGBColor(214, 39, 40)];

fn plot_utilisation(m: &Metrics) -> String {
    let mut svg = String::new();
    {
        let root = SVGBackend::with_string(&mut svg, (960, 420)).into_drawing_area();
        let hours = m.hours.len().max(1) as f64;
        let drawn =
            (|| -> Result<(), Box<dyn std::error::Error + '_>> {
                root.fill(&WHITE)?;
                let mut chart = ChartBuilder::on(&root)
                    .caption("Utilisation per class (% of available GPUs leased)", ("sans-serif", 18))
                    .margin(12)
                    .x_label_area_size(36)
                    .y_label_area_size(48)
                    // Headroom above 100% keeps the legend off the lines.
                    .build_cartesian_2d(0f64..hours, 0f64..145f64)?;
                chart
                    .configure_mesh()
                    .x_desc("hour of the run")
                    .y_desc("%")
                    .y_label_formatter(&|y| if *y <= 100.0 { format!("{y:.0}") } else { String::new() })
                    .draw()?;
                for (index, class) in CLASSES.iter().enumerate() {
                    let color = PALETTE[index];
                    let points =
                        m.hours.iter().enumerate().filter(|(_, h)| h[index].available_gpu_samples > 0).map(|(hour, h)| {
                            (hour as f64, h[index].leased_gpu_samples as f64 * 100.0 / h[index].available_gpu_samples as f64)
                        });
                    chart
                        .draw_series(LineSeries::new(points, color.stroke_width(2)))?
                        .label(class.name)
                        .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 18, y)], color));
                }
                chart
                    .configure_series_labels()
                    .position(SeriesLabelPosition::UpperRight)
                    .background_style(WHITE.mix(0.9))
                    .border_style(BLACK)
                    .draw()?;
                root.present()?;
                Ok(())
            })();
        drawn.expect("drawing into a string cannot fail");
    }
    svg
}

fn plot_prices(m: &Metrics) -> String {
    let mut svg = String::new();
    {
        let root = SVGBackend::with_string(&mut svg, (960, 420)).into_drawing_area();
        let hours = m.trades.len().max(1) as f64;
        let top = m
            .trades
            .iter()
            .flat_map(|h| h.iter().flat_map(|c| c.iter()))
            .filter(|b| b.gpus > 0)
            .map(|b| (b.notional_minor / b.gpus as u128) as f64 / 1e6)
            .fold(0.5f64, f64::max)
            // Headroom for the legend above the highest price.
            * 1.5;
        let drawn = (|| -> Result<(), Box<dyn std::error::Error + '_>> {
            root.fill(&WHITE)?;
            let mut chart = ChartBuilder::on(&root)
                .caption("Hourly clearing price, $ per GPU-hour (solid spot, thin preemptible)", ("sans-serif", 18))
                .margin(12)
                .x_label_area_size(36)
                .y_label_area_size(48)
                .build_cartesian_2d(0f64..hours, 0f64..top)?;
            chart.configure_mesh().x_desc("hour of the run").y_desc("$ / GPU-h").draw()?;
            for (index, class) in CLASSES.iter().enumerate() {
                let color = PALETTE[index];
                for kind in 0..2 {
                    let points = m
                        .trades
                        .iter()
                        .enumerate()
                        .filter(|(_, h)| h[index][kind].gpus > 0)
                        .map(|(hour, h)| (hour as f64, (h[index][kind].notional_minor / h[index][kind].gpus as u128) as f64 / 1e6));
                    let series = chart.draw_series(LineSeries::new(points, color.stroke_width(if kind == 0 { 2 } else { 1 })))?;
                    if kind == 0 {
                        series.label(class.name).legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 18, y)], color));
                    }
                }
            }
            chart
                .configure_series_labels()
                .position(SeriesLabelPosition::UpperRight)
                .background_style(WHITE.mix(0.9))
                .border_style(BLACK)
                .draw()?;
            root.present()?;
            Ok(())
        })();
        drawn.expect("drawing into a string cannot fail");
    }
    svg
}

fn plot_revenue(m: &Metrics) -> String {
    let mut svg = String::new();
    {
        let root = SVGBackend::with_string(&mut svg, (960, 420)).into_drawing_area();
        let top =
            m.supplier_revenue_minor.iter().chain(m.posted_baseline_minor.iter()).copied().max().unwrap_or(1).max(1) as f64 / 1e6 * 1.4;
        let drawn = (|| -> Result<(), Box<dyn std::error::Error + '_>> {
            root.fill(&WHITE)?;
            let mut chart = ChartBuilder::on(&root)
                .caption("Supplier revenue per class, $", ("sans-serif", 18))
                .margin(12)
                .x_label_area_size(36)
                .y_label_area_size(72)
                .build_cartesian_2d(0f64..(CLASSES.len() as f64), 0f64..top)?;
            chart
                .configure_mesh()
                .x_labels(CLASSES.len())
                .x_label_formatter(&|x| CLASSES.get(*x as usize).map_or(String::new(), |c| c.name.to_string()))
                .y_desc("$")
                .draw()?;
            let label = ("sans-serif", 13).into_font();
            for (offset, color, name, values) in [
                (0.15, PALETTE[0], "exchange", &m.supplier_revenue_minor),
                (0.52, PALETTE[1], "posted-price baseline", &m.posted_baseline_minor),
            ] {
                let bars = (0..CLASSES.len()).map(|index| {
                    let (x, value) = (index as f64 + offset, values[index] as f64 / 1e6);
                    Rectangle::new([(x, 0.0), (x + 0.33, value)], color.filled())
                });
                chart.draw_series(bars)?.label(name).legend(move |(x, y)| Rectangle::new([(x, y - 5), (x + 14, y + 5)], color.filled()));
                // Each bar's value just above it.
                chart.draw_series((0..CLASSES.len()).map(|index| {
                    let (x, value) = (index as f64 + offset, values[index] as f64 / 1e6);
                    Text::new(dollars(values[index] as u128), (x, value + top * 0.02), label.clone())
                }))?;
            }
            chart
                .configure_series_labels()
                .position(SeriesLabelPosition::UpperRight)
                .background_style(WHITE.mix(0.9))
                .border_style(BLACK)
                .draw()?;
            root.present()?;
            Ok(())
        })();
        drawn.expect("drawing into a string cannot fail");
    }
    svg
}
