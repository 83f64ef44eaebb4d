//! Reliability records and scores of suppliers and their hosts, from
//! journaled facts only, so the exchange, a replay and `gpux-audit` compute
//! the same figures (docs/market-rules.md "Reliability score").
//!
//! A record keeps one bucket per UTC day of exchange time, the last
//! [`SCORE_WINDOW_DAYS`] days only: its size does not grow with history.
//! Facts counted, each on the day it happened:
//! - a lease's billing close: its leased and verified GPU-milliseconds;
//! - a failed delivery (a reserved window whose GPU was not there at its
//!   start, or a lease ended `delivery_failed`);
//! - a refused usage report, by code;
//! - a hardware challenge's outcome (passed, too slow, wrong, unanswered);
//! - GPU time a renter's signed liveness evidence disputes (docs/market-rules.md
//!   "Disputes");
//! - a supplier's last session closing while it supplies active leases;
//! - a preemption honoured late (the workload not reported stopped within
//!   a minute of the lease's end).

use std::collections::{BTreeMap, VecDeque};

use gpux_engine::{AccountId, ChallengeOutcome, Engine, Event, EventKind, HostId, LeaseEndReason, LeaseId};
use gpux_protocol::UsageRejectCode;
use serde::{Deserialize, Serialize};

pub use gpux_protocol::HostReliability;

/// Days a score looks back over (UTC days of exchange time, today included).
pub const SCORE_WINDOW_DAYS: u64 = 30;
/// A record with less than this many GPU-hours leased in the window (failed
/// deliveries counted as leased) has no score yet.
pub const SCORE_MIN_GPU_MS: u64 = 10 * MS_PER_HOUR;
/// Each failed delivery counts as this many GPU-milliseconds leased and
/// none delivered.
pub const FAILED_DELIVERY_GPU_MS: u64 = MS_PER_HOUR;
/// Taken off the score (in basis points) for each refused report whose code
/// an honest agent never produces (`forged`, `replayed`).
pub const DISHONEST_REPORT_PENALTY_BPS: u32 = 100;
/// Taken off the score for each wrong answer to a hardware challenge (an
/// honest GPU never computes a wrong product).
pub const WRONG_CHALLENGE_PENALTY_BPS: u32 = 1_000;
/// Taken off for each disconnect during leases (the renter loses status,
/// logs and timely reports while the agent is away; a restart costs little).
pub const DISCONNECT_PENALTY_BPS: u32 = 10;
/// Taken off for each preemption honoured late (the next holder of the GPU
/// waits for it).
pub const LATE_PREEMPTION_PENALTY_BPS: u32 = 100;

pub(crate) use gpux_engine::time::{MS_PER_DAY, MS_PER_HOUR};
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
struct Day {
    day: u64,
    leased_gpu_ms: u64,
    verified_gpu_ms: u64,
    leases_closed: u32,
    failed_deliveries: u32,
    /// Refused reports by code (few, and none from an honest agent).
    refused: Vec<(UsageRejectCode, u32)>,
    /// Hardware challenges: passed, too slow, wrong, unanswered.
    challenges: [u32; 4],
    disputes: u32,
    disputed_gpu_ms: u64,
    disconnects: u32,
    late_preemptions: u32,
}

impl Day {
    fn refuse(&mut self, code: UsageRejectCode) {
        match self.refused.iter_mut().find(|(c, _)| *c == code) {
            Some((_, count)) => *count += 1,
            None => self.refused.push((code, 1)),
        }
    }
}

/// One supplier's or one host's days.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Record {
    days: VecDeque<Day>,
    /// Host-side delivery failures since its last workload reached `running`.
    failed_in_row: u32,
}

impl Record {
    fn today(&mut self, at_ms: u64) -> &mut Day {
        let day = at_ms / MS_PER_DAY;
        if self.days.back().is_none_or(|last| last.day < day) {
            self.days.push_back(Day { day, ..Day::default() });
        }
        while self.days.front().is_some_and(|first| first.day + SCORE_WINDOW_DAYS <= day) {
            self.days.pop_front();
        }
        // Entries come in time order, so the newest bucket is today's.
        self.days.back_mut().expect("pushed above")
    }

    /// The record's figures over the window that ends on `now_ms`'s day.
    pub fn summary(&self, now_ms: u64) -> Summary {
        let today = now_ms / MS_PER_DAY;
        let mut summary = Summary::default();
        for day in self.days.iter().filter(|d| d.day + SCORE_WINDOW_DAYS > today && d.day <= today) {
            summary.leased_gpu_ms += day.leased_gpu_ms;
            summary.verified_gpu_ms += day.verified_gpu_ms;
            summary.leases_closed += day.leases_closed;
            summary.failed_deliveries += day.failed_deliveries;
            for (code, count) in &day.refused {
                *summary.refused_reports.entry(*code).or_default() += count;
            }
            summary.challenges_passed += day.challenges[0];
            summary.challenges_too_slow += day.challenges[1];
            summary.challenges_failed += day.challenges[2];
            summary.challenges_unanswered += day.challenges[3];
            summary.disputes += day.disputes;
            summary.disputed_gpu_ms += day.disputed_gpu_ms;
            summary.disconnects_during_leases += day.disconnects;
            summary.preemptions_late += day.late_preemptions;
        }
        summary.score_bps = score(&summary);
        summary.failed_deliveries_in_row = self.failed_in_row;
        summary
    }
}

/// A record's figures over the score window (the wire type).
pub use gpux_protocol::ReliabilityRecord as Summary;

/// `(verified - disputed) / (leased + failed deliveries x FAILED_DELIVERY_GPU_MS)`
/// in basis points (verified capped at leased), less
/// [`DISHONEST_REPORT_PENALTY_BPS`] per forged or replayed report and
/// [`WRONG_CHALLENGE_PENALTY_BPS`] per wrong challenge answer, at least 0,
/// rounded down; `None` below [`SCORE_MIN_GPU_MS`].
pub fn score(summary: &Summary) -> Option<u32> {
    let expected = summary.leased_gpu_ms + summary.failed_deliveries as u64 * FAILED_DELIVERY_GPU_MS;
    if expected < SCORE_MIN_GPU_MS {
        return None;
    }
    let delivered = summary.verified_gpu_ms.min(summary.leased_gpu_ms).saturating_sub(summary.disputed_gpu_ms);
    let availability_bps = (delivered as u128 * 10_000 / expected as u128) as u32;
    let dishonest: u32 = [UsageRejectCode::Forged, UsageRejectCode::Replayed]
        .iter()
        .map(|code| summary.refused_reports.get(code).copied().unwrap_or(0))
        .sum();
    let penalty = dishonest
        .saturating_mul(DISHONEST_REPORT_PENALTY_BPS)
        .saturating_add(summary.challenges_failed.saturating_mul(WRONG_CHALLENGE_PENALTY_BPS))
        .saturating_add(summary.disconnects_during_leases.saturating_mul(DISCONNECT_PENALTY_BPS))
        .saturating_add(summary.preemptions_late.saturating_mul(LATE_PREEMPTION_PENALTY_BPS));
    Some(availability_bps.saturating_sub(penalty))
}

/// Every supplier's and host's record.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Reliability {
    suppliers: BTreeMap<AccountId, Record>,
    hosts: BTreeMap<HostId, Record>,
}

impl Reliability {
    /// Counts the facts among one entry's events. Called by the market's
    /// apply before leases are archived, so each lease is still known.
    /// Returns the suppliers whose records changed.
    pub(crate) fn observe(&mut self, engine: &Engine, events: &[Event]) -> Vec<AccountId> {
        let mut touched = Vec::new();
        for event in events {
            match event.kind {
                EventKind::LeaseBillingClosed { lease, leased_gpu_ms, verified_gpu_ms, .. } => {
                    touched.extend(engine.lease(lease).map(|l| l.supplier));
                    self.count(engine, lease, event.at_ms, |day| {
                        day.leased_gpu_ms += leased_gpu_ms;
                        day.verified_gpu_ms += verified_gpu_ms;
                        day.leases_closed += 1;
                    });
                }
                EventKind::LeaseEnded { lease, reason: LeaseEndReason::DeliveryFailed } => {
                    touched.extend(engine.lease(lease).map(|l| l.supplier));
                    self.count(engine, lease, event.at_ms, |day| day.failed_deliveries += 1);
                    self.each_record(engine, lease, |record| record.failed_in_row += 1);
                }
                EventKind::GpuChallenged { gpu, owner, outcome, .. } | EventKind::GpuMemoryChallenged { gpu, owner, outcome, .. } => {
                    let slot = match outcome {
                        ChallengeOutcome::Passed => 0,
                        ChallengeOutcome::TooSlow => 1,
                        ChallengeOutcome::WrongAnswer => 2,
                        ChallengeOutcome::Unanswered => 3,
                    };
                    touched.push(owner);
                    self.suppliers.entry(owner).or_default().today(event.at_ms).challenges[slot] += 1;
                    if let Some(host) = engine.gpu(gpu).map(|g| g.host) {
                        self.hosts.entry(host).or_default().today(event.at_ms).challenges[slot] += 1;
                    }
                }
                // A fabric claim the probe does not bear out counts like a
                // wrong challenge answer (docs/market-rules.md "Interconnect probe").
                EventKind::FabricProbed { host, owner, borne_out, .. } => {
                    let slot = if borne_out { 0 } else { 2 };
                    touched.push(owner);
                    self.suppliers.entry(owner).or_default().today(event.at_ms).challenges[slot] += 1;
                    self.hosts.entry(host).or_default().today(event.at_ms).challenges[slot] += 1;
                }
                EventKind::DeliveryFailed { supplier, gpu, .. } => {
                    touched.push(supplier);
                    let record = self.suppliers.entry(supplier).or_default();
                    record.today(event.at_ms).failed_deliveries += 1;
                    record.failed_in_row += 1;
                    if let Some(host) = engine.gpu(gpu).map(|g| g.host) {
                        let record = self.hosts.entry(host).or_default();
                        record.today(event.at_ms).failed_deliveries += 1;
                        record.failed_in_row += 1;
                    }
                }
                _ => {}
            }
        }
        touched
    }

    /// A refused usage report of `reporter` about `lease`. A report about a
    /// lease that is not the reporter's (unknown, another host's) is not
    /// counted: it says nothing about the reporter's own supply, and counting
    /// it would let anyone lower a supplier's host score.
    pub(crate) fn refused(&mut self, engine: &Engine, reporter: AccountId, lease: LeaseId, code: UsageRejectCode, at_ms: u64) {
        let Some(info) = engine.lease(lease).filter(|l| l.supplier == reporter) else { return };
        self.suppliers.entry(reporter).or_default().today(at_ms).refuse(code);
        if let Some(host) = info.gpus.first().and_then(|g| engine.gpu(*g)).map(|g| g.host) {
            self.hosts.entry(host).or_default().today(at_ms).refuse(code);
        }
    }

    /// GPU time of `lease` that a renter's evidence disputes: one dispute
    /// in its supplier's and host's records. Returns the supplier.
    pub(crate) fn disputed(&mut self, engine: &Engine, lease: LeaseId, disputed_gpu_ms: u64, at_ms: u64) -> Option<AccountId> {
        self.count(engine, lease, at_ms, |day| {
            day.disputes += 1;
            day.disputed_gpu_ms += disputed_gpu_ms;
        });
        engine.lease(lease).map(|l| l.supplier)
    }

    /// A supplier's last session closed while it supplied `leases` (active):
    /// one disconnect for it and for each host among the leases'.
    pub(crate) fn disconnected(&mut self, engine: &Engine, supplier: AccountId, leases: &[LeaseId], at_ms: u64) {
        if leases.is_empty() {
            return;
        }
        self.suppliers.entry(supplier).or_default().today(at_ms).disconnects += 1;
        let mut hosts: Vec<HostId> = leases
            .iter()
            .filter_map(|l| engine.lease(*l))
            .filter_map(|l| l.gpus.first().and_then(|g| engine.gpu(*g)))
            .map(|g| g.host)
            .collect();
        hosts.sort_unstable();
        hosts.dedup();
        for host in hosts {
            self.hosts.entry(host).or_default().today(at_ms).disconnects += 1;
        }
    }

    /// A preempted lease whose workload was not reported stopped in time.
    pub(crate) fn late_preemption(&mut self, engine: &Engine, lease: LeaseId, at_ms: u64) {
        self.count(engine, lease, at_ms, |day| day.late_preemptions += 1);
    }

    /// A workload of `lease` reached `running` for the first time: its
    /// supplier's and host's failures in a row end.
    pub(crate) fn delivered(&mut self, engine: &Engine, lease: LeaseId) {
        let Some(info) = engine.lease(lease) else { return };
        if let Some(record) = self.suppliers.get_mut(&info.supplier) {
            record.failed_in_row = 0;
        }
        if let Some(record) = info.gpus.first().and_then(|g| engine.gpu(*g)).and_then(|g| self.hosts.get_mut(&g.host)) {
            record.failed_in_row = 0;
        }
    }

    /// Changes the lease's supplier's and host's records (those that exist or are due).
    fn each_record(&mut self, engine: &Engine, lease: LeaseId, change: impl Fn(&mut Record)) {
        let Some(info) = engine.lease(lease) else { return };
        change(self.suppliers.entry(info.supplier).or_default());
        if let Some(host) = info.gpus.first().and_then(|g| engine.gpu(*g)).map(|g| g.host) {
            change(self.hosts.entry(host).or_default());
        }
    }

    fn count(&mut self, engine: &Engine, lease: LeaseId, at_ms: u64, add: impl Fn(&mut Day)) {
        let Some(info) = engine.lease(lease) else { return };
        add(self.suppliers.entry(info.supplier).or_default().today(at_ms));
        if let Some(host) = info.gpus.first().and_then(|g| engine.gpu(*g)).map(|g| g.host) {
            add(self.hosts.entry(host).or_default().today(at_ms));
        }
    }

    pub fn supplier(&self, supplier: AccountId, now_ms: u64) -> Summary {
        self.suppliers.get(&supplier).map(|r| r.summary(now_ms)).unwrap_or_default()
    }

    /// Suppliers with a record.
    pub(crate) fn suppliers(&self) -> impl Iterator<Item = AccountId> + '_ {
        self.suppliers.keys().copied()
    }

    pub fn host(&self, host: HostId, now_ms: u64) -> Summary {
        self.hosts.get(&host).map(|r| r.summary(now_ms)).unwrap_or_default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn summary(leased_h: u64, verified_h: u64, failed: u32, forged: u32) -> Summary {
        let mut summary = Summary {
            leased_gpu_ms: leased_h * MS_PER_HOUR,
            verified_gpu_ms: verified_h * MS_PER_HOUR,
            failed_deliveries: failed,
            ..Summary::default()
        };
        if forged > 0 {
            summary.refused_reports.insert(UsageRejectCode::Forged, forged);
        }
        summary
    }

    #[test]
    fn the_score_follows_the_formula() {
        assert_eq!(score(&summary(9, 9, 0, 0)), None, "below the minimum history");
        assert_eq!(score(&summary(9, 9, 1, 0)), Some(9_000), "a failed delivery counts as an hour leased, none delivered");
        assert_eq!(score(&summary(100, 99, 0, 0)), Some(9_900));
        assert_eq!(score(&summary(100, 99, 0, 3)), Some(9_600), "100 bps per forged report");
        assert_eq!(score(&summary(10, 1, 0, 200)), Some(0), "never below zero");
        assert_eq!(score(&summary(10, 20, 0, 0)), Some(10_000), "verified above leased is capped");
        let wrong = Summary { challenges_failed: 2, challenges_unanswered: 5, challenges_too_slow: 1, ..summary(100, 99, 0, 1) };
        assert_eq!(score(&wrong), Some(7_800), "1 000 bps per wrong challenge answer; slow and unanswered cost nothing here");
        let disputed = Summary { disputes: 3, disputed_gpu_ms: 9 * MS_PER_HOUR, ..summary(100, 99, 0, 0) };
        assert_eq!(score(&disputed), Some(9_000), "disputed time counts as not delivered");
        let all_disputed = Summary { disputed_gpu_ms: 200 * MS_PER_HOUR, ..summary(100, 99, 0, 0) };
        assert_eq!(score(&all_disputed), Some(0));
        let flaky = Summary { disconnects_during_leases: 3, preemptions_late: 2, ..summary(100, 99, 0, 0) };
        assert_eq!(score(&flaky), Some(9_900 - 30 - 200), "10 bps per disconnect during leases, 100 per late preemption");
    }

    #[test]
    fn a_record_keeps_the_window_only() {
        let mut record = Record::default();
        for day in 0..100 {
            let bucket = record.today(day * MS_PER_DAY + 5);
            bucket.leased_gpu_ms += MS_PER_HOUR;
            bucket.verified_gpu_ms += MS_PER_HOUR / 2;
        }
        assert_eq!(record.days.len() as u64, SCORE_WINDOW_DAYS);
        let now = 99 * MS_PER_DAY + 7;
        assert_eq!(record.summary(now).leased_gpu_ms, SCORE_WINDOW_DAYS * MS_PER_HOUR);
        assert_eq!(record.summary(now).score_bps, Some(5_000));
        // Days later, with nothing new, the old days fall out of the window.
        assert_eq!(record.summary(now + 25 * MS_PER_DAY).leased_gpu_ms, 5 * MS_PER_HOUR);
        assert_eq!(record.summary(now + 25 * MS_PER_DAY).score_bps, None, "too little history left");
    }
}
