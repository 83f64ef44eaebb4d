//! The job leases a host's token holds for: running now, or ended within
//! the log grace.

use gpux_engine::LeaseId;

/// How long after its lease ended a host may still put its attempt's
/// output tail (and nothing else).
pub const LOG_GRACE_MS: u64 = 120_000;
/// Ended leases remembered for the log grace (the oldest forgotten first).
const ENDED_KEPT_MAX: usize = 1 << 16;

/// Where a host grant's lease stands.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Standing {
    Running,
    /// Ended less than [`LOG_GRACE_MS`] ago.
    JustEnded,
    Ended,
}

/// The job leases running now, and those that ended within the log grace:
/// what a host's grant needs besides its signature. The sequencer keeps it
/// (from the market at start, then from every lease created and ended);
/// the store's HTTP side reads it.
#[derive(Default)]
pub struct RunningLeases(std::sync::RwLock<Leases>);

#[derive(Default)]
pub struct Leases {
    running: std::collections::HashSet<LeaseId>,
    /// Ended leases by when they ended, oldest first.
    ended: std::collections::VecDeque<(LeaseId, u64)>,
    ended_at: std::collections::HashMap<LeaseId, u64>,
}

impl RunningLeases {
    pub fn standing(&self, lease: LeaseId, now_ms: u64) -> Standing {
        let leases = self.0.read().unwrap_or_else(|e| e.into_inner());
        if leases.running.contains(&lease) {
            return Standing::Running;
        }
        match leases.ended_at.get(&lease) {
            Some(&at_ms) if now_ms < at_ms.saturating_add(LOG_GRACE_MS) => Standing::JustEnded,
            _ => Standing::Ended,
        }
    }

    /// Exactly these leases run from now on.
    pub fn replace(&self, leases: impl IntoIterator<Item = LeaseId>) {
        let mut this = self.0.write().unwrap_or_else(|e| e.into_inner());
        this.running.clear();
        this.running.extend(leases);
    }

    /// Exactly these leases run now (a cluster node's view, read from the
    /// market it applied): those no longer among them ended now (`now_ms`,
    /// for the log grace), new ones started.
    pub fn sync(&self, running: &std::collections::BTreeSet<LeaseId>, now_ms: u64) {
        let (gone, new): (Vec<LeaseId>, Vec<LeaseId>) = {
            let this = self.0.read().unwrap_or_else(|e| e.into_inner());
            (
                this.running.iter().filter(|lease| !running.contains(lease)).copied().collect(),
                running.iter().filter(|lease| !this.running.contains(lease)).copied().collect(),
            )
        };
        for lease in gone {
            self.ended(lease, now_ms);
        }
        for lease in new {
            self.started(lease);
        }
    }

    pub fn started(&self, lease: LeaseId) {
        self.0.write().unwrap_or_else(|e| e.into_inner()).running.insert(lease);
    }

    pub fn ended(&self, lease: LeaseId, at_ms: u64) {
        let mut this = self.0.write().unwrap_or_else(|e| e.into_inner());
        if !this.running.remove(&lease) {
            return;
        }
        while this.ended.len() >= ENDED_KEPT_MAX || this.ended.front().is_some_and(|&(_, t)| t.saturating_add(LOG_GRACE_MS) <= at_ms) {
            let Some((old, _)) = this.ended.pop_front() else { break };
            this.ended_at.remove(&old);
        }
        this.ended.push_back((lease, at_ms));
        this.ended_at.insert(lease, at_ms);
    }
}
