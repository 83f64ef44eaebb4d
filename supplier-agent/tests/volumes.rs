//! Volumes end to end (docs/storage.md): a real exchange with its job
//! store, the real agent binary on fake one-GPU hosts with the `docker`
//! backend on a real container engine (podman, `scripts/containers`).
//!
//! Files a workload writes into its volume in one lease are in the store
//! when its exit ends the lease, and the next lease, on another host,
//! finds them at its mount. A volume has one writer: a second read-write
//! mount is refused `volume_in_use` while a lease writes it; a read-only
//! mount gets a copy that its workload cannot change; a held volume cannot
//! be deleted; once free, deleting it removes its files from the store.

mod common;

use std::time::{Duration, Instant};

use common::*;
use ed25519_dalek::SigningKey;
use gpux_engine::{EventKind, InstrumentId, LeaseId, Side, TimeInForce};
use gpux_protocol::*;
use gpux_supplier_agent::session::Connection;

const IMAGE: &str = "localhost/gpux-test:busybox";

/// A workload of the test image whose secrets (its command) follow.
fn workload(end_on_exit: bool) -> Workload {
    Workload { secrets_follow: true, end_lease_on_exit: end_on_exit, ..Workload::image(IMAGE) }
}

fn shell(script: &str) -> Secrets {
    Secrets { command: vec!["/bin/sh".into(), "-c".into(), script.into()], ..Secrets::default() }
}

fn mount(volume: &str, at: &str, read_only: bool) -> VolumeMount {
    VolumeMount { volume: volume.into(), mount: at.into(), read_only }
}

/// Bids IOC for one GPU with `workload` and `volumes` until a lease fills
/// (20 s); the bid's refusal if the exchange refuses it.
async fn lease_with(renter: &mut Connection, workload: &Workload, volumes: Vec<VolumeMount>) -> Result<LeaseId, ServerMessage> {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let id = renter.new_id();
        let mut order = OrderTicket::limit(id, InstrumentId(0), Side::Buy, 2_100_000, 1);
        order.time_in_force = TimeInForce::Ioc;
        order.volumes = volumes.clone();
        let answer = renter.request(ClientMessage::NewOrder { id, order, workload: Some(Box::new(workload.clone())) }).await.expect("bid");
        if !matches!(answer, ServerMessage::Ack { .. }) {
            return Err(answer);
        }
        let found = tokio::time::timeout(Duration::from_millis(700), async {
            loop {
                if let Ok(ServerMessage::Private { event, .. }) = renter.next().await {
                    if let EventKind::LeaseCreated { lease, .. } = event.kind {
                        return lease;
                    }
                }
            }
        })
        .await;
        if let Ok(lease) = found {
            return Ok(lease);
        }
        assert!(Instant::now() < deadline, "no lease within 20 s");
    }
}

/// The lease's delivery states until `done` holds (90 s); a failure panics.
async fn await_delivery(renter: &mut Connection, lease: LeaseId, mut done: impl FnMut(&DeliveryState) -> bool) -> DeliveryState {
    let deadline = Instant::now() + Duration::from_secs(90);
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        let message = tokio::time::timeout(left, renter.next()).await.expect("delivery status in time").expect("message");
        if let ServerMessage::Delivery { lease: of, state, .. } = message {
            if of != lease {
                continue;
            }
            assert!(!matches!(state, DeliveryState::Failed { .. }) || done(&state), "delivery failed: {state:?}");
            if done(&state) {
                return state;
            }
        }
    }
}

async fn create_volume(renter: &mut Connection, name: &str, size_gib: u32) -> VolumeInfo {
    let id = renter.new_id();
    match renter.request(ClientMessage::CreateVolume { id, name: name.into(), size_gib }).await.expect("answer") {
        ServerMessage::Volume { volume, .. } => *volume,
        other => panic!("{other:?}"),
    }
}

async fn volume(renter: &mut Connection, name: &str) -> VolumeInfo {
    let id = renter.new_id();
    match renter.request(ClientMessage::Volumes { id }).await.expect("answer") {
        ServerMessage::Volumes { volumes, .. } => volumes.into_iter().find(|v| v.name == name).expect("the volume"),
        other => panic!("{other:?}"),
    }
}

/// The renter's token for its volume `name`: the store's URL and the token.
async fn volume_token(renter: &mut Connection, name: &str) -> Result<(String, String), ServerMessage> {
    let id = renter.new_id();
    match renter.request(ClientMessage::JobStoreToken { id, job: None, lease: None, volume: Some(name.into()) }).await.expect("answer") {
        ServerMessage::JobStoreToken { url, token, .. } => Ok((url, token)),
        other => Err(other),
    }
}

/// The volume's files in the store by their path in it, with their content.
async fn volume_files(renter: &mut Connection, info: &VolumeInfo) -> Vec<(String, String)> {
    let (url, token) = volume_token(renter, &info.name).await.expect("a token");
    let prefix = format!("{}/volumes/{}", info.owner.0, info.volume.0);
    let listing = reqwest::Client::new().get(format!("{url}/v1/list/{prefix}")).bearer_auth(&token).send().await.expect("listing");
    assert!(listing.status().is_success(), "{}", listing.status());
    let listed: Vec<serde_json::Value> = serde_json::from_slice(&listing.bytes().await.expect("body")).expect("json");
    let mut files = Vec::new();
    for item in listed {
        let key = item["key"].as_str().expect("key").to_string();
        let body = store_get(&url, &token, &key).await.expect("the file");
        files.push((key.trim_start_matches(&format!("{prefix}/")).to_string(), String::from_utf8_lossy(&body).trim().to_string()));
    }
    files
}

/// Files a workload wrote into its volume on one host are in the store
/// when its exit ends the lease; the next lease, on another host, finds
/// them at its mount, and what it adds is kept too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_volume_written_in_one_lease_is_read_in_the_next_on_another_host() {
    let Some(socket) = socket() else { return };
    let dir = tempfile::tempdir().expect("temp dir");
    let operator = SigningKey::from_bytes(&[1; 32]);
    let exchange = Exchange::start(&dir.path().join("exchange"), &operator);
    supplier_keys(dir.path(), &["vol-a", "vol-b"]);
    let (config_a, host_a) = job_host(&dir.path().join("vol-a"), &exchange.url, &socket, "vol-a", H100_GPU, &[("spot", 2_100_000)]);
    let (config_b, host_b) = job_host(&dir.path().join("vol-b"), &exchange.url, &socket, "vol-b", H100_GPU, &[("spot", 2_100_000)]);
    let mut agent_a = spawn_agent(&config_a, &host_a);
    let mut renter = funded_renter(&exchange, &operator, 21, 1_000_000_000).await;
    let data = create_volume(&mut renter, "data", 1).await;
    assert_eq!((data.name.as_str(), data.size_gib, data.writer), ("data", 1, None));

    // The first lease (host a) writes a file and a nested one, and exits.
    let first = lease_with(&mut renter, &workload(true), vec![mount("data", "/data", false)]).await.expect("a lease");
    assert_eq!(volume(&mut renter, "data").await.writer, Some(first), "the lease writes the volume");
    let write = shell(
        "echo written-on-a > /data/note.txt && mkdir -p /data/sub && echo deep > /data/sub/deep.txt && test \"$GPUX_VOLUME_DATA\" = /data",
    );
    send_secrets(&mut renter, first, workload(true), &write).await;
    let exited = await_delivery(&mut renter, first, |s| matches!(s, DeliveryState::Exited { .. })).await;
    assert_eq!(exited, DeliveryState::Exited { code: 0 });
    let files = volume_files(&mut renter, &data).await;
    assert_eq!(files, vec![("note.txt".to_string(), "written-on-a".to_string()), ("sub/deep.txt".to_string(), "deep".to_string())]);

    // Host a goes away; the next lease is on host b, which restores the
    // volume before its workload starts.
    let _ = agent_a.0.kill();
    let _ = agent_a.0.wait();
    let _agent_b = spawn_agent(&config_b, &host_b);
    let deadline = Instant::now() + Duration::from_secs(30);
    while volume(&mut renter, "data").await.writer.is_some() {
        assert!(Instant::now() < deadline, "the ended lease still writes the volume");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let second = lease_with(&mut renter, &workload(true), vec![mount("data", "/work", false)]).await.expect("a lease on host b");
    let read = shell("test \"$(cat /work/note.txt)\" = written-on-a && test \"$(cat /work/sub/deep.txt)\" = deep && echo read-on-b > /work/second.txt && rm /work/sub/deep.txt");
    send_secrets(&mut renter, second, workload(true), &read).await;
    let exited = await_delivery(&mut renter, second, |s| matches!(s, DeliveryState::Exited { .. })).await;
    assert_eq!(exited, DeliveryState::Exited { code: 0 }, "the second lease found the first one's files");
    let files = volume_files(&mut renter, &data).await;
    assert_eq!(
        files,
        vec![("note.txt".to_string(), "written-on-a".to_string()), ("second.txt".to_string(), "read-on-b".to_string())],
        "the second lease's new file is kept and its deletion mirrored"
    );
}

/// One writer, any readers: a read-write mount of a volume a lease writes
/// is refused; a read-only one gets a copy its workload cannot change; a
/// held volume is not deleted; once free it is, and its files leave the
/// store.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_volume_has_one_writer_any_readers_and_deleting_it_removes_its_files() {
    let Some(socket) = socket() else { return };
    let dir = tempfile::tempdir().expect("temp dir");
    let operator = SigningKey::from_bytes(&[1; 32]);
    let exchange_dir = dir.path().join("exchange");
    let exchange = Exchange::start(&exchange_dir, &operator);
    supplier_keys(dir.path(), &["vol-c", "vol-d"]);
    let (config_c, host_c) = job_host(&dir.path().join("vol-c"), &exchange.url, &socket, "vol-c", H100_GPU, &[("spot", 2_100_000)]);
    let (config_d, host_d) = job_host(&dir.path().join("vol-d"), &exchange.url, &socket, "vol-d", H100_GPU, &[("spot", 2_100_000)]);
    let _agent_c = spawn_agent(&config_c, &host_c);
    let _agent_d = spawn_agent(&config_d, &host_d);
    let mut renter = funded_renter(&exchange, &operator, 22, 1_000_000_000).await;
    let shared = create_volume(&mut renter, "shared", 1).await;

    // The renter puts a file in the volume itself (`gpux volume cp`).
    let (url, token) = volume_token(&mut renter, "shared").await.expect("a token");
    let key = format!("{}/volumes/{}/seed.txt", shared.owner.0, shared.volume.0);
    let put = reqwest::Client::new().put(format!("{url}/v1/objects/{key}")).bearer_auth(&token).body("seeded").send().await.expect("put");
    assert!(put.status().is_success(), "{}", put.status());

    let writer = lease_with(&mut renter, &workload(false), vec![mount("shared", "/data", false)]).await.expect("a lease");
    send_secrets(&mut renter, writer, workload(false), &shell("test -f /data/seed.txt && exec sleep 600")).await;
    await_delivery(&mut renter, writer, |s| matches!(s, DeliveryState::Running { .. })).await;

    let refused = lease_with(&mut renter, &workload(false), vec![mount("shared", "/data", false)]).await.expect_err("refused");
    assert!(matches!(refused, ServerMessage::Error { code: ErrorCode::VolumeInUse, .. }), "{refused:?}");

    let reader = lease_with(&mut renter, &workload(true), vec![mount("shared", "/ro", true)]).await.expect("a read-only lease");
    let info = volume(&mut renter, "shared").await;
    assert_eq!((info.writer, info.readers.clone()), (Some(writer), vec![reader]));
    send_secrets(&mut renter, reader, workload(true), &shell("test \"$(cat /ro/seed.txt)\" = seeded && ! touch /ro/mine.txt")).await;
    let exited = await_delivery(&mut renter, reader, |s| matches!(s, DeliveryState::Exited { .. })).await;
    assert_eq!(exited, DeliveryState::Exited { code: 0 }, "a read-only copy: read, not written");

    let id = renter.new_id();
    let held = renter.request(ClientMessage::DeleteVolume { id, name: "shared".into() }).await.expect("answer");
    assert!(matches!(held, ServerMessage::Error { code: ErrorCode::VolumeInUse, .. }), "{held:?}");

    // The writer's lease ends: its host stops the workload and syncs once
    // more; the volume is free and its deletion removes its files.
    let id = renter.new_id();
    let ended = renter.request(ClientMessage::EndLease { id, lease: writer }).await.expect("answer");
    assert!(matches!(ended, ServerMessage::Ack { .. }), "{ended:?}");
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let id = renter.new_id();
        match renter.request(ClientMessage::DeleteVolume { id, name: "shared".into() }).await.expect("answer") {
            ServerMessage::Volume { volume, .. } => {
                assert_eq!(volume.state, VolumeState::Deleted);
                break;
            }
            other => assert!(Instant::now() < deadline, "still held: {other:?}"),
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let gone = volume_token(&mut renter, "shared").await.expect_err("no token for a deleted volume");
    assert!(matches!(gone, ServerMessage::Error { code: ErrorCode::UnknownVolume, .. }), "{gone:?}");
    let files = exchange_dir.join("job-store").join(shared.owner.0.to_string()).join("volumes").join(shared.volume.0.to_string());
    let deadline = Instant::now() + Duration::from_secs(30);
    while count_files(&files) > 0 {
        assert!(Instant::now() < deadline, "the deleted volume's files are still in the store");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

fn count_files(dir: &std::path::Path) -> usize {
    let Ok(entries) = std::fs::read_dir(dir) else { return 0 };
    entries.flatten().map(|e| if e.path().is_dir() { count_files(&e.path()) } else { 1 }).sum()
}

/// An agent restarted under a running workload re-adopts it and syncs its
/// volume again: what the workload writes after the restart reaches the
/// store when the lease ends.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restarted_agent_keeps_syncing_the_volume_of_the_workload_it_readopts() {
    let Some(socket) = socket() else { return };
    let dir = tempfile::tempdir().expect("temp dir");
    let operator = SigningKey::from_bytes(&[1; 32]);
    let exchange = Exchange::start(&dir.path().join("exchange"), &operator);
    let (config, host) = job_host(&dir.path().join("vol-e"), &exchange.url, &socket, "vol-e", H100_GPU, &[("spot", 2_100_000)]);
    let mut agent = spawn_agent(&config, &host);
    let mut renter = funded_renter(&exchange, &operator, 23, 1_000_000_000).await;
    let data = create_volume(&mut renter, "kept", 1).await;
    let lease = lease_with(&mut renter, &workload(false), vec![mount("kept", "/data", false)]).await.expect("a lease");
    let late =
        shell("echo early > /data/early.txt; while [ ! -f /data/go ]; do sleep 0.2; done; echo late > /data/late.txt; exec sleep 600");
    send_secrets(&mut renter, lease, workload(false), &late).await;
    await_delivery(&mut renter, lease, |s| matches!(s, DeliveryState::Running { .. })).await;

    // The agent dies and comes back; the workload runs on meanwhile.
    let _ = agent.0.kill();
    let _ = agent.0.wait();
    agent = spawn_agent(&config, &host);
    tokio::time::sleep(Duration::from_secs(4)).await;
    // The workload writes after the restart (told to through its folder on the host).
    let folder = dir.path().join("vol-e").join("leases").join("volumes").join(lease.0.to_string()).join(data.volume.0.to_string());
    assert!(folder.join("early.txt").exists(), "the volume's folder on the host: {}", folder.display());
    std::fs::write(folder.join("go"), "").expect("go");
    let deadline = Instant::now() + Duration::from_secs(20);
    while !folder.join("late.txt").exists() {
        assert!(Instant::now() < deadline, "the workload never wrote late.txt");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let id = renter.new_id();
    assert!(matches!(renter.request(ClientMessage::EndLease { id, lease }).await.expect("answer"), ServerMessage::Ack { .. }));
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let files = volume_files(&mut renter, &data).await;
        if files.iter().any(|(path, text)| path == "late.txt" && text == "late") {
            assert!(files.iter().any(|(path, _)| path == "early.txt"), "{files:?}");
            break;
        }
        assert!(Instant::now() < deadline, "the last sync after the restart never came: {files:?}");
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    drop(agent);
}

/// A host whose state disk cannot hold a lease's volumes (and its 1 GiB
/// reserve) fails the start before writing anything, as the host's fault:
/// the renter is told `host_error` and the lease ends unbilled. The host's
/// state folder is a tmpfs of 1 GiB and 4 MiB; the volume holds 6 MiB.
/// Mounting needs root (SKIPPED without, unless `GPUX_REQUIRE_MOUNT=1`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_volume_the_hosts_disk_cannot_hold_fails_the_start_as_the_hosts_fault() {
    let Some(socket) = socket() else { return };
    let dir = tempfile::tempdir().expect("temp dir");
    let state = dir.path().join("vol-f").join("leases");
    std::fs::create_dir_all(&state).expect("state dir");
    let mounted = std::process::Command::new("mount").args(["-t", "tmpfs", "-o", "size=1028m,mode=0700", "tmpfs"]).arg(&state).status();
    if !mounted.is_ok_and(|s| s.success()) {
        assert!(std::env::var_os("GPUX_REQUIRE_MOUNT").is_none(), "GPUX_REQUIRE_MOUNT=1 but a tmpfs could not be mounted");
        eprintln!("SKIPPED: mounting a tmpfs needs root");
        return;
    }
    struct Unmount(std::path::PathBuf);
    impl Drop for Unmount {
        fn drop(&mut self) {
            let _ = std::process::Command::new("umount").arg("-l").arg(&self.0).status();
        }
    }
    let _unmount = Unmount(state.clone());
    let operator = SigningKey::from_bytes(&[1; 32]);
    let exchange = Exchange::start(&dir.path().join("exchange"), &operator);
    let (config, host) = job_host(&dir.path().join("vol-f"), &exchange.url, &socket, "vol-f", H100_GPU, &[("spot", 2_100_000)]);
    let _agent = spawn_agent(&config, &host);
    let mut renter = funded_renter(&exchange, &operator, 24, 1_000_000_000).await;
    let big = create_volume(&mut renter, "big", 1).await;
    let (url, token) = volume_token(&mut renter, "big").await.expect("a token");
    let key = format!("{}/volumes/{}/blob.bin", big.owner.0, big.volume.0);
    let put = reqwest::Client::new().put(format!("{url}/v1/objects/{key}")).bearer_auth(&token).body(vec![7u8; 6 << 20]).send().await;
    assert!(put.expect("put").status().is_success());

    let lease = lease_with(&mut renter, &workload(false), vec![mount("big", "/data", false)]).await.expect("a lease");
    send_secrets(&mut renter, lease, workload(false), &shell("exec sleep 600")).await;
    let failed = await_delivery(&mut renter, lease, |s| matches!(s, DeliveryState::Failed { .. })).await;
    let DeliveryState::Failed { code, fault, .. } = failed else { unreachable!() };
    assert_eq!((code, fault), (FailureCode::HostError, Fault::Host), "the host's fault");
    let folder = state.join("volumes").join(lease.0.to_string()).join(big.volume.0.to_string());
    assert!(!folder.join("blob.bin").exists(), "nothing restored into a disk that cannot hold it");
    // The volume is let go with the lease, its files untouched.
    let deadline = Instant::now() + Duration::from_secs(30);
    while volume(&mut renter, "big").await.writer.is_some() {
        assert!(Instant::now() < deadline, "the failed lease still holds the volume");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert_eq!(volume_files(&mut renter, &big).await.len(), 1);
    let id = renter.new_id();
    let ServerMessage::RecentStatement { lines, .. } =
        renter.request(ClientMessage::RecentStatement { id, before: None }).await.expect("answer")
    else {
        panic!("a statement")
    };
    assert!(lines.iter().all(|line| line.kind != "usage_charge"), "nothing billed for a start the host failed: {lines:?}");
}
