//! gpux-router (docs/services.md "The router"): takes HTTP requests for one
//! service at a stable address and routes them to the service's ready
//! replicas. It follows the exchange's feed of the service (logged in with
//! a key of the service's account: `read` scope is enough to route), so
//! several routers may serve one service and a restarted one serves again
//! as soon as the feed answers.
//!
//! - `table.rs`: the ready replicas, their requests outstanding and
//!   health, the service's keys.
//! - `proxy.rs`: one request: the key checked, least outstanding chosen,
//!   retried where idempotent, queued while no replica is ready, streamed.
//! - `follow.rs`: the feed follower, and the health probe that stops
//!   routing to a replica within a second of its readiness failing.

pub mod follow;
pub mod proxy;
pub mod table;

use std::net::SocketAddr;
use std::sync::atomic::AtomicUsize;
use std::sync::Arc;
use std::time::Duration;

use ed25519_dalek::SigningKey;
use gpux_protocol::ServiceId;
use hyper_util::rt::TokioIo;
use prometheus::{IntCounter, IntCounterVec, IntGauge, Opts, Registry};
use tokio::net::TcpListener;
use tokio::task::JoinSet;

/// Requests that may wait for a first ready replica at once (more: `503`).
pub const QUEUE_MAX_DEFAULT: usize = 256;
/// How long a request waits for a ready replica before `503`.
pub const QUEUE_WAIT_DEFAULT: Duration = Duration::from_secs(30);
/// How often the router probes each replica's readiness path.
pub const PROBE_INTERVAL: Duration = Duration::from_millis(300);

#[derive(Clone)]
pub struct Config {
    /// The exchange's WebSocket address (a cluster's nodes, comma-separated).
    pub exchange: String,
    /// A key of the service's account (`read` scope at least).
    pub key: SigningKey,
    pub service: ServiceId,
    pub listen: SocketAddr,
    pub queue_max: usize,
    pub queue_wait: Duration,
    /// TLS for the service's address (a certificate and key in PEM), as the gateway's.
    pub tls: Option<Arc<tokio_rustls::rustls::ServerConfig>>,
    /// This router's number in its load reports (distinct per router of a service).
    pub router: u32,
}

impl Config {
    pub fn new(exchange: String, key: SigningKey, service: ServiceId, listen: SocketAddr) -> Config {
        // Distinct enough per router without configuration: its process and start time.
        let router =
            std::process::id() ^ std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.subsec_nanos());
        Config { exchange, key, service, listen, queue_max: QUEUE_MAX_DEFAULT, queue_wait: QUEUE_WAIT_DEFAULT, tls: None, router }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum RouterError {
    #[error("listening on {address}: {source}")]
    Listen { address: SocketAddr, source: std::io::Error },
    #[error("metrics: {0}")]
    Metrics(#[from] prometheus::Error),
}

/// The router's counters (Prometheus, `gpux_router_*`).
pub struct Metrics {
    pub registry: Registry,
    pub requests: IntCounter,
    pub answers: IntCounterVec,
    pub retries: IntCounter,
    pub replica_failures: IntCounter,
    pub replicas_routable: IntGauge,
}

impl Metrics {
    fn new(service: ServiceId) -> Result<Metrics, prometheus::Error> {
        let registry = Registry::new_custom(Some("gpux_router".into()), Some([("service".to_string(), service.to_string())].into()))?;
        let requests = IntCounter::new("requests_total", "Requests received")?;
        let answers = IntCounterVec::new(Opts::new("answers_total", "Answers sent, by HTTP status"), &["status"])?;
        let retries = IntCounter::new("retries_total", "Idempotent requests sent again after their replica failed")?;
        let replica_failures = IntCounter::new("replica_failures_total", "Requests a replica failed before it answered")?;
        let replicas_routable = IntGauge::new("replicas_routable", "Ready replicas whose probe passes")?;
        registry.register(Box::new(requests.clone()))?;
        registry.register(Box::new(answers.clone()))?;
        registry.register(Box::new(retries.clone()))?;
        registry.register(Box::new(replica_failures.clone()))?;
        registry.register(Box::new(replicas_routable.clone()))?;
        Ok(Metrics { registry, requests, answers, retries, replica_failures, replicas_routable })
    }
}

/// What every request and the router's tasks share.
pub struct Shared {
    pub config: Config,
    pub table: table::Table,
    pub upstream: proxy::Upstream,
    /// Bumped whenever replicas may have become routable (queued requests look again).
    pub changed: tokio::sync::watch::Sender<u64>,
    /// Requests waiting for a ready replica now.
    pub queued: AtomicUsize,
    /// Told when a request starts waiting: the load is reported at once
    /// (a service at zero wakes without waiting for the next report).
    pub wake: tokio::sync::Notify,
    pub metrics: Metrics,
}

/// A router serving: its address, and its tasks (stopped when dropped).
pub struct Running {
    pub addr: SocketAddr,
    pub shared: Arc<Shared>,
    tasks: JoinSet<()>,
}

impl Running {
    /// Stops serving at once, as a killed router would: its address and
    /// every connection closed when this returns.
    pub async fn stop(mut self) {
        self.tasks.abort_all();
        while self.tasks.join_next().await.is_some() {}
    }
}

/// Binds the service's address and starts following the feed, probing
/// replicas and serving requests.
pub async fn start(config: Config) -> Result<Running, RouterError> {
    let listener = TcpListener::bind(config.listen).await.map_err(|source| RouterError::Listen { address: config.listen, source })?;
    let addr = listener.local_addr().map_err(|source| RouterError::Listen { address: config.listen, source })?;
    let shared = Arc::new(Shared {
        metrics: Metrics::new(config.service)?,
        config,
        table: table::Table::default(),
        upstream: proxy::upstream(),
        changed: tokio::sync::watch::channel(0).0,
        queued: AtomicUsize::new(0),
        wake: tokio::sync::Notify::new(),
    });
    let mut tasks = JoinSet::new();
    tasks.spawn(follow::follow(shared.clone()));
    tasks.spawn(follow::probe(shared.clone()));
    tasks.spawn(serve(listener, shared.clone()));
    Ok(Running { addr, shared, tasks })
}

async fn serve(listener: TcpListener, shared: Arc<Shared>) {
    let acceptor = shared.config.tls.clone().map(tokio_rustls::TlsAcceptor::from);
    // The connections' tasks: aborted with this one.
    let mut connections = JoinSet::new();
    loop {
        while connections.try_join_next().is_some() {}
        let (stream, peer) = match listener.accept().await {
            Ok(accepted) => accepted,
            Err(error) => {
                tracing::warn!(%error, "accepting a connection");
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        let _ = stream.set_nodelay(true);
        let (shared, acceptor) = (shared.clone(), acceptor.clone());
        connections.spawn(async move {
            let service = hyper::service::service_fn(move |request| proxy::handle(shared.clone(), request, peer));
            let builder = hyper::server::conn::http1::Builder::new();
            let served = match acceptor {
                None => builder.serve_connection(TokioIo::new(stream), service).await,
                Some(acceptor) => match tokio::time::timeout(Duration::from_secs(10), acceptor.accept(stream)).await {
                    Ok(Ok(tls)) => builder.serve_connection(TokioIo::new(tls), service).await,
                    _ => return,
                },
            };
            if let Err(error) = served {
                tracing::debug!(%error, %peer, "a connection ended with an error");
            }
        });
    }
}
