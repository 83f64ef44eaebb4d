//! Every bound of the supplier agent in one place, with the relations the
//! code relies on asserted at compile time (engine/src/limits.rs's style);
//! the modules re-export what they use.

use std::time::Duration;

// Usage reports (reports.rs).
/// Unacknowledged reports kept at most (about a day of 10 s reports for 8 GPUs).
pub const PENDING_REPORTS_MAX: usize = 100_000;

// The session with the exchange (session/).
/// How long a login waits for the delivery manager's listing of the host's
/// workloads before going on without offers (they follow the listing).
pub const RECONCILE_WAIT: Duration = Duration::from_secs(10);
/// The longest wait between health checks after a host failure.
pub const HEALTH_BACKOFF_MAX: Duration = Duration::from_secs(3600);
/// Reconnect back-off bounds.
pub const BACKOFF_MIN: Duration = Duration::from_millis(500);
pub const BACKOFF_MAX: Duration = Duration::from_secs(30);
/// How long a GPU refused `gpus_awaiting_challenge` waits before the agent
/// registers it again (the account's earlier GPUs prove themselves at
/// their first hardware challenge, issued right after registration).
pub const REGISTER_AGAIN_AFTER: Duration = Duration::from_secs(60);
/// An interconnect probe's members must all be reached, and the ring run,
/// within this of its attempt's delivery.
pub const PROBE_DEADLINE: Duration = Duration::from_secs(120);
/// Hosts of one account whose asks' client order ids never meet: each
/// host's ids are its own residue modulo this.
pub const CLIENT_ORDER_ID_STRIDE: u64 = 1 << 16;
/// How often the agent measures the exchange's clock again during a session
/// (a login measures it too).
pub const CLOCK_SYNC_EVERY: Duration = Duration::from_secs(600);
/// A change of the offset larger than this is logged.
pub const CLOCK_DRIFT_NOTED_MS: i64 = 250;

// Delivery (delivery/mod.rs).
/// How often running workloads are checked for exits.
pub const POLL_EVERY: Duration = Duration::from_secs(1);
/// How often a started workload not yet `running` is checked (and probed).
pub const SETTLE_POLL_EVERY: Duration = Duration::from_millis(100);
/// Attempts at looking up a lease's workload before re-adoption gives up
/// (waiting 1 s, 2 s, ... between them: under a minute in all).
pub const FIND_ATTEMPTS: u32 = 10;
/// Retries of a removal the engine did not confirm: from 1 s, doubling, to 30 s apart.
pub const REMOVE_RETRY_MIN: Duration = Duration::from_secs(1);
pub const REMOVE_RETRY_MAX: Duration = Duration::from_secs(30);

// Jobs' transfers (delivery/jobs.rs).
/// The bundle and restore downloads, and each sync, must be over within this.
pub const TRANSFER_TIMEOUT: Duration = Duration::from_secs(600);
/// Files of one job directory synced at most (the store keeps 10 000 per account).
pub const FILES_MAX: usize = 5_000;

// Hardware (backend.rs, vendor/).
/// The largest compute challenge the CPU answers: `n = 1024` (2.1 GFLOP,
/// seconds of one core). A larger one is a GPU's to answer.
pub const CPU_CHALLENGE_N_MAX: u32 = 1024;
/// The largest memory challenge the CPU answers: 2^26 words (256 MiB, twice
/// that while the passes run). A larger one is a GPU's to answer.
pub const CPU_MEMORY_WORDS_LOG2_MAX: u32 = 26;
/// A GPU hotter than this is reported unhealthy.
pub const TEMPERATURE_MAX_C: u32 = 90;
/// The hotspot (junction) sensor runs well above the edge sensor; AMD's
/// Instinct parts throttle near 100 C there.
pub const HOTSPOT_MAX_C: u32 = 105;

// Interconnect probes (probe.rs).
/// A member's probe listens this far above the port its cluster peers
/// reach it on (member ports are `port_base` to `port_base + 63`).
pub const PROBE_PORT_OFFSET: u16 = 64;

// The relations the bounds rely on.
const _: () = assert!(BACKOFF_MIN.as_millis() < BACKOFF_MAX.as_millis() && BACKOFF_MAX.as_secs() <= HEALTH_BACKOFF_MAX.as_secs());
const _: () = assert!(REMOVE_RETRY_MIN.as_millis() <= REMOVE_RETRY_MAX.as_millis());
const _: () =
    assert!(SETTLE_POLL_EVERY.as_millis() < POLL_EVERY.as_millis(), "a settling workload is looked at more often than a running one");
const _: () = assert!(FIND_ATTEMPTS * (FIND_ATTEMPTS + 1) / 2 < 60, "re-adoption gives up within a minute");
const _: () = assert!(PENDING_REPORTS_MAX >= 8 * 24 * 360, "a day of 10 s reports of 8 GPUs waits for the exchange");
const _: () = assert!(
    CPU_CHALLENGE_N_MAX.is_power_of_two()
        && CPU_CHALLENGE_N_MAX >= gpux_engine::limits::CHALLENGE_N_MIN
        && CPU_CHALLENGE_N_MAX <= gpux_engine::limits::CHALLENGE_N_MAX,
    "the CPU answers the smallest challenges a class may ask"
);
const _: () = assert!(
    CPU_MEMORY_WORDS_LOG2_MAX >= gpux_engine::limits::MEMORY_WORDS_LOG2_MIN
        && CPU_MEMORY_WORDS_LOG2_MAX <= gpux_engine::limits::MEMORY_WORDS_LOG2_MAX
);
const _: () = assert!(TEMPERATURE_MAX_C < HOTSPOT_MAX_C, "the hotspot sensor reads above the edge sensor");
const _: () = assert!(CLIENT_ORDER_ID_STRIDE.is_power_of_two());
const _: () = assert!(
    PROBE_PORT_OFFSET as u32 >= gpux_engine::limits::CLUSTER_NODES_MAX,
    "a probe's port never meets a member's: members use port_base to port_base + 63"
);

/// The tail of an ended workload's output the agent keeps (and, for a
/// job, puts in the job store beside its outputs): `gpux lease logs` and
/// `gpux job logs` work after the end (docs/agent.md "Logs").
pub const KEPT_LOG_BYTES: u32 = 64 * 1024;
/// Ended leases whose tail the agent keeps in memory (the oldest forgotten first).
pub const KEPT_LOGS_MAX: usize = 256;
/// How long the agent reads a workload's output for one logs request.
pub const LOGS_READ_MAX: Duration = Duration::from_secs(10);
