//! A preemptible job preempted by a spot bid, end to end on the real
//! container engine (issue "Jobs that hold up"): whatever its workload does
//! on the notice (checkpoints and exits 0, as docs/jobs.md asks; exits with
//! an error; ignores the signal until the deadline kills it), the job is
//! never succeeded or failed by the preempted lease: it bids its next
//! attempt, resumes on another host from its checkpoint and finishes there.
//! The workload also sees the notice file (`GPUX_PREEMPT_FILE`), and the
//! preempted lease's output is still there after its end (`lease logs`,
//! and the job's kept tail in the store).
//!
//! Needs `GPUX_DOCKER_SOCKET` and the `localhost/gpux-py:1` image
//! (`scripts/containers start` makes both); skipped without them unless
//! `GPUX_REQUIRE_CONTAINERS=1`.

mod common;

use std::time::{Duration, Instant};

use common::*;
use ed25519_dalek::SigningKey;
use gpux_engine::InstrumentId;
use gpux_protocol::*;
use gpux_supplier_agent::session::Connection;

const STEPS: u32 = 200;
const H100_PREEMPTIBLE: InstrumentId = InstrumentId(1);

/// A step every 0.25 s, checkpointed atomically at each; on SIGTERM it does
/// what argv[2] says: `checkpoint` (save, exit 0), `fail` (exit 3), `ignore`
/// (SIG_IGN: killed at the deadline), `default` (no handler: the signal's
/// default action ends it, through the container's init). It prints when it sees the notice file.
const TRAIN_PY: &str = r#"
import json, os, signal, sys, time
ckpt = os.path.join(os.environ["GPUX_CHECKPOINT_DIR"], "state.json")
step = 0
if os.path.exists(ckpt):
    with open(ckpt) as f:
        step = json.load(f)["step"]
started = step
def save():
    with open(ckpt + ".tmp", "w") as f:
        json.dump({"step": step}, f)
    os.replace(ckpt + ".tmp", ckpt)
def on_term(signum, frame):
    print(f"SIGTERM at step {step}; notice file there: {os.path.exists(os.environ['GPUX_PREEMPT_FILE'])}", flush=True)
    if sys.argv[2] == "checkpoint":
        save()
        sys.exit(0)
    sys.exit(3)
if sys.argv[2] != "default":
    signal.signal(signal.SIGTERM, signal.SIG_IGN if sys.argv[2] == "ignore" else on_term)
print(f"attempt {os.environ['GPUX_JOB_ATTEMPT']} from step {step}", flush=True)
noticed = False
while step < int(sys.argv[1]):
    time.sleep(0.25)
    step += 1
    save()
    if not noticed and os.path.exists(os.environ["GPUX_PREEMPT_FILE"]):
        noticed = True
        print("notice file seen: deadline " + open(os.environ["GPUX_PREEMPT_FILE"]).read().strip(), flush=True)
with open(os.path.join(os.environ["GPUX_OUTPUT_DIR"], "result.json"), "w") as f:
    json.dump({"steps": step, "started_at": started, "attempt": int(os.environ["GPUX_JOB_ATTEMPT"])}, f)
"#;

/// A fake one-GPU H100 host `name` on the docker backend, offering
/// preemptible time at `preemptible_floor` and, with `spot_floor`, spot
/// time beside it.
fn host(dir: &std::path::Path, url: &str, socket: &str, name: &str, preemptible_floor: u64, spot_floor: Option<u64>) -> Agent {
    let mut offers = vec![("preemptible", preemptible_floor)];
    offers.extend(spot_floor.map(|floor| ("spot", floor)));
    let (config, host) = job_host(dir, url, socket, name, H100_GPU, &offers);
    spawn_agent(&config, &host)
}

async fn lease_logs(renter: &mut Connection, lease: gpux_engine::LeaseId) -> Option<String> {
    let id = renter.new_id();
    match renter.request(ClientMessage::LeaseLogs { id, lease, tail_bytes: 16_384 }).await.expect("logs") {
        ServerMessage::LeaseLogs { data, .. } => Some(data),
        _ => None,
    }
}

async fn preempted_job_resumes(on_sigterm: &str, seed: u8) {
    let Some(socket) = socket() else { return };
    let dir = tempfile::tempdir().expect("temp dir");
    let operator = SigningKey::from_bytes(&[1; 32]);
    let exchange = Exchange::start(&dir.path().join("exchange"), &operator);
    let mut renter = funded_renter(&exchange, &operator, seed, 1_000_000_000).await;
    let mut urgent = funded_renter(&exchange, &operator, seed + 1, 1_000_000_000).await;

    let code = dir.path().join("code");
    std::fs::create_dir_all(&code).expect("code dir");
    write(&code.join("train.py"), TRAIN_PY);
    let bundle = gpux_jobs::bundle::pack(&code).expect("packs");
    let (url, token) = store_token(&mut renter).await;
    let http = reqwest::Client::new();
    let key = format!("{}/bundles/{}.tar.gz", renter.account.0, bundle.sha256_hex());
    let put = http.put(format!("{url}/v1/objects/{key}")).bearer_auth(&token).body(bundle.bytes.clone()).send().await.expect("put");
    assert_eq!(put.status(), 201);

    // Host A is the cheaper preemptible seller and also sells spot; host B
    // sells preemptible time only, dearer.
    let (name_a, name_b) = (format!("pre-{on_sigterm}-a"), format!("pre-{on_sigterm}-b"));
    let _agent_a = host(&dir.path().join("a"), &exchange.url, &socket, &name_a, 1_000_000, Some(2_000_000));
    let _agent_b = host(&dir.path().join("b"), &exchange.url, &socket, &name_b, 1_500_000, None);
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let id = renter.new_id();
        if let Ok(ServerMessage::BookOffers { offers, .. }) =
            renter.request(ClientMessage::BookOffers { id, instrument: H100_PREEMPTIBLE, offset: 0, after: None }).await
        {
            if offers.len() >= 2 {
                break;
            }
        }
        assert!(Instant::now() < deadline, "both hosts offer preemptible time");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }

    let run = job_run(
        &["python3", "train.py", &STEPS.to_string(), on_sigterm],
        Some(BundleRef { sha256: bundle.sha256_hex(), bytes: bundle.bytes.len() as u64 }),
    );
    let submission = JobSubmission {
        limit_minor_per_gpu_hour: 2_000_000,
        budget_minor: 10_000_000,
        ..job_submission(&format!("preempted-{on_sigterm}"), H100_PREEMPTIBLE, run)
    };
    let id = renter.new_id();
    let job = match renter.request(ClientMessage::SubmitJob { id, job: Box::new(submission) }).await.expect("submitted") {
        ServerMessage::Job { job, .. } => job.job,
        other => panic!("{other:?}"),
    };
    let running = await_job(&mut renter, job, Duration::from_secs(30), |i| matches!(i.state, JobState::Running { .. })).await;
    let JobState::Running { attempt: 1, leases } = running.state else { panic!("{:?}", running.state) };
    let first = leases[0];

    // A checkpoint reaches the store (the first sync, 10 s after start).
    let checkpoint_key = format!("{}/jobs/{}/checkpoints/state.json", renter.account.0, job.0);
    let deadline = Instant::now() + Duration::from_secs(60);
    let synced_step = loop {
        if let Some(body) = store_get(&url, &token, &checkpoint_key).await {
            let state: serde_json::Value = serde_json::from_slice(&body).expect("json");
            break state["step"].as_u64().expect("a step");
        }
        assert!(Instant::now() < deadline, "host A synced a checkpoint");
        tokio::time::sleep(Duration::from_millis(500)).await;
    };

    // A spot buyer takes host A's GPU: the job's lease gets its notice.
    let preempted_at = preempt_with_spot_bid(&mut renter, &mut urgent, first).await;

    // Whatever the workload does, the job moves: attempt 2 on host B,
    // never succeeded or failed on the way.
    let mut states = Vec::new();
    let mut leased_at = None;
    let resumed = await_job(&mut renter, job, Duration::from_secs(90), |i| {
        states.push(i.state.clone());
        if matches!(i.state, JobState::Starting { attempt: 2, .. }) {
            leased_at.get_or_insert_with(Instant::now);
        }
        matches!(i.state, JobState::Running { attempt: 2, .. }) || i.state.is_over()
    })
    .await;
    let JobState::Running { leases, .. } = &resumed.state else { panic!("{on_sigterm}: the job did not move: {states:?}") };
    let second = leases[0];
    assert_ne!(second, first);
    // docs/PERFORMANCE.md "Jobs": notice -> next attempt's lease -> its workload running.
    let leased_ms = leased_at.map_or(0, |at| at.duration_since(preempted_at).as_millis());
    eprintln!("PREEMPTION {on_sigterm}: notice -> attempt 2 leased {leased_ms} ms, running {} ms", preempted_at.elapsed().as_millis());
    if on_sigterm != "ignore" {
        assert!(leased_ms < 20_000, "{on_sigterm}: moved at the signal, long before the 30 s deadline: {leased_ms} ms");
    }
    let finished = await_job(&mut renter, job, Duration::from_secs(120), |i| i.state.is_over()).await;
    assert_eq!(finished.state, JobState::Succeeded, "{on_sigterm}");
    assert_eq!((finished.attempts, finished.leases.len()), (2, 2), "{on_sigterm}: one lease per attempt");

    let result_key = format!("{}/jobs/{}/outputs/result.json", renter.account.0, job.0);
    let result: serde_json::Value = serde_json::from_slice(&store_get(&url, &token, &result_key).await.expect("the result")).expect("json");
    assert_eq!((result["steps"].as_u64(), result["attempt"].as_u64()), (Some(STEPS as u64), Some(2)), "{result}");
    let started_at = result["started_at"].as_u64().expect("started_at");
    assert!(started_at >= synced_step, "{on_sigterm}: resumed from step {started_at}, at least the synced {synced_step}");

    // The preempted lease's output after its end: from its host's kept
    // tail, and the attempt's tail in the job store.
    let logs = lease_logs(&mut renter, first).await.unwrap_or_default();
    assert!(logs.contains("attempt 1 from step 0"), "{on_sigterm}: the ended lease's logs: {logs:?}");
    // The notice file is written before the SIGTERM is sent.
    match on_sigterm {
        "ignore" => assert!(logs.contains("notice file seen: deadline "), "the workload saw the notice file: {logs:?}"),
        "default" => {}
        _ => assert!(logs.contains("notice file there: True"), "{on_sigterm}: {logs:?}"),
    }
    let kept = format!("{}/jobs/{}/logs/attempt-1-rank-0.log", renter.account.0, job.0);
    let kept = String::from_utf8(store_get(&url, &token, &kept).await.expect("attempt 1's tail in the store")).expect("utf-8");
    assert!(kept.contains("attempt 1 from step 0"), "{kept:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_preempted_job_that_checkpoints_and_exits_0_resumes_elsewhere() {
    preempted_job_resumes("checkpoint", 3).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_preempted_job_whose_workload_fails_on_sigterm_resumes_elsewhere() {
    preempted_job_resumes("fail", 5).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_preempted_job_that_ignores_sigterm_resumes_elsewhere_after_the_deadline() {
    preempted_job_resumes("ignore", 7).await;
}

/// A script with no SIGTERM handler (what most training scripts are) ends
/// at the notice's signal, not at the deadline: the job's container runs
/// it under an init that passes the signal on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_preempted_job_without_a_sigterm_handler_ends_at_the_signal_and_resumes_elsewhere() {
    preempted_job_resumes("default", 9).await;
}
