//! Usage reports: what a supplier's agent says about one GPU of one lease
//! over one interval, signed with the host key and chained to the previous
//! report of the same lease and GPU.
//!
//! The signed bytes are the bincode encoding of the report without its
//! signature, after a domain prefix: a report without readings is signed
//! as version 1 (`gpux-usage-v1:` and the body without its `readings`
//! field, byte for byte what agents signed before readings existed), one
//! with readings as version 2 (`gpux-usage-v2:` and the whole body). A
//! report's hash is SHA-256 of those bytes followed by the signature, and
//! the next report carries it as `prev_hash` (the first carries 32 zero
//! bytes). One definition here serves the agent that signs and settlement
//! that verifies.

use ed25519_dalek::{SigningKey, VerifyingKey};
use gpux_engine::LeaseId;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use ed25519_dalek::{Signer, Verifier};

use crate::signed::{signature_from_hex, signed_bytes};

pub const USAGE_DOMAIN: &[u8] = b"gpux-usage-v1:";
/// The domain of reports that carry readings.
pub const USAGE_DOMAIN_V2: &[u8] = b"gpux-usage-v2:";

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
    /// The GPU's temperature and power over the interval, signed with the
    /// rest (version 2); absent from reports of agents that predate them.
    #[serde(default)]
    pub readings: Option<Readings>,
}

/// Temperature and power of one GPU over a report's interval; each absent
/// when the GPU has no such sensor.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Readings {
    /// The highest temperature sampled, in degrees Celsius.
    pub temperature_c_max: Option<u32>,
    /// The mean power drawn over the samples, in watts.
    pub power_w_mean: Option<u32>,
}

/// A body as version 1 signed it: every field but `readings`, in order.
#[derive(Serialize, Deserialize)]
struct BodyV1 {
    lease: LeaseId,
    gpu_uuid: String,
    seq: u32,
    start_ms: u64,
    end_ms: u64,
    available_ms: u64,
    utilisation_percent: u32,
    memory_used_mib_max: u32,
    unhealthy_samples: u32,
    prev_hash: String,
}

impl UsageBody {
    fn v1(&self) -> BodyV1 {
        BodyV1 {
            lease: self.lease,
            gpu_uuid: self.gpu_uuid.clone(),
            seq: self.seq,
            start_ms: self.start_ms,
            end_ms: self.end_ms,
            available_ms: self.available_ms,
            utilisation_percent: self.utilisation_percent,
            memory_used_mib_max: self.memory_used_mib_max,
            unhealthy_samples: self.unhealthy_samples,
            prev_hash: self.prev_hash.clone(),
        }
    }

    /// The bytes its signature covers (version 1 without readings, 2 with).
    pub fn signed_bytes(&self) -> Vec<u8> {
        match self.readings {
            None => signed_bytes(USAGE_DOMAIN, &self.v1()),
            Some(_) => signed_bytes(USAGE_DOMAIN_V2, self),
        }
    }
}

/// The journal's record of a report without readings keeps version 1's
/// layout (`#[serde(with = "usage_v1_record")]`), so journals written
/// before readings existed decode unchanged; reports with readings are
/// journaled in an entry of their own with the whole body.
pub mod usage_v1_record {
    use super::*;

    #[derive(Serialize, Deserialize)]
    struct ReportV1 {
        body: BodyV1,
        signature: String,
    }

    pub fn serialize<S: serde::Serializer>(report: &UsageReport, serializer: S) -> Result<S::Ok, S::Error> {
        if report.body.readings.is_some() {
            return Err(serde::ser::Error::custom("a report with readings is journaled as a UsageReportV2 entry"));
        }
        ReportV1 { body: report.body.v1(), signature: report.signature.clone() }.serialize(serializer)
    }

    pub fn deserialize<'de, D: serde::Deserializer<'de>>(deserializer: D) -> Result<UsageReport, D::Error> {
        let ReportV1 { body, signature } = ReportV1::deserialize(deserializer)?;
        let body = UsageBody {
            lease: body.lease,
            gpu_uuid: body.gpu_uuid,
            seq: body.seq,
            start_ms: body.start_ms,
            end_ms: body.end_ms,
            available_ms: body.available_ms,
            utilisation_percent: body.utilisation_percent,
            memory_used_mib_max: body.memory_used_mib_max,
            unhealthy_samples: body.unhealthy_samples,
            prev_hash: body.prev_hash,
            readings: None,
        };
        Ok(UsageReport { body, signature })
    }
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
    /// The highest temperature (degrees Celsius) and the mean power (watts)
    /// the report signed; null from reports without readings.
    #[serde(default)]
    pub temperature_c_max: Option<u32>,
    #[serde(default)]
    pub power_w_mean: Option<u32>,
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
            temperature_c_max: body.readings.and_then(|r| r.temperature_c_max),
            power_w_mean: body.readings.and_then(|r| r.power_w_mean),
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
        let signature = hex::encode(key.sign(&body.signed_bytes()).to_bytes());
        UsageReport { body, signature }
    }

    /// Whether the signature is the holder of `public_key`'s.
    pub fn verify(&self, public_key: &[u8; 32]) -> bool {
        VerifyingKey::from_bytes(public_key).is_ok_and(|key| self.verify_with(&key))
    }

    /// `verify` with a key already decompressed (settlement keeps each
    /// host's key decompressed: decompression is a fifth of a verification).
    pub fn verify_with(&self, key: &VerifyingKey) -> bool {
        let Some(signature) = signature_from_hex(&self.signature) else { return false };
        key.verify(&self.body.signed_bytes(), &signature).is_ok()
    }

    /// The hash the next report of the chain carries as `prev_hash`.
    pub fn hash(&self) -> String {
        let mut hasher = Sha256::new();
        hasher.update(self.body.signed_bytes());
        hasher.update(self.signature.as_bytes());
        hex::encode(hasher.finalize())
    }
}

impl UsageReport {
    /// Whether the signature is `public_key`'s under ZIP-215's rules
    /// (ed25519-zebra): the cofactored equation, any encoding of a point
    /// that decodes, S below the group order. Single and batch verification
    /// ([`verify_batch_zip215`]) agree on every input.
    pub fn verify_zip215(&self, public_key: &[u8; 32]) -> bool {
        Zip215Key::decompress(public_key).is_some_and(|key| self.verify_zip215_key(&key))
    }

    /// `verify_zip215` with a key already decompressed (settlement keeps
    /// each host's: a decompression is about a fifth of a verification).
    pub fn verify_zip215_key(&self, key: &Zip215Key) -> bool {
        let Some(signature) = zebra_signature(&self.signature) else { return false };
        key.0.verify(&signature, &self.body.signed_bytes()).is_ok()
    }
}

/// A public key decompressed for ZIP-215 verification.
#[derive(Clone, Copy, Debug)]
pub struct Zip215Key(ed25519_zebra::VerificationKey);

impl Zip215Key {
    /// `None` for bytes that are no point's encoding (no report verifies
    /// against them).
    pub fn decompress(public_key: &[u8; 32]) -> Option<Zip215Key> {
        ed25519_zebra::VerificationKey::try_from(*public_key).ok().map(Zip215Key)
    }
}

fn zebra_signature(text: &str) -> Option<ed25519_zebra::Signature> {
    let bytes: [u8; 64] = hex::decode(text).ok()?.try_into().ok()?;
    Some(ed25519_zebra::Signature::from_bytes(&bytes))
}

/// Verifies many reports at once under ZIP-215's rules, each against its
/// signer's key: true only if every one verifies, which is exactly when
/// [`UsageReport::verify_zip215`] accepts each (the property batch
/// verification under these rules guarantees, and
/// `zip215_batch_and_single_verification_agree_on_edge_cases` checks).
pub fn verify_batch_zip215(reports: &[(&UsageReport, [u8; 32])]) -> bool {
    let mut verifier = ed25519_zebra::batch::Verifier::new();
    let mut messages = Vec::with_capacity(reports.len());
    for (report, _) in reports {
        messages.push(report.body.signed_bytes());
    }
    for ((report, public_key), message) in reports.iter().zip(&messages) {
        let Some(signature) = zebra_signature(&report.signature) else { return false };
        verifier.queue((ed25519_zebra::VerificationKeyBytes::from(*public_key), signature, message));
    }
    verifier.verify(rand_core::OsRng).is_ok()
}

/// Why a report was refused. Codes are stable (docs/protocol.md).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize, strum::IntoStaticStr, strum::VariantArray)]
#[serde(rename_all = "snake_case")]
#[strum(serialize_all = "snake_case")]
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
    /// The code as the protocol writes it (`billing_closed`).
    pub fn name(self) -> &'static str {
        self.into()
    }

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
            BillingClosed => {
                "the lease's bill is final (its grace passed with every report in, or its late-report window passed); report sooner"
            }
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
        messages.push(report.body.signed_bytes());
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
            readings: None,
        }
    }

    type FieldsV1 = (LeaseId, String, u32, u64, u64, u64, u32, u32, u32, String);

    /// A body's ten fields as version 1 had them.
    fn v1_fields(body: &UsageBody) -> FieldsV1 {
        (
            body.lease,
            body.gpu_uuid.clone(),
            body.seq,
            body.start_ms,
            body.end_ms,
            body.available_ms,
            body.utilisation_percent,
            body.memory_used_mib_max,
            body.unhealthy_samples,
            body.prev_hash.clone(),
        )
    }

    /// What agents signed before readings existed: `gpux-usage-v1:` and the
    /// ten fields' record encoding.
    fn v1_bytes(body: &UsageBody) -> Vec<u8> {
        let mut bytes = USAGE_DOMAIN.to_vec();
        bytes.extend_from_slice(&crate::record::encode_record(&v1_fields(body)));
        bytes
    }

    #[test]
    fn a_report_without_readings_signs_version_ones_bytes_and_journals_in_its_layout() {
        let key = SigningKey::from_bytes(&[7; 32]);
        let old = UsageReport::sign(body(), &key);
        assert_eq!(body().signed_bytes(), v1_bytes(&body()), "version 1's signed bytes are unchanged");
        let signature = hex::encode(key.sign(&v1_bytes(&body())).to_bytes());
        assert_eq!(old.signature, signature, "an old agent's report verifies as it always did");

        #[derive(Serialize, Deserialize)]
        struct Entry(#[serde(with = "usage_v1_record")] UsageReport);
        let journaled = crate::record::encode_record(&Entry(old.clone()));
        let legacy = crate::record::encode_record(&(v1_fields(&body()), old.signature.clone()));
        assert_eq!(journaled, legacy, "the journal's layout is version 1's");
        let Entry(decoded) = crate::record::decode_record(&journaled).expect("decodes");
        assert_eq!(decoded, old);
        let with = UsageReport::sign(UsageBody { readings: Some(Readings::default()), ..body() }, &key);
        let refused = bincode::serde::encode_to_vec(Entry(with), bincode::config::standard());
        assert!(refused.is_err(), "a report with readings is no version 1 record");
    }

    /// The points of order dividing 8, canonically encoded, and the
    /// non-canonical encodings of points (y + p for the y that fit in 255
    /// bits, and x = 0 with its sign bit set).
    fn edge_encodings() -> Vec<[u8; 32]> {
        use curve25519_dalek::edwards::CompressedEdwardsY;
        let mut encodings: Vec<[u8; 32]> = curve25519_dalek::constants::EIGHT_TORSION.iter().map(|p| p.compress().to_bytes()).collect();
        let mut one_with_sign = [0u8; 32];
        one_with_sign[0] = 1;
        one_with_sign[31] = 0x80;
        encodings.push(one_with_sign);
        let mut minus_one_with_sign = [0xff; 32];
        minus_one_with_sign[0] = 0xec;
        encodings.push(minus_one_with_sign);
        for delta in 0u8..19 {
            // p + delta = 2^255 - 19 + delta, little-endian.
            let mut y = [0xff; 32];
            y[0] = 0xed + delta;
            y[31] = 0x7f;
            for sign in [0u8, 0x80] {
                let mut e = y;
                e[31] |= sign;
                if CompressedEdwardsY(e).decompress().is_some() {
                    encodings.push(e);
                }
            }
        }
        encodings
    }

    #[test]
    fn zip215_batch_and_single_verification_agree_on_edge_cases() {
        let key = SigningKey::from_bytes(&[7; 32]);
        let public = key.verifying_key().to_bytes();
        let honest = UsageReport::sign(body(), &key);
        assert!(honest.verify_zip215(&public) && honest.verify(&public), "an honest report verifies under both rules");
        let encodings = edge_encodings();
        assert!(encodings.len() >= 12, "{}", encodings.len());
        let (mut cases, mut accepted) = (0, 0);
        // Small-order and non-canonical keys and R, s = 0 and s = 1, over a
        // real report's bytes: each alone, and in a batch with honest
        // reports, batch and single give the same answer.
        for a in &encodings {
            for r in &encodings {
                for s_low in [0u8, 1] {
                    let mut signature = [0u8; 64];
                    signature[..32].copy_from_slice(r);
                    signature[32] = s_low;
                    let crafted = UsageReport { body: body(), signature: hex::encode(signature) };
                    let single = crafted.verify_zip215(a);
                    assert_eq!(verify_batch_zip215(&[(&crafted, *a)]), single, "A {} R {} s {s_low}", hex::encode(a), hex::encode(r));
                    let mixed = [(&honest, public), (&crafted, *a), (&honest, public)];
                    assert_eq!(verify_batch_zip215(&mixed), single, "in a batch: A {} R {}", hex::encode(a), hex::encode(r));
                    cases += 1;
                    accepted += usize::from(single);
                }
            }
        }
        assert!(accepted > 0 && accepted < cases, "the cases include accepted and refused ones: {accepted} of {cases}");
        // A wrong signature fails the batch it is in.
        let mut wrong = honest.clone();
        wrong.body.available_ms += 1;
        assert!(!wrong.verify_zip215(&public));
        assert!(!verify_batch_zip215(&[(&honest, public), (&wrong, public)]));
        // S at or above the group order is refused by both.
        let mut unreduced = hex::decode(&honest.signature).expect("hex");
        unreduced[63] |= 0xf0;
        let unreduced = UsageReport { body: body(), signature: hex::encode(unreduced) };
        assert!(!unreduced.verify_zip215(&public) && !verify_batch_zip215(&[(&unreduced, public)]));
    }

    #[test]
    fn readings_are_signed_version_two_and_cannot_be_stripped_or_changed() {
        let key = SigningKey::from_bytes(&[7; 32]);
        let public = key.verifying_key().to_bytes();
        let readings = Readings { temperature_c_max: Some(71), power_w_mean: Some(412) };
        let report = UsageReport::sign(UsageBody { readings: Some(readings), ..body() }, &key);
        assert!(report.verify(&public));
        assert!(report.body.signed_bytes().starts_with(USAGE_DOMAIN_V2));
        let mut stripped = report.clone();
        stripped.body.readings = None;
        assert!(!stripped.verify(&public), "readings cannot be dropped from a signed report");
        let mut cooler = report.clone();
        cooler.body.readings = Some(Readings { temperature_c_max: Some(60), ..readings });
        assert!(!cooler.verify(&public), "nor changed");
        assert_ne!(report.hash(), UsageReport::sign(body(), &key).hash());
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

#[cfg(test)]
mod names {
    use super::UsageRejectCode;
    use crate::ErrorCode;

    /// strum's names are serde's, for every variant of each code.
    #[test]
    fn names_are_the_wire_names() {
        let wire = |value: serde_json::Value| value.as_str().expect("a string").to_string();
        for code in <ErrorCode as strum::VariantArray>::VARIANTS {
            assert_eq!(code.name(), wire(serde_json::to_value(code).expect("JSON")), "{code:?}");
        }
        for code in <UsageRejectCode as strum::VariantArray>::VARIANTS {
            assert_eq!(code.name(), wire(serde_json::to_value(code).expect("JSON")), "{code:?}");
        }
    }
}
