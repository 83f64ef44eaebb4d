//! The REST API (docs/rest.md, docs/openapi.json): reads (`GET
//! /api/v1/...`) and writes (orders, leases, funds) over the exchange's
//! HTTP listener, answered by the same sequencer requests as the WebSocket
//! ones, so every rule (scopes, pages, codes) is the protocol's. Each HTTP request is one short session: the handler
//! connects to the sequencer, logs in when the request is signed, sends one
//! request, takes its answer and disconnects. Such a session is not the
//! account's presence (`presence: false`): it gets no pushed events and its
//! end cancels nothing.
//!
//! A signed request carries `X-Gpux-Key` (the ed25519 public key, hex),
//! `X-Gpux-Timestamp` (ms since the Unix epoch, within
//! [`SIGNATURE_SKEW_MS`] of the exchange's clock) and `X-Gpux-Signature`
//! (hex) over [`REST_DOMAIN`], the method, the path with its query and the
//! timestamp, one per line; a write adds its `Idempotency-Key` and its
//! body's SHA-256 ([`signed_write_bytes`]). A write's answer is kept under
//! its idempotency key ([`crate::idempotency`]), so a retry is answered
//! again instead of applied again.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::http::{header, HeaderMap, HeaderValue, Method, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use crossbeam_channel::{Sender, TrySendError};
use ed25519_dalek::{Signature, VerifyingKey};
use gpux_engine::{AccountId, InstrumentId, Role};
use gpux_protocol::{CandleInterval, ClientMessage, ErrorCode, FillCursor, ServerMessage};
use serde_json::{Map, Value};
use sha2::{Digest, Sha256};
use tokio::sync::{mpsc, Notify};

use crate::idempotency::{self, Begin, Idempotency, Stored};
use crate::link::{Body, Clock, ConnectionId, HistoryRequest, LoginOutcome, Outbound, Outgoing, Request};
use crate::server::{request_of, Caller};

/// What a signed request's signature starts with.
pub const REST_DOMAIN: &str = "gpux-rest-v1";
/// How far a signed request's timestamp may be from the exchange's clock.
pub const SIGNATURE_SKEW_MS: u64 = 30_000;
/// How long a request waits for the sequencer's answer.
const ANSWER_TIMEOUT: Duration = Duration::from_secs(4);
/// The OpenAPI document this module implements (served at `/api/v1/openapi.json`).
pub const OPENAPI_JSON: &str = include_str!("../../docs/openapi.json");

/// How long a write's session may take in all before its outcome is
/// forgotten (the client was told to retry after [`ANSWER_TIMEOUT`]).
const OUTCOME_TIMEOUT: Duration = Duration::from_secs(60);
pub use crate::limits::WRITE_BODY_BYTES_MAX;
/// The methods of writes.
const WRITE_METHODS: [Method; 4] = [Method::POST, Method::PUT, Method::PATCH, Method::DELETE];

/// The bytes a REST read's signature covers.
pub fn signed_bytes(method: &str, path_and_query: &str, timestamp_ms: u64) -> Vec<u8> {
    format!("{REST_DOMAIN}\n{method}\n{path_and_query}\n{timestamp_ms}").into_bytes()
}

/// The bytes a REST write's signature covers: a read's, then its
/// idempotency key and its body's SHA-256 in hex (of no bytes when it has
/// no body), one per line.
pub fn signed_write_bytes(method: &str, path_and_query: &str, timestamp_ms: u64, idempotency_key: &str, body: &[u8]) -> Vec<u8> {
    let digest = hex::encode(Sha256::digest(body));
    format!("{REST_DOMAIN}\n{method}\n{path_and_query}\n{timestamp_ms}\n{idempotency_key}\n{digest}").into_bytes()
}

/// The REST routes, to be served on the exchange's HTTP listener. With
/// `cors_origins` (each `scheme://host[:port]`, or `*` for any), browsers
/// on those origins may call it: preflights are answered, and answers carry
/// `Access-Control-Allow-Origin` (docs/rest.md "CORS").
pub fn router(core: Sender<Request>, clock: Clock, cors_origins: &[HeaderValue]) -> axum::Router {
    let state = Rest { core, clock, idempotency: Arc::default(), participants: Arc::default(), started: Instant::now() };
    let router = axum::Router::new().route(
        "/api/v1/{*path}",
        axum::routing::any(move |method: Method, uri: Uri, headers: HeaderMap, body: axum::body::Body| {
            let state = state.clone();
            async move { state.answer(method, uri, headers, body).await }
        }),
    );
    if cors_origins.is_empty() {
        return router;
    }
    use tower_http::cors::{AllowOrigin, CorsLayer};
    let origins = if cors_origins.iter().any(|o| o == "*") { AllowOrigin::any() } else { AllowOrigin::list(cors_origins.to_vec()) };
    let request_headers =
        ["x-gpux-key", "x-gpux-timestamp", "x-gpux-signature", "idempotency-key", "content-type"].map(header::HeaderName::from_static);
    let mut methods = vec![Method::GET];
    methods.extend(WRITE_METHODS);
    router.layer(
        CorsLayer::new()
            .allow_origin(origins)
            .allow_methods(methods)
            .allow_headers(request_headers)
            .expose_headers([header::HeaderName::from_static("idempotent-replayed")])
            .max_age(Duration::from_secs(600)),
    )
}

/// Checks an operator's CORS origin (`--rest-cors-origin`): `*`, or a
/// `scheme://host[:port]` without path.
pub fn cors_origin(text: &str) -> Result<HeaderValue, String> {
    let valid = text == "*"
        || text.parse::<Uri>().is_ok_and(|uri| {
            uri.scheme().is_some() && uri.host().is_some() && uri.path_and_query().is_none_or(|p| p.as_str().is_empty() || p == "/")
        }) && !text.ends_with('/');
    match HeaderValue::from_str(text) {
        Ok(value) if valid => Ok(value),
        _ => Err(format!("{text:?} is not an origin: give scheme://host[:port] (no path), or * for any")),
    }
}

#[derive(Clone)]
struct Rest {
    core: Sender<Request>,
    clock: Clock,
    /// Writes' answers by signing key and idempotency key.
    idempotency: Arc<Mutex<Idempotency>>,
    /// Signing keys' participants, learned at their first write (a key's
    /// account and an account's parent never change); at most
    /// `PARTICIPANTS_CACHED_MAX`, emptied when full.
    participants: Arc<Mutex<HashMap<[u8; 32], AccountId>>>,
    /// The idempotency table's monotonic clock.
    started: Instant,
}

/// A REST error: its HTTP status and the protocol's code.
struct Failure {
    status: StatusCode,
    code: ErrorCode,
    message: String,
}

impl Failure {
    fn new(code: ErrorCode, message: impl Into<String>) -> Failure {
        Failure { status: status_of(code), code, message: message.into() }
    }

    fn coded(code: ErrorCode) -> Failure {
        Failure::new(code, code.message())
    }

    fn stored(&self) -> Stored {
        let body = serde_json::json!({ "error": { "code": self.code, "message": self.message } });
        Stored { status: self.status.as_u16(), body: body.to_string() }
    }
}

impl IntoResponse for Failure {
    fn into_response(self) -> Response {
        let body = serde_json::json!({ "error": { "code": self.code, "message": self.message } });
        (self.status, [(header::CONTENT_TYPE, "application/json")], body.to_string()).into_response()
    }
}

/// The HTTP status of a protocol error code.
pub fn status_of(code: ErrorCode) -> StatusCode {
    use ErrorCode::*;
    match code {
        NotAuthenticated | AuthFailed | KeyExpired | KeyRevoked => StatusCode::UNAUTHORIZED,
        Forbidden | ScopeDenied => StatusCode::FORBIDDEN,
        UnknownInstrument | UnknownLease | UnknownSupplier | UnknownAccount | UnknownMessage | UnknownVolume | UnknownService => {
            StatusCode::NOT_FOUND
        }
        RateLimited => StatusCode::TOO_MANY_REQUESTS,
        IdempotencyKeyReused => StatusCode::UNPROCESSABLE_ENTITY,
        RequestInProgress => StatusCode::CONFLICT,
        FrameTooLarge => StatusCode::PAYLOAD_TOO_LARGE,
        ShuttingDown | HistoryUnavailable | InvoiceUnavailable | JournalUnavailable => StatusCode::SERVICE_UNAVAILABLE,
        _ => StatusCode::BAD_REQUEST,
    }
}

impl Rest {
    async fn answer(&self, method: Method, uri: Uri, headers: HeaderMap, body: axum::body::Body) -> Response {
        if WRITE_METHODS.contains(&method) {
            return match self.answer_write(&method, &uri, &headers, body).await {
                Ok(response) => response,
                Err(failure) => failure.into_response(),
            };
        }
        if method != Method::GET {
            return Failure {
                status: StatusCode::METHOD_NOT_ALLOWED,
                code: ErrorCode::UnknownMessage,
                message: "the REST API reads with GET and writes with POST, PUT, PATCH or DELETE".into(),
            }
            .into_response();
        }
        match self.answer_get(&uri, &headers).await {
            Ok(body) => ([(header::CONTENT_TYPE, "application/json"), (header::CACHE_CONTROL, "no-store")], body).into_response(),
            Err(failure) => failure.into_response(),
        }
    }

    async fn answer_get(&self, uri: &Uri, headers: &HeaderMap) -> Result<String, Failure> {
        let query = Query::parse(uri.query().unwrap_or(""))?;
        let mut segments: Vec<&str> = uri.path().trim_start_matches("/api/v1/").split('/').collect();
        // An instrument named by its symbol is asked by its id.
        let resolved;
        if let ["instruments", instrument, _] = segments[..] {
            if instrument.parse::<u32>().is_err() {
                resolved = self.instrument_by_segment(instrument).await?.to_string();
                segments[1] = &resolved;
            }
        }
        let request = route(&segments, &query)?;
        let signed = self.signer("GET", uri, headers, None)?;
        let body = match request {
            Routed::OpenApi => return Ok(OPENAPI_JSON.to_string()),
            Routed::Ask(body) => body,
        };
        if !body.is_public() && signed.is_none() {
            return Err(Failure::new(
                ErrorCode::NotAuthenticated,
                "this path needs a signed request (X-Gpux-Key, X-Gpux-Timestamp, X-Gpux-Signature)",
            ));
        }
        let message = self.ask(signed, Box::new(move |connection, id, _| Ok(Request::new(connection, id, body)))).await?.answer;
        body_of(message)
    }

    /// A write: its body read, its route and signature checked, then
    /// applied once under its idempotency key (or its kept answer sent).
    async fn answer_write(&self, method: &Method, uri: &Uri, headers: &HeaderMap, body: axum::body::Body) -> Result<Response, Failure> {
        let body = axum::body::to_bytes(body, WRITE_BODY_BYTES_MAX)
            .await
            .map_err(|_| Failure::new(ErrorCode::FrameTooLarge, format!("a write's body is at most {WRITE_BODY_BYTES_MAX} bytes")))?;
        let key = idempotency_key(headers)?;
        let fields = body_fields(&body)?;
        let query = Query::parse(uri.query().unwrap_or(""))?;
        let segments: Vec<&str> = uri.path().trim_start_matches("/api/v1/").split('/').collect();
        let mut message = write_route(method, &segments, &query, fields)?;
        let signer = self.signer(method.as_str(), uri, headers, Some((&key, &body)))?.ok_or_else(|| {
            Failure::new(
                ErrorCode::NotAuthenticated,
                "a write needs a signed request (X-Gpux-Key, X-Gpux-Timestamp, X-Gpux-Signature) and an Idempotency-Key",
            )
        })?;
        // An order's instrument by its symbol, as in paths.
        if let Some(Value::String(symbol)) = message.get("new_order").and_then(|m| m.get("order")).and_then(|o| o.get("instrument")) {
            let instrument = self.instrument_by_symbol(symbol).await?;
            message["new_order"]["order"]["instrument"] = Value::from(instrument);
        }
        let message: ClientMessage =
            serde_json::from_value(message).map_err(|error| Failure::new(ErrorCode::WrongType, format!("the body: {error}")))?;
        let fingerprint = fingerprint(method, uri, &body);
        let participant = self.participant_of(signer).await?;
        let now_ms = self.started.elapsed().as_millis() as u64;
        let begun = self.idempotency.lock().unwrap_or_else(|e| e.into_inner()).begin(participant, signer, &key, fingerprint, now_ms);
        match begun {
            Begin::New => {}
            Begin::Replay(stored) => return Ok(written(stored, true)),
            Begin::InProgress => return Err(Failure::coded(ErrorCode::RequestInProgress)),
            Begin::Reused => return Err(Failure::coded(ErrorCode::IdempotencyKeyReused)),
            Begin::Full => {
                return Err(Failure::new(
                    ErrorCode::RateLimited,
                    format!(
                        "the exchange keeps the answers of {} writes of an account and its sub-accounts for an hour ({} of one key, {} in all) and has no room for this one now: the answers kept are of writes still in flight, or yours are the most kept; retry later",
                        idempotency::PER_PARTICIPANT_MAX,
                        idempotency::PER_SIGNER_MAX,
                        idempotency::ENTRIES_MAX
                    ),
                ))
            }
        }
        // Its own task: the answer is kept under the key even when this
        // client goes away or stops waiting.
        let rest = self.clone();
        let session = tokio::spawn(async move {
            let (stored, keep) = match rest.write(signer, message).await {
                Ok(stored) => (stored, true),
                // Refused before the sequencer applied anything, or not
                // known within a minute: a retry is applied.
                Err(failure) => (failure.stored(), false),
            };
            rest.idempotency.lock().unwrap_or_else(|e| e.into_inner()).finish(signer, &key, keep.then(|| stored.clone()));
            stored
        });
        match tokio::time::timeout(ANSWER_TIMEOUT, session).await {
            Ok(Ok(stored)) => Ok(written(stored, false)),
            Ok(Err(_)) => Err(Failure::coded(ErrorCode::ShuttingDown)),
            Err(_) => Err(Failure::new(
                ErrorCode::RequestInProgress,
                "the exchange did not answer within 4 s and the write may still be applied: retry with the same Idempotency-Key to read its outcome",
            )),
        }
    }

    /// The participant of a signing key's account: cached, or learned by
    /// a login that asks for the balance.
    async fn participant_of(&self, signer: [u8; 32]) -> Result<AccountId, Failure> {
        if let Some(&participant) = self.participants.lock().unwrap_or_else(|e| e.into_inner()).get(&signer) {
            return Ok(participant);
        }
        let answered = self.ask(Some(signer), Box::new(|connection, id, _| Ok(Request { connection, id, body: Body::Balance {} }))).await?;
        let participant = answered.participant.ok_or_else(|| Failure::coded(ErrorCode::NotAuthenticated))?;
        let mut cached = self.participants.lock().unwrap_or_else(|e| e.into_inner());
        if cached.len() >= PARTICIPANTS_CACHED_MAX {
            cached.clear();
        }
        cached.insert(signer, participant);
        Ok(participant)
    }

    /// One write's session: its answer as the client gets it, or a failure
    /// that applied nothing (the key is then forgotten).
    async fn write(&self, signer: [u8; 32], message: ClientMessage) -> Result<Stored, Failure> {
        let make = move |connection, id, caller: Option<(AccountId, Role)>| {
            let (account, role) = caller.expect("a write's session is signed");
            let caller = Caller { connection, account, role, login_key: Some(signer) };
            debug_assert_eq!(message.id(), id, "write_route numbers a write 1, as ask does");
            request_of(&caller, message, None)
                .map_err(|refused| Failure::new(refused.code, refused.message.unwrap_or_else(|| refused.code.message().to_string())))
        };
        let Answered { answer, events, .. } = self.ask_within(OUTCOME_TIMEOUT, Some(signer), Box::new(make)).await?;
        let events: Vec<Value> = events.iter().filter_map(|event| serde_json::to_value(event).ok()).collect();
        match answer {
            ServerMessage::Ack { journal_seq, order, .. } => {
                let body = serde_json::json!({ "journal_seq": journal_seq, "order": order, "events": events });
                Ok(Stored { status: 200, body: body.to_string() })
            }
            ServerMessage::Reject { journal_seq, code, message, bound, .. } => {
                let body =
                    serde_json::json!({ "rejected": { "code": code, "message": message, "journal_seq": journal_seq, "bound": bound } });
                Ok(Stored { status: StatusCode::UNPROCESSABLE_ENTITY.as_u16(), body: body.to_string() })
            }
            ServerMessage::Error { code: ErrorCode::RateLimited | ErrorCode::ShuttingDown | ErrorCode::JournalUnavailable, .. } => {
                Err(body_of(answer).expect_err("an error"))
            }
            answer => match body_of(answer) {
                Ok(body) => Ok(Stored { status: 200, body }),
                Err(failure) => Ok(failure.stored()),
            },
        }
    }

    /// The id of the listed instrument whose symbol is `segment` (its `/`
    /// percent-encoded, `H100-SXM-80G%2FSPOT`): one `instruments` request.
    async fn instrument_by_segment(&self, segment: &str) -> Result<u32, Failure> {
        let symbol = percent_decoded(segment).ok_or_else(|| {
            Failure::new(ErrorCode::WrongType, "the instrument is an id or a symbol with its '/' written %2F (H100-SXM-80G%2FSPOT)")
        })?;
        self.instrument_by_symbol(&symbol).await
    }

    /// The id of the listed instrument whose symbol is `symbol`.
    async fn instrument_by_symbol(&self, symbol: &str) -> Result<u32, Failure> {
        let listed = self.ask(None, Box::new(|connection, id, _| Ok(Request { connection, id, body: Body::Instruments {} }))).await?.answer;
        let ServerMessage::Instruments { instruments, .. } = listed else {
            return Err(Failure::coded(ErrorCode::ShuttingDown));
        };
        instruments.iter().find(|i| i.symbol == symbol).map(|i| i.instrument.0).ok_or_else(|| {
            Failure::new(
                ErrorCode::UnknownInstrument,
                format!(
                    "no listed instrument has the symbol {symbol:?} (GET /api/v1/instruments lists them; an expired window is asked by id)"
                ),
            )
        })
    }

    /// The key of a signed request, checked; `None` for an unsigned one.
    fn signer(&self, method: &str, uri: &Uri, headers: &HeaderMap, write: Option<(&str, &[u8])>) -> Result<Option<[u8; 32]>, Failure> {
        let header = |name: &str| headers.get(name).and_then(|v| v.to_str().ok());
        let (Some(key), Some(timestamp), Some(signature)) = (header("x-gpux-key"), header("x-gpux-timestamp"), header("x-gpux-signature"))
        else {
            if ["x-gpux-key", "x-gpux-timestamp", "x-gpux-signature"].iter().any(|name| headers.contains_key(*name)) {
                return Err(Failure::new(
                    ErrorCode::AuthFailed,
                    "a signed request carries X-Gpux-Key, X-Gpux-Timestamp and X-Gpux-Signature",
                ));
            }
            return Ok(None);
        };
        let refused = |why: &str| Failure::new(ErrorCode::AuthFailed, why.to_string());
        let timestamp_ms: u64 = timestamp.parse().map_err(|_| refused("X-Gpux-Timestamp must be ms since the Unix epoch"))?;
        let now_ms = self.clock.now_ms();
        if timestamp_ms.abs_diff(now_ms) > SIGNATURE_SKEW_MS {
            // Seconds since the epoch are about a thousandth of the clock in ms.
            if timestamp_ms.abs_diff(now_ms / 1_000) <= SIGNATURE_SKEW_MS / 1_000 {
                return Err(refused(&format!(
                    "X-Gpux-Timestamp must be milliseconds since the Unix epoch, not seconds ({timestamp_ms} is seconds; the exchange's clock reads {now_ms} ms)"
                )));
            }
            return Err(refused(&format!(
                "X-Gpux-Timestamp {timestamp_ms} is more than 30 s from the exchange's clock ({now_ms} ms since the Unix epoch); sync this host's clock"
            )));
        }
        let public_key: [u8; 32] =
            hex::decode(key).ok().and_then(|b| b.try_into().ok()).ok_or_else(|| refused("X-Gpux-Key must be 64 hex digits"))?;
        let signature: [u8; 64] = hex::decode(signature)
            .ok()
            .and_then(|b| b.try_into().ok())
            .ok_or_else(|| refused("X-Gpux-Signature must be 128 hex digits"))?;
        let path_and_query = uri.path_and_query().map_or(uri.path(), |p| p.as_str());
        let verifying = VerifyingKey::from_bytes(&public_key).map_err(|_| refused("X-Gpux-Key is not an ed25519 key"))?;
        let (signed, covers) = match write {
            None => (signed_bytes(method, path_and_query, timestamp_ms), "the method, the path and the timestamp"),
            Some((key, body)) => (
                signed_write_bytes(method, path_and_query, timestamp_ms, key, body),
                "the method, the path, the timestamp, the Idempotency-Key and the body's SHA-256",
            ),
        };
        verifying
            .verify_strict(&signed, &Signature::from_bytes(&signature))
            .map_err(|_| refused(&format!("the signature does not verify over gpux-rest-v1, {covers}")))?;
        Ok(Some(public_key))
    }

    /// One short session: connect, log in if signed, ask, disconnect. The
    /// request is made knowing the session's account and role (a signed
    /// one's); the answer comes with the private events its command caused
    /// (the sequencer sends them to a REST session before the answer).
    async fn ask(&self, signed: Option<[u8; 32]>, make: MakeRequest) -> Result<Answered, Failure> {
        self.ask_within(ANSWER_TIMEOUT, signed, make).await
    }

    async fn ask_within(&self, timeout: Duration, signed: Option<[u8; 32]>, make: MakeRequest) -> Result<Answered, Failure> {
        let connection = crate::server::next_connection_id();
        // A command's events all come at once, before its answer: room for
        // as many as a WebSocket session has.
        let (frames, mut answers) = mpsc::channel::<Outgoing>(crate::server::OUTBOUND_FRAMES_MAX);
        let outbound = Outbound::local(frames, std::sync::Arc::new(Notify::new()));
        self.send(Request { connection, id: 0, body: Body::Connect { outbound } })?;
        let _session = RestRequestSession { core: self.core.clone(), connection };
        let exchange = async {
            let mut caller = None;
            let mut participant = None;
            if let Some(public_key) = signed {
                self.send(Request {
                    connection,
                    id: 0,
                    body: Body::Authenticate {
                        public_key,
                        role: None,
                        cancel_on_disconnect: false,
                        presence: false,
                        invite: None,
                        address: None,
                    },
                })?;
                loop {
                    match answers.recv().await {
                        Some(Outgoing::Login(LoginOutcome::Accepted { account, role, participant: of })) => {
                            caller = Some((account, role));
                            participant = Some(of);
                            break;
                        }
                        Some(Outgoing::Login(LoginOutcome::Refused)) => {
                            return Err(Failure::new(ErrorCode::AuthFailed, "no account for this key, or the key was revoked or expired"));
                        }
                        Some(Outgoing::Frame(frame)) => {
                            if let ServerMessage::Error { code, message, .. } = frame.message() {
                                return Err(Failure::new(*code, message.clone()));
                            }
                        }
                        Some(_) => {}
                        None => return Err(Failure::coded(ErrorCode::ShuttingDown)),
                    }
                }
            }
            self.send(make(connection, 1, caller)?)?;
            let mut events = Vec::new();
            loop {
                match answers.recv().await {
                    Some(Outgoing::Frame(frame)) if frame.message().answer_to() == Some(1) => {
                        return Ok(Answered { answer: frame.message().clone(), events, participant })
                    }
                    Some(Outgoing::Frame(frame)) => {
                        if let ServerMessage::Private { event, .. } = frame.message() {
                            events.push(*event);
                        }
                    }
                    Some(_) => {}
                    None => return Err(Failure::coded(ErrorCode::ShuttingDown)),
                }
            }
        };
        tokio::time::timeout(timeout, exchange)
            .await
            .unwrap_or_else(|_| Err(Failure::new(ErrorCode::RateLimited, "the exchange did not answer in time; retry")))
    }

    fn send(&self, request: Request) -> Result<(), Failure> {
        self.core.try_send(request).map_err(|error| match error {
            TrySendError::Full(_) => Failure::new(ErrorCode::RateLimited, "the exchange is saturated; retry"),
            TrySendError::Disconnected(_) => Failure::coded(ErrorCode::ShuttingDown),
        })
    }
}

/// A write's Idempotency-Key header, checked.
fn idempotency_key(headers: &HeaderMap) -> Result<String, Failure> {
    let key = headers.get("idempotency-key").and_then(|v| v.to_str().ok()).filter(|key| idempotency::valid_key(key));
    let key = key.ok_or_else(|| {
        Failure::new(
            ErrorCode::WrongType,
            "a write carries an Idempotency-Key header: 1 to 64 of A-Z a-z 0-9 - _ . : (new for each write, the same on its retries)",
        )
    })?;
    Ok(key.to_string())
}

/// A write's body: a JSON object, or nothing.
fn body_fields(body: &[u8]) -> Result<Map<String, Value>, Failure> {
    match body {
        [] => Ok(Map::new()),
        bytes => match serde_json::from_slice::<Value>(bytes) {
            Ok(Value::Object(fields)) => Ok(fields),
            Ok(_) => Err(Failure::new(ErrorCode::WrongType, "a write's body is a JSON object")),
            Err(error) => Err(Failure::new(ErrorCode::MalformedJson, format!("the body is not JSON: {error}"))),
        },
    }
}

/// What a retry under the same Idempotency-Key must repeat: the method, the
/// path and query, and the body.
fn fingerprint(method: &Method, uri: &Uri, body: &[u8]) -> [u8; 32] {
    let path_and_query = uri.path_and_query().map_or(uri.path(), |p| p.as_str());
    let mut hasher = Sha256::new();
    hasher.update(format!("{method}\n{path_and_query}\n").as_bytes());
    hasher.update(body);
    hasher.finalize().into()
}

/// Ends the session however the request ended (answered, timed out, or
/// the client went away).
struct RestRequestSession {
    core: Sender<Request>,
    connection: ConnectionId,
}

impl Drop for RestRequestSession {
    fn drop(&mut self) {
        // A full queue drops nothing important: the sequencer forgets a
        // connection whose outbound is closed when it next writes to it.
        let _ = self.core.try_send(Request { connection: self.connection, id: 0, body: Body::Disconnect { exchange_stopping: false } });
    }
}

/// Makes a session's request from its connection, the request id and the
/// signed session's account and role.
type MakeRequest = Box<dyn FnOnce(ConnectionId, u64, Option<(AccountId, Role)>) -> Result<Request, Failure> + Send>;

/// A request's answer and the private events its command caused.
struct Answered {
    answer: ServerMessage,
    events: Vec<gpux_engine::Event>,
    /// The signed caller's participant.
    participant: Option<AccountId>,
}

/// Signing keys whose participant the REST side remembers.
const PARTICIPANTS_CACHED_MAX: usize = 65_536;

/// A write's answer as sent (again, when `replayed`).
fn written(stored: Stored, replayed: bool) -> Response {
    let status = StatusCode::from_u16(stored.status).unwrap_or(StatusCode::OK);
    let replayed = if replayed { "true" } else { "false" };
    (
        status,
        [
            (header::CONTENT_TYPE, "application/json"),
            (header::CACHE_CONTROL, "no-store"),
            (header::HeaderName::from_static("idempotent-replayed"), replayed),
        ],
        stored.body,
    )
        .into_response()
}

/// The body of an answer: its fields without the request id; an error is
/// a failure with its code's status.
fn body_of(message: ServerMessage) -> Result<String, Failure> {
    if let ServerMessage::Error { code, message, .. } = message {
        return Err(Failure::new(code, message));
    }
    let value = serde_json::to_value(&message).map_err(|e| Failure::new(ErrorCode::HistoryUnavailable, e.to_string()))?;
    let mut fields = match value {
        serde_json::Value::Object(map) => map.into_iter().next().map(|(_, fields)| fields).unwrap_or_default(),
        _ => serde_json::Value::Null,
    };
    if let Some(object) = fields.as_object_mut() {
        object.remove("id");
    }
    Ok(fields.to_string())
}

/// A path segment with its `%XX` escapes decoded (`None`: a broken escape
/// or bytes that are not UTF-8).
fn percent_decoded(segment: &str) -> Option<String> {
    let mut bytes = Vec::with_capacity(segment.len());
    let mut rest = segment.as_bytes();
    while let Some((&first, tail)) = rest.split_first() {
        if first == b'%' {
            let hex = tail.get(..2)?;
            bytes.push(u8::from_str_radix(std::str::from_utf8(hex).ok()?, 16).ok()?);
            rest = &tail[2..];
        } else {
            bytes.push(first);
            rest = tail;
        }
    }
    String::from_utf8(bytes).ok()
}

/// A query string's parameters (`a=1&b=2`), each name at most once.
struct Query(Vec<(String, String)>);

impl Query {
    fn parse(text: &str) -> Result<Query, Failure> {
        let mut pairs: Vec<(String, String)> = Vec::new();
        for part in text.split('&').filter(|p| !p.is_empty()) {
            let (name, value) = part.split_once('=').unwrap_or((part, ""));
            if pairs.iter().any(|(n, _)| n == name) {
                return Err(Failure::new(ErrorCode::WrongType, format!("query parameter {name} given twice")));
            }
            pairs.push((name.to_string(), value.to_string()));
        }
        Ok(Query(pairs))
    }

    fn get(&self, name: &str) -> Option<&str> {
        self.0.iter().find(|(n, _)| n == name).map(|(_, v)| v.as_str())
    }

    /// Refuses parameters the path does not take.
    fn only(&self, names: &[&str]) -> Result<(), Failure> {
        match self.0.iter().find(|(n, _)| !names.contains(&n.as_str())) {
            Some((name, _)) => Err(Failure::new(ErrorCode::WrongType, format!("unknown query parameter {name}"))),
            None => Ok(()),
        }
    }

    fn number<T: std::str::FromStr>(&self, name: &str) -> Result<Option<T>, Failure> {
        match self.get(name) {
            None => Ok(None),
            Some(text) => {
                text.parse().map(Some).map_err(|_| Failure::new(ErrorCode::WrongType, format!("{name} must be a non-negative integer")))
            }
        }
    }
}

/// `GET /offers`'s query as a search (docs/rest.md "Search"): each field
/// of `search_offers` by name, lists comma-separated, the place after by
/// its three fields.
fn search_of(query: &Query) -> Result<gpux_protocol::search::OfferSearch, Failure> {
    use gpux_protocol::search::{OfferSearch, SearchCursor};
    query.only(&[
        "min_gpu_memory_gb",
        "min_gpus",
        "vendor",
        "max_price_minor_per_gpu_hour",
        "regions",
        "min_score_bps",
        "verified_only",
        "contracts",
        "fabric_only",
        "sort",
        "after_key",
        "after_instrument",
        "after_priority",
        "limit",
    ])?;
    fn named<T: serde::de::DeserializeOwned>(text: &str, what: &str) -> Result<T, Failure> {
        serde_json::from_value(Value::String(text.to_string()))
            .map_err(|error| Failure::new(ErrorCode::WrongType, format!("{what}: {error}")))
    }
    let list = |name: &str| -> Vec<String> {
        query.get(name).map(|text| text.split(',').filter(|t| !t.is_empty()).filter_map(percent_decoded).collect()).unwrap_or_default()
    };
    let flag = |name: &str| -> Result<bool, Failure> {
        match query.get(name) {
            None | Some("false") => Ok(false),
            Some("true" | "") => Ok(true),
            Some(_) => Err(Failure::new(ErrorCode::WrongType, format!("{name} is true or false"))),
        }
    };
    let after = match (query.number("after_key")?, query.number::<u32>("after_instrument")?, query.number("after_priority")?) {
        (Some(key), Some(instrument), Some(priority)) => Some(SearchCursor { key, instrument: InstrumentId(instrument), priority }),
        (None, None, None) => None,
        _ => {
            return Err(Failure::new(
                ErrorCode::WrongType,
                "after_key, after_instrument and after_priority go together (next_after's fields)",
            ))
        }
    };
    Ok(OfferSearch {
        min_gpu_memory_gb: query.number("min_gpu_memory_gb")?.unwrap_or(0),
        min_gpus: query.number("min_gpus")?.unwrap_or(0),
        vendor: query.get("vendor").map(|v| named(v, "vendor")).transpose()?,
        max_price_minor_per_gpu_hour: query.number("max_price_minor_per_gpu_hour")?,
        regions: list("regions"),
        min_score_bps: query.number("min_score_bps")?.unwrap_or(0),
        verified_only: flag("verified_only")?,
        contracts: list("contracts").iter().map(|c| named(c, "contracts")).collect::<Result<_, _>>()?,
        fabric_only: flag("fabric_only")?,
        sort: query.get("sort").map(|s| named(s, "sort")).transpose()?.unwrap_or_default(),
        after,
        limit: query.number("limit")?,
    })
}

enum Routed {
    OpenApi,
    /// What to ask the sequencer; it needs a signature unless
    /// [`Body::is_public`].
    Ask(Body),
}

fn ask(body: Body) -> Result<Routed, Failure> {
    Ok(Routed::Ask(body))
}

fn id_of<T: std::str::FromStr>(text: &str, what: &str) -> Result<T, Failure> {
    text.parse().map_err(|_| Failure::new(ErrorCode::WrongType, format!("{what} must be a non-negative integer")))
}

/// The sequencer request for a path (without `/api/v1/`).
fn route(segments: &[&str], query: &Query) -> Result<Routed, Failure> {
    match segments {
        ["openapi.json"] => {
            query.only(&[])?;
            Ok(Routed::OpenApi)
        }
        ["listing"] => {
            query.only(&[])?;
            ask(Body::Listing {})
        }
        ["instruments"] => {
            query.only(&[])?;
            ask(Body::Instruments {})
        }
        ["offers"] => ask(Body::SearchOffers { search: Box::new(search_of(query)?) }),
        ["instruments", instrument, what] => instrument_route(InstrumentId(id_of(instrument, "the instrument id")?), what, query),
        ["suppliers", supplier, "stats"] => {
            query.only(&[])?;
            let supplier = AccountId(id_of(supplier, "the supplier id")?);
            ask(Body::SupplierStats { supplier })
        }
        ["renters", renter, "stats"] => {
            query.only(&[])?;
            let renter = AccountId(id_of(renter, "the renter id")?);
            ask(Body::RenterStats { renter })
        }
        ["account", what] => account_route(what, query),
        ["account", "services", service] => {
            query.only(&[])?;
            let service = gpux_protocol::ServiceId(id_of(service, "the service id")?);
            ask(Body::Service { request: crate::link::ServiceRequest::Status { service } })
        }
        _ => Err(not_found()),
    }
}

fn not_found() -> Failure {
    Failure::new(ErrorCode::UnknownMessage, "no such path in the REST API (see /api/v1/openapi.json)")
}

/// `instruments/{id}/...`: an instrument's market data.
fn instrument_route(instrument: InstrumentId, what: &str, query: &Query) -> Result<Routed, Failure> {
    match what {
        "stats" => {
            query.only(&[])?;
            ask(Body::Stats { instrument })
        }
        "book" => {
            query.only(&[])?;
            ask(Body::Book { instrument })
        }
        "offers" => {
            query.only(&["offset", "after_price", "after_priority"])?;
            let offset = query.number("offset")?.unwrap_or(0);
            let after = match (query.number("after_price")?, query.number("after_priority")?) {
                (Some(price_minor_per_gpu_hour), Some(priority)) => Some(gpux_engine::OfferCursor { price_minor_per_gpu_hour, priority }),
                (None, None) => None,
                _ => {
                    return Err(Failure::new(ErrorCode::WrongType, "after_price and after_priority go together (next_after's two fields)"))
                }
            };
            ask(Body::BookOffers { instrument, offset, after })
        }
        "trades" => {
            query.only(&["before_seq"])?;
            let before_seq = query.number("before_seq")?;
            ask(Body::History { request: HistoryRequest::Trades { instrument, before_seq } })
        }
        "candles" => {
            query.only(&["interval", "before_ms"])?;
            let interval = query
                .get("interval")
                .and_then(CandleInterval::from_name)
                .ok_or_else(|| Failure::new(ErrorCode::WrongType, "interval must be 1m, 1h or 1d"))?;
            let before_ms = query.number("before_ms")?;
            ask(Body::History { request: HistoryRequest::Candles { instrument, interval, before_ms } })
        }
        _ => Err(not_found()),
    }
}

/// `account/...`: the signing key's account.
fn account_route(what: &str, query: &Query) -> Result<Routed, Failure> {
    match what {
        "balance" => {
            query.only(&[])?;
            ask(Body::Balance {})
        }
        "orders" => {
            query.only(&["after"])?;
            let after = query.number("after")?;
            ask(Body::OpenOrders { after })
        }
        "leases" => {
            query.only(&["after"])?;
            let after = query.number("after")?;
            ask(Body::Leases { after })
        }
        "gpus" => {
            query.only(&["offset"])?;
            let offset = query.number("offset")?.unwrap_or(0);
            ask(Body::MyGpus { offset })
        }
        "volumes" => {
            query.only(&[])?;
            ask(Body::Volume { request: crate::link::VolumeRequest::List })
        }
        "services" => {
            query.only(&["offset"])?;
            let offset = query.number("offset")?.unwrap_or(0);
            ask(Body::Service { request: crate::link::ServiceRequest::List { offset } })
        }
        "statement" => {
            query.only(&["before"])?;
            let before = query.number("before")?;
            ask(Body::RecentStatement { before })
        }
        "fills" => {
            query.only(&["before_at_ms", "before_instrument", "before_seq"])?;
            let cursor = (query.number("before_at_ms")?, query.number("before_instrument")?, query.number("before_seq")?);
            let before = match cursor {
                (None, None, None) => None,
                (Some(at_ms), Some(instrument), Some(seq)) => Some(FillCursor { at_ms, instrument: InstrumentId(instrument), seq }),
                _ => return Err(Failure::new(ErrorCode::WrongType, "before_at_ms, before_instrument and before_seq go together")),
            };
            ask(Body::History { request: HistoryRequest::Fills { before } })
        }
        _ => Err(not_found()),
    }
}

/// The WebSocket message a write asks for (docs/rest.md "Writes"), as
/// JSON numbered 1: its body's fields with the path's ids put in.
fn write_route(method: &Method, segments: &[&str], query: &Query, mut fields: Map<String, Value>) -> Result<Value, Failure> {
    let not_found =
        || Failure::new(ErrorCode::UnknownMessage, format!("no {method} path like this in the REST API (see /api/v1/openapi.json)"));
    let number = |text: &str, what: &str| id_of::<u64>(text, what).map(Value::from);
    let mut from_path = Vec::new();
    let kind = match (method.as_str(), segments) {
        ("POST", ["orders"]) => "new_order",
        ("DELETE", ["orders"]) => {
            query.only(&["instrument"])?;
            from_path.push(("instrument", query.number::<u32>("instrument")?.map_or(Value::Null, Value::from)));
            "mass_cancel"
        }
        ("DELETE", ["orders", order]) => {
            from_path.push(("order", number(order, "the order id")?));
            "cancel_order"
        }
        ("PATCH", ["orders", order]) => {
            from_path.push(("order", number(order, "the order id")?));
            "replace_order"
        }
        ("POST", ["leases", lease, "end"]) => {
            from_path.push(("lease", number(lease, "the lease id")?));
            "end_lease"
        }
        ("PUT", ["leases", lease, "workload"]) => {
            // The body is the workload itself.
            let workload = Value::Object(std::mem::take(&mut fields));
            from_path.push(("lease", number(lease, "the lease id")?));
            from_path.push(("workload", workload));
            "set_workload"
        }
        ("POST", ["services"]) => {
            // The body is the service's spec itself, with its floor beside
            // the spec's fields when it has one.
            let floor = fields.remove("floor");
            let spec = Value::Object(std::mem::take(&mut fields));
            from_path.push(("service", spec));
            if let Some(floor) = floor {
                from_path.push(("floor", floor));
            }
            "create_service"
        }
        ("POST", ["services", service, "scale"]) => {
            from_path.push(("service", number(service, "the service id")?));
            "scale_service"
        }
        ("PUT", ["services", service, "run"]) => {
            // The body is the run itself.
            let run = Value::Object(std::mem::take(&mut fields));
            from_path.push(("service", number(service, "the service id")?));
            from_path.push(("run", run));
            "update_service"
        }
        ("DELETE", ["services", service]) => {
            from_path.push(("service", number(service, "the service id")?));
            "delete_service"
        }
        ("POST", ["volumes"]) => "create_volume",
        ("DELETE", ["volumes", name]) => {
            from_path.push(("name", Value::from(*name)));
            "delete_volume"
        }
        ("POST", ["account", "deposit"]) => "deposit",
        ("POST", ["account", "withdraw"]) => "withdraw",
        ("POST", ["account", "payout"]) => "payout",
        _ => return Err(not_found()),
    };
    if !matches!(segments, ["orders"]) || method != Method::DELETE {
        query.only(&[])?;
    }
    if fields.contains_key("id") {
        return Err(Failure::new(ErrorCode::WrongType, "a REST body carries no request id"));
    }
    for (name, value) in from_path {
        if fields.insert(name.to_string(), value).is_some() {
            return Err(Failure::new(ErrorCode::WrongType, format!("{name} is given by the path, not the body")));
        }
    }
    fields.insert("id".into(), Value::from(1u64));
    Ok(serde_json::json!({ kind: fields }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use ed25519_dalek::{Signer, SigningKey};

    /// A POST of `body` to `/api/v1/orders` signed by `key` under
    /// `idempotency_key`: status, head and body of the answer.
    async fn post(addr: std::net::SocketAddr, key: &SigningKey, idempotency_key: &str, body: &str) -> (u16, String, String) {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let now_ms = Clock { offset_ms: 0 }.now_ms();
        let signature = key.sign(&signed_write_bytes("POST", "/api/v1/orders", now_ms, idempotency_key, body.as_bytes()));
        let request = format!(
            "POST /api/v1/orders HTTP/1.1\r\nHost: x\r\nConnection: close\r\nContent-Length: {}\r\nX-Gpux-Key: {}\r\n\
             X-Gpux-Timestamp: {now_ms}\r\nX-Gpux-Signature: {}\r\nIdempotency-Key: {idempotency_key}\r\n\r\n{body}",
            body.len(),
            hex::encode(key.verifying_key().to_bytes()),
            hex::encode(signature.to_bytes()),
        );
        let mut stream = tokio::net::TcpStream::connect(addr).await.expect("the listener");
        stream.write_all(request.as_bytes()).await.expect("request");
        let mut response = String::new();
        stream.read_to_string(&mut response).await.expect("response");
        let status = response.split(' ').nth(1).and_then(|code| code.parse().ok()).expect("a status");
        let (head, body) = response.split_once("\r\n\r\n").expect("head and body");
        (status, head.to_ascii_lowercase(), body.to_string())
    }

    /// A sequencer that answers late: the write is told `request_in_progress`
    /// after 4 s (it may still be applied), a retry meanwhile too, and once
    /// the answer comes the retry under the same key reads it, without the
    /// sequencer seeing the write twice.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_write_answered_late_is_in_progress_and_its_retry_reads_the_answer() {
        let (core, requests) = crossbeam_channel::bounded::<Request>(64);
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("a port");
        let addr = listener.local_addr().expect("its address");
        let app = router(core, Clock { offset_ms: 0 }, &[]);
        tokio::spawn(async move { axum::serve(listener, app).await });
        let key = SigningKey::from_bytes(&[7; 32]);
        let body = r#"{"order":{"client_order_id":1,"instrument":0,"side":"buy","price_minor_per_gpu_hour":100,"quantity":1}}"#;

        let first = tokio::spawn({
            let key = key.clone();
            async move { post(addr, &key, "late-1", body).await }
        });
        // A key's first write learns its participant: a login that asks for
        // the balance (any answer will do).
        let mut lookup = None;
        loop {
            match requests.recv_timeout(Duration::from_secs(5)).expect("the lookup's requests") {
                Request { body: Body::Connect { outbound }, .. } => lookup = Some(outbound),
                Request { body: Body::Authenticate { .. }, .. } => {
                    let accepted =
                        Outgoing::Login(LoginOutcome::Accepted { account: AccountId(5), role: Role::Renter, participant: AccountId(5) });
                    lookup.as_ref().expect("connect first").frames.try_send(accepted).expect("queued");
                }
                Request { body: Body::Balance {}, .. } => {
                    let answer = ServerMessage::Error { id: Some(1), code: ErrorCode::RateLimited, message: String::new() };
                    let frame = Outgoing::Frame(crate::link::SharedFrame::new(answer));
                    lookup.as_ref().expect("connect first").frames.try_send(frame).expect("queued");
                    break;
                }
                other => panic!("unexpected {:?}", other.id()),
            }
        }
        // The sequencer takes the session and the write, and answers nothing yet.
        let mut taken = Vec::new();
        while taken.len() < 3 {
            match requests.recv_timeout(Duration::from_secs(5)).expect("the write's requests") {
                Request { body: Body::Disconnect { .. }, .. } => continue,
                request @ (Request { body: Body::Connect { .. }, .. }
                | Request { body: Body::Authenticate { .. }, .. }
                | Request { body: Body::Command { .. }, .. }) => taken.push(request),
                other => panic!("unexpected {:?}", other.id()),
            }
            if let Some(Request { body: Body::Authenticate { .. }, .. }) = taken.last() {
                let Some(Request { body: Body::Connect { outbound, .. }, .. }) = taken.first() else { panic!("connect first") };
                let accepted =
                    Outgoing::Login(LoginOutcome::Accepted { account: AccountId(5), role: Role::Renter, participant: AccountId(5) });
                outbound.frames.try_send(accepted).expect("queued");
            }
        }
        let (status, _, retry) = post(addr, &key, "late-1", body).await;
        assert_eq!((status, retry.contains("request_in_progress")), (409, true), "{retry}");
        let (status, _, answer) = first.await.expect("the first write");
        assert_eq!(status, 409, "no answer within 4 s: {answer}");
        assert!(answer.contains("request_in_progress") && answer.contains("retry with the same Idempotency-Key"), "{answer}");
        // The answer comes at last; the retry reads it.
        let Some(Request { body: Body::Connect { outbound, .. }, .. }) = taken.first() else { panic!("connect first") };
        let Some(Request { id, body: Body::Command { .. }, .. }) = taken.last() else { panic!("the order last") };
        let ack = ServerMessage::Ack { id: *id, journal_seq: 41, order: Some(gpux_engine::OrderId(9)) };
        outbound.frames.try_send(Outgoing::Frame(crate::link::SharedFrame::new(ack))).expect("queued");
        let mut kept = None;
        for _ in 0..50 {
            let (status, head, answer) = post(addr, &key, "late-1", body).await;
            if status == 200 {
                kept = Some((head, answer));
                break;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let (head, answer) = kept.expect("the kept answer");
        assert!(head.contains("idempotent-replayed: true"), "{head}");
        assert_eq!(answer, r#"{"events":[],"journal_seq":41,"order":9}"#);
        // The sequencer saw the write once: only the first session's disconnect follows.
        let rest: Vec<Request> = requests.try_iter().collect();
        assert!(
            rest.iter().all(|r| matches!(r, Request { body: Body::Disconnect { .. }, .. })),
            "{:?}",
            rest.iter().map(Request::id).collect::<Vec<_>>()
        );
    }

    #[test]
    fn path_segments_decode_their_escapes_and_refuse_broken_ones() {
        assert_eq!(percent_decoded("H100-SXM-80G%2FSPOT").as_deref(), Some("H100-SXM-80G/SPOT"));
        assert_eq!(percent_decoded("H100-SXM-80G%2fR%2F2026-12-07T10%2F1h").as_deref(), Some("H100-SXM-80G/R/2026-12-07T10/1h"));
        assert_eq!(percent_decoded("plain").as_deref(), Some("plain"));
        for broken in ["%", "%2", "%zz", "%FF"] {
            assert_eq!(percent_decoded(broken), None, "{broken}");
        }
    }

    #[test]
    fn cors_origins_are_scheme_and_host_or_a_star() {
        for good in ["https://dash.example", "http://127.0.0.1:8080", "*"] {
            assert!(cors_origin(good).is_ok(), "{good}");
        }
        for bad in ["dash.example", "https://dash.example/", "https://dash.example/app", "", "https://"] {
            assert!(cors_origin(bad).is_err(), "{bad}");
        }
    }
}
