//! The NVIDIA backend, through NVML (nvml-wrapper). NVML is loaded at run
//! time, so the agent builds and runs everywhere; without the library (no
//! NVIDIA driver) `NvmlBackend::open` fails with a message that says what to
//! do. MIG slices are listed as devices of their own, as the exchange sells them.

use gpux_engine::{GpuSpec, Interconnect, Vendor};
use nvml_wrapper::enum_wrappers::device::{EccCounter, MemoryError, TemperatureSensor};
use nvml_wrapper::{Device, Nvml};

use crate::backend::{BackendError, GpuBackend, GpuInventory, GpuSample, TEMPERATURE_MAX_C};

/// NVLink links probed per GPU (NVML's maximum).
const NVLINK_LINKS_MAX: u32 = 18;
const MIB: u64 = 1024 * 1024;

pub struct NvmlBackend {
    nvml: Nvml,
}

fn nvml_error(what: &str, error: impl std::fmt::Display) -> BackendError {
    BackendError::Query { what: format!("NVML {what}"), detail: error.to_string() }
}

impl NvmlBackend {
    pub fn open() -> Result<Self, BackendError> {
        let nvml = Nvml::init().map_err(|error| {
            BackendError::Unavailable(format!(
                "NVML is not available ({error}): install the NVIDIA driver (libnvidia-ml.so), or run with --fake <host.json> on a machine without NVIDIA GPUs"
            ))
        })?;
        Ok(NvmlBackend { nvml })
    }

    fn devices(&self) -> Result<Vec<(Device<'_>, Option<String>)>, BackendError> {
        let count = self.nvml.device_count().map_err(|e| nvml_error("device count", e))?;
        let mut devices = Vec::new();
        for index in 0..count {
            let device = self.nvml.device_by_index(index).map_err(|e| nvml_error("device handle", e))?;
            let mig_enabled = device.mig_mode().is_ok_and(|mode| mode.current == 1);
            if !mig_enabled {
                devices.push((device, None));
                continue;
            }
            // A GPU in MIG mode is sold as its slices, not whole.
            let parent = device.uuid().map_err(|e| nvml_error("uuid", e))?;
            let slots = device.mig_device_count().unwrap_or(0);
            for slot in 0..slots {
                if let Ok(slice) = device.mig_device_by_index(slot) {
                    devices.push((slice, Some(parent.clone())));
                }
            }
        }
        Ok(devices)
    }
}

/// `NVIDIA A100-SXM4-80GB MIG 1g.10gb` -> `1g.10gb`.
fn mig_profile(name: &str) -> Option<String> {
    name.split(" MIG ").nth(1).map(|profile| profile.trim().to_string())
}

/// Compute processes on a GPU other than this agent's own.
fn others(processes: &[nvml_wrapper::struct_wrappers::device::ProcessInfo]) -> u32 {
    processes.iter().filter(|process| process.pid != std::process::id()).count() as u32
}

fn has_active_nvlink(device: &Device<'_>) -> bool {
    (0..NVLINK_LINKS_MAX).any(|link| device.link_wrapper_for(link).is_active().unwrap_or(false))
}

impl GpuBackend for NvmlBackend {
    fn inventory(&mut self) -> Result<Vec<GpuInventory>, BackendError> {
        let driver_version = self.nvml.sys_driver_version().ok();
        let cuda_version = self.nvml.sys_cuda_driver_version().ok().map(|v| format!("{}.{}", v / 1000, (v % 1000) / 10));
        let mut inventory = Vec::new();
        for (device, parent_uuid) in self.devices()? {
            let name = device.name().map_err(|e| nvml_error("name", e))?;
            let memory = device.memory_info().map_err(|e| nvml_error("memory", e))?;
            let profile = parent_uuid.as_ref().and_then(|_| mig_profile(&name));
            // A slice is named after its parent model in the class requirement.
            let model = name.split(" MIG ").next().unwrap_or(&name).to_string();
            inventory.push(GpuInventory {
                uuid: device.uuid().map_err(|e| nvml_error("uuid", e))?,
                spec: GpuSpec {
                    vendor: Vendor::Nvidia,
                    model,
                    memory_mib: (memory.total / MIB) as u32,
                    interconnect: if has_active_nvlink(&device) { Interconnect::NvLink } else { Interconnect::Pcie },
                    mig_profile: profile,
                },
                mig_enabled: parent_uuid.is_some(),
                parent_uuid,
                pci_bus_id: device.pci_info().ok().map(|pci| pci.bus_id),
                driver_version: driver_version.clone(),
                cuda_version: cuda_version.clone(),
            });
        }
        // Before the GPUs register (and the exchange challenges them): the
        // challenges' CUDA setup, once per GPU and process.
        #[cfg(feature = "cuda")]
        for gpu in inventory.iter().filter(|gpu| gpu.parent_uuid.is_none()) {
            let started = std::time::Instant::now();
            match crate::cuda::self_check(&gpu.uuid) {
                Ok(()) => tracing::debug!(uuid = %gpu.uuid, elapsed = ?started.elapsed(), "ready for hardware challenges"),
                Err(error) => tracing::warn!(uuid = %gpu.uuid, %error, "hardware challenges will fail on this GPU"),
            }
        }
        Ok(inventory)
    }

    fn sample(&mut self, _at_ms: u64) -> Result<Vec<GpuSample>, BackendError> {
        let mut samples = Vec::new();
        for (device, _) in self.devices()? {
            let Ok(uuid) = device.uuid() else { continue };
            let memory = device.memory_info().ok();
            let temperature_c = device.temperature(TemperatureSensor::Gpu).ok();
            let ecc_uncorrected = device.total_ecc_errors(MemoryError::Uncorrected, EccCounter::Volatile).ok();
            samples.push(GpuSample {
                uuid,
                healthy: memory.is_some()
                    && temperature_c.is_none_or(|t| t <= TEMPERATURE_MAX_C)
                    && ecc_uncorrected.is_none_or(|errors| errors == 0),
                utilisation_percent: device.utilization_rates().map_or(0, |u| u.gpu),
                memory_used_mib: memory.map_or(0, |m| (m.used / MIB) as u32),
                temperature_c,
                power_mw: device.power_usage().ok(),
                ecc_uncorrected,
                // Not the agent itself: its hardware challenges run on the
                // GPU (feature `cuda`) and hold a CUDA context there, which
                // would read as the owner's own work and take the GPU off sale.
                processes: device.running_compute_processes().map_or(0, |p| others(&p)),
            });
        }
        Ok(samples)
    }

    /// With the `cuda` feature the product is computed on the GPU by cuBLAS;
    /// without it, on the host's CPU (the default), which no NVIDIA class's
    /// minimum rate expects.
    #[cfg(feature = "cuda")]
    fn challenge(&mut self, uuid: &str, seed: &[u8; 32], n: u32) -> Result<Box<dyn crate::backend::MerkleProof>, BackendError> {
        crate::cuda::self_check(uuid)?;
        Ok(Box::new(crate::cuda::product(uuid, seed, n)?))
    }

    /// With the `cuda` feature the memory passes, the leaf hashes and the
    /// Merkle tree run on the GPU (NVRTC-compiled kernels); without it, on
    /// the host's CPU up to its limit.
    #[cfg(feature = "cuda")]
    fn memory_challenge(
        &mut self,
        uuid: &str,
        seed: &[u8; 32],
        words_log2: u32,
        passes: u32,
    ) -> Result<Box<dyn crate::backend::MerkleProof>, BackendError> {
        crate::cuda::self_check(uuid)?;
        Ok(Box::new(crate::cuda::memory(uuid, seed, words_log2, passes)?))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mig_profiles_are_read_from_the_slice_name() {
        assert_eq!(mig_profile("NVIDIA H100 80GB HBM3 MIG 1g.10gb").as_deref(), Some("1g.10gb"));
        assert_eq!(mig_profile("NVIDIA H100 80GB HBM3"), None);
    }

    /// On a machine without the NVIDIA driver the backend refuses to start
    /// with a message that says what to do; with one, it lists the GPUs.
    #[test]
    fn opening_nvml_either_works_or_says_what_is_missing() {
        match NvmlBackend::open() {
            Ok(mut backend) => {
                let inventory = backend.inventory().expect("an initialised NVML lists devices");
                assert!(inventory.iter().all(|gpu| !gpu.uuid.is_empty()));
            }
            Err(error) => {
                assert!(matches!(&error, BackendError::Unavailable(text) if text.contains("install the NVIDIA driver")), "{error}")
            }
        }
    }
}
