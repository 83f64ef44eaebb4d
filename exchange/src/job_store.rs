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
//! `<renter>/jobs/<job>/outputs/<path>`.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::extract::{Path as UrlPath, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use futures_util::StreamExt;
use gpux_engine::{AccountId, LeaseId};
use gpux_protocol::JobId;
use hmac::{Hmac, Mac};
use object_store::path::Path as StorePath;
use object_store::ObjectStore;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

pub use crate::limits::OBJECTS_PER_ACCOUNT_MAX;
pub use crate::limits::OBJECT_BYTES_MAX;
pub use crate::limits::PUTS_IN_FLIGHT_MAX;
pub use crate::limits::PUTS_PER_UPLOADER_MAX;
pub use crate::limits::QUOTA_BYTES_DEFAULT;
use crate::limits::{PUT_CHUNK_BYTES, PUT_IDLE, PUT_RATE_GRACE, PUT_RATE_MIN_BYTES_PER_S};
/// The whole of one request must be over within this time.
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(600);
use crate::limits::KEY_BYTES_MAX;

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
}

impl Grant {
    fn expires_at_ms(&self) -> u64 {
        match self {
            Grant::Renter { expires_at_ms, .. } | Grant::Host { expires_at_ms, .. } => *expires_at_ms,
        }
    }

    /// Whose share of the upload slots a put under this grant takes.
    fn uploader(&self) -> Uploader {
        match self {
            Grant::Renter { account, participant, .. } => Uploader::Participant(participant.unwrap_or(*account)),
            Grant::Host { lease, .. } => Uploader::Lease(*lease),
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
        }
    }

    /// The prefix a listing may cover.
    fn may_list(&self, owner: AccountId, job: Option<JobId>) -> bool {
        match self {
            Grant::Renter { account, .. } => *account == owner,
            Grant::Host { renter, job: own, .. } => *renter == owner && job == Some(*own),
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
            _ => None,
        }
    }
}

/// How long after its lease ended a host may still put its attempt's
/// output tail (and nothing else).
pub const LOG_GRACE_MS: u64 = 120_000;
/// Ended leases remembered for the log grace (the oldest forgotten first).
const ENDED_KEPT_MAX: usize = 1 << 16;

/// Where a host grant's lease stands.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Standing {
    Running,
    /// Ended less than [`LOG_GRACE_MS`] ago.
    JustEnded,
    Ended,
}

/// The job leases running now, and those that ended within the log grace:
/// what a host's grant needs besides its signature. The sequencer keeps it
/// (from the market at start, then from every lease created and ended);
/// the store's HTTP side reads it.
#[derive(Default)]
pub struct RunningLeases(std::sync::RwLock<Leases>);

#[derive(Default)]
pub struct Leases {
    running: std::collections::HashSet<LeaseId>,
    /// Ended leases by when they ended, oldest first.
    ended: std::collections::VecDeque<(LeaseId, u64)>,
    ended_at: std::collections::HashMap<LeaseId, u64>,
}

impl RunningLeases {
    pub fn standing(&self, lease: LeaseId, now_ms: u64) -> Standing {
        let leases = self.0.read().unwrap_or_else(|e| e.into_inner());
        if leases.running.contains(&lease) {
            return Standing::Running;
        }
        match leases.ended_at.get(&lease) {
            Some(&at_ms) if now_ms < at_ms.saturating_add(LOG_GRACE_MS) => Standing::JustEnded,
            _ => Standing::Ended,
        }
    }

    /// Exactly these leases run from now on.
    pub fn replace(&self, leases: impl IntoIterator<Item = LeaseId>) {
        let mut this = self.0.write().unwrap_or_else(|e| e.into_inner());
        this.running.clear();
        this.running.extend(leases);
    }

    pub fn started(&self, lease: LeaseId) {
        self.0.write().unwrap_or_else(|e| e.into_inner()).running.insert(lease);
    }

    pub fn ended(&self, lease: LeaseId, at_ms: u64) {
        let mut this = self.0.write().unwrap_or_else(|e| e.into_inner());
        if !this.running.remove(&lease) {
            return;
        }
        while this.ended.len() >= ENDED_KEPT_MAX || this.ended.front().is_some_and(|&(_, t)| t.saturating_add(LOG_GRACE_MS) <= at_ms) {
            let Some((old, _)) = this.ended.pop_front() else { break };
            this.ended_at.remove(&old);
        }
        this.ended.push_back((lease, at_ms));
        this.ended_at.insert(lease, at_ms);
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
}

impl Issuer {
    pub fn new(url: String, secret: [u8; 32], running: Arc<RunningLeases>) -> Issuer {
        Issuer { url, secret, running }
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

/// Who an upload slot is counted against.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
enum Uploader {
    Participant(AccountId),
    Lease(LeaseId),
}

/// Uploads in flight: at most `PUTS_IN_FLIGHT_MAX`, `PUTS_PER_UPLOADER_MAX`
/// of one uploader.
#[derive(Default)]
struct Uploads(std::sync::Mutex<std::collections::HashMap<Uploader, usize>>);

/// An upload's slot; dropping it gives the slot back.
struct UploadSlot<'a> {
    uploads: &'a Uploads,
    uploader: Uploader,
}

impl Uploads {
    fn take(&self, uploader: Uploader) -> Result<UploadSlot<'_>, &'static str> {
        let mut open = self.0.lock().unwrap_or_else(|e| e.into_inner());
        if open.get(&uploader).is_some_and(|&n| n >= PUTS_PER_UPLOADER_MAX) {
            return Err("this account (with its sub-accounts), or this lease, has 2 uploads in flight: wait for one to end");
        }
        if open.values().sum::<usize>() >= PUTS_IN_FLIGHT_MAX {
            return Err("the job store takes 16 uploads at once; try again");
        }
        *open.entry(uploader).or_default() += 1;
        Ok(UploadSlot { uploads: self, uploader })
    }
}

impl Drop for UploadSlot<'_> {
    fn drop(&mut self) {
        let mut open = self.uploads.0.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(n) = open.get_mut(&self.uploader) {
            *n -= 1;
            if *n == 0 {
                open.remove(&self.uploader);
            }
        }
    }
}

/// The HTTP side: checks tokens and shares, moves bytes.
pub struct StoreServer {
    store: Arc<dyn ObjectStore>,
    secret: [u8; 32],
    running: Arc<RunningLeases>,
    quota_bytes: u64,
    uploads: Uploads,
    clock: gpux_gateway::link::Clock,
    /// The journal's file system, when the store is on it: puts keep out
    /// of the journal's reserve.
    disk: Option<Arc<crate::disk::Disk>>,
}

#[derive(Serialize, Deserialize)]
pub struct Listed {
    pub key: String,
    pub bytes: u64,
}

type Shared = Arc<StoreServer>;

impl StoreServer {
    pub fn new(
        store: Arc<dyn ObjectStore>,
        secret: [u8; 32],
        running: Arc<RunningLeases>,
        quota_bytes: u64,
        clock: gpux_gateway::link::Clock,
    ) -> StoreServer {
        StoreServer { store, secret, running, quota_bytes, uploads: Uploads::default(), clock, disk: None }
    }

    /// The store shares the journal's file system: a put that would leave
    /// less than twice the journal's reserve free is refused `507
    /// disk_low`, before its body and as it streams.
    pub fn beside_journal(mut self, disk: Arc<crate::disk::Disk>) -> StoreServer {
        self.disk = Some(disk);
        self
    }

    pub fn router(self) -> axum::Router {
        axum::Router::new()
            .route("/v1/objects/{*key}", get(get_object).put(put_object).delete(delete_object))
            .route("/v1/list/{*prefix}", get(list))
            .with_state(Arc::new(self))
    }

    fn grant(&self, headers: &HeaderMap) -> Result<Grant, Refusal> {
        let token = headers
            .get(axum::http::header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("Bearer "))
            .ok_or(Refusal(StatusCode::UNAUTHORIZED, "token_missing", "send Authorization: Bearer <job_store_token>"))?;
        let grant = verify(&self.secret, token, self.clock.now_ms()).ok_or(Refusal(
            StatusCode::UNAUTHORIZED,
            "token_invalid",
            "the token does not verify or has expired: ask for a new one",
        ))?;
        Ok(grant)
    }

    /// A host grant's lease must run; one that ended within the log grace
    /// may put its attempt's output tail (`log_tail`) and nothing else.
    fn check_lease(&self, grant: &Grant, log_tail: bool) -> Result<(), Refusal> {
        let Grant::Host { lease, .. } = grant else { return Ok(()) };
        match self.running.standing(*lease, self.clock.now_ms()) {
            Standing::Running => Ok(()),
            Standing::JustEnded if log_tail => Ok(()),
            Standing::JustEnded | Standing::Ended => Err(Refusal(
                StatusCode::FORBIDDEN,
                "lease_ended",
                "the lease this host token was issued for has ended: a host reaches a job's files only while its lease runs",
            )),
        }
    }

    async fn usage(&self, owner: AccountId) -> Result<(u64, usize), object_store::Error> {
        let prefix = StorePath::from(owner.0.to_string());
        let mut listing = self.store.list(Some(&prefix));
        let (mut bytes, mut objects) = (0u64, 0usize);
        while let Some(meta) = listing.next().await {
            bytes += meta?.size;
            objects += 1;
        }
        Ok((bytes, objects))
    }
}

/// A refusal before any work: the status, a code and a message.
struct Refusal(StatusCode, &'static str, &'static str);

impl IntoResponse for Refusal {
    fn into_response(self) -> Response {
        refuse(self.0, self.1, self.2)
    }
}

/// An error answer: the status and `{"code":..,"message":..}`.
fn refuse(status: StatusCode, code: &'static str, message: &str) -> Response {
    json(status, &serde_json::json!({ "code": code, "message": message }))
}

fn json(status: StatusCode, body: &impl Serialize) -> Response {
    let body = serde_json::to_vec(body).unwrap_or_default();
    (status, [(axum::http::header::CONTENT_TYPE, "application/json")], body).into_response()
}

fn disk_low() -> Response {
    refuse(
        StatusCode::INSUFFICIENT_STORAGE,
        "disk_low",
        "the exchange's disk keeps its last space for the journal: the store takes nothing more until the operator frees space",
    )
}

fn store_failed(error: object_store::Error) -> Response {
    match error {
        object_store::Error::NotFound { .. } => refuse(StatusCode::NOT_FOUND, "not_found", "no such object"),
        error => {
            tracing::warn!(%error, "job store");
            refuse(StatusCode::SERVICE_UNAVAILABLE, "store_unavailable", "the job store's backend failed; try again")
        }
    }
}

fn authorised(server: &StoreServer, headers: &HeaderMap, key: &str, operation: Operation) -> Result<Key, Refusal> {
    let grant = server.grant(headers)?;
    let log_tail = match &grant {
        Grant::Host { attempt, .. } => {
            let name = key.rsplit_once("/logs/").map(|(_, name)| name).unwrap_or_default();
            operation == Operation::Write
                && name
                    .strip_prefix(&format!("attempt-{attempt}-rank-"))
                    .is_some_and(|rank| rank.strip_suffix(".log").is_some_and(|r| !r.is_empty() && r.bytes().all(|b| b.is_ascii_digit())))
        }
        Grant::Renter { .. } => false,
    };
    server.check_lease(&grant, log_tail)?;
    let parsed = Key::parse(key).ok_or(Refusal(
        StatusCode::BAD_REQUEST,
        "key_invalid",
        "keys are <account>/bundles/<sha256>.tar.gz or <account>/jobs/<job>/(checkpoints|outputs|logs)/<path>",
    ))?;
    if !grant.allows(operation, &parsed) {
        return Err(Refusal(StatusCode::FORBIDDEN, "forbidden", "the token does not open this key for this operation"));
    }
    Ok(parsed)
}

async fn get_object(State(server): State<Shared>, UrlPath(key): UrlPath<String>, headers: HeaderMap) -> Response {
    if let Err(refused) = authorised(&server, &headers, &key, Operation::Read) {
        return refused.into_response();
    }
    match server.store.get(&StorePath::from(key.as_str())).await {
        Ok(found) => {
            let size = found.meta.size;
            let stream = found.into_stream();
            Response::builder()
                .header(axum::http::header::CONTENT_LENGTH, size)
                .body(Body::from_stream(stream))
                .unwrap_or_else(|_| refuse(StatusCode::INTERNAL_SERVER_ERROR, "internal", "building the answer"))
        }
        Err(error) => store_failed(error),
    }
}

async fn put_object(State(server): State<Shared>, UrlPath(key): UrlPath<String>, headers: HeaderMap, body: Body) -> Response {
    let parsed = match authorised(&server, &headers, &key, Operation::Write) {
        Ok(parsed) => parsed,
        Err(refused) => return refused.into_response(),
    };
    let uploader = match server.grant(&headers) {
        Ok(grant) => grant.uploader(),
        Err(refused) => return refused.into_response(),
    };
    // A declared length that can never fit is refused before any body is
    // read or an upload slot taken.
    let declared = headers.get(axum::http::header::CONTENT_LENGTH).and_then(|v| v.to_str().ok()).and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|bytes| bytes > OBJECT_BYTES_MAX) {
        return refuse(StatusCode::PAYLOAD_TOO_LARGE, "too_large", "an object is at most 1 GiB");
    }
    if declared.is_some_and(|bytes| bytes > server.quota_bytes) {
        return refuse(
            StatusCode::INSUFFICIENT_STORAGE,
            "quota_exceeded",
            "the object is larger than the account's share of the job store",
        );
    }
    let _slot = match server.uploads.take(uploader) {
        Ok(slot) => slot,
        Err(why) => return refuse(StatusCode::SERVICE_UNAVAILABLE, "busy", why),
    };
    let (owner, sha256) = match &parsed {
        Key::Bundle { owner, sha256 } | Key::Input { owner, sha256 } => (*owner, Some(sha256.clone())),
        Key::Job { owner, .. } => (*owner, None),
    };
    let path = StorePath::from(key.as_str());
    let replaced = match server.store.head(&path).await {
        Ok(meta) => meta.size,
        Err(object_store::Error::NotFound { .. }) => 0,
        Err(error) => return store_failed(error),
    };
    // The room the account has for this object, checked before its body.
    let room = match server.usage(owner).await {
        Ok((used, objects)) => {
            if replaced == 0 && objects >= OBJECTS_PER_ACCOUNT_MAX {
                return refuse(StatusCode::INSUFFICIENT_STORAGE, "quota_exceeded", "the account holds 10 000 objects in the job store");
            }
            server.quota_bytes.saturating_sub(used - replaced.min(used))
        }
        Err(error) => return store_failed(error),
    };
    let full =
        || refuse(StatusCode::INSUFFICIENT_STORAGE, "quota_exceeded", "the account's share of the job store is full: delete old results");
    if declared.is_some_and(|bytes| bytes > room) {
        return full();
    }
    if server.disk.as_ref().is_some_and(|disk| !disk.others_may_write(declared.unwrap_or(0))) {
        return disk_low();
    }
    let upload = match server.store.put_multipart(&path).await {
        Ok(upload) => upload,
        Err(error) => return store_failed(error),
    };
    match stream_body(body, upload, room.min(OBJECT_BYTES_MAX), declared, sha256.as_deref(), server.disk.as_deref()).await {
        Ok(()) => StatusCode::CREATED.into_response(),
        Err(Streamed::Store(error)) => store_failed(error),
        Err(Streamed::Full) => full(),
        Err(Streamed::DiskLow) => disk_low(),
        Err(Streamed::Refused(status, code, message)) => refuse(status, code, message),
    }
}

/// Why a streamed put did not land (nothing of it is visible then).
enum Streamed {
    Store(object_store::Error),
    /// Past the account's room.
    Full,
    /// Into twice the journal's reserve.
    DiskLow,
    Refused(StatusCode, &'static str, &'static str),
}

/// Moves a put's body to the backend part by part (at most
/// `PUT_CHUNK_BYTES` buffered and two parts in flight), at most `limit`
/// bytes, a declared length kept to, and a bundle's SHA-256 checked
/// before the object is completed; a body that stalls for `PUT_IDLE`, or
/// averages less than `PUT_RATE_MIN_BYTES_PER_S` after `PUT_RATE_GRACE`,
/// is cut off. Any refusal aborts the upload: the key keeps what it held.
async fn stream_body(
    body: Body,
    upload: Box<dyn object_store::MultipartUpload>,
    limit: u64,
    declared: Option<u64>,
    sha256: Option<&str>,
    disk: Option<&crate::disk::Disk>,
) -> Result<(), Streamed> {
    let mut writer = object_store::WriteMultipart::new_with_chunk_size(upload, PUT_CHUNK_BYTES);
    let outcome = async {
        let mut stream = body.into_data_stream();
        let mut hasher = Sha256::new();
        let (mut received, started) = (0u64, tokio::time::Instant::now());
        loop {
            let chunk = match tokio::time::timeout(PUT_IDLE, stream.next()).await {
                Err(_) => return Err(Streamed::Refused(StatusCode::REQUEST_TIMEOUT, "upload_stalled", "the body sent nothing for 10 s")),
                Ok(None) => break,
                Ok(Some(Err(_))) => return Err(Streamed::Refused(StatusCode::BAD_REQUEST, "upload_broken", "the body ended early")),
                Ok(Some(Ok(chunk))) => chunk,
            };
            received += chunk.len() as u64;
            if received > OBJECT_BYTES_MAX {
                return Err(Streamed::Refused(StatusCode::PAYLOAD_TOO_LARGE, "too_large", "an object is at most 1 GiB"));
            }
            if received > limit {
                return Err(Streamed::Full);
            }
            let elapsed = started.elapsed();
            if elapsed > PUT_RATE_GRACE && received < (elapsed - PUT_RATE_GRACE).as_secs() * PUT_RATE_MIN_BYTES_PER_S {
                return Err(Streamed::Refused(
                    StatusCode::REQUEST_TIMEOUT,
                    "upload_too_slow",
                    "the body arrives at less than 256 KiB/s: upload from a faster link",
                ));
            }
            // The disk, read once per part (the parts written so far are on it).
            let part = PUT_CHUNK_BYTES as u64;
            if received / part != (received - chunk.len() as u64) / part && disk.is_some_and(|disk| !disk.others_may_write(part)) {
                return Err(Streamed::DiskLow);
            }
            hasher.update(&chunk);
            writer.wait_for_capacity(2).await.map_err(Streamed::Store)?;
            writer.write(&chunk);
        }
        if declared.is_some_and(|bytes| bytes != received) {
            return Err(Streamed::Refused(StatusCode::BAD_REQUEST, "upload_broken", "the body is not as long as its Content-Length"));
        }
        if sha256.is_some_and(|sha| hex::encode(hasher.finalize()) != sha) {
            return Err(Streamed::Refused(StatusCode::BAD_REQUEST, "hash_mismatch", "the bundle's SHA-256 is not the one its key names"));
        }
        Ok(())
    }
    .await;
    match outcome {
        Ok(()) => writer.finish().await.map(|_| ()).map_err(Streamed::Store),
        Err(refused) => {
            let _ = writer.abort().await;
            Err(refused)
        }
    }
}

async fn delete_object(State(server): State<Shared>, UrlPath(key): UrlPath<String>, headers: HeaderMap) -> Response {
    let parsed = match authorised(&server, &headers, &key, Operation::Write) {
        Ok(parsed) => parsed,
        Err(refused) => return refused.into_response(),
    };
    // Bundles are named by their content and may serve several jobs: a
    // renter replaces them, nobody deletes one through the API.
    if matches!(parsed, Key::Bundle { .. } | Key::Input { .. }) {
        return refuse(StatusCode::FORBIDDEN, "forbidden", "bundles are not deleted through the API");
    }
    match server.store.delete(&StorePath::from(key.as_str())).await {
        Ok(()) | Err(object_store::Error::NotFound { .. }) => StatusCode::NO_CONTENT.into_response(),
        Err(error) => store_failed(error),
    }
}

/// `GET /v1/list/<account>[/jobs/<job>[/<area>]]`: `[{"key":..,"bytes":..}]`.
async fn list(State(server): State<Shared>, UrlPath(prefix): UrlPath<String>, headers: HeaderMap) -> Response {
    let grant = match server.grant(&headers) {
        Ok(grant) => grant,
        Err(refused) => return refused.into_response(),
    };
    let parts: Vec<&str> = prefix.trim_end_matches('/').split('/').collect();
    let owner = parts.first().and_then(|p| p.parse::<u64>().ok()).map(|id| AccountId(id as _));
    let job = match parts.get(1..) {
        Some(["jobs", job, ..]) => job.parse::<u64>().ok().map(JobId),
        _ => None,
    };
    let shape_ok = parts.iter().all(|c| component_ok(c)) && parts.len() <= 4;
    let Some(owner) = owner.filter(|_| shape_ok) else {
        return refuse(StatusCode::BAD_REQUEST, "key_invalid", "list <account>, <account>/jobs/<job> or <account>/jobs/<job>/<area>");
    };
    if let Err(refused) = server.check_lease(&grant, false) {
        return refused.into_response();
    }
    if !grant.may_list(owner, job) {
        return refuse(StatusCode::FORBIDDEN, "forbidden", "the token does not open this prefix");
    }
    let mut listing = server.store.list(Some(&StorePath::from(prefix.trim_end_matches('/'))));
    let mut found = Vec::new();
    while let Some(meta) = listing.next().await {
        match meta {
            Ok(meta) if found.len() < OBJECTS_PER_ACCOUNT_MAX => found.push(Listed { key: meta.location.to_string(), bytes: meta.size }),
            Ok(_) => break,
            Err(error) => return store_failed(error),
        }
    }
    found.sort_by(|a, b| a.key.cmp(&b.key));
    json(StatusCode::OK, &found)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_store_the_exchange_cannot_speak_is_refused_at_start() {
        let dir = tempfile::tempdir().expect("temp dir");
        let refused = open("ftp://host/path", dir.path()).expect_err("refused").to_string();
        assert!(refused.contains("expected local, file:///DIR, s3://BUCKET"), "{refused}");
        assert!(open("local", dir.path()).is_ok() && dir.path().join("job-store").is_dir());
    }

    /// A local store's root is owner-only, even one that existed with
    /// wider modes: nothing below it is readable by another user.
    #[test]
    fn a_local_stores_root_is_owner_only() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().expect("temp dir");
        open("local", dir.path()).expect("opens");
        let mode = |path: &Path| std::fs::metadata(path).expect("there").permissions().mode() & 0o777;
        assert_eq!(mode(&dir.path().join("job-store")), 0o700);
        let shared = dir.path().join("shared");
        std::fs::create_dir_all(&shared).expect("dir");
        std::fs::set_permissions(&shared, std::fs::Permissions::from_mode(0o755)).expect("chmod");
        open(&format!("file://{}", shared.display()), dir.path()).expect("opens");
        assert_eq!(mode(&shared), 0o700);
    }

    #[test]
    fn keys_parse_strictly() {
        let sha = "ab".repeat(32);
        assert_eq!(Key::parse(&format!("7/bundles/{sha}.tar.gz")), Some(Key::Bundle { owner: AccountId(7), sha256: sha.clone() }));
        assert_eq!(
            Key::parse("7/jobs/3/checkpoints/step-10.json"),
            Some(Key::Job { owner: AccountId(7), job: JobId(3), rest: "checkpoints/step-10.json".into() })
        );
        for bad in [
            "7/bundles/x.tar.gz",
            "7/jobs/3/other/a",
            "7/jobs/3/outputs/../a",
            "7/jobs/3/outputs",
            "x/jobs/3/outputs/a",
            "/7/jobs/3/outputs/a",
        ] {
            assert_eq!(Key::parse(bad), None, "{bad}");
        }
    }

    #[test]
    fn grants_open_what_they_name_only() {
        let issuer = Issuer::new("http://store".into(), [9; 32], Arc::default());
        let sha = "cd".repeat(32);
        let host = Grant::Host {
            renter: AccountId(7),
            job: JobId(3),
            lease: LeaseId(11),
            attempt: 1,
            bundle: Some(sha.clone()),
            inputs: vec!["ab".repeat(32)],
            expires_at_ms: 2_000,
        };
        let token = issuer.issue(&host);
        assert_eq!(verify(&[9; 32], &token, 1_000), Some(host.clone()));
        assert_eq!(verify(&[9; 32], &token, 2_000), None, "expired");
        assert_eq!(verify(&[8; 32], &token, 1_000), None, "another secret");
        let other = issuer.issue(&Grant::Host {
            renter: AccountId(7),
            job: JobId(4),
            lease: LeaseId(11),
            attempt: 1,
            bundle: None,
            inputs: Vec::new(),
            expires_at_ms: 2_000,
        });
        let forged = format!("{}.{}", other.split('.').next().expect("a body"), token.split('.').nth(1).expect("a tag"));
        assert_eq!(verify(&[9; 32], &forged, 1_000), None, "a changed body");
        let key = |k: &str| Key::parse(k).expect("valid");
        assert!(host.allows(Operation::Read, &key(&format!("7/bundles/{sha}.tar.gz"))));
        assert!(!host.allows(Operation::Write, &key(&format!("7/bundles/{sha}.tar.gz"))));
        assert!(!host.allows(Operation::Read, &key(&format!("7/bundles/{}.tar.gz", "ee".repeat(32)))));
        assert!(host.allows(Operation::Write, &key("7/jobs/3/outputs/model.bin")));
        assert!(host.allows(Operation::Read, &key(&format!("7/inputs/{}.tar.gz", "ab".repeat(32)))), "its job's input");
        assert!(!host.allows(Operation::Read, &key(&format!("7/inputs/{}.tar.gz", "ef".repeat(32)))), "another input");
        assert!(!host.allows(Operation::Read, &key("7/jobs/4/outputs/model.bin")), "another job");
        assert!(!host.allows(Operation::Read, &key("8/jobs/3/outputs/model.bin")), "another renter");
        let renter = Grant::Renter { account: AccountId(7), participant: None, expires_at_ms: 2_000 };
        assert!(renter.allows(Operation::Write, &key(&format!("7/bundles/{sha}.tar.gz"))));
        assert!(renter.allows(Operation::Read, &key("7/jobs/4/outputs/model.bin")));
        assert!(!renter.allows(Operation::Write, &key("7/jobs/4/outputs/model.bin")), "results are the host's to write");
        assert!(!renter.allows(Operation::Read, &key("8/jobs/4/outputs/model.bin")));
    }
}
