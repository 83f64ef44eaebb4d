//! gpux-client: the Rust client of the gpux exchange, shared by the `gpux`
//! CLI, the supplier agent and the simulator's live mode.
//!
//! One decision shapes it: a `Connection` is a plain sequential object
//! (send a request, wait for the message that answers its id, queue whatever
//! else arrives for `next`), not a background task with channels. Every user
//! here drives one conversation at a time, and a sequential client keeps the
//! order of pushed messages exactly as the exchange sent them.

pub mod store;

use std::time::{SystemTime, UNIX_EPOCH};

use ed25519_dalek::{Signer, SigningKey};
use futures_util::{SinkExt, StreamExt};
use gpux_engine::{AccountId, Role};
use gpux_protocol::*;
use tokio::net::TcpStream;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::{MaybeTlsStream, WebSocketStream};

/// Why a client call failed. Callers branch on the kind (the CLI tells a
/// refused key from an exchange it cannot reach; the agent stops for good
/// on a refused key and retries the rest), never on the text.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// No WebSocket to the exchange at `url` (refused, unresolvable, TLS, upgrade).
    #[error("connecting to {url}: {source}")]
    Connect {
        url: String,
        #[source]
        source: Box<tokio_tungstenite::tungstenite::Error>,
    },
    /// The exchange answered the login with an error: the key has no
    /// account (and no role was given to open one), or it is not an operator's.
    #[error("the exchange refused the key: {}: {message}", wire_code(code))]
    LoginRefused { code: ErrorCode, message: String },
    /// The exchange closed the connection (with its close frame's reason, if any).
    #[error("the exchange closed the connection{}", reason.as_ref().map(|r| format!(": {r}")).unwrap_or_default())]
    Closed { reason: Option<String> },
    /// The exchange sent a frame this client cannot decode (a newer protocol?).
    #[error("undecodable server message: {0}")]
    Undecodable(String),
    /// The exchange sent something other than what the protocol says comes next.
    #[error("unexpected message from the exchange: {0}")]
    Unexpected(String),
    /// The WebSocket failed after it was open.
    #[error("connection to the exchange failed: {0}")]
    Socket(#[from] Box<tokio_tungstenite::tungstenite::Error>),
}

impl From<tokio_tungstenite::tungstenite::Error> for ClientError {
    fn from(error: tokio_tungstenite::tungstenite::Error) -> Self {
        ClientError::Socket(Box::new(error))
    }
}

pub type Result<T, E = ClientError> = std::result::Result<T, E>;

/// An authenticated connection to the exchange, with request/answer by id.
/// Messages that arrive while waiting for an answer are queued for `next`.
pub struct Connection {
    socket: WebSocketStream<MaybeTlsStream<TcpStream>>,
    backlog: std::collections::VecDeque<ServerMessage>,
    next_id: u64,
    pub account: AccountId,
    /// The account's role as the exchange has it (`None` when anonymous).
    pub role: Option<Role>,
    /// The exchange's clock minus ours, measured at login.
    pub clock_offset_ms: i64,
}

/// Clock differences with the exchange above this are logged as a warning.
pub const CLOCK_SKEW_WARN_MS: i64 = 1_000;

impl Connection {
    /// Connects and logs in with `key`; `role` opens an account for a key
    /// the exchange does not know yet (`None`: the key must have one).
    pub async fn open(url: &str, key: &SigningKey, role: Option<Role>) -> Result<Connection> {
        Self::open_with(url, key, role, false).await
    }

    /// `open`, asking the exchange to cancel the account's open orders when
    /// its last session ends (an agent's asks must not outlive the agent).
    pub async fn open_with(url: &str, key: &SigningKey, role: Option<Role>, cancel_on_disconnect: bool) -> Result<Connection> {
        Self::open_invited(url, key, role, cancel_on_disconnect, None).await
    }

    /// `open_with` carrying an operator's invitation (`gpux invite`), which
    /// an exchange that opens accounts by invitation needs on a first login.
    pub async fn open_invited(
        url: &str,
        key: &SigningKey,
        role: Option<Role>,
        cancel_on_disconnect: bool,
        invite: Option<String>,
    ) -> Result<Connection> {
        let (mut socket, nonce, clock_offset_ms) = connect_challenged(url).await?;
        if clock_offset_ms.abs() > CLOCK_SKEW_WARN_MS {
            tracing::warn!(clock_offset_ms, "this host's clock differs from the exchange's; reports use the exchange's time");
        }
        let nonce: [u8; 32] = hex::decode(&nonce)
            .ok()
            .and_then(|n| n.try_into().ok())
            .ok_or_else(|| ClientError::Unexpected(format!("a challenge nonce that is not 32 hex bytes: {nonce}")))?;
        let auth = ClientMessage::Auth {
            id: 1,
            public_key: hex::encode(key.verifying_key().to_bytes()),
            signature: hex::encode(key.sign(&auth_payload(&nonce)).to_bytes()),
            role,
            cancel_on_disconnect,
            invite,
            market_data_version: None,
        };
        socket.send(Message::Text(encode_client_text(&auth).into())).await?;
        let mut backlog = std::collections::VecDeque::new();
        loop {
            match read(&mut socket).await? {
                ServerMessage::Authenticated { account, role, .. } => {
                    return Ok(Connection { socket, backlog, next_id: 1, account, role: Some(role), clock_offset_ms })
                }
                ServerMessage::Error { code, message, .. } => return Err(ClientError::LoginRefused { code, message }),
                other => backlog.push_back(other),
            }
        }
    }

    /// Sends a message without waiting for an answer.
    pub async fn send(&mut self, message: &ClientMessage) -> Result<()> {
        self.socket.send(Message::Text(encode_client_text(message).into())).await?;
        Ok(())
    }

    /// The next pushed message, or `None` if none arrives within `timeout`.
    pub async fn next_within(&mut self, timeout: std::time::Duration) -> Result<Option<ServerMessage>> {
        if let Some(message) = self.backlog.pop_front() {
            return Ok(Some(message));
        }
        match tokio::time::timeout(timeout, read(&mut self.socket)).await {
            Ok(message) => message.map(Some),
            Err(_) => Ok(None),
        }
    }

    /// Connects without logging in: public market data only (instruments,
    /// stats, book and trade subscriptions). `account` is meaningless here.
    pub async fn open_anonymous(url: &str) -> Result<Connection> {
        let (socket, _, clock_offset_ms) = connect_challenged(url).await?;
        Ok(Connection {
            socket,
            backlog: std::collections::VecDeque::new(),
            next_id: 1,
            account: AccountId(u32::MAX),
            role: None,
            clock_offset_ms,
        })
    }

    pub fn new_id(&mut self) -> u64 {
        self.next_id += 1;
        self.next_id
    }

    /// Sends a request and waits for the message answering its id.
    pub async fn request(&mut self, message: ClientMessage) -> Result<ServerMessage> {
        let id = message.id();
        self.socket.send(Message::Text(encode_client_text(&message).into())).await?;
        loop {
            let message = read(&mut self.socket).await?;
            if message.answer_to() == Some(id) {
                return Ok(message);
            }
            self.backlog.push_back(message);
        }
    }

    /// The next pushed message (private events, market data).
    pub async fn next(&mut self) -> Result<ServerMessage> {
        match self.backlog.pop_front() {
            Some(message) => Ok(message),
            None => read(&mut self.socket).await,
        }
    }
}

/// With several addresses (a cluster's nodes), how long a client tries
/// again while none accepts: during an election the old leader has stopped
/// serving and the new one not yet (docs/operations.md "What clients see on
/// a failure"). One address fails at once.
pub const FAILOVER_WINDOW: std::time::Duration = std::time::Duration::from_secs(10);
/// The wait between two passes over the addresses in that window.
const FAILOVER_RETRY: std::time::Duration = std::time::Duration::from_millis(250);

type Socket = WebSocketStream<MaybeTlsStream<TcpStream>>;

/// Connects (see [`connect`]) and reads the exchange's login challenge:
/// the socket, the nonce and the exchange's clock minus this one's. Given
/// several addresses, a pass where none accepts, or where the one that did
/// closed before its challenge (a leader stepping down), is tried again
/// for up to [`FAILOVER_WINDOW`].
async fn connect_challenged(url: &str) -> Result<(Socket, String, i64)> {
    let several = url.split(',').filter(|u| !u.trim().is_empty()).count() > 1;
    let started = std::time::Instant::now();
    loop {
        let attempt = async {
            let mut socket = connect(url).await?;
            match read(&mut socket).await? {
                ServerMessage::Challenge { nonce, server_time_ms } => Ok((socket, nonce, server_time_ms as i64 - now_ms() as i64)),
                other => Err(ClientError::Unexpected(format!("expected a challenge, got {other:?}"))),
            }
        };
        match attempt.await {
            Err(ClientError::Connect { .. } | ClientError::Closed { .. } | ClientError::Socket(_))
                if several && started.elapsed() < FAILOVER_WINDOW =>
            {
                tokio::time::sleep(FAILOVER_RETRY).await;
            }
            outcome => return outcome,
        }
    }
}

/// Connects to `url`, or, given several comma-separated addresses (the
/// nodes of a cluster: only the leader accepts), to the first that does;
/// the error names the last one tried.
async fn connect(url: &str) -> Result<Socket> {
    let mut failed = None;
    for url in url.split(',').map(str::trim).filter(|url| !url.is_empty()) {
        match tokio_tungstenite::connect_async(url).await {
            Ok((socket, _)) => return Ok(socket),
            Err(source) => failed = Some(ClientError::Connect { url: url.to_string(), source: Box::new(source) }),
        }
    }
    Err(failed.unwrap_or_else(|| ClientError::Connect {
        url: url.to_string(),
        source: Box::new(tokio_tungstenite::tungstenite::Error::Url(tokio_tungstenite::tungstenite::error::UrlError::NoHostName)),
    }))
}

async fn read(socket: &mut WebSocketStream<MaybeTlsStream<TcpStream>>) -> Result<ServerMessage> {
    loop {
        match socket.next().await.ok_or(ClientError::Closed { reason: None })?? {
            Message::Text(text) => return decode_server_text(&text).map_err(|e| ClientError::Undecodable(e.message)),
            Message::Binary(bytes) => return decode_server_binary(&bytes).map_err(|e| ClientError::Undecodable(e.message)),
            Message::Close(frame) => {
                return Err(ClientError::Closed { reason: frame.map(|f| format!("{} {}", u16::from(f.code), f.reason)) })
            }
            _ => continue,
        }
    }
}

pub fn now_ms() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64)
}

/// An error code as the protocol writes it (`key_revoked`).
fn wire_code(code: &ErrorCode) -> &'static str {
    code.name()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A stand-in for the node that wins an election: it starts listening
    /// only after `delay`, then sends a login challenge.
    fn late_node(port: u16, delay: std::time::Duration) -> tokio::task::JoinHandle<()> {
        tokio::spawn(async move {
            tokio::time::sleep(delay).await;
            let listener = tokio::net::TcpListener::bind(("127.0.0.1", port)).await.expect("the port is still free");
            let (stream, _) = listener.accept().await.expect("accepts");
            let mut socket = tokio_tungstenite::accept_async(stream).await.expect("upgrades");
            let challenge = ServerMessage::Challenge { nonce: "ab".repeat(32), server_time_ms: now_ms() };
            socket.send(Message::Text(gpux_protocol::encode_server_text(&challenge).into())).await.expect("sends");
            let _ = socket.next().await;
        })
    }

    fn free_port() -> u16 {
        std::net::TcpListener::bind("127.0.0.1:0").and_then(|l| l.local_addr()).map(|a| a.port()).expect("a free port")
    }

    #[tokio::test]
    async fn with_several_addresses_a_client_waits_out_an_election_and_with_one_fails_at_once() {
        let (old_leader, new_leader) = (free_port(), free_port());
        let node = late_node(new_leader, std::time::Duration::from_millis(1_500));
        let started = std::time::Instant::now();
        let url = format!("ws://127.0.0.1:{old_leader},ws://127.0.0.1:{new_leader}");
        Connection::open_anonymous(&url).await.expect("the new leader answers within the window");
        assert!(started.elapsed() >= std::time::Duration::from_millis(1_400), "it waited for the election");
        node.abort();

        let started = std::time::Instant::now();
        let alone = Connection::open_anonymous(&format!("ws://127.0.0.1:{}", free_port())).await;
        assert!(matches!(alone, Err(ClientError::Connect { .. })), "one address fails");
        assert!(started.elapsed() < std::time::Duration::from_secs(1), "at once");
    }
}
