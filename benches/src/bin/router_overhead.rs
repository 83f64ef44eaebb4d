//! The router's cost per request (docs/PERFORMANCE.md "Services"), all in
//! one process on loopback: a hyper server stands for a replica (it
//! answers `GET /` with 64 bytes), `gpux-router` routes to it (its table
//! set as the exchange's feed would set it: the feed itself is not part of
//! a request's path), and a bare hyper proxy (the same pooled client, no
//! key check, no choice of replica, no accounting) is the ceiling.
//!
//! Run:
//!
//! ```text
//! cargo run --release -p gpux-benches --bin router-overhead [requests] [concurrency] [seconds]
//! ```
//!
//! 1. **Latency**: `requests` (default 20 000) sequential GETs on one kept-alive
//!    connection, direct to the replica, through the bare proxy and through
//!    the router: p50 and p99 of each, in the same run.
//! 2. **Throughput**: `concurrency` (default 32) clients for `seconds`
//!    (default 5) each, through the bare proxy and through the router:
//!    requests a second.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use gpux_engine::{InstrumentId, LeaseId};
use gpux_protocol::{ReplicaInfo, ReplicaState, ServiceId, ServiceInfo, ServiceSpec, ServiceState};
use hdrhistogram::Histogram;
use http_body_util::{BodyExt, Empty, Full};
use hyper::{Request, Response};
use hyper_util::client::legacy::Client;
use hyper_util::rt::{TokioExecutor, TokioIo};

const KEY: &str = "router-overhead-key";

type Body = http_body_util::combinators::BoxBody<Bytes, hyper::Error>;

fn empty() -> Body {
    Empty::new().map_err(|never: Infallible| match never {}).boxed()
}

/// Serves `answer` for every connection accepted on a fresh loopback port.
async fn serve<F, Fut>(answer: F) -> SocketAddr
where
    F: Fn(Request<hyper::body::Incoming>) -> Fut + Clone + Send + Sync + 'static,
    Fut: std::future::Future<Output = Response<Body>> + Send + 'static,
{
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr");
    tokio::spawn(async move {
        loop {
            let Ok((stream, _)) = listener.accept().await else { continue };
            let _ = stream.set_nodelay(true);
            let answer = answer.clone();
            tokio::spawn(async move {
                let service = hyper::service::service_fn(move |request| {
                    let answer = answer.clone();
                    async move { Ok::<_, Infallible>(answer(request).await) }
                });
                let _ = hyper::server::conn::http1::Builder::new().serve_connection(TokioIo::new(stream), service).await;
            });
        }
    });
    addr
}

fn service_at(replica: SocketAddr) -> ServiceInfo {
    ServiceInfo {
        service: ServiceId(1),
        spec: ServiceSpec {
            name: "bench".into(),
            instrument: InstrumentId(0),
            gpus: 1,
            limit_minor_per_gpu_hour: 1_000,
            budget_minor_per_hour: 1_000,
            replicas: 1,
            min_replicas: 1,
            max_replicas: 1,
            image: "bench".into(),
            command: Vec::new(),
            port: replica.port(),
            readiness_path: None,
            regions: Vec::new(),
            min_supplier_score_bps: 0,
            scaling: None,
            key_hashes: vec![gpux_protocol::services::key_hash(KEY)],
        },
        state: ServiceState::Running,
        replicas: vec![ReplicaInfo {
            slot: 0,
            state: ReplicaState::Ready,
            lease: Some(LeaseId(1)),
            endpoint: Some(replica.to_string()),
            stalled: None,
            since_ms: 0,
            generation: 0,
            noticed: false,
        }],
        bids: 1,
        replaced: 0,
        leases: vec![LeaseId(1)],
        created_at_ms: 0,
        updated_at_ms: 0,
        last_scaling: None,
        generation: 0,
        rollout: None,
        floor: None,
    }
}

async fn get(client: &Client<hyper_util::client::legacy::connect::HttpConnector, Body>, to: SocketAddr) {
    let request = Request::get(format!("http://{to}/")).header("authorization", format!("Bearer {KEY}")).body(empty()).expect("request");
    let answer = client.request(request).await.expect("an answer");
    assert!(answer.status().is_success(), "{}", answer.status());
    answer.into_body().collect().await.expect("the body");
}

fn client() -> Client<hyper_util::client::legacy::connect::HttpConnector, Body> {
    let mut connector = hyper_util::client::legacy::connect::HttpConnector::new();
    connector.set_nodelay(true);
    Client::builder(TokioExecutor::new()).build(connector)
}

async fn latency(to: SocketAddr, requests: usize) -> Histogram<u64> {
    let client = client();
    let mut histogram = Histogram::<u64>::new(3).expect("histogram");
    for _ in 0..requests / 10 {
        get(&client, to).await;
    }
    for _ in 0..requests {
        let started = Instant::now();
        get(&client, to).await;
        histogram.record(started.elapsed().as_nanos() as u64).expect("recorded");
    }
    histogram
}

async fn throughput(to: SocketAddr, concurrency: usize, seconds: u64) -> f64 {
    let (stop, done) = (Arc::new(AtomicBool::new(false)), Arc::new(AtomicU64::new(0)));
    let tasks: Vec<_> = (0..concurrency)
        .map(|_| {
            let (stop, done, client) = (stop.clone(), done.clone(), client());
            tokio::spawn(async move {
                while !stop.load(Ordering::Relaxed) {
                    get(&client, to).await;
                    done.fetch_add(1, Ordering::Relaxed);
                }
            })
        })
        .collect();
    let started = Instant::now();
    tokio::time::sleep(Duration::from_secs(seconds)).await;
    stop.store(true, Ordering::Relaxed);
    let count = done.load(Ordering::Relaxed);
    let elapsed = started.elapsed();
    for task in tasks {
        let _ = task.await;
    }
    count as f64 / elapsed.as_secs_f64()
}

fn us(nanos: u64) -> f64 {
    nanos as f64 / 1_000.0
}

fn main() {
    let args: Vec<usize> = std::env::args().skip(1).filter_map(|a| a.parse().ok()).collect();
    let (requests, concurrency, seconds) =
        (args.first().copied().unwrap_or(20_000), args.get(1).copied().unwrap_or(32), args.get(2).copied().unwrap_or(5) as u64);
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build().expect("runtime");
    runtime.block_on(async {
        let replica = serve(|_| async { Response::new(Full::new(Bytes::from_static(&[b'x'; 64])).map_err(|n| match n {}).boxed()) }).await;
        // The bare proxy: the same pooled client, straight through.
        let upstream = gpux_router::proxy::upstream();
        let bare = serve(move |request: Request<hyper::body::Incoming>| {
            let upstream = upstream.clone();
            async move {
                let path = request.uri().path_and_query().map_or("/", |p| p.as_str()).to_string();
                let forwarded = Request::get(format!("http://{replica}{path}")).body(empty()).expect("request");
                let answer = upstream.request(forwarded).await.expect("the replica answers");
                let (parts, body) = answer.into_parts();
                Response::from_parts(parts, body.boxed())
            }
        })
        .await;
        // The router, its table set as the feed would set it (its feed
        // points nowhere and keeps trying: not on a request's path).
        let key = ed25519_dalek::SigningKey::from_bytes(&[9; 32]);
        let config = gpux_router::Config::new("ws://127.0.0.1:1".into(), key, ServiceId(1), "127.0.0.1:0".parse().expect("addr"));
        let router = gpux_router::start(config).await.expect("the router starts");
        router.shared.table.update(&service_at(replica));
        let through = router.addr;

        println!("router overhead: {requests} sequential GETs each (64-byte answers), {concurrency} clients x {seconds} s for throughput");
        for (name, to) in [("direct to the replica", replica), ("bare hyper proxy", bare), ("gpux-router", through)] {
            let h = latency(to, requests).await;
            println!("  {name:<22} p50 {:>7.1} us  p99 {:>7.1} us", us(h.value_at_quantile(0.5)), us(h.value_at_quantile(0.99)));
        }
        for (name, to) in [("bare hyper proxy", bare), ("gpux-router", through)] {
            let rate = throughput(to, concurrency, seconds).await;
            println!("  {name:<22} {rate:>9.0} requests/s");
        }
        router.stop().await;
    });
}
