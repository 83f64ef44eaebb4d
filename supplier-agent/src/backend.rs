//! The GPU backend trait and its vendor-neutral readings. NVIDIA (NVML),
//! the vendor-tool backends (AMD, Huawei Ascend, Cambricon, Iluvatar: see
//! `vendor`) and the scripted fake all produce these, so nothing else in
//! the agent knows which vendor it runs on.

use gpux_engine::GpuSpec;

/// One GPU (or MIG slice) as the host describes it once.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GpuInventory {
    pub uuid: String,
    pub spec: GpuSpec,
    /// The physical GPU of a MIG slice.
    pub parent_uuid: Option<String>,
    pub pci_bus_id: Option<String>,
    pub driver_version: Option<String>,
    pub cuda_version: Option<String>,
    pub mig_enabled: bool,
}

/// A periodic reading of one GPU's health and use.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GpuSample {
    pub uuid: String,
    /// Reachable, not overheating, and no uncorrected ECC error in the
    /// volatile counter (since the driver last loaded: a reboot or driver
    /// reload clears it).
    pub healthy: bool,
    pub utilisation_percent: u32,
    pub memory_used_mib: u32,
    pub temperature_c: Option<u32>,
    pub power_mw: Option<u32>,
    pub ecc_uncorrected: Option<u64>,
    pub processes: u32,
}

/// Why a GPU backend could not answer.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BackendError {
    /// The vendor's library or driver is missing: the agent cannot start
    /// on this backend (the message says what to install or use instead).
    #[error("{0}")]
    Unavailable(String),
    /// A query to the GPUs failed; the next sample may succeed.
    #[error("{what}: {detail}")]
    Query { what: String, detail: String },
    /// The fake backend's host description is unusable.
    #[error("{0}")]
    Description(String),
}

/// A source of GPU readings. `at_ms` is the agent's clock, so scripted
/// backends can replay faults over time.
pub trait GpuBackend: Send {
    fn inventory(&mut self) -> Result<Vec<GpuInventory>, BackendError>;
    fn sample(&mut self, at_ms: u64) -> Result<Vec<GpuSample>, BackendError>;

    /// Computes a hardware challenge's product `A x B` on the GPU `uuid`
    /// (docs/agent.md "Hardware challenges"): the matrices come from
    /// `seed`, the rows are returned in order. The default computes on the
    /// host's CPU: no backend has a GPU kernel yet (docs/agent.md says what
    /// that means for the measured rate).
    fn challenge(&mut self, uuid: &str, seed: &[u8; 32], n: u32) -> Result<Vec<Vec<i32>>, BackendError> {
        let _ = uuid;
        let (a, b) = gpux_protocol::challenge::matrices(seed, n);
        Ok(gpux_protocol::challenge::product(&a, &b, n))
    }
}

/// A GPU hotter than this is reported unhealthy.
pub const TEMPERATURE_MAX_C: u32 = 90;
