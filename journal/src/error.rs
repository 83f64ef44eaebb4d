//! What a journal operation could not do (redb's habit: a typed error that
//! names its operation and its cause, which callers may branch on, instead
//! of text).

use std::path::PathBuf;

/// The journal operation an error happened in.
#[derive(Clone, Copy, Debug, PartialEq, Eq, strum::Display)]
#[strum(serialize_all = "snake_case")]
pub enum Op {
    /// Not named yet (the operation names it as the error leaves it).
    Unnamed,
    Open,
    Append,
    Sync,
    Entries,
    Statement,
    RecentStatement,
    ArchivedLeases,
    ArchivedLease,
    ArchivedContract,
    ArchivedInstrument,
    Trades,
    Candles,
    Fills,
    AccountTransfers,
    FormatVersion,
    Archive,
}

#[derive(Debug, thiserror::Error)]
pub enum JournalError {
    /// The file could not be opened or created (missing, locked by another
    /// process, not a redb file, or a disk error).
    #[error("opening the journal {}: {source}", path.display())]
    Open { path: PathBuf, source: Box<redb::Error> },
    /// The storage failed: an I/O error, a full disk, a failed fsync.
    #[error("journal {op}: {source}")]
    Storage { op: Op, source: Box<redb::Error> },
    /// A stored record does not decode: the file is damaged or was written
    /// by a build this one cannot read.
    #[error("journal {op}: {what} does not decode: {message}")]
    Corrupt { op: Op, what: String, message: String },
    /// An index names a record that is not stored.
    #[error("journal {op}: {what} is indexed but not stored")]
    Missing { op: Op, what: String },
    /// The entries are not contiguous.
    #[error("journal {op}: a gap: expected entry {expected}, found {found}")]
    Gap { op: Op, expected: u64, found: u64 },
    /// Entries asked for were moved to the archive file.
    #[error("journal {op}: entries {from}..{to} are not in this journal: they were archived (put them back with `gpux-exchange journal restore`)")]
    Archived { op: Op, from: u64, to: u64 },
    /// The file's format is newer than this build's.
    #[error(transparent)]
    Format(#[from] crate::FormatError),
    /// A test told the journal to fail (`MemoryJournal::fail_appends`, `fail_reads`).
    #[error("journal {op}: failing as the test asked")]
    Injected { op: Op },
    /// The thread that wrote the journal is gone (it panicked): nothing
    /// more is written.
    #[error("journal append: the journal's thread stopped")]
    Stopped,
    /// A replicated journal could not commit or read through its cluster
    /// (not the leader, no majority in time, fenced).
    #[error("journal {op}: {message}")]
    Replication { op: Op, message: String },
}

impl JournalError {
    /// The operation it happened in.
    pub fn op(&self) -> Op {
        match self {
            JournalError::Open { .. } | JournalError::Format(_) => Op::Open,
            JournalError::Stopped => Op::Append,
            JournalError::Storage { op, .. }
            | JournalError::Corrupt { op, .. }
            | JournalError::Missing { op, .. }
            | JournalError::Gap { op, .. }
            | JournalError::Archived { op, .. }
            | JournalError::Injected { op }
            | JournalError::Replication { op, .. } => *op,
        }
    }

    /// Names the operation, if it is not named yet.
    pub fn during(mut self, named: Op) -> JournalError {
        if self.op() == Op::Unnamed {
            self.set_op(named);
        }
        self
    }

    fn set_op(&mut self, named: Op) {
        if let JournalError::Storage { op, .. }
        | JournalError::Corrupt { op, .. }
        | JournalError::Missing { op, .. }
        | JournalError::Gap { op, .. }
        | JournalError::Archived { op, .. }
        | JournalError::Injected { op }
        | JournalError::Replication { op, .. } = self
        {
            *op = named;
        }
    }
}

pub type Result<T, E = JournalError> = std::result::Result<T, E>;

// Small enough to return everywhere (redb's errors are boxed).
const _: () = assert!(std::mem::size_of::<JournalError>() <= 64);

/// Names the operation of a result's error.
pub trait During<T> {
    fn during(self, op: Op) -> Result<T>;
}

impl<T> During<T> for Result<T> {
    fn during(self, op: Op) -> Result<T> {
        self.map_err(|error| error.during(op))
    }
}

/// A record that does not decode.
pub(crate) fn corrupt(what: String, error: gpux_protocol::RecordError) -> JournalError {
    JournalError::Corrupt { op: Op::Unnamed, what, message: error.message }
}

/// A record an index names that is not stored.
pub(crate) fn missing(what: String) -> JournalError {
    JournalError::Missing { op: Op::Unnamed, what }
}

macro_rules! from_redb {
    ($($error:ty),*) => {
        $(impl From<$error> for JournalError {
            fn from(error: $error) -> Self {
                JournalError::Storage { op: Op::Unnamed, source: Box::new(error.into()) }
            }
        })*
    };
}

from_redb!(
    redb::Error,
    redb::DatabaseError,
    redb::TransactionError,
    redb::TableError,
    redb::StorageError,
    redb::CommitError,
    redb::SetDurabilityError,
    redb::CompactionError
);
