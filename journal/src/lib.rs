//! The durable journal: every accepted input, in sequence, in a redb table.
//!
//! An entry is acknowledged to anyone only after the transaction holding it
//! committed with `Durability::Immediate` (fsync). Appends are batched: the
//! sequencer hands over everything that arrived while the previous commit
//! was in flight, so one fsync covers many commands (group commit). redb's
//! commits are atomic, so a crash mid-commit (a torn write) leaves the
//! journal at the previous commit and the restart replays that.

use std::path::Path;

use anyhow::{Context, Result};
use gpux_engine::{AccountId, LeaseInfo};
pub use gpux_market::JournalEntry;
use gpux_protocol::{decode_record, encode_record};
use gpux_settlement::ledger::Transfer;
use redb::{Database, Durability, ReadableDatabase, ReadableTable, TableDefinition};

const JOURNAL: TableDefinition<u64, &[u8]> = TableDefinition::new("journal");
/// The ledger's transfers, by transfer id, written in the same commit as
/// the journal entries they follow from (so statements are durable too).
const TRANSFERS: TableDefinition<u64, &[u8]> = TableDefinition::new("transfers");
/// Leases archived out of the market's hot state, by lease id, written in
/// the commit of the entry that archived them. A replay derives the same
/// archive from the entries; this table is what queries read.
const ARCHIVED_LEASES: TableDefinition<u64, &[u8]> = TableDefinition::new("archived_leases");

pub struct Journal {
    db: Database,
    next_seq: u64,
}

impl Journal {
    /// Opens (or creates) the journal.
    pub fn open(path: &Path) -> Result<Journal> {
        let db = Database::create(path).with_context(|| format!("opening journal {}", path.display()))?;
        let setup = db.begin_write()?;
        setup.open_table(JOURNAL)?;
        setup.open_table(TRANSFERS)?;
        setup.open_table(ARCHIVED_LEASES)?;
        setup.commit()?;
        let next_seq = {
            let read = db.begin_read()?;
            let table = read.open_table(JOURNAL)?;
            let last = table.last()?.map(|(seq, _)| seq.value());
            last.map_or(1, |seq| seq + 1)
        };
        Ok(Journal { db, next_seq })
    }

    /// Every entry after `seq`, in order; a gap is an error.
    pub fn entries_after(&self, seq: u64) -> Result<Vec<JournalEntry>> {
        entries_after(&self.db.begin_read()?, seq)
    }

    /// Appends `entries` in one durable commit; returns the sequence number
    /// of the first. An error here is fatal to the exchange.
    pub fn append(&mut self, entries: &[JournalEntry]) -> Result<u64> {
        self.append_with_transfers(entries, &[], &[])
    }

    /// Appends entries, the ledger transfers they caused and the leases they
    /// archived, in one durable commit.
    pub fn append_with_transfers(&mut self, entries: &[JournalEntry], transfers: &[Transfer], archived: &[LeaseInfo]) -> Result<u64> {
        let first = self.next_seq;
        let mut transaction = self.db.begin_write()?;
        transaction.set_durability(Durability::Immediate)?;
        {
            let mut table = transaction.open_table(JOURNAL)?;
            for (offset, entry) in entries.iter().enumerate() {
                table.insert(first + offset as u64, encode_record(entry).as_slice())?;
            }
            let mut ledger = transaction.open_table(TRANSFERS)?;
            for transfer in transfers {
                ledger.insert(transfer.id, encode_record(transfer).as_slice())?;
            }
            let mut archive = transaction.open_table(ARCHIVED_LEASES)?;
            for lease in archived {
                archive.insert(lease.lease.0, encode_record(lease).as_slice())?;
            }
        }
        transaction.commit()?;
        self.next_seq += entries.len() as u64;
        Ok(first)
    }

    /// Up to `limit` transfers involving `account` after transfer id `after`,
    /// oldest first (a scan: statements are not a hot path).
    pub fn statement(&self, account: AccountId, after: Option<u64>, limit: usize) -> Result<Vec<Transfer>> {
        statement(&self.db.begin_read()?, account, after, limit)
    }

    /// The sequence number the next entry will get.
    pub fn next_seq(&self) -> u64 {
        self.next_seq
    }
}

/// What the sequencer needs of a journal: the redb file ([`Journal`]) in
/// the exchange, memory ([`MemoryJournal`]) in tests of the sequencer.
pub trait JournalStore: Send {
    /// The sequence number the next entry will get.
    fn next_seq(&self) -> u64;
    /// Every entry after `seq`, in order.
    fn entries_after(&self, seq: u64) -> Result<Vec<JournalEntry>>;
    /// Appends entries, the transfers they caused and the leases they
    /// archived, durably, in one commit; returns the first entry's sequence number.
    fn append_with_transfers(&mut self, entries: &[JournalEntry], transfers: &[Transfer], archived: &[LeaseInfo]) -> Result<u64>;
    /// Up to `limit` transfers involving `account` after transfer id `after`.
    fn statement(&self, account: AccountId, after: Option<u64>, limit: usize) -> Result<Vec<Transfer>>;
    /// Archived leases `account` rented or supplied, newest first, skipping
    /// `offset`: up to `limit`, and whether more follow.
    fn archived_leases_of(&self, account: AccountId, offset: usize, limit: usize) -> Result<(Vec<LeaseInfo>, bool)>;
}

impl JournalStore for Journal {
    fn next_seq(&self) -> u64 {
        Journal::next_seq(self)
    }
    fn entries_after(&self, seq: u64) -> Result<Vec<JournalEntry>> {
        Journal::entries_after(self, seq)
    }
    fn append_with_transfers(&mut self, entries: &[JournalEntry], transfers: &[Transfer], archived: &[LeaseInfo]) -> Result<u64> {
        Journal::append_with_transfers(self, entries, transfers, archived)
    }
    fn statement(&self, account: AccountId, after: Option<u64>, limit: usize) -> Result<Vec<Transfer>> {
        Journal::statement(self, account, after, limit)
    }
    fn archived_leases_of(&self, account: AccountId, offset: usize, limit: usize) -> Result<(Vec<LeaseInfo>, bool)> {
        let read = self.db.begin_read()?;
        let table = read.open_table(ARCHIVED_LEASES)?;
        let mut matching = Vec::new();
        for row in table.iter()?.rev() {
            let (key, bytes) = row?;
            let lease: LeaseInfo =
                decode_record(bytes.value()).map_err(|e| anyhow::anyhow!("archived lease {}: {}", key.value(), e.message))?;
            if lease.renter == account || lease.supplier == account {
                matching.push(lease);
                if matching.len() > offset + limit {
                    break;
                }
            }
        }
        Ok(page_of(matching, offset, limit))
    }
}

/// `items[offset..offset + limit]`, and whether anything follows.
fn page_of<T>(items: Vec<T>, offset: usize, limit: usize) -> (Vec<T>, bool) {
    let more = items.len() > offset + limit;
    (items.into_iter().skip(offset).take(limit).collect(), more)
}

/// A journal in memory, for tests of the sequencer without IO. Clones share
/// the same entries (a test "restarts" a sequencer on a clone), and appends
/// can be made to fail, as a full disk would.
#[derive(Clone, Default)]
pub struct MemoryJournal {
    inner: std::sync::Arc<std::sync::Mutex<MemoryInner>>,
}

#[derive(Default)]
struct MemoryInner {
    entries: Vec<JournalEntry>,
    transfers: std::collections::BTreeMap<u64, Transfer>,
    archived: std::collections::BTreeMap<u64, LeaseInfo>,
    commits: u64,
    failing: bool,
}

impl MemoryJournal {
    fn inner(&self) -> std::sync::MutexGuard<'_, MemoryInner> {
        self.inner.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Every append from now on fails (`false`: they succeed again).
    pub fn fail_appends(&self, failing: bool) {
        self.inner().failing = failing;
    }

    /// Successful appends so far (one per batch with entries).
    pub fn commits(&self) -> u64 {
        self.inner().commits
    }

    /// Every entry appended so far.
    pub fn entries(&self) -> Vec<JournalEntry> {
        self.inner().entries.clone()
    }
}

impl JournalStore for MemoryJournal {
    fn next_seq(&self) -> u64 {
        self.inner().entries.len() as u64 + 1
    }
    fn entries_after(&self, seq: u64) -> Result<Vec<JournalEntry>> {
        Ok(self.inner().entries.iter().skip(seq as usize).cloned().collect())
    }
    fn append_with_transfers(&mut self, entries: &[JournalEntry], transfers: &[Transfer], archived: &[LeaseInfo]) -> Result<u64> {
        let mut inner = self.inner();
        anyhow::ensure!(!inner.failing, "the memory journal was told to fail");
        let first = inner.entries.len() as u64 + 1;
        inner.entries.extend_from_slice(entries);
        inner.transfers.extend(transfers.iter().map(|t| (t.id, *t)));
        inner.archived.extend(archived.iter().map(|l| (l.lease.0, l.clone())));
        inner.commits += 1;
        Ok(first)
    }
    fn statement(&self, account: AccountId, after: Option<u64>, limit: usize) -> Result<Vec<Transfer>> {
        let inner = self.inner();
        let start = after.map_or(0, |after| after + 1);
        Ok(inner.transfers.range(start..).map(|(_, t)| *t).filter(|t| t.involves(account)).take(limit).collect())
    }
    fn archived_leases_of(&self, account: AccountId, offset: usize, limit: usize) -> Result<(Vec<LeaseInfo>, bool)> {
        let inner = self.inner();
        let matching = inner.archived.values().rev().filter(|l| l.renter == account || l.supplier == account).cloned().collect();
        Ok(page_of(matching, offset, limit))
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
        let db = redb::ReadOnlyDatabase::open(path).with_context(|| format!("opening journal {} read-only", path.display()))?;
        Ok(JournalReader { db })
    }

    pub fn entries_after(&self, seq: u64) -> Result<Vec<JournalEntry>> {
        entries_after(&self.db.begin_read()?, seq)
    }

    pub fn statement(&self, account: AccountId, after: Option<u64>, limit: usize) -> Result<Vec<Transfer>> {
        statement(&self.db.begin_read()?, account, after, limit)
    }
}

fn entries_after(read: &redb::ReadTransaction, seq: u64) -> Result<Vec<JournalEntry>> {
    let table = read.open_table(JOURNAL)?;
    let mut entries = Vec::new();
    for (expected, row) in (seq + 1..).zip(table.range(seq + 1..)?) {
        let (key, bytes) = row?;
        anyhow::ensure!(key.value() == expected, "journal gap: expected entry {expected}, found {}", key.value());
        let entry: JournalEntry =
            decode_record(bytes.value()).map_err(|e| anyhow::anyhow!("journal entry {}: {}", key.value(), e.message))?;
        entries.push(entry);
    }
    Ok(entries)
}

fn statement(read: &redb::ReadTransaction, account: AccountId, after: Option<u64>, limit: usize) -> Result<Vec<Transfer>> {
    let table = read.open_table(TRANSFERS)?;
    let mut lines = Vec::new();
    let start = after.map_or(0, |after| after + 1);
    for row in table.range(start..)? {
        let (key, bytes) = row?;
        let transfer: Transfer = decode_record(bytes.value()).map_err(|e| anyhow::anyhow!("transfer {}: {}", key.value(), e.message))?;
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
}
