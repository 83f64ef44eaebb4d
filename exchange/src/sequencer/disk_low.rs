//! New work refused while the data directory's disk is down to the
//! journal's reserve (docs/operations.md "Disk space").

use gpux_engine::Command;
use gpux_gateway::link::Body;

use super::Sequencer;

/// Whether a request is new work, which the exchange stops taking while
/// its disk is down to the journal's reserve (docs/operations.md "Disk
/// space"): orders, registrations, deposits, jobs, sub-accounts and keys.
/// Cancels, lease ends, delivery statuses, reports, reads and withdrawals
/// still pass: they end work, or are what the reserve is for.
pub(super) fn new_work(body: &Body) -> bool {
    use gpux_gateway::link::{AccessRequest, JobRequest, ServiceRequest};
    match body {
        // Every form of placing an order, and the other commands that add.
        Body::Command { command } => {
            command.new_order().is_some()
                || matches!(
                    command,
                    Command::ReplaceOrder { .. } | Command::Register { .. } | Command::Deposit { .. } | Command::OfferLease { .. }
                )
        }
        Body::Bid { .. } => true,
        Body::Job { request } => matches!(request, JobRequest::Submit { .. } | JobRequest::Resize { .. }),
        Body::Service { request } => {
            matches!(request, ServiceRequest::Create { .. } | ServiceRequest::Scale { .. } | ServiceRequest::Update { .. })
        }
        Body::Volume { request } => matches!(request, gpux_gateway::link::VolumeRequest::Create { .. }),
        Body::Access { request } => {
            matches!(request, AccessRequest::OpenSubAccount | AccessRequest::MoveFunds { .. } | AccessRequest::AddKey { .. })
        }
        _ => false,
    }
}

impl Sequencer {
    /// Watches the data directory's free space against the journal's
    /// reserve (`--disk-reserve-mib`).
    pub fn set_disk(&mut self, disk: std::sync::Arc<crate::disk::Disk>) {
        // Snapshots keep twice the reserve free, as the job store does.
        self.snapshots.set_reserve(disk.reserve_bytes().saturating_mul(2).max(crate::snapshots::SNAPSHOT_RESERVE_BYTES));
        self.disk = Some(crate::disk::DiskState::new(disk));
    }

    /// Takes no new work while the disk is down to the journal's reserve,
    /// and takes it again by itself once space is back.
    pub(super) fn check_disk(&mut self) {
        let now_ms = self.clock.now_ms();
        let Some(disk) = &mut self.disk else { return };
        if disk.check(now_ms) {
            let (free, reserve) = (disk.disk.free_bytes(), disk.disk.reserve_bytes());
            if disk.low() {
                tracing::error!(
                    free_bytes = free,
                    reserve_bytes = reserve,
                    "disk down to the journal's reserve: refusing new work (disk_low) until space comes back"
                );
            } else {
                tracing::warn!(free_bytes = free, reserve_bytes = reserve, "disk space back: taking new work again");
            }
            self.metrics.disk_low.set(i64::from(disk.low()));
        }
    }
}
