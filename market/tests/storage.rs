//! Volumes' storage priced (docs/storage.md "Prices"), against the real
//! market: a volume's size is charged to the millisecond, hourly, at the
//! price in force, from its account's funds to the exchange's fees; what
//! the funds do not cover is the account's debt; an account whose storage
//! stays unpaid has its volumes read-only after the grace and deleted after
//! the notice (told each time), unless its debt is repaid first. Every
//! step journaled as the sequencer journals it; the journal replays to the
//! same state.

use gpux_engine::*;
use gpux_market::volumes::MS_PER_MONTH;
use gpux_market::{Applied, JournalEntry, MarketState};
use gpux_protocol::volumes::limits::{STORAGE_CHARGE_EVERY_MS, STORAGE_GRACE_MS, STORAGE_NOTICE_MS};
use gpux_protocol::{ErrorCode, ServerMessage, VolumeInfo, VolumeMount, VolumeState};
use gpux_settlement::ledger::{LedgerAccount, TransferKind};

const T0: u64 = 1_796_223_600_000;
const HOUR: u64 = STORAGE_CHARGE_EVERY_MS;
/// US$0.07 per GiB-month (a minor unit is a millionth).
const PRICE: u64 = 70_000;

struct Journal {
    market: MarketState,
    entries: Vec<JournalEntry>,
    now_ms: u64,
    /// Every `volume_update` pushed, and to whom.
    told: Vec<(gpux_market::Audience, VolumeInfo)>,
    /// Storage transfers posted: (from, amount).
    storage: Vec<(LedgerAccount, u64)>,
    purged: Vec<gpux_protocol::VolumeId>,
    /// Every transfer posted (what an invoice is built from).
    transfers: Vec<gpux_settlement::ledger::Transfer>,
}

impl Journal {
    fn new() -> Journal {
        let mut journal = Journal {
            market: MarketState::new(EngineConfig::demo()).expect("demo"),
            entries: Vec::new(),
            now_ms: T0,
            told: Vec::new(),
            storage: Vec::new(),
            purged: Vec::new(),
            transfers: Vec::new(),
        };
        journal.engine(Command::OpenAccount { role: Role::Renter });
        journal.record(JournalEntry::StorageRules { at_ms: T0, minor_per_gib_month: PRICE });
        journal
    }

    /// Journals and applies an entry, then each follow-up, as the sequencer does.
    fn record(&mut self, entry: JournalEntry) -> Applied {
        let applied = self.market.apply(&entry).expect("applies");
        self.entries.push(entry);
        for notice in &applied.notices {
            if let ServerMessage::VolumeUpdate { volume } = &notice.message {
                self.told.push((notice.to, (**volume).clone()));
            }
        }
        for transfer in applied.transfers.iter().filter(|t| t.kind == TransferKind::StorageCharge) {
            assert_eq!(transfer.to, LedgerAccount::Fees, "storage pays the exchange");
            self.storage.push((transfer.from, transfer.amount_minor));
        }
        self.purged.extend(applied.volumes_purged.iter().map(|(_, volume)| *volume));
        self.transfers.extend(applied.transfers.iter().copied());
        for command in applied.follow_ups.clone() {
            self.engine(command);
        }
        applied
    }

    fn engine(&mut self, command: Command) -> Applied {
        self.now_ms += 1;
        self.record(JournalEntry::Engine(Input { at_ms: self.now_ms, command }))
    }

    /// Charges storage every hour until `until_ms`, as the sequencer's timer does.
    fn hours_until(&mut self, until_ms: u64) {
        while self.now_ms + HOUR <= until_ms {
            self.now_ms += HOUR;
            if self.market.volumes().charge_due(self.now_ms) {
                self.record(JournalEntry::StorageCharge { at_ms: self.now_ms });
            }
        }
    }

    fn create(&mut self, name: &str, size_gib: u32) -> VolumeInfo {
        self.now_ms += 1;
        let applied = self.record(JournalEntry::CreateVolume { at_ms: self.now_ms, account: RENTER, name: name.into(), size_gib });
        *applied.volume.expect("an answer").expect("created")
    }

    fn deposit(&mut self, amount_minor: u64) {
        self.engine(Command::Deposit { account: RENTER, amount_minor });
    }

    fn balances(&self) -> Balances {
        self.market.engine().balances(RENTER).expect("the renter")
    }

    fn charged(&self) -> u64 {
        self.storage.iter().map(|(_, amount)| amount).sum()
    }

    /// The renter's invoice over everything so far: its `storage` line
    /// (account-wide), after checking it reconciles with the ledger.
    fn invoiced_storage(&self) -> i64 {
        let transfers: Vec<_> = self.transfers.iter().filter(|t| t.involves(RENTER)).copied().collect();
        let header = gpux_settlement::invoice::InvoiceHeader {
            account: RENTER,
            parent: None,
            period: "2026-12".into(),
            period_start_ms: 0,
            period_end_ms: u64::MAX,
            issuer: "test".into(),
            currency: "USD".into(),
            minor_per_unit: 1_000_000,
            tax: None,
        };
        let invoice = gpux_settlement::invoice::build_invoice(header, &transfers, &Default::default());
        assert_eq!(gpux_settlement::invoice::reconcile(&invoice, &transfers), Ok(()), "the invoice reconciles with the ledger");
        let storage: Vec<_> = invoice.lines.iter().filter(|l| l.item == gpux_protocol::InvoiceItem::Storage).collect();
        assert!(storage.len() <= 1 && storage.iter().all(|l| l.lease.is_none()), "one account-wide storage line: {storage:?}");
        storage.iter().map(|l| l.amount_minor).sum()
    }

    fn replays(&self) {
        let mut again = MarketState::new(EngineConfig::demo()).expect("demo");
        for entry in &self.entries {
            again.apply(entry).expect("replays");
        }
        assert_eq!(again.state_hash(), self.market.state_hash(), "the journal replays to the same state");
    }
}

const RENTER: AccountId = AccountId(0);

/// 10 GiB for a 30-day month at US$0.07 per GiB-month is US$0.70 exactly,
/// charged hourly to the fees, on the renter's statement; a second volume
/// deleted after half a day pays its half day, charged at its deletion.
#[test]
fn a_month_of_storage_is_charged_hourly_to_the_millisecond() {
    let mut j = Journal::new();
    j.deposit(10_000_000);
    let start = j.now_ms;
    let data = j.create("data", 10);
    j.hours_until(start + 12 * HOUR);
    let scratch = j.create("scratch", 3);
    j.hours_until(start + 24 * HOUR);
    j.now_ms += 1;
    let applied = j.record(JournalEntry::DeleteVolume { at_ms: j.now_ms, account: RENTER, name: "scratch".into() });
    let deleted = applied.volume.expect("an answer").expect("deleted");
    assert_eq!(deleted.state, VolumeState::Deleted);
    assert_eq!(j.purged, vec![scratch.volume], "its files are to be removed");
    // 3 GiB for about 12 hours (to the millisecond of its creation and deletion).
    let scratch_ms = j.now_ms - scratch.created_at_ms;
    let scratch_due = 3 * PRICE * scratch_ms / MS_PER_MONTH;
    j.hours_until(data.created_at_ms + MS_PER_MONTH + HOUR);
    // The charge at the hour past the month covers it; the month is
    // exact to the minor unit: 10 x 70 000 = 700 000, plus the rest of the
    // hour past it (rounded down on the whole, never per hour).
    let data_ms = j.now_ms - data.created_at_ms;
    let data_due = 10 * PRICE * u128::from(data_ms) as u64 / MS_PER_MONTH;
    assert!((700_000..700_000 + 10 * PRICE * 2 * HOUR / MS_PER_MONTH).contains(&data_due), "{data_due}");
    assert_eq!(j.charged(), data_due + scratch_due, "every hour charged, nothing lost to rounding");
    assert!(j.storage.iter().all(|(from, _)| *from == LedgerAccount::Available(RENTER)), "paid from its funds");
    assert_eq!(j.balances().available_minor, 10_000_000 - data_due - scratch_due);
    assert_eq!(j.market.volumes().named(RENTER, "data").expect("data").charged_minor, data_due);
    assert!(j.told.is_empty(), "a paid account is not pestered");
    assert_eq!(j.invoiced_storage(), (data_due + scratch_due) as i64, "the invoice's storage line is what was charged");
    j.replays();
}

/// An account whose storage its funds no longer cover: the rest becomes its
/// debt and its grace starts (the owner told the dates); after the grace
/// a read-write mount is refused `volume_unpaid` (read-only still mounts);
/// a deposit that repays the debt makes it writable again; unpaid again and
/// past the grace and the notice, its volume is deleted (told, files purged).
#[test]
fn unpaid_storage_turns_read_only_after_the_grace_and_is_deleted_after_the_notice() {
    let mut j = Journal::new();
    // Funds for about a week of 100 GiB (70 000 x 100 / 30 a day).
    j.deposit(1_600_000);
    let start = j.now_ms;
    let big = j.create("big", 100);
    j.hours_until(start + 8 * 24 * HOUR);
    let unpaid_since = j.market.volumes().named(RENTER, "big").expect("big").unpaid_since_ms.expect("unpaid by now");
    assert!(j.storage.iter().any(|(from, _)| *from == LedgerAccount::Debt(RENTER)), "the rest is its debt");
    assert!(j.balances().debt_minor > 0 && j.balances().available_minor == 0);
    let (to, told) = j.told.first().cloned().expect("the owner is told");
    assert_eq!(to, gpux_market::Audience::account(RENTER));
    assert_eq!(told.read_only_from_ms, Some(unpaid_since + STORAGE_GRACE_MS));
    assert_eq!(told.delete_from_ms, Some(unpaid_since + STORAGE_GRACE_MS + STORAGE_NOTICE_MS));

    let write = [VolumeMount { volume: "big".into(), mount: "/data".into(), read_only: false }];
    let read = [VolumeMount { volume: "big".into(), mount: "/data".into(), read_only: true }];
    assert_eq!(j.market.volumes().check_mounts(RENTER, &write, unpaid_since + STORAGE_GRACE_MS - 1), Ok(()), "writable in the grace");
    j.hours_until(unpaid_since + STORAGE_GRACE_MS + HOUR);
    assert_eq!(j.market.volumes().check_mounts(RENTER, &write, j.now_ms), Err(ErrorCode::VolumeUnpaid));
    assert_eq!(j.market.volumes().check_mounts(RENTER, &read, j.now_ms), Ok(()), "a copy still mounts");

    // A deposit repays the debt: writable again, the owner told.
    let told_before = j.told.len();
    j.deposit(50_000_000);
    assert_eq!(j.balances().debt_minor, 0);
    assert_eq!(j.market.volumes().check_mounts(RENTER, &write, j.now_ms), Ok(()));
    assert!(j.told[told_before..].iter().any(|(_, v)| v.unpaid_since_ms.is_none()), "told it is paid up");

    // Unpaid again, and left so: deleted after the grace and the notice.
    j.engine(Command::Withdraw { account: RENTER, amount_minor: j.balances().available_minor });
    let again = j.now_ms;
    j.hours_until(again + 2 * HOUR);
    let since = j.market.volumes().named(RENTER, "big").expect("big").unpaid_since_ms.expect("unpaid again");
    j.hours_until(since + STORAGE_GRACE_MS + STORAGE_NOTICE_MS - HOUR);
    assert!(j.market.volumes().named(RENTER, "big").is_some(), "kept until the notice is over");
    j.hours_until(since + STORAGE_GRACE_MS + STORAGE_NOTICE_MS + 2 * HOUR);
    assert!(j.market.volumes().named(RENTER, "big").is_none(), "deleted");
    assert_eq!(j.purged, vec![big.volume], "its files are removed");
    let (_, last) = j.told.last().cloned().expect("told");
    assert_eq!((last.name.as_str(), last.state), ("big", VolumeState::Deleted), "the owner is told of the deletion");
    // Its storage was charged to the end; nothing more accrues.
    let charged = j.charged();
    j.hours_until(j.now_ms + 5 * HOUR);
    assert_eq!(j.charged(), charged);
    // The invoice's storage line holds all of it, the part that became debt included.
    assert_eq!(j.invoiced_storage(), charged as i64);
    j.replays();
}
