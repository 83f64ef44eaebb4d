//! What the simulator measures while it runs, and the invariants it checks.
//! Money is counted in integer minor units; ratios are computed only when the
//! report is written.

use std::collections::BTreeMap;

use crate::population::{RenterKind, SupplierCheat};

/// Per simulated hour and class.
#[derive(Clone, Debug, Default)]
pub struct HourSample {
    /// GPU-samples with a running lease, and GPU-samples available to lease
    /// (registered, online, host up): their ratio is the utilisation.
    pub leased_gpu_samples: u64,
    pub available_gpu_samples: u64,
}

/// Traded volume in one hour of one instrument kind (spot, preemptible,
/// reserved) of one class.
#[derive(Clone, Copy, Debug, Default)]
pub struct TradeBucket {
    pub notional_minor: u128,
    pub gpus: u64,
}

#[derive(Clone, Debug, Default)]
pub struct JobStats {
    pub placed: u64,
    pub gpus_wanted: u64,
    pub gpus_filled: u64,
    pub fully_filled: u64,
    pub unfilled: u64,
    /// Milliseconds from the order to its first fill, for filled jobs.
    pub time_to_fill_ms: Vec<u64>,
}

/// Training work submitted as gpux jobs (`SimConfig::managed_jobs_bps`).
#[derive(Clone, Debug, Default)]
pub struct ManagedStats {
    pub submitted: u64,
    pub succeeded: u64,
    /// Failed, by reason (`retries_exhausted`, ...), at the run's end.
    pub failed: BTreeMap<String, u64>,
    /// Still bidding or running when the run ended.
    pub unfinished: u64,
    /// Jobs that bid a preemptible book.
    pub preemptible: u64,
    /// Attempts that ended because their host went silent or failed.
    pub failovers: u64,
    /// Attempts that ended by a preemption (the workload checkpointed at
    /// the notice and exited), and the ms from each notice to the next
    /// attempt's lease.
    pub preemptions: u64,
    pub notice_to_resume_ms: Vec<u64>,
    /// GPU-ms of work redone after failures (since the last checkpoint),
    /// and what the same failures would have cost by hand (every attempt's
    /// whole work, with no checkpoint to resume from).
    pub lost_work_gpu_ms: u64,
    pub lost_work_by_hand_gpu_ms: u64,
    /// Ms between an attempt's failure and the next attempt's start.
    pub waiting_ms: Vec<u64>,
    /// From submission to success, for the jobs that succeeded.
    pub time_to_finish_ms: Vec<u64>,
    /// Useful GPU-ms the succeeded jobs needed, and what their leases were
    /// charged (usage, every attempt).
    pub useful_gpu_ms: u64,
    pub charged_minor: u64,
    /// Training leases bought by hand: verified GPU-ms and usage charged.
    pub by_hand_gpu_ms: u64,
    pub by_hand_charged_minor: u64,
}

/// Inference served as gpux services (`SimConfig::service_renters_bps`).
#[derive(Clone, Debug, Default)]
pub struct ServiceStats {
    pub created: u64,
    /// Creations the market refused.
    pub refused: u64,
    /// Requests the traffic asked for, and those ready replicas served
    /// (each serves at most `CAPACITY_RPS` a second).
    pub requests: u64,
    pub served: u64,
    /// Load reports, and those that found no replica ready.
    pub intervals: u64,
    pub intervals_without_ready: u64,
    /// Replica-ms ready, summed over the load reports.
    pub ready_replica_ms: u64,
    /// Scaling decisions, by reason.
    pub scalings: BTreeMap<String, u64>,
    /// Replicas whose lease ended early and were bid again, and bids placed.
    pub replaced: u64,
    pub bids: u64,
    /// Services not running at the end (failed, or out of bids).
    pub not_running: u64,
    /// Usage charged on the services' leases and their verified GPU-ms.
    pub charged_minor: u64,
    pub verified_gpu_ms: u64,
    /// By hand: the peak's replicas leased all the while, and their cost
    /// at the price the services' replicas paid.
    pub by_hand_gpu_ms: u64,
    pub by_hand_minor: u64,
}

#[derive(Clone, Debug, Default)]
pub struct CheatStats {
    pub attempts: u64,
    /// Refused by settlement or the engine, or moved nothing (a duplicate).
    pub caught: u64,
    /// Minor units a cheat attempt moved to the cheater. The goal is zero.
    pub moved_minor: u64,
    /// The codes it was refused with.
    pub codes: BTreeMap<String, u64>,
}

/// Hardware challenges of one kind of supplier (docs/market-rules.md
/// "Verified hardware").
#[derive(Clone, Debug, Default)]
pub struct ChallengeStats {
    pub suppliers: u64,
    /// Suppliers with at least one challenge answered.
    pub suppliers_answered: u64,
    /// Suppliers with a GPU found wrong or too slow, and how long after
    /// the run's start (when every GPU was listed) the first was.
    pub suppliers_caught: u64,
    pub time_to_catch_ms: Vec<u64>,
    pub issued: u64,
    /// Results: passed, too slow, wrong, unanswered.
    pub outcomes: [u64; 4],
}

#[derive(Clone, Debug, Default)]
pub struct FaultStats {
    pub crashes: u64,
    pub network_losses: u64,
    pub agents_stopped_reporting: u64,
    pub leases_on_down_hosts: u64,
    pub honest_reports_refused: BTreeMap<String, u64>,
    /// GPU-ms delivered but never billed, by cause.
    pub unbilled_late_gpu_ms: u64,
    pub unbilled_stopped_gpu_ms: u64,
    /// Leases with time never billed, by cause.
    pub unbilled_late_leases: u64,
    pub unbilled_stopped_leases: u64,
    /// Bills made provisional at the grace (reports missing), the GPU time
    /// missing then, what late reports billed before the bills were final,
    /// and how many became final before their window ended (their last
    /// report arrived).
    pub provisional_bills: u64,
    pub provisional_unreported_gpu_ms: u64,
    pub late_billed_gpu_ms: u64,
    pub provisional_final_early: u64,
    pub restarts: u64,
    pub restart_entries_replayed: u64,
    pub restart_mismatches: u64,
}

#[derive(Clone, Debug, Default)]
pub struct BillingStats {
    pub leases_closed: u64,
    /// Leases whose usage charge is not `floor(price x verified / 1 h)`.
    pub charge_rule_violations: u64,
    /// Leases billed for more GPU time than they were delivered.
    pub overbilled_leases: u64,
    pub overbilled_gpu_ms: u64,
    /// Leases with every report on time from an honest agent: verified must
    /// equal delivered exactly.
    pub clean_leases: u64,
    pub clean_mismatches: u64,
    pub delivered_gpu_ms: u64,
    pub verified_gpu_ms: u64,
    pub usage_charged_minor: u64,
    /// What the delivered time is worth at each lease's price (rounded down per lease).
    pub delivered_value_minor: u64,
    pub sla_credits: u64,
    pub sla_credited_minor: u64,
    pub fees_minor: u64,
    pub unpaid_usage_minor: u64,
}

/// Renters' liveness evidence against suppliers' reports, for the leases
/// of one kind of supplier.
#[derive(Clone, Debug, Default)]
pub struct DisputeStats {
    pub leases: u64,
    /// Leases whose renter signs liveness observations.
    pub leases_watched: u64,
    pub leases_disputed: u64,
    /// Watched leases, closed, whose workload died while the host reported
    /// it available, and how many of them were disputed.
    pub leases_watched_faked: u64,
    pub leases_watched_faked_disputed: u64,
    /// GPU time billed that was not delivered (verified beyond the truth).
    pub billed_undelivered_gpu_ms: u64,
    pub disputed_gpu_ms: u64,
    /// Of it, what the renters' GPU probes proved.
    pub proven_gpu_ms: u64,
    /// The supplier's share held for disputed time.
    pub held_minor: u64,
    /// At the final bills: what went back to renters (held share and fee)
    /// and what the holds paid to the hosts.
    pub refunded_minor: u64,
    pub paid_to_host_minor: u64,
    /// From the workload's death to the lease's first dispute.
    pub time_to_dispute_ms: Vec<u64>,
    pub observations: u64,
}

#[derive(Clone, Debug, Default)]
pub struct Metrics {
    /// Suppliers' reliability scores at the end (`None`: unrated), by kind.
    pub scores: BTreeMap<String, Vec<Option<u32>>>,
    /// Indexed by hour of the run, then class index.
    pub hours: Vec<[HourSample; 4]>,
    /// Indexed by hour, then class, then kind (0 spot, 1 preemptible, 2 reserved).
    pub trades: Vec<[[TradeBucket; 3]; 4]>,
    pub jobs: BTreeMap<RenterKind, JobStats>,
    pub window_bids: JobStats,
    /// Training bought as cluster bids (`--cluster-bids-bps`), and what
    /// their fills cost against each class's last spot price at the time.
    pub cluster_bids: JobStats,
    /// Cluster bids placed while a fabric group of their class had the
    /// hosts free, and how many of those never filled.
    pub cluster_with_supply: u64,
    pub cluster_with_supply_unfilled: u64,
    /// Cluster fills whose leases were not whole 8-GPU hosts of one fabric
    /// group (the engine's rule says none).
    pub cluster_fills_outside_one_group: u64,
    pub cluster_paid_minor: u128,
    pub cluster_at_spot_minor: u128,
    /// Fabric groups and their hosts, at the start.
    pub fabric_groups: u64,
    pub fabric_hosts: u64,
    pub managed: ManagedStats,
    pub services: ServiceStats,
    pub cheats: BTreeMap<SupplierCheat, CheatStats>,
    /// Hardware challenges by supplier kind (`None`: no hardware cheat:
    /// honest, or cheating at usage reports only).
    pub challenges: BTreeMap<Option<SupplierCheat>, ChallengeStats>,
    pub renter_cheats: BTreeMap<&'static str, CheatStats>,
    /// Disputes by supplier kind (`None`: honest at availability).
    pub disputes: BTreeMap<Option<SupplierCheat>, DisputeStats>,
    /// Debt the underpaying renters still owe at the end.
    pub underpayer_debt_minor: u64,
    pub faults: FaultStats,
    pub billing: BillingStats,
    pub preemptions_by_day: Vec<u64>,
    pub leases_by_kind: [u64; 3],
    /// Supplier earnings per class (usage and reserved rest, before fees).
    pub supplier_revenue_minor: [u64; 4],
    pub posted_baseline_minor: [u64; 4],
    pub double_bookings: u64,
    pub sim_actions: u64,
    pub orders_rejected: BTreeMap<String, u64>,
    /// Renters' bids placed as order types beyond plain ones, by type
    /// (`SimConfig::order_types_bps`), and stops the market triggered.
    pub order_types: BTreeMap<&'static str, u64>,
    /// The exchange state's encoded size at the end of each day.
    pub hot_state_by_day: Vec<crate::exchange::HotState>,
    /// Leases by the region of their host, as the engine has it
    /// (`SimConfig::regional_renters_bps`).
    pub regions: BTreeMap<String, RegionStats>,
    /// Leases a renter who bids only at home got outside its region (the
    /// engine must make none).
    pub regional_leases_elsewhere: u64,
}

/// The leases made on hosts of one region.
#[derive(Clone, Debug, Default)]
pub struct RegionStats {
    pub leases: u64,
    pub gpus: u64,
    /// Leases of renters who bid only in this region.
    pub regional_leases: u64,
    /// Each GPU's price as basis points of its class's list price, summed
    /// (over `gpus`: the average price level in the region).
    pub price_bps_of_list_sum: u64,
}

impl Metrics {
    /// The row a renter's job counts in.
    pub fn job_stats(&mut self, kind: RenterKind, window: bool, cluster: bool) -> &mut JobStats {
        match (window, cluster) {
            (true, _) => &mut self.window_bids,
            (false, true) => &mut self.cluster_bids,
            (false, false) => self.jobs.entry(kind).or_default(),
        }
    }

    pub fn new(hours: usize, days: usize) -> Self {
        Metrics {
            hours: vec![Default::default(); hours],
            trades: vec![Default::default(); hours],
            preemptions_by_day: vec![0; days],
            ..Default::default()
        }
    }

    /// Every hardware cheater answered was caught, and no honest GPU was
    /// found wrong or too slow.
    pub fn hardware_cheats_caught_and_honest_spared(&self) -> bool {
        self.challenges.iter().all(|(kind, stats)| match kind {
            Some(_) => stats.suppliers_caught == stats.suppliers_answered,
            None => stats.outcomes[1] == 0 && stats.outcomes[2] == 0,
        })
    }

    /// No supplier that reports availability truthfully was disputed, and
    /// every watched lease of a fake-availability supplier was.
    pub fn fake_availability_disputed_and_honest_spared(&self) -> bool {
        self.disputes.iter().all(|(kind, stats)| match kind {
            Some(SupplierCheat::FakeAvailability) => stats.leases_watched_faked_disputed == stats.leases_watched_faked,
            _ => stats.leases_disputed == 0 && stats.disputed_gpu_ms == 0,
        })
    }

    pub fn every_cheat_caught(&self) -> bool {
        self.cheats.values().chain(self.renter_cheats.values()).all(|c| c.caught == c.attempts && c.moved_minor == 0)
    }
}
