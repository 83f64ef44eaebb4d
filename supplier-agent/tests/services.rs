//! Services end to end (docs/services.md): a real exchange, the real agent
//! binary on three fake one-GPU hosts with the `docker` backend on a real
//! container engine (podman, `scripts/containers`), and a service of two
//! replicas of Python's http.server in the jobs' test image. A replica's
//! host dies (its agent killed): the exchange stops hearing of its lease,
//! ends it as the host's fault, bids a replacement at once and the third
//! host serves it; the service then scales down and is deleted, its
//! containers removed.

mod common;

use std::io::{Read, Write};
use std::time::{Duration, Instant};

use common::*;
use ed25519_dalek::SigningKey;
use gpux_engine::{InstrumentId, LeaseId};
use gpux_protocol::*;
use gpux_supplier_agent::session::Connection;

fn spec() -> ServiceSpec {
    ServiceSpec {
        name: "echo".into(),
        instrument: InstrumentId(0),
        gpus: 1,
        limit_minor_per_gpu_hour: 2_500_000,
        budget_minor_per_hour: 10_000_000,
        replicas: 2,
        min_replicas: 0,
        max_replicas: 3,
        image: PY_IMAGE.into(),
        command: vec!["python3".into(), "-m".into(), "http.server".into(), "8000".into()],
        port: 8000,
        readiness_path: Some("/".into()),
        regions: Vec::new(),
        min_supplier_score_bps: 0,
    }
}

/// The service's pushes until `done` holds (within `within`).
async fn await_service(renter: &mut Connection, within: Duration, mut done: impl FnMut(&ServiceInfo) -> bool) -> ServiceInfo {
    let deadline = Instant::now() + within;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        let message = tokio::time::timeout(left, renter.next()).await.expect("the service's update in time").expect("message");
        if let ServerMessage::ServiceUpdate { service } = message {
            let replicas: Vec<_> = service.replicas.iter().map(|r| (r.slot, r.state, r.lease.map(|l| l.0))).collect();
            eprintln!("service {}: {:?} {replicas:?}", service.service, service.state);
            if done(&service) {
                return *service;
            }
        }
    }
}

fn ready(info: &ServiceInfo) -> Vec<(LeaseId, String)> {
    info.replicas.iter().filter(|r| r.state == ReplicaState::Ready).filter_map(|r| Some((r.lease?, r.endpoint.clone()?))).collect()
}

/// An HTTP GET of `/` at `endpoint` (`host:port`): its status line.
fn http_status(endpoint: &str) -> Option<String> {
    let mut stream = std::net::TcpStream::connect(endpoint).ok()?;
    stream.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    stream.write_all(b"GET / HTTP/1.0\r\n\r\n").ok()?;
    let mut page = String::new();
    let _ = stream.read_to_string(&mut page);
    page.lines().next().map(str::to_string)
}

fn container_exists(socket: &str, host: &str, lease: LeaseId) -> bool {
    let output = std::process::Command::new("curl")
        .args(["-s", "-o", "/dev/null", "-w", "%{http_code}", "--unix-socket", socket])
        .arg(format!("http://d/v1.41/containers/gpux-{host}-lease-{}/json", lease.0))
        .output()
        .expect("curl runs");
    String::from_utf8_lossy(&output.stdout) == "200"
}

fn remove_container(socket: &str, host: &str, lease: LeaseId) {
    let _ = std::process::Command::new("curl")
        .args(["-s", "-X", "DELETE", "--unix-socket", socket])
        .arg(format!("http://d/v1.41/containers/gpux-{host}-lease-{}?force=true", lease.0))
        .output();
}

async fn request(renter: &mut Connection, message: impl FnOnce(u64) -> ClientMessage) -> ServerMessage {
    let id = renter.new_id();
    renter.request(message(id)).await.expect("an answer")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_service_replaces_a_replica_whose_host_died_then_scales_down_and_is_deleted() {
    let Some(socket) = socket() else { return };
    let dir = tempfile::tempdir().expect("temp dir");
    let operator = SigningKey::from_bytes(&[1; 32]);
    let exchange = Exchange::start(&dir.path().join("exchange"), &operator);
    let names = ["svc-a", "svc-b", "svc-c"];
    let mut agents = Vec::new();
    for name in &names[..2] {
        let (config, host) = job_host(&dir.path().join(name), &exchange.url, &socket, name, H100_GPU, &[("spot", 2_100_000)]);
        agents.push(Some(spawn_agent(&config, &host)));
    }
    let mut renter = funded_renter(&exchange, &operator, 7, 1_000_000_000).await;
    await_asks(&mut renter, InstrumentId(0), 2).await;

    // Created: both replicas bid, fill on the two hosts and become ready;
    // each answers HTTP at its endpoint.
    let ServerMessage::Service { service, .. } =
        request(&mut renter, |id| ClientMessage::CreateService { id, service: Box::new(spec()) }).await
    else {
        panic!("created")
    };
    let id = service.service;
    let info = await_service(&mut renter, Duration::from_secs(60), |s| ready(s).len() == 2).await;
    for (_, endpoint) in ready(&info) {
        let status = http_status(&endpoint).expect("the replica answers");
        assert!(status.contains("200"), "{endpoint}: {status}");
    }
    let host_of = |lease: LeaseId| names.iter().copied().find(|name| container_exists(&socket, name, lease)).expect("a host runs it");
    let (lost, _) = ready(&info)[0].clone();
    let lost_host = host_of(lost);
    let dead = names.iter().position(|n| *n == lost_host).expect("one of ours");

    // The third host comes up, then the first replica's host dies: its
    // agent killed and its container gone with it.
    let (config, host) = job_host(&dir.path().join(names[2]), &exchange.url, &socket, names[2], H100_GPU, &[("spot", 2_100_000)]);
    agents.push(Some(spawn_agent(&config, &host)));
    await_asks(&mut renter, InstrumentId(0), 1).await;
    agents[dead] = None;
    remove_container(&socket, lost_host, lost);
    let killed = Instant::now();
    let killed_ms = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).expect("clock").as_millis() as u64;
    let info = await_service(&mut renter, Duration::from_secs(60), |s| {
        s.replaced >= 1 && ready(s).len() == 2 && ready(s).iter().all(|(lease, _)| *lease != lost)
    })
    .await;
    eprintln!("replica replaced and ready {:?} after its host died", killed.elapsed());
    assert_eq!(info.replaced, 1, "one replica lost, one replaced");
    assert!(info.leases.contains(&lost));
    for (lease, endpoint) in ready(&info) {
        let status = http_status(&endpoint).expect("the replica answers");
        assert!(status.contains("200"), "{endpoint}: {status}");
        assert_ne!(host_of(lease), lost_host, "nothing runs on the dead host");
    }
    let ServerMessage::Leases { leases, .. } = request(&mut renter, |rid| ClientMessage::Leases { id: rid, after: None }).await else {
        panic!("leases")
    };
    let old = leases.iter().find(|l| l.lease == lost).expect("the lost lease");
    assert!(!old.active, "the dead host's lease ended");
    // Billed for what its host reported, never past its death.
    assert!(old.verified_gpu_ms <= killed_ms.saturating_sub(old.start_ms), "billed {} ms", old.verified_gpu_ms);
    assert!(old.ended_at_ms.is_some_and(|end| end >= killed_ms), "ended after the host died: {:?}", old.ended_at_ms);

    // Scaled to one: one replica let go, its lease ended and its container removed.
    let ServerMessage::Service { service, .. } =
        request(&mut renter, |rid| ClientMessage::ScaleService { id: rid, service: id, replicas: 1 }).await
    else {
        panic!("scaled")
    };
    assert_eq!(service.replicas.len(), 1);
    let kept = service.replicas[0].lease.expect("a lease");
    let gone: Vec<LeaseId> = ready(&info).into_iter().map(|(l, _)| l).filter(|l| *l != kept).collect();
    assert_eq!(gone.len(), 1);
    let deadline = Instant::now() + Duration::from_secs(30);
    while names.iter().any(|name| container_exists(&socket, name, gone[0])) {
        assert!(Instant::now() < deadline, "the let-go replica's container is removed");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    // Out of bounds.
    let answer = request(&mut renter, |rid| ClientMessage::ScaleService { id: rid, service: id, replicas: 4 }).await;
    assert!(matches!(answer, ServerMessage::Error { code: ErrorCode::ServiceScaleInvalid, .. }), "{answer:?}");

    // Deleted: the last replica's lease ends, its container removed.
    let ServerMessage::Service { service, .. } = request(&mut renter, |rid| ClientMessage::DeleteService { id: rid, service: id }).await
    else {
        panic!("deleted")
    };
    assert_eq!(service.state, ServiceState::Deleted);
    let deadline = Instant::now() + Duration::from_secs(30);
    while names.iter().any(|name| container_exists(&socket, name, kept)) {
        assert!(Instant::now() < deadline, "the last replica's container is removed");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let ServerMessage::Services { services, .. } = request(&mut renter, |rid| ClientMessage::Services { id: rid, offset: 0 }).await else {
        panic!("services")
    };
    assert_eq!(services.iter().map(|s| (s.service, s.state)).collect::<Vec<_>>(), [(id, ServiceState::Deleted)]);
}
