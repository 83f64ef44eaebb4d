//! Every gateway error code docs/protocol.md lists ("Gateway error codes"),
//! each produced against the real binary by the frame (or the silence) the
//! table says causes it, and every `ErrorCode` the code knows is documented.
//! One row per code: what to send, from whom; the test records the code that
//! comes back and compares the whole set with the docs.

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use common::*;
use gpux_engine::*;
use gpux_protocol::delivery::limits;
use gpux_protocol::*;
use strum::VariantNames;
use tokio_tungstenite::tungstenite::Message;

const USD_2: u64 = 2_000_000;

/// The codes in the first column of docs/protocol.md's "Gateway error codes" table.
fn documented_codes() -> BTreeSet<String> {
    let docs = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../docs/protocol.md")).expect("docs/protocol.md");
    let section = docs.split("## Gateway error codes").nth(1).expect("the section").split("\n## ").next().expect("its text");
    let mut codes = BTreeSet::new();
    for row in section.lines().filter(|line| line.starts_with("| `")) {
        let first_cell = row.split('|').nth(1).expect("a first cell");
        codes.extend(first_cell.split('`').skip(1).step_by(2).map(str::to_string));
    }
    codes
}

/// Who sends a row's frames.
#[derive(Clone, Copy, Debug)]
enum Who {
    /// A fresh connection that has not logged in.
    Stranger,
    Renter,
    Supplier,
}

/// What a row sends.
enum Send {
    Text(String),
    Binary(Vec<u8>),
    /// Requests, all sent before any answer is read; the first error counts.
    Messages(Vec<ClientMessage>),
}

struct Row {
    code: &'static str,
    from: Who,
    send: Send,
}

fn row(code: &'static str, from: Who, send: Send) -> Row {
    Row { code, from, send }
}

fn one(message: ClientMessage) -> Send {
    Send::Messages(vec![message])
}

/// A bid with a workload; `edit` breaks it one way.
/// A resting bid (no ask that low) with a workload that mounts `volumes`.
fn bid_mounting(id: u64, volumes: &[(&str, &str, bool)]) -> ClientMessage {
    let mut order = OrderTicket::limit(id, InstrumentId(0), Side::Buy, 1_000_000, 1);
    order.volumes = volumes
        .iter()
        .map(|(volume, mount, read_only)| VolumeMount { volume: volume.to_string(), mount: mount.to_string(), read_only: *read_only })
        .collect();
    ClientMessage::NewOrder { id, order, workload: Some(Box::new(Workload::image("docker.io/library/busybox:1.36"))) }
}

fn bid_with(id: u64, edit: impl FnOnce(&mut Workload)) -> ClientMessage {
    let mut workload = Workload::image("docker.io/library/busybox:1.36");
    edit(&mut workload);
    let order = OrderTicket::limit(id, InstrumentId(0), Side::Buy, 1_000_000, 1);
    ClientMessage::NewOrder { id, order, workload: Some(Box::new(workload)) }
}

/// The market the rows need: a renter with one lease that ended (its host
/// connected, without an encryption key) and one whose host has gone.
struct Market {
    exchange: Exchange,
    _dir: tempfile::TempDir,
    renter: Client,
    supplier: Client,
    ended_lease: LeaseId,
    orphan_lease: LeaseId,
}

async fn lease_from(renter: &mut Client, supplier: &mut Client, gpu_uuid: &str, client_order_id: u64) -> LeaseId {
    let id = supplier.id();
    let registered = supplier
        .request(ClientMessage::RegisterGpu {
            id,
            host: gpu_uuid.into(),
            gpu_uuid: gpu_uuid.into(),
            spec: h100_spec(),
            region: None,
            zone: None,
            fabric: None,
        })
        .await;
    assert!(matches!(registered, ServerMessage::Ack { .. }), "{registered:?}");
    let (host, index_on_host) = supplier
        .recv_until(|message| match message {
            ServerMessage::Private { event: Event { kind: EventKind::GpuRegistered { host, index_on_host, .. }, .. }, .. } => {
                Some((*host, *index_on_host))
            }
            _ => None,
        })
        .await;
    let mut ask = ticket(client_order_id, Side::Sell, USD_2, 1);
    ask.supply = Some(GpuSet { host, gpu_mask: 1 << index_on_host });
    assert!(matches!(supplier.place(ask).await, ServerMessage::Ack { order: Some(_), .. }));
    assert!(matches!(renter.place(ticket(client_order_id, Side::Buy, USD_2, 1)).await, ServerMessage::Ack { .. }));
    renter
        .recv_until(|message| match message {
            ServerMessage::Private { event: Event { kind: EventKind::LeaseCreated { lease, .. }, .. }, .. } => Some(*lease),
            _ => None,
        })
        .await
}

async fn market() -> Market {
    let dir = tempfile::tempdir().expect("temp dir");
    let exchange = Exchange::start(dir.path(), Some(&key(1)));
    let (mut operator, _) = Client::login(&exchange.addr, &key(1), Role::Operator).await;
    let (mut renter, renter_account) = Client::login(&exchange.addr, &key(3), Role::Renter).await;
    let id = operator.id();
    let deposit = operator.request(ClientMessage::Deposit { id, account: renter_account, amount_minor: 1_000_000_000 }).await;
    assert!(matches!(deposit, ServerMessage::Ack { .. }), "{deposit:?}");
    let (mut supplier, _) = Client::login(&exchange.addr, &key(2), Role::Supplier).await;
    let ended_lease = lease_from(&mut renter, &mut supplier, "GPU-1", 1).await;
    let id = renter.id();
    assert!(matches!(renter.request(ClientMessage::EndLease { id, lease: ended_lease }).await, ServerMessage::Ack { .. }));
    let (mut gone, _) = Client::login(&exchange.addr, &key(5), Role::Supplier).await;
    let orphan_lease = lease_from(&mut renter, &mut gone, "GPU-2", 2).await;
    drop(gone);
    Market { exchange, _dir: dir, renter, supplier, ended_lease, orphan_lease }
}

/// Sends a row and returns the code of the first `error` that answers it.
async fn run(m: &mut Market, row: Row) -> String {
    let mut stranger;
    let client = match row.from {
        Who::Stranger => {
            stranger = Client::connect(&m.exchange.addr).await;
            &mut stranger
        }
        Who::Renter => &mut m.renter,
        Who::Supplier => &mut m.supplier,
    };
    let ids: BTreeSet<u64> = match &row.send {
        Send::Messages(messages) => messages.iter().map(ClientMessage::id).collect(),
        Send::Text(_) | Send::Binary(_) => BTreeSet::new(),
    };
    // A raw frame's answer carries the frame's id when the frame holds one
    // (`{"name": {"id": 3, ...}}`), and none otherwise.
    let raw_id = match &row.send {
        Send::Text(text) => serde_json::from_str::<serde_json::Value>(text)
            .ok()
            .and_then(|frame| frame.as_object().and_then(|fields| fields.values().next().cloned()))
            .and_then(|body| body.get("id").and_then(serde_json::Value::as_u64)),
        _ => None,
    };
    let raw = !matches!(row.send, Send::Messages(_));
    match row.send {
        Send::Text(text) => client.send_raw(Message::Text(text.into())).await,
        Send::Binary(bytes) => client.send_raw(Message::Binary(bytes.into())).await,
        Send::Messages(messages) => {
            for message in &messages {
                client.send_nowait(message).await;
            }
            client.flush().await;
        }
    }
    client
        .recv_until(|message| match message {
            // Raw frames are answered with their own id or none; requests by their ids.
            ServerMessage::Error { id, code, .. } if raw && *id == raw_id => Some(wire_name(code)),
            ServerMessage::Error { id, code, .. } if !raw && id.is_none_or(|id| ids.contains(&id)) => Some(wire_name(code)),
            _ => None,
        })
        .await
}

/// A job of one GPU for an hour at the lowest price, changed by `change`.
fn submit_job(id: u64, instrument: InstrumentId, change: impl FnOnce(&mut JobSubmission)) -> ClientMessage {
    // The demo books' lowest price, one tick.
    let run = JobRun::in_image("localhost/gpux-py:1", &["python3", "train.py"]);
    let mut job = JobSubmission::one_host(&format!("job-{id}"), instrument, 1, 10_000, 1, 100_000, run);
    change(&mut job);
    ClientMessage::SubmitJob { id, job: Box::new(job) }
}

fn create_service(id: u64, change: impl FnOnce(&mut gpux_protocol::ServiceSpec)) -> ClientMessage {
    // The demo books' lowest price; no replica yet.
    let mut spec = gpux_protocol::ServiceSpec {
        name: format!("service-{id}"),
        instrument: InstrumentId(0),
        gpus: 1,
        limit_minor_per_gpu_hour: 10_000,
        budget_minor_per_hour: 40_000,
        replicas: 0,
        min_replicas: 0,
        max_replicas: 4,
        image: "localhost/gpux-py:1".into(),
        command: vec!["python3".into(), "-m".into(), "http.server".into()],
        port: 8000,
        readiness_path: None,
        regions: Vec::new(),
        min_supplier_score_bps: 0,
        scaling: None,
        key_hashes: Vec::new(),
    };
    change(&mut spec);
    ClientMessage::CreateService { id, service: Box::new(spec), floor: None }
}

fn public(key: &ed25519_dalek::SigningKey) -> String {
    hex::encode(key.verifying_key().to_bytes())
}

fn add_key(id: u64, public_key: String, scopes: &[Scope]) -> ClientMessage {
    ClientMessage::AddKey { id, account: None, public_key, scopes: Scopes::of(scopes), expires_at_ms: None, label: String::new() }
}

fn limits_keys() -> usize {
    gpux_protocol::access::KEYS_PER_ACCOUNT_MAX
}

/// Logs in with a key added to an account (no role).
async fn login_with(addr: &str, key: &ed25519_dalek::SigningKey) -> Client {
    let mut client = Client::connect(addr).await;
    let auth = client.auth_message(key, None);
    client.send(&auth).await;
    client.recv_until(|m| matches!(m, ServerMessage::Authenticated { .. }).then_some(())).await;
    client
}

fn wire_name(code: &ErrorCode) -> String {
    serde_json::to_value(code).expect("a code serialises").as_str().expect("a string").to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_documented_error_code_has_a_frame_that_produces_it() {
    let documented = documented_codes();
    let known: BTreeSet<String> = ErrorCode::VARIANTS.iter().map(|name| name.to_string()).collect();
    assert_eq!(documented, known, "docs/protocol.md lists exactly the codes ErrorCode has");

    let mut m = market().await;
    let (ended, orphan) = (m.ended_lease, m.orphan_lease);
    let instruments = match m.renter.request(ClientMessage::Instruments { id: 900 }).await {
        ServerMessage::Instruments { instruments, .. } => instruments,
        other => panic!("{other:?}"),
    };
    assert!(instruments.len() * 2 > 64, "enough feeds to go over the subscription cap");
    let subscriptions = [Channel::Book, Channel::Trades]
        .into_iter()
        .flat_map(|channel| instruments.iter().map(move |i| (channel, i.instrument)))
        .take(65)
        .enumerate()
        .map(|(n, (channel, instrument))| ClientMessage::Subscribe { id: 1_000 + n as u64, channel, instrument })
        .collect();
    let window = instruments
        .iter()
        .find(|i| matches!(i.contract, ContractKind::Reserved { .. }))
        .map(|i| i.instrument)
        .expect("the demo listing has reserved windows");
    let mut forged_auth = Client::connect(&m.exchange.addr).await.auth_message(&key(8), Some(Role::Renter));
    if let ClientMessage::Auth { signature, .. } = &mut forged_auth {
        *signature = "00".repeat(64);
    }
    let second_auth = m.renter.auth_message(&key(3), Some(Role::Renter));
    let unsigned_key = ClientMessage::SetEncryptionKey { id: 20, encryption_key: "zz".into(), signature: "00".repeat(64) };
    let failed_status =
        DeliveryState::Failed { code: FailureCode::HostError, fault: Fault::Host, reason: "x".repeat(limits::REASON_BYTES_MAX + 1) };

    let table = vec![
        row("malformed_json", Who::Stranger, Send::Text("{not json".into())),
        row("wrong_type", Who::Stranger, Send::Text(r#"{"subscribe":{"id":3,"channel":"candles","instrument":0}}"#.into())),
        row("unknown_message", Who::Stranger, Send::Text(r#"{"frobnicate":{"id":4}}"#.into())),
        row("malformed_binary", Who::Stranger, Send::Binary(vec![0xff; 9])),
        row("not_authenticated", Who::Stranger, one(ClientMessage::Balance { id: 5 })),
        row("already_authenticated", Who::Renter, one(second_auth)),
        row("auth_failed", Who::Stranger, one(forged_auth)),
        row("forbidden", Who::Renter, one(ClientMessage::Deposit { id: 7, account: AccountId(0), amount_minor: 1 })),
        row("rate_limited", Who::Stranger, Send::Messages((0..25_000).map(|id| ClientMessage::Ping { id }).collect())),
        row("too_many_subscriptions", Who::Stranger, Send::Messages(subscriptions)),
        row(
            "unknown_instrument",
            Who::Stranger,
            one(ClientMessage::Subscribe { id: 8, channel: Channel::Book, instrument: InstrumentId(999_999) }),
        ),
        row(
            "not_subscribed",
            Who::Stranger,
            one(ClientMessage::Unsubscribe { id: 9, channel: Channel::Trades, instrument: InstrumentId(0) }),
        ),
        row("image_invalid", Who::Renter, one(bid_with(10, |w| w.image = String::new()))),
        row("too_many_ports", Who::Renter, one(bid_with(11, |w| w.ports = (1..=limits::PORTS_MAX as u16 + 1).collect()))),
        row("port_invalid", Who::Renter, one(bid_with(12, |w| w.ports = vec![0]))),
        row("shm_too_large", Who::Renter, one(bid_with(13, |w| w.shm_mib = limits::SHM_MIB_MAX + 1))),
        row(
            "too_many_restarts",
            Who::Renter,
            one(bid_with(14, |w| w.restart = RestartPolicy::OnFailure { max_restarts: limits::RESTARTS_MAX + 1 })),
        ),
        row(
            "sealed_too_large",
            Who::Renter,
            one(bid_with(15, |w| {
                w.sealed = Some(Sealed { recipient: "00".repeat(32), ciphertext: "00".repeat(limits::SEALED_HEX_MAX / 2 + 1) })
            })),
        ),
        row(
            "sealed_invalid",
            Who::Renter,
            one(bid_with(16, |w| w.sealed = Some(Sealed { recipient: "zz".into(), ciphertext: "00".into() }))),
        ),
        row("workload_option_refused", Who::Renter, one(bid_with(17, |w| w.privileged = true))),
        row("workload_not_on_bid", Who::Renter, {
            let order = OrderTicket::limit(18, InstrumentId(0), Side::Sell, USD_2, 1);
            one(ClientMessage::NewOrder { id: 18, order, workload: Some(Box::new(Workload::image("busybox"))) })
        }),
        row("unknown_lease", Who::Renter, one(ClientMessage::LeaseDelivery { id: 19, lease: LeaseId(999_999) })),
        row(
            "lease_not_active",
            Who::Renter,
            one(ClientMessage::SetWorkload { id: 21, lease: ended, workload: Box::new(Workload::image("busybox")) }),
        ),
        row("no_encryption_key", Who::Renter, one(ClientMessage::HostKey { id: 22, lease: ended })),
        row("encryption_key_invalid", Who::Supplier, one(unsigned_key)),
        row("delivery_status_invalid", Who::Supplier, one(ClientMessage::DeliveryStatus { id: 23, lease: ended, state: failed_status })),
        row("host_unreachable", Who::Renter, one(ClientMessage::LeaseLogs { id: 24, lease: orphan, tail_bytes: 1024 })),
        row("exec_invalid", Who::Renter, one(ClientMessage::LeaseExec { id: 24, lease: orphan, command: Vec::new(), timeout_ms: 1_000 })),
        row("unknown_supplier", Who::Stranger, one(ClientMessage::SupplierStats { id: 25, supplier: AccountId(999_999) })),
        row("rematch_not_on_spot_bid", Who::Renter, {
            let order = OrderTicket { rematch: true, ..OrderTicket::limit(26, InstrumentId(0), Side::Sell, USD_2, 1) };
            one(ClientMessage::NewOrder { id: 26, order, workload: None })
        }),
        // The exchange challenged GPU-1 as its (connected) supplier registered
        // it: challenge 1, never answered here.
        row(
            "unknown_challenge",
            Who::Supplier,
            one(ClientMessage::ChallengeCommit { id: 27, challenge: 999, commitment: "ab".repeat(32) }),
        ),
        row("unknown_challenge", Who::Renter, one(ClientMessage::ChallengeCommit { id: 28, challenge: 1, commitment: "ab".repeat(32) })),
        row(
            "challenge_answer_invalid",
            Who::Supplier,
            one(ClientMessage::ChallengeCommit { id: 29, challenge: 1, commitment: "zz".into() }),
        ),
        row("unknown_account", Who::Stranger, one(ClientMessage::RenterStats { id: 31, renter: AccountId(999_999) })),
        row("liveness_invalid", Who::Renter, {
            // Before the lease began, and signed by a key not the renter's.
            let body = LivenessBody { lease: orphan, start_ms: 1, end_ms: 2, reachable: false };
            one(ClientMessage::Liveness { id: 32, report: LivenessReport::sign(body, &key(7)) })
        }),
        row("unknown_lease", Who::Supplier, {
            // Liveness is the renter's to sign: not the supplier's lease to observe.
            let body = LivenessBody { lease: ended, start_ms: 1, end_ms: 2, reachable: false };
            one(ClientMessage::Liveness { id: 33, report: LivenessReport::sign(body, &key(2)) })
        }),
        row("gpu_probe_invalid", Who::Renter, {
            // The renter's own lease, but from before it began.
            let gpus = vec![ProbeGpu { uuid: "GPU-a".into(), present_samples: 0, utilisation_percent_mean: 0, memory_used_mib_max: 0 }];
            let body = GpuProbeBody { lease: orphan, start_ms: 1, end_ms: 2, samples: 1, gpus };
            one(ClientMessage::GpuProbe { id: 41, report: Box::new(GpuProbeReport::sign(body, &key(7))) })
        }),
        row("fabric_probe_invalid", Who::Supplier, {
            // Its own lease, signed by its key, but no cluster job's member.
            let body = FabricProbeBody { lease: ended, job: JobId(1), attempt: 1, ranks: 2, rank: 0, bytes: 1 << 20, elapsed_us: 1_000 };
            one(ClientMessage::FabricProbe { id: 40, report: Box::new(FabricProbeReport::sign(body, &key(2))) })
        }),
        row("key_invalid", Who::Renter, one(add_key(34, "zz".into(), &[Scope::Read]))),
        row("key_in_use", Who::Renter, one(add_key(35, public(&key(3)), &[Scope::Read]))),
        row("key_invalid", Who::Renter, one(add_key(36, public(&key(80)), &[]))),
        row("unknown_key", Who::Renter, one(ClientMessage::RevokeKey { id: 37, public_key: public(&key(81)) })),
        row("owner_key", Who::Renter, one(ClientMessage::RevokeKey { id: 38, public_key: public(&key(3)) })),
        row("not_your_sub_account", Who::Renter, one(ClientMessage::Keys { id: 39, account: Some(AccountId(0)) })),
        row("period_invalid", Who::Renter, one(ClientMessage::Invoice { id: 75, period: "2026-13".into(), account: None, offset: 0 })),
        row(
            "too_many_keys",
            Who::Renter,
            Send::Messages((0..=limits_keys()).map(|n| add_key(40 + n as u64, public(&key(100 + n as u8)), &[Scope::Read])).collect()),
        ),
        row("challenge_out_of_order", Who::Supplier, one(ClientMessage::ChallengeOpening { id: 30, challenge: 1, leaves: Vec::new() })),
        row("job_invalid", Who::Renter, one(submit_job(120, InstrumentId(0), |s| s.gpus = 0))),
        row("job_invalid", Who::Renter, one(submit_job(125, InstrumentId(0), |s| s.limit_minor_per_gpu_hour += 1))),
        // Another book that is no spot or preemptible one, one off its tick, a region the exchange lacks.
        row(
            "job_invalid",
            Who::Renter,
            one(submit_job(126, InstrumentId(0), |s| {
                s.alternatives = vec![gpux_protocol::JobAlternative { instrument: InstrumentId(9_999), limit_minor_per_gpu_hour: 10_000 }]
            })),
        ),
        row(
            "job_invalid",
            Who::Renter,
            one(submit_job(127, InstrumentId(0), |s| {
                s.alternatives = vec![gpux_protocol::JobAlternative { instrument: InstrumentId(2), limit_minor_per_gpu_hour: 10_001 }]
            })),
        ),
        row("job_invalid", Who::Renter, one(submit_job(128, InstrumentId(0), |s| s.regions = vec!["mars-1".into()]))),
        row("job_invalid", Who::Renter, one(submit_job(129, InstrumentId(0), |s| s.restarts_on_error = 21))),
        row("job_budget_too_small", Who::Renter, one(submit_job(121, InstrumentId(0), |s| s.hours = 20))),
        row("job_instrument_invalid", Who::Renter, one(submit_job(122, window, |_| {}))),
        row("unknown_job", Who::Renter, one(ClientMessage::JobStatus { id: 123, job: JobId(999_999) })),
        row(
            "job_store_unavailable",
            Who::Supplier,
            one(ClientMessage::JobStoreToken { id: 124, job: None, lease: Some(ended), volume: None }),
        ),
        // Each job's bid rests at the book's lowest price (no ask that
        // low): 64 jobs not yet over, the 65th refused.
        row(
            "too_many_jobs",
            Who::Renter,
            Send::Messages(
                (0..=gpux_protocol::jobs::limits::JOBS_LIVE_PER_ACCOUNT_MAX as u64)
                    .map(|n| submit_job(130 + n, InstrumentId(0), |_| {}))
                    .collect(),
            ),
        ),
        // Those jobs are bidding, not running.
        row("job_not_running", Who::Renter, one(ClientMessage::ResizeJob { id: 126, job: JobId(0), gpus: 2 })),
        row("service_invalid", Who::Renter, one(create_service(300, |s| s.port = 0))),
        row("service_invalid", Who::Renter, one(create_service(301, |s| s.limit_minor_per_gpu_hour += 1))),
        row("service_invalid", Who::Renter, one(create_service(302, |s| s.instrument = window))),
        // 16 services not deleted, the 17th refused (ids 1 to 16 created).
        row(
            "too_many_services",
            Who::Renter,
            Send::Messages(
                (0..=gpux_protocol::services::limits::SERVICES_PER_ACCOUNT_MAX as u64).map(|n| create_service(310 + n, |_| {})).collect(),
            ),
        ),
        row("service_scale_invalid", Who::Renter, one(ClientMessage::ScaleService { id: 330, service: ServiceId(1), replicas: 5 })),
        row("unknown_service", Who::Renter, one(ClientMessage::ServiceStatus { id: 331, service: ServiceId(999_999) })),
        row("unknown_service", Who::Supplier, one(ClientMessage::DeleteService { id: 332, service: ServiceId(1) })),
        row(
            "service_not_running",
            Who::Renter,
            Send::Messages(vec![
                ClientMessage::DeleteService { id: 334, service: ServiceId(2) },
                ClientMessage::UpdateService {
                    id: 335,
                    service: ServiceId(2),
                    run: ServiceRun { image: "localhost/gpux-py:2".into(), command: Vec::new(), port: 8000, readiness_path: None },
                },
            ]),
        ),
        row(
            "service_not_scaling",
            Who::Renter,
            one(ClientMessage::ServiceLoad { id: 333, service: ServiceId(1), router: 0, load: ServiceLoad::default() }),
        ),
        row("volume_invalid", Who::Renter, one(ClientMessage::CreateVolume { id: 400, name: "-data".into(), size_gib: 1 })),
        row("volume_invalid", Who::Renter, one(ClientMessage::CreateVolume { id: 401, name: "data".into(), size_gib: 0 })),
        row("volume_invalid", Who::Renter, one(bid_mounting(402, &[("data", "/proc/x", false)]))),
        row(
            "volume_exists",
            Who::Renter,
            Send::Messages(vec![
                ClientMessage::CreateVolume { id: 403, name: "data".into(), size_gib: 1 },
                ClientMessage::CreateVolume { id: 404, name: "data".into(), size_gib: 2 },
            ]),
        ),
        row("unknown_volume", Who::Renter, one(bid_mounting(405, &[("nothing", "/data", false)]))),
        row("unknown_volume", Who::Renter, one(ClientMessage::DeleteVolume { id: 406, name: "nothing".into() })),
        row(
            "unknown_volume",
            Who::Supplier,
            one(ClientMessage::JobStoreToken { id: 407, job: None, lease: None, volume: Some("data".into()) }),
        ),
        // A resting bid claims "data" read-write: a second writer is
        // refused, and so is the volume's deletion.
        row(
            "volume_in_use",
            Who::Renter,
            Send::Messages(vec![bid_mounting(408, &[("data", "/data", false)]), bid_mounting(409, &[("data", "/d", false)])]),
        ),
        row("volume_in_use", Who::Renter, one(ClientMessage::DeleteVolume { id: 410, name: "data".into() })),
        // "data" and 15 more are 16 volumes: the 17th is refused.
        row(
            "too_many_volumes",
            Who::Renter,
            Send::Messages((0..16u64).map(|n| ClientMessage::CreateVolume { id: 411 + n, name: format!("v{n}"), size_gib: 1 }).collect()),
        ),
    ];
    let mut produced = BTreeMap::new();
    for row in table {
        let (expected, from) = (row.code, row.from);
        let got = tokio::time::timeout(Duration::from_secs(20), run(&mut m, row)).await.expect("an answer");
        assert_eq!(got, expected, "the {expected} row, sent as {from:?}");
        produced.insert(got, from);
    }

    // A key's scope, expiry and revocation: the supplier adds two read-only
    // keys, one expiring in a second.
    let now = match m.supplier.request(ClientMessage::Ping { id: 60 }).await {
        ServerMessage::Pong { server_time_ms, .. } => server_time_ms,
        other => panic!("{other:?}"),
    };
    let mut expiring = add_key(61, public(&key(91)), &[Scope::Read]);
    if let ClientMessage::AddKey { expires_at_ms, .. } = &mut expiring {
        *expires_at_ms = Some(now + 1_000);
    }
    for add in [add_key(62, public(&key(90)), &[Scope::Read]), expiring] {
        assert!(matches!(m.supplier.request(add).await, ServerMessage::KeyAdded { .. }));
    }
    let mut reader = login_with(&m.exchange.addr, &key(90)).await;
    let mut short_lived = login_with(&m.exchange.addr, &key(91)).await;
    let order = OrderTicket::limit(63, InstrumentId(0), Side::Buy, USD_2, 1);
    match reader.request(ClientMessage::NewOrder { id: 63, order, workload: None }).await {
        ServerMessage::Error { code, .. } => produced.insert(wire_name(&code), Who::Supplier),
        other => panic!("{other:?}"),
    };
    let revoked = m.supplier.request(ClientMessage::RevokeKey { id: 64, public_key: public(&key(90)) }).await;
    assert!(matches!(revoked, ServerMessage::KeyRevoked { .. }), "{revoked:?}");
    for (client, expected) in [(&mut reader, "key_revoked"), (&mut short_lived, "key_expired")] {
        let (_, reason) = tokio::time::timeout(Duration::from_secs(5), client.read_to_close()).await.expect("closed");
        assert_eq!(reason, expected);
        produced.insert(reason, Who::Supplier);
    }

    // The codes that close the connection, each on an exchange configured
    // to reach it quickly.
    let dir = tempfile::tempdir().expect("temp dir");
    let quick = Exchange::start_with(dir.path(), None, &["--login-timeout-ms", "500", "--idle-timeout-ms", "1800"]);
    let mut oversize = Client::connect(&quick.addr).await;
    oversize.send_raw(Message::Text("x".repeat(FRAME_BYTES_MAX + 1).into())).await;
    // Read at once: the exchange cannot read past an oversize frame, so it
    // closes the socket with the frame's tail unread, which resets it.
    assert_eq!(oversize.closed_reason().await, "frame_too_large");
    produced.insert("frame_too_large".to_string(), Who::Stranger);
    let silent = Client::connect(&quick.addr).await;
    let mut idle = Client::connect(&quick.addr).await;
    idle.request_subscribe(2, Channel::Trades, InstrumentId(0)).await;
    // None reads (so none answers a ping) for longer than both timeouts;
    // the first ping (a third of the idle timeout) comes after the login
    // deadline, as at the defaults.
    tokio::time::sleep(Duration::from_millis(3_000)).await;
    for (mut client, expected) in [(silent, "login_timeout"), (idle, "idle_timeout")] {
        assert_eq!(client.closed_reason().await, expected);
        produced.insert(expected.to_string(), Who::Stranger);
    }

    let dir = tempfile::tempdir().expect("temp dir");
    let mut narrow = Exchange::start_with(dir.path(), None, &["--outbound-frames-max", "1"]);
    let mut flooder = Client::connect(&narrow.addr).await;
    for id in 0..50 {
        flooder.send_nowait(&ClientMessage::Instruments { id }).await;
    }
    flooder.flush().await;
    assert_eq!(flooder.closed_reason().await, "slow_consumer");
    produced.insert("slow_consumer".into(), Who::Stranger);
    let mut bystander = Client::connect(&narrow.addr).await;
    narrow.terminate();
    assert_eq!(bystander.closed_reason().await, "shutting_down");
    produced.insert("shutting_down".into(), Who::Stranger);

    // Produced where its cause can be made: a journal that cannot be read
    // (exchange/src/invoices.rs, an_invoice_the_journal_cannot_give_is_invoice_unavailable).
    produced.insert("invoice_unavailable".into(), Who::Renter);
    // (exchange/src/sequencer/tests.rs, history_the_journal_cannot_give_is_history_unavailable).
    produced.insert("history_unavailable".into(), Who::Renter);
    // (exchange/src/sequencer/tests.rs, reads_the_journal_cannot_give_are_journal_unavailable_never_an_empty_answer).
    produced.insert("journal_unavailable".into(), Who::Renter);
    // REST writes only (exchange/tests/rest.rs, writes_are_signed_idempotent_and_answer_their_whole_outcome).
    produced.insert("idempotency_key_reused".into(), Who::Renter);
    produced.insert("request_in_progress".into(), Who::Renter);
    // An exchange that opens accounts by invitation, and a full account
    // table (exchange/tests/account_opening.rs,
    // without_an_invitation_no_key_opens_an_account_and_a_full_table_says_too_many_accounts).
    for code in ["invite_required", "invite_invalid", "too_many_accounts"] {
        produced.insert(code.into(), Who::Stranger);
    }
    // A disk down to the journal's reserve (exchange/tests/disk.rs,
    // the_journal_keeps_its_reserve_new_work_stops_before_it_and_comes_back_by_itself).
    produced.insert("disk_low".into(), Who::Renter);
    // Storage unpaid for 3 days: the market's rule the sequencer checks
    // before it journals a bid (market/tests/storage.rs,
    // unpaid_storage_turns_read_only_after_the_grace_and_is_deleted_after_the_notice).
    produced.insert("volume_unpaid".into(), Who::Renter);
    // Only a gateway in its own process closes with it
    // (exchange/tests/remote_gateway.rs, a_gateway_in_its_own_process_serves_the_same_market).
    produced.insert("sequencer_unavailable".into(), Who::Stranger);
    let produced: BTreeSet<String> = produced.into_keys().collect();
    assert_eq!(produced, documented, "every documented code was produced");
}
