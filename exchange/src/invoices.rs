//! Invoices are built off the sequencer's thread (docs/market-rules.md
//! "Invoices"): a month of an account's transfers may be many thousands of
//! rows, and the market must not wait for them. The sequencer checks the
//! request (scope, account, a closed month), hands this worker the job with
//! the account's leases still in the hot state, and goes on; the worker
//! reads the period's transfers and archived leases through the journal's
//! shared reader (committed data only), builds the invoice with
//! `gpux_settlement::invoice`, signs it with the exchange's key and sends
//! the page asked for straight to the connection.

use std::collections::HashMap;
use std::sync::Arc;

use crossbeam_channel::{Receiver, Sender, TrySendError};
use ed25519_dalek::SigningKey;
use gpux_engine::AccountId;
use gpux_gateway::link::{Outbound, Outgoing, SharedFrame};
use gpux_journal::JournalRead;
use gpux_protocol::invoice::INVOICE_LINES_PAGE_MAX;
use gpux_protocol::{ErrorCode, Invoice, ServerMessage};
use gpux_settlement::invoice::{build_invoice, reconcile, InvoiceHeader, LeaseRecords};

use crate::limits::CACHED_MAX;
pub use crate::limits::{INVOICE_QUEUE_MAX, INVOICE_QUEUE_PER_PARTICIPANT_MAX};

/// What the operator's configuration puts on every invoice.
#[derive(Clone, Debug)]
pub struct InvoiceSettings {
    /// Name and address of the operator (`--invoice-issuer`).
    pub issuer: String,
    /// `(name, rate in basis points, registration)` of the tax included in
    /// prices (`--tax-name`, `--tax-rate-bps`, `--tax-registration`).
    pub tax: Option<(String, u32, String)>,
    /// The exchange's currency (the listing's; fixed at genesis).
    pub currency: gpux_engine::Currency,
}

impl Default for InvoiceSettings {
    fn default() -> Self {
        InvoiceSettings { issuer: "gpux exchange".into(), tax: None, currency: gpux_engine::Currency::usd_micro() }
    }
}

/// One invoice page to build and send.
pub struct InvoiceWork {
    pub outbound: Outbound,
    pub id: u64,
    pub account: AccountId,
    pub parent: Option<AccountId>,
    pub period: String,
    pub bounds: (u64, u64),
    pub offset: u32,
    /// The account's leases still in the market's hot state, with symbols.
    pub hot_leases: LeaseRecords,
    /// A job's bill: only the transfers of these leases (never cached: a
    /// running job's bill grows).
    pub only_leases: Option<std::collections::BTreeSet<gpux_engine::LeaseId>>,
}

/// Invoice jobs queued or being built, per participant (an account, or
/// the parent of a sub-account): each holds at most
/// `INVOICE_QUEUE_PER_PARTICIPANT_MAX` of the queue.
#[derive(Clone, Default)]
struct Shares(Arc<std::sync::Mutex<HashMap<AccountId, usize>>>);

impl Shares {
    /// Takes one of `who`'s places; `false` when it holds all of its share.
    fn take(&self, who: AccountId) -> bool {
        let mut held = self.0.lock().unwrap_or_else(|p| p.into_inner());
        let count = held.entry(who).or_default();
        if *count >= INVOICE_QUEUE_PER_PARTICIPANT_MAX {
            return false;
        }
        *count += 1;
        true
    }

    /// Gives one of `who`'s places back.
    fn give(&self, who: AccountId) {
        let mut held = self.0.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(count) = held.get_mut(&who) {
            *count -= 1;
            if *count == 0 {
                held.remove(&who);
            }
        }
    }
}

/// The sequencer's handle on the worker.
pub struct InvoiceDesk {
    jobs: Sender<InvoiceWork>,
    shares: Shares,
    pub public_key: String,
}

impl InvoiceDesk {
    /// Starts the worker thread. It ends once the desk is dropped; join it
    /// then, so that its handle on the journal's database is gone before
    /// the process exits (redb marks a file cleanly closed only when the
    /// last handle drops; otherwise the next open must repair it).
    pub fn start(
        reader: Arc<dyn JournalRead>,
        key: SigningKey,
        settings: InvoiceSettings,
    ) -> std::io::Result<(InvoiceDesk, std::thread::JoinHandle<()>)> {
        let (jobs, inbox) = crossbeam_channel::bounded(INVOICE_QUEUE_MAX);
        let public_key = hex::encode(key.verifying_key().to_bytes());
        let shares = Shares::default();
        let held = shares.clone();
        let worker = std::thread::Builder::new().name("invoices".into()).spawn(move || work(inbox, reader, key, settings, held))?;
        Ok((InvoiceDesk { jobs, shares, public_key }, worker))
    }

    /// Queues a job; `false` when the worker is saturated or gone, or the
    /// job's participant holds its whole share of the queue.
    pub fn submit(&self, job: InvoiceWork) -> bool {
        let who = job.parent.unwrap_or(job.account);
        if !self.shares.take(who) {
            return false;
        }
        let queued = !matches!(self.jobs.try_send(job), Err(TrySendError::Full(_) | TrySendError::Disconnected(_)));
        if !queued {
            self.shares.give(who);
        }
        queued
    }
}

fn work(inbox: Receiver<InvoiceWork>, reader: Arc<dyn JournalRead>, key: SigningKey, settings: InvoiceSettings, shares: Shares) {
    let public_key = hex::encode(key.verifying_key().to_bytes());
    let mut built: HashMap<(AccountId, String), (Arc<Invoice>, String)> = HashMap::new();
    for job in inbox {
        let _place = Place(&shares, job.parent.unwrap_or(job.account));
        let cached = built.get(&(job.account, job.period.clone())).filter(|_| job.only_leases.is_none()).cloned();
        let made = match cached {
            Some(made) => Ok(made),
            None => build(&*reader, &key, &settings, &job).map(|(invoice, signature)| (Arc::new(invoice), signature)),
        };
        let message = match made {
            Ok((invoice, signature)) => {
                if built.len() >= CACHED_MAX {
                    built.clear();
                }
                if job.only_leases.is_none() {
                    built.insert((job.account, job.period.clone()), (invoice.clone(), signature.clone()));
                }
                page(job.id, &invoice, job.offset, signature, public_key.clone())
            }
            Err(error) => {
                tracing::error!(account = %job.account, period = %job.period, error = %format!("{error:#}"), "invoice not built");
                let code = ErrorCode::InvoiceUnavailable;
                ServerMessage::Error { id: Some(job.id), code, message: code.message().to_string() }
            }
        };
        // A connection that cannot take the answer is closed, as for any
        // answer the sequencer sends.
        if job.outbound.frames.try_send(Outgoing::Frame(SharedFrame::new(message))).is_err() {
            job.outbound.too_slow.notify_one();
        }
    }
}

/// A job's place in its participant's share, given back once it is answered.
struct Place<'a>(&'a Shares, AccountId);

impl Drop for Place<'_> {
    fn drop(&mut self) {
        self.0.give(self.1);
    }
}

fn build(reader: &dyn JournalRead, key: &SigningKey, settings: &InvoiceSettings, job: &InvoiceWork) -> anyhow::Result<(Invoice, String)> {
    let (start, end) = job.bounds;
    let mut transfers = reader.account_transfers(job.account, start, end)?;
    if let Some(only) = &job.only_leases {
        transfers.retain(|t| t.lease.is_some_and(|lease| only.contains(&lease)));
    }
    let mut leases = LeaseRecords::new();
    for lease in transfers.iter().filter_map(|t| t.lease) {
        if leases.contains_key(&lease) {
            continue;
        }
        let record = match job.hot_leases.get(&lease) {
            Some(record) => Some(record.clone()),
            None => reader.archived_lease_info(lease)?,
        };
        if let Some(record) = record {
            leases.insert(lease, record);
        }
    }
    let header = InvoiceHeader {
        account: job.account,
        parent: job.parent,
        period: job.period.clone(),
        period_start_ms: start,
        period_end_ms: end,
        issuer: settings.issuer.clone(),
        currency: settings.currency.code.clone(),
        minor_per_unit: 10u64.pow(settings.currency.decimals as u32),
        tax: settings.tax.clone(),
    };
    let invoice = build_invoice(header, &transfers, &leases);
    if let Err((change, expected)) = reconcile(&invoice, &transfers) {
        anyhow::bail!("invoice does not reconcile with the ledger: worth changed {change}, the invoice says {expected}");
    }
    let signature = invoice.sign(key);
    Ok((invoice, signature))
}

/// The answer for one page: the invoice with `lines[offset..]` up to a page.
fn page(id: u64, invoice: &Invoice, offset: u32, signature: String, exchange_key: String) -> ServerMessage {
    let total = invoice.lines.len();
    let start = (offset as usize).min(total);
    let end = (start + INVOICE_LINES_PAGE_MAX).min(total);
    let mut lines = invoice.lines[start..end].to_vec();
    gpux_protocol::fit_page(&mut lines);
    let end = start + lines.len();
    let mut shown = invoice.clone();
    shown.lines = lines;
    ServerMessage::Invoice {
        id,
        invoice: Box::new(shown),
        line_count: total as u32,
        next_offset: (end < total).then_some(end as u32),
        signature,
        exchange_key,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use gpux_engine::{LeaseId, LeaseInfo};
    use gpux_settlement::ledger::Transfer;

    /// One participant's burst holds its share of the invoice queue, never
    /// the whole of it: another's request still finds a place, and each
    /// answered job gives its place back.
    #[test]
    fn each_participant_holds_its_share_of_the_queue() {
        let shares = Shares::default();
        let (burst, victim) = (AccountId(7), AccountId(8));
        for _ in 0..INVOICE_QUEUE_PER_PARTICIPANT_MAX {
            assert!(shares.take(burst));
        }
        assert!(!shares.take(burst), "its share is full");
        assert!(shares.take(victim), "another participant's request is queued");
        drop(Place(&shares, burst));
        assert!(shares.take(burst), "an answered job gives its place back");
    }

    /// A journal whose reads fail, as a broken disk's would.
    struct Broken;

    impl JournalRead for Broken {
        fn account_transfers(&self, _: AccountId, _: u64, _: u64) -> gpux_journal::Result<Vec<Transfer>> {
            Err(gpux_journal::JournalError::Injected { op: gpux_journal::Op::AccountTransfers })
        }
        fn archived_lease_info(&self, _: LeaseId) -> gpux_journal::Result<Option<(LeaseInfo, String)>> {
            Err(gpux_journal::JournalError::Injected { op: gpux_journal::Op::ArchivedLease })
        }
        fn entries_range(&self, _: u64, _: usize) -> gpux_journal::Result<Vec<gpux_market::JournalEntry>> {
            Err(gpux_journal::JournalError::Injected { op: gpux_journal::Op::Entries })
        }
    }

    fn job(outbound: Outbound, offset: u32) -> InvoiceWork {
        InvoiceWork {
            outbound,
            id: 7,
            account: AccountId(1),
            parent: None,
            period: "2026-11".into(),
            bounds: (0, 1),
            offset,
            hot_leases: LeaseRecords::new(),
            only_leases: None,
        }
    }

    fn outbound() -> (Outbound, tokio::sync::mpsc::Receiver<Outgoing>) {
        let (frames, receiver) = tokio::sync::mpsc::channel(4);
        (Outbound::local(frames, Arc::new(tokio::sync::Notify::new())), receiver)
    }

    fn answer(receiver: &mut tokio::sync::mpsc::Receiver<Outgoing>) -> ServerMessage {
        for _ in 0..500 {
            if let Ok(Outgoing::Frame(frame)) = receiver.try_recv() {
                return frame.message().clone();
            }
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        panic!("no answer from the worker")
    }

    #[test]
    fn an_invoice_the_journal_cannot_give_is_invoice_unavailable() {
        let (desk, _) = InvoiceDesk::start(Arc::new(Broken), SigningKey::from_bytes(&[3; 32]), InvoiceSettings::default()).expect("starts");
        let (outbound, mut receiver) = outbound();
        assert!(desk.submit(job(outbound, 0)));
        let message = answer(&mut receiver);
        assert!(matches!(message, ServerMessage::Error { id: Some(7), code: ErrorCode::InvoiceUnavailable, .. }), "{message:?}");
    }

    #[test]
    fn pages_split_the_lines_and_carry_the_whole_invoices_signature() {
        let line = gpux_protocol::InvoiceLine {
            lease: Some(LeaseId(1)),
            instrument: "H100-SXM-80G/SPOT".into(),
            item: gpux_protocol::InvoiceItem::Usage,
            price_minor_per_gpu_hour: Some(2_000_000),
            verified_gpu_ms: None,
            amount_minor: 5,
        };
        let header = gpux_settlement::invoice::InvoiceHeader {
            account: AccountId(1),
            parent: None,
            period: "2026-11".into(),
            period_start_ms: 0,
            period_end_ms: 1,
            issuer: "x".into(),
            currency: "USD".into(),
            minor_per_unit: 1_000_000,
            tax: None,
        };
        let mut invoice = build_invoice(header, &[], &LeaseRecords::new());
        invoice.lines = vec![line; 450];
        let key = SigningKey::from_bytes(&[4; 32]);
        let signature = invoice.sign(&key);
        let mut lines = Vec::new();
        let mut offset = Some(0);
        while let Some(at) = offset {
            let ServerMessage::Invoice { invoice: page, line_count, next_offset, signature: signed, .. } =
                page(1, &invoice, at, signature.clone(), String::new())
            else {
                panic!("a page")
            };
            assert_eq!((line_count, signed.as_str()), (450, signature.as_str()));
            assert!(page.lines.len() <= INVOICE_LINES_PAGE_MAX);
            lines.extend(page.lines);
            offset = next_offset;
        }
        let mut whole = invoice.clone();
        whole.lines = lines;
        assert!(whole.verify(&signature, &hex::encode(key.verifying_key().to_bytes())), "the pages rebuild the signed invoice");
    }
}
