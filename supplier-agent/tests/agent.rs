//! The real agent binary (fake backend) against a real exchange over real
//! sockets: it registers its GPUs, its offers appear in the book, a renter's
//! purchase reaches the delivery hook, and a GPU that fails leaves the book.

use std::io::Write;
use std::os::unix::fs::PermissionsExt;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use ed25519_dalek::SigningKey;
use gpux_engine::{InstrumentId, Role, Side};
use gpux_protocol::*;
use gpux_supplier_agent::session::Connection;

mod common;
use common::*;

const HOST: &str = r#"{"gpus": [
    {"uuid": "GPU-a", "vendor": "nvidia", "model": "NVIDIA H100 80GB HBM3", "memory_mib": 81559, "interconnect": "nv_link"},
    {"uuid": "GPU-b", "vendor": "nvidia", "model": "NVIDIA H100 80GB HBM3", "memory_mib": 81559, "interconnect": "nv_link"}],
  "utilisation_percent": 80,
  "faults": [{"gpu": "GPU-b", "from_ms": 4000, "until_ms": 600000, "kind": "offline"}]}"#;

/// A host of one H100.
const ONE_GPU: &str = r#"{"gpus": [{"uuid": "GPU-a", "vendor": "nvidia", "model": "NVIDIA H100 80GB HBM3", "memory_mib": 81559, "interconnect": "nv_link"}]}"#;

fn agent_files(dir: &std::path::Path, url: &str) -> (std::path::PathBuf, std::path::PathBuf, std::path::PathBuf) {
    agent_files_with(dir, url, HOST)
}

fn agent_files_with(dir: &std::path::Path, url: &str, host_json: &str) -> (std::path::PathBuf, std::path::PathBuf, std::path::PathBuf) {
    let hook_log = dir.join("deliveries.log");
    let hook = dir.join("hook.sh");
    write(&hook, &format!("#!/bin/sh\necho \"$@\" >> {}\n", hook_log.display()));
    std::fs::set_permissions(&hook, std::fs::Permissions::from_mode(0o755)).expect("chmod hook");
    let config = dir.join("agent.toml");
    write(
        &config,
        &format!(
            "exchange = \"{url}\"\nhost = \"node-1\"\nkey_file = \"{}\"\nsample_interval_ms = 1000\nreport_interval_ms = 1000\ndelivery_hook = \"{}\"\n\n[[offer]]\ncontract = \"spot\"\nprice_floor_minor_per_gpu_hour = 2100000\n",
            dir.join("host.key").display(),
            hook.display()
        ),
    );
    let host = dir.join("host.json");
    write(&host, host_json);
    (config, host, hook_log)
}

/// A one-GPU host's agent (the delivery hook) whose ask is on the book, and
/// a funded renter watching the book: the agent's files, the agent, the renter.
async fn one_gpu_on_sale(
    dir: &std::path::Path,
    exchange: &Exchange,
    operator: &SigningKey,
) -> (std::path::PathBuf, std::path::PathBuf, common::Agent, Connection) {
    let (config, host, _) = agent_files_with(dir, &exchange.url, ONE_GPU);
    let mut renter = funded_renter(exchange, operator, 3, 1_000_000_000).await;
    let id = renter.new_id();
    renter.request(ClientMessage::Subscribe { id, channel: Channel::Book, instrument: InstrumentId(0) }).await.expect("subscribe");
    let agent = spawn_agent(&config, &host);
    await_ask_quantity(&mut renter, &mut std::collections::BTreeMap::new(), 1).await;
    (config, host, agent, renter)
}

/// Buys the one GPU on sale (a GTC bid at the agent's floor): the lease and its start.
async fn buy_the_gpu(renter: &mut Connection) -> (gpux_engine::LeaseId, u64) {
    let id = renter.new_id();
    let order = OrderTicket::limit(1, InstrumentId(0), Side::Buy, 2_100_000, 1);
    let bought = renter.request(ClientMessage::NewOrder { id, order, workload: None }).await;
    assert!(matches!(bought, Ok(ServerMessage::Ack { order: Some(_), .. })), "{bought:?}");
    loop {
        if let ServerMessage::Private { event, .. } = renter.next().await.expect("message") {
            if let gpux_engine::EventKind::LeaseCreated { lease, start_ms, .. } = event.kind {
                return (lease, start_ms);
            }
        }
    }
}

/// The renter ends its lease: the time the exchange ended it.
async fn end_the_lease(renter: &mut Connection, lease: gpux_engine::LeaseId) -> u64 {
    let id = renter.new_id();
    let ended = renter.request(ClientMessage::EndLease { id, lease }).await.expect("end lease");
    assert!(matches!(ended, ServerMessage::Ack { .. }), "{ended:?}");
    loop {
        if let ServerMessage::Private { event, .. } = renter.next().await.expect("message") {
            if matches!(event.kind, gpux_engine::EventKind::LeaseEnded { .. }) {
                return event.at_ms;
            }
        }
    }
}

/// Reads book messages until the asks' total equals `quantity` (10 s).
async fn await_ask_quantity(renter: &mut Connection, asks: &mut std::collections::BTreeMap<u64, u64>, quantity: u64) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while asks.values().sum::<u64>() != quantity {
        let left = deadline.saturating_duration_since(Instant::now());
        match tokio::time::timeout(left, renter.next()).await.expect("book reaches the expected size in time").expect("message") {
            ServerMessage::BookSnapshot { asks: levels, .. } => *asks = levels.into_iter().collect(),
            ServerMessage::BookUpdate { side: Side::Sell, price_minor_per_gpu_hour, quantity, .. } => {
                asks.insert(price_minor_per_gpu_hour, quantity);
                asks.retain(|_, q| *q > 0);
            }
            _ => {}
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_agent_registers_offers_delivers_and_withdraws_a_failed_gpu() {
    let dir = tempfile::tempdir().expect("temp dir");
    let operator = SigningKey::from_bytes(&[1; 32]);
    let exchange = Exchange::start(&dir.path().join("exchange"), &operator);
    let (config, host, hook_log) = agent_files(dir.path(), &exchange.url);

    let mut renter = funded_renter(&exchange, &operator, 3, 1_000_000_000).await;
    let id = renter.new_id();
    renter.request(ClientMessage::Subscribe { id, channel: Channel::Book, instrument: InstrumentId(0) }).await.expect("subscribe");

    let spawned = Instant::now();
    let _agent = spawn_agent(&config, &host);
    let mut asks = std::collections::BTreeMap::new();
    await_ask_quantity(&mut renter, &mut asks, 2).await;
    assert_eq!(asks.keys().copied().collect::<Vec<_>>(), [2_100_000], "offered at the owner's floor");

    let id = renter.new_id();
    let bought = renter
        .request(ClientMessage::NewOrder { id, order: OrderTicket::limit(1, InstrumentId(0), Side::Buy, 2_100_000, 1), workload: None })
        .await;
    assert!(matches!(bought, Ok(ServerMessage::Ack { order: Some(_), .. })), "{bought:?}");
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let log = std::fs::read_to_string(&hook_log).unwrap_or_default();
        if let Some(line) = log.lines().find(|l| l.starts_with("start ")) {
            assert!(line.contains("GPU-a"), "the leased GPU is handed to the hook: {line}");
            break;
        }
        assert!(Instant::now() < deadline, "the delivery hook ran: {log:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // Settled after the sale: GPU-b alone is on offer.
    tokio::time::sleep(Duration::from_millis(1_000)).await;
    assert_eq!(book_asks(&mut renter).await, 1);
    // The renter sees how its GPU is doing: the host's signed reports, with
    // the utilisation the host measured (the fake host's 80%).
    let deadline = Instant::now() + Duration::from_secs(10);
    let gpus = loop {
        let id = renter.new_id();
        let Ok(ServerMessage::LeaseTelemetry { gpus, .. }) =
            renter.request(ClientMessage::LeaseTelemetry { id, lease: gpux_engine::LeaseId(0) }).await
        else {
            panic!("telemetry")
        };
        // A report whose interval held no health sample says 0%: wait for one that did.
        if gpus.first().is_some_and(|g| g.samples.iter().any(|s| s.utilisation_percent > 0)) || Instant::now() > deadline {
            break gpus;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    assert_eq!(gpus.len(), 1, "{gpus:?}");
    assert_eq!(gpus[0].gpu_uuid, "GPU-a");
    let samples = &gpus[0].samples;
    assert!(samples.iter().any(|s| s.utilisation_percent == 80) && samples.iter().all(|s| s.available_ms > 0), "{gpus:?}");
    // And its temperature and power, signed in the same reports (version 2):
    // the fake host's 60 °C and 300 W.
    let measured = samples.iter().find(|s| s.utilisation_percent == 80).expect("a measured interval");
    assert_eq!((measured.temperature_c_max, measured.power_w_mean), (Some(60), Some(300)), "{gpus:?}");
    // GPU-b goes offline 4 s into the agent's run: the agent withdraws it and it stays out.
    tokio::time::sleep((spawned + Duration::from_secs(7)).saturating_duration_since(Instant::now())).await;
    assert_eq!(book_asks(&mut renter).await, 0);
}

/// The total quantity of asks in a fresh snapshot of the H100 spot book.
async fn book_asks(renter: &mut Connection) -> u64 {
    let id = renter.new_id();
    renter.request(ClientMessage::Unsubscribe { id, channel: Channel::Book, instrument: InstrumentId(0) }).await.expect("unsubscribe");
    let id = renter.new_id();
    renter.request(ClientMessage::Subscribe { id, channel: Channel::Book, instrument: InstrumentId(0) }).await.expect("subscribe");
    loop {
        if let ServerMessage::BookSnapshot { asks, .. } = renter.next().await.expect("message") {
            return asks.iter().map(|(_, quantity)| quantity).sum();
        }
    }
}

#[test]
fn the_agent_refuses_a_host_key_others_can_read() {
    let dir = tempfile::tempdir().expect("temp dir");
    let (config, host, _) = agent_files(dir.path(), "ws://127.0.0.1:9");
    let key = dir.path().join("host.key");
    let mut file = std::fs::File::create(&key).expect("key file");
    writeln!(file, "{}", "11".repeat(32)).expect("write key");
    std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o644)).expect("chmod");
    let output =
        Command::new(env!("CARGO_BIN_EXE_gpux-agent")).arg("--config").arg(&config).arg("--fake").arg(&host).output().expect("runs");
    assert!(!output.status.success());
    assert!(String::from_utf8_lossy(&output.stderr).contains("chmod 600"));
}

/// On a host without the vendor's tool, each backend stops the agent with
/// a message that names what to install (no tool here has the hardware).
#[test]
fn a_vendor_backend_without_its_tool_says_what_to_install() {
    let dir = tempfile::tempdir().expect("temp dir");
    let (config, _, _) = agent_files(dir.path(), "ws://127.0.0.1:9");
    for (backend, expected) in [
        ("amd", "install ROCm"),
        ("ascend", "install the Ascend NPU driver"),
        ("cambricon", "install the Cambricon MLU driver"),
        ("iluvatar", "install the Iluvatar CoreX driver"),
    ] {
        let output = Command::new(env!("CARGO_BIN_EXE_gpux-agent"))
            .arg("--config")
            .arg(&config)
            .args(["--backend", backend])
            .env("PATH", dir.path())
            .output()
            .expect("runs");
        assert!(!output.status.success(), "{backend}");
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(stderr.contains(expected), "{backend}: {stderr}");
    }
    let output =
        Command::new(env!("CARGO_BIN_EXE_gpux-agent")).arg("--config").arg(&config).args(["--backend", "tpu"]).output().expect("runs");
    assert!(!output.status.success());
    assert!(String::from_utf8_lossy(&output.stderr).contains("possible values: nvml, amd, ascend, cambricon, iluvatar"));
}

/// Reports flow every second; the exchange then stops for 30 s and comes
/// back; the agent buffers on disk, reconnects with back-off and delivers
/// its reports in order, so the lease is billed for every millisecond it ran,
/// outage included, to the minor unit.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn usage_is_reported_through_a_30_second_outage_and_billed_exactly() {
    let dir = tempfile::tempdir().expect("temp dir");
    let operator = SigningKey::from_bytes(&[1; 32]);
    let mut exchange = Exchange::start(&dir.path().join("exchange"), &operator);
    let healthy_host = r#"{"gpus": [{"uuid": "GPU-a", "vendor": "nvidia", "model": "NVIDIA H100 80GB HBM3", "memory_mib": 81559, "interconnect": "nv_link"}]}"#;
    let (config, host, _) = agent_files_with(dir.path(), &exchange.url, healthy_host);
    let renter_key = SigningKey::from_bytes(&[3; 32]);
    let deposit = 1_000_000_000;
    let mut renter = funded_renter(&exchange, &operator, 3, deposit).await;
    let id = renter.new_id();
    renter.request(ClientMessage::Subscribe { id, channel: Channel::Book, instrument: InstrumentId(0) }).await.expect("subscribe");
    let _agent = spawn_agent(&config, &host);
    let mut asks = std::collections::BTreeMap::new();
    await_ask_quantity(&mut renter, &mut asks, 1).await;
    let (lease, start_ms) = buy_the_gpu(&mut renter).await;
    tokio::time::sleep(Duration::from_millis(2_500)).await;
    exchange.stop();
    tokio::time::sleep(Duration::from_secs(30)).await;
    exchange.start_again();

    let mut renter = Connection::open(&exchange.url, &renter_key, Some(Role::Renter)).await.expect("renter again");
    // Give the agent time to reconnect and deliver what it buffered.
    tokio::time::sleep(Duration::from_secs(4)).await;
    let ended_at_ms = end_the_lease(&mut renter, lease).await;
    let expected = (2_100_000u128 * (ended_at_ms - start_ms) as u128 / 3_600_000) as u64;
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let id = renter.new_id();
        let ServerMessage::Balance { available_minor, held_minor, .. } =
            renter.request(ClientMessage::Balance { id }).await.expect("balance")
        else {
            panic!("a balance");
        };
        // What is still held is escrow awaiting the billing close.
        let billed = deposit - available_minor - held_minor;
        if billed == expected {
            break;
        }
        assert!(Instant::now() < deadline, "billed {billed} of {expected} expected for {} ms (held {held_minor})", ended_at_ms - start_ms);
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    // Its ask filled, the lease came, the exchange went away and back: the
    // agent never sent a request the exchange refused (its ask's
    // `order_closed` follows the `lease_created`; it offers again once both
    // are read, not in between).
    exchange.stop();
    assert_eq!(journaled_rejections(&dir.path().join("exchange")), Vec::<String>::new());
}

/// kill -9 of the agent mid-lease, restarted 5 s later: the gap between its
/// last report and the new process's start was measured by nobody, so it is
/// not billed (docs/market-rules.md "Delivery": gaps nobody reported are not
/// billed). Before, the first report after the restart counted the whole gap
/// as available, from samples taken after the restart.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_time_a_killed_agent_was_down_is_not_billed() {
    let dir = tempfile::tempdir().expect("temp dir");
    let operator = SigningKey::from_bytes(&[1; 32]);
    let exchange = Exchange::start(&dir.path().join("exchange"), &operator);
    let (config, host, mut agent, mut renter) = one_gpu_on_sale(dir.path(), &exchange, &operator).await;
    let (lease, start_ms) = buy_the_gpu(&mut renter).await;
    tokio::time::sleep(Duration::from_millis(2_500)).await;
    let _ = agent.0.kill();
    let _ = agent.0.wait();
    let killed_ms = now_ms();
    tokio::time::sleep(Duration::from_secs(5)).await;
    let restarted_ms = now_ms();
    let _agent = spawn_agent(&config, &host);
    tokio::time::sleep(Duration::from_millis(3_000)).await;
    let ended_ms = end_the_lease(&mut renter, lease).await;
    // Billed time settles once the agent sent its last report; read it until it stops moving.
    let (mut last, mut still_since) = (u64::MAX, Instant::now());
    let deadline = Instant::now() + Duration::from_secs(15);
    let verified = loop {
        let id = renter.new_id();
        let ServerMessage::Leases { leases, .. } = renter.request(ClientMessage::Leases { id, after: None }).await.expect("leases") else {
            panic!("leases")
        };
        let verified = leases.iter().find(|l| l.lease == lease).expect("the lease").verified_gpu_ms;
        if verified != last {
            (last, still_since) = (verified, Instant::now());
        } else if still_since.elapsed() > Duration::from_secs(2) {
            break verified;
        }
        assert!(Instant::now() < deadline, "billing settled");
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    // At most what both processes measured: from the lease's start to the
    // kill, and from the restart to the end (one ms of rounding a report).
    let measured = (killed_ms - start_ms) + (ended_ms - restarted_ms);
    assert!(verified <= measured + 2, "billed {verified} ms of the {measured} ms measured ({} ms in all)", ended_ms - start_ms);
    assert!(verified + 3_000 >= measured, "billed {verified} ms: what was measured is paid ({measured} ms)");
}

/// The agent is killed with reports it could not send (the exchange was
/// down) still on disk; the lease ends, and its billing grace passes, while
/// the agent is gone: the bill is provisional (both sides told what is
/// kept for the missing time), the restarted agent sends the reports, they
/// are billed as late usage, and the bill is final as soon as they cover
/// the lease (docs/market-rules.md "Late reports").
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reports_an_agent_kept_on_disk_through_a_kill_are_billed_after_the_grace() {
    let dir = tempfile::tempdir().expect("temp dir");
    let operator = SigningKey::from_bytes(&[1; 32]);
    let renter_key = SigningKey::from_bytes(&[3; 32]);
    // A 2 s grace; late reports are taken for 10 minutes after it.
    let mut exchange = Exchange::start_with_billing(&dir.path().join("exchange"), &operator, 2_000, 600_000);
    let (config, host, mut agent, mut renter) = one_gpu_on_sale(dir.path(), &exchange, &operator).await;
    let (lease, start_ms) = buy_the_gpu(&mut renter).await;
    tokio::time::sleep(Duration::from_millis(2_500)).await;
    // The exchange goes away for 8 s: the agent measures and keeps its
    // reports on disk; then it is killed before it can send them.
    exchange.stop();
    tokio::time::sleep(Duration::from_secs(8)).await;
    let _ = agent.0.kill();
    let _ = agent.0.wait();
    let killed_ms = now_ms();
    exchange.start_again();
    let mut renter = Connection::open(&exchange.url, &renter_key, Some(Role::Renter)).await.expect("renter again");
    let ended_ms = end_the_lease(&mut renter, lease).await;
    // The grace passes with about 9 s of the lease unreported.
    let provisional = loop {
        if let ServerMessage::Private { event, .. } = renter.next().await.expect("message") {
            if let gpux_engine::EventKind::LeaseBillProvisional { lease: l, unreported_gpu_ms, kept_minor, released_minor, .. } = event.kind
            {
                assert_eq!(l, lease);
                break (unreported_gpu_ms, kept_minor, released_minor);
            }
        }
    };
    let (unreported_ms, kept, _) = provisional;
    assert!(unreported_ms > 5_000 && unreported_ms <= ended_ms - start_ms, "{provisional:?}");
    assert_eq!(kept, (2_100_000u128 * unreported_ms as u128).div_ceil(3_600_000) as u64, "what the missing time could cost is kept");
    let lease_info = |leases: Vec<gpux_protocol::views::Lease>| leases.into_iter().find(|l| l.lease == lease).expect("the lease");
    let id = renter.new_id();
    let ServerMessage::Leases { leases, .. } = renter.request(ClientMessage::Leases { id, after: None }).await.expect("leases") else {
        panic!("leases")
    };
    let before = lease_info(leases);
    assert!(!before.billing_closed && before.escrow_minor == kept, "{before:?}");

    // Back, the agent sends what it kept: billed, and the bill is final.
    let _agent = spawn_agent(&config, &host);
    let deadline = Instant::now() + Duration::from_secs(20);
    let after = loop {
        let id = renter.new_id();
        let ServerMessage::Leases { leases, .. } = renter.request(ClientMessage::Leases { id, after: None }).await.expect("leases") else {
            panic!("leases")
        };
        let info = lease_info(leases);
        if info.billing_closed {
            break info;
        }
        assert!(Instant::now() < deadline, "the late reports make the bill final: {info:?}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    // Everything measured is paid: up to the kill (the rest of the lease
    // was measured by nobody, within the allowance).
    let measured = killed_ms - start_ms;
    assert!(after.verified_gpu_ms + 3_000 >= measured && after.verified_gpu_ms <= ended_ms - start_ms, "{after:?}, measured {measured}");
    assert_eq!(after.escrow_minor, 0);
    let id = renter.new_id();
    let ServerMessage::Statement { lines, .. } = renter.request(ClientMessage::Statement { id, after: None }).await.expect("statement")
    else {
        panic!("statement")
    };
    let late: u64 = lines.iter().filter(|l| l.lease == Some(lease) && l.kind == "late_usage_charge").map(|l| l.amount_minor).sum();
    assert!(late > 0 && late + before.usage_charged_minor == after.usage_charged_minor, "late usage {late}: {lines:?}");
}

/// A host whose clock runs 20 s ahead of the exchange's (docs/agent.md
/// "Clock"): its agent stamps reports in the exchange's time, measured at
/// login, so none is refused `from_future` and the renter pays for the
/// time delivered, to the report.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_host_whose_clock_runs_20_s_ahead_is_paid_for_what_it_delivered() {
    let dir = tempfile::tempdir().expect("temp dir");
    let operator = SigningKey::from_bytes(&[1; 32]);
    let mut exchange = Exchange::start_skewed(&dir.path().join("exchange"), &operator, -20_000);
    let (_config, _host, _agent, mut renter) = one_gpu_on_sale(dir.path(), &exchange, &operator).await;
    let (lease, start_ms) = buy_the_gpu(&mut renter).await;
    tokio::time::sleep(Duration::from_millis(4_000)).await;
    let ended_ms = end_the_lease(&mut renter, lease).await;
    let deadline = Instant::now() + Duration::from_secs(15);
    let verified = loop {
        let id = renter.new_id();
        let ServerMessage::Leases { leases, .. } = renter.request(ClientMessage::Leases { id, after: None }).await.expect("leases") else {
            panic!("leases")
        };
        let verified = leases.iter().find(|l| l.lease == lease).expect("the lease").verified_gpu_ms;
        if verified + 1_000 >= ended_ms - start_ms {
            break verified;
        }
        assert!(Instant::now() < deadline, "verified {verified} ms of the {} ms leased", ended_ms - start_ms);
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    assert!(verified <= ended_ms - start_ms, "never more than the lease: {verified} ms");
    exchange.stop();
    let refused = journaled_rejections(&dir.path().join("exchange"));
    assert!(!refused.iter().any(|line| line.contains("from_future")), "{refused:?}");
}

/// A host whose agent runs no workloads (the delivery hook only) publishes
/// no encryption key: a bid that carries a workload never leases its GPU
/// (the renter would pay for GPUs its workload cannot reach), a bid without
/// one does.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_workload_bid_never_leases_a_host_that_runs_no_workloads() {
    let dir = tempfile::tempdir().expect("temp dir");
    let operator = SigningKey::from_bytes(&[1; 32]);
    let exchange = Exchange::start(&dir.path().join("exchange"), &operator);
    let (_, _, _agent, mut renter) = one_gpu_on_sale(dir.path(), &exchange, &operator).await;
    let bid = |client_order_id| {
        let mut order = OrderTicket::limit(client_order_id, InstrumentId(0), Side::Buy, 2_100_000, 1);
        order.time_in_force = gpux_engine::TimeInForce::Ioc;
        order
    };
    let leased = |message: &ServerMessage| matches!(message, ServerMessage::Private { event, .. } if matches!(event.kind, gpux_engine::EventKind::LeaseCreated { .. }));
    let id = renter.new_id();
    let workload = Box::new(Workload { secrets_follow: true, ..Workload::image("localhost/app:1") });
    let answer = renter.request(ClientMessage::NewOrder { id, order: bid(1), workload: Some(workload) }).await.expect("bid");
    assert!(matches!(answer, ServerMessage::Ack { .. }), "{answer:?}");
    let deadline = Instant::now() + Duration::from_secs(2);
    while let Ok(message) = tokio::time::timeout(deadline.saturating_duration_since(Instant::now()), renter.next()).await {
        assert!(!leased(&message.expect("message")), "a workload bid leased a host that runs no workloads");
    }
    let id = renter.new_id();
    renter.request(ClientMessage::NewOrder { id, order: bid(2), workload: None }).await.expect("bid");
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let message = tokio::time::timeout(deadline.saturating_duration_since(Instant::now()), renter.next()).await;
        if leased(&message.expect("a lease for the plain bid").expect("message")) {
            break;
        }
    }
}

fn now_ms() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).expect("clock").as_millis() as u64
}

/// A preemptible lease on the agent's GPU is preempted by a spot buyer: the
/// delivery hook hears `preempt` with the deadline the notice gave.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_preemption_notice_reaches_the_delivery_hook_with_its_deadline() {
    let dir = tempfile::tempdir().expect("temp dir");
    let operator = SigningKey::from_bytes(&[1; 32]);
    let exchange = Exchange::start(&dir.path().join("exchange"), &operator);
    let (config, host, hook_log) = agent_files_with(dir.path(), &exchange.url, ONE_GPU);
    let text = std::fs::read_to_string(&config).expect("config");
    write(&config, &format!("{text}\n[[offer]]\ncontract = \"preemptible\"\nprice_floor_minor_per_gpu_hour = 800000\n"));

    let mut batch = funded_renter(&exchange, &operator, 3, 1_000_000_000).await;
    let mut urgent = funded_renter(&exchange, &operator, 4, 1_000_000_000).await;
    let id = batch.new_id();
    batch.request(ClientMessage::Subscribe { id, channel: Channel::Book, instrument: InstrumentId(1) }).await.expect("subscribe");
    let _agent = spawn_agent(&config, &host);
    let mut asks = std::collections::BTreeMap::new();
    await_ask_quantity(&mut batch, &mut asks, 1).await;
    let id = batch.new_id();
    let cheap = batch
        .request(ClientMessage::NewOrder { id, order: OrderTicket::limit(1, InstrumentId(1), Side::Buy, 800_000, 1), workload: None })
        .await;
    assert!(matches!(cheap, Ok(ServerMessage::Ack { .. })), "{cheap:?}");
    // The agent keeps the GPU in its spot ask while the preemptible lease runs.
    let deadline = Instant::now() + Duration::from_secs(10);
    let notice = loop {
        let id = urgent.new_id();
        let order = OrderTicket::limit(id, InstrumentId(0), Side::Buy, 2_100_000, 1);
        let mut order = order;
        order.time_in_force = gpux_engine::TimeInForce::Ioc;
        let _ = urgent.request(ClientMessage::NewOrder { id, order, workload: None }).await.expect("spot bid");
        let log = std::fs::read_to_string(&hook_log).unwrap_or_default();
        if let Some(line) = log.lines().find(|l| l.starts_with("preempt ")) {
            break line.to_string();
        }
        assert!(Instant::now() < deadline, "the hook heard a preemption: {log:?}");
        tokio::time::sleep(Duration::from_millis(300)).await;
    };
    let deadline_ms: u64 = notice.rsplit(' ').next().and_then(|ms| ms.parse().ok()).expect("a deadline in ms");
    assert!(deadline_ms > 0 && notice.contains("GPU-a"), "{notice}");
}

/// The owner offers the next two hourly windows and next month too, and runs
/// a job of their own on GPU-b: the agent keeps GPU-b out of every ask
/// ("taken locally"), and offers GPU-a in spot, in each of the two hourly
/// windows and in the first monthly window.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reserved_windows_are_offered_and_a_gpu_in_local_use_is_not() {
    let dir = tempfile::tempdir().expect("temp dir");
    let operator = SigningKey::from_bytes(&[1; 32]);
    let exchange = Exchange::start(&dir.path().join("exchange"), &operator);
    let busy_b = r#"{"gpus": [
        {"uuid": "GPU-a", "vendor": "nvidia", "model": "NVIDIA H100 80GB HBM3", "memory_mib": 81559, "interconnect": "nv_link"},
        {"uuid": "GPU-b", "vendor": "nvidia", "model": "NVIDIA H100 80GB HBM3", "memory_mib": 81559, "interconnect": "nv_link"}],
      "faults": [{"gpu": "GPU-b", "from_ms": 0, "until_ms": 600000, "kind": "busy"}]}"#;
    let (config, host, _) = agent_files_with(dir.path(), &exchange.url, busy_b);
    let text = std::fs::read_to_string(&config).expect("config");
    write(
        &config,
        &format!(
            "{text}\n[[offer]]\ncontract = \"hourly_window\"\nprice_floor_minor_per_gpu_hour = 1800000\nwindows_ahead = 2\n\
             \n[[offer]]\ncontract = \"monthly_window\"\nprice_floor_minor_per_gpu_hour = 1500000\nwindows_ahead = 1\n"
        ),
    );
    let mut watcher = Connection::open(&exchange.url, &SigningKey::from_bytes(&[3; 32]), Some(Role::Renter)).await.expect("watcher");
    let _agent = spawn_agent(&config, &host);
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        // The tradable hourly windows now (one may stop trading mid-test).
        let hourly = trading_hourly_windows(&mut watcher).await;
        let spot = book_asks_of(&mut watcher, InstrumentId(0)).await;
        let first = book_asks_of(&mut watcher, hourly[0].1).await;
        let second = book_asks_of(&mut watcher, hourly[1].1).await;
        let third = book_asks_of(&mut watcher, hourly[2].1).await;
        let monthly = trading_windows(&mut watcher, "/1M").await;
        let month = book_asks_of(&mut watcher, monthly[0].1).await;
        let next_month = book_asks_of(&mut watcher, monthly[1].1).await;
        if (spot, first, second, third, month, next_month) == (1, 1, 1, 0, 1, 0) {
            break;
        }
        assert!(Instant::now() < deadline, "spot {spot}, windows {first} {second} {third}, months {month} {next_month}");
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
}

async fn trading_hourly_windows(client: &mut Connection) -> Vec<(u64, InstrumentId)> {
    trading_windows(client, "/1H").await
}

async fn trading_windows(client: &mut Connection, label: &str) -> Vec<(u64, InstrumentId)> {
    let id = client.new_id();
    let ServerMessage::Instruments { instruments, .. } = client.request(ClientMessage::Instruments { id }).await.expect("instruments")
    else {
        panic!("instruments")
    };
    let mut hourly: Vec<(u64, InstrumentId)> = instruments
        .iter()
        .filter(|i| {
            i.symbol.starts_with("H100-SXM-80G/R/") && i.symbol.ends_with(label) && i.state == gpux_engine::InstrumentState::Trading
        })
        .filter_map(|i| match i.contract {
            gpux_engine::ContractKind::Reserved { window_start_ms, .. } => Some((window_start_ms, i.instrument)),
            _ => None,
        })
        .collect();
    hourly.sort();
    hourly
}

/// The total quantity of asks in a fresh snapshot of one book.
async fn book_asks_of(client: &mut Connection, instrument: InstrumentId) -> u64 {
    let id = client.new_id();
    client.request(ClientMessage::Subscribe { id, channel: Channel::Book, instrument }).await.expect("subscribe");
    let asks = loop {
        if let ServerMessage::BookSnapshot { instrument: i, asks, .. } = client.next().await.expect("message") {
            if i == instrument {
                break asks;
            }
        }
    };
    let id = client.new_id();
    client.request(ClientMessage::Unsubscribe { id, channel: Channel::Book, instrument }).await.expect("unsubscribe");
    asks.iter().map(|(_, quantity)| quantity).sum()
}

/// A delivery hook that cannot start the renter's job makes the agent take
/// the GPU off the market and report it unavailable: the renter pays nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_delivery_is_not_billed() {
    let dir = tempfile::tempdir().expect("temp dir");
    let operator = SigningKey::from_bytes(&[1; 32]);
    let exchange = Exchange::start(&dir.path().join("exchange"), &operator);
    let (config, host, _) = agent_files_with(dir.path(), &exchange.url, ONE_GPU);
    write(&dir.path().join("hook.sh"), "#!/bin/sh\n[ \"$1\" = start ] && exit 1\nexit 0\n");
    let deposit = 1_000_000_000;
    let mut renter = funded_renter(&exchange, &operator, 3, deposit).await;
    let id = renter.new_id();
    renter.request(ClientMessage::Subscribe { id, channel: Channel::Book, instrument: InstrumentId(0) }).await.expect("subscribe");
    let _agent = spawn_agent(&config, &host);
    let mut asks = std::collections::BTreeMap::new();
    await_ask_quantity(&mut renter, &mut asks, 1).await;
    let id = renter.new_id();
    renter
        .request(ClientMessage::NewOrder { id, order: OrderTicket::limit(1, InstrumentId(0), Side::Buy, 2_100_000, 1), workload: None })
        .await
        .expect("buy");
    let lease = loop {
        if let ServerMessage::Private { event, .. } = renter.next().await.expect("message") {
            if let gpux_engine::EventKind::LeaseCreated { lease, .. } = event.kind {
                break lease;
            }
        }
    };
    tokio::time::sleep(Duration::from_millis(3_500)).await;
    let id = renter.new_id();
    renter.request(ClientMessage::EndLease { id, lease }).await.expect("end");
    tokio::time::sleep(Duration::from_millis(2_000)).await;
    let id = renter.new_id();
    let ServerMessage::Balance { available_minor, held_minor, .. } = renter.request(ClientMessage::Balance { id }).await.expect("balance")
    else {
        panic!("balance")
    };
    assert_eq!(available_minor + held_minor, deposit, "nothing billed for a GPU that was never delivered");
}

/// The owner makes the GPU available only later today: the agent sells
/// reserved windows inside that period and nothing on spot now.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_availability_schedule_limits_what_is_offered() {
    let dir = tempfile::tempdir().expect("temp dir");
    let operator = SigningKey::from_bytes(&[1; 32]);
    let exchange = Exchange::start(&dir.path().join("exchange"), &operator);
    let (config, host, _) = agent_files_with(dir.path(), &exchange.url, ONE_GPU);
    let now_ms = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).expect("clock").as_millis() as u64;
    let hour = |ms: u64| (ms / 3_600_000) % 24;
    let (from, until) = (hour(now_ms) + 2, hour(now_ms) + 4);
    let text = std::fs::read_to_string(&config).expect("config");
    write(
        &config,
        &format!(
            "{text}\n[[offer]]\ncontract = \"hourly_window\"\nprice_floor_minor_per_gpu_hour = 1800000\nwindows_ahead = 6\n\n[[available]]\nfrom_utc = \"{:02}:00\"\nuntil_utc = \"{:02}:00\"\n",
            from % 24,
            until % 24
        ),
    );
    let mut watcher = Connection::open(&exchange.url, &SigningKey::from_bytes(&[3; 32]), Some(Role::Renter)).await.expect("watcher");
    let _agent = spawn_agent(&config, &host);
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let windows = trading_hourly_windows(&mut watcher).await;
        let inside: Vec<InstrumentId> = windows
            .iter()
            .filter(|(start, _)| (from..until).contains(&((start / 3_600_000) % 24 + if hour(*start) < hour(now_ms) { 24 } else { 0 })))
            .map(|(_, i)| *i)
            .collect();
        let mut offered_inside = 0;
        for instrument in &inside {
            offered_inside += book_asks_of(&mut watcher, *instrument).await;
        }
        if offered_inside == 2 {
            break;
        }
        assert!(Instant::now() < deadline, "the two windows inside the schedule are offered ({offered_inside})");
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    assert_eq!(book_asks_of(&mut watcher, InstrumentId(0)).await, 0, "nothing on spot outside the schedule");
    let windows = trading_hourly_windows(&mut watcher).await;
    let inside_schedule = |start: u64| (from..until).contains(&(hour(start) + if hour(start) < hour(now_ms) { 24 } else { 0 }));
    let outside = windows.iter().find(|(start, _)| !inside_schedule(*start)).expect("a listed window outside the schedule").1;
    assert_eq!(book_asks_of(&mut watcher, outside).await, 0, "nor in a window outside it");
}

/// A host with two kinds of GPU sells each in its own class: the H100 in
/// `H100-SXM-80G/SPOT`, the RTX 4090 in `RTX4090-24G/SPOT`; a renter buys
/// in each book and both leases reach the delivery hook.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_host_with_mixed_models_offers_each_in_its_own_class() {
    let dir = tempfile::tempdir().expect("temp dir");
    let operator = SigningKey::from_bytes(&[1; 32]);
    let exchange = Exchange::start(&dir.path().join("exchange"), &operator);
    let mixed = r#"{"gpus": [
        {"uuid": "GPU-h", "vendor": "nvidia", "model": "NVIDIA H100 80GB HBM3", "memory_mib": 81559, "interconnect": "nv_link"},
        {"uuid": "GPU-r", "vendor": "nvidia", "model": "NVIDIA GeForce RTX 4090", "memory_mib": 24564, "interconnect": "pcie"}]}"#;
    let (config, host, hook_log) = agent_files_with(dir.path(), &exchange.url, mixed);
    let mut renter = funded_renter(&exchange, &operator, 3, 1_000_000_000).await;
    let id = renter.new_id();
    let ServerMessage::Instruments { instruments, .. } = renter.request(ClientMessage::Instruments { id }).await.expect("instruments")
    else {
        panic!("instruments");
    };
    let spot = |symbol: &str| instruments.iter().find(|i| i.symbol == symbol).unwrap_or_else(|| panic!("{symbol} listed")).instrument;
    let _agent = spawn_agent(&config, &host);
    for (instrument, gpu) in [(spot("H100-SXM-80G/SPOT"), "GPU-h"), (spot("RTX4090-24G/SPOT"), "GPU-r")] {
        let deadline = Instant::now() + Duration::from_secs(15);
        loop {
            let id = renter.new_id();
            let mut order = OrderTicket::limit(id, instrument, Side::Buy, 2_100_000, 1);
            order.time_in_force = gpux_engine::TimeInForce::Ioc;
            let placed = renter.request(ClientMessage::NewOrder { id, order, workload: None }).await.expect("bid");
            assert!(matches!(placed, ServerMessage::Ack { .. }), "{placed:?}");
            tokio::time::sleep(Duration::from_millis(300)).await;
            if std::fs::read_to_string(&hook_log).unwrap_or_default().contains(gpu) {
                break;
            }
            assert!(Instant::now() < deadline, "a lease on {gpu} reached the hook");
        }
    }
}

/// The config's region and zone reach the exchange with the host's GPUs:
/// the book's offers show them and a bid for that region trades with them;
/// a region the exchange does not list stops the agent with that reason.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_agent_declares_its_hosts_region_and_a_regional_bid_buys_there() {
    let dir = tempfile::tempdir().expect("temp dir");
    let operator = SigningKey::from_bytes(&[1; 32]);
    let exchange = Exchange::start(&dir.path().join("exchange"), &operator);
    let (config, host, _) = agent_files(dir.path(), &exchange.url);
    let text = std::fs::read_to_string(&config).expect("config");
    write(&config, &text.replacen("host = \"node-1\"\n", "host = \"node-1\"\nregion = \"cn-west\"\nzone = \"gy-1\"\n", 1));
    let mut renter = funded_renter(&exchange, &operator, 3, 1_000_000_000).await;
    let id = renter.new_id();
    renter.request(ClientMessage::Subscribe { id, channel: Channel::Book, instrument: InstrumentId(0) }).await.expect("subscribe");
    let _agent = spawn_agent(&config, &host);
    let mut asks = std::collections::BTreeMap::new();
    await_ask_quantity(&mut renter, &mut asks, 2).await;
    let id = renter.new_id();
    let Ok(ServerMessage::BookOffers { offers, .. }) =
        renter.request(ClientMessage::BookOffers { id, instrument: InstrumentId(0), offset: 0, after: None }).await
    else {
        panic!("offers")
    };
    assert!(offers.iter().all(|o| o.region.as_deref() == Some("cn-west")), "{offers:?}");

    let mut elsewhere = OrderTicket::limit(1, InstrumentId(0), Side::Buy, 2_100_000, 1);
    elsewhere.regions = vec!["cn-east".into()];
    elsewhere.time_in_force = gpux_engine::TimeInForce::Ioc;
    let mut here = OrderTicket::limit(2, InstrumentId(0), Side::Buy, 2_100_000, 1);
    here.regions = vec!["cn-west".into()];
    for (order, trades) in [(elsewhere, false), (here, true)] {
        let id = renter.new_id();
        let answer = renter.request(ClientMessage::NewOrder { id, order, workload: None }).await;
        let Ok(ServerMessage::Ack { order: Some(order), .. }) = answer else { panic!("{answer:?}") };
        let reason = loop {
            let message = tokio::time::timeout(Duration::from_secs(10), renter.next()).await.expect("in time").expect("message");
            if let ServerMessage::Private { event, .. } = message {
                if let gpux_engine::EventKind::OrderClosed { order: closed, reason, .. } = event.kind {
                    if closed == order {
                        break reason;
                    }
                }
            }
        };
        let filled = reason == gpux_engine::OrderCloseReason::Filled;
        assert_eq!(filled, trades, "{reason:?}");
    }

    // A region the exchange does not list: the agent stops and says so.
    let other = tempfile::tempdir().expect("temp dir");
    let (config, host, _) = agent_files(other.path(), &exchange.url);
    let text = std::fs::read_to_string(&config).expect("config");
    write(&config, &text.replacen("host = \"node-1\"\n", "host = \"node-2\"\nregion = \"mars-north\"\n", 1));
    let output =
        Command::new(env!("CARGO_BIN_EXE_gpux-agent")).arg("--config").arg(&config).arg("--fake").arg(&host).output().expect("runs");
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("region \"mars-north\" is not one the exchange lists"), "{stderr}");
}

/// Issue 64: `gpux-agent` could not present an invitation, so a host could
/// not join an exchange that opens accounts by invitation. Without one the
/// agent stops at once and says how to get one; with `invite` in its
/// config its key opens its account and its GPU goes on sale.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_presents_its_invitation_where_accounts_open_by_invitation() {
    let dir = tempfile::tempdir().expect("temp dir");
    let operator = SigningKey::from_bytes(&[1; 32]);
    let exchange = Exchange::start_by_invitation(dir.path(), &operator);
    let (config, host, _) = agent_files_with(dir.path(), &exchange.url, ONE_GPU);
    let host_key = SigningKey::from_bytes(&[0x42; 32]);
    let key_path = dir.path().join("host.key");
    let mut file = std::fs::File::create(&key_path).expect("key file");
    writeln!(file, "{}", "42".repeat(32)).expect("write key");
    std::fs::set_permissions(&key_path, std::fs::Permissions::from_mode(0o600)).expect("chmod");

    let run = |config: &std::path::Path| {
        let mut child = Command::new(env!("CARGO_BIN_EXE_gpux-agent"))
            .arg("--config")
            .arg(config)
            .arg("--fake")
            .arg(&host)
            .stderr(Stdio::piped())
            .spawn()
            .expect("runs");
        let deadline = Instant::now() + Duration::from_secs(20);
        while child.try_wait().expect("wait").is_none() {
            assert!(Instant::now() < deadline, "the agent stops at a refused login");
            std::thread::sleep(Duration::from_millis(50));
        }
        let mut stderr = String::new();
        std::io::Read::read_to_string(&mut child.stderr.take().expect("stderr"), &mut stderr).expect("read");
        (child.wait().expect("status"), stderr)
    };
    let (status, stderr) = run(&config);
    assert!(!status.success(), "{stderr}");
    let public = hex::encode(host_key.verifying_key().to_bytes());
    assert!(stderr.contains("invite_required") && stderr.contains(&format!("gpux invite {public} --role supplier")), "{stderr}");

    // A renter's invitation is refused when the config is read.
    let expires = gpux_client::now_ms() + 3_600_000;
    let for_renter = gpux_protocol::invite::Invite::sign(&operator, &host_key.verifying_key().to_bytes(), Role::Renter, expires).encode();
    let text = std::fs::read_to_string(&config).expect("config");
    let renter_config = dir.path().join("renter-invite.toml");
    write(&renter_config, &format!("invite = \"{for_renter}\"\n{text}"));
    let (status, stderr) = run(&renter_config);
    assert!(!status.success() && stderr.contains("a host's agent logs in as a supplier"), "{stderr}");

    // With the operator's invitation for the host's key, it opens its account and offers its GPU.
    let invite = gpux_protocol::invite::Invite::sign(&operator, &host_key.verifying_key().to_bytes(), Role::Supplier, expires).encode();
    write(&config, &format!("invite = \"{invite}\"\n{text}"));
    let _agent = spawn_agent(&config, &host);
    let mut watcher = Connection::open(&exchange.url, &operator, Some(Role::Operator)).await.expect("operator");
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let id = watcher.new_id();
        let offers =
            watcher.request(ClientMessage::BookOffers { id, instrument: InstrumentId(0), offset: 0, after: None }).await.expect("offers");
        if matches!(&offers, ServerMessage::BookOffers { offers, .. } if offers.len() == 1) {
            break;
        }
        assert!(Instant::now() < deadline, "the invited host's GPU went on sale: {offers:?}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// A hook whose `start` fails takes its GPU off sale (the host's failure),
/// and the GPU stays off sale while the hook's own check fails (issue 64:
/// it once came back at every back-off whatever the hook said); once the
/// check passes, it is on sale again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hook_that_fails_keeps_its_gpu_off_sale_until_its_own_check_passes() {
    let dir = tempfile::tempdir().expect("temp dir");
    let operator = SigningKey::from_bytes(&[1; 32]);
    let exchange = Exchange::start(&dir.path().join("exchange"), &operator);
    let (config, host, hook_log) = agent_files_with(dir.path(), &exchange.url, ONE_GPU);
    let healthy = dir.path().join("healthy");
    let hook = dir.path().join("hook.sh");
    write(
        &hook,
        &format!(
            "#!/bin/sh\necho \"$@\" >> {log}\ncase \"$1\" in\n  start) exit 1 ;;\n  check) [ -f {healthy} ] && exit 0; echo 'scheduler unreachable' >&2; exit 1 ;;\nesac\nexit 0\n",
            log = hook_log.display(),
            healthy = healthy.display()
        ),
    );
    let text = std::fs::read_to_string(&config).expect("config");
    let text = text.replace(&format!("delivery_hook = \"{}\"\n", hook.display()), "");
    write(&config, &format!("{text}\n[delivery]\nbackend = \"hook\"\nhook = \"{}\"\nhealth_backoff_ms = 1500\n", hook.display()));

    let mut renter = funded_renter(&exchange, &operator, 3, 1_000_000_000).await;
    let id = renter.new_id();
    renter.request(ClientMessage::Subscribe { id, channel: Channel::Book, instrument: InstrumentId(0) }).await.expect("subscribe");
    let _agent = spawn_agent(&config, &host);
    await_ask_quantity(&mut renter, &mut std::collections::BTreeMap::new(), 1).await;
    let (lease, _) = buy_the_gpu(&mut renter).await;
    // The failed start ends the lease as the host's failure.
    loop {
        if let ServerMessage::Private { event, .. } = renter.next().await.expect("message") {
            if let gpux_engine::EventKind::LeaseEnded { lease: ended, .. } = event.kind {
                assert_eq!(ended, lease);
                break;
            }
        }
    }
    // Checks at 1.5 s, then 3 s and 6 s later all fail: off sale throughout.
    tokio::time::sleep(Duration::from_secs(6)).await;
    assert_eq!(book_asks(&mut renter).await, 0, "off sale while the hook's check fails");
    let log = std::fs::read_to_string(&hook_log).expect("hook log");
    assert!(log.lines().any(|l| l.starts_with("check ")), "the hook's own check ran: {log}");
    // The owner fixes what the hook needs: the next check passes.
    write(&healthy, "");
    let deadline = Instant::now() + Duration::from_secs(20);
    while book_asks(&mut renter).await == 0 {
        assert!(Instant::now() < deadline, "on sale again once the check passed");
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}
