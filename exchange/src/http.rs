//! The exchange's small HTTP servers (the metrics scrape and the web
//! console): axum routers served over hyper's HTTP/1.1, with the bounds an
//! unauthenticated port needs: at most [`HTTP_CONNECTIONS_MAX`] connections
//! at once and [`HTTP_CONNECTIONS_PER_IP_MAX`] from one address (more are
//! closed at accept, so one client cannot take every slot), one request per
//! connection, the
//! request head read within [`HTTP_HEAD_TIMEOUT`] and the whole exchange over
//! within [`HTTP_REQUEST_TIMEOUT`] however slowly its bytes trickle in, and
//! accept failures backing off (docs/protocol.md "Limits and abuse"). With
//! the gateway's TLS identity (`--tls-cert`), the console's listener speaks
//! HTTPS only: the TLS handshake must end within [`HTTP_HEAD_TIMEOUT`].

use std::sync::Arc;
use std::time::Duration;

use gpux_gateway::admission::{accept, AcceptBackoff};
use gpux_gateway::metrics::GatewayMetrics;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use tokio::net::TcpListener;

pub use crate::limits::HTTP_CONNECTIONS_MAX;
pub use crate::limits::HTTP_CONNECTIONS_PER_IP_MAX;
pub use crate::limits::HTTP_HEAD_TIMEOUT;
pub use crate::limits::HTTP_REQUEST_TIMEOUT;

/// Connections open per address; a [`PerIpSlot`] gives its place back.
#[derive(Default)]
struct PerIp(std::sync::Mutex<std::collections::HashMap<std::net::IpAddr, usize>>);

struct PerIpSlot {
    counts: Arc<PerIp>,
    ip: std::net::IpAddr,
}

impl PerIp {
    fn take(counts: &Arc<PerIp>, ip: std::net::IpAddr) -> Option<PerIpSlot> {
        let mut open = counts.0.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        let count = open.entry(ip).or_insert(0);
        if *count >= HTTP_CONNECTIONS_PER_IP_MAX {
            return None;
        }
        *count += 1;
        Some(PerIpSlot { counts: counts.clone(), ip })
    }
}

impl Drop for PerIpSlot {
    fn drop(&mut self) {
        let mut open = self.counts.0.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        if let Some(count) = open.get_mut(&self.ip) {
            *count -= 1;
            if *count == 0 {
                open.remove(&self.ip);
            }
        }
    }
}
use crate::limits::HTTP_HEAD_BYTES_MAX;

/// Serves `router` on `listener` until the process ends, over TLS when
/// `tls` is given.
pub async fn serve(
    listener: TcpListener,
    what: &'static str,
    metrics: Arc<GatewayMetrics>,
    router: axum::Router,
    tls: Option<tokio_rustls::TlsAcceptor>,
) {
    serve_within(listener, what, metrics, router, tls, HTTP_REQUEST_TIMEOUT).await
}

/// `serve`, with each connection's whole exchange over within
/// `request_timeout` (the job store moves large bodies).
pub async fn serve_within(
    listener: TcpListener,
    what: &'static str,
    metrics: Arc<GatewayMetrics>,
    router: axum::Router,
    tls: Option<tokio_rustls::TlsAcceptor>,
    request_timeout: Duration,
) {
    let slots = Arc::new(tokio::sync::Semaphore::new(HTTP_CONNECTIONS_MAX));
    let per_ip = Arc::new(PerIp::default());
    let mut backoff = AcceptBackoff::new(what);
    loop {
        let (stream, peer) = accept(&listener, &mut backoff, &metrics).await;
        let Some(from_ip) = PerIp::take(&per_ip, peer.ip()) else { continue };
        let Ok(slot) = slots.clone().try_acquire_owned() else { continue };
        let service = TowerToHyperService::new(router.clone());
        let tls = tls.clone();
        tokio::spawn(async move {
            let _slots = (slot, from_ip);
            let exchange = async move {
                let builder = || {
                    let mut builder = hyper::server::conn::http1::Builder::new();
                    builder
                        .timer(TokioTimer::new())
                        .header_read_timeout(HTTP_HEAD_TIMEOUT)
                        .max_buf_size(HTTP_HEAD_BYTES_MAX)
                        .keep_alive(false);
                    builder
                };
                match tls {
                    Some(acceptor) => {
                        let Ok(Ok(secured)) = tokio::time::timeout(HTTP_HEAD_TIMEOUT, acceptor.accept(stream)).await else { return };
                        let _ = builder().serve_connection(TokioIo::new(secured), service).await;
                    }
                    None => {
                        let _ = builder().serve_connection(TokioIo::new(stream), service).await;
                    }
                }
            };
            let _ = tokio::time::timeout(request_timeout, exchange).await;
        });
    }
}
