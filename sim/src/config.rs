//! The knobs of one simulation run. Every figure in a report follows from
//! these and nothing else: no clock, no environment.

/// 2026-12-07T00:00:00Z, a Monday: simulated time starts here.
pub const START_MS: u64 = 1_796_601_600_000;
pub use gpux_engine::time::{MS_PER_DAY, MS_PER_HOUR};

#[derive(Clone, Debug)]
pub struct SimConfig {
    pub seed: u64,
    pub suppliers: u32,
    pub renters: u32,
    pub aggregators: u32,
    pub days: u32,
    /// How often an agent reports each leased GPU's usage (the real agent
    /// reports every minute; the simulator reports less often to keep the
    /// signature work in proportion, which only coarsens the grain).
    pub report_interval_ms: u64,
    /// Share of suppliers that cheat (and half as many renters that try to underpay).
    pub cheater_share_bps: u32,
    /// Hosts per thousand that crash, lose their network or stop reporting each day.
    pub fault_per_mille: u32,
    /// Multiplies every renter's job rate.
    pub demand_scale: f64,
    /// Exchange restarts (snapshot plus journal replay) spread over the run.
    pub restarts: u32,
    /// How often each supplier re-prices and re-posts its idle GPUs.
    pub supplier_wake_ms: u64,
    /// Keep every journal entry of the run (`sim.exchange.journal()`), for
    /// replaying it through the exchange and the audit.
    pub record_journal: bool,
    /// Share of renters' job bids (basis points) placed as one of the order
    /// types beyond plain ones, in turn: a budget of three quarters of the
    /// job's hold at its limit, all-or-none, or a stop one percent above its
    /// price (docs/market-rules.md). 0 draws nothing, so runs without it
    /// are the same as before it existed.
    pub order_types_bps: u32,
    /// Regions (docs/market-rules.md "Regions"): 0 draws none, so runs
    /// without it are the same as before it existed. Otherwise every host
    /// declares a region (`population::REGIONS`, owners' floors scaled by
    /// its costs) and this share of renters (basis points) bid only in
    /// their home region; the report shows prices by region.
    pub regional_renters_bps: u32,
    /// Share of training renters' work (basis points) submitted as gpux
    /// jobs (docs/jobs.md) instead of bought as leases: the exchange bids,
    /// resumes the job from its last checkpoint on another host when one
    /// goes silent, and the report compares completion, time lost and cost
    /// with leases bought by hand. 0 draws nothing, so runs without it are
    /// the same as before it existed.
    pub managed_jobs_bps: u32,
    /// Clusters (docs/market-rules.md "Cluster bids"): data-centre owners
    /// run some of their 8-GPU hosts as fabric groups under one account,
    /// and this share of training renters' jobs (basis points) buy 2 to 4
    /// whole hosts of one fabric with a cluster bid; the report shows their
    /// fill rate, time to fill and price premium. 0 draws nothing.
    pub cluster_bids_bps: u32,
    /// Share of inference renters (basis points) that run a gpux service
    /// (docs/services.md) instead of buying leases: autoscaled on a daily
    /// traffic curve, its replicas replaced when their lease ends early;
    /// the report sets requests served, replicas replaced and the cost
    /// beside leases bought by hand for the peak. 0 draws nothing.
    pub service_renters_bps: u32,
}

impl SimConfig {
    /// The default market: the sizes the issue asks the simulator to handle.
    pub fn full() -> Self {
        SimConfig {
            seed: 1,
            suppliers: 10_000,
            renters: 50_000,
            aggregators: 50,
            days: 7,
            report_interval_ms: 4 * MS_PER_HOUR,
            cheater_share_bps: 100,
            fault_per_mille: 20,
            demand_scale: 1.3,
            restarts: 2,
            supplier_wake_ms: 30 * 60_000,
            record_journal: false,
            order_types_bps: 0,
            regional_renters_bps: 0,
            managed_jobs_bps: 0,
            cluster_bids_bps: 0,
            service_renters_bps: 0,
        }
    }

    /// A small market for tests: a day, a few hundred participants, many
    /// cheaters and faults so every kind shows up.
    pub fn small(seed: u64) -> Self {
        SimConfig {
            seed,
            suppliers: 120,
            renters: 600,
            aggregators: 4,
            days: 2,
            report_interval_ms: MS_PER_HOUR,
            cheater_share_bps: 1_500,
            fault_per_mille: 100,
            demand_scale: 1.3,
            restarts: 2,
            supplier_wake_ms: 30 * 60_000,
            record_journal: false,
            order_types_bps: 0,
            regional_renters_bps: 0,
            managed_jobs_bps: 0,
            cluster_bids_bps: 0,
            service_renters_bps: 0,
        }
    }

    pub fn end_ms(&self) -> u64 {
        START_MS + self.days as u64 * MS_PER_DAY
    }
}
