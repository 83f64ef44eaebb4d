//! Usage reports: every `report_interval_ms` a signed, hash-chained report
//! per leased GPU (the interval since its last, with the share of samples
//! that found it healthy), kept on disk until the exchange acknowledges it;
//! and the exchange's clock, which the reports are stamped in.

use anyhow::{bail, Result};
use ed25519_dalek::SigningKey;
use gpux_client::Connection;
use gpux_protocol::{ClientMessage, ServerMessage};

use super::host::{Billing, Host};
use super::now_ms;
use crate::limits::{CLOCK_DRIFT_NOTED_MS, CLOCK_SYNC_EVERY};
use crate::reports::{Interval, ReportBook};

pub(super) struct Reporting {
    pub(super) book: ReportBook,
    /// The exchange's clock minus ours, from the last login or clock sync.
    pub(super) clock_offset_ms: i64,
    /// When the offset was last measured.
    clock_synced_at: Option<tokio::time::Instant>,
    /// When this process began measuring (this host's clock): time before
    /// it, while the agent was down, was measured by nobody and is not billed.
    measuring_since_ms: Option<u64>,
}

impl Reporting {
    pub(super) fn new(book: ReportBook) -> Reporting {
        Reporting { book, clock_offset_ms: 0, clock_synced_at: None, measuring_since_ms: None }
    }

    /// Measuring begins (the agent's run starts).
    pub(super) fn start_measuring(&mut self) {
        self.measuring_since_ms = Some(now_ms());
    }

    /// The offset the login measured.
    pub(super) fn logged_in(&mut self, clock_offset_ms: i64) {
        self.clock_offset_ms = clock_offset_ms;
        self.clock_synced_at = Some(tokio::time::Instant::now());
    }

    /// An exchange time on this host's clock.
    pub(super) fn host_ms(&self, exchange_ms: u64) -> u64 {
        exchange_ms.saturating_add_signed(-self.clock_offset_ms)
    }

    pub(super) fn clock_sync_due(&self) -> bool {
        self.clock_synced_at.is_none_or(|at| at.elapsed() >= CLOCK_SYNC_EVERY)
    }

    /// Measures the exchange's clock again (a `ping`; its `pong` carries
    /// the exchange's time), so a host clock that drifts during a long
    /// session still stamps reports in the exchange's time.
    pub(super) async fn sync_clock(&mut self, connection: &mut Connection) -> Result<()> {
        let sent_ms = now_ms();
        let id = connection.new_id();
        let ServerMessage::Pong { server_time_ms, .. } = connection.request(ClientMessage::Ping { id }).await? else {
            bail!("a ping answered with something else than a pong");
        };
        let offset = super::clock_offset(sent_ms, now_ms(), server_time_ms);
        if (offset - self.clock_offset_ms).abs() > CLOCK_DRIFT_NOTED_MS {
            tracing::info!(was_ms = self.clock_offset_ms, now_ms = offset, "this host's clock drifted from the exchange's");
        }
        self.logged_in(offset);
        Ok(())
    }

    /// Signs a report per leased GPU for the time since its last report;
    /// forgets the leases reported to their end.
    pub(super) fn record(&mut self, host: &mut Host, key: &SigningKey) -> Result<()> {
        // Intervals are stated in the exchange's time, which leases are in too.
        let now = now_ms().saturating_add_signed(self.clock_offset_ms);
        // Time before this process began measuring was measured by nobody
        // (the agent was down): it is reported, but never as available.
        let measured_from = self.measuring_since_ms.map_or(u64::MAX, |ms| ms.saturating_add_signed(self.clock_offset_ms));
        let mut finished = Vec::new();
        for (&lease, state) in &host.leases {
            if state.billing == Billing::DeliveryPending && !state.ended {
                continue;
            }
            // An ended lease is reported up to its end as the exchange
            // stamped it, whatever this host's clock says: its chains are
            // closed right after, so a last interval cut short by a clock a
            // few ms behind would be followed by a new chain from the lease's
            // start (refused `replayed`; seen on an H200 host).
            let until = match state.end_ms {
                Some(end) if state.ended => end,
                Some(end) => end.min(now),
                None => now,
            };
            let mut done = state.ended;
            for gpu in host.gpus.iter_mut().filter(|g| state.gpu_mask & g.bit() != 0) {
                let start = self.book.next_start_ms(lease, &gpu.info.uuid, state.start_ms);
                if until <= start {
                    continue;
                }
                let window = std::mem::take(&mut gpu.window);
                let measured = until - start.max(measured_from).min(until);
                let available_ms = match window.samples {
                    _ if state.billing == Billing::HostFailed => 0,
                    0 if gpu.healthy => measured,
                    0 => 0,
                    samples => measured * (samples - window.unhealthy) as u64 / samples as u64,
                };
                let interval = Interval {
                    start_ms: start,
                    end_ms: until,
                    available_ms,
                    utilisation_percent: window.utilisation_sum.checked_div(window.samples as u64).unwrap_or(0) as u32,
                    memory_used_mib_max: window.memory_used_mib_max,
                    unhealthy_samples: window.unhealthy,
                    temperature_c_max: window.temperature_c_max,
                    power_w_mean: window.power_mw_sum.checked_div(window.power_samples as u64).map(|mw| (mw / 1_000) as u32),
                };
                self.book.record(lease, &gpu.info.uuid, interval, key)?;
                done &= state.end_ms.is_some_and(|end| until >= end);
            }
            if done {
                finished.push(lease);
            }
        }
        for lease in finished {
            host.leases.remove(&lease);
        }
        Ok(())
    }

    /// Sends queued reports in order until the queue is empty.
    pub(super) async fn send(&mut self, connection: &mut Connection) -> Result<()> {
        while let Some(report) = self.book.front().cloned() {
            let id = connection.new_id();
            match connection.request(ClientMessage::UsageReport { id, report: report.clone() }).await? {
                ServerMessage::UsageAccepted { .. } => {}
                ServerMessage::UsageRejected { code, message, .. } => {
                    tracing::error!(lease = %report.body.lease, seq = report.body.seq, ?code, %message, "usage report refused")
                }
                other => bail!("sending a usage report: {other:?}"),
            }
            self.book.acknowledge_front()?;
        }
        Ok(())
    }
}
