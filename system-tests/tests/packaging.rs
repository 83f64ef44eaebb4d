//! The files in packaging/ stay true to this build: every program and flag
//! the systemd units and the image's entry points name is in that
//! program's `--help`; every binary the image copies is one the workspace
//! builds, from a package the image's `cargo build` names. (The Grafana
//! dashboard's metrics and labels are checked against the exchange's
//! registry in exchange/src/metrics.rs.) The image itself is not built here:
//! this machine has no registry access for its base images.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Command;

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// The build's binaries (target/debug), where `cargo test --workspace` puts them.
fn binary(name: &str) -> PathBuf {
    let exe = std::env::current_exe().expect("the test's path");
    let dir = exe.parent().and_then(Path::parent).expect("target/debug");
    let path = dir.join(name);
    assert!(path.exists(), "{name} is not built: run `cargo build --workspace` (scripts/test does)");
    path
}

fn help(program: &str) -> String {
    let output = Command::new(binary(program)).arg("--help").output().expect("the program runs");
    assert!(output.status.success(), "{program} --help");
    String::from_utf8(output.stdout).expect("utf-8")
}

/// `program --flag value ...` as named in a unit or an entry point.
fn check_command(words: &[String], what: &str) {
    let program = Path::new(&words[0]).file_name().and_then(|n| n.to_str()).expect("a program").to_string();
    let help = help(&program);
    for flag in words.iter().filter(|w| w.starts_with("--")) {
        let flag = flag.split('=').next().expect("a flag");
        assert!(help.contains(&format!("{flag} ")) || help.contains(&format!("{flag}\n")), "{what}: {program} has no {flag}");
    }
}

#[test]
fn the_systemd_units_run_programs_and_flags_this_build_has() {
    for unit in ["gpux-exchange.service", "gpux-agent.service"] {
        let text = std::fs::read_to_string(root().join("packaging/systemd").join(unit)).expect("the unit");
        let sections: BTreeSet<&str> = text.lines().filter(|l| l.starts_with('[')).collect();
        assert_eq!(sections, ["[Install]", "[Service]", "[Unit]"].into_iter().collect(), "{unit}");
        let exec = text.lines().find_map(|l| l.strip_prefix("ExecStart=")).expect("an ExecStart");
        let words: Vec<String> = exec.split_whitespace().map(str::to_string).collect();
        check_command(&words, unit);
        // Variables it expands come from its environment file.
        for variable in words.iter().filter_map(|w| w.strip_prefix("${").and_then(|w| w.strip_suffix('}'))) {
            assert!(text.contains("EnvironmentFile="), "{unit} expands ${{{variable}}} without an EnvironmentFile");
            assert!(text.contains(&format!("{variable}=")), "{unit} says how to set {variable}");
        }
    }
}

#[test]
fn the_image_copies_binaries_the_workspace_builds_and_runs_them_with_their_flags() {
    let text = std::fs::read_to_string(root().join("packaging/Dockerfile")).expect("the Dockerfile");
    let build = text.lines().find(|l| l.starts_with("RUN cargo build")).expect("a cargo build");
    let packages: BTreeSet<&str> = build.split_whitespace().skip_while(|w| *w != "-p").filter(|w| *w != "-p").collect();
    // Each binary and the package that builds it.
    let made_by = [
        ("gpux-exchange", "gpux-exchange"),
        ("gpux-gateway", "gpux-gateway"),
        ("gpux-agent", "gpux-supplier-agent"),
        ("gpux", "gpux-cli"),
        ("gpux-audit", "gpux-audit"),
        ("gpux-sim", "gpux-sim"),
        ("gpux-router", "gpux-router"),
    ];
    let mut copied = 0;
    for line in text.lines().filter(|l| l.starts_with("COPY --from=build /src/target/release/")) {
        let name = line.split_whitespace().nth(2).and_then(|p| p.rsplit('/').next()).expect("a binary");
        let package =
            made_by.iter().find(|(bin, _)| *bin == name).map(|(_, p)| *p).unwrap_or_else(|| panic!("{name} is no binary of the workspace"));
        assert!(packages.contains(package), "the image copies {name} but does not build {package}");
        binary(name);
        copied += 1;
    }
    assert!(copied >= 4, "the image copies the programs");
    for line in text.lines().filter_map(|l| l.strip_prefix("ENTRYPOINT ")) {
        let words: Vec<String> = serde_json::from_str(line).expect("an exec-form entry point");
        check_command(&words, "the image's entry point");
    }
}
