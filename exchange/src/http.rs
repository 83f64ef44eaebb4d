//! The exchange's small HTTP servers (the metrics scrape and the web
//! console): axum routers served over hyper's HTTP/1.1, with the bounds an
//! unauthenticated port needs: at most [`HTTP_CONNECTIONS_MAX`] connections
//! at once (more are closed at accept), one request per connection, the
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

/// The whole exchange on one HTTP connection must be over within this time.
pub const HTTP_REQUEST_TIMEOUT: Duration = Duration::from_secs(5);
/// The request head must have arrived within this time.
pub const HTTP_HEAD_TIMEOUT: Duration = Duration::from_secs(2);
/// HTTP connections at once on each of the metrics and console listeners.
pub const HTTP_CONNECTIONS_MAX: usize = 64;
/// The largest request head read.
const HTTP_HEAD_BYTES_MAX: usize = 8 * 1024;

/// Serves `router` on `listener` until the process ends, over TLS when
/// `tls` is given.
pub async fn serve(
    listener: TcpListener,
    what: &'static str,
    metrics: Arc<GatewayMetrics>,
    router: axum::Router,
    tls: Option<tokio_rustls::TlsAcceptor>,
) {
    let slots = Arc::new(tokio::sync::Semaphore::new(HTTP_CONNECTIONS_MAX));
    let mut backoff = AcceptBackoff::new(what);
    loop {
        let (stream, _) = accept(&listener, &mut backoff, &metrics).await;
        let Ok(slot) = slots.clone().try_acquire_owned() else { continue };
        let service = TowerToHyperService::new(router.clone());
        let tls = tls.clone();
        tokio::spawn(async move {
            let _slot = slot;
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
            let _ = tokio::time::timeout(HTTP_REQUEST_TIMEOUT, exchange).await;
        });
    }
}
