//! Lease delivery, measured end to end on real parts: the `gpux-exchange`
//! binary (a child process, so its CPU time can be read), the supplier agent
//! (in process) with the docker backend on a real container engine, and a
//! renter doing what `gpux run` does.
//!
//! Run (docs/PERFORMANCE.md "Lease delivery"):
//!
//! ```text
//! export GPUX_DOCKER_SOCKET="$(scripts/containers start)"
//! cargo build --release -p gpux-exchange
//! cargo run --release -p gpux-benches --bin delivery-latency [leases] [statuses]
//! ```
//!
//! 1. **Fill to running**, `leases` times (default 50), one after the other
//!    on a one-GPU host: the renter's IOC bid carries a workload whose
//!    secrets follow; on the fill the renter fetches and checks the host's
//!    key, seals the secrets and sets the workload; the clock stops when the
//!    `running` status (with the endpoint) reaches the renter. The lease is
//!    then ended and the container removed before the next one. The image
//!    is local (`localhost/gpux-test:busybox`), so no pull leaves the host.
//! 2. **Exchange load per delivery status**: the host's account sends
//!    `statuses` (default 20 000) `delivery_status` messages for a running
//!    lease (each validated, journaled, acked and pushed to the renter),
//!    eight in flight on each of four connections; the exchange's CPU time
//!    (all its threads, from /proc/PID/task/*/schedstat) is divided by the
//!    count. Measured in the same run for comparison: `ping` (answered by the
//!    gateway, the bare ceiling of a request) and `cancel_order` of an
//!    unknown order (a journaled engine command, rejected).

use gpux_benches::process::{cpu_ns, start_exchange};
use std::time::{Duration, Instant};

use ed25519_dalek::SigningKey;
use gpux_client::Connection;
use gpux_engine::{EventKind, InstrumentId, LeaseId, OrderId, Role, Side, TimeInForce};
use gpux_protocol::delivery::encryption_key_certified;
use gpux_protocol::{ClientMessage, DeliveryState, OrderTicket, Secrets, ServerMessage, Workload};
use hdrhistogram::Histogram;

const IMAGE: &str = "localhost/gpux-test:busybox";
const ONE_GPU: &str = r#"{"gpus": [{"uuid": "GPU-bench", "vendor": "nvidia", "model": "NVIDIA H100 80GB HBM3", "memory_mib": 81559, "interconnect": "nv_link"}]}"#;

fn main() {
    let mut args = std::env::args().skip(1);
    let leases: usize = args.next().map_or(50, |a| a.parse().expect("leases is a number"));
    let statuses: usize = args.next().map_or(20_000, |a| a.parse().expect("statuses is a number"));
    let socket = std::env::var("GPUX_DOCKER_SOCKET").expect("GPUX_DOCKER_SOCKET: run `scripts/containers start` first");
    let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().expect("runtime");
    runtime.block_on(run(leases, statuses, &socket));
}

async fn run(leases: usize, statuses: usize, socket: &str) {
    let dir = tempfile::tempdir().expect("temp dir");
    let operator = SigningKey::from_bytes(&[1; 32]);
    let operator_key = hex::encode(operator.verifying_key().to_bytes());
    let exchange = start_exchange(&dir.path().join("exchange"), &["--operator-key", operator_key.as_str()]);
    let _ = EXCHANGE_PID.set(exchange.child.id());
    let url = exchange.url();

    let host = dir.path().join("host.json");
    std::fs::write(&host, ONE_GPU).expect("host file");
    let key_file = dir.path().join("host.key");
    let config = format!(
        "exchange = \"{url}\"\nhost = \"bench-host\"\nkey_file = \"{}\"\nsample_interval_ms = 1000\nreport_interval_ms = 1000\n\n\
         [[offer]]\ncontract = \"spot\"\nprice_floor_minor_per_gpu_hour = 2100000\n\n\
         [delivery]\nbackend = \"docker\"\npublic_address = \"127.0.0.1\"\nstate_dir = \"{}\"\nstop_grace_ms = 1000\n\n\
         [delivery.docker]\nsocket = \"{socket}\"\ngpu_devices = \"none\"\n",
        key_file.display(),
        dir.path().join("leases").display(),
    );
    let config = gpux_supplier_agent::config::AgentConfig::parse(&config).expect("agent config");
    let host_key = gpux_supplier_agent::keys::load_or_create(&key_file).expect("host key");
    let backend = gpux_supplier_agent::fake::FakeBackend::from_file(&host).expect("fake host");
    let agent = gpux_supplier_agent::session::Agent::new(config, host_key.clone(), Box::new(backend)).expect("agent");
    let (stop_agent, agent_stopped) = tokio::sync::oneshot::channel::<()>();
    // The agent runs as its binary does: on its own single-threaded runtime.
    let agent = std::thread::spawn(move || {
        let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("agent runtime");
        runtime.block_on(agent.run(async move {
            let _ = agent_stopped.await;
        }))
    });

    let mut renter = Connection::open(&url, &SigningKey::from_bytes(&[3; 32]), Some(Role::Renter)).await.expect("renter");
    let mut admin = Connection::open(&url, &operator, Some(Role::Operator)).await.expect("operator");
    let id = admin.new_id();
    admin.request(ClientMessage::Deposit { id, account: renter.account, amount_minor: 1_000_000_000_000 }).await.expect("deposit");

    eprintln!("fill to running: {leases} leases, one after the other...");
    let mut histogram = Histogram::<u64>::new_with_bounds(1, 600_000, 3).expect("histogram");
    let secrets = Secrets {
        command: vec!["/bin/busybox".into()],
        args: ["httpd", "-f", "-p", "8080", "-h", "/www"].map(String::from).to_vec(),
        env: vec![("HF_TOKEN".into(), "bench-secret".into())],
        ssh_keys: Vec::new(),
        // `running` once the server answers (without a probe the host waits
        // its ready_after_ms, 2 s by default, to see that it stays up).
        readiness: Some(gpux_protocol::delivery::Readiness { port: 8080, http_path: Some("/".into()) }),
        registry_auth: None,
    };
    let workload = Workload { ports: vec![8080], ..Workload::image(IMAGE) };
    for round in 0..=leases {
        let (lease, since) = fill(&mut renter, &workload).await;
        set_sealed_workload(&mut renter, lease, &workload, &secrets).await;
        await_delivery(&mut renter, lease, |s| matches!(s, DeliveryState::Running { .. })).await;
        if round == leases {
            // The last lease stays up for the status phase.
            let statuses_phase = status_load(&url, &host_key, &mut renter, lease, statuses).await;
            print_fill_to_running(&histogram, leases);
            statuses_phase.print();
            break;
        }
        histogram.record(since.elapsed().as_millis().max(1) as u64).expect("in range");
        let id = renter.new_id();
        renter.request(ClientMessage::EndLease { id, lease }).await.expect("end lease");
        await_delivery(&mut renter, lease, |s| matches!(s, DeliveryState::Stopped)).await;
        if (round + 1) % 10 == 0 {
            eprintln!("  {} leases", round + 1);
        }
    }
    let _ = stop_agent.send(());
    let _ = agent.join();
}

/// Bids until a fill: the lease and when the bid that filled was sent.
async fn fill(renter: &mut Connection, workload: &Workload) -> (LeaseId, Instant) {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        assert!(Instant::now() < deadline, "the host's ask never came back");
        let since = Instant::now();
        let id = renter.new_id();
        let mut order = OrderTicket::limit(id, InstrumentId(0), Side::Buy, 2_100_000, 1);
        order.time_in_force = TimeInForce::Ioc;
        let bid = Workload { secrets_follow: true, ..workload.clone() };
        let answer = renter.request(ClientMessage::NewOrder { id, order, workload: Some(Box::new(bid)) }).await.expect("bid");
        assert!(matches!(answer, ServerMessage::Ack { .. }), "{answer:?}");
        // An IOC bid's fill and lease come right behind its ack.
        while let Some(message) = renter.next_within(Duration::from_millis(200)).await.expect("renter") {
            if let ServerMessage::Private { event, .. } = message {
                if let EventKind::LeaseCreated { lease, .. } = event.kind {
                    return (lease, since);
                }
            }
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// What `gpux run` does for each lease: check the host's key, seal, send.
async fn set_sealed_workload(renter: &mut Connection, lease: LeaseId, workload: &Workload, secrets: &Secrets) {
    let id = renter.new_id();
    let ServerMessage::HostKey { encryption_key, identity_key, signature, .. } =
        renter.request(ClientMessage::HostKey { id, lease }).await.expect("host key")
    else {
        panic!("no host key")
    };
    let key: [u8; 32] = hex::decode(&encryption_key).expect("hex").try_into().expect("32 bytes");
    let identity: [u8; 32] = hex::decode(&identity_key).expect("hex").try_into().expect("32 bytes");
    assert!(encryption_key_certified(&key, &identity, &signature), "the host signed its key");
    let workload = Workload { sealed: Some(secrets.seal(&key)), ..workload.clone() };
    let id = renter.new_id();
    let answer = renter.request(ClientMessage::SetWorkload { id, lease, workload: Box::new(workload) }).await.expect("set workload");
    assert!(matches!(answer, ServerMessage::Ack { .. }), "{answer:?}");
}

async fn await_delivery(renter: &mut Connection, lease: LeaseId, done: impl Fn(&DeliveryState) -> bool) {
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        let message = tokio::time::timeout(left, renter.next()).await.expect("delivery status in time").expect("renter");
        if let ServerMessage::Delivery { lease: of, state, .. } = message {
            assert!(!matches!(state, DeliveryState::Failed { .. }), "delivery failed: {state:?}");
            if of == lease && done(&state) {
                return;
            }
        }
    }
}

fn print_fill_to_running(histogram: &Histogram<u64>, leases: usize) {
    println!(
        "fill to running, {leases} leases (ms): p50 {} p90 {} p99 {} max {}",
        histogram.value_at_quantile(0.5),
        histogram.value_at_quantile(0.9),
        histogram.value_at_quantile(0.99),
        histogram.max()
    );
}

struct Phase {
    name: &'static str,
    count: usize,
    wall: Duration,
    cpu_ns: u64,
}

struct StatusLoad(Vec<Phase>, usize);

impl StatusLoad {
    fn print(&self) {
        println!("exchange CPU per request (all its threads), 4 connections x 8 in flight:");
        for phase in &self.0 {
            println!(
                "  {:<34} {:>7} requests  {:>8.0}/s  {:>6.1} us CPU each",
                phase.name,
                phase.count,
                phase.count as f64 / phase.wall.as_secs_f64(),
                phase.cpu_ns as f64 / phase.count as f64 / 1_000.0
            );
        }
        println!("  delivery pushes the renter received: {}", self.1);
    }
}

const CONNECTIONS: usize = 4;
const IN_FLIGHT: usize = 8;

async fn status_load(url: &str, host_key: &SigningKey, renter: &mut Connection, lease: LeaseId, count: usize) -> StatusLoad {
    let exchange_pid = EXCHANGE_PID.get().copied().expect("exchange pid");
    let mut phases = Vec::new();
    type Make = fn(u64, LeaseId, usize) -> ClientMessage;
    let kinds: [(&'static str, Make); 3] = [
        ("ping (gateway only)", |id, _, _| ClientMessage::Ping { id }),
        ("cancel_order, unknown (journaled)", |id, _, _| ClientMessage::CancelOrder { id, order: OrderId(u64::MAX - 1) }),
        ("delivery_status (journaled, pushed)", |id, lease, i| ClientMessage::DeliveryStatus {
            id,
            lease,
            state: DeliveryState::Pulling { bytes_done: i as u64, bytes_total: u64::MAX },
        }),
    ];
    let mut pushes = 0;
    for (name, make) in kinds {
        let mut connections = Vec::new();
        for _ in 0..CONNECTIONS {
            connections.push(Connection::open(url, host_key, None).await.expect("host connection"));
        }
        let cpu_before = cpu_ns(exchange_pid);
        let started = Instant::now();
        let mut tasks = Vec::new();
        for mut connection in connections {
            tasks.push(tokio::spawn(async move {
                let share = count / CONNECTIONS;
                let (mut sent, mut answered) = (0, 0);
                while answered < share {
                    while sent < share && sent - answered < IN_FLIGHT {
                        let id = connection.new_id();
                        connection.send(&make(id, lease, sent)).await.expect("send");
                        sent += 1;
                    }
                    match connection.next().await.expect("answer") {
                        ServerMessage::Pong { .. } | ServerMessage::Ack { .. } | ServerMessage::Reject { .. } => answered += 1,
                        ServerMessage::Error { code, message, .. } => panic!("{name}: {code:?}: {message}"),
                        _ => {}
                    }
                }
            }));
        }
        // The renter reads its pushes meanwhile, as a live client would.
        while !tasks.iter().all(|t| t.is_finished()) {
            if let Ok(Some(ServerMessage::Delivery { .. })) = renter.next_within(Duration::from_millis(5)).await {
                pushes += 1;
            }
        }
        for task in tasks {
            task.await.expect("load task");
        }
        let wall = started.elapsed();
        let cpu_ns = cpu_ns(exchange_pid) - cpu_before;
        phases.push(Phase { name, count: count / CONNECTIONS * CONNECTIONS, wall, cpu_ns });
    }
    while let Ok(Some(message)) = renter.next_within(Duration::from_millis(500)).await {
        if matches!(message, ServerMessage::Delivery { .. }) {
            pushes += 1;
        }
    }
    StatusLoad(phases, pushes)
}

static EXCHANGE_PID: std::sync::OnceLock<u32> = std::sync::OnceLock::new();
