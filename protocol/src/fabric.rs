//! Interconnect probes: what a cluster member's agent measured of its
//! cluster's fabric at delivery (a ring all-reduce among the members'
//! agents), signed with the supplier's key (docs/protocol.md "Interconnect
//! probe", docs/market-rules.md "Interconnect probe"). The signed bytes are
//! `gpux-fabric-probe-v1:` followed by the bincode encoding of the body, as
//! for usage reports; the journal keeps the report whole, so the figure the
//! market publishes stays checkable against the supplier's signature.

use ed25519_dalek::{SigningKey, VerifyingKey};
use gpux_engine::LeaseId;
use serde::{Deserialize, Serialize};

use crate::jobs::JobId;
use crate::signed::{sign_hex, verify_hex};

pub const FABRIC_PROBE_DOMAIN: &[u8] = b"gpux-fabric-probe-v1:";

/// The least and most bytes one probe reduces (each rank's buffer).
pub const FABRIC_PROBE_BYTES_MIN: u64 = 1 << 20;
pub const FABRIC_PROBE_BYTES_MAX: u64 = 16 << 30;

/// The signed part of a probe.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct FabricProbeBody {
    /// The member's lease (its host is the one measured).
    pub lease: LeaseId,
    /// The cluster job and attempt the ring belonged to.
    pub job: JobId,
    pub attempt: u32,
    /// Hosts in the ring (the cluster's members) and this one's rank.
    pub ranks: u32,
    pub rank: u32,
    /// Bytes of each rank's buffer, summed across the ring.
    pub bytes: u64,
    /// From the ring's first step to its last, microseconds; 0 when the
    /// probe did not complete (a member not reached in time, or a sum that
    /// came out wrong).
    pub elapsed_us: u64,
}

impl FabricProbeBody {
    /// The ring's bus bandwidth, Mb/s, as nccl-tests defines it for an
    /// all-reduce: `bytes / time * 2 (ranks - 1) / ranks` (each rank sends
    /// and receives that share of its buffer); 0 for a probe that did not
    /// complete.
    pub fn bus_mbps(&self) -> u64 {
        if self.elapsed_us == 0 || self.ranks < 2 {
            return 0;
        }
        let bits = self.bytes as u128 * 8 * 2 * (self.ranks as u128 - 1) / self.ranks as u128;
        // Bits per microsecond are megabits per second.
        (bits / self.elapsed_us as u128).min(u64::MAX as u128) as u64
    }

    /// Whether the body's figures are in range.
    pub fn is_valid(&self) -> bool {
        (2..=gpux_engine::limits::CLUSTER_NODES_MAX).contains(&self.ranks)
            && self.rank < self.ranks
            && (FABRIC_PROBE_BYTES_MIN..=FABRIC_PROBE_BYTES_MAX).contains(&self.bytes)
    }
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct FabricProbeReport {
    pub body: FabricProbeBody,
    /// Hex ed25519 signature by the supplier's key.
    pub signature: String,
}

impl FabricProbeReport {
    pub fn sign(body: FabricProbeBody, key: &SigningKey) -> FabricProbeReport {
        let signature = sign_hex(FABRIC_PROBE_DOMAIN, &body, key);
        FabricProbeReport { body, signature }
    }

    /// Whether the signature is the holder of `public_key`'s.
    pub fn verify(&self, public_key: &[u8; 32]) -> bool {
        VerifyingKey::from_bytes(public_key).is_ok_and(|key| verify_hex(FABRIC_PROBE_DOMAIN, &self.body, &self.signature, &key))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn body() -> FabricProbeBody {
        FabricProbeBody { lease: LeaseId(4), job: JobId(2), attempt: 1, ranks: 4, rank: 1, bytes: 64 << 20, elapsed_us: 20_000 }
    }

    #[test]
    fn a_probe_verifies_with_its_signers_key_only_and_unaltered() {
        let key = SigningKey::from_bytes(&[7; 32]);
        let report = FabricProbeReport::sign(body(), &key);
        assert!(report.verify(&key.verifying_key().to_bytes()));
        assert!(!report.verify(&SigningKey::from_bytes(&[8; 32]).verifying_key().to_bytes()));
        let faster = FabricProbeReport { body: FabricProbeBody { elapsed_us: 10_000, ..body() }, ..report };
        assert!(!faster.verify(&key.verifying_key().to_bytes()), "a figure changed after signing does not verify");
    }

    #[test]
    fn bus_bandwidth_is_nccl_tests_definition() {
        // 64 MiB in 20 ms: algbw 26 843 Mb/s, x 2*3/4 = 40 265 Mb/s.
        assert_eq!(body().bus_mbps(), 40_265);
        assert_eq!(FabricProbeBody { ranks: 2, ..body() }.bus_mbps(), 26_843, "two ranks: bus = algorithm bandwidth");
        assert_eq!(FabricProbeBody { elapsed_us: 0, ..body() }.bus_mbps(), 0, "incomplete");
        assert!(body().is_valid());
        assert!(!FabricProbeBody { rank: 4, ..body() }.is_valid());
        assert!(!FabricProbeBody { ranks: 1, rank: 0, ..body() }.is_valid());
        assert!(!FabricProbeBody { bytes: 1_000, ..body() }.is_valid());
    }
}
