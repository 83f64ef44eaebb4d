//! What usage reports and liveness observations share: the signed bytes are
//! a domain prefix followed by the body's record encoding (so a signature
//! for one kind can never pass for another), and signatures travel as hex.

use ed25519_dalek::{Signature, Signer, SigningKey, Verifier, VerifyingKey};
use serde::Serialize;

use crate::record::encode_record;

/// `domain` followed by the record encoding of `body`.
pub(crate) fn signed_bytes<T: Serialize>(domain: &[u8], body: &T) -> Vec<u8> {
    let mut bytes = domain.to_vec();
    bytes.extend_from_slice(&encode_record(body));
    bytes
}

/// The hex ed25519 signature of `body` under `domain`.
pub(crate) fn sign_hex<T: Serialize>(domain: &[u8], body: &T, key: &SigningKey) -> String {
    hex::encode(key.sign(&signed_bytes(domain, body)).to_bytes())
}

/// A signature from its hex text, if it is 64 hex-encoded bytes.
pub(crate) fn signature_from_hex(text: &str) -> Option<Signature> {
    hex::decode(text).ok().and_then(|b| <[u8; 64]>::try_from(b).ok()).map(|b| Signature::from_bytes(&b))
}

/// Whether `signature` (hex) is `key`'s over `body` under `domain`; false
/// for a signature that is not 64 hex-encoded bytes.
pub(crate) fn verify_hex<T: Serialize>(domain: &[u8], body: &T, signature: &str, key: &VerifyingKey) -> bool {
    let Some(signature) = signature_from_hex(signature) else { return false };
    key.verify(&signed_bytes(domain, body), &signature).is_ok()
}

/// One signature of a batch: what was signed, the hex signature, the key.
pub struct SignedItem<'a> {
    message: Vec<u8>,
    signature: &'a str,
    key: [u8; 32],
}

impl<'a> SignedItem<'a> {
    pub(crate) fn new<T: Serialize>(domain: &[u8], body: &T, signature: &'a str, key: [u8; 32]) -> SignedItem<'a> {
        SignedItem { message: signed_bytes(domain, body), signature, key }
    }
}

/// Verifies many signatures at once under ZIP-215's rules (liveness and GPU
/// probe observations; usage reports have [`crate::verify_batch_zip215`]):
/// true only if every one verifies under them. For signatures an honest
/// signer makes, the same as verifying each with its kind's `verify`; the
/// two rules differ only on crafted non-canonical encodings, which ZIP-215
/// accepts, so a batch is for evidence whose signers are known honest (the
/// simulator's renters) or whose single check runs when the batch fails.
pub fn verify_signed_batch_zip215(items: &[SignedItem]) -> bool {
    let mut verifier = ed25519_zebra::batch::Verifier::new();
    for item in items {
        let Some(signature) = hex::decode(item.signature).ok().and_then(|b| <[u8; 64]>::try_from(b).ok()) else { return false };
        let signature = ed25519_zebra::Signature::from_bytes(&signature);
        verifier.queue((ed25519_zebra::VerificationKeyBytes::from(item.key), signature, &item.message));
    }
    verifier.verify(rand_core::OsRng).is_ok()
}

#[cfg(test)]
mod tests {
    use ed25519_dalek::SigningKey;
    use gpux_engine::LeaseId;

    use crate::{GpuProbeBody, GpuProbeReport, LivenessBody, LivenessReport, ProbeGpu};

    use super::*;

    #[test]
    fn a_batch_of_evidence_verifies_only_when_every_signature_does() {
        let renter = SigningKey::from_bytes(&[3; 32]);
        let probe = SigningKey::from_bytes(&[4; 32]);
        let observation =
            |start_ms| LivenessReport::sign(LivenessBody { lease: LeaseId(9), start_ms, end_ms: start_ms + 10, reachable: true }, &renter);
        let gpus = vec![ProbeGpu { uuid: "GPU-1".into(), present_samples: 6, utilisation_percent_mean: 90, memory_used_mib_max: 1 }];
        let probed = GpuProbeReport::sign(GpuProbeBody { lease: LeaseId(9), start_ms: 0, end_ms: 10, samples: 6, gpus }, &probe);
        let (first, second) = (observation(0), observation(10));
        let key = renter.verifying_key().to_bytes();
        let batch = |items: Vec<SignedItem>| verify_signed_batch_zip215(&items);
        assert!(batch(vec![first.signed_item(key), second.signed_item(key), probed.signed_item().expect("a key")]));
        assert!(batch(Vec::new()), "nothing to refuse");
        // Another signer's key, an altered body, a signature that is not hex.
        assert!(!batch(vec![first.signed_item(key), second.signed_item(probe.verifying_key().to_bytes())]));
        let mut altered = second.clone();
        altered.body.reachable = false;
        assert!(!batch(vec![first.signed_item(key), altered.signed_item(key)]));
        let mut garbled = first.clone();
        garbled.signature = "zz".into();
        assert!(!batch(vec![garbled.signed_item(key), probed.signed_item().expect("a key")]));
        // Each alone agrees with its kind's own check.
        assert!(first.verify(&key) && probed.verify() && !altered.verify(&key));
    }
}
