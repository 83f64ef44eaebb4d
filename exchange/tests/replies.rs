//! Every request is answered exactly once, and answering frees its
//! in-flight slot: more than `REQUESTS_IN_FLIGHT_MAX` requests of each kind,
//! sent in sequence of pipelined rounds on one connection, all get their
//! answer (never `rate_limited`). A kind whose answer the gateway did not
//! count would leak a slot per request and lock the connection after 1 024.

mod common;

use common::*;
use gpux_engine::Role;
use gpux_protocol::*;
use tokio_tungstenite::tungstenite::Message;

/// One request of each kind a logged-in renter can send, `{id}` to fill in.
/// Most are refused (unknown lease, no funds...), which is an answer too.
const REQUESTS: &[&str] = &[
    r#"{"subscribe":{"id":{id},"channel":"book","instrument":0}}"#,
    r#"{"unsubscribe":{"id":{id},"channel":"trades","instrument":0}}"#,
    r#"{"new_order":{"id":{id},"order":{"client_order_id":{id},"instrument":0,"side":"buy","order_type":"limit","price_minor_per_gpu_hour":2000000,"quantity":1}}}"#,
    r#"{"cancel_order":{"id":{id},"order":999999}}"#,
    r#"{"replace_order":{"id":{id},"order":999999,"price_minor_per_gpu_hour":2000000,"quantity":1}}"#,
    r#"{"mass_cancel":{"id":{id},"instrument":null}}"#,
    r#"{"register_gpu":{"id":{id},"host":"h","gpu_uuid":"GPU-x","spec":{"vendor":"nvidia","model":"NVIDIA H100 80GB HBM3","memory_mib":81559,"interconnect":"nv_link","mig_profile":null}}}"#,
    r#"{"set_gpu_online":{"id":{id},"gpu":999999,"online":true}}"#,
    r#"{"end_lease":{"id":{id},"lease":999999}}"#,
    r#"{"deposit":{"id":{id},"account":0,"amount_minor":1}}"#,
    r#"{"withdraw":{"id":{id},"account":null,"amount_minor":1}}"#,
    r#"{"payout":{"id":{id},"account":null,"amount_minor":1}}"#,
    r#"{"instruments":{"id":{id}}}"#,
    r#"{"stats":{"id":{id},"instrument":0}}"#,
    r#"{"balance":{"id":{id}}}"#,
    r#"{"statement":{"id":{id},"after":null}}"#,
    r#"{"usage_report":{"id":{id},"report":{"body":{"lease":17,"gpu_uuid":"GPU-1","seq":1,"start_ms":1796223720000,"end_ms":1796223730000,"available_ms":10000,"utilisation_percent":87,"memory_used_mib_max":61234,"unhealthy_samples":0,"prev_hash":"0000000000000000000000000000000000000000000000000000000000000000"},"signature":"00000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000"}}}"#,
    r#"{"my_gpus":{"id":{id}}}"#,
    r#"{"open_orders":{"id":{id},"offset":0}}"#,
    r#"{"leases":{"id":{id},"offset":0}}"#,
    r#"{"set_workload":{"id":{id},"lease":999999,"workload":{"image":"localhost/gpux-test:busybox"}}}"#,
    r#"{"set_encryption_key":{"id":{id},"encryption_key":"0000000000000000000000000000000000000000000000000000000000000000","signature":"00000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000"}}"#,
    r#"{"host_key":{"id":{id},"lease":999999}}"#,
    r#"{"delivery_status":{"id":{id},"lease":999999,"state":"starting"}}"#,
    r#"{"lease_delivery":{"id":{id},"lease":999999}}"#,
    r#"{"lease_logs":{"id":{id},"lease":999999,"tail_bytes":1024}}"#,
    r#"{"logs":{"id":{id},"request":5,"data":"","truncated":false}}"#,
    r#"{"ping":{"id":{id}}}"#,
    r#"{"auth":{"id":{id},"public_key":"00","signature":"00","role":null}}"#,
];

const ROUNDS: usize = 3;
const PER_ROUND: usize = 400;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_request_kind_is_answered_and_frees_its_slot() {
    let dir = tempfile::tempdir().expect("temp dir");
    let exchange = Exchange::start(&dir.path().join("data"), None);
    assert!(ROUNDS * PER_ROUND > gpux_exchange::gateway::REQUESTS_IN_FLIGHT_MAX as usize);
    for (kind, template) in REQUESTS.iter().enumerate() {
        let (mut client, _) = Client::login(&exchange.addr, &key(kind as u8 + 1), Role::Renter).await;
        let mut id = 1_000u64;
        for _ in 0..ROUNDS {
            let first = id + 1;
            for _ in 0..PER_ROUND {
                id += 1;
                client.send_raw(Message::Text(template.replace("{id}", &id.to_string()).into())).await;
            }
            let mut answered = std::collections::BTreeSet::new();
            while answered.len() < PER_ROUND {
                let message = client.recv().await;
                if let ServerMessage::Error { code: ErrorCode::RateLimited, message, .. } = &message {
                    panic!("{template}: rate_limited ({message}) after {} answers: a leaked in-flight slot", answered.len());
                }
                if let Some(of) = message.answer_to() {
                    assert!((first..=id).contains(&of), "{template}: an answer to {of}, not asked in this round");
                    assert!(answered.insert(of), "{template}: {of} answered twice");
                }
            }
        }
    }
}
