//! Sessions as the sequencer sees them: connections, the account each
//! logged in as (opening one on a first login), market-data subscriptions,
//! and what a disconnect cancels.

use gpux_engine::{AccountId, Command, EventKind, Input, InstrumentId, Role};
use gpux_market::keys::KeyRefusal;
use gpux_market::JournalEntry;
use gpux_protocol::{Channel, ErrorCode, ServerMessage};

use super::session_table::Bound;
use super::{error, opening, Pending, Sequencer, Target, SUBSCRIPTIONS_PER_CONNECTION_MAX};
use gpux_gateway::link::{ConnectionId, LoginOutcome, Outbound, Outgoing};

/// A login the gateway verified (`Request::Authenticate`).
pub(super) struct Login {
    pub public_key: [u8; 32],
    pub role: Option<Role>,
    pub cancel_on_disconnect: bool,
    pub presence: bool,
    pub invite: Option<String>,
    pub address: Option<std::net::IpAddr>,
}

impl Sequencer {
    /// Notes an order a `cancel_on_disconnect` session placed.
    pub(super) fn remember_session_order(&mut self, connection: ConnectionId, order: gpux_engine::OrderId) {
        let Some(state) = self.sessions.get_mut(connection).filter(|c| c.cancel_on_disconnect) else { return };
        state.orders.insert(order);
        let bound = 2 * self.market.engine().config().orders_per_account_max as usize;
        if state.orders.len() > bound {
            let engine = self.market.engine();
            state.orders.retain(|order| engine.order(*order).is_some());
        }
    }

    pub(super) fn connect(&mut self, connection: ConnectionId, outbound: Outbound) {
        self.sessions.open(connection, outbound);
    }

    /// The gateway verified the signature over the challenge: bind the key
    /// to its account, opening one with the role asked for on a first login
    /// when the exchange's opening policy lets it (`opening`).
    pub(super) fn authenticate(&mut self, connection: ConnectionId, id: u64, login: Login) {
        let Login { public_key, role, cancel_on_disconnect, presence, invite, address } = login;
        // A key revoked or expired never logs in (nor opens a new account).
        let now_ms = self.market.clock_ms();
        let refuse = |sequencer: &mut Self, reason: &str, code: ErrorCode| {
            sequencer.metrics.gateway.auth_failures.with_label_values(&[reason]).inc();
            sequencer.reply(connection, error(Some(id), code));
            sequencer.batch.pending.push((Target::Connection(connection), Pending::Control(Outgoing::Login(LoginOutcome::Refused))));
        };
        let access = match self.market.keys().access(&public_key, now_ms) {
            Ok(access) => access,
            Err(KeyRefusal::Revoked) => return refuse(self, "key_revoked", ErrorCode::KeyRevoked),
            Err(KeyRefusal::Expired) => return refuse(self, "key_expired", ErrorCode::KeyExpired),
        };
        let key_expires_at_ms = access.and_then(|access| access.expires_at_ms);
        let operator_key = self.operator_keys.contains(&public_key);
        let account = match (access.map(|access| access.account), role) {
            (Some(account), _) => account,
            (None, Some(Role::Operator) | None) if operator_key => match self.open_account(public_key, Role::Operator) {
                Some(account) => account,
                None => return refuse(self, "too_many_accounts", ErrorCode::TooManyAccounts),
            },
            (None, Some(Role::Operator)) => return refuse(self, "operator_key_unknown", ErrorCode::AuthFailed),
            (None, Some(_)) if self.disk.as_ref().is_some_and(crate::disk::DiskState::low) => {
                return refuse(self, "disk_low", ErrorCode::DiskLow);
            }
            (None, Some(role)) => {
                let accounts = self.market.engine().account_count();
                let operators: Vec<[u8; 32]> = self.operator_keys.iter().copied().collect();
                let first = opening::FirstLogin { public_key: &public_key, role, invite: invite.as_deref(), address };
                if let Err(refused) = self.openings.admit(first, accounts, &operators, now_ms) {
                    return refuse(self, refused.reason, refused.code);
                }
                match self.open_account(public_key, role) {
                    Some(account) => account,
                    None => return refuse(self, "too_many_accounts", ErrorCode::TooManyAccounts),
                }
            }
            (None, None) => return refuse(self, "no_account", ErrorCode::AuthFailed),
        };
        let role = self.market.engine().role(account).expect("bound accounts exist");
        let bound = Bound { account, key: public_key, key_expires_at_ms, cancel_on_disconnect, presence };
        self.sessions.log_in(connection, bound);
        let participant = self.market.engine().participant_of(account);
        let accepted = Outgoing::Login(LoginOutcome::Accepted { account, role, participant });
        self.batch.pending.push((Target::Connection(connection), Pending::Control(accepted)));
        self.reply(connection, ServerMessage::Authenticated { id, account, role });
    }

    fn open_account(&mut self, public_key: [u8; 32], role: Role) -> Option<AccountId> {
        let input = Input { at_ms: self.market.clock_ms(), command: Command::OpenAccount { role } };
        let (_, applied) = self.journal(JournalEntry::Engine(input))?;
        let account = applied.events.iter().find_map(|e| match e.kind {
            EventKind::AccountOpened { account, .. } => Some(account),
            _ => None,
        })?;
        self.journal(JournalEntry::BindKey { public_key, account })?;
        Some(account)
    }

    pub(super) fn subscribe(&mut self, connection: ConnectionId, id: u64, channel: Channel, instrument: InstrumentId) {
        if self.market.engine().instrument(instrument).is_none() {
            self.reply(connection, error(Some(id), ErrorCode::UnknownInstrument));
            return;
        }
        let Some(state) = self.sessions.get_mut(connection) else { return };
        if state.subscriptions.len() >= SUBSCRIPTIONS_PER_CONNECTION_MAX && !state.subscriptions.contains(&(channel, instrument)) {
            self.reply(connection, error(Some(id), ErrorCode::TooManySubscriptions));
            return;
        }
        let newly = state.subscriptions.insert((channel, instrument));
        self.reply(connection, ServerMessage::Subscribed { id, channel, instrument });
        if channel == Channel::Book {
            self.reply(connection, self.book_snapshot(instrument));
        }
        if newly {
            self.start_feed(connection, channel, instrument);
        }
    }

    pub(super) fn unsubscribe(&mut self, connection: ConnectionId, id: u64, channel: Channel, instrument: InstrumentId) {
        let removed = self.sessions.get_mut(connection).is_some_and(|c| c.subscriptions.remove(&(channel, instrument)));
        if removed {
            self.leave_link_feed(connection, channel, instrument);
            self.reply(connection, ServerMessage::Unsubscribed { id, channel, instrument });
            self.batch.pending.push((Target::Connection(connection), Pending::Control(Outgoing::FeedEnd { channel, instrument })));
        } else {
            self.reply(connection, error(Some(id), ErrorCode::NotSubscribed));
        }
    }

    /// An instrument's book once, without a subscription (public).
    pub(super) fn book(&mut self, connection: ConnectionId, id: u64, instrument: InstrumentId) {
        let reply = match self.book_snapshot(instrument) {
            _ if self.market.engine().instrument(instrument).is_none() => error(Some(id), ErrorCode::UnknownInstrument),
            ServerMessage::BookSnapshot { instrument, seq, bids, asks } => ServerMessage::Book { id, instrument, seq, bids, asks },
            other => other,
        };
        self.reply(connection, reply);
    }

    fn book_snapshot(&self, instrument: InstrumentId) -> ServerMessage {
        let engine = self.market.engine();
        let levels = gpux_protocol::BOOK_SNAPSHOT_LEVELS_MAX;
        ServerMessage::BookSnapshot {
            instrument,
            seq: self.market.book_seq(instrument),
            bids: engine.depth_best(instrument, gpux_engine::Side::Buy, levels),
            asks: engine.depth_best(instrument, gpux_engine::Side::Sell, levels),
        }
    }

    /// Hands the connection a receiver of the feed from now on; updates
    /// older than a snapshot sent just before carry a seq the client ignores.
    fn start_feed(&mut self, connection: ConnectionId, channel: Channel, instrument: InstrumentId) {
        // A remote gateway's connection: its link carries the feed (once
        // for all of the gateway's subscribers), from this point of the
        // sequencer's order on.
        let link = self.sessions.get(connection).and_then(|c| c.outbound.frames.link());
        let feed = self.fanout.join((channel, instrument), connection, link);
        self.batch.pending.push((Target::Connection(connection), Pending::Control(Outgoing::FeedStart { channel, instrument, feed })));
    }

    /// A subscriber lost its place in a feed: the book it missed is conflated
    /// into one fresh snapshot (levels by price, the current seq), then the
    /// feed resumes from there; trades resume with a gap in `seq`.
    pub(super) fn resync(&mut self, connection: ConnectionId, channel: Channel, instrument: InstrumentId) {
        let subscribed = self.sessions.get(connection).is_some_and(|state| state.subscriptions.contains(&(channel, instrument)));
        if !subscribed {
            return;
        }
        self.metrics.feed_resyncs.inc();
        if channel == Channel::Book {
            self.reply(connection, self.book_snapshot(instrument));
        }
        self.start_feed(connection, channel, instrument);
    }

    /// A remote gateway's connection left a feed: the link stops carrying
    /// it once none of the gateway's connections is subscribed.
    fn leave_link_feed(&mut self, connection: ConnectionId, channel: Channel, instrument: InstrumentId) {
        let Some(link) = self.sessions.get(connection).and_then(|c| c.outbound.frames.link()).map(|l| l.id) else { return };
        self.fanout.leave_link((channel, instrument), connection, link);
    }

    pub(super) fn disconnect(&mut self, connection: ConnectionId, exchange_stopping: bool) {
        let feeds: Vec<(Channel, InstrumentId)> =
            self.sessions.get(connection).map(|c| c.subscriptions.iter().copied().collect()).unwrap_or_default();
        for (channel, instrument) in feeds {
            self.leave_link_feed(connection, channel, instrument);
        }
        let Some((state, last)) = self.sessions.close(connection) else { return };
        let Some(account) = state.account.filter(|_| state.presence) else { return };
        if state.cancel_on_disconnect && last {
            // Journaled like any command, so replay cancels the same orders.
            self.apply_command(None, 0, Command::MassCancel { account, instrument: None });
        } else if state.cancel_on_disconnect {
            // The account's other sessions go on (a supplier's other hosts,
            // docs/agent.md "Clusters"): only what this one placed goes.
            for order in state.orders {
                if self.market.engine().order(order).is_some_and(|o| o.account == account) {
                    self.apply_command(None, 0, Command::CancelOrder { account, order });
                }
            }
        }
        // A supplier gone while it supplies leases: a fact of its record.
        if last && !exchange_stopping && !self.market.engine().active_leases_supplied(account).is_empty() {
            let at_ms = self.market.clock_ms();
            self.journal(gpux_market::JournalEntry::SupplierDisconnected { at_ms, account });
        }
    }
}
