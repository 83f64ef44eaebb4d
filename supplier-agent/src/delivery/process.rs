//! The `process` delivery backend: the workload's command runs as a process
//! of its own session on the host, with `CUDA_VISIBLE_DEVICES` (NVIDIA) and
//! `HIP_VISIBLE_DEVICES` (AMD) set to the leased GPUs. For bare hosts and
//! tests; the image is not used, so the renter's secret part must name the
//! command. Output goes to `<scratch>/<lease>/output.log`, the pid to
//! `<scratch>/<lease>/pid`, so a restarted agent finds its processes again
//! (it can then see whether they run, not their exit codes).

use std::path::PathBuf;
use std::time::Duration;

use gpux_engine::LeaseId;
use gpux_protocol::{Endpoint, FailureCode};
use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use tokio::sync::Mutex;

use super::{DeliveryBackend, Failure, Found, Launch, Poll, Progress};

pub struct ProcessBackend {
    scratch: PathBuf,
    public_address: String,
    /// Children this agent started (exit codes are known for these only).
    children: Mutex<std::collections::BTreeMap<LeaseId, tokio::process::Child>>,
}

impl ProcessBackend {
    pub fn new(scratch: PathBuf, public_address: String) -> Self {
        ProcessBackend { scratch, public_address, children: Mutex::new(Default::default()) }
    }

    fn dir(&self, lease: LeaseId) -> PathBuf {
        self.scratch.join(lease.0.to_string())
    }

    /// The workload's pid from its pid file. Never 0 or 1 (nor negative):
    /// its negation is a process group to signal, and `kill(-1)` would
    /// signal every process the agent may.
    fn pid(&self, lease: LeaseId) -> Option<Pid> {
        let text = std::fs::read_to_string(self.dir(lease).join("pid")).ok()?;
        let pid: i32 = text.trim().parse().ok()?;
        (pid > 1).then(|| Pid::from_raw(pid))
    }

    /// The UUIDs of the GPUs its workload was given.
    fn gpus(&self, lease: LeaseId) -> Vec<String> {
        std::fs::read_to_string(self.dir(lease).join("gpus"))
            .map(|text| text.split(',').filter(|u| !u.is_empty()).map(String::from).collect())
            .unwrap_or_default()
    }
}

fn alive(pid: Pid) -> bool {
    kill(pid, None).is_ok()
}

#[async_trait::async_trait]
impl DeliveryBackend for ProcessBackend {
    fn name(&self) -> &'static str {
        "process"
    }

    /// A command beside the workload: in its directory, with its GPUs
    /// (`CUDA_VISIBLE_DEVICES`, `GPUX_GPUS`, `GPUX_LEASE`; not its sealed
    /// environment, which the host keeps only in the workload), killed past
    /// `timeout`.
    async fn exec(&self, lease: LeaseId, command: &[String], timeout: std::time::Duration) -> gpux_protocol::delivery::ExecOutcome {
        use gpux_protocol::delivery::ExecOutcome;
        if !self.pid(lease).is_some_and(alive) {
            return ExecOutcome::refused("the workload is not running");
        }
        let gpus = self.gpus(lease).join(",");
        let mut child = tokio::process::Command::new(&command[0]);
        child
            .args(&command[1..])
            .current_dir(self.dir(lease))
            .env("CUDA_VISIBLE_DEVICES", &gpus)
            .env("GPUX_GPUS", &gpus)
            .env("GPUX_LEASE", lease.0.to_string())
            .stdin(std::process::Stdio::null())
            .kill_on_drop(true);
        match tokio::time::timeout(timeout, child.output()).await {
            Err(_) => ExecOutcome { timed_out: true, ..ExecOutcome::default() },
            Ok(Err(error)) => ExecOutcome::refused(format!("running {}: {error}", command[0])),
            Ok(Ok(output)) => {
                let mut text = String::from_utf8_lossy(&output.stdout).into_owned();
                text.push_str(&String::from_utf8_lossy(&output.stderr));
                let exit_code = output.status.code().map(i64::from).or_else(|| {
                    use std::os::unix::process::ExitStatusExt;
                    output.status.signal().map(|signal| 128 + i64::from(signal))
                });
                ExecOutcome { exit_code, output: text, ..ExecOutcome::default() }
            }
        }
    }

    async fn start(&self, job: &Launch, _progress: &Progress) -> Result<Vec<Endpoint>, Failure> {
        let workload = job.workload.as_ref().ok_or_else(|| Failure::public(FailureCode::WorkloadRefused, "no workload"))?;
        let mut words = job.secrets.command.iter().chain(&job.secrets.args);
        let program = words.next().ok_or_else(|| Failure::public(FailureCode::WorkloadRefused, "the process backend needs a command"))?;
        let dir = self.dir(job.lease);
        std::fs::create_dir_all(&dir).map_err(|e| Failure::new(FailureCode::HostError, format!("scratch directory: {e}")))?;
        let output =
            std::fs::File::create(dir.join("output.log")).map_err(|e| Failure::new(FailureCode::HostError, format!("log file: {e}")))?;
        let errors = output.try_clone().map_err(|e| Failure::new(FailureCode::HostError, format!("log file: {e}")))?;
        let uuids: Vec<&str> = job.gpus.iter().map(|g| g.uuid.as_str()).collect();
        let indices: Vec<String> = job.gpus.iter().map(|g| g.index_on_host.to_string()).collect();
        let mut command = tokio::process::Command::new(program);
        command.args(words).current_dir(&dir);
        if let Some(files) = &job.files {
            command.current_dir(files.code());
        }
        command
            .env("CUDA_VISIBLE_DEVICES", uuids.join(","))
            .env("HIP_VISIBLE_DEVICES", indices.join(","))
            .env("GPUX_LEASE", job.lease.0.to_string())
            .env("GPUX_GPUS", uuids.join(","))
            .envs(job.secrets.env.iter().map(|(n, v)| (n, v)))
            .envs(job.volumes.iter().flat_map(|v| v.env(false)))
            .stdin(std::process::Stdio::null())
            .stdout(output)
            .stderr(errors)
            .process_group(0)
            .kill_on_drop(false);
        let child = command.spawn().map_err(|e| {
            let code = if e.kind() == std::io::ErrorKind::NotFound || e.kind() == std::io::ErrorKind::PermissionDenied {
                FailureCode::ExecFailed
            } else {
                FailureCode::HostError
            };
            Failure::new(code, format!("running {program}: {e}"))
        })?;
        if let Some(pid) = child.id() {
            std::fs::write(dir.join("pid"), pid.to_string()).map_err(|e| Failure::new(FailureCode::HostError, format!("pid file: {e}")))?;
        }
        // Which GPUs it holds, so a restarted agent keeps them off sale until it is gone.
        let _ = std::fs::write(dir.join("gpus"), uuids.join(","));
        self.children.lock().await.insert(job.lease, child);
        // A process exposes its ports on the host itself.
        Ok(workload.ports.iter().map(|&port| Endpoint { container_port: port, host: self.public_address.clone(), port }).collect())
    }

    async fn poll(&self, lease: LeaseId) -> Poll {
        if let Some(child) = self.children.lock().await.get_mut(&lease) {
            return match child.try_wait() {
                Ok(None) => Poll::Running,
                Ok(Some(status)) => Poll::Exited(status.code().map_or(-1, i64::from)),
                Err(_) => Poll::Gone,
            };
        }
        match self.pid(lease) {
            Some(pid) if alive(pid) => Poll::Running,
            Some(_) => Poll::Exited(-1),
            None => Poll::Gone,
        }
    }

    async fn terminate(&self, job: &Launch, _deadline_ms: u64) {
        let lease = job.lease;
        if let Some(pid) = self.pid(lease) {
            // The whole process group: the command and what it started.
            let _ = kill(Pid::from_raw(-pid.as_raw()), Signal::SIGTERM);
        }
    }

    async fn remove(&self, lease: LeaseId, grace: Duration) -> Result<(), String> {
        if let Some(pid) = self.pid(lease) {
            let group = Pid::from_raw(-pid.as_raw());
            if alive(pid) && !grace.is_zero() {
                let _ = kill(group, Signal::SIGTERM);
                let deadline = tokio::time::Instant::now() + grace;
                while alive(pid) && tokio::time::Instant::now() < deadline {
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            }
            let _ = kill(group, Signal::SIGKILL);
        }
        if let Some(mut child) = self.children.lock().await.remove(&lease) {
            let _ = child.wait().await;
        }
        // A process not our child is reaped by someone else: wait for it to go.
        if let Some(pid) = self.pid(lease) {
            let deadline = tokio::time::Instant::now() + Duration::from_secs(2);
            while alive(pid) && tokio::time::Instant::now() < deadline {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            if alive(pid) {
                return Err(format!("process {pid} still runs after SIGKILL"));
            }
        }
        match std::fs::remove_dir_all(self.dir(lease)) {
            Ok(()) => Ok(()),
            Err(error) if error.kind() == std::io::ErrorKind::NotFound => Ok(()),
            Err(error) => Err(format!("removing {}: {error}", self.dir(lease).display())),
        }
    }

    async fn logs(&self, lease: LeaseId, tail_bytes: u32) -> (String, bool) {
        let bytes = std::fs::read(self.dir(lease).join("output.log")).unwrap_or_default();
        super::docker::tail(&bytes, tail_bytes as usize)
    }

    async fn found(&self, lease: LeaseId) -> Result<Option<Found>, String> {
        Ok(self.pid(lease).map(|pid| Found { lease, running: alive(pid), endpoints: Vec::new(), gpus: self.gpus(lease) }))
    }

    async fn find(&self) -> Result<Vec<Found>, String> {
        let entries = match std::fs::read_dir(&self.scratch) {
            Ok(entries) => entries,
            Err(error) if error.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
            Err(error) => return Err(format!("reading {}: {error}", self.scratch.display())),
        };
        Ok(entries
            .filter_map(|entry| entry.ok()?.file_name().to_str()?.parse::<u64>().ok())
            .map(LeaseId)
            .filter_map(|lease| {
                let pid = self.pid(lease)?;
                Some(Found { lease, running: alive(pid), endpoints: Vec::new(), gpus: self.gpus(lease) })
            })
            .collect())
    }
}
