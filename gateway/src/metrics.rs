//! The gateway's own metrics (connections, refusals, reaping, slow
//! consumers, error frames, refused logins), registered in the registry the
//! process serves on `/metrics`. Every metric and its labels are listed in
//! docs/protocol.md "Metrics".

use prometheus::{IntCounter, IntCounterVec, IntGauge, Opts, Registry};

use crate::admission::Refusal;
use crate::{SlowCause, Stage};

pub struct GatewayMetrics {
    /// Gateway `error` frames, by code.
    pub errors: IntCounterVec,
    /// Open WebSocket connections, and how many have not logged in.
    pub connections: IntGauge,
    pub connections_unauthenticated: IntGauge,
    pub connections_total: IntCounter,
    connections_refused: IntCounterVec,
    connections_reaped: IntCounterVec,
    /// Accepts that failed (most often: out of file descriptors).
    pub accept_errors: IntCounter,
    slow_consumers: IntCounterVec,
    /// Refused logins, by reason (the sequencer counts the ones it refuses too).
    pub auth_failures: IntCounterVec,
    /// Batches of usage-report signatures the verifier pool checked.
    pub usage_verify_batches: IntCounter,
    /// Book feeds a version-2 connection fell behind on and caught up with
    /// by one `book_conflated` (the sequencer counts snapshot resyncs).
    pub book_conflations: IntCounter,
}

impl Default for GatewayMetrics {
    /// Metrics in a registry of their own (tests).
    fn default() -> Self {
        GatewayMetrics::new(&Registry::new())
    }
}

pub(crate) fn counter(registry: &Registry, name: &str, help: &str) -> IntCounter {
    let metric = IntCounter::new(name, help).expect("a valid metric");
    registry.register(Box::new(metric.clone())).expect("registered once");
    metric
}

pub(crate) fn counters(registry: &Registry, name: &str, help: &str, label: &str) -> IntCounterVec {
    let metric = IntCounterVec::new(Opts::new(name, help), &[label]).expect("a valid metric");
    registry.register(Box::new(metric.clone())).expect("registered once");
    metric
}

pub(crate) fn gauge(registry: &Registry, name: &str, help: &str) -> IntGauge {
    let metric = IntGauge::new(name, help).expect("a valid metric");
    registry.register(Box::new(metric.clone())).expect("registered once");
    metric
}

impl GatewayMetrics {
    /// Every metric, for listing their names and labels.
    pub fn collectors(&self) -> Vec<&dyn prometheus::core::Collector> {
        vec![
            &self.errors,
            &self.connections,
            &self.connections_unauthenticated,
            &self.connections_total,
            &self.connections_refused,
            &self.connections_reaped,
            &self.accept_errors,
            &self.slow_consumers,
            &self.auth_failures,
            &self.usage_verify_batches,
            &self.book_conflations,
        ]
    }

    /// Creates the gateway's metrics in `r`.
    pub fn new(r: &Registry) -> GatewayMetrics {
        let metrics = GatewayMetrics {
            errors: counters(r, "gpux_errors_total", "Error frames sent (bad frames, limits, refused requests), by code.", "code"),
            connections: gauge(r, "gpux_connections", "Open WebSocket connections."),
            connections_unauthenticated: gauge(r, "gpux_connections_unauthenticated", "Open WebSocket connections not logged in."),
            connections_total: counter(r, "gpux_connections_total", "WebSocket connections accepted."),
            connections_refused: counters(r, "gpux_connections_refused_total", "Connections closed at accept, by the cap they hit.", "cap"),
            connections_reaped: counters(
                r,
                "gpux_connections_reaped_total",
                "Connections closed for silence, by the stage they stalled in.",
                "stage",
            ),
            accept_errors: counter(r, "gpux_accept_errors_total", "Failed accepts (out of descriptors, most often); each backs off."),
            slow_consumers: counters(r, "gpux_slow_consumers_total", "Connections closed slow_consumer, by cause.", "cause"),
            auth_failures: counters(r, "gpux_auth_failures_total", "Refused logins, by reason.", "reason"),
            usage_verify_batches: counter(
                r,
                "gpux_usage_verify_batches_total",
                "Batches of usage-report signatures the gateway's verifier pool checked (a report alone is a batch of one).",
            ),
            book_conflations: counter(
                r,
                "gpux_book_conflations_total",
                "Book feeds a market-data version 2 connection fell behind on and caught up with by one book_conflated (its missed updates conflated per level).",
            ),
        };
        // Labelled series that exist from the start, so a scrape shows them at 0.
        for refusal in Refusal::ALL {
            metrics.connections_refused.with_label_values(&[refusal.label()]);
        }
        for stage in Stage::ALL {
            metrics.connections_reaped.with_label_values(&[stage.label()]);
        }
        for cause in SlowCause::ALL {
            metrics.slow_consumers.with_label_values(&[cause.label()]);
        }
        metrics
    }

    pub fn refused(&self, refusal: Refusal) {
        self.connections_refused.with_label_values(&[refusal.label()]).inc();
    }

    pub fn reaped(&self, stage: Stage) {
        self.connections_reaped.with_label_values(&[stage.label()]).inc();
    }

    pub fn slow_consumer(&self, cause: SlowCause) {
        self.slow_consumers.with_label_values(&[cause.label()]).inc();
    }
}
