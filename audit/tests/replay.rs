//! The audit replay binary, run for real: the demo replays, its printed
//! command stream replays to byte-identical events, and bad input stops the
//! replay with the offending line number and a non-zero exit.

use std::io::Write;
use std::process::{Command, Stdio};

fn audit(args: &[&str], stdin: &str) -> (i32, String, String) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_gpux-audit"))
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("gpux-audit runs");
    child.stdin.take().expect("stdin").write_all(stdin.as_bytes()).expect("write stdin");
    let output = child.wait_with_output().expect("gpux-audit finishes");
    (output.status.code().unwrap_or(-1), String::from_utf8(output.stdout).expect("utf-8"), String::from_utf8(output.stderr).expect("utf-8"))
}

#[test]
fn the_demo_session_trades_preempts_resells_and_delivers() {
    let (code, events, _) = audit(&["--demo"], "");
    assert_eq!(code, 0);
    let types: Vec<String> = events
        .lines()
        .map(|line| {
            let event: serde_json::Value = serde_json::from_str(line).expect("each line is JSON");
            // An event names its type in `kind`; an archived lease is `{"lease_archived": ..}`.
            let kind = event.get("kind").unwrap_or(&event);
            kind.as_object().and_then(|kind| kind.keys().next().cloned()).expect("the line names its type")
        })
        .collect();
    for expected in [
        "trade",
        "lease_created",
        "preemption_notice",
        "contract_transferred",
        "rejected",
        "instrument_expired",
        "lease_archived",
        "contract_archived",
        "instrument_archived",
        "stop_armed",
        "stop_triggered",
    ] {
        assert!(types.iter().any(|t| t == expected), "the demo shows {expected}");
    }
    // The A100 book at the end: the budget bid spent its money, the
    // all-or-none bid filled whole at the asks' prices, the stop filled last.
    let a100_trades: Vec<(u64, u64)> = events
        .lines()
        .filter_map(|line| {
            let event: serde_json::Value = serde_json::from_str(line).ok()?;
            let trade = event.get("kind")?.get("trade")?;
            (trade["instrument"] == 2)
                .then(|| (trade["price_minor_per_gpu_hour"].as_u64().expect("a price"), trade["quantity"].as_u64().expect("a quantity")))
        })
        .collect();
    assert_eq!(a100_trades, [(1_200_000, 2), (1_300_000, 1), (1_300_000, 1), (1_500_000, 2), (1_600_000, 1)]);
    assert!(events.contains("\"budget_spent\""), "the budget bid closes budget_spent");
}

#[test]
fn a_printed_command_stream_replays_to_the_same_events() {
    let (_, commands, _) = audit(&["--print-demo-commands"], "");
    let (_, from_demo, demo_summary) = audit(&["--demo"], "");
    let (code, from_stdin, stdin_summary) = audit(&[], &commands);
    assert_eq!(code, 0);
    assert_eq!(from_demo, from_stdin);
    assert_eq!(demo_summary, stdin_summary, "same command count, event count and state hash");
}

#[test]
fn rejected_events_carry_their_code_and_message() {
    let (_, events, _) = audit(&["--demo"], "");
    let rejected: serde_json::Value =
        serde_json::from_str(events.lines().find(|l| l.contains("\"rejected\"")).expect("a rejection")).expect("JSON");
    assert_eq!(rejected["kind"]["rejected"]["code"], "price_off_tick");
    assert!(rejected["kind"]["rejected"]["message"].as_str().is_some_and(|m| m.contains("tick")));
}

#[test]
fn a_malformed_line_stops_the_replay_with_its_line_number() {
    let good = r#"{"at_ms":1,"command":{"open_account":{"role":"renter"}}}"#;
    for bad in ["{not json", r#"{"at_ms":"soon","command":"tick"}"#, r#"{"at_ms":2,"command":{"launch_rocket":{}}}"#] {
        let (code, _, stderr) = audit(&[], &format!("{good}\n{bad}\n"));
        assert_eq!(code, 2, "{bad}");
        assert!(stderr.contains("line 2"), "{stderr}");
    }
}

#[test]
fn an_oversized_line_is_refused() {
    let (code, _, stderr) = audit(&[], &"x".repeat(70_000));
    assert_eq!(code, 2);
    assert!(stderr.contains("longer than"), "{stderr}");
}

/// The exchange's own journal replays through the audit tool to the state
/// hash the exchange printed when it stopped.
#[test]
fn an_exchange_journal_replays_to_the_exchanges_final_state() {
    let dir = tempfile::tempdir().expect("temp dir");
    let journal = dir.path().join("journal.redb");
    let inputs = demo_inputs();
    {
        let mut store = gpux_journal::Journal::open(&journal).expect("journal");
        let entries: Vec<_> = inputs.iter().cloned().map(gpux_journal::JournalEntry::Engine).collect();
        store.append(&entries).expect("append");
    }
    let (code, from_journal, journal_summary) = audit(&["--journal", journal.to_str().expect("utf-8")], "");
    assert_eq!(code, 0, "{journal_summary}");
    let (_, from_demo, demo_summary) = audit(&["--demo"], "");
    assert_eq!(from_journal, from_demo);
    assert_eq!(journal_summary, demo_summary);
    let (_, commands, _) = audit(&["--journal", journal.to_str().expect("utf-8"), "--commands-only"], "");
    assert_eq!(commands.lines().count(), inputs.len());
}

/// A journal holding a renter's sealed workloads: the audit trail shows every
/// delivery record, and neither the env value nor the SSH key appears in
/// clear (nor as the hex of their bytes) in anything the tool prints.
#[test]
fn audit_output_never_holds_a_workloads_secrets_in_clear() {
    use gpux_journal::{Journal, JournalEntry};
    use gpux_protocol::delivery::EncryptionKey;
    use gpux_protocol::{Secrets, Workload};
    const ENV_VALUE: &str = "hf_audit_secret_0c9a";
    const SSH_KEY: &str = "AAAAC3NzaC1lZDI1NTE5AAAAIAuditSecretKey";

    let host = EncryptionKey::from_bytes([5; 32]);
    let secrets = Secrets {
        command: vec!["/bin/sh".into()],
        args: vec!["-c".into(), format!("echo {ENV_VALUE}")],
        env: vec![("HF_TOKEN".into(), ENV_VALUE.into())],
        ssh_keys: vec![format!("ssh-ed25519 {SSH_KEY} renter@laptop")],
        ..Secrets::default()
    };
    let workload =
        Workload { ports: vec![22, 8888], sealed: Some(secrets.seal(&host.public())), ..Workload::image("docker.io/library/python:3.12") };
    let dir = tempfile::tempdir().expect("temp dir");
    let journal = dir.path().join("journal.redb");
    let mut entries: Vec<JournalEntry> = demo_inputs().into_iter().map(JournalEntry::Engine).collect();
    let account = gpux_engine::AccountId(1);
    entries.push(JournalEntry::BidWorkload { account, client_order_id: 7, workload: Box::new(workload.clone()) });
    entries.push(JournalEntry::LeaseWorkload { account, lease: gpux_engine::LeaseId(0), workload: Box::new(workload) });
    Journal::open(&journal).expect("journal").append(&entries).expect("append");

    let path = journal.to_str().expect("utf-8");
    let (code, events, summary) = audit(&["--journal", path], "");
    assert_eq!(code, 0, "{summary}");
    assert_eq!(events.matches("\"LeaseWorkload\"").count(), 1, "the delivery records are in the audit trail");
    let (_, commands, _) = audit(&["--journal", path, "--commands-only"], "");
    for output in [events, summary, commands] {
        for needle in [ENV_VALUE, SSH_KEY] {
            assert!(!output.contains(needle), "{needle} in clear");
            assert!(!output.contains(&hex(needle)), "{needle} as hex");
        }
    }
}

fn hex(text: &str) -> String {
    text.bytes().map(|b| format!("{b:02x}")).collect()
}

fn demo_inputs() -> Vec<gpux_engine::Input> {
    let (_, commands, _) = audit(&["--print-demo-commands"], "");
    commands.lines().map(|line| serde_json::from_str(line).expect("a command")).collect()
}

/// `gpux-audit --demo | head -1`: the reader leaving early is not a failure.
#[test]
fn a_reader_that_stops_early_is_not_an_error() {
    use std::io::{BufRead, BufReader};
    let mut child = Command::new(env!("CARGO_BIN_EXE_gpux-audit"))
        .arg("--demo")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("gpux-audit runs");
    let mut first = String::new();
    BufReader::new(child.stdout.take().expect("stdout")).read_line(&mut first).expect("a line");
    // The pipe's reading end is closed here, as `head` closes it.
    let output = child.wait_with_output().expect("gpux-audit finishes");
    assert!(first.starts_with('{'), "{first}");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(0), "{stderr}");
    // The replay may finish into the pipe's buffer first (its summary line is
    // then all it says); it never reports the closed pipe as an error.
    assert!(!stderr.contains("Broken pipe") && !stderr.contains("rror"), "{stderr}");
}

/// An audit opens its input read-only: the journal file is byte for byte
/// the same afterwards, and a file without write permission is read.
#[test]
fn the_journal_is_read_without_being_changed() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().expect("temp dir");
    let journal = dir.path().join("journal.redb");
    {
        let mut store = gpux_journal::Journal::open(&journal).expect("journal");
        let entries: Vec<_> = demo_inputs().into_iter().map(gpux_journal::JournalEntry::Engine).collect();
        store.append(&entries).expect("append");
    }
    std::fs::set_permissions(&journal, std::fs::Permissions::from_mode(0o444)).expect("read-only");
    let before = std::fs::read(&journal).expect("bytes");
    let (code, events, summary) = audit(&["--journal", journal.to_str().expect("utf-8")], "");
    assert_eq!(code, 0, "{summary}");
    assert!(!events.is_empty());
    let (code, _, summary) = audit(&["--journal", journal.to_str().expect("utf-8"), "--commands-only"], "");
    assert_eq!(code, 0, "{summary}");
    assert!(std::fs::read(&journal).expect("bytes") == before, "the journal was changed by reading it");
}
