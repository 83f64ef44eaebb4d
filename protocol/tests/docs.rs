//! docs/protocol.md stays true: every JSON example in it, marked as a client
//! or server message, decodes with the real codec and re-encodes to the same
//! JSON value.

use gpux_protocol::*;

fn examples(kind: &str) -> Vec<String> {
    let doc = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../docs/protocol.md")).expect("docs/protocol.md exists");
    let fence = format!("```json {kind}\n");
    doc.split(&fence).skip(1).map(|block| block.split("```").next().expect("closed block").trim().to_string()).collect()
}

#[test]
fn every_client_example_in_the_protocol_document_decodes() {
    let examples = examples("client");
    assert!(examples.len() >= 15, "found {} client examples", examples.len());
    for example in examples {
        let message = decode_client_text(&example).unwrap_or_else(|e| panic!("{example}: {}", e.message));
        let again: serde_json::Value = serde_json::from_str(&encode_client_text(&message)).expect("json");
        let original: serde_json::Value = serde_json::from_str(&example).expect("json");
        // Examples may leave out defaulted fields; everything they state must survive.
        assert_subset(&original, &again, &example);
    }
}

#[test]
fn every_server_example_in_the_protocol_document_decodes() {
    let examples = examples("server");
    assert!(examples.len() >= 12, "found {} server examples", examples.len());
    for example in examples {
        let message = decode_server_text(&example).unwrap_or_else(|e| panic!("{example}: {}", e.message));
        let again: serde_json::Value = serde_json::from_str(&encode_server_text(&message)).expect("json");
        let original: serde_json::Value = serde_json::from_str(&example).expect("json");
        assert_eq!(original, again, "{example}");
    }
}

fn assert_subset(stated: &serde_json::Value, full: &serde_json::Value, example: &str) {
    match (stated, full) {
        (serde_json::Value::Object(stated), serde_json::Value::Object(full)) => {
            for (key, value) in stated {
                assert_subset(value, full.get(key).unwrap_or_else(|| panic!("{example}: {key} lost")), example);
            }
        }
        _ => assert_eq!(stated, full, "{example}"),
    }
}

/// A worked signing example of docs/protocol.md (a ```text NAME block):
/// its fields by label, and its key.
struct WorkedExample {
    block: String,
}

impl WorkedExample {
    fn named(name: &str) -> WorkedExample {
        let doc = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../docs/protocol.md")).expect("docs/protocol.md exists");
        let marker = format!("```text {name}\n");
        let block = doc.split(&marker).nth(1).expect("the worked example").split("```").next().expect("closed").to_string();
        WorkedExample { block }
    }

    /// The field's value, spaces dropped.
    fn field(&self, name: &str) -> String {
        let line = self.block.lines().find(|line| line.starts_with(name)).unwrap_or_else(|| panic!("{name} in the example"));
        line[name.len()..].split_whitespace().collect()
    }

    fn key(&self) -> ed25519_dalek::SigningKey {
        let secret: [u8; 32] = hex::decode(self.field("secret key:")).expect("hex").try_into().expect("32 bytes");
        ed25519_dalek::SigningKey::from_bytes(&secret)
    }
}

/// The first client example that `pick` takes.
fn client_example<T>(pick: impl Fn(ClientMessage) -> Option<T>) -> T {
    examples("client").into_iter().find_map(|example| decode_client_text(&example).ok().and_then(&pick)).expect("an example")
}

/// The worked usage-report example: signing the documented report's body
/// with the documented key gives exactly the documented bytes, signature
/// and hash, so a client written from the docs alone signs what the
/// exchange verifies.
#[test]
fn the_usage_signing_example_is_what_the_code_signs() {
    let example = WorkedExample::named("usage-signing");
    let field = |name: &str| example.field(name);
    let key = example.key();
    assert_eq!(hex::encode(key.verifying_key().to_bytes()), field("public key:"));

    let report = client_example(|message| match message {
        ClientMessage::UsageReport { report, .. } => Some(report),
        _ => None,
    });
    assert!(report.body.readings.is_none(), "the worked example is version 1");
    assert_eq!(hex::encode(report.body.signed_bytes()), field("signed bytes:"), "the byte layout");
    let resigned = UsageReport::sign(report.body.clone(), &key);
    assert_eq!(resigned.signature, field("signature:"));
    assert_eq!(report.signature, resigned.signature, "the JSON example carries the real signature");
    assert!(report.verify(&key.verifying_key().to_bytes()));
    assert_eq!(report.hash(), field("report hash:"));
}

/// The liveness signing example: the documented body, signed with the
/// documented key, is exactly the documented bytes and signature.
#[test]
fn the_liveness_signing_example_is_what_the_code_signs() {
    let example = WorkedExample::named("liveness-signing");
    let field = |name: &str| example.field(name);
    let key = example.key();
    let report = client_example(|message| match message {
        ClientMessage::Liveness { report, .. } => Some(report),
        _ => None,
    });
    let mut signed = gpux_protocol::liveness::LIVENESS_DOMAIN.to_vec();
    signed.extend_from_slice(&encode_record(&report.body));
    assert_eq!(hex::encode(&signed), field("signed bytes:"), "the byte layout");
    let resigned = LivenessReport::sign(report.body.clone(), &key);
    assert_eq!(resigned.signature, field("signature:"));
    assert_eq!(report.signature, resigned.signature, "the JSON example carries the real signature");
    assert!(report.verify(&key.verifying_key().to_bytes()));
}

/// The GPU probe signing example: the documented body, signed with the
/// documented key, is exactly the documented bytes and signature.
#[test]
fn the_gpu_probe_signing_example_is_what_the_code_signs() {
    let example = WorkedExample::named("gpu-probe-signing");
    let field = |name: &str| example.field(name);
    let key = example.key();
    let report = client_example(|message| match message {
        ClientMessage::GpuProbe { report, .. } => Some(report),
        _ => None,
    });
    let mut signed = gpux_protocol::gpu_probe::GPU_PROBE_DOMAIN.to_vec();
    signed.extend_from_slice(&encode_record(&report.body));
    assert_eq!(hex::encode(&signed), field("signed bytes:"), "the byte layout");
    let resigned = gpux_protocol::GpuProbeReport::sign(report.body.clone(), &key);
    assert_eq!(resigned.signature, field("signature:"));
    assert_eq!(*report, resigned, "the JSON example carries the real key and signature");
    assert!(report.verify());
}
