//! A job end to end on the real container engine (issue "Jobs"): a renter
//! packs its code, puts the bundle in the exchange's job store and submits
//! a job; it runs in a Python image on one fake host, checkpointing; that
//! host's agent is killed (`kill -9`) and its container removed; the
//! exchange hears nothing more of the lease, fails its delivery (the host's
//! fault) and the job bids again, lands on a second host and resumes from
//! the checkpoint the first host synced (its step counter does not restart
//! at 0); it finishes, and its outputs download from the store.
//!
//! Needs `GPUX_DOCKER_SOCKET` and the `localhost/gpux-py:1` image
//! (`scripts/containers start` makes both); skipped without them unless
//! `GPUX_REQUIRE_CONTAINERS=1`.

mod common;

use std::time::{Duration, Instant};

use common::*;
use ed25519_dalek::SigningKey;
use gpux_engine::{InstrumentId, LeaseId};
use gpux_protocol::*;

const STEPS: u32 = 120;

/// The renter's training script: a step every 0.25 s, its state written
/// atomically to the checkpoint directory at each step, resumed from it;
/// at the end the outputs say where it started.
const TRAIN_PY: &str = r#"
import json, os, sys, time
ckpt = os.path.join(os.environ["GPUX_CHECKPOINT_DIR"], "state.json")
out = os.environ["GPUX_OUTPUT_DIR"]
step = 0
if os.path.exists(ckpt):
    with open(ckpt) as f:
        step = json.load(f)["step"]
started = step
with open("/data/numbers.txt") as f:
    data_sum = sum(int(x) for x in f.read().split())
try:
    open("/data/mine.txt", "w").write("x")
    data_read_only = False
except OSError:
    data_read_only = True
print(f"attempt {os.environ['GPUX_JOB_ATTEMPT']} from step {step} resumed={os.environ['GPUX_RESUMED']}", flush=True)
while step < int(sys.argv[1]):
    time.sleep(0.25)
    step += 1
    with open(ckpt + ".tmp", "w") as f:
        json.dump({"step": step}, f)
    os.replace(ckpt + ".tmp", ckpt)
with open(os.path.join(out, "result.json"), "w") as f:
    json.dump({"steps": step, "started_at": started, "attempt": int(os.environ["GPUX_JOB_ATTEMPT"]),
               "data_sum": data_sum, "data_read_only": data_read_only, "input_env": os.environ.get("GPUX_INPUT_DATA")}, f)
"#;

/// A fake one-GPU H100 host `name` on the docker backend, offering spot at `floor`.
fn host(dir: &std::path::Path, url: &str, socket: &str, name: &str, floor: u64) -> (std::path::PathBuf, std::path::PathBuf) {
    job_host(dir, url, socket, name, H100_GPU, &[("spot", floor)])
}

fn remove_container(socket: &str, host: &str, lease: LeaseId) {
    let output = std::process::Command::new("curl")
        .args(["-s", "-X", "DELETE", "--unix-socket", socket])
        .arg(format!("http://d/v1.41/containers/gpux-{host}-lease-{}?force=true", lease.0))
        .output()
        .expect("curl runs");
    assert!(output.status.success(), "{output:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_resumes_on_another_host_from_its_checkpoint_after_its_host_dies() {
    let Some(socket) = socket() else { return };
    let dir = tempfile::tempdir().expect("temp dir");
    let operator = SigningKey::from_bytes(&[1; 32]);
    let exchange = Exchange::start(dir.path(), &operator);
    let mut renter = funded_renter(&exchange, &operator, 3, 1_000_000_000).await;

    // The code, packed and put in the job store under its hash.
    let code = dir.path().join("code");
    std::fs::create_dir_all(&code).expect("code dir");
    write(&code.join("train.py"), TRAIN_PY);
    let bundle = gpux_jobs::bundle::pack(&code).expect("packs");
    let (url, token) = store_token(&mut renter).await;
    let http = reqwest::Client::new();
    let key = format!("{}/bundles/{}.tar.gz", renter.account.0, bundle.sha256_hex());
    let put = http.put(format!("{url}/v1/objects/{key}")).bearer_auth(&token).body(bundle.bytes.clone()).send().await.expect("put");
    assert_eq!(put.status(), 201, "the bundle is stored");
    let wrong = http.put(format!("{url}/v1/objects/{key}")).bearer_auth(&token).body(b"not it".to_vec()).send().await.expect("put");
    assert_eq!(wrong.status(), 400, "a body that is not the named bundle is refused");
    // Its data, an input packed and put beside it: mounted read-only at /data.
    let data = dir.path().join("data");
    std::fs::create_dir_all(&data).expect("data dir");
    write(&data.join("numbers.txt"), "1 2 3 4 5\n");
    let input = gpux_jobs::bundle::pack_within(&data, gpux_jobs::bundle::Limits::INPUT).expect("packs");
    let input_key = format!("{}/inputs/{}.tar.gz", renter.account.0, input.sha256_hex());
    let put = http.put(format!("{url}/v1/objects/{input_key}")).bearer_auth(&token).body(input.bytes.clone()).send().await.expect("put");
    assert_eq!(put.status(), 201, "the input is stored");

    // Host A is cheaper: the job lands there first.
    let (config_a, host_a) = host(&dir.path().join("a"), &exchange.url, &socket, "job-a", 2_000_000);
    let (config_b, host_b) = host(&dir.path().join("b"), &exchange.url, &socket, "job-b", 2_500_000);
    let mut agent_a = spawn_agent(&config_a, &host_a);
    let _agent_b = spawn_agent(&config_b, &host_b);
    // Both hosts' asks on the book before the job bids.
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let id = renter.new_id();
        if let Ok(ServerMessage::BookOffers { offers, .. }) =
            renter.request(ClientMessage::BookOffers { id, instrument: InstrumentId(0), offset: 0, after: None }).await
        {
            if offers.len() >= 2 {
                break;
            }
        }
        assert!(Instant::now() < deadline, "both hosts offer");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }

    let steps = STEPS.to_string();
    let run = JobRun {
        inputs: vec![JobInput {
            name: "data".into(),
            mount: "/data".into(),
            source: InputSource::Store { sha256: input.sha256_hex(), bytes: input.bytes.len() as u64 },
        }],
        ..job_run(&["python3", "train.py", &steps], Some(BundleRef { sha256: bundle.sha256_hex(), bytes: bundle.bytes.len() as u64 }))
    };
    let submission = JobSubmission { budget_minor: 10_000_000, ..job_submission("resume-test", InstrumentId(0), run) };
    let id = renter.new_id();
    let job = match renter.request(ClientMessage::SubmitJob { id, job: Box::new(submission) }).await.expect("submitted") {
        ServerMessage::Job { job, .. } => job.job,
        other => panic!("{other:?}"),
    };
    // `starting` once the bid fills, `running` once the container runs.
    let mut seen = Vec::new();
    let running = await_job(&mut renter, job, Duration::from_secs(30), |i| {
        seen.push(i.state.clone());
        matches!(i.state, JobState::Running { .. })
    })
    .await;
    let JobState::Running { attempt: 1, leases } = running.state else { panic!("{:?}", running.state) };
    assert!(seen.iter().any(|s| *s == JobState::Starting { attempt: 1, leases: leases.clone() }), "starting before running: {seen:?}");
    let first = leases[0];

    // A checkpoint reaches the store (the first sync, 10 s after start).
    let checkpoint_key = format!("{}/jobs/{}/checkpoints/state.json", renter.account.0, job.0);
    let deadline = Instant::now() + Duration::from_secs(60);
    let synced_step = loop {
        let answer = http.get(format!("{url}/v1/objects/{checkpoint_key}")).bearer_auth(&token).send().await.expect("get");
        if answer.status() == 200 {
            let state: serde_json::Value = serde_json::from_slice(&answer.bytes().await.expect("body")).expect("json");
            break state["step"].as_u64().expect("a step");
        }
        assert!(Instant::now() < deadline, "host A synced a checkpoint");
        tokio::time::sleep(Duration::from_millis(500)).await;
    };
    assert!(synced_step > 0);

    // Host A dies: its agent killed, its container gone.
    agent_a.0.kill().expect("kill -9");
    let _ = agent_a.0.wait();
    remove_container(&socket, "job-a", first);

    // The exchange fails the silent lease and the job bids again: host B.
    let resumed = await_job(&mut renter, job, Duration::from_secs(60), |i| matches!(i.state, JobState::Running { attempt: 2, .. })).await;
    let JobState::Running { leases, .. } = &resumed.state else { unreachable!() };
    assert_ne!(leases[0], first, "a new lease");
    let finished = await_job(&mut renter, job, Duration::from_secs(90), |i| i.state.is_over()).await;
    assert_eq!(finished.state, JobState::Succeeded);
    assert_eq!(finished.leases.len(), 2, "two leases: one per attempt");

    // The results: the step counter went on from the synced checkpoint.
    let id = renter.new_id();
    let status = renter.request(ClientMessage::JobStatus { id, job }).await.expect("status");
    assert!(matches!(status, ServerMessage::Job { ref job, .. } if job.state == JobState::Succeeded), "{status:?}");
    let listed =
        http.get(format!("{url}/v1/list/{}/jobs/{}/outputs", renter.account.0, job.0)).bearer_auth(&token).send().await.expect("list");
    let listed: serde_json::Value = serde_json::from_slice(&listed.bytes().await.expect("body")).expect("json");
    assert_eq!(listed.as_array().map(Vec::len), Some(1), "{listed}");
    let result_key = format!("{}/jobs/{}/outputs/result.json", renter.account.0, job.0);
    let result = http.get(format!("{url}/v1/objects/{result_key}")).bearer_auth(&token).send().await.expect("get");
    let result: serde_json::Value = serde_json::from_slice(&result.bytes().await.expect("body")).expect("json");
    assert_eq!(result["steps"], STEPS);
    assert_eq!(result["attempt"], 2);
    let started_at = result["started_at"].as_u64().expect("started_at");
    assert!(started_at >= synced_step, "resumed from step {started_at}, at least the synced {synced_step}: not from 0");
    assert_eq!(result["data_sum"], 15, "the input was there on the second host too");
    assert_eq!(result["data_read_only"], true, "inputs are mounted read-only");
    assert_eq!(result["input_env"], "/data");

    // The job's bill: signed by the exchange, its leases only, and what it
    // says is due is what the ledger moved out of the renter for them.
    tokio::time::sleep(Duration::from_secs(2)).await; // the last usage reports settle
    let id = renter.new_id();
    let ServerMessage::Invoice { invoice, signature, exchange_key, next_offset, .. } =
        renter.request(ClientMessage::JobBill { id, job, offset: 0 }).await.expect("bill")
    else {
        panic!("a bill")
    };
    assert!(invoice.verify(&signature, &exchange_key), "the bill is signed by the exchange");
    assert_eq!(next_offset, None);
    assert!(invoice.lines.iter().all(|l| l.lease.is_some_and(|lease| finished.leases.contains(&lease))), "{:?}", invoice.lines);
    assert!(invoice.totals.amount_due_minor > 0, "the job's GPU time was billed");
    let paid = paid_for_leases(&mut renter, &finished.leases).await;
    assert_eq!(invoice.totals.amount_due_minor, paid, "the bill equals the ledger's transfers for the job's leases");

    // Another renter's token opens none of it.
    let mut stranger = funded_renter(&exchange, &operator, 9, 1_000).await;
    let (_, other_token) = store_token(&mut stranger).await;
    let denied = http.get(format!("{url}/v1/objects/{result_key}")).bearer_auth(&other_token).send().await.expect("get");
    assert_eq!(denied.status(), 403);
}
