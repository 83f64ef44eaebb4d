//! Invoices against the real binary (docs/protocol.md "Invoices"): a renter
//! rents from a supplier in one month, usage is billed, the exchange
//! restarts in the next month, and both ask for last month's invoice. Each
//! verifies with the exchange's published key and its totals equal, to the
//! minor unit, what the account's own statement says for the month.

mod common;

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use common::*;
use gpux_engine::*;
use gpux_protocol::*;

fn now_ms() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).expect("clock").as_millis() as u64
}

async fn invoice(client: &mut Client, period: &str, account: Option<AccountId>) -> Result<(Invoice, String, String), ErrorCode> {
    let mut lines = Vec::new();
    let mut offset = 0;
    loop {
        let id = client.id();
        match client.request(ClientMessage::Invoice { id, period: period.into(), account, offset }).await {
            ServerMessage::Invoice { invoice, line_count, next_offset, signature, exchange_key, .. } => {
                lines.extend(invoice.lines.iter().cloned());
                match next_offset {
                    Some(next) => offset = next,
                    None => {
                        assert_eq!(lines.len(), line_count as usize);
                        let mut whole = *invoice;
                        whole.lines = lines;
                        return Ok((whole, signature, exchange_key));
                    }
                }
            }
            ServerMessage::Error { code, .. } => return Err(code),
            other => panic!("{other:?}"),
        }
    }
}

async fn statement(client: &mut Client) -> Vec<StatementLine> {
    let mut lines = Vec::new();
    let mut after = None;
    loop {
        let id = client.id();
        let ServerMessage::Statement { lines: page, next_after, .. } = client.request(ClientMessage::Statement { id, after }).await else {
            panic!("a statement")
        };
        lines.extend(page);
        match next_after {
            Some(next) => after = Some(next),
            None => return lines,
        }
    }
}

/// The account's worth (available + held + payable - debt) change in
/// `[start, end)`, from its own statement's labels.
fn worth_change(lines: &[StatementLine], account: AccountId, (start, end): (u64, u64)) -> i128 {
    let mine = |label: &str| ["available", "held", "payable", "debt"].iter().any(|kind| label == format!("{kind}:{account}"));
    lines
        .iter()
        .filter(|l| l.at_ms >= start && l.at_ms < end)
        .map(|l| (i128::from(mine(&l.to)) - i128::from(mine(&l.from))) * l.amount_minor as i128)
        .sum()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn last_months_invoices_verify_and_equal_the_ledger() {
    let dir = tempfile::tempdir().expect("temp dir");
    let exchange = Exchange::start_with(
        dir.path(),
        Some(&key(1)),
        &["--tax-name", "VAT", "--tax-rate-bps", "2000", "--tax-registration", "GB123456789"],
    );
    let (mut operator, _) = Client::login(&exchange.addr, &key(1), Role::Operator).await;
    let (mut renter, renter_account) = Client::login(&exchange.addr, &key(3), Role::Renter).await;
    let (mut supplier, supplier_account) = Client::login(&exchange.addr, &key(2), Role::Supplier).await;
    let id = operator.id();
    assert!(matches!(
        operator.request(ClientMessage::Deposit { id, account: renter_account, amount_minor: 100_000_000 }).await,
        ServerMessage::Ack { .. }
    ));
    let id = supplier.id();
    let register = ClientMessage::RegisterGpu {
        id,
        host: "inv-host".into(),
        gpu_uuid: "GPU-inv".into(),
        spec: h100_spec(),
        region: None,
        zone: None,
        fabric: None,
    };
    assert!(matches!(supplier.request(register).await, ServerMessage::Ack { .. }));
    let mut ask = ticket(1, Side::Sell, 2_000_000, 1);
    ask.supply = Some(GpuSet { host: HostId(0), gpu_mask: 1 });
    assert!(matches!(supplier.place(ask).await, ServerMessage::Ack { .. }));
    let mut bid = ticket(2, Side::Buy, 2_500_000, 1);
    bid.duration = LeaseDuration::Hours(2);
    assert!(matches!(renter.place(bid).await, ServerMessage::Ack { .. }));
    let (lease, start_ms) = renter
        .recv_until(|m| match m {
            ServerMessage::Private { event: Event { kind: EventKind::LeaseCreated { lease, start_ms, .. }, .. }, .. } => {
                Some((*lease, *start_ms))
            }
            _ => None,
        })
        .await;
    tokio::time::sleep(Duration::from_millis(1_500)).await;
    let end_ms = (start_ms + 1_400).min(now_ms());
    let body = UsageBody {
        lease,
        gpu_uuid: "GPU-inv".into(),
        seq: 1,
        start_ms,
        end_ms,
        available_ms: end_ms - start_ms,
        utilisation_percent: 90,
        memory_used_mib_max: 1_000,
        unhealthy_samples: 0,
        prev_hash: genesis_hash(),
        readings: None,
    };
    let id = supplier.id();
    let report = ClientMessage::UsageReport { id, report: UsageReport::sign(body, &key(2)) };
    let ServerMessage::UsageAccepted { charged_minor, .. } = supplier.request(report).await else { panic!("the report is billed") };
    assert!(charged_minor > 0);
    let id = renter.id();
    assert!(matches!(renter.request(ClientMessage::EndLease { id, lease }).await, ServerMessage::Ack { .. }));
    // A sub-account the renter funds this month: its own invoice, for the parent.
    let id = renter.id();
    let ServerMessage::SubAccountOpened { account: sub, .. } = renter.request(ClientMessage::OpenSubAccount { id }).await else {
        panic!("a sub-account")
    };
    let id = renter.id();
    let moved = renter.request(ClientMessage::MoveFunds { id, sub_account: sub, amount_minor: 10_000_000, to_sub_account: true }).await;
    assert!(matches!(moved, ServerMessage::Ack { .. }), "{moved:?}");
    let this_month = gpux_engine::time::format_month(now_ms());
    let bounds = gpux_engine::time::month_bounds_ms(&this_month).expect("a month");
    assert_eq!(invoice(&mut renter, &this_month, None).await.err(), Some(ErrorCode::PeriodInvalid), "the month has not ended");

    // Next month: the same journal, the clock an hour past the month's end.
    let addr = exchange.addr.clone();
    drop((operator, renter, supplier));
    let mut exchange = exchange;
    exchange.terminate();
    let offset = (bounds.1 + 3_600_000 - now_ms()).to_string();
    let restarted = Exchange::start_on(
        dir.path(),
        Some(&key(1)),
        &addr,
        &["--clock-offset-ms", &offset, "--tax-name", "VAT", "--tax-rate-bps", "2000", "--tax-registration", "GB123456789"],
    );
    let (mut renter, _) = Client::login(&restarted.addr, &key(3), Role::Renter).await;
    let (mut supplier, _) = Client::login(&restarted.addr, &key(2), Role::Supplier).await;
    let mut anonymous = Client::connect(&restarted.addr).await;
    let id = anonymous.id();
    let ServerMessage::ExchangeKey { public_key, .. } = anonymous.request(ClientMessage::ExchangeKey { id }).await else {
        panic!("the exchange key is public")
    };

    for (client, account) in [(&mut renter, renter_account), (&mut supplier, supplier_account)] {
        let (invoice, signature, key) = invoice(client, &this_month, None).await.expect("last month's invoice");
        assert_eq!(key, public_key, "signed by the published key");
        assert!(invoice.verify(&signature, &public_key), "the signature verifies");
        let mut forged = invoice.clone();
        forged.totals.amount_due_minor += 1;
        assert!(!forged.verify(&signature, &public_key), "a changed invoice does not");
        assert_eq!(invoice.number, format!("GPUX-{account}-{}", this_month.replace('-', "")));
        assert_eq!((invoice.period_start_ms, invoice.period_end_ms), bounds);
        let lines = statement(client).await;
        let t = invoice.totals;
        let expected = t.deposits_minor as i128 - t.withdrawals_minor as i128 - t.payouts_minor as i128 + t.moved_in_minor as i128
            - t.moved_out_minor as i128
            - t.amount_due_minor as i128;
        assert_eq!(worth_change(&lines, account, bounds), expected, "the invoice is the ledger's month for {account}");
        let tax = invoice.tax.clone().expect("the configured tax");
        assert_eq!((tax.name.as_str(), tax.rate_bps, tax.registration.as_str()), ("VAT", 2_000, "GB123456789"));
        assert_eq!(tax.included_minor, (t.amount_due_minor.max(0) as u64) * 2_000 / 12_000);
        let usage: i64 = invoice.lines.iter().filter(|l| l.item == InvoiceItem::Usage).map(|l| l.amount_minor).sum();
        let earned: i64 = invoice.lines.iter().filter(|l| l.item == InvoiceItem::Earnings).map(|l| l.amount_minor).sum();
        let fee: i64 = invoice.lines.iter().filter(|l| l.item == InvoiceItem::Fee).map(|l| l.amount_minor).sum();
        let to_fees: u64 = lines.iter().filter(|l| l.to == "fees" && l.at_ms < bounds.1).map(|l| l.amount_minor).sum();
        if account == renter_account {
            assert_eq!((usage, earned, t.deposits_minor), (charged_minor as i64, 0, 100_000_000), "{invoice:?}");
            let line = invoice.lines.iter().find(|l| l.item == InvoiceItem::Usage).expect("the lease's line");
            assert_eq!(
                (line.lease, line.instrument.as_str(), line.price_minor_per_gpu_hour),
                (Some(lease), "H100-SXM-80G/SPOT", Some(2_000_000))
            );
        } else {
            assert_eq!((usage, earned, fee), (0, -(charged_minor as i64), to_fees as i64), "{invoice:?}");
        }
    }
    let (sub_invoice, signature, _) = invoice(&mut renter, &this_month, Some(sub)).await.expect("the sub-account's invoice");
    assert!(sub_invoice.verify(&signature, &public_key));
    assert_eq!((sub_invoice.account, sub_invoice.parent), (sub, Some(renter_account)));
    assert_eq!((sub_invoice.totals.moved_in_minor, sub_invoice.totals.amount_due_minor), (10_000_000, 0));
    let (parent_invoice, _, _) = invoice(&mut renter, &this_month, None).await.expect("the parent's");
    assert_eq!(parent_invoice.totals.moved_out_minor, 10_000_000, "the parent's side of the move");
    let next_month = gpux_engine::time::format_month(bounds.1);
    for period in [next_month.as_str(), "2026-13", "november"] {
        assert_eq!(invoice(&mut renter, period, None).await.err(), Some(ErrorCode::PeriodInvalid), "{period}");
    }
    assert_eq!(invoice(&mut renter, &this_month, Some(supplier_account)).await.err(), Some(ErrorCode::NotYourSubAccount));
}
