//! The listing file over the real binary: a new journal starts with the
//! operator's listing (its genesis entry), a changed file is journaled as
//! a `ChangeListing` that replays exactly, and a file the journal's listing
//! cannot take (a class removed, another currency, a broken file) stops the
//! exchange before it serves, with the file, line and field, and writes nothing.

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;

use common::*;
use gpux_protocol::{ClientMessage, ServerMessage};

const DEMO: &str = gpux_exchange::listing::DEMO;

const ASCEND_CLASS: &str = r#"
[[class]]
name = "910B-64G"
vendor = "huawei"
models = ["Ascend 910B*"]
memory_mib_min = 60000
fabric_required = true
calendar = { hourly_windows_ahead = 6, daily_windows_ahead = 2, trading_stop_before_start_ms = 900000 }
"#;

const MLU_CLASS: &str = r#"
[[class]]
name = "MLU370-48G"
vendor = "cambricon"
models = ["Cambricon MLU370*"]
memory_mib_min = 48000
no_challenge = true
"#;

fn write(dir: &Path, name: &str, text: &str) -> PathBuf {
    let path = dir.join(name);
    std::fs::write(&path, text).expect("write listing");
    path
}

/// The demo listing at 99.9% with a steeper credit schedule, plus an Ascend class.
fn listing_a() -> String {
    let tiers = "sla_credit_tiers = [\n    { availability_below_bps = 9990, credit_bps = 1000 },\n    { availability_below_bps = 9900, credit_bps = 3000 },\n    { availability_below_bps = 9500, credit_bps = 10000 },\n]";
    let start = DEMO.find("sla_credit_tiers = [").expect("tiers");
    let end = start + DEMO[start..].find("]\n").expect("tiers end") + 1;
    let text =
        format!("{}{tiers}{}", &DEMO[..start], &DEMO[end..]).replacen("sla_availability_bps = 9900", "sla_availability_bps = 9990", 1);
    format!("{text}{ASCEND_CLASS}")
}

async fn symbols(addr: &str) -> Vec<String> {
    let mut client = Client::connect(addr).await;
    let id = client.id();
    match client.request(ClientMessage::Instruments { id }).await {
        ServerMessage::Instruments { instruments, .. } => instruments.into_iter().map(|i| i.symbol).collect(),
        other => panic!("expected instruments, got {other:?}"),
    }
}

/// The classes' cluster terms the exchange at `addr` lists.
async fn cluster_rules(addr: &str) -> Vec<gpux_engine::ClusterRule> {
    let mut client = Client::connect(addr).await;
    let id = client.id();
    match client.request(ClientMessage::Listing { id }).await {
        ServerMessage::Listing { cluster_rules, .. } => cluster_rules,
        other => panic!("expected listing, got {other:?}"),
    }
}

/// Runs the exchange expecting it to refuse to start; returns its stderr.
fn refused(data_dir: &Path, listing: &Path) -> String {
    let output = Command::new(env!("CARGO_BIN_EXE_gpux-exchange"))
        .arg("--data-dir")
        .arg(data_dir)
        .args(["--listen", "127.0.0.1:0", "--metrics-listen", "off", "--console-listen", "off", "--listing"])
        .arg(listing)
        .output()
        .expect("runs");
    assert!(!output.status.success(), "the exchange started");
    String::from_utf8_lossy(&output.stderr).into_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_listing_file_starts_the_journal_its_changes_are_journaled_and_replay_exactly() {
    let dir = tempfile::tempdir().expect("temp dir");
    let data = dir.path().join("data");
    let a = write(dir.path(), "a.toml", &listing_a());
    let a_arg = a.to_str().expect("utf-8 path");

    let mut exchange = Exchange::start_with(&data, None, &["--listing", a_arg]);
    let listed = symbols(&exchange.addr).await;
    assert!(listed.iter().any(|s| s == "910B-64G/SPOT") && listed.iter().any(|s| s == "910B-64G/PREEMPT"), "{listed:?}");
    assert!(listed.iter().any(|s| s.starts_with("910B-64G/R/")), "its calendar lists windows: {listed:?}");
    let hash_a = exchange.terminate();

    // The same file again: nothing to change, the journal replays to the same state.
    let mut exchange = Exchange::start_with(&data, None, &["--listing", a_arg]);
    assert_eq!(exchange.recovered_hash, hash_a, "{}", exchange.recovered_line);
    assert_eq!(cluster_rules(&exchange.addr).await, Vec::new(), "listing a names no cluster terms");
    exchange.terminate();

    // A class appended, the fee raised and the H100 class's cluster bids
    // held to 200 Gb/s hosts: a ChangeListing and a SetClusterRules, journaled.
    let b_text = format!("{}{MLU_CLASS}", listing_a()).replacen("fee_bps = 250", "fee_bps = 300", 1).replacen(
        "fabric_required = true\n",
        "fabric_required = true\ncluster_min_fabric_gbps = 200\n",
        1,
    );
    let b = write(dir.path(), "b.toml", &b_text);
    let b_arg = b.to_str().expect("utf-8 path");
    let mut exchange = Exchange::start_with(&data, None, &["--listing", b_arg]);
    let listed = symbols(&exchange.addr).await;
    assert!(listed.iter().any(|s| s == "MLU370-48G/SPOT"), "{listed:?}");
    let rule = gpux_engine::ClusterRule { class: "H100-SXM-80G".into(), min_fabric_gbps: 200 };
    assert_eq!(cluster_rules(&exchange.addr).await, std::slice::from_ref(&rule));
    let hash_b = exchange.terminate();
    assert_ne!(hash_a, hash_b);
    let mut exchange = Exchange::start_with(&data, None, &["--listing", b_arg]);
    assert_eq!(exchange.recovered_hash, hash_b, "the change replays: {}", exchange.recovered_line);
    assert_eq!(cluster_rules(&exchange.addr).await, [rule], "the terms replay");
    exchange.terminate();

    // What the journal's listing cannot take stops the exchange before it serves.
    let stderr = refused(&data, &a);
    assert!(stderr.contains("class MLU370-48G is in the journal's listing"), "{stderr}");
    let cny = write(dir.path(), "cny.toml", &b_text.replacen("currency = \"USD\"", "currency = \"CNY\"", 1));
    let stderr = refused(&data, &cny);
    assert!(stderr.contains("the currency is fixed when the journal starts (USD)"), "{stderr}");
    let moved = write(dir.path(), "moved.toml", &b_text.replacen("models = [\"Ascend 910B*\"]", "models = [\"Ascend 910*\"]", 1));
    let stderr = refused(&data, &moved);
    assert!(stderr.contains("class 910B-64G: its requirement"), "{stderr}");
    let broken = write(dir.path(), "broken.toml", &b_text.replacen("memory_mib_min = 48000", "memory_mib_min = -1", 1));
    let stderr = refused(&data, &broken);
    let line = b_text.lines().position(|l| l == "memory_mib_min = 48000").expect("line") + 1;
    assert!(stderr.contains(&format!("broken.toml:{line}: memory_mib_min:")), "{stderr}");

    // None of those wrote anything: the journal still replays to the same state.
    let mut exchange = Exchange::start_with(&data, None, &["--listing", b_arg]);
    assert_eq!(exchange.recovered_hash, hash_b, "{}", exchange.recovered_line);
    assert!(!symbols(&exchange.addr).await.is_empty(), "serving before it is stopped");
    exchange.terminate();
}

/// A journal written before listing files (no genesis entry) keeps the demo
/// listing it was written under: started without --listing, nothing changes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_a_listing_file_the_exchange_lists_the_demo_listing() {
    let dir = tempfile::tempdir().expect("temp dir");
    let mut exchange = Exchange::start(dir.path(), None);
    let listed = symbols(&exchange.addr).await;
    for class in ["H100-SXM-80G", "A100-80G", "RTX4090-24G", "MI300X-192G", "H100-1g.10gb"] {
        assert!(listed.iter().any(|s| s == &format!("{class}/SPOT")), "{class}: {listed:?}");
    }
    assert!(!listed.iter().any(|s| s.starts_with("910B")));
    let hash = exchange.terminate();
    let mut exchange = Exchange::start(dir.path(), None);
    assert_eq!(exchange.recovered_hash, hash);
    // Serving (its signal handlers installed) before it is stopped.
    assert!(!symbols(&exchange.addr).await.is_empty());
    exchange.terminate();
}

/// An exchange whose listing is in CNY (fen, two decimals) counts every
/// amount in fen from its genesis, and its statement says so.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cny_exchange_counts_in_fen_and_its_statement_says_cny() {
    let dir = tempfile::tempdir().expect("temp dir");
    let data = dir.path().join("data");
    let cny = DEMO
        .replacen("currency = \"USD\"", "currency = \"CNY\"", 1)
        .replacen("decimals = 6\n", "decimals = 2\n", 1)
        .replacen("tick_minor = 1000 ", "tick_minor = 1 ", 1)
        .replacen("price_min_minor_per_gpu_hour = 1000\n", "price_min_minor_per_gpu_hour = 1\n", 1)
        .replacen("price_max_minor_per_gpu_hour = 100000000 ", "price_max_minor_per_gpu_hour = 10000000 ", 1);
    let listing = write(dir.path(), "cny.toml", &format!("{cny}{ASCEND_CLASS}"));
    let mut exchange = Exchange::start_with(&data, Some(&key(1)), &["--listing", listing.to_str().expect("utf-8 path")]);
    let (mut operator, _) = Client::login(&exchange.addr, &key(1), gpux_engine::Role::Operator).await;
    let (_renter, renter) = Client::login(&exchange.addr, &key(3), gpux_engine::Role::Renter).await;
    let id = operator.id();
    let deposit = operator.request(ClientMessage::Deposit { id, account: renter, amount_minor: 150_505 }).await;
    assert!(matches!(deposit, ServerMessage::Ack { .. }), "{deposit:?}");
    exchange.terminate();

    let output = Command::new(env!("CARGO_BIN_EXE_gpux-exchange"))
        .arg("--data-dir")
        .arg(&data)
        .args(["statement", "--account", &renter.0.to_string()])
        .output()
        .expect("statement runs");
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
    let csv = String::from_utf8(output.stdout).expect("utf-8");
    assert!(csv.starts_with("transfer,at_ms,from,to,amount_minor,lease,amount,currency,at,kind,description\n"), "{csv}");
    assert!(csv.contains(",150505,,1505.05,CNY,"), "{csv}");
    assert!(csv.contains(",deposit,\"deposit\"\n"), "each line says what it was: {csv}");

    // An account nothing moved for is an error, not an empty file.
    let output = Command::new(env!("CARGO_BIN_EXE_gpux-exchange"))
        .arg("--data-dir")
        .arg(&data)
        .args(["statement", "--account", "4000"])
        .output()
        .expect("statement runs");
    assert_eq!(output.status.code(), Some(1));
    assert!(output.stdout.is_empty(), "no header for nothing");
    assert!(String::from_utf8_lossy(&output.stderr).contains("no transfer involves account 4000"), "{output:?}");
}
