//! Services end to end (docs/services.md): a real exchange, the real agent
//! binary on three fake one-GPU hosts with the `docker` backend on a real
//! container engine (podman, `scripts/containers`), a service of two
//! replicas of Python's http.server in the jobs' test image, and a router
//! in front of it driven by a load generator. A replica's host dies (its
//! agent killed, its container gone): the router stops sending to it
//! within a second and no request fails (idempotent GETs go to the other
//! replica); the exchange stops hearing of its lease, ends it as the
//! host's fault, bids a replacement at once and the third host serves it.
//! The router is killed and started again and serves from the feed; the
//! service scales to zero, a request waits for the first replica; it is
//! deleted, its containers removed. A preemptible replica's notice brings a
//! stand-in up before the noticed one goes, with two routers serving.

mod common;

use std::io::{Read, Write};
use std::time::{Duration, Instant};

use common::*;
use ed25519_dalek::SigningKey;
use gpux_engine::{InstrumentId, LeaseId};
use gpux_protocol::*;
use gpux_supplier_agent::session::Connection;

const SERVICE_KEY: &str = "svc-key-0123456789";
/// The demo listing's H100 preemptible book.
const H100_PREEMPTIBLE: InstrumentId = InstrumentId(1);

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
        scaling: None,
        key_hashes: vec![gpux_protocol::services::key_hash(SERVICE_KEY)],
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

/// The load generator: `workers` tasks sending GET / through the router
/// with the service's key until told to stop; (answered 200, failed).
struct Load {
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    ok: std::sync::Arc<std::sync::atomic::AtomicU64>,
    failed: std::sync::Arc<std::sync::atomic::AtomicU64>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl Load {
    fn start(router: std::net::SocketAddr, workers: usize) -> Load {
        Load::at(format!("http://{router}/"), reqwest::Client::new(), workers)
    }

    /// `workers` GETs in a loop at `url` with `client`.
    fn at(url: String, client: reqwest::Client, workers: usize) -> Load {
        use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
        use std::sync::Arc;
        let (stop, ok, failed) = (Arc::new(AtomicBool::new(false)), Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
        let tasks = (0..workers)
            .map(|_| {
                let (stop, ok, failed, client, url) = (stop.clone(), ok.clone(), failed.clone(), client.clone(), url.clone());
                tokio::spawn(async move {
                    while !stop.load(Ordering::Relaxed) {
                        let answer = client.get(&url).bearer_auth(SERVICE_KEY).send().await;
                        let outcome = match answer {
                            Ok(answer) => {
                                let status = answer.status();
                                match answer.bytes().await {
                                    Ok(_) if status == 200 => Ok(()),
                                    Ok(_) => Err(status.to_string()),
                                    Err(error) => Err(error.to_string()),
                                }
                            }
                            Err(error) => Err(error.to_string()),
                        };
                        match outcome {
                            Ok(()) => ok.fetch_add(1, Ordering::Relaxed),
                            Err(why) => {
                                eprintln!("load: {why}");
                                failed.fetch_add(1, Ordering::Relaxed)
                            }
                        };
                    }
                })
            })
            .collect();
        Load { stop, ok, failed, tasks }
    }

    fn counts(&self) -> (u64, u64) {
        use std::sync::atomic::Ordering;
        (self.ok.load(Ordering::Relaxed), self.failed.load(Ordering::Relaxed))
    }

    async fn stop(mut self) -> (u64, u64) {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
        for task in std::mem::take(&mut self.tasks) {
            let _ = task.await;
        }
        self.counts()
    }
}

/// A key of the renter's account that can only read (what a router logs
/// in with), from `seed`.
async fn read_key(renter: &mut Connection, seed: u8) -> SigningKey {
    let key = SigningKey::from_bytes(&[seed; 32]);
    let public_key = hex::encode(key.verifying_key().to_bytes());
    let answer = request(renter, |id| ClientMessage::AddKey {
        id,
        account: None,
        public_key,
        scopes: Scopes::of(&[Scope::Read]),
        expires_at_ms: None,
        label: format!("router {seed}"),
    })
    .await;
    assert!(matches!(answer, ServerMessage::Ack { .. } | ServerMessage::KeyAdded { .. }), "{answer:?}");
    key
}

/// A router for `service` on `listen` (port 0: any), logged in with `key`.
/// A request may wait 2 minutes for a first replica (30 s by default): a
/// cold start on a machine busy with the other tests' containers can take
/// longer than the default.
async fn router(exchange: &Exchange, key: &SigningKey, service: ServiceId, listen: std::net::SocketAddr) -> gpux_router::Running {
    let mut config = gpux_router::Config::new(exchange.url.clone(), key.clone(), service, listen);
    config.queue_wait = Duration::from_secs(120);
    gpux_router::start(config).await.expect("the router starts")
}

/// GET / through the router with `key` (within 150 s): the status.
async fn get(router: std::net::SocketAddr, key: Option<&str>) -> u16 {
    let mut request = reqwest::Client::new().get(format!("http://{router}/")).timeout(Duration::from_secs(150));
    if let Some(key) = key {
        request = request.bearer_auth(key);
    }
    request.send().await.map_or(0, |a| a.status().as_u16())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_service_behind_its_router_outlives_a_replicas_host_and_its_router_and_scales_to_zero() {
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

    // The router logs in with a key of the renter's account that can only read.
    let router_key = read_key(&mut renter, 77).await;

    // Created: both replicas bid, fill on the two hosts and become ready;
    // each answers HTTP at its endpoint.
    let ServerMessage::Service { service, .. } =
        request(&mut renter, |id| ClientMessage::CreateService { id, service: Box::new(spec()), floor: None }).await
    else {
        panic!("created")
    };
    let id = service.service;
    let info = await_service(&mut renter, Duration::from_secs(60), |s| ready(s).len() == 2).await;
    for (_, endpoint) in ready(&info) {
        let status = http_status(&endpoint).expect("the replica answers");
        assert!(status.contains("200"), "{endpoint}: {status}");
    }
    let mut front = router(&exchange, &router_key, id, "127.0.0.1:0".parse().expect("addr")).await;
    let address = front.addr;
    assert_eq!(get(address, Some(SERVICE_KEY)).await, 200, "the router serves the service");
    assert_eq!(get(address, Some("not-the-key")).await, 401, "a wrong key");
    assert_eq!(get(address, None).await, 401, "no key");

    let host_of = |lease: LeaseId| names.iter().copied().find(|name| container_exists(&socket, name, lease)).expect("a host runs it");
    let (lost, _) = ready(&info)[0].clone();
    let lost_host = host_of(lost);
    let dead = names.iter().position(|n| *n == lost_host).expect("one of ours");

    // Load through the router; the third host comes up, then the first
    // replica's host dies: its agent killed and its container gone with it.
    let load = Load::start(address, 4);
    let (config, host) = job_host(&dir.path().join(names[2]), &exchange.url, &socket, names[2], H100_GPU, &[("spot", 2_100_000)]);
    agents.push(Some(spawn_agent(&config, &host)));
    await_asks(&mut renter, InstrumentId(0), 1).await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    let before = load.counts();
    assert!(before.0 > 0, "requests served before the host died");
    agents[dead] = None;
    remove_container(&socket, lost_host, lost);
    let killed = Instant::now();
    let killed_ms = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).expect("clock").as_millis() as u64;
    while front.shared.table.routable() > 1 {
        assert!(killed.elapsed() < Duration::from_millis(1_500), "the router stopped sending to the dead replica within a second");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let unrouted = killed.elapsed();
    let info = await_service(&mut renter, Duration::from_secs(60), |s| {
        s.replaced >= 1 && ready(s).len() == 2 && ready(s).iter().all(|(lease, _)| *lease != lost)
    })
    .await;
    let replaced = killed.elapsed();
    while front.shared.table.routable() < 2 {
        assert!(killed.elapsed() < Duration::from_secs(60), "the router routes to the replacement");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    tokio::time::sleep(Duration::from_secs(1)).await;
    let (served, failed) = load.stop().await;
    eprintln!("dead replica unrouted after {unrouted:?}, replaced and ready after {replaced:?}; {served} requests served, {failed} failed");
    assert_eq!(failed, 0, "no request failed: those in flight on the dead replica were sent again");
    assert!(served > before.0, "requests went on while the replica was replaced");
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

    // The router killed and started again on its address: it serves
    // again as soon as the feed answers.
    front.stop().await;
    let restarted = Instant::now();
    front = router(&exchange, &router_key, id, address).await;
    assert_eq!(get(address, Some(SERVICE_KEY)).await, 200, "the restarted router serves");
    eprintln!("a restarted router served its first request after {:?}", restarted.elapsed());

    // Scaled to zero: every replica let go; a request then waits in the
    // router's queue for the first replica of the scale back to one.
    let ServerMessage::Service { service, .. } =
        request(&mut renter, |rid| ClientMessage::ScaleService { id: rid, service: id, replicas: 0 }).await
    else {
        panic!("scaled")
    };
    assert!(service.replicas.is_empty());
    let deadline = Instant::now() + Duration::from_secs(10);
    while front.shared.table.routable() > 0 {
        assert!(Instant::now() < deadline, "the router knows the service is at zero");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let waiting = tokio::spawn(async move { get(address, Some(SERVICE_KEY)).await });
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(!waiting.is_finished(), "the request waits for a replica");
    let cold = Instant::now();
    let ServerMessage::Service { .. } = request(&mut renter, |rid| ClientMessage::ScaleService { id: rid, service: id, replicas: 1 }).await
    else {
        panic!("scaled")
    };
    assert_eq!(waiting.await.expect("joined"), 200, "the queued request is answered by the first replica");
    eprintln!("from zero: a queued request answered {:?} after the scale to one", cold.elapsed());
    // Out of bounds.
    let answer = request(&mut renter, |rid| ClientMessage::ScaleService { id: rid, service: id, replicas: 4 }).await;
    assert!(matches!(answer, ServerMessage::Error { code: ErrorCode::ServiceScaleInvalid, .. }), "{answer:?}");

    // Deleted: the last replica's lease ends, its container removed; the
    // router refuses the service's requests.
    let ServerMessage::Service { service, .. } = request(&mut renter, |rid| ClientMessage::DeleteService { id: rid, service: id }).await
    else {
        panic!("deleted")
    };
    assert_eq!(service.state, ServiceState::Deleted);
    let deadline = Instant::now() + Duration::from_secs(30);
    while names.iter().any(|name| service.leases.iter().any(|lease| container_exists(&socket, name, *lease))) {
        assert!(Instant::now() < deadline, "every replica's container is removed");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let deadline = Instant::now() + Duration::from_secs(10);
    while get(address, Some(SERVICE_KEY)).await != 404 {
        assert!(Instant::now() < deadline, "the router refuses a deleted service's requests");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let ServerMessage::Services { services, .. } = request(&mut renter, |rid| ClientMessage::Services { id: rid, offset: 0 }).await else {
        panic!("services")
    };
    assert_eq!(services.iter().map(|s| (s.service, s.state)).collect::<Vec<_>>(), [(id, ServiceState::Deleted)]);

    // The service's bill: signed by the exchange, every replica's lease
    // (the dead host's among them), and what it says is due is what the
    // ledger moved out of the renter for them.
    tokio::time::sleep(Duration::from_secs(2)).await; // the last usage reports settle
    let ServerMessage::Invoice { invoice, signature, exchange_key, next_offset, .. } =
        request(&mut renter, |rid| ClientMessage::ServiceBill { id: rid, service: id, offset: 0 }).await
    else {
        panic!("a bill")
    };
    assert!(invoice.verify(&signature, &exchange_key), "the bill is signed by the exchange");
    assert_eq!((next_offset, invoice.period.as_str()), (None, format!("service-{}", id.0).as_str()));
    let billed: std::collections::BTreeSet<LeaseId> = invoice.lines.iter().filter_map(|l| l.lease).collect();
    assert!(billed.iter().all(|lease| service.leases.contains(lease)), "{billed:?} of {:?}", service.leases);
    assert!(billed.contains(&lost) && billed.len() >= 3, "the lost replica, its replacement and the others: {billed:?}");
    assert!(invoice.totals.amount_due_minor > 0, "the replicas' GPU time was billed");
    let paid = paid_for_leases(&mut renter, &service.leases).await;
    assert_eq!(invoice.totals.amount_due_minor, paid, "the bill equals the ledger's transfers for the service's leases");
    front.stop().await;
}

/// Autoscaling from the router's measured load: load raised, replicas
/// added up to the maximum; load gone, removed to zero; a request to the
/// service at zero waits in the router's queue, wakes it, and is answered
/// by the first replica.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_service_scales_on_its_routers_load_to_its_max_to_zero_and_back() {
    let Some(socket) = socket() else { return };
    let dir = tempfile::tempdir().expect("temp dir");
    let operator = SigningKey::from_bytes(&[1; 32]);
    let exchange = Exchange::start(&dir.path().join("exchange"), &operator);
    let mut agents = Vec::new();
    for name in ["scale-a", "scale-b", "scale-c"] {
        let (config, host) = job_host(&dir.path().join(name), &exchange.url, &socket, name, H100_GPU, &[("spot", 2_100_000)]);
        agents.push(spawn_agent(&config, &host));
    }
    let mut renter = funded_renter(&exchange, &operator, 8, 1_000_000_000).await;
    await_asks(&mut renter, InstrumentId(0), 3).await;
    let scaling = ServiceScaling { target: ScalingTarget::RequestsPerSecondMilli(20_000), up_window_ms: 2_000, down_window_ms: 5_000 };
    let spec = ServiceSpec { replicas: 1, min_replicas: 0, max_replicas: 3, scaling: Some(scaling), ..spec() };
    let ServerMessage::Service { service, .. } =
        request(&mut renter, |id| ClientMessage::CreateService { id, service: Box::new(spec), floor: None }).await
    else {
        panic!("created")
    };
    let id = service.service;
    await_service(&mut renter, Duration::from_secs(60), |s| ready(s).len() == 1).await;
    let router_key = SigningKey::from_bytes(&[8; 32]);
    let front = router(&exchange, &router_key, id, "127.0.0.1:0".parse().expect("addr")).await;

    // Load far over 20 requests a second per replica: up to the max (3).
    let load = Load::start(front.addr, 4);
    let raised = Instant::now();
    let info = await_service(&mut renter, Duration::from_secs(60), |s| ready(s).len() == 3).await;
    eprintln!("load raised: 3 replicas ready after {:?} ({:?})", raised.elapsed(), info.last_scaling);
    assert_eq!(info.last_scaling.as_ref().map(|d| d.reason.as_str()), Some("load_above"));
    let (served, failed) = load.stop().await;
    assert_eq!(failed, 0, "no request failed while replicas were added ({served} served)");

    // No load for the down window: to zero.
    let info = await_service(&mut renter, Duration::from_secs(60), |s| s.replicas.is_empty()).await;
    assert_eq!(info.last_scaling.as_ref().map(|d| (d.to, d.reason.as_str())), Some((0, "idle")));
    let deadline = Instant::now() + Duration::from_secs(10);
    while front.shared.table.routable() > 0 {
        assert!(Instant::now() < deadline, "the router knows the service is at zero");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    // A request at zero waits, wakes the service and is answered.
    let cold = Instant::now();
    assert_eq!(get(front.addr, Some(SERVICE_KEY)).await, 200, "the first replica answers the queued request");
    eprintln!("cold start from zero: the queued request answered after {:?}", cold.elapsed());
    let info = await_service(&mut renter, Duration::from_secs(10), |s| ready(s).len() == 1).await;
    assert_eq!(info.last_scaling.as_ref().map(|d| (d.from, d.to, d.reason.as_str())), Some((0, 1, "woken")));
    front.stop().await;
    let _ = request(&mut renter, |rid| ClientMessage::DeleteService { id: rid, service: id }).await;
}

/// kill -9 of a replica's agent and its container removed behind its back:
/// the agent started again finds nothing running for the lease, asks the
/// exchange for the lease's delivery, gets the replica (command and
/// readiness included) and runs it again on the same lease.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restarted_agent_runs_its_replica_again_from_the_exchange() {
    let Some(socket) = socket() else { return };
    let dir = tempfile::tempdir().expect("temp dir");
    let operator = SigningKey::from_bytes(&[1; 32]);
    let exchange = Exchange::start(&dir.path().join("exchange"), &operator);
    let (config, host) = job_host(&dir.path().join("restart-a"), &exchange.url, &socket, "restart-a", H100_GPU, &[("spot", 2_100_000)]);
    let mut agent = Some(spawn_agent(&config, &host));
    let mut renter = funded_renter(&exchange, &operator, 9, 1_000_000_000).await;
    await_asks(&mut renter, InstrumentId(0), 1).await;
    let spec = ServiceSpec { replicas: 1, max_replicas: 1, budget_minor_per_hour: 2_500_000, ..spec() };
    let ServerMessage::Service { .. } =
        request(&mut renter, |id| ClientMessage::CreateService { id, service: Box::new(spec), floor: None }).await
    else {
        panic!("created")
    };
    let info = await_service(&mut renter, Duration::from_secs(60), |s| ready(s).len() == 1).await;
    let (lease, _) = ready(&info)[0].clone();

    drop(agent.take());
    remove_container(&socket, "restart-a", lease);
    assert!(!container_exists(&socket, "restart-a", lease));
    agent.replace(spawn_agent(&config, &host));
    let deadline = Instant::now() + Duration::from_secs(30);
    while !container_exists(&socket, "restart-a", lease) {
        assert!(Instant::now() < deadline, "the replica runs again on its lease");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let id = renter.new_id();
    let mut answered = None;
    while Instant::now() < deadline {
        let ServerMessage::LeaseDelivery { state, .. } =
            renter.request(ClientMessage::LeaseDelivery { id, lease }).await.expect("delivery")
        else {
            panic!("lease delivery")
        };
        if let Some(DeliveryState::Running { endpoints, .. }) = state {
            if let Some(status) = endpoints.first().and_then(|e| http_status(&format!("{}:{}", e.host, e.port))) {
                answered = Some(status);
                break;
            }
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let status = answered.expect("the replica answers again");
    assert!(status.contains("200"), "the service's command runs (the image's own would not serve HTTP): {status}");
    let info = request(&mut renter, |id| ClientMessage::ServiceStatus { id, service: info.service }).await;
    let ServerMessage::Service { service, .. } = info else { panic!("status") };
    assert_eq!(service.replaced, 0, "the same lease runs it: {:?}", service.leases);
}

/// A rolling update under load: a new command brought up one replica at a
/// time on the third host and on the hosts the old replicas leave; no
/// request fails; every replica ends on the new run.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rolling_update_under_load_fails_no_request() {
    let Some(socket) = socket() else { return };
    let dir = tempfile::tempdir().expect("temp dir");
    let operator = SigningKey::from_bytes(&[1; 32]);
    let exchange = Exchange::start(&dir.path().join("exchange"), &operator);
    let mut agents = Vec::new();
    for name in ["roll-a", "roll-b", "roll-c"] {
        let (config, host) = job_host(&dir.path().join(name), &exchange.url, &socket, name, H100_GPU, &[("spot", 2_100_000)]);
        agents.push(spawn_agent(&config, &host));
    }
    let mut renter = funded_renter(&exchange, &operator, 10, 1_000_000_000).await;
    await_asks(&mut renter, InstrumentId(0), 3).await;
    let ServerMessage::Service { service, .. } =
        request(&mut renter, |id| ClientMessage::CreateService { id, service: Box::new(spec()), floor: None }).await
    else {
        panic!("created")
    };
    let id = service.service;
    await_service(&mut renter, Duration::from_secs(60), |s| ready(s).len() == 2).await;
    let front = router(&exchange, &SigningKey::from_bytes(&[10; 32]), id, "127.0.0.1:0".parse().expect("addr")).await;
    assert_eq!(get(front.addr, Some(SERVICE_KEY)).await, 200);

    let load = Load::start(front.addr, 4);
    tokio::time::sleep(Duration::from_millis(500)).await;
    let run = ServiceRun {
        command: vec!["python3".into(), "-m".into(), "http.server".into(), "8000".into(), "--bind".into(), "0.0.0.0".into()],
        ..spec().run()
    };
    let ServerMessage::Service { service, .. } =
        request(&mut renter, |rid| ClientMessage::UpdateService { id: rid, service: id, run }).await
    else {
        panic!("updated")
    };
    assert_eq!(service.rollout, Some(RolloutState::Rolling));
    let started = Instant::now();
    let info = await_service(&mut renter, Duration::from_secs(90), |s| {
        s.rollout == Some(RolloutState::Done) && ready(s).len() == 2 && s.replicas.iter().all(|r| r.generation == 1)
    })
    .await;
    eprintln!("rolled out to {} replicas in {:?}", info.replicas.len(), started.elapsed());
    // The router follows: both new replicas routable.
    let deadline = Instant::now() + Duration::from_secs(10);
    while front.shared.table.routable() < 2 {
        assert!(Instant::now() < deadline, "the router routes to the new replicas");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    let (served, failed) = load.stop().await;
    eprintln!("during the rolling update: {served} requests served, {failed} failed");
    assert_eq!(failed, 0, "no request failed during the rolling update");
    assert!(served > 0);
    front.stop().await;
    let _ = request(&mut renter, |rid| ClientMessage::DeleteService { id: rid, service: id }).await;
}

/// A preemptible replica preempted by a spot buyer, under load through two
/// routers (one of them HTTPS): at the notice a stand-in is bid for and started on a third
/// host while the noticed replica still serves; the noticed one's workload
/// exits at the notice's SIGTERM and it goes, with no new bid and no
/// failure of the run; neither router fails a request (GETs on the leaving
/// replica are sent to another), and both served.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_preempted_replica_is_replaced_at_its_notice_while_two_routers_serve_without_a_failed_request() {
    let Some(socket) = socket() else { return };
    let dir = tempfile::tempdir().expect("temp dir");
    let operator = SigningKey::from_bytes(&[1; 32]);
    let exchange = Exchange::start(&dir.path().join("exchange"), &operator);
    // Host a sells preemptible and spot time; b preemptible at a's price;
    // c dearer, so the two replicas land on a and b.
    let hosts: [(&str, &[(&str, u64)]); 3] = [
        ("pre-svc-a", &[("preemptible", 1_000_000), ("spot", 2_000_000)]),
        ("pre-svc-b", &[("preemptible", 1_000_000)]),
        ("pre-svc-c", &[("preemptible", 1_400_000)]),
    ];
    let mut agents = Vec::new();
    for (name, offers) in hosts {
        let (config, host) = job_host(&dir.path().join(name), &exchange.url, &socket, name, H100_GPU, offers);
        agents.push(spawn_agent(&config, &host));
    }
    let mut renter = funded_renter(&exchange, &operator, 12, 1_000_000_000).await;
    let mut urgent = funded_renter(&exchange, &operator, 13, 1_000_000_000).await;
    await_asks(&mut renter, H100_PREEMPTIBLE, 3).await;
    let spec = ServiceSpec { instrument: H100_PREEMPTIBLE, limit_minor_per_gpu_hour: 1_500_000, ..spec() };
    let ServerMessage::Service { service, .. } =
        request(&mut renter, |id| ClientMessage::CreateService { id, service: Box::new(spec), floor: None }).await
    else {
        panic!("created")
    };
    let id = service.service;
    let info = await_service(&mut renter, Duration::from_secs(60), |s| ready(s).len() == 2).await;
    let host_of = |lease: LeaseId| hosts.iter().map(|h| h.0).find(|name| container_exists(&socket, name, lease)).expect("a host runs it");
    let on_a = ready(&info).into_iter().map(|(lease, _)| lease).find(|lease| host_of(*lease) == "pre-svc-a").expect("a replica on host a");

    let router_key = read_key(&mut renter, 78).await;
    // The second router serves HTTPS (a certificate for localhost), as
    // `gpux-router --tls-cert --tls-key` does.
    let identity = rcgen::generate_simple_self_signed(vec!["localhost".to_string()]).expect("certificate");
    let (cert, key) = (dir.path().join("router.crt"), dir.path().join("router.key"));
    std::fs::write(&cert, identity.cert.pem()).expect("cert");
    std::fs::write(&key, identity.signing_key.serialize_pem()).expect("key");
    std::fs::set_permissions(&key, std::os::unix::fs::PermissionsExt::from_mode(0o600)).expect("a key only its owner reads");
    let mut tls_config = gpux_router::Config::new(exchange.url.clone(), router_key.clone(), id, "127.0.0.1:0".parse().expect("addr"));
    tls_config.tls = Some(gpux_protocol::tls::server_config(&cert, &key).expect("the router's TLS"));
    let fronts = [
        router(&exchange, &router_key, id, "127.0.0.1:0".parse().expect("addr")).await,
        gpux_router::start(tls_config).await.expect("the TLS router starts"),
    ];
    let trusting = reqwest::Client::builder()
        .add_root_certificate(reqwest::Certificate::from_pem(identity.cert.pem().as_bytes()).expect("pem"))
        .build()
        .expect("client");
    let https = format!("https://localhost:{}/", fronts[1].addr.port());
    assert_eq!(get(fronts[0].addr, Some(SERVICE_KEY)).await, 200, "the first router serves the service");
    let answer = trusting.get(&https).bearer_auth(SERVICE_KEY).send().await.expect("an HTTPS answer");
    assert_eq!(answer.status(), 200, "the second serves it over HTTPS");
    assert_eq!(trusting.get(&https).send().await.expect("an HTTPS answer").status(), 401, "a request without the key, over HTTPS");
    assert_eq!(get(fronts[1].addr, Some(SERVICE_KEY)).await, 0, "plain HTTP to the TLS router is no answer");
    let loads = [Load::start(fronts[0].addr, 2), Load::at(https, trusting, 2)];
    tokio::time::sleep(Duration::from_secs(1)).await;

    // A spot buyer takes host a's GPU: the replica's lease gets its notice.
    let noticed_at = preempt_with_spot_bid(&mut renter, &mut urgent, on_a).await;
    let first: Vec<LeaseId> = ready(&info).into_iter().map(|(lease, _)| lease).collect();
    let (mut saw_noticed, mut stand_in_ready) = (false, None);
    let info = await_service(&mut renter, Duration::from_secs(90), |s| {
        let noticed_serves = s.replicas.iter().any(|r| r.noticed && r.lease == Some(on_a) && r.state == ReplicaState::Ready);
        saw_noticed |= noticed_serves;
        if noticed_serves && ready(s).iter().any(|(lease, _)| !first.contains(lease)) {
            stand_in_ready.get_or_insert_with(|| noticed_at.elapsed());
        }
        ready(s).len() == 2 && s.replicas.len() == 2 && ready(s).iter().all(|(lease, _)| *lease != on_a)
    })
    .await;
    let replaced = noticed_at.elapsed();
    assert!(saw_noticed, "the status said the replica was noticed while it still served");
    let stand_in_ready = stand_in_ready.expect("the stand-in was ready while the noticed replica still served");
    assert_eq!((info.replaced, info.state), (1, ServiceState::Running), "one stand-in, the run never failed");
    assert_eq!(info.bids, 3, "two replicas and one stand-in: the noticed one's exit bid nothing more");
    for (lease, _) in ready(&info) {
        assert_ne!(host_of(lease), "pre-svc-a", "nothing of the service runs on the preempted host");
    }
    while fronts.iter().any(|front| front.shared.table.routable() != 2) {
        assert!(noticed_at.elapsed() < Duration::from_secs(60), "both routers route to the two ready replicas");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    tokio::time::sleep(Duration::from_secs(1)).await;
    let [first, second] = loads;
    let ((served_1, failed_1), (served_2, failed_2)) = (first.stop().await, second.stop().await);
    eprintln!(
        "preempted replica: notice -> stand-in ready after {stand_in_ready:?}, the noticed one gone after {replaced:?} (it served through its notice); routers served {served_1} and {served_2}, failed {failed_1} and {failed_2}"
    );
    assert_eq!((failed_1, failed_2), (0, 0), "no request failed through either router");
    assert!(served_1 > 0 && served_2 > 0, "both routers served");
    let ServerMessage::Leases { leases, .. } = request(&mut renter, |rid| ClientMessage::Leases { id: rid, after: None }).await else {
        panic!("leases")
    };
    assert!(leases.iter().any(|l| l.lease == on_a && !l.active), "the preempted lease ended");
    for front in fronts {
        front.stop().await;
    }
    let _ = request(&mut renter, |rid| ClientMessage::DeleteService { id: rid, service: id }).await;
    drop(agents);
}
