//! Jobs on the wire (docs/jobs.md, docs/protocol.md "Jobs"): what a renter
//! submits, what the exchange says about a job, and what a host is handed
//! to run one attempt of it.
//!
//! A job's run (image, command, code bundle, directories) is public to the
//! exchange, like its terms: the exchange journals it so that it can hand
//! the job to a new host while the renter is offline. A job carries no
//! secrets; its code and data travel through the job store (docs/jobs.md
//! "Code and data"), never through the journal.

use gpux_engine::{InstrumentId, LeaseId, OrderCloseReason, OrderId, RejectCode};
use serde::{Deserialize, Serialize};

/// Bounds of a job submission; a breach is `job_invalid` with the field named.
pub mod limits {
    /// Bytes of a job's name.
    pub const NAME_BYTES_MAX: usize = 64;
    /// Words of the command.
    pub const COMMAND_WORDS_MAX: usize = 256;
    /// Bytes of one word of the command, of a directory, of a package.
    pub const WORD_BYTES_MAX: usize = 4096;
    /// Bytes of the command and the packages together (a job fits a frame).
    pub const RUN_BYTES_MAX: usize = 8 * 1024;
    /// Packages installed at start (those the image lacks).
    pub const INSTALL_MAX: usize = 128;
    /// Retries after the first attempt.
    pub const RETRIES_MAX: u32 = 100;
    /// Hours each attempt's leases run at most (90 days).
    pub const HOURS_MAX: u32 = 24 * 90;
    /// GPUs one job buys (256 nodes of 64).
    pub const GPUS_MAX: u32 = 256 * 64;
    /// Checkpoint interval, seconds.
    pub const CHECKPOINT_INTERVAL_S_MIN: u32 = 10;
    pub const CHECKPOINT_INTERVAL_S_MAX: u32 = 24 * 3600;
    /// Bytes of a code bundle (as `gpux_jobs::bundle` packs it at most).
    pub const BUNDLE_BYTES_MAX: u64 = 256 << 20;
    /// Inputs of one job, and bytes of a packed input in the job store.
    pub const INPUTS_MAX: usize = 32;
    pub const INPUT_BYTES_MAX: u64 = 1 << 30;
    /// Jobs not yet over that one account may hold.
    pub const JOBS_LIVE_PER_ACCOUNT_MAX: usize = 64;
    /// Jobs not yet over that one participant (an account and all its
    /// sub-accounts) may hold together: 1/256 of the exchange's.
    pub const JOBS_LIVE_PER_PARTICIPANT_MAX: usize = JOBS_LIVE_MAX / 256;
    /// Jobs not yet over, all accounts together.
    pub const JOBS_LIVE_MAX: usize = 1 << 16;
    /// Finished jobs one account's queries still find (its oldest go first).
    pub const JOBS_FINISHED_PER_ACCOUNT_MAX: usize = 256;
    /// Finished jobs kept, all accounts together; when full, the account
    /// that keeps the most forgets its oldest.
    pub const JOBS_FINISHED_MAX: usize = 1 << 17;
    /// Jobs in one `jobs` page.
    pub const JOBS_PAGE_MAX: usize = 100;
    /// A job lease with no delivery status this long after it was created
    /// fails as its host's (an agent says `starting` as soon as it is
    /// handed the job; within `--job-silence-ms` when that is shorter).
    pub const JOB_START_SILENCE_MS: u64 = 30_000;
    /// A job lease heard of by nothing this long, while no connected
    /// session of its supplier runs it (its agent is gone), fails as its
    /// host's (within `--job-silence-ms` when that is shorter).
    pub const JOB_GONE_SILENCE_MS: u64 = 30_000;
    /// Restarts after the program's own errors (a non-zero exit).
    pub const RESTARTS_ON_ERROR_MAX: u32 = 20;
    /// Other books a job's attempts may bid on, and regions it accepts.
    pub const ALTERNATIVES_MAX: usize = 8;
    pub const REGIONS_MAX: usize = 8;
    /// A cluster member's non-zero exit waits this long for a peer's host
    /// fault (the gone rule's 30 s and a margin): a rank that fails
    /// because its peer's host died moves with the job instead of failing
    /// it (docs/jobs.md "Clusters").
    pub const CLUSTER_EXIT_HOLD_MS: u64 = 45_000;
    /// The extra a preemptible lease is expected to cost in work done
    /// again after a preemption, in basis points of its price (15%): how
    /// the plan and each new attempt's choice of book weigh preemptible
    /// books against spot ones.
    pub const PREEMPTIBLE_REWORK_BPS: u64 = 1_500;
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct JobId(pub u64);

impl std::fmt::Display for JobId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}", self.0)
    }
}

/// A code bundle in the job store: the SHA-256 of its bytes (hex) and its size.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct BundleRef {
    pub sha256: String,
    pub bytes: u64,
}

/// Where an input comes from: the job store (a directory the renter packed
/// and put at `<account>/inputs/<sha256>.tar.gz`), or a public https:// URL
/// the host downloads.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum InputSource {
    Store { sha256: String, bytes: u64 },
    Https { url: String },
}

/// Data the job reads: fetched by the host before the workload starts and
/// mounted read-only at `mount`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct JobInput {
    pub name: String,
    pub mount: String,
    pub source: InputSource,
}

/// What each attempt of a job runs. The host unpacks the bundle into
/// `/job` (read-only, the working directory), restores the newest
/// checkpoint into `checkpoint_dir`, installs `install` with pip (cached on
/// the host), runs `command`, and syncs `checkpoint_dir` and `outputs_dir`
/// to the job store every `checkpoint_interval_s` and when it ends.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct JobRun {
    pub image: String,
    pub command: Vec<String>,
    #[serde(default)]
    pub bundle: Option<BundleRef>,
    #[serde(default)]
    pub install: Vec<String>,
    pub checkpoint_dir: String,
    pub outputs_dir: String,
    pub checkpoint_interval_s: u32,
    #[serde(default)]
    pub shm_mib: u32,
    /// Data mounted read-only (at most 32).
    #[serde(default)]
    pub inputs: Vec<JobInput>,
}

/// `submit_job`: a job's terms and run. The client plans it (the book, the
/// limit, the image; `gpux job submit --dry-run` prints the plan).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct JobSubmission {
    pub name: String,
    /// A spot or preemptible book.
    pub instrument: InstrumentId,
    pub gpus: u32,
    /// All GPUs on one host (a single-node job).
    pub one_host: bool,
    pub limit_minor_per_gpu_hour: u64,
    /// Hours each attempt's leases run at most.
    pub hours: u32,
    /// The most the job may hold in escrow over all its attempts.
    pub budget_minor: u64,
    pub retries: u32,
    #[serde(default)]
    pub min_supplier_score_bps: u32,
    #[serde(default)]
    pub verified_only: bool,
    pub run: JobRun,
    /// A multi-node job on one fabric: this many hosts (2 to 64) with
    /// `gpus / nodes` GPUs each, bought with a cluster bid
    /// (docs/market-rules.md "Cluster bids"); 0: not a cluster.
    #[serde(default)]
    pub nodes: u32,
    /// With `nodes`: the least fabric bandwidth each host declared, Gb/s.
    #[serde(default)]
    pub min_fabric_gbps: u32,
    /// New attempts after the workload's own errors (a non-zero exit not
    /// caused by a preemption or a host fault), counted apart from
    /// `retries` (docs/jobs.md "Retries").
    #[serde(default)]
    pub restarts_on_error: u32,
    /// Other books (classes, spot or preemptible) each new attempt may bid
    /// on, each at its own limit: an attempt after the first bids the one
    /// of these and `instrument` with the lowest expected cost now
    /// (docs/jobs.md "Failover").
    #[serde(default)]
    pub alternatives: Vec<JobAlternative>,
    /// Regions whose hosts the job accepts (empty: any).
    #[serde(default)]
    pub regions: Vec<String>,
}

/// Another book a job may bid on, at its own limit.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct JobAlternative {
    pub instrument: InstrumentId,
    pub limit_minor_per_gpu_hour: u64,
}

/// Why an attempt after the first was started.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum AttemptCause {
    /// A host failed a lease of the previous attempt (its agent gone,
    /// silent, or its delivery failed).
    HostFailed,
    /// A lease of the previous attempt was preempted.
    Preempted,
    /// The workload exited with this code (a restart on error).
    ExitedWithError(i64),
}

/// How a new attempt chose its book among the job's.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum BookChoice {
    /// The lowest expected cost (`expected_minor` for the attempt's hours,
    /// a preemptible book's rework included) of `offering` books that
    /// offered the job's GPUs within their limits.
    Cheapest { expected_minor: u64, offering: u32 },
    /// No book offered the job's GPUs within its limit now: it bids the
    /// same book as before and waits for asks.
    NoneOffered,
}

/// The job's latest move to a new attempt, for its feed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct AttemptMove {
    pub attempt: u32,
    pub cause: AttemptCause,
    pub instrument: InstrumentId,
    pub choice: BookChoice,
    pub at_ms: u64,
}

/// A preemption the market already knows is coming to a lease of the
/// job's running attempt: a reserved window sold on its GPUs
/// (docs/market-rules.md "Preemptible"). The notice comes at
/// `notice_at_ms`, the lease ends at `ends_at_ms`. A spot buyer's
/// preemption gives no earlier sign than its notice.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PreemptionAhead {
    pub lease: LeaseId,
    pub notice_at_ms: u64,
    pub ends_at_ms: u64,
}

/// Why a submission breaks its bounds (`job_invalid`; the field it names).
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum JobInvalid {
    #[error("name: 1 to 64 bytes of letters, digits, '-', '_' or '.'")]
    Name,
    #[error("gpus: 1 to {}", limits::GPUS_MAX)]
    Gpus,
    #[error("hours: 1 to {}", limits::HOURS_MAX)]
    Hours,
    #[error("retries: at most {}", limits::RETRIES_MAX)]
    Retries,
    #[error("limit_minor_per_gpu_hour and budget_minor: above 0")]
    Price,
    #[error("min_supplier_score_bps: at most 10000")]
    Score,
    #[error("run.image: [registry/]name[:tag][@digest]")]
    Image,
    #[error("run.command: 1 to 256 words, none empty, each at most 4096 bytes without control characters, with run.install at most 8 KiB")]
    Command,
    #[error("run.bundle: a 64-hex-digit SHA-256 and 1 byte to 256 MiB")]
    Bundle,
    #[error("run.install: at most 128 package requirements of letters, digits and -_.[]<>=!~,")]
    Install,
    #[error("run.checkpoint_dir and run.outputs_dir: distinct absolute paths below / of plain names, not /job")]
    Directory,
    #[error("run.checkpoint_interval_s: 10 to 86400")]
    CheckpointInterval,
    #[error("run.shm_mib: at most 262144")]
    Shm,
    #[error(
        "nodes: 0, or 2 to 64 hosts with the same number of GPUs each (gpus a multiple of nodes, at most 64 a node), not with one_host"
    )]
    Nodes,
    #[error("restarts_on_error: at most {}", limits::RESTARTS_ON_ERROR_MAX)]
    Restarts,
    #[error("alternatives: at most {}, each another book than instrument and the others, with a limit above 0", limits::ALTERNATIVES_MAX)]
    Alternatives,
    #[error("regions: at most {}, distinct, each 1 to 64 bytes", limits::REGIONS_MAX)]
    Regions,
    #[error("run.inputs: at most 32, each a distinct name of letters, digits, '-', '_' or '.', a distinct mount that is an absolute path of plain names (not /job, the checkpoint or output directory), and a store object (64 hex digits, 1 byte to 1 GiB) or an https:// URL of at most 2048 printable bytes")]
    Input,
}

impl JobSubmission {
    /// A job of `gpus` GPUs on one host of `instrument` at up to `limit`
    /// per GPU-hour for `hours`, within `budget_minor`, running `run`: one
    /// retry, no filters, no restarts, no other books; change the fields
    /// for more.
    pub fn one_host(
        name: &str,
        instrument: InstrumentId,
        gpus: u32,
        limit: u64,
        hours: u32,
        budget_minor: u64,
        run: JobRun,
    ) -> JobSubmission {
        JobSubmission {
            name: name.into(),
            instrument,
            gpus,
            one_host: true,
            limit_minor_per_gpu_hour: limit,
            hours,
            budget_minor,
            retries: 1,
            min_supplier_score_bps: 0,
            verified_only: false,
            run,
            nodes: 0,
            min_fabric_gbps: 0,
            restarts_on_error: 0,
            alternatives: Vec::new(),
            regions: Vec::new(),
        }
    }

    /// Checks the bounds the exchange and the host both hold a job to.
    pub fn validate(&self) -> Result<(), JobInvalid> {
        let name_ok = |n: &str| {
            !n.is_empty() && n.len() <= limits::NAME_BYTES_MAX && n.bytes().all(|b| b.is_ascii_alphanumeric() || b"-_.".contains(&b))
        };
        if !name_ok(&self.name) {
            return Err(JobInvalid::Name);
        }
        if self.gpus == 0 || self.gpus > limits::GPUS_MAX {
            return Err(JobInvalid::Gpus);
        }
        if self.hours == 0 || self.hours > limits::HOURS_MAX {
            return Err(JobInvalid::Hours);
        }
        if self.retries > limits::RETRIES_MAX {
            return Err(JobInvalid::Retries);
        }
        if self.limit_minor_per_gpu_hour == 0 || self.budget_minor == 0 {
            return Err(JobInvalid::Price);
        }
        if self.min_supplier_score_bps > 10_000 {
            return Err(JobInvalid::Score);
        }
        let cluster_ok =
            |nodes: u32| (2..=64).contains(&nodes) && !self.one_host && self.gpus.is_multiple_of(nodes) && self.gpus / nodes <= 64;
        if (self.nodes != 0 && !cluster_ok(self.nodes)) || (self.nodes == 0 && self.min_fabric_gbps != 0) {
            return Err(JobInvalid::Nodes);
        }
        if self.restarts_on_error > limits::RESTARTS_ON_ERROR_MAX {
            return Err(JobInvalid::Restarts);
        }
        let mut books = std::collections::BTreeSet::from([self.instrument]);
        if self.alternatives.len() > limits::ALTERNATIVES_MAX
            || !self.alternatives.iter().all(|a| a.limit_minor_per_gpu_hour > 0 && books.insert(a.instrument))
        {
            return Err(JobInvalid::Alternatives);
        }
        let mut regions = std::collections::BTreeSet::new();
        if self.regions.len() > limits::REGIONS_MAX
            || !self.regions.iter().all(|r| !r.is_empty() && r.len() <= 64 && regions.insert(r.as_str()))
        {
            return Err(JobInvalid::Regions);
        }
        self.run.validate()
    }
}

impl JobRun {
    /// `command` in `image`, no bundle, nothing installed, no inputs:
    /// checkpoints in `/checkpoints` synced every minute, outputs in
    /// `/outputs` (what `gpux job submit` uses when the file says nothing
    /// of them); change the fields for more.
    pub fn in_image(image: &str, command: &[&str]) -> JobRun {
        JobRun {
            image: image.into(),
            command: command.iter().map(|word| word.to_string()).collect(),
            bundle: None,
            install: Vec::new(),
            checkpoint_dir: "/checkpoints".into(),
            outputs_dir: "/outputs".into(),
            checkpoint_interval_s: 60,
            shm_mib: 0,
            inputs: Vec::new(),
        }
    }

    pub fn validate(&self) -> Result<(), JobInvalid> {
        if crate::Workload::image(self.image.clone()).validate().is_err() {
            return Err(JobInvalid::Image);
        }
        let word_ok = |w: &String| !w.is_empty() && w.len() <= limits::WORD_BYTES_MAX && !w.chars().any(char::is_control);
        let run_bytes: usize = self.command.iter().chain(&self.install).map(String::len).sum();
        if self.command.is_empty()
            || self.command.len() > limits::COMMAND_WORDS_MAX
            || !self.command.iter().all(word_ok)
            || run_bytes > limits::RUN_BYTES_MAX
        {
            return Err(JobInvalid::Command);
        }
        if let Some(bundle) = &self.bundle {
            let hex = bundle.sha256.len() == 64 && bundle.sha256.bytes().all(|b| b.is_ascii_hexdigit());
            if !hex || bundle.bytes == 0 || bundle.bytes > limits::BUNDLE_BYTES_MAX {
                return Err(JobInvalid::Bundle);
            }
        }
        let package_ok = |p: &String| {
            !p.is_empty()
                && p.len() <= 256
                && p.as_bytes()[0].is_ascii_alphanumeric()
                && p.bytes().all(|b| b.is_ascii_alphanumeric() || b"-_.[]<>=!~,".contains(&b))
        };
        if self.install.len() > limits::INSTALL_MAX || !self.install.iter().all(package_ok) {
            return Err(JobInvalid::Install);
        }
        if !container_dir_ok(&self.checkpoint_dir) || !container_dir_ok(&self.outputs_dir) || self.checkpoint_dir == self.outputs_dir {
            return Err(JobInvalid::Directory);
        }
        if !(limits::CHECKPOINT_INTERVAL_S_MIN..=limits::CHECKPOINT_INTERVAL_S_MAX).contains(&self.checkpoint_interval_s) {
            return Err(JobInvalid::CheckpointInterval);
        }
        if self.shm_mib > crate::delivery::limits::SHM_MIB_MAX {
            return Err(JobInvalid::Shm);
        }
        self.validate_inputs()
    }

    fn validate_inputs(&self) -> Result<(), JobInvalid> {
        if self.inputs.len() > limits::INPUTS_MAX {
            return Err(JobInvalid::Input);
        }
        let mut names = std::collections::BTreeSet::new();
        let mut mounts = std::collections::BTreeSet::from([self.checkpoint_dir.as_str(), self.outputs_dir.as_str()]);
        for input in &self.inputs {
            let name_ok = !input.name.is_empty()
                && input.name.len() <= 64
                && input.name.bytes().all(|b| b.is_ascii_alphanumeric() || b"-_.".contains(&b))
                && input.name != "."
                && input.name != "..";
            if !name_ok || !names.insert(input.name.as_str()) || !container_dir_ok(&input.mount) || !mounts.insert(input.mount.as_str()) {
                return Err(JobInvalid::Input);
            }
            let source_ok = match &input.source {
                InputSource::Store { sha256, bytes } => {
                    sha256.len() == 64
                        && sha256.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
                        && (1..=limits::INPUT_BYTES_MAX).contains(bytes)
                }
                InputSource::Https { url } => {
                    url.starts_with("https://") && url.len() > 8 && url.len() <= 2048 && url.bytes().all(|b| b.is_ascii_graphic())
                }
            };
            if !source_ok {
                return Err(JobInvalid::Input);
            }
        }
        Ok(())
    }
}

/// An absolute directory in the container, of plain components, that is
/// not the job's code directory (`/job`) nor above or below it.
fn container_dir_ok(dir: &str) -> bool {
    let Some(rest) = dir.strip_prefix('/') else { return false };
    let components: Vec<&str> = rest.split('/').collect();
    let plain = |c: &&str| !c.is_empty() && *c != "." && *c != ".." && c.bytes().all(|b| b.is_ascii_alphanumeric() || b"-_.".contains(&b));
    dir.len() <= 256 && components.iter().all(plain) && components[0] != "job"
}

/// Why a job ended without finishing.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum JobFailure {
    /// Its leases failed more often than it may retry.
    RetriesExhausted,
    /// What is left of its budget pays for no further attempt.
    BudgetSpent,
    /// The exchange refused its bid (funds, limits): the code says why.
    BidRefused(RejectCode),
    /// Its bid closed unfilled (the renter cancelled the order itself, say).
    BidClosed(OrderCloseReason),
    /// Its leases ran their hours before the workload finished.
    OutOfTime,
    /// The workload exited with this code (the renter's code failed: not retried).
    WorkloadFailed(i64),
    /// A host could not start the job for the renter's reason (its image
    /// does not pull, its bundle is missing): not retried.
    Undeliverable(crate::delivery::FailureCode),
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum JobState {
    /// Its bid for `attempt` is on the book (or about to be).
    Bidding {
        attempt: u32,
        order: Option<OrderId>,
    },
    Running {
        attempt: u32,
        leases: Vec<LeaseId>,
    },
    Succeeded,
    Failed(JobFailure),
    Cancelled,
    /// Its attempt's leases exist, but not every host reported its
    /// workload `running` yet (the bundle is fetched, the container starts);
    /// `running` once every one has. Shown, never held: the market holds
    /// such an attempt as `Running` (docs/jobs.md "A job's life").
    Starting {
        attempt: u32,
        leases: Vec<LeaseId>,
    },
}

impl JobState {
    pub fn is_over(&self) -> bool {
        matches!(self, JobState::Succeeded | JobState::Failed(_) | JobState::Cancelled)
    }
}

/// A job as `job_status`, `jobs` and the `job` push show it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct JobInfo {
    pub job: JobId,
    pub name: String,
    pub instrument: InstrumentId,
    pub gpus: u32,
    pub state: JobState,
    /// Attempts started so far (bids placed).
    pub attempts: u32,
    pub retries: u32,
    /// Escrow its leases took so far, against `budget_minor`.
    pub escrowed_minor: u64,
    pub budget_minor: u64,
    /// Every lease it ran on, oldest first.
    pub leases: Vec<LeaseId>,
    pub submitted_at_ms: u64,
    /// When it entered its state.
    pub updated_at_ms: u64,
    pub run: JobRun,
    /// Restarts after its workload's errors: allowed, and used so far.
    #[serde(default)]
    pub restarts_on_error: u32,
    #[serde(default)]
    pub restarts: u32,
    #[serde(default)]
    pub alternatives: Vec<JobAlternative>,
    #[serde(default)]
    pub regions: Vec<String>,
    /// Its latest move to a new attempt: why, and the book it chose.
    #[serde(default)]
    pub last_move: Option<AttemptMove>,
    /// A preemption known to be coming to its running attempt.
    #[serde(default)]
    pub preemption_ahead: Option<PreemptionAhead>,
}

/// The job store's address and a host's bearer token for one attempt's
/// files, sent with its assignment so the host need not ask for it
/// (`job_store_token` gives the same).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct StoreGrant {
    pub url: String,
    pub token: String,
    pub expires_at_ms: u64,
}

/// Pushed to a job lease's host (like `workload` for a lease): the attempt
/// to run.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct JobAssignment {
    pub job: JobId,
    pub attempt: u32,
    /// The job's renter (its store prefix).
    pub renter: gpux_engine::AccountId,
    /// GPUs of the whole attempt and this host's rank among its hosts
    /// (0-based, in lease order), for multi-node jobs.
    pub world_gpus: u32,
    pub node_rank: u32,
    pub nodes: u32,
    pub run: JobRun,
    /// A cluster job's members by rank: where each listens (its host's
    /// fabric address and its port, docs/agent.md "Clusters"). Empty when
    /// the job is no cluster.
    #[serde(default)]
    pub peers: Vec<gpux_engine::MemberAddress>,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn submission() -> JobSubmission {
        JobSubmission {
            name: "train".into(),
            instrument: InstrumentId(0),
            gpus: 1,
            one_host: true,
            limit_minor_per_gpu_hour: 200,
            hours: 1,
            budget_minor: 1_000,
            retries: 3,
            min_supplier_score_bps: 0,
            verified_only: false,
            nodes: 0,
            min_fabric_gbps: 0,
            restarts_on_error: 2,
            alternatives: vec![JobAlternative { instrument: InstrumentId(2), limit_minor_per_gpu_hour: 300 }],
            regions: vec!["eu-west".into()],
            run: JobRun {
                image: "python:3.11".into(),
                command: vec!["python3".into(), "train.py".into()],
                bundle: Some(BundleRef { sha256: "ab".repeat(32), bytes: 10 }),
                install: vec!["numpy==1.26".into()],
                checkpoint_dir: "/checkpoints".into(),
                outputs_dir: "/outputs".into(),
                checkpoint_interval_s: 60,
                shm_mib: 0,
                inputs: vec![JobInput {
                    name: "data".into(),
                    mount: "/data".into(),
                    source: InputSource::Store { sha256: "cd".repeat(32), bytes: 100 },
                }],
            },
        }
    }

    #[test]
    fn each_bound_is_its_own_error() {
        assert_eq!(submission().validate(), Ok(()));
        type Breach = fn(&mut JobSubmission);
        let cases: Vec<(Breach, JobInvalid)> = vec![
            (|s| s.name = "a b".into(), JobInvalid::Name),
            (|s| s.gpus = 0, JobInvalid::Gpus),
            (|s| s.hours = limits::HOURS_MAX + 1, JobInvalid::Hours),
            (|s| s.retries = 101, JobInvalid::Retries),
            (|s| s.budget_minor = 0, JobInvalid::Price),
            (|s| s.min_supplier_score_bps = 10_001, JobInvalid::Score),
            (|s| s.run.image = "; rm -rf /".into(), JobInvalid::Image),
            (|s| s.run.command = vec![], JobInvalid::Command),
            (|s| s.run.command = vec!["a\0b".into()], JobInvalid::Command),
            (|s| s.run.command = vec!["x".repeat(4096); 3], JobInvalid::Command),
            (|s| s.run.bundle.as_mut().expect("a bundle").sha256 = "zz".into(), JobInvalid::Bundle),
            (|s| s.run.bundle.as_mut().expect("a bundle").bytes = limits::BUNDLE_BYTES_MAX + 1, JobInvalid::Bundle),
            (|s| s.run.install = vec!["numpy; rm".into()], JobInvalid::Install),
            (|s| s.run.checkpoint_dir = "relative".into(), JobInvalid::Directory),
            (|s| s.run.checkpoint_dir = "/a/../etc".into(), JobInvalid::Directory),
            (|s| s.run.outputs_dir = "/job/out".into(), JobInvalid::Directory),
            (|s| s.run.outputs_dir = "/checkpoints".into(), JobInvalid::Directory),
            (|s| s.run.checkpoint_interval_s = 9, JobInvalid::CheckpointInterval),
            (|s| s.run.shm_mib = u32::MAX, JobInvalid::Shm),
            (|s| s.run.inputs[0].mount = "/outputs".into(), JobInvalid::Input),
            (|s| s.run.inputs[0].name = "a/b".into(), JobInvalid::Input),
            (|s| s.run.inputs[0].source = InputSource::Https { url: "http://plain.example".into() }, JobInvalid::Input),
            (
                |s| s.run.inputs[0].source = InputSource::Store { sha256: "cd".repeat(32), bytes: limits::INPUT_BYTES_MAX + 1 },
                JobInvalid::Input,
            ),
            (|s| s.run.inputs.push(s.run.inputs[0].clone()), JobInvalid::Input),
            (|s| s.restarts_on_error = limits::RESTARTS_ON_ERROR_MAX + 1, JobInvalid::Restarts),
            (|s| s.alternatives[0].instrument = s.instrument, JobInvalid::Alternatives),
            (|s| s.alternatives[0].limit_minor_per_gpu_hour = 0, JobInvalid::Alternatives),
            (|s| s.alternatives.push(s.alternatives[0].clone()), JobInvalid::Alternatives),
            (|s| s.regions.push("eu-west".into()), JobInvalid::Regions),
            (|s| s.regions = vec![String::new()], JobInvalid::Regions),
        ];
        for (breach, expected) in cases {
            let mut bad = submission();
            breach(&mut bad);
            assert_eq!(bad.validate(), Err(expected), "{bad:?}");
        }
    }
}
