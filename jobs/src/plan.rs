//! Choosing the GPU (docs/jobs.md "Choosing the GPU"): the memory a job
//! needs per GPU, then, among the listing's spot and preemptible books, the
//! class that meets it and the job's limits at the lowest expected cost
//! from the asks resting now, with the reason every other one lost.

use std::collections::{BTreeMap, BTreeSet};

use gpux_engine::{ContractKind, InstrumentId, InstrumentState, Vendor};
use gpux_protocol::views::{Instrument, Listing, Offer};
use rust_decimal::Decimal;

use crate::spec::{ContractChoice, JobSpec, MemoryNeed, Mode};

/// Bytes of GPU memory per parameter when training with mixed precision and
/// Adam: fp16 weights (2) and gradients (2), fp32 master weights (4) and the
/// optimizer's two moments (4 + 4).
pub const TRAINING_BYTES_PER_PARAM: u64 = 16;
/// Bytes per parameter when only running the model (fp16 weights).
pub const INFERENCE_BYTES_PER_PARAM: u64 = 2;
/// Activations, workspace and fragmentation on top, in percent: training
/// 25%, inference 20% (a KV cache or large batches need more: state
/// `gpu_memory_gib` then).
pub const TRAINING_OVERHEAD_PERCENT: u64 = 125;
pub const INFERENCE_OVERHEAD_PERCENT: u64 = 120;
/// The extra a preemptible lease is expected to cost in work done again
/// after a preemption (resumed from the last checkpoint), in basis points
/// of its price: 15% (the exchange weighs a job's books the same way).
pub use gpux_protocol::jobs::limits::PREEMPTIBLE_REWORK_BPS;
/// Hours a job without `max_duration` is priced for.
pub const HOURS_PRICED_DEFAULT: u64 = 1;

/// GPU memory one GPU of the job needs, in MiB (0: nothing stated). With
/// data parallelism every GPU holds the whole model's state; a job that
/// shards it (FSDP, ZeRO) needs less and says so with `gpu_memory_gib`.
pub fn memory_mib_per_gpu(spec: &JobSpec) -> u64 {
    match spec.memory {
        MemoryNeed::Unstated => 0,
        MemoryNeed::GpuMemoryGib(gib) => gib as u64 * 1024,
        MemoryNeed::ModelParams(params) => {
            let (bytes, overhead) = match spec.mode {
                Mode::Training => (TRAINING_BYTES_PER_PARAM, TRAINING_OVERHEAD_PERCENT),
                Mode::Inference => (INFERENCE_BYTES_PER_PARAM, INFERENCE_OVERHEAD_PERCENT),
            };
            let total = params as u128 * bytes as u128 * overhead as u128 / 100;
            total.div_ceil(1 << 20).min(u64::MAX as u128) as u64
        }
    }
}

/// The asks resting in one book, best first: (price per GPU-hour, GPUs).
pub type Asks = Vec<(u64, u32)>;

/// The GPUs of resting asks (`book_offers`, best first) the job's filters
/// let it buy, merged by price: an unrated seller fails a minimum score,
/// only verified GPUs count for `verified_only`, and a region excludes
/// hosts elsewhere or in none (the exchange applies the same filters to
/// the job's bids).
///
/// A job on several nodes buys a cluster (docs/market-rules.md "Cluster
/// bids"), so its asks are the members the exchange would fill it with
/// now, `gpus_per_node` GPUs of each: the offers walked in the book's
/// price-time order, one per host whose fabric counts at least the job's
/// `min_fabric_gbps` and the class's `class_min_gbps`, grouped by fabric
/// group (supplier, zone, name); the first group to reach `nodes` members.
/// None while no group can.
pub fn usable_asks(spec: &JobSpec, offers: &[Offer], class_min_gbps: u32) -> Asks {
    if spec.nodes > 1 {
        return cluster_asks(spec, offers, spec.min_fabric_gbps.max(class_min_gbps));
    }
    let mut asks: Asks = Vec::new();
    for offer in offers.iter().filter(|offer| passes_filters(spec, offer)) {
        let quantity = if spec.verified_only { offer.gpus_verified.min(offer.quantity) } else { offer.quantity };
        match asks.last_mut() {
            Some((price, total)) if *price == offer.price_minor_per_gpu_hour => *total += quantity,
            _ => asks.push((offer.price_minor_per_gpu_hour, quantity)),
        }
    }
    asks
}

/// The job's seller, region and verification filters (the exchange applies
/// the same to its bids): an unrated seller fails a minimum score, a region
/// excludes hosts elsewhere or in none, and an offer with no GPU the job
/// may buy is none.
fn passes_filters(spec: &JobSpec, offer: &Offer) -> bool {
    if spec.min_score_bps > 0 && offer.supplier_score_bps.is_none_or(|score| score < spec.min_score_bps) {
        return false;
    }
    if !spec.regions.is_empty() && !offer.region.as_ref().is_some_and(|region| spec.regions.contains(region)) {
        return false;
    }
    let quantity = if spec.verified_only { offer.gpus_verified.min(offer.quantity) } else { offer.quantity };
    quantity > 0
}

/// The members of the cluster the exchange would fill now (see
/// [`usable_asks`]), each as `(its price, gpus_per_node)`.
fn cluster_asks(spec: &JobSpec, offers: &[Offer], min_gbps: u32) -> Asks {
    let nodes = spec.nodes as usize;
    let mut groups: BTreeMap<(gpux_engine::AccountId, String, String), Vec<(gpux_engine::HostId, u64)>> = BTreeMap::new();
    for offer in offers.iter().filter(|offer| passes_filters(spec, offer)) {
        let (Some(host), Some(fabric)) = (offer.host, &offer.fabric) else { continue };
        let quantity = if spec.verified_only { offer.gpus_verified.min(offer.quantity) } else { offer.quantity };
        let counts = match &fabric.probe {
            Some(probe) if !probe.borne_out => (probe.mbps / 1_000).min(fabric.gbps as u64) as u32,
            _ => fabric.gbps,
        };
        if counts < min_gbps || fabric.hosts < spec.nodes || quantity < spec.gpus_per_node {
            continue;
        }
        let group = groups.entry((offer.supplier, fabric.zone.clone(), fabric.name.clone())).or_default();
        if group.iter().any(|(member, _)| *member == host) {
            continue;
        }
        group.push((host, offer.price_minor_per_gpu_hour));
        if group.len() == nodes {
            return group.iter().map(|&(_, price)| (price, spec.gpus_per_node)).collect();
        }
    }
    Vec::new()
}

/// What the plan knows of the market now.
pub struct Market<'a> {
    pub listing: &'a Listing,
    pub instruments: &'a [Instrument],
    pub asks: &'a BTreeMap<InstrumentId, Asks>,
}

/// Why a book was passed over.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Verdict {
    Chosen,
    /// Cheaper candidates are above it.
    Costlier,
    VendorWithoutImage,
    /// The job names another vendor (`resources.vendor`).
    VendorExcluded,
    /// The job names other classes (`resources.classes`).
    ClassExcluded,
    TooLittleMemory {
        class_mib: u32,
    },
    ContractExcluded,
    NotEnoughOffered {
        offered: u32,
    },
    /// A cluster job: no fabric group offers `nodes` hosts with the GPUs
    /// and bandwidth it needs now.
    NoCluster {
        nodes: u32,
    },
    OverMaxPrice {
        price: u64,
    },
    OverBudget {
        cost: u64,
    },
}

impl Verdict {
    /// What it says to the renter; `money` formats an amount in minor units.
    pub fn describe(&self, money: &dyn Fn(u64) -> String) -> String {
        match self {
            Verdict::Chosen => "chosen: the lowest expected cost".into(),
            Verdict::Costlier => "costs more than the chosen one".into(),
            Verdict::VendorWithoutImage => "no preset image for the framework on this vendor".into(),
            Verdict::VendorExcluded => "the job asks for another vendor".into(),
            Verdict::ClassExcluded => "the job names other classes".into(),
            Verdict::TooLittleMemory { class_mib } => format!("{} GiB per GPU is less than the job needs", class_mib / 1024),
            Verdict::ContractExcluded => "the job's contract preference excludes it".into(),
            Verdict::NotEnoughOffered { offered } => format!("only {offered} GPU(s) offered now"),
            Verdict::NoCluster { nodes } => format!("no fabric group offers {nodes} hosts with the GPUs and bandwidth needed now"),
            Verdict::OverMaxPrice { price } => format!("the GPUs cost up to {} per GPU-hour, over the job's maximum", money(*price)),
            Verdict::OverBudget { cost } => format!("expected {} for the job, over its budget", money(*cost)),
        }
    }
}

/// One book considered.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Candidate {
    pub instrument: InstrumentId,
    pub symbol: String,
    pub class: String,
    pub vendor: Vendor,
    pub preemptible: bool,
    /// The worst price the job's GPUs fill at, per GPU-hour (0: not enough offered).
    pub worst_price: u64,
    /// The job's GPUs for its hours at the asks' prices, plus the rework a
    /// preemptible lease is expected to cost; minor units.
    pub expected_cost: u64,
    pub verdict: Verdict,
}

/// The plan: every book considered, the chosen one first among equals.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Plan {
    pub memory_mib_per_gpu: u64,
    pub hours_priced: u64,
    pub candidates: Vec<Candidate>,
}

impl Plan {
    pub fn chosen(&self) -> Option<&Candidate> {
        self.candidates.iter().find(|c| c.verdict == Verdict::Chosen)
    }
}

/// Converts an amount in major units to minor units of `currency` (rounded down).
/// `amount` in minor units of `currency`, refused when it has more
/// decimals than the currency counts (never rounded: docs/first-hour.md
/// "Amounts").
pub fn to_minor_exact(amount: Decimal, currency: &gpux_engine::Currency) -> Result<u64, String> {
    let minor = amount.checked_mul(Decimal::from(10u64.pow(currency.decimals as u32))).ok_or_else(|| format!("`{amount}` is too large"))?;
    if minor.fract() != Decimal::ZERO {
        let (decimals, code) = (currency.decimals, &currency.code);
        return Err(format!("`{amount}`: at most {decimals} decimals (the exchange counts {code} to 10^-{decimals})"));
    }
    u64::try_from(minor.trunc()).map_err(|_| format!("`{amount}` is too large"))
}

pub fn to_minor(amount: Decimal, currency: &gpux_engine::Currency) -> u64 {
    // Too large for a Decimal is too large for u64 minor units too.
    let Some(minor) = amount.checked_mul(Decimal::from(10u64.pow(currency.decimals as u32))) else { return u64::MAX };
    u64::try_from(minor.trunc()).unwrap_or(u64::MAX)
}

/// Plans `spec` on `market`; `vendors`: the vendors with an image for its
/// framework (`None`: any vendor, a job that brings its own image).
pub fn plan(spec: &JobSpec, market: &Market<'_>, vendors: Option<&BTreeSet<Vendor>>) -> Plan {
    let need_mib = memory_mib_per_gpu(spec);
    let hours = spec.max_duration_ms.map_or(HOURS_PRICED_DEFAULT, |ms| ms.div_ceil(gpux_engine::time::MS_PER_HOUR));
    let currency = &market.listing.currency;
    let max_price = spec.max_price_per_gpu_hour.map(|p| to_minor(p, currency));
    let budget = spec.budget.map(|b| to_minor(b, currency));
    let gpus = spec.gpus();
    let mut candidates = Vec::new();
    for instrument in market.instruments.iter().filter(|i| i.state == InstrumentState::Trading) {
        let preemptible = match instrument.contract {
            ContractKind::Spot => false,
            ContractKind::Preemptible => true,
            _ => continue,
        };
        let Some(class) = market.listing.classes.iter().find(|c| c.name == instrument.class) else { continue };
        let asks = market.asks.get(&instrument.instrument).map(Vec::as_slice).unwrap_or(&[]);
        let (worst_price, gpu_hour_cost) = fill(asks, gpus);
        let mut expected_cost = gpu_hour_cost.saturating_mul(hours);
        if preemptible {
            expected_cost = expected_cost.saturating_add(expected_cost.saturating_mul(PREEMPTIBLE_REWORK_BPS) / 10_000);
        }
        let offered: u32 = asks.iter().map(|(_, quantity)| quantity).sum();
        let verdict = if !spec.vendor.allows(class.requirement.vendor) {
            Verdict::VendorExcluded
        } else if !spec.classes.is_empty() && !spec.classes.contains(&class.name) {
            Verdict::ClassExcluded
        } else if vendors.is_some_and(|v| !v.contains(&class.requirement.vendor)) {
            Verdict::VendorWithoutImage
        } else if (class.requirement.memory_mib_min as u64) < need_mib {
            Verdict::TooLittleMemory { class_mib: class.requirement.memory_mib_min }
        } else if matches!((spec.contract, preemptible), (ContractChoice::Spot, true) | (ContractChoice::Preemptible, false)) {
            Verdict::ContractExcluded
        } else if offered < gpus && spec.nodes > 1 {
            Verdict::NoCluster { nodes: spec.nodes }
        } else if offered < gpus {
            Verdict::NotEnoughOffered { offered }
        } else if max_price.is_some_and(|max| worst_price > max) {
            Verdict::OverMaxPrice { price: worst_price }
        } else if budget.is_some_and(|budget| expected_cost > budget) {
            Verdict::OverBudget { cost: expected_cost }
        } else {
            Verdict::Costlier
        };
        candidates.push(Candidate {
            instrument: instrument.instrument,
            symbol: instrument.symbol.clone(),
            class: class.name.clone(),
            vendor: class.requirement.vendor,
            preemptible,
            worst_price,
            expected_cost,
            verdict,
        });
    }
    // The cheapest eligible one wins; ties go to spot (no rework risk),
    // then to the listing's order.
    let best = candidates
        .iter()
        .enumerate()
        .filter(|(_, c)| c.verdict == Verdict::Costlier)
        .min_by_key(|(index, c)| (c.expected_cost, c.preemptible, *index))
        .map(|(index, _)| index);
    if let Some(index) = best {
        candidates[index].verdict = Verdict::Chosen;
    }
    Plan { memory_mib_per_gpu: need_mib, hours_priced: hours, candidates }
}

/// The other books a job's new attempts may bid on (docs/jobs.md
/// "Failover"), each at its limit, cheapest expected first: every book
/// that meets the job as the chosen one does (its vendor, so the same
/// image runs; memory, contract, classes) whatever it offers now, at the
/// job's `max_price_per_gpu_hour` or, without one, at the worst price its
/// GPUs fill at now (a book offering too few has no price to bid and is
/// left out), on the book's tick within its band. None with `failover =
/// false`.
pub fn alternatives(plan: &Plan, spec: &JobSpec, market: &Market<'_>) -> Vec<(InstrumentId, u64)> {
    let Some(chosen) = plan.chosen() else { return Vec::new() };
    if !spec.failover {
        return Vec::new();
    }
    let max_price = spec.max_price_per_gpu_hour.map(|p| to_minor(p, &market.listing.currency));
    let mut books: Vec<(u64, InstrumentId, u64)> = Vec::new();
    for candidate in &plan.candidates {
        let meets = matches!(
            candidate.verdict,
            Verdict::Costlier
                | Verdict::NotEnoughOffered { .. }
                | Verdict::NoCluster { .. }
                | Verdict::OverMaxPrice { .. }
                | Verdict::OverBudget { .. }
        );
        if !meets || candidate.instrument == chosen.instrument || candidate.vendor != chosen.vendor {
            continue;
        }
        let Some(instrument) = market.instruments.iter().find(|i| i.instrument == candidate.instrument) else { continue };
        let Some(limit) = max_price.or((candidate.worst_price > 0).then_some(candidate.worst_price)) else { continue };
        let tick = instrument.tick_minor.max(1);
        let limit = (limit / tick * tick).clamp(instrument.price_min_minor_per_gpu_hour, instrument.price_max_minor_per_gpu_hour);
        let rank = if candidate.expected_cost > 0 { candidate.expected_cost } else { u64::MAX };
        books.push((rank, candidate.instrument, limit));
    }
    books.sort();
    books.truncate(gpux_protocol::jobs::limits::ALTERNATIVES_MAX);
    books.into_iter().map(|(_, instrument, limit)| (instrument, limit)).collect()
}

/// The worst price and the cost per hour of `gpus` GPUs taken from the
/// best asks (a whole host's ask may be taken in part).
fn fill(asks: &[(u64, u32)], gpus: u32) -> (u64, u64) {
    let (mut left, mut worst, mut cost) = (gpus, 0u64, 0u64);
    for &(price, quantity) in asks {
        if left == 0 {
            break;
        }
        let take = quantity.min(left);
        left -= take;
        worst = price;
        cost = cost.saturating_add(price.saturating_mul(take as u64));
    }
    if left > 0 {
        (0, 0)
    } else {
        (worst, cost)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::spec::JobSpec;

    fn spec(extra_resources: &str, extra_limits: &str) -> JobSpec {
        JobSpec::parse(&format!(
            "name = \"t\"\n[code]\nimage = \"x\"\ncommand = [\"run\"]\n[resources]\n{extra_resources}\n[limits]\n{extra_limits}\n"
        ))
        .expect("a valid job")
    }

    #[test]
    fn memory_follows_the_documented_factors() {
        // 7B trained: 7e9 x 16 B x 1.25 = 140 GB = 133 514 MiB.
        assert_eq!(memory_mib_per_gpu(&spec("model_params = \"7B\"", "")), 133_515);
        // 7B served: 7e9 x 2 B x 1.2 = 16.8 GB.
        assert_eq!(memory_mib_per_gpu(&spec("model_params = \"7B\"\nmode = \"inference\"", "")), 16_022);
        assert_eq!(memory_mib_per_gpu(&spec("gpu_memory_gib = 40", "")), 40 * 1024);
        assert_eq!(memory_mib_per_gpu(&spec("", "")), 0);
    }

    #[test]
    fn offers_the_job_may_not_buy_are_left_out() {
        let offer = |price, quantity, verified, score: Option<u32>, region: Option<&str>| Offer {
            price_minor_per_gpu_hour: price,
            quantity,
            supplier: gpux_engine::AccountId(1),
            host: Some(gpux_engine::HostId(0)),
            gpus_verified: verified,
            supplier_score_bps: score,
            region: region.map(str::to_string),
            fabric: None,
        };
        let offers = [
            offer(1_000_000, 4, 1, Some(9_900), Some("eu")),
            offer(1_000_000, 2, 2, None, Some("eu")),
            offer(1_100_000, 8, 8, Some(9_000), Some("us")),
        ];
        assert_eq!(usable_asks(&spec("", ""), &offers, 0), [(1_000_000, 6), (1_100_000, 8)]);
        assert_eq!(usable_asks(&spec("", "min_score = 0.95"), &offers, 0), [(1_000_000, 4)]);
        assert_eq!(usable_asks(&spec("", "verified_only = true"), &offers, 0), [(1_000_000, 3), (1_100_000, 8)]);
        assert_eq!(usable_asks(&spec("", "region = \"us\""), &offers, 0), [(1_100_000, 8)]);
    }

    /// A cluster job prices the members the exchange would fill it with:
    /// one ask per host of one fabric group, bandwidth counted as measured.
    #[test]
    fn a_cluster_job_prices_the_first_fabric_group_to_complete_in_price_order() {
        let offer = |price, host: u32, supplier: u32, fabric: Option<(&str, u32, Option<u64>)>| Offer {
            price_minor_per_gpu_hour: price,
            quantity: 8,
            supplier: gpux_engine::AccountId(supplier),
            host: Some(gpux_engine::HostId(host)),
            gpus_verified: 8,
            supplier_score_bps: Some(9_900),
            region: Some("us-east".into()),
            fabric: fabric.map(|(name, gbps, measured)| gpux_protocol::views::Fabric {
                name: name.into(),
                zone: "z1".into(),
                gbps,
                hosts: 4,
                probe: measured.map(|mbps| gpux_protocol::views::FabricProbe {
                    at_ms: 1,
                    lease: gpux_engine::LeaseId(1),
                    ranks: 2,
                    mbps,
                    borne_out: gpux_engine::probe_bears_out(gbps, mbps),
                }),
            }),
        };
        let offers = [
            offer(900_000, 0, 1, None),                               // no fabric
            offer(1_000_000, 1, 1, Some(("ib0", 400, Some(40_000)))), // claim not borne out: counts 40
            offer(1_100_000, 2, 2, Some(("ib1", 400, None))),
            offer(1_200_000, 3, 1, Some(("ib0", 400, None))),
            offer(1_300_000, 4, 2, Some(("ib1", 400, Some(390_000)))),
            offer(1_400_000, 5, 1, Some(("ib0", 400, None))),
        ];
        let cluster = |limits: &str| spec("gpus_per_node = 8\nnodes = 2\nmin_fabric_gbps = 100", limits);
        // Host 1 counts at 40 Gb/s: group ib1 (hosts 2 and 4) completes first.
        assert_eq!(usable_asks(&cluster(""), &offers, 0), [(1_100_000, 8), (1_300_000, 8)]);
        // A class rule of 50 Gb/s changes nothing; without the bid's own
        // minimum and the rule, host 1 counts and ib0 (1, 3) completes first.
        let no_minimum = spec("gpus_per_node = 8\nnodes = 2", "");
        assert_eq!(usable_asks(&no_minimum, &offers, 0), [(1_000_000, 8), (1_200_000, 8)]);
        assert_eq!(usable_asks(&no_minimum, &offers, 50), [(1_100_000, 8), (1_300_000, 8)], "the class's 50 Gb/s passes host 1 over");
        // Three nodes: ib0 has hosts 1 (too slow for 100), 3 and 5 only.
        let three = spec("gpus_per_node = 8\nnodes = 3\nmin_fabric_gbps = 100", "");
        assert_eq!(usable_asks(&three, &offers, 0), []);
        assert_eq!(usable_asks(&spec("gpus_per_node = 8\nnodes = 3", ""), &offers, 0).len(), 3);
    }

    /// The demo listing's books, scripted: the class choice against them.
    #[test]
    fn the_cheapest_book_that_meets_memory_gpus_and_limits_wins_and_each_loser_says_why() {
        let config = gpux_engine::EngineConfig::demo();
        let listing = Listing::from(&config);
        let instruments: Vec<Instrument> = gpux_protocol::views::of(&gpux_engine::Engine::new(config).expect("demo").instruments());
        let find = |symbol: &str| instruments.iter().find(|i| i.symbol == symbol).unwrap_or_else(|| panic!("{symbol} listed")).instrument;
        let (h100, h100_pre, a100) = (find("H100-SXM-80G/SPOT"), find("H100-SXM-80G/PREEMPT"), find("A100-80G/SPOT"));
        let mut asks = BTreeMap::new();
        asks.insert(h100, vec![(2_000_000, 2), (2_400_000, 4)]);
        asks.insert(h100_pre, vec![(1_200_000, 8)]);
        asks.insert(a100, vec![(1_500_000, 1)]);
        let market = Market { listing: &listing, instruments: &instruments, asks: &asks };
        let verdict = |plan: &Plan, instrument| plan.candidates.iter().find(|c| c.instrument == instrument).map(|c| c.verdict.clone());

        // Four GPUs: preemptible H100 at 1.20 (+15% rework) beats spot
        // (2 at 2.00 and 2 at 2.40); the A100 book has one GPU.
        let plan = plan(&spec("gpus_per_node = 4", ""), &market, None);
        assert_eq!(plan.chosen().map(|c| c.instrument), Some(h100_pre));
        assert_eq!(plan.chosen().map(|c| c.expected_cost), Some(4 * 1_200_000 * 115 / 100));
        assert_eq!(verdict(&plan, h100), Some(Verdict::Costlier));
        assert_eq!(verdict(&plan, a100), Some(Verdict::NotEnoughOffered { offered: 1 }));

        // Spot only, capped at 2.20: the spot book's fourth GPU costs 2.40.
        let capped = super::plan(&spec("gpus_per_node = 4", "contract = \"spot\"\nmax_price_per_gpu_hour = \"2.20\""), &market, None);
        assert_eq!(capped.chosen(), None);
        assert_eq!(verdict(&capped, h100), Some(Verdict::OverMaxPrice { price: 2_400_000 }));
        assert_eq!(verdict(&capped, h100_pre), Some(Verdict::ContractExcluded));

        // One GPU for 10 hours within a 16.00 budget: the A100 at 1.50 (15.00).
        let one = super::plan(&spec("", "contract = \"spot\"\nmax_duration = \"10h\"\nbudget = \"16\""), &market, None);
        assert_eq!(one.chosen().map(|c| (c.instrument, c.expected_cost)), Some((a100, 15_000_000)));
        assert_eq!(verdict(&one, h100), Some(Verdict::OverBudget { cost: 20_000_000 }));

        // A vendor without the framework's image is passed over.
        let no_nvidia: BTreeSet<Vendor> = [Vendor::Amd].into();
        let amd_only = super::plan(&spec("", ""), &market, Some(&no_nvidia));
        assert_eq!(verdict(&amd_only, h100), Some(Verdict::VendorWithoutImage));
        // And one the job excludes.
        let amd_job = super::plan(&spec("vendor = \"amd\"", ""), &market, None);
        assert_eq!(verdict(&amd_job, h100), Some(Verdict::VendorExcluded));
    }
}
