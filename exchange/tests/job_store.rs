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
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::*;
use gpux_engine::Role;
use gpux_protocol::*;
use sha2::{Digest, Sha256};

async fn renter_token(addr: &str, seed: u8) -> (String, String, u64) {
    let (mut renter, account) = Client::login(addr, &key(seed), Role::Renter).await;
    match renter.request(ClientMessage::JobStoreToken { id: 5, job: None, lease: None }).await {
        ServerMessage::JobStoreToken { url, token, .. } => (url, token, account.0 as u64),
        other => panic!("{other:?}"),
    }
}

/// A "bundle" of `bytes` pseudo-random bytes and its key.
fn bundle(account: u64, seed: u8, bytes: usize) -> (String, Vec<u8>) {
    let body: Vec<u8> = (0..bytes).map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed)).collect();
    (format!("{account}/bundles/{}.tar.gz", hex::encode(Sha256::digest(&body))), body)
}

async fn put(url: &str, token: &str, key: &str, body: Vec<u8>) -> (u16, String) {
    let answer = reqwest::Client::new().put(format!("{url}/v1/objects/{key}")).bearer_auth(token).body(body).send().await.expect("put");
    let status = answer.status().as_u16();
    (status, answer.text().await.unwrap_or_default())
}

async fn get(url: &str, token: &str, key: &str) -> (u16, Vec<u8>) {
    let answer = reqwest::Client::new().get(format!("{url}/v1/objects/{key}")).bearer_auth(token).send().await.expect("get");
    let status = answer.status().as_u16();
    (status, answer.bytes().await.map(|b| b.to_vec()).unwrap_or_default())
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

/// The s3s-fs server, on `port`, over `data`.
struct S3Server(Child);

impl S3Server {
    fn start(binary: &Path, port: u16, data: &Path) -> S3Server {
        let child = Command::new(binary)
            .args(["--host", "127.0.0.1", "--port", &port.to_string(), "--access-key", "gpuxtest", "--secret-key", "gpuxtestsecret"])
            .arg(data)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("s3s-fs starts");
        let deadline = Instant::now() + Duration::from_secs(20);
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            assert!(Instant::now() < deadline, "s3s-fs listened");
            std::thread::sleep(Duration::from_millis(50));
        }
        S3Server(child)
    }
}

impl Drop for S3Server {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn s3s_fs() -> Option<std::path::PathBuf> {
    match std::env::var_os("GPUX_S3S_FS").map(std::path::PathBuf::from) {
        Some(path) if path.exists() => Some(path),
        _ => {
            assert!(
                std::env::var("GPUX_REQUIRE_S3").as_deref() != Ok("1"),
                "GPUX_REQUIRE_S3=1 but GPUX_S3S_FS names no s3s-fs binary (scripts/test installs it)"
            );
            eprintln!("SKIPPED: no S3-compatible server (set GPUX_S3S_FS; scripts/test does)");
            None
        }
    }
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
