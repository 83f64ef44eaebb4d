//! The exchange's listing configuration: GPU classes (the minimum spec a GPU
//! must meet to be sold in a class), their tick sizes and price bands, the
//! preemption notice, and the reserved-window calendar. A class is
//! vendor-neutral: NVIDIA, AMD and other accelerators are described by the same
//! fields, and a MIG slice profile makes a fractional class.

use serde::{Deserialize, Serialize};

use crate::limits;

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Vendor {
    Nvidia,
    Amd,
    Intel,
    Other,
    /// Huawei Ascend NPUs.
    Huawei,
    Cambricon,
    Iluvatar,
}

impl Vendor {
    /// The name as the protocol writes it (serde's, held to it by
    /// engine/tests/names.rs), for metrics labels and text without
    /// serialising.
    pub fn name(self) -> &'static str {
        match self {
            Vendor::Nvidia => "nvidia",
            Vendor::Amd => "amd",
            Vendor::Intel => "intel",
            Vendor::Other => "other",
            Vendor::Huawei => "huawei",
            Vendor::Cambricon => "cambricon",
            Vendor::Iluvatar => "iluvatar",
        }
    }
}

/// How the GPU talks to its peers on the host. Every link but PCIe (NVLink,
/// AMD's Infinity Fabric/xGMI, Huawei's HCCS, Cambricon's MLU-Link) counts
/// as a high-bandwidth fabric for classes that require one. Variants are
/// only ever appended: journals encode their index.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Interconnect {
    Pcie,
    NvLink,
    InfinityFabric,
    Hccs,
    MluLink,
}

impl Interconnect {
    pub fn is_fabric(self) -> bool {
        !matches!(self, Interconnect::Pcie)
    }
}

/// What a supplier's agent reports about one GPU (or one MIG slice).
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct GpuSpec {
    pub vendor: Vendor,
    /// The model name as the driver reports it, e.g. `NVIDIA H100 80GB HBM3`.
    pub model: String,
    pub memory_mib: u32,
    pub interconnect: Interconnect,
    /// Set for a MIG slice, e.g. `1g.10gb`.
    pub mig_profile: Option<String>,
}

impl GpuSpec {
    /// An NVIDIA H100 SXM 80 GB as NVML reports it (demo data and tests).
    pub fn h100_sxm() -> Self {
        GpuSpec {
            vendor: Vendor::Nvidia,
            model: "NVIDIA H100 80GB HBM3".into(),
            memory_mib: 81_559,
            interconnect: Interconnect::NvLink,
            mig_profile: None,
        }
    }
}

/// The minimum spec of a class.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct GpuRequirement {
    pub vendor: Vendor,
    /// Accepted model names as the driver reports them, each a pattern in
    /// which `*` stands for any run of characters (`NVIDIA A100*80GB*`);
    /// without a `*` the name must match exactly. Case counts.
    pub models: Vec<String>,
    pub memory_mib_min: u32,
    pub fabric_required: bool,
    /// A fractional class names the slice profile it sells; whole-GPU classes
    /// accept no slice.
    pub mig_profile: Option<String>,
}

impl GpuRequirement {
    pub fn is_met_by(&self, spec: &GpuSpec) -> bool {
        spec.vendor == self.vendor
            && self.models.iter().any(|pattern| matches_pattern(pattern, &spec.model))
            && spec.memory_mib >= self.memory_mib_min
            && (!self.fabric_required || spec.interconnect.is_fabric())
            && spec.mig_profile == self.mig_profile
    }
}

/// Whether `text` matches `pattern`, where `*` matches any run of
/// characters (none included) and everything else matches itself.
pub fn matches_pattern(pattern: &str, text: &str) -> bool {
    let mut parts = pattern.split('*');
    let first = parts.next().unwrap_or("");
    let Some(mut rest) = text.strip_prefix(first) else { return false };
    let parts: Vec<&str> = parts.collect();
    let Some((last, middle)) = parts.split_last() else { return rest.is_empty() };
    for part in middle {
        match rest.find(part) {
            Some(at) => rest = &rest[at + part.len()..],
            None => return false,
        }
    }
    rest.len() >= last.len() && rest.ends_with(last)
}

/// One step of a class's SLA credit schedule: a lease whose availability
/// came in below `availability_below_bps` is credited `credit_bps` of its
/// usage charges (the deepest step it falls under counts).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SlaCreditTier {
    pub availability_below_bps: u32,
    pub credit_bps: u32,
}

/// The credit schedule the demo listing and journals older than the
/// listing file use: 10% below the SLA, 25% below 95%, 50% below 90%.
pub fn default_credit_tiers(sla_availability_bps: u32) -> Vec<SlaCreditTier> {
    let mut tiers = vec![SlaCreditTier { availability_below_bps: sla_availability_bps, credit_bps: 1_000 }];
    for (below, credit) in [(9_500, 2_500), (9_000, 5_000)] {
        if below < sla_availability_bps {
            tiers.push(SlaCreditTier { availability_below_bps: below, credit_bps: credit });
        }
    }
    tiers
}

/// The exchange's currency: what every amount is counted in, and how many
/// minor units make one major unit (10^decimals). Fixed at genesis.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Currency {
    /// ISO 4217 code, e.g. `USD`, `CNY`.
    pub code: String,
    /// Decimal places of the minor unit: 6 for US dollar micro-units, 2 for CNY fen.
    pub decimals: u8,
}

impl Currency {
    pub fn usd_micro() -> Self {
        Currency { code: "USD".into(), decimals: 6 }
    }

    /// An amount of minor units in major units, exactly: `1_500_000` USD micro -> `1.500000`.
    pub fn format(&self, minor: i128) -> String {
        let scale = 10i128.pow(self.decimals as u32);
        let sign = if minor < 0 { "-" } else { "" };
        let (whole, fraction) = (minor.abs() / scale, minor.abs() % scale);
        if self.decimals == 0 {
            format!("{sign}{whole}")
        } else {
            format!("{sign}{whole}.{fraction:0width$}", width = self.decimals as usize)
        }
    }
}

/// How reserved windows of a class are listed: hourly blocks for the next
/// `hourly_windows_ahead` hours, daily blocks (from 00:00 UTC) for the next
/// `daily_windows_ahead` days, weekly blocks (from Monday 00:00 UTC) for
/// the next `weekly_windows_ahead` weeks and monthly blocks (UTC calendar
/// months) for the next `monthly_windows_ahead` months, each tradable until
/// `trading_stop_before_start_ms` before it starts.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CalendarSpec {
    pub hourly_windows_ahead: u32,
    pub daily_windows_ahead: u32,
    pub trading_stop_before_start_ms: u64,
    #[serde(default)]
    pub weekly_windows_ahead: u32,
    #[serde(default)]
    pub monthly_windows_ahead: u32,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ClassSpec {
    /// The class symbol, e.g. `H100-SXM-80G`.
    pub name: String,
    pub requirement: GpuRequirement,
    pub tick_minor: u64,
    pub price_min_minor_per_gpu_hour: u64,
    pub price_max_minor_per_gpu_hour: u64,
    /// Notice a preemptible lease gets before it is ended for a spot or
    /// reserved-window lease on the same GPU.
    pub preemption_notice_ms: u64,
    /// Reserved windows of this class, if it lists any.
    pub calendar: Option<CalendarSpec>,
    /// The availability (verified GPU-time over leased GPU-time, in basis
    /// points) a spot or reserved lease of this class is promised; below it
    /// the renter is credited (docs/market-rules.md, "SLA credits").
    pub sla_availability_bps: u32,
    /// The hardware challenge a GPU of this class must pass to be verified
    /// in it (docs/market-rules.md "Verified hardware"); `None`: GPUs of
    /// the class are not challenged and never verified.
    #[serde(default)]
    pub challenge: Option<ChallengeSpec>,
    /// The SLA credit schedule, deepest last (availability thresholds
    /// falling, credits rising; the first at most the SLA).
    pub sla_credit_tiers: Vec<SlaCreditTier>,
    /// The memory-bandwidth challenge a GPU of this class must pass to be
    /// verified in it (docs/market-rules.md "Verified hardware"); `None`:
    /// the class does not measure memory bandwidth.
    #[serde(default)]
    pub memory_challenge: Option<MemoryChallengeSpec>,
}

/// A class's memory-bandwidth challenge: `passes` passes over a seeded
/// buffer of `2^words_log2` 32-bit words (`gpux_protocol::memory`),
/// committed to within the time the class's minimum bandwidth allows.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MemoryChallengeSpec {
    /// The buffer's size, log2 of its words
    /// (`limits::MEMORY_WORDS_LOG2_MIN..=MEMORY_WORDS_LOG2_MAX`).
    pub words_log2: u32,
    /// Passes over it (1..=`limits::MEMORY_PASSES_MAX`).
    pub passes: u32,
    /// The least bandwidth a GPU of the class must show, MB/s: the bytes
    /// an honest GPU moves (`4 W (1 + 3 passes)`) over the time from the
    /// challenge's issue to its commitment's arrival (the round trip included).
    pub min_mbps: u64,
}

impl MemoryChallengeSpec {
    /// The bytes an honest prover moves.
    pub fn bytes(&self) -> u64 {
        4 * (1u64 << self.words_log2) * (1 + 3 * self.passes as u64)
    }

    /// The bandwidth a commitment `elapsed_ms` after the challenge shows,
    /// MB/s (rounded down; an answer within the same millisecond counts as 1 ms).
    pub fn mbps(&self, elapsed_ms: u64) -> u64 {
        self.bytes() / 1_000 / elapsed_ms.max(1)
    }
}

/// A class's hardware challenge: multiply two seeded `n x n` matrices
/// (`gpux_protocol::challenge`) and commit to the product within the time
/// the class's minimum rate allows.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ChallengeSpec {
    /// The matrices' side: a power of two from `limits::CHALLENGE_N_MIN` to
    /// `limits::CHALLENGE_N_MAX`.
    pub n: u32,
    /// The least rate a GPU of the class must show, in MFLOP/s: the
    /// challenge's `2 n^3` operations over the time from the challenge's
    /// issue to its commitment's arrival (the round trip included).
    pub min_mflops: u64,
}

impl ChallengeSpec {
    /// Whether `n` is a side a challenge may ask for: a power of two from
    /// `limits::CHALLENGE_N_MIN` to `limits::CHALLENGE_N_MAX`.
    pub fn side_valid(&self) -> bool {
        self.n.is_power_of_two() && (limits::CHALLENGE_N_MIN..=limits::CHALLENGE_N_MAX).contains(&self.n)
    }

    /// The challenge's floating-point operations: `2 n^3`.
    pub fn flops(&self) -> u64 {
        2 * (self.n as u64).pow(3)
    }

    /// The rate a commitment `elapsed_ms` after the challenge shows, MFLOP/s
    /// (rounded down; an answer within the same millisecond counts as 1 ms).
    pub fn mflops(&self, elapsed_ms: u64) -> u64 {
        self.flops() / 1_000 / elapsed_ms.max(1)
    }
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct EngineConfig {
    pub classes: Vec<ClassSpec>,
    /// Funds a spot or preemptible bid without a fixed duration must hold: its
    /// limit price for this many hours per GPU.
    pub prepaid_horizon_hours: u32,
    /// A market order trades no further than this many basis points through the
    /// best opposite price at the moment it arrives.
    pub market_protection_bps: u32,
    pub orders_per_account_max: u32,
    /// Accounts the engine will open (at most `limits::ACCOUNTS_MAX`).
    pub accounts_max: u32,
    /// The exchange's fee on usage charges, in basis points; changed later
    /// only by the journaled `SetFee` command.
    pub fee_bps: u32,
    /// How long after a lease ends its usage reports are still billed; then
    /// its billing closes (leftover escrow released, SLA settled).
    pub billing_grace_ms: u64,
    /// What every amount is counted in; fixed at genesis.
    pub currency: Currency,
    /// The regions hosts may declare and bids may require, in id order
    /// (only ever appended: a host's region is its index here).
    #[serde(default)]
    pub regions: Vec<String>,
}

/// A configuration the engine refuses to run with, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ConfigError {
    ClassCount,
    AccountsMax,
    /// `orders_per_account_max` over its share of the live-orders table
    /// (`limits::ORDERS_PER_ACCOUNT_LISTED_MAX`).
    OrdersPerAccount,
    HorizonOrProtection,
    FeeOrGrace,
    PriceBand {
        class: String,
    },
    Calendar {
        class: String,
    },
    Sla {
        class: String,
    },
    DuplicateClass {
        class: String,
    },
    Challenge {
        class: String,
    },
    MemoryChallenge {
        class: String,
    },
    CreditTiers {
        class: String,
    },
    Currency,
    ModelPattern {
        class: String,
    },
    Regions,
}

impl std::fmt::Display for ConfigError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("invalid engine config: ")?;
        match self {
            ConfigError::ClassCount => write!(f, "1..={} classes required", limits::CLASSES_MAX),
            ConfigError::AccountsMax => write!(f, "accounts_max must be at most {}", limits::ACCOUNTS_MAX),
            ConfigError::OrdersPerAccount => write!(
                f,
                "orders_per_account_max must be 1..={} (an account's share of the {} live orders every account shares)",
                limits::ORDERS_PER_ACCOUNT_LISTED_MAX,
                limits::ORDERS_LIVE_MAX
            ),
            ConfigError::HorizonOrProtection => f.write_str("prepaid horizon must be > 0 h and protection < 10000 bps"),
            ConfigError::FeeOrGrace => write!(f, "fee must be at most {} bps, billing grace at most one day", limits::FEE_BPS_MAX),
            ConfigError::PriceBand { class } => {
                write!(f, "class {class}: tick and price band must be positive multiples of the tick, max <= 2^40")
            }
            ConfigError::Calendar { class } => write!(
                f,
                "class {class}: windows must stop trading at least the preemption notice before they start; at most 336 hourly, 60 daily, 26 weekly and 6 monthly windows ahead"
            ),
            ConfigError::Sla { class } => write!(f, "class {class}: SLA availability is at most 10000 bps"),
            ConfigError::DuplicateClass { class } => write!(f, "class {class} listed twice"),
            ConfigError::Challenge { class } => {
                write!(
                    f,
                    "class {class}: the challenge's n must be a power of two from {} to {} and its minimum rate positive",
                    limits::CHALLENGE_N_MIN,
                    limits::CHALLENGE_N_MAX
                )
            }
            ConfigError::MemoryChallenge { class } => write!(
                f,
                "class {class}: the memory challenge's words_log2 must be {}..={}, its passes 1..={} and its minimum bandwidth positive",
                limits::MEMORY_WORDS_LOG2_MIN,
                limits::MEMORY_WORDS_LOG2_MAX,
                limits::MEMORY_PASSES_MAX
            ),
            ConfigError::CreditTiers { class } => write!(
                f,
                "class {class}: SLA credit tiers must start at or below the SLA, fall in availability and rise in credit (at most 10000 bps), at most {} tiers",
                limits::SLA_TIERS_MAX
            ),
            ConfigError::Currency => f.write_str("currency: a code of 3 capital letters and 0..=9 decimals"),
            ConfigError::ModelPattern { class } => {
                write!(f, "class {class}: 1..=16 model patterns, each 1..=128 printable characters and not only `*`")
            }
            ConfigError::Regions => write!(
                f,
                "regions: at most {} distinct names of 1..=32 lower-case letters, digits and -",
                limits::REGIONS_MAX
            ),
        }
    }
}

impl std::error::Error for ConfigError {}

impl EngineConfig {
    /// [`EngineConfig::validate`], and the rules that hold for listings
    /// written now but not for every listing a journal may hold: a
    /// challenge's side is a power of two from `limits::CHALLENGE_N_MIN` to
    /// `limits::CHALLENGE_N_MAX` (a class of a journal's older listing with
    /// another side is never challenged: `ChallengeSpec::side_valid`).
    pub fn validate_listing(&self) -> Result<(), ConfigError> {
        self.validate()?;
        // New listings only: a journal's older listing stays valid as it was.
        if self.orders_per_account_max == 0 || self.orders_per_account_max > limits::ORDERS_PER_ACCOUNT_LISTED_MAX {
            return Err(ConfigError::OrdersPerAccount);
        }
        match self.classes.iter().find(|class| class.challenge.is_some_and(|c| !c.side_valid())) {
            Some(class) => Err(ConfigError::Challenge { class: class.name.clone() }),
            None => Ok(()),
        }
    }

    /// Whether the config can be applied: what every listing a journal
    /// holds must meet (see [`EngineConfig::validate_listing`] for new ones).
    pub fn validate(&self) -> Result<(), ConfigError> {
        if self.classes.is_empty() || self.classes.len() > limits::CLASSES_MAX {
            return Err(ConfigError::ClassCount);
        }
        if self.accounts_max > limits::ACCOUNTS_MAX {
            return Err(ConfigError::AccountsMax);
        }
        if self.prepaid_horizon_hours == 0 || self.market_protection_bps >= 10_000 {
            return Err(ConfigError::HorizonOrProtection);
        }
        if self.fee_bps > limits::FEE_BPS_MAX || self.billing_grace_ms > limits::BILLING_GRACE_MS_MAX {
            return Err(ConfigError::FeeOrGrace);
        }
        let code = &self.currency.code;
        if code.len() != 3 || !code.bytes().all(|b| b.is_ascii_uppercase()) || self.currency.decimals > 9 {
            return Err(ConfigError::Currency);
        }
        let regions_ok = self.regions.len() <= limits::REGIONS_MAX
            && self.regions.iter().all(|r| region_name_is_valid(r))
            && self.regions.iter().enumerate().all(|(i, r)| !self.regions[..i].contains(r));
        if !regions_ok {
            return Err(ConfigError::Regions);
        }
        for class in &self.classes {
            self.validate_class(class)?;
        }
        Ok(())
    }

    /// One class's terms: price band, calendar, SLA and credit tiers,
    /// challenges, model patterns, a name of its own.
    fn validate_class(&self, class: &ClassSpec) -> Result<(), ConfigError> {
        let prices_ok = class.tick_minor > 0
            && class.price_min_minor_per_gpu_hour >= class.tick_minor
            && class.price_min_minor_per_gpu_hour.is_multiple_of(class.tick_minor)
            && class.price_max_minor_per_gpu_hour.is_multiple_of(class.tick_minor)
            && class.price_max_minor_per_gpu_hour >= class.price_min_minor_per_gpu_hour
            && class.price_max_minor_per_gpu_hour <= 1 << 40;
        if !prices_ok {
            return Err(ConfigError::PriceBand { class: class.name.clone() });
        }
        if let Some(calendar) = &class.calendar {
            if calendar.trading_stop_before_start_ms < class.preemption_notice_ms
                || calendar.hourly_windows_ahead > 24 * 14
                || calendar.daily_windows_ahead > 60
                || calendar.weekly_windows_ahead > limits::WEEKLY_WINDOWS_AHEAD_MAX
                || calendar.monthly_windows_ahead > limits::MONTHLY_WINDOWS_AHEAD_MAX
            {
                return Err(ConfigError::Calendar { class: class.name.clone() });
            }
        }
        if class.sla_availability_bps > 10_000 {
            return Err(ConfigError::Sla { class: class.name.clone() });
        }
        // Journals replay listings of every version: sides from before the
        // Merkle commitment (1 to 256, any) stay valid here;
        // `validate_listing` holds new listings to powers of two.
        if class.challenge.is_some_and(|c| c.n == 0 || c.n > limits::CHALLENGE_N_MAX || c.min_mflops == 0) {
            return Err(ConfigError::Challenge { class: class.name.clone() });
        }
        if class.memory_challenge.is_some_and(|c| {
            !(limits::MEMORY_WORDS_LOG2_MIN..=limits::MEMORY_WORDS_LOG2_MAX).contains(&c.words_log2)
                || !(1..=limits::MEMORY_PASSES_MAX).contains(&c.passes)
                || c.min_mbps == 0
        }) {
            return Err(ConfigError::MemoryChallenge { class: class.name.clone() });
        }
        let tiers = &class.sla_credit_tiers;
        let tiers_ok = tiers.len() <= limits::SLA_TIERS_MAX
            && tiers.first().is_none_or(|t| t.availability_below_bps <= class.sla_availability_bps)
            && tiers.iter().all(|t| t.credit_bps <= 10_000)
            && tiers.windows(2).all(|w| w[1].availability_below_bps < w[0].availability_below_bps && w[1].credit_bps >= w[0].credit_bps);
        if !tiers_ok {
            return Err(ConfigError::CreditTiers { class: class.name.clone() });
        }
        let models = &class.requirement.models;
        if models.is_empty()
            || models.len() > 16
            || models.iter().any(|m| m.is_empty() || m.len() > 128 || m.chars().all(|c| c == '*') || m.chars().any(char::is_control))
        {
            return Err(ConfigError::ModelPattern { class: class.name.clone() });
        }
        if self.classes.iter().filter(|other| other.name == class.name).count() > 1 {
            return Err(ConfigError::DuplicateClass { class: class.name.clone() });
        }
        Ok(())
    }

    /// The demo listing used by the README's run command, the simulator and the
    /// tests: data-centre, consumer, AMD and fractional classes. Prices are in
    /// micro-dollars per GPU-hour (1 minor unit = US$0.000001).
    pub fn demo() -> Self {
        let calendar = Some(CalendarSpec {
            hourly_windows_ahead: 24,
            daily_windows_ahead: 7,
            trading_stop_before_start_ms: 15 * 60_000,
            weekly_windows_ahead: 4,
            monthly_windows_ahead: 6,
        });
        let class =
            |name: &str, vendor, models: &[&str], memory_mib_min, fabric_required, mig: Option<&str>, calendar: Option<CalendarSpec>| {
                ClassSpec {
                    name: name.into(),
                    requirement: GpuRequirement {
                        vendor,
                        models: models.iter().map(|m| m.to_string()).collect(),
                        memory_mib_min,
                        fabric_required,
                        mig_profile: mig.map(str::to_string),
                    },
                    tick_minor: 1_000,
                    price_min_minor_per_gpu_hour: 1_000,
                    price_max_minor_per_gpu_hour: 100_000_000,
                    preemption_notice_ms: 30_000,
                    calendar,
                    sla_availability_bps: 9_900,
                    sla_credit_tiers: default_credit_tiers(9_900),
                    // Sized for the fake backend, which answers on the CPU
                    // (docs/market-rules.md "Verified hardware" says what a
                    // production listing states instead).
                    challenge: Some(ChallengeSpec { n: 256, min_mflops: 10 }),
                    memory_challenge: Some(MemoryChallengeSpec { words_log2: 16, passes: 8, min_mbps: 10 }),
                }
            };
        EngineConfig {
            classes: vec![
                class("H100-SXM-80G", Vendor::Nvidia, &["NVIDIA H100 80GB HBM3"], 80_000, true, None, calendar.clone()),
                class(
                    "A100-80G",
                    Vendor::Nvidia,
                    &["NVIDIA A100-SXM4-80GB", "NVIDIA A100 80GB PCIe"],
                    80_000,
                    false,
                    None,
                    calendar.clone(),
                ),
                class("RTX4090-24G", Vendor::Nvidia, &["NVIDIA GeForce RTX 4090"], 24_000, false, None, None),
                class("MI300X-192G", Vendor::Amd, &["AMD Instinct MI300X"], 190_000, true, None, calendar),
                class("H100-1g.10gb", Vendor::Nvidia, &["NVIDIA H100 80GB HBM3"], 9_000, false, Some("1g.10gb"), None),
            ],
            prepaid_horizon_hours: 1,
            market_protection_bps: 500,
            orders_per_account_max: limits::ORDERS_PER_ACCOUNT_MAX_DEFAULT,
            accounts_max: limits::ACCOUNTS_MAX,
            fee_bps: 250,
            billing_grace_ms: 10 * 60_000,
            currency: Currency::usd_micro(),
            regions: ["us-east", "us-west", "eu-central", "cn-east", "cn-west"].map(String::from).to_vec(),
        }
    }

    /// The index of region `name` in the listing.
    pub fn region_index(&self, name: &str) -> Option<u8> {
        self.regions.iter().position(|r| r == name).map(|i| i as u8)
    }
}

/// Whether `name` may name a region or a zone: 1..=32 bytes of lower-case
/// letters, digits and `-`.
pub fn region_name_is_valid(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= limits::REGION_NAME_BYTES_MAX
        && name.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
}

#[cfg(test)]
mod tests {
    use super::*;

    fn h100() -> GpuSpec {
        GpuSpec::h100_sxm()
    }

    #[test]
    fn a_gpu_qualifies_only_for_classes_whose_minimum_spec_it_meets() {
        let config = EngineConfig::demo();
        let qualifying: Vec<&str> =
            config.classes.iter().filter(|class| class.requirement.is_met_by(&h100())).map(|class| class.name.as_str()).collect();
        assert_eq!(qualifying, ["H100-SXM-80G"]);

        let pcie = GpuSpec { interconnect: Interconnect::Pcie, ..h100() };
        assert!(!config.classes[0].requirement.is_met_by(&pcie), "SXM class needs a fabric");

        let slice = GpuSpec { memory_mib: 9_856, mig_profile: Some("1g.10gb".into()), ..h100() };
        assert!(config.classes[4].requirement.is_met_by(&slice));
        assert!(!config.classes[0].requirement.is_met_by(&slice), "a slice is not a whole GPU");
    }

    #[test]
    fn model_patterns_match_runs_of_any_characters() {
        assert!(matches_pattern("NVIDIA H100 80GB HBM3", "NVIDIA H100 80GB HBM3"));
        assert!(!matches_pattern("NVIDIA H100 80GB HBM3", "NVIDIA H100 80GB HBM3e"));
        assert!(matches_pattern("NVIDIA A100*80GB*", "NVIDIA A100-SXM4-80GB"));
        assert!(matches_pattern("NVIDIA A100*80GB*", "NVIDIA A100 80GB PCIe"));
        assert!(!matches_pattern("NVIDIA A100*80GB*", "NVIDIA A100-SXM4-40GB"));
        assert!(matches_pattern("*MI300X*", "AMD Instinct MI300X OAM"));
        assert!(matches_pattern("Ascend 910B*", "Ascend 910B3"));
        assert!(!matches_pattern("Ascend 910B*", "Ascend 910"));
        assert!(matches_pattern("a*b*a", "aba") && !matches_pattern("a*a", "a"));
    }

    #[test]
    fn credit_tiers_pay_the_deepest_step_and_bad_schedules_are_refused() {
        let mut config = EngineConfig::demo();
        config.classes[0].sla_availability_bps = 9_990;
        config.classes[0].sla_credit_tiers = vec![
            SlaCreditTier { availability_below_bps: 9_990, credit_bps: 1_000 },
            SlaCreditTier { availability_below_bps: 9_900, credit_bps: 3_000 },
        ];
        assert_eq!(config.validate(), Ok(()));
        config.classes[0].sla_credit_tiers.reverse();
        assert_eq!(config.validate(), Err(ConfigError::CreditTiers { class: "H100-SXM-80G".into() }));
        let mut config = EngineConfig::demo();
        config.currency = Currency { code: "usd".into(), decimals: 6 };
        assert_eq!(config.validate(), Err(ConfigError::Currency));
        assert_eq!(Currency { code: "CNY".into(), decimals: 2 }.format(-1_505), "-15.05");
        assert_eq!(Currency::usd_micro().format(2_100_000), "2.100000");
    }

    #[test]
    fn the_demo_config_is_valid_and_a_broken_one_is_refused() {
        assert_eq!(EngineConfig::demo().validate(), Ok(()));
        let mut broken = EngineConfig::demo();
        broken.classes[0].price_min_minor_per_gpu_hour = 1_500;
        assert!(broken.validate().is_err());
    }

    #[test]
    fn a_challenge_side_is_a_power_of_two_within_the_limits() {
        let class = EngineConfig::demo().classes[0].name.clone();
        // (n, min_mflops, valid in a new listing, valid in a journal's listing)
        for (n, min_mflops, new, replayed) in [
            (16, 1, true, true),
            (16_384, 1, true, true),
            (1_024, 1, true, true),
            (8, 1, false, true),
            (100, 1, false, true),
            (32_768, 1, false, false),
            (0, 1, false, false),
            (256, 0, false, false),
        ] {
            let mut config = EngineConfig::demo();
            config.classes[0].challenge = Some(ChallengeSpec { n, min_mflops });
            let verdict = |valid: bool| if valid { Ok(()) } else { Err(ConfigError::Challenge { class: class.clone() }) };
            assert_eq!(config.validate_listing(), verdict(new), "n = {n}, min_mflops = {min_mflops}, a new listing");
            assert_eq!(config.validate(), verdict(replayed), "n = {n}, min_mflops = {min_mflops}, a journal's listing");
        }
    }
}
