//! The owner's agent configuration (TOML): where the exchange is, what this
//! host is called, where its key lives, what to offer at what floor price,
//! and the delivery hook. Unknown keys and impossible values are refused
//! with the key's name, before the agent connects anywhere.
//!
//! ```toml
//! exchange = "ws://127.0.0.1:7300"
//! host = "dc1-node-01"
//! key_file = "/var/lib/gpux/host.key"
//! sample_interval_ms = 10000
//! delivery_hook = "/usr/local/bin/gpux-deliver"
//!
//! [[offer]]
//! contract = "spot"            # or "preemptible"
//! price_floor_minor_per_gpu_hour = 2100000
//!
//! [[offer]]
//! contract = "hourly_window"   # or "daily_window", "weekly_window", "monthly_window"
//! price_floor_minor_per_gpu_hour = 1800000
//! windows_ahead = 6
//! ```

use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use serde::Deserialize;

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum OfferedContract {
    Spot,
    Preemptible,
    /// The next `windows_ahead` hourly reserved windows.
    HourlyWindow,
    /// The next `windows_ahead` daily reserved windows.
    DailyWindow,
    /// The next `windows_ahead` weekly reserved windows (Monday to Monday, UTC).
    WeeklyWindow,
    /// The next `windows_ahead` monthly reserved windows (UTC calendar months).
    MonthlyWindow,
}

impl OfferedContract {
    pub fn is_window(self) -> bool {
        self.window_label().is_some()
    }

    /// The symbol suffix of the windows this contract offers in.
    pub fn window_label(self) -> Option<&'static str> {
        match self {
            OfferedContract::Spot | OfferedContract::Preemptible => None,
            OfferedContract::HourlyWindow => Some("/1H"),
            OfferedContract::DailyWindow => Some("/1D"),
            OfferedContract::WeeklyWindow => Some("/1W"),
            OfferedContract::MonthlyWindow => Some("/1M"),
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Offer {
    pub contract: OfferedContract,
    pub price_floor_minor_per_gpu_hour: u64,
    /// For window offers: how many upcoming tradable windows to offer in.
    #[serde(default = "default_windows_ahead")]
    pub windows_ahead: u32,
}

fn default_windows_ahead() -> u32 {
    4
}

/// A daily period (UTC) when the owner makes the GPUs available; `until`
/// before `from` spans midnight.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Availability {
    pub from_utc: String,
    pub until_utc: String,
}

/// Minute of the day of an `HH:MM` time.
fn minute_of_day(text: &str) -> Option<u32> {
    let (hours, minutes) = text.split_once(':')?;
    let (hours, minutes): (u32, u32) = (hours.parse().ok()?, minutes.parse().ok()?);
    (hours < 24 && minutes < 60 && text.len() == 5).then_some(hours * 60 + minutes)
}

impl Availability {
    fn minutes(&self) -> Option<(u32, u32)> {
        Some((minute_of_day(&self.from_utc)?, minute_of_day(&self.until_utc)?))
    }

    fn contains(&self, minute: u32) -> bool {
        let Some((from, until)) = self.minutes() else { return false };
        if from <= until {
            (from..until).contains(&minute)
        } else {
            minute >= from || minute < until
        }
    }
}

/// The `[fabric]` table: what the host declares of its fabric.
#[derive(Clone, Debug, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FabricConfig {
    /// The fabric's name among this supplier's fabrics in the zone, e.g. "ib-pod-3".
    pub group: String,
    /// The host's bandwidth on it, Gb/s (e.g. 400 for one NDR port).
    pub gbps: u32,
    /// The host's address on the fabric: where its cluster peers reach it.
    pub address: String,
    /// The first of 64 ports cluster containers listen on (one per GPU
    /// index): the member whose lowest GPU is index `i` gets `port_base + i`.
    /// The interconnect probe listens on `port_base + 64` to `port_base +
    /// 127` (docs/agent.md "Interconnect probe").
    #[serde(default = "default_port_base")]
    pub port_base: u16,
    /// MiB each member reduces in the interconnect probe at a cluster's
    /// delivery (1 to 16 384; 0: no probe).
    #[serde(default = "default_probe_mib")]
    pub probe_mib: u32,
    /// `"nftables"`: the agent admits new connections to the fabric address
    /// only from this host and its clusters' members (docs/agent.md
    /// "Firewall"); `"none"` (the default): the operator's own rules.
    #[serde(default)]
    pub firewall: FirewallKind,
}

/// Who keeps the fabric's firewall.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FirewallKind {
    #[default]
    None,
    Nftables,
}

fn default_port_base() -> u16 {
    29_500
}

fn default_probe_mib() -> u32 {
    64
}

impl FabricConfig {
    pub fn claim(&self) -> gpux_engine::FabricClaim {
        gpux_engine::FabricClaim { group: self.group.clone(), gbps: self.gbps, address: self.address.clone(), port_base: self.port_base }
    }
}

#[derive(Clone, Debug, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AgentConfig {
    pub exchange: String,
    pub host: String,
    pub key_file: PathBuf,
    /// The host's region, one the exchange lists (its `listing` request);
    /// declared when the host's first GPU registers and kept for good.
    /// Without it the host is in no region: bids that require regions
    /// never trade with it.
    #[serde(default)]
    pub region: Option<String>,
    /// The host's zone (data centre, availability zone), shown to renters.
    #[serde(default)]
    pub zone: Option<String>,
    /// The fabric (InfiniBand or RoCE partition, cross-host NVLink domain)
    /// that joins this host to the supplier's other hosts in its zone:
    /// cluster bids fill across hosts of one fabric (docs/agent.md
    /// "Clusters"). Declared with the host's first GPU; needs `region`.
    #[serde(default)]
    pub fabric: Option<FabricConfig>,
    #[serde(default = "default_sample_interval_ms")]
    pub sample_interval_ms: u64,
    /// How often each leased GPU's usage is reported.
    #[serde(default = "default_report_interval_ms")]
    pub report_interval_ms: u64,
    /// A leased GPU unhealthy this long is lost: the agent fails its lease
    /// on the host's side (`gpu_unavailable`), so the exchange ends it,
    /// bills nothing more, and re-matches it where the renter asked.
    #[serde(default = "default_gpu_lost_after_ms")]
    pub gpu_lost_after_ms: u64,
    /// A program run on every lease event as `hook <event> <lease> <gpu uuids,comma-separated> <end_ms or ->`,
    /// where event is `start`, `preempt` or `end`. Without one, deliveries are logged.
    #[serde(default)]
    pub delivery_hook: Option<PathBuf>,
    #[serde(default, rename = "offer")]
    pub offers: Vec<Offer>,
    /// When the GPUs may be sold; none means always.
    #[serde(default)]
    pub available: Vec<Availability>,
    /// How leases are delivered: `[delivery] backend = "docker" | "process" | "hook"`.
    /// Without this section, `delivery_hook` (if set) is the `hook` backend
    /// and otherwise lease events are only logged.
    #[serde(default)]
    pub delivery: Option<DeliveryConfig>,
    /// An operator's invitation for this host's key (`gpux invite KEY
    /// --role supplier`), which an exchange that opens accounts by
    /// invitation (`--account-opening invite`) needs at the key's first
    /// login; ignored once the key has its account.
    #[serde(default)]
    pub invite: Option<String>,
}

/// Which delivery backend runs the renters' workloads, and its settings.
#[derive(Clone, Debug, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DeliveryConfig {
    pub backend: BackendKind,
    /// Where workloads' published ports are reachable (the host's public address).
    #[serde(default = "default_public_address")]
    pub public_address: String,
    /// Where per-lease scratch data lives (SSH keys file, process output); default `<key_file's dir>/leases`.
    #[serde(default)]
    pub state_dir: Option<PathBuf>,
    /// How long a stopping workload gets between SIGTERM and SIGKILL at a lease's end.
    #[serde(default = "default_stop_grace_ms")]
    pub stop_grace_ms: u64,
    /// How long a started workload must stay up before it is reported
    /// `running` (a command that exits sooner is reported `exited`).
    #[serde(default = "default_ready_after_ms")]
    pub ready_after_ms: u64,
    /// After a delivery the host failed, its GPUs stay off sale until the
    /// lease ended and a health check (the engine answers, the GPUs read
    /// healthy) passed, tried first this long after the failure, then at
    /// doubling intervals (up to an hour) while it fails; each further host
    /// failure in a row doubles the first wait.
    #[serde(default = "default_health_backoff_ms")]
    pub health_backoff_ms: u64,
    /// Pulls, starts and stops run side by side, at most this many at once.
    #[serde(default = "default_delivery_concurrency")]
    pub concurrency: u32,
    #[serde(default)]
    pub docker: DockerConfig,
    /// The owner's program for the `hook` backend.
    #[serde(default)]
    pub hook: Option<PathBuf>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum BackendKind {
    Docker,
    Process,
    Hook,
}

/// How GPUs are handed to containers.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum GpuDevices {
    /// A device request for the leased GPUs' UUIDs (NVIDIA Container Toolkit).
    #[default]
    Nvidia,
    /// `/dev/kfd` and the leased GPUs' `/dev/dri/renderD*` nodes (ROCm).
    Amd,
    /// The leased NPUs' `/dev/davinci<N>` and the shared `/dev/davinci_manager`,
    /// `/dev/devmm_svm`, `/dev/hisi_hdc`, with the host's driver
    /// (`/usr/local/Ascend/driver`) mounted read-only (Huawei Ascend).
    Ascend,
    /// The leased MLUs' `/dev/cambricon_dev<N>` and `/dev/cambricon_ctl` (Cambricon).
    Cambricon,
    /// The leased GPUs' `/dev/iluvatar<N>` (Iluvatar CoreX).
    Iluvatar,
    /// No device (hosts whose GPUs come from the fake backend, for tests and demos).
    None,
    /// Each leased fake GPU as `/dev/gpux-fake<N>` (the host's `/dev/null`),
    /// so tests on machines without GPUs check that a container gets exactly
    /// its leased devices, through the same device mapping the vendors use.
    Fake,
}

#[derive(Clone, Debug, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DockerConfig {
    /// The Docker Engine API socket (Docker's, or `podman system service`'s).
    #[serde(default = "default_docker_socket")]
    pub socket: String,
    #[serde(default)]
    pub gpu_devices: GpuDevices,
    /// CPUs a container gets per leased GPU (none: no limit).
    #[serde(default)]
    pub cpus_per_gpu: Option<f64>,
    /// Memory a container gets per leased GPU, MiB (none: no limit).
    #[serde(default)]
    pub memory_mib_per_gpu: Option<u64>,
    /// Copied from `DeliveryConfig::public_address` at load.
    #[serde(skip)]
    pub public_address: String,
}

impl Default for DockerConfig {
    fn default() -> Self {
        DockerConfig {
            socket: default_docker_socket(),
            gpu_devices: GpuDevices::default(),
            cpus_per_gpu: None,
            memory_mib_per_gpu: None,
            public_address: default_public_address(),
        }
    }
}

fn default_public_address() -> String {
    "127.0.0.1".into()
}

fn default_stop_grace_ms() -> u64 {
    10_000
}

fn default_ready_after_ms() -> u64 {
    2_000
}

fn default_health_backoff_ms() -> u64 {
    30_000
}

fn default_delivery_concurrency() -> u32 {
    8
}

fn default_docker_socket() -> String {
    "/var/run/docker.sock".into()
}

fn default_sample_interval_ms() -> u64 {
    10_000
}

fn default_report_interval_ms() -> u64 {
    10_000
}

fn default_gpu_lost_after_ms() -> u64 {
    60_000
}

impl AgentConfig {
    /// Whether the owner makes the GPUs available at `at_ms` (UTC).
    pub fn available_at(&self, at_ms: u64) -> bool {
        let minute = ((at_ms / 60_000) % (24 * 60)) as u32;
        self.available.is_empty() || self.available.iter().any(|period| period.contains(minute))
    }

    /// Whether every minute of `[start_ms, end_ms)` is available.
    pub fn available_throughout(&self, start_ms: u64, end_ms: u64) -> bool {
        self.available.is_empty() || (start_ms..end_ms).step_by(60_000).all(|at| self.available_at(at))
    }

    pub fn from_file(path: &Path) -> Result<Self> {
        let text = std::fs::read_to_string(path).with_context(|| format!("reading agent config {}", path.display()))?;
        Self::parse(&text).with_context(|| format!("agent config {}", path.display()))
    }

    pub fn parse(text: &str) -> Result<Self> {
        let mut config: AgentConfig = toml::from_str(text)?;
        let legacy_hook = config.delivery_hook.is_some();
        if let Some(delivery) = &mut config.delivery {
            delivery.check(legacy_hook)?;
        }
        // One address, or a cluster's nodes comma-separated (the agent
        // connects to the one that accepts: the leader).
        let urls: Vec<&str> = config.exchange.split(',').map(str::trim).collect();
        if urls.iter().any(|url| !(url.starts_with("ws://") || url.starts_with("wss://"))) {
            bail!("exchange must be a ws:// or wss:// URL (or several, comma-separated), not {:?}", config.exchange);
        }
        if config.host.is_empty() || config.host.len() > 128 || !config.host.bytes().all(|b| (0x21..0x7f).contains(&b)) {
            bail!("host must be 1..=128 printable ASCII characters without spaces");
        }
        config.check_location()?;
        if let Some(invite) = &config.invite {
            let parsed = gpux_protocol::invite::Invite::parse(invite)
                .map_err(|error| anyhow::anyhow!("invite is not an invitation `gpux invite` printed ({error}): {invite:?}"))?;
            if parsed.role != gpux_engine::Role::Supplier {
                bail!(
                    "invite is for the {} role; a host's agent logs in as a supplier (`gpux invite KEY --role supplier`)",
                    parsed.role.name()
                );
            }
        }
        if !(1_000..=86_400_000).contains(&config.gpu_lost_after_ms) {
            bail!("gpu_lost_after_ms must be between 1000 and 86400000");
        }
        if !(1_000..=3_600_000).contains(&config.sample_interval_ms) {
            bail!("sample_interval_ms must be between 1000 and 3600000");
        }
        if !(1_000..=3_600_000).contains(&config.report_interval_ms) {
            bail!("report_interval_ms must be between 1000 and 3600000");
        }
        for offer in &config.offers {
            if offer.price_floor_minor_per_gpu_hour == 0 {
                bail!("offer price_floor_minor_per_gpu_hour must be positive");
            }
        }
        for period in &config.available {
            if period.minutes().is_none() {
                bail!("available periods need from_utc and until_utc as HH:MM, not {:?}..{:?}", period.from_utc, period.until_utc);
            }
        }
        for (index, offer) in config.offers.iter().enumerate() {
            if config.offers[..index].iter().any(|other| other.contract == offer.contract) {
                bail!("at most one offer per contract kind");
            }
            if offer.contract.is_window() && !(1..=48).contains(&offer.windows_ahead) {
                bail!("windows_ahead must be between 1 and 48");
            }
        }
        Ok(config)
    }

    /// Region, zone and fabric: named validly, and each within the one before.
    fn check_location(&self) -> Result<()> {
        for (field, name) in [("region", &self.region), ("zone", &self.zone)] {
            if name.as_deref().is_some_and(|name| !gpux_engine::region_name_is_valid(name)) {
                bail!("{field} must be 1..=32 lower-case letters, digits and - (e.g. \"cn-east\"), not {name:?}");
            }
        }
        if self.zone.is_some() && self.region.is_none() {
            bail!("zone needs region (a zone is within a region)");
        }
        if let Some(fabric) = &self.fabric {
            if self.region.is_none() {
                bail!("fabric needs region (a fabric group is one supplier's hosts in one zone)");
            }
            let probe_ports_fit = fabric.port_base as u32 + 2 * crate::probe::PROBE_PORT_OFFSET as u32 <= 65_536;
            if !fabric.claim().is_valid() || !probe_ports_fit || fabric.probe_mib > 16_384 {
                bail!(
                    "fabric: group must be 1..=32 lower-case letters, digits and -, gbps 1..=100000, address an IP address, port_base 1024..=65408, probe_mib 0..=16384 (got {fabric:?})"
                );
            }
        }
        Ok(())
    }
}

impl DeliveryConfig {
    /// The delivery settings' bounds; copies the public address to the
    /// container engine's settings. `legacy_hook`: the top-level
    /// `delivery_hook` is set.
    fn check(&mut self, legacy_hook: bool) -> Result<()> {
        self.docker.public_address = self.public_address.clone();
        if self.public_address.is_empty() || self.public_address.len() > 253 || self.public_address.contains(char::is_whitespace) {
            bail!("delivery.public_address must be a host name or IP address");
        }
        if self.backend == BackendKind::Hook && self.hook.is_none() && !legacy_hook {
            bail!("delivery.backend = \"hook\" needs delivery.hook (the owner's program)");
        }
        if self.stop_grace_ms > 600_000 {
            bail!("delivery.stop_grace_ms must be at most 600000");
        }
        if self.ready_after_ms > 600_000 {
            bail!("delivery.ready_after_ms must be at most 600000");
        }
        if !(1_000..=3_600_000).contains(&self.health_backoff_ms) {
            bail!("delivery.health_backoff_ms must be between 1000 and 3600000");
        }
        if !(1..=256).contains(&self.concurrency) {
            bail!("delivery.concurrency must be between 1 and 256");
        }
        if self.docker.cpus_per_gpu.is_some_and(|c| !(c > 0.0 && c <= 1024.0)) {
            bail!("delivery.docker.cpus_per_gpu must be above 0 and at most 1024");
        }
        if self.docker.memory_mib_per_gpu == Some(0) {
            bail!("delivery.docker.memory_mib_per_gpu must be positive");
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const GOOD: &str = r#"
exchange = "ws://127.0.0.1:7300"
host = "node-1"
key_file = "host.key"

[[offer]]
contract = "spot"
price_floor_minor_per_gpu_hour = 2100000

[[offer]]
contract = "preemptible"
price_floor_minor_per_gpu_hour = 900000
"#;

    #[test]
    fn a_valid_config_parses_with_defaults() {
        let config = AgentConfig::parse(GOOD).expect("valid");
        assert_eq!(config.sample_interval_ms, 10_000);
        assert_eq!(config.offers.len(), 2);
        assert_eq!(config.delivery_hook, None);
    }

    #[test]
    fn availability_periods_may_span_midnight() {
        let config = AgentConfig::parse(&format!("{GOOD}\n[[available]]\nfrom_utc = \"22:00\"\nuntil_utc = \"06:00\"\n")).expect("valid");
        let at = |hour: u64| 1_796_169_600_000 + hour * 3_600_000; // 2026-12-02T00:00Z + hours
        assert!(config.available_at(at(23)));
        assert!(config.available_at(at(5)));
        assert!(!config.available_at(at(6)));
        assert!(!config.available_at(at(12)));
        assert!(config.available_throughout(at(22), at(24 + 6)));
        assert!(!config.available_throughout(at(21), at(23)));
        assert!(AgentConfig::parse(GOOD).expect("valid").available_at(at(12)), "no periods: always");
        let broken = format!("{GOOD}\n[[available]]\nfrom_utc = \"8am\"\nuntil_utc = \"20:00\"\n");
        assert!(format!("{:#}", AgentConfig::parse(&broken).expect_err("refused")).contains("HH:MM"));
    }

    /// A cluster's nodes, comma-separated (docs/operations.md).
    #[test]
    fn several_exchange_addresses_are_accepted() {
        let cluster = GOOD.replace("ws://127.0.0.1:7300", "ws://127.0.0.1:7301, ws://127.0.0.1:7302,wss://n3.example:7300");
        assert!(AgentConfig::parse(&cluster).is_ok());
    }

    #[test]
    fn a_corrupt_config_is_refused_with_a_reason() {
        let cases = [
            ("exchange = 7", "invalid type"),
            (&GOOD.replace("ws://", "http://"), "ws:// or wss://"),
            (&GOOD.replace("ws://127.0.0.1:7300", "ws://127.0.0.1:7300,127.0.0.1:7301"), "several, comma-separated"),
            (&GOOD.replace("node-1", "node 1"), "host must be"),
            (&GOOD.replace("900000", "0"), "positive"),
            (&format!("{GOOD}\ncolour = \"red\""), "unknown field"),
            (&GOOD.replace("preemptible", "spot"), "one offer per contract"),
            (&format!("{GOOD}\n[delivery]\nbackend = \"kubernetes\""), "unknown variant"),
            (&format!("{GOOD}\n[delivery]\nbackend = \"hook\""), "needs delivery.hook"),
            (&format!("{GOOD}\n[delivery]\nbackend = \"docker\"\n[delivery.docker]\ncpus_per_gpu = 0.0"), "cpus_per_gpu"),
            (&format!("{GOOD}\n[delivery]\nbackend = \"docker\"\n[delivery.docker]\nprivileged = true"), "unknown field"),
        ];
        for (text, expected) in cases {
            let error = format!("{:#}", AgentConfig::parse(text).expect_err(expected));
            assert!(error.contains(expected), "{expected}: {error}");
        }
    }
}
