//! The sequencer's sessions as a type of their own (exchange-core's habit
//! of one stage per concern): every open connection, the account each
//! logged in as, the accounts' present sessions (the WebSocket sessions
//! their events go to) and when each session's key expires. The sequencer
//! decides what a login, a subscription or a disconnect does; this type
//! keeps the three indexes consistent with each other.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use gpux_engine::{AccountId, InstrumentId};
use gpux_gateway::link::{ConnectionId, Outbound};
use gpux_protocol::Channel;

/// One open connection as the sequencer sees it.
pub(super) struct ConnectionState {
    pub outbound: Outbound,
    pub account: Option<AccountId>,
    pub subscriptions: BTreeSet<(Channel, InstrumentId)>,
    /// Cancel the orders this session placed when it ends, and the
    /// account's others too when it was the account's last session.
    pub cancel_on_disconnect: bool,
    /// With `cancel_on_disconnect`: the orders this session placed (some
    /// may have closed since; pruned to the live ones when it holds twice
    /// the account's order limit).
    pub orders: BTreeSet<gpux_engine::OrderId>,
    /// The key it logged in with, and when that key expires.
    pub key: Option<[u8; 32]>,
    pub key_expires_at_ms: Option<u64>,
    /// A WebSocket session (the account's presence), not one REST request's.
    pub presence: bool,
    /// Leases this session (a supplier's agent) reported delivery status
    /// for: the agent that runs them, asked for their logs (the newest
    /// `DELIVERED_KEPT_MAX`).
    pub delivered: BTreeSet<gpux_engine::LeaseId>,
}

/// Leases a session remembers having delivered (the oldest forgotten first).
const DELIVERED_KEPT_MAX: usize = 4_096;

/// What a connection logged in as (`Sessions::log_in`).
pub(super) struct Bound {
    pub account: AccountId,
    pub key: [u8; 32],
    pub key_expires_at_ms: Option<u64>,
    pub cancel_on_disconnect: bool,
    pub presence: bool,
}

#[derive(Default)]
pub(super) struct Sessions {
    connections: BTreeMap<ConnectionId, ConnectionState>,
    /// Each account's present sessions (none: the account is not connected).
    present: HashMap<AccountId, BTreeSet<ConnectionId>>,
    /// Sessions whose key expires, by when.
    expiring: BTreeSet<(u64, ConnectionId)>,
}

impl Sessions {
    pub(super) fn get(&self, connection: ConnectionId) -> Option<&ConnectionState> {
        self.connections.get(&connection)
    }

    pub(super) fn get_mut(&mut self, connection: ConnectionId) -> Option<&mut ConnectionState> {
        self.connections.get_mut(&connection)
    }

    pub(super) fn contains(&self, connection: ConnectionId) -> bool {
        self.connections.contains_key(&connection)
    }

    /// A new connection, not logged in, answered through `outbound`.
    pub(super) fn open(&mut self, connection: ConnectionId, outbound: Outbound) {
        let state = ConnectionState {
            outbound,
            account: None,
            subscriptions: BTreeSet::new(),
            cancel_on_disconnect: false,
            orders: BTreeSet::new(),
            key: None,
            key_expires_at_ms: None,
            presence: false,
            delivered: BTreeSet::new(),
        };
        self.connections.insert(connection, state);
    }

    /// Binds an open connection to the account it logged in as.
    pub(super) fn log_in(&mut self, connection: ConnectionId, bound: Bound) {
        let Some(state) = self.connections.get_mut(&connection) else { return };
        state.account = Some(bound.account);
        state.cancel_on_disconnect = bound.cancel_on_disconnect && bound.presence;
        state.key = Some(bound.key);
        state.key_expires_at_ms = bound.key_expires_at_ms;
        state.presence = bound.presence;
        if bound.presence {
            self.present.entry(bound.account).or_default().insert(connection);
        }
        if let Some(at_ms) = bound.key_expires_at_ms {
            self.expiring.insert((at_ms, connection));
        }
    }

    /// Removes a connection: it, and whether it was its account's last
    /// present session.
    pub(super) fn close(&mut self, connection: ConnectionId) -> Option<(ConnectionState, bool)> {
        let state = self.connections.remove(&connection)?;
        if let Some(at_ms) = state.key_expires_at_ms {
            self.expiring.remove(&(at_ms, connection));
        }
        let last =
            match state.account.filter(|_| state.presence).and_then(|account| self.present.get_mut(&account).map(|set| (account, set))) {
                Some((account, set)) => {
                    set.remove(&connection);
                    let last = set.is_empty();
                    if last {
                        self.present.remove(&account);
                    }
                    last
                }
                None => true,
            };
        Some((state, last))
    }

    /// `connection` reported a delivery status for `lease`: its agent runs it.
    pub(super) fn delivered(&mut self, connection: ConnectionId, lease: gpux_engine::LeaseId) {
        let Some(state) = self.connections.get_mut(&connection) else { return };
        state.delivered.insert(lease);
        while state.delivered.len() > DELIVERED_KEPT_MAX {
            state.delivered.pop_first();
        }
    }

    /// The present session of `account` that runs `lease` (the newest that
    /// reported it), if any.
    pub(super) fn runner_of(&self, account: AccountId, lease: gpux_engine::LeaseId) -> Option<ConnectionId> {
        let present = self.present.get(&account)?;
        present.iter().rev().copied().find(|c| self.connections.get(c).is_some_and(|s| s.delivered.contains(&lease)))
    }

    /// The account's present sessions.
    pub(super) fn of(&self, account: AccountId) -> Vec<ConnectionId> {
        self.present.get(&account).map(|set| set.iter().copied().collect()).unwrap_or_default()
    }

    /// Whether the account has a present session.
    pub(super) fn is_present(&self, account: AccountId) -> bool {
        self.present.get(&account).is_some_and(|set| !set.is_empty())
    }

    /// The sessions logged in with a key `which` picks.
    pub(super) fn logged_in_with(&self, which: impl Fn(&[u8; 32]) -> bool) -> Vec<ConnectionId> {
        self.connections.iter().filter(|(_, c)| c.key.as_ref().is_some_and(&which)).map(|(&connection, _)| connection).collect()
    }

    /// Whether a session's key expires by `now_ms`.
    pub(super) fn expiry_due(&self, now_ms: u64) -> bool {
        self.expiring.first().is_some_and(|(at_ms, _)| *at_ms <= now_ms)
    }

    /// The next session whose key expired by `now_ms`, taken off the
    /// expiry index (the caller closes it).
    pub(super) fn take_expired(&mut self, now_ms: u64) -> Option<ConnectionId> {
        match self.expiring.first() {
            Some(&(at_ms, connection)) if at_ms <= now_ms => {
                self.expiring.pop_first();
                Some(connection)
            }
            _ => None,
        }
    }
}
