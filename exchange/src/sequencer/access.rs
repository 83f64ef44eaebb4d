//! Sub-accounts and API keys as the sequencer serves them (docs/protocol.md
//! "Sub-accounts", "Keys and scopes"): the scope check every request passes,
//! the requests that open, fund and limit sub-accounts and add and revoke
//! keys, and closing the sessions of a key revoked or expired.

use gpux_engine::{Command, EventKind, Input};
use gpux_gateway::link::{AccessRequest, ConnectionId, Outgoing, Request};
use gpux_market::keys::KeyRefusal;
use gpux_market::JournalEntry;
use gpux_protocol::views;
use gpux_protocol::{ErrorCode, ServerMessage, ORDERS_PAGE_MAX};

use super::{error, Pending, Sequencer, Target};

impl Sequencer {
    /// Whether the connection's key may send `request` now: a connection
    /// that has not logged in sends public requests only
    /// (`not_authenticated`); a key revoked or expired since login closes
    /// its session; a key without the request's scope is refused
    /// (`scope_denied`).
    pub(super) fn permitted(&mut self, request: &Request) -> bool {
        let Some(scope) = request.scope() else { return true };
        let connection = request.connection();
        let Some(key) = self.sessions.get(connection).and_then(|c| c.key) else {
            // Only a public request comes before a login (`Body::is_public`;
            // the gateways hold to it, and this holds a link to it).
            self.reply(connection, error(request.id(), ErrorCode::NotAuthenticated));
            return false;
        };
        match self.market.keys().access(&key, self.market.clock_ms()) {
            Ok(Some(access)) if access.scopes.contains(scope) => true,
            Ok(Some(_)) => {
                self.metrics.scope_refusals.inc();
                self.reply(connection, error(request.id(), ErrorCode::ScopeDenied));
                false
            }
            Ok(None) | Err(KeyRefusal::Revoked) => {
                self.close_session(connection, request.id(), ErrorCode::KeyRevoked);
                false
            }
            Err(KeyRefusal::Expired) => {
                self.close_session(connection, request.id(), ErrorCode::KeyExpired);
                false
            }
        }
    }

    /// Tells the connection why and closes it once that is written.
    pub(super) fn close_session(&mut self, connection: ConnectionId, id: Option<u64>, code: ErrorCode) {
        self.reply(connection, error(id, code));
        self.batch.pending.push((Target::Connection(connection), Pending::Control(Outgoing::Close(code))));
    }

    /// Whether a session's key expires by now (closing it changes who
    /// receives what: the batch in flight is released first).
    pub(super) fn sessions_due(&self) -> bool {
        self.sessions.expiry_due(self.clock.now_ms())
    }

    /// Sessions whose key expired by now are closed (`key_expired`).
    pub(super) fn expire_sessions(&mut self) {
        let now = self.market.clock_ms();
        while let Some(connection) = self.sessions.take_expired(now) {
            if self.sessions.contains(connection) {
                self.close_session(connection, None, ErrorCode::KeyExpired);
            }
        }
    }

    pub(super) fn access(&mut self, connection: ConnectionId, id: u64, request: AccessRequest) {
        let Some(account) = self.account(connection) else { return };
        match request {
            AccessRequest::OpenSubAccount => self.open_sub_account(connection, id, account),
            AccessRequest::MoveFunds { sub_account, amount_minor, to_sub_account } => {
                let command = Command::MoveFunds { parent: account, sub_account, amount_minor, to_sub_account };
                self.apply_command(Some(connection), id, command);
            }
            AccessRequest::SetLimits { sub_account, limits } => {
                self.apply_command(Some(connection), id, Command::SetAccountLimits { parent: account, sub_account, limits });
            }
            AccessRequest::SubAccounts { offset } => self.sub_accounts(connection, id, account, offset),
            AccessRequest::AddKey { account: named, public_key, scopes, expires_at_ms, label } => {
                let target = named.unwrap_or(account);
                // A key grants only what the key adding it holds, and never
                // outlives it.
                let holds = self.session_scopes(connection);
                let adder_expires = self.session_expiry(connection);
                let outlives = adder_expires.is_some_and(|until| expires_at_ms.is_none_or(|at| at > until));
                if !holds.covers(scopes) || outlives {
                    self.metrics.scope_refusals.inc();
                    return self.reply(connection, error(Some(id), ErrorCode::ScopeDenied));
                }
                let at_ms = self.market.clock_ms();
                let checked = self.market.keys().check_add(
                    self.market.engine(),
                    account,
                    target,
                    &public_key,
                    (&scopes, expires_at_ms, &label),
                    at_ms,
                );
                if let Err(code) = checked {
                    return self.reply(connection, error(Some(id), code));
                }
                // The adding key is journaled: the new key is revoked with it.
                let entry = match self.sessions.get(connection).and_then(|c| c.key) {
                    Some(by_key) => {
                        JournalEntry::AddKeyBy { at_ms, by: account, by_key, account: target, public_key, scopes, expires_at_ms, label }
                    }
                    None => JournalEntry::AddKey { at_ms, by: account, account: target, public_key, scopes, expires_at_ms, label },
                };
                let Some((journal_seq, _)) = self.journal(entry) else { return };
                let reply = ServerMessage::KeyAdded { id, journal_seq, public_key: hex::encode(public_key), account: target };
                self.reply(connection, reply);
            }
            AccessRequest::RevokeKey { public_key } => self.revoke_key(connection, id, account, public_key),
            AccessRequest::Invoice { period, account: named, offset } => self.invoice(connection, id, account, named, period, offset),
            AccessRequest::Spend => {
                let spend = self.market.engine().spend_status(account);
                self.reply(connection, ServerMessage::Spend { id, spend: spend.as_ref().map(views::Spend::from) });
            }
            AccessRequest::Keys { account: named } => {
                let target = named.unwrap_or(account);
                if target != account && self.market.engine().parent_of(target) != Some(account) {
                    return self.reply(connection, error(Some(id), ErrorCode::NotYourSubAccount));
                }
                let keys = self.market.keys().keys_of(target);
                self.reply(connection, ServerMessage::Keys { id, account: target, keys });
            }
        }
    }

    fn open_sub_account(&mut self, connection: ConnectionId, id: u64, account: gpux_engine::AccountId) {
        // A sub-account is a row of the accounts table like any account:
        // `--accounts-max` bounds them together.
        if self.market.engine().account_count() >= self.openings.policy.accounts_max {
            return self.reply(connection, error(Some(id), ErrorCode::TooManyAccounts));
        }
        let input = Input { at_ms: self.market.clock_ms(), command: Command::OpenSubAccount { parent: account } };
        self.metrics.commands.inc();
        let Some((journal_seq, applied)) = self.journal(JournalEntry::Engine(input)) else { return };
        let reply = applied.events.iter().rev().find_map(|event| match event.kind {
            EventKind::SubAccountOpened { account, .. } => Some(ServerMessage::SubAccountOpened { id, journal_seq, account }),
            EventKind::Rejected { code, .. } => Some(self.reject(id, journal_seq, code)),
            _ => None,
        });
        if let Some(reply) = reply {
            self.reply(connection, reply);
        }
    }

    fn sub_accounts(&mut self, connection: ConnectionId, id: u64, account: gpux_engine::AccountId, offset: u32) {
        let engine = self.market.engine();
        let mut sub_accounts = engine.sub_accounts_of(account, offset as usize, ORDERS_PAGE_MAX);
        gpux_protocol::fit_page(&mut sub_accounts);
        let end = offset as usize + sub_accounts.len();
        let next_offset = (end < engine.sub_account_count(account)).then_some(end as u32);
        self.reply(connection, ServerMessage::SubAccounts { id, sub_accounts: views::of(&sub_accounts), next_offset });
    }

    /// Revokes a key and what it added, and theirs in turn; every open
    /// session of those keys ends.
    fn revoke_key(&mut self, connection: ConnectionId, id: u64, account: gpux_engine::AccountId, public_key: [u8; 32]) {
        if let Err(code) = self.market.keys().check_revoke(self.market.engine(), account, &public_key) {
            return self.reply(connection, error(Some(id), code));
        }
        // A key revokes only keys whose scopes are within its own.
        let target_scopes = self.market.keys().access(&public_key, self.market.clock_ms()).ok().flatten().map(|a| a.scopes);
        if target_scopes.is_some_and(|scopes| !self.session_scopes(connection).covers(scopes)) {
            self.metrics.scope_refusals.inc();
            return self.reply(connection, error(Some(id), ErrorCode::ScopeDenied));
        }
        let revoked = self.market.keys().lineage(&public_key);
        let at_ms = self.market.clock_ms();
        let Some((journal_seq, _)) = self.journal(JournalEntry::RevokeKey { at_ms, by: account, public_key }) else { return };
        self.reply(connection, ServerMessage::KeyRevoked { id, journal_seq, public_key: hex::encode(public_key) });
        // Ends after this batch's commit, like everything else the batch sends.
        for session in self.sessions.logged_in_with(|key| revoked.contains(key)) {
            self.close_session(session, None, ErrorCode::KeyRevoked);
        }
    }

    /// Checks an invoice request and hands it to the invoices' worker,
    /// which answers the connection itself.
    fn invoice(
        &mut self,
        connection: ConnectionId,
        id: u64,
        account: gpux_engine::AccountId,
        named: Option<gpux_engine::AccountId>,
        period: String,
        offset: u32,
    ) {
        let target = named.unwrap_or(account);
        let engine = self.market.engine();
        if target != account && engine.parent_of(target) != Some(account) {
            return self.reply(connection, error(Some(id), ErrorCode::NotYourSubAccount));
        }
        let now = self.market.clock_ms();
        let Some(bounds) = gpux_engine::time::month_bounds_ms(&period).filter(|&(_, end)| end <= now) else {
            return self.reply(connection, error(Some(id), ErrorCode::PeriodInvalid));
        };
        let mut hot_leases = gpux_settlement::invoice::LeaseRecords::new();
        let mut before = None;
        loop {
            let (page, more) = engine.leases_of(target, before, 1_000);
            before = page.last().map(|info| info.lease);
            for info in page {
                let symbol = engine.lease_symbol(info.lease).unwrap_or_default();
                hot_leases.insert(info.lease, (info, symbol));
            }
            if !more {
                break;
            }
        }
        let parent = engine.parent_of(target);
        let (Some(desk), Some(outbound)) = (&self.invoices, self.sessions.get(connection).map(|c| c.outbound.clone())) else {
            return self.reply(connection, error(Some(id), ErrorCode::InvoiceUnavailable));
        };
        let job =
            crate::invoices::InvoiceWork { outbound, id, account: target, parent, period, bounds, offset, hot_leases, only_leases: None };
        if !desk.submit(job) {
            self.reply(connection, error(Some(id), ErrorCode::InvoiceUnavailable));
        }
    }

    /// The exchange's public key, which signs invoices.
    pub(super) fn exchange_key(&mut self, connection: ConnectionId, id: u64) {
        match self.invoices.as_ref().map(|desk| desk.public_key.clone()) {
            Some(public_key) => self.reply(connection, ServerMessage::ExchangeKey { id, public_key }),
            None => self.reply(connection, error(Some(id), ErrorCode::InvoiceUnavailable)),
        }
    }

    /// When the key a connection logged in with expires (`None`: never).
    fn session_expiry(&self, connection: ConnectionId) -> Option<u64> {
        let key = self.sessions.get(connection).and_then(|c| c.key);
        key.and_then(|key| self.market.keys().access(&key, self.market.clock_ms()).ok().flatten()).and_then(|access| access.expires_at_ms)
    }

    /// The scopes of the key a connection logged in with.
    fn session_scopes(&self, connection: ConnectionId) -> gpux_protocol::Scopes {
        let key = self.sessions.get(connection).and_then(|c| c.key);
        key.and_then(|key| self.market.keys().access(&key, self.market.clock_ms()).ok().flatten())
            .map_or(gpux_protocol::Scopes::NONE, |access| access.scopes)
    }
}
