//! The release `gpux-exchange` binary as a child process for the probes
//! that measure it from outside (delivery-latency, job-latency,
//! connection-capacity), and the CPU time of a process's threads.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

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

/// The exchange, killed when dropped.
pub struct ExchangeProcess {
    pub child: Child,
    pub url: String,
}

impl ExchangeProcess {
    /// Starts the binary beside this one (or `GPUX_EXCHANGE_BIN`) on a free
    /// loopback port with `args` added (metrics and console off); each line
    /// it prints before it listens is handed to `on_line`.
    pub fn start(data_dir: &Path, args: &[&str], mut on_line: impl FnMut(&str)) -> ExchangeProcess {
        let binary = std::env::var_os("GPUX_EXCHANGE_BIN")
            .map(PathBuf::from)
            .unwrap_or_else(|| std::env::current_exe().expect("own path").with_file_name("gpux-exchange"));
        assert!(binary.exists(), "{} missing: cargo build --release -p gpux-exchange", binary.display());
        let port = std::net::TcpListener::bind("127.0.0.1:0").expect("free port").local_addr().expect("addr").port();
        let mut child = Command::new(&binary)
            .args(["--data-dir", data_dir.to_str().expect("utf-8"), "--listen", &format!("127.0.0.1:{port}")])
            .args(["--metrics-listen", "off", "--console-listen", "off"])
            .args(args)
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("exchange starts");
        let mut lines = BufReader::new(child.stdout.take().expect("stdout")).lines();
        for line in lines.by_ref() {
            let line = line.expect("exchange output");
            on_line(&line);
            if line.contains("listening on") {
                break;
            }
        }
        // Keep draining its output so it never blocks on a full pipe.
        std::thread::spawn(move || for _ in lines {});
        ExchangeProcess { child, url: format!("ws://127.0.0.1:{port}") }
    }
}

impl Drop for ExchangeProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
