//! The exchange's small HTTP servers (the metrics scrape and the web
//! console): axum routers served over hyper's HTTP/1.1, with the bounds an
//! unauthenticated port needs: at most [`HTTP_CONNECTIONS_MAX`] connections
//! at once and [`HTTP_CONNECTIONS_PER_IP_MAX`] from one address (an IPv6
//! /64 is one address; more are closed at accept), and when all are taken
//! a new address's connection takes the place of the oldest connection of
//! the address holding the most, so a few addresses cannot take every
//! slot; one request per connection, the
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

use gpux_protocol::peer_auth::address_key;

/// The connections open on one listener, by address, each with what
/// closes it: at most [`HTTP_CONNECTIONS_MAX`] in all and
/// [`HTTP_CONNECTIONS_PER_IP_MAX`] per address. When all are taken, a
/// connection from an address that holds fewer than the address holding
/// the most takes that address's oldest connection's place, so a few
/// addresses' silent connections cannot keep others out.
#[derive(Default)]
struct Open {
    next: u64,
    total: usize,
    by_address: std::collections::HashMap<u128, std::collections::BTreeMap<u64, Option<tokio::task::AbortHandle>>>,
}

/// A connection's place; dropping it gives the place back.
struct Place {
    open: Arc<std::sync::Mutex<Open>>,
    address: u128,
    id: u64,
}

impl Open {
    fn lock(open: &std::sync::Mutex<Open>) -> std::sync::MutexGuard<'_, Open> {
        open.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    fn held(&self, address: u128) -> usize {
        self.by_address.get(&address).map_or(0, std::collections::BTreeMap::len)
    }

    /// A place for a connection from `address`, or `None` (close it).
    fn take(open: &Arc<std::sync::Mutex<Open>>, address: u128) -> Option<Place> {
        let mut this = Open::lock(open);
        let mine = this.held(address);
        if mine >= HTTP_CONNECTIONS_PER_IP_MAX {
            return None;
        }
        if this.total >= HTTP_CONNECTIONS_MAX {
            let (&heaviest, _) = this.by_address.iter().max_by_key(|(_, connections)| connections.len())?;
            if this.held(heaviest) <= mine + 1 {
                return None;
            }
            let connections = this.by_address.get_mut(&heaviest)?;
            let (_, close) = connections.pop_first()?;
            if connections.is_empty() {
                this.by_address.remove(&heaviest);
            }
            this.total -= 1;
            if let Some(close) = close {
                close.abort();
            }
        }
        let id = this.next;
        this.next += 1;
        this.total += 1;
        this.by_address.entry(address).or_default().insert(id, None);
        Some(Place { open: open.clone(), address, id })
    }

    /// What closes connection `id` from `address`, once its task runs (it
    /// may have ended already: then there is nothing to close).
    fn closes_with(open: &std::sync::Mutex<Open>, address: u128, id: u64, close: tokio::task::AbortHandle) {
        let mut this = Open::lock(open);
        if let Some(slot) = this.by_address.get_mut(&address).and_then(|c| c.get_mut(&id)) {
            *slot = Some(close);
        }
    }
}

impl Drop for Place {
    fn drop(&mut self) {
        let mut this = Open::lock(&self.open);
        let Some(connections) = this.by_address.get_mut(&self.address) else { return };
        if connections.remove(&self.id).is_some() {
            if connections.is_empty() {
                this.by_address.remove(&self.address);
            }
            this.total -= 1;
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
    let open = Arc::new(std::sync::Mutex::new(Open::default()));
    let mut backoff = AcceptBackoff::new(what);
    loop {
        let (stream, peer) = accept(&listener, &mut backoff, &metrics).await;
        let Some(place) = Open::take(&open, address_key(peer.ip())) else { continue };
        let service = TowerToHyperService::new(router.clone());
        let tls = tls.clone();
        let (address, id) = (place.address, place.id);
        let task = tokio::spawn(async move {
            let _place = place;
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
        Open::closes_with(&open, address, id, task.abort_handle());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_address_is_ipv4_or_an_ipv6_64_and_mapped_ipv4_is_ipv4() {
        let v4: std::net::IpAddr = "203.0.113.9".parse().expect("ip");
        let mapped: std::net::IpAddr = "::ffff:203.0.113.9".parse().expect("ip");
        assert_eq!(address_key(v4), address_key(mapped));
        let a: std::net::IpAddr = "2001:db8:1:2::1".parse().expect("ip");
        let b: std::net::IpAddr = "2001:db8:1:2:ffff::9".parse().expect("ip");
        let c: std::net::IpAddr = "2001:db8:1:3::1".parse().expect("ip");
        assert_eq!(address_key(a), address_key(b), "one /64");
        assert_ne!(address_key(a), address_key(c));
        assert_ne!(address_key(v4), address_key("::cb00:7109".parse().expect("ip")), "IPv6 never reads as IPv4");
    }

    /// When every place is taken, a newcomer takes the oldest place of the
    /// address that holds the most, unless it would hold as many itself.
    #[test]
    fn a_full_table_gives_a_newcomer_the_oldest_place_of_the_heaviest_address() {
        let open = Arc::new(std::sync::Mutex::new(Open::default()));
        let mut places = Vec::new();
        let addresses = HTTP_CONNECTIONS_MAX / HTTP_CONNECTIONS_PER_IP_MAX;
        for address in 0..addresses as u128 {
            for _ in 0..HTTP_CONNECTIONS_PER_IP_MAX {
                places.push(Open::take(&open, address).expect("a place"));
            }
            assert!(Open::take(&open, address).is_none(), "the address's share");
        }
        let newcomer = Open::take(&open, 1_000).expect("a newcomer's place");
        assert_eq!(Open::lock(&open).total, HTTP_CONNECTIONS_MAX);
        let shorted: Vec<u128> = (0..addresses as u128).filter(|&a| Open::lock(&open).held(a) < HTTP_CONNECTIONS_PER_IP_MAX).collect();
        assert_eq!(shorted.len(), 1, "one address gave up its oldest");
        // Equal shares give nothing up: one address of 15 against 16s.
        let second = Open::take(&open, 1_001).expect("another newcomer");
        let mut more = Vec::new();
        while let Some(place) = Open::take(&open, 1_001) {
            more.push(place);
        }
        let held = Open::lock(&open).held(1_001);
        let heaviest = (0..addresses as u128).map(|a| Open::lock(&open).held(a)).max().expect("addresses");
        assert!(held < HTTP_CONNECTIONS_PER_IP_MAX && heaviest <= held + 1, "it stops at about the others' share: {held} vs {heaviest}");
        drop((newcomer, second, more));
        drop(places);
        assert_eq!(Open::lock(&open).total, 0, "every place given back, the taken ones once");
    }
}
