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
