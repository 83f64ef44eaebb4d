//! Verified hardware end to end (docs/market-rules.md "Verified hardware"):
//! five real agents on the fake backend against a real exchange that
//! challenges every GPU's compute as it registers, its memory bandwidth
//! right after, and both again every couple of seconds while idle. The
//! honest GPU passes both (again and again) and is verified; a GPU that
//! computes a wrong product, or runs the memory passes one short, is
//! rejected from its class for good; a GPU that answers either too slowly
//! for the class it claims (a slower card registered as an H100) leaves the
//! class. A bid for verified GPUs trades with the honest one only, and
//! every result is in the suppliers' public records.

use std::time::{Duration, Instant};

use ed25519_dalek::SigningKey;
use gpux_engine::{AccountId, ChallengeOutcome, InstrumentId, Side, TimeInForce};
use gpux_protocol::*;
use gpux_supplier_agent::session::Connection;

mod common;
use common::*;

/// An agent on host `name` with one H100 as described by `extra` (cheats).
fn agent(dir: &std::path::Path, url: &str, name: &str, extra: &str) -> (Agent, SigningKey) {
    let dir = dir.join(name);
    std::fs::create_dir_all(&dir).expect("agent dir");
    let key_file = dir.join("host.key");
    let config = dir.join("agent.toml");
    write(
        &config,
        &format!(
            "exchange = \"{url}\"\nhost = \"{name}\"\nkey_file = \"{}\"\nsample_interval_ms = 1000\nreport_interval_ms = 1000\n\n[[offer]]\ncontract = \"spot\"\nprice_floor_minor_per_gpu_hour = 2000000\n",
            key_file.display()
        ),
    );
    let host = dir.join("host.json");
    write(
        &host,
        &format!(
            r#"{{"gpus": [{{"uuid": "GPU-{name}", "vendor": "nvidia", "model": "NVIDIA H100 80GB HBM3", "memory_mib": 81559, "interconnect": "nv_link"{extra}}}]}}"#
        ),
    );
    let key = gpux_supplier_agent::keys::load_or_create(&key_file).expect("host key");
    (spawn_agent(&config, &host), key)
}

/// The supplier's GPU as the exchange shows it to its owner, once the
/// agent logged in and registered it.
async fn gpu_of(exchange: &Exchange, key: &SigningKey) -> Option<(AccountId, gpux_protocol::views::Gpu)> {
    let mut owner = Connection::open(&exchange.url, key, None).await.ok()?;
    let id = owner.new_id();
    let ServerMessage::Gpus { gpus, .. } = owner.request(ClientMessage::MyGpus { id, offset: 0 }).await.expect("gpus") else {
        panic!("gpus");
    };
    Some((owner.account, gpus.into_iter().next()?))
}

async fn record(client: &mut Connection, supplier: AccountId) -> ReliabilityRecord {
    let id = client.new_id();
    match client.request(ClientMessage::SupplierStats { id, supplier }).await.expect("supplier stats") {
        ServerMessage::SupplierStats { record, .. } => record,
        other => panic!("{other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn challenges_verify_the_honest_gpu_and_catch_a_wrong_and_a_slow_one() {
    let dir = tempfile::tempdir().expect("temp dir");
    let operator = SigningKey::from_bytes(&[1; 32]);
    let exchange = Exchange::start_with_challenges(&dir.path().join("exchange"), &operator, 2_000);
    let mut renter = funded_renter(&exchange, &operator, 3, 1_000_000_000).await;
    // The demo class: n = 256, at least 10 MFLOP/s, so at most 3.4 s to commit.
    let (_honest, honest_key) = agent(dir.path(), &exchange.url, "honest", "");
    let (_wrong, wrong_key) = agent(dir.path(), &exchange.url, "wrong", r#", "challenge_wrong": true"#);
    let (_slow, slow_key) = agent(dir.path(), &exchange.url, "slow", r#", "challenge_delay_ms": 5000"#);
    // The demo class's memory challenge: 2^16 words, 8 passes (6.55 MB) at
    // at least 10 MB/s, so at most 655 ms to commit.
    let (_memory_wrong, memory_wrong_key) = agent(dir.path(), &exchange.url, "memwrong", r#", "memory_wrong": true"#);
    let (_memory_slow, memory_slow_key) = agent(dir.path(), &exchange.url, "memslow", r#", "memory_delay_ms": 2000"#);

    // Each GPU's first challenge comes as it registers; the honest one is
    // challenged again while idle (every 1 to 3 s here).
    let deadline = Instant::now() + Duration::from_secs(60);
    let (honest, wrong, slow, memory_wrong, memory_slow) = loop {
        let results = (
            gpu_of(&exchange, &honest_key).await,
            gpu_of(&exchange, &wrong_key).await,
            gpu_of(&exchange, &slow_key).await,
            gpu_of(&exchange, &memory_wrong_key).await,
            gpu_of(&exchange, &memory_slow_key).await,
        );
        if let (Some(honest), Some(wrong), Some(slow), Some(memory_wrong), Some(memory_slow)) = &results {
            let honest_record = record(&mut renter, honest.0).await;
            if wrong.1.challenge.is_some()
                && slow.1.memory.is_some()
                && memory_wrong.1.memory.is_some()
                && memory_slow.1.memory.is_some()
                && honest_record.challenges_passed >= 3
            {
                break (honest.clone(), wrong.clone(), slow.clone(), memory_wrong.clone(), memory_slow.clone());
            }
        }
        assert!(Instant::now() < deadline, "every GPU answered its challenges: {results:?}");
        tokio::time::sleep(Duration::from_millis(500)).await;
    };
    let outcome = |gpu: &gpux_protocol::views::Gpu| gpu.challenge.map(|c| c.outcome);
    assert_eq!(outcome(&honest.1), Some(ChallengeOutcome::Passed), "{honest:?}");
    assert!(honest.1.verified && honest.1.classes == ["H100-SXM-80G"], "{honest:?}");
    assert!(honest.1.challenge.expect("challenged").mflops >= 10, "{honest:?}");
    assert!(honest.1.memory.is_some_and(|m| m.outcome == ChallengeOutcome::Passed && m.mbps >= 10), "{honest:?}");
    assert_eq!(outcome(&wrong.1), Some(ChallengeOutcome::WrongAnswer), "{wrong:?}");
    assert!(!wrong.1.verified && wrong.1.classes.is_empty() && wrong.1.challenge.expect("challenged").rejected, "{wrong:?}");
    assert_eq!(outcome(&slow.1), Some(ChallengeOutcome::TooSlow), "{slow:?}");
    assert!(!slow.1.verified && slow.1.classes.is_empty(), "{slow:?}");
    assert!(slow.1.challenge.expect("challenged").mflops < 10, "{slow:?}");
    assert_eq!(slow.1.memory.map(|m| m.outcome), Some(ChallengeOutcome::Passed), "its memory is fine: {slow:?}");
    // Memory a pass short: rejected for good, though its compute passed.
    assert_eq!(memory_wrong.1.challenge.map(|c| c.outcome), Some(ChallengeOutcome::Passed), "{memory_wrong:?}");
    assert_eq!(memory_wrong.1.memory.map(|m| m.outcome), Some(ChallengeOutcome::WrongAnswer), "{memory_wrong:?}");
    assert!(!memory_wrong.1.verified && memory_wrong.1.classes.is_empty(), "{memory_wrong:?}");
    assert!(memory_wrong.1.challenge.expect("challenged").rejected, "{memory_wrong:?}");
    // Memory too slow for the class: out of it.
    assert_eq!(memory_slow.1.memory.map(|m| m.outcome), Some(ChallengeOutcome::TooSlow), "{memory_slow:?}");
    assert!(memory_slow.1.memory.expect("challenged").mbps < 10, "{memory_slow:?}");
    assert!(!memory_slow.1.verified && memory_slow.1.classes.is_empty(), "{memory_slow:?}");

    // The public records say so; a wrong answer costs the score.
    let honest_record = record(&mut renter, honest.0).await;
    assert!(honest_record.challenges_passed >= 2 && honest_record.challenges_failed == 0, "{honest_record:?}");
    let wrong_record = record(&mut renter, wrong.0).await;
    assert_eq!(wrong_record.challenges_failed, 1, "rejected for good: not challenged again {wrong_record:?}");
    let slow_record = record(&mut renter, slow.0).await;
    assert!(slow_record.challenges_too_slow >= 1 && slow_record.challenges_failed == 0, "{slow_record:?}");
    let memory_wrong_record = record(&mut renter, memory_wrong.0).await;
    assert_eq!(memory_wrong_record.challenges_failed, 1, "{memory_wrong_record:?}");
    let memory_slow_record = record(&mut renter, memory_slow.0).await;
    assert!(memory_slow_record.challenges_too_slow >= 1, "{memory_slow_record:?}");

    // A bid for verified GPUs trades with the honest GPU.
    let mut order = OrderTicket::limit(1, InstrumentId(0), Side::Buy, 2_000_000, 1);
    order.time_in_force = TimeInForce::Ioc;
    order.verified_only = true;
    let id = renter.new_id();
    let placed = renter.request(ClientMessage::NewOrder { id, order, workload: None }).await.expect("bid");
    assert!(matches!(placed, ServerMessage::Ack { .. }), "{placed:?}");
    let id = renter.new_id();
    let ServerMessage::Leases { leases, .. } = renter.request(ClientMessage::Leases { id, after: None }).await.expect("leases") else {
        panic!("leases");
    };
    assert_eq!(leases.iter().map(|l| l.supplier).collect::<Vec<_>>(), [honest.0], "{leases:?}");
}
