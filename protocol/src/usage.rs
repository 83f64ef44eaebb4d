//! Usage reports: what a supplier's agent says about one GPU of one lease
//! over one interval, signed with the host key and chained to the previous
//! report of the same lease and GPU.
//!
//! The signed bytes are the bincode encoding of the report without its
//! signature, after the domain prefix `gpux-usage-v1:`; a report's hash is
//! SHA-256 of those bytes followed by the signature, and the next report
//! carries it as `prev_hash` (the first carries 32 zero bytes). One
//! definition here serves the agent that signs and settlement that verifies.

use ed25519_dalek::{SigningKey, VerifyingKey};
use gpux_engine::LeaseId;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::signed::{sign_hex, signature_from_hex, signed_bytes, verify_hex};

pub const USAGE_DOMAIN: &[u8] = b"gpux-usage-v1:";

/// The signed part of a report.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct UsageBody {
    pub lease: LeaseId,
    pub gpu_uuid: String,
    /// Position in the chain of this lease and GPU, from 1.
    pub seq: u32,
    /// The interval `[start_ms, end_ms)` this report covers.
    pub start_ms: u64,
    pub end_ms: u64,
    /// How much of the interval the GPU was delivered and healthy.
    pub available_ms: u64,
    pub utilisation_percent: u32,
    pub memory_used_mib_max: u32,
    /// Samples in the interval that found the GPU unhealthy.
    pub unhealthy_samples: u32,
    /// Hex SHA-256 of the previous report of this chain (64 zeros for the first).
    pub prev_hash: String,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct UsageReport {
    pub body: UsageBody,
    /// Hex ed25519 signature by the host key.
    pub signature: String,
}

/// What one accepted usage report measured of one GPU (docs/protocol.md
/// "Lease telemetry"): the interval, its available time, the mean
/// utilisation, the most memory used and the unhealthy samples.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct TelemetrySample {
    pub start_ms: u64,
    pub end_ms: u64,
    pub available_ms: u64,
    pub utilisation_percent: u32,
    pub memory_used_mib_max: u32,
    pub unhealthy_samples: u32,
}

impl From<&UsageBody> for TelemetrySample {
    fn from(body: &UsageBody) -> Self {
        TelemetrySample {
            start_ms: body.start_ms,
            end_ms: body.end_ms,
            available_ms: body.available_ms,
            utilisation_percent: body.utilisation_percent,
            memory_used_mib_max: body.memory_used_mib_max,
            unhealthy_samples: body.unhealthy_samples,
        }
    }
}

/// One leased GPU's recent telemetry, oldest first.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct GpuTelemetry {
    pub gpu_uuid: String,
    pub samples: Vec<TelemetrySample>,
}

/// The `prev_hash` of a chain's first report.
pub fn genesis_hash() -> String {
    hex::encode([0u8; 32])
}

impl UsageReport {
    pub fn sign(body: UsageBody, key: &SigningKey) -> UsageReport {
        let signature = sign_hex(USAGE_DOMAIN, &body, key);
        UsageReport { body, signature }
    }

    /// Whether the signature is the holder of `public_key`'s.
    pub fn verify(&self, public_key: &[u8; 32]) -> bool {
        VerifyingKey::from_bytes(public_key).is_ok_and(|key| self.verify_with(&key))
    }

    /// `verify` with a key already decompressed (settlement keeps each
    /// host's key decompressed: decompression is a fifth of a verification).
    pub fn verify_with(&self, key: &VerifyingKey) -> bool {
        verify_hex(USAGE_DOMAIN, &self.body, &self.signature, key)
    }

    /// The hash the next report of the chain carries as `prev_hash`.
    pub fn hash(&self) -> String {
        let mut hasher = Sha256::new();
        hasher.update(signed_bytes(USAGE_DOMAIN, &self.body));
        hasher.update(self.signature.as_bytes());
        hex::encode(hasher.finalize())
    }
}

/// Why a report was refused. Codes are stable (docs/protocol.md).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum UsageRejectCode {
    UnknownLease,
    /// The reporting account is not the lease's supplier.
    WrongHost,
    /// The GPU is not one of the lease's.
    WrongGpu,
    /// The signature is not the supplier's host key's.
    Forged,
    /// Out of order: a later report than the chain expects next.
    Reordered,
    /// A position already taken by a different report.
    Replayed,
    /// The interval starts before the previous report's end.
    Overlapping,
    /// The interval starts before the lease, or at or after its end.
    OutOfLease,
    /// The interval ends after the exchange's clock plus the allowed skew.
    FromFuture,
    /// An empty interval, more available time than the interval, or a bad field.
    Malformed,
    /// The chain reached its report limit.
    ChainFull,
    /// The lease ended more than the billing grace ago: no more usage is billed.
    BillingClosed,
}

impl UsageRejectCode {
    pub fn message(self) -> &'static str {
        use UsageRejectCode::*;
        match self {
            UnknownLease => "no such lease",
            WrongHost => "only the lease's supplier reports on it",
            WrongGpu => "the GPU is not part of the lease",
            Forged => "the signature does not verify against the supplier's host key",
            Reordered => "report out of order: send the earlier reports of this lease and GPU first",
            Replayed => "a different report already holds this position in the chain",
            Overlapping => "the interval overlaps the previous report",
            OutOfLease => "the interval starts before the lease or after its end",
            FromFuture => "the interval ends in the future by the exchange's clock",
            Malformed => "empty interval, or more available time than the interval",
            ChainFull => "this lease and GPU reached the report limit",
            BillingClosed => "the lease's billing closed (its end plus the billing grace passed); report sooner",
        }
    }
}

/// Verifies many reports' signatures at once, each against its signer's
/// public key: true only if every one verifies. About twice as fast per
/// report as one at a time (docs/PERFORMANCE.md). Batch verification is a
/// different equation than single verification and can disagree with it on
/// signatures crafted with small-order components, so a caller whose outcome
/// must be reproducible by single verification (the exchange's journal
/// replay) must not use it as the deciding check; see docs/PERFORMANCE.md.
pub fn verify_batch(reports: &[(&UsageReport, [u8; 32])]) -> bool {
    let mut messages = Vec::with_capacity(reports.len());
    let mut signatures = Vec::with_capacity(reports.len());
    let mut keys = Vec::with_capacity(reports.len());
    for (report, public_key) in reports {
        let (Ok(key), Some(signature)) = (VerifyingKey::from_bytes(public_key), signature_from_hex(&report.signature)) else {
            return false;
        };
        messages.push(signed_bytes(USAGE_DOMAIN, &report.body));
        signatures.push(signature);
        keys.push(key);
    }
    let messages: Vec<&[u8]> = messages.iter().map(Vec::as_slice).collect();
    ed25519_dalek::verify_batch(&messages, &signatures, &keys).is_ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn body() -> UsageBody {
        UsageBody {
            lease: LeaseId(3),
            gpu_uuid: "GPU-a".into(),
            seq: 1,
            start_ms: 1_000,
            end_ms: 11_000,
            available_ms: 10_000,
            utilisation_percent: 80,
            memory_used_mib_max: 60_000,
            unhealthy_samples: 0,
            prev_hash: genesis_hash(),
        }
    }

    #[test]
    fn a_report_verifies_against_its_signer_only_and_any_change_breaks_it() {
        let key = SigningKey::from_bytes(&[7; 32]);
        let report = UsageReport::sign(body(), &key);
        assert!(report.verify(&key.verifying_key().to_bytes()));
        assert!(!report.verify(&SigningKey::from_bytes(&[8; 32]).verifying_key().to_bytes()));
        let mut inflated = report.clone();
        inflated.body.available_ms += 1;
        assert!(!inflated.verify(&key.verifying_key().to_bytes()), "an inflated report no longer verifies");
        assert_ne!(report.hash(), UsageReport::sign(UsageBody { seq: 2, ..body() }, &key).hash());
    }

    #[test]
    fn a_batch_verifies_only_when_every_report_in_it_does() {
        let keys: Vec<SigningKey> = (1..=4u8).map(|i| SigningKey::from_bytes(&[i; 32])).collect();
        let reports: Vec<UsageReport> = keys.iter().map(|key| UsageReport::sign(body(), key)).collect();
        let batch: Vec<(&UsageReport, [u8; 32])> = reports.iter().zip(&keys).map(|(r, k)| (r, k.verifying_key().to_bytes())).collect();
        assert!(verify_batch(&batch));
        let mut inflated = reports[2].clone();
        inflated.body.available_ms += 1;
        let mut tampered = batch.clone();
        tampered[2].0 = &inflated;
        assert!(!verify_batch(&tampered), "one altered report fails the batch");
        let mut wrong_key = batch.clone();
        wrong_key[0].1 = keys[1].verifying_key().to_bytes();
        assert!(!verify_batch(&wrong_key), "one report checked against the wrong key fails the batch");
    }
}
