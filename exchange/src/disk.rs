//! The journal keeps its room (docs/operations.md "Disk space"): the last
//! `--disk-reserve-mib` of the data directory's file system is the
//! journal's alone. Everything else written beside it (the local job
//! store's objects, snapshots) is refused while it would leave less than
//! twice the reserve free; once free space falls below the reserve, the
//! sequencer takes no new work (`disk_low`) while cancels, lease ends and
//! reports still pass, and takes it again by itself once a quarter of the
//! reserve more is free.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

pub use crate::limits::DISK_RESERVE_BYTES_DEFAULT;

/// The data directory's file system, as the reserve sees it.
pub struct Disk {
    dir: PathBuf,
    reserve_bytes: u64,
    /// Free bytes at the last reading (a test may set them).
    forced_free: AtomicU64,
}

impl Disk {
    pub fn new(dir: &Path, reserve_bytes: u64) -> Disk {
        Disk { dir: dir.to_path_buf(), reserve_bytes, forced_free: AtomicU64::new(u64::MAX) }
    }

    /// The journal's reserve.
    pub fn reserve_bytes(&self) -> u64 {
        self.reserve_bytes
    }

    /// Free bytes for the exchange's (unprivileged) writes now; an
    /// unreadable file system reads as full, never as empty.
    pub fn free_bytes(&self) -> u64 {
        let forced = self.forced_free.load(Ordering::Relaxed);
        if forced != u64::MAX {
            return forced;
        }
        crate::snapshots::free_bytes(&self.dir).unwrap_or(0)
    }

    /// Whether writing `bytes` more beside the journal leaves it twice its
    /// reserve.
    pub fn others_may_write(&self, bytes: u64) -> bool {
        self.free_bytes().saturating_sub(bytes) >= self.reserve_bytes.saturating_mul(2)
    }

    /// Whether `path` is on the data directory's file system (whose room
    /// the reserve keeps).
    pub fn holds(&self, path: &Path) -> bool {
        use std::os::unix::fs::MetadataExt;
        match (std::fs::metadata(&self.dir), std::fs::metadata(path)) {
            (Ok(dir), Ok(other)) => dir.dev() == other.dev(),
            _ => false,
        }
    }
}

/// The sequencer's view: whether it takes new work, with hysteresis.
pub struct DiskState {
    pub disk: std::sync::Arc<Disk>,
    low: bool,
    checked_ms: u64,
}

/// How often the sequencer reads the free space.
pub const DISK_CHECK_MS: u64 = 250;

impl DiskState {
    pub fn new(disk: std::sync::Arc<Disk>) -> DiskState {
        DiskState { disk, low: false, checked_ms: 0 }
    }

    /// Reads the free space when due; true when the state changed.
    pub fn check(&mut self, now_ms: u64) -> bool {
        if now_ms < self.checked_ms.saturating_add(DISK_CHECK_MS) && self.checked_ms != 0 {
            return false;
        }
        self.checked_ms = now_ms.max(1);
        let free = self.disk.free_bytes();
        let reserve = self.disk.reserve_bytes;
        let low = if self.low { free < reserve + reserve / 4 } else { free < reserve };
        let changed = low != self.low;
        self.low = low;
        changed
    }

    /// Whether the disk is down to the journal's reserve.
    pub fn low(&self) -> bool {
        self.low
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn new_work_stops_below_the_reserve_and_comes_back_a_quarter_above_it() {
        let dir = tempfile::tempdir().expect("temp dir");
        let disk = std::sync::Arc::new(Disk::new(dir.path(), 100));
        let mut state = DiskState::new(disk.clone());
        let at = |free: u64| disk.forced_free.store(free, Ordering::Relaxed);
        let mut now = 1_000;
        let mut step = |state: &mut DiskState| {
            now += DISK_CHECK_MS;
            state.check(now);
            state.low()
        };
        at(300);
        assert!(!step(&mut state));
        assert!(disk.others_may_write(100) && !disk.others_may_write(101), "others keep twice the reserve");
        at(99);
        assert!(step(&mut state), "below the reserve");
        at(120);
        assert!(step(&mut state), "not yet a quarter above");
        at(125);
        assert!(!step(&mut state), "back by itself");
        at(110);
        assert!(!step(&mut state), "and stays until below the reserve again");
    }
}
