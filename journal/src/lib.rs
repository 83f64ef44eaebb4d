//! The durable journal: every accepted input, in sequence, in a redb table.
//!
//! An entry is acknowledged to anyone only after the transaction holding it
//! committed with `Durability::Immediate` (fsync). Appends are batched: the
//! sequencer hands over everything that arrived while the previous commit
//! was in flight, so one fsync covers many commands (group commit). redb's
//! commits are atomic, so a crash mid-commit (a torn write) leaves the
//! journal at the previous commit and the restart replays that.

pub mod archive;
mod error;
pub mod faults;
use std::path::Path;

use error::{corrupt, missing};
pub use error::{During, JournalError, Op, Result};

pub use archive::{ArchiveError, ArchiveOutcome};

/// The journal's storage format: how its entries, transfers and indexes
/// are encoded. Recorded in the file (`journal_meta`, `format_version`) as
/// a build opens it; a file with none was written before 2026-12-06, in
/// format 1. A build refuses a journal of a newer format than its own
/// ([`FormatError::Newer`]) instead of misreading or appending to it; a
/// change of encoding bumps this and decodes older formats by an upcast
/// (test `system-tests/tests/old_journals.rs` replays a file an older
/// build wrote).
pub const FORMAT_VERSION: u64 = 1;

/// A journal file this build cannot use as it is.
#[derive(Debug, thiserror::Error)]
pub enum FormatError {
    #[error(
        "the journal was written in format {found} by a newer gpux (this build reads formats up to {supported}): run the newer build, or restore a backup taken before the upgrade"
    )]
    Newer { found: u64, supported: u64 },
}

use gpux_engine::{AccountId, ContractId, ContractInfo, InstrumentId, InstrumentInfo, LeaseId, LeaseInfo};
pub use gpux_market::JournalEntry;
use gpux_market::{Archived, ArchivedLease, LeaseDelivery};
use gpux_protocol::history::{Candle, CandleInterval, CandleRecord, Fill, FillCursor, TradeRecord};
use gpux_protocol::{decode_record, encode_record};
use gpux_settlement::ledger::{Transfer, TransferKind};
use redb::{Database, Durability, ReadableDatabase, ReadableTable, ReadableTableMetadata, TableDefinition};

const JOURNAL: TableDefinition<u64, &[u8]> = TableDefinition::new("journal");
/// The ledger's transfers, by transfer id, written in the same commit as
/// the journal entries they follow from (so statements are durable too).
const TRANSFERS: TableDefinition<u64, &[u8]> = TableDefinition::new("transfers");
/// Leases archived out of the market's hot state, by lease id, written in
/// the commit of the entry that archived them. A replay derives the same
/// archive from the entries; this table is what queries read.
const ARCHIVED_LEASES: TableDefinition<u64, &[u8]> = TableDefinition::new("archived_leases");
/// Archived leases by account: `(account, lease)` for the renter and the
/// supplier, so an account's page is a range read, not a scan.
const ARCHIVED_LEASES_BY_ACCOUNT: TableDefinition<(u32, u64), ()> = TableDefinition::new("archived_leases_by_account");
/// The delivery record (workload as sealed, last status) of an archived
/// lease that had one, by lease id.
const ARCHIVED_DELIVERIES: TableDefinition<u64, &[u8]> = TableDefinition::new("archived_deliveries");
/// Contracts of expired reserved windows, by contract id, as they ended.
const ARCHIVED_CONTRACTS: TableDefinition<u64, &[u8]> = TableDefinition::new("archived_contracts");
/// Reserved windows retired from the hot state, by instrument id, as listed.
const ARCHIVED_INSTRUMENTS: TableDefinition<u32, &[u8]> = TableDefinition::new("archived_instruments");
/// The instrument symbol of each archived lease, by lease id (leases
/// archived before it existed have none).
const ARCHIVED_LEASE_SYMBOLS: TableDefinition<u64, &str> = TableDefinition::new("archived_lease_symbols");
/// Every participant's transfers by time: `(account, at_ms, transfer id)`
/// for each participant a transfer involves, with its kind
/// (`TransferKind` as u8), written in the transfers' commit. Statements and
/// invoices are range reads of one account's period, not scans.
const ACCOUNT_TRANSFERS: TableDefinition<(u32, u64, u64), u8> = TableDefinition::new("account_transfers");
/// Every trade as printed, by `(instrument, seq)` (docs/protocol.md
/// "History"), written in the commit of the entry that printed it.
const TRADES: TableDefinition<(u32, u64), &[u8]> = TableDefinition::new("trades");
/// Each party's fills: `(account, at_ms, instrument, seq)` -> its side (0
/// buy, 1 sell); the trade itself is in [`TRADES`].
const ACCOUNT_FILLS: TableDefinition<(u32, u64, u32, u64), u8> = TableDefinition::new("account_fills");
/// Price candles: `(instrument, interval ms, start ms)` -> [`CandleRecord`],
/// updated in the trades' commit (adding a trade twice counts it once).
const CANDLES: TableDefinition<(u32, u64, u64), &[u8]> = TableDefinition::new("candles");

pub struct Journal {
    db: std::sync::Arc<Database>,
    next_seq: u64,
    /// Every how many commits one is made durable (1: every one; see
    /// [`Journal::durable_every`]), and commits since the last durable one.
    durable_every: u32,
    since_durable: u32,
}

impl Journal {
    /// Opens (or creates) the journal.
    pub fn open(path: &Path) -> Result<Journal> {
        let db = Database::create(path).map_err(|e| JournalError::Open { path: path.to_path_buf(), source: Box::new(e.into()) })?;
        Self::from_db(db)
    }

    /// Opens the journal on a storage backend of the caller's (tests inject
    /// faults with [`faults::FaultyBackend`]).
    pub fn open_with_backend(backend: impl redb::StorageBackend) -> Result<Journal> {
        let db = redb::Builder::new()
            .create_with_backend(backend)
            .map_err(|e| JournalError::Open { path: "(its backend)".into(), source: Box::new(e.into()) })?;
        Self::from_db(db)
    }

    fn from_db(db: Database) -> Result<Journal> {
        let setup = db.begin_write()?;
        setup.open_table(JOURNAL)?;
        {
            let mut meta = setup.open_table(archive::JOURNAL_META)?;
            match archive::read_u64(&meta, archive::FORMAT)? {
                Some(found) if found > FORMAT_VERSION => return Err(FormatError::Newer { found, supported: FORMAT_VERSION }.into()),
                Some(_) => {}
                // New, or written before the version was recorded (format 1).
                None => {
                    meta.insert(archive::FORMAT, FORMAT_VERSION.to_le_bytes().as_slice())?;
                }
            }
        }
        setup.open_table(TRANSFERS)?;
        {
            let archive = setup.open_table(ARCHIVED_LEASES)?;
            let mut by_account = setup.open_table(ARCHIVED_LEASES_BY_ACCOUNT)?;
            // A journal written before the index existed: build it once.
            if by_account.is_empty()? {
                for row in archive.iter()? {
                    let (key, bytes) = row?;
                    let lease: LeaseInfo =
                        decode_record(bytes.value()).map_err(|e| corrupt(format!("archived lease {}", key.value()), e))?;
                    index_archived_lease(&mut by_account, &lease)?;
                }
            }
        }
        setup.open_table(ARCHIVED_DELIVERIES)?;
        setup.open_table(ARCHIVED_LEASE_SYMBOLS)?;
        setup.open_table(ARCHIVED_CONTRACTS)?;
        setup.open_table(ARCHIVED_INSTRUMENTS)?;
        setup.open_table(TRADES)?;
        setup.open_table(ACCOUNT_FILLS)?;
        setup.open_table(CANDLES)?;
        {
            let transfers = setup.open_table(TRANSFERS)?;
            let mut by_account = setup.open_table(ACCOUNT_TRANSFERS)?;
            // A journal written before the index existed: build it once
            // (those transfers' kinds are unknown: `unclassified`).
            if by_account.is_empty()? && !transfers.is_empty()? {
                for row in transfers.iter()? {
                    let (key, bytes) = row?;
                    let transfer: Transfer = decode_record(bytes.value()).map_err(|e| corrupt(format!("transfer {}", key.value()), e))?;
                    index_transfer(&mut by_account, &transfer)?;
                }
            }
        }
        setup.commit()?;
        let next_seq = {
            let read = db.begin_read()?;
            let table = read.open_table(JOURNAL)?;
            let last = table.last()?.map(|(seq, _)| seq.value());
            // Every entry archived: the journal goes on after them.
            last.map_or(archive::first_seq(&read)?, |seq| seq + 1)
        };
        Ok(Journal { db: std::sync::Arc::new(db), next_seq, durable_every: 1, since_durable: 0 })
    }

    /// Every entry after `seq`, in order; a gap is an error.
    pub fn entries_after(&self, seq: u64) -> Result<Vec<JournalEntry>> {
        entries_after(&self.db.begin_read()?, seq)
    }

    /// Appends `entries` in one durable commit; returns the sequence number
    /// of the first. An error here is fatal to the exchange.
    pub fn append(&mut self, entries: &[JournalEntry]) -> Result<u64> {
        self.append_with_transfers(entries, &[], &Archived::default())
    }

    /// Makes only every `commits`-th commit durable (and those [`sync`]
    /// asks): for a journal that is a copy of a durable log (a cluster
    /// node's, whose Raft log on a majority's disks is what an
    /// acknowledgement waits for), which the log rebuilds after a crash.
    /// A crash loses at most the commits since the last durable one, whole
    /// (redb: a non-durable commit is persisted by the next durable one).
    ///
    /// [`sync`]: JournalStore::sync
    pub fn durable_every(&mut self, commits: u32) {
        self.durable_every = commits.max(1);
    }

    /// Appends entries, the ledger transfers they caused and what they
    /// archived, in one durable commit (see [`Journal::durable_every`]).
    pub fn append_with_transfers(&mut self, entries: &[JournalEntry], transfers: &[Transfer], archived: &Archived) -> Result<u64> {
        let first = self.next_seq;
        let mut transaction = self.db.begin_write()?;
        self.since_durable += 1;
        let durable = self.since_durable >= self.durable_every;
        if durable {
            self.since_durable = 0;
        }
        transaction.set_durability(if durable { Durability::Immediate } else { Durability::None })?;
        {
            let mut table = transaction.open_table(JOURNAL)?;
            for (offset, entry) in entries.iter().enumerate() {
                table.insert(first + offset as u64, encode_record(entry).as_slice())?;
            }
            let mut ledger = transaction.open_table(TRANSFERS)?;
            let mut by_account = transaction.open_table(ACCOUNT_TRANSFERS)?;
            for transfer in transfers {
                ledger.insert(transfer.id, encode_record(transfer).as_slice())?;
                index_transfer(&mut by_account, transfer)?;
            }
            let mut archive = transaction.open_table(ARCHIVED_LEASES)?;
            let mut by_account = transaction.open_table(ARCHIVED_LEASES_BY_ACCOUNT)?;
            let mut deliveries = transaction.open_table(ARCHIVED_DELIVERIES)?;
            let mut symbols = transaction.open_table(ARCHIVED_LEASE_SYMBOLS)?;
            for lease in &archived.leases {
                archive.insert(lease.info.lease.0, encode_record(&lease.info).as_slice())?;
                if !lease.symbol.is_empty() {
                    symbols.insert(lease.info.lease.0, lease.symbol.as_str())?;
                }
                index_archived_lease(&mut by_account, &lease.info)?;
                if let Some(delivery) = &lease.delivery {
                    deliveries.insert(lease.info.lease.0, encode_record(delivery).as_slice())?;
                }
            }
            let mut contracts = transaction.open_table(ARCHIVED_CONTRACTS)?;
            for contract in &archived.contracts {
                contracts.insert(contract.contract.0, encode_record(contract).as_slice())?;
            }
            let mut instruments = transaction.open_table(ARCHIVED_INSTRUMENTS)?;
            for instrument in &archived.instruments {
                instruments.insert(instrument.instrument.0, encode_record(instrument).as_slice())?;
            }
            index_trades(&transaction, &archived.trades)?;
        }
        transaction.commit()?;
        self.next_seq += entries.len() as u64;
        Ok(first)
    }

    /// Up to `limit` transfers involving `account` after transfer id `after`,
    /// oldest first (a range of the account's index).
    pub fn statement(&self, account: AccountId, after: Option<u64>, limit: usize) -> Result<Vec<Transfer>> {
        statement(&self.db.begin_read()?, account, after, limit)
    }

    /// A handle other threads read committed data through while this
    /// journal goes on writing (redb readers never block the writer).
    pub fn reader(&self) -> SharedReader {
        SharedReader { db: self.db.clone() }
    }

    /// The sequence number the next entry will get.
    pub fn next_seq(&self) -> u64 {
        self.next_seq
    }
}

/// Writing the journal: what the sequencer's commit and its recovery need.
pub trait JournalAppend: Send {
    /// The sequence number the next entry will get.
    fn next_seq(&self) -> u64;
    /// Every entry after `seq`, in order.
    fn entries_after(&self, seq: u64) -> Result<Vec<JournalEntry>>;
    /// Appends entries, the transfers they caused and what they archived,
    /// durably, in one commit; returns the first entry's sequence number.
    fn append_with_transfers(&mut self, entries: &[JournalEntry], transfers: &[Transfer], archived: &Archived) -> Result<u64>;
    /// Makes every commit so far durable (a journal whose commits are not
    /// all durable: [`Journal::durable_every`]).
    fn sync(&mut self) -> Result<()> {
        Ok(())
    }
}

/// Reading what the journal keeps: the queries the sequencer answers from
/// it (statements, the archive, history).
pub trait JournalQuery {
    /// Up to `limit` transfers involving `account` after transfer id `after`.
    fn statement(&self, account: AccountId, after: Option<u64>, limit: usize) -> Result<Vec<Transfer>>;
    /// Up to `limit` transfers involving `account` before transfer id
    /// `before` (the newest without it), newest first.
    fn recent_statement(&self, account: AccountId, before: Option<u64>, limit: usize) -> Result<Vec<Transfer>>;
    /// Archived leases `account` rented or supplied, newest first (by lease
    /// id), those before lease `before` only when it is given: up to
    /// `limit`, and whether more follow.
    fn archived_leases_of(&self, account: AccountId, before: Option<LeaseId>, limit: usize) -> Result<(Vec<LeaseInfo>, bool)>;
    /// An archived lease with its delivery record, if it had one.
    fn archived_lease(&self, lease: LeaseId) -> Result<Option<ArchivedLease>>;
    /// A contract of an expired window, as it ended.
    fn archived_contract(&self, contract: ContractId) -> Result<Option<ContractInfo>>;
    /// A retired reserved window, as it was listed.
    fn archived_instrument(&self, instrument: InstrumentId) -> Result<Option<InstrumentInfo>>;
    /// What another thread reads committed data through.
    fn shared_reader(&self) -> std::sync::Arc<dyn JournalRead>;
    /// Up to `limit` of an instrument's trades before trade `before_seq`
    /// (the newest without it), newest first.
    fn trades(&self, instrument: InstrumentId, before_seq: Option<u64>, limit: usize) -> Result<Vec<TradeRecord>>;
    /// The newest `limit` candles of `interval` starting before
    /// `before_ms`, oldest first, and whether older ones exist.
    fn candles(&self, instrument: InstrumentId, interval: CandleInterval, before_ms: u64, limit: usize) -> Result<(Vec<Candle>, bool)>;
    /// Up to `limit` of an account's fills before `before` (the newest
    /// without it), newest first.
    fn fills(&self, account: AccountId, before: Option<FillCursor>, limit: usize) -> Result<Vec<Fill>>;
}

/// What the sequencer holds: a journal it appends to and answers queries
/// from; the redb file ([`Journal`]) in the exchange, memory
/// ([`MemoryJournal`]) in tests of the sequencer, the replicated journal
/// on a cluster's leader. Every type that is both is one.
pub trait JournalStore: JournalAppend + JournalQuery {}

impl<T: JournalAppend + JournalQuery> JournalStore for T {}

/// Reads of committed data that may run off the sequencer's thread (the
/// invoices' worker): an account's transfers over a period, archived leases.
pub trait JournalRead: Send + Sync {
    /// Every transfer involving `account` with `from_ms <= at_ms < to_ms`,
    /// oldest first, with its kind.
    fn account_transfers(&self, account: AccountId, from_ms: u64, to_ms: u64) -> Result<Vec<Transfer>>;
    /// An archived lease as it ended, and the symbol it traded on (empty
    /// if unknown).
    fn archived_lease_info(&self, lease: LeaseId) -> Result<Option<(LeaseInfo, String)>>;
    /// Up to `limit` entries after `seq`, in order (fewer where the journal
    /// ends): what a cluster node that took a snapshot copies from a peer's
    /// journal (`gpux_replica`'s journal fill).
    fn entries_range(&self, seq: u64, limit: usize) -> Result<Vec<JournalEntry>>;
}

/// [`Journal::reader`]: the journal's database, shared.
#[derive(Clone)]
pub struct SharedReader {
    db: std::sync::Arc<Database>,
}

impl JournalRead for SharedReader {
    fn account_transfers(&self, account: AccountId, from_ms: u64, to_ms: u64) -> Result<Vec<Transfer>> {
        (|| account_transfers(&self.db.begin_read()?, account, from_ms, to_ms))().during(Op::AccountTransfers)
    }
    fn archived_lease_info(&self, lease: LeaseId) -> Result<Option<(LeaseInfo, String)>> {
        (|| {
            let read = self.db.begin_read()?;
            let Some(bytes) = read.open_table(ARCHIVED_LEASES)?.get(lease.0)? else { return Ok(None) };
            let info = decode_record(bytes.value()).map_err(|e| corrupt(format!("archived lease {}", lease.0), e))?;
            let symbol = read.open_table(ARCHIVED_LEASE_SYMBOLS)?.get(lease.0)?.map(|s| s.value().to_string()).unwrap_or_default();
            Ok(Some((info, symbol)))
        })()
        .during(Op::ArchivedLease)
    }
    fn entries_range(&self, seq: u64, limit: usize) -> Result<Vec<JournalEntry>> {
        (|| entries_range(&self.db.begin_read()?, seq, limit))().during(Op::Entries)
    }
}

fn index_transfer(by_account: &mut redb::Table<'_, (u32, u64, u64), u8>, transfer: &Transfer) -> Result<()> {
    for owner in [transfer.from.owner(), transfer.to.owner()].into_iter().flatten() {
        by_account.insert((owner.0, transfer.at_ms, transfer.id), transfer.kind as u8)?;
    }
    Ok(())
}

fn account_transfers(read: &redb::ReadTransaction, account: AccountId, from_ms: u64, to_ms: u64) -> Result<Vec<Transfer>> {
    let index = read.open_table(ACCOUNT_TRANSFERS)?;
    let table = read.open_table(TRANSFERS)?;
    let mut transfers = Vec::new();
    if to_ms <= from_ms {
        return Ok(transfers);
    }
    for row in index.range((account.0, from_ms, 0)..(account.0, to_ms, 0))? {
        let (key, kind) = row?;
        let (_, _, id) = key.value();
        let bytes = table.get(id)?.ok_or_else(|| missing(format!("transfer {id}")))?;
        let mut transfer: Transfer = decode_record(bytes.value()).map_err(|e| corrupt(format!("transfer {id}"), e))?;
        transfer.kind = TransferKind::from_u8(kind.value());
        transfers.push(transfer);
    }
    Ok(transfers)
}

impl JournalAppend for Journal {
    fn next_seq(&self) -> u64 {
        Journal::next_seq(self)
    }
    fn entries_after(&self, seq: u64) -> Result<Vec<JournalEntry>> {
        Journal::entries_after(self, seq).during(Op::Entries)
    }
    fn append_with_transfers(&mut self, entries: &[JournalEntry], transfers: &[Transfer], archived: &Archived) -> Result<u64> {
        Journal::append_with_transfers(self, entries, transfers, archived).during(Op::Append)
    }
    fn sync(&mut self) -> Result<()> {
        (|| {
            if self.since_durable > 0 {
                let mut transaction = self.db.begin_write()?;
                transaction.set_durability(Durability::Immediate)?;
                transaction.commit()?;
                self.since_durable = 0;
            }
            Ok(())
        })()
        .during(Op::Sync)
    }
}

impl JournalQuery for Journal {
    fn statement(&self, account: AccountId, after: Option<u64>, limit: usize) -> Result<Vec<Transfer>> {
        Journal::statement(self, account, after, limit).during(Op::Statement)
    }
    fn recent_statement(&self, account: AccountId, before: Option<u64>, limit: usize) -> Result<Vec<Transfer>> {
        (|| recent_statement(&self.db.begin_read()?, account, before, limit))().during(Op::RecentStatement)
    }
    fn archived_leases_of(&self, account: AccountId, before: Option<LeaseId>, limit: usize) -> Result<(Vec<LeaseInfo>, bool)> {
        (|| {
            let read = self.db.begin_read()?;
            let by_account = read.open_table(ARCHIVED_LEASES_BY_ACCOUNT)?;
            let archive = read.open_table(ARCHIVED_LEASES)?;
            let mut ids = Vec::new();
            let end = before.map_or(u64::MAX, |lease| lease.0);
            let rows = match before {
                Some(_) => by_account.range((account.0, 0)..(account.0, end))?,
                None => by_account.range((account.0, 0)..=(account.0, end))?,
            };
            for row in rows.rev().take(limit + 1) {
                ids.push(row?.0.value().1);
            }
            let more = ids.len() > limit;
            let mut leases = Vec::with_capacity(limit);
            for id in ids.into_iter().take(limit) {
                let bytes = archive.get(id)?.ok_or_else(|| missing(format!("archived lease {id}")))?;
                leases.push(decode_record(bytes.value()).map_err(|e| corrupt(format!("archived lease {id}"), e))?);
            }
            Ok((leases, more))
        })()
        .during(Op::ArchivedLeases)
    }
    fn archived_lease(&self, lease: LeaseId) -> Result<Option<ArchivedLease>> {
        (|| {
            let read = self.db.begin_read()?;
            let Some(bytes) = read.open_table(ARCHIVED_LEASES)?.get(lease.0)? else { return Ok(None) };
            let info: LeaseInfo = decode_record(bytes.value()).map_err(|e| corrupt(format!("archived lease {}", lease.0), e))?;
            let delivery = match read.open_table(ARCHIVED_DELIVERIES)?.get(lease.0)? {
                Some(bytes) => {
                    Some(decode_record::<LeaseDelivery>(bytes.value()).map_err(|e| corrupt(format!("archived delivery {}", lease.0), e))?)
                }
                None => None,
            };
            let symbol = read.open_table(ARCHIVED_LEASE_SYMBOLS)?.get(lease.0)?.map(|s| s.value().to_string()).unwrap_or_default();
            Ok(Some(ArchivedLease { info, delivery, symbol }))
        })()
        .during(Op::ArchivedLease)
    }
    fn archived_contract(&self, contract: ContractId) -> Result<Option<ContractInfo>> {
        (|| {
            let read = self.db.begin_read()?;
            let Some(bytes) = read.open_table(ARCHIVED_CONTRACTS)?.get(contract.0)? else { return Ok(None) };
            let info = decode_record(bytes.value()).map_err(|e| corrupt(format!("archived contract {}", contract.0), e))?;
            Ok(Some(info))
        })()
        .during(Op::ArchivedContract)
    }
    fn archived_instrument(&self, instrument: InstrumentId) -> Result<Option<InstrumentInfo>> {
        (|| {
            let read = self.db.begin_read()?;
            let Some(bytes) = read.open_table(ARCHIVED_INSTRUMENTS)?.get(instrument.0)? else { return Ok(None) };
            let info = decode_record(bytes.value()).map_err(|e| corrupt(format!("archived instrument {}", instrument.0), e))?;
            Ok(Some(info))
        })()
        .during(Op::ArchivedInstrument)
    }
    fn shared_reader(&self) -> std::sync::Arc<dyn JournalRead> {
        std::sync::Arc::new(self.reader())
    }
    fn trades(&self, instrument: InstrumentId, before_seq: Option<u64>, limit: usize) -> Result<Vec<TradeRecord>> {
        (|| trades(&self.db.begin_read()?, instrument, before_seq, limit))().during(Op::Trades)
    }
    fn candles(&self, instrument: InstrumentId, interval: CandleInterval, before_ms: u64, limit: usize) -> Result<(Vec<Candle>, bool)> {
        (|| candles(&self.db.begin_read()?, instrument, interval, before_ms, limit))().during(Op::Candles)
    }
    fn fills(&self, account: AccountId, before: Option<FillCursor>, limit: usize) -> Result<Vec<Fill>> {
        (|| fills(&self.db.begin_read()?, account, before, limit))().during(Op::Fills)
    }
}

/// Writes trades, their parties' fills and the candles they fall in.
fn index_trades(transaction: &redb::WriteTransaction, trades: &[TradeRecord]) -> Result<()> {
    if trades.is_empty() {
        return Ok(());
    }
    let mut table = transaction.open_table(TRADES)?;
    let mut fills = transaction.open_table(ACCOUNT_FILLS)?;
    let mut candles = transaction.open_table(CANDLES)?;
    for trade in trades {
        table.insert((trade.instrument.0, trade.seq), encode_record(trade).as_slice())?;
        fills.insert((trade.buyer.0, trade.at_ms, trade.instrument.0, trade.seq), 0)?;
        fills.insert((trade.seller.0, trade.at_ms, trade.instrument.0, trade.seq), 1)?;
        for interval in CandleInterval::ALL {
            let start_ms = interval.start(trade.at_ms);
            let key = (trade.instrument.0, interval.ms(), start_ms);
            let existing = match candles.get(key)? {
                Some(bytes) => Some(decode_record::<CandleRecord>(bytes.value()).map_err(|e| corrupt(format!("candle {key:?}"), e))?),
                None => None,
            };
            let record = match existing {
                Some(mut record) => {
                    record.add(trade);
                    record
                }
                None => CandleRecord::first(start_ms, trade),
            };
            candles.insert(key, encode_record(&record).as_slice())?;
        }
    }
    Ok(())
}

fn side_of(code: u8) -> gpux_engine::Side {
    if code == 0 {
        gpux_engine::Side::Buy
    } else {
        gpux_engine::Side::Sell
    }
}

fn decode_trade(bytes: &[u8], key: (u32, u64)) -> Result<TradeRecord> {
    decode_record(bytes).map_err(|e| corrupt(format!("trade {key:?}"), e))
}

fn trades(read: &redb::ReadTransaction, instrument: InstrumentId, before_seq: Option<u64>, limit: usize) -> Result<Vec<TradeRecord>> {
    let table = read.open_table(TRADES)?;
    let end = before_seq.unwrap_or(u64::MAX);
    let mut found = Vec::new();
    for row in table.range((instrument.0, 0)..(instrument.0, end))?.rev().take(limit) {
        let (key, bytes) = row?;
        found.push(decode_trade(bytes.value(), key.value())?);
    }
    Ok(found)
}

fn candles(
    read: &redb::ReadTransaction,
    instrument: InstrumentId,
    interval: CandleInterval,
    before_ms: u64,
    limit: usize,
) -> Result<(Vec<Candle>, bool)> {
    let table = read.open_table(CANDLES)?;
    let range = (instrument.0, interval.ms(), 0)..(instrument.0, interval.ms(), before_ms);
    let mut found = Vec::new();
    for row in table.range(range)?.rev().take(limit + 1) {
        let (key, bytes) = row?;
        let record: CandleRecord = decode_record(bytes.value()).map_err(|e| corrupt(format!("candle {:?}", key.value()), e))?;
        found.push(record.candle);
    }
    let more = found.len() > limit;
    found.truncate(limit);
    found.reverse();
    Ok((found, more))
}

fn fills(read: &redb::ReadTransaction, account: AccountId, before: Option<FillCursor>, limit: usize) -> Result<Vec<Fill>> {
    let index = read.open_table(ACCOUNT_FILLS)?;
    let table = read.open_table(TRADES)?;
    let end = match before {
        Some(cursor) => (account.0, cursor.at_ms, cursor.instrument.0, cursor.seq),
        None => (account.0, u64::MAX, u32::MAX, u64::MAX),
    };
    let mut found = Vec::new();
    for row in index.range((account.0, 0, 0, 0)..end)?.rev().take(limit) {
        let (key, side) = row?;
        let (_, _, instrument, seq) = key.value();
        let bytes = table.get((instrument, seq))?.ok_or_else(|| missing(format!("the trade {instrument}/{seq} of a fill")))?;
        found.push(decode_trade(bytes.value(), (instrument, seq))?.fill(side_of(side.value())));
    }
    Ok(found)
}

fn index_archived_lease(by_account: &mut redb::Table<'_, (u32, u64), ()>, lease: &LeaseInfo) -> Result<()> {
    by_account.insert((lease.renter.0, lease.lease.0), ())?;
    by_account.insert((lease.supplier.0, lease.lease.0), ())?;
    Ok(())
}

/// A journal in memory, for tests of the sequencer without IO: the real
/// [`Journal`] (the same tables, queries and paging) on redb's in-memory
/// backend, with switches a test turns. Clones share the same journal (a
/// test "restarts" a sequencer on a clone); appends can be made to fail, as
/// a full disk would, and reads of what the journal keeps, as an unreadable
/// file would.
#[derive(Clone)]
pub struct MemoryJournal {
    inner: std::sync::Arc<std::sync::Mutex<MemoryInner>>,
}

struct MemoryInner {
    journal: Journal,
    commits: u64,
    failing: bool,
    /// Reads of what the journal keeps (statements, the archive, history)
    /// fail, as an unreadable file would.
    failing_reads: bool,
}

impl Default for MemoryJournal {
    fn default() -> Self {
        let journal = Journal::open_with_backend(redb::backends::InMemoryBackend::new()).expect("an in-memory journal opens");
        let inner = MemoryInner { journal, commits: 0, failing: false, failing_reads: false };
        MemoryJournal { inner: std::sync::Arc::new(std::sync::Mutex::new(inner)) }
    }
}

impl MemoryJournal {
    fn inner(&self) -> std::sync::MutexGuard<'_, MemoryInner> {
        self.inner.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Every append from now on fails (`false`: they succeed again).
    pub fn fail_appends(&self, failing: bool) {
        self.inner().failing = failing;
    }

    /// Every read of statements, the archive and history from now on fails
    /// (`false`: they succeed again).
    pub fn fail_reads(&self, failing: bool) {
        self.inner().failing_reads = failing;
    }

    /// The journal, after checking that reads are not told to fail.
    fn readable(&self) -> Result<std::sync::MutexGuard<'_, MemoryInner>> {
        let inner = self.inner();
        if inner.failing_reads {
            return Err(JournalError::Injected { op: Op::Unnamed });
        }
        Ok(inner)
    }

    /// Successful appends so far (one per batch with entries).
    pub fn commits(&self) -> u64 {
        self.inner().commits
    }

    /// Every entry appended so far.
    pub fn entries(&self) -> Vec<JournalEntry> {
        self.inner().journal.entries_after(0).expect("the in-memory journal reads")
    }
}

impl JournalAppend for MemoryJournal {
    fn next_seq(&self) -> u64 {
        self.inner().journal.next_seq()
    }
    fn entries_after(&self, seq: u64) -> Result<Vec<JournalEntry>> {
        self.inner().journal.entries_after(seq).during(Op::Entries)
    }
    fn append_with_transfers(&mut self, entries: &[JournalEntry], transfers: &[Transfer], archived: &Archived) -> Result<u64> {
        (|| {
            let mut inner = self.inner();
            if inner.failing {
                return Err(JournalError::Injected { op: Op::Append });
            }
            let first = inner.journal.append_with_transfers(entries, transfers, archived)?;
            inner.commits += 1;
            Ok(first)
        })()
        .during(Op::Append)
    }
}

impl JournalQuery for MemoryJournal {
    fn statement(&self, account: AccountId, after: Option<u64>, limit: usize) -> Result<Vec<Transfer>> {
        (|| JournalQuery::statement(&self.readable()?.journal, account, after, limit))().during(Op::Statement)
    }
    fn recent_statement(&self, account: AccountId, before: Option<u64>, limit: usize) -> Result<Vec<Transfer>> {
        (|| self.readable()?.journal.recent_statement(account, before, limit))().during(Op::RecentStatement)
    }
    fn shared_reader(&self) -> std::sync::Arc<dyn JournalRead> {
        std::sync::Arc::new(self.clone())
    }
    fn archived_leases_of(&self, account: AccountId, before: Option<LeaseId>, limit: usize) -> Result<(Vec<LeaseInfo>, bool)> {
        (|| self.readable()?.journal.archived_leases_of(account, before, limit))().during(Op::ArchivedLeases)
    }
    fn archived_lease(&self, lease: LeaseId) -> Result<Option<ArchivedLease>> {
        (|| self.readable()?.journal.archived_lease(lease))().during(Op::ArchivedLease)
    }
    fn archived_contract(&self, contract: ContractId) -> Result<Option<ContractInfo>> {
        (|| self.readable()?.journal.archived_contract(contract))().during(Op::ArchivedContract)
    }
    fn archived_instrument(&self, instrument: InstrumentId) -> Result<Option<InstrumentInfo>> {
        (|| self.readable()?.journal.archived_instrument(instrument))().during(Op::ArchivedInstrument)
    }
    fn trades(&self, instrument: InstrumentId, before_seq: Option<u64>, limit: usize) -> Result<Vec<TradeRecord>> {
        (|| self.readable()?.journal.trades(instrument, before_seq, limit))().during(Op::Trades)
    }
    fn candles(&self, instrument: InstrumentId, interval: CandleInterval, before_ms: u64, limit: usize) -> Result<(Vec<Candle>, bool)> {
        (|| self.readable()?.journal.candles(instrument, interval, before_ms, limit))().during(Op::Candles)
    }
    fn fills(&self, account: AccountId, before: Option<FillCursor>, limit: usize) -> Result<Vec<Fill>> {
        (|| self.readable()?.journal.fills(account, before, limit))().during(Op::Fills)
    }
}

impl JournalRead for MemoryJournal {
    fn account_transfers(&self, account: AccountId, from_ms: u64, to_ms: u64) -> Result<Vec<Transfer>> {
        self.inner().journal.shared_reader().account_transfers(account, from_ms, to_ms).during(Op::AccountTransfers)
    }
    fn archived_lease_info(&self, lease: LeaseId) -> Result<Option<(LeaseInfo, String)>> {
        self.inner().journal.shared_reader().archived_lease_info(lease).during(Op::ArchivedLease)
    }
    fn entries_range(&self, seq: u64, limit: usize) -> Result<Vec<JournalEntry>> {
        self.inner().journal.shared_reader().entries_range(seq, limit).during(Op::Entries)
    }
}

/// A journal opened read-only, by tools that must never change it
/// (`gpux-audit --journal`, `gpux-exchange statement`): the file is opened
/// without write access and nothing is created.
pub struct JournalReader {
    db: redb::ReadOnlyDatabase,
}

impl JournalReader {
    pub fn open(path: &Path) -> Result<JournalReader> {
        let db =
            redb::ReadOnlyDatabase::open(path).map_err(|e| JournalError::Open { path: path.to_path_buf(), source: Box::new(e.into()) })?;
        let reader = JournalReader { db };
        if let Some(found) = reader.format_version()?.filter(|found| *found > FORMAT_VERSION) {
            return Err(FormatError::Newer { found, supported: FORMAT_VERSION }.into());
        }
        Ok(reader)
    }

    /// The format the file records ([`FORMAT_VERSION`]); `None` for one no
    /// build since 2026-12-06 has opened for writing (format 1).
    pub fn format_version(&self) -> Result<Option<u64>> {
        (|| {
            let read = self.db.begin_read()?;
            match read.open_table(archive::JOURNAL_META) {
                Ok(meta) => archive::read_u64(&meta, archive::FORMAT),
                Err(redb::TableError::TableDoesNotExist(_)) => Ok(None),
                Err(error) => Err(error.into()),
            }
        })()
        .during(Op::FormatVersion)
    }

    pub fn entries_after(&self, seq: u64) -> Result<Vec<JournalEntry>> {
        (|| entries_after(&self.db.begin_read()?, seq))().during(Op::Entries)
    }

    pub fn statement(&self, account: AccountId, after: Option<u64>, limit: usize) -> Result<Vec<Transfer>> {
        (|| statement(&self.db.begin_read()?, account, after, limit))().during(Op::Statement)
    }

    /// The listing the journal started with: its `Genesis` entry, or the
    /// demo listing for a journal written before listing files. (Later
    /// `ChangeListing`s never change the currency.)
    pub fn genesis_listing(&self) -> Result<gpux_engine::EngineConfig> {
        (|| {
            let read = self.db.begin_read()?;
            let table = read.open_table(JOURNAL)?;
            let bytes = match table.get(1)? {
                Some(bytes) => Some(bytes.value().to_vec()),
                // Archived: the journal kept it.
                None => archive::kept_genesis(&read)?,
            };
            let first = match bytes {
                Some(bytes) => Some(decode_record::<JournalEntry>(&bytes).map_err(|e| corrupt("journal entry 1".into(), e))?),
                None => None,
            };
            Ok(match first {
                Some(JournalEntry::Genesis { listing }) => *listing,
                _ => gpux_engine::EngineConfig::demo(),
            })
        })()
        .during(Op::Entries)
    }
}

fn entries_after(read: &redb::ReadTransaction, seq: u64) -> Result<Vec<JournalEntry>> {
    entries_range(read, seq, usize::MAX)
}

fn entries_range(read: &redb::ReadTransaction, seq: u64, limit: usize) -> Result<Vec<JournalEntry>> {
    let first = archive::first_seq(read)?;
    if seq + 1 < first {
        return Err(JournalError::Archived { op: Op::Unnamed, from: seq + 1, to: first });
    }
    let table = read.open_table(JOURNAL)?;
    let mut entries = Vec::new();
    for (expected, row) in (seq + 1..).zip(table.range(seq + 1..)?.take(limit)) {
        let (key, bytes) = row?;
        if key.value() != expected {
            return Err(JournalError::Gap { op: Op::Unnamed, expected, found: key.value() });
        }
        let entry: JournalEntry = decode_record(bytes.value()).map_err(|e| corrupt(format!("journal entry {}", key.value()), e))?;
        entries.push(entry);
    }
    Ok(entries)
}

fn statement(read: &redb::ReadTransaction, account: AccountId, after: Option<u64>, limit: usize) -> Result<Vec<Transfer>> {
    let table = read.open_table(TRANSFERS)?;
    let index = match read.open_table(ACCOUNT_TRANSFERS) {
        Ok(index) if !index.is_empty()? || table.is_empty()? => index,
        // A journal no newer version has opened yet (read-only tools):
        // no index, so a scan.
        Ok(_) | Err(redb::TableError::TableDoesNotExist(_)) => return statement_by_scan(&table, account, after, limit),
        Err(error) => return Err(error.into()),
    };
    // Transfer ids grow with time, so (at_ms, id) orders as id does: resume
    // just after `after` in the account's index.
    let start = match after {
        None => (account.0, 0, 0),
        Some(after) => match table.get(after)? {
            Some(bytes) => {
                let at_ms = decode_record::<Transfer>(bytes.value()).map_err(|e| corrupt(format!("transfer {after}"), e))?.at_ms;
                (account.0, at_ms, after.saturating_add(1))
            }
            // Not a transfer id: the first transfer after it, by id.
            None => match table.range(after..)?.next() {
                Some(row) => {
                    let (key, bytes) = row?;
                    let at_ms =
                        decode_record::<Transfer>(bytes.value()).map_err(|e| corrupt(format!("transfer {}", key.value()), e))?.at_ms;
                    (account.0, at_ms, key.value())
                }
                None => return Ok(Vec::new()),
            },
        },
    };
    let mut lines = Vec::new();
    for row in index.range(start..=(account.0, u64::MAX, u64::MAX))?.take(limit) {
        let (key, kind) = row?;
        let (_, _, id) = key.value();
        let bytes = table.get(id)?.ok_or_else(|| missing(format!("transfer {id}")))?;
        let mut transfer: Transfer = decode_record(bytes.value()).map_err(|e| corrupt(format!("transfer {id}"), e))?;
        transfer.kind = TransferKind::from_u8(kind.value());
        lines.push(transfer);
    }
    Ok(lines)
}

fn recent_statement(read: &redb::ReadTransaction, account: AccountId, before: Option<u64>, limit: usize) -> Result<Vec<Transfer>> {
    let table = read.open_table(TRANSFERS)?;
    let index = read.open_table(ACCOUNT_TRANSFERS)?;
    // Transfer ids grow with time, so (at_ms, id) orders as id does.
    let end = match before {
        None => (account.0, u64::MAX, u64::MAX),
        Some(before) => match table.range(before..)?.next() {
            Some(row) => {
                let (key, bytes) = row?;
                let at_ms = decode_record::<Transfer>(bytes.value()).map_err(|e| corrupt(format!("transfer {}", key.value()), e))?.at_ms;
                (account.0, at_ms, before)
            }
            None => (account.0, u64::MAX, u64::MAX),
        },
    };
    let mut lines = Vec::new();
    for row in index.range((account.0, 0, 0)..end)?.rev().take(limit) {
        let (key, kind) = row?;
        let (_, _, id) = key.value();
        let bytes = table.get(id)?.ok_or_else(|| missing(format!("transfer {id}")))?;
        let mut transfer: Transfer = decode_record(bytes.value()).map_err(|e| corrupt(format!("transfer {id}"), e))?;
        transfer.kind = TransferKind::from_u8(kind.value());
        lines.push(transfer);
    }
    Ok(lines)
}

fn statement_by_scan(
    table: &redb::ReadOnlyTable<u64, &[u8]>,
    account: AccountId,
    after: Option<u64>,
    limit: usize,
) -> Result<Vec<Transfer>> {
    let mut lines = Vec::new();
    let start = after.map_or(0, |after| after + 1);
    for row in table.range(start..)? {
        let (key, bytes) = row?;
        let transfer: Transfer = decode_record(bytes.value()).map_err(|e| corrupt(format!("transfer {}", key.value()), e))?;
        if transfer.involves(account) {
            lines.push(transfer);
            if lines.len() >= limit {
                break;
            }
        }
    }
    Ok(lines)
}

#[cfg(test)]
mod tests {
    use super::*;
    use gpux_engine::{Command, Input, Role};

    /// A new journal records this build's format; one that records a newer
    /// format is refused, for writing and for reading, with a typed error.
    #[test]
    fn a_journal_records_its_format_and_a_newer_one_is_refused() {
        let dir = tempfile::tempdir().expect("temp dir");
        let path = dir.path().join("journal.redb");
        drop(Journal::open(&path).expect("open"));
        assert_eq!(JournalReader::open(&path).expect("reads").format_version().expect("meta"), Some(FORMAT_VERSION));
        {
            let db = Database::open(&path).expect("opens");
            let write = db.begin_write().expect("write");
            write.open_table(archive::JOURNAL_META).expect("meta").insert(archive::FORMAT, 7u64.to_le_bytes().as_slice()).expect("insert");
            write.commit().expect("commit");
        }
        let refusals = [Journal::open(&path).err().expect("refused"), JournalReader::open(&path).err().expect("refused")];
        for refusal in refusals {
            assert!(matches!(refusal, JournalError::Format(FormatError::Newer { found: 7, supported: FORMAT_VERSION })), "{refusal:#}");
        }
    }

    /// Errors name their operation and cause: a read told to fail, an
    /// append told to fail, a file that is not a journal.
    #[test]
    fn errors_name_the_operation_and_the_cause() {
        let journal = MemoryJournal::default();
        journal.fail_reads(true);
        let statement = JournalQuery::statement(&journal, AccountId(1), None, 10).expect_err("told to fail");
        assert!(matches!(statement, JournalError::Injected { op: Op::Statement }), "{statement:?}");
        let trades = journal.trades(InstrumentId(0), None, 10).expect_err("told to fail");
        assert_eq!(trades.op(), Op::Trades);
        let mut appending = MemoryJournal::default();
        appending.fail_appends(true);
        let append = appending.append_with_transfers(&[], &[], &Archived::default()).expect_err("told to fail");
        assert_eq!(append.op(), Op::Append);
        let dir = tempfile::tempdir().expect("temp dir");
        let path = dir.path().join("not-a-journal");
        std::fs::write(&path, b"this is not a redb file, by far not long enough to be one").expect("write");
        let opened = Journal::open(&path).err().expect("refused");
        assert!(matches!(&opened, JournalError::Open { path: named, .. } if *named == path), "{opened:?}");
    }

    /// A lazily durable journal reads back every commit at once, and what
    /// `sync` made durable survives reopening.
    #[test]
    fn a_lazy_journal_reads_its_commits_and_sync_makes_them_durable() {
        let dir = tempfile::tempdir().expect("temp dir");
        let path = dir.path().join("journal.redb");
        let tick = |at_ms| JournalEntry::Engine(Input { at_ms, command: Command::Tick });
        {
            let mut journal = Journal::open(&path).expect("open");
            journal.durable_every(100);
            for at_ms in 1..=10 {
                journal.append(&[tick(at_ms)]).expect("append");
            }
            assert_eq!(journal.since_durable, 10, "none of the ten was durable");
            assert_eq!(journal.entries_after(0).expect("read").len(), 10, "readable before any is durable");
            JournalAppend::sync(&mut journal).expect("sync");
            assert_eq!(journal.since_durable, 0);
        }
        let journal = Journal::open(&path).expect("reopen");
        assert_eq!(journal.entries_after(0).expect("read"), (1..=10).map(tick).collect::<Vec<_>>());
    }

    /// Each storage fault at redb's seam (docs/operations.md "Disk space"):
    /// the failing append is refused (never acknowledged), what was
    /// committed before is read back whole after a restart on a healthy
    /// disk, the failed batch is there whole or not at all, and the journal
    /// takes appends again.
    #[test]
    fn a_failing_disk_refuses_the_append_and_loses_nothing_committed() {
        use faults::{Fault, Faults, FaultyBackend};
        let tick = |at_ms| JournalEntry::Engine(Input { at_ms, command: Command::Tick });
        for fault in [Fault::NoSpace, Fault::WriteError, Fault::SyncError, Fault::TornWrite] {
            let dir = tempfile::tempdir().expect("temp dir");
            let path = dir.path().join("journal.redb");
            let committed: Vec<JournalEntry> = (1..=50).map(tick).collect();
            let failed: Vec<JournalEntry> = (51..=60).map(tick).collect();
            {
                let faults = Faults::default();
                let file = std::fs::OpenOptions::new().read(true).write(true).create(true).truncate(false).open(&path).expect("file");
                let mut journal = Journal::open_with_backend(FaultyBackend::new(file, faults.clone()).expect("backend")).expect("open");
                for entry in &committed {
                    journal.append(std::slice::from_ref(entry)).expect("a healthy disk takes it");
                }
                faults.set(fault);
                // Through the trait the sequencer uses: a storage error of the append.
                let refused = JournalAppend::append_with_transfers(&mut journal, &failed, &[], &Archived::default()).expect_err("refused");
                assert!(
                    matches!(refused, JournalError::Storage { op: Op::Append, .. }),
                    "{fault:?}: the append fails, so nothing of it is acknowledged: {refused:?}"
                );
                assert!(journal.append(&failed).is_err(), "{fault:?}: and so does the next, until the journal is opened again");
            }
            let mut journal = Journal::open(&path).unwrap_or_else(|e| panic!("{fault:?}: reopens on a healthy disk: {e:#}"));
            let read = journal.entries_after(0).expect("read");
            assert_eq!(read[..50], committed[..], "{fault:?}: every committed entry, in order");
            assert!(
                read.len() == 50 || read[50..] == failed[..],
                "{fault:?}: the failed batch whole or not at all ({} entries)",
                read.len()
            );
            let next = journal.next_seq();
            journal.append(&[tick(99)]).expect("appends again");
            assert_eq!(journal.entries_after(next - 1).expect("read"), [tick(99)]);
        }
    }

    #[test]
    fn entries_survive_reopening_in_order() {
        let dir = tempfile::tempdir().expect("temp dir");
        let path = dir.path().join("journal.redb");
        let entries = vec![
            JournalEntry::Engine(Input { at_ms: 1, command: Command::OpenAccount { role: Role::Renter } }),
            JournalEntry::BindKey { public_key: [7; 32], account: AccountId(0) },
            JournalEntry::Engine(Input { at_ms: 2, command: Command::Tick }),
        ];
        {
            let mut journal = Journal::open(&path).expect("open");
            assert!(journal.entries_after(0).expect("read").is_empty());
            assert_eq!(journal.append(&entries[..2]).expect("append"), 1);
            assert_eq!(journal.append(&entries[2..]).expect("append"), 3);
        }
        let journal = Journal::open(&path).expect("reopen");
        assert_eq!(journal.entries_after(0).expect("read"), entries);
        assert_eq!(journal.entries_after(2).expect("read"), entries[2..]);
        assert_eq!(journal.next_seq(), 4);
    }

    fn lease(id: u64, renter: u32, supplier: u32) -> LeaseInfo {
        LeaseInfo {
            lease: LeaseId(id),
            kind: gpux_engine::LeaseKind::Spot,
            renter: AccountId(renter),
            supplier: AccountId(supplier),
            gpus: Vec::new(),
            price_minor_per_gpu_hour: 2_000_000,
            start_ms: id,
            end_ms: None,
            active: false,
            ended_at_ms: Some(id + 1),
            escrow_minor: 0,
            billing_closed: true,
            verified_gpu_ms: 0,
            usage_charged_minor: 0,
        }
    }

    fn archive_of(ids: std::ops::Range<u64>) -> Archived {
        let leases = ids
            .map(|id| {
                let delivery = (id % 2 == 0).then_some(LeaseDelivery {
                    supplier: Some(AccountId(2)),
                    workload: None,
                    state: Some((gpux_protocol::DeliveryState::Exited { code: id as i64 }, id)),
                    ran: true,
                });
                ArchivedLease { info: lease(id, if id % 2 == 0 { 1 } else { 3 }, 2), delivery, symbol: format!("H100-SXM-80G/SPOT#{id}") }
            })
            .collect();
        let window = InstrumentInfo {
            instrument: InstrumentId(40),
            symbol: "H100-SXM-80G/R/2026-12-02T16/1H".into(),
            class: "H100-SXM-80G".into(),
            contract: gpux_engine::ContractKind::Reserved { window_start_ms: 0, window_end_ms: 3_600_000 },
            state: gpux_engine::InstrumentState::Expired,
            tick_minor: 1_000,
            price_min_minor_per_gpu_hour: 1_000,
            price_max_minor_per_gpu_hour: 100_000_000,
        };
        let contract = ContractInfo {
            contract: ContractId(12),
            instrument: InstrumentId(40),
            gpu: gpux_engine::GpuId(3),
            holder: AccountId(1),
            supplier: AccountId(2),
            price_minor_per_gpu_hour: 2_000_000,
            outcome: gpux_engine::ContractOutcome::Delivered { lease: LeaseId(4) },
        };
        Archived { leases, contracts: vec![contract], instruments: vec![window], trades: Vec::new() }
    }

    /// Pages of an account's archived leases (newest first), one archived
    /// lease with its delivery record, a retired window: the same from the
    /// redb journal and from the memory one.
    fn check_archive(store: &dyn JournalStore) {
        let ids = |leases: Vec<LeaseInfo>| leases.iter().map(|l| l.lease.0).collect::<Vec<_>>();
        let (page, more) = store.archived_leases_of(AccountId(1), None, 2).expect("reads");
        assert_eq!((ids(page), more), (vec![6, 4], true));
        let (page, more) = store.archived_leases_of(AccountId(1), Some(LeaseId(4)), 2).expect("reads");
        assert_eq!((ids(page), more), (vec![2, 0], false));
        let (page, more) = store.archived_leases_of(AccountId(1), Some(LeaseId(5)), 1).expect("reads");
        assert_eq!((ids(page), more), (vec![4], true), "after a lease that is not the account's");
        let (page, more) = store.archived_leases_of(AccountId(2), None, 100).expect("reads");
        assert_eq!((ids(page), more), ((0..7).rev().collect::<Vec<_>>(), false), "the supplier sees both renters' leases");
        assert_eq!(store.archived_leases_of(AccountId(9), None, 10).expect("reads"), (Vec::new(), false));
        let found = store.archived_lease(LeaseId(4)).expect("reads").expect("archived");
        assert_eq!(
            (found.info.renter, found.delivery.and_then(|d| d.state)),
            (AccountId(1), Some((gpux_protocol::DeliveryState::Exited { code: 4 }, 4)))
        );
        assert_eq!(store.archived_lease(LeaseId(3)).expect("reads").map(|l| l.delivery), Some(None), "no delivery record");
        assert_eq!(store.archived_lease(LeaseId(99)).expect("reads"), None);
        assert_eq!(
            store.archived_instrument(InstrumentId(40)).expect("reads").map(|i| i.symbol),
            Some("H100-SXM-80G/R/2026-12-02T16/1H".into())
        );
        assert_eq!(store.archived_instrument(InstrumentId(41)).expect("reads"), None);
        let contract = store.archived_contract(ContractId(12)).expect("reads").expect("archived");
        assert_eq!((contract.holder, contract.outcome), (AccountId(1), gpux_engine::ContractOutcome::Delivered { lease: LeaseId(4) }));
        assert_eq!(store.archived_contract(ContractId(13)).expect("reads"), None);
    }

    #[test]
    fn the_archive_answers_by_account_and_by_id_and_its_index_is_rebuilt() {
        let dir = tempfile::tempdir().expect("temp dir");
        let path = dir.path().join("journal.redb");
        let mut memory = MemoryJournal::default();
        {
            let mut journal = Journal::open(&path).expect("open");
            for (store, _) in [(&mut journal as &mut dyn JournalStore, 0), (&mut memory as &mut dyn JournalStore, 1)] {
                let tick = JournalEntry::Engine(Input { at_ms: 1, command: Command::Tick });
                store.append_with_transfers(std::slice::from_ref(&tick), &[], &archive_of(0..3)).expect("append");
                let later = Archived { contracts: Vec::new(), instruments: Vec::new(), ..archive_of(3..7) };
                store.append_with_transfers(&[tick], &[], &later).expect("append");
                store.append_with_transfers(&[], &[], &Archived { leases: Vec::new(), ..archive_of(0..0) }).expect("append");
            }
            check_archive(&journal);
            check_archive(&memory);
        }
        // A journal written before the by-account index existed: reopening builds it.
        {
            let db = Database::create(&path).expect("open");
            let write = db.begin_write().expect("write");
            write.delete_table(ARCHIVED_LEASES_BY_ACCOUNT).expect("drop the index");
            write.commit().expect("commit");
        }
        check_archive(&Journal::open(&path).expect("reopen"));
    }

    fn transfer(id: u64, at_ms: u64, from: LedgerAccount, to: LedgerAccount, kind: TransferKind) -> Transfer {
        Transfer { id, at_ms, from, to, amount_minor: id * 10, lease: None, kind }
    }

    use gpux_settlement::ledger::LedgerAccount;

    #[test]
    fn an_accounts_transfers_come_by_period_and_page_with_their_kinds_and_an_old_journal_is_indexed() {
        let dir = tempfile::tempdir().expect("temp dir");
        let path = dir.path().join("journal.redb");
        let (a, b) = (AccountId(1), AccountId(2));
        let transfers = vec![
            transfer(4, 100, LedgerAccount::External, LedgerAccount::Available(a), TransferKind::Deposit),
            transfer(8, 200, LedgerAccount::Available(a), LedgerAccount::Available(b), TransferKind::FundsMoved),
            transfer(12, 200, LedgerAccount::Available(b), LedgerAccount::Held(b), TransferKind::Hold),
            transfer(16, 300, LedgerAccount::Available(a), LedgerAccount::External, TransferKind::Withdrawal),
        ];
        let tick = JournalEntry::Engine(Input { at_ms: 1, command: Command::Tick });
        let mut memory = MemoryJournal::default();
        {
            let mut journal = Journal::open(&path).expect("open");
            for store in [&mut journal as &mut dyn JournalStore, &mut memory as &mut dyn JournalStore] {
                store.append_with_transfers(std::slice::from_ref(&tick), &transfers, &Archived::default()).expect("append");
                let reader = store.shared_reader();
                let period: Vec<(u64, TransferKind)> =
                    reader.account_transfers(a, 100, 300).expect("read").iter().map(|t| (t.id, t.kind)).collect();
                assert_eq!(period, vec![(4, TransferKind::Deposit), (8, TransferKind::FundsMoved)], "[from, to) of one account");
                let of_b: Vec<u64> = reader.account_transfers(b, 0, u64::MAX).expect("read").iter().map(|t| t.id).collect();
                assert_eq!(of_b, vec![8, 12]);
                let pages: Vec<Vec<u64>> = [None, Some(4), Some(8), Some(9), Some(16)]
                    .into_iter()
                    .map(|after| store.statement(a, after, 1).expect("page").iter().map(|t| t.id).collect())
                    .collect();
                assert_eq!(pages, vec![vec![4], vec![8], vec![16], vec![16], vec![]]);
                let newest: Vec<Vec<u64>> = [None, Some(16), Some(9), Some(8), Some(4)]
                    .into_iter()
                    .map(|before| store.recent_statement(a, before, 2).expect("page").iter().map(|t| t.id).collect())
                    .collect();
                assert_eq!(newest, vec![vec![16, 8], vec![8, 4], vec![8, 4], vec![4], vec![]], "newest first, before an id");
            }
        }
        {
            let db = Database::create(&path).expect("open");
            let write = db.begin_write().expect("write");
            write.delete_table(ACCOUNT_TRANSFERS).expect("drop the index");
            write.commit().expect("commit");
        }
        let read_only = JournalReader::open(&path).expect("read-only");
        assert_eq!(read_only.statement(a, None, 10).expect("scan").len(), 3, "no index: a scan");
        drop(read_only);
        let journal = Journal::open(&path).expect("reopen builds the index");
        let kinds: Vec<TransferKind> = journal.reader().account_transfers(a, 0, u64::MAX).expect("read").iter().map(|t| t.kind).collect();
        assert_eq!(kinds, vec![TransferKind::Unclassified; 3], "kinds older journals never had");
    }
}
