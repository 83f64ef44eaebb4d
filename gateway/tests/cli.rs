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
    let owner_only = |path: &std::path::Path, text: &str| {
        use std::os::unix::fs::PermissionsExt;
        std::fs::write(path, text).expect("write");
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600)).expect("chmod");
    };
    owner_only(&secret, "00ff");
    let empty = dir.path().join("empty.secret");
    owner_only(&empty, "\n");
    let exposed = dir.path().join("exposed.secret");
    std::fs::write(&exposed, "00ff").expect("write");
    let secret = secret.to_str().expect("utf-8");
    let missing = dir.path().join("missing.secret");
    let cases: Vec<(Vec<&str>, &str)> = vec![
        (vec!["--link-secret-file", secret], "--sequencer"),
        (vec!["--sequencer", "127.0.0.1:7390"], "--link-secret-file"),
        (vec!["--sequencer", "127.0.0.1:7390", "--link-secret-file", missing.to_str().expect("utf-8")], "missing.secret"),
        (vec!["--sequencer", "127.0.0.1:7390", "--link-secret-file", empty.to_str().expect("utf-8")], "is empty"),
        (vec!["--sequencer", "127.0.0.1:7390", "--link-secret-file", exposed.to_str().expect("utf-8")], "chmod 600"),
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
