//! The REST read API (docs/rest.md, docs/openapi.json): `GET /api/v1/...`
//! over the exchange's HTTP listener, answered by the same sequencer
//! requests as the WebSocket ones, so every rule (scopes, pages, codes) is
//! the protocol's. Each HTTP request is one short session: the handler
//! connects to the sequencer, logs in when the request is signed, sends one
//! request, takes its answer and disconnects. Such a session is not the
//! account's presence (`presence: false`): it gets no pushed events and its
//! end cancels nothing.
//!
//! A signed request carries `X-Gpux-Key` (the ed25519 public key, hex),
//! `X-Gpux-Timestamp` (ms since the Unix epoch, within
//! [`SIGNATURE_SKEW_MS`] of the exchange's clock) and `X-Gpux-Signature`
//! (hex) over [`REST_DOMAIN`], the method, the path with its query and the
//! timestamp, one per line.

use std::time::Duration;

use axum::http::{header, HeaderMap, HeaderValue, Method, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use crossbeam_channel::{Sender, TrySendError};
use ed25519_dalek::{Signature, VerifyingKey};
use gpux_engine::{AccountId, InstrumentId};
use gpux_protocol::{CandleInterval, ErrorCode, FillCursor, ServerMessage};
use tokio::sync::{mpsc, Notify};

use crate::link::{Clock, ConnectionId, HistoryRequest, LoginOutcome, Outbound, Outgoing, Request};

/// What a signed request's signature starts with.
pub const REST_DOMAIN: &str = "gpux-rest-v1";
/// How far a signed request's timestamp may be from the exchange's clock.
pub const SIGNATURE_SKEW_MS: u64 = 30_000;
/// How long a request waits for the sequencer's answer.
const ANSWER_TIMEOUT: Duration = Duration::from_secs(4);
/// The OpenAPI document this module implements (served at `/api/v1/openapi.json`).
pub const OPENAPI_JSON: &str = include_str!("../../docs/openapi.json");

/// The bytes a REST request's signature covers.
pub fn signed_bytes(method: &str, path_and_query: &str, timestamp_ms: u64) -> Vec<u8> {
    format!("{REST_DOMAIN}\n{method}\n{path_and_query}\n{timestamp_ms}").into_bytes()
}

/// The REST routes, to be served on the exchange's HTTP listener. With
/// `cors_origins` (each `scheme://host[:port]`, or `*` for any), browsers
/// on those origins may call it: preflights are answered, and answers carry
/// `Access-Control-Allow-Origin` (docs/rest.md "CORS").
pub fn router(core: Sender<Request>, clock: Clock, cors_origins: &[HeaderValue]) -> axum::Router {
    let state = Rest { core, clock };
    let router = axum::Router::new().route(
        "/api/v1/{*path}",
        axum::routing::any(move |method: Method, uri: Uri, headers: HeaderMap| {
            let state = state.clone();
            async move { state.answer(method, uri, headers).await }
        }),
    );
    if cors_origins.is_empty() {
        return router;
    }
    use tower_http::cors::{AllowOrigin, CorsLayer};
    let origins = if cors_origins.iter().any(|o| o == "*") { AllowOrigin::any() } else { AllowOrigin::list(cors_origins.to_vec()) };
    let signature_headers = ["x-gpux-key", "x-gpux-timestamp", "x-gpux-signature"].map(header::HeaderName::from_static);
    router.layer(
        CorsLayer::new()
            .allow_origin(origins)
            .allow_methods([Method::GET])
            .allow_headers(signature_headers)
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
        UnknownInstrument | UnknownLease | UnknownSupplier | UnknownAccount | UnknownMessage => StatusCode::NOT_FOUND,
        RateLimited => StatusCode::TOO_MANY_REQUESTS,
        ShuttingDown | HistoryUnavailable | InvoiceUnavailable | JournalUnavailable => StatusCode::SERVICE_UNAVAILABLE,
        _ => StatusCode::BAD_REQUEST,
    }
}

impl Rest {
    async fn answer(&self, method: Method, uri: Uri, headers: HeaderMap) -> Response {
        if method != Method::GET {
            return Failure {
                status: StatusCode::METHOD_NOT_ALLOWED,
                code: ErrorCode::UnknownMessage,
                message: "the REST API is read-only: GET".into(),
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
                resolved = self.instrument_by_symbol(instrument).await?.to_string();
                segments[1] = &resolved;
            }
        }
        let request = route(&segments, &query)?;
        let signed = self.signer(uri, headers)?;
        let (make, public) = match request {
            Routed::OpenApi => return Ok(OPENAPI_JSON.to_string()),
            Routed::Request { make, public } => (make, public),
        };
        if !public && signed.is_none() {
            return Err(Failure::new(
                ErrorCode::NotAuthenticated,
                "this path needs a signed request (X-Gpux-Key, X-Gpux-Timestamp, X-Gpux-Signature)",
            ));
        }
        let message = self.ask(signed, make).await?;
        body_of(message)
    }

    /// The id of the listed instrument whose symbol is `segment` (its `/`
    /// percent-encoded, `H100-SXM-80G%2FSPOT`): one `instruments` request.
    async fn instrument_by_symbol(&self, segment: &str) -> Result<u32, Failure> {
        let symbol = percent_decoded(segment).ok_or_else(|| {
            Failure::new(ErrorCode::WrongType, "the instrument is an id or a symbol with its '/' written %2F (H100-SXM-80G%2FSPOT)")
        })?;
        let listed = self.ask(None, Box::new(|connection, id| Request::Instruments { connection, id })).await?;
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
    fn signer(&self, uri: &Uri, headers: &HeaderMap) -> Result<Option<[u8; 32]>, Failure> {
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
        verifying
            .verify_strict(&signed_bytes("GET", path_and_query, timestamp_ms), &Signature::from_bytes(&signature))
            .map_err(|_| refused("the signature does not verify over gpux-rest-v1, the method, the path and the timestamp"))?;
        Ok(Some(public_key))
    }

    /// One short session: connect, log in if signed, ask, disconnect.
    async fn ask(
        &self,
        signed: Option<[u8; 32]>,
        make: Box<dyn FnOnce(ConnectionId, u64) -> Request + Send>,
    ) -> Result<ServerMessage, Failure> {
        let connection = crate::server::next_connection_id();
        let (frames, mut answers) = mpsc::channel::<Outgoing>(16);
        let outbound = Outbound::local(frames, std::sync::Arc::new(Notify::new()));
        self.send(Request::Connect { connection, outbound })?;
        let _session = Session { core: self.core.clone(), connection };
        let exchange = async {
            if let Some(public_key) = signed {
                self.send(Request::Authenticate {
                    connection,
                    id: 0,
                    public_key,
                    role: None,
                    cancel_on_disconnect: false,
                    presence: false,
                    invite: None,
                    address: None,
                })?;
                loop {
                    match answers.recv().await {
                        Some(Outgoing::Login(LoginOutcome::Accepted { .. })) => break,
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
            self.send(make(connection, 1))?;
            loop {
                match answers.recv().await {
                    Some(Outgoing::Frame(frame)) if frame.message().answer_to() == Some(1) => return Ok(frame.message().clone()),
                    Some(_) => {}
                    None => return Err(Failure::coded(ErrorCode::ShuttingDown)),
                }
            }
        };
        tokio::time::timeout(ANSWER_TIMEOUT, exchange)
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

/// Ends the session however the request ended (answered, timed out, or
/// the client went away).
struct Session {
    core: Sender<Request>,
    connection: ConnectionId,
}

impl Drop for Session {
    fn drop(&mut self) {
        // A full queue drops nothing important: the sequencer forgets a
        // connection whose outbound is closed when it next writes to it.
        let _ = self.core.try_send(Request::Disconnect { connection: self.connection, exchange_stopping: false });
    }
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

enum Routed {
    OpenApi,
    Request { make: Box<dyn FnOnce(ConnectionId, u64) -> Request + Send>, public: bool },
}

fn public(make: impl FnOnce(ConnectionId, u64) -> Request + Send + 'static) -> Result<Routed, Failure> {
    Ok(Routed::Request { make: Box::new(make), public: true })
}

fn private(make: impl FnOnce(ConnectionId, u64) -> Request + Send + 'static) -> Result<Routed, Failure> {
    Ok(Routed::Request { make: Box::new(make), public: false })
}

fn id_of<T: std::str::FromStr>(text: &str, what: &str) -> Result<T, Failure> {
    text.parse().map_err(|_| Failure::new(ErrorCode::WrongType, format!("{what} must be a non-negative integer")))
}

/// The sequencer request for a path (without `/api/v1/`).
fn route(segments: &[&str], query: &Query) -> Result<Routed, Failure> {
    let not_found = || Failure::new(ErrorCode::UnknownMessage, "no such path in the REST API (see /api/v1/openapi.json)");
    match segments {
        ["openapi.json"] => {
            query.only(&[])?;
            Ok(Routed::OpenApi)
        }
        ["listing"] => {
            query.only(&[])?;
            public(|connection, id| Request::Listing { connection, id })
        }
        ["instruments"] => {
            query.only(&[])?;
            public(|connection, id| Request::Instruments { connection, id })
        }
        ["instruments", instrument, what] => {
            let instrument = InstrumentId(id_of(instrument, "the instrument id")?);
            match *what {
                "stats" => {
                    query.only(&[])?;
                    public(move |connection, id| Request::Stats { connection, id, instrument })
                }
                "book" => {
                    query.only(&[])?;
                    public(move |connection, id| Request::Book { connection, id, instrument })
                }
                "offers" => {
                    query.only(&["offset", "after_price", "after_priority"])?;
                    let offset = query.number("offset")?.unwrap_or(0);
                    let after = match (query.number("after_price")?, query.number("after_priority")?) {
                        (Some(price_minor_per_gpu_hour), Some(priority)) => {
                            Some(gpux_engine::OfferCursor { price_minor_per_gpu_hour, priority })
                        }
                        (None, None) => None,
                        _ => {
                            return Err(Failure::new(
                                ErrorCode::WrongType,
                                "after_price and after_priority go together (next_after's two fields)",
                            ))
                        }
                    };
                    public(move |connection, id| Request::BookOffers { connection, id, instrument, offset, after })
                }
                "trades" => {
                    query.only(&["before_seq"])?;
                    let before_seq = query.number("before_seq")?;
                    public(move |connection, id| Request::History {
                        connection,
                        id,
                        request: HistoryRequest::Trades { instrument, before_seq },
                    })
                }
                "candles" => {
                    query.only(&["interval", "before_ms"])?;
                    let interval = query
                        .get("interval")
                        .and_then(CandleInterval::from_name)
                        .ok_or_else(|| Failure::new(ErrorCode::WrongType, "interval must be 1m, 1h or 1d"))?;
                    let before_ms = query.number("before_ms")?;
                    public(move |connection, id| Request::History {
                        connection,
                        id,
                        request: HistoryRequest::Candles { instrument, interval, before_ms },
                    })
                }
                _ => Err(not_found()),
            }
        }
        ["suppliers", supplier, "stats"] => {
            query.only(&[])?;
            let supplier = AccountId(id_of(supplier, "the supplier id")?);
            public(move |connection, id| Request::SupplierStats { connection, id, supplier })
        }
        ["renters", renter, "stats"] => {
            query.only(&[])?;
            let renter = AccountId(id_of(renter, "the renter id")?);
            public(move |connection, id| Request::RenterStats { connection, id, renter })
        }
        ["account", what] => match *what {
            "balance" => {
                query.only(&[])?;
                private(|connection, id| Request::Balance { connection, id })
            }
            "orders" => {
                query.only(&["after"])?;
                let after = query.number("after")?;
                private(move |connection, id| Request::OpenOrders { connection, id, after })
            }
            "leases" => {
                query.only(&["after"])?;
                let after = query.number("after")?;
                private(move |connection, id| Request::Leases { connection, id, after })
            }
            "gpus" => {
                query.only(&["offset"])?;
                let offset = query.number("offset")?.unwrap_or(0);
                private(move |connection, id| Request::MyGpus { connection, id, offset })
            }
            "statement" => {
                query.only(&["before"])?;
                let before = query.number("before")?;
                private(move |connection, id| Request::RecentStatement { connection, id, before })
            }
            "fills" => {
                query.only(&["before_at_ms", "before_instrument", "before_seq"])?;
                let cursor = (query.number("before_at_ms")?, query.number("before_instrument")?, query.number("before_seq")?);
                let before = match cursor {
                    (None, None, None) => None,
                    (Some(at_ms), Some(instrument), Some(seq)) => Some(FillCursor { at_ms, instrument: InstrumentId(instrument), seq }),
                    _ => return Err(Failure::new(ErrorCode::WrongType, "before_at_ms, before_instrument and before_seq go together")),
                };
                private(move |connection, id| Request::History { connection, id, request: HistoryRequest::Fills { before } })
            }
            _ => Err(not_found()),
        },
        _ => Err(not_found()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
