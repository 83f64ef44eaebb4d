//! The operator's listing file (`gpux-exchange --listing listing.toml`):
//! classes, books, SLA and credit tiers, fees, calendar and currency, read
//! into the engine's [`EngineConfig`]. Every mistake is reported with the
//! file, the line and the field (`ListingError`), before the exchange opens
//! its journal. How the listing takes effect (the journal's genesis entry,
//! then a journaled `ChangeListing` when the file changes) is in
//! `sequencer::recovery`; the rules are in docs/market-rules.md "The listing".

use std::path::Path;

use gpux_engine::{
    CalendarSpec, ChallengeSpec, ClassSpec, ClusterRule, ConfigError, Currency, EngineConfig, GpuRequirement, MemoryChallengeSpec,
    SlaCreditTier, Vendor,
};
use serde::Deserialize;
use toml::Spanned;

/// The demo listing (`listing/demo.toml`): the default, and what journals
/// written before listing files started with (`EngineConfig::demo()`).
pub const DEMO: &str = include_str!("../../listing/demo.toml");

/// A listing file the exchange will not run with, and where it is wrong.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{file}:{line}: {field}: {message}")]
pub struct ListingError {
    pub file: String,
    /// 1-based; 0 when the file could not be read at all.
    pub line: usize,
    /// The field (or section) at fault, e.g. `class H100-SXM-80G.sla_credit_tiers`.
    pub field: String,
    pub message: String,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct File {
    exchange: Spanned<ExchangeSection>,
    #[serde(default)]
    defaults: ClassFields,
    #[serde(rename = "class", default)]
    classes: Vec<Spanned<ClassEntry>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ExchangeSection {
    currency: String,
    decimals: u8,
    fee_bps: u32,
    billing_grace_ms: u64,
    prepaid_horizon_hours: u32,
    market_protection_bps: u32,
    orders_per_account_max: u32,
    accounts_max: u32,
    #[serde(default)]
    regions: Vec<String>,
}

/// What a class may set and `[defaults]` may give every class.
#[derive(Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct ClassFields {
    tick_minor: Option<u64>,
    price_min_minor_per_gpu_hour: Option<u64>,
    price_max_minor_per_gpu_hour: Option<u64>,
    preemption_notice_ms: Option<u64>,
    sla_availability_bps: Option<u32>,
    sla_credit_tiers: Option<Vec<SlaCreditTier>>,
    challenge: Option<ChallengeSpec>,
    memory_challenge: Option<MemoryChallengeSpec>,
    /// Cluster bids in the class ask at least this of every member host's
    /// fabric, Gb/s (docs/market-rules.md "Cluster bids").
    cluster_min_fabric_gbps: Option<u32>,
}

/// A listing file read: the engine's listing and the cluster contract
/// terms of its classes (journaled apart: `SetClusterRules`).
#[derive(Clone, Debug, PartialEq)]
pub struct Listing {
    pub config: EngineConfig,
    pub cluster_rules: Vec<ClusterRule>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ClassEntry {
    name: String,
    vendor: Vendor,
    models: Vec<String>,
    memory_mib_min: u32,
    #[serde(default)]
    fabric_required: bool,
    #[serde(default)]
    mig_profile: Option<String>,
    #[serde(default)]
    calendar: Option<CalendarSpec>,
    /// The class is not challenged (neither challenge) even if `[defaults]` names one.
    #[serde(default)]
    no_challenge: bool,
    #[serde(flatten)]
    fields: ClassFields,
}

fn line_of(text: &str, offset: usize) -> usize {
    text[..offset.min(text.len())].bytes().filter(|&b| b == b'\n').count() + 1
}

/// Reads and checks a listing file.
pub fn load(path: &Path) -> Result<Listing, ListingError> {
    let file = path.display().to_string();
    let text = std::fs::read_to_string(path).map_err(|error| ListingError {
        file: file.clone(),
        line: 0,
        field: "file".into(),
        message: format!("cannot read it: {error}"),
    })?;
    parse(&text, &file)
}

/// Parses and checks a listing's text; `file` names it in errors.
pub fn parse(text: &str, file: &str) -> Result<Listing, ListingError> {
    let error = |line: usize, field: &str, message: String| ListingError { file: file.into(), line, field: field.into(), message };
    let parsed: File = toml::from_str(text).map_err(|e| syntax_error(text, file, &e))?;
    let exchange_line = line_of(text, parsed.exchange.span().start);
    let exchange = parsed.exchange.into_inner();
    let mut classes = Vec::new();
    let mut class_lines = Vec::new();
    let mut cluster_rules = Vec::new();
    for entry in parsed.classes {
        let line = line_of(text, entry.span().start);
        class_lines.push(line);
        let (class, rule) = class_spec(&entry.into_inner(), &parsed.defaults, |field, message| error(line, field, message))?;
        classes.push(class);
        cluster_rules.extend(rule);
    }
    let config = EngineConfig {
        classes,
        prepaid_horizon_hours: exchange.prepaid_horizon_hours,
        market_protection_bps: exchange.market_protection_bps,
        orders_per_account_max: exchange.orders_per_account_max,
        accounts_max: exchange.accounts_max,
        fee_bps: exchange.fee_bps,
        billing_grace_ms: exchange.billing_grace_ms,
        currency: Currency { code: exchange.currency, decimals: exchange.decimals },
        regions: exchange.regions,
    };
    config.validate_listing().map_err(|invalid| {
        let (line, field) = where_invalid(&config, &class_lines, exchange_line, &invalid);
        let message = invalid.to_string();
        error(line, &field, message.trim_start_matches("invalid engine config: ").to_string())
    })?;
    Ok(Listing { config, cluster_rules })
}

/// A file that is not the listing's TOML: the line at fault and the key on
/// it (a missing field: the section's header).
fn syntax_error(text: &str, file: &str, e: &toml::de::Error) -> ListingError {
    let line = e.span().map_or(1, |span| line_of(text, span.start));
    let message = e.message().trim().to_string();
    let on_line = text.lines().nth(line - 1).unwrap_or("").trim();
    let field = match on_line.split_once('=') {
        Some((key, _)) => key.trim().to_string(),
        None if !on_line.is_empty() => on_line.to_string(),
        None => "toml".to_string(),
    };
    ListingError { file: file.into(), line, field, message }
}

/// One `[[class]]` with `[defaults]` filling what it leaves out, and its
/// cluster rule if it has one; `error(field, message)` places a mistake.
fn class_spec(
    entry: &ClassEntry,
    defaults: &ClassFields,
    error: impl Fn(&str, String) -> ListingError,
) -> Result<(ClassSpec, Option<ClusterRule>), ListingError> {
    let field = |name: &str| format!("class {}.{name}", entry.name);
    let pick = |own: &Option<u64>, default: &Option<u64>, name: &str| {
        own.or(*default).ok_or_else(|| error(&field(name), "missing, and [defaults] does not give it".into()))
    };
    let own = &entry.fields;
    let sla_availability_bps = own
        .sla_availability_bps
        .or(defaults.sla_availability_bps)
        .ok_or_else(|| error(&field("sla_availability_bps"), "missing, and [defaults] does not give it".into()))?;
    let rule = match own.cluster_min_fabric_gbps.or(defaults.cluster_min_fabric_gbps) {
        Some(gbps) if !(1..=gpux_engine::limits::FABRIC_GBPS_MAX).contains(&gbps) => {
            let message = format!("must be 1 to {} Gb/s", gpux_engine::limits::FABRIC_GBPS_MAX);
            return Err(error(&field("cluster_min_fabric_gbps"), message));
        }
        Some(gbps) => Some(ClusterRule { class: entry.name.clone(), min_fabric_gbps: gbps }),
        None => None,
    };
    let class = ClassSpec {
        name: entry.name.clone(),
        requirement: GpuRequirement {
            vendor: entry.vendor,
            models: entry.models.clone(),
            memory_mib_min: entry.memory_mib_min,
            fabric_required: entry.fabric_required,
            mig_profile: entry.mig_profile.clone(),
        },
        tick_minor: pick(&own.tick_minor, &defaults.tick_minor, "tick_minor")?,
        price_min_minor_per_gpu_hour: pick(
            &own.price_min_minor_per_gpu_hour,
            &defaults.price_min_minor_per_gpu_hour,
            "price_min_minor_per_gpu_hour",
        )?,
        price_max_minor_per_gpu_hour: pick(
            &own.price_max_minor_per_gpu_hour,
            &defaults.price_max_minor_per_gpu_hour,
            "price_max_minor_per_gpu_hour",
        )?,
        preemption_notice_ms: pick(&own.preemption_notice_ms, &defaults.preemption_notice_ms, "preemption_notice_ms")?,
        calendar: entry.calendar.clone(),
        sla_availability_bps,
        sla_credit_tiers: own
            .sla_credit_tiers
            .clone()
            .or_else(|| defaults.sla_credit_tiers.clone())
            .unwrap_or_else(|| gpux_engine::default_credit_tiers(sla_availability_bps)),
        challenge: if entry.no_challenge { None } else { own.challenge.or(defaults.challenge) },
        memory_challenge: if entry.no_challenge { None } else { own.memory_challenge.or(defaults.memory_challenge) },
    };
    Ok((class, rule))
}

/// The line and field of the listing that the engine's check found wrong.
fn where_invalid(config: &EngineConfig, class_lines: &[usize], exchange_line: usize, invalid: &ConfigError) -> (usize, String) {
    let class_at =
        |name: &str| config.classes.iter().position(|c| c.name == name).and_then(|i| class_lines.get(i).copied()).unwrap_or(exchange_line);
    match invalid {
        ConfigError::ClassCount => (exchange_line, "class".to_string()),
        ConfigError::AccountsMax => (exchange_line, "exchange.accounts_max".into()),
        ConfigError::OrdersPerAccount => (exchange_line, "exchange.orders_per_account_max".into()),
        ConfigError::HorizonOrProtection => (exchange_line, "exchange.prepaid_horizon_hours/market_protection_bps".into()),
        ConfigError::FeeOrGrace => (exchange_line, "exchange.fee_bps/billing_grace_ms".into()),
        ConfigError::Currency => (exchange_line, "exchange.currency/decimals".into()),
        ConfigError::Regions => (exchange_line, "exchange.regions".into()),
        ConfigError::PriceBand { class } => (class_at(class), format!("class {class}.tick_minor/price_*")),
        ConfigError::Calendar { class } => (class_at(class), format!("class {class}.calendar")),
        ConfigError::Sla { class } => (class_at(class), format!("class {class}.sla_availability_bps")),
        ConfigError::DuplicateClass { class } => {
            let second = config.classes.iter().enumerate().filter(|(_, c)| &c.name == class).nth(1).map(|(i, _)| i);
            (second.and_then(|i| class_lines.get(i).copied()).unwrap_or(exchange_line), format!("class {class}.name"))
        }
        ConfigError::Challenge { class } => (class_at(class), format!("class {class}.challenge")),
        ConfigError::MemoryChallenge { class } => (class_at(class), format!("class {class}.memory_challenge")),
        ConfigError::CreditTiers { class } => (class_at(class), format!("class {class}.sla_credit_tiers")),
        ConfigError::ModelPattern { class } => (class_at(class), format!("class {class}.models")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_demo_listing_file_is_the_demo_config() {
        assert_eq!(parse(DEMO, "demo.toml"), Ok(Listing { config: EngineConfig::demo(), cluster_rules: Vec::new() }));
    }

    /// Every kind of mistake names the file, the line and the field.
    #[test]
    fn mistakes_are_reported_with_file_line_and_field() {
        let cases: &[(&str, &str, usize, &str)] = &[
            ("fee_bps = 250", "fee_bps = \"250\"", 9, "invalid type"),
            ("decimals = 6\n", "decimals = 6\ncolour = \"blue\"\n", 9, "unknown field `colour`"),
            ("vendor = \"amd\"", "vendor = \"graphcore\"", 59, "unknown variant `graphcore`"),
            ("sla_availability_bps = 9900 ", "sla_availability_bps = 10001 ", 0, "SLA availability"),
            ("models = [\"NVIDIA GeForce RTX 4090\"]", "models = [\"*\"]", 51, "model patterns"),
            ("currency = \"USD\"", "currency = \"dollar\"", 6, "currency"),
            ("name = \"A100-80G\"", "name = \"H100-SXM-80G\"", 44, "listed twice"),
            ("tick_minor = 1000 ", "tick_minor = 1500 ", 0, "tick and price band"),
            ("monthly_windows_ahead = 6", "monthly_windows_ahead = 7", 0, "6 monthly windows ahead"),
            ("\"cn-east\", \"cn-west\"]", "\"cn-east\", \"cn-east\"]", 0, "distinct names"),
            ("\"us-east\",", "\"US East\",", 0, "lower-case letters"),
            ("words_log2 = 16", "words_log2 = 40", 0, "memory challenge's words_log2"),
            ("passes = 8", "passes = 13", 0, "its passes 1..=12"),
            ("n = 256, ", "n = 100, ", 0, "a power of two from 16 to 16384"),
            ("n = 256, ", "n = 32768, ", 0, "a power of two from 16 to 16384"),
            ("orders_per_account_max = 10000", "orders_per_account_max = 16777216", 0, "an account's share of the 16777216 live orders"),
            ("fabric_required = true\n", "fabric_required = true\ncluster_min_fabric_gbps = 0\n", 36, "must be 1 to 100000 Gb/s"),
        ];
        for (from, to, line, needle) in cases {
            assert!(DEMO.contains(from), "{from}");
            let text = DEMO.replacen(from, to, 1);
            let error = parse(&text, "listing.toml").expect_err(to);
            assert_eq!(error.file, "listing.toml");
            if *line > 0 {
                assert_eq!(error.line, *line, "{to}: {error}");
            }
            assert!(error.to_string().contains(needle), "{to}: {error}");
        }
        // A missing field without a default names the class.
        let text = DEMO.replacen("tick_minor = 1000 ", "", 1);
        let error = parse(&text, "listing.toml").expect_err("no tick");
        assert_eq!((error.line, error.field.as_str()), (36, "class H100-SXM-80G.tick_minor"));
        let missing = load(Path::new("/nonexistent/listing.toml")).expect_err("no file");
        assert!(missing.to_string().starts_with("/nonexistent/listing.toml:0: file: cannot read it"), "{missing}");
    }

    #[test]
    fn a_class_names_its_cluster_terms_or_takes_the_defaults() {
        let text = DEMO.replacen("[defaults]\n", "[defaults]\ncluster_min_fabric_gbps = 100\n", 1).replacen(
            "fabric_required = true\n",
            "fabric_required = true\ncluster_min_fabric_gbps = 400\n",
            1,
        );
        let listing = parse(&text, "listing.toml").expect("valid");
        assert_eq!(listing.config, EngineConfig::demo(), "the engine's listing is unchanged");
        let rules: Vec<(String, u32)> = listing.cluster_rules.into_iter().map(|r| (r.class, r.min_fabric_gbps)).collect();
        assert_eq!(rules[0], ("H100-SXM-80G".to_string(), 400));
        assert!(rules[1..].iter().all(|(_, gbps)| *gbps == 100) && rules.len() == EngineConfig::demo().classes.len());
    }

    #[test]
    fn a_class_may_override_the_defaults_and_opt_out_of_the_challenge() {
        let text = format!(
            "{DEMO}\n[[class]]\nname = \"910B-64G\"\nvendor = \"huawei\"\nmodels = [\"Ascend 910B*\"]\nmemory_mib_min = 60000\n\
             sla_availability_bps = 9990\nno_challenge = true\ntick_minor = 10000\nprice_min_minor_per_gpu_hour = 10000\n"
        );
        let config = parse(&text, "listing.toml").expect("valid").config;
        let class = config.classes.last().expect("a class");
        assert_eq!((class.tick_minor, class.sla_availability_bps, class.challenge, class.memory_challenge), (10_000, 9_990, None, None));
        assert_eq!(class.sla_credit_tiers, config.classes[0].sla_credit_tiers, "[defaults]' tiers");
    }
}
