//! The `gpux-router` binary's bad input: each refused with a clear message
//! and its documented exit code (main.rs: 2 bad arguments, 1 a start that
//! failed), and nothing served. Having a test here also makes `cargo test
//! --workspace` build the binary the guides' tests run (clients/cli/tests/
//! first_hour.rs) before any test starts.

use std::path::Path;
use std::process::{Command, Output};

fn router(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_gpux-router")).args(args).output().expect("gpux-router runs")
}

fn key_file(dir: &Path, text: &str) -> String {
    let path = dir.join("router.key");
    gpux_protocol::secret_file::create(&path, text.as_bytes()).expect("the key file");
    path.display().to_string()
}

fn stderr(output: &Output) -> String {
    String::from_utf8_lossy(&output.stderr).into_owned()
}

#[test]
fn bad_arguments_exit_2_with_clap_s_message() {
    let missing = router(&["--key", "k"]);
    assert_eq!(missing.status.code(), Some(2), "{}", stderr(&missing));
    assert!(stderr(&missing).contains("--service"), "{}", stderr(&missing));

    let address = router(&["--key", "k", "--service", "1", "--listen", "not-an-address"]);
    assert_eq!(address.status.code(), Some(2), "{}", stderr(&address));
    assert!(stderr(&address).contains("--listen"), "{}", stderr(&address));

    let half_tls = router(&["--key", "k", "--service", "1", "--tls-cert", "cert.pem"]);
    assert_eq!(half_tls.status.code(), Some(2), "{}", stderr(&half_tls));
    assert!(stderr(&half_tls).contains("--tls-key"), "{}", stderr(&half_tls));
}

#[test]
fn a_missing_or_malformed_key_stops_the_start_with_exit_1() {
    let dir = tempfile::tempdir().expect("temp dir");
    let absent = dir.path().join("absent.key").display().to_string();
    let output = router(&["--key", &absent, "--service", "1", "--listen", "127.0.0.1:0"]);
    assert_eq!(output.status.code(), Some(1), "{}", stderr(&output));
    assert!(stderr(&output).contains("the key") && stderr(&output).contains("absent.key"), "{}", stderr(&output));

    let malformed = key_file(dir.path(), "not hex");
    let output = router(&["--key", &malformed, "--service", "1", "--listen", "127.0.0.1:0"]);
    assert_eq!(output.status.code(), Some(1), "{}", stderr(&output));
    assert!(stderr(&output).contains("64 hex digits"), "{}", stderr(&output));
}

#[test]
fn an_address_in_use_stops_the_start_with_exit_1() {
    let dir = tempfile::tempdir().expect("temp dir");
    let key = key_file(dir.path(), &"11".repeat(32));
    let taken = std::net::TcpListener::bind("127.0.0.1:0").expect("a port");
    let address = taken.local_addr().expect("its address").to_string();
    let output = router(&["--key", &key, "--service", "1", "--listen", &address, "--exchange", "ws://127.0.0.1:9"]);
    assert_eq!(output.status.code(), Some(1), "{}", stderr(&output));
    assert!(stderr(&output).contains(&address), "{}", stderr(&output));
}
