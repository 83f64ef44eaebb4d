//! Two-sided evidence (docs/market-rules.md "Disputes"): the renter's
//! signed evidence against the supplier's signed usage reports of the same
//! time. Two kinds of renter evidence:
//!
//! - **liveness observations** of the lease's endpoint (weak: a port that
//!   does not answer may be the renter's own server). An "unreachable" one
//!   disputes what a report claims beyond the time left outside it:
//!   `available - (span - unreachable overlap)`, at least 0.
//! - **GPU probe observations** from inside the lease's container (strong):
//!   a GPU no sample found in an interval was absent, and the same formula
//!   over that GPU's reports *proves* the time it disputes.
//!
//! A report's disputed time is the larger of the two; its proven time is the
//! probe's. The engine holds the supplier's share of disputed time and
//! decides at the final bill: proven time refunded to the renter, the rest
//! paid to the supplier (`Command::HoldDisputed`, a follow-up the sequencer
//! journals). An honest report of a host that was down while the renter saw
//! it down is never disputed, however the two sides cut their intervals.
//!
//! Each report keeps the evidence overlap and disputed time so far, so a
//! later observation adds only what it proves beyond them. Each side keeps
//! its recent evidence per lease ([`EVIDENCE_KEPT`] items, none older than
//! [`EVIDENCE_WINDOW_MS`] before the newest), so evidence further apart is
//! not matched. A renter's observations of each kind come in time order
//! without overlap (checked before journaling), and settlement refuses
//! overlapping reports of a GPU, so no time is counted twice.

use std::collections::{BTreeMap, VecDeque};

use gpux_engine::{AccountId, LeaseId, LeaseInfo};
use gpux_protocol::{ErrorCode, GpuProbeReport, LivenessReport, UsageBody};
use serde::{Deserialize, Serialize};

/// Items of evidence kept per lease and side.
pub const EVIDENCE_KEPT: usize = 256;
/// Evidence this much older than a side's newest is dropped.
pub const EVIDENCE_WINDOW_MS: u64 = 24 * 3_600_000;
/// How far past the exchange's clock an observation may end (clock skew).
pub const LIVENESS_FUTURE_MS: u64 = 5_000;

/// One accepted usage report: its GPU, interval and verified time, the
/// renter's evidence against it, and what of it is disputed so far.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
struct Claimed {
    gpu_uuid: String,
    start_ms: u64,
    end_ms: u64,
    available_ms: u64,
    /// Liveness: time seen unreachable in the interval.
    unreachable_ms: u64,
    /// Probe: time the GPU was seen absent in the interval.
    absent_ms: u64,
    /// What the liveness evidence disputes, what the probe's proves, and
    /// what is held (the larger).
    weak_ms: u64,
    proven_ms: u64,
    disputed_ms: u64,
}

/// Disputed and proven GPU time newly found.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Found {
    pub disputed_gpu_ms: u64,
    pub proven_gpu_ms: u64,
}

impl std::ops::AddAssign for Found {
    fn add_assign(&mut self, other: Found) {
        self.disputed_gpu_ms += other.disputed_gpu_ms;
        self.proven_gpu_ms += other.proven_gpu_ms;
    }
}

impl Claimed {
    fn overlap(&self, from: u64, to: u64) -> u64 {
        self.end_ms.min(to).saturating_sub(self.start_ms.max(from))
    }

    /// What the claim cannot have delivered outside `excluded_ms` of its span.
    fn contradicted(&self, excluded_ms: u64) -> u64 {
        self.available_ms.saturating_sub((self.end_ms - self.start_ms).saturating_sub(excluded_ms))
    }

    /// Adds unreachable time `[from, to)` (not overlapping what was added
    /// before); returns what this newly disputes.
    fn unreachable(&mut self, from: u64, to: u64) -> Found {
        let overlap = self.overlap(from, to);
        if overlap == 0 {
            return Found::default();
        }
        self.unreachable_ms += overlap;
        self.weak_ms = self.weak_ms.max(self.contradicted(self.unreachable_ms));
        self.settle()
    }

    /// Adds time `[from, to)` the probe saw this claim's GPU absent (not
    /// overlapping what was added before); returns what this newly
    /// disputes and proves.
    fn absent(&mut self, from: u64, to: u64) -> Found {
        let overlap = self.overlap(from, to);
        if overlap == 0 {
            return Found::default();
        }
        self.absent_ms += overlap;
        let before = self.proven_ms;
        self.proven_ms = self.proven_ms.max(self.contradicted(self.absent_ms));
        Found { proven_gpu_ms: self.proven_ms - before, ..self.settle() }
    }

    /// The held time becomes the larger of the two kinds; returns the change.
    fn settle(&mut self) -> Found {
        let disputed = self.weak_ms.max(self.proven_ms);
        let found = Found { disputed_gpu_ms: disputed - self.disputed_ms, proven_gpu_ms: 0 };
        self.disputed_ms = disputed;
        found
    }
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
struct Evidence {
    claimed: VecDeque<Claimed>,
    unreachable: VecDeque<(u64, u64)>,
    /// The end of the renter's last liveness observation.
    observed_to_ms: u64,
    /// Intervals the probe saw a GPU absent: `(uuid, from, to)`.
    absent: VecDeque<(String, u64, u64)>,
    /// The lease's probe key (its first observation's) and the end of its
    /// last observation.
    probe_key: Option<[u8; 32]>,
    probed_to_ms: u64,
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

trait Raised {
    fn raised(&mut self, found: Found);
}

impl Raised for RenterRecord {
    /// Counts a dispute the renter's evidence raised.
    fn raised(&mut self, found: Found) {
        if found.disputed_gpu_ms > 0 {
            self.disputes += 1;
            self.disputed_gpu_ms += found.disputed_gpu_ms;
        }
    }
}

impl Disputes {
    /// Checks an observation before it is journaled.
    pub fn check(
        &self,
        account: AccountId,
        lease: Option<&LeaseInfo>,
        report: &LivenessReport,
        signed: impl FnOnce() -> bool,
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
            && signed();
        if !valid {
            return Err(ErrorCode::LivenessInvalid);
        }
        Ok(())
    }

    /// Checks a GPU probe observation before it is journaled.
    pub fn check_probe(
        &self,
        account: AccountId,
        lease: Option<&LeaseInfo>,
        report: &GpuProbeReport,
        signed: impl FnOnce() -> bool,
        now_ms: u64,
    ) -> Result<(), ErrorCode> {
        let info = lease.filter(|l| l.renter == account && l.lease == report.body.lease);
        let Some(info) = info.filter(|l| !l.billing_closed) else { return Err(ErrorCode::GpuProbeInvalid) };
        let body = &report.body;
        let evidence = self.leases.get(&body.lease);
        let lease_end = info.ended_at_ms.or(info.end_ms).unwrap_or(u64::MAX);
        let after_previous = evidence.is_none_or(|e| body.start_ms >= e.probed_to_ms);
        let same_probe = evidence.and_then(|e| e.probe_key).is_none_or(|key| report.key() == Some(key));
        let valid = body.is_valid()
            && body.start_ms >= info.start_ms
            && body.end_ms <= lease_end.saturating_add(LIVENESS_FUTURE_MS)
            && body.end_ms <= now_ms + LIVENESS_FUTURE_MS
            && after_previous
            && same_probe
            && signed();
        if !valid {
            return Err(ErrorCode::GpuProbeInvalid);
        }
        Ok(())
    }

    /// A renter's liveness observation (checked before it was journaled):
    /// returns the GPU time it disputes against the reports already in.
    pub(crate) fn observe(&mut self, renter: AccountId, report: &LivenessReport) -> Found {
        let body = &report.body;
        let evidence = self.leases.entry(body.lease).or_default();
        evidence.observed_to_ms = evidence.observed_to_ms.max(body.end_ms);
        let record = self.renters.entry(renter).or_default();
        record.observations += 1;
        if body.reachable {
            return Found::default();
        }
        record.unreachable_ms += body.end_ms - body.start_ms;
        let mut found = Found::default();
        for claimed in &mut evidence.claimed {
            found += claimed.unreachable(body.start_ms, body.end_ms);
        }
        keep(&mut evidence.unreachable, (body.start_ms, body.end_ms), |(_, end)| *end);
        record.raised(found);
        found
    }

    /// A renter's GPU probe observation (checked before it was journaled):
    /// returns the GPU time it disputes and proves against the reports
    /// already in.
    pub(crate) fn probed(&mut self, renter: AccountId, report: &GpuProbeReport) -> Found {
        let body = &report.body;
        let evidence = self.leases.entry(body.lease).or_default();
        evidence.probed_to_ms = evidence.probed_to_ms.max(body.end_ms);
        evidence.probe_key = evidence.probe_key.or(report.key());
        let record = self.renters.entry(renter).or_default();
        record.observations += 1;
        let mut found = Found::default();
        for uuid in body.absent() {
            for claimed in evidence.claimed.iter_mut().filter(|c| c.gpu_uuid == uuid) {
                found += claimed.absent(body.start_ms, body.end_ms);
            }
            keep(&mut evidence.absent, (uuid.to_string(), body.start_ms, body.end_ms), |(_, _, end)| *end);
        }
        record.raised(found);
        found
    }

    /// An accepted usage report of `renter`'s lease that verified
    /// `verified_ms` of its interval: returns the GPU time it claimed that
    /// the renter's evidence already disputes and proves.
    pub(crate) fn claimed(&mut self, renter: AccountId, body: &UsageBody, verified_ms: u64) -> Found {
        let mut claimed = Claimed {
            gpu_uuid: body.gpu_uuid.clone(),
            start_ms: body.start_ms,
            end_ms: body.end_ms,
            available_ms: verified_ms,
            unreachable_ms: 0,
            absent_ms: 0,
            weak_ms: 0,
            proven_ms: 0,
            disputed_ms: 0,
        };
        let evidence = self.leases.entry(body.lease).or_default();
        let mut found = Found::default();
        for (from, to) in &evidence.unreachable {
            found += claimed.unreachable(*from, *to);
        }
        for (_, from, to) in evidence.absent.iter().filter(|(uuid, _, _)| *uuid == body.gpu_uuid) {
            found += claimed.absent(*from, *to);
        }
        keep(&mut evidence.claimed, claimed, |c| c.end_ms);
        self.renters.entry(renter).or_default().raised(found);
        found
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
        Claimed {
            gpu_uuid: "GPU-a".into(),
            start_ms,
            end_ms,
            available_ms,
            unreachable_ms: 0,
            absent_ms: 0,
            weak_ms: 0,
            proven_ms: 0,
            disputed_ms: 0,
        }
    }

    fn disputed(found: Found) -> u64 {
        assert_eq!(found.proven_gpu_ms, 0, "liveness proves nothing");
        found.disputed_gpu_ms
    }

    #[test]
    fn the_disputed_time_is_what_cannot_have_been_delivered_outside_the_unreachable_time() {
        let mut full = claim(0, 60_000, 60_000);
        assert_eq!(disputed(full.unreachable(30_000, 90_000)), 30_000, "all claimed, half seen unreachable");
        assert_eq!(disputed(full.unreachable(60_000, 90_000)), 0, "no overlap");
        let mut honest = claim(0, 60_000, 30_000);
        assert_eq!(disputed(honest.unreachable(0, 30_000)), 0, "half claimed, the other half seen down: no contradiction");
        assert_eq!(disputed(honest.unreachable(30_000, 45_000)), 15_000, "three quarters seen down: a quarter cannot fit");
        assert_eq!(disputed(honest.unreachable(45_000, 60_000)), 15_000, "all seen down: all claimed time disputed");
        assert_eq!(honest.disputed_ms, 30_000);
    }

    #[test]
    fn probe_absence_proves_time_and_the_held_time_is_the_larger_of_the_two_kinds() {
        let mut c = claim(0, 60_000, 60_000);
        assert_eq!(c.unreachable(0, 20_000), Found { disputed_gpu_ms: 20_000, proven_gpu_ms: 0 });
        // The probe saw the GPU absent over a third: proven, nothing more held.
        assert_eq!(c.absent(10_000, 30_000), Found { disputed_gpu_ms: 0, proven_gpu_ms: 20_000 });
        // Then over another half: proven and held grow together.
        assert_eq!(c.absent(30_000, 60_000), Found { disputed_gpu_ms: 30_000, proven_gpu_ms: 30_000 });
        assert_eq!((c.disputed_ms, c.proven_ms), (50_000, 50_000));
        assert!(c.proven_ms <= c.disputed_ms);
    }

    #[test]
    fn a_probe_observation_proves_only_against_its_own_gpus_reports() {
        let mut disputes = Disputes::default();
        let (renter, lease) = (AccountId(2), LeaseId(1));
        let report = |gpu: &str| UsageBody {
            lease,
            gpu_uuid: gpu.into(),
            seq: 1,
            start_ms: 0,
            end_ms: 60_000,
            available_ms: 60_000,
            utilisation_percent: 0,
            memory_used_mib_max: 0,
            unhealthy_samples: 0,
            prev_hash: String::new(),
            readings: None,
        };
        assert_eq!(disputes.claimed(renter, &report("GPU-a"), 60_000), Found::default());
        assert_eq!(disputes.claimed(renter, &report("GPU-b"), 60_000), Found::default());
        let gpu = |uuid: &str, present_samples| gpux_protocol::ProbeGpu {
            uuid: uuid.into(),
            present_samples,
            utilisation_percent_mean: 0,
            memory_used_mib_max: 0,
        };
        let body =
            gpux_protocol::GpuProbeBody { lease, start_ms: 0, end_ms: 60_000, samples: 6, gpus: vec![gpu("GPU-a", 6), gpu("GPU-b", 0)] };
        let probe = GpuProbeReport::sign(body, &ed25519_dalek::SigningKey::from_bytes(&[4; 32]));
        assert_eq!(disputes.probed(renter, &probe), Found { disputed_gpu_ms: 60_000, proven_gpu_ms: 60_000 }, "GPU-b only");
        // A report that arrives after the probe's evidence is matched too.
        let later = UsageBody { start_ms: 60_000, end_ms: 120_000, ..report("GPU-b") };
        assert_eq!(disputes.claimed(renter, &later, 60_000), Found::default(), "outside the absent interval");
        assert_eq!(disputes.renter(renter).disputes, 1);
    }
}
