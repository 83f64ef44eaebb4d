//! The simulated participants and how a seed draws them: GPU owners with
//! hosts of 1-8 GPUs, renters of three kinds, aggregators, and which of them
//! cheat or suffer faults.
//!
//! Everything here is drawn from one seeded ChaCha stream in a fixed order, so
//! the same seed and sizes always give the same population. Prices are in
//! minor units (micro-dollars) per GPU-hour, like the engine's.

use gpux_engine::{GpuSpec, Interconnect, Vendor};
use rand::{Rng, RngCore};

use crate::config::SimConfig;

/// The GPU classes the simulated hosts carry: a list price (owners' floors
/// and the opening prices are drawn around it) and the share of hosts that
/// carry them.
pub struct ClassModel {
    pub name: &'static str,
    /// Index of the class in `EngineConfig::demo()`.
    pub class: u16,
    pub list_price_minor: u64,
    pub host_share_percent: u32,
    /// Data-centre hosts: always on, 8 GPUs mostly; else home rigs with 1-4.
    pub data_centre: bool,
}

pub const CLASSES: [ClassModel; 4] = [
    ClassModel { name: "H100-SXM-80G", class: 0, list_price_minor: 2_400_000, host_share_percent: 35, data_centre: true },
    ClassModel { name: "A100-80G", class: 1, list_price_minor: 1_500_000, host_share_percent: 25, data_centre: true },
    ClassModel { name: "RTX4090-24G", class: 2, list_price_minor: 400_000, host_share_percent: 30, data_centre: false },
    ClassModel { name: "MI300X-192G", class: 3, list_price_minor: 2_100_000, host_share_percent: 10, data_centre: true },
];

pub fn spec_of(class_index: usize) -> GpuSpec {
    match class_index {
        0 => GpuSpec::h100_sxm(),
        1 => GpuSpec {
            vendor: Vendor::Nvidia,
            model: "NVIDIA A100-SXM4-80GB".into(),
            memory_mib: 81_920,
            interconnect: Interconnect::NvLink,
            mig_profile: None,
        },
        2 => GpuSpec {
            vendor: Vendor::Nvidia,
            model: "NVIDIA GeForce RTX 4090".into(),
            memory_mib: 24_564,
            interconnect: Interconnect::Pcie,
            mig_profile: None,
        },
        _ => GpuSpec {
            vendor: Vendor::Amd,
            model: "AMD Instinct MI300X".into(),
            memory_mib: 196_608,
            interconnect: Interconnect::InfinityFabric,
            mig_profile: None,
        },
    }
}

/// A region of the demo listing as the simulator models it: what power and
/// space cost there (owners' floors scale by it) and the shares of hosts
/// and of regional renters at home there. Compute moves west for the east:
/// cn-west is cheap and has hosts, cn-east has the demand.
pub struct RegionModel {
    pub name: &'static str,
    pub cost_percent: u64,
    pub host_share_percent: u32,
    pub renter_share_percent: u32,
}

pub const REGIONS: [RegionModel; 5] = [
    RegionModel { name: "us-east", cost_percent: 100, host_share_percent: 30, renter_share_percent: 30 },
    RegionModel { name: "us-west", cost_percent: 105, host_share_percent: 15, renter_share_percent: 15 },
    RegionModel { name: "eu-central", cost_percent: 115, host_share_percent: 15, renter_share_percent: 20 },
    RegionModel { name: "cn-east", cost_percent: 125, host_share_percent: 10, renter_share_percent: 30 },
    RegionModel { name: "cn-west", cost_percent: 75, host_share_percent: 30, renter_share_percent: 5 },
];

fn pick_region(rng: &mut impl RngCore, share: impl Fn(&RegionModel) -> u32) -> u8 {
    let roll = rng.random_range(0..100);
    let mut acc = 0;
    for (index, region) in REGIONS.iter().enumerate() {
        acc += share(region);
        if roll < acc {
            return index as u8;
        }
    }
    REGIONS.len() as u8 - 1
}

/// How a cheating supplier tries to be paid for GPU time it did not deliver.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum SupplierCheat {
    /// Claims more available time than the interval holds.
    InflateAvailable,
    /// Claims time that has not happened yet.
    ClaimFuture,
    /// Sends an accepted report again, and an old one re-chained.
    Replay,
    /// Signs reports with a key that is not its host key.
    Forge,
    /// Reports GPUs that are not in the lease.
    PhantomGpu,
    /// Reports the same time twice (overlapping intervals).
    DoubleCount,
    /// Reports time before its lease began.
    BeforeLease,
    /// Registers a GPU another host already listed, and offers leased GPUs
    /// again in a reserved window.
    DoubleSell,
    /// Reports another supplier's lease.
    ForeignLease,
    /// Its GPUs answer hardware challenges with a wrong product (a broken
    /// or emulated GPU passed off as a real one).
    WrongProduct,
    /// A slower GPU registered as the class's model (misdeclared): it
    /// answers hardware challenges right, but slower than the class allows.
    SlowGpu,
    /// The renter's workload dies some time into each lease and the host
    /// keeps reporting the GPUs available (fake availability): only the
    /// renter's signed liveness evidence can tell.
    FakeAvailability,
}

/// In the order cheaters take them (the hardware cheats and fake
/// availability early, so a run with few cheaters has them).
pub const SUPPLIER_CHEATS: [SupplierCheat; 12] = [
    SupplierCheat::InflateAvailable,
    SupplierCheat::WrongProduct,
    SupplierCheat::FakeAvailability,
    SupplierCheat::ClaimFuture,
    SupplierCheat::SlowGpu,
    SupplierCheat::Replay,
    SupplierCheat::Forge,
    SupplierCheat::PhantomGpu,
    SupplierCheat::DoubleCount,
    SupplierCheat::BeforeLease,
    SupplierCheat::DoubleSell,
    SupplierCheat::ForeignLease,
];

impl SupplierCheat {
    /// Cheats at hardware challenges (their usage reports are honest).
    pub fn is_hardware(self) -> bool {
        matches!(self, SupplierCheat::WrongProduct | SupplierCheat::SlowGpu)
    }

    pub fn label(self) -> &'static str {
        match self {
            SupplierCheat::InflateAvailable => "inflated available time",
            SupplierCheat::ClaimFuture => "time claimed ahead of the clock",
            SupplierCheat::Replay => "replayed reports",
            SupplierCheat::Forge => "forged signatures",
            SupplierCheat::PhantomGpu => "GPUs not in the lease",
            SupplierCheat::DoubleCount => "the same time reported twice",
            SupplierCheat::BeforeLease => "time before the lease",
            SupplierCheat::DoubleSell => "double-selling GPUs",
            SupplierCheat::ForeignLease => "another supplier's lease",
            SupplierCheat::WrongProduct => "wrong hardware challenge answers",
            SupplierCheat::SlowGpu => "a slower GPU than the model it claims",
            SupplierCheat::FakeAvailability => "leased GPUs taken away, reported available",
        }
    }
}

/// Faults that strike an honest host.
#[derive(Clone, Copy, Debug, Default)]
pub struct HostFaults {
    /// The host's clock runs this far ahead (negative: behind); its agent
    /// converts to the exchange's time (market/usage.rs).
    pub clock_skew_ms: i64,
    /// Reports reach the exchange this long after they are due.
    pub report_delay_ms: u64,
    /// The agent stops reporting at this point of every lease it holds
    /// (a broken agent): the GPUs keep working, unbilled.
    pub stops_reporting: bool,
}

pub struct Supplier {
    pub class_index: usize,
    pub host_name: String,
    pub gpu_count: u32,
    /// The owner's floor: it never asks below this.
    pub floor_minor: u64,
    /// Home rigs are used by their owners during the owner's day: the hour
    /// (UTC) the owner's day starts, 10 hours long.
    pub owner_day_start_hour: Option<u32>,
    /// Data-centre owners that also sell reserved daily windows.
    pub sells_windows: bool,
    pub cheat: Option<SupplierCheat>,
    pub faults: HostFaults,
    pub key_seed: [u8; 32],
    /// The host's region (`REGIONS` index); `None` when the run has none.
    pub region: Option<u8>,
    /// The data-centre operator whose fabric group the host is in (the
    /// index of the group's first host, whose account and key every host of
    /// the group shares); `None`: no fabric.
    pub fabric_group: Option<u32>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum RenterKind {
    /// Gang allocations on one host for hours.
    Training,
    /// Steady spot capacity, open-ended, for days.
    Inference,
    /// Short preemptible jobs.
    Batch,
}

impl RenterKind {
    pub fn label(self) -> &'static str {
        match self {
            RenterKind::Training => "training (gang, hours)",
            RenterKind::Inference => "inference (open-ended spot)",
            RenterKind::Batch => "batch (preemptible)",
        }
    }
}

pub struct Renter {
    pub kind: RenterKind,
    pub class_index: usize,
    /// Expected jobs per simulated day at the daily average demand.
    pub jobs_per_day: f64,
    /// How much above the going price it will pay, in basis points.
    pub eagerness_bps: u32,
    /// Deposits only what one job's hold needs, never tops up, and tries to
    /// withdraw held funds.
    pub underpays: bool,
    /// Bids only in this region (`REGIONS` index): its data must stay there.
    pub region: Option<u8>,
}

pub struct Aggregator {
    pub class_index: usize,
    /// Contracts it tries to hold in each daily window.
    pub contracts_per_window: u32,
}

pub struct Population {
    pub suppliers: Vec<Supplier>,
    pub renters: Vec<Renter>,
    pub aggregators: Vec<Aggregator>,
}

fn pick_class(rng: &mut impl RngCore) -> usize {
    let roll = rng.random_range(0..100);
    let mut acc = 0;
    for (index, class) in CLASSES.iter().enumerate() {
        acc += class.host_share_percent;
        if roll < acc {
            return index;
        }
    }
    CLASSES.len() - 1
}

/// Draws the whole population from the config's seed.
pub fn draw(config: &SimConfig, rng: &mut impl RngCore) -> Population {
    let mut suppliers = Vec::with_capacity(config.suppliers as usize);
    let mut cheaters = 0usize;
    for index in 0..config.suppliers {
        let class_index = pick_class(rng);
        let model = &CLASSES[class_index];
        let gpu_count =
            if model.data_centre { *[8u32, 8, 8, 4, 2, 1].get(rng.random_range(0..6)).unwrap_or(&8) } else { rng.random_range(1..=4) };
        let floor_minor = model.list_price_minor * rng.random_range(45..80) / 100 / 1_000 * 1_000;
        // Cheaters take the cheats in turn, so every kind shows up.
        let cheat = (rng.random_range(0..10_000) < config.cheater_share_bps).then(|| {
            cheaters += 1;
            SUPPLIER_CHEATS[(cheaters - 1) % SUPPLIER_CHEATS.len()]
        });
        let faults = HostFaults {
            clock_skew_ms: if rng.random_range(0..100) < 3 { rng.random_range(6_000..20_000) } else { rng.random_range(-2_000..2_000) },
            report_delay_ms: if rng.random_range(0..100) < 5 { rng.random_range(60_000..1_800_000) } else { rng.random_range(0..5_000) },
            stops_reporting: rng.random_range(0..1_000) < config.fault_per_mille / 2,
        };
        let mut key_seed = [0u8; 32];
        rng.fill_bytes(&mut key_seed);
        suppliers.push(Supplier {
            class_index,
            host_name: format!("sim-host-{index:06}"),
            gpu_count,
            floor_minor: floor_minor.max(1_000),
            owner_day_start_hour: (!model.data_centre).then(|| rng.random_range(0..24)),
            sells_windows: model.data_centre && class_index != 3 && rng.random_range(0..100) < 30,
            cheat,
            faults,
            key_seed,
            region: None,
            fabric_group: None,
        });
    }
    let mut renters = Vec::with_capacity(config.renters as usize);
    for _ in 0..config.renters {
        let kind = match rng.random_range(0..100) {
            0..35 => RenterKind::Training,
            35..60 => RenterKind::Inference,
            _ => RenterKind::Batch,
        };
        let jobs_per_day = match kind {
            RenterKind::Training => rng.random_range(0.3..1.0),
            RenterKind::Inference => rng.random_range(0.05..0.2),
            RenterKind::Batch => rng.random_range(0.5..2.0),
        };
        renters.push(Renter {
            kind,
            class_index: pick_class(rng),
            jobs_per_day: jobs_per_day * config.demand_scale,
            eagerness_bps: rng.random_range(0..3_000),
            underpays: rng.random_range(0..10_000) < config.cheater_share_bps / 2,
            region: None,
        });
    }
    let aggregators = (0..config.aggregators)
        .map(|_| Aggregator { class_index: rng.random_range(0..2), contracts_per_window: rng.random_range(2..=8) })
        .collect();
    let mut population = Population { suppliers, renters, aggregators };
    draw_regions(config, &mut population);
    draw_fabrics(config, &mut population);
    population
}

/// Fabric groups come from a stream of their own (a run without cluster
/// bids draws what it drew before): honest data-centre owners' 8-GPU hosts
/// of one class, in runs of 4 to 8, seven runs in ten wired as one fabric
/// group under one account. Its hosts sell no reserved windows (their
/// owner sells them as clusters). At most 8 hosts: an account registers at
/// most 64 GPUs that have not yet passed a hardware challenge
/// (`gpus_awaiting_challenge`), and the simulator registers every GPU at
/// the start (the agent registers the rest as challenges pass).
fn draw_fabrics(config: &SimConfig, population: &mut Population) {
    use rand::SeedableRng;
    if config.cluster_bids_bps == 0 {
        return;
    }
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(config.seed ^ 0x6661_6272_6963_7321);
    for (class_index, class) in CLASSES.iter().enumerate() {
        let eligible: Vec<usize> = (0..population.suppliers.len())
            .filter(|&i| {
                let s = &population.suppliers[i];
                s.class_index == class_index && class.data_centre && s.gpu_count == 8 && s.cheat.is_none()
            })
            .collect();
        let mut at = 0;
        while at < eligible.len() {
            let size = rng.random_range(4..=8usize).min(eligible.len() - at);
            if size >= 2 && rng.random_range(0..10) < 7 {
                let first = eligible[at];
                let region = population.suppliers[first].region;
                for &index in &eligible[at..at + size] {
                    let supplier = &mut population.suppliers[index];
                    supplier.fabric_group = Some(first as u32);
                    supplier.sells_windows = false;
                    supplier.region = region;
                }
            }
            at += size;
        }
    }
}

/// Regions come from a stream of their own, so a run without them draws
/// exactly what it drew before regions existed.
fn draw_regions(config: &SimConfig, population: &mut Population) {
    use rand::SeedableRng;
    if config.regional_renters_bps == 0 {
        return;
    }
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(config.seed ^ 0x7265_6769_6f6e_7321);
    for supplier in &mut population.suppliers {
        let region = pick_region(&mut rng, |r| r.host_share_percent);
        let cost = REGIONS[region as usize].cost_percent;
        supplier.floor_minor = (supplier.floor_minor * cost / 100 / 1_000 * 1_000).max(1_000);
        supplier.region = Some(region);
    }
    for renter in &mut population.renters {
        let home = pick_region(&mut rng, |r| r.renter_share_percent);
        renter.region = (rng.random_range(0..10_000) < config.regional_renters_bps).then_some(home);
    }
}
