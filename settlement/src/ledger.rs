//! The double-entry ledger: every movement of money is one transfer between
//! two ledger accounts, so the sum of all balances is zero at all times.
//!
//! The ledger is derived from the engine's event stream (deposits,
//! withdrawals, holds, releases, usage charges with their fee, unpaid usage,
//! payouts, debt repayments, SLA credits) and books each as transfers between
//! ledger accounts: a participant's available, held, payable and debt
//! accounts, the exchange's fee account, the SLA pool and the outside world.
//! Because the event stream is replayed from the journal, so is the ledger; a
//! transfer's id is the engine event's sequence number x 4 and its leg, so
//! none is applied twice. The engine holds the same balances; a property
//! test checks that they agree.

use std::collections::BTreeMap;

use gpux_engine::{AccountId, Event, EventKind, HoldReason, LeaseId};
use serde::{Deserialize, Serialize};

/// A ledger account: a participant's sub-account, or the exchange's own.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum LedgerAccount {
    /// Funds the participant may use or withdraw.
    Available(AccountId),
    /// Funds held for open bids and escrowed for leases and contracts.
    Held(AccountId),
    /// What the exchange owes a supplier for verified usage.
    Payable(AccountId),
    /// Verified usage a renter has not paid (a debit balance).
    Debt(AccountId),
    /// The exchange's fee income.
    Fees,
    /// SLA credits pass through here: suppliers pay in, renters are paid
    /// out, so it is zero after every credit.
    SlaPool,
    /// The world outside the exchange: deposits come from it, withdrawals go
    /// to it (a debit balance).
    External,
    /// Suppliers' shares of disputed time, held until each lease's final
    /// bill decides them (docs/market-rules.md "Disputes"). Appended.
    DisputesHeld,
}

impl LedgerAccount {
    /// A stable label for statements: `available:3`, `fees`, ...
    pub fn label(self) -> String {
        match self {
            LedgerAccount::Available(account) => format!("available:{account}"),
            LedgerAccount::Held(account) => format!("held:{account}"),
            LedgerAccount::Payable(account) => format!("payable:{account}"),
            LedgerAccount::Debt(account) => format!("debt:{account}"),
            LedgerAccount::Fees => "fees".into(),
            LedgerAccount::SlaPool => "sla_pool".into(),
            LedgerAccount::External => "external".into(),
            LedgerAccount::DisputesHeld => "disputes_held".into(),
        }
    }

    /// The participant the account belongs to, if any.
    pub fn owner(self) -> Option<AccountId> {
        match self {
            LedgerAccount::Available(a) | LedgerAccount::Held(a) | LedgerAccount::Payable(a) | LedgerAccount::Debt(a) => Some(a),
            LedgerAccount::Fees | LedgerAccount::SlaPool | LedgerAccount::External | LedgerAccount::DisputesHeld => None,
        }
    }

    /// Whether the account may go below zero.
    pub fn may_be_negative(self) -> bool {
        matches!(self, LedgerAccount::External | LedgerAccount::Debt(_))
    }
}

/// One leg to post: from, to, amount, and the lease it is for.
type Leg = (LedgerAccount, LedgerAccount, u64, Option<LeaseId>);

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Transfer {
    /// Engine event sequence number x 4 + leg (an event posts up to four legs).
    pub id: u64,
    pub at_ms: u64,
    pub from: LedgerAccount,
    pub to: LedgerAccount,
    pub amount_minor: u64,
    pub lease: Option<LeaseId>,
    /// What the movement was (from the event that posted it). Not in the
    /// transfer's stored record (older journals have none): the journal
    /// keeps it in its per-account index.
    #[serde(skip)]
    pub kind: TransferKind,
}

/// What a transfer was, named after the engine event that posted it: what
/// invoices group lines by (docs/market-rules.md "Invoices").
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[repr(u8)]
pub enum TransferKind {
    /// Posted by a journal older than transfer kinds.
    #[default]
    Unclassified = 0,
    Deposit = 1,
    Withdrawal = 2,
    Hold = 3,
    Release = 4,
    /// A usage (or reserved window) charge paid to the supplier's payable.
    UsageCharge = 5,
    /// Usage nothing covered: the renter's debt, the supplier's payable.
    UsageUnpaid = 6,
    /// The exchange's fee on a usage charge.
    Fee = 7,
    DebtRepaid = 8,
    Payout = 9,
    /// An SLA credit (a lease under its availability level).
    SlaCredit = 10,
    /// The credit for a reserved window not delivered.
    DeliveryCredit = 11,
    /// A supplier's share of disputed time, withheld.
    DisputeWithheld = 12,
    /// A reserved contract's resale: the price difference between buyer and seller.
    ContractSettlement = 13,
    /// Funds moved between a parent and its sub-account.
    FundsMoved = 14,
    /// A lease's escrow released at its provisional bill (reports were
    /// missing at the grace; what they could cost stays held).
    ProvisionalRelease = 15,
    /// A usage charge of a report that arrived after the grace, while the
    /// lease's bill was provisional.
    LateUsageCharge = 16,
    /// What a provisional bill kept for late reports, released when it
    /// became final.
    FinalRelease = 17,
    /// A supplier's share of disputed time, held until the final bill.
    DisputeHeld = 18,
    /// A lease's held disputes decided at its final bill: the proven time's
    /// charge back to the renter, the rest of the hold to the supplier.
    DisputeDecided = 19,
    /// The account's volumes' storage, to the exchange's fees (from its
    /// available funds, or, what they did not cover, as its debt).
    StorageCharge = 20,
}

impl TransferKind {
    pub fn from_u8(value: u8) -> TransferKind {
        use TransferKind::*;
        [
            Unclassified,
            Deposit,
            Withdrawal,
            Hold,
            Release,
            UsageCharge,
            UsageUnpaid,
            Fee,
            DebtRepaid,
            Payout,
            SlaCredit,
            DeliveryCredit,
            DisputeWithheld,
            ContractSettlement,
            FundsMoved,
            ProvisionalRelease,
            LateUsageCharge,
            FinalRelease,
            DisputeHeld,
            DisputeDecided,
            StorageCharge,
        ]
        .get(value as usize)
        .copied()
        .unwrap_or(Unclassified)
    }

    /// Its name on the wire and in files (snake case, as serde writes it).
    pub fn name(self) -> &'static str {
        use TransferKind::*;
        match self {
            Unclassified => "unclassified",
            Deposit => "deposit",
            Withdrawal => "withdrawal",
            Hold => "hold",
            Release => "release",
            UsageCharge => "usage_charge",
            UsageUnpaid => "usage_unpaid",
            Fee => "fee",
            DebtRepaid => "debt_repaid",
            Payout => "payout",
            SlaCredit => "sla_credit",
            DeliveryCredit => "delivery_credit",
            DisputeWithheld => "dispute_withheld",
            ContractSettlement => "contract_settlement",
            FundsMoved => "funds_moved",
            ProvisionalRelease => "provisional_release",
            LateUsageCharge => "late_usage_charge",
            FinalRelease => "final_release",
            DisputeHeld => "dispute_held",
            DisputeDecided => "dispute_decided",
            StorageCharge => "storage_charge",
        }
    }
}

/// A ledger posting that would break an invariant; the ledger stops there
/// (better to stop than to go on in a wrong state).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum LedgerError {
    #[error("a usage charge without a lease")]
    ChargeWithoutLease,
    #[error("usage charge for unseen lease {0}")]
    UnseenLease(LeaseId),
    #[error("transfer {0} applied out of order or twice")]
    OutOfOrder(u64),
    #[error("{account:?} would go below zero ({balance})")]
    BelowZero { account: LedgerAccount, balance: i128 },
}

#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct Ledger {
    balances: BTreeMap<LedgerAccount, i128>,
    /// Suppliers of the leases seen, to know whom a usage charge pays.
    suppliers: BTreeMap<LeaseId, AccountId>,
    last_transfer_id: Option<u64>,
    transfers: u64,
    /// Leases whose bill is provisional: their usage charges are late ones
    /// and their escrow's release is the final bill's.
    provisional: std::collections::BTreeSet<LeaseId>,
}

impl Transfer {
    pub fn involves(&self, account: AccountId) -> bool {
        self.from.owner() == Some(account) || self.to.owner() == Some(account)
    }

    pub fn line(&self) -> gpux_protocol::StatementLine {
        gpux_protocol::StatementLine {
            transfer: self.id,
            at_ms: self.at_ms,
            from: self.from.label(),
            to: self.to.label(),
            amount_minor: self.amount_minor,
            lease: self.lease,
            kind: self.kind.name().to_string(),
            description: self.description(),
        }
    }

    /// What moved and why, in words (a statement's description column).
    pub fn description(&self) -> String {
        use TransferKind::*;
        let lease = self.lease.map_or_else(|| "a lease".to_string(), |lease| format!("lease {}", lease.0));
        match self.kind {
            Unclassified => "transfer (recorded before transfers had kinds)".into(),
            Deposit => "deposit".into(),
            Withdrawal => "withdrawal".into(),
            Hold => match self.lease {
                Some(lease) => format!("escrow held for lease {}", lease.0),
                None => "held for an open bid or a reserved window".into(),
            },
            Release => match self.lease {
                Some(lease) => format!("unused escrow of lease {} released", lease.0),
                None => "held funds released (the order or window closed)".into(),
            },
            UsageCharge => match self.lease {
                Some(lease) => format!("verified usage of lease {}", lease.0),
                None => "reserved window charge".into(),
            },
            UsageUnpaid => format!("usage of {lease} that nothing covered (owed as debt)"),
            Fee => format!("exchange fee on the usage of {lease}"),
            DebtRepaid => "debt repaid".into(),
            Payout => "supplier payout".into(),
            SlaCredit => format!("SLA credit on {lease} (availability under its level)"),
            DeliveryCredit => "credit for a reserved window not delivered".into(),
            DisputeWithheld => format!("supplier's share of disputed time on {lease}, withheld"),
            ContractSettlement => "reserved contract resold: the price difference".into(),
            FundsMoved => "moved between an account and its sub-account".into(),
            ProvisionalRelease => {
                format!("escrow of {lease} released at its provisional bill (what its missing reports could cost stays held)")
            }
            LateUsageCharge => format!("verified usage of {lease} reported after its billing grace (provisional bill)"),
            FinalRelease => format!("escrow kept for late reports of {lease} released at its final bill"),
            DisputeHeld => format!("supplier's share of disputed time on {lease}, held until its final bill"),
            DisputeDecided => match (self.from, self.to) {
                (LedgerAccount::Fees, _) => format!("fee on time of {lease} the renter's probe proved undelivered, refunded"),
                (_, LedgerAccount::Payable(_)) => format!("disputed time on {lease} not proven at its final bill, paid to the supplier"),
                _ => format!("charge for time of {lease} the renter's probe proved undelivered, refunded"),
            },
            StorageCharge => match self.from {
                LedgerAccount::Debt(_) => "volume storage its funds did not cover (owed as debt)".into(),
                _ => "volume storage (GiB-months of the account's volumes)".into(),
            },
        }
    }
}

impl Ledger {
    pub fn new() -> Self {
        Ledger::default()
    }

    pub fn balance(&self, account: LedgerAccount) -> i128 {
        self.balances.get(&account).copied().unwrap_or(0)
    }

    /// The sum of every balance; zero after every posting.
    pub fn sum(&self) -> i128 {
        self.balances.values().sum()
    }

    pub fn transfer_count(&self) -> u64 {
        self.transfers
    }

    /// Posts the transfers an engine event implies; returns them.
    pub fn apply(&mut self, event: &Event) -> Result<Vec<Transfer>, LedgerError> {
        let legs = self.legs_of(&event.kind)?;
        let kind = self.transfer_kind(&event.kind);
        let mut posted = Vec::with_capacity(legs.len());
        for (leg, (from, to, amount_minor, lease)) in legs.into_iter().enumerate() {
            let transfer = Transfer { id: event.seq * 4 + leg as u64, at_ms: event.at_ms, from, to, amount_minor, lease, kind };
            self.post(transfer)?;
            posted.push(transfer);
        }
        Ok(posted)
    }

    /// The legs an event moves money along, in the order they are posted
    /// (a transfer's id is its event's and its place here); the leases'
    /// suppliers and provisional bills it notes on the way.
    fn legs_of(&mut self, kind: &EventKind) -> Result<Vec<Leg>, LedgerError> {
        use LedgerAccount::*;
        let mut legs: Vec<Leg> = Vec::new();
        match *kind {
            EventKind::LeaseCreated { lease, supplier, .. } => {
                self.suppliers.insert(lease, supplier);
            }
            EventKind::FundsDeposited { account, amount_minor } => legs.push((External, Available(account), amount_minor, None)),
            EventKind::FundsWithdrawn { account, amount_minor } => legs.push((Available(account), External, amount_minor, None)),
            EventKind::FundsMoved { from, to, amount_minor } => legs.push((Available(from), Available(to), amount_minor, None)),
            EventKind::FundsHeld { account, amount_minor, reason } => {
                legs.push((Available(account), Held(account), amount_minor, lease_of(reason)))
            }
            EventKind::FundsReleased { account, amount_minor, reason } => {
                legs.push((Held(account), Available(account), amount_minor, lease_of(reason)))
            }
            EventKind::FundsCharged { account, to: Some(to), amount_minor, reason, .. } => {
                legs.push((Available(account), Available(to), amount_minor, lease_of(reason)))
            }
            EventKind::FundsCharged { account, to: None, amount_minor, from_held, reason } => {
                let source = if from_held { Held(account) } else { Available(account) };
                let lease = lease_of(reason).ok_or(LedgerError::ChargeWithoutLease)?;
                legs.push((source, Payable(self.supplier_of(lease)?), amount_minor, Some(lease)));
            }
            EventKind::UsageUnpaid { lease, renter, amount_minor } => {
                legs.push((Debt(renter), Payable(self.supplier_of(lease)?), amount_minor, Some(lease)))
            }
            EventKind::FeeCharged { lease, supplier, amount_minor } => legs.push((Payable(supplier), Fees, amount_minor, Some(lease))),
            EventKind::DebtRepaid { account, amount_minor, from_payable } => {
                let source = if from_payable { Payable(account) } else { Available(account) };
                legs.push((source, Debt(account), amount_minor, None))
            }
            EventKind::PayoutSent { account, amount_minor } => legs.push((Payable(account), External, amount_minor, None)),
            EventKind::SlaCredited { lease, renter, supplier, amount_minor, from_payable, from_available, from_debt } => {
                from_supplier(&mut legs, supplier, [from_payable, from_available, from_debt], SlaPool, Some(lease));
                legs.push((SlaPool, Available(renter), amount_minor, Some(lease)));
            }
            EventKind::UsageDisputed { lease, supplier, from_payable, from_available, from_debt, .. } => {
                from_supplier(&mut legs, supplier, [from_payable, from_available, from_debt], Fees, Some(lease));
            }
            EventKind::UsageDisputeHeld { lease, supplier, from_payable, from_available, from_debt, .. } => {
                from_supplier(&mut legs, supplier, [from_payable, from_available, from_debt], DisputesHeld, Some(lease));
            }
            EventKind::DisputeDecided { lease, renter, supplier, refunded_minor, fee_refunded_minor, paid_minor, .. } => {
                let moves = [
                    (DisputesHeld, Available(renter), refunded_minor),
                    (Fees, Available(renter), fee_refunded_minor),
                    (DisputesHeld, Payable(supplier), paid_minor),
                ];
                legs.extend(
                    moves.into_iter().filter(|&(_, _, amount)| amount > 0).map(|(from, to, amount)| (from, to, amount, Some(lease))),
                );
            }
            EventKind::LeaseBillProvisional { lease, renter, released_minor, .. } => {
                self.provisional.insert(lease);
                if released_minor > 0 {
                    legs.push((Held(renter), Available(renter), released_minor, Some(lease)));
                }
            }
            EventKind::LeaseBillingClosed { lease, .. } => {
                self.provisional.remove(&lease);
            }
            EventKind::DeliveryCredited { holder, supplier, amount_minor, from_payable, from_available, from_debt, .. } => {
                from_supplier(&mut legs, supplier, [from_payable, from_available, from_debt], SlaPool, None);
                legs.push((SlaPool, Available(holder), amount_minor, None));
            }
            EventKind::StorageCharged { account, amount_minor, unpaid_minor } => {
                from_supplier(&mut legs, account, [0, amount_minor, unpaid_minor], Fees, None);
            }
            _ => {}
        }
        Ok(legs)
    }

    /// The kind of every transfer an event posts: a usage charge or an
    /// escrow release of a lease whose bill is provisional is the late
    /// report's or the final bill's.
    fn transfer_kind(&self, event: &EventKind) -> TransferKind {
        match *event {
            EventKind::FundsCharged { to: None, reason: HoldReason::Lease(lease), .. } if self.provisional.contains(&lease) => {
                TransferKind::LateUsageCharge
            }
            EventKind::FundsReleased { reason: HoldReason::Lease(lease), .. } if self.provisional.contains(&lease) => {
                TransferKind::FinalRelease
            }
            _ => transfer_kind(event),
        }
    }

    /// Forgets which supplier a lease pays, once nothing can be charged to
    /// it any more (the market calls it when it archives the lease).
    pub fn forget_lease(&mut self, lease: LeaseId) {
        self.suppliers.remove(&lease);
    }

    /// The supplier a usage charge of `lease` pays.
    fn supplier_of(&self, lease: LeaseId) -> Result<AccountId, LedgerError> {
        self.suppliers.get(&lease).copied().ok_or(LedgerError::UnseenLease(lease))
    }

    fn post(&mut self, transfer: Transfer) -> Result<(), LedgerError> {
        if self.last_transfer_id.is_some_and(|last| transfer.id <= last) {
            return Err(LedgerError::OutOfOrder(transfer.id));
        }
        let from = self.balance(transfer.from) - transfer.amount_minor as i128;
        if from < 0 && !transfer.from.may_be_negative() {
            return Err(LedgerError::BelowZero { account: transfer.from, balance: from });
        }
        *self.balances.entry(transfer.from).or_default() = from;
        *self.balances.entry(transfer.to).or_default() += transfer.amount_minor as i128;
        self.last_transfer_id = Some(transfer.id);
        self.transfers += 1;
        debug_assert_eq!(self.sum(), 0);
        Ok(())
    }
}

/// The kind of every transfer an event posts.
fn transfer_kind(event: &EventKind) -> TransferKind {
    match event {
        EventKind::FundsDeposited { .. } => TransferKind::Deposit,
        EventKind::FundsWithdrawn { .. } => TransferKind::Withdrawal,
        EventKind::FundsMoved { .. } => TransferKind::FundsMoved,
        EventKind::FundsHeld { .. } => TransferKind::Hold,
        EventKind::FundsReleased { .. } => TransferKind::Release,
        EventKind::FundsCharged { to: Some(_), .. } => TransferKind::ContractSettlement,
        EventKind::FundsCharged { to: None, .. } => TransferKind::UsageCharge,
        EventKind::UsageUnpaid { .. } => TransferKind::UsageUnpaid,
        EventKind::FeeCharged { .. } => TransferKind::Fee,
        EventKind::DebtRepaid { .. } => TransferKind::DebtRepaid,
        EventKind::PayoutSent { .. } => TransferKind::Payout,
        EventKind::SlaCredited { .. } => TransferKind::SlaCredit,
        EventKind::DeliveryCredited { .. } => TransferKind::DeliveryCredit,
        EventKind::UsageDisputed { .. } => TransferKind::DisputeWithheld,
        EventKind::LeaseBillProvisional { .. } => TransferKind::ProvisionalRelease,
        EventKind::UsageDisputeHeld { .. } => TransferKind::DisputeHeld,
        EventKind::DisputeDecided { .. } => TransferKind::DisputeDecided,
        EventKind::StorageCharged { .. } => TransferKind::StorageCharge,
        _ => TransferKind::Unclassified,
    }
}

/// What a supplier gives up, taken from its payable, available and debt
/// balances in that order (the parts above 0), to `to`.
fn from_supplier(legs: &mut Vec<Leg>, supplier: gpux_engine::AccountId, parts: [u64; 3], to: LedgerAccount, lease: Option<LeaseId>) {
    let sources = [LedgerAccount::Payable(supplier), LedgerAccount::Available(supplier), LedgerAccount::Debt(supplier)];
    for (source, amount) in sources.into_iter().zip(parts) {
        if amount > 0 {
            legs.push((source, to, amount, lease));
        }
    }
}

fn lease_of(reason: HoldReason) -> Option<LeaseId> {
    match reason {
        HoldReason::Lease(lease) => Some(lease),
        HoldReason::Order(_) | HoldReason::Contract(_) => None,
    }
}
