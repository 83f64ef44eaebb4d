//! A command's session with the exchange: connect (through a cluster's
//! election, within the client's failover window), log in, ask, and print a
//! write's whole outcome. Every command module uses it; it uses none of them.

use std::time::Duration;

use gpux_client::Connection;
use gpux_engine::{InstrumentId, Role};
use gpux_protocol::views::Instrument;
use gpux_protocol::{ClientMessage, ServerMessage};
use indicatif::ProgressBar;

use crate::{Failure, RoleArg};

/// A connection and what the exchange said about it.
pub struct Session {
    pub connection: Connection,
    pub(crate) role: Option<Role>,
    instruments: Option<Vec<Instrument>>,
}

fn unreachable_exchange(url: &str, error: gpux_client::ClientError) -> Failure {
    let text = error.to_string();
    if let gpux_client::ClientError::LoginRefused { code, .. } = error {
        if matches!(code, gpux_protocol::ErrorCode::InviteRequired | gpux_protocol::ErrorCode::InviteInvalid) {
            return Failure::Refused(format!(
                "{text}\n(send the exchange's operator your public key (`gpux keys show`); they run `gpux invite KEY --role ROLE` and give you the invitation for `gpux login --role ROLE --invite INVITATION`)"
            ));
        }
        if code == gpux_protocol::ErrorCode::TooManyAccounts {
            return Failure::Refused(format!("{text}\n(the exchange opens no more accounts; ask its operator)"));
        }
        if code != gpux_protocol::ErrorCode::AuthFailed {
            // Revoked, expired: the key itself is done; no account to open.
            return Failure::Refused(format!("{text}\n(ask the account's owner for a new key, or use another key of the account)"));
        }
        return Failure::Refused(format!(
            "{text}\n(a new key needs an account: `gpux login --role renter` (or supplier, aggregator) opens one)"
        ));
    }
    if url.split(',').any(|u| u.trim().starts_with("http://") || u.trim().starts_with("https://")) {
        return Failure::Usage(format!(
            "{url}: the exchange's clients speak WebSocket: write ws://HOST:PORT (wss:// with TLS), not http://; the REST API on the console port is another listener (docs/protocol.md)"
        ));
    }
    Failure::Unreachable(format!(
        "cannot reach the exchange at {url}: {text}\n(is it running? start it with `gpux-exchange` (docs/first-hour.md), or point --url (or GPUX_URL) at a running one)"
    ))
}

/// How long a command waits for its connection and login: the client's
/// failover window (a cluster electing a leader) and then some.
const OPEN_TIMEOUT: Duration = Duration::from_secs(gpux_client::FAILOVER_WINDOW.as_secs() + 5);

pub(crate) fn role_of(role: RoleArg) -> Role {
    match role {
        RoleArg::Renter => Role::Renter,
        RoleArg::Supplier => Role::Supplier,
        RoleArg::Aggregator => Role::Aggregator,
    }
}

pub fn spinner(message: &str) -> ProgressBar {
    let bar = ProgressBar::new_spinner();
    bar.set_message(message.to_string());
    bar.enable_steady_tick(Duration::from_millis(100));
    bar
}

impl Session {
    pub(crate) async fn login(
        url: &str,
        key: &ed25519_dalek::SigningKey,
        role: Option<Role>,
        invite: Option<String>,
    ) -> Result<Session, Failure> {
        let bar = spinner(&format!("connecting to {url}"));
        let opened = tokio::time::timeout(OPEN_TIMEOUT, Connection::open_invited(url, key, role, false, invite)).await;
        bar.finish_and_clear();
        let connection = match opened {
            Ok(Ok(connection)) => connection,
            Ok(Err(error)) => return Err(unreachable_exchange(url, error)),
            Err(_) => {
                return Err(Failure::Unreachable(format!("the exchange at {url} did not answer within {} s", OPEN_TIMEOUT.as_secs())))
            }
        };
        let mut session = Session { connection, role, instruments: None };
        session.adopt_currency().await;
        Ok(session)
    }

    /// Reads the exchange's currency from its listing, so amounts are typed
    /// and shown in it (an exchange that publishes none: US dollars).
    pub(crate) async fn adopt_currency(&mut self) {
        let id = self.connection.new_id();
        if let Ok(ServerMessage::Listing { listing, .. }) = self.connection.request(ClientMessage::Listing { id }).await {
            crate::money::set_currency(listing.currency);
        }
    }

    /// Market data needs no login: connect without a key.
    pub(crate) async fn anonymous(url: &str) -> Result<Session, Failure> {
        let bar = spinner(&format!("connecting to {url}"));
        let opened = tokio::time::timeout(OPEN_TIMEOUT, Connection::open_anonymous(url)).await;
        bar.finish_and_clear();
        match opened {
            Ok(Ok(connection)) => {
                let mut session = Session { connection, role: None, instruments: None };
                session.adopt_currency().await;
                Ok(session)
            }
            Ok(Err(error)) => Err(unreachable_exchange(url, error)),
            Err(_) => Err(Failure::Unreachable(format!("the exchange at {url} did not answer within {} s", OPEN_TIMEOUT.as_secs()))),
        }
    }

    /// Sends a request and returns its answer; a gateway error is a refusal.
    pub async fn ask(&mut self, message: ClientMessage, json: bool) -> Result<ServerMessage, Failure> {
        let answer = self.connection.request(message).await.map_err(|e| Failure::Unreachable(format!("{e:#}")))?;
        answered(answer, json)
    }

    pub(crate) async fn instrument_list(&mut self) -> Result<&[Instrument], Failure> {
        if self.instruments.is_none() {
            let id = self.connection.new_id();
            let list = match self.ask(ClientMessage::Instruments { id }, false).await? {
                ServerMessage::Instruments { instruments, .. } => instruments,
                other => return Err(Failure::Unreachable(format!("expected instruments, got {other:?}"))),
            };
            self.instruments = Some(list);
        }
        Ok(self.instruments.as_deref().unwrap_or_default())
    }

    /// Every instrument's symbol by id, for output people read.
    pub(crate) async fn symbols(&mut self) -> Result<std::collections::HashMap<InstrumentId, String>, Failure> {
        Ok(self.instrument_list().await?.iter().map(|i| (i.instrument, i.symbol.clone())).collect())
    }

    /// An instrument by symbol (case-insensitive) or id.
    pub async fn resolve(&mut self, name: &str) -> Result<InstrumentId, Failure> {
        let list = self.instrument_list().await?;
        if let Ok(id) = name.parse::<u32>() {
            if list.iter().any(|i| i.instrument.0 == id) {
                return Ok(InstrumentId(id));
            }
        }
        list.iter()
            .find(|i| i.symbol.eq_ignore_ascii_case(name))
            .map(|i| i.instrument)
            .ok_or_else(|| Failure::Usage(format!("no instrument `{name}`: `gpux instruments` lists them (e.g. H100-SXM-80G/SPOT)")))
    }
}

/// An answer as `Session::ask` gives it: printed as sent with `--json`; a
/// gateway error or an engine rejection is a refusal.
pub(crate) fn answered(answer: ServerMessage, json: bool) -> Result<ServerMessage, Failure> {
    if json {
        out!("{}", gpux_protocol::encode_server_text(&answer));
    }
    match answer {
        ServerMessage::Error { code, message, .. } => Err(Failure::Refused(format!("{}: {message}", code.name()))),
        ServerMessage::Reject { code, message, .. } => Err(Failure::Refused(format!("{}: {message}", code.name()))),
        answer => Ok(answer),
    }
}

/// A write's whole outcome (README.md, the `--json` paragraph). Without `--json`, the
/// acknowledgement in words. With it, the ack as the exchange sent it
/// (`ask` printed it), then every private event that follows within
/// 300 ms, each as the exchange sent it, then one line scripts read last:
/// `{"outcome":{"done":DONE,"journal_seq":N,"order":ID|null,"events":[KIND,..]}}`.
pub(crate) async fn written(s: &mut Session, answer: ServerMessage, what: &str, done: &str, json: bool) -> Result<(), Failure> {
    if !json {
        return acknowledged(answer, what);
    }
    let (journal_seq, order) = match &answer {
        ServerMessage::Ack { journal_seq, order, .. } => (Some(*journal_seq), order.map(|o| o.0)),
        _ => (None, None),
    };
    let mut events = Vec::new();
    while let Ok(Some(message)) = s.connection.next_within(Duration::from_millis(300)).await {
        out!("{}", gpux_protocol::encode_server_text(&message));
        if let ServerMessage::Private { event, .. } = message {
            events.push(event.kind.name().to_string());
        }
    }
    out!("{}", serde_json::json!({"outcome": {"done": done, "journal_seq": journal_seq, "order": order, "events": events}}));
    Ok(())
}

pub(crate) fn acknowledged(answer: ServerMessage, what: &str) -> Result<(), Failure> {
    if let ServerMessage::Ack { journal_seq, order, .. } = answer {
        match order {
            Some(order) => out!("{what}: order {} (journal entry {journal_seq})", order.0),
            None => out!("{what} (journal entry {journal_seq})"),
        }
    }
    Ok(())
}
