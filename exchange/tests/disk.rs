//! The journal keeps its room (docs/operations.md "Disk space"), on a real
//! small file system: a tmpfs mounted for the test (it needs root; it says
//! SKIPPED without, unless `GPUX_REQUIRE_MOUNT=1`). The job store stops
//! before twice the journal's reserve, the exchange refuses new work with
//! `disk_low` once free space falls below the reserve while cancels still
//! pass, and it takes new work again by itself when space comes back.

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use common::*;
use gpux_engine::{GpuSet, HostId, Role, Side};
use gpux_protocol::*;
use sha2::{Digest, Sha256};

/// A tmpfs of `mib` MiB at `at`, unmounted when dropped.
struct Mounted(PathBuf);

impl Mounted {
    fn tmpfs(at: &Path, mib: u64) -> Option<Mounted> {
        std::fs::create_dir_all(at).expect("mount point");
        let status = Command::new("mount").args(["-t", "tmpfs", "-o", &format!("size={mib}m,mode=0700"), "tmpfs"]).arg(at).status();
        match status {
            Ok(status) if status.success() => Some(Mounted(at.to_path_buf())),
            _ => {
                assert!(std::env::var_os("GPUX_REQUIRE_MOUNT").is_none(), "GPUX_REQUIRE_MOUNT=1 but a tmpfs could not be mounted");
                eprintln!("SKIPPED: mounting a tmpfs needs root");
                None
            }
        }
    }
}

impl Drop for Mounted {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(&self.0).status();
    }
}

fn free_mib(dir: &Path) -> u64 {
    let stats = nix::sys::statvfs::statvfs(dir).expect("statvfs");
    (stats.blocks_available() as u64 * stats.fragment_size() as u64) >> 20
}

async fn bid(renter: &mut Client, client_order_id: u64) -> ServerMessage {
    renter.place(ticket(client_order_id, Side::Buy, 1_000_000, 1)).await
}

async fn wait_for(what: &str, mut check: impl AsyncFnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while !check().await {
        assert!(Instant::now() < deadline, "{what}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Issue 61: one renter's uploads filled a 24 MiB disk and, 1,327 orders
/// later, the journal hit ENOSPC and the exchange exited 70, orders
/// acknowledged to 0 bytes free.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_journal_keeps_its_reserve_new_work_stops_before_it_and_comes_back_by_itself() {
    let dir = tempfile::tempdir().expect("temp dir");
    let Some(_mounted) = Mounted::tmpfs(&dir.path().join("fs"), 64) else { return };
    let data = dir.path().join("fs").join("data");
    let mut exchange = Exchange::start_with(&data, Some(&key(1)), &["--disk-reserve-mib", "8"]);
    let (mut operator, _) = Client::login(&exchange.addr, &key(1), Role::Operator).await;
    let (mut renter, renter_account) = Client::login(&exchange.addr, &key(3), Role::Renter).await;
    let id = operator.id();
    let deposit = ClientMessage::Deposit { id, account: renter_account, amount_minor: 1_000_000_000 };
    assert!(matches!(operator.request(deposit).await, ServerMessage::Ack { .. }));
    let (mut supplier, _) = Client::login(&exchange.addr, &key(2), Role::Supplier).await;
    supplier.register_h100("disk-host", "GPU-disk-0").await;
    let mut ask = ticket(1, Side::Sell, 3_000_000, 1);
    ask.supply = Some(GpuSet { host: HostId(0), gpu_mask: 1 });
    assert!(matches!(supplier.place(ask).await, ServerMessage::Ack { .. }));

    // The job store fills up to twice the reserve, never past it.
    let id = renter.id();
    let (url, token) = match renter.request(ClientMessage::JobStoreToken { id, job: None, lease: None, volume: None }).await {
        ServerMessage::JobStoreToken { url, token, .. } => (url, token),
        other => panic!("{other:?}"),
    };
    let http = reqwest::Client::new();
    let mut refused = None;
    for seed in 0..32u8 {
        let body: Vec<u8> = (0..4 << 20).map(|i: u32| (i as u8).wrapping_mul(seed | 1)).collect();
        let key = format!("{}/inputs/{}.tar.gz", renter_account.0, hex::encode(Sha256::digest(&body)));
        let answer = http.put(format!("{url}/v1/objects/{key}")).bearer_auth(&token).body(body).send().await.expect("put");
        if answer.status() != 201 {
            refused = Some((answer.status().as_u16(), answer.text().await.unwrap_or_default()));
            break;
        }
    }
    let (status, text) = refused.expect("the store stops");
    assert_eq!((status, text.contains("disk_low")), (507, true), "{text}");
    let free = free_mib(&data);
    assert!(free >= 12, "the store left twice the reserve, less a part: {free} MiB free");
    let ServerMessage::Ack { order: Some(resting), .. } = bid(&mut renter, 10).await else { panic!("orders go on") };

    // Something else on the disk (logs, another program) eats into the reserve.
    let filler = dir.path().join("fs").join("filler");
    let take = (free_mib(&data) - 4) << 20;
    std::fs::write(&filler, vec![0u8; take as usize]).expect("filler");
    assert!(free_mib(&data) < 8);
    wait_for("new work is refused disk_low", async || {
        matches!(bid(&mut renter, 11).await, ServerMessage::Error { code: ErrorCode::DiskLow, .. })
    })
    .await;
    let id = renter.id();
    let cancelled = renter.request(ClientMessage::CancelOrder { id, order: resting }).await;
    assert!(matches!(cancelled, ServerMessage::Ack { .. }), "a cancel passes: {cancelled:?}");
    let mut stranger = Client::connect(&exchange.addr).await;
    let auth = stranger.auth_message(&key(9), Some(Role::Renter));
    stranger.send(&auth).await;
    let opened = stranger
        .recv_until(|m| match m {
            ServerMessage::Authenticated { .. } => Some(None),
            ServerMessage::Error { code, .. } => Some(Some(*code)),
            _ => None,
        })
        .await;
    assert_eq!(opened, Some(ErrorCode::DiskLow), "no account opens on a full disk");
    let metrics = scrape(&exchange.metrics_addr).await;
    assert_eq!(metric(&metrics, "gpux_disk_low"), 1.0);

    // Space comes back: new work is taken again, by itself.
    std::fs::remove_file(&filler).expect("freed");
    wait_for("new work is taken again", async || matches!(bid(&mut renter, 12).await, ServerMessage::Ack { .. })).await;
    let metrics = scrape(&exchange.metrics_addr).await;
    assert_eq!(metric(&metrics, "gpux_disk_low"), 0.0);
    assert!(metric(&metrics, "gpux_disk_low_refusals_total") >= 1.0);
    exchange.terminate();
}
