//! Liveness observations: what a renter's client saw of its lease's
//! endpoint over one interval (reachable or not), signed with the key the
//! renter's account logged in with (docs/protocol.md "Liveness", docs/market-rules.md
//! "Disputes"). The signed bytes are `gpux-liveness-v1:` followed by the
//! bincode encoding of the body, as for usage reports: an observation is
//! evidence the renter cannot later deny, and the journal keeps it whole.

use ed25519_dalek::{SigningKey, VerifyingKey};
use gpux_engine::LeaseId;
use serde::{Deserialize, Serialize};

use crate::signed::{sign_hex, verify_hex, SignedItem};

pub const LIVENESS_DOMAIN: &[u8] = b"gpux-liveness-v1:";

/// The longest interval one observation may cover.
pub const LIVENESS_INTERVAL_MS_MAX: u64 = 3_600_000;

/// The signed part of an observation.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct LivenessBody {
    pub lease: LeaseId,
    /// The interval `[start_ms, end_ms)` observed (exchange time).
    pub start_ms: u64,
    pub end_ms: u64,
    /// Whether any probe in the interval reached the lease's endpoint;
    /// `false` says it was unreachable throughout.
    pub reachable: bool,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct LivenessReport {
    pub body: LivenessBody,
    /// Hex ed25519 signature by the renter's key.
    pub signature: String,
}

impl LivenessReport {
    pub fn sign(body: LivenessBody, key: &SigningKey) -> LivenessReport {
        let signature = sign_hex(LIVENESS_DOMAIN, &body, key);
        LivenessReport { body, signature }
    }

    /// Whether the signature is the holder of `public_key`'s.
    pub fn verify(&self, public_key: &[u8; 32]) -> bool {
        VerifyingKey::from_bytes(public_key).is_ok_and(|key| verify_hex(LIVENESS_DOMAIN, &self.body, &self.signature, &key))
    }

    /// The observation's signature as one of a batch
    /// ([`crate::verify_signed_batch_zip215`]), against `public_key`.
    pub fn signed_item(&self, public_key: [u8; 32]) -> SignedItem<'_> {
        SignedItem::new(LIVENESS_DOMAIN, &self.body, &self.signature, public_key)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_observation_verifies_with_its_signers_key_only_and_unaltered() {
        let key = SigningKey::from_bytes(&[5; 32]);
        let body = LivenessBody { lease: LeaseId(17), start_ms: 1_000, end_ms: 11_000, reachable: false };
        let report = LivenessReport::sign(body.clone(), &key);
        assert!(report.verify(&key.verifying_key().to_bytes()));
        assert!(!report.verify(&SigningKey::from_bytes(&[6; 32]).verifying_key().to_bytes()), "another key");
        let altered = LivenessReport { body: LivenessBody { reachable: true, ..body }, ..report.clone() };
        assert!(!altered.verify(&key.verifying_key().to_bytes()), "an altered body");
        let garbled = LivenessReport { signature: "zz".into(), ..report };
        assert!(!garbled.verify(&key.verifying_key().to_bytes()));
    }
}
