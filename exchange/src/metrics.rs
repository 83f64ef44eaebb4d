//! Operator metrics in the Prometheus text format, served on a separate
//! loopback HTTP port (`--metrics-listen`). Counters are atomics updated by
//! the sequencer and the gateway; book depth is a text block the sequencer
//! refreshes at most once a second. The HTTP side is a deliberately tiny
//! GET-only responder: one request per connection, bounded header size.

use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::Duration;

use tokio::net::TcpListener;

/// Upper bounds (seconds) of the journal commit latency histogram.
const COMMIT_BUCKETS_SECONDS: [f64; 11] = [0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.5];

#[derive(Default)]
pub struct Metrics {
    pub commands: AtomicU64,
    pub orders: AtomicU64,
    pub rejects: AtomicU64,
    pub journal_entries: AtomicU64,
    pub connections: AtomicU64,
    pub connections_total: AtomicU64,
    pub slow_consumers: AtomicU64,
    /// Accepts that failed (most often: out of file descriptors).
    pub accept_errors: AtomicU64,
    connections_refused: [AtomicU64; crate::admission::Refusal::ALL.len()],
    connections_reaped: [AtomicU64; crate::gateway::Stage::ALL.len()],
    commit_buckets: [AtomicU64; COMMIT_BUCKETS_SECONDS.len()],
    commit_count: AtomicU64,
    commit_nanos: AtomicU64,
    pub book_depth: Mutex<String>,
    delivery_statuses: [AtomicU64; DELIVERY_STATES.len()],
    running_buckets: [AtomicU64; RUNNING_BUCKETS_SECONDS.len()],
    running_count: AtomicU64,
    running_millis: AtomicU64,
}

/// Delivery status names, as `gpux_delivery_statuses_total{state=...}` labels.
const DELIVERY_STATES: [&str; 7] = ["awaiting_secrets", "pulling", "starting", "running", "exited", "failed", "stopped"];
/// Upper bounds (seconds) of the time-to-running histogram.
const RUNNING_BUCKETS_SECONDS: [f64; 11] = [0.5, 1.0, 2.0, 5.0, 10.0, 20.0, 30.0, 60.0, 120.0, 360.0, 900.0];

impl Metrics {
    pub fn refused(&self, refusal: crate::admission::Refusal) {
        let index = crate::admission::Refusal::ALL.iter().position(|r| *r == refusal).expect("listed");
        self.connections_refused[index].fetch_add(1, Ordering::Relaxed);
    }

    pub fn reaped(&self, stage: crate::gateway::Stage) {
        let index = crate::gateway::Stage::ALL.iter().position(|s| *s == stage).expect("listed");
        self.connections_reaped[index].fetch_add(1, Ordering::Relaxed);
    }

    pub fn observe_commit(&self, took: Duration) {
        let seconds = took.as_secs_f64();
        for (bucket, bound) in self.commit_buckets.iter().zip(COMMIT_BUCKETS_SECONDS) {
            if seconds <= bound {
                bucket.fetch_add(1, Ordering::Relaxed);
            }
        }
        self.commit_count.fetch_add(1, Ordering::Relaxed);
        self.commit_nanos.fetch_add(took.as_nanos() as u64, Ordering::Relaxed);
    }

    pub fn observe_delivery_status(&self, state: &gpux_protocol::DeliveryState) {
        if let Some(index) = DELIVERY_STATES.iter().position(|name| *name == state.name()) {
            self.delivery_statuses[index].fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Time from a lease's start to its workload's first `running`.
    pub fn observe_time_to_running(&self, millis: u64) {
        let seconds = millis as f64 / 1e3;
        for (bucket, bound) in self.running_buckets.iter().zip(RUNNING_BUCKETS_SECONDS) {
            if seconds <= bound {
                bucket.fetch_add(1, Ordering::Relaxed);
            }
        }
        self.running_count.fetch_add(1, Ordering::Relaxed);
        self.running_millis.fetch_add(millis, Ordering::Relaxed);
    }

    pub fn render(&self) -> String {
        let load = |counter: &AtomicU64| counter.load(Ordering::Relaxed);
        let mut out = String::new();
        let mut metric = |name: &str, kind: &str, help: &str, value: u64| {
            let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} {kind}\n{name} {value}");
        };
        metric("gpux_commands_total", "counter", "Commands journaled and applied (rate = commands/s).", load(&self.commands));
        metric("gpux_orders_total", "counter", "New orders received (rate = orders/s).", load(&self.orders));
        metric("gpux_rejects_total", "counter", "Commands the engine refused.", load(&self.rejects));
        metric("gpux_journal_entries_total", "counter", "Entries appended to the journal.", load(&self.journal_entries));
        metric("gpux_connections", "gauge", "Open WebSocket connections.", load(&self.connections));
        metric("gpux_connections_total", "counter", "WebSocket connections accepted.", load(&self.connections_total));
        metric("gpux_slow_consumers_total", "counter", "Connections closed for not reading their feed.", load(&self.slow_consumers));
        metric(
            "gpux_accept_errors_total",
            "counter",
            "Failed accepts (out of descriptors, most often); each backs off.",
            load(&self.accept_errors),
        );
        let _ = writeln!(out, "# HELP gpux_connections_refused_total Connections closed at accept, by the cap they hit.");
        let _ = writeln!(out, "# TYPE gpux_connections_refused_total counter");
        for (counter, refusal) in self.connections_refused.iter().zip(crate::admission::Refusal::ALL) {
            let _ = writeln!(out, "gpux_connections_refused_total{{cap=\"{}\"}} {}", refusal.label(), load(counter));
        }
        let _ = writeln!(out, "# HELP gpux_connections_reaped_total Connections closed for silence, by the stage they stalled in.");
        let _ = writeln!(out, "# TYPE gpux_connections_reaped_total counter");
        for (counter, stage) in self.connections_reaped.iter().zip(crate::gateway::Stage::ALL) {
            let _ = writeln!(out, "gpux_connections_reaped_total{{stage=\"{}\"}} {}", stage.label(), load(counter));
        }
        let _ = writeln!(out, "# HELP gpux_journal_commit_seconds Durable journal commit latency (one fsync per batch).");
        let _ = writeln!(out, "# TYPE gpux_journal_commit_seconds histogram");
        for (bucket, bound) in self.commit_buckets.iter().zip(COMMIT_BUCKETS_SECONDS) {
            let _ = writeln!(out, "gpux_journal_commit_seconds_bucket{{le=\"{bound}\"}} {}", load(bucket));
        }
        let count = load(&self.commit_count);
        let _ = writeln!(out, "gpux_journal_commit_seconds_bucket{{le=\"+Inf\"}} {count}");
        let _ = writeln!(out, "gpux_journal_commit_seconds_sum {}", load(&self.commit_nanos) as f64 / 1e9);
        let _ = writeln!(out, "gpux_journal_commit_seconds_count {count}");
        let _ = writeln!(out, "# HELP gpux_delivery_statuses_total Delivery statuses reported by hosts, by state.");
        let _ = writeln!(out, "# TYPE gpux_delivery_statuses_total counter");
        for (counter, name) in self.delivery_statuses.iter().zip(DELIVERY_STATES) {
            let _ = writeln!(out, "gpux_delivery_statuses_total{{state=\"{name}\"}} {}", load(counter));
        }
        let _ = writeln!(out, "# HELP gpux_lease_time_to_running_seconds From a lease's start to its workload's first running status.");
        let _ = writeln!(out, "# TYPE gpux_lease_time_to_running_seconds histogram");
        for (bucket, bound) in self.running_buckets.iter().zip(RUNNING_BUCKETS_SECONDS) {
            let _ = writeln!(out, "gpux_lease_time_to_running_seconds_bucket{{le=\"{bound}\"}} {}", load(bucket));
        }
        let count = load(&self.running_count);
        let _ = writeln!(out, "gpux_lease_time_to_running_seconds_bucket{{le=\"+Inf\"}} {count}");
        let _ = writeln!(out, "gpux_lease_time_to_running_seconds_sum {}", load(&self.running_millis) as f64 / 1e3);
        let _ = writeln!(out, "gpux_lease_time_to_running_seconds_count {count}");
        let _ = writeln!(out, "# HELP gpux_book_quantity GPUs resting per instrument and side.\n# TYPE gpux_book_quantity gauge");
        out.push_str(&self.book_depth.lock().map(|text| text.clone()).unwrap_or_default());
        out
    }
}

/// Serves `GET /metrics` until the process ends.
pub async fn serve(listener: TcpListener, metrics: std::sync::Arc<Metrics>) {
    let rendering = metrics.clone();
    crate::admission::serve_http(listener, "metrics", metrics, move |request| {
        if request.starts_with(b"GET /metrics ") {
            let body = rendering.render();
            format!(
                "HTTP/1.1 200 OK\r\nContent-Type: text/plain; version=0.0.4\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                body.len()
            )
        } else {
            "HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\nConnection: close\r\n\r\n".to_string()
        }
    })
    .await
}
