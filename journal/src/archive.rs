//! Moving a journal's oldest entries into an archive file
//! (docs/operations.md "Archiving the journal").
//!
//! The entries table is the journal's history; a restart needs only the
//! entries after the newest snapshot, so older ones may move to a file of
//! their own (a journal file holding only entries, readable by
//! [`JournalReader`] and `gpux-audit --journal`). What statements, invoices
//! and history read (transfers, trades, fills, candles, archived leases)
//! stays. The move is safe to repeat after a crash at any point:
//!
//! 1. the entries are copied into the archive, in durable commits; an
//!    archive that already holds some of them (a move cut short) is
//!    continued, never written twice;
//! 2. the journal records, durably, that entries before `before` are
//!    archived (and keeps entry 1, the genesis listing, as a record of its
//!    own): from then on a read before that point is refused, not answered
//!    with a gap;
//! 3. the entries are deleted from the journal in runs.

use std::path::Path;

use redb::{Durability, ReadableDatabase, ReadableTable, TableDefinition};

use crate::{Journal, JournalError, JournalReader, Op, Result, JOURNAL};

/// Facts about the journal itself, by name.
pub(crate) const JOURNAL_META: TableDefinition<&str, &[u8]> = TableDefinition::new("journal_meta");
/// The first entry the journal holds (u64, little-endian): the ones before
/// it were archived.
pub(crate) const ARCHIVED_BEFORE: &str = "archived_before";
/// Entry 1 (the genesis listing) as the journal encoded it, kept when it
/// is archived (the listing's currency names every amount).
pub(crate) const GENESIS: &str = "genesis";
/// The journal's format ([`crate::FORMAT_VERSION`], u64 little-endian).
pub(crate) const FORMAT: &str = "format_version";

/// Entries copied or deleted in one commit.
const ARCHIVE_RUN: u64 = 50_000;

/// What [`Journal::archive_before`] did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ArchiveOutcome {
    /// Entries now in the archive that were not before.
    pub copied: u64,
    /// The first entry the journal holds now.
    pub first_kept: u64,
}

/// Why an archive could not be made. Callers branch on it (the exchange's
/// `journal archive` command names the remedy).
#[derive(Debug, thiserror::Error)]
pub enum ArchiveError {
    #[error("entry {before} is past the journal's end (its next entry is {next})")]
    PastTheEnd { before: u64, next: u64 },
    #[error("the archive ends at entry {archive_end} but the journal's first entry is {first}: archive into a new file")]
    NotContiguous { archive_end: u64, first: u64 },
    #[error("the journal is shared (a reader is open): compacting needs it to itself")]
    Shared,
    #[error(transparent)]
    Journal(#[from] JournalError),
}

pub(crate) fn read_u64(meta: &impl ReadableTable<&'static str, &'static [u8]>, key: &str) -> Result<Option<u64>> {
    let Some(bytes) = meta.get(key)? else { return Ok(None) };
    let bytes: [u8; 8] = bytes.value().try_into().map_err(|_| JournalError::Corrupt {
        op: Op::Unnamed,
        what: format!("journal_meta {key}"),
        message: "not 8 bytes".into(),
    })?;
    Ok(Some(u64::from_le_bytes(bytes)))
}

/// The first entry a journal's read transaction holds (1 for one never
/// archived; an older journal has no meta table).
pub(crate) fn first_seq(read: &redb::ReadTransaction) -> Result<u64> {
    match read.open_table(JOURNAL_META) {
        Ok(meta) => Ok(read_u64(&meta, ARCHIVED_BEFORE)?.unwrap_or(1)),
        Err(redb::TableError::TableDoesNotExist(_)) => Ok(1),
        Err(error) => Err(error.into()),
    }
}

/// Entry 1's bytes, where the journal kept them when it archived entry 1.
pub(crate) fn kept_genesis(read: &redb::ReadTransaction) -> Result<Option<Vec<u8>>> {
    match read.open_table(JOURNAL_META) {
        Ok(meta) => Ok(meta.get(GENESIS)?.map(|bytes| bytes.value().to_vec())),
        Err(redb::TableError::TableDoesNotExist(_)) => Ok(None),
        Err(error) => Err(error.into()),
    }
}

/// Copies the journal entries `seqs` that `read` holds into `into`'s
/// journal table, in durable commits of [`ARCHIVE_RUN`]; a gap is an error.
fn copy_entries(read: &redb::ReadTransaction, into: &redb::Database, seqs: std::ops::Range<u64>) -> Result<()> {
    let table = read.open_table(JOURNAL)?;
    let mut next = seqs.start;
    while next < seqs.end {
        let end = (next + ARCHIVE_RUN).min(seqs.end);
        let mut write = into.begin_write()?;
        write.set_durability(Durability::Immediate)?;
        {
            let mut copy = write.open_table(JOURNAL)?;
            for (expected, row) in (next..).zip(table.range(next..end)?) {
                let (seq, bytes) = row?;
                if seq.value() != expected {
                    return Err(JournalError::Gap { op: Op::Archive, expected, found: seq.value() });
                }
                copy.insert(expected, bytes.value())?;
            }
        }
        write.commit()?;
        next = end;
    }
    Ok(())
}

impl Journal {
    /// The first entry this journal holds (entries before it were moved to
    /// an archive); 1 for a journal never archived.
    pub fn first_seq(&self) -> Result<u64> {
        first_seq(&self.db.begin_read()?)
    }

    /// Moves entries from the journal's first up to `before` (exclusive)
    /// into the journal file at `archive` (created if absent; an archive
    /// must end where the journal starts: one file per contiguous run).
    /// Every step is durable before the next; repeating a move cut short
    /// finishes it. Nothing else of the journal changes.
    pub fn archive_before(&mut self, before: u64, archive: &Path) -> Result<ArchiveOutcome, ArchiveError> {
        let first = self.first_seq()?;
        if before > self.next_seq {
            return Err(ArchiveError::PastTheEnd { before, next: self.next_seq });
        }
        let mut copied = 0;
        if before > first {
            let mut archive = Journal::open(archive)?;
            // An empty archive starts where the journal does.
            if archive.next_seq == archive.first_seq()? && archive.next_seq != first {
                archive.mark_first(first)?;
            }
            let (archive_first, next) = (archive.first_seq()?, archive.next_seq);
            if next < first || archive_first > first {
                return Err(ArchiveError::NotContiguous { archive_end: next - 1, first });
            }
            // A move cut short already copied some: go on from there.
            if next < before {
                let read = self.db.begin_read().map_err(JournalError::from)?;
                copy_entries(&read, &archive.db, next..before)?;
                copied = before - next;
                archive.next_seq = before;
            }
            self.mark_archived(first, before)?;
        }
        self.delete_archived()?;
        Ok(ArchiveOutcome { copied, first_kept: self.first_seq()? })
    }

    /// An empty journal file that is to hold entries from `first` on.
    fn mark_first(&mut self, first: u64) -> Result<()> {
        self.mark_first_kept(first)?;
        self.next_seq = first;
        Ok(())
    }

    /// Records that entries before `before` are archived, keeping entry 1.
    fn mark_archived(&mut self, first: u64, before: u64) -> Result<()> {
        let mut write = self.db.begin_write()?;
        write.set_durability(Durability::Immediate)?;
        {
            let mut meta = write.open_table(JOURNAL_META)?;
            if first == 1 && meta.get(GENESIS)?.is_none() {
                let journal = write.open_table(JOURNAL)?;
                let genesis = journal.get(1)?.map(|bytes| bytes.value().to_vec());
                if let Some(genesis) = genesis {
                    meta.insert(GENESIS, genesis.as_slice())?;
                }
            }
            meta.insert(ARCHIVED_BEFORE, before.to_le_bytes().as_slice())?;
        }
        write.commit()?;
        Ok(())
    }

    /// Deletes the entries before the archived point, in runs.
    fn delete_archived(&mut self) -> Result<()> {
        let first = self.first_seq()?;
        loop {
            let oldest = {
                let read = self.db.begin_read()?;
                let table = read.open_table(JOURNAL)?;
                let oldest = table.first()?.map(|(seq, _)| seq.value());
                oldest
            };
            let Some(oldest) = oldest.filter(|seq| *seq < first) else { return Ok(()) };
            let end = (oldest + ARCHIVE_RUN).min(first);
            let mut write = self.db.begin_write()?;
            write.set_durability(Durability::Immediate)?;
            write.open_table(JOURNAL)?.retain_in(oldest..end, |_, _| false)?;
            write.commit()?;
        }
    }

    /// Copies the entries of the archive at `from` back in front of the
    /// journal: the archive must end where the journal starts (restore the
    /// newest archive first). Returns the entries restored. The archive is
    /// left as it was.
    pub fn restore_from(&mut self, from: &Path) -> Result<u64, ArchiveError> {
        let first = self.first_seq()?;
        let archive = JournalReader::open(from)?;
        let (archive_first, archive_next) = (archive.first_seq()?, archive.next_seq()?);
        if archive_next != first {
            return Err(ArchiveError::NotContiguous { archive_end: archive_next - 1, first });
        }
        let read = archive.db.begin_read().map_err(JournalError::from)?;
        copy_entries(&read, &self.db, archive_first..archive_next)?;
        // Only now is the restored run readable.
        self.mark_first_kept(archive_first)?;
        Ok(archive_next - archive_first)
    }

    /// Records, durably, that the journal's first entry is now `first`.
    fn mark_first_kept(&mut self, first: u64) -> Result<()> {
        let mut write = self.db.begin_write()?;
        write.set_durability(Durability::Immediate)?;
        write.open_table(JOURNAL_META)?.insert(ARCHIVED_BEFORE, first.to_le_bytes().as_slice())?;
        write.commit()?;
        Ok(())
    }

    /// Gives back the space archived entries left (redb keeps a file's
    /// pages otherwise, and reuses them). Needs the journal to itself.
    pub fn compact(&mut self) -> Result<bool, ArchiveError> {
        let db = std::sync::Arc::get_mut(&mut self.db).ok_or(ArchiveError::Shared)?;
        db.compact().map_err(|e| JournalError::Storage { op: Op::Archive, source: Box::new(e.into()) }.into())
    }
}

impl JournalReader {
    /// The first entry this file holds.
    pub fn first_seq(&self) -> Result<u64> {
        first_seq(&self.db.begin_read()?)
    }

    /// Up to `limit` entries after `seq`, in order.
    pub fn entries_range(&self, seq: u64, limit: usize) -> Result<Vec<crate::JournalEntry>> {
        crate::entries_range(&self.db.begin_read()?, seq, limit)
    }

    /// The entry after the last this file holds.
    pub fn next_seq(&self) -> Result<u64> {
        let read = self.db.begin_read()?;
        let last = read.open_table(JOURNAL)?.last()?.map(|(seq, _)| seq.value());
        Ok(match last {
            Some(last) => last + 1,
            None => first_seq(&read)?,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::JournalEntry;
    use gpux_engine::{AccountId, Command, Input};

    fn deposit(amount: u64) -> JournalEntry {
        JournalEntry::Engine(Input { at_ms: 1_800_000_000_000, command: Command::Deposit { account: AccountId(1), amount_minor: amount } })
    }

    /// A journal of the genesis listing and deposits 2..=`last`.
    fn journal(path: &Path, last: u64) -> (Journal, Vec<JournalEntry>) {
        let mut journal = Journal::open(path).expect("journal");
        let mut entries = vec![JournalEntry::Genesis { listing: Box::new(gpux_engine::EngineConfig::demo()) }];
        entries.extend((2..=last).map(deposit));
        journal.append(&entries).expect("appended");
        (journal, entries)
    }

    fn archived(path: &Path) -> (u64, Vec<JournalEntry>) {
        let reader = JournalReader::open(path).expect("archive");
        let first = reader.first_seq().expect("first");
        (first, reader.entries_range(first - 1, usize::MAX).expect("entries"))
    }

    #[test]
    fn archived_entries_move_to_the_archive_and_the_journal_goes_on_after_them() {
        let dir = tempfile::tempdir().expect("dir");
        let (path, archive) = (dir.path().join("journal.redb"), dir.path().join("archive-1.redb"));
        let (mut journal, entries) = journal(&path, 10);

        let outcome = journal.archive_before(6, &archive).expect("archived");
        assert_eq!(outcome, ArchiveOutcome { copied: 5, first_kept: 6 });
        assert_eq!(journal.first_seq().expect("first"), 6);
        assert_eq!(journal.entries_after(5).expect("the rest"), entries[5..]);
        let refused = journal.entries_after(0).expect_err("archived entries are not read as a gap");
        assert!(matches!(refused, JournalError::Archived { from: 1, to: 6, .. }), "{refused:#}");
        assert_eq!(journal.next_seq(), 11);
        drop(journal);
        assert_eq!(archived(&archive), (1, entries[..5].to_vec()));

        // Reopened, it appends after its last entry; its genesis listing is kept.
        let mut journal = Journal::open(&path).expect("reopened");
        assert_eq!(journal.next_seq(), 11);
        assert_eq!(journal.append(&[deposit(11)]).expect("appended"), 11);
        drop(journal);
        let reader = JournalReader::open(&path).expect("reader");
        assert_eq!(reader.genesis_listing().expect("listing"), gpux_engine::EngineConfig::demo());
        drop(reader);

        // The same archive goes on; a new one starts where the journal does.
        let mut journal = Journal::open(&path).expect("reopened");
        assert_eq!(journal.archive_before(8, &archive).expect("more").copied, 2);
        assert_eq!(archived(&archive), (1, entries[..7].to_vec()));
        let second = dir.path().join("archive-2.redb");
        assert_eq!(journal.archive_before(12, &second).expect("all").first_kept, 12);
        let (first, mut rest) = archived(&second);
        assert_eq!(first, 8);
        assert_eq!(rest.pop(), Some(deposit(11)));
        assert_eq!(rest, entries[7..]);
        // Everything archived: reopened, it still goes on at 12.
        drop(journal);
        let mut journal = Journal::open(&path).expect("reopened");
        assert_eq!(journal.next_seq(), 12);

        // Restored, newest archive first, it reads whole again.
        match journal.restore_from(&archive) {
            Err(ArchiveError::NotContiguous { archive_end: 7, first: 12 }) => {}
            other => panic!("the older archive first: {other:?}"),
        }
        assert_eq!(journal.restore_from(&second).expect("restored"), 4);
        assert_eq!(journal.restore_from(&archive).expect("restored"), 7);
        let mut all = entries.clone();
        all.push(deposit(11));
        assert_eq!(journal.first_seq().expect("first"), 1);
        assert_eq!(journal.entries_after(0).expect("every entry"), all);
    }

    #[test]
    fn an_archive_must_end_where_the_journal_starts_and_the_move_stays_within_the_journal() {
        let dir = tempfile::tempdir().expect("dir");
        let path = dir.path().join("journal.redb");
        let (first_archive, second_archive) = (dir.path().join("a1.redb"), dir.path().join("a2.redb"));
        let (mut journal, _) = journal(&path, 10);
        journal.archive_before(4, &first_archive).expect("archived");
        journal.archive_before(7, &second_archive).expect("archived");
        match journal.archive_before(9, &first_archive) {
            Err(ArchiveError::NotContiguous { archive_end: 3, first: 7 }) => {}
            other => panic!("{other:?}"),
        }
        match journal.archive_before(12, &second_archive) {
            Err(ArchiveError::PastTheEnd { before: 12, next: 11 }) => {}
            other => panic!("{other:?}"),
        }
        assert_eq!(journal.first_seq().expect("first"), 7, "nothing moved");
    }

    /// A move cut short after copying (the journal's copy taken before the
    /// move stands for the crash): repeated, it copies only what the
    /// archive lacks and the journal ends as after one move.
    #[test]
    fn a_move_cut_short_is_finished_by_repeating_it() {
        let dir = tempfile::tempdir().expect("dir");
        let (path, archive) = (dir.path().join("journal.redb"), dir.path().join("archive.redb"));
        let (journal, entries) = journal(&path, 10);
        drop(journal);
        let copy = dir.path().join("copy.redb");
        std::fs::copy(&path, &copy).expect("copied");
        Journal::open(&copy).expect("copy").archive_before(4, &archive).expect("archived from the copy");

        let mut journal = Journal::open(&path).expect("journal");
        assert_eq!(journal.first_seq().expect("first"), 1, "the journal itself was not changed");
        assert_eq!(journal.archive_before(6, &archive).expect("finished"), ArchiveOutcome { copied: 2, first_kept: 6 });
        drop(journal);
        assert_eq!(archived(&archive), (1, entries[..5].to_vec()), "nothing twice, nothing missing");
    }
}
