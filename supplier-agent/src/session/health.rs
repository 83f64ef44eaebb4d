//! After a delivery the host failed: its GPUs stay off sale (offline at the
//! exchange) until the failed lease ended and a health check passed, with a
//! back-off that grows with failures in a row (docs/agent.md "Delivery").

use std::collections::BTreeMap;
use std::time::Duration;

use anyhow::Result;
use gpux_client::Connection;
use gpux_engine::LeaseId;
use gpux_protocol::{ClientMessage, ServerMessage};

use super::host::Host;
use crate::delivery::DeliveryBackend;
use crate::limits::HEALTH_BACKOFF_MAX;

pub(super) struct HostHealth {
    /// Leases the host failed that are still active, with their GPU masks.
    failed_leases: BTreeMap<LeaseId, u64>,
    /// Host failures since the last workload that reached `running`.
    failures_in_row: u32,
    /// The first wait after a failure (`delivery.health_backoff_ms`).
    backoff: Duration,
    /// The wait before the next check (doubles while checks fail).
    wait: Duration,
    /// When the next check is due (this host's clock).
    check_at: Option<tokio::time::Instant>,
}

impl HostHealth {
    pub(super) fn new(backoff: Duration) -> HostHealth {
        HostHealth { failed_leases: BTreeMap::new(), failures_in_row: 0, backoff, wait: Duration::ZERO, check_at: None }
    }

    /// The wait after `in_row` failures in a row.
    fn wait_after(&self, in_row: u32) -> Duration {
        (self.backoff * 2u32.saturating_pow(in_row.saturating_sub(1).min(12))).min(HEALTH_BACKOFF_MAX)
    }

    /// The host failed a lease's delivery.
    pub(super) fn host_failed(&mut self, lease: LeaseId, mask: u64) {
        self.failures_in_row += 1;
        self.failed_leases.insert(lease, mask);
    }

    /// A workload reached `running`: the failures in a row are over.
    pub(super) fn ran(&mut self) {
        self.failures_in_row = 0;
    }

    /// A lease ended; when the host had failed it, the first check is
    /// scheduled.
    pub(super) fn lease_ended(&mut self, lease: LeaseId) {
        if self.failed_leases.remove(&lease).is_none() {
            return;
        }
        // GPUs the host failed on come back only through the health check.
        self.wait = self.wait_after(self.failures_in_row);
        self.check_at = Some(tokio::time::Instant::now() + self.wait);
        tracing::warn!(%lease, failures_in_row = self.failures_in_row, check_in_ms = self.wait.as_millis() as u64, "the host failed this lease's delivery: its GPUs stay off sale until a health check passes");
    }

    /// A restarted agent keeps the back-off of the one before it: when the
    /// host's public record shows host-side delivery failures in a row and
    /// the exchange has its GPUs offline, they stay off sale until a health
    /// check passes, first after the wait that count calls for.
    pub(super) async fn resume(&mut self, connection: &mut Connection, host: &mut Host) -> Result<()> {
        if self.check_at.is_some() {
            return Ok(());
        }
        let Some(host_id) = host.id() else { return Ok(()) };
        let id = connection.new_id();
        let ServerMessage::SupplierStats { hosts, .. } =
            connection.request(ClientMessage::SupplierStats { id, supplier: connection.account }).await?
        else {
            return Ok(());
        };
        let in_row = hosts.iter().find(|h| h.host == host_id).map_or(0, |h| h.record.failed_deliveries_in_row);
        let offline = host.gpus.iter().filter(|g| !g.info.online).count();
        if in_row == 0 || offline == 0 {
            return Ok(());
        }
        for gpu in host.gpus.iter_mut().filter(|g| !g.info.online) {
            gpu.delivery_failed = true;
            gpu.healthy = false;
        }
        self.failures_in_row = in_row;
        self.wait = self.wait_after(in_row);
        self.check_at = Some(tokio::time::Instant::now() + self.wait);
        tracing::warn!(
            failures_in_row = in_row,
            check_in_ms = self.wait.as_millis() as u64,
            "this host failed deliveries before the restart: its offline GPUs stay off sale until a health check passes"
        );
        Ok(())
    }

    /// Once every lease the host failed has ended and the back-off passed:
    /// the delivery backend must answer (the engine is up) for the GPUs it
    /// failed on to count as healthy again; a failed check doubles the wait.
    pub(super) async fn check(&mut self, backend: Option<&dyn DeliveryBackend>, host: &mut Host) {
        let Some(due) = self.check_at else { return };
        if !self.failed_leases.is_empty() || tokio::time::Instant::now() < due {
            return;
        }
        let outcome = match backend {
            Some(backend) => match tokio::time::timeout(Duration::from_secs(5), backend.health()).await {
                Ok(outcome) => outcome,
                Err(_) => Err("the health check timed out after 5 s".to_string()),
            },
            None => Ok(()),
        };
        match outcome {
            Ok(()) => {
                tracing::info!("health check passed: the GPUs the host failed on are offered again");
                self.check_at = None;
                for gpu in &mut host.gpus {
                    gpu.delivery_failed = false;
                }
            }
            Err(error) => {
                self.wait = (self.wait * 2).min(HEALTH_BACKOFF_MAX);
                self.check_at = Some(tokio::time::Instant::now() + self.wait);
                tracing::warn!(%error, check_in_ms = self.wait.as_millis() as u64, "health check failed: the GPUs stay off sale");
            }
        }
    }
}
