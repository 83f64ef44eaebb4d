//! gpux-settlement: turns usage reports into verified GPU time and charges.
//!
//! `Settlement` is a pure state machine like the engine: it checks each
//! report against the lease it claims (signature by the supplier's host key,
//! the hash chain of that lease and GPU, the interval inside the lease, no
//! overlap, nothing from the future) and meters what verifies. The exchange
//! journals every report it receives and replays them through here, so the
//! outcome of every report, refusals included, is part of the audit trail.
//!
//! Metering rule (docs/market-rules.md, "Billing"): a lease's verified
//! GPU-milliseconds are summed over its GPUs; its charge so far is
//! `floor(price_minor_per_gpu_hour x verified_ms / 3_600_000)`, and each
//! report charges the difference from the previous total. However the time is
//! split into reports, the charges add up to the exact amount rounded down,
//! so never more than one minor unit below it.

pub mod invoice;
pub mod ledger;

use std::collections::{BTreeMap, VecDeque};

use gpux_engine::{AccountId, LeaseId};
pub use gpux_protocol::UsageRejectCode;
use gpux_protocol::{genesis_hash, UsageReport};
use serde::{Deserialize, Serialize};

/// How far in the future (by the exchange's clock) a report may end.
pub const CLOCK_SKEW_MS_MAX: u64 = 5_000;
/// Reports one chain (lease x GPU) may hold.
pub const REPORTS_PER_CHAIN_MAX: usize = 1 << 20;
/// Decompressed host keys kept; the cache starts over when full.
pub const KEY_CACHE_MAX: usize = 1 << 16;
const MS_PER_HOUR: u128 = gpux_engine::time::MS_PER_HOUR as u128;
/// Hashes a chain keeps of its newest accepted reports, to tell a resent
/// report (`Duplicate`) from a different one with the same `seq`
/// (`Replayed`). An agent resends only the reports not yet acknowledged,
/// the newest few; one older than these is answered `Duplicate` unchecked
/// (it can charge nothing either way).
pub const RECENT_HASHES: usize = 8;

/// What settlement needs to know about the lease a report claims.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LeaseTerms {
    pub lease: LeaseId,
    pub supplier: AccountId,
    pub gpu_uuids: Vec<String>,
    pub start_ms: u64,
    /// When it ended or is scheduled to end; `None` while open-ended.
    pub end_ms: Option<u64>,
    pub price_minor_per_gpu_hour: u64,
    /// The lease's billing closed (its end plus the billing grace passed).
    pub billing_closed: bool,
}

/// What a verified report did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum UsageOutcome {
    /// New verified time, and the charge it adds to the lease.
    Accepted { verified_ms: u64, charge_minor: u64 },
    /// The very report was accepted before: nothing happens again.
    Duplicate,
}

/// The report's available time that falls inside the lease. An agent learns
/// that a lease ended only when told, so its last report may run past the
/// end: only the share of the interval up to the end counts.
fn verified_ms(terms: &LeaseTerms, body: &gpux_protocol::UsageBody) -> u64 {
    match terms.end_ms {
        Some(end) if body.end_ms > end => {
            let inside = end - body.start_ms;
            (body.available_ms as u128 * inside as u128 / (body.end_ms - body.start_ms) as u128) as u64
        }
        _ => body.available_ms,
    }
}

/// One lease-and-GPU chain: its counters and newest hashes only, so a
/// chain's size stays the same however many reports it accepts.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
struct Chain {
    /// Reports accepted (the `seq` of the newest).
    accepted: u32,
    /// Hashes of the newest accepted reports, oldest first, at most
    /// `RECENT_HASHES`: the last is the chain's head (`prev_hash` of the next).
    recent: VecDeque<String>,
    last_end_ms: u64,
}

impl Chain {
    fn head(&self) -> Option<&String> {
        self.recent.back()
    }

    /// The hash of accepted report `seq`, if it is among the newest kept.
    fn hash_of(&self, seq: u32) -> Option<&String> {
        let oldest_kept = self.accepted - self.recent.len() as u32 + 1;
        seq.checked_sub(oldest_kept).and_then(|index| self.recent.get(index as usize))
    }

    fn push(&mut self, hash: String, end_ms: u64) {
        self.accepted += 1;
        self.recent.push_back(hash);
        if self.recent.len() > RECENT_HASHES {
            self.recent.pop_front();
        }
        self.last_end_ms = end_ms;
    }
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Metered {
    pub verified_ms: u64,
    pub charged_minor: u64,
}

/// The rule a report's signature is checked by (docs/market-rules.md
/// "Usage reports"). A journal starts with `Legacy` and changes once, by a
/// journaled entry, so every report is checked at replay by the rule it was
/// checked by live.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SignatureRule {
    /// ed25519-dalek's `verify` (cofactorless), as before ZIP-215.
    #[default]
    Legacy,
    /// ZIP-215 (ed25519-zebra): batch and single verification agree on
    /// every input, so a report may be checked before it is sequenced.
    Zip215,
}

#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct Settlement {
    chains: BTreeMap<(LeaseId, String), Chain>,
    metered: BTreeMap<LeaseId, Metered>,
    /// Refused reports per supplier (feeds its reliability score).
    rejections: BTreeMap<AccountId, u64>,
    rule: SignatureRule,
    /// Host keys, decompressed once (a cache: not state, never snapshotted,
    /// and no outcome depends on it).
    #[serde(skip)]
    keys: BTreeMap<[u8; 32], Option<ed25519_dalek::VerifyingKey>>,
    /// The same for ZIP-215 verification.
    #[serde(skip)]
    zip215_keys: BTreeMap<[u8; 32], Option<gpux_protocol::Zip215Key>>,
    /// A report already verified under ZIP-215 off the sequencer's thread,
    /// as (key, report hash), for the next `report` call only: it skips the
    /// verification whose outcome it already knows (the same under ZIP-215
    /// wherever computed), so no outcome depends on it.
    #[serde(skip)]
    checked: Option<([u8; 32], String)>,
}

impl Settlement {
    /// Checks and meters one report from `reporter` (whose host key is
    /// `reporter_key`) about `terms`' lease, at exchange time `now_ms`.
    pub fn report(
        &mut self,
        reporter: AccountId,
        reporter_key: &[u8; 32],
        terms: Option<&LeaseTerms>,
        report: &UsageReport,
        now_ms: u64,
    ) -> Result<UsageOutcome, UsageRejectCode> {
        let checked = self.checked.take();
        // Only a report about one of the reporter's leased GPUs is worth a
        // verification (`check` refuses the rest before the signature).
        let worth = terms.is_some_and(|t| t.supplier == reporter && t.gpu_uuids.contains(&report.body.gpu_uuid));
        let signature_valid = worth
            && match self.rule {
                SignatureRule::Legacy => self.verifying_key(reporter_key).is_some_and(|key| report.verify_with(&key)),
                SignatureRule::Zip215 => {
                    checked.is_some_and(|(key, hash)| key == *reporter_key && hash == report.hash())
                        || self.zip215_key(reporter_key).is_some_and(|key| report.verify_zip215_key(&key))
                }
            };
        match self.check(reporter, signature_valid, terms, report, now_ms) {
            Ok(UsageOutcome::Accepted { verified_ms, .. }) => {
                let charge_minor = self.accept(terms.expect("an accepted report has a lease"), report);
                Ok(UsageOutcome::Accepted { verified_ms, charge_minor })
            }
            Ok(UsageOutcome::Duplicate) => Ok(UsageOutcome::Duplicate),
            Err(code) => {
                *self.rejections.entry(reporter).or_default() += 1;
                Err(code)
            }
        }
    }

    /// The rule signatures are checked by from now on.
    pub fn set_signature_rule(&mut self, rule: SignatureRule) {
        self.rule = rule;
    }

    pub fn signature_rule(&self) -> SignatureRule {
        self.rule
    }

    /// The next report settled is this one, already verified under ZIP-215
    /// against `key` (by the gateway); under the legacy rule it is verified
    /// again all the same.
    pub fn mark_checked(&mut self, key: [u8; 32], report: &UsageReport) {
        self.checked = Some((key, report.hash()));
    }

    /// The reporter's key, decompressed (`None`: not a valid key).
    fn verifying_key(&mut self, key: &[u8; 32]) -> Option<ed25519_dalek::VerifyingKey> {
        if let Some(cached) = self.keys.get(key) {
            return *cached;
        }
        if self.keys.len() >= KEY_CACHE_MAX {
            self.keys.clear();
        }
        let decompressed = ed25519_dalek::VerifyingKey::from_bytes(key).ok();
        self.keys.insert(*key, decompressed);
        decompressed
    }

    /// The reporter's key, decompressed for ZIP-215 (`None`: not a valid key).
    fn zip215_key(&mut self, key: &[u8; 32]) -> Option<gpux_protocol::Zip215Key> {
        if let Some(cached) = self.zip215_keys.get(key) {
            return *cached;
        }
        if self.zip215_keys.len() >= KEY_CACHE_MAX {
            self.zip215_keys.clear();
        }
        let decompressed = gpux_protocol::Zip215Key::decompress(key);
        self.zip215_keys.insert(*key, decompressed);
        decompressed
    }

    /// Records a verified report and returns the charge it adds.
    fn accept(&mut self, terms: &LeaseTerms, report: &UsageReport) -> u64 {
        let body = &report.body;
        let chain = self.chains.entry((body.lease, body.gpu_uuid.clone())).or_default();
        chain.push(report.hash(), body.end_ms);
        let metered = self.metered.entry(body.lease).or_default();
        metered.verified_ms += verified_ms(terms, body);
        let total = (terms.price_minor_per_gpu_hour as u128 * metered.verified_ms as u128 / MS_PER_HOUR) as u64;
        let charge = total - metered.charged_minor;
        metered.charged_minor = total;
        charge
    }

    /// Forgets one lease's chains and meter when its billing closes: no
    /// report about it can be accepted any more, and every one is answered
    /// `BillingClosed` before its chain is looked at, so forgetting changes
    /// no outcome. The market calls it on the lease's `LeaseBillingClosed`
    /// event, so live runs and replays forget at the same point.
    pub fn forget_lease(&mut self, lease: LeaseId) {
        let first = (lease, String::new());
        let chains: Vec<(LeaseId, String)> =
            self.chains.range(first..).take_while(|((l, _), _)| *l == lease).map(|(key, _)| key.clone()).collect();
        for key in chains {
            self.chains.remove(&key);
        }
        self.metered.remove(&lease);
    }

    /// Chains held (one per lease and GPU with an accepted report).
    pub fn chains(&self) -> usize {
        self.chains.len()
    }

    pub fn metered(&self, lease: LeaseId) -> Metered {
        self.metered.get(&lease).copied().unwrap_or_default()
    }

    /// Refused reports of a supplier so far.
    pub fn rejections(&self, supplier: AccountId) -> u64 {
        self.rejections.get(&supplier).copied().unwrap_or(0)
    }

    fn check(
        &self,
        reporter: AccountId,
        signature_valid: bool,
        terms: Option<&LeaseTerms>,
        report: &UsageReport,
        now_ms: u64,
    ) -> Result<UsageOutcome, UsageRejectCode> {
        use UsageRejectCode::*;
        let body = &report.body;
        let terms = terms.ok_or(UnknownLease)?;
        if terms.supplier != reporter {
            return Err(WrongHost);
        }
        if !terms.gpu_uuids.contains(&body.gpu_uuid) {
            return Err(WrongGpu);
        }
        if !signature_valid {
            return Err(Forged);
        }
        // Before anything about the chain: once a lease's bill is final its
        // chains may be forgotten (`forget_lease`), and every answer about
        // it must be the same whether they were or not.
        if terms.billing_closed {
            return Err(BillingClosed);
        }
        let chain = self.chains.get(&(body.lease, body.gpu_uuid.clone()));
        let accepted = chain.map_or(0, |c| c.accepted);
        if body.seq == 0 {
            return Err(Malformed);
        }
        if body.seq <= accepted {
            return match chain.and_then(|c| c.hash_of(body.seq)) {
                Some(seen) if *seen == report.hash() => Ok(UsageOutcome::Duplicate),
                Some(_) => Err(Replayed),
                // Older than the hashes kept: it charges nothing either way.
                None => Ok(UsageOutcome::Duplicate),
            };
        }
        if body.seq > accepted + 1 {
            return Err(Reordered);
        }
        let expected_prev = chain.and_then(|c| c.head().cloned()).unwrap_or_else(genesis_hash);
        if body.prev_hash != expected_prev {
            return Err(Replayed);
        }
        if accepted as usize >= REPORTS_PER_CHAIN_MAX {
            return Err(ChainFull);
        }
        if body.end_ms <= body.start_ms || body.available_ms > body.end_ms - body.start_ms {
            return Err(Malformed);
        }
        if chain.is_some_and(|c| body.start_ms < c.last_end_ms) {
            return Err(Overlapping);
        }
        if body.start_ms < terms.start_ms || terms.end_ms.is_some_and(|end| body.start_ms >= end) {
            return Err(OutOfLease);
        }
        if body.end_ms > now_ms + CLOCK_SKEW_MS_MAX {
            return Err(FromFuture);
        }
        Ok(UsageOutcome::Accepted { verified_ms: verified_ms(terms, body), charge_minor: 0 })
    }
}

/// Verifies and meters one usage report from `account` (whose key is
/// `reporter_key`) and charges what it adds to the lease's escrow (a
/// `SettleUsage` engine input at the report's time). The exchange, the audit
/// tool and the simulator all settle through here. The charge is derived, not
/// journaled: the same report at the same time always charges the same amount,
/// so replay reaches the same state.
pub fn settle_report(
    engine: &mut gpux_engine::Engine,
    settlement: &mut Settlement,
    reporter_key: &[u8; 32],
    at_ms: u64,
    account: AccountId,
    report: &UsageReport,
) -> (Result<UsageOutcome, UsageRejectCode>, Vec<gpux_engine::Event>) {
    let lease = engine.lease(report.body.lease);
    let terms = lease.as_ref().map(|lease| LeaseTerms {
        lease: lease.lease,
        supplier: lease.supplier,
        gpu_uuids: lease.gpus.iter().filter_map(|gpu| engine.gpu(*gpu)).map(|gpu| gpu.uuid).collect(),
        start_ms: lease.start_ms,
        end_ms: lease.ended_at_ms.or(lease.end_ms),
        price_minor_per_gpu_hour: lease.price_minor_per_gpu_hour,
        billing_closed: lease.billing_closed,
    });
    let outcome = settlement.report(account, reporter_key, terms.as_ref(), report, at_ms);
    let mut events = Vec::new();
    if let (Ok(UsageOutcome::Accepted { .. }), Some(terms)) = (&outcome, &terms) {
        // The time the report covers, available or not, within the lease:
        // whether the lease's bill waits for late reports at its grace.
        let end_ms = terms.end_ms.map_or(report.body.end_ms, |end| report.body.end_ms.min(end));
        engine.note_reported(report.body.lease, end_ms.saturating_sub(report.body.start_ms.max(terms.start_ms)));
    }
    if let Ok(UsageOutcome::Accepted { charge_minor, verified_ms }) = outcome {
        // The engine records the verified time (for the SLA) and takes the
        // charge from escrow, then available funds, the rest as debt.
        if charge_minor > 0 || verified_ms > 0 {
            let command =
                gpux_engine::Command::SettleUsage { lease: report.body.lease, amount_minor: charge_minor, verified_gpu_ms: verified_ms };
            events = engine.apply(&gpux_engine::Input { at_ms, command }).to_vec();
        }
    }
    (outcome, events)
}
