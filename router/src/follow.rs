//! The router's view of its service: the exchange's feed followed (the
//! service's state asked at each login, then every `service_update`), and
//! its own probe of each replica's readiness path.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use gpux_protocol::{ClientMessage, ServerMessage};

use crate::Shared;

/// Waits between two logins after the feed was lost.
const RECONNECT_WAIT: Duration = Duration::from_secs(1);

/// Follows the service on the exchange for as long as the router runs;
/// a lost connection is opened again (what it knew is kept meanwhile:
/// requests go on to the replicas it knew).
pub async fn follow(shared: Arc<Shared>) {
    loop {
        if let Err(error) = follow_once(&shared).await {
            tracing::warn!(%error, "the exchange's feed was lost; logging in again");
        }
        tokio::time::sleep(RECONNECT_WAIT).await;
    }
}

async fn follow_once(shared: &Shared) -> anyhow::Result<()> {
    let config = &shared.config;
    let mut connection = gpux_client::Connection::open(&config.exchange, &config.key, None).await?;
    let id = connection.new_id();
    match connection.request(ClientMessage::ServiceStatus { id, service: config.service }).await? {
        ServerMessage::Service { service, .. } => apply(shared, &service),
        ServerMessage::Error { code, message, .. } => anyhow::bail!("service {}: {}: {message}", config.service, code.message()),
        other => anyhow::bail!("unexpected answer: {other:?}"),
    }
    tracing::info!(service = %config.service, "following the service");
    let mut tick = tokio::time::interval(LOAD_INTERVAL);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut meter = Meter::new(shared);
    loop {
        tokio::select! {
            message = connection.next() => {
                match message? {
                    ServerMessage::ServiceUpdate { service } if service.service == config.service => apply(shared, &service),
                    ServerMessage::Error { code, message, .. } => tracing::debug!(code = code.message(), %message, "the exchange refused"),
                    _ => {}
                }
            }
            _ = tick.tick() => report(shared, &mut connection, &mut meter).await?,
            _ = shared.wake.notified() => report(shared, &mut connection, &mut meter).await?,
        }
    }
}

/// How often a router reports its load of a service with autoscaling.
pub const LOAD_INTERVAL: Duration = Duration::from_secs(1);

/// Requests counted at the last report, and when.
struct Meter {
    at: std::time::Instant,
    requests: u64,
}

impl Meter {
    fn new(shared: &Shared) -> Meter {
        Meter { at: std::time::Instant::now(), requests: shared.metrics.requests.get() }
    }
}

/// The load since the last report (requests per second, in flight,
/// queued), sent as `service_load` when the service scales on it; its
/// `ack` is read (and passed over) with the feed.
async fn report(shared: &Shared, connection: &mut gpux_client::Connection, meter: &mut Meter) -> anyhow::Result<()> {
    if !shared.table.scales() {
        return Ok(());
    }
    let (now, requests) = (std::time::Instant::now(), shared.metrics.requests.get());
    let load = gpux_protocol::ServiceLoad {
        requests_per_second_milli: rate_milli(requests.saturating_sub(meter.requests), now.duration_since(meter.at)),
        in_flight: shared.table.in_flight(),
        queued: shared.queued.load(Ordering::Relaxed) as u32,
    };
    *meter = Meter { at: now, requests };
    let id = connection.new_id();
    let message = ClientMessage::ServiceLoad { id, service: shared.config.service, router: shared.config.router, load };
    connection.send(&message).await?;
    Ok(())
}

/// Requests per second (in thousandths) of `requests` counted over
/// `elapsed`. A report sooner than the interval (a queued request wakes
/// one) still measures over a whole interval: one request 30 ms after the
/// last tick is one request a second, not 33.
fn rate_milli(requests: u64, elapsed: Duration) -> u64 {
    let elapsed_ms = elapsed.max(LOAD_INTERVAL).as_millis() as u64;
    requests.saturating_mul(1_000_000) / elapsed_ms
}

fn apply(shared: &Shared, service: &gpux_protocol::ServiceInfo) {
    shared.table.update(service);
    shared.metrics.replicas_routable.set(shared.table.routable() as i64);
    shared.changed.send_modify(|n| *n += 1);
}

/// Probes every replica every [`crate::PROBE_INTERVAL`]: an HTTP GET of
/// the readiness path answered 2xx or 3xx within a second (without a path,
/// a TCP connection), so a replica whose readiness fails stops getting
/// requests within about a second, and gets them again once it passes.
pub async fn probe(shared: Arc<Shared>) {
    loop {
        tokio::time::sleep(crate::PROBE_INTERVAL).await;
        let (replicas, path) = shared.table.snapshot();
        let checks = replicas.into_iter().map(|replica| {
            let (shared, path) = (shared.clone(), path.clone());
            async move {
                let healthy =
                    tokio::time::timeout(Duration::from_secs(1), check(&shared, &replica.endpoint, path.as_deref())).await.unwrap_or(false);
                let was = replica.healthy.swap(healthy, Ordering::Relaxed);
                if was != healthy {
                    tracing::info!(lease = %replica.lease, endpoint = %replica.endpoint, healthy, "a replica's probe changed");
                }
                healthy && !was
            }
        });
        let recovered = futures_join(checks).await;
        shared.metrics.replicas_routable.set(shared.table.routable() as i64);
        if recovered {
            shared.changed.send_modify(|n| *n += 1);
        }
    }
}

/// Runs the checks together: whether any replica became healthy.
async fn futures_join(checks: impl Iterator<Item = impl std::future::Future<Output = bool> + Send + 'static>) -> bool {
    let mut set = tokio::task::JoinSet::new();
    for check in checks {
        set.spawn(check);
    }
    let mut any = false;
    while let Some(done) = set.join_next().await {
        any |= done.unwrap_or(false);
    }
    any
}

async fn check(shared: &Shared, endpoint: &str, path: Option<&str>) -> bool {
    let Some(path) = path else { return tokio::net::TcpStream::connect(endpoint).await.is_ok() };
    let Ok(uri) = format!("http://{endpoint}{path}").parse::<hyper::Uri>() else { return false };
    use http_body_util::BodyExt;
    let empty = http_body_util::Empty::new().map_err(|never: std::convert::Infallible| match never {}).boxed();
    let Ok(request) = hyper::Request::get(uri).body(empty) else { return false };
    match shared.upstream.request(request).await {
        Ok(answer) => answer.status().is_success() || answer.status().is_redirection(),
        Err(_) => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_report_sooner_than_the_interval_measures_over_the_whole_interval() {
        assert_eq!(rate_milli(1, Duration::from_millis(30)), 1_000);
        assert_eq!(rate_milli(50, Duration::from_millis(500)), 50_000);
        assert_eq!(rate_milli(30, Duration::from_secs(2)), 15_000);
        assert_eq!(rate_milli(0, Duration::ZERO), 0);
    }
}
