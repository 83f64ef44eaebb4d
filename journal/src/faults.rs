//! Storage faults at redb's storage seam, for tests (redb's own crash tests
//! inject them the same way): a [`FaultyBackend`] passes every call to a
//! real file until its [`Faults`] handle says otherwise, then answers as a
//! failing disk would: `ENOSPC` on writes and growth, `EIO` on writes or
//! on `fsync`, or a torn write (the first half of the bytes written, then
//! `EIO`: what a crash in the middle of a write leaves).

use std::fs::File;
use std::io;
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::Arc;

use redb::backends::FileBackend;
use redb::StorageBackend;

/// What the disk does now.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum Fault {
    None = 0,
    /// Writes and growth fail with `ENOSPC` (the file system is full).
    NoSpace = 1,
    /// Writes fail with `EIO`.
    WriteError = 2,
    /// `fsync` fails with `EIO`; writes go through.
    SyncError = 3,
    /// The next write stops half way with `EIO`; later ones fail too.
    TornWrite = 4,
}

/// The switch a test flips; clones share it.
#[derive(Clone, Debug, Default)]
pub struct Faults(Arc<AtomicU8>);

impl Faults {
    pub fn set(&self, fault: Fault) {
        self.0.store(fault as u8, Ordering::SeqCst);
    }

    fn now(&self) -> u8 {
        self.0.load(Ordering::SeqCst)
    }
}

/// A file backend that fails as its [`Faults`] say.
#[derive(Debug)]
pub struct FaultyBackend {
    inner: FileBackend,
    faults: Faults,
}

impl FaultyBackend {
    pub fn new(file: File, faults: Faults) -> io::Result<FaultyBackend> {
        let inner = FileBackend::new(file).map_err(io::Error::other)?;
        Ok(FaultyBackend { inner, faults })
    }
}

fn no_space() -> io::Error {
    io::Error::from_raw_os_error(28) // ENOSPC
}

fn io_error() -> io::Error {
    io::Error::from_raw_os_error(5) // EIO
}

impl StorageBackend for FaultyBackend {
    fn len(&self) -> Result<u64, io::Error> {
        self.inner.len()
    }

    fn read(&self, offset: u64, out: &mut [u8]) -> Result<(), io::Error> {
        self.inner.read(offset, out)
    }

    fn set_len(&self, len: u64) -> Result<(), io::Error> {
        if self.faults.now() == Fault::NoSpace as u8 && len > self.inner.len()? {
            return Err(no_space());
        }
        self.inner.set_len(len)
    }

    fn sync_data(&self) -> Result<(), io::Error> {
        if self.faults.now() == Fault::SyncError as u8 {
            return Err(io_error());
        }
        self.inner.sync_data()
    }

    fn write(&self, offset: u64, data: &[u8]) -> Result<(), io::Error> {
        match self.faults.now() {
            n if n == Fault::NoSpace as u8 => Err(no_space()),
            n if n == Fault::WriteError as u8 => Err(io_error()),
            n if n == Fault::TornWrite as u8 => {
                self.inner.write(offset, &data[..data.len() / 2])?;
                self.faults.set(Fault::WriteError);
                Err(io_error())
            }
            _ => self.inner.write(offset, data),
        }
    }

    fn close(&self) -> Result<(), io::Error> {
        self.inner.close()
    }
}
