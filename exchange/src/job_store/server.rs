//! The store's HTTP side: checks tokens and shares, moves bytes.

use std::sync::Arc;

use axum::body::Body;
use axum::extract::{Path as UrlPath, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use futures_util::StreamExt;
use gpux_engine::{AccountId, LeaseId};
use object_store::path::Path as StorePath;
use object_store::ObjectStore;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use gpux_protocol::JobId;

use super::{component_ok, verify, Grant, Key, Operation, RunningLeases, Standing};
use super::{OBJECTS_PER_ACCOUNT_MAX, OBJECT_BYTES_MAX, PUTS_IN_FLIGHT_MAX, PUTS_PER_UPLOADER_MAX};
use crate::limits::{PUT_CHUNK_BYTES, PUT_IDLE, PUT_RATE_GRACE, PUT_RATE_MIN_BYTES_PER_S};

/// Who an upload slot is counted against.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(super) enum Uploader {
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
    /// A key tokens were signed with before a rotation, still accepted.
    previous: Option<[u8; 32]>,
    running: Arc<RunningLeases>,
    quota_bytes: u64,
    uploads: Uploads,
    clock: gpux_gateway::link::Clock,
    /// The journal's file system, when the store is on it: puts keep out
    /// of the journal's reserve.
    disk: Option<Arc<crate::disk::Disk>>,
    /// Prefixes of deleted volumes whose files are to be removed (the
    /// sequencer sends them; `router` starts the task that removes them).
    purges: std::sync::Mutex<Option<tokio::sync::mpsc::UnboundedReceiver<String>>>,
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
        StoreServer {
            store,
            secret,
            previous: None,
            running,
            quota_bytes,
            uploads: Uploads::default(),
            clock,
            disk: None,
            purges: std::sync::Mutex::new(None),
        }
    }

    /// Removes the files under each prefix `purges` sends (deleted
    /// volumes), once `router` runs within a runtime.
    pub fn purging(self, purges: tokio::sync::mpsc::UnboundedReceiver<String>) -> StoreServer {
        *self.purges.lock().unwrap_or_else(|e| e.into_inner()) = Some(purges);
        self
    }

    /// The store shares the journal's file system: a put that would leave
    /// less than twice the journal's reserve free is refused `507
    /// disk_low`, before its body and as it streams.
    pub fn beside_journal(mut self, disk: Arc<crate::disk::Disk>) -> StoreServer {
        self.disk = Some(disk);
        self
    }

    /// Tokens signed with `previous` (the key before a rotation) verify
    /// too, until the operator drops it.
    pub fn also_accepting(mut self, previous: [u8; 32]) -> StoreServer {
        self.previous = Some(previous);
        self
    }

    /// The grant `token` carries, under the key or the previous one.
    pub(super) fn verify_token(&self, token: &str) -> Option<Grant> {
        let now_ms = self.clock.now_ms();
        verify(&self.secret, token, now_ms).or_else(|| self.previous.and_then(|previous| verify(&previous, token, now_ms)))
    }

    pub fn router(self) -> axum::Router {
        let purges = self.purges.lock().unwrap_or_else(|e| e.into_inner()).take();
        if let (Some(purges), Ok(runtime)) = (purges, tokio::runtime::Handle::try_current()) {
            runtime.spawn(purge(self.store.clone(), purges));
        }
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
        let grant = self.verify_token(token).ok_or(Refusal(
            StatusCode::UNAUTHORIZED,
            "token_invalid",
            "the token does not verify or has expired: ask for a new one",
        ))?;
        Ok(grant)
    }

    /// A host grant's lease must run; one that ended within the log grace
    /// may put its attempt's output tail (`log_tail`) and nothing else, and
    /// a host's volume grant may make its last sync.
    fn check_lease(&self, grant: &Grant, log_tail: bool) -> Result<(), Refusal> {
        let (Grant::Host { lease, .. } | Grant::Volume { lease: Some(lease), .. }) = grant else { return Ok(()) };
        let log_tail = log_tail && matches!(grant, Grant::Host { .. });
        // A lease's volumes take their host's last sync, once the workload
        // is gone, within the same grace.
        let last_sync = matches!(grant, Grant::Volume { .. });
        match self.running.standing(*lease, self.clock.now_ms()) {
            Standing::Running => Ok(()),
            Standing::JustEnded if log_tail || last_sync => Ok(()),
            Standing::JustEnded | Standing::Ended => Err(Refusal(
                StatusCode::FORBIDDEN,
                "lease_ended",
                "the lease this host token was issued for has ended: a host reaches a job's files only while its lease runs",
            )),
        }
    }

    /// What the account's jobs and bundles hold (not its volumes, which
    /// each have their own size), bytes and objects.
    async fn usage(&self, owner: AccountId) -> Result<(u64, usize), object_store::Error> {
        let prefix = StorePath::from(owner.0.to_string());
        let volumes = format!("{}/volumes/", owner.0);
        let mut listing = self.store.list(Some(&prefix));
        let (mut bytes, mut objects) = (0u64, 0usize);
        while let Some(meta) = listing.next().await {
            let meta = meta?;
            if !meta.location.as_ref().starts_with(&volumes) {
                bytes += meta.size;
                objects += 1;
            }
        }
        Ok((bytes, objects))
    }

    /// What one volume's files hold, bytes and objects.
    async fn volume_usage(&self, owner: AccountId, volume: gpux_protocol::VolumeId) -> Result<(u64, usize), object_store::Error> {
        let prefix = StorePath::from(format!("{}/volumes/{}", owner.0, volume.0));
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
        Grant::Renter { .. } | Grant::Volume { .. } => false,
    };
    server.check_lease(&grant, log_tail)?;
    let parsed = Key::parse(key).ok_or(Refusal(
        StatusCode::BAD_REQUEST,
        "key_invalid",
        "keys are <account>/bundles/<sha256>.tar.gz, <account>/jobs/<job>/(checkpoints|outputs|logs)/<path> or <account>/volumes/<volume>/<path>",
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
    let grant = match server.grant(&headers) {
        Ok(grant) => grant,
        Err(refused) => return refused.into_response(),
    };
    let uploader = grant.uploader();
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
        Key::Job { owner, .. } | Key::Volume { owner, .. } => (*owner, None),
    };
    let path = StorePath::from(key.as_str());
    let replaced = match server.store.head(&path).await {
        Ok(meta) => meta.size,
        Err(object_store::Error::NotFound { .. }) => 0,
        Err(error) => return store_failed(error),
    };
    // The room the account (or the volume) has for this object, checked
    // before its body.
    let (room, full): (u64, fn() -> Response) = match (&parsed, grant.volume(&parsed)) {
        (Key::Volume { volume, .. }, Some(access)) => match server.volume_usage(owner, *volume).await {
            Ok((used, objects)) => {
                if replaced == 0 && objects >= gpux_protocol::volumes::limits::FILES_PER_VOLUME_MAX {
                    return refuse(StatusCode::INSUFFICIENT_STORAGE, "volume_full", "the volume holds 10 000 files");
                }
                (access.bytes_max.saturating_sub(used - replaced.min(used)), || {
                    refuse(
                        StatusCode::INSUFFICIENT_STORAGE,
                        "volume_full",
                        "the volume's size is reached: delete files or use a larger volume",
                    )
                })
            }
            Err(error) => return store_failed(error),
        },
        _ => match server.usage(owner).await {
            Ok((used, objects)) => {
                if replaced == 0 && objects >= OBJECTS_PER_ACCOUNT_MAX {
                    return refuse(StatusCode::INSUFFICIENT_STORAGE, "quota_exceeded", "the account holds 10 000 objects in the job store");
                }
                (server.quota_bytes.saturating_sub(used - replaced.min(used)), || {
                    refuse(
                        StatusCode::INSUFFICIENT_STORAGE,
                        "quota_exceeded",
                        "the account's share of the job store is full: delete old results",
                    )
                })
            }
            Err(error) => return store_failed(error),
        },
    };
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
    let volume = match parts.get(1..) {
        Some(["volumes", volume, ..]) => volume.parse::<u64>().ok().map(gpux_protocol::VolumeId),
        _ => None,
    };
    let deep = if volume.is_some() { 64 } else { 4 };
    let shape_ok = parts.iter().all(|c| component_ok(c)) && parts.len() <= deep;
    let Some(owner) = owner.filter(|_| shape_ok) else {
        return refuse(
            StatusCode::BAD_REQUEST,
            "key_invalid",
            "list <account>, <account>/jobs/<job>, <account>/jobs/<job>/<area> or <account>/volumes/<volume>[/<path>]",
        );
    };
    if let Err(refused) = server.check_lease(&grant, false) {
        return refused.into_response();
    }
    if !grant.may_list(owner, job, volume) {
        return refuse(StatusCode::FORBIDDEN, "forbidden", "the token does not open this prefix");
    }
    let mut listing = server.store.list(Some(&StorePath::from(prefix.trim_end_matches('/'))));
    // The account's listing leaves out its volumes' files (each volume's
    // token lists its own).
    let volumes = format!("{}/volumes/", owner.0);
    let mut found = Vec::new();
    while let Some(meta) = listing.next().await {
        match meta {
            Ok(meta) if volume.is_none() && meta.location.as_ref().starts_with(&volumes) => {}
            Ok(meta) if found.len() < OBJECTS_PER_ACCOUNT_MAX => found.push(Listed { key: meta.location.to_string(), bytes: meta.size }),
            Ok(_) => break,
            Err(error) => return store_failed(error),
        }
    }
    found.sort_by(|a, b| a.key.cmp(&b.key));
    json(StatusCode::OK, &found)
}

/// Removes every file under each prefix received (a deleted volume's),
/// retrying a backend that fails every 10 s until it answers.
async fn purge(store: Arc<dyn ObjectStore>, mut purges: tokio::sync::mpsc::UnboundedReceiver<String>) {
    while let Some(prefix) = purges.recv().await {
        loop {
            match purge_once(store.as_ref(), &prefix).await {
                Ok(removed) => {
                    tracing::info!(%prefix, removed, "a deleted volume's files removed");
                    break;
                }
                Err(error) => {
                    tracing::warn!(%prefix, %error, "removing a deleted volume's files; retrying in 10 s");
                    tokio::time::sleep(std::time::Duration::from_secs(10)).await;
                }
            }
        }
    }
}

async fn purge_once(store: &dyn ObjectStore, prefix: &str) -> Result<usize, object_store::Error> {
    let mut keys = Vec::new();
    let mut listing = store.list(Some(&StorePath::from(prefix)));
    while let Some(meta) = listing.next().await {
        keys.push(meta?.location);
    }
    for key in &keys {
        match store.delete(key).await {
            Ok(()) | Err(object_store::Error::NotFound { .. }) => {}
            Err(error) => return Err(error),
        }
    }
    Ok(keys.len())
}
