//! What the agent knows of its host: the GPUs the exchange registered for
//! it (with their health and the samples since their last report), the
//! leases on them, and the GPUs sold per reserved window.

use std::collections::BTreeMap;

use gpux_engine::{InstrumentId, LeaseId, LeaseKind};

use crate::backend::GpuBackend;
use crate::config::OfferedContract;
use crate::delivery::LeasedGpu;

/// What the agent knows about one of its GPUs.
pub(super) struct HostGpu {
    pub(super) info: gpux_protocol::views::Gpu,
    pub(super) healthy: bool,
    /// The delivery failed for this GPU's lease on the host's side: it
    /// counts as unavailable (reported so, hence not billed) until a health
    /// check passes.
    pub(super) delivery_failed: bool,
    /// Samples since this GPU's last report.
    pub(super) window: Window,
    /// Since when (this host's clock) its samples read it unhealthy.
    pub(super) unhealthy_since: Option<u64>,
}

impl HostGpu {
    pub(super) fn bit(&self) -> u64 {
        1u64 << self.info.index_on_host
    }
}

/// The samples of one GPU since its last report.
#[derive(Clone, Copy, Default)]
pub(super) struct Window {
    pub(super) samples: u32,
    pub(super) unhealthy: u32,
    pub(super) utilisation_sum: u64,
    pub(super) memory_used_mib_max: u32,
    /// The highest temperature read, and power summed over the samples
    /// that read it (mW) with their count, for the report's readings.
    pub(super) temperature_c_max: Option<u32>,
    pub(super) power_mw_sum: u64,
    pub(super) power_samples: u32,
}

/// A lease on this host, as the agent follows it.
#[derive(Clone, Copy, Debug)]
pub(super) struct LeaseState {
    pub(super) kind: LeaseKind,
    pub(super) gpu_mask: u64,
    pub(super) start_ms: u64,
    /// The scheduled end, or the actual end once it ended.
    pub(super) end_ms: Option<u64>,
    pub(super) ended: bool,
    pub(super) billing: Billing,
}

/// How a lease's usage reports count its time (docs/market-rules.md,
/// "Delivery failures"): a delivery the host fails is not billed at all, so
/// the reports of a delivery under way wait until its outcome is known.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Billing {
    /// Reports carry the available time the samples show.
    AsMeasured,
    /// A workload is being delivered: no report until it runs or fails
    /// (or the lease ends); the samples keep accumulating.
    DeliveryPending,
    /// The host failed the delivery: every report carries no available time.
    HostFailed,
}

/// The host's GPUs and leases.
#[derive(Default)]
pub(super) struct Host {
    pub(super) gpus: Vec<HostGpu>,
    pub(super) leases: BTreeMap<LeaseId, LeaseState>,
    /// GPUs (as a host mask) sold as contracts, per reserved window.
    pub(super) windows_sold: BTreeMap<InstrumentId, u64>,
}

impl Host {
    /// The exchange's id of this host, once a GPU of it is registered.
    pub(super) fn id(&self) -> Option<gpux_engine::HostId> {
        self.gpus.first().map(|gpu| gpu.info.host)
    }

    /// The GPUs in a mask over the host.
    pub(super) fn in_mask(&self, mask: u64) -> impl Iterator<Item = &HostGpu> {
        self.gpus.iter().filter(move |gpu| mask & gpu.bit() != 0)
    }

    /// The mask of the GPUs with these exchange ids.
    pub(super) fn mask_of(&self, gpus: &[gpux_engine::GpuId]) -> u64 {
        gpus.iter().filter_map(|id| self.gpus.iter().find(|g| g.info.gpu == *id)).fold(0, |mask, gpu| mask | gpu.bit())
    }

    /// The mask of the GPUs with these UUIDs.
    pub(super) fn mask_of_uuids(&self, uuids: &[String]) -> u64 {
        self.gpus.iter().filter(|g| uuids.contains(&g.info.uuid)).fold(0, |mask, gpu| mask | gpu.bit())
    }

    pub(super) fn healthy_mask(&self) -> u64 {
        self.gpus.iter().filter(|g| g.healthy).fold(0, |mask, gpu| mask | gpu.bit())
    }

    /// The GPUs held by leases that have not ended and that a lease of
    /// `contract` cannot share (an exclusive lease takes its GPUs out of
    /// every contract, a preemptible one out of the preemptible ask only).
    pub(super) fn busy_mask(&self, contract: OfferedContract) -> u64 {
        self.leases
            .values()
            .filter(|lease| !lease.ended && (contract == OfferedContract::Preemptible || lease.kind != LeaseKind::Preemptible))
            .fold(0, |mask, lease| mask | lease.gpu_mask)
    }

    /// The classes this host's GPUs are offered in: each GPU in its own
    /// (the first it qualifies for), so a host with mixed models or MIG
    /// profiles sells each kind in its own book.
    pub(super) fn classes(&self) -> Vec<String> {
        let mut classes: Vec<String> = Vec::new();
        for class in self.gpus.iter().filter_map(|g| g.info.classes.first()) {
            if !classes.contains(class) {
                classes.push(class.clone());
            }
        }
        classes
    }

    /// The GPUs offered in `class`, as a mask over the host.
    pub(super) fn class_mask(&self, class: &str) -> u64 {
        self.gpus.iter().filter(|g| g.info.classes.first().is_some_and(|c| c == class)).fold(0, |mask, gpu| mask | gpu.bit())
    }

    /// The host's GPUs in a lease's mask, as the delivery backends take them.
    pub(super) fn leased_gpus(&self, gpu_mask: u64) -> Vec<LeasedGpu> {
        self.in_mask(gpu_mask).map(|g| LeasedGpu { uuid: g.info.uuid.clone(), index_on_host: g.info.index_on_host }).collect()
    }

    /// A lease of this host began: followed for its reports; samples taken
    /// before it say nothing about it.
    pub(super) fn lease_started(&mut self, lease: LeaseId, state: LeaseState) {
        for gpu in self.gpus.iter_mut().filter(|g| state.gpu_mask & g.bit() != 0) {
            gpu.window = Window::default();
        }
        self.leases.insert(lease, state);
    }

    /// Reads the GPUs; returns those whose health changed.
    pub(super) fn sample(&mut self, backend: &mut dyn GpuBackend, now_ms: u64) -> anyhow::Result<Vec<(gpux_engine::GpuId, bool)>> {
        let samples = backend.sample(now_ms)?;
        let leased = self.leases.values().filter(|l| !l.ended).fold(0u64, |mask, l| mask | l.gpu_mask);
        let mut changed = Vec::new();
        for mut sample in samples {
            let Some(gpu) = self.gpus.iter_mut().find(|g| g.info.uuid == sample.uuid) else { continue };
            // A GPU running the owner's own work while nobody leases it is
            // taken locally: not for sale until it is free again.
            if sample.processes > 0 && leased & gpu.bit() == 0 {
                sample.healthy = false;
            }
            if gpu.delivery_failed {
                sample.healthy = false;
            }
            gpu.window.samples += 1;
            gpu.window.unhealthy += u32::from(!sample.healthy);
            gpu.window.utilisation_sum += sample.utilisation_percent as u64;
            gpu.window.memory_used_mib_max = gpu.window.memory_used_mib_max.max(sample.memory_used_mib);
            if let Some(temperature) = sample.temperature_c {
                gpu.window.temperature_c_max = Some(gpu.window.temperature_c_max.map_or(temperature, |max| max.max(temperature)));
            }
            if let Some(power) = sample.power_mw {
                gpu.window.power_mw_sum += power as u64;
                gpu.window.power_samples += 1;
            }
            // Lost when the GPU itself reads unhealthy (not when the agent
            // holds it back after a failed delivery).
            gpu.unhealthy_since = match (sample.healthy || gpu.delivery_failed, gpu.unhealthy_since) {
                (true, _) => None,
                (false, since) => since.or(Some(now_ms)),
            };
            if gpu.healthy != sample.healthy {
                gpu.healthy = sample.healthy;
                tracing::warn!(uuid = %sample.uuid, healthy = sample.healthy, "GPU health changed");
                changed.push((gpu.info.gpu, sample.healthy));
            }
        }
        Ok(changed)
    }

    /// The delivery could not hand these GPUs over: they count as
    /// unavailable until a health check passes, so the exchange takes them
    /// off the books and the usage reports carry no available time; those
    /// that were healthy (to be set offline at the exchange).
    pub(super) fn fail_delivery(&mut self, mask: u64) -> Vec<gpux_engine::GpuId> {
        let mut failed = Vec::new();
        for gpu in self.gpus.iter_mut().filter(|g| mask & g.bit() != 0) {
            gpu.delivery_failed = true;
            if gpu.healthy {
                gpu.healthy = false;
                failed.push(gpu.info.gpu);
            }
        }
        failed
    }

    /// The leases with a GPU unhealthy for `lost_after_ms` that the host
    /// has not failed yet, each with the lost GPUs' UUIDs.
    pub(super) fn lost_leases(&self, lost_after_ms: u64, now_ms: u64) -> Vec<(LeaseId, Vec<String>)> {
        let lost_mask = self
            .gpus
            .iter()
            .filter(|g| g.unhealthy_since.is_some_and(|since| now_ms.saturating_sub(since) >= lost_after_ms))
            .fold(0u64, |mask, gpu| mask | gpu.bit());
        if lost_mask == 0 {
            return Vec::new();
        }
        self.leases
            .iter()
            .filter(|(_, l)| !l.ended && l.billing != Billing::HostFailed && l.gpu_mask & lost_mask != 0)
            .map(|(&lease, l)| (lease, self.in_mask(l.gpu_mask & lost_mask).map(|g| g.info.uuid.clone()).collect()))
            .collect()
    }

    pub(super) fn log_lease_event(&self, event: &str, lease: LeaseId, mask: u64, until_ms: Option<u64>) {
        let uuids: Vec<&str> = self.in_mask(mask).map(|g| g.info.uuid.as_str()).collect();
        let until = until_ms.map_or("-".to_string(), |ms| ms.to_string());
        tracing::info!(event, %lease, gpus = %uuids.join(","), %until, "lease event");
    }
}
