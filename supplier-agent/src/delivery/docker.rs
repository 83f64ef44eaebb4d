//! The `docker` delivery backend: the Docker Engine API through bollard, so
//! it drives Docker or podman (`podman system service`) alike.
//!
//! Each lease's workload is one container named `gpux-<host>-lease-<id>`, labelled
//! with its lease, given exactly the leased GPUs (NVIDIA: a device request
//! by UUID, MIG slices by their MIG UUID; AMD: `/dev/kfd` and the leased
//! `/dev/dri/renderD*` nodes), CPU and memory in proportion to its GPUs, its
//! ports published on the host's public address, and the renter's SSH keys
//! as a read-only `/root/.ssh/authorized_keys`. Nothing else of the host is
//! mounted, the network is the engine's default bridge, and capabilities
//! are the engine's defaults with `no-new-privileges`.

use std::collections::HashMap;
use std::path::PathBuf;
use std::time::Duration;

use bollard::models::{ContainerCreateBody, DeviceMapping, DeviceRequest, HostConfig, PortBinding};
use bollard::query_parameters::{
    CreateContainerOptions, CreateImageOptions, KillContainerOptions, ListContainersOptions, LogsOptions, RemoveContainerOptions,
};
use bollard::Docker;
use futures_util::StreamExt;
use gpux_engine::LeaseId;
use gpux_protocol::{DeliveryState, Endpoint, FailureCode};

use super::{DeliveryBackend, Failure, Found, Launch, Poll, Progress};
use crate::config::{DockerConfig, GpuDevices};

/// The label that ties a container to its lease.
pub const LEASE_LABEL: &str = "gpux.lease";
/// The label naming the host whose agent owns the container.
pub const HOST_LABEL: &str = "gpux.host";
/// The label listing the UUIDs of the GPUs the container was given: a
/// restarted agent keeps them off sale until the container is gone.
pub const GPUS_LABEL: &str = "gpux.gpus";

/// Whether an engine error means the engine answered (an HTTP status from
/// it) rather than not being reached at all (socket refused, timed out,
/// connection broken): only the second is the engine being unavailable.
fn engine_answered(error: &bollard::errors::Error) -> bool {
    matches!(error, bollard::errors::Error::DockerResponseServerError { .. } | bollard::errors::Error::DockerStreamError { .. })
}

fn not_found(error: &bollard::errors::Error) -> bool {
    matches!(error, bollard::errors::Error::DockerResponseServerError { status_code: 404, .. })
}

/// A failure of a call to the engine: `EngineUnavailable` (host) when the
/// engine was not reached, else `answered` (whose side the caller says).
fn engine_failure(answered: FailureCode, what: &str, error: &bollard::errors::Error) -> Failure {
    let code = if engine_answered(error) { answered } else { FailureCode::EngineUnavailable };
    Failure::new(code, format!("{what}: {error}"))
}

pub struct DockerBackend {
    docker: Docker,
    config: DockerConfig,
    host: String,
    scratch: PathBuf,
}

impl DockerBackend {
    pub fn connect(config: DockerConfig, host: String, scratch: PathBuf) -> anyhow::Result<Self> {
        let docker = Docker::connect_with_unix(&config.socket, 120, bollard::API_DEFAULT_VERSION)?;
        Ok(DockerBackend { docker, config, host, scratch })
    }

    /// The container's name: host and lease, so agents sharing an engine never collide.
    fn name_of(&self, lease: LeaseId) -> String {
        format!("gpux-{}-lease-{}", self.host, lease.0)
    }

    fn scratch_of(&self, lease: LeaseId) -> PathBuf {
        self.scratch.join(lease.0.to_string())
    }

    /// Pulls the image unless it is present, reporting bytes as they come.
    /// An engine that does not answer is the host's failure; an engine that
    /// answers that the image cannot be had (absent, private, a registry the
    /// renter named that does not answer) is the renter's.
    async fn pull(&self, job: &Launch, image: &str, progress: &Progress) -> Result<(), Failure> {
        match self.docker.inspect_image(image).await {
            Ok(_) => return Ok(()),
            Err(error) if not_found(&error) => {}
            Err(error) => return Err(engine_failure(FailureCode::HostError, "inspecting the image", &error)),
        }
        let options = CreateImageOptions { from_image: Some(image.to_string()), ..Default::default() };
        // A private registry's credentials, from the sealed part: for this pull only.
        let credentials = job.secrets.registry_auth.as_ref().map(|auth| bollard::auth::DockerCredentials {
            username: Some(auth.username.clone()),
            password: Some(auth.password.clone()),
            serveraddress: auth.server.clone(),
            ..Default::default()
        });
        let mut stream = self.docker.create_image(Some(options), None, credentials);
        let mut layers: HashMap<String, (u64, u64)> = HashMap::new();
        let mut last_report = std::time::Instant::now() - Duration::from_secs(10);
        while let Some(item) = stream.next().await {
            let info = item.map_err(|e| match engine_answered(&e) {
                // The image's name is the renter's own and public in its workload.
                true => Failure::public(FailureCode::PullFailed, format!("pulling {image}: {e}")),
                false => Failure::new(FailureCode::EngineUnavailable, format!("pulling {image}: {e}")),
            })?;
            if let Some(detail) = info.error_detail {
                let message = detail.message.unwrap_or_default();
                return Err(Failure::public(FailureCode::PullFailed, format!("pulling {image}: {message}")));
            }
            if let (Some(id), Some(detail)) = (info.id, info.progress_detail) {
                let entry = layers.entry(id).or_default();
                entry.0 = detail.current.unwrap_or(0).max(0) as u64;
                entry.1 = detail.total.unwrap_or(0).max(0) as u64;
            }
            if last_report.elapsed() >= Duration::from_secs(2) {
                last_report = std::time::Instant::now();
                let (bytes_done, bytes_total) = layers.values().fold((0, 0), |(d, t), (ld, lt)| (d + ld, t + lt));
                let _ = progress.send((job.lease, DeliveryState::Pulling { bytes_done, bytes_total }));
            }
        }
        // Some engines end a failed pull without an error item.
        match self.docker.inspect_image(image).await {
            Ok(_) => Ok(()),
            Err(error) if engine_answered(&error) => Err(Failure::public(FailureCode::PullFailed, format!("pulling {image}: {error}"))),
            Err(error) => Err(Failure::new(FailureCode::EngineUnavailable, format!("pulling {image}: {error}"))),
        }
    }

    fn host_config(&self, job: &Launch, authorized_keys: Option<&PathBuf>) -> HostConfig {
        let workload = job.workload.as_ref().expect("docker jobs have a workload");
        let gpus = job.gpus.len().max(1) as f64;
        // A job's attempt runs under an init process (docker's tini,
        // podman's catatonit) as PID 1: it forwards a preemption notice's
        // SIGTERM to the job's command, whose default action then ends it
        // (as PID 1 itself a script without a handler would ignore it until
        // the deadline). A lease's own workload stays PID 1, so that a
        // command that cannot be executed fails the start (`exec_failed`)
        // instead of exiting 127 under the init.
        let mut config = HostConfig {
            privileged: Some(false),
            security_opt: Some(vec!["no-new-privileges".into()]),
            init: job.files.is_some().then_some(true),
            ..Default::default()
        };
        if !workload.ports.is_empty() {
            let bindings = workload
                .ports
                .iter()
                .map(|port| {
                    let binding = PortBinding { host_ip: Some(self.config.public_address.clone()), host_port: Some(String::new()) };
                    (format!("{port}/tcp"), Some(vec![binding]))
                })
                .collect();
            config.port_bindings = Some(bindings);
        }
        if let Some(cpus) = self.config.cpus_per_gpu {
            config.nano_cpus = Some((cpus * gpus * 1e9) as i64);
        }
        if let Some(mib) = self.config.memory_mib_per_gpu {
            config.memory = Some((mib as f64 * gpus) as i64 * 1024 * 1024);
        }
        if workload.shm_mib > 0 {
            config.shm_size = Some(workload.shm_mib as i64 * 1024 * 1024);
        }
        self.pass_gpus(job, &mut config);
        let binds = self.binds(job, authorized_keys, &mut config);
        if !binds.is_empty() {
            config.binds = Some(binds);
        }
        config
    }

    /// Passes the job's GPUs into the container, by the host's kind of devices.
    fn pass_gpus(&self, job: &Launch, config: &mut HostConfig) {
        match self.config.gpu_devices {
            GpuDevices::Nvidia => {
                config.device_requests = Some(vec![DeviceRequest {
                    driver: Some("nvidia".into()),
                    device_ids: Some(job.gpus.iter().map(|g| g.uuid.clone()).collect()),
                    capabilities: Some(vec![vec!["gpu".into()]]),
                    ..Default::default()
                }]);
            }
            GpuDevices::Amd => {
                let mut devices = vec![device("/dev/kfd")];
                // Render nodes are numbered from 128 in the order the driver enumerates the GPUs.
                devices.extend(job.gpus.iter().map(|g| device(&format!("/dev/dri/renderD{}", 128 + g.index_on_host))));
                config.devices = Some(devices);
            }
            GpuDevices::Ascend => {
                let mut devices: Vec<DeviceMapping> =
                    job.gpus.iter().map(|g| device(&format!("/dev/davinci{}", g.index_on_host))).collect();
                devices.extend(["/dev/davinci_manager", "/dev/devmm_svm", "/dev/hisi_hdc"].map(device));
                config.devices = Some(devices);
            }
            GpuDevices::Cambricon => {
                let mut devices: Vec<DeviceMapping> =
                    job.gpus.iter().map(|g| device(&format!("/dev/cambricon_dev{}", g.index_on_host))).collect();
                devices.push(device("/dev/cambricon_ctl"));
                config.devices = Some(devices);
            }
            GpuDevices::Iluvatar => {
                config.devices = Some(job.gpus.iter().map(|g| device(&format!("/dev/iluvatar{}", g.index_on_host))).collect());
            }
            GpuDevices::Fake => {
                let fake = |g: &crate::delivery::LeasedGpu| DeviceMapping {
                    path_on_host: Some("/dev/null".into()),
                    path_in_container: Some(format!("/dev/gpux-fake{}", g.index_on_host)),
                    cgroup_permissions: Some("rwm".into()),
                };
                config.devices = Some(job.gpus.iter().map(fake).collect());
            }
            GpuDevices::None => {}
        }
    }

    /// What the container mounts: the vendor's runtime, the renter's SSH
    /// keys, and a job's code, inputs, checkpoints and outputs. A cluster
    /// member shares the host's network.
    fn binds(&self, job: &Launch, authorized_keys: Option<&PathBuf>, config: &mut HostConfig) -> Vec<String> {
        let mut binds = Vec::new();
        if self.config.gpu_devices == GpuDevices::Ascend {
            // The Ascend user-space runtime in the image talks to the host's driver.
            binds.push("/usr/local/Ascend/driver:/usr/local/Ascend/driver:ro".to_string());
        }
        if let Some(path) = authorized_keys {
            binds.push(format!("{}:/root/.ssh/authorized_keys:ro", path.display()));
        }
        if let Some(files) = &job.files {
            // The agent's own directories for the job, never a path the renter names.
            let run = &files.assignment.run;
            binds.push(format!("{}:/job:ro", files.code().display()));
            binds.push(format!("{}:{}", files.checkpoints().display(), run.checkpoint_dir));
            binds.push(format!("{}:{}", files.outputs().display(), run.outputs_dir));
            binds.push(format!("{}:/var/cache/gpux-pip", files.pip_cache.display()));
            binds.push(format!("{}:{}:ro", files.notices().display(), super::jobs::NOTICE_DIR_IN_CONTAINER));
            for input in &run.inputs {
                binds.push(format!("{}:{}:ro", files.input(&input.name).display(), input.mount));
            }
            // A cluster member shares the host's network: its peers reach it
            // on the fabric's address at its port, and NCCL, Gloo and MPI
            // open their own connections between members (docs/agent.md
            // "Clusters").
            if files.cluster() {
                binds.push(format!("{}:{}:ro", files.hostfile().display(), super::jobs::HOSTFILE_IN_CONTAINER));
                config.network_mode = Some("host".into());
            }
        }
        // The renter's volumes, each at the path it named (checked by the
        // exchange and the protocol's rules: never a system path).
        if let Some(volumes) = &job.volumes {
            binds.extend(volumes.binds());
        }
        binds
    }

    async fn endpoints(&self, name: &str) -> Vec<Endpoint> {
        let Ok(inspect) = self.docker.inspect_container(name, None).await else { return Vec::new() };
        let ports = inspect.network_settings.and_then(|n| n.ports).unwrap_or_default();
        let mut endpoints: Vec<Endpoint> = ports
            .into_iter()
            .filter_map(|(key, bindings)| {
                let container_port: u16 = key.split('/').next()?.parse().ok()?;
                let binding = bindings?.into_iter().next()?;
                let port: u16 = binding.host_port?.parse().ok()?;
                Some(Endpoint { container_port, host: self.config.public_address.clone(), port })
            })
            .collect();
        endpoints.sort_by_key(|e| e.container_port);
        endpoints
    }
}

fn device(path: &str) -> DeviceMapping {
    DeviceMapping { path_on_host: Some(path.into()), path_in_container: Some(path.into()), cgroup_permissions: Some("rwm".into()) }
}

/// A start error the renter's image causes (its command cannot run) rather than the host.
fn exec_failure(message: &str) -> bool {
    let message = message.to_ascii_lowercase();
    ["executable file not found", "no such file or directory", "permission denied: oci", "exec format error"]
        .iter()
        .any(|needle| message.contains(needle))
}

#[async_trait::async_trait]
impl DeliveryBackend for DockerBackend {
    fn name(&self) -> &'static str {
        "docker"
    }

    async fn start(&self, job: &Launch, progress: &Progress) -> Result<Vec<Endpoint>, Failure> {
        let workload = job.workload.as_ref().ok_or_else(|| Failure::public(FailureCode::WorkloadRefused, "no workload"))?;
        let _ = progress.send((job.lease, DeliveryState::Pulling { bytes_done: 0, bytes_total: 0 }));
        self.pull(job, &workload.image, progress).await?;
        let _ = progress.send((job.lease, DeliveryState::Starting));
        let name = self.name_of(job.lease);
        // A leftover of an earlier attempt would block the name.
        match self.docker.remove_container(&name, Some(RemoveContainerOptions { force: true, ..Default::default() })).await {
            Ok(()) => {}
            Err(error) if not_found(&error) => {}
            Err(error) => return Err(engine_failure(FailureCode::HostError, "removing a leftover container", &error)),
        }
        let scratch = self.scratch_of(job.lease);
        let authorized_keys = if job.secrets.ssh_keys.is_empty() {
            None
        } else {
            std::fs::create_dir_all(&scratch).map_err(|e| Failure::new(FailureCode::HostError, format!("scratch directory: {e}")))?;
            let path = scratch.join("authorized_keys");
            std::fs::write(&path, job.secrets.ssh_keys.join("\n") + "\n")
                .map_err(|e| Failure::new(FailureCode::HostError, format!("writing authorized_keys: {e}")))?;
            Some(path)
        };
        let mut env: Vec<String> = job.secrets.env.iter().map(|(name, value)| format!("{name}={value}")).collect();
        let uuids: Vec<&str> = job.gpus.iter().map(|g| g.uuid.as_str()).collect();
        env.push(format!("GPUX_LEASE={}", job.lease.0));
        if let Some(volumes) = &job.volumes {
            env.extend(volumes.env(true).into_iter().map(|(name, value)| format!("{name}={value}")));
        }
        env.push(format!("GPUX_GPUS={}", uuids.join(",")));
        if self.config.gpu_devices == GpuDevices::Fake {
            // Where the renter's GPU probe finds each fake GPU (`gpux-probe`).
            let devices: Vec<String> = job.gpus.iter().map(|g| format!("{}=/dev/gpux-fake{}", g.uuid, g.index_on_host)).collect();
            env.push(format!("GPUX_FAKE_DEVICES={}", devices.join(",")));
        }
        let labels = HashMap::from([
            (LEASE_LABEL.to_string(), job.lease.0.to_string()),
            (HOST_LABEL.to_string(), self.host.clone()),
            (GPUS_LABEL.to_string(), uuids.join(",")),
        ]);
        let body = ContainerCreateBody {
            image: Some(workload.image.clone()),
            entrypoint: (!job.secrets.command.is_empty()).then(|| job.secrets.command.clone()),
            working_dir: job.files.as_ref().map(|_| "/job".to_string()),
            cmd: (!job.secrets.args.is_empty()).then(|| job.secrets.args.clone()),
            env: Some(env),
            labels: Some(labels),
            exposed_ports: Some(workload.ports.iter().map(|p| format!("{p}/tcp")).collect()),
            host_config: Some(self.host_config(job, authorized_keys.as_ref())),
            ..Default::default()
        };
        let options = CreateContainerOptions { name: Some(name.clone()), ..Default::default() };
        if let Err(error) = self.docker.create_container(Some(options), body).await {
            return Err(engine_failure(FailureCode::HostError, "creating the container", &error));
        }
        if let Err(error) = self.docker.start_container(&name, None).await {
            // The engine's text can name the renter's sealed command: it
            // stays in `detail`, on this host.
            let message = error.to_string();
            let code = match engine_answered(&error) {
                true if exec_failure(&message) => FailureCode::ExecFailed,
                true => FailureCode::HostError,
                false => FailureCode::EngineUnavailable,
            };
            return Err(Failure::new(code, format!("starting the container: {message}")));
        }
        Ok(self.endpoints(&name).await)
    }

    async fn poll(&self, lease: LeaseId) -> Poll {
        match self.docker.inspect_container(&self.name_of(lease), None).await {
            Ok(inspect) => {
                let state = inspect.state.unwrap_or_default();
                if state.running == Some(true) {
                    Poll::Running
                } else {
                    Poll::Exited(state.exit_code.unwrap_or(-1))
                }
            }
            Err(error) if not_found(&error) => Poll::Gone,
            Err(_) => Poll::Unknown,
        }
    }

    async fn terminate(&self, job: &Launch, _deadline_ms: u64) {
        let lease = job.lease;
        let options = KillContainerOptions { signal: "SIGTERM".into() };
        if let Err(error) = self.docker.kill_container(&self.name_of(lease), Some(options)).await {
            tracing::warn!(%lease, %error, "could not send SIGTERM to the workload");
        }
    }

    async fn remove(&self, lease: LeaseId, grace: Duration) -> Result<(), String> {
        let name = self.name_of(lease);
        if !grace.is_zero() {
            let options = bollard::query_parameters::StopContainerOptions { t: Some(grace.as_secs().max(1) as i32), signal: None };
            let _ = self.docker.stop_container(&name, Some(options)).await;
        }
        let options = RemoveContainerOptions { force: true, v: true, ..Default::default() };
        match self.docker.remove_container(&name, Some(options)).await {
            Ok(()) => tracing::info!(%lease, "workload removed"),
            Err(error) if not_found(&error) => {}
            Err(error) => return Err(format!("removing {name}: {error}")),
        }
        // Confirmed: the engine no longer knows the container.
        match self.docker.inspect_container(&name, None).await {
            Err(error) if not_found(&error) => {}
            Ok(_) => return Err(format!("{name} is still there after its removal")),
            Err(error) => return Err(format!("confirming the removal of {name}: {error}")),
        }
        let _ = std::fs::remove_dir_all(self.scratch_of(lease));
        Ok(())
    }

    /// The last `tail_bytes` of the output, read from the start and kept in
    /// a window of at most twice that (podman's `tail` lines, counted from
    /// the file's end, came back short under load: the first lines of a
    /// running container's output went missing), for at most
    /// `LOGS_READ_MAX` (then what was read, marked truncated).
    async fn logs(&self, lease: LeaseId, tail_bytes: u32) -> (String, bool) {
        let options = LogsOptions { stdout: true, stderr: true, tail: "all".into(), ..Default::default() };
        let mut stream = self.docker.logs(&self.name_of(lease), Some(options));
        let limit = tail_bytes as usize;
        let (mut bytes, mut dropped) = (Vec::new(), false);
        let read = async {
            while let Some(Ok(chunk)) = stream.next().await {
                bytes.extend_from_slice(&chunk.into_bytes());
                if bytes.len() > 2 * limit.max(1) {
                    bytes.drain(..bytes.len() - limit);
                    dropped = true;
                }
            }
        };
        let whole = tokio::time::timeout(crate::limits::LOGS_READ_MAX, read).await.is_ok();
        let (text, cut) = tail(&bytes, limit);
        (text, cut || dropped || !whole)
    }

    /// `docker exec` in the lease's container (never privileged, as the
    /// container's own user), its stdout and stderr as they come, the last
    /// `EXEC_OUTPUT_BYTES_MAX` kept; past `timeout` the command is left
    /// running (the engine has no way to stop one exec) and its output so
    /// far returned.
    async fn exec(&self, lease: LeaseId, command: &[String], timeout: Duration) -> gpux_protocol::delivery::ExecOutcome {
        use bollard::exec::StartExecResults;
        use gpux_protocol::delivery::{limits::EXEC_OUTPUT_BYTES_MAX, ExecOutcome};
        let config = bollard::models::ExecConfig {
            cmd: Some(command.to_vec()),
            attach_stdout: Some(true),
            attach_stderr: Some(true),
            privileged: Some(false),
            ..Default::default()
        };
        let created = match self.docker.create_exec(&self.name_of(lease), config).await {
            Ok(created) => created,
            Err(error) => return ExecOutcome::refused(format!("the container engine refused the command: {error}")),
        };
        let output = match self.docker.start_exec(&created.id, None).await {
            Ok(StartExecResults::Attached { output, .. }) => output,
            Ok(StartExecResults::Detached) => return ExecOutcome::refused("the container engine detached the command"),
            Err(error) => return ExecOutcome::refused(format!("the container engine could not start the command: {error}")),
        };
        let mut output = output;
        let (mut bytes, mut dropped) = (Vec::new(), false);
        let read = async {
            while let Some(Ok(chunk)) = output.next().await {
                bytes.extend_from_slice(&chunk.into_bytes());
                if bytes.len() > 2 * EXEC_OUTPUT_BYTES_MAX {
                    bytes.drain(..bytes.len() - EXEC_OUTPUT_BYTES_MAX);
                    dropped = true;
                }
            }
        };
        let finished = tokio::time::timeout(timeout, read).await.is_ok();
        let (text, cut) = tail(&bytes, EXEC_OUTPUT_BYTES_MAX);
        let exit_code = match finished {
            true => self.docker.inspect_exec(&created.id).await.ok().and_then(|inspect| inspect.exit_code),
            false => None,
        };
        ExecOutcome { exit_code, output: text, truncated: cut || dropped, timed_out: !finished, refused: None }
    }

    async fn found(&self, lease: LeaseId) -> Result<Option<Found>, String> {
        let name = self.name_of(lease);
        match self.docker.inspect_container(&name, None).await {
            Ok(inspect) => {
                let gpus = gpus_of(inspect.config.as_ref().and_then(|c| c.labels.as_ref()));
                let running = inspect.state.and_then(|s| s.running) == Some(true);
                Ok(Some(Found { lease, running, endpoints: self.endpoints(&name).await, gpus }))
            }
            Err(error) if not_found(&error) => Ok(None),
            Err(error) => Err(format!("inspecting {name}: {error}")),
        }
    }

    async fn find(&self) -> Result<Vec<Found>, String> {
        let filters = HashMap::from([("label".to_string(), vec![format!("{HOST_LABEL}={}", self.host)])]);
        let options = ListContainersOptions { all: true, filters: Some(filters), ..Default::default() };
        let containers = self.docker.list_containers(Some(options)).await.map_err(|error| format!("listing containers: {error}"))?;
        let mut found = Vec::new();
        for container in containers {
            let Some(lease) = container.labels.as_ref().and_then(|l| l.get(LEASE_LABEL)).and_then(|v| v.parse().ok()) else { continue };
            let lease = LeaseId(lease);
            let running = container.state.as_ref().is_some_and(|s| s.to_string() == "running");
            let gpus = gpus_of(container.labels.as_ref());
            found.push(Found { lease, running, endpoints: self.endpoints(&self.name_of(lease)).await, gpus });
        }
        Ok(found)
    }

    async fn health(&self) -> Result<(), String> {
        self.docker.ping().await.map(|_| ()).map_err(|error| format!("the container engine did not answer: {error}"))
    }
}

/// The GPU UUIDs a container's labels name.
fn gpus_of(labels: Option<&HashMap<String, String>>) -> Vec<String> {
    labels.and_then(|l| l.get(GPUS_LABEL)).map(|v| v.split(',').filter(|u| !u.is_empty()).map(String::from).collect()).unwrap_or_default()
}

/// The last `limit` bytes of `bytes` as text (lossy), and whether more came before.
pub fn tail(bytes: &[u8], limit: usize) -> (String, bool) {
    let start = bytes.len().saturating_sub(limit);
    (String::from_utf8_lossy(&bytes[start..]).into_owned(), start > 0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::delivery::LeasedGpu;

    fn job() -> Launch {
        Launch {
            lease: LeaseId(7),
            gpus: vec![LeasedGpu { uuid: "U-2".into(), index_on_host: 2 }, LeasedGpu { uuid: "U-5".into(), index_on_host: 5 }],
            workload: Some(serde_json::from_str(r#"{"image": "ubuntu:24.04"}"#).expect("a workload")),
            secrets: Default::default(),
            end_ms: None,
            files: None,
            volumes: None,
        }
    }

    fn host_config(gpu_devices: GpuDevices) -> HostConfig {
        // bollard wants the socket's path to exist, and connects lazily:
        // nothing is dialled here.
        let dir = tempfile::tempdir().expect("a temp dir");
        let socket = dir.path().join("engine.sock");
        std::fs::write(&socket, b"").expect("a socket stand-in");
        let config = DockerConfig { gpu_devices, socket: socket.display().to_string(), ..DockerConfig::default() };
        let backend = DockerBackend::connect(config, "h".into(), dir.path().into()).expect("a client");
        backend.host_config(&job(), None)
    }

    fn device_paths(config: &HostConfig) -> Vec<String> {
        config.devices.iter().flatten().filter_map(|d| d.path_on_host.clone()).collect()
    }

    /// Each vendor's container gets exactly the leased devices (by the
    /// vendor's device index) and the shared control nodes, nothing more.
    #[test]
    fn each_vendor_hands_the_container_only_the_leased_devices() {
        let nvidia = host_config(GpuDevices::Nvidia);
        let request = &nvidia.device_requests.as_ref().expect("a device request")[0];
        assert_eq!(request.device_ids.as_deref(), Some(&["U-2".to_string(), "U-5".to_string()][..]));
        assert_eq!(device_paths(&host_config(GpuDevices::Amd)), ["/dev/kfd", "/dev/dri/renderD130", "/dev/dri/renderD133"]);
        let ascend = host_config(GpuDevices::Ascend);
        assert_eq!(device_paths(&ascend), ["/dev/davinci2", "/dev/davinci5", "/dev/davinci_manager", "/dev/devmm_svm", "/dev/hisi_hdc"]);
        assert_eq!(ascend.binds.as_deref(), Some(&["/usr/local/Ascend/driver:/usr/local/Ascend/driver:ro".to_string()][..]));
        assert_eq!(device_paths(&host_config(GpuDevices::Cambricon)), ["/dev/cambricon_dev2", "/dev/cambricon_dev5", "/dev/cambricon_ctl"]);
        assert_eq!(device_paths(&host_config(GpuDevices::Iluvatar)), ["/dev/iluvatar2", "/dev/iluvatar5"]);
        let none = host_config(GpuDevices::None);
        assert!(none.devices.is_none() && none.device_requests.is_none() && none.binds.is_none());
        assert_eq!(none.privileged, Some(false));
    }
}
