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
