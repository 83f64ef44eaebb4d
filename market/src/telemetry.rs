//! Leases' recent telemetry (docs/protocol.md "Lease telemetry"): what each
//! accepted usage report measured of its GPU, the latest
//! [`TELEMETRY_SAMPLES_MAX`] per leased GPU, kept while the lease is in the
//! hot state. Derived from journaled reports only, so replay rebuilds it.

use std::collections::{BTreeMap, VecDeque};

use gpux_engine::LeaseId;
use gpux_protocol::{GpuTelemetry, TelemetrySample, UsageBody};
use serde::{Deserialize, Serialize};

/// Samples kept per leased GPU: two hours at the agent's one-minute reports.
pub const TELEMETRY_SAMPLES_MAX: usize = 120;

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Telemetry {
    /// Per lease, per GPU (by UUID; settlement accepts reports only for the
    /// lease's own GPUs, so at most its GPUs), the latest samples.
    leases: BTreeMap<LeaseId, BTreeMap<String, VecDeque<TelemetrySample>>>,
}

impl Telemetry {
    /// An accepted report's measurements.
    pub fn record(&mut self, body: &UsageBody) {
        let samples = self.leases.entry(body.lease).or_default().entry(body.gpu_uuid.clone()).or_default();
        if samples.len() == TELEMETRY_SAMPLES_MAX {
            samples.pop_front();
        }
        samples.push_back(TelemetrySample::from(body));
    }

    /// A lease's GPUs and their samples, oldest first (GPUs in UUID order).
    pub fn lease(&self, lease: LeaseId) -> Vec<GpuTelemetry> {
        self.leases
            .get(&lease)
            .map(|gpus| {
                gpus.iter()
                    .map(|(uuid, samples)| GpuTelemetry { gpu_uuid: uuid.clone(), samples: samples.iter().cloned().collect() })
                    .collect()
            })
            .unwrap_or_default()
    }

    /// The lease left the hot state.
    pub fn forget_lease(&mut self, lease: LeaseId) {
        self.leases.remove(&lease);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn body(lease: u64, gpu: &str, seq: u32) -> UsageBody {
        UsageBody {
            lease: LeaseId(lease),
            gpu_uuid: gpu.into(),
            seq,
            start_ms: seq as u64 * 60_000,
            end_ms: (seq as u64 + 1) * 60_000,
            available_ms: 60_000,
            utilisation_percent: seq % 100,
            memory_used_mib_max: 1_000 + seq,
            unhealthy_samples: 0,
            prev_hash: gpux_protocol::genesis_hash(),
            readings: None,
        }
    }

    #[test]
    fn each_gpu_keeps_its_latest_samples_and_a_forgotten_lease_none() {
        let mut telemetry = Telemetry::default();
        for seq in 1..=TELEMETRY_SAMPLES_MAX as u32 + 5 {
            telemetry.record(&body(1, "GPU-b", seq));
        }
        telemetry.record(&body(1, "GPU-a", 1));
        telemetry.record(&body(2, "GPU-c", 1));
        let gpus = telemetry.lease(LeaseId(1));
        assert_eq!(gpus.iter().map(|g| g.gpu_uuid.as_str()).collect::<Vec<_>>(), ["GPU-a", "GPU-b"]);
        let kept = &gpus[1].samples;
        assert_eq!(kept.len(), TELEMETRY_SAMPLES_MAX, "bounded");
        assert_eq!((kept[0].start_ms, kept.last().map(|s| s.utilisation_percent)), (6 * 60_000, Some(25)), "the latest, oldest first");
        telemetry.forget_lease(LeaseId(1));
        assert!(telemetry.lease(LeaseId(1)).is_empty());
        assert_eq!(telemetry.lease(LeaseId(2)).len(), 1);
    }
}
