//! `gpux invoice --period YYYY-MM`: fetches every page of an invoice,
//! verifies the exchange's signature with its published key, prints it, and
//! writes it as printable HTML (`--html`) or, through a headless Chromium on
//! this machine, as PDF (`--pdf`).

use std::path::{Path, PathBuf};

use gpux_engine::AccountId;
use gpux_protocol::{ClientMessage, Invoice, ServerMessage};

use crate::money::amount;
use crate::session::Session;
use crate::Failure;

/// Signed money for people: `-$1.50`.
fn signed(minor: i64) -> String {
    if minor < 0 {
        format!("-{}", amount(minor.unsigned_abs()))
    } else {
        amount(minor as u64)
    }
}

/// Which signed document: a month's invoice, a job's or a service's bill.
pub enum Document {
    Month { period: String, sub_account: Option<u32> },
    Job(u64),
    Service(u64),
}

pub async fn invoice(
    s: &mut Session,
    period: String,
    sub_account: Option<u32>,
    html: Option<PathBuf>,
    pdf: Option<PathBuf>,
    json: bool,
) -> Result<(), Failure> {
    document(s, Document::Month { period, sub_account }, html, pdf, json).await
}

/// Fetches every page of the document, checks the exchange's signature
/// over the whole, prints it, and writes it as HTML or PDF when asked.
pub async fn document(s: &mut Session, which: Document, html: Option<PathBuf>, pdf: Option<PathBuf>, json: bool) -> Result<(), Failure> {
    let id = s.connection.new_id();
    let ServerMessage::ExchangeKey { public_key, .. } = s.ask(ClientMessage::ExchangeKey { id }, json).await? else {
        return Err(Failure::Unreachable("expected exchange_key".into()));
    };
    let mut lines = Vec::new();
    let mut offset = 0;
    let (mut whole, signature) = loop {
        let id = s.connection.new_id();
        let request = match &which {
            Document::Month { period, sub_account } => {
                ClientMessage::Invoice { id, period: period.clone(), account: sub_account.map(AccountId), offset }
            }
            Document::Job(job) => ClientMessage::JobBill { id, job: gpux_protocol::JobId(*job), offset },
            Document::Service(service) => ClientMessage::ServiceBill { id, service: gpux_protocol::ServiceId(*service), offset },
        };
        let ServerMessage::Invoice { invoice, next_offset, signature, exchange_key, .. } = s.ask(request, json).await? else {
            return Err(Failure::Unreachable("expected invoice".into()));
        };
        if exchange_key != public_key {
            return Err(Failure::Refused(format!("the invoice names key {exchange_key}, the exchange publishes {public_key}")));
        }
        lines.extend(invoice.lines.iter().cloned());
        match next_offset {
            Some(next) => offset = next,
            None => break (*invoice, signature),
        }
    };
    whole.lines = lines;
    if !whole.verify(&signature, &public_key) {
        return Err(Failure::Refused(format!("invoice {} does not verify with the exchange's key {public_key}", whole.number)));
    }
    if !json {
        print_invoice(&whole, &public_key);
    }
    if let Some(path) = &html {
        write(path, &render_html(&whole, &signature, &public_key))?;
        if !json {
            out!("wrote {}", path.display());
        }
    }
    if let Some(path) = &pdf {
        let page = path.with_extension("html");
        write(&page, &render_html(&whole, &signature, &public_key))?;
        print_pdf(&page, path)?;
        if !json {
            out!("wrote {}", path.display());
        }
    }
    Ok(())
}

fn write(path: &Path, text: &str) -> Result<(), Failure> {
    std::fs::write(path, text).map_err(|e| Failure::Usage(format!("writing {}: {e}", path.display())))
}

fn print_invoice(invoice: &Invoice, public_key: &str) {
    out!("invoice {} for account {} ({}), {} in {}", invoice.number, invoice.account, invoice.period, invoice.issuer, invoice.currency);
    if let Some(parent) = invoice.parent {
        out!("sub-account of {parent}");
    }
    for line in &invoice.lines {
        let lease = line.lease.map_or_else(|| "account".to_string(), |l| format!("lease {l}"));
        let price = line.price_minor_per_gpu_hour.map_or_else(String::new, |p| format!(" at {}/GPU-h", amount(p)));
        let hours = line.verified_gpu_ms.map_or_else(String::new, |ms| format!(", {:.3} GPU-h verified", ms as f64 / 3_600_000.0));
        out!("  {lease} {}{price}{hours}: {} {}", line.instrument, line.item.name(), signed(line.amount_minor));
    }
    let t = invoice.totals;
    out!("charges {}, credits {}, amount due {}", amount(t.charges_minor), amount(t.credits_minor), signed(t.amount_due_minor));
    out!(
        "deposits {}, withdrawals {}, payouts {}, moved in {}, moved out {}",
        amount(t.deposits_minor),
        amount(t.withdrawals_minor),
        amount(t.payouts_minor),
        amount(t.moved_in_minor),
        amount(t.moved_out_minor)
    );
    if let Some(tax) = &invoice.tax {
        out!(
            "includes {} {}.{:02}% ({}): {}",
            tax.name,
            tax.rate_bps / 100,
            tax.rate_bps % 100,
            tax.registration,
            amount(tax.included_minor)
        );
    }
    out!("signature verified with the exchange's key {public_key}");
}

fn escape(text: &str) -> String {
    text.replace('&', "&amp;").replace('<', "&lt;").replace('>', "&gt;").replace('"', "&quot;")
}

/// A self-contained page, made to be printed (A4, no scripts).
pub fn render_html(invoice: &Invoice, signature: &str, public_key: &str) -> String {
    let mut rows = String::new();
    for line in &invoice.lines {
        rows.push_str(&format!(
            "<tr><td>{}</td><td>{}</td><td>{}</td><td class=n>{}</td><td class=n>{}</td><td class=n>{}</td></tr>\n",
            line.lease.map_or_else(|| "-".into(), |l| l.to_string()),
            escape(&line.instrument),
            escape(line.item.name()),
            line.price_minor_per_gpu_hour.map_or_else(String::new, amount),
            line.verified_gpu_ms.map_or_else(String::new, |ms| format!("{:.3}", ms as f64 / 3_600_000.0)),
            signed(line.amount_minor),
        ));
    }
    let t = invoice.totals;
    let tax = invoice.tax.as_ref().map_or_else(String::new, |tax| {
        format!(
            "<tr><td>Included {} {}.{:02}% (registration {})</td><td class=n>{}</td></tr>",
            escape(&tax.name),
            tax.rate_bps / 100,
            tax.rate_bps % 100,
            escape(&tax.registration),
            amount(tax.included_minor)
        )
    });
    let parent = invoice.parent.map_or_else(String::new, |p| format!(" (sub-account of {p})"));
    format!(
        r#"<!doctype html>
<html><head><meta charset="utf-8"><title>Invoice {number}</title>
<style>
@page {{ size: A4; margin: 18mm; }}
body {{ font-family: sans-serif; font-size: 10pt; }}
table {{ border-collapse: collapse; width: 100%; margin: 1em 0; }}
td, th {{ border-bottom: 1px solid #ccc; padding: 3px 6px; text-align: left; }}
.n {{ text-align: right; font-variant-numeric: tabular-nums; }}
.sig {{ font-family: monospace; font-size: 7pt; word-break: break-all; }}
</style></head><body>
<h1>Invoice {number}</h1>
<p>{issuer}</p>
<p>Account {account}{parent} &middot; period {period} (UTC) &middot; amounts in {currency}</p>
<table><thead><tr><th>Lease</th><th>Instrument</th><th>Item</th><th class=n>Price / GPU-h</th><th class=n>GPU-h verified</th><th class=n>Amount</th></tr></thead>
<tbody>
{rows}</tbody></table>
<table>
<tr><td>Charges</td><td class=n>{charges}</td></tr>
<tr><td>Credits</td><td class=n>{credits}</td></tr>
<tr><th>Amount due</th><th class=n>{due}</th></tr>
{tax}
<tr><td>Deposits / withdrawals / payouts in the period</td><td class=n>{deposits} / {withdrawals} / {payouts}</td></tr>
<tr><td>Funds moved in / out</td><td class=n>{moved_in} / {moved_out}</td></tr>
</table>
<p class=sig>Signed by the exchange's ed25519 key {public_key}<br>signature {signature}</p>
</body></html>
"#,
        number = escape(&invoice.number),
        issuer = escape(&invoice.issuer),
        account = invoice.account,
        period = escape(&invoice.period),
        currency = escape(&invoice.currency),
        charges = amount(t.charges_minor),
        // A credit reduces what is due: shown negative, and never `-0.00`.
        credits = signed(0i64.saturating_sub_unsigned(t.credits_minor)),
        due = signed(t.amount_due_minor),
        deposits = amount(t.deposits_minor),
        withdrawals = amount(t.withdrawals_minor),
        payouts = amount(t.payouts_minor),
        moved_in = amount(t.moved_in_minor),
        moved_out = amount(t.moved_out_minor),
    )
}

/// Prints the page to PDF with a headless Chromium (`$GPUX_CHROMIUM`, or
/// `chromium` / `chromium-browser` / `google-chrome` on the PATH).
fn print_pdf(page: &Path, pdf: &Path) -> Result<(), Failure> {
    let browser = std::env::var_os("GPUX_CHROMIUM").map(PathBuf::from).or_else(|| {
        ["chromium", "chromium-browser", "google-chrome"].iter().find_map(|name| {
            std::env::var_os("PATH")?.to_str()?.split(':').map(|dir| Path::new(dir).join(name)).find(|path| path.is_file())
        })
    });
    let Some(browser) = browser else {
        return Err(Failure::Usage(format!(
            "--pdf prints through a headless Chromium and none was found (install chromium or set GPUX_CHROMIUM); {} holds the page to print yourself",
            page.display()
        )));
    };
    let page = std::fs::canonicalize(page).map_err(|e| Failure::Usage(format!("{}: {e}", page.display())))?;
    let profile = tempfile::tempdir().map_err(|e| Failure::Usage(format!("a temporary profile: {e}")))?;
    let status = std::process::Command::new(&browser)
        .args(["--headless", "--no-sandbox", "--disable-gpu", "--no-pdf-header-footer"])
        .arg(format!("--user-data-dir={}", profile.path().display()))
        .arg(format!("--print-to-pdf={}", pdf.display()))
        .arg(format!("file://{}", page.display()))
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .status()
        .map_err(|e| Failure::Usage(format!("running {}: {e}", browser.display())))?;
    if !status.success() || !pdf.is_file() {
        return Err(Failure::Usage(format!("{} did not print {} to {}", browser.display(), page.display(), pdf.display())));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use gpux_protocol::invoice::InvoiceTotals;

    fn invoice(credits_minor: u64) -> Invoice {
        Invoice {
            number: "GPUX-3-202611".into(),
            issuer: "gpux exchange".into(),
            account: gpux_engine::AccountId(3),
            parent: None,
            period: "2026-11".into(),
            period_start_ms: 1_793_491_200_000,
            period_end_ms: 1_796_083_200_000,
            currency: "USD".into(),
            minor_per_unit: 1_000_000,
            lines: Vec::new(),
            totals: InvoiceTotals {
                charges_minor: 4_000_000,
                credits_minor,
                amount_due_minor: 4_000_000 - credits_minor as i64,
                deposits_minor: 0,
                withdrawals_minor: 0,
                payouts_minor: 0,
                moved_in_minor: 0,
                moved_out_minor: 0,
            },
            tax: None,
        }
    }

    /// A credit is shown negative, and no credit never as `-$0.00`.
    #[test]
    fn credits_print_negative_and_never_as_negative_zero() {
        let none = render_html(&invoice(0), "sig", "key");
        assert!(none.contains("<tr><td>Credits</td><td class=n>0.00</td></tr>") || none.contains("<td class=n>$0.00</td></tr>"), "{none}");
        assert!(!none.contains("-0.00") && !none.contains("-$0.00"), "{none}");
        let some = render_html(&invoice(400_000), "sig", "key");
        assert!(some.contains("<tr><td>Credits</td><td class=n>-"), "{some}");
        assert!(some.contains("0.40</td></tr>"), "{some}");
    }
}
