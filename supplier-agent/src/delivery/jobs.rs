//! A job's files on its host (docs/agent.md "Jobs"): the code bundle
//! fetched from the job store and unpacked (its hash checked) into
//! `<jobs>/<lease>/code`, mounted read-only at `/job`; the job's newest
//! checkpoint restored into `<jobs>/<lease>/checkpoints`; outputs written
//! to `<jobs>/<lease>/outputs`. While the workload runs, both directories
//! are synced to the job store every checkpoint interval, and once more
//! when it exits or its lease ends: what a workload wrote is on the store
//! before the exchange hears that it ended.
//!
//! Only the store's HTTP API is spoken here (a bearer token for this lease's
//! job from the exchange); the store's own credentials stay with the exchange.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::SystemTime;

use gpux_protocol::{FailureCode, JobAssignment};

use super::Failure;
use crate::limits::{FILES_MAX, TRANSFER_TIMEOUT};

/// Where a cluster job's hostfile is in its container.
pub const HOSTFILE_IN_CONTAINER: &str = "/etc/gpux/hostfile";
/// Where the job's notices are in its container (read-only): `preempt`
/// appears there, holding the deadline in Unix milliseconds, when a
/// preemption notice reaches the host (for frameworks that swallow SIGTERM).
pub const NOTICE_DIR_IN_CONTAINER: &str = "/run/gpux";

/// `address:port`, an IPv6 address in brackets.
fn socket_address(address: &str, port: u16) -> String {
    match address.contains(':') {
        true => format!("[{address}]:{port}"),
        false => format!("{address}:{port}"),
    }
}

/// Where a job's attempt runs on this host and how to reach its store.
#[derive(Clone, Debug)]
pub struct JobFiles {
    pub assignment: JobAssignment,
    /// `<jobs>/<lease>`: code/, checkpoints/, outputs/.
    pub dir: PathBuf,
    /// The host-wide pip cache, mounted into every job's container.
    pub pip_cache: PathBuf,
    pub store_url: String,
    pub token: String,
    /// Whether a checkpoint was restored (the attempt resumes).
    pub resumed: bool,
    /// What each file was (size, modification time, SHA-256 of its
    /// content) when last put or restored: a file is put again only when
    /// its content changed since (docs/jobs.md "Code and data").
    pub uploaded: Arc<Mutex<BTreeMap<String, Seen>>>,
}

/// A file as it was when last put or restored.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Seen {
    pub bytes: u64,
    pub modified: SystemTime,
    pub sha256: [u8; 32],
}

fn sha256(body: &[u8]) -> [u8; 32] {
    use sha2::Digest;
    sha2::Sha256::digest(body).into()
}

#[derive(serde::Deserialize)]
struct Listed {
    key: String,
    bytes: u64,
}

impl JobFiles {
    pub fn code(&self) -> PathBuf {
        self.dir.join("code")
    }

    pub fn checkpoints(&self) -> PathBuf {
        self.dir.join("checkpoints")
    }

    pub fn outputs(&self) -> PathBuf {
        self.dir.join("outputs")
    }

    /// The agent's notices to the workload (`preempt`), mounted read-only
    /// at [`NOTICE_DIR_IN_CONTAINER`].
    pub fn notices(&self) -> PathBuf {
        self.dir.join("notice")
    }

    /// A preemption notice: `preempt` written (atomically) with the
    /// deadline in Unix milliseconds, beside the SIGTERM.
    pub fn notify_preemption(&self, deadline_ms: u64) -> std::io::Result<()> {
        let temporary = self.notices().join(".preempt.tmp");
        std::fs::write(&temporary, format!("{deadline_ms}\n"))?;
        std::fs::rename(temporary, self.notices().join("preempt"))
    }

    /// Where input `name` is fetched to (mounted read-only at its mount).
    pub fn input(&self, name: &str) -> PathBuf {
        self.dir.join("inputs").join(name)
    }

    /// A cluster job's hostfile (`<jobs>/<lease>/hostfile`: one line per
    /// member by rank, `ADDRESS slots=GPUS`, as MPI and DeepSpeed read it),
    /// mounted read-only at [`HOSTFILE_IN_CONTAINER`].
    pub fn hostfile(&self) -> PathBuf {
        self.dir.join("hostfile")
    }

    /// Whether this attempt is a cluster: several nodes, each told where
    /// every member listens (docs/agent.md "Clusters").
    pub fn cluster(&self) -> bool {
        let a = &self.assignment;
        a.nodes > 1 && a.peers.len() == a.nodes as usize
    }

    fn prefix(&self) -> String {
        format!("{}/jobs/{}", self.assignment.renter.0, self.assignment.job.0)
    }

    /// The environment the workload gets (docs/agent.md "Jobs"): in a
    /// container the directories are the job's own paths; for the process
    /// backend, the host's.
    pub fn env(&self, in_container: bool, gpus_here: usize) -> Vec<(String, String)> {
        let a = &self.assignment;
        let (checkpoints, outputs, code) = match in_container {
            true => (a.run.checkpoint_dir.clone(), a.run.outputs_dir.clone(), "/job".to_string()),
            false => (self.checkpoints().display().to_string(), self.outputs().display().to_string(), self.code().display().to_string()),
        };
        let notice = match in_container {
            true => format!("{NOTICE_DIR_IN_CONTAINER}/preempt"),
            false => self.notices().join("preempt").display().to_string(),
        };
        vec![
            ("GPUX_JOB_ID".into(), a.job.0.to_string()),
            ("GPUX_JOB_ATTEMPT".into(), a.attempt.to_string()),
            ("GPUX_JOB_DIR".into(), code),
            ("GPUX_CHECKPOINT_DIR".into(), checkpoints),
            ("GPUX_OUTPUT_DIR".into(), outputs),
            ("GPUX_CHECKPOINT_INTERVAL_S".into(), a.run.checkpoint_interval_s.to_string()),
            ("GPUX_RESUMED".into(), u8::from(self.resumed).to_string()),
            ("GPUX_WORLD_GPUS".into(), a.world_gpus.to_string()),
            ("GPUX_NODES".into(), a.nodes.to_string()),
            ("GPUX_NODE_RANK".into(), a.node_rank.to_string()),
            ("GPUX_GPUS_ON_NODE".into(), gpus_here.to_string()),
            ("GPUX_PREEMPT_FILE".into(), notice),
            ("PYTHONUNBUFFERED".into(), "1".into()),
        ]
        .into_iter()
        .chain(self.cluster_env(in_container, gpus_here))
        .chain(a.run.inputs.iter().map(|input| {
            let name: String = input.name.chars().map(|c| if c.is_ascii_alphanumeric() { c.to_ascii_uppercase() } else { '_' }).collect();
            let path = if in_container { input.mount.clone() } else { self.input(&input.name).display().to_string() };
            (format!("GPUX_INPUT_{name}"), path)
        }))
        .collect()
    }

    /// What distributed frameworks read to join a cluster (PyTorch's
    /// `env://`, torchrun, DeepSpeed, Horovod through the hostfile): rank 0's
    /// address and port, the world's size, this node's rank and first global
    /// rank (one process per GPU), and every member's `address:port`. Empty
    /// for a job that is no cluster.
    fn cluster_env(&self, in_container: bool, gpus_here: usize) -> Vec<(String, String)> {
        if !self.cluster() {
            return Vec::new();
        }
        let a = &self.assignment;
        let master = &a.peers[0];
        let own = &a.peers[a.node_rank as usize];
        let peers: Vec<String> = a.peers.iter().map(|p| socket_address(&p.address, p.port)).collect();
        let hostfile = if in_container { HOSTFILE_IN_CONTAINER.to_string() } else { self.hostfile().display().to_string() };
        let gpus_here = gpus_here.max(1) as u32;
        vec![
            ("MASTER_ADDR".into(), master.address.clone()),
            ("MASTER_PORT".into(), master.port.to_string()),
            ("WORLD_SIZE".into(), a.world_gpus.to_string()),
            ("RANK".into(), (a.node_rank * gpus_here).to_string()),
            ("LOCAL_RANK".into(), "0".into()),
            ("NODE_RANK".into(), a.node_rank.to_string()),
            ("NNODES".into(), a.nodes.to_string()),
            ("NPROC_PER_NODE".into(), gpus_here.to_string()),
            ("GPUX_PEERS".into(), peers.join(",")),
            ("GPUX_CLUSTER_ADDR".into(), own.address.clone()),
            ("GPUX_CLUSTER_PORT".into(), own.port.to_string()),
            ("GPUX_HOSTFILE".into(), hostfile),
        ]
    }

    /// Writes the cluster's hostfile (a job that is no cluster has none).
    fn write_hostfile(&self) -> Result<(), Failure> {
        if !self.cluster() {
            return Ok(());
        }
        let a = &self.assignment;
        let slots = (a.world_gpus / a.nodes).max(1);
        let text: String = a.peers.iter().map(|p| format!("{} slots={slots}\n", p.address)).collect();
        std::fs::write(self.hostfile(), text).map_err(|e| Failure::new(FailureCode::HostError, format!("writing the hostfile: {e}")))
    }

    /// The command, with the packages the image lacks installed first
    /// (pip, cached on the host) when the job names any. Not in a process
    /// on the host itself (`in_container` false): the host's Python is the
    /// owner's, and nothing is installed into it.
    pub fn command(&self, in_container: bool) -> Vec<String> {
        let run = &self.assignment.run;
        if run.install.is_empty() || !in_container {
            return run.command.clone();
        }
        // Package requirements are checked to hold no quote (JobRun::validate).
        let packages: Vec<String> = run.install.iter().map(|p| format!("'{p}'")).collect();
        let script = format!(
            "python3 -m pip install --quiet --disable-pip-version-check --cache-dir /var/cache/gpux-pip {} && exec \"$0\" \"$@\"",
            packages.join(" ")
        );
        let mut command = vec!["sh".to_string(), "-c".to_string(), script];
        command.extend(run.command.iter().cloned());
        command
    }

    fn client() -> Result<reqwest::Client, Failure> {
        reqwest::Client::builder()
            .timeout(TRANSFER_TIMEOUT)
            .build()
            .map_err(|e| Failure::new(FailureCode::HostError, format!("HTTP client: {e}")))
    }

    /// Fetches and unpacks the bundle, restores the newest checkpoint.
    /// A bundle that is not in the store or does not match its hash is the
    /// renter's failure (`bundle_unavailable`); a store that does not
    /// answer is this host's (`host_error`).
    pub async fn prepare(&mut self) -> Result<(), Failure> {
        for dir in [self.code(), self.checkpoints(), self.outputs(), self.notices(), self.pip_cache.clone()] {
            std::fs::create_dir_all(&dir).map_err(|e| Failure::new(FailureCode::HostError, format!("{}: {e}", dir.display())))?;
        }
        self.write_hostfile()?;
        let client = Self::client()?;
        if let Some(bundle) = self.assignment.run.bundle.clone() {
            let key = format!("{}/bundles/{}.tar.gz", self.assignment.renter.0, bundle.sha256);
            let bytes = self.get(&client, &key).await.map_err(|(renters, detail)| match renters {
                true => Failure::public(FailureCode::BundleUnavailable, "the job's code bundle is not in the job store"),
                false => Failure::new(FailureCode::HostError, detail),
            })?;
            let mut sha = [0u8; 32];
            hex::decode_to_slice(&bundle.sha256, &mut sha).map_err(|_| Failure::public(FailureCode::BundleUnavailable, "bundle hash"))?;
            let (code, body) = (self.code(), bytes.to_vec());
            tokio::task::spawn_blocking(move || gpux_jobs::bundle::unpack(&body, &sha, &code))
                .await
                .map_err(|e| Failure::new(FailureCode::HostError, format!("unpacking: {e}")))?
                .map_err(|e| Failure::public(FailureCode::BundleUnavailable, format!("the job's code bundle: {e}")))?;
        }
        self.fetch_inputs(&client).await?;
        let listed = self.list(&client, "checkpoints").await.map_err(|detail| Failure::new(FailureCode::HostError, detail))?;
        let prefix = format!("{}/checkpoints/", self.prefix());
        for item in &listed {
            let Some(relative) = item.key.strip_prefix(&prefix) else { continue };
            let bytes = self.get(&client, &item.key).await.map_err(|(_, detail)| Failure::new(FailureCode::HostError, detail))?;
            let path =
                safe_join(&self.checkpoints(), relative).ok_or_else(|| Failure::new(FailureCode::HostError, "a stored checkpoint path"))?;
            if let Some(parent) = path.parent() {
                std::fs::create_dir_all(parent).map_err(|e| Failure::new(FailureCode::HostError, e.to_string()))?;
            }
            std::fs::write(&path, &bytes).map_err(|e| Failure::new(FailureCode::HostError, format!("{}: {e}", path.display())))?;
            if let Ok(modified) = std::fs::metadata(&path).and_then(|m| m.modified()) {
                let seen = Seen { bytes: bytes.len() as u64, modified, sha256: sha256(&bytes) };
                self.remember(&format!("checkpoints/{relative}"), seen);
            }
        }
        self.resumed = !listed.is_empty();
        // The container runs as root by default, the process backend as the
        // agent: both may write; nobody else on the host may read.
        Ok(())
    }

    /// Each input into its directory: a packed directory from the job store
    /// (hash checked, unpacked within its bounds), or an https:// URL's body
    /// (at most 1 GiB) saved under the URL's last path segment. What the
    /// renter named that cannot be had is the renter's failure.
    async fn fetch_inputs(&self, client: &reqwest::Client) -> Result<(), Failure> {
        use gpux_protocol::jobs::limits::INPUT_BYTES_MAX;
        use gpux_protocol::InputSource;
        let unavailable = |name: &str, why: &str| Failure::public(FailureCode::InputUnavailable, format!("input {name}: {why}"));
        for input in &self.assignment.run.inputs {
            let dir = self.input(&input.name);
            std::fs::create_dir_all(&dir).map_err(|e| Failure::new(FailureCode::HostError, format!("{}: {e}", dir.display())))?;
            match &input.source {
                InputSource::Store { sha256, .. } => {
                    let key = format!("{}/inputs/{sha256}.tar.gz", self.assignment.renter.0);
                    let bytes = self.get(client, &key).await.map_err(|(renters, detail)| match renters {
                        true => unavailable(&input.name, "not in the job store"),
                        false => Failure::new(FailureCode::HostError, detail),
                    })?;
                    let mut sha = [0u8; 32];
                    hex::decode_to_slice(sha256, &mut sha).map_err(|_| unavailable(&input.name, "its hash"))?;
                    let (body, into) = (bytes.to_vec(), dir.clone());
                    let limits = gpux_jobs::bundle::Limits::INPUT;
                    tokio::task::spawn_blocking(move || gpux_jobs::bundle::unpack_within(&body, &sha, &into, limits))
                        .await
                        .map_err(|e| Failure::new(FailureCode::HostError, format!("unpacking: {e}")))?
                        .map_err(|e| unavailable(&input.name, &e.to_string()))?;
                }
                InputSource::Https { url } => {
                    let file = url.split(['?', '#']).next().unwrap_or("").rsplit('/').next().unwrap_or("");
                    let file = if file.is_empty() || file == "." || file == ".." { "data" } else { file };
                    let mut answer = client.get(url).send().await.map_err(|e| unavailable(&input.name, &format!("{url}: {e}")))?;
                    if !answer.status().is_success() {
                        return Err(unavailable(&input.name, &format!("{url} answered {}", answer.status())));
                    }
                    let path = dir.join(file);
                    let mut out = std::fs::File::create(&path)
                        .map_err(|e| Failure::new(FailureCode::HostError, format!("{}: {e}", path.display())))?;
                    let mut written = 0u64;
                    while let Some(chunk) = answer.chunk().await.map_err(|e| unavailable(&input.name, &format!("{url}: {e}")))? {
                        written += chunk.len() as u64;
                        if written > INPUT_BYTES_MAX {
                            return Err(unavailable(&input.name, "over 1 GiB"));
                        }
                        std::io::Write::write_all(&mut out, &chunk)
                            .map_err(|e| Failure::new(FailureCode::HostError, format!("{}: {e}", path.display())))?;
                    }
                }
            }
        }
        Ok(())
    }

    /// Mirrors checkpoints/ and outputs/ to the store: files whose content
    /// changed since they were restored or last put are put (a changed
    /// size or time makes the content hashed; the same content is not put
    /// again); checkpoint files deleted here are deleted there. A cluster's
    /// members share the job's areas: a member puts only what it changed,
    /// so a restored copy of another rank's file never overwrites that
    /// rank's newer one, and none deletes what another wrote. A single
    /// host also puts what the store lacks or holds at another size.
    pub async fn sync(&self) -> Result<usize, String> {
        let client = Self::client().map_err(|f| f.detail)?;
        let mut put = 0;
        for area in ["checkpoints", "outputs"] {
            let local = list_files(&self.dir.join(area))?;
            let remote: BTreeMap<String, u64> = self
                .list(&client, area)
                .await?
                .into_iter()
                .filter_map(|l| l.key.strip_prefix(&format!("{}/{area}/", self.prefix())).map(|r| (r.to_string(), l.bytes)))
                .collect();
            for (relative, (path, bytes, modified)) in &local {
                let key = format!("{area}/{relative}");
                let known = self.uploaded.lock().unwrap_or_else(|p| p.into_inner()).get(&key).copied();
                let store_differs = !self.cluster() && remote.get(relative) != Some(bytes);
                let untouched = known.is_some_and(|k| k.bytes == *bytes && k.modified == *modified);
                if untouched && !store_differs {
                    continue;
                }
                let body = std::fs::read(path).map_err(|e| format!("{}: {e}", path.display()))?;
                let seen = Seen { bytes: *bytes, modified: *modified, sha256: sha256(&body) };
                if known.is_some_and(|k| k.sha256 == seen.sha256) && !store_differs {
                    // Touched, not changed: the store holds this content.
                    self.remember(&key, seen);
                    continue;
                }
                let (path, body) = (format!("/v1/objects/{}/{area}/{relative}", self.prefix()), bytes::Bytes::from(body));
                let putting = |to: &str| client.put(to).bearer_auth(&self.token).body(body.clone());
                let answer = gpux_client::store::send(&self.store_url, &path, putting).await.map_err(|e| e.to_string())?;
                if !answer.status().is_success() {
                    return Err(format!("putting {relative}: {}", answer.status()));
                }
                // What was read may have changed since: the time read before
                // the body keeps such a file for the next sync.
                self.remember(&key, seen);
                put += 1;
            }
            if area == "checkpoints" && !self.cluster() {
                for relative in remote.keys().filter(|r| !local.contains_key(*r)) {
                    let path = format!("/v1/objects/{}/{area}/{relative}", self.prefix());
                    let _ = gpux_client::store::send(&self.store_url, &path, |to| client.delete(to).bearer_auth(&self.token)).await;
                }
            }
        }
        Ok(put)
    }

    /// The attempt's last output (a bounded tail) at
    /// `logs/attempt-<A>-rank-<R>.log`: what the renter reads with `gpux
    /// job logs` once the job ended, and why a failed job failed.
    pub async fn put_log(&self, tail: &str) -> Result<(), String> {
        let client = Self::client().map_err(|f| f.detail)?;
        let a = &self.assignment;
        let path = format!("/v1/objects/{}/logs/attempt-{}-rank-{}.log", self.prefix(), a.attempt, a.node_rank);
        let put = |to: &str| client.put(to).bearer_auth(&self.token).body(tail.to_string());
        let answer = gpux_client::store::send(&self.store_url, &path, put).await.map_err(|e| e.to_string())?;
        match answer.status().is_success() {
            true => Ok(()),
            false => Err(format!("putting the output: {}", answer.status())),
        }
    }

    fn remember(&self, key: &str, seen: Seen) {
        self.uploaded.lock().unwrap_or_else(|p| p.into_inner()).insert(key.to_string(), seen);
    }

    /// `Err((the renter's fault, detail))`.
    async fn get(&self, client: &reqwest::Client, key: &str) -> Result<bytes::Bytes, (bool, String)> {
        let url = format!("{}/v1/objects/{key}", self.store_url);
        let get = |to: &str| client.get(to).bearer_auth(&self.token);
        let answer = gpux_client::store::send(&self.store_url, &format!("/v1/objects/{key}"), get)
            .await
            .map_err(|e| (false, format!("{url}: {e}")))?;
        match answer.status() {
            status if status.is_success() => answer.bytes().await.map_err(|e| (false, format!("{url}: {e}"))),
            reqwest::StatusCode::NOT_FOUND => Err((true, format!("{url}: not found"))),
            status => Err((false, format!("{url}: {status}"))),
        }
    }

    async fn list(&self, client: &reqwest::Client, area: &str) -> Result<Vec<Listed>, String> {
        let (url, path) = (format!("{}/v1/list/{}/{area}", self.store_url, self.prefix()), format!("/v1/list/{}/{area}", self.prefix()));
        let get = |to: &str| client.get(to).bearer_auth(&self.token);
        let answer = gpux_client::store::send(&self.store_url, &path, get).await.map_err(|e| format!("{url}: {e}"))?;
        if !answer.status().is_success() {
            return Err(format!("{url}: {}", answer.status()));
        }
        let body = answer.bytes().await.map_err(|e| format!("{url}: {e}"))?;
        serde_json::from_slice(&body).map_err(|e| format!("{url}: {e}"))
    }
}

/// `relative` below `root`, refusing anything that would leave it.
pub(super) fn safe_join(root: &Path, relative: &str) -> Option<PathBuf> {
    let ok = relative.split('/').all(|c| !c.is_empty() && c != "." && c != "..");
    ok.then(|| root.join(relative))
}

/// Plain files below `root` by their path relative to it (`/`-separated),
/// with their size and modification time: at most [`FILES_MAX`].
fn list_files(root: &Path) -> Result<BTreeMap<String, (PathBuf, u64, SystemTime)>, String> {
    list_files_within(root, FILES_MAX)
}

/// Plain files below `root`, at most `files_max` of them.
pub(super) fn list_files_within(root: &Path, files_max: usize) -> Result<BTreeMap<String, (PathBuf, u64, SystemTime)>, String> {
    let mut found = BTreeMap::new();
    let mut stack = vec![root.to_path_buf()];
    while let Some(dir) = stack.pop() {
        let entries = match std::fs::read_dir(&dir) {
            Ok(entries) => entries,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
            Err(e) => return Err(format!("{}: {e}", dir.display())),
        };
        for entry in entries {
            let entry = entry.map_err(|e| e.to_string())?;
            let kind = entry.file_type().map_err(|e| e.to_string())?;
            let path = entry.path();
            if kind.is_dir() {
                stack.push(path);
            } else if kind.is_file() {
                let meta = entry.metadata().map_err(|e| e.to_string())?;
                let relative = path.strip_prefix(root).map_err(|e| e.to_string())?.to_string_lossy().replace('\\', "/");
                let modified = meta.modified().map_err(|e| e.to_string())?;
                found.insert(relative, (path, meta.len(), modified));
                if found.len() > files_max {
                    return Err(format!("more than {files_max} files in {}", root.display()));
                }
            }
        }
    }
    Ok(found)
}
