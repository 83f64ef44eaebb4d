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

/// The worked usage-report example: signing the documented report's body
/// with the documented key gives exactly the documented bytes, signature
/// and hash, so a client written from the docs alone signs what the
/// exchange verifies.
#[test]
fn the_usage_signing_example_is_what_the_code_signs() {
    let doc = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../docs/protocol.md")).expect("docs/protocol.md exists");
    let block = doc.split("```text usage-signing\n").nth(1).expect("the worked example").split("```").next().expect("closed");
    let field = |name: &str| -> String {
        let line = block.lines().find(|line| line.starts_with(name)).unwrap_or_else(|| panic!("{name} in the example"));
        line[name.len()..].split_whitespace().collect()
    };
    let secret: [u8; 32] = hex::decode(field("secret key:")).expect("hex").try_into().expect("32 bytes");
    let key = ed25519_dalek::SigningKey::from_bytes(&secret);
    assert_eq!(hex::encode(key.verifying_key().to_bytes()), field("public key:"));

    let report = examples("client")
        .into_iter()
        .find_map(|example| match decode_client_text(&example) {
            Ok(ClientMessage::UsageReport { report, .. }) => Some(report),
            _ => None,
        })
        .expect("a usage_report example");
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
    let doc = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../docs/protocol.md")).expect("docs/protocol.md exists");
    let block = doc.split("```text liveness-signing\n").nth(1).expect("the worked example").split("```").next().expect("closed");
    let field = |name: &str| -> String {
        let line = block.lines().find(|line| line.starts_with(name)).unwrap_or_else(|| panic!("{name} in the example"));
        line[name.len()..].split_whitespace().collect()
    };
    let secret: [u8; 32] = hex::decode(field("secret key:")).expect("hex").try_into().expect("32 bytes");
    let key = ed25519_dalek::SigningKey::from_bytes(&secret);
    let report = examples("client")
        .into_iter()
        .find_map(|example| match decode_client_text(&example) {
            Ok(ClientMessage::Liveness { report, .. }) => Some(report),
            _ => None,
        })
        .expect("a liveness example");
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
    let doc = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../docs/protocol.md")).expect("docs/protocol.md exists");
    let block = doc.split("```text gpu-probe-signing\n").nth(1).expect("the worked example").split("```").next().expect("closed");
    let field = |name: &str| -> String {
        let line = block.lines().find(|line| line.starts_with(name)).unwrap_or_else(|| panic!("{name} in the example"));
        line[name.len()..].split_whitespace().collect()
    };
    let secret: [u8; 32] = hex::decode(field("secret key:")).expect("hex").try_into().expect("32 bytes");
    let key = ed25519_dalek::SigningKey::from_bytes(&secret);
    let report = examples("client")
        .into_iter()
        .find_map(|example| match decode_client_text(&example) {
            Ok(ClientMessage::GpuProbe { report, .. }) => Some(report),
            _ => None,
        })
        .expect("a gpu_probe example");
    let mut signed = gpux_protocol::gpu_probe::GPU_PROBE_DOMAIN.to_vec();
    signed.extend_from_slice(&encode_record(&report.body));
    assert_eq!(hex::encode(&signed), field("signed bytes:"), "the byte layout");
    let resigned = gpux_protocol::GpuProbeReport::sign(report.body.clone(), &key);
    assert_eq!(resigned.signature, field("signature:"));
    assert_eq!(*report, resigned, "the JSON example carries the real key and signature");
    assert!(report.verify());
}
