//! Jobs, measured end to end on real parts (docs/PERFORMANCE.md "Jobs"):
//! the `gpux-exchange` binary with its job store (a child process, so its
//! CPU time can be read), real `gpux-agent` processes on scripted hosts with
//! the docker backend on a real container engine, and a renter speaking the
//! protocol as `gpux job submit` does.
//!
//! Run:
//!
//! ```text
//! export GPUX_DOCKER_SOCKET="$(scripts/containers start)"
//! cargo build --release -p gpux-exchange -p gpux-supplier-agent
//! cargo run --release -p gpux-benches --bin job-latency [jobs] [failovers] [pairs] [preemptions] [silence_ms]
//! ```
//!
//! 1. **Submit to running**, `jobs` times (default 10), one after the
//!    other on a one-GPU host: from `submit_job` to the `running` delivery
//!    status of the job's lease reaching the renter: the bid, the fill, the
//!    host's token, the bundle fetched and unpacked, the container started
//!    from the cached image (`localhost/gpux-py:1`). Each job is then
//!    cancelled and its container removed before the next.
//! 2. **Failure to resumed**, `failovers` times (default 5): a job runs on
//!    the cheaper host A; A's agent is killed (`kill -9`); the clock runs
//!    until the job's next attempt is `running` on host B. The exchange runs
//!    with `--job-silence-ms silence_ms` (default 5000; `default` runs the
//!    exchange's defaults: a dead agent's lease fails 30 s after the last
//!    word), so that much of it is the silence the exchange waits before it
//!    calls a host dead. A's agent is then started again before the next
//!    round.
//! 3. **Exchange load per job transition**: `pairs` (default 2 000) jobs
//!    submitted and cancelled while their bids rest (each pair: two
//!    transitions, a bid and its cancel), against the same count of plain
//!    bids placed and cancelled, measured in the same run; the exchange's CPU
//!    time (all its threads) divided by the count.
//! 4. **Preemption notice to resumed**, `preemptions` times (default 10): a
//!    job on the preemptible book runs on host A (the cheaper preemptible
//!    seller, which also sells spot); another renter's spot bid takes A's
//!    GPU; the clock runs from the notice reaching the job's renter to the
//!    job's next attempt `running` on host B. The workload has no SIGTERM
//!    handler (the default action ends it at the signal).

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

use gpux_benches::process::{cpu_ns, start_exchange};
use std::time::{Duration, Instant};

use ed25519_dalek::SigningKey;
use gpux_client::Connection;
use gpux_engine::{InstrumentId, LeaseId, Role, Side};
use gpux_protocol::{BundleRef, ClientMessage, DeliveryState, JobId, JobRun, JobState, JobSubmission, OrderTicket, ServerMessage};
use hdrhistogram::Histogram;

const PY_IMAGE: &str = "localhost/gpux-py:1";
/// The job: a step a second, its checkpoint rewritten at each, for ten minutes.
const TRAIN_PY: &str = "import json, os, time\nckpt = os.path.join(os.environ['GPUX_CHECKPOINT_DIR'], 's.json')\nstep = json.load(open(ckpt))['s'] if os.path.exists(ckpt) else 0\nwhile step < 600:\n    time.sleep(1)\n    step += 1\n    json.dump({'s': step}, open(ckpt + '.t', 'w'))\n    os.replace(ckpt + '.t', ckpt)\n";

fn main() {
    let mut args = std::env::args().skip(1);
    let jobs: usize = args.next().map_or(10, |a| a.parse().expect("jobs is a number"));
    let failovers: usize = args.next().map_or(5, |a| a.parse().expect("failovers is a number"));
    let pairs: usize = args.next().map_or(2_000, |a| a.parse().expect("pairs is a number"));
    let preemptions: usize = args.next().map_or(10, |a| a.parse().expect("preemptions is a number"));
    let silence_ms: Option<u64> = match args.next().as_deref() {
        None => Some(5_000),
        Some("default") => None,
        Some(ms) => Some(ms.parse().expect("silence_ms is a number or `default`")),
    };
    let socket = std::env::var("GPUX_DOCKER_SOCKET").expect("GPUX_DOCKER_SOCKET: run `scripts/containers start` first");
    let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().expect("runtime");
    runtime.block_on(run(jobs, failovers, pairs, preemptions, silence_ms, &socket));
}

async fn run(jobs: usize, failovers: usize, pairs: usize, preemptions: usize, silence_ms: Option<u64>, socket: &str) {
    let dir = tempfile::tempdir().expect("temp dir");
    let operator = SigningKey::from_bytes(&[1; 32]);
    let operator_key = hex::encode(operator.verifying_key().to_bytes());
    let silence = silence_ms.map(|ms| ms.to_string());
    let mut args = vec!["--operator-key", operator_key.as_str()];
    if let Some(silence) = &silence {
        args.extend(["--job-silence-ms", silence.as_str()]);
    }
    let exchange = start_exchange(&dir.path().join("exchange"), &args);
    let url = exchange.url();
    let mut renter = Connection::open(&url, &SigningKey::from_bytes(&[3; 32]), Some(Role::Renter)).await.expect("renter");
    let mut admin = Connection::open(&url, &operator, Some(Role::Operator)).await.expect("operator");
    let id = admin.new_id();
    admin.request(ClientMessage::Deposit { id, account: renter.account, amount_minor: 1_000_000_000_000 }).await.expect("deposit");
    // The spot buyer of the preemption rounds, funded now (an idle
    // operator connection does not last the rounds before them).
    let mut urgent = Connection::open(&url, &SigningKey::from_bytes(&[4; 32]), Some(Role::Renter)).await.expect("spot buyer");
    let id = admin.new_id();
    admin.request(ClientMessage::Deposit { id, account: urgent.account, amount_minor: 1_000_000_000_000 }).await.expect("deposit");

    // The code, in the job store once.
    let code = dir.path().join("code");
    std::fs::create_dir_all(&code).expect("code dir");
    std::fs::write(code.join("train.py"), TRAIN_PY).expect("train.py");
    let bundle = gpux_jobs::bundle::pack(&code).expect("packs");
    let id = renter.new_id();
    let ServerMessage::JobStoreToken { url: store, token, .. } =
        renter.request(ClientMessage::JobStoreToken { id, job: None, lease: None, volume: None }).await.expect("token")
    else {
        panic!("no job store")
    };
    let key = format!("{}/bundles/{}.tar.gz", renter.account.0, bundle.sha256_hex());
    let put = reqwest::Client::new().put(format!("{store}/v1/objects/{key}")).bearer_auth(&token).body(bundle.bytes.clone()).send().await;
    assert_eq!(put.expect("put").status(), 201);
    let run = JobRun {
        bundle: Some(BundleRef { sha256: bundle.sha256_hex(), bytes: bundle.bytes.len() as u64 }),
        checkpoint_interval_s: 10,
        ..JobRun::in_image(PY_IMAGE, &["python3", "train.py"])
    };
    let submission =
        JobSubmission { retries: 100, ..JobSubmission::one_host("bench", InstrumentId(0), 1, 3_000_000, 1, 1_000_000_000, run) };

    // Each host sells spot and preemptible time; A is the cheaper in both.
    let host_a = Host::new(&dir.path().join("a"), &url, socket, "bench-a", 2_000_000, 1_000_000);
    let host_b = Host::new(&dir.path().join("b"), &url, socket, "bench-b", 2_500_000, 1_500_000);
    let mut agent_a = host_a.spawn();
    offers_at_least(&mut renter, 1).await;

    eprintln!("submit to running: {jobs} jobs, one after the other...");
    let mut histogram = Histogram::<u64>::new_with_bounds(1, 600_000, 3).expect("histogram");
    for _ in 0..jobs {
        let since = Instant::now();
        let job = submit(&mut renter, &submission).await;
        let lease = running_lease(&mut renter, job, 1).await;
        await_delivery(&mut renter, lease, |s| matches!(s, DeliveryState::Running { .. })).await;
        histogram.record(since.elapsed().as_millis().max(1) as u64).expect("in range");
        cancel(&mut renter, job, lease).await;
        offers_at_least(&mut renter, 1).await;
    }
    print_histogram("submit to running", jobs, &histogram);

    eprintln!("failure to resumed: {failovers} rounds...");
    let agent_b = host_b.spawn();
    offers_at_least(&mut renter, 2).await;
    let mut histogram = Histogram::<u64>::new_with_bounds(1, 600_000, 3).expect("histogram");
    for _ in 0..failovers {
        let job = submit(&mut renter, &submission).await;
        let lease = running_lease(&mut renter, job, 1).await;
        await_delivery(&mut renter, lease, |s| matches!(s, DeliveryState::Running { .. })).await;
        // Host A dies.
        agent_a.0.kill().expect("kill -9");
        let _ = agent_a.0.wait();
        let since = Instant::now();
        let resumed = running_lease(&mut renter, job, 2).await;
        await_delivery(&mut renter, resumed, |s| matches!(s, DeliveryState::Running { .. })).await;
        histogram.record(since.elapsed().as_millis().max(1) as u64).expect("in range");
        cancel(&mut renter, job, resumed).await;
        // Host A comes back (removing what its dead agent left) and offers again.
        agent_a = host_a.spawn();
        offers_at_least(&mut renter, 2).await;
    }
    let limit = silence_ms.map_or("the defaults: a gone agent 30 s".to_string(), |ms| format!("--job-silence-ms {ms}"));
    print_histogram(&format!("failure to resumed ({limit} of it the silence limit)"), failovers, &histogram);

    eprintln!("preemption notice to resumed: {preemptions} rounds...");
    let preemptible = JobSubmission { instrument: InstrumentId(1), ..submission.clone() };
    let mut histogram = Histogram::<u64>::new_with_bounds(1, 600_000, 3).expect("histogram");
    for _ in 0..preemptions {
        offers_on(&mut renter, InstrumentId(0), 2).await;
        offers_on(&mut renter, InstrumentId(1), 2).await;
        let job = submit(&mut renter, &preemptible).await;
        let first = running_lease(&mut renter, job, 1).await;
        await_delivery(&mut renter, first, |s| matches!(s, DeliveryState::Running { .. })).await;
        let noticed_at = preempt(&mut renter, &mut urgent, first).await;
        let resumed = running_lease(&mut renter, job, 2).await;
        await_delivery(&mut renter, resumed, |s| matches!(s, DeliveryState::Running { .. })).await;
        histogram.record(noticed_at.elapsed().as_millis().max(1) as u64).expect("in range");
        cancel(&mut renter, job, resumed).await;
    }
    print_histogram("preemption notice to resumed (no SIGTERM handler)", preemptions, &histogram);
    drop(agent_a);
    drop(agent_b);

    eprintln!("exchange load: {pairs} jobs submitted and cancelled, {pairs} bids placed and cancelled...");
    let pid = exchange.child.id();
    let resting = JobSubmission { limit_minor_per_gpu_hour: 1_000, budget_minor: 1_000_000, ..submission.clone() };
    let before = cpu_ns(pid);
    let started = Instant::now();
    for _ in 0..pairs {
        let job = submit(&mut renter, &resting).await;
        let id = renter.new_id();
        let answer = renter.request(ClientMessage::CancelJob { id, job }).await.expect("cancel");
        assert!(matches!(answer, ServerMessage::Job { .. }), "{answer:?}");
    }
    let (jobs_cpu, jobs_wall) = (cpu_ns(pid) - before, started.elapsed());
    let before = cpu_ns(pid);
    let started = Instant::now();
    for _ in 0..pairs {
        let id = renter.new_id();
        let order = OrderTicket::limit(id, InstrumentId(0), Side::Buy, 1_000, 1);
        let ServerMessage::Ack { order: Some(order), .. } =
            renter.request(ClientMessage::NewOrder { id, order, workload: None }).await.expect("bid")
        else {
            panic!("no ack")
        };
        let id = renter.new_id();
        renter.request(ClientMessage::CancelOrder { id, order }).await.expect("cancel");
    }
    let (orders_cpu, orders_wall) = (cpu_ns(pid) - before, started.elapsed());
    println!("exchange CPU (all its threads), one request in flight:");
    println!(
        "  job submitted and cancelled (2 transitions, a bid and its cancel): {:>6.1} us CPU per job, {:>6.1} us per transition, {:>6.0} jobs/s",
        jobs_cpu as f64 / pairs as f64 / 1_000.0,
        jobs_cpu as f64 / pairs as f64 / 2_000.0,
        pairs as f64 / jobs_wall.as_secs_f64()
    );
    println!(
        "  bid placed and cancelled (the bare ceiling):                       {:>6.1} us CPU per pair, {:>6.0} pairs/s",
        orders_cpu as f64 / pairs as f64 / 1_000.0,
        pairs as f64 / orders_wall.as_secs_f64()
    );
}

fn print_histogram(what: &str, count: usize, histogram: &Histogram<u64>) {
    println!(
        "{what}, {count} jobs (ms): p50 {} p90 {} p99 {} max {}",
        histogram.value_at_quantile(0.5),
        histogram.value_at_quantile(0.9),
        histogram.value_at_quantile(0.99),
        histogram.max()
    );
}

async fn submit(renter: &mut Connection, submission: &JobSubmission) -> JobId {
    let id = renter.new_id();
    match renter.request(ClientMessage::SubmitJob { id, job: Box::new(submission.clone()) }).await.expect("submit") {
        ServerMessage::Job { job, .. } => job.job,
        other => panic!("{other:?}"),
    }
}

/// The lease of the job's `attempt` once it has one (from its pushes).
async fn running_lease(renter: &mut Connection, job: JobId, attempt: u32) -> LeaseId {
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        let message = tokio::time::timeout(left, renter.next()).await.expect("the job runs in time").expect("renter");
        if let ServerMessage::JobUpdate { job: info } = message {
            // `starting` names the attempt's leases before their workloads run.
            if let (true, JobState::Starting { attempt: a, leases } | JobState::Running { attempt: a, leases }) =
                (info.job == job, &info.state)
            {
                if *a == attempt {
                    return leases[0];
                }
            }
        }
    }
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

/// Cancels the job and waits for its container to be gone.
async fn cancel(renter: &mut Connection, job: JobId, lease: LeaseId) {
    let id = renter.new_id();
    renter.request(ClientMessage::CancelJob { id, job }).await.expect("cancel");
    await_delivery(renter, lease, |s| matches!(s, DeliveryState::Stopped)).await;
}

/// The spot buyer bids (IOC) for one GPU at 2.00 until the job's lease
/// `lease` gets its notice: when the notice reached the job's renter. The
/// buyer's lease is then ended, so host A sells again.
async fn preempt(renter: &mut Connection, urgent: &mut Connection, lease: LeaseId) -> Instant {
    use gpux_engine::EventKind;
    let deadline = Instant::now() + Duration::from_secs(30);
    let noticed_at = loop {
        let id = urgent.new_id();
        let mut order = OrderTicket::limit(id, InstrumentId(0), Side::Buy, 2_000_000, 1);
        order.time_in_force = gpux_engine::TimeInForce::Ioc;
        urgent.request(ClientMessage::NewOrder { id, order, workload: None }).await.expect("spot bid");
        if let Ok(Ok(ServerMessage::Private { event, .. })) = tokio::time::timeout(Duration::from_millis(700), renter.next()).await {
            if matches!(event.kind, EventKind::PreemptionNotice { lease: noticed, .. } if noticed == lease) {
                break Instant::now();
            }
        }
        assert!(Instant::now() < deadline, "the job's preemptible lease was preempted");
    };
    let deadline = Instant::now() + Duration::from_secs(30);
    let bought = loop {
        let left = deadline.saturating_duration_since(Instant::now());
        let message = tokio::time::timeout(left, urgent.next()).await.expect("the spot lease").expect("spot buyer");
        if let ServerMessage::Private { event, .. } = message {
            if let EventKind::LeaseCreated { lease, .. } = event.kind {
                break lease;
            }
        }
    };
    let id = urgent.new_id();
    urgent.request(ClientMessage::EndLease { id, lease: bought }).await.expect("end the spot lease");
    noticed_at
}

/// Waits until the spot book offers at least `count` GPUs.
async fn offers_at_least(renter: &mut Connection, count: usize) {
    offers_on(renter, InstrumentId(0), count).await
}

/// Waits until `instrument`'s book offers at least `count` GPUs.
async fn offers_on(renter: &mut Connection, instrument: InstrumentId, count: usize) {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let id = renter.new_id();
        if let Ok(ServerMessage::BookOffers { offers, .. }) =
            renter.request(ClientMessage::BookOffers { id, instrument, offset: 0, after: None }).await
        {
            if offers.len() >= count {
                return;
            }
        }
        assert!(Instant::now() < deadline, "the hosts' asks came back on instrument {}", instrument.0);
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

struct Host {
    config: PathBuf,
    fake: PathBuf,
}

struct AgentProcess(Child);

impl Drop for AgentProcess {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

impl Host {
    fn new(dir: &Path, url: &str, socket: &str, name: &str, floor: u64, preemptible_floor: u64) -> Host {
        std::fs::create_dir_all(dir).expect("host dir");
        let fake = dir.join("host.json");
        let gpu = format!(
            r#"{{"gpus": [{{"uuid": "GPU-{name}", "vendor": "nvidia", "model": "NVIDIA H100 80GB HBM3", "memory_mib": 81559, "interconnect": "nv_link"}}]}}"#
        );
        std::fs::write(&fake, gpu).expect("host file");
        let config = dir.join("agent.toml");
        let text = format!(
            "exchange = \"{url}\"\nhost = \"{name}\"\nkey_file = \"{}\"\nsample_interval_ms = 1000\nreport_interval_ms = 1000\n\n\
             [[offer]]\ncontract = \"spot\"\nprice_floor_minor_per_gpu_hour = {floor}\n\n\
             [[offer]]\ncontract = \"preemptible\"\nprice_floor_minor_per_gpu_hour = {preemptible_floor}\n\n\
             [delivery]\nbackend = \"docker\"\npublic_address = \"127.0.0.1\"\nstate_dir = \"{}\"\nstop_grace_ms = 1000\nready_after_ms = 500\n\n\
             [delivery.docker]\nsocket = \"{socket}\"\ngpu_devices = \"fake\"\n",
            dir.join("host.key").display(),
            dir.join("leases").display(),
        );
        std::fs::write(&config, text).expect("agent config");
        Host { config, fake }
    }

    fn spawn(&self) -> AgentProcess {
        let binary = std::env::current_exe().expect("own path").with_file_name("gpux-agent");
        assert!(binary.exists(), "{} missing: cargo build --release -p gpux-supplier-agent", binary.display());
        let child = Command::new(binary)
            .arg("--config")
            .arg(&self.config)
            .arg("--fake")
            .arg(&self.fake)
            .stderr(Stdio::null())
            .spawn()
            .expect("agent starts");
        AgentProcess(child)
    }
}
