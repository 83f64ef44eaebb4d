//! One request through the router (docs/services.md "The router"): the
//! service's key checked, the healthy replica with the fewest requests
//! outstanding chosen, the request forwarded and its answer streamed back
//! as it comes (server-sent events and chunked bodies pass through). An
//! idempotent request without a body whose replica fails before it
//! answers is sent to another; so is one whose answer declares at most
//! [`BUFFERED_BYTES_MAX`] and breaks off before it is whole (the answer
//! is read whole before it is passed on: a replica that dies mid-answer
//! costs the client nothing). With no replica ready the request waits in
//! a bounded queue, then `503` with `Retry-After`.

use std::convert::Infallible;
use std::pin::Pin;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, Empty, Full};
use hyper::body::Incoming;
use hyper::header::{HeaderName, HeaderValue};
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;

use crate::table::Outstanding;
use crate::Shared;

pub type Answer = Response<BoxBody<Bytes, hyper::Error>>;
pub type Upstream = Client<HttpConnector, BoxBody<Bytes, hyper::Error>>;

/// Replicas one request is tried on at most.
pub const ATTEMPTS_MAX: usize = 3;

/// The longest answer to a retryable request read whole before it is
/// passed on (a longer one, or one of unknown length, streams).
pub const BUFFERED_BYTES_MAX: u64 = 1 << 20;

/// Headers that belong to one hop, never forwarded (RFC 9110 7.6.1).
const HOP_BY_HOP: [&str; 8] =
    ["connection", "keep-alive", "proxy-authenticate", "proxy-authorization", "te", "trailer", "transfer-encoding", "upgrade"];

/// The pooled client that reaches replicas: a replica that does not accept
/// a connection within a second counts as failed.
pub fn upstream() -> Upstream {
    let mut connector = HttpConnector::new();
    connector.set_connect_timeout(Some(Duration::from_secs(1)));
    connector.set_nodelay(true);
    Client::builder(hyper_util::rt::TokioExecutor::new()).pool_idle_timeout(Duration::from_secs(30)).build(connector)
}

/// A plain answer from the router itself: `{"code": ..., "message": ...}`.
pub fn refusal(status: StatusCode, code: &str, message: &str) -> Answer {
    let body = format!("{{\"code\":\"{code}\",\"message\":\"{message}\"}}");
    let mut answer = Response::new(Full::new(Bytes::from(body)).map_err(|never: Infallible| match never {}).boxed());
    *answer.status_mut() = status;
    answer.headers_mut().insert(hyper::header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
    answer
}

fn idempotent(method: &Method) -> bool {
    matches!(*method, Method::GET | Method::HEAD | Method::OPTIONS | Method::PUT | Method::DELETE | Method::TRACE)
}

pub async fn handle(shared: Arc<Shared>, request: Request<Incoming>, peer: std::net::SocketAddr) -> Result<Answer, Infallible> {
    shared.metrics.requests.inc();
    let answer = route(&shared, request, peer).await;
    shared.metrics.answers.with_label_values(&[answer.status().as_str()]).inc();
    Ok(answer)
}

async fn route(shared: &Shared, request: Request<Incoming>, peer: std::net::SocketAddr) -> Answer {
    if !shared.table.admits(request.headers().get(hyper::header::AUTHORIZATION).map(HeaderValue::as_bytes)) {
        return refusal(StatusCode::UNAUTHORIZED, "service_key_invalid", "no key of this service (Authorization: Bearer KEY)");
    }
    if shared.table.gone() {
        return refusal(StatusCode::NOT_FOUND, "service_gone", "the service was deleted or failed");
    }
    let (parts, body) = request.into_parts();
    // Only a request whose body is known empty can be sent again.
    let retry = idempotent(&parts.method) && body.is_end_stream();
    let mut body = Some(body.boxed());
    let mut tried = Vec::new();
    loop {
        let Some(outstanding) = next_replica(shared, &tried).await else {
            return match tried.is_empty() {
                true => {
                    let mut answer = refusal(StatusCode::SERVICE_UNAVAILABLE, "no_replica_ready", "no replica became ready in time");
                    answer.headers_mut().insert(hyper::header::RETRY_AFTER, HeaderValue::from_static("5"));
                    answer
                }
                false => refusal(StatusCode::BAD_GATEWAY, "replica_failed", "the replicas tried did not answer"),
            };
        };
        let replica = outstanding.replica().clone();
        tried.push(replica.lease);
        let sent = match body.take() {
            Some(body) => body,
            None => Empty::new().map_err(|never: Infallible| match never {}).boxed(),
        };
        let forwarded = match forward(&parts, sent, &replica.endpoint, peer) {
            Ok(forwarded) => forwarded,
            Err(why) => return refusal(StatusCode::BAD_REQUEST, "request_invalid", why),
        };
        let answered = match shared.upstream.request(forwarded).await {
            Ok(answer) if retry && declared_len(&answer).is_some_and(|bytes| bytes <= BUFFERED_BYTES_MAX) => {
                read_whole(answer).await.map_err(|error| error.to_string())
            }
            Ok(answer) => return stream_back(answer, outstanding),
            Err(error) => Err(error.to_string()),
        };
        match answered {
            Ok(answer) => return answer,
            Err(error) => {
                // It did not answer: no request goes to it until its probe passes.
                tracing::warn!(lease = %replica.lease, endpoint = %replica.endpoint, %error, "a replica failed a request");
                replica.healthy.store(false, Ordering::Relaxed);
                shared.metrics.replica_failures.inc();
                if !retry || tried.len() >= ATTEMPTS_MAX {
                    return refusal(StatusCode::BAD_GATEWAY, "replica_failed", "the replica failed before it answered");
                }
                shared.metrics.retries.inc();
            }
        }
    }
}

/// A healthy replica not yet tried; with none, the request waits for one
/// in the bounded queue (`queue_max` waiting, `queue_wait` each) only if
/// none was tried yet.
async fn next_replica(shared: &Shared, tried: &[gpux_engine::LeaseId]) -> Option<Outstanding> {
    if let Some(found) = shared.table.pick(tried) {
        return Some(found);
    }
    if !tried.is_empty() {
        return None;
    }
    let waiting = shared.queued.fetch_add(1, Ordering::Relaxed);
    let _leave = Leave(shared);
    if waiting >= shared.config.queue_max {
        return None;
    }
    let mut changed = shared.changed.subscribe();
    shared.wake.notify_one();
    let wait = async {
        loop {
            if let Some(found) = shared.table.pick(tried) {
                return found;
            }
            if changed.changed().await.is_err() {
                std::future::pending::<()>().await;
            }
        }
    };
    tokio::time::timeout(shared.config.queue_wait, wait).await.ok()
}

struct Leave<'a>(&'a Shared);

impl Drop for Leave<'_> {
    fn drop(&mut self) {
        self.0.queued.fetch_sub(1, Ordering::Relaxed);
    }
}

/// The request as the replica gets it: its path and query on the
/// replica's address, its headers less those of this hop and the
/// service's key, with `x-forwarded-for`.
fn forward(
    parts: &hyper::http::request::Parts,
    body: BoxBody<Bytes, hyper::Error>,
    endpoint: &str,
    peer: std::net::SocketAddr,
) -> Result<Request<BoxBody<Bytes, hyper::Error>>, &'static str> {
    let path = parts.uri.path_and_query().map_or("/", |p| p.as_str());
    let uri: hyper::Uri = format!("http://{endpoint}{path}").parse().map_err(|_| "the request's path")?;
    let mut request = Request::builder().method(parts.method.clone()).uri(uri).version(hyper::Version::HTTP_11);
    let headers = request.headers_mut().ok_or("the request's headers")?;
    for (name, value) in &parts.headers {
        if HOP_BY_HOP.contains(&name.as_str()) || name == hyper::header::AUTHORIZATION || name == hyper::header::HOST {
            continue;
        }
        headers.append(name.clone(), value.clone());
    }
    if let Ok(value) = HeaderValue::from_str(&peer.ip().to_string()) {
        headers.append(HeaderName::from_static("x-forwarded-for"), value);
    }
    request.body(body).map_err(|_| "the request")
}

/// The `Content-Length` an answer declares.
fn declared_len(answer: &Response<Incoming>) -> Option<u64> {
    answer.headers().get(hyper::header::CONTENT_LENGTH).and_then(|v| v.to_str().ok()).and_then(|v| v.parse().ok())
}

/// The replica's answer read whole (its declared length, small), or the
/// error that cut it off: then it is tried again on another replica.
async fn read_whole(answer: Response<Incoming>) -> Result<Answer, hyper::Error> {
    let (mut parts, body) = answer.into_parts();
    let bytes = body.collect().await?.to_bytes();
    for name in HOP_BY_HOP {
        parts.headers.remove(name);
    }
    Ok(Response::from_parts(parts, Full::new(bytes).map_err(|never: Infallible| match never {}).boxed()))
}

/// The replica's answer, its body streamed back as it comes; the request
/// stays outstanding on the replica until the body ends.
fn stream_back(answer: Response<Incoming>, outstanding: Outstanding) -> Answer {
    let (mut parts, body) = answer.into_parts();
    for name in HOP_BY_HOP {
        parts.headers.remove(name);
    }
    Response::from_parts(parts, Tracked { body, _outstanding: outstanding }.boxed())
}

struct Tracked {
    body: Incoming,
    _outstanding: Outstanding,
}

impl Body for Tracked {
    type Data = Bytes;
    type Error = hyper::Error;

    fn poll_frame(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, hyper::Error>>> {
        Pin::new(&mut self.body).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.body.size_hint()
    }
}
