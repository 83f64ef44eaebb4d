//! Invoices (docs/market-rules.md "Invoices", docs/protocol.md "Invoices"):
//! the document an account gets for a closed calendar month, its canonical
//! form and the exchange's ed25519 signature over it.
//!
//! The canonical form is the invoice as JSON with every object's keys
//! sorted and no whitespace, after the domain `gpux-invoice-v1:`; any
//! language's JSON library rebuilds it (Python: `json.dumps(invoice,
//! sort_keys=True, separators=(",", ":"), ensure_ascii=False)`), so anyone
//! holding the exchange's public key can verify an invoice without gpux.

use ed25519_dalek::{Signature, Signer, SigningKey, VerifyingKey};
use gpux_engine::{AccountId, LeaseId};
use serde::{Deserialize, Serialize};

/// What the exchange signs: this prefix, then the canonical JSON.
pub const INVOICE_DOMAIN: &[u8] = b"gpux-invoice-v1:";
/// Lines in one `invoice` answer; ask again from `next_offset`.
pub const INVOICE_LINES_PAGE_MAX: usize = 200;

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Invoice {
    /// `GPUX-<account>-<YYYYMM>`: one invoice per account and month.
    pub number: String,
    /// The operator's name and address as configured (`--invoice-issuer`).
    pub issuer: String,
    pub account: AccountId,
    /// The parent of a sub-account's invoice.
    pub parent: Option<AccountId>,
    /// `YYYY-MM` (UTC); the invoice covers transfers posted in
    /// `[period_start_ms, period_end_ms)`.
    pub period: String,
    pub period_start_ms: u64,
    pub period_end_ms: u64,
    /// The exchange's currency and how many minor units make one unit
    /// (USD in micro-dollars: 1 000 000).
    pub currency: String,
    pub minor_per_unit: u64,
    /// One line per lease and item, in lease order (account-wide items
    /// last); `amount_minor` is positive for what the account pays,
    /// negative for what it is owed.
    pub lines: Vec<InvoiceLine>,
    pub totals: InvoiceTotals,
    /// Tax included in the amount due, from the operator's configuration.
    pub tax: Option<InvoiceTax>,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct InvoiceLine {
    pub lease: Option<LeaseId>,
    /// The instrument the lease traded on (empty when unknown).
    pub instrument: String,
    pub item: InvoiceItem,
    pub price_minor_per_gpu_hour: Option<u64>,
    /// The lease's verified GPU time to the invoice's issue (all periods).
    pub verified_gpu_ms: Option<u64>,
    pub amount_minor: i64,
}

/// What a line is for.
#[derive(
    Clone,
    Copy,
    Debug,
    PartialEq,
    Eq,
    PartialOrd,
    Ord,
    Hash,
    Serialize,
    Deserialize,
    strum::IntoStaticStr,
    strum::VariantArray,
    strum::VariantNames,
)]
#[serde(rename_all = "snake_case")]
#[strum(serialize_all = "snake_case")]
pub enum InvoiceItem {
    /// Verified usage (and a reserved window's rest) charged to the renter;
    /// unpaid usage included (it became the renter's debt).
    Usage,
    /// An SLA credit the renter received (negative), or the supplier paid.
    SlaCredit,
    /// The credit for a reserved window not delivered.
    DeliveryCredit,
    /// Usage the supplier earned (negative: owed to it).
    Earnings,
    /// The exchange's fee on the supplier's earnings.
    Fee,
    /// The supplier's share of disputed time, withheld.
    DisputeWithheld,
    /// A reserved contract resold: the price difference paid or received.
    ContractResale,
    /// Transfers of an older journal whose kind was not recorded.
    Unclassified,
    /// The supplier's share of disputed time, held until the lease's final
    /// bill (docs/market-rules.md "Disputes"). Appended.
    DisputeHeld,
    /// The charge of disputed time the renter's probe proved, refunded to
    /// the renter (negative).
    DisputeRefund,
    /// Held disputed time the final bill found for the supplier, paid to it
    /// (negative).
    DisputeReleased,
    /// The account's volumes' storage (docs/storage.md "Prices"); unpaid
    /// storage included (it became the account's debt). Appended.
    Storage,
}

impl InvoiceItem {
    /// The name as the protocol writes it (`snake_case`): strum's, the
    /// same as serde's (tested), without serialising.
    pub fn name(self) -> &'static str {
        self.into()
    }
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct InvoiceTotals {
    /// Sum of the positive lines.
    pub charges_minor: u64,
    /// Sum of the negative lines, as a positive amount.
    pub credits_minor: u64,
    /// charges - credits: what the account owes for the period (negative:
    /// what the exchange owes it).
    pub amount_due_minor: i64,
    /// Money in and out of the account during the period (not billed).
    pub deposits_minor: u64,
    pub withdrawals_minor: u64,
    pub payouts_minor: u64,
    /// Funds moved from the parent (or to a sub-account) and back.
    pub moved_in_minor: u64,
    pub moved_out_minor: u64,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct InvoiceTax {
    /// e.g. `VAT`.
    pub name: String,
    pub rate_bps: u32,
    /// The operator's tax registration.
    pub registration: String,
    /// The tax part of a positive amount due (prices include tax):
    /// `floor(due x rate / (10000 + rate))`; 0 when nothing is due.
    pub included_minor: u64,
}

impl Invoice {
    /// The bytes the exchange signs.
    pub fn signed_bytes(&self) -> Vec<u8> {
        let mut bytes = INVOICE_DOMAIN.to_vec();
        let value = serde_json::to_value(self).expect("an invoice is JSON");
        write_canonical(&value, &mut bytes);
        bytes
    }

    pub fn sign(&self, key: &SigningKey) -> String {
        hex::encode(key.sign(&self.signed_bytes()).to_bytes())
    }

    /// Whether `signature` (hex) is `public_key`'s (hex) over this invoice.
    pub fn verify(&self, signature: &str, public_key: &str) -> bool {
        let key = hex::decode(public_key).ok().and_then(|b| <[u8; 32]>::try_from(b).ok());
        let signature = hex::decode(signature).ok().and_then(|b| <[u8; 64]>::try_from(b).ok());
        let (Some(key), Some(signature)) = (key, signature) else { return false };
        let Ok(key) = VerifyingKey::from_bytes(&key) else { return false };
        key.verify_strict(&self.signed_bytes(), &Signature::from_bytes(&signature)).is_ok()
    }
}

/// JSON with sorted keys and no whitespace, whatever order the map keeps.
fn write_canonical(value: &serde_json::Value, out: &mut Vec<u8>) {
    match value {
        serde_json::Value::Object(map) => {
            let mut keys: Vec<&String> = map.keys().collect();
            keys.sort();
            out.push(b'{');
            for (n, key) in keys.into_iter().enumerate() {
                if n > 0 {
                    out.push(b',');
                }
                out.extend_from_slice(serde_json::to_string(key).expect("a key").as_bytes());
                out.push(b':');
                write_canonical(&map[key], out);
            }
            out.push(b'}');
        }
        serde_json::Value::Array(items) => {
            out.push(b'[');
            for (n, item) in items.iter().enumerate() {
                if n > 0 {
                    out.push(b',');
                }
                write_canonical(item, out);
            }
            out.push(b']');
        }
        scalar => out.extend_from_slice(serde_json::to_string(scalar).expect("a scalar").as_bytes()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn invoice() -> Invoice {
        Invoice {
            number: "GPUX-3-202611".into(),
            issuer: "gpux demo exchange".into(),
            account: AccountId(3),
            parent: None,
            period: "2026-11".into(),
            period_start_ms: 1_793_491_200_000,
            period_end_ms: 1_796_083_200_000,
            currency: "USD".into(),
            minor_per_unit: 1_000_000,
            lines: vec![InvoiceLine {
                lease: Some(LeaseId(7)),
                instrument: "H100-SXM-80G/SPOT".into(),
                item: InvoiceItem::Usage,
                price_minor_per_gpu_hour: Some(2_000_000),
                verified_gpu_ms: Some(3_600_000),
                amount_minor: 2_000_000,
            }],
            totals: InvoiceTotals { charges_minor: 2_000_000, amount_due_minor: 2_000_000, ..InvoiceTotals::default() },
            tax: None,
        }
    }

    #[test]
    fn the_canonical_form_sorts_keys_and_a_changed_invoice_no_longer_verifies() {
        let invoice = invoice();
        let text = String::from_utf8(invoice.signed_bytes()).expect("utf-8");
        assert!(text.starts_with(r#"gpux-invoice-v1:{"account":3,"currency":"USD","issuer":"#), "{text}");
        assert!(!text.contains(' ') || text.contains("gpux demo exchange"), "no whitespace but inside strings");
        let key = SigningKey::from_bytes(&[5; 32]);
        let public = hex::encode(key.verifying_key().to_bytes());
        let signature = invoice.sign(&key);
        assert!(invoice.verify(&signature, &public));
        let mut changed = invoice.clone();
        changed.lines[0].amount_minor -= 1;
        assert!(!changed.verify(&signature, &public), "one minor unit less is another invoice");
        assert!(!invoice.verify(&signature, &hex::encode(SigningKey::from_bytes(&[6; 32]).verifying_key().to_bytes())));
        assert!(!invoice.verify("zz", &public));
    }
}
