//! GPU probe observations: what the renter's probe, running inside the
//! lease's own container (`gpux-probe`, docs/agent.md "The renter's GPU
//! probe"), saw of the leased GPUs over one interval, signed with a key the
//! renter made for it (docs/protocol.md "GPU probe", docs/market-rules.md
//! "Disputes"). The signed bytes are `gpux-gpu-probe-v1:` followed by the
//! bincode encoding of the body, as for usage reports and liveness
//! observations. The renter's session sends them; the exchange pins a
//! lease's first probe key, so a lease's observations are one probe's.

use ed25519_dalek::{SigningKey, VerifyingKey};
use gpux_engine::LeaseId;
use serde::{Deserialize, Serialize};

use crate::signed::{sign_hex, verify_hex, SignedItem};

pub const GPU_PROBE_DOMAIN: &[u8] = b"gpux-gpu-probe-v1:";

/// The longest interval one observation may cover.
pub const GPU_PROBE_INTERVAL_MS_MAX: u64 = 3_600_000;
/// The most GPUs one observation names (a host's most).
pub const GPU_PROBE_GPUS_MAX: usize = 64;
/// The longest GPU identifier an observation may carry.
pub const GPU_PROBE_UUID_BYTES_MAX: usize = 128;

/// One leased GPU as the probe saw it over the interval.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProbeGpu {
    /// The GPU the host says it delivered (the container's `GPUX_GPUS`).
    pub uuid: String,
    /// Of the interval's samples, how many found the GPU in the container.
    pub present_samples: u32,
    /// Its mean utilisation over the samples that found it, percent.
    pub utilisation_percent_mean: u32,
    /// The most memory in use at any sample, MiB.
    pub memory_used_mib_max: u32,
}

/// The signed part of an observation.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct GpuProbeBody {
    pub lease: LeaseId,
    /// The interval `[start_ms, end_ms)` observed (the container's clock).
    pub start_ms: u64,
    pub end_ms: u64,
    /// How many times the probe looked in the interval (at least 1).
    pub samples: u32,
    /// Every GPU of the lease.
    pub gpus: Vec<ProbeGpu>,
}

impl GpuProbeBody {
    /// Whether the figures are in range: an interval of at most an hour,
    /// 1 to 64 GPUs named once each, samples that add up, utilisation a
    /// percentage.
    pub fn is_valid(&self) -> bool {
        let names_unique = self.gpus.iter().enumerate().all(|(i, g)| self.gpus[..i].iter().all(|h| h.uuid != g.uuid));
        self.start_ms < self.end_ms
            && self.end_ms - self.start_ms <= GPU_PROBE_INTERVAL_MS_MAX
            && self.samples >= 1
            && !self.gpus.is_empty()
            && self.gpus.len() <= GPU_PROBE_GPUS_MAX
            && names_unique
            && self.gpus.iter().all(|g| {
                !g.uuid.is_empty()
                    && g.uuid.len() <= GPU_PROBE_UUID_BYTES_MAX
                    && g.present_samples <= self.samples
                    && g.utilisation_percent_mean <= 100
            })
    }

    /// The GPUs no sample of the interval found: the probe's signed word
    /// that they were absent throughout.
    pub fn absent(&self) -> impl Iterator<Item = &str> {
        self.gpus.iter().filter(|g| g.present_samples == 0).map(|g| g.uuid.as_str())
    }
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct GpuProbeReport {
    pub body: GpuProbeBody,
    /// Hex of the probe's ed25519 public key (32 bytes).
    pub probe_key: String,
    /// Hex ed25519 signature by the probe's key.
    pub signature: String,
}

impl GpuProbeReport {
    pub fn sign(body: GpuProbeBody, key: &SigningKey) -> GpuProbeReport {
        let signature = sign_hex(GPU_PROBE_DOMAIN, &body, key);
        GpuProbeReport { body, probe_key: hex::encode(key.verifying_key().to_bytes()), signature }
    }

    /// The probe's public key, if `probe_key` is 32 hex-encoded bytes.
    pub fn key(&self) -> Option<[u8; 32]> {
        hex::decode(&self.probe_key).ok().and_then(|b| <[u8; 32]>::try_from(b).ok())
    }

    /// Whether the signature is the probe key's.
    pub fn verify(&self) -> bool {
        self.key()
            .and_then(|key| VerifyingKey::from_bytes(&key).ok())
            .is_some_and(|key| verify_hex(GPU_PROBE_DOMAIN, &self.body, &self.signature, &key))
    }

    /// The observation's signature as one of a batch
    /// ([`crate::verify_signed_batch_zip215`]), against the probe's key;
    /// `None` when `probe_key` is no key.
    pub fn signed_item(&self) -> Option<SignedItem<'_>> {
        Some(SignedItem::new(GPU_PROBE_DOMAIN, &self.body, &self.signature, self.key()?))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn body() -> GpuProbeBody {
        GpuProbeBody {
            lease: LeaseId(3),
            start_ms: 1_000,
            end_ms: 61_000,
            samples: 6,
            gpus: vec![
                ProbeGpu { uuid: "GPU-a".into(), present_samples: 6, utilisation_percent_mean: 97, memory_used_mib_max: 70_000 },
                ProbeGpu { uuid: "GPU-b".into(), present_samples: 0, utilisation_percent_mean: 0, memory_used_mib_max: 0 },
            ],
        }
    }

    #[test]
    fn an_observation_verifies_under_its_own_key_only_and_unaltered() {
        let key = SigningKey::from_bytes(&[9; 32]);
        let report = GpuProbeReport::sign(body(), &key);
        assert!(report.verify());
        assert_eq!(report.key(), Some(key.verifying_key().to_bytes()));
        let mut altered = report.clone();
        altered.body.gpus[1].present_samples = 6;
        assert!(!altered.verify(), "an altered body");
        let other =
            GpuProbeReport { probe_key: hex::encode(SigningKey::from_bytes(&[8; 32]).verifying_key().to_bytes()), ..report.clone() };
        assert!(!other.verify(), "another key");
        assert!(!GpuProbeReport { probe_key: "zz".into(), ..report }.verify(), "a key that is not hex");
    }

    #[test]
    fn only_figures_in_range_are_valid_and_absent_means_no_sample_found_it() {
        assert!(body().is_valid());
        assert_eq!(body().absent().collect::<Vec<_>>(), ["GPU-b"]);
        let cases: [fn(&mut GpuProbeBody); 8] = [
            |b| b.end_ms = b.start_ms,
            |b| b.end_ms = b.start_ms + GPU_PROBE_INTERVAL_MS_MAX + 1,
            |b| b.samples = 0,
            |b| b.gpus.clear(),
            |b| b.gpus[1].uuid = "GPU-a".into(),
            |b| b.gpus[0].present_samples = 7,
            |b| b.gpus[0].utilisation_percent_mean = 101,
            |b| b.gpus[0].uuid = "x".repeat(GPU_PROBE_UUID_BYTES_MAX + 1),
        ];
        for (i, break_it) in cases.iter().enumerate() {
            let mut b = body();
            break_it(&mut b);
            assert!(!b.is_valid(), "case {i}");
        }
    }
}
