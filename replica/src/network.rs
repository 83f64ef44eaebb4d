//! Raft between nodes over TCP: length-prefixed bincode frames, one
//! request and its reply at a time per connection, on a port of its own
//! (never the clients' or the gateways').
//!
//! A connection starts with a mutual challenge-response over the cluster's
//! secret (every node holds the same secret file; `gpux_protocol::peer_auth`):
//! the caller sends `gpuxraft`, the version, a fresh nonce and its node id
//! (u64 little-endian; 0 for an operator's `gpux-exchange cluster`
//! command); the node answers with its own nonce and its proof over both;
//! the caller checks it and sends its proof, which covers its node id. A
//! peer that cannot prove the secret is dropped before anything else is
//! read: an entry from outside the cluster must never reach the log, and a
//! captured handshake never works again. At most [`RAFT_HANDSHAKES_MAX`]
//! connections wait in their handshake at once, a quarter of them from one
//! address (a newcomer displaces its own address's oldest, or the oldest of
//! the address holding the most: `HandshakePool`), each for at most 5 s. Frames are bounded
//! ([`RAFT_FRAME_BYTES_MAX`]) before they are read. Besides Raft's own
//! calls a connection carries the operator's ([`crate::admin`]).
//!
//! Errors map as openraft expects: a connection that cannot be made is
//! `Unreachable` (Raft backs off), a connection that breaks mid-call is a
//! `Network` error (retried), an error the remote Raft returned is a
//! `RemoteError`; every call is bounded by the RPC's hard TTL.

use std::sync::Arc;
use std::time::Duration;

use openraft::error::{InstallSnapshotError, NetworkError, RPCError, RaftError, RemoteError, Unreachable};
use openraft::network::{RPCOption, RaftNetwork, RaftNetworkFactory};
use openraft::raft::{
    AppendEntriesRequest, AppendEntriesResponse, InstallSnapshotRequest, InstallSnapshotResponse, VoteRequest, VoteResponse,
};
use openraft::{AnyError, BasicNode};
use serde::{Deserialize, Serialize};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

use crate::admin::{AdminReply, AdminRequest, Handover};
use crate::{NodeId, Raft, TypeConfig};
use gpux_journal::JournalRead;
use gpux_market::JournalEntry;
use gpux_protocol::peer_auth::{self, HandshakePool, Role, Throttle, NONCE_BYTES};
use tokio_rustls::rustls::{ClientConfig, ServerConfig};

/// The largest Raft frame: a batch of log entries or a snapshot chunk
/// (openraft sends snapshots in 3 MiB chunks).
pub const RAFT_FRAME_BYTES_MAX: usize = 64 << 20;

/// The key both ends prove: SHA-256 of `gpux-raft-v1:` and the cluster's
/// secret (it never travels).
pub fn cluster_token(secret: &[u8]) -> [u8; 32] {
    use sha2::Digest;
    let mut hasher = sha2::Sha256::new();
    hasher.update(b"gpux-raft-v1:");
    hasher.update(secret);
    hasher.finalize().into()
}

/// What a connection starts with: magic, version, the caller's nonce and
/// its node id (the last 8 bytes: [`hello_node`]).
pub const HELLO_BYTES: usize = 8 + 2 + NONCE_BYTES + 8;
const RAFT_MAGIC: [u8; 8] = *b"gpuxraft";
/// This build's Raft protocol version; both ends must speak the same (raised
/// when what Raft carries, the engine's commands, gains a form an older
/// build cannot decode).
pub const RAFT_VERSION: u16 = 4;
const RAFT_DOMAIN: &[u8] = b"gpux-raft-v2";
/// Connections in their handshake at once.
pub const RAFT_HANDSHAKES_MAX: usize = 16;
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(5);

/// A Raft connection's byte stream: plain TCP, or TLS over it.
pub trait RaftIo: AsyncRead + AsyncWrite + Unpin + Send + Sync + 'static {}
impl<T: AsyncRead + AsyncWrite + Unpin + Send + Sync + 'static> RaftIo for T {}
type RaftStream = Box<dyn RaftIo>;

/// Connects to `addr` (TLS first when `tls` is given: the node's
/// certificate must name the host of `addr`) and proves the secret as node
/// `id`.
pub(crate) async fn connect(addr: &str, tls: Option<&Arc<ClientConfig>>, key: &[u8; 32], id: NodeId) -> Result<RaftStream, FrameError> {
    let tcp = TcpStream::connect(addr).await?;
    let _ = tcp.set_nodelay(true);
    let mut stream: RaftStream = match tls {
        None => Box::new(tcp),
        Some(tls) => {
            let name = gpux_protocol::tls::server_name(addr).map_err(|e| FrameError::Decode(e.to_string()))?;
            Box::new(tokio_rustls::TlsConnector::from(tls.clone()).connect(name, tcp).await?)
        }
    };
    client_handshake(&mut stream, key, id).await?;
    Ok(stream)
}

/// The node id a connection's hello names (not yet proven).
pub fn hello_node(hello: &[u8; HELLO_BYTES]) -> NodeId {
    u64::from_le_bytes(hello[HELLO_BYTES - 8..].try_into().expect("8 bytes"))
}

/// The caller's side of the handshake: proves the secret as node `id` and
/// checks that the node it reached holds it too.
pub(crate) async fn client_handshake<S: AsyncRead + AsyncWrite + Unpin>(
    stream: &mut S,
    key: &[u8; 32],
    id: NodeId,
) -> Result<(), FrameError> {
    let mine = peer_auth::nonce();
    let mut hello = [0u8; HELLO_BYTES];
    hello[..8].copy_from_slice(&RAFT_MAGIC);
    hello[8..10].copy_from_slice(&RAFT_VERSION.to_le_bytes());
    hello[10..10 + NONCE_BYTES].copy_from_slice(&mine);
    hello[HELLO_BYTES - 8..].copy_from_slice(&id.to_le_bytes());
    stream.write_all(&hello).await?;
    stream.flush().await?;
    let mut answer = [0u8; NONCE_BYTES + 32];
    stream.read_exact(&mut answer).await?;
    let theirs: [u8; NONCE_BYTES] = answer[..NONCE_BYTES].try_into().expect("32 bytes");
    let proof: [u8; 32] = answer[NONCE_BYTES..].try_into().expect("32 bytes");
    if !peer_auth::same(&peer_auth::proof(key, RAFT_DOMAIN, Role::Responder, &mine, &theirs, b""), &proof) {
        return Err(FrameError::Decode("the node does not hold this cluster's secret".into()));
    }
    let proof = peer_auth::proof(key, RAFT_DOMAIN, Role::Initiator, &mine, &theirs, &id.to_le_bytes());
    stream.write_all(&proof).await?;
    stream.flush().await?;
    Ok(())
}

/// The node's side: returns the caller's node id once it proved the secret.
async fn server_handshake<S: AsyncRead + AsyncWrite + Unpin>(stream: &mut S, key: &[u8; 32]) -> Result<NodeId, FrameError> {
    let mut hello = [0u8; HELLO_BYTES];
    stream.read_exact(&mut hello).await?;
    if hello[..8] != RAFT_MAGIC || hello[8..10] != RAFT_VERSION.to_le_bytes() {
        return Err(FrameError::Decode("not a gpux Raft connection of this version".into()));
    }
    let theirs: [u8; NONCE_BYTES] = hello[10..10 + NONCE_BYTES].try_into().expect("32 bytes");
    let node = hello_node(&hello);
    let mine = peer_auth::nonce();
    let mut answer = [0u8; NONCE_BYTES + 32];
    answer[..NONCE_BYTES].copy_from_slice(&mine);
    answer[NONCE_BYTES..].copy_from_slice(&peer_auth::proof(key, RAFT_DOMAIN, Role::Responder, &theirs, &mine, b""));
    stream.write_all(&answer).await?;
    stream.flush().await?;
    let mut proof = [0u8; 32];
    stream.read_exact(&mut proof).await?;
    if !peer_auth::same(&peer_auth::proof(key, RAFT_DOMAIN, Role::Initiator, &theirs, &mine, &node.to_le_bytes()), &proof) {
        return Err(FrameError::Decode("not this cluster's secret".into()));
    }
    Ok(node)
}

#[derive(Serialize, Deserialize)]
pub(crate) enum Call {
    AppendEntries(AppendEntriesRequest<TypeConfig>),
    Vote(VoteRequest<NodeId>),
    InstallSnapshot(InstallSnapshotRequest<TypeConfig>),
    Admin(AdminRequest),
    /// Up to `limit` entries of the node's journal after `seq` (a peer
    /// that took a snapshot fills its journal from them).
    JournalEntries {
        seq: u64,
        limit: u32,
    },
}

#[derive(Serialize, Deserialize)]
pub(crate) enum Reply {
    AppendEntries(Result<AppendEntriesResponse<NodeId>, RaftError<NodeId>>),
    Vote(Result<VoteResponse<NodeId>, RaftError<NodeId>>),
    InstallSnapshot(Result<InstallSnapshotResponse<NodeId>, RaftError<NodeId, InstallSnapshotError>>),
    Admin(AdminReply),
    JournalEntries(Result<Vec<JournalEntry>, String>),
}

#[derive(Debug, thiserror::Error)]
pub enum FrameError {
    #[error("raft link i/o: {0}")]
    Io(#[from] std::io::Error),
    #[error("a raft frame of {0} bytes is over the limit")]
    TooLarge(usize),
    #[error("a raft frame does not decode: {0}")]
    Decode(String),
    #[error("the peer could not answer: {0}")]
    Refused(String),
}

pub(crate) async fn write_frame<W: AsyncWrite + Unpin, T: Serialize>(writer: &mut W, value: &T) -> Result<(), FrameError> {
    let body = crate::encode(value).map_err(|e| FrameError::Decode(e.to_string()))?;
    if body.len() > RAFT_FRAME_BYTES_MAX {
        return Err(FrameError::TooLarge(body.len()));
    }
    writer.write_all(&(body.len() as u32).to_le_bytes()).await?;
    writer.write_all(&body).await?;
    writer.flush().await?;
    Ok(())
}

pub(crate) async fn read_frame<R: AsyncRead + Unpin, T: serde::de::DeserializeOwned>(reader: &mut R) -> Result<T, FrameError> {
    let mut length = [0u8; 4];
    reader.read_exact(&mut length).await?;
    let length = u32::from_le_bytes(length) as usize;
    if length > RAFT_FRAME_BYTES_MAX {
        return Err(FrameError::TooLarge(length));
    }
    let mut body = vec![0; length];
    reader.read_exact(&mut body).await?;
    crate::decode(&body).map_err(|e| FrameError::Decode(e.to_string()))
}

/// What a node serves its peers besides Raft: the operator's handover,
/// and its journal, which a peer that took a snapshot copies the entries
/// it missed from ([`TcpNetwork::journal_entries`]).
#[derive(Clone, Default)]
pub struct Services {
    pub handover: Handover,
    pub journal: Option<Arc<dyn JournalRead>>,
}

/// The most entries one journal call carries, and about the most bytes
/// (fewer entries are sent when they would encode larger).
pub const JOURNAL_CALL_ENTRIES_MAX: u32 = 4_096;
pub const JOURNAL_CALL_BYTES_MAX: usize = 16 << 20;

/// Serves this node's Raft to its peers (and operators' calls) until the
/// listener fails.
pub async fn serve(listener: TcpListener, raft: Raft, secret: Arc<[u8]>, services: Services) {
    serve_tls(listener, raft, secret, services, None).await
}

/// [`serve`], TLS first on every connection when `tls` is given.
pub async fn serve_tls(listener: TcpListener, raft: Raft, secret: Arc<[u8]>, services: Services, tls: Option<Arc<ServerConfig>>) {
    let tls = tls.map(tokio_rustls::TlsAcceptor::from);
    let key = cluster_token(&secret);
    let handshaking: Arc<HandshakePool<tokio::sync::oneshot::Sender<()>>> = Arc::new(HandshakePool::new(RAFT_HANDSHAKES_MAX));
    let refusals = Arc::new(Throttle::new(Duration::from_secs(10)));
    let mut next: u64 = 0;
    loop {
        let Ok((stream, peer)) = listener.accept().await else {
            tokio::time::sleep(Duration::from_millis(100)).await;
            continue;
        };
        next += 1;
        let connection = next;
        let (cancel, cancelled) = tokio::sync::oneshot::channel();
        if let Some(oldest) = handshaking.enter(connection, peer_auth::address_key(peer.ip()), cancel) {
            let _ = oldest.send(());
        }
        let (raft, secret, services, handshaking, refusals, tls) =
            (raft.clone(), secret.clone(), services.clone(), handshaking.clone(), refusals.clone(), tls.clone());
        tokio::spawn(async move {
            let _ = stream.set_nodelay(true);
            let handshake = async {
                let mut stream: RaftStream = match tls {
                    None => Box::new(stream),
                    Some(acceptor) => Box::new(acceptor.accept(stream).await?),
                };
                server_handshake(&mut stream, &key).await.map(|_| stream)
            };
            let proven = tokio::select! {
                proven = tokio::time::timeout(HANDSHAKE_TIMEOUT, handshake) => {
                    proven.unwrap_or_else(|_| Err(FrameError::Decode("no handshake within 5 s".into())))
                }
                _ = cancelled => Err(FrameError::Decode(format!("dropped for a newer connection: {RAFT_HANDSHAKES_MAX} handshakes waiting"))),
            };
            handshaking.leave(connection);
            let stream = match proven {
                Ok(stream) => stream,
                Err(error) => {
                    if let Some(suppressed) = refusals.should_log() {
                        tracing::warn!(%peer, %error, suppressed, "raft handshake failed");
                    }
                    return;
                }
            };
            if let Err(error) = serve_peer(stream, raft, secret, services).await {
                tracing::debug!(%peer, %error, "raft peer connection ended");
            }
        });
    }
}

async fn serve_peer(mut stream: RaftStream, raft: Raft, secret: Arc<[u8]>, services: Services) -> Result<(), FrameError> {
    loop {
        let call: Call = match read_frame(&mut stream).await {
            Ok(call) => call,
            Err(FrameError::Io(e)) if e.kind() == std::io::ErrorKind::UnexpectedEof => return Ok(()),
            Err(error) => return Err(error),
        };
        let reply = match call {
            Call::AppendEntries(request) => Reply::AppendEntries(raft.append_entries(request).await),
            Call::Vote(request) => Reply::Vote(raft.vote(request).await),
            Call::InstallSnapshot(request) => Reply::InstallSnapshot(raft.install_snapshot(request).await),
            Call::Admin(request) => Reply::Admin(crate::admin::handle(&raft, &secret, &services.handover, request).await),
            Call::JournalEntries { seq, limit } => Reply::JournalEntries(journal_entries(services.journal.clone(), seq, limit).await),
        };
        // This node's Raft stopped: say so, then close, so the peer
        // connects afresh (to whatever serves the address next).
        let stopped = matches!(
            &reply,
            Reply::AppendEntries(Err(RaftError::Fatal(_)))
                | Reply::Vote(Err(RaftError::Fatal(_)))
                | Reply::InstallSnapshot(Err(RaftError::Fatal(_)))
        );
        write_frame(&mut stream, &reply).await?;
        if stopped {
            return Ok(());
        }
    }
}

/// Up to `limit` entries of `journal` after `seq`, fewer where they would
/// encode to more than [`JOURNAL_CALL_BYTES_MAX`] (at least one).
async fn journal_entries(journal: Option<Arc<dyn JournalRead>>, seq: u64, limit: u32) -> Result<Vec<JournalEntry>, String> {
    let journal = journal.ok_or("this node keeps no journal")?;
    let read = tokio::task::spawn_blocking(move || {
        let mut limit = limit.clamp(1, JOURNAL_CALL_ENTRIES_MAX) as usize;
        loop {
            let entries = journal.entries_range(seq, limit).map_err(|e| format!("{e:#}"))?;
            let bytes = crate::encode(&entries).map_err(|e| e.to_string())?.len();
            if bytes <= JOURNAL_CALL_BYTES_MAX || limit == 1 {
                return Ok(entries);
            }
            limit /= 2;
        }
    });
    read.await.map_err(|e| e.to_string())?
}

/// Makes connections to peers (lazily: nothing connects until a call).
#[derive(Clone)]
pub struct TcpNetwork {
    key: [u8; 32],
    id: NodeId,
    tls: Option<Arc<ClientConfig>>,
}

impl TcpNetwork {
    /// The network of node `id` (named to its peers as each connection starts).
    pub fn new(secret: &[u8], id: NodeId) -> TcpNetwork {
        TcpNetwork { key: cluster_token(secret), id, tls: None }
    }

    /// Connects to peers over TLS, trusting `tls`'s certificates.
    pub fn with_tls(self, tls: Arc<ClientConfig>) -> TcpNetwork {
        TcpNetwork { tls: Some(tls), ..self }
    }

    /// This node's id.
    pub fn id(&self) -> NodeId {
        self.id
    }

    /// Up to `limit` entries of the journal of the node at `addr` after
    /// `seq` (fewer where it ends, or where they would not fit one call),
    /// within [`JOURNAL_CALL_TIMEOUT`].
    pub async fn journal_entries(&self, addr: &str, seq: u64, limit: u32) -> Result<Vec<JournalEntry>, FrameError> {
        let call = async {
            let mut stream = connect(addr, self.tls.as_ref(), &self.key, self.id).await?;
            write_frame(&mut stream, &Call::JournalEntries { seq, limit }).await?;
            match read_frame::<_, Reply>(&mut stream).await? {
                Reply::JournalEntries(entries) => entries.map_err(FrameError::Refused),
                _ => Err(FrameError::Decode("a journal call answered with another reply".into())),
            }
        };
        match tokio::time::timeout(JOURNAL_CALL_TIMEOUT, call).await {
            Ok(answered) => answered,
            Err(_) => Err(FrameError::Io(std::io::Error::new(std::io::ErrorKind::TimedOut, "no journal entries within 30 s"))),
        }
    }
}

/// How long one journal call may take.
pub const JOURNAL_CALL_TIMEOUT: Duration = Duration::from_secs(30);

/// One peer's connection, made on first use and again after it breaks.
pub struct TcpPeer {
    target: NodeId,
    addr: String,
    key: [u8; 32],
    id: NodeId,
    tls: Option<Arc<ClientConfig>>,
    stream: Option<RaftStream>,
}

impl RaftNetworkFactory<TypeConfig> for TcpNetwork {
    type Network = TcpPeer;

    async fn new_client(&mut self, target: NodeId, node: &BasicNode) -> TcpPeer {
        TcpPeer { target, addr: node.addr.clone(), key: self.key, id: self.id, tls: self.tls.clone(), stream: None }
    }
}

/// Why a call failed, before it is typed for the RPC.
enum CallError {
    Unreachable(Unreachable),
    Network(NetworkError),
}

impl TcpPeer {
    async fn call(&mut self, call: Call, option: &RPCOption) -> Result<Reply, CallError> {
        let ttl = option.hard_ttl();
        if self.stream.is_none() {
            let connected = tokio::time::timeout(ttl, connect(&self.addr, self.tls.as_ref(), &self.key, self.id)).await;
            match connected {
                Ok(Ok(stream)) => self.stream = Some(stream),
                Ok(Err(error)) => return Err(CallError::Unreachable(Unreachable::new(&error))),
                Err(_) => return Err(CallError::Unreachable(Unreachable::new(&AnyError::error("connect timed out")))),
            }
        }
        let stream = self.stream.as_mut().expect("connected above");
        let exchanged = tokio::time::timeout(ttl, async {
            write_frame(stream, &call).await?;
            read_frame::<_, Reply>(stream).await
        })
        .await;
        match exchanged {
            Ok(Ok(reply)) => Ok(reply),
            Ok(Err(error)) => {
                self.stream = None;
                Err(CallError::Network(NetworkError::new(&error)))
            }
            Err(_) => {
                // A reply may still come on this stream: start afresh.
                self.stream = None;
                Err(CallError::Network(NetworkError::new(&AnyError::error(format!("no reply within {ttl:?}")))))
            }
        }
    }

    fn unexpected(&mut self) -> CallError {
        self.stream = None;
        CallError::Network(NetworkError::new(&AnyError::error("a reply to another call")))
    }
}

fn typed<E: std::error::Error>(error: CallError) -> RPCError<NodeId, BasicNode, E> {
    match error {
        CallError::Unreachable(unreachable) => RPCError::Unreachable(unreachable),
        CallError::Network(network) => RPCError::Network(network),
    }
}

impl RaftNetwork<TypeConfig> for TcpPeer {
    async fn append_entries(
        &mut self,
        rpc: AppendEntriesRequest<TypeConfig>,
        option: RPCOption,
    ) -> Result<AppendEntriesResponse<NodeId>, RPCError<NodeId, BasicNode, RaftError<NodeId>>> {
        match self.call(Call::AppendEntries(rpc), &option).await.map_err(typed)? {
            Reply::AppendEntries(reply) => reply.map_err(|e| RPCError::RemoteError(RemoteError::new(self.target, e))),
            _ => Err(typed(self.unexpected())),
        }
    }

    async fn install_snapshot(
        &mut self,
        rpc: InstallSnapshotRequest<TypeConfig>,
        option: RPCOption,
    ) -> Result<InstallSnapshotResponse<NodeId>, RPCError<NodeId, BasicNode, RaftError<NodeId, InstallSnapshotError>>> {
        match self.call(Call::InstallSnapshot(rpc), &option).await.map_err(typed)? {
            Reply::InstallSnapshot(reply) => reply.map_err(|e| RPCError::RemoteError(RemoteError::new(self.target, e))),
            _ => Err(typed(self.unexpected())),
        }
    }

    async fn vote(
        &mut self,
        rpc: VoteRequest<NodeId>,
        option: RPCOption,
    ) -> Result<VoteResponse<NodeId>, RPCError<NodeId, BasicNode, RaftError<NodeId>>> {
        match self.call(Call::Vote(rpc), &option).await.map_err(typed)? {
            Reply::Vote(reply) => reply.map_err(|e| RPCError::RemoteError(RemoteError::new(self.target, e))),
            _ => Err(typed(self.unexpected())),
        }
    }
}
