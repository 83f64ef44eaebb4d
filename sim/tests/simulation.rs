//! The simulator as a specification of the market: a small seeded run with
//! many cheaters and faults must keep every invariant (no GPU leased twice at
//! once, the ledger balanced and equal to the engine, every charge exact,
//! nothing billed beyond what was delivered, every cheat refused, restarts
//! replaying to the same state), and the same seed must give byte-identical
//! reports.

use gpux_sim::population::{SupplierCheat, SUPPLIER_CHEATS};
use gpux_sim::{report, Sim, SimConfig};

fn run(seed: u64) -> Sim {
    let mut sim = Sim::new(SimConfig { suppliers: 100, renters: 500, cheater_share_bps: 3_000, ..SimConfig::small(seed) });
    sim.run(|_| {});
    sim
}

#[test]
fn a_small_market_with_cheaters_and_faults_keeps_every_invariant() {
    let sim = run(7);
    for (name, ok, found) in report::invariants(&sim) {
        assert!(ok, "{name}: {found}");
    }
    let m = &sim.metrics;
    assert!(m.billing.leases_closed > 300, "the market traded: {} leases closed", m.billing.leases_closed);
    assert!(m.billing.clean_leases > 0 && m.billing.sla_credits > 0, "clean leases and SLA credits both occur");
    for cheat in SUPPLIER_CHEATS.into_iter().filter(|cheat| !cheat.is_hardware() && *cheat != SupplierCheat::FakeAvailability) {
        let stats = m.cheats.get(&cheat).unwrap_or_else(|| panic!("{cheat:?} was never tried"));
        assert!(stats.attempts > 0 && stats.caught == stats.attempts && stats.moved_minor == 0, "{cheat:?}: {stats:?}");
    }
    // Hardware cheaters are caught by challenges, at their first one (as
    // their GPUs are listed); honest GPUs pass theirs.
    for cheat in SUPPLIER_CHEATS.into_iter().filter(|cheat| cheat.is_hardware()) {
        let stats = m.challenges.get(&Some(cheat)).unwrap_or_else(|| panic!("no {cheat:?} supplier"));
        assert!(stats.suppliers > 0 && stats.suppliers_caught == stats.suppliers, "{cheat:?}: {stats:?}");
        assert!(stats.time_to_catch_ms.iter().all(|ms| *ms < 60_000), "{cheat:?}: {stats:?}");
    }
    // Fake availability is caught by the renters that watch: every watched
    // lease whose workload died while its host reported it available is
    // disputed, and no truthful host is.
    let faked =
        m.disputes.get(&Some(SupplierCheat::FakeAvailability)).unwrap_or_else(|| panic!("a fake-availability supplier: {:?}", m.disputes));
    assert!(faked.leases_watched_faked > 0 && faked.leases_watched_faked_disputed == faked.leases_watched_faked, "{faked:?}");
    assert!(faked.disputed_gpu_ms > 0 && faked.held_minor > 0 && faked.disputed_gpu_ms <= faked.billed_undelivered_gpu_ms, "{faked:?}");
    // The probes proved the time and the renters got its charge back.
    assert!(faked.proven_gpu_ms > 0 && faked.proven_gpu_ms <= faked.disputed_gpu_ms && faked.refunded_minor > 0, "{faked:?}");
    assert_eq!(faked.paid_to_host_minor, 0, "every disputed millisecond was proven, none paid to the host: {faked:?}");
    let truthful = &m.disputes[&None];
    assert!(truthful.observations > 0 && truthful.leases_disputed == 0 && truthful.disputed_gpu_ms == 0, "{truthful:?}");
    let honest = &m.challenges[&None];
    assert!(honest.outcomes[0] > 0 && honest.outcomes[1] == 0 && honest.outcomes[2] == 0, "{honest:?}");
    for label in ["withdrawal of held funds", "bid beyond its funds", "open-ended lease left unfunded"] {
        let stats = &m.renter_cheats[label];
        assert!(stats.attempts > 0 && stats.moved_minor == 0, "{label}: {stats:?}");
    }
    assert_eq!(m.faults.restarts, 2, "both restarts replayed the journal");
    assert!(m.faults.crashes > 0 && m.faults.network_losses > 0 && m.faults.agents_stopped_reporting > 0);
    // 3% of hosts run clocks 6-20 s ahead: their agents stamp in the
    // exchange's time, so none of their reports is from the future.
    assert!(!m.faults.honest_reports_refused.contains_key("FromFuture"), "{:?}", m.faults.honest_reports_refused);
    // Reports that arrive after the grace (agents that delay them, hosts
    // that were down) are billed on provisional bills: at most 0.1% of the
    // delivered time stays unpaid for that cause (docs/market-rules.md
    // "Late reports").
    let f = &m.faults;
    assert!(f.provisional_bills > 0 && f.late_billed_gpu_ms > 0, "late reports billed: {f:?}");
    assert!(f.unbilled_late_gpu_ms * 1_000 <= m.billing.delivered_gpu_ms, "late reports left unpaid: {f:?} of {:?}", m.billing);
    // Scores separate suppliers that deliver from those that do not: every
    // rated honest supplier whose agent worked scores above every rated one
    // whose agent stopped reporting (it delivered, unverified, so unpaid).
    let rated = |kind: &str| -> Vec<u32> { m.scores.get(kind).map(|s| s.iter().flatten().copied().collect()).unwrap_or_default() };
    let (mut honest, silent) = (rated("honest"), rated("honest, agent stops reporting"));
    honest.sort_unstable();
    assert!(!honest.is_empty() && !silent.is_empty(), "both kinds rated: {:?}", m.scores);
    let honest_median = honest[honest.len() / 2];
    assert!(silent.iter().all(|s| *s < honest_median), "silent agents {silent:?} against an honest median of {honest_median}");
    assert!(honest_median >= 9_000, "honest suppliers score high: {honest:?}");
    // The state's size is measured at the end of every day (docs/PERFORMANCE.md "Hot state").
    assert_eq!(m.hot_state_by_day.len(), m.preemptions_by_day.len());
    assert!(m.hot_state_by_day.iter().all(|state| state.engine > 0 && state.settlement > 0));
}

/// A third of the renters' bids use budgets, all-or-none or stops: every
/// invariant still holds (the ledger equal to the engine's balances, what
/// budgets and stops hold and release included; restarts replay them).
#[test]
fn a_market_using_budget_all_or_none_and_stop_orders_keeps_every_invariant() {
    let mut sim = Sim::new(SimConfig { suppliers: 100, renters: 500, order_types_bps: 3_300, ..SimConfig::small(11) });
    sim.run(|_| {});
    for (name, ok, found) in report::invariants(&sim) {
        assert!(ok, "{name}: {found}");
    }
    let types = &sim.metrics.order_types;
    for label in ["budget", "all-or-none", "stop", "stops triggered"] {
        assert!(types.get(label).is_some_and(|n| *n > 0), "{label}: {types:?}");
    }
    assert_eq!(sim.metrics.faults.restarts, 2, "restarts replayed journals holding them");
}

#[test]
fn the_same_seed_gives_byte_identical_reports_and_another_seed_does_not() {
    let first = report::render(&run(11)).files;
    let again = report::render(&run(11)).files;
    assert_eq!(first.len(), 4, "report.md and three plots");
    for ((name, a), (_, b)) in first.iter().zip(&again) {
        assert!(a == b, "{name} differs between two runs of seed 11");
    }
    let other = report::render(&run(12)).files;
    assert_ne!(first[0].1, other[0].1, "seed 12 tells another story");
    assert!(first.iter().any(|(name, svg)| name.ends_with(".svg") && svg.starts_with("<svg")));
}

/// The report reads as prose for people: codes as the protocol writes them
/// (no Rust Debug text), durations a person reads, the never-billed time
/// broken down by cause so its shares add up, a short run's revenue
/// comparison flagged as such, and labelled revenue bars with a legend.
#[test]
fn the_report_is_written_for_people() {
    let sim = run(7);
    let files = report::render(&sim).files;
    let md = &files.iter().find(|(name, _)| name == "report.md").expect("report.md").1;
    for debug in ["{\"", "FromFuture", "InsufficientCapacity", "BillingClosed", "Some(", "0.0 min", "per day: ["] {
        assert!(!md.contains(debug), "{debug:?} in the report:\n{md}");
    }
    assert!(md.contains("`from_future`"), "codes in snake_case");
    assert!(md.contains("Preemption notices: day 1: "), "counts per day in words");
    assert!(md.contains("Delivered but never billed"), "the unbilled time is explained");
    let rows: Vec<f64> = md
        .lines()
        .skip_while(|line| !line.starts_with("| Cause |"))
        .skip(2)
        .take_while(|line| line.starts_with('|'))
        .map(|line| line.split('|').nth(3).expect("a GPU-h cell").trim().parse().expect("GPU-h"))
        .collect();
    assert_eq!(rows.len(), 3, "three causes");
    let total: f64 = md
        .split("Delivered but never billed: ")
        .nth(1)
        .and_then(|rest| rest.split(" GPU-h").next())
        .and_then(|hours| hours.parse().ok())
        .expect("the total");
    assert!((rows.iter().sum::<f64>() - total).abs() < 0.2, "the causes add up to the total: {rows:?} vs {total}");
    assert!(md.contains("too short to compare"), "a {}-day run says so", sim.metrics.preemptions_by_day.len());
    let revenue = &files.iter().find(|(name, _)| name == "revenue.svg").expect("revenue.svg").1;
    assert!(revenue.contains("posted-price baseline") && revenue.contains("exchange"), "the bars have a legend");
    assert!(revenue.contains("H100-SXM-80G") && revenue.contains('$'), "the bars are labelled");
}

/// Bounded state: after a day of warm-up the exchange's hot state (what a
/// snapshot holds) stays flat while leases keep coming: each leaves the
/// engine and the ledger an hour after its bill is final, and settlement
/// forgets its chains at the close. Before the archive the engine alone
/// grew by about 70 bytes a lease, most of its size again every day.
#[test]
fn the_hot_state_is_flat_after_a_day_of_warm_up() {
    let mut sim = Sim::new(SimConfig { suppliers: 100, renters: 500, days: 5, restarts: 0, ..SimConfig::small(3) });
    sim.run(|_| {});
    let days = &sim.metrics.hot_state_by_day;
    assert_eq!(days.len(), 5);
    let total = |day: usize| days[day].engine + days[day].settlement + days[day].ledger;
    let leases_closed = sim.metrics.billing.leases_closed;
    assert!(leases_closed > 1_000, "the market traded: {leases_closed} leases closed");
    // Within the day-to-day swing of the leases running at midnight (up to
    // 12% here), not a trend: growth by history was most of the size again
    // every day.
    for day in 2..5 {
        assert!(total(day) * 100 <= total(1) * 115, "day {}: {} bytes against {} after day 2: {days:?}", day + 1, total(day), total(1));
    }
}

/// Hosts declare regions whose costs differ and a third of the renters bid
/// only at home: every invariant still holds, those renters leased only in
/// their region, and prices differ by region as the costs do (cn-west,
/// cheap power, below cn-east, where the demand is).
#[test]
fn a_market_with_regions_prices_them_apart_and_keeps_home_only_renters_at_home() {
    let mut sim = Sim::new(SimConfig { suppliers: 100, renters: 500, regional_renters_bps: 3_300, ..SimConfig::small(13) });
    sim.run(|_| {});
    for (name, ok, found) in report::invariants(&sim) {
        assert!(ok, "{name}: {found}");
    }
    let regions = &sim.metrics.regions;
    assert!(regions.keys().all(|r| r != "none"), "every host declared a region: {regions:?}");
    let level = |name: &str| {
        let stats = &regions[name];
        assert!(stats.gpus > 0 && stats.regional_leases > 0, "{name}: {stats:?}");
        stats.price_bps_of_list_sum / stats.gpus
    };
    assert!(level("cn-west") < level("cn-east"), "cn-west {} vs cn-east {}", level("cn-west"), level("cn-east"));
    let report = report::render(&sim).files;
    assert!(report[0].1.contains("## Prices by region"), "the report shows them");
}

/// Half the training work goes to the exchange as gpux jobs: they bid, the
/// exchange fails leases whose hosts go silent (crashes, agents that stop
/// reporting) and the jobs resume elsewhere from their checkpoints. Every
/// invariant holds (restarts replay the jobs), jobs finish, and what the
/// failures cost them is less than the same failures cost by hand. A fifth
/// of the hosts fail each day here, so some fail under a job.
#[test]
fn training_as_jobs_resumes_after_host_failures_and_loses_less_than_by_hand() {
    let mut sim =
        Sim::new(SimConfig { suppliers: 100, renters: 500, managed_jobs_bps: 5_000, fault_per_mille: 200, ..SimConfig::small(17) });
    sim.run(|_| {});
    for (name, ok, found) in report::invariants(&sim) {
        assert!(ok, "{name}: {found}");
    }
    let m = &sim.metrics.managed;
    assert!(m.submitted >= 20, "{m:?}");
    assert!(m.succeeded > 0, "{m:?}");
    assert!(m.failovers > 0, "the run's host faults ended some attempts: {m:?}");
    assert!(m.preemptible > 0, "half the jobs bid preemptible books: {m:?}");
    assert!(m.preemptions > 0, "spot buyers preempted some of them: {m:?}");
    let resumed = m.notice_to_resume_ms.len() as u64;
    assert!(resumed > 0 && resumed <= m.preemptions, "preempted jobs resumed, each counted once: {m:?}");
    assert!(m.lost_work_gpu_ms < m.lost_work_by_hand_gpu_ms, "checkpoints saved work: {m:?}");
    assert!(m.charged_minor > 0 && m.by_hand_charged_minor > 0, "{m:?}");
    assert_eq!(sim.metrics.faults.restarts, 2, "restarts replayed journals holding jobs");
    let files = report::render(&sim).files;
    let md = &files.iter().find(|(name, _)| name == "report.md").expect("report.md").1;
    assert!(md.contains("## Training as gpux jobs"), "the report has its section");
}

/// Inference as gpux services (docs/services.md): half the inference
/// renters run a service on a daily traffic curve instead of buying leases.
/// Every invariant holds (restarts replay the services), the market scales
/// them up and down with the day, replaces replicas whose lease ended early
/// (a fifth of the hosts fail each day here), serves most of the traffic,
/// and costs less than the peak's replicas bought by hand.
#[test]
fn inference_as_services_scales_with_the_day_replaces_lost_replicas_and_costs_less_than_by_hand() {
    let mut sim = Sim::new(SimConfig { service_renters_bps: 5_000, fault_per_mille: 200, ..SimConfig::small(23) });
    sim.run(|_| {});
    for (name, ok, found) in report::invariants(&sim) {
        assert!(ok, "{name}: {found}");
    }
    let s = &sim.metrics.services;
    assert!(s.created >= 10 && s.refused == 0, "{s:?}");
    assert!(s.scalings.get("load_above").is_some_and(|n| *n > 0), "scaled up with the day: {s:?}");
    assert!(s.scalings.get("load_below").is_some_and(|n| *n > 0), "and down at night: {s:?}");
    assert!(s.replaced > 0, "host faults and preemptions ended some replicas' leases early: {s:?}");
    assert!(s.served > s.requests / 2, "most requests served: {s:?}");
    assert!(s.charged_minor > 0 && s.charged_minor < s.by_hand_minor, "cheaper than the peak by hand: {s:?}");
    assert_eq!(sim.metrics.faults.restarts, 2, "restarts replayed journals holding services");
    let files = report::render(&sim).files;
    let md = &files.iter().find(|(name, _)| name == "report.md").expect("report.md").1;
    assert!(md.contains("## Inference as gpux services"), "the report has its section");
}

/// Clusters (docs/market-rules.md "Cluster bids"): data-centre owners run
/// fabric groups under one account, a share of training buys 2 to 4 whole
/// hosts of one group; every invariant holds (restarts replay cluster bids),
/// clusters fill, each fill is whole hosts of one group, and the report
/// shows their fill rate and premium.
#[test]
fn cluster_bids_fill_whole_hosts_of_one_fabric_group_and_keep_every_invariant() {
    let mut sim = Sim::new(SimConfig { suppliers: 300, renters: 1_500, cluster_bids_bps: 3_000, ..SimConfig::small(19) });
    sim.run(|_| {});
    for (name, ok, found) in report::invariants(&sim) {
        assert!(ok, "{name}: {found}");
    }
    let m = &sim.metrics;
    assert!(m.fabric_groups > 0 && m.fabric_hosts >= 2 * m.fabric_groups, "{} groups, {} hosts", m.fabric_groups, m.fabric_hosts);
    assert!(m.cluster_bids.placed >= 10, "{:?}", m.cluster_bids);
    assert!(m.cluster_bids.fully_filled > 0, "{:?}", m.cluster_bids);
    assert_eq!(m.cluster_fills_outside_one_group, 0, "every fill is whole hosts of one fabric group");
    assert!(m.cluster_paid_minor > 0);
    assert_eq!(m.faults.restarts, 2, "restarts replayed journals holding cluster bids and fabric claims");
    let files = report::render(&sim).files;
    let md = &files.iter().find(|(name, _)| name == "report.md").expect("report.md").1;
    assert!(md.contains("training clusters") && md.contains("fabric groups"), "the report shows clusters");
}
