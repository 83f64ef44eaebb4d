//! Searching every book at once (docs/protocol.md "Search"): the asks of
//! every class and contract filtered by what a renter looks for (GPU
//! memory, GPUs on one host, vendor, price, region, score, verified,
//! contract, fabric) and sorted by price, by price per GB of GPU memory,
//! or by price per measured TFLOPS, a page at a time.

use gpux_engine::{AccountId, ContractKind, HostId, InstrumentId, Vendor};
use serde::{Deserialize, Serialize};

use crate::views::Fabric;

/// Offers one page holds at most (and unless a search asks for fewer).
pub const SEARCH_PAGE_MAX: u32 = 100;
/// Asks of each book a search looks at: its cheapest.
pub const SEARCH_ASKS_PER_BOOK_MAX: usize = 256;

/// What a renter looks for; every field is optional (`{}` lists
/// everything, cheapest first).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct OfferSearch {
    /// Each GPU has at least this much memory, GB (10^9 bytes, as GPU
    /// makers label it: an "80GB" H100 reports 81 559 MiB, 85.5 GB).
    #[serde(default)]
    pub min_gpu_memory_gb: u32,
    /// The ask offers at least this many GPUs on one host.
    #[serde(default)]
    pub min_gpus: u32,
    #[serde(default)]
    pub vendor: Option<Vendor>,
    /// At most this price per GPU-hour, minor units.
    #[serde(default)]
    pub max_price_minor_per_gpu_hour: Option<u64>,
    /// Hosts in one of these regions (names from the listing; empty: any).
    #[serde(default)]
    pub regions: Vec<String>,
    /// Sellers scored at least this (an unrated seller has none).
    #[serde(default)]
    pub min_score_bps: u32,
    /// Every GPU of the ask verified by its last hardware challenge.
    #[serde(default)]
    pub verified_only: bool,
    /// These contracts only (empty: any).
    #[serde(default)]
    pub contracts: Vec<ContractFilter>,
    /// Hosts on a declared fabric only (for cluster bids).
    #[serde(default)]
    pub fabric_only: bool,
    #[serde(default)]
    pub sort: OfferSort,
    /// The page after this place (the answer's `next_after`).
    #[serde(default)]
    pub after: Option<SearchCursor>,
    /// Offers in the page (at most, and by default, `SEARCH_PAGE_MAX`).
    #[serde(default)]
    pub limit: Option<u32>,
}

/// A contract as a search names it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ContractFilter {
    Spot,
    Preemptible,
    /// Any reserved window.
    Reserved,
    /// Resold leases.
    Resale,
}

impl ContractFilter {
    pub fn matches(self, contract: &ContractKind) -> bool {
        matches!(
            (self, contract),
            (ContractFilter::Spot, ContractKind::Spot)
                | (ContractFilter::Preemptible, ContractKind::Preemptible)
                | (ContractFilter::Reserved, ContractKind::Reserved { .. })
                | (ContractFilter::Resale, ContractKind::LeaseResale)
        )
    }
}

/// How found offers are ordered (each then by book and place in it).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum OfferSort {
    /// Price per GPU-hour.
    #[default]
    Price,
    /// Price per GB (10^9 bytes) of GPU memory per hour.
    PricePerGb,
    /// Price per TFLOPS per hour, the TFLOPS its GPUs' hardware challenges
    /// measured (the least among them); offers with no measure come last.
    PricePerTflops,
}

/// A place in a search's order: its sort key, its book, its place there.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct SearchCursor {
    pub key: u64,
    pub instrument: InstrumentId,
    pub priority: u64,
}

/// One ask a search found, with what it sells.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct FoundOffer {
    pub instrument: InstrumentId,
    pub symbol: String,
    pub class: String,
    pub contract: ContractKind,
    pub price_minor_per_gpu_hour: u64,
    /// GPUs the ask offers (on one host, unless resold contracts).
    pub quantity: u32,
    pub supplier: AccountId,
    pub host: Option<HostId>,
    pub vendor: Vendor,
    /// The model its GPUs report (the class's first accepted name for
    /// resold contracts).
    pub model: String,
    pub gpu_memory_mib: u32,
    pub gpus_verified: u32,
    pub supplier_score_bps: Option<u32>,
    pub region: Option<String>,
    pub fabric: Option<Fabric>,
    /// The least compute rate a correct hardware challenge measured among
    /// its GPUs, TFLOPS x 1000 (`None`: one of them has no measure).
    pub measured_gflops: Option<u64>,
    /// Price per GB (10^9 bytes) of GPU memory per hour, minor units
    /// (rounded down).
    pub price_minor_per_gb_hour: u64,
    /// Price per measured TFLOPS per hour, minor units (rounded down).
    pub price_minor_per_tflops_hour: Option<u64>,
    /// Its place in this search's order.
    pub place: SearchCursor,
}

impl FoundOffer {
    /// Its sort key under `sort`.
    pub fn key(&self, sort: OfferSort) -> u64 {
        match sort {
            OfferSort::Price => self.price_minor_per_gpu_hour,
            OfferSort::PricePerGb => self.price_minor_per_gb_hour,
            OfferSort::PricePerTflops => self.price_minor_per_tflops_hour.unwrap_or(u64::MAX),
        }
    }
}

/// Bytes in a MiB, as drivers report GPU memory.
const MIB: u128 = 1 << 20;

/// Whether `memory_mib` is at least `gb` GB (10^9 bytes).
pub fn has_gb(memory_mib: u32, gb: u32) -> bool {
    u128::from(memory_mib) * MIB >= u128::from(gb) * 1_000_000_000
}

/// Price per GB-hour (10^9 bytes) of a GPU of `memory_mib` (rounded down;
/// 0 memory reads as 1 MiB).
pub fn price_per_gb(price_minor_per_gpu_hour: u64, memory_mib: u32) -> u64 {
    (u128::from(price_minor_per_gpu_hour) * 1_000_000_000 / (u128::from(memory_mib.max(1)) * MIB)) as u64
}

/// Price per TFLOPS-hour of a GPU measured at `mflops` (rounded down).
pub fn price_per_tflops(price_minor_per_gpu_hour: u64, mflops: u64) -> u64 {
    (u128::from(price_minor_per_gpu_hour) * 1_000_000 / u128::from(mflops.max(1))).min(u128::from(u64::MAX - 1)) as u64
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prices_per_gb_and_per_tflops_are_exact_integers_rounded_down() {
        // $2.00 an hour for an H100's 81 559 MiB (85.5 GB): 23 386 minor per GB-hour.
        assert_eq!(price_per_gb(2_000_000, 81_559), 23_386);
        assert_eq!(price_per_gb(1, 3 * 1024), 0);
        assert!(has_gb(81_559, 80) && has_gb(81_559, 85) && !has_gb(81_559, 86), "an 80GB card is 85.5 GB");
        // $2.00 an hour at 400 TFLOPS: 5 000 minor per TFLOPS-hour.
        assert_eq!(price_per_tflops(2_000_000, 400_000_000), 5_000);
        assert!(price_per_tflops(u64::MAX, 1) < u64::MAX, "never the unmeasured key");
        let all: OfferSearch = serde_json::from_str("{}").expect("an empty search");
        assert_eq!(all, OfferSearch::default());
        let some: OfferSearch =
            serde_json::from_str(r#"{"min_gpu_memory_gb":24,"contracts":["spot","reserved"],"sort":"price_per_gb"}"#).expect("parses");
        assert_eq!((some.min_gpu_memory_gb, some.sort), (24, OfferSort::PricePerGb));
        assert!(ContractFilter::Reserved.matches(&ContractKind::Reserved { window_start_ms: 0, window_end_ms: 1 }));
        assert!(!ContractFilter::Spot.matches(&ContractKind::Preemptible));
    }
}
