//! The one harness that starts a test exchange, for every test and bench
//! that needs one: in this process on a real socket and real redb files
//! ([`InProcess`], configured from [`config`]), or as the `gpux-exchange`
//! binary in a child process ([`Spawned`], found by [`binary`]), told where
//! it listens by the lines it prints.

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use ed25519_dalek::SigningKey;
use gpux_exchange::{ExchangeConfig, JobStoreConfig};

/// How long a test exchange may take to listen: a loaded 2-core machine
/// (CI) can be slow to start one.
pub const START_WITHIN: Duration = Duration::from_secs(30);

/// The tests' exchange: the demo listing, a free loopback port, no metrics,
/// console or links, a local job store on a free port with a 1 GiB quota,
/// the default fees, grace, challenges, account opening and disk reserve;
/// the operator's key (its public half) may deposit. Change what a test
/// needs before [`InProcess::start`].
pub fn config(data_dir: &Path, operator_public_key: [u8; 32]) -> ExchangeConfig {
    ExchangeConfig {
        data_dir: data_dir.to_path_buf(),
        listen: loopback(0),
        operator_keys: [operator_public_key].into_iter().collect(),
        listing: gpux_exchange::listing::Listing { config: gpux_engine::EngineConfig::demo(), cluster_rules: Vec::new() },
        limits: gpux_exchange::gateway::GatewayLimits::default(),
        metrics_listen: None,
        console_listen: None,
        rest_cors_origins: Vec::new(),
        link_listen: None,
        tls: None,
        link_tls: None,
        billing: gpux_exchange::sequencer::BillingPolicy {
            fee_bps: gpux_exchange::FEE_BPS_DEFAULT,
            grace_ms: gpux_exchange::BILLING_GRACE_MS_DEFAULT,
            late_window_ms: gpux_exchange::LATE_REPORT_WINDOW_MS_DEFAULT,
            storage_minor_per_gib_month: gpux_exchange::STORAGE_PRICE_DEFAULT,
        },
        clock_offset_ms: 0,
        challenge_interval_ms: gpux_exchange::sequencer::CHALLENGE_INTERVAL_MS_DEFAULT,
        on_listening: None,
        cluster: None,
        accounts: Default::default(),
        invoicing: Default::default(),
        job_store: Some(JobStoreConfig { store: "local".into(), listen: loopback(0), url: None, quota_bytes: 1 << 30 }),
        job_silence_ms: gpux_exchange::sequencer::JOB_SILENCE_MS_DEFAULT,
        disk_reserve_bytes: gpux_exchange::disk::DISK_RESERVE_BYTES_DEFAULT,
    }
}

/// `127.0.0.1:port` (0: the system picks one as the exchange binds).
pub fn loopback(port: u16) -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], port))
}

/// A port free now, for an exchange that must listen on the same address
/// again after a restart (a port the system picks is taken at bind).
pub fn free_port() -> u16 {
    std::net::TcpListener::bind(loopback(0)).and_then(|l| l.local_addr()).map(|a| a.port()).expect("a free port")
}

/// An exchange running on a thread of this process, stopped cleanly when
/// dropped (its files closed).
pub struct InProcess {
    /// `ws://` and the address it listens on.
    pub url: String,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<anyhow::Result<u64>>>,
}

impl InProcess {
    /// Starts it and waits until it listens (at most [`START_WITHIN`]).
    pub fn start(mut config: ExchangeConfig) -> InProcess {
        let (listening, url) = std::sync::mpsc::channel::<String>();
        let theirs = config.on_listening.take();
        config.on_listening = Some(Box::new(move |url: &str| {
            let _ = listening.send(url.to_string());
            if let Some(theirs) = theirs {
                theirs(url);
            }
        }));
        let (stop, stopped) = tokio::sync::oneshot::channel();
        let thread = std::thread::spawn(move || gpux_exchange::run_until(config, gpux_exchange::Stop::Channel(stopped)));
        let deadline = std::time::Instant::now() + START_WITHIN;
        while std::time::Instant::now() < deadline {
            if let Ok(url) = url.recv_timeout(Duration::from_millis(50)) {
                return InProcess { url, stop: Some(stop), thread: Some(thread) };
            }
            if thread.is_finished() {
                panic!("the exchange stopped before it served: {:?}", thread.join());
            }
        }
        panic!("the exchange did not start within {START_WITHIN:?}");
    }

    /// Stops it and waits until its files are closed: the state hash it
    /// stopped at, or why it had stopped already.
    pub fn stop(&mut self) -> anyhow::Result<u64> {
        drop(self.stop.take());
        match self.thread.take() {
            Some(thread) => thread.join().map_err(|_| anyhow::anyhow!("the exchange's thread panicked"))?,
            None => anyhow::bail!("stopped already"),
        }
    }
}

impl Drop for InProcess {
    fn drop(&mut self) {
        if self.thread.is_some() {
            let _ = self.stop();
        }
    }
}

/// The `gpux-exchange` binary: `GPUX_EXCHANGE_BIN`, else the one cargo
/// built beside the running test or bench (`target/<profile>/`).
pub fn binary() -> PathBuf {
    if let Some(path) = std::env::var_os("GPUX_EXCHANGE_BIN") {
        return PathBuf::from(path);
    }
    let me = std::env::current_exe().expect("own path");
    let dir = me.parent().expect("a directory");
    // Tests run from target/<profile>/deps/, binaries from target/<profile>/.
    let dir = if dir.file_name().is_some_and(|n| n == "deps") { dir.parent().expect("the profile's directory") } else { dir };
    let binary = dir.join("gpux-exchange");
    assert!(binary.exists(), "{} missing: cargo build -p gpux-exchange (or set GPUX_EXCHANGE_BIN)", binary.display());
    binary
}

/// The exchange as a child process, killed when dropped.
pub struct Spawned {
    pub child: Child,
    /// Where it listens for WebSocket clients (`host:port`).
    pub addr: String,
    /// The state hash it printed when it recovered, and the whole line.
    pub recovered_hash: String,
    pub recovered_line: String,
    /// Where it serves `GET /metrics`, the console and REST, and remote
    /// gateways' links (empty where it does not).
    pub metrics_addr: String,
    pub console_addr: String,
    pub link_addr: String,
    /// The lines it printed until it listened, and every line after.
    pub before: Vec<String>,
    pub output: Arc<Mutex<Vec<String>>>,
}

/// How to start a [`Spawned`] exchange beyond its data directory.
pub struct Launch<'a> {
    /// The command (the binary, or a shell that execs it), with its
    /// environment.
    pub command: Command,
    pub operator: Option<&'a SigningKey>,
    /// The WebSocket listener (`127.0.0.1:0`: a free port).
    pub listen: &'a str,
    /// `--metrics-listen` (`127.0.0.1:0` unless a test turns it off).
    pub metrics: &'a str,
    pub extra: &'a [&'a str],
    pub stderr: Stdio,
}

impl Launch<'_> {
    /// The binary from [`binary`], on a free port, metrics on a free port,
    /// stderr inherited.
    pub fn new<'a>(extra: &'a [&'a str]) -> Launch<'a> {
        Launch {
            command: Command::new(binary()),
            operator: None,
            listen: "127.0.0.1:0",
            metrics: "127.0.0.1:0",
            extra,
            stderr: Stdio::inherit(),
        }
    }
}

impl Spawned {
    /// Starts it on `data_dir` and reads its output until it listens; the
    /// console is off unless `--console-listen` is among the extra arguments.
    pub fn launch(data_dir: &Path, launch: Launch<'_>) -> Spawned {
        let Launch { mut command, operator, listen, metrics, extra, stderr } = launch;
        command.arg("--data-dir").arg(data_dir).arg("--listen").arg(listen).arg("--metrics-listen").arg(metrics);
        if !extra.contains(&"--console-listen") {
            command.arg("--console-listen").arg("off");
        }
        command.args(extra);
        if let Some(key) = operator {
            command.arg("--operator-key").arg(hex::encode(key.verifying_key().to_bytes()));
        }
        let mut child = command.stdout(Stdio::piped()).stderr(stderr).spawn().expect("gpux-exchange starts");
        let mut lines = BufReader::new(child.stdout.take().expect("stdout"));
        let (mut recovered_hash, mut recovered_line) = (String::new(), String::new());
        let (mut metrics_addr, mut console_addr, mut link_addr) = (String::new(), String::new(), String::new());
        let (mut addr, mut before) = (None, Vec::new());
        let mut line = String::new();
        while addr.is_none() && lines.read_line(&mut line).unwrap_or(0) > 0 {
            let trimmed = line.trim();
            before.push(trimmed.to_string());
            if let Some(hash) = trimmed.split("state hash ").nth(1) {
                recovered_hash = hash.to_string();
                recovered_line = trimmed.to_string();
            }
            if let Some(metrics) = trimmed.strip_prefix("gpux-exchange: metrics on http://") {
                metrics_addr = metrics.trim_end_matches("/metrics").to_string();
            }
            let console = trimmed.strip_prefix("gpux-exchange: web console on http://");
            if let Some(console) = console.or_else(|| trimmed.strip_prefix("gpux-exchange: web console on https://")) {
                console_addr = console.trim_end_matches('/').to_string();
            }
            if let Some(link) = trimmed.strip_prefix("gpux-exchange: links for gateways on ") {
                link_addr = link.split_whitespace().next().unwrap_or("").to_string();
            }
            addr = trimmed
                .strip_prefix("gpux-exchange: listening on ws://")
                .or_else(|| trimmed.strip_prefix("gpux-exchange: listening on wss://"))
                .map(str::to_string);
            line.clear();
        }
        let Some(addr) = addr else {
            let _ = child.kill();
            let _ = child.wait();
            panic!("exchange exited before listening");
        };
        // Keep draining stdout so the process never blocks on a full pipe.
        let output = Arc::new(Mutex::new(Vec::new()));
        let sink = output.clone();
        std::thread::spawn(move || {
            for line in lines.lines().map_while(Result::ok) {
                sink.lock().expect("output lock").push(line);
            }
        });
        Spawned { child, addr, recovered_hash, recovered_line, metrics_addr, console_addr, link_addr, before, output }
    }

    /// `ws://` and the address it listens on.
    pub fn url(&self) -> String {
        format!("ws://{}", self.addr)
    }

    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// SIGTERM and wait for a clean exit; returns the final state hash printed.
    pub fn terminate(&mut self) -> String {
        terminate(&mut self.child, &self.output)
    }
}

/// SIGTERM an exchange's process, wait for its clean exit, and the final
/// state hash it printed (among `output`, the lines read from its stdout).
pub fn terminate(child: &mut Child, output: &Mutex<Vec<String>>) -> String {
    let _ = Command::new("kill").arg("-TERM").arg(child.id().to_string()).status();
    let status = child.wait().expect("wait");
    assert!(status.success(), "clean shutdown: {status:?}");
    // The last lines are read off the pipe by the draining thread.
    std::thread::sleep(Duration::from_millis(100));
    let output = output.lock().expect("output lock");
    output
        .iter()
        .find_map(|line| line.strip_prefix("gpux-exchange: stopped, state hash ").map(str::to_string))
        .expect("the final state hash is printed")
}

impl Drop for Spawned {
    fn drop(&mut self) {
        self.kill();
    }
}
