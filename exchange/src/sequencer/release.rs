//! The release stage: what a batch produced, routed as it is applied and
//! sent once the batch is durable.

use gpux_gateway::link::{ConnectionId, Outgoing, QueueError, SharedFrame};
use gpux_market::{Applied, Audience};
use gpux_protocol::ServerMessage;

use super::{Pending, Sequencer, Target};

impl Sequencer {
    /// A REST request's session is not the account's presence, so the
    /// account's events do not reach it; those its own command caused (the
    /// frames for its account queued since `from`) do, before its answer
    /// (docs/rest.md "Writes").
    pub(super) fn echo_own_events(&mut self, connection: ConnectionId, from: usize) {
        let Some(state) = self.sessions.get(connection) else { return };
        let Some(account) = state.account.filter(|_| !state.presence) else { return };
        let own: Vec<std::sync::Arc<SharedFrame>> = self.batch.pending[from..]
            .iter()
            .filter_map(|(target, item)| match (target, item) {
                (Target::Account(to), Pending::Frame(frame)) if *to == account => Some(frame.clone()),
                _ => None,
            })
            .collect();
        self.batch.pending.extend(own.into_iter().map(|frame| (Target::Connection(connection), Pending::Frame(frame))));
    }

    /// Queues what an entry owes: market data once per feed, private events
    /// and delivery messages once per account (one shared frame).
    /// The notices are moved out of `applied` into frames (not copied).
    pub(super) fn route(&mut self, applied: &mut Applied) {
        self.metrics.observe_events(&applied.events);
        self.batch.transfers.extend_from_slice(&applied.transfers);
        self.batch.archived.append(&mut applied.archived);
        // A deleted volume's files go once its deletion is on disk.
        for (owner, volume) in applied.volumes_purged.drain(..) {
            self.batch.pending.push((Target::Store, Pending::Purge(owner, volume)));
        }
        for mut notice in applied.notices.drain(..) {
            // A job's attempt goes to its host with the token for its files
            // (the market, pure, holds no key to sign one).
            if let ServerMessage::JobAssigned { lease, store: store @ None, .. } = &mut notice.message {
                *store = self.host_store_grant(*lease);
            }
            // Likewise a lease's volumes.
            if let ServerMessage::VolumesAttached { lease, store: store @ None, .. } = &mut notice.message {
                *store = self.host_volume_store_grant(*lease);
            }
            let frame = SharedFrame::new(notice.message);
            match notice.to {
                Audience::Feed(channel, instrument) => self.batch.pending.push((Target::Feed(channel, instrument), Pending::Frame(frame))),
                Audience::Accounts(accounts) => {
                    for account in accounts.into_iter().flatten() {
                        self.batch.pending.push((Target::Account(account), Pending::Frame(frame.clone())));
                    }
                }
            }
        }
    }

    pub(super) fn reply(&mut self, connection: ConnectionId, message: ServerMessage) {
        self.batch.pending.push((Target::Connection(connection), Pending::Frame(SharedFrame::new(message))));
    }

    /// Rewrites the book-depth gauges, at most once a second.
    pub(super) fn refresh_depth(&mut self) {
        let now = self.market.clock_ms();
        if now < self.depth_refreshed_ms + 1_000 {
            return;
        }
        self.depth_refreshed_ms = now;
        // Expired windows drop out of the gauges.
        self.metrics.book_quantity.reset();
        let engine = self.market.engine();
        for instrument in engine.listed_instruments() {
            for (side, name) in [(gpux_engine::Side::Buy, "bid"), (gpux_engine::Side::Sell, "ask")] {
                let quantity: u64 = engine.depth(instrument.instrument, side).iter().map(|(_, q)| q).sum();
                self.metrics.book_quantity.with_label_values(&[instrument.symbol.as_str(), name]).set(quantity as i64);
            }
        }
    }

    /// Sends everything a batch produced, now that it is durable. A
    /// connection whose queue is full is told to close as a slow consumer.
    pub(super) fn release(&mut self, pending: Vec<(Target, Pending)>) {
        for (target, item) in pending {
            match (target, item) {
                (Target::Connection(connection), Pending::Frame(frame)) => self.send(connection, Outgoing::Frame(frame)),
                (Target::Connection(connection), Pending::Control(control)) => self.send(connection, control),
                (Target::Account(account), Pending::Frame(frame)) => {
                    for connection in self.sessions.of(account) {
                        self.send(connection, Outgoing::Frame(frame.clone()));
                    }
                }
                (Target::Feed(channel, instrument), Pending::Frame(frame)) => self.fanout.publish((channel, instrument), frame),
                (Target::Store, Pending::Purge(owner, volume)) => {
                    if let Some(issuer) = &self.job_store {
                        issuer.purge_volume(owner, volume);
                    }
                }
                (_, Pending::Control(_)) => unreachable!("controls go to one connection"),
                (_, Pending::Purge(..)) | (Target::Store, _) => unreachable!("purges go to the store, and only they"),
            }
        }
    }

    pub(super) fn send(&mut self, connection: ConnectionId, outgoing: Outgoing) {
        let Some(state) = self.sessions.get(connection) else { return };
        // Private frames are never dropped: a connection that cannot take
        // one more is closed instead (the gateway counts it).
        if let Err(QueueError::Full) = state.outbound.frames.try_send(outgoing) {
            state.outbound.too_slow.notify_one();
            self.disconnect(connection, false);
        }
    }
}
