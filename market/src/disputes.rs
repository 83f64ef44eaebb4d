//! Two-sided evidence (docs/market-rules.md "Disputes"): a renter's signed
//! liveness observations of its lease's endpoint against the supplier's
//! signed usage reports of the same time. An "unreachable" observation says
//! no probe reached the endpoint in its interval; a report claims
//! `available_ms` somewhere in its own interval. The time disputed is what
//! the report cannot have delivered outside the renter's unreachable time:
//! `available - (span - unreachable overlap)`, at least 0. An honest report
//! of a host that was down while the renter saw it down is never disputed,
//! however the two sides cut their intervals. Disputed time is counted in
//! both parties' records and the supplier's share of its charge withheld
//! (the engine's `WithholdDisputed`, a follow-up the sequencer journals).
//!
//! Each report keeps the unreachable overlap and the disputed time so far,
//! so a later observation adds only what it proves beyond them. Each side
//! keeps its recent evidence per lease ([`EVIDENCE_KEPT`] items, none older
//! than [`EVIDENCE_WINDOW_MS`] before the newest), so evidence further apart
//! is not matched. A renter's observations of a lease come in time order
//! without overlap (checked before journaling), and settlement refuses
//! overlapping reports of a GPU, so no time is counted twice.

use std::collections::{BTreeMap, VecDeque};

use gpux_engine::{AccountId, LeaseId, LeaseInfo};
use gpux_protocol::{ErrorCode, LivenessReport, UsageBody};
use serde::{Deserialize, Serialize};

/// Items of evidence kept per lease and side.
pub const EVIDENCE_KEPT: usize = 256;
/// Evidence this much older than a side's newest is dropped.
pub const EVIDENCE_WINDOW_MS: u64 = 24 * 3_600_000;
/// How far past the exchange's clock an observation may end (clock skew).
pub const LIVENESS_FUTURE_MS: u64 = 5_000;

/// One accepted usage report: its interval and verified time, the renter's
/// unreachable time inside it, and what of it is disputed so far.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
struct Claimed {
    start_ms: u64,
    end_ms: u64,
    available_ms: u64,
    unreachable_ms: u64,
    disputed_ms: u64,
}

impl Claimed {
    /// Adds unreachable time `[from, to)` (not overlapping what was added
    /// before); returns the GPU time this newly disputes.
    fn unreachable(&mut self, from: u64, to: u64) -> u64 {
        let overlap = self.end_ms.min(to).saturating_sub(self.start_ms.max(from));
        if overlap == 0 {
            return 0;
        }
        self.unreachable_ms += overlap;
        let reachable_ms = (self.end_ms - self.start_ms).saturating_sub(self.unreachable_ms);
        let disputed = self.available_ms.saturating_sub(reachable_ms);
        let new = disputed.saturating_sub(self.disputed_ms);
        self.disputed_ms = self.disputed_ms.max(disputed);
        new
    }
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
struct Evidence {
    claimed: VecDeque<Claimed>,
    unreachable: VecDeque<(u64, u64)>,
    /// The end of the renter's last observation.
    observed_to_ms: u64,
}

fn keep<T>(items: &mut VecDeque<T>, item: T, end_of: impl Fn(&T) -> u64) {
    let newest = end_of(&item);
    items.push_back(item);
    while items.len() > EVIDENCE_KEPT || items.front().is_some_and(|first| end_of(first) + EVIDENCE_WINDOW_MS < newest) {
        items.pop_front();
    }
}

/// Leases' evidence, and renters' dispute records (suppliers' are in the
/// reliability records).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Disputes {
    leases: BTreeMap<LeaseId, Evidence>,
    /// Per renter: observations sent, intervals disputed, GPU time disputed.
    renters: BTreeMap<AccountId, RenterRecord>,
}

pub use gpux_protocol::RenterRecord;

impl Disputes {
    /// Checks an observation before it is journaled.
    pub fn check(
        &self,
        account: AccountId,
        lease: Option<&LeaseInfo>,
        report: &LivenessReport,
        key: Option<[u8; 32]>,
        now_ms: u64,
    ) -> Result<(), ErrorCode> {
        let info = lease.filter(|l| l.renter == account && l.lease == report.body.lease).ok_or(ErrorCode::UnknownLease)?;
        if info.billing_closed {
            return Err(ErrorCode::LeaseNotActive);
        }
        let body = &report.body;
        let lease_end = info.ended_at_ms.or(info.end_ms).unwrap_or(u64::MAX);
        let after_previous = self.leases.get(&body.lease).is_none_or(|e| body.start_ms >= e.observed_to_ms);
        let valid = body.start_ms < body.end_ms
            && body.end_ms - body.start_ms <= gpux_protocol::liveness::LIVENESS_INTERVAL_MS_MAX
            && body.start_ms >= info.start_ms
            && body.end_ms <= lease_end
            && body.end_ms <= now_ms + LIVENESS_FUTURE_MS
            && after_previous
            && key.is_some_and(|key| report.verify(&key));
        if !valid {
            return Err(ErrorCode::LivenessInvalid);
        }
        Ok(())
    }

    /// A renter's observation (checked before it was journaled): returns the
    /// GPU time it disputes against the reports already in.
    pub(crate) fn observe(&mut self, renter: AccountId, report: &LivenessReport) -> u64 {
        let body = &report.body;
        let evidence = self.leases.entry(body.lease).or_default();
        evidence.observed_to_ms = evidence.observed_to_ms.max(body.end_ms);
        let record = self.renters.entry(renter).or_default();
        record.observations += 1;
        if body.reachable {
            return 0;
        }
        record.unreachable_ms += body.end_ms - body.start_ms;
        let disputed: u64 = evidence.claimed.iter_mut().map(|c| c.unreachable(body.start_ms, body.end_ms)).sum();
        keep(&mut evidence.unreachable, (body.start_ms, body.end_ms), |(_, end)| *end);
        if disputed > 0 {
            record.disputes += 1;
            record.disputed_gpu_ms += disputed;
        }
        disputed
    }

    /// An accepted usage report of `renter`'s lease that verified
    /// `verified_ms` of its interval: returns the GPU time it claimed that
    /// the renter's observations already dispute.
    pub(crate) fn claimed(&mut self, renter: AccountId, body: &UsageBody, verified_ms: u64) -> u64 {
        let mut claimed =
            Claimed { start_ms: body.start_ms, end_ms: body.end_ms, available_ms: verified_ms, unreachable_ms: 0, disputed_ms: 0 };
        let evidence = self.leases.entry(body.lease).or_default();
        let disputed: u64 = evidence.unreachable.iter().map(|(from, to)| claimed.unreachable(*from, *to)).sum();
        keep(&mut evidence.claimed, claimed, |c| c.end_ms);
        if disputed > 0 {
            let record = self.renters.entry(renter).or_default();
            record.disputes += 1;
            record.disputed_gpu_ms += disputed;
        }
        disputed
    }

    /// Forgets a lease's evidence (its bill is final).
    pub(crate) fn forget_lease(&mut self, lease: LeaseId) {
        self.leases.remove(&lease);
    }

    pub fn renter(&self, renter: AccountId) -> RenterRecord {
        self.renters.get(&renter).copied().unwrap_or_default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn claim(start_ms: u64, end_ms: u64, available_ms: u64) -> Claimed {
        Claimed { start_ms, end_ms, available_ms, unreachable_ms: 0, disputed_ms: 0 }
    }

    #[test]
    fn the_disputed_time_is_what_cannot_have_been_delivered_outside_the_unreachable_time() {
        let mut full = claim(0, 60_000, 60_000);
        assert_eq!(full.unreachable(30_000, 90_000), 30_000, "all claimed, half seen unreachable");
        assert_eq!(full.unreachable(60_000, 90_000), 0, "no overlap");
        let mut honest = claim(0, 60_000, 30_000);
        assert_eq!(honest.unreachable(0, 30_000), 0, "half claimed, the other half seen down: no contradiction");
        assert_eq!(honest.unreachable(30_000, 45_000), 15_000, "three quarters seen down: a quarter cannot fit");
        assert_eq!(honest.unreachable(45_000, 60_000), 15_000, "all seen down: all claimed time disputed");
        assert_eq!(honest.disputed_ms, 30_000);
    }
}
