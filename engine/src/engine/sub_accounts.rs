//! Sub-accounts: accounts a renter or an aggregator opens under itself for
//! its own customers (docs/market-rules.md "Sub-accounts"). A sub-account is
//! an account like any other (its own balances, orders, leases and keys),
//! with two differences: its funds come from its parent and go back to it
//! only (`MoveFunds`; it never withdraws), and its parent may limit the
//! orders it places (`SetAccountLimits`, checked at admission).

use super::{Checked, Engine, SubAccount};
use crate::command::AccountLimits;
use crate::event::{EventKind, RejectCode};
use crate::ids::AccountId;
use crate::limits;
use serde::{Deserialize, Serialize};

/// One sub-account as its parent sees it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SubAccountInfo {
    pub account: AccountId,
    pub balances: super::Balances,
    pub open_orders: u32,
    pub limits: AccountLimits,
}

impl Engine {
    pub(super) fn open_sub_account(&mut self, parent: AccountId) -> Checked<()> {
        let role = self.account(parent)?.role;
        if !role.may_buy() {
            return Err(RejectCode::SubAccountRoleNotPermitted);
        }
        if self.sub_accounts.contains_key(&parent) {
            return Err(RejectCode::SubAccountNested);
        }
        if self.sub_accounts_of.get(&parent).is_some_and(|subs| subs.len() >= limits::SUB_ACCOUNTS_PER_ACCOUNT_MAX) {
            return Err(RejectCode::TooManySubAccounts);
        }
        let account = AccountId(self.accounts.len() as u32);
        self.open_account(role)?;
        self.sub_accounts.insert(account, SubAccount { parent, limits: AccountLimits::default() });
        self.sub_accounts_of.entry(parent).or_default().push(account);
        self.emit(EventKind::SubAccountOpened { parent, account });
        Ok(())
    }

    fn check_parent(&self, parent: AccountId, sub_account: AccountId) -> Checked<()> {
        self.account(parent)?;
        match self.sub_accounts.get(&sub_account) {
            Some(sub) if sub.parent == parent => Ok(()),
            _ => Err(RejectCode::NotYourSubAccount),
        }
    }

    pub(super) fn move_funds(&mut self, parent: AccountId, sub_account: AccountId, amount_minor: u64, to_sub: bool) -> Checked<()> {
        self.check_parent(parent, sub_account)?;
        let (from, to) = if to_sub { (parent, sub_account) } else { (sub_account, parent) };
        if amount_minor == 0 || amount_minor > limits::DEPOSIT_MINOR_MAX {
            return Err(RejectCode::AmountInvalid);
        }
        if self.account(from)?.available_minor < amount_minor {
            return Err(RejectCode::InsufficientFunds);
        }
        if self.account(to)?.available_minor.checked_add(amount_minor).is_none_or(|total| total > u64::MAX / 4) {
            return Err(RejectCode::AmountInvalid);
        }
        self.accounts[from.0 as usize].available_minor -= amount_minor;
        self.accounts[to.0 as usize].available_minor += amount_minor;
        self.emit(EventKind::FundsMoved { from, to, amount_minor });
        // Like a deposit: what the receiver owes is repaid first.
        let funds = &mut self.accounts[to.0 as usize];
        let repaid = funds.debt_minor.min(funds.available_minor);
        if repaid > 0 {
            funds.debt_minor -= repaid;
            funds.available_minor -= repaid;
            self.emit(EventKind::DebtRepaid { account: to, amount_minor: repaid, from_payable: false });
        }
        Ok(())
    }

    pub(super) fn set_account_limits(&mut self, parent: AccountId, sub_account: AccountId, limits: AccountLimits) -> Checked<()> {
        self.check_parent(parent, sub_account)?;
        if let Some(sub) = self.sub_accounts.get_mut(&sub_account) {
            sub.limits = limits;
        }
        self.emit(EventKind::AccountLimitsSet { parent, account: sub_account, limits });
        Ok(())
    }

    /// Refuses a sub-account's withdrawal or payout: its money goes back
    /// through its parent.
    pub(super) fn check_funds_may_leave(&self, account: AccountId) -> Checked<()> {
        if self.sub_accounts.contains_key(&account) {
            return Err(RejectCode::SubAccountFundsStay);
        }
        Ok(())
    }

    /// A sub-account's limits on a new order that would hold `hold_minor`
    /// (0 for asks); no check for other accounts.
    pub(super) fn check_sub_account_limits(&self, account: AccountId, hold_minor: u64, new_open_order: bool) -> Checked<()> {
        let Some(sub) = self.sub_accounts.get(&account) else { return Ok(()) };
        let funds = self.account(account)?;
        let limits = sub.limits;
        if new_open_order && limits.max_open_orders.is_some_and(|max| funds.open_orders >= max) {
            return Err(RejectCode::SubAccountLimit);
        }
        if limits.max_order_minor.is_some_and(|max| hold_minor > max) {
            return Err(RejectCode::SubAccountLimit);
        }
        if hold_minor > 0 && limits.max_held_minor.is_some_and(|max| funds.held_minor.saturating_add(hold_minor) > max) {
            return Err(RejectCode::SubAccountLimit);
        }
        Ok(())
    }

    /// The parent of a sub-account (`None` for any other account).
    pub fn parent_of(&self, account: AccountId) -> Option<AccountId> {
        self.sub_accounts.get(&account).map(|sub| sub.parent)
    }

    /// A parent's sub-accounts in the order opened, from `offset`, at most `limit`.
    pub fn sub_accounts_of(&self, parent: AccountId, offset: usize, limit: usize) -> Vec<SubAccountInfo> {
        let Some(subs) = self.sub_accounts_of.get(&parent) else { return Vec::new() };
        subs.iter()
            .skip(offset)
            .take(limit)
            .filter_map(|&account| {
                let funds = self.accounts.get(account.0 as usize)?;
                Some(SubAccountInfo {
                    account,
                    balances: super::Balances {
                        available_minor: funds.available_minor,
                        held_minor: funds.held_minor,
                        payable_minor: funds.payable_minor,
                        debt_minor: funds.debt_minor,
                    },
                    open_orders: funds.open_orders,
                    limits: self.sub_accounts.get(&account).map(|sub| sub.limits).unwrap_or_default(),
                })
            })
            .collect()
    }

    /// How many sub-accounts a parent has.
    pub fn sub_account_count(&self, parent: AccountId) -> usize {
        self.sub_accounts_of.get(&parent).map_or(0, Vec::len)
    }
}

/// What one participant (an account and all its sub-accounts) holds of the
/// tables every account shares (docs/market-rules.md "Shared limits").
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ParticipantUse {
    pub open_orders: u32,
    pub armed_stops: u32,
    pub gpus: u32,
    pub gpus_unproven: u32,
}

impl Engine {
    pub(super) fn set_share_rules(&mut self, version: u32) -> Checked<()> {
        if version > limits::SHARE_RULES || version < self.share_rules {
            return Err(RejectCode::ListingIncompatible);
        }
        self.share_rules = version;
        Ok(())
    }

    /// The share rules in force (0 before any `SetShareRules`).
    pub fn share_rules(&self) -> u32 {
        self.share_rules
    }

    /// The participant an account belongs to: its parent for a sub-account,
    /// else itself.
    pub fn participant_of(&self, account: AccountId) -> AccountId {
        self.parent_of(account).unwrap_or(account)
    }

    /// The accounts of `account`'s participant: the parent first, then its
    /// sub-accounts in the order opened.
    pub fn participant_accounts(&self, account: AccountId) -> impl Iterator<Item = AccountId> + '_ {
        let root = self.participant_of(account);
        std::iter::once(root).chain(self.sub_accounts_of.get(&root).into_iter().flatten().copied())
    }

    /// What `account`'s participant holds, summed over its accounts.
    pub fn participant_use(&self, account: AccountId) -> ParticipantUse {
        self.participant_accounts(account).filter_map(|a| self.accounts.get(a.0 as usize)).fold(ParticipantUse::default(), |sum, a| {
            ParticipantUse {
                open_orders: sum.open_orders + a.open_orders,
                armed_stops: sum.armed_stops + a.armed_stops,
                gpus: sum.gpus + a.gpus,
                gpus_unproven: sum.gpus_unproven + a.gpus_unproven,
            }
        })
    }

    /// Under share rules 1, `account`'s participant's use when it is more
    /// than the account alone (it has sub-accounts or is one): `None`
    /// otherwise, when the account's own bounds are the participant's.
    pub(super) fn shared_use(&self, account: AccountId) -> Option<ParticipantUse> {
        if self.share_rules < 1 {
            return None;
        }
        let root = self.participant_of(account);
        if root == account && !self.sub_accounts_of.contains_key(&root) {
            return None;
        }
        Some(self.participant_use(account))
    }
}
