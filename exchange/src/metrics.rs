//! Operator metrics in the Prometheus text format, served on a separate
//! loopback HTTP port (`--metrics-listen`), kept with the `prometheus` crate:
//! counters and gauges updated by the sequencer and the gateway, and the
//! book depth the sequencer refreshes at most once a second. Every metric
//! and its labels are listed in docs/protocol.md "Metrics".

use std::sync::Arc;
use std::time::Duration;

use gpux_gateway::metrics::GatewayMetrics;
use prometheus::{Histogram, HistogramOpts, IntCounter, IntCounterVec, IntGauge, IntGaugeVec, Opts, Registry};
use tokio::net::TcpListener;

/// Upper bounds (seconds) of the journal commit latency histogram.
const COMMIT_BUCKETS_SECONDS: [f64; 11] = [0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.5];
/// Upper bounds (seconds) of the time-to-running histogram.
const RUNNING_BUCKETS_SECONDS: [f64; 11] = [0.5, 1.0, 2.0, 5.0, 10.0, 20.0, 30.0, 60.0, 120.0, 360.0, 900.0];

pub struct Metrics {
    registry: Registry,
    /// The gateway's connection metrics, in the same registry.
    pub gateway: Arc<GatewayMetrics>,
    pub commands: IntCounter,
    pub orders: IntCounter,
    /// Engine refusals, by code.
    pub rejects: IntCounterVec,
    pub journal_entries: IntCounter,
    /// Subscribers resynchronised with a fresh snapshot after falling behind a feed.
    pub feed_resyncs: IntCounter,
    pub trades: IntCounter,
    /// GPUs traded (a trade of 4 GPUs adds 4).
    pub traded_gpus: IntCounter,
    pub leases_opened: IntCounterVec,
    pub leases_closed: IntCounterVec,
    pub usage_accepted: IntCounter,
    pub usage_refused: IntCounterVec,
    /// Requests refused because the session's key lacks their scope.
    pub scope_refusals: IntCounter,
    /// Services' autoscaling decisions, by reason.
    pub service_scalings: IntCounterVec,
    /// 1 while the disk is down to the journal's reserve (new work refused).
    pub disk_low: IntGauge,
    /// New work refused `disk_low`.
    pub disk_low_refusals: IntCounter,
    delivery_statuses: IntCounterVec,
    /// Hardware challenges issued, and their outcomes.
    pub challenges_issued: IntCounter,
    challenge_outcomes: IntCounterVec,
    commit_seconds: Histogram,
    time_to_running_seconds: Histogram,
    /// GPUs resting per instrument and side.
    pub book_quantity: IntGaugeVec,
    /// Remote gateways' links open now (`link_server`).
    pub links_open: IntGauge,
    /// Links that ended, by cause.
    pub links_ended: IntCounterVec,
    /// A cluster node's Raft (`gpux_raft_*`), and whether it serves now.
    raft_term: IntGauge,
    raft_leader: IntGauge,
    raft_is_leader: IntGauge,
    raft_last_log_index: IntGauge,
    raft_applied_index: IntGauge,
    raft_lag: IntGaugeVec,
    pub cluster_serving: IntGauge,
    /// Snapshots written, failed, and skipped to keep the journal's room.
    pub snapshots: crate::snapshots::SnapshotCounters,
    /// Free bytes on the data directory's file system, and the journal's and
    /// snapshots' file sizes, read at each scrape (`watch_data_dir`).
    data_dir_free_bytes: IntGauge,
    journal_bytes: IntGauge,
    snapshots_bytes: IntGauge,
    raft_log_bytes: IntGauge,
    data_dir: std::sync::Mutex<Option<std::path::PathBuf>>,
    /// Library log lines held back as repeats (`logging::Repeats`), read at each scrape.
    log_lines_suppressed: IntCounter,
}

impl Default for Metrics {
    fn default() -> Self {
        Metrics::new()
    }
}

fn counter(registry: &Registry, name: &str, help: &str) -> IntCounter {
    let metric = IntCounter::new(name, help).expect("a valid metric");
    registry.register(Box::new(metric.clone())).expect("registered once");
    metric
}

fn gauge(registry: &Registry, name: &str, help: &str) -> IntGauge {
    let metric = IntGauge::new(name, help).expect("a valid metric");
    registry.register(Box::new(metric.clone())).expect("registered once");
    metric
}

fn gauges(registry: &Registry, name: &str, help: &str, labels: &[&str]) -> IntGaugeVec {
    let metric = IntGaugeVec::new(Opts::new(name, help), labels).expect("a valid metric");
    registry.register(Box::new(metric.clone())).expect("registered once");
    metric
}

fn snapshot_counters(r: &Registry) -> crate::snapshots::SnapshotCounters {
    crate::snapshots::SnapshotCounters {
        written: counter(r, "gpux_snapshots_written_total", "State snapshots written."),
        failed: counter(r, "gpux_snapshots_failed_total", "State snapshots whose write failed (the store is reopened for the next)."),
        skipped_low_space: counter(
            r,
            "gpux_snapshots_skipped_low_space_total",
            "State snapshots skipped because the data directory would keep less than its reserve free.",
        ),
    }
}

fn counters(registry: &Registry, name: &str, help: &str, label: &str) -> IntCounterVec {
    let metric = IntCounterVec::new(Opts::new(name, help), &[label]).expect("a valid metric");
    registry.register(Box::new(metric.clone())).expect("registered once");
    metric
}

fn histogram(registry: &Registry, name: &str, help: &str, buckets: &[f64]) -> Histogram {
    let metric = Histogram::with_opts(HistogramOpts::new(name, help).buckets(buckets.to_vec())).expect("a valid metric");
    registry.register(Box::new(metric.clone())).expect("registered once");
    metric
}

impl Metrics {
    pub fn new() -> Metrics {
        let r = Registry::new();
        let metrics = Metrics {
            gateway: Arc::new(GatewayMetrics::new(&r)),
            commands: counter(&r, "gpux_commands_total", "Commands journaled and applied (rate = commands/s)."),
            orders: counter(&r, "gpux_orders_total", "New orders received (rate = orders/s)."),
            rejects: counters(&r, "gpux_rejects_total", "Commands the engine refused, by code.", "code"),
            journal_entries: counter(&r, "gpux_journal_entries_total", "Entries appended to the journal."),
            feed_resyncs: counter(&r, "gpux_feed_resyncs_total", "Subscribers that fell behind a feed and were sent a fresh snapshot."),
            trades: counter(&r, "gpux_trades_total", "Trades."),
            traded_gpus: counter(&r, "gpux_traded_gpus_total", "GPUs traded (volume)."),
            leases_opened: counters(&r, "gpux_leases_opened_total", "Leases created, by kind.", "kind"),
            leases_closed: counters(&r, "gpux_leases_closed_total", "Leases ended, by reason.", "reason"),
            usage_accepted: counter(&r, "gpux_usage_reports_accepted_total", "Usage reports accepted (duplicates included)."),
            usage_refused: counters(&r, "gpux_usage_reports_refused_total", "Usage reports refused, by code.", "code"),
            scope_refusals: counter(&r, "gpux_scope_refusals_total", "Requests refused because the key lacks their scope."),
            service_scalings: counters(&r, "gpux_service_scalings_total", "Services' autoscaling decisions, by reason.", "reason"),
            disk_low: gauge(
                &r,
                "gpux_disk_low",
                "1 while the data directory's free space is below the journal's reserve: new work is refused disk_low.",
            ),
            disk_low_refusals: counter(
                &r,
                "gpux_disk_low_refusals_total",
                "New work refused disk_low while the disk was down to the journal's reserve.",
            ),
            delivery_statuses: counters(&r, "gpux_delivery_statuses_total", "Delivery statuses reported by hosts, by state.", "state"),
            challenges_issued: counter(&r, "gpux_challenges_issued_total", "Hardware challenges issued to GPUs."),
            challenge_outcomes: counters(&r, "gpux_challenge_outcomes_total", "Hardware challenge results, by outcome.", "outcome"),
            commit_seconds: histogram(
                &r,
                "gpux_journal_commit_seconds",
                "Durable journal commit latency (one fsync per batch).",
                &COMMIT_BUCKETS_SECONDS,
            ),
            time_to_running_seconds: histogram(
                &r,
                "gpux_lease_time_to_running_seconds",
                "From a lease's start to its workload's first running status.",
                &RUNNING_BUCKETS_SECONDS,
            ),
            snapshots: snapshot_counters(&r),
            data_dir_free_bytes: gauge(&r, "gpux_data_dir_free_bytes", "Free bytes on the data directory's file system, at the scrape."),
            journal_bytes: gauge(
                &r,
                "gpux_journal_bytes",
                "Disk space the journal file (journal.redb) takes (its allocated blocks), at the scrape.",
            ),
            snapshots_bytes: gauge(&r, "gpux_snapshots_bytes", "Size of the snapshot file (snapshots.redb), at the scrape."),
            raft_log_bytes: gauge(
                &r,
                "gpux_raft_log_bytes",
                "Size of a cluster node's Raft log file (raft-log.redb; 0 on a single node), at the scrape.",
            ),
            data_dir: std::sync::Mutex::new(None),
            log_lines_suppressed: counter(
                &r,
                "gpux_log_lines_suppressed_total",
                "Log lines of libraries (openraft) held back as repeats of one written in the last 10 s.",
            ),
            book_quantity: gauges(&r, "gpux_book_quantity", "GPUs resting per instrument and side.", &["instrument", "side"]),
            links_open: gauge(&r, "gpux_links", "Remote gateways' links open now (--link-listen)."),
            links_ended: counters(&r, "gpux_links_ended_total", "Remote gateways' links that ended, by cause.", "cause"),
            raft_term: gauge(&r, "gpux_raft_term", "A cluster node's current Raft term."),
            raft_leader: gauge(&r, "gpux_raft_leader", "The node id of the leader this node knows (0: none)."),
            raft_is_leader: gauge(&r, "gpux_raft_is_leader", "1 while this node is the Raft leader."),
            raft_last_log_index: gauge(&r, "gpux_raft_last_log_index", "The last Raft log index this node holds."),
            raft_applied_index: gauge(&r, "gpux_raft_applied_index", "The last Raft log index this node applied."),
            raft_lag: gauges(&r, "gpux_raft_replication_lag", "On the leader: log entries each node is behind it.", &["node"]),
            cluster_serving: gauge(&r, "gpux_cluster_serving", "1 while this node's sequencer serves (it leads with a majority)."),
            registry: r,
        };
        // Labelled series that exist from the start, so a scrape shows them at 0.
        for state in ["awaiting_secrets", "pulling", "starting", "running", "exited", "failed", "stopped"] {
            metrics.delivery_statuses.with_label_values(&[state]);
        }
        metrics
    }

    /// Every metric the process serves: its name and label names (series
    /// of labelled metrics appear in a scrape only once they exist).
    pub fn descriptions(&self) -> Vec<(String, Vec<String>)> {
        let mut collectors: Vec<&dyn prometheus::core::Collector> = vec![
            &self.commands,
            &self.orders,
            &self.rejects,
            &self.journal_entries,
            &self.feed_resyncs,
            &self.trades,
            &self.traded_gpus,
            &self.leases_opened,
            &self.leases_closed,
            &self.usage_accepted,
            &self.usage_refused,
            &self.scope_refusals,
            &self.service_scalings,
            &self.disk_low,
            &self.disk_low_refusals,
            &self.delivery_statuses,
            &self.challenges_issued,
            &self.challenge_outcomes,
            &self.commit_seconds,
            &self.time_to_running_seconds,
            &self.book_quantity,
            &self.links_open,
            &self.links_ended,
            &self.raft_term,
            &self.raft_leader,
            &self.raft_is_leader,
            &self.raft_last_log_index,
            &self.raft_applied_index,
            &self.raft_lag,
            &self.cluster_serving,
            &self.snapshots.written,
            &self.snapshots.failed,
            &self.snapshots.skipped_low_space,
            &self.data_dir_free_bytes,
            &self.journal_bytes,
            &self.snapshots_bytes,
            &self.raft_log_bytes,
            &self.log_lines_suppressed,
        ];
        collectors.extend(self.gateway.collectors());
        collectors.iter().flat_map(|c| c.desc()).map(|d| (d.fq_name.clone(), d.variable_labels.clone())).collect()
    }

    /// A cluster node's Raft, as its status reads.
    pub fn observe_raft(&self, status: &gpux_replica::admin::NodeStatus) {
        self.raft_term.set(status.term as i64);
        self.raft_leader.set(status.leader.as_ref().map_or(0, |(id, _)| *id as i64));
        self.raft_is_leader.set(i64::from(status.state == "leader"));
        self.raft_last_log_index.set(status.last_log_index as i64);
        self.raft_applied_index.set(status.last_applied as i64);
        self.raft_lag.reset();
        for (node, lag) in &status.lag {
            self.raft_lag.with_label_values(&[&node.to_string()]).set(*lag as i64);
        }
    }

    pub fn observe_commit(&self, took: Duration) {
        self.commit_seconds.observe(took.as_secs_f64());
    }

    pub fn observe_delivery_status(&self, state: &gpux_protocol::DeliveryState) {
        self.delivery_statuses.with_label_values(&[state.name()]).inc();
    }

    /// Time from a lease's start to its workload's first `running`.
    pub fn observe_time_to_running(&self, millis: u64) {
        self.time_to_running_seconds.observe(millis as f64 / 1e3);
    }

    /// Counts what the engine did: trades, volume, leases, refusals.
    pub fn observe_events(&self, events: &[gpux_engine::Event]) {
        use gpux_engine::EventKind;
        for event in events {
            match &event.kind {
                EventKind::Trade { quantity, .. } => {
                    self.trades.inc();
                    self.traded_gpus.inc_by(u64::from(*quantity));
                }
                EventKind::LeaseCreated { kind, .. } => self.leases_opened.with_label_values(&[kind.name()]).inc(),
                EventKind::LeaseEnded { reason, .. } => self.leases_closed.with_label_values(&[reason.name()]).inc(),
                EventKind::Rejected { code, .. } => self.rejects.with_label_values(&[code.name()]).inc(),
                EventKind::GpuChallenged { outcome, .. } | EventKind::GpuMemoryChallenged { outcome, .. } => {
                    self.challenge_outcomes.with_label_values(&[outcome.name()]).inc()
                }
                _ => {}
            }
        }
    }

    /// Reads free space and file sizes of `data_dir` at each scrape.
    pub fn watch_data_dir(&self, data_dir: &std::path::Path) {
        *self.data_dir.lock().unwrap_or_else(|p| p.into_inner()) = Some(data_dir.to_path_buf());
    }

    fn read_data_dir(&self) {
        let Some(dir) = self.data_dir.lock().unwrap_or_else(|p| p.into_inner()).clone() else { return };
        if let Ok(free) = crate::snapshots::free_bytes(&dir) {
            self.data_dir_free_bytes.set(free.min(i64::MAX as u64) as i64);
        }
        let size = |name: &str| disk_bytes(&dir.join(name));
        self.journal_bytes.set(size("journal.redb"));
        self.snapshots_bytes.set(size("snapshots.redb"));
        self.raft_log_bytes.set(size("raft-log.redb"));
    }

    pub fn render(&self) -> String {
        self.read_data_dir();
        let suppressed = crate::logging::suppressed();
        self.log_lines_suppressed.inc_by(suppressed.saturating_sub(self.log_lines_suppressed.get()));
        prometheus::TextEncoder::new().encode_to_string(&self.registry.gather()).expect("the text format encodes every metric")
    }
}

/// The disk space a file takes (its allocated 512-byte blocks), not its
/// length: a preallocated or sparse file's length says nothing of what
/// the disk holds, and a free-space alert reads this figure. 0 when absent.
fn disk_bytes(path: &std::path::Path) -> i64 {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata(path).map_or(0, |m| m.blocks().saturating_mul(512).min(i64::MAX as u64) as i64)
}

#[cfg(test)]
mod disk_tests {
    /// A file of a gibibyte's length with a few bytes written takes a few
    /// blocks: the gauge follows the disk, not the length.
    #[test]
    fn a_files_disk_bytes_are_its_blocks_not_its_length() {
        use std::io::Write;
        let dir = tempfile::tempdir().expect("temp dir");
        let path = dir.path().join("journal.redb");
        let mut file = std::fs::File::create(&path).expect("create");
        file.write_all(&[7; 4096]).expect("write");
        file.set_len(1 << 30).expect("sparse length");
        file.sync_all().expect("sync");
        let used = super::disk_bytes(&path);
        assert!((4096..1 << 20).contains(&used), "{used}");
        assert_eq!(super::disk_bytes(&dir.path().join("absent")), 0);
    }
}

/// Serves `GET /metrics` until the process ends.
pub async fn serve(listener: TcpListener, metrics: Arc<Metrics>) {
    let gateway = metrics.gateway.clone();
    let router = axum::Router::new().route(
        "/metrics",
        axum::routing::get(move || {
            let metrics = metrics.clone();
            async move { ([(axum::http::header::CONTENT_TYPE, "text/plain; version=0.0.4")], metrics.render()) }
        }),
    );
    crate::http::serve(listener, "metrics", gateway, router, None).await
}

#[cfg(test)]
mod tests {
    use std::collections::{BTreeMap, BTreeSet};

    use super::*;

    fn registered() -> BTreeMap<String, BTreeSet<String>> {
        Metrics::new().descriptions().into_iter().map(|(name, labels)| (name, labels.into_iter().collect())).collect()
    }

    /// The label names a docs table cell gives: the backticked words outside
    /// parentheses, before a colon (what follows it lists values).
    fn label_names(cell: &str) -> BTreeSet<String> {
        let head = cell.split(':').next().unwrap_or("");
        let (mut depth, mut outside) = (0, String::new());
        for c in head.chars() {
            match c {
                '(' => depth += 1,
                ')' => depth -= 1,
                c if depth == 0 => outside.push(c),
                _ => {}
            }
        }
        outside.split('`').skip(1).step_by(2).map(str::to_string).collect()
    }

    /// docs/protocol.md "Metrics": every metric with its label names, as registered.
    #[test]
    fn the_metrics_table_lists_every_metric_with_its_labels() {
        let docs = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../docs/protocol.md")).expect("docs/protocol.md");
        let section = docs.split("\n## Metrics\n").nth(1).expect("the section").split("\n## ").next().expect("its text");
        let mut documented = BTreeMap::new();
        for row in section.lines().filter(|l| l.starts_with("| `gpux_")) {
            let cells: Vec<&str> = row.split('|').collect();
            for name in cells[1].split('`').skip(1).step_by(2) {
                documented.insert(name.to_string(), label_names(cells[3]));
            }
        }
        assert_eq!(documented, registered(), "docs/protocol.md lists exactly the registered metrics, each with its labels");
    }

    /// packaging/grafana/gpux-exchange.json queries only registered metrics,
    /// grouped by their own labels.
    #[test]
    fn the_dashboard_queries_registered_metrics_by_their_labels() {
        let text = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../packaging/grafana/gpux-exchange.json"))
            .expect("the dashboard");
        let dashboard: serde_json::Value = serde_json::from_str(&text).expect("JSON");
        let registered = registered();
        let mut queries = 0;
        for panel in dashboard["panels"].as_array().expect("panels") {
            for target in panel["targets"].as_array().expect("targets") {
                let expr = target["expr"].as_str().expect("expr");
                let legend = target["legendFormat"].as_str().unwrap_or("");
                let names: Vec<&str> = expr
                    .split(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
                    .filter(|w| w.starts_with("gpux_"))
                    .map(|w| w.trim_end_matches("_bucket").trim_end_matches("_sum").trim_end_matches("_count"))
                    .collect();
                assert!(!names.is_empty(), "{expr} queries no gpux metric");
                let mut labels: Vec<&str> = expr
                    .split("by (")
                    .skip(1)
                    .filter_map(|rest| rest.split(')').next())
                    .flat_map(|l| l.split(','))
                    .map(str::trim)
                    .collect();
                labels.extend(legend.split("{{").skip(1).filter_map(|rest| rest.split("}}").next()));
                for name in names {
                    let own =
                        registered.get(name).unwrap_or_else(|| panic!("the dashboard queries {name}, which the exchange does not serve"));
                    // `le` is a histogram's; `instance` is the label Prometheus
                    // gives every series of a scraped process (one per cluster node).
                    for label in labels.iter().filter(|l| !["le", "instance"].contains(*l)) {
                        assert!(own.contains(*label), "{expr}: {name} has no label {label}");
                    }
                }
                queries += 1;
            }
        }
        assert!(queries >= 10);
    }
}
