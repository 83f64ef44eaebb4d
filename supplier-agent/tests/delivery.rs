//! Lease delivery end to end: a real exchange, the real agent binary with
//! the `docker` backend driving a real container engine (podman serving the
//! Docker API, started by `scripts/containers`), GPUs from the fake backend.
//!
//! The socket comes from `GPUX_DOCKER_SOCKET`; `scripts/test` sets it. Run
//! alone without it, these tests say so and pass, unless
//! `GPUX_REQUIRE_CONTAINERS=1` (CI) makes a missing engine a failure.

mod common;

use std::io::{Read, Write};
use std::time::{Duration, Instant};

use common::*;
use ed25519_dalek::SigningKey;
use gpux_engine::{EventKind, InstrumentId, LeaseId, Side, TimeInForce};
use gpux_protocol::*;
use gpux_supplier_agent::session::Connection;

const IMAGE: &str = "localhost/gpux-test:busybox";
const SECRET_ENV: &str = "s3cret-env-value-42";
const SECRET_SSH: &str = "AAAAC3NzaC1lZDI1NTE5AAAAIGpuxtestkeynotreal";

fn socket() -> Option<String> {
    match std::env::var("GPUX_DOCKER_SOCKET") {
        Ok(socket) if std::path::Path::new(&socket).exists() => Some(socket),
        _ => {
            assert!(
                std::env::var("GPUX_REQUIRE_CONTAINERS").as_deref() != Ok("1"),
                "GPUX_REQUIRE_CONTAINERS=1 but GPUX_DOCKER_SOCKET names no socket: run scripts/containers start"
            );
            eprintln!("SKIPPED: no container engine (set GPUX_DOCKER_SOCKET; scripts/test does)");
            None
        }
    }
}

const ONE_GPU: &str = r#"{"gpus": [{"uuid": "GPU-a", "vendor": "nvidia", "model": "NVIDIA H100 80GB HBM3", "memory_mib": 81559, "interconnect": "nv_link"}]}"#;

/// Agent files: the docker backend on `socket`, offering spot and
/// preemptible; `devices` is `none` (fake GPUs) or a host-side fault.
fn docker_agent(
    dir: &std::path::Path,
    url: &str,
    socket: &str,
    host_name: &str,
    devices: &str,
) -> (std::path::PathBuf, std::path::PathBuf) {
    let host = dir.join("host.json");
    write(&host, ONE_GPU);
    let config = dir.join("agent.toml");
    write(
        &config,
        &format!(
            "exchange = \"{url}\"\nhost = \"{host_name}\"\nkey_file = \"{}\"\nsample_interval_ms = 1000\nreport_interval_ms = 1000\n\n\
             [[offer]]\ncontract = \"spot\"\nprice_floor_minor_per_gpu_hour = 2100000\n\n\
             [[offer]]\ncontract = \"preemptible\"\nprice_floor_minor_per_gpu_hour = 900000\n\n\
             [delivery]\nbackend = \"docker\"\npublic_address = \"127.0.0.1\"\nstate_dir = \"{}\"\nstop_grace_ms = 1000\n\n\
             [delivery.docker]\nsocket = \"{socket}\"\ngpu_devices = \"{devices}\"\n",
            dir.join("host.key").display(),
            dir.join("leases").display(),
        ),
    );
    (config, host)
}

/// What a renter sees of its lease's delivery until `done` holds (60 s).
async fn await_delivery(renter: &mut Connection, lease: LeaseId, mut done: impl FnMut(&DeliveryState) -> bool) -> DeliveryState {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        let message = tokio::time::timeout(left, renter.next()).await.expect("delivery status in time").expect("message");
        if let ServerMessage::Delivery { lease: of, state, .. } = message {
            assert!(!matches!(state, DeliveryState::Failed { .. }) || done(&state), "delivery failed: {state:?}");
            if of == lease && done(&state) {
                return state;
            }
        }
    }
}

async fn await_lease(renter: &mut Connection) -> LeaseId {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        if let ServerMessage::Private { event, .. } =
            tokio::time::timeout(left, renter.next()).await.expect("a lease in time").expect("message")
        {
            if let EventKind::LeaseCreated { lease, .. } = event.kind {
                return lease;
            }
        }
    }
}

fn http_get(host: &str, port: u16) -> String {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        if let Ok(mut stream) = std::net::TcpStream::connect((host, port)) {
            stream.set_read_timeout(Some(Duration::from_secs(5))).expect("timeout");
            let _ = stream.write_all(b"GET / HTTP/1.0\r\n\r\n");
            let mut page = String::new();
            let _ = stream.read_to_string(&mut page);
            if page.contains("200") {
                return page;
            }
        }
        assert!(Instant::now() < deadline, "the container's web server answered through the endpoint");
        std::thread::sleep(Duration::from_millis(200));
    }
}

fn files_hold(dir: &std::path::Path, needle: &str) -> Vec<std::path::PathBuf> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir(dir).expect("dir").flatten() {
        let path = entry.path();
        if path.is_dir() {
            found.extend(files_hold(&path, needle));
        } else if std::fs::read(&path).is_ok_and(|bytes| bytes.windows(needle.len()).any(|w| w == needle.as_bytes())) {
            found.push(path);
        }
    }
    found
}

fn secrets_for_httpd() -> Secrets {
    Secrets {
        command: vec!["/bin/busybox".into()],
        args: vec!["httpd".into(), "-f".into(), "-v".into(), "-p".into(), "8080".into(), "-h".into(), "/www".into()],
        env: vec![("GPUX_TEST_SECRET".into(), SECRET_ENV.into())],
        ssh_keys: vec![format!("ssh-ed25519 {SECRET_SSH} renter@test")],
        // `running` once the page is served, not once it stayed up 2 s.
        readiness: Some(gpux_protocol::delivery::Readiness { port: 8080, http_path: Some("/index.html".into()) }),
        registry_auth: None,
    }
}

/// The renter's bid carries a workload whose secrets follow; once the bid
/// fills, the renter seals them to the host's key; the container starts on
/// the leased GPU, the renter's HTTP request reaches it through the endpoint
/// it was sent, its logs come back, and the lease's end removes it. Neither
/// the journal nor the snapshots hold the secrets in clear.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_renter_reaches_its_container_and_the_lease_end_removes_it() {
    let Some(socket) = socket() else { return };
    let dir = tempfile::tempdir().expect("temp dir");
    let operator = SigningKey::from_bytes(&[1; 32]);
    let mut exchange = Exchange::start(&dir.path().join("exchange"), &operator);
    let (config, host) = docker_agent(dir.path(), &exchange.url, &socket, "delivery-1", "none");
    let _agent = spawn_agent(&config, &host);
    let mut renter = funded_renter(&exchange, &operator, 3, 1_000_000_000).await;

    let workload = Workload { ports: vec![8080], secrets_follow: true, ..Workload::image(IMAGE) };
    let deadline = Instant::now() + Duration::from_secs(20);
    let lease = loop {
        let id = renter.new_id();
        let mut order = OrderTicket::limit(id, InstrumentId(0), Side::Buy, 2_100_000, 1);
        order.time_in_force = TimeInForce::Ioc;
        let answer = renter.request(ClientMessage::NewOrder { id, order, workload: Some(Box::new(workload.clone())) }).await.expect("bid");
        assert!(matches!(answer, ServerMessage::Ack { .. }), "{answer:?}");
        if let Ok(lease) = tokio::time::timeout(Duration::from_millis(700), await_lease(&mut renter)).await {
            break lease;
        }
        assert!(Instant::now() < deadline, "the agent's ask filled");
    };
    await_delivery(&mut renter, lease, |s| matches!(s, DeliveryState::AwaitingSecrets)).await;
    send_secrets(&mut renter, lease, workload, &secrets_for_httpd()).await;
    let DeliveryState::Running { endpoints, ssh, .. } =
        await_delivery(&mut renter, lease, |s| matches!(s, DeliveryState::Running { .. })).await
    else {
        unreachable!()
    };
    assert_eq!(ssh, None, "no port 22 published");
    let endpoint = endpoints.iter().find(|e| e.container_port == 8080).expect("the published port");
    let page = http_get(&endpoint.host, endpoint.port);
    assert!(page.contains("gpux delivery test page"), "{page}");

    // The last status is kept for queries.
    let id = renter.new_id();
    let ServerMessage::LeaseDelivery { state: Some(DeliveryState::Running { .. }), workload: Some(kept), .. } =
        renter.request(ClientMessage::LeaseDelivery { id, lease }).await.expect("query")
    else {
        panic!("lease delivery")
    };
    assert!(kept.sealed.is_some(), "the exchange keeps the sealed secrets for the host");

    // The container's output, relayed by the exchange from the host.
    let id = renter.new_id();
    let ServerMessage::LeaseLogs { data, .. } =
        renter.request(ClientMessage::LeaseLogs { id, lease, tail_bytes: 4096 }).await.expect("logs")
    else {
        panic!("logs")
    };
    assert!(data.contains("response:200"), "httpd -v logged the request: {data:?}");

    let id = renter.new_id();
    renter.request(ClientMessage::EndLease { id, lease }).await.expect("end");
    await_delivery(&mut renter, lease, |s| matches!(s, DeliveryState::Stopped)).await;
    assert!(!container_exists(&socket, "delivery-1", lease), "the container is removed at the lease's end");

    exchange.stop();
    for needle in [SECRET_ENV, SECRET_SSH] {
        let found = files_hold(&dir.path().join("exchange"), needle);
        assert!(found.is_empty(), "{needle} in clear in {found:?}");
    }
}

/// kill -9 of the agent while the container runs: the restarted agent
/// re-adopts the same container and billing goes on; a preemption notice
/// then reaches the workload as SIGTERM, and the container is removed when
/// the lease ends at the deadline.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restarted_agent_readopts_and_a_preempted_workload_gets_sigterm() {
    let Some(socket) = socket() else { return };
    let dir = tempfile::tempdir().expect("temp dir");
    let operator = SigningKey::from_bytes(&[1; 32]);
    let exchange = Exchange::start(&dir.path().join("exchange"), &operator);
    let (config, host) = docker_agent(dir.path(), &exchange.url, &socket, "delivery-2", "none");
    let mut agent = spawn_agent(&config, &host);
    let mut renter = funded_renter(&exchange, &operator, 4, 1_000_000_000).await;

    // A preemptible lease whose workload says goodbye on SIGTERM.
    let secrets = Secrets {
        command: vec!["/bin/sh".into()],
        args: vec!["-c".into(), "trap 'echo got-sigterm; exit 0' TERM; echo started; while true; do sleep 1; done".into()],
        ..Secrets::default()
    };
    let deadline = Instant::now() + Duration::from_secs(20);
    let lease = loop {
        let id = renter.new_id();
        let mut order = OrderTicket::limit(id, InstrumentId(1), Side::Buy, 900_000, 1);
        order.time_in_force = TimeInForce::Ioc;
        let answer = renter.request(ClientMessage::NewOrder { id, order, workload: None }).await.expect("bid");
        assert!(matches!(answer, ServerMessage::Ack { .. }), "{answer:?}");
        if let Ok(lease) = tokio::time::timeout(Duration::from_millis(700), await_lease(&mut renter)).await {
            break lease;
        }
        assert!(Instant::now() < deadline, "the agent's preemptible ask filled");
    };
    send_secrets(&mut renter, lease, Workload::image(IMAGE), &secrets).await;
    await_delivery(&mut renter, lease, |s| matches!(s, DeliveryState::Running { .. })).await;
    let started_at = container_started_at(&socket, "delivery-2", lease);

    // kill -9 and restart: the container is adopted, not started again.
    let _ = agent.0.kill();
    let _ = agent.0.wait();
    tokio::time::sleep(Duration::from_millis(1_500)).await;
    assert!(container_exists(&socket, "delivery-2", lease), "the workload outlives its agent");
    let _agent = spawn_agent(&config, &host);
    await_delivery(&mut renter, lease, |s| matches!(s, DeliveryState::Running { .. })).await;
    assert_eq!(container_started_at(&socket, "delivery-2", lease), started_at, "adopted, not started again");
    let verified = |info: &gpux_protocol::views::Lease| info.verified_gpu_ms;
    let before = lease_info(&mut renter, lease).await;
    tokio::time::sleep(Duration::from_millis(3_000)).await;
    assert!(verified(&lease_info(&mut renter, lease).await) > verified(&before), "billing goes on after the restart");

    // A spot buyer preempts: SIGTERM at the notice.
    let mut urgent = funded_renter(&exchange, &operator, 5, 1_000_000_000).await;
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let id = urgent.new_id();
        let mut order = OrderTicket::limit(id, InstrumentId(0), Side::Buy, 2_100_000, 1);
        order.time_in_force = TimeInForce::Ioc;
        urgent.request(ClientMessage::NewOrder { id, order, workload: None }).await.expect("spot bid");
        if let Ok(Ok(ServerMessage::Private { event, .. })) = tokio::time::timeout(Duration::from_millis(700), renter.next()).await {
            if matches!(event.kind, EventKind::PreemptionNotice { lease: l, .. } if l == lease) {
                break;
            }
        }
        assert!(Instant::now() < deadline, "the preemptible lease was preempted");
    }
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let id = renter.new_id();
        if let ServerMessage::LeaseLogs { data, .. } =
            renter.request(ClientMessage::LeaseLogs { id, lease, tail_bytes: 4096 }).await.expect("logs")
        {
            if data.contains("got-sigterm") {
                break;
            }
        }
        assert!(Instant::now() < deadline, "the workload got SIGTERM at the notice");
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    // The lease ends at the deadline (the demo's 30 s notice); the container goes.
    await_delivery(&mut renter, lease, |s| matches!(s, DeliveryState::Stopped)).await;
    assert!(!container_exists(&socket, "delivery-2", lease), "removed at the deadline");
    let ended = lease_info(&mut renter, lease).await;
    assert!(!ended.active);
}

/// An agent configured for devices its host lacks cannot create the
/// container: a failed delivery on the host's side. The lease ends
/// `delivery_failed` and the renter pays nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_host_side_failure_ends_the_lease_and_is_not_billed() {
    let Some(socket) = socket() else { return };
    if std::path::Path::new("/dev/kfd").exists() {
        eprintln!("SKIPPED: this host has /dev/kfd, so the AMD device mapping would not fail");
        return;
    }
    let dir = tempfile::tempdir().expect("temp dir");
    let operator = SigningKey::from_bytes(&[1; 32]);
    let exchange = Exchange::start(&dir.path().join("exchange"), &operator);
    let (config, host) = docker_agent(dir.path(), &exchange.url, &socket, "delivery-3", "amd");
    let _agent = spawn_agent(&config, &host);
    let deposit = 1_000_000_000;
    let mut renter = funded_renter(&exchange, &operator, 6, deposit).await;
    let secrets = Secrets { command: vec!["/bin/busybox".into(), "sleep".into(), "600".into()], ..Secrets::default() };
    let deadline = Instant::now() + Duration::from_secs(20);
    let lease = loop {
        let id = renter.new_id();
        let mut order = OrderTicket::limit(id, InstrumentId(0), Side::Buy, 2_100_000, 1);
        order.time_in_force = TimeInForce::Ioc;
        let workload = Workload { secrets_follow: true, ..Workload::image(IMAGE) };
        renter.request(ClientMessage::NewOrder { id, order, workload: Some(Box::new(workload)) }).await.expect("bid");
        if let Ok(lease) = tokio::time::timeout(Duration::from_millis(700), await_lease(&mut renter)).await {
            break lease;
        }
        assert!(Instant::now() < deadline, "the agent's ask filled");
    };
    send_secrets(&mut renter, lease, Workload::image(IMAGE), &secrets).await;
    let failed = await_delivery(&mut renter, lease, |s| matches!(s, DeliveryState::Failed { .. })).await;
    assert!(matches!(failed, DeliveryState::Failed { code: FailureCode::HostError, fault: Fault::Host, .. }), "{failed:?}");
    let deadline = Instant::now() + Duration::from_secs(10);
    while lease_info(&mut renter, lease).await.active {
        assert!(Instant::now() < deadline, "the lease ended");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    tokio::time::sleep(Duration::from_millis(2_500)).await;
    let info = lease_info(&mut renter, lease).await;
    assert_eq!(info.usage_charged_minor, 0, "nothing charged for a delivery the host failed");
    let id = renter.new_id();
    let ServerMessage::Balance { available_minor, held_minor, .. } = renter.request(ClientMessage::Balance { id }).await.expect("balance")
    else {
        panic!("balance")
    };
    assert_eq!(available_minor + held_minor, deposit, "the renter's money is whole (escrow released at billing close)");
}

/// An image that cannot be pulled is the renter's failure: the lease runs on
/// (and is billed), and a new workload can be set on it. The image's
/// registry is `localhost`, so the pull fails at once on loopback.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pull_failure_is_the_renters_and_the_lease_runs_on() {
    let Some(socket) = socket() else { return };
    let dir = tempfile::tempdir().expect("temp dir");
    let operator = SigningKey::from_bytes(&[1; 32]);
    let exchange = Exchange::start(&dir.path().join("exchange"), &operator);
    let (config, host) = docker_agent(dir.path(), &exchange.url, &socket, "delivery-4", "none");
    let _agent = spawn_agent(&config, &host);
    let mut renter = funded_renter(&exchange, &operator, 8, 1_000_000_000).await;
    let deadline = Instant::now() + Duration::from_secs(20);
    let lease = loop {
        let id = renter.new_id();
        let mut order = OrderTicket::limit(id, InstrumentId(0), Side::Buy, 2_100_000, 1);
        order.time_in_force = TimeInForce::Ioc;
        let workload = Workload::image("localhost/gpux-absent:none");
        renter.request(ClientMessage::NewOrder { id, order, workload: Some(Box::new(workload)) }).await.expect("bid");
        if let Ok(lease) = tokio::time::timeout(Duration::from_millis(700), await_lease(&mut renter)).await {
            break lease;
        }
        assert!(Instant::now() < deadline, "the agent's ask filled");
    };
    let failed = await_delivery(&mut renter, lease, |s| matches!(s, DeliveryState::Failed { .. })).await;
    assert!(matches!(failed, DeliveryState::Failed { code: FailureCode::PullFailed, fault: Fault::Renter, .. }), "{failed:?}");
    tokio::time::sleep(Duration::from_millis(1_500)).await;
    assert!(lease_info(&mut renter, lease).await.active, "the renter's failure does not end the lease");
    // A working workload on the same lease.
    let secrets = Secrets { command: vec!["/bin/busybox".into(), "sleep".into(), "600".into()], ..Secrets::default() };
    send_secrets(&mut renter, lease, Workload::image(IMAGE), &secrets).await;
    await_delivery(&mut renter, lease, |s| matches!(s, DeliveryState::Running { .. })).await;
    let id = renter.new_id();
    renter.request(ClientMessage::EndLease { id, lease }).await.expect("end");
    await_delivery(&mut renter, lease, |s| matches!(s, DeliveryState::Stopped)).await;
}

/// Options no host grants are refused by the exchange with their own code.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refused_workload_options_get_their_codes_over_the_wire() {
    let dir = tempfile::tempdir().expect("temp dir");
    let operator = SigningKey::from_bytes(&[1; 32]);
    let exchange = Exchange::start(&dir.path().join("exchange"), &operator);
    let mut renter = funded_renter(&exchange, &operator, 7, 1_000_000).await;
    let base = Workload::image(IMAGE);
    let cases = [
        (Workload { privileged: true, ..base.clone() }, ErrorCode::WorkloadOptionRefused),
        (Workload { host_network: true, ..base.clone() }, ErrorCode::WorkloadOptionRefused),
        (Workload { host_mounts: vec!["/:/host".into()], ..base.clone() }, ErrorCode::WorkloadOptionRefused),
        (Workload { cap_add: vec!["SYS_ADMIN".into()], ..base.clone() }, ErrorCode::WorkloadOptionRefused),
        (Workload { ports: (1..=17).collect(), ..base.clone() }, ErrorCode::TooManyPorts),
        (Workload::image("bad image"), ErrorCode::ImageInvalid),
    ];
    for (workload, expected) in cases {
        let id = renter.new_id();
        let order = OrderTicket::limit(id, InstrumentId(0), Side::Buy, 1_000, 1);
        let answer = renter.request(ClientMessage::NewOrder { id, order, workload: Some(Box::new(workload)) }).await.expect("answer");
        assert!(matches!(answer, ServerMessage::Error { code, .. } if code == expected), "{expected:?}: {answer:?}");
    }
    let id = renter.new_id();
    let answer = renter.request(ClientMessage::SetWorkload { id, lease: LeaseId(42), workload: Box::new(base) }).await.expect("answer");
    assert!(matches!(answer, ServerMessage::Error { code: ErrorCode::UnknownLease, .. }), "{answer:?}");
    let id = renter.new_id();
    let answer = renter.request(ClientMessage::HostKey { id, lease: LeaseId(42) }).await.expect("answer");
    assert!(matches!(answer, ServerMessage::Error { code: ErrorCode::UnknownLease, .. }), "{answer:?}");
}

/// A container engine of one test's own: podman serving the Docker API on
/// a socket of its own, over the same image store as the shared one, so a
/// test can take it down and bring it back without touching the others.
struct PrivateEngine {
    socket: std::path::PathBuf,
    service: Option<std::process::Child>,
}

impl PrivateEngine {
    fn start(dir: &std::path::Path) -> PrivateEngine {
        let mut engine = PrivateEngine { socket: dir.join("engine.sock"), service: None };
        engine.up();
        engine
    }

    fn up(&mut self) {
        let _ = std::fs::remove_file(&self.socket);
        let conf = std::path::Path::new(&std::env::var("GPUX_DOCKER_SOCKET").expect("socket")).with_file_name("containers.conf");
        let service = std::process::Command::new("podman")
            .env("CONTAINERS_CONF", conf)
            .args(["system", "service", "--time=0"])
            .arg(format!("unix://{}", self.socket.display()))
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .expect("podman starts");
        self.service = Some(service);
        let deadline = Instant::now() + Duration::from_secs(10);
        while !self.socket.exists() {
            assert!(Instant::now() < deadline, "podman opened its socket");
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// The engine's service killed: its socket refuses (containers run on).
    fn down(&mut self) {
        if let Some(mut service) = self.service.take() {
            let _ = service.kill();
            let _ = service.wait();
        }
    }

    fn socket(&self) -> String {
        self.socket.display().to_string()
    }
}

impl Drop for PrivateEngine {
    fn drop(&mut self) {
        self.down();
    }
}

/// Whether podman itself (no service needed) knows the container.
fn container_known_to_podman(host: &str, lease: LeaseId) -> bool {
    let conf = std::path::Path::new(&std::env::var("GPUX_DOCKER_SOCKET").expect("socket")).with_file_name("containers.conf");
    std::process::Command::new("podman")
        .env("CONTAINERS_CONF", conf)
        .args(["container", "exists", &format!("gpux-{host}-lease-{}", lease.0)])
        .status()
        .expect("podman runs")
        .success()
}

/// Bids IOC for one GPU of instrument 0 until one fills (`Some(lease)`) or
/// `within` passes (`None`), with `workload` attached.
async fn lease_within(renter: &mut Connection, workload: Option<&Workload>, within: Duration) -> Option<LeaseId> {
    let deadline = Instant::now() + within;
    loop {
        let id = renter.new_id();
        let mut order = OrderTicket::limit(id, InstrumentId(0), Side::Buy, 2_100_000, 1);
        order.time_in_force = TimeInForce::Ioc;
        let answer = renter.request(ClientMessage::NewOrder { id, order, workload: workload.cloned().map(Box::new) }).await.expect("bid");
        assert!(matches!(answer, ServerMessage::Ack { .. }), "{answer:?}");
        if let Ok(lease) = tokio::time::timeout(Duration::from_millis(500), await_lease(renter)).await {
            return Some(lease);
        }
        if Instant::now() >= deadline {
            return None;
        }
    }
}

/// A workload that runs until stopped.
fn sleeper() -> Secrets {
    Secrets { command: vec!["/bin/busybox".into(), "sleep".into(), "600".into()], ..Secrets::default() }
}

/// Leases one GPU with a workload whose secrets follow, seals `secrets` to
/// the lease's host and waits until it runs.
async fn running_lease(renter: &mut Connection, secrets: &Secrets) -> LeaseId {
    let workload = Workload { secrets_follow: true, ..Workload::image(IMAGE) };
    let lease = lease_within(renter, Some(&workload), Duration::from_secs(20)).await.expect("a lease");
    send_secrets(renter, lease, Workload::image(IMAGE), secrets).await;
    await_delivery(renter, lease, |s| matches!(s, DeliveryState::Running { .. })).await;
    lease
}

async fn balance(renter: &mut Connection) -> (u64, u64) {
    let id = renter.new_id();
    let ServerMessage::Balance { available_minor, held_minor, .. } = renter.request(ClientMessage::Balance { id }).await.expect("balance")
    else {
        panic!("balance")
    };
    (available_minor, held_minor)
}

/// The host's container engine is down when a lease's delivery begins: the
/// host's failure (`engine_unavailable`), never a pull failure charged to
/// the renter. The lease ends `delivery_failed`, nothing is charged, the
/// GPU is off sale while the engine stays down (health checks fail), also
/// through a restart of the agent, and on sale again once the engine is
/// back and a check passed; then a delivery works.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_engine_that_does_not_answer_is_the_hosts_fault_and_its_gpu_waits_for_a_health_check() {
    let Some(_) = socket() else { return };
    let dir = tempfile::tempdir().expect("temp dir");
    let mut engine = PrivateEngine::start(dir.path());
    let operator = SigningKey::from_bytes(&[1; 32]);
    let exchange = Exchange::start(&dir.path().join("exchange"), &operator);
    let (config, host) = docker_agent(dir.path(), &exchange.url, &engine.socket(), "faults-1", "none");
    let text = std::fs::read_to_string(&config).expect("config");
    write(&config, &text.replace("stop_grace_ms = 1000\n", "stop_grace_ms = 1000\nhealth_backoff_ms = 4000\n"));
    let mut agent = spawn_agent(&config, &host);
    let deposit = 1_000_000_000;
    let mut renter = funded_renter(&exchange, &operator, 9, deposit).await;
    // The agent offers once it has listed the engine's workloads.
    let probe = lease_within(&mut renter, None, Duration::from_secs(20)).await.expect("the GPU on sale");
    let id = renter.new_id();
    renter.request(ClientMessage::EndLease { id, lease: probe }).await.expect("end");
    tokio::time::sleep(Duration::from_millis(1_500)).await;

    engine.down();
    let down_at = Instant::now();
    let workload = Workload::image(IMAGE);
    let lease = lease_within(&mut renter, Some(&workload), Duration::from_secs(20)).await.expect("a lease");
    let failed = await_delivery(&mut renter, lease, |s| matches!(s, DeliveryState::Failed { .. })).await;
    assert!(matches!(failed, DeliveryState::Failed { code: FailureCode::EngineUnavailable, fault: Fault::Host, .. }), "{failed:?}");
    let deadline = Instant::now() + Duration::from_secs(10);
    while lease_info(&mut renter, lease).await.active {
        assert!(Instant::now() < deadline, "the lease ended");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let info = lease_info(&mut renter, lease).await;
    let ended_after_ms = info.ended_at_ms.expect("ended") - info.start_ms;
    eprintln!(
        "engine down: lease ended as the host's fault {ended_after_ms} ms after it began ({} ms after the outage)",
        down_at.elapsed().as_millis()
    );
    // Off sale while the engine is down: the check at 4 s fails.
    assert_eq!(lease_within(&mut renter, None, Duration::from_secs(6)).await, None, "the GPU is not sold while the engine is down");
    tokio::time::sleep(Duration::from_millis(2_500)).await;
    assert_eq!(lease_info(&mut renter, lease).await.usage_charged_minor, 0, "nothing charged for the host's failure");
    let probe_charged = lease_info(&mut renter, probe).await.usage_charged_minor;
    let (available, held) = balance(&mut renter).await;
    assert_eq!(available + held + probe_charged, deposit, "the renter paid for the probe lease only");

    // The engine is back, and the agent restarted (kill -9) at once: the new
    // process keeps the back-off (the host's record shows the failure and
    // the exchange has the GPU offline), so the GPU is not sold before a
    // health check, 4 s on.
    engine.up();
    let _ = agent.0.kill();
    let _ = agent.0.wait();
    let _agent = spawn_agent(&config, &host);
    let restarted = Instant::now();
    assert_eq!(lease_within(&mut renter, None, Duration::from_millis(2_500)).await, None, "not sold before the resumed health check");
    let back = lease_within(&mut renter, None, Duration::from_secs(30)).await.expect("on sale again once a health check passed");
    assert!(restarted.elapsed() >= Duration::from_secs(3), "sold {:?} after the restart", restarted.elapsed());
    let id = renter.new_id();
    renter.request(ClientMessage::EndLease { id, lease: back }).await.expect("end");
    tokio::time::sleep(Duration::from_millis(1_500)).await;
    let lease = running_lease(&mut renter, &sleeper()).await;
    let id = renter.new_id();
    renter.request(ClientMessage::EndLease { id, lease }).await.expect("end");
    await_delivery(&mut renter, lease, |s| matches!(s, DeliveryState::Stopped)).await;
}

/// The engine goes down while a workload runs (podman's containers run on
/// without its API service): the agent cannot see the container, and says
/// nothing it does not know: no `exited`, the lease goes on and is billed
/// (the GPU is the renter's, the workload runs); once the engine is back
/// the agent sees it running and the lease's end removes it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_engine_down_while_the_workload_runs_claims_no_exit() {
    let Some(_) = socket() else { return };
    let dir = tempfile::tempdir().expect("temp dir");
    let mut engine = PrivateEngine::start(dir.path());
    let operator = SigningKey::from_bytes(&[1; 32]);
    let exchange = Exchange::start(&dir.path().join("exchange"), &operator);
    let (config, host) = docker_agent(dir.path(), &exchange.url, &engine.socket(), "faults-9", "none");
    let _agent = spawn_agent(&config, &host);
    let mut renter = funded_renter(&exchange, &operator, 19, 1_000_000_000).await;
    let lease = running_lease(&mut renter, &sleeper()).await;

    engine.down();
    let told =
        tokio::time::timeout(Duration::from_secs(5), await_delivery(&mut renter, lease, |s| !matches!(s, DeliveryState::Running { .. })))
            .await;
    assert!(told.is_err(), "the renter was told {told:?} while the engine could not be asked");
    let before = lease_info(&mut renter, lease).await;
    assert!(before.active, "the lease goes on");
    engine.up();
    tokio::time::sleep(Duration::from_secs(3)).await;
    let after = lease_info(&mut renter, lease).await;
    assert!(after.verified_gpu_ms > before.verified_gpu_ms, "billing went on: the workload ran");
    let id = renter.new_id();
    renter.request(ClientMessage::EndLease { id, lease }).await.expect("end");
    await_delivery(&mut renter, lease, |s| matches!(s, DeliveryState::Stopped)).await;
    assert!(!container_known_to_podman("faults-9", lease), "removed at the end");
}

/// The engine is unreachable when a lease ends: the agent does not claim
/// `stopped`, the container is still there, and the GPU is not sold to the
/// next renter; once the engine is back the removal is retried, confirmed,
/// `stopped` reported and the GPU offered again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_removal_the_engine_cannot_confirm_keeps_the_gpu_off_sale() {
    let Some(_) = socket() else { return };
    let dir = tempfile::tempdir().expect("temp dir");
    let mut engine = PrivateEngine::start(dir.path());
    let operator = SigningKey::from_bytes(&[1; 32]);
    let exchange = Exchange::start(&dir.path().join("exchange"), &operator);
    let (config, host) = docker_agent(dir.path(), &exchange.url, &engine.socket(), "faults-2", "none");
    let _agent = spawn_agent(&config, &host);
    let mut renter = funded_renter(&exchange, &operator, 10, 1_000_000_000).await;
    let mut next = funded_renter(&exchange, &operator, 11, 1_000_000_000).await;
    let lease = running_lease(&mut renter, &sleeper()).await;

    engine.down();
    let id = renter.new_id();
    renter.request(ClientMessage::EndLease { id, lease }).await.expect("end");
    let stopped =
        tokio::time::timeout(Duration::from_secs(4), await_delivery(&mut renter, lease, |s| matches!(s, DeliveryState::Stopped))).await;
    assert!(stopped.is_err(), "`stopped` is not claimed while the engine cannot remove the container");
    assert!(container_known_to_podman("faults-2", lease), "the container is still there");
    assert_eq!(lease_within(&mut next, None, Duration::from_secs(3)).await, None, "the GPU is not sold while its last container stays");

    engine.up();
    await_delivery(&mut renter, lease, |s| matches!(s, DeliveryState::Stopped)).await;
    assert!(!container_known_to_podman("faults-2", lease), "removed once the engine is back");
    let again = lease_within(&mut next, None, Duration::from_secs(20)).await.expect("offered again once the removal is confirmed");
    assert!(lease_info(&mut next, again).await.active);
}

/// A sealed command that cannot be executed: `exec_failed`, the renter's
/// side, and the command's path (a canary here) reaches neither the
/// renter's feed nor the exchange's journal or snapshots: the engine's
/// error text, which names it, stays in the host's log.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_exec_journals_a_code_never_the_sealed_command() {
    const CANARY: &str = "gpux-canary-3f9a1c";
    let Some(socket) = socket() else { return };
    let dir = tempfile::tempdir().expect("temp dir");
    let operator = SigningKey::from_bytes(&[1; 32]);
    let mut exchange = Exchange::start(&dir.path().join("exchange"), &operator);
    let (config, host) = docker_agent(dir.path(), &exchange.url, &socket, "faults-3", "none");
    let _agent = spawn_agent(&config, &host);
    let mut renter = funded_renter(&exchange, &operator, 12, 1_000_000_000).await;
    let secrets = Secrets { command: vec![format!("/{CANARY}/run")], ..Secrets::default() };
    let workload = Workload { secrets_follow: true, ..Workload::image(IMAGE) };
    let lease = lease_within(&mut renter, Some(&workload), Duration::from_secs(20)).await.expect("a lease");
    send_secrets(&mut renter, lease, Workload::image(IMAGE), &secrets).await;
    let failed = await_delivery(&mut renter, lease, |s| matches!(s, DeliveryState::Failed { .. })).await;
    let DeliveryState::Failed { code: FailureCode::ExecFailed, fault: Fault::Renter, reason } = &failed else { panic!("{failed:?}") };
    assert!(!reason.contains(CANARY), "{reason}");
    tokio::time::sleep(Duration::from_millis(1_000)).await;
    assert!(lease_info(&mut renter, lease).await.active, "the renter's failure leaves the lease running");
    let id = renter.new_id();
    renter.request(ClientMessage::EndLease { id, lease }).await.expect("end");
    await_delivery(&mut renter, lease, |s| matches!(s, DeliveryState::Stopped)).await;
    exchange.stop();
    let found = files_hold(&dir.path().join("exchange"), CANARY);
    assert!(found.is_empty(), "the sealed command in clear in {found:?}");
}

/// A command that exits at once is never reported `running`: it stays
/// `starting` until it stayed up (2 s by default), so the renter sees it
/// exit with its code.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_command_that_exits_at_once_is_exited_never_running() {
    let Some(socket) = socket() else { return };
    let dir = tempfile::tempdir().expect("temp dir");
    let operator = SigningKey::from_bytes(&[1; 32]);
    let exchange = Exchange::start(&dir.path().join("exchange"), &operator);
    let (config, host) = docker_agent(dir.path(), &exchange.url, &socket, "faults-4", "none");
    let _agent = spawn_agent(&config, &host);
    let mut renter = funded_renter(&exchange, &operator, 13, 1_000_000_000).await;
    let secrets = Secrets { command: vec!["/bin/sh".into(), "-c".into(), "echo bye; exit 3".into()], ..Secrets::default() };
    let workload = Workload { secrets_follow: true, ..Workload::image(IMAGE) };
    let lease = lease_within(&mut renter, Some(&workload), Duration::from_secs(20)).await.expect("a lease");
    send_secrets(&mut renter, lease, Workload::image(IMAGE), &secrets).await;
    let mut seen = Vec::new();
    let exited = await_delivery(&mut renter, lease, |s| {
        seen.push(s.name());
        matches!(s, DeliveryState::Exited { .. })
    })
    .await;
    assert_eq!(exited, DeliveryState::Exited { code: 3 });
    assert!(!seen.contains(&"running"), "claimed running before it exited: {seen:?}");
}

/// A leased GPU lost mid-lease (the fake GPU stops answering 9 s after its
/// agent started; the agent calls it lost after 2 s): the renter is told
/// `gpu_unavailable`, the host's side; the lease ends and is billed only
/// for what was delivered before; the renter's re-match bid takes a GPU on
/// another host, the renter seals its secrets to that host's key (the old
/// sealing does not open there) and the workload runs again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gpu_lost_mid_lease_ends_it_as_the_hosts_fault_and_rematch_delivers_again() {
    let Some(socket) = socket() else { return };
    let dir = tempfile::tempdir().expect("temp dir");
    let operator = SigningKey::from_bytes(&[1; 32]);
    let exchange = Exchange::start(&dir.path().join("exchange"), &operator);
    let (dir_a, dir_b) = (dir.path().join("a"), dir.path().join("b"));
    std::fs::create_dir_all(&dir_a).expect("dir");
    std::fs::create_dir_all(&dir_b).expect("dir");
    let (config_a, host_a) = docker_agent(&dir_a, &exchange.url, &socket, "faults-7a", "none");
    let failing = ONE_GPU
        .replace("GPU-a", "GPU-lost")
        .replace(r#"}]}"#, r#"}], "faults": [{"gpu": "GPU-lost", "from_ms": 9000, "until_ms": 600000, "kind": "offline"}]}"#);
    write(&host_a, &failing);
    let text = std::fs::read_to_string(&config_a).expect("config");
    write(&config_a, &text.replace("report_interval_ms = 1000\n", "report_interval_ms = 1000\ngpu_lost_after_ms = 2000\n"));
    let _agent_a = spawn_agent(&config_a, &host_a);
    let mut renter = funded_renter(&exchange, &operator, 16, 1_000_000_000).await;
    let secrets = sleeper();
    let workload = Workload { secrets_follow: true, ..Workload::image(IMAGE) };
    let deadline = Instant::now() + Duration::from_secs(8);
    let first = loop {
        let id = renter.new_id();
        let mut order = OrderTicket::limit(id, InstrumentId(0), Side::Buy, 2_500_000, 1);
        order.time_in_force = TimeInForce::Ioc;
        order.rematch = true;
        let answer = renter.request(ClientMessage::NewOrder { id, order, workload: Some(Box::new(workload.clone())) }).await.expect("bid");
        assert!(matches!(answer, ServerMessage::Ack { .. }), "{answer:?}");
        if let Ok(lease) = tokio::time::timeout(Duration::from_millis(500), await_lease(&mut renter)).await {
            break lease;
        }
        assert!(Instant::now() < deadline, "host a's GPU leased before it fails");
    };
    send_secrets(&mut renter, first, Workload::image(IMAGE), &secrets).await;
    await_delivery(&mut renter, first, |s| matches!(s, DeliveryState::Running { .. })).await;
    let (config_b, host_b) = docker_agent(&dir_b, &exchange.url, &socket, "faults-7b", "none");
    write(&host_b, &ONE_GPU.replace("GPU-a", "GPU-spare"));
    let _agent_b = spawn_agent(&config_b, &host_b);

    let (mut failed, mut replacement) = (None, None);
    let deadline = Instant::now() + Duration::from_secs(40);
    while failed.is_none() || replacement.is_none() {
        let left = deadline.saturating_duration_since(Instant::now());
        match tokio::time::timeout(left, renter.next()).await.expect("the loss and its replacement in time").expect("message") {
            ServerMessage::Delivery { lease, state: state @ DeliveryState::Failed { .. }, .. } if lease == first => failed = Some(state),
            ServerMessage::LeaseReplaced { lease, replacement: by } if lease == first => {
                replacement = Some(by.expect("a replacement on host b"));
            }
            _ => {}
        }
    }
    let failed = failed.expect("told");
    assert!(matches!(failed, DeliveryState::Failed { code: FailureCode::GpuUnavailable, fault: Fault::Host, .. }), "{failed:?}");
    let second = replacement.expect("replaced");
    send_secrets(&mut renter, second, Workload::image(IMAGE), &secrets).await;
    await_delivery(&mut renter, second, |s| matches!(s, DeliveryState::Running { .. })).await;
    assert!(container_exists(&socket, "faults-7b", second), "the workload runs on host b");
    let old = lease_info(&mut renter, first).await;
    assert!(!old.active, "the failed lease ended");
    assert!(old.verified_gpu_ms <= 9_000, "billed {} ms: nothing after the GPU was lost", old.verified_gpu_ms);
    let id = renter.new_id();
    renter.request(ClientMessage::EndLease { id, lease: second }).await.expect("end");
    await_delivery(&mut renter, second, |s| matches!(s, DeliveryState::Stopped)).await;
}

/// kill -9 of the agent, and its container removed behind its back (`podman
/// rm -f`) while it was down: the restarted agent finds nothing running for
/// the active lease and delivers it again from the workload the exchange
/// kept (sealed to this host, so it opens); the time the agent was down is
/// not billed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restarted_agent_whose_container_was_removed_delivers_again_and_bills_no_gap() {
    let Some(socket) = socket() else { return };
    let dir = tempfile::tempdir().expect("temp dir");
    let operator = SigningKey::from_bytes(&[1; 32]);
    let exchange = Exchange::start(&dir.path().join("exchange"), &operator);
    let (config, host) = docker_agent(dir.path(), &exchange.url, &socket, "faults-8", "none");
    let mut agent = spawn_agent(&config, &host);
    let mut renter = funded_renter(&exchange, &operator, 18, 1_000_000_000).await;
    let lease = running_lease(&mut renter, &sleeper()).await;
    let start_ms = lease_info(&mut renter, lease).await.start_ms;

    let _ = agent.0.kill();
    let _ = agent.0.wait();
    let killed_ms = now_ms();
    let conf = std::path::Path::new(&socket).with_file_name("containers.conf");
    let removed = std::process::Command::new("podman")
        .env("CONTAINERS_CONF", conf)
        .args(["rm", "-f", &format!("gpux-faults-8-lease-{}", lease.0)])
        .output()
        .expect("podman runs");
    assert!(removed.status.success(), "{removed:?}");
    tokio::time::sleep(Duration::from_secs(4)).await;
    let restarted_ms = now_ms();
    let _agent = spawn_agent(&config, &host);
    await_delivery(&mut renter, lease, |s| matches!(s, DeliveryState::Running { .. })).await;
    assert!(container_exists(&socket, "faults-8", lease), "delivered again");
    tokio::time::sleep(Duration::from_secs(2)).await;
    let id = renter.new_id();
    renter.request(ClientMessage::EndLease { id, lease }).await.expect("end");
    await_delivery(&mut renter, lease, |s| matches!(s, DeliveryState::Stopped)).await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    let info = lease_info(&mut renter, lease).await;
    let ended_ms = info.ended_at_ms.expect("ended");
    let measured = (killed_ms - start_ms) + (ended_ms - restarted_ms);
    assert!(
        info.verified_gpu_ms <= measured + 2,
        "billed {} ms of the {measured} ms the agents measured ({} ms in all)",
        info.verified_gpu_ms,
        ended_ms - start_ms
    );
}

fn now_ms() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).expect("clock").as_millis() as u64
}

/// A container gets exactly the leased GPUs' devices: a two-GPU host
/// (`gpu_devices = "fake"`: each GPU a device node of its own) leases one
/// GPU per lease; each container lists one device node, its own lease's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_container_gets_exactly_its_leased_gpus_devices() {
    let Some(socket) = socket() else { return };
    let dir = tempfile::tempdir().expect("temp dir");
    let operator = SigningKey::from_bytes(&[1; 32]);
    let exchange = Exchange::start(&dir.path().join("exchange"), &operator);
    let (config, host) = docker_agent(dir.path(), &exchange.url, &socket, "devices-1", "fake");
    let two_gpus = ONE_GPU.replace(
        r#"}]}"#,
        r#"}, {"uuid": "GPU-b", "vendor": "nvidia", "model": "NVIDIA H100 80GB HBM3", "memory_mib": 81559, "interconnect": "nv_link"}]}"#,
    );
    write(&host, &two_gpus);
    let _agent = spawn_agent(&config, &host);
    let mut renter = funded_renter(&exchange, &operator, 17, 1_000_000_000).await;
    let secrets =
        Secrets { command: vec!["/bin/sh".into(), "-c".into(), "echo GPUS=$GPUX_GPUS; ls /dev; sleep 600".into()], ..Secrets::default() };
    let workload = Workload { secrets_follow: true, ..Workload::image(IMAGE) };
    let mut seen = Vec::new();
    for _ in 0..2 {
        let lease = lease_within(&mut renter, Some(&workload), Duration::from_secs(20)).await.expect("a lease");
        send_secrets(&mut renter, lease, Workload::image(IMAGE), &secrets).await;
        await_delivery(&mut renter, lease, |s| matches!(s, DeliveryState::Running { .. })).await;
        let id = renter.new_id();
        let ServerMessage::LeaseLogs { data, .. } =
            renter.request(ClientMessage::LeaseLogs { id, lease, tail_bytes: 4096 }).await.expect("logs")
        else {
            panic!("logs")
        };
        let nodes: Vec<&str> = data.split_whitespace().filter(|w| w.starts_with("gpux-fake")).collect();
        let uuid = data.lines().find_map(|l| l.strip_prefix("GPUS=")).expect("the leased GPU named");
        let expected = if uuid == "GPU-a" { "gpux-fake0" } else { "gpux-fake1" };
        assert_eq!(nodes, [expected], "lease {lease:?} on {uuid}: {data}");
        seen.push(uuid.to_string());
    }
    seen.sort();
    assert_eq!(seen, ["GPU-a", "GPU-b"], "one lease on each GPU");
}

/// A readiness probe on a port nothing listens on: the workload runs but is
/// never claimed `running` (it stays `starting`); the lease's end stops it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_workload_whose_readiness_probe_never_answers_is_not_running() {
    let Some(socket) = socket() else { return };
    let dir = tempfile::tempdir().expect("temp dir");
    let operator = SigningKey::from_bytes(&[1; 32]);
    let exchange = Exchange::start(&dir.path().join("exchange"), &operator);
    let (config, host) = docker_agent(dir.path(), &exchange.url, &socket, "faults-6", "none");
    let _agent = spawn_agent(&config, &host);
    let mut renter = funded_renter(&exchange, &operator, 15, 1_000_000_000).await;
    let secrets = Secrets {
        command: vec!["/bin/busybox".into(), "sleep".into(), "600".into()],
        readiness: Some(gpux_protocol::delivery::Readiness { port: 8080, http_path: None }),
        ..Secrets::default()
    };
    let workload = Workload { ports: vec![8080], secrets_follow: true, ..Workload::image(IMAGE) };
    let lease = lease_within(&mut renter, Some(&workload), Duration::from_secs(20)).await.expect("a lease");
    send_secrets(&mut renter, lease, workload.clone(), &secrets).await;
    let running = tokio::time::timeout(
        Duration::from_secs(6),
        await_delivery(&mut renter, lease, |s| matches!(s, DeliveryState::Running { .. } | DeliveryState::Exited { .. })),
    )
    .await;
    assert!(running.is_err(), "claimed {running:?} although nothing answers on the readiness port");
    assert!(container_exists(&socket, "faults-6", lease), "the workload itself runs");
    let id = renter.new_id();
    renter.request(ClientMessage::EndLease { id, lease }).await.expect("end");
    await_delivery(&mut renter, lease, |s| matches!(s, DeliveryState::Stopped)).await;
}

/// A workload that ignores SIGTERM (a shell as PID 1) holds its lease's
/// removal for the whole stop grace (8 s here); meanwhile another lease on
/// the same host is served: its logs come back at once, and a third lease
/// is delivered (with an SSH key, from a state directory the config names
/// relatively, as docs/first-hour.md writes paths: the key file's bind
/// mount must be absolute, or the engine reads it as a volume's name).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_stopping_lease_does_not_freeze_the_host() {
    let Some(socket) = socket() else { return };
    let dir = tempfile::tempdir().expect("temp dir");
    let operator = SigningKey::from_bytes(&[1; 32]);
    let exchange = Exchange::start(&dir.path().join("exchange"), &operator);
    let (config, host) = docker_agent(dir.path(), &exchange.url, &socket, "faults-5", "none");
    let three_gpus = ONE_GPU.replace(
        r#"}]}"#,
        r#"}, {"uuid": "GPU-b", "vendor": "nvidia", "model": "NVIDIA H100 80GB HBM3", "memory_mib": 81559, "interconnect": "nv_link"}, {"uuid": "GPU-c", "vendor": "nvidia", "model": "NVIDIA H100 80GB HBM3", "memory_mib": 81559, "interconnect": "nv_link"}]}"#,
    );
    write(&host, &three_gpus);
    let text = std::fs::read_to_string(&config).expect("config");
    let state_dir = format!("state_dir = \"{}\"", dir.path().join("leases").display());
    let text = text.replace("stop_grace_ms = 1000\n", "stop_grace_ms = 8000\n").replace(&state_dir, "state_dir = \"leases\"");
    assert!(text.contains("state_dir = \"leases\""), "{text}");
    write(&config, &text);
    let _agent = Agent(
        std::process::Command::new(env!("CARGO_BIN_EXE_gpux-agent"))
            .current_dir(dir.path())
            .arg("--config")
            .arg(&config)
            .arg("--fake")
            .arg(&host)
            .stderr(std::process::Stdio::null())
            .spawn()
            .expect("agent starts"),
    );
    let mut renter = funded_renter(&exchange, &operator, 14, 1_000_000_000).await;
    let stubborn = Secrets { command: vec!["/bin/sh".into(), "-c".into(), "while true; do sleep 1; done".into()], ..Secrets::default() };
    let workload = Workload { secrets_follow: true, ..Workload::image(IMAGE) };
    let first = lease_within(&mut renter, Some(&workload), Duration::from_secs(20)).await.expect("a lease");
    send_secrets(&mut renter, first, Workload::image(IMAGE), &stubborn).await;
    await_delivery(&mut renter, first, |s| matches!(s, DeliveryState::Running { .. })).await;
    let talker = Secrets {
        command: vec!["/bin/sh".into(), "-c".into(), "echo hello-from-two; while true; do sleep 1; done".into()],
        ..Secrets::default()
    };
    let second = lease_within(&mut renter, Some(&workload), Duration::from_secs(20)).await.expect("a second lease");
    send_secrets(&mut renter, second, Workload::image(IMAGE), &talker).await;
    await_delivery(&mut renter, second, |s| matches!(s, DeliveryState::Running { .. })).await;

    let id = renter.new_id();
    renter.request(ClientMessage::EndLease { id, lease: first }).await.expect("end");
    tokio::time::sleep(Duration::from_millis(500)).await;
    let asked = Instant::now();
    let id = renter.new_id();
    let ServerMessage::LeaseLogs { data, .. } =
        renter.request(ClientMessage::LeaseLogs { id, lease: second, tail_bytes: 4096 }).await.expect("logs")
    else {
        panic!("logs")
    };
    assert!(data.contains("hello-from-two"), "{data:?}");
    assert!(asked.elapsed() < Duration::from_secs(3), "logs took {:?} while another lease stopped", asked.elapsed());
    let with_key = Secrets {
        command: vec!["/bin/busybox".into(), "sleep".into(), "600".into()],
        ssh_keys: vec![format!("ssh-ed25519 {SECRET_SSH} renter@test")],
        ..Secrets::default()
    };
    let third = lease_within(&mut renter, Some(&workload), Duration::from_secs(5)).await.expect("a third lease during the grace");
    send_secrets(&mut renter, third, Workload::image(IMAGE), &with_key).await;
    await_delivery(&mut renter, third, |s| matches!(s, DeliveryState::Running { .. })).await;
    assert!(asked.elapsed() < Duration::from_secs(6), "delivered while the first still stopped: {:?}", asked.elapsed());
    // The stubborn one is stopped only after its grace, SIGKILLed.
    await_delivery(&mut renter, first, |s| matches!(s, DeliveryState::Stopped)).await;
    assert!(asked.elapsed() >= Duration::from_secs(6), "the grace was given: {:?}", asked.elapsed());
}

async fn lease_info(renter: &mut Connection, lease: LeaseId) -> gpux_protocol::views::Lease {
    let id = renter.new_id();
    let ServerMessage::Leases { leases, .. } = renter.request(ClientMessage::Leases { id, after: None }).await.expect("leases") else {
        panic!("leases")
    };
    leases.into_iter().find(|l| l.lease == lease).expect("the lease")
}

fn container_started_at(socket: &str, host: &str, lease: LeaseId) -> String {
    let output = std::process::Command::new("curl")
        .args(["-s", "--unix-socket", socket])
        .arg(format!("http://d/v1.41/containers/gpux-{host}-lease-{}/json", lease.0))
        .output()
        .expect("curl runs");
    let inspect: serde_json::Value = serde_json::from_slice(&output.stdout).expect("inspect JSON");
    inspect["State"]["StartedAt"].as_str().expect("started").to_string()
}
