//! `gpux-gateway`'s command line: every mistake is refused before it
//! serves, with a message that says what to fix.

use std::process::Command;

fn run(args: &[&str]) -> (i32, String) {
    let output = Command::new(env!("CARGO_BIN_EXE_gpux-gateway")).args(args).output().expect("gpux-gateway runs");
    (output.status.code().unwrap_or(-1), String::from_utf8_lossy(&output.stderr).to_string())
}

#[test]
fn bad_flags_are_refused_with_what_to_fix() {
    let dir = tempfile::tempdir().expect("temp dir");
    let secret = dir.path().join("link.secret");
    std::fs::write(&secret, "00ff").expect("write");
    let empty = dir.path().join("empty.secret");
    std::fs::write(&empty, "\n").expect("write");
    let secret = secret.to_str().expect("utf-8");
    let missing = dir.path().join("missing.secret");
    let cases: Vec<(Vec<&str>, &str)> = vec![
        (vec!["--link-secret-file", secret], "--sequencer"),
        (vec!["--sequencer", "127.0.0.1:7390"], "--link-secret-file"),
        (vec!["--sequencer", "127.0.0.1:7390", "--link-secret-file", missing.to_str().expect("utf-8")], "missing.secret"),
        (vec!["--sequencer", "127.0.0.1:7390", "--link-secret-file", empty.to_str().expect("utf-8")], "is empty"),
        (vec!["--sequencer", "127.0.0.1:7390", "--link-secret-file", secret, "--listen", "0.0.0.0:7301"], "--tls-cert and --tls-key"),
        (vec!["--sequencer", "127.0.0.1:7390", "--link-secret-file", secret, "--listen", "nowhere"], "invalid socket address"),
        (vec!["--sequencer", "127.0.0.1:7390", "--link-secret-file", secret, "--connections-max", "0"], "at least 1"),
    ];
    for (args, needle) in cases {
        let (code, stderr) = run(&args);
        assert_ne!(code, 0, "{args:?} is refused");
        assert!(stderr.contains(needle), "{args:?}: {stderr}");
    }
}
