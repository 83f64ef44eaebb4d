//! The job store (docs/jobs.md "Code and data") against the real binary:
//! on local files, each account's share holds and what is put is checked;
//! on a real S3-compatible server process (s3s-fs, started here offline),
//! objects go through `object_store`'s S3 client, and the backend going
//! down and coming back is told to clients as `store_unavailable`, never
//! as a lost object.
//!
//! The S3 test needs the s3s-fs binary (`GPUX_S3S_FS`; scripts/test
//! installs it); it says SKIPPED without it unless `GPUX_REQUIRE_S3=1`.

mod common;

use std::path::Path;
use std::time::{Duration, Instant};

use common::*;
use gpux_engine::Role;
use gpux_protocol::*;
use sha2::{Digest, Sha256};

async fn renter_token(addr: &str, seed: u8) -> (String, String, u64) {
    let (mut renter, account) = Client::login(addr, &key(seed), Role::Renter).await;
    match renter.request(ClientMessage::JobStoreToken { id: 5, job: None, lease: None, volume: None }).await {
        ServerMessage::JobStoreToken { url, token, .. } => (url, token, account.0 as u64),
        other => panic!("{other:?}"),
    }
}

/// A "bundle" of `bytes` pseudo-random bytes and its key.
fn bundle(account: u64, seed: u8, bytes: usize) -> (String, Vec<u8>) {
    let body: Vec<u8> = (0..bytes).map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed)).collect();
    (format!("{account}/bundles/{}.tar.gz", hex::encode(Sha256::digest(&body))), body)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_local_job_store_keeps_each_accounts_share_and_checks_what_is_put() {
    let dir = tempfile::tempdir().expect("temp dir");
    let exchange = Exchange::start_with(dir.path(), None, &["--job-store-quota-mib", "1"]);
    let (url, token, account) = renter_token(&exchange.addr, 3).await;

    let (key, body) = bundle(account, 1, 600 << 10);
    assert_eq!(put(&url, &token, &key, body.clone()).await.0, 201);
    assert_eq!(get(&url, &token, &key).await, (200, body.clone()), "read back as put");
    assert!(dir.path().join("job-store").join(&key).exists(), "kept in the data directory's job-store/");

    // What is put under a bundle's name must be that bundle.
    let (status, text) = put(&url, &token, &key, b"something else".to_vec()).await;
    assert_eq!(status, 400);
    assert!(text.contains("hash_mismatch"), "{text}");
    // A second 600 KiB goes over the account's 1 MiB share; replacing the
    // first in place does not.
    let (other_key, other) = bundle(account, 2, 600 << 10);
    let (status, text) = put(&url, &token, &other_key, other.clone()).await;
    assert_eq!(status, 507);
    assert!(text.contains("quota_exceeded"), "{text}");
    assert_eq!(put(&url, &token, &key, body).await.0, 201, "the same object again fits");
    // Another account has its own share.
    let (_, other_token, other_account) = renter_token(&exchange.addr, 4).await;
    let (their_key, theirs) = bundle(other_account, 2, 600 << 10);
    assert_eq!(put(&url, &other_token, &their_key, theirs).await.0, 201);
    // And cannot touch this account's objects, nor can a forged or absent token.
    assert_eq!(get(&url, &other_token, &key).await.0, 403);
    assert_eq!(put(&url, &other_token, &other_key, other).await.0, 403);
    assert_eq!(get(&url, &format!("{token}0"), &key).await.0, 401);
    let bare = reqwest::Client::new().get(format!("{url}/v1/objects/{key}")).send().await.expect("get");
    assert_eq!(bare.status(), 401);
    // Keys outside the layout are refused, not stored.
    assert_eq!(put(&url, &token, &format!("{account}/../etc/passwd"), b"x".to_vec()).await.0, 400);
    assert_eq!(put(&url, &token, &format!("{account}/jobs/1/outputs/x"), b"x".to_vec()).await.0, 403, "results are the host's to write");
    // A declared length that can never fit (over 1 GiB, or over the whole
    // share) is refused at once, before any body: four such uploads left
    // hanging hold no upload slot, and a fifth account's upload goes in.
    let host_port = url.trim_start_matches("http://").to_string();
    for declared in [2u64 << 30, 512 << 20, 512 << 20, 512 << 20] {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let mut stream = tokio::net::TcpStream::connect(&host_port).await.expect("connect");
        let head = format!(
            "PUT /v1/objects/{other_key} HTTP/1.1\r\nHost: {host_port}\r\nAuthorization: Bearer {token}\r\nContent-Length: {declared}\r\n\r\nabc"
        );
        stream.write_all(head.as_bytes()).await.expect("write");
        let mut answer = vec![0u8; 512];
        let read = tokio::time::timeout(Duration::from_secs(5), stream.read(&mut answer)).await.expect("answered at once").expect("read");
        let answer = String::from_utf8_lossy(&answer[..read]).to_string();
        let expected = if declared > 1 << 30 { "413" } else { "507" };
        assert!(answer.starts_with(&format!("HTTP/1.1 {expected}")), "{declared}: {answer}");
        std::mem::forget(stream); // left hanging
    }
    let (_, late_token, late_account) = renter_token(&exchange.addr, 5).await;
    let (late_key, late) = bundle(late_account, 3, 1 << 10);
    assert_eq!(put(&url, &late_token, &late_key, late).await.0, 201, "no upload slot is held by the refused ones");
    // The listing shows the account's own objects only.
    let listed = reqwest::Client::new().get(format!("{url}/v1/list/{account}")).bearer_auth(&token).send().await.expect("list");
    let listed: serde_json::Value = serde_json::from_slice(&listed.bytes().await.expect("body")).expect("json");
    assert_eq!(listed.as_array().map(Vec::len), Some(1), "{listed}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_job_store_on_an_s3_server_survives_the_server_going_down_and_back() {
    let Some(binary) = s3s_fs() else { return };
    let dir = tempfile::tempdir().expect("temp dir");
    let data = dir.path().join("s3");
    std::fs::create_dir_all(data.join("gpux-jobs")).expect("the bucket");
    let port = std::net::TcpListener::bind("127.0.0.1:0").expect("port").local_addr().expect("addr").port();
    let server = S3Server::start(&binary, port, &data);
    let endpoint = format!("http://127.0.0.1:{port}");
    let env = [
        ("AWS_ENDPOINT", endpoint.as_str()),
        ("AWS_ACCESS_KEY_ID", "gpuxtest"),
        ("AWS_SECRET_ACCESS_KEY", "gpuxtestsecret"),
        ("AWS_REGION", "us-east-1"),
        ("AWS_ALLOW_HTTP", "true"),
    ];
    let exchange_dir = dir.path().join("exchange");
    let exchange = Exchange::start_with_env(&exchange_dir, None, &["--job-store", "s3://gpux-jobs"], &env);
    let (url, token, account) = renter_token(&exchange.addr, 3).await;

    let (key, body) = bundle(account, 1, 100 << 10);
    let (status, text) = put(&url, &token, &key, body.clone()).await;
    assert_eq!(status, 201, "{text}");
    assert!(data.join("gpux-jobs").join(&key).exists(), "the object is in the S3 server's bucket");
    assert_eq!(get(&url, &token, &key).await, (200, body.clone()));

    // The S3 server goes away: clients are told the store is unavailable.
    drop(server);
    let (key_2, body_2) = bundle(account, 2, 10 << 10);
    let (status, text) = put(&url, &token, &key_2, body_2.clone()).await;
    assert_eq!(status, 503, "{text}");
    assert!(text.contains("store_unavailable"), "{text}");
    assert_eq!(get(&url, &token, &key).await.0, 503);

    // It comes back: nothing was lost, and puts go on.
    let _server = S3Server::start(&binary, port, &data);
    assert_eq!(get(&url, &token, &key).await, (200, body));
    assert_eq!(put(&url, &token, &key_2, body_2.clone()).await.0, 201);
    assert_eq!(get(&url, &token, &key_2).await, (200, body_2));

    // A wrong secret at the exchange is refused by the server: a 503, not a write.
    let wrong_dir = dir.path().join("exchange-wrong");
    let mut wrong_env = env;
    wrong_env[2] = ("AWS_SECRET_ACCESS_KEY", "not-the-secret");
    let wrong = Exchange::start_with_env(&wrong_dir, None, &["--job-store", "s3://gpux-jobs"], &wrong_env);
    let (wrong_url, wrong_token, wrong_account) = renter_token(&wrong.addr, 5).await;
    let (wrong_key, wrong_body) = bundle(wrong_account, 3, 1 << 10);
    assert_eq!(put(&wrong_url, &wrong_token, &wrong_key, wrong_body).await.0, 503);
    assert!(!data.join("gpux-jobs").join(&wrong_key).exists());
}

/// Issue 61: a host kept its job-store token after its lease ended and
/// could still overwrite checkpoints and write outputs: the renter
/// downloaded a forged result. A host's token now opens the job only while
/// its lease runs: refused `lease_ended` after the host failed and the job
/// moved, and after the renter cancelled; the new host's token is its own.
/// Within 2 minutes of the end the old host may still put its own
/// attempt's output tail, and nothing else.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hosts_token_ends_with_its_lease_and_a_rematch_gets_its_own() {
    let dir = tempfile::tempdir().expect("temp dir");
    let (_exchange, mut renter, renter_account, mut supplier) = renter_and_delivering_supplier(dir.path()).await;
    // Two hosts asking.
    for (n, host) in ["host-a", "host-b"].iter().enumerate() {
        supplier.register_h100(host, &format!("GPU-{host}")).await;
        let mut ask = ticket(n as u64 + 1, gpux_engine::Side::Sell, 1_000_000, 1);
        ask.supply = Some(gpux_engine::GpuSet { host: gpux_engine::HostId(n as u32), gpu_mask: 1 });
        assert!(matches!(supplier.place(ask).await, ServerMessage::Ack { .. }));
    }
    let run = JobRun::in_image("localhost/gpux-py:1", &["python3", "train.py"]);
    let mut submission = JobSubmission::one_host("forgery", gpux_engine::InstrumentId(0), 1, 2_000_000, 1, 100_000_000, run);
    submission.retries = 2;
    let id = renter.id();
    let job = match renter.request(ClientMessage::SubmitJob { id, job: Box::new(submission) }).await {
        ServerMessage::Job { job, .. } => job.job,
        other => panic!("{other:?}"),
    };
    let (url, renter_token, _) = {
        let id = renter.id();
        match renter.request(ClientMessage::JobStoreToken { id, job: None, lease: None, volume: None }).await {
            ServerMessage::JobStoreToken { url, token, .. } => (url, token, ()),
            other => panic!("{other:?}"),
        }
    };
    let prefix = format!("{}/jobs/{}", renter_account.0, job.0);
    let first = running_lease(&mut renter, job, None).await;
    // The attempt reached its host with the token for its files (issue 65:
    // no round trip for it); the token opens the job's prefix.
    let grant = supplier
        .recv_until(|m| match m {
            ServerMessage::JobAssigned { lease, store, .. } if *lease == first => Some(store.clone()),
            _ => None,
        })
        .await
        .expect("the store's grant with the assignment");
    assert_eq!(grant.url, url);
    assert_eq!(put(&url, &grant.token, &format!("{prefix}/outputs/assigned.json"), b"{}".to_vec()).await.0, 201);
    let first_token = host_token(&mut supplier, first).await;
    assert_eq!(put(&url, &first_token, &format!("{prefix}/outputs/result.json"), b"{\"honest\":1}".to_vec()).await.0, 201);

    // The first host fails: the job moves to the other host.
    let id = supplier.id();
    let failed = DeliveryState::Failed { code: FailureCode::HostError, fault: Fault::Host, reason: "gpu fell off the bus".into() };
    let answer = supplier.request(ClientMessage::DeliveryStatus { id, lease: first, state: failed }).await;
    assert!(!matches!(answer, ServerMessage::Error { .. }), "{answer:?}");
    let second = running_lease(&mut renter, job, Some(first)).await;
    let (status, body) = put(&url, &first_token, &format!("{prefix}/outputs/result.json"), b"{\"forged\":1}".to_vec()).await;
    assert_eq!((status, body.contains("lease_ended")), (403, true), "the old host writes no output: {body}");
    let (status, _) = put(&url, &first_token, &format!("{prefix}/checkpoints/state.json"), b"{}".to_vec()).await;
    assert_eq!(status, 403, "nor a checkpoint");
    assert_eq!(get(&url, &first_token, &format!("{prefix}/outputs/result.json")).await.0, 403, "nor reads");
    let own_tail = format!("{prefix}/logs/attempt-1-rank-0.log");
    assert_eq!(put(&url, &first_token, &own_tail, b"last words".to_vec()).await.0, 201, "its own attempt's tail, within the grace");
    let other_tail = format!("{prefix}/logs/attempt-2-rank-0.log");
    assert_eq!(put(&url, &first_token, &other_tail, b"forged".to_vec()).await.0, 403, "not another attempt's");
    let (status, result) = get(&url, &renter_token, &format!("{prefix}/outputs/result.json")).await;
    assert_eq!((status, result.as_slice()), (200, b"{\"honest\":1}".as_slice()), "the renter reads what a running host wrote");

    // The new host's own token; then the renter cancels and it ends too.
    let second_token = host_token(&mut supplier, second).await;
    assert_eq!(put(&url, &second_token, &format!("{prefix}/outputs/result.json"), b"{\"second\":1}".to_vec()).await.0, 201);
    let id = renter.id();
    assert!(matches!(renter.request(ClientMessage::CancelJob { id, job }).await, ServerMessage::Job { .. }));
    let deadline = Instant::now() + Duration::from_secs(5);
    while !job_state(&mut renter, job).await.is_over() {
        assert!(Instant::now() < deadline, "cancelled");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let (status, body) = put(&url, &second_token, &format!("{prefix}/outputs/result.json"), b"{\"late\":1}".to_vec()).await;
    assert_eq!((status, body.contains("lease_ended")), (403, true), "{body}");
    // A host token for a lease that has ended is not issued at all.
    let id = supplier.id();
    let refused = supplier.request(ClientMessage::JobStoreToken { id, job: None, lease: Some(first), volume: None }).await;
    assert!(matches!(refused, ServerMessage::Error { code: ErrorCode::JobStoreUnavailable, .. }), "{refused:?}");
}

/// Resident memory of a process, in KiB (`VmRSS`).
fn resident_kib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("/proc status");
    let line = status.lines().find(|line| line.starts_with("VmRSS:")).expect("VmRSS");
    line.split_whitespace().nth(1).expect("a number").parse().expect("KiB")
}

/// Starts a put that declares `declared` bytes and sends 1 KiB: the stream,
/// left open.
async fn stalled_put(url: &str, token: &str, key: &str, declared: u64) -> tokio::net::TcpStream {
    use tokio::io::AsyncWriteExt;
    let host_port = url.trim_start_matches("http://");
    let mut stream = tokio::net::TcpStream::connect(host_port).await.expect("connect");
    let head = format!(
        "PUT /v1/objects/{key} HTTP/1.1\r\nHost: {host_port}\r\nAuthorization: Bearer {token}\r\nContent-Length: {declared}\r\n\r\n"
    );
    stream.write_all(head.as_bytes()).await.expect("head");
    stream.write_all(&[7u8; 1024]).await.expect("1 KiB");
    stream
}

/// Issue 61: 4 stalled uploads (512 MiB declared, 1 KiB sent) made every
/// other account's upload `503 busy` for 10 minutes, 4 uploads of 256 MiB
/// took the exchange from 30 MiB to 1.9 GiB, and objects were 0644 in
/// 0755 folders. Uploads are now each uploader's (2 at once, 16 in all),
/// a body that stalls is cut off after 10 s, bodies stream to the backend
/// in bounded memory, and what the store keeps is owner-only.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stalled_uploads_hold_only_their_own_slots_and_bodies_stream_in_bounded_memory() {
    use tokio::io::AsyncReadExt;
    let dir = tempfile::tempdir().expect("temp dir");
    let exchange = Exchange::start(dir.path(), None);
    let pid = exchange.child.id();
    let (url, attacker, attacker_account) = renter_token(&exchange.addr, 3).await;
    let (mut stalled, mut keys) = (Vec::new(), Vec::new());
    for seed in 0..2u8 {
        let (key, _) = bundle(attacker_account, seed, 16);
        stalled.push(stalled_put(&url, &attacker, &key, 512 << 20).await);
        keys.push(key);
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    let (third, body) = bundle(attacker_account, 9, 1 << 10);
    let (status, text) = put(&url, &attacker, &third, body).await;
    assert_eq!((status, text.contains("2 uploads in flight")), (503, true), "the attacker's own share: {text}");
    let (_, victim, victim_account) = renter_token(&exchange.addr, 4).await;
    let (key, body) = bundle(victim_account, 1, 64 << 10);
    assert_eq!(put(&url, &victim, &key, body).await.0, 201, "another account uploads meanwhile");
    // The stalled bodies are cut off and answered; nothing of them is kept.
    for mut stream in stalled {
        let mut answer = vec![0u8; 512];
        let read = tokio::time::timeout(Duration::from_secs(15), stream.read(&mut answer)).await.expect("cut off").expect("read");
        let answer = String::from_utf8_lossy(&answer[..read]).to_string();
        assert!(answer.starts_with("HTTP/1.1 408") && answer.contains("upload_stalled"), "{answer}");
    }
    for key in &keys {
        assert_eq!(get(&url, &attacker, key).await.0, 404, "a cut upload leaves nothing");
    }

    // Four uploaders put 128 MiB each at once: the exchange's memory stays bounded.
    let before_kib = resident_kib(pid);
    let peak = std::sync::Arc::new(std::sync::atomic::AtomicU64::new(before_kib));
    let sampling = tokio::spawn({
        let peak = peak.clone();
        async move {
            loop {
                peak.fetch_max(resident_kib(pid), std::sync::atomic::Ordering::Relaxed);
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }
    });
    let mut uploads = tokio::task::JoinSet::new();
    for seed in 10..14u8 {
        let (_, token, account) = renter_token(&exchange.addr, seed).await;
        let (key, body) = bundle(account, seed, 128 << 20);
        let url = url.clone();
        uploads.spawn(async move { (put(&url, &token, &key, body).await.0, key) });
    }
    let mut stored = Vec::new();
    while let Some(done) = uploads.join_next().await {
        let (status, key) = done.expect("an upload");
        assert_eq!(status, 201, "{key}");
        stored.push(key);
    }
    sampling.abort();
    let grown_mib = peak.load(std::sync::atomic::Ordering::Relaxed).saturating_sub(before_kib) / 1024;
    eprintln!("JOB STORE: 4 x 128 MiB uploads at once grew the exchange by {grown_mib} MiB at most");
    assert!(grown_mib < 96, "512 MiB in flight grew the exchange by {grown_mib} MiB");

    // Owner-only: each object 0600, each folder 0700.
    use std::os::unix::fs::PermissionsExt;
    let mode = |path: &Path| std::fs::metadata(path).expect("there").permissions().mode() & 0o777;
    let object = dir.path().join("job-store").join(&stored[0]);
    assert_eq!(mode(&object), 0o600, "{}", object.display());
    let mut folder = object.parent().expect("a folder").to_path_buf();
    while folder != dir.path() {
        assert_eq!(mode(&folder), 0o700, "{}", folder.display());
        folder = folder.parent().expect("a parent").to_path_buf();
    }
}

/// A host's token for its lease's volumes lasts the lease, not an hour: an
/// open-ended lease's host syncs with the token it was handed for as long
/// as the lease runs (an hour's token left its syncs refused after the
/// first hour); the store honours it only while the lease runs (and for
/// the last sync after it).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hosts_volume_token_lasts_its_open_ended_lease() {
    let dir = tempfile::tempdir().expect("temp dir");
    let (_exchange, mut renter, renter_account, mut supplier) = renter_and_delivering_supplier(dir.path()).await;
    supplier.register_h100("host-v", "GPU-host-v").await;
    let mut ask = ticket(1, gpux_engine::Side::Sell, 1_000_000, 1);
    ask.supply = Some(gpux_engine::GpuSet { host: gpux_engine::HostId(0), gpu_mask: 1 });
    assert!(matches!(supplier.place(ask).await, ServerMessage::Ack { .. }));
    let id = renter.id();
    let volume = match renter.request(ClientMessage::CreateVolume { id, name: "data".into(), size_gib: 1 }).await {
        ServerMessage::Volume { volume, .. } => volume.volume,
        other => panic!("{other:?}"),
    };
    // An open-ended bid mounting the volume, with a workload.
    let mut bid = ticket(2, gpux_engine::Side::Buy, 1_000_000, 1);
    bid.duration = gpux_engine::LeaseDuration::UntilCancelled;
    bid.volumes = vec![VolumeMount { volume: "data".into(), mount: "/data".into(), read_only: false }];
    let id = renter.id();
    let workload = Some(Box::new(Workload::image("localhost/gpux-test:busybox")));
    let placed = renter.request(ClientMessage::NewOrder { id, order: bid, workload }).await;
    assert!(matches!(placed, ServerMessage::Ack { .. }), "{placed:?}");
    let lease = supplier
        .recv_until(|m| match m {
            ServerMessage::VolumesAttached { lease, .. } => Some(*lease),
            _ => None,
        })
        .await;
    let id = supplier.id();
    let now_ms = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).expect("clock").as_millis() as u64;
    let (url, token, expires_at_ms) =
        match supplier.request(ClientMessage::JobStoreToken { id, job: None, lease: Some(lease), volume: Some("data".into()) }).await {
            ServerMessage::JobStoreToken { url, token, expires_at_ms, .. } => (url, token, expires_at_ms),
            other => panic!("{other:?}"),
        };
    assert!(expires_at_ms >= now_ms + 300 * 24 * 3_600_000, "an open-ended lease's host token lasts: {}", expires_at_ms - now_ms);
    let key = format!("{}/volumes/{}/synced.txt", renter_account.0, volume.0);
    let (status, body) = put(&url, &token, &key, b"synced".to_vec()).await;
    assert_eq!(status, 201, "the running lease's host writes its volume: {body}");
}

/// An exchange in `dir` with a renter (key 3) funded with $1 000 and a
/// supplier (key 2) whose hosts deliver workloads (its encryption key
/// published): the exchange, the renter, its account and the supplier.
async fn renter_and_delivering_supplier(dir: &Path) -> (Exchange, Client, gpux_engine::AccountId, Client) {
    let exchange = Exchange::start(dir, Some(&key(1)));
    let (mut operator, _) = Client::login(&exchange.addr, &key(1), Role::Operator).await;
    let (renter, renter_account) = Client::login(&exchange.addr, &key(3), Role::Renter).await;
    let (mut supplier, _) = Client::login(&exchange.addr, &key(2), Role::Supplier).await;
    let id = operator.id();
    let deposit = ClientMessage::Deposit { id, account: renter_account, amount_minor: 1_000_000_000 };
    assert!(matches!(operator.request(deposit).await, ServerMessage::Ack { .. }));
    publish_encryption_key(&mut supplier, &key(2)).await;
    (exchange, renter, renter_account, supplier)
}
