//! The job store (docs/jobs.md "Code and data"): where a job's code bundle,
//! checkpoints and outputs live, so that neither the sequencer nor the
//! journal carries bulk data. Objects are kept through the `object_store`
//! crate: local files under the data directory by default (nothing to
//! install), any S3-compatible store (`--job-store s3://bucket`, its
//! endpoint and keys from the standard `AWS_*` environment variables),
//! Google Cloud Storage (`gs://`) or Azure Blob Storage (`az://`).
//!
//! Clients and hosts reach it over a small HTTP API on its own listener
//! (`--job-store-listen`), with a bearer token the sequencer signs
//! (`job_store_token`): a renter's token opens its own prefix (it uploads
//! bundles and reads its jobs' results); a host's token opens the bundle
//! and the directory of the one job its lease runs, while that lease runs
//! ([`RunningLeases`], kept by the sequencer: refused `lease_ended` the
//! moment the lease ends; a re-match's new lease has a token of its own),
//! except that for [`LOG_GRACE_MS`] after the end it may still put its own
//! attempt's output tail (`logs/attempt-<A>-rank-<R>.log`), which its
//! host can only take once the workload is stopped.
//! Tokens are
//! HMAC-SHA-256 under a secret kept in the data directory
//! (`job-store.key`), so the HTTP side checks them without asking the
//! sequencer. Each renter's prefix holds at most its quota of bytes and
//! objects: one account cannot fill the store.
//!
//! Keys: `<renter>/bundles/<sha256>.tar.gz` and `<renter>/inputs/<sha256>.tar.gz`
//! (the server checks the hash of what is put), `<renter>/jobs/<job>/checkpoints/<path>`,
//! `<renter>/jobs/<job>/outputs/<path>`, and a volume's files
//! `<renter>/volumes/<volume>/<path>` (docs/storage.md): opened by a
//! volume token only (the renter's, or a host's for the volumes of one of
//! its running leases, writable unless mounted read-only), within the
//! volume's size and file count rather than the account's quota.

mod leases;
mod server;
#[cfg(test)]
mod tests;

pub use leases::{RunningLeases, Standing, LOG_GRACE_MS};
pub use server::{Listed, StoreServer};

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use gpux_engine::{AccountId, LeaseId};
use gpux_protocol::{JobId, VolumeId};
use hmac::{Hmac, Mac};
use object_store::ObjectStore;
use serde::{Deserialize, Serialize};
use sha2::Sha256;

use crate::limits::KEY_BYTES_MAX;
pub use crate::limits::OBJECTS_PER_ACCOUNT_MAX;
pub use crate::limits::OBJECT_BYTES_MAX;
pub use crate::limits::PUTS_IN_FLIGHT_MAX;
pub use crate::limits::PUTS_PER_UPLOADER_MAX;
pub use crate::limits::QUOTA_BYTES_DEFAULT;
use server::Uploader;

/// The whole of one request must be over within this time.
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(600);

/// What a token opens.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Grant {
    /// The renter's own prefix: read all, put bundles. `participant`: its
    /// account's parent for a sub-account (whose share of the upload
    /// slots it takes; its own account when absent).
    Renter {
        account: AccountId,
        #[serde(default)]
        participant: Option<AccountId>,
        expires_at_ms: u64,
    },
    /// A host running `job` of `renter`: read its bundle and its inputs in
    /// the store, read and write (and delete) its checkpoints and outputs.
    Host {
        renter: AccountId,
        job: JobId,
        /// The lease the host runs the job on, for `attempt`: the grant
        /// holds while it runs.
        lease: LeaseId,
        attempt: u32,
        bundle: Option<String>,
        #[serde(default)]
        inputs: Vec<String>,
        expires_at_ms: u64,
    },
    /// Volumes of `owner`: the renter's own token for one (`lease` absent),
    /// or a host's for those attached to its running `lease`.
    Volume {
        owner: AccountId,
        #[serde(default)]
        lease: Option<LeaseId>,
        volumes: Vec<VolumeAccess>,
        expires_at_ms: u64,
    },
}

/// One volume a token opens.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct VolumeAccess {
    pub volume: VolumeId,
    pub writable: bool,
    /// Its size: what its files may hold together.
    pub bytes_max: u64,
}

impl Grant {
    /// When the token that carries it stops verifying.
    pub fn expires_at_ms(&self) -> u64 {
        match self {
            Grant::Renter { expires_at_ms, .. } | Grant::Host { expires_at_ms, .. } | Grant::Volume { expires_at_ms, .. } => *expires_at_ms,
        }
    }

    /// Whose share of the upload slots a put under this grant takes.
    fn uploader(&self) -> Uploader {
        match self {
            Grant::Renter { account, participant, .. } => Uploader::Participant(participant.unwrap_or(*account)),
            Grant::Host { lease, .. } | Grant::Volume { lease: Some(lease), .. } => Uploader::Lease(*lease),
            Grant::Volume { owner, lease: None, .. } => Uploader::Participant(*owner),
        }
    }

    /// Whether the grant lets `operation` touch `key`.
    fn allows(&self, operation: Operation, key: &Key) -> bool {
        match (self, key) {
            (Grant::Renter { account, .. }, Key::Bundle { owner, .. } | Key::Input { owner, .. }) => owner == account,
            (Grant::Host { renter, inputs, .. }, Key::Input { owner, sha256 }) => {
                owner == renter && operation == Operation::Read && inputs.iter().any(|i| i == sha256)
            }
            (Grant::Renter { account, .. }, Key::Job { owner, .. }) => owner == account && operation == Operation::Read,
            (Grant::Host { renter, bundle, .. }, Key::Bundle { owner, sha256 }) => {
                owner == renter && operation == Operation::Read && bundle.as_deref() == Some(sha256.as_str())
            }
            (Grant::Host { renter, job, .. }, Key::Job { owner, job: of, .. }) => owner == renter && of == job,
            (Grant::Volume { owner, volumes, .. }, Key::Volume { owner: of, volume, .. }) => {
                owner == of && volumes.iter().any(|v| v.volume == *volume && (operation == Operation::Read || v.writable))
            }
            (Grant::Volume { .. }, _) | (_, Key::Volume { .. }) => false,
        }
    }

    /// The volume `key` is in, as this grant opens it.
    fn volume(&self, key: &Key) -> Option<&VolumeAccess> {
        match (self, key) {
            (Grant::Volume { volumes, .. }, Key::Volume { volume, .. }) => volumes.iter().find(|v| v.volume == *volume),
            _ => None,
        }
    }

    /// The prefix a listing may cover: a job's or the account's (no
    /// volume's files), or one volume's.
    fn may_list(&self, owner: AccountId, job: Option<JobId>, volume: Option<VolumeId>) -> bool {
        match (self, volume) {
            (Grant::Renter { account, .. }, None) => *account == owner,
            (Grant::Host { renter, job: own, .. }, None) => *renter == owner && job == Some(*own),
            (Grant::Volume { owner: of, volumes, .. }, Some(volume)) => *of == owner && volumes.iter().any(|v| v.volume == volume),
            _ => false,
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Operation {
    Read,
    Write,
}

/// A key the store serves, parsed.
#[derive(Debug, PartialEq, Eq)]
enum Key {
    Bundle {
        owner: AccountId,
        sha256: String,
    },
    /// A packed input, named by its hash like a bundle.
    Input {
        owner: AccountId,
        sha256: String,
    },
    Job {
        owner: AccountId,
        job: JobId,
        rest: String,
    },
    /// A file of a volume.
    Volume {
        owner: AccountId,
        volume: VolumeId,
    },
}

fn component_ok(c: &str) -> bool {
    !c.is_empty() && c != "." && c != ".." && c.len() <= 255 && c.bytes().all(|b| b.is_ascii_alphanumeric() || b"._-+=@,".contains(&b))
}

impl Key {
    fn parse(key: &str) -> Option<Key> {
        if key.len() > KEY_BYTES_MAX {
            return None;
        }
        let parts: Vec<&str> = key.split('/').collect();
        if !parts.iter().all(|c| component_ok(c)) {
            return None;
        }
        let owner = AccountId(parts.first()?.parse().ok()?);
        match parts.get(1..)? {
            [area @ ("bundles" | "inputs"), file] => {
                let sha256 = file.strip_suffix(".tar.gz")?;
                let named = sha256.len() == 64 && sha256.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'));
                let sha256 = sha256.to_string();
                named.then(|| if *area == "bundles" { Key::Bundle { owner, sha256 } } else { Key::Input { owner, sha256 } })
            }
            ["jobs", job, area @ ("checkpoints" | "outputs" | "logs"), rest @ ..] if !rest.is_empty() => {
                Some(Key::Job { owner, job: JobId(job.parse().ok()?), rest: format!("{area}/{}", rest.join("/")) })
            }
            ["volumes", volume, rest @ ..] if !rest.is_empty() => Some(Key::Volume { owner, volume: VolumeId(volume.parse().ok()?) }),
            _ => None,
        }
    }
}

/// Signs tokens (the sequencer's side).
#[derive(Clone)]
pub struct Issuer {
    /// The store's URL as clients reach it.
    pub url: String,
    secret: [u8; 32],
    /// The job leases running, shared with the store's HTTP side.
    pub running: Arc<RunningLeases>,
    /// Where deleted volumes' prefixes go to have their files removed.
    purges: Option<tokio::sync::mpsc::UnboundedSender<String>>,
}

impl Issuer {
    pub fn new(url: String, secret: [u8; 32], running: Arc<RunningLeases>) -> Issuer {
        Issuer { url, secret, running, purges: None }
    }

    /// Sends deleted volumes' prefixes to `purges` (the store server's).
    pub fn purging(mut self, purges: tokio::sync::mpsc::UnboundedSender<String>) -> Issuer {
        self.purges = Some(purges);
        self
    }

    /// Has the files of `owner`'s deleted volume removed from the store.
    pub fn purge_volume(&self, owner: AccountId, volume: VolumeId) {
        if let Some(purges) = &self.purges {
            let _ = purges.send(format!("{}/volumes/{}", owner.0, volume.0));
        }
    }

    /// `hex(JSON of the grant).hex(HMAC-SHA-256 of it)`.
    pub fn issue(&self, grant: &Grant) -> String {
        let body = hex::encode(serde_json::to_vec(grant).expect("a grant encodes"));
        let tag = hex::encode(mac(&self.secret, body.as_bytes()));
        format!("{body}.{tag}")
    }
}

fn mac(secret: &[u8; 32], body: &[u8]) -> [u8; 32] {
    let mut mac = <Hmac<Sha256> as Mac>::new_from_slice(secret).expect("any key length");
    mac.update(body);
    mac.finalize().into_bytes().into()
}

/// The grant a token carries, if it verifies and has not expired.
pub fn verify(secret: &[u8; 32], token: &str, now_ms: u64) -> Option<Grant> {
    let (body, tag) = token.split_once('.')?;
    let tag = hex::decode(tag).ok()?;
    let mut check = <Hmac<Sha256> as Mac>::new_from_slice(secret).expect("any key length");
    check.update(body.as_bytes());
    check.verify_slice(&tag).ok()?;
    let grant: Grant = serde_json::from_slice(&hex::decode(body).ok()?).ok()?;
    (grant.expires_at_ms() > now_ms).then_some(grant)
}

/// The secret tokens are signed with: 32 random bytes kept like the
/// exchange's own key (created on first start, owner-only).
pub fn load_or_create_secret(path: &Path) -> anyhow::Result<[u8; 32]> {
    Ok(crate::identity::load_or_create(path)?.to_bytes())
}

/// A local store's root, created if need be and made owner-only (0700):
/// renters' code, checkpoints and outputs below it are readable by no other
/// user of the host, whatever modes the files get inside.
fn private_root(root: &Path) -> anyhow::Result<()> {
    use std::os::unix::fs::PermissionsExt;
    std::fs::create_dir_all(root)?;
    std::fs::set_permissions(root, std::fs::Permissions::from_mode(0o700))?;
    Ok(())
}

/// A local store's root folder (`local`: the data directory's
/// `job-store`, `file:///DIR`), none for a remote one.
pub fn local_root(spec: &str, data_dir: &Path) -> Option<std::path::PathBuf> {
    match spec {
        "local" => Some(data_dir.join("job-store")),
        _ => spec.strip_prefix("file://").map(std::path::PathBuf::from),
    }
}

/// Where objects live (`--job-store`).
pub fn open(spec: &str, data_dir: &Path) -> anyhow::Result<Arc<dyn ObjectStore>> {
    if spec == "local" {
        let root = data_dir.join("job-store");
        private_root(&root)?;
        return Ok(Arc::new(object_store::local::LocalFileSystem::new_with_prefix(root)?));
    }
    if let Some(dir) = spec.strip_prefix("file://") {
        private_root(Path::new(dir))?;
        return Ok(Arc::new(object_store::local::LocalFileSystem::new_with_prefix(dir)?));
    }
    if spec.starts_with("s3://") {
        let store = object_store::aws::AmazonS3Builder::from_env().with_url(spec).with_allow_http(true).build()?;
        return Ok(Arc::new(store));
    }
    if spec.starts_with("gs://") {
        // Credentials from GOOGLE_SERVICE_ACCOUNT (a key file) or the environment's.
        return Ok(Arc::new(object_store::gcp::GoogleCloudStorageBuilder::from_env().with_url(spec).build()?));
    }
    if spec.starts_with("az://") || spec.starts_with("abfs://") {
        // AZURE_STORAGE_ACCOUNT_NAME with AZURE_STORAGE_ACCOUNT_KEY (or a SAS, or the environment's identity).
        return Ok(Arc::new(object_store::azure::MicrosoftAzureBuilder::from_env().with_url(spec).build()?));
    }
    anyhow::bail!("--job-store {spec}: expected local, file:///DIR, s3://BUCKET, gs://BUCKET, az://CONTAINER or off")
}

/// The key tokens are signed with on every node of a cluster: derived from
/// the cluster's secret, which every node holds, so a token one node's
/// sequencer signed verifies on every node's store. Rotating the cluster
/// secret (a restart of every node) rotates it; tokens signed before are
/// refused `token_invalid` unless the node is given the previous secret
/// (`--previous-cluster-secret-file`, `StoreServer::also_accepting`), as it
/// should be while jobs started before the rotation run: their hosts keep
/// the tokens their assignments carried.
pub fn cluster_key(cluster_secret: &[u8]) -> [u8; 32] {
    let mut mac = <Hmac<Sha256> as Mac>::new_from_slice(cluster_secret).expect("any key length");
    mac.update(b"gpux job store tokens v1");
    mac.finalize().into_bytes().into()
}

/// Why a cluster does not run this job store: objects must be where every
/// node reads them (docs/operations.md "A replicated cluster").
pub fn check_shared(spec: &str) -> anyhow::Result<()> {
    if spec == "local" || spec.starts_with("file://") {
        anyhow::bail!(
            "--job-store {spec}: a cluster's job store must be shared by every node (s3://BUCKET, gs://BUCKET or az://CONTAINER); files on one node are not on the others, and a job whose leader moves would lose its code and checkpoints"
        );
    }
    Ok(())
}

/// Opens the job store's backend and binds its listener (before the
/// runtime starts, so that the sequencer knows the URL to hand out).
/// `key`: the token key every node of a cluster derives ([`cluster_key`]);
/// a single node keeps its own in the data directory (`job-store.key`).
pub(crate) fn bind(
    config: &crate::JobStoreConfig,
    data_dir: &std::path::Path,
    clock: gpux_gateway::link::Clock,
    disk: Arc<crate::disk::Disk>,
    key: Option<[u8; 32]>,
) -> anyhow::Result<(std::net::TcpListener, StoreServer, Issuer)> {
    let store = open(&config.store, data_dir)?;
    let secret = match key {
        Some(key) => key,
        None => load_or_create_secret(&data_dir.join("job-store.key"))?,
    };
    let listener = std::net::TcpListener::bind(config.listen).with_context(|| format!("binding {}", config.listen))?;
    listener.set_nonblocking(true)?;
    let url = config.url.clone().unwrap_or(format!("http://{}", listener.local_addr()?));
    crate::say(&format!("job store on {url} ({})", config.store));
    let running = std::sync::Arc::new(RunningLeases::default());
    let (purge_tx, purge_rx) = tokio::sync::mpsc::unbounded_channel();
    let mut server = StoreServer::new(store, secret, running.clone(), config.quota_bytes, clock).purging(purge_rx);
    // A store on the journal's file system keeps out of its reserve.
    if local_root(&config.store, data_dir).is_some_and(|root| disk.holds(&root)) {
        server = server.beside_journal(disk);
    }
    Ok((listener, server, Issuer::new(url, secret, running).purging(purge_tx)))
}
