//! The process's log lines: a bound on what a library may repeat.
//!
//! While a Raft peer is down, openraft's replication logs each failed
//! attempt (about four ERROR lines a second per peer at the default back-off
//! in a 3-node cluster): a night of a peer down is a gigabyte of the same
//! line. [`Repeats`] lets one line of each call site through every
//! `REPEAT_WINDOW` and counts the rest (`gpux_log_lines_suppressed_total`).
//! gpux's own repeated warnings carry their own `suppressed` counts
//! (admission, link and Raft handshakes); this filter is for code that is
//! not ours.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use tracing::callsite::Identifier;
use tracing::{Event, Level, Metadata};
use tracing_subscriber::layer::{Context, Filter};

/// How often one call site of a library may write a line.
pub const REPEAT_WINDOW: Duration = Duration::from_secs(10);

/// Lines the filter held back since the process started.
static SUPPRESSED: AtomicU64 = AtomicU64::new(0);

/// Lines held back so far (the metric's value).
pub fn suppressed() -> u64 {
    SUPPRESSED.load(Ordering::Relaxed)
}

/// Lets one event of each call site under `targets` through per window;
/// every other event passes untouched.
pub struct Repeats {
    targets: &'static [&'static str],
    window: Duration,
    last: Mutex<HashMap<Identifier, Instant>>,
}

impl Repeats {
    pub fn new(targets: &'static [&'static str], window: Duration) -> Repeats {
        Repeats { targets, window, last: Mutex::new(HashMap::new()) }
    }

    /// The libraries whose repeats are bounded: openraft.
    pub fn libraries() -> Repeats {
        Repeats::new(&["openraft"], REPEAT_WINDOW)
    }

    fn bounded(&self, metadata: &Metadata<'_>) -> bool {
        *metadata.level() <= Level::INFO && self.targets.iter().any(|t| metadata.target().starts_with(t))
    }
}

impl<S> Filter<S> for Repeats {
    fn enabled(&self, _metadata: &Metadata<'_>, _cx: &Context<'_, S>) -> bool {
        true
    }

    fn event_enabled(&self, event: &Event<'_>, _cx: &Context<'_, S>) -> bool {
        let metadata = event.metadata();
        if !self.bounded(metadata) {
            return true;
        }
        let now = Instant::now();
        let mut last = self.last.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        match last.get(&metadata.callsite()) {
            Some(at) if now.duration_since(*at) < self.window => {
                SUPPRESSED.fetch_add(1, Ordering::Relaxed);
                false
            }
            _ => {
                last.insert(metadata.callsite(), now);
                true
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;
    use tracing_subscriber::layer::SubscriberExt;
    use tracing_subscriber::Layer;

    /// Counts the events that reach it.
    struct Count(Arc<AtomicU64>);

    impl<S: tracing::Subscriber> tracing_subscriber::Layer<S> for Count {
        fn on_event(&self, _event: &Event<'_>, _cx: Context<'_, S>) {
            self.0.fetch_add(1, Ordering::Relaxed);
        }
    }

    #[test]
    fn a_library_line_repeated_in_a_loop_is_written_once_a_window_and_others_pass() {
        let passed = Arc::new(AtomicU64::new(0));
        let subscriber = tracing_subscriber::registry().with(Count(passed.clone()).with_filter(Repeats::libraries()));
        let before = suppressed();
        tracing::subscriber::with_default(subscriber, || {
            for _ in 0..100 {
                tracing::error!(target: "openraft::replication", "error sending append entries to target 2");
            }
            tracing::warn!(target: "openraft::core", "another call site: its own window");
            for _ in 0..10 {
                tracing::warn!(target: "gpux_exchange", "ours: not bounded here");
            }
        });
        assert_eq!(passed.load(Ordering::Relaxed), 1 + 1 + 10);
        assert!(suppressed() - before >= 99, "counted: {}", suppressed() - before);
    }

    #[test]
    fn after_the_window_the_line_is_written_again() {
        let passed = Arc::new(AtomicU64::new(0));
        let filter = Repeats::new(&["openraft"], Duration::from_millis(50));
        let subscriber = tracing_subscriber::registry().with(Count(passed.clone()).with_filter(filter));
        tracing::subscriber::with_default(subscriber, || {
            for round in 0..3 {
                for _ in 0..5 {
                    tracing::error!(target: "openraft::replication", round, "unreachable");
                }
                std::thread::sleep(Duration::from_millis(60));
            }
        });
        assert_eq!(passed.load(Ordering::Relaxed), 3);
    }
}
