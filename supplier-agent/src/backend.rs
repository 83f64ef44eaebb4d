//! The GPU backend trait and its vendor-neutral readings. NVIDIA (NVML),
//! the vendor-tool backends (AMD, Huawei Ascend, Cambricon, Iluvatar: see
//! `vendor`) and the scripted fake all produce these, so nothing else in
//! the agent knows which vendor it runs on.

pub use crate::limits::{CPU_CHALLENGE_N_MAX, CPU_MEMORY_WORDS_LOG2_MAX, TEMPERATURE_MAX_C};
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
    /// (docs/agent.md "Hardware challenges"), the matrices drawn from
    /// `seed`, and commits to it by a Merkle root. The default computes on
    /// the host's CPU (what a backend without a GPU kernel can do; the rate
    /// measured is the host's), up to [`CPU_CHALLENGE_N_MAX`].
    fn challenge(&mut self, uuid: &str, seed: &[u8; 32], n: u32) -> Result<Box<dyn MerkleProof>, BackendError> {
        let _ = uuid;
        cpu_challenge_proof(seed, n)
    }

    /// Runs a memory-bandwidth challenge on the GPU `uuid` (docs/agent.md
    /// "Hardware challenges"): `passes` over `2^words_log2` words drawn from
    /// `seed`, committed to by a Merkle root. The default computes on the
    /// host's CPU (what a backend without a GPU kernel can do; its
    /// bandwidth is the host's), up to [`CPU_MEMORY_WORDS_LOG2_MAX`].
    fn memory_challenge(
        &mut self,
        uuid: &str,
        seed: &[u8; 32],
        words_log2: u32,
        passes: u32,
    ) -> Result<Box<dyn MerkleProof>, BackendError> {
        let _ = uuid;
        cpu_memory_proof(seed, words_log2, passes)
    }
}

/// A challenge's result (the product, or the memory buffer), committed:
/// the root, and the leaves the exchange names opened with their paths. A
/// GPU backend keeps the buffer and the tree on the GPU until it is
/// dropped.
pub trait MerkleProof: Send {
    fn root(&self) -> [u8; 32];
    fn open(&mut self, leaves: &[u32]) -> Result<Vec<gpux_protocol::memory::LeafOpening>, BackendError>;
}

impl MerkleProof for gpux_protocol::memory::CpuProof {
    fn root(&self) -> [u8; 32] {
        gpux_protocol::memory::CpuProof::root(self)
    }

    fn open(&mut self, leaves: &[u32]) -> Result<Vec<gpux_protocol::memory::LeafOpening>, BackendError> {
        Ok(gpux_protocol::memory::CpuProof::open(self, leaves))
    }
}

/// The compute challenge computed on the host's CPU.
pub fn cpu_challenge_proof(seed: &[u8; 32], n: u32) -> Result<Box<dyn MerkleProof>, BackendError> {
    if n > CPU_CHALLENGE_N_MAX {
        return Err(BackendError::Query {
            what: "hardware challenge".into(),
            detail: format!("n = {n} is more than the CPU answers ({CPU_CHALLENGE_N_MAX}); this backend has no GPU kernel"),
        });
    }
    Ok(Box::new(gpux_protocol::challenge::cpu_proof(seed, n)))
}

/// The memory challenge computed on the host's CPU.
pub fn cpu_memory_proof(seed: &[u8; 32], words_log2: u32, passes: u32) -> Result<Box<dyn MerkleProof>, BackendError> {
    if words_log2 > CPU_MEMORY_WORDS_LOG2_MAX {
        return Err(BackendError::Query {
            what: "memory challenge".into(),
            detail: format!(
                "2^{words_log2} words is more than the CPU answers (2^{CPU_MEMORY_WORDS_LOG2_MAX}); this backend has no GPU kernel"
            ),
        });
    }
    let words = gpux_protocol::memory::Params::new(seed, words_log2, passes).compute();
    Ok(Box::new(gpux_protocol::memory::CpuProof::new(words)))
}
