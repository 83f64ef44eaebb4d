//! Builds an account's invoice for a period from the ledger's transfers of
//! that period (docs/market-rules.md "Invoices"). Pure: the same transfers
//! and lease records give the same invoice, byte for byte, so the exchange
//! can rebuild any page and the signature covers the whole.
//!
//! Every transfer involving the account is counted once: as a line (what the
//! account was charged or credited), as money in or out (deposits,
//! withdrawals, payouts, funds moved), or as a movement between the
//! account's own balances (holds, releases, debt repaid), which changes
//! nothing it owes. `reconcile` checks that identity on the result.

use std::collections::BTreeMap;

use gpux_engine::{AccountId, LeaseId, LeaseInfo};
use gpux_protocol::invoice::{Invoice, InvoiceItem, InvoiceLine, InvoiceTax, InvoiceTotals};

use crate::ledger::{LedgerAccount, Transfer, TransferKind};

/// Who the invoice is for and what it says about the issuer.
pub struct InvoiceHeader {
    pub account: AccountId,
    pub parent: Option<AccountId>,
    pub period: String,
    pub period_start_ms: u64,
    pub period_end_ms: u64,
    pub issuer: String,
    pub currency: String,
    pub minor_per_unit: u64,
    /// `(name, rate_bps, registration)`.
    pub tax: Option<(String, u32, String)>,
}

/// What the invoice knows of a lease: its record and instrument symbol.
pub type LeaseRecords = BTreeMap<LeaseId, (LeaseInfo, String)>;

pub fn build_invoice(header: InvoiceHeader, transfers: &[Transfer], leases: &LeaseRecords) -> Invoice {
    let account = header.account;
    let mine = |ledger: LedgerAccount| ledger.owner() == Some(account);
    let mut amounts: BTreeMap<(Option<LeaseId>, InvoiceItem), i64> = BTreeMap::new();
    let mut totals = InvoiceTotals::default();
    for t in transfers {
        let (from_mine, to_mine) = (mine(t.from), mine(t.to));
        if from_mine == to_mine {
            // Between two of the account's own balances (or not its own).
            continue;
        }
        let Some(item) = item_of(t, from_mine, to_mine, &mut totals) else { continue };
        let amount = t.amount_minor as i64;
        // Positive: the account pays; negative: it receives.
        *amounts.entry((t.lease, item)).or_default() += if from_mine { amount } else { -amount };
    }
    let lines = lines_of(amounts, leases);
    for line in &lines {
        if line.amount_minor > 0 {
            totals.charges_minor += line.amount_minor as u64;
        } else {
            totals.credits_minor += line.amount_minor.unsigned_abs();
        }
    }
    totals.amount_due_minor = totals.charges_minor as i64 - totals.credits_minor as i64;
    let tax = header.tax.map(|(name, rate_bps, registration)| {
        let due = totals.amount_due_minor.max(0) as u128;
        let included_minor = (due * rate_bps as u128 / (10_000 + rate_bps as u128)) as u64;
        InvoiceTax { name, rate_bps, registration, included_minor }
    });
    let number = format!("GPUX-{}-{}", account, header.period.replace('-', ""));
    Invoice {
        number,
        issuer: header.issuer,
        account,
        parent: header.parent,
        period: header.period,
        period_start_ms: header.period_start_ms,
        period_end_ms: header.period_end_ms,
        currency: header.currency,
        minor_per_unit: header.minor_per_unit,
        lines,
        totals,
        tax,
    }
}

/// The invoice item a transfer between the account and another is, or
/// `None` for money in or out, which counts in the totals instead.
fn item_of(t: &Transfer, from_mine: bool, to_mine: bool, totals: &mut InvoiceTotals) -> Option<InvoiceItem> {
    let item = match t.kind {
        TransferKind::Deposit => {
            totals.deposits_minor += t.amount_minor;
            return None;
        }
        TransferKind::Withdrawal => {
            totals.withdrawals_minor += t.amount_minor;
            return None;
        }
        TransferKind::Payout => {
            totals.payouts_minor += t.amount_minor;
            return None;
        }
        TransferKind::FundsMoved => {
            if to_mine {
                totals.moved_in_minor += t.amount_minor;
            } else {
                totals.moved_out_minor += t.amount_minor;
            }
            return None;
        }
        TransferKind::UsageCharge | TransferKind::LateUsageCharge | TransferKind::UsageUnpaid if from_mine => InvoiceItem::Usage,
        TransferKind::UsageCharge | TransferKind::LateUsageCharge | TransferKind::UsageUnpaid => InvoiceItem::Earnings,
        TransferKind::Fee => InvoiceItem::Fee,
        TransferKind::SlaCredit => InvoiceItem::SlaCredit,
        TransferKind::DeliveryCredit => InvoiceItem::DeliveryCredit,
        TransferKind::DisputeWithheld => InvoiceItem::DisputeWithheld,
        TransferKind::DisputeHeld => InvoiceItem::DisputeHeld,
        TransferKind::DisputeDecided if t.from == LedgerAccount::DisputesHeld && matches!(t.to, LedgerAccount::Payable(_)) => {
            InvoiceItem::DisputeReleased
        }
        TransferKind::DisputeDecided => InvoiceItem::DisputeRefund,
        TransferKind::ContractSettlement => InvoiceItem::ContractResale,
        TransferKind::StorageCharge => InvoiceItem::Storage,
        // Hold, release and debt repaid stay within the account (skipped
        // by the caller); an older journal's transfers have no kind.
        TransferKind::Hold
        | TransferKind::Release
        | TransferKind::ProvisionalRelease
        | TransferKind::FinalRelease
        | TransferKind::DebtRepaid
        | TransferKind::Unclassified => InvoiceItem::Unclassified,
    };
    Some(item)
}

/// The invoice's lines: lease lines in lease order, then account-wide ones
/// (`None` sorts first in a B-tree, so they are moved last), none of 0.
fn lines_of(amounts: BTreeMap<(Option<LeaseId>, InvoiceItem), i64>, leases: &LeaseRecords) -> Vec<InvoiceLine> {
    let (account_wide, by_lease): (Vec<_>, Vec<_>) = amounts.into_iter().partition(|((lease, _), _)| lease.is_none());
    by_lease
        .into_iter()
        .chain(account_wide)
        .filter(|(_, amount)| *amount != 0)
        .map(|((lease, item), amount_minor)| {
            let record = lease.and_then(|lease| leases.get(&lease));
            InvoiceLine {
                lease,
                instrument: record.map(|(_, symbol)| symbol.clone()).unwrap_or_default(),
                item,
                price_minor_per_gpu_hour: record.map(|(info, _)| info.price_minor_per_gpu_hour),
                verified_gpu_ms: record.map(|(info, _)| info.verified_gpu_ms),
                amount_minor,
            }
        })
        .collect()
}

/// The identity every invoice keeps with the ledger: what the account's
/// worth (available + held + payable - debt) changed by over the period,
/// summed from the transfers, equals money in less money out less the
/// amount due. `Err` with both sides otherwise.
pub fn reconcile(invoice: &Invoice, transfers: &[Transfer]) -> Result<(), (i128, i128)> {
    let account = invoice.account;
    let worth = |ledger: LedgerAccount| -> i128 {
        match ledger {
            LedgerAccount::Available(a) | LedgerAccount::Held(a) | LedgerAccount::Payable(a) if a == account => 1,
            // Debt is a debit balance: money into it is owed less.
            LedgerAccount::Debt(a) if a == account => 1,
            _ => 0,
        }
    };
    let change: i128 = transfers.iter().map(|t| (worth(t.to) - worth(t.from)) * t.amount_minor as i128).sum();
    let t = &invoice.totals;
    let expected = t.deposits_minor as i128 - t.withdrawals_minor as i128 - t.payouts_minor as i128 + t.moved_in_minor as i128
        - t.moved_out_minor as i128
        - t.amount_due_minor as i128;
    if change == expected {
        Ok(())
    } else {
        Err((change, expected))
    }
}
