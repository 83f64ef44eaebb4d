//! Services on the wire (docs/services.md, docs/protocol.md "Services"):
//! what a renter creates, what the exchange says about a service and its
//! replicas, and what a host is handed to run one replica.
//!
//! A service's run (image, command, port, readiness path) is public to the
//! exchange, like a job's: the exchange journals it so that it can hand a
//! replacement replica to a new host while the renter is offline. A service
//! carries no secrets (no environment, no keys); what a replica needs that
//! is secret it fetches itself.

use gpux_engine::{InstrumentId, LeaseId};
use serde::{Deserialize, Serialize};

/// Bounds of a service; a breach is `service_invalid` with the field named.
pub mod limits {
    /// Bytes of a service's name.
    pub const NAME_BYTES_MAX: usize = 64;
    /// Words of the command, bytes of one word, bytes of all of them.
    pub const COMMAND_WORDS_MAX: usize = 256;
    pub const WORD_BYTES_MAX: usize = 4096;
    pub const COMMAND_BYTES_MAX: usize = 8 * 1024;
    /// Bytes of the readiness path.
    pub const READINESS_PATH_BYTES_MAX: usize = 256;
    /// Replicas one service keeps at most.
    pub const REPLICAS_MAX: u32 = 64;
    /// GPUs of one replica (all on one host).
    pub const GPUS_PER_REPLICA_MAX: u32 = 64;
    /// Services not deleted one account may hold.
    pub const SERVICES_PER_ACCOUNT_MAX: usize = 16;
    /// Services not deleted, all accounts together.
    pub const SERVICES_LIVE_MAX: usize = 1 << 14;
    /// Deleted services one account's queries still find (its oldest go first).
    pub const SERVICES_DELETED_PER_ACCOUNT_MAX: usize = 16;
    /// The longest scaling window.
    pub const SCALING_WINDOW_MS_MAX: u64 = 3_600_000;
    /// Routers whose load one service sums (more: the oldest reporter is
    /// forgotten), and how old a router's last report may be to count.
    pub const ROUTERS_MAX: usize = 8;
    pub const LOAD_STALE_MS: u64 = 5_000;
    /// Keys one service accepts.
    pub const KEY_HASHES_MAX: usize = 16;
    /// Services in one `services` page.
    pub const SERVICES_PAGE_MAX: usize = 50;
    /// Bids one service may place over its life (its replicas' first bids
    /// and every replacement); then it stops bidding (`bids_exhausted`).
    pub const BIDS_MAX: u64 = 1 << 20;
    /// Replicas in a row that exit or fail for the renter's reason before
    /// any became ready: the service fails (`failed`) rather than buy
    /// replacements that will fail the same way.
    pub const REPLICA_FAILURES_MAX: u32 = 5;
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct ServiceId(pub u64);

impl std::fmt::Display for ServiceId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}", self.0)
    }
}

/// `create_service`: what a service runs, where, at what price, how many.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ServiceSpec {
    pub name: String,
    /// A spot or preemptible book: each replica's lease is bought there.
    pub instrument: InstrumentId,
    /// GPUs of each replica, on one host.
    pub gpus: u32,
    /// The most a replica's lease may cost per GPU-hour.
    pub limit_minor_per_gpu_hour: u64,
    /// The most the service may pay per hour across its replicas (at
    /// their limits): it caps how many replicas the service keeps.
    pub budget_minor_per_hour: u64,
    /// Replicas the service keeps now (`scale_service` changes it), within
    /// `min_replicas..=max_replicas`.
    pub replicas: u32,
    pub min_replicas: u32,
    pub max_replicas: u32,
    /// Container image reference.
    pub image: String,
    /// Replaces the image's entrypoint when not empty.
    #[serde(default)]
    pub command: Vec<String>,
    /// The container port that serves requests (published by the host).
    pub port: u16,
    /// HTTP path answered 2xx or 3xx once a replica is ready (`None`: a TCP
    /// connection to the port is enough).
    #[serde(default)]
    pub readiness_path: Option<String>,
    /// Regions a replica's host may be in (empty: any).
    #[serde(default)]
    pub regions: Vec<String>,
    #[serde(default)]
    pub min_supplier_score_bps: u32,
    /// Autoscaling from the load its routers measure (docs/services.md
    /// "Autoscaling"); without it the service keeps `replicas` until the
    /// renter scales it.
    #[serde(default)]
    pub scaling: Option<ServiceScaling>,
    /// The hex SHA-256 of each key a router accepts for the service
    /// (`Authorization: Bearer KEY`); at most 16. Empty: the service is
    /// open to anyone who reaches a router.
    #[serde(default)]
    pub key_hashes: Vec<String>,
}

/// What a service scales on, per replica.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ScalingTarget {
    /// Requests per second per replica, in thousandths (1 500: 1.5 rps).
    RequestsPerSecondMilli(u64),
    /// Requests in flight per replica.
    InFlight(u32),
}

/// A service's autoscaling: replicas added when the load wanted more for a
/// whole `up_window_ms`, removed when it wanted fewer for a whole
/// `down_window_ms`, within `min_replicas..=max_replicas` and the budget;
/// to zero when `min_replicas` is 0 and no request came for a down window.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ServiceScaling {
    pub target: ScalingTarget,
    pub up_window_ms: u64,
    pub down_window_ms: u64,
}

/// The load one router measured over the last second, as it reports it
/// (`service_load`): requests per second in thousandths, requests in
/// flight to replicas, and requests queued while no replica is ready.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ServiceLoad {
    pub requests_per_second_milli: u64,
    pub in_flight: u32,
    pub queued: u32,
}

/// A change of a service's replicas the autoscaler made, and why
/// (`load_above`, `load_below`, `idle`, `woken`, `below_min`, `above_max`,
/// `budget`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ScalingDecision {
    pub from: u32,
    pub to: u32,
    pub reason: String,
    pub at_ms: u64,
}

/// What a service's replicas run: what `update_service` changes.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ServiceRun {
    pub image: String,
    #[serde(default)]
    pub command: Vec<String>,
    pub port: u16,
    #[serde(default)]
    pub readiness_path: Option<String>,
}

/// A rolling update's state (`update_service`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RolloutState {
    /// The new run's replicas come up one at a time, each replacing an old one once ready.
    Rolling,
    /// Every replica runs the new run.
    Done,
    /// 5 new replicas in a row failed before one was ready: the old run is back.
    RolledBack,
}

/// Where a service stands.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ServiceState {
    /// Keeps its replicas: bids for those it lacks, replaces those lost.
    Running,
    /// `REPLICA_FAILURES_MAX` replicas in a row exited or failed for the
    /// renter's reason before any became ready: no more bids; its leases ended.
    Failed,
    /// It placed `BIDS_MAX` bids: no more; its leases run on until deleted.
    BidsExhausted,
    /// Deleted by its renter: bids cancelled, leases ended.
    Deleted,
}

impl ServiceState {
    pub fn name(self) -> &'static str {
        match self {
            ServiceState::Running => "running",
            ServiceState::Failed => "failed",
            ServiceState::BidsExhausted => "bids_exhausted",
            ServiceState::Deleted => "deleted",
        }
    }
}

/// Where one replica stands.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ReplicaState {
    /// Its bid rests until a host fills it.
    Bidding,
    /// Its lease runs; the host is starting the workload.
    Starting,
    /// The host reports it running and ready: the router sends it requests.
    Ready,
}

/// One replica of a service now.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReplicaInfo {
    /// Its place in the service (0..replicas), kept by its replacements.
    pub slot: u32,
    pub state: ReplicaState,
    /// Its lease once its bid filled.
    #[serde(default)]
    pub lease: Option<LeaseId>,
    /// `host:port` serving the service's port once ready.
    #[serde(default)]
    pub endpoint: Option<String>,
    /// Why a bidding replica has no bid: its last was refused or closed
    /// unfilled (`bid refused: CODE`, `bid closed: REASON`); the service's
    /// next `scale_service` bids again.
    #[serde(default)]
    pub stalled: Option<String>,
    /// When it entered its state.
    pub since_ms: u64,
    /// The generation of the run it runs (the service's `generation` but
    /// during a rolling update).
    #[serde(default)]
    pub generation: u32,
    /// Its lease got a preemption notice: a stand-in replica bids beside it
    /// (docs/services.md "Replicas"), and this one goes when its lease ends.
    #[serde(default)]
    pub noticed: bool,
}

/// What the exchange says about a service.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ServiceInfo {
    pub service: ServiceId,
    pub spec: ServiceSpec,
    pub state: ServiceState,
    /// Replicas now, by slot.
    pub replicas: Vec<ReplicaInfo>,
    /// Bids placed so far (first bids and replacements).
    pub bids: u64,
    /// Replicas whose lease ended before the service let it go (host
    /// fault, preemption, silence, the workload's exit) and were bid again.
    pub replaced: u64,
    /// Every lease it ran on, newest last (its newest `INFO_LEASES_MAX`).
    pub leases: Vec<LeaseId>,
    pub created_at_ms: u64,
    pub updated_at_ms: u64,
    /// The autoscaler's latest change, if it made one.
    #[serde(default)]
    pub last_scaling: Option<ScalingDecision>,
    /// The run's generation: 0 as created, one more with each update (and
    /// each roll back).
    #[serde(default)]
    pub generation: u32,
    /// The latest rolling update's state, if there was one.
    #[serde(default)]
    pub rollout: Option<RolloutState>,
    /// Its floor of replicas on a book that does not preempt, if it has one.
    #[serde(default)]
    pub floor: Option<ServiceFloor>,
}

/// Leases of one service `ServiceInfo` lists (its newest).
pub const INFO_LEASES_MAX: usize = 64;

/// Pushed to a replica lease's host: what to run on it. The host publishes
/// `port` and reports `running` once the readiness probe answers.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReplicaAssignment {
    pub service: ServiceId,
    pub slot: u32,
    pub image: String,
    pub command: Vec<String>,
    pub port: u16,
    pub readiness_path: Option<String>,
}

/// The hex SHA-256 of a service key: what `key_hashes` holds.
pub fn key_hash(key: &str) -> String {
    use sha2::Digest;
    hex::encode(sha2::Sha256::digest(key.as_bytes()))
}

/// Why a spec was refused: the field that breaks its bound.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum SpecError {
    #[error("name: 1 to 64 bytes of letters, digits and ._-")]
    Name,
    #[error("gpus: 1 to 64 per replica")]
    Gpus,
    #[error("replicas: min_replicas <= replicas <= max_replicas <= 64")]
    Replicas,
    #[error("limit_minor_per_gpu_hour: more than 0")]
    Limit,
    #[error("budget_minor_per_hour: pays for min_replicas (and at least one replica) at the limit")]
    Budget,
    #[error("image: not an image reference")]
    Image,
    #[error("command: at most 256 words of at most 4096 bytes, 8 KiB in all, no NUL")]
    Command,
    #[error("port: 1 to 65535")]
    Port,
    #[error("readiness_path: starts with /, printable, at most 256 bytes")]
    ReadinessPath,
    #[error("regions: at most 16 names")]
    Regions,
    #[error("min_supplier_score_bps: at most 10000")]
    Score,
    #[error("key_hashes: at most 16 SHA-256 hashes, 64 hex digits each")]
    KeyHashes,
    #[error("scaling: a target above 0, an up window of 1 s to 1 h and a down window from the up window to 1 h")]
    Scaling,
    #[error("floor: 1 to min_replicas replicas, a limit above 0, and a budget that pays for min_replicas with the floor's at its limit")]
    Floor,
}

/// A floor of replicas kept on a book that does not preempt (a spot book)
/// while the rest run on the service's preemptible book
/// (docs/services.md "A floor"): slots `0..replicas` bid on `instrument`
/// at `limit_minor_per_gpu_hour`, the others on the spec's.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ServiceFloor {
    /// A spot book of the same GPU class as the spec's (the exchange checks).
    pub instrument: InstrumentId,
    /// Replicas on it: 1 to the spec's `min_replicas`, so a scale never
    /// goes below it.
    pub replicas: u32,
    /// The most a floor replica's lease may cost per GPU-hour.
    pub limit_minor_per_gpu_hour: u64,
}

impl ServiceFloor {
    /// What one floor replica costs per hour at its limit.
    pub fn replica_minor_per_hour(&self, spec: &ServiceSpec) -> u64 {
        self.limit_minor_per_gpu_hour.saturating_mul(u64::from(spec.gpus))
    }

    /// Checks the floor against the spec it is for (its book's kind and
    /// class are the exchange's to check).
    pub fn check(&self, spec: &ServiceSpec) -> Result<(), SpecError> {
        let floor_cost = self.replica_minor_per_hour(spec).saturating_mul(u64::from(self.replicas));
        let rest = u64::from(spec.min_replicas.saturating_sub(self.replicas)).saturating_mul(spec.replica_minor_per_hour());
        if self.replicas == 0
            || self.replicas > spec.min_replicas
            || self.limit_minor_per_gpu_hour == 0
            || floor_cost.saturating_add(rest) > spec.budget_minor_per_hour
        {
            return Err(SpecError::Floor);
        }
        Ok(())
    }
}

/// Replicas the budget pays for, at their limits: the floor's first (at
/// the floor's limit), then the rest at the spec's.
pub fn affordable(spec: &ServiceSpec, floor: Option<&ServiceFloor>) -> u32 {
    let Some(floor) = floor else { return spec.affordable() };
    let floor_cost = floor.replica_minor_per_hour(spec).saturating_mul(u64::from(floor.replicas));
    let Some(left) = spec.budget_minor_per_hour.checked_sub(floor_cost) else {
        return (spec.budget_minor_per_hour / floor.replica_minor_per_hour(spec).max(1)) as u32;
    };
    let rest = left / spec.replica_minor_per_hour().max(1);
    (u64::from(floor.replicas) + rest).min(u64::from(limits::REPLICAS_MAX)) as u32
}

impl ServiceSpec {
    /// What its replicas run.
    pub fn run(&self) -> ServiceRun {
        ServiceRun {
            image: self.image.clone(),
            command: self.command.clone(),
            port: self.port,
            readiness_path: self.readiness_path.clone(),
        }
    }

    pub fn set_run(&mut self, run: ServiceRun) {
        let ServiceRun { image, command, port, readiness_path } = run;
        (self.image, self.command, self.port, self.readiness_path) = (image, command, port, readiness_path);
    }

    /// What one replica costs per hour at the limit.
    pub fn replica_minor_per_hour(&self) -> u64 {
        self.limit_minor_per_gpu_hour.saturating_mul(u64::from(self.gpus))
    }

    /// Replicas the budget pays for at the limit.
    pub fn affordable(&self) -> u32 {
        let each = self.replica_minor_per_hour().max(1);
        (self.budget_minor_per_hour / each).min(u64::from(limits::REPLICAS_MAX)) as u32
    }

    /// Checks every bound of the spec (the instrument's kind is the
    /// exchange's to check).
    pub fn check(&self) -> Result<(), SpecError> {
        let name_ok = |n: &str| {
            !n.is_empty() && n.len() <= limits::NAME_BYTES_MAX && n.bytes().all(|b| b.is_ascii_alphanumeric() || b"._-".contains(&b))
        };
        if !name_ok(&self.name) {
            return Err(SpecError::Name);
        }
        if self.gpus == 0 || self.gpus > limits::GPUS_PER_REPLICA_MAX {
            return Err(SpecError::Gpus);
        }
        if !(self.min_replicas <= self.replicas && self.replicas <= self.max_replicas && self.max_replicas <= limits::REPLICAS_MAX)
            || self.max_replicas == 0
        {
            return Err(SpecError::Replicas);
        }
        if self.limit_minor_per_gpu_hour == 0 {
            return Err(SpecError::Limit);
        }
        if self.affordable() < self.min_replicas.max(1) {
            return Err(SpecError::Budget);
        }
        if crate::delivery::Workload::image(self.image.clone()).validate().is_err() {
            return Err(SpecError::Image);
        }
        let bytes: usize = self.command.iter().map(String::len).sum();
        if self.command.len() > limits::COMMAND_WORDS_MAX
            || bytes > limits::COMMAND_BYTES_MAX
            || self.command.iter().any(|w| w.len() > limits::WORD_BYTES_MAX || w.contains('\0'))
        {
            return Err(SpecError::Command);
        }
        if self.port == 0 {
            return Err(SpecError::Port);
        }
        if let Some(path) = &self.readiness_path {
            let printable = path.bytes().all(|b| (0x21..0x7f).contains(&b));
            if !path.starts_with('/') || !printable || path.len() > limits::READINESS_PATH_BYTES_MAX {
                return Err(SpecError::ReadinessPath);
            }
        }
        if self.regions.len() > 16 || self.regions.iter().any(|r| r.is_empty() || r.len() > 64) {
            return Err(SpecError::Regions);
        }
        if self.min_supplier_score_bps > 10_000 {
            return Err(SpecError::Score);
        }
        if let Some(scaling) = &self.scaling {
            let target_ok = !matches!(scaling.target, ScalingTarget::RequestsPerSecondMilli(0) | ScalingTarget::InFlight(0));
            let windows_ok = (1_000..=limits::SCALING_WINDOW_MS_MAX).contains(&scaling.up_window_ms)
                && (scaling.up_window_ms..=limits::SCALING_WINDOW_MS_MAX).contains(&scaling.down_window_ms);
            if !target_ok || !windows_ok {
                return Err(SpecError::Scaling);
            }
        }
        let hash_ok = |h: &String| h.len() == 64 && h.bytes().all(|b| b.is_ascii_hexdigit());
        if self.key_hashes.len() > limits::KEY_HASHES_MAX || !self.key_hashes.iter().all(hash_ok) {
            return Err(SpecError::KeyHashes);
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    pub fn spec() -> ServiceSpec {
        ServiceSpec {
            name: "echo".into(),
            instrument: InstrumentId(1),
            gpus: 1,
            limit_minor_per_gpu_hour: 100,
            budget_minor_per_hour: 400,
            replicas: 2,
            min_replicas: 1,
            max_replicas: 4,
            image: "localhost/gpux-test:latest".into(),
            command: vec!["python3".into(), "-m".into(), "http.server".into(), "8000".into()],
            port: 8000,
            readiness_path: Some("/".into()),
            regions: Vec::new(),
            min_supplier_score_bps: 0,
            scaling: Some(ServiceScaling { target: ScalingTarget::InFlight(4), up_window_ms: 2_000, down_window_ms: 10_000 }),
            key_hashes: vec!["ab".repeat(32)],
        }
    }

    #[test]
    fn each_bound_of_a_spec_is_named_when_broken() {
        assert_eq!(spec().check(), Ok(()));
        assert_eq!(spec().affordable(), 4);
        let cases = [
            (ServiceSpec { name: "a b".into(), ..spec() }, SpecError::Name),
            (ServiceSpec { gpus: 0, ..spec() }, SpecError::Gpus),
            (ServiceSpec { replicas: 5, ..spec() }, SpecError::Replicas),
            (ServiceSpec { min_replicas: 3, ..spec() }, SpecError::Replicas),
            (ServiceSpec { max_replicas: 0, replicas: 0, min_replicas: 0, ..spec() }, SpecError::Replicas),
            (ServiceSpec { limit_minor_per_gpu_hour: 0, ..spec() }, SpecError::Limit),
            (ServiceSpec { budget_minor_per_hour: 99, ..spec() }, SpecError::Budget),
            (ServiceSpec { min_replicas: 2, budget_minor_per_hour: 199, ..spec() }, SpecError::Budget),
            (ServiceSpec { image: "bad image".into(), ..spec() }, SpecError::Image),
            (ServiceSpec { command: vec!["a\0".into()], ..spec() }, SpecError::Command),
            (ServiceSpec { port: 0, ..spec() }, SpecError::Port),
            (ServiceSpec { readiness_path: Some("health".into()), ..spec() }, SpecError::ReadinessPath),
            (ServiceSpec { regions: vec![String::new()], ..spec() }, SpecError::Regions),
            (ServiceSpec { min_supplier_score_bps: 10_001, ..spec() }, SpecError::Score),
            (ServiceSpec { key_hashes: vec!["ab".into()], ..spec() }, SpecError::KeyHashes),
            (
                ServiceSpec {
                    scaling: Some(ServiceScaling { target: ScalingTarget::InFlight(0), up_window_ms: 2_000, down_window_ms: 10_000 }),
                    ..spec()
                },
                SpecError::Scaling,
            ),
            (
                ServiceSpec {
                    scaling: Some(ServiceScaling { target: ScalingTarget::InFlight(1), up_window_ms: 2_000, down_window_ms: 1_000 }),
                    ..spec()
                },
                SpecError::Scaling,
            ),
            (ServiceSpec { key_hashes: vec!["ab".repeat(32); 17], ..spec() }, SpecError::KeyHashes),
        ];
        for (spec, error) in cases {
            assert_eq!(spec.check(), Err(error), "{spec:?}");
        }
    }
}
