//! Spend control (docs/market-rules.md "Spend control"): an account caps
//! what it commits per UTC day and in all, and what it holds at once. A
//! bid is refused (`spend_limit`) when what the account spent (this day, or
//! since it set its limits) plus everything it holds plus the bid's hold
//! would pass a limit; money already committed (running leases' usage,
//! escrow top-ups) is never refused, but each limit raises alerts as what
//! was spent crosses half, four fifths and all of it.

use super::{Checked, Engine};
use crate::command::SpendLimits;
use crate::event::{EventKind, RejectCode};
use crate::ids::AccountId;
use crate::time::MS_PER_DAY;
use serde::{Deserialize, Serialize};

/// Alert thresholds, in basis points of a limit.
const ALERTS_BPS: [u32; 3] = [5_000, 8_000, 10_000];

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Spend {
    pub limits: SpendLimits,
    /// The UTC day `spent_today_minor` counts.
    pub day: u64,
    pub spent_today_minor: u64,
    /// Since the limits were (last) set.
    pub spent_total_minor: u64,
    /// The highest alert raised: today's (daily) and in all.
    pub daily_alerted_bps: u32,
    pub total_alerted_bps: u32,
}

/// An account's spend limits and what they count, as `spend` answers.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct SpendStatus {
    pub limits: SpendLimits,
    pub spent_today_minor: u64,
    pub spent_total_minor: u64,
    pub held_minor: u64,
}

impl Engine {
    pub(super) fn set_spend_limits(&mut self, account: AccountId, limits: SpendLimits) -> Checked<()> {
        self.account(account)?;
        let day = self.now_ms / MS_PER_DAY;
        let spent_today = self.spend.get(&account).filter(|s| s.day == day).map_or(0, |s| s.spent_today_minor);
        if limits == SpendLimits::default() {
            self.spend.remove(&account);
        } else {
            // Today's spending still counts against a new daily limit; the total starts afresh.
            self.spend.insert(account, Spend { limits, day, spent_today_minor: spent_today, ..Spend::default() });
        }
        self.emit(EventKind::SpendLimitsSet { account, limits });
        Ok(())
    }

    /// Counts money an account paid out of its funds (usage, a reserved
    /// window's rest, a resale's price difference, unpaid usage it owes).
    pub(super) fn note_spend(&mut self, kind: &EventKind) {
        let (account, amount) = match *kind {
            EventKind::FundsCharged { account, amount_minor, .. } => (account, amount_minor),
            EventKind::UsageUnpaid { renter, amount_minor, .. } => (renter, amount_minor),
            _ => return,
        };
        let day = self.now_ms / MS_PER_DAY;
        let Some(spend) = self.spend.get_mut(&account) else { return };
        if spend.day != day {
            spend.day = day;
            spend.spent_today_minor = 0;
            spend.daily_alerted_bps = 0;
        }
        spend.spent_today_minor = spend.spent_today_minor.saturating_add(amount);
        spend.spent_total_minor = spend.spent_total_minor.saturating_add(amount);
        let spend = *spend;
        for (daily, limit, spent, alerted) in [
            (true, spend.limits.daily_minor, spend.spent_today_minor, spend.daily_alerted_bps),
            (false, spend.limits.total_minor, spend.spent_total_minor, spend.total_alerted_bps),
        ] {
            let Some(limit) = limit.filter(|l| *l > 0) else { continue };
            let reached = (spent as u128 * 10_000 / limit as u128).min(u32::MAX as u128) as u32;
            let Some(&threshold_bps) = ALERTS_BPS.iter().rev().find(|t| reached >= **t && **t > alerted) else { continue };
            if let Some(entry) = self.spend.get_mut(&account) {
                if daily {
                    entry.daily_alerted_bps = threshold_bps;
                } else {
                    entry.total_alerted_bps = threshold_bps;
                }
            }
            // Emitted directly: an alert is no spending of its own.
            let event = crate::event::Event {
                seq: self.next_seq,
                at_ms: self.now_ms,
                kind: EventKind::SpendAlert { account, daily, threshold_bps, spent_minor: spent, limit_minor: limit },
            };
            self.next_seq += 1;
            self.events.push(event);
        }
    }

    /// A new bid that would hold `hold_minor`: refused past a spend limit.
    pub(super) fn check_spend_limits(&self, account: AccountId, hold_minor: u64) -> Checked<()> {
        let Some(spend) = self.spend.get(&account) else { return Ok(()) };
        let held = self.account(account)?.held_minor.saturating_add(hold_minor);
        let today = if spend.day == self.now_ms / MS_PER_DAY { spend.spent_today_minor } else { 0 };
        let limits = spend.limits;
        if limits.max_held_minor.is_some_and(|max| held > max)
            || limits.daily_minor.is_some_and(|max| today.saturating_add(held) > max)
            || limits.total_minor.is_some_and(|max| spend.spent_total_minor.saturating_add(held) > max)
        {
            return Err(RejectCode::SpendLimit);
        }
        Ok(())
    }

    /// An account's spend limits and counts (`None` without limits).
    pub fn spend_status(&self, account: AccountId) -> Option<SpendStatus> {
        let spend = self.spend.get(&account)?;
        let today = if spend.day == self.now_ms / MS_PER_DAY { spend.spent_today_minor } else { 0 };
        Some(SpendStatus {
            limits: spend.limits,
            spent_today_minor: today,
            spent_total_minor: spend.spent_total_minor,
            held_minor: self.accounts.get(account.0 as usize).map_or(0, |a| a.held_minor),
        })
    }
}
