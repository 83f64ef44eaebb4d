//! The scripted fake backend: a host described in JSON (its GPUs, and faults
//! over time), for tests and demos on machines without a GPU.
//!
//! ```json
//! {"gpus": [{"uuid": "GPU-a", "vendor": "nvidia", "model": "NVIDIA H100 80GB HBM3",
//!            "memory_mib": 81559, "interconnect": "nv_link"}],
//!  "utilisation_percent": 85,
//!  "faults": [{"gpu": "GPU-a", "from_ms": 5000, "until_ms": 9000, "kind": "offline"}]}
//! ```
//! Fault times are milliseconds after the backend was created.

use std::path::Path;

use gpux_engine::{GpuSpec, Interconnect, Vendor};
use serde::Deserialize;

use crate::backend::{BackendError, GpuBackend, GpuInventory, GpuSample, TEMPERATURE_MAX_C};

#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FakeGpu {
    pub uuid: String,
    pub vendor: Vendor,
    pub model: String,
    pub memory_mib: u32,
    pub interconnect: Interconnect,
    #[serde(default)]
    pub mig_profile: Option<String>,
    /// A cheating GPU for tests and demos: answers hardware challenges with
    /// a wrong product (`wrong`), or this many milliseconds late (`slow`:
    /// a slower GPU than the model it claims).
    #[serde(default)]
    pub challenge_wrong: bool,
    #[serde(default)]
    pub challenge_delay_ms: u64,
    /// The same for the memory-bandwidth challenge: a buffer one pass
    /// short (`memory_wrong`: plausible, committed, but wrong), or an
    /// answer this many milliseconds late (`memory_delay_ms`: slower
    /// memory than the model it claims).
    #[serde(default)]
    pub memory_wrong: bool,
    #[serde(default)]
    pub memory_delay_ms: u64,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FaultKind {
    /// The GPU does not answer.
    Offline,
    /// It answers but runs too hot.
    Overheat,
    /// New uncorrected memory errors.
    Ecc,
    /// The owner runs a job of their own on it.
    Busy,
}

#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Fault {
    pub gpu: String,
    pub from_ms: u64,
    pub until_ms: u64,
    pub kind: FaultKind,
}

#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FakeHost {
    pub gpus: Vec<FakeGpu>,
    #[serde(default)]
    pub utilisation_percent: u32,
    #[serde(default)]
    pub faults: Vec<Fault>,
}

pub struct FakeBackend {
    host: FakeHost,
    started_ms: Option<u64>,
}

impl FakeBackend {
    pub fn new(host: FakeHost) -> Result<Self, BackendError> {
        if host.gpus.is_empty() {
            return Err(BackendError::Description("the host description lists no GPU".into()));
        }
        for fault in &host.faults {
            if !host.gpus.iter().any(|gpu| gpu.uuid == fault.gpu) {
                return Err(BackendError::Description(format!("fault for unknown GPU {}", fault.gpu)));
            }
        }
        Ok(FakeBackend { host, started_ms: None })
    }

    pub fn from_file(path: &Path) -> Result<Self, BackendError> {
        let text = std::fs::read_to_string(path).map_err(|e| BackendError::Description(format!("reading {}: {e}", path.display())))?;
        let host: FakeHost = serde_json::from_str(&text).map_err(|e| BackendError::Description(format!("{}: {e}", path.display())))?;
        Self::new(host)
    }

    fn fault_at(&self, uuid: &str, elapsed_ms: u64) -> Option<FaultKind> {
        self.host.faults.iter().find(|f| f.gpu == uuid && (f.from_ms..f.until_ms).contains(&elapsed_ms)).map(|f| f.kind)
    }
}

impl GpuBackend for FakeBackend {
    fn inventory(&mut self) -> Result<Vec<GpuInventory>, BackendError> {
        Ok(self
            .host
            .gpus
            .iter()
            .map(|gpu| GpuInventory {
                uuid: gpu.uuid.clone(),
                spec: GpuSpec {
                    vendor: gpu.vendor,
                    model: gpu.model.clone(),
                    memory_mib: gpu.memory_mib,
                    interconnect: gpu.interconnect,
                    mig_profile: gpu.mig_profile.clone(),
                },
                parent_uuid: None,
                pci_bus_id: None,
                driver_version: Some("fake".into()),
                cuda_version: None,
                mig_enabled: gpu.mig_profile.is_some(),
            })
            .collect())
    }

    fn sample(&mut self, at_ms: u64) -> Result<Vec<GpuSample>, BackendError> {
        let started = *self.started_ms.get_or_insert(at_ms);
        let elapsed = at_ms.saturating_sub(started);
        Ok(self
            .host
            .gpus
            .iter()
            .map(|gpu| {
                let fault = self.fault_at(&gpu.uuid, elapsed);
                GpuSample {
                    uuid: gpu.uuid.clone(),
                    healthy: matches!(fault, None | Some(FaultKind::Busy)),
                    utilisation_percent: self.host.utilisation_percent,
                    memory_used_mib: gpu.memory_mib * self.host.utilisation_percent / 100,
                    temperature_c: Some(if fault == Some(FaultKind::Overheat) { TEMPERATURE_MAX_C + 5 } else { 60 }),
                    power_mw: Some(300_000),
                    ecc_uncorrected: Some(if fault == Some(FaultKind::Ecc) { 1 } else { 0 }),
                    processes: u32::from(fault == Some(FaultKind::Busy)),
                }
            })
            .collect())
    }

    /// Computes on the CPU, as an honest GPU would answer; a cheating GPU
    /// of the description answers late or wrong.
    fn challenge(&mut self, uuid: &str, seed: &[u8; 32], n: u32) -> Result<Box<dyn crate::backend::MerkleProof>, BackendError> {
        let gpu = self.described(uuid, "challenge")?;
        if n > crate::backend::CPU_CHALLENGE_N_MAX {
            return crate::backend::cpu_challenge_proof(seed, n);
        }
        let (a, b) = gpux_protocol::challenge::matrices(seed, n);
        let mut words = gpux_protocol::challenge::product(&a, &b, n);
        if gpu.challenge_wrong {
            // Plausible but wrong: every entry off by one.
            words.iter_mut().for_each(|word| *word = word.wrapping_add(1));
        }
        std::thread::sleep(std::time::Duration::from_millis(gpu.challenge_delay_ms));
        Ok(Box::new(gpux_protocol::memory::CpuProof::new(words)))
    }

    /// Computes on the CPU, as an honest GPU would answer; a cheating GPU
    /// of the description runs a pass short or answers late.
    fn memory_challenge(
        &mut self,
        uuid: &str,
        seed: &[u8; 32],
        words_log2: u32,
        passes: u32,
    ) -> Result<Box<dyn crate::backend::MerkleProof>, BackendError> {
        let gpu = self.described(uuid, "memory challenge")?;
        let passes = if gpu.memory_wrong { passes - 1 } else { passes };
        let proof = crate::backend::cpu_memory_proof(seed, words_log2, passes)?;
        std::thread::sleep(std::time::Duration::from_millis(gpu.memory_delay_ms));
        Ok(proof)
    }
}

impl FakeBackend {
    /// The described GPU `uuid`, for a challenge (`what`) asked of it.
    fn described(&self, uuid: &str, what: &str) -> Result<&FakeGpu, BackendError> {
        self.host
            .gpus
            .iter()
            .find(|g| g.uuid == uuid)
            .ok_or_else(|| BackendError::Query { what: what.into(), detail: format!("no GPU {uuid} on this host") })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn host(json: &str) -> Result<FakeBackend, BackendError> {
        let host: FakeHost = serde_json::from_str(json).map_err(|e| BackendError::Description(e.to_string()))?;
        FakeBackend::new(host)
    }

    #[test]
    fn faults_make_a_gpu_unhealthy_for_their_interval_only() {
        let mut backend = host(
            r#"{"gpus":[{"uuid":"GPU-a","vendor":"nvidia","model":"NVIDIA H100 80GB HBM3","memory_mib":81559,"interconnect":"nv_link"}],
                "faults":[{"gpu":"GPU-a","from_ms":1000,"until_ms":2000,"kind":"overheat"}]}"#,
        )
        .expect("valid host");
        assert_eq!(backend.inventory().expect("inventory")[0].spec, GpuSpec::h100_sxm());
        let healthy_at = |backend: &mut FakeBackend, at| backend.sample(at).expect("sample")[0].healthy;
        assert!(healthy_at(&mut backend, 10_000));
        assert!(!healthy_at(&mut backend, 11_500));
        assert!(healthy_at(&mut backend, 12_000));
    }

    #[test]
    fn the_fake_answers_challenges_right_unless_it_cheats() {
        let gpus = r#"{"gpus":[{"uuid":"GPU-a","vendor":"nvidia","model":"NVIDIA H100 80GB HBM3","memory_mib":81559,"interconnect":"nv_link"},
                              {"uuid":"GPU-b","vendor":"nvidia","model":"NVIDIA H100 80GB HBM3","memory_mib":81559,"interconnect":"nv_link","challenge_wrong":true}]}"#;
        let mut backend = host(gpus).expect("valid host");
        let (seed, open) = ([4u8; 32], [5u8; 32]);
        let leaves = gpux_protocol::challenge::leaves_to_open(&open, 32);
        let verify = |proof: &mut Box<dyn crate::backend::MerkleProof>| {
            let opened = proof.open(&leaves).expect("opens");
            gpux_protocol::challenge::verify_opening(&seed, 32, &proof.root(), &open, &opened)
        };
        assert_eq!(verify(&mut backend.challenge("GPU-a", &seed, 32).expect("answered")), Ok(()));
        assert!(verify(&mut backend.challenge("GPU-b", &seed, 32).expect("answered")).is_err());
        assert!(backend.challenge("GPU-z", &seed, 32).is_err(), "not a GPU of this host");
        assert!(backend.challenge("GPU-a", &seed, 2048).is_err(), "more than the CPU answers");
    }

    #[test]
    fn the_fake_answers_memory_challenges_right_unless_it_cheats() {
        let json = r#"{"gpus": [{"uuid":"GPU-a","vendor":"nvidia","model":"NVIDIA H100 80GB HBM3","memory_mib":81559,"interconnect":"nv_link"},
                              {"uuid":"GPU-b","vendor":"nvidia","model":"NVIDIA H100 80GB HBM3","memory_mib":81559,"interconnect":"nv_link","memory_wrong":true}]}"#;
        let mut backend = host(json).expect("valid");
        let (seed, open) = ([3u8; 32], [4u8; 32]);
        let leaves = gpux_protocol::memory::leaves_to_open(&open, 12);
        let verify = |proof: &mut Box<dyn crate::backend::MerkleProof>| {
            let opened = proof.open(&leaves).expect("opens");
            gpux_protocol::memory::verify_opening(&seed, 12, 3, &proof.root(), &open, &opened)
        };
        assert_eq!(verify(&mut backend.memory_challenge("GPU-a", &seed, 12, 3).expect("answered")), Ok(()));
        assert!(verify(&mut backend.memory_challenge("GPU-b", &seed, 12, 3).expect("answered")).is_err());
        assert!(backend.memory_challenge("GPU-z", &seed, 12, 3).is_err(), "not a GPU of this host");
        assert!(backend.memory_challenge("GPU-a", &seed, 30, 3).is_err(), "more than the CPU answers");
    }

    #[test]
    fn a_broken_host_description_is_refused_with_a_reason() {
        assert!(host(r#"{"gpus":[]}"#).is_err());
        assert!(host(r#"{"gpus":[{"uuid":"a"}]}"#).is_err(), "missing fields");
        let unknown = r#"{"gpus":[{"uuid":"a","vendor":"amd","model":"AMD Instinct MI300X","memory_mib":196592,"interconnect":"infinity_fabric"}],
                         "faults":[{"gpu":"b","from_ms":0,"until_ms":1,"kind":"ecc"}]}"#;
        assert!(host(unknown).is_err_and(|e| matches!(&e, BackendError::Description(text) if text.contains("unknown GPU b"))));
    }
}
