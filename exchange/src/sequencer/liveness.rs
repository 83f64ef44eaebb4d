//! Renters' liveness and GPU probe observations (docs/market-rules.md
//! "Disputes"): checked against the renter's lease and key before
//! journaling; the market matches them against the supplier's usage reports.

use gpux_gateway::link::ConnectionId;
use gpux_market::JournalEntry;
use gpux_protocol::ServerMessage;

use super::{error, Sequencer};

impl Sequencer {
    /// A renter's liveness observation: checked, journaled, acknowledged
    /// (what it disputes reaches both parties as `usage_dispute_held`).
    pub(super) fn liveness(&mut self, connection: ConnectionId, id: u64, report: gpux_protocol::LivenessReport) {
        self.evidence(connection, id, |market, account, now| {
            market.check_liveness(account, &report, now).map(|()| JournalEntry::Liveness { at_ms: now, account, report })
        });
    }

    /// A renter's GPU probe observation: checked, journaled, acknowledged
    /// (what it disputes and proves reaches both parties as
    /// `usage_dispute_held`).
    pub(super) fn gpu_probe(&mut self, connection: ConnectionId, id: u64, report: Box<gpux_protocol::GpuProbeReport>) {
        self.evidence(connection, id, |market, account, now| {
            market.check_gpu_probe(account, &report, now).map(|()| JournalEntry::GpuProbe { at_ms: now, account, report })
        });
    }

    /// Renter evidence: `entry` checks it for the connection's account and
    /// makes its journal entry, or names the refusal; journaled and
    /// acknowledged, or refused.
    fn evidence(
        &mut self,
        connection: ConnectionId,
        id: u64,
        entry: impl FnOnce(&gpux_market::MarketState, gpux_engine::AccountId, u64) -> Result<JournalEntry, gpux_protocol::ErrorCode>,
    ) {
        let Some(account) = self.account(connection) else { return };
        let now = self.market.clock_ms();
        let reply = match entry(&self.market, account, now) {
            Err(code) => error(Some(id), code),
            Ok(entry) => match self.journal(entry) {
                Some((journal_seq, _)) => ServerMessage::Ack { id, journal_seq, order: None },
                None => return,
            },
        };
        self.reply(connection, reply);
    }
}
