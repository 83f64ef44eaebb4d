//! docs/first-hour.md, docs/jobs.md's, docs/services.md's and
//! docs/storage.md's first hour, run as written: every `sh first-hour` (`sh
//! jobs-first-hour`, `sh services-first-hour`, `sh storage-first-hour`) block, in
//! order, in one bash session, with this build's programs on PATH and free
//! ports, in a fresh directory (also HOME). The guide starts an exchange and
//! an agent in the background and stops them itself; after a failing run,
//! the processes still working in its directory are stopped by pid.

use std::io::Read;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").and_then(|l| l.local_addr()).map(|a| a.port()).expect("a free port")
}

fn blocks(doc: &str, tag: &str) -> Vec<String> {
    doc.split(&format!("```sh {tag}\n")).skip(1).map(|block| block.split("```").next().expect("a closed block").to_string()).collect()
}

/// Processes whose working directory is `dir` or below it.
fn processes_in(dir: &Path) -> Vec<u32> {
    let Ok(entries) = std::fs::read_dir("/proc") else { return Vec::new() };
    entries
        .flatten()
        .filter_map(|entry| entry.file_name().to_str().and_then(|name| name.parse::<u32>().ok()))
        .filter(|pid| *pid != std::process::id())
        .filter(|pid| std::fs::read_link(format!("/proc/{pid}/cwd")).is_ok_and(|cwd| cwd.starts_with(dir)))
        .collect()
}

/// Runs the blocks of `doc` tagged `sh TAG`, in order, in one bash session
/// in a fresh directory (also HOME), with this build's programs on PATH and
/// free ports; returns what it printed (stdout, stderr), having checked it
/// succeeded within 300 s.
fn run_guide(doc: &str, tag: &str, blocks_min: usize) -> (String, String) {
    let doc = std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("../..").join(doc)).expect("the guide");
    let blocks = blocks(&doc, tag);
    assert!(blocks.len() >= blocks_min, "{tag}: {} blocks", blocks.len());
    let bin_dir = Path::new(env!("CARGO_BIN_EXE_gpux")).parent().expect("the build's directory").to_path_buf();
    for program in ["gpux-exchange", "gpux-agent", "gpux-audit", "gpux-router"] {
        assert!(
            bin_dir.join(program).exists(),
            "{program} is not built: run the workspace's tests (scripts/test) or `cargo build --workspace` first"
        );
    }
    let dir = tempfile::tempdir().expect("temp dir");
    let script = format!("set -euo pipefail\n{}", blocks.join("\n"));
    let (listen, metrics, console, web, router) = (free_port(), free_port(), free_port(), free_port(), free_port());
    let mut child = Command::new("bash")
        .arg("-c")
        .arg(&script)
        .current_dir(dir.path())
        .env("HOME", dir.path())
        .env("PATH", format!("{}:{}", bin_dir.display(), std::env::var("PATH").unwrap_or_default()))
        .env("GPUX_LISTEN", format!("127.0.0.1:{listen}"))
        .env("GPUX_URL", format!("ws://127.0.0.1:{listen}"))
        .env("GPUX_METRICS_LISTEN", format!("127.0.0.1:{metrics}"))
        .env("GPUX_CONSOLE_LISTEN", format!("127.0.0.1:{console}"))
        .env("GPUX_WEB_PORT", web.to_string())
        .env("GPUX_ROUTER_PORT", router.to_string())
        .env_remove("GPUX_KEY")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("bash runs");
    let (mut stdout, mut stderr) = (child.stdout.take().expect("stdout"), child.stderr.take().expect("stderr"));
    let out = std::thread::spawn(move || {
        let mut text = String::new();
        let _ = stdout.read_to_string(&mut text);
        text
    });
    let err = std::thread::spawn(move || {
        let mut text = String::new();
        let _ = stderr.read_to_string(&mut text);
        text
    });
    let deadline = Instant::now() + Duration::from_secs(300);
    let status = loop {
        if let Some(status) = child.try_wait().expect("wait") {
            break Some(status);
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            break None;
        }
        std::thread::sleep(Duration::from_millis(200));
    };
    let _ = child.wait();
    // Whatever the guide left running (it stops its own when it succeeds):
    // the processes whose working directory is the guide's.
    for pid in processes_in(dir.path()) {
        let _ = Command::new("kill").arg("-s").arg("TERM").arg(pid.to_string()).status();
    }
    let (out, err) = (out.join().expect("stdout"), err.join().expect("stderr"));
    let status = status.unwrap_or_else(|| panic!("the guide ran over 300 s\n--- stdout\n{out}\n--- stderr\n{err}"));
    assert!(status.success(), "the guide failed ({status})\n--- stdout\n{out}\n--- stderr\n{err}");
    (out, err)
}

#[test]
fn the_first_hour_guide_runs_as_written() {
    let (out, err) = run_guide("docs/first-hour.md", "first-hour", 5);
    for expected in [
        "H100-SXM-80G/SPOT",
        "logged in as account",
        "available $100.00",
        "filled 1 GPU(s) of H100-SXM-80G/SPOT at $2.00/GPU-h",
        "lease ended",
        "filled 1 GPU(s) of H100-SXM-80G/R/",
        "resting: the rest waits in the book",
        "gpux_leases_opened_total{kind=\"spot\"} 2",
        "gpux-audit: replayed",
        "unrated (under 10 GPU-hours)",
        "{\"supplier_score\":{",
        // Find and rent until stopped (issue 64).
        "/GPU-h x 1  NVIDIA H100 80GB HBM3",
        "leased: lease",
        "Directory listing",
        "leased GPUs: GPU-first-hour-0",
        "connect: no SSH",
        "publishes no port 22",
    ] {
        // gpux-audit's summary goes to stderr, the rest to stdout.
        assert!(
            out.contains(expected) || err.contains(expected),
            "{expected:?} missing from what the guide printed:\n{out}\n--- stderr\n{err}"
        );
    }
}

#[test]
fn the_jobs_guide_runs_as_written() {
    let (out, err) = run_guide("docs/jobs.md", "jobs-first-hour", 4);
    for expected in [
        "code: 2 file(s)",
        "framework: pytorch (requirements.txt:1 torch==2.4.0)",
        "image: pytorch 2.4 on cuda-12.4 (torch==2.4.0 pins 2.4)",
        "installed at start: einops>=0.7",
        "memory: 19 GiB per GPU at least",
        "* H100-SXM-80G/SPOT",
        "only 0 GPU(s) offered now",
        "plan: H100-SXM-80G/SPOT for $12.00 expected",
        "job 0 submitted: starting (attempt 1, lease 0: its hosts are starting it)",
        "job 0 first-job: running (attempt 1, lease 0)",
        "escrowed $12.00 of a budget of $15.00",
        "attempt 1 (retries 2, restarts on error 0 of 0)",
        "input samples at /data (read-only), from the job store",
        "     0  first-job                running (attempt 1, lease 0)",
        "training",
        "job 0 (cancelled): 0 file(s) into first-job-0",
        "GPUX-1-job0",
    ] {
        assert!(out.contains(expected), "{expected:?} missing from what the guide printed:\n{out}\n--- stderr\n{err}");
    }
}

#[test]
fn the_services_guide_runs_as_written() {
    let (out, err) = run_guide("docs/services.md", "services-first-hour", 4);
    for expected in [
        "the service's key: 64 hex digits",
        "service 1 (hello): running",
        "replica 0: ready lease 0 127.0.0.1:",
        "Directory listing",
        "without the key: 401",
        "service 1: keeps 0 replica(s) now",
        "service 1 deleted",
        "hello                    deleted",
        "router: the service is gone",
        "(service-1)",
        "signature verified with the exchange's key",
    ] {
        assert!(out.contains(expected), "{expected:?} missing from what the guide printed:\n{out}\n--- stderr\n{err}");
    }
}

#[test]
fn the_storage_guide_runs_as_written() {
    let (out, err) = run_guide("docs/storage.md", "storage-first-hour", 4);
    for expected in [
        "volume data (1 GiB) created",
        "1 file(s), 15 bytes into volume data",
        "inbox/hello.txt",
        "from my laptop",
        "result.txt",
        "2 file(s), 39 bytes",
        "1 file(s), 24 bytes from volume data",
        "written on the GPU host",
        "data  1 GiB  free  charged ",
        "volume data deleted",
    ] {
        assert!(out.contains(expected), "{expected:?} missing from what the guide printed:\n{out}\n--- stderr\n{err}");
    }
}
