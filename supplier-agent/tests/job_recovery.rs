//! A job's recovery beyond its host failures, end to end on the real
//! container engine (issue "Jobs that hold up", docs/jobs.md "Retries" and
//! "Failover"): a workload that exits 3 is restarted twice and then fails
//! the job, whose kept logs say why; a job whose class has no supply left
//! after its host dies resumes in another class it named.
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

const H100_SPOT: InstrumentId = InstrumentId(0);
const A100_SPOT: InstrumentId = InstrumentId(2);

/// Fails at once with exit 3, saying which attempt it is.
const FAIL_PY: &str = r#"
import os, sys, time
print(f"attempt {os.environ['GPUX_JOB_ATTEMPT']}: the data is bad, exiting 3", flush=True)
time.sleep(0.5)
sys.exit(3)
"#;

/// A step every 0.25 s to argv[1], checkpointed at each step; the result
/// says which attempt finished and where it started.
const TRAIN_PY: &str = r#"
import json, os, sys, time
ckpt = os.path.join(os.environ["GPUX_CHECKPOINT_DIR"], "state.json")
step = 0
if os.path.exists(ckpt):
    with open(ckpt) as f:
        step = json.load(f)["step"]
started = step
print(f"attempt {os.environ['GPUX_JOB_ATTEMPT']} from step {step}", flush=True)
while step < int(sys.argv[1]):
    time.sleep(0.25)
    step += 1
    with open(ckpt + ".tmp", "w") as f:
        json.dump({"step": step}, f)
    os.replace(ckpt + ".tmp", ckpt)
with open(os.path.join(os.environ["GPUX_OUTPUT_DIR"], "result.json"), "w") as f:
    json.dump({"steps": step, "started_at": started, "attempt": int(os.environ["GPUX_JOB_ATTEMPT"])}, f)
"#;

fn submission(name: &str, run: JobRun) -> JobSubmission {
    job_submission(name, H100_SPOT, run)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_failing_with_exit_3_is_restarted_twice_then_fails_and_its_logs_say_why() {
    let Some(socket) = socket() else { return };
    let dir = tempfile::tempdir().expect("temp dir");
    let operator = SigningKey::from_bytes(&[1; 32]);
    let exchange = Exchange::start(&dir.path().join("exchange"), &operator);
    let mut renter = funded_renter(&exchange, &operator, 31, 1_000_000_000).await;
    let (bundle, url, token) = put_code(&mut renter, &dir.path().join("code"), &[("fail.py", FAIL_PY)]).await;
    let (config, host) = job_host(&dir.path().join("a"), &exchange.url, &socket, "restart-a", H100_GPU, &[("spot", 2_000_000)]);
    let _agent = spawn_agent(&config, &host);
    await_asks(&mut renter, H100_SPOT, 1).await;

    let job = submit_job(
        &mut renter,
        JobSubmission { restarts_on_error: 2, ..submission("fails", job_run(&["python3", "fail.py"], Some(bundle))) },
    )
    .await;
    let mut moves = Vec::new();
    let failed = await_job(&mut renter, job, Duration::from_secs(120), |info| {
        if let Some(moved) = info.last_move.filter(|m| !moves.contains(m)) {
            moves.push(moved);
        }
        info.state.is_over()
    })
    .await;
    assert_eq!(failed.state, JobState::Failed(JobFailure::WorkloadFailed(3)), "failed with the program's code");
    assert_eq!((failed.attempts, failed.restarts, failed.leases.len()), (3, 2, 3), "two restarts, three leases");
    let causes: Vec<(u32, AttemptCause)> = moves.iter().map(|m| (m.attempt, m.cause)).collect();
    assert_eq!(causes, [(2, AttemptCause::ExitedWithError(3)), (3, AttemptCause::ExitedWithError(3))], "each restart said why");

    // Why it failed, after it ended: every attempt's kept tail.
    for attempt in 1..=3 {
        let key = format!("{}/jobs/{}/logs/attempt-{attempt}-rank-0.log", renter.account.0, job.0);
        let deadline = Instant::now() + Duration::from_secs(20);
        let kept = loop {
            if let Some(kept) = store_get(&url, &token, &key).await {
                break String::from_utf8(kept).expect("utf-8");
            }
            assert!(Instant::now() < deadline, "attempt {attempt}'s tail is kept");
            tokio::time::sleep(Duration::from_millis(250)).await;
        };
        assert!(kept.contains(&format!("attempt {attempt}: the data is bad, exiting 3")), "{kept:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_whose_class_has_no_supply_left_resumes_in_another_class_it_named() {
    let Some(socket) = socket() else { return };
    let dir = tempfile::tempdir().expect("temp dir");
    let operator = SigningKey::from_bytes(&[1; 32]);
    let exchange = Exchange::start(&dir.path().join("exchange"), &operator);
    let mut renter = funded_renter(&exchange, &operator, 33, 1_000_000_000).await;
    let (bundle, url, token) = put_code(&mut renter, &dir.path().join("code"), &[("train.py", TRAIN_PY)]).await;
    // The only H100 host, and an A100 host: the job is planned on the H100
    // book and names the A100 book as another it accepts.
    let (config_h, host_h) = job_host(&dir.path().join("h"), &exchange.url, &socket, "class-h100", H100_GPU, &[("spot", 2_000_000)]);
    let (config_a, host_a) = job_host(&dir.path().join("a"), &exchange.url, &socket, "class-a100", A100_GPU, &[("spot", 1_500_000)]);
    let mut agent_h = spawn_agent(&config_h, &host_h);
    let _agent_a = spawn_agent(&config_a, &host_a);
    await_asks(&mut renter, H100_SPOT, 1).await;
    await_asks(&mut renter, A100_SPOT, 1).await;

    let alternatives = vec![JobAlternative { instrument: A100_SPOT, limit_minor_per_gpu_hour: 2_000_000 }];
    let job = submit_job(
        &mut renter,
        JobSubmission { alternatives, ..submission("failover", job_run(&["python3", "train.py", "120"], Some(bundle))) },
    )
    .await;
    let running = await_job(&mut renter, job, Duration::from_secs(60), |i| matches!(i.state, JobState::Running { .. })).await;
    assert_eq!(running.instrument, H100_SPOT, "the first attempt bids the book it was planned on");
    // A checkpoint reaches the store, then the H100 host dies with it.
    let checkpoint = format!("{}/jobs/{}/checkpoints/state.json", renter.account.0, job.0);
    let deadline = Instant::now() + Duration::from_secs(60);
    while store_get(&url, &token, &checkpoint).await.is_none() {
        assert!(Instant::now() < deadline, "a checkpoint is synced");
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    agent_h.0.kill().expect("kill -9");
    let _ = agent_h.0.wait();

    // No H100 is offered any more: the next attempt bids the A100 book.
    let resumed = await_job(&mut renter, job, Duration::from_secs(90), |i| matches!(i.state, JobState::Running { attempt: 2, .. })).await;
    assert_eq!(resumed.instrument, A100_SPOT);
    let moved = resumed.last_move.expect("the move is in the job's feed");
    assert_eq!((moved.attempt, moved.cause, moved.instrument), (2, AttemptCause::HostFailed, A100_SPOT));
    assert!(matches!(moved.choice, BookChoice::Cheapest { offering: 1, .. }), "{:?}", moved.choice);
    let finished = await_job(&mut renter, job, Duration::from_secs(90), |i| i.state.is_over()).await;
    assert_eq!(finished.state, JobState::Succeeded);
    let result = format!("{}/jobs/{}/outputs/result.json", renter.account.0, job.0);
    let result: serde_json::Value = serde_json::from_slice(&store_get(&url, &token, &result).await.expect("the result")).expect("json");
    assert_eq!(result["attempt"], 2);
    assert!(result["started_at"].as_u64().expect("started_at") > 0, "resumed from the checkpoint: {result}");
}
