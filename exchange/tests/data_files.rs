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

/// The exchange run on the data directory `data` until it stops.
fn exchange_on(data: &std::path::Path) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_gpux-exchange"))
        .arg("--data-dir")
        .arg(data)
        .args(["--listen", "127.0.0.1:0", "--metrics-listen", "off", "--console-listen", "off"])
        .output()
        .expect("runs")
}

#[test]
fn a_data_directory_others_may_write_is_refused() {
    let dir = tempfile::tempdir().expect("temp dir");
    let data = dir.path().join("data");
    std::fs::create_dir(&data).expect("dir");
    std::fs::set_permissions(&data, std::fs::Permissions::from_mode(0o777)).expect("chmod");
    let output = exchange_on(&data);
    assert_eq!(output.status.code(), Some(1), "refused: {output:?}");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("may be written by others (mode 777)") && stderr.contains("chmod go-w"), "{stderr}");
    assert!(!data.join("journal.redb").exists(), "nothing was opened");
}

/// A journal of a newer format than this build's (docs/operations.md
/// "Formats and upgrades") stops the exchange before it reads or appends
/// anything, exit 1, naming both formats; the file keeps its format.
#[test]
fn a_journal_of_a_newer_format_is_refused_before_anything_is_read() {
    let dir = tempfile::tempdir().expect("temp dir");
    let data = dir.path().join("data");
    std::fs::create_dir(&data).expect("dir");
    std::fs::set_permissions(&data, std::fs::Permissions::from_mode(0o700)).expect("chmod");
    let journal = data.join("journal.redb");
    drop(gpux_journal::Journal::open(&journal).expect("a journal"));
    let newer = gpux_journal::FORMAT_VERSION + 1;
    {
        let db = redb::Database::open(&journal).expect("opens");
        let write = db.begin_write().expect("write");
        {
            let meta: redb::TableDefinition<&str, &[u8]> = redb::TableDefinition::new("journal_meta");
            write.open_table(meta).expect("meta").insert("format_version", newer.to_le_bytes().as_slice()).expect("insert");
        }
        write.commit().expect("commit");
    }
    std::fs::set_permissions(&journal, std::fs::Permissions::from_mode(0o600)).expect("chmod");
    let output = exchange_on(&data);
    assert_eq!(output.status.code(), Some(1), "refused: {output:?}");
    let stderr = String::from_utf8_lossy(&output.stderr);
    let expected = format!("written in format {newer} by a newer gpux (this build reads formats up to {})", gpux_journal::FORMAT_VERSION);
    assert!(stderr.contains(&expected), "{stderr}");
    // Still the newer build's: nothing rewrote its format.
    let db = redb::ReadOnlyDatabase::open(&journal).expect("opens read-only");
    let read = redb::ReadableDatabase::begin_read(&db).expect("read");
    let meta: redb::TableDefinition<&str, &[u8]> = redb::TableDefinition::new("journal_meta");
    let format = read.open_table(meta).expect("meta").get("format_version").expect("reads").map(|v| v.value().to_vec());
    assert_eq!(format, Some(newer.to_le_bytes().to_vec()), "the format is the newer build's still");
}
