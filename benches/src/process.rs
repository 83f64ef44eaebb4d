//! The release `gpux-exchange` binary as a child process for the probes
//! that measure it from outside (delivery-latency, job-latency,
//! connection-capacity), and the CPU time of a process's threads.

use std::path::Path;
use std::process::Stdio;

use gpux_test_exchange::Launch;
pub use gpux_test_exchange::Spawned;

/// CPU time of every thread of a process, in ns (Linux schedstat).
pub fn cpu_ns(pid: u32) -> u64 {
    let mut total = 0;
    for task in std::fs::read_dir(format!("/proc/{pid}/task")).expect("the process's threads").flatten() {
        if let Ok(text) = std::fs::read_to_string(task.path().join("schedstat")) {
            total += text.split_whitespace().next().and_then(|t| t.parse::<u64>().ok()).unwrap_or(0);
        }
    }
    total
}

/// The release `gpux-exchange` binary (beside this one, or
/// `GPUX_EXCHANGE_BIN`) on a free loopback port with `args` added, metrics
/// and console off, its log nowhere: the workspace's one harness
/// (`gpux-test-exchange`). Its lines before it listened are in `before`.
pub fn start_exchange(data_dir: &Path, args: &[&str]) -> Spawned {
    let launch = Launch { metrics: "off", stderr: Stdio::null(), ..Launch::new(args) };
    Spawned::launch(data_dir, launch)
}
