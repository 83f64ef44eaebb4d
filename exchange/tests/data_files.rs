//! The data directory over the real binary (docs/operations.md "Files"):
//! created owner-only with owner-only data files, and a directory others may
//! write to is refused before anything is opened or served.

mod common;

use std::os::unix::fs::PermissionsExt;
use std::process::Command;

use common::*;

fn mode(path: &std::path::Path) -> u32 {
    std::fs::metadata(path).unwrap_or_else(|e| panic!("{}: {e}", path.display())).permissions().mode() & 0o777
}

/// Answers a ping: the exchange serves (and handles signals) by then.
async fn served(exchange: &Exchange) {
    let mut client = Client::connect(&exchange.addr).await;
    let id = client.id();
    assert!(matches!(client.request(gpux_protocol::ClientMessage::Ping { id }).await, gpux_protocol::ServerMessage::Pong { .. }));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_data_directory_and_its_files_are_owner_only() {
    let dir = tempfile::tempdir().expect("temp dir");
    let data = dir.path().join("data");
    let mut exchange = Exchange::start_with(&data, None, &[]);
    served(&exchange).await;
    exchange.terminate();
    assert_eq!(mode(&data), 0o700, "the data directory");
    for file in ["journal.redb", "snapshots.redb", "exchange.key"] {
        assert_eq!(mode(&data.join(file)), 0o600, "{file}");
    }
    // A file an older exchange left readable is made owner-only at the next start.
    std::fs::set_permissions(data.join("journal.redb"), std::fs::Permissions::from_mode(0o644)).expect("chmod");
    let mut exchange = Exchange::start_with(&data, None, &[]);
    served(&exchange).await;
    exchange.terminate();
    assert_eq!(mode(&data.join("journal.redb")), 0o600);
}

#[test]
fn a_data_directory_others_may_write_is_refused() {
    let dir = tempfile::tempdir().expect("temp dir");
    let data = dir.path().join("data");
    std::fs::create_dir(&data).expect("dir");
    std::fs::set_permissions(&data, std::fs::Permissions::from_mode(0o777)).expect("chmod");
    let output = Command::new(env!("CARGO_BIN_EXE_gpux-exchange"))
        .arg("--data-dir")
        .arg(&data)
        .args(["--listen", "127.0.0.1:0", "--metrics-listen", "off", "--console-listen", "off"])
        .output()
        .expect("runs");
    assert_eq!(output.status.code(), Some(1), "refused: {output:?}");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("may be written by others (mode 777)") && stderr.contains("chmod go-w"), "{stderr}");
    assert!(!data.join("journal.redb").exists(), "nothing was opened");
}
