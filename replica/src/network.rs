//! Raft between nodes over TCP: length-prefixed bincode frames, one
//! request and its reply at a time per connection, on a port of its own
//! (never the clients' or the gateways').
//!
//! A connection starts with the cluster token: SHA-256 of
//! `gpux-raft-v1:` and the cluster's secret (every node holds the same
//! secret file), then the caller's node id (u64 little-endian; 0 for an
//! operator's `gpux-exchange cluster` command). A peer with another token
//! is dropped before anything else is read: an entry from outside the
//! cluster must never reach the log. Frames are bounded
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

/// The largest Raft frame: a batch of log entries or a snapshot chunk
/// (openraft sends snapshots in 3 MiB chunks).
pub const RAFT_FRAME_BYTES_MAX: usize = 64 << 20;

/// What a connection starts with: the cluster's token.
pub fn cluster_token(secret: &[u8]) -> [u8; 32] {
    use sha2::Digest;
    let mut hasher = sha2::Sha256::new();
    hasher.update(b"gpux-raft-v1:");
    hasher.update(secret);
    hasher.finalize().into()
}

/// The bytes a connection starts with: the cluster token and the caller's node id.
pub const HELLO_BYTES: usize = 40;

#[derive(Serialize, Deserialize)]
pub(crate) enum Call {
    AppendEntries(AppendEntriesRequest<TypeConfig>),
    Vote(VoteRequest<NodeId>),
    InstallSnapshot(InstallSnapshotRequest<TypeConfig>),
    Admin(AdminRequest),
}

#[derive(Serialize, Deserialize)]
pub(crate) enum Reply {
    AppendEntries(Result<AppendEntriesResponse<NodeId>, RaftError<NodeId>>),
    Vote(Result<VoteResponse<NodeId>, RaftError<NodeId>>),
    InstallSnapshot(Result<InstallSnapshotResponse<NodeId>, RaftError<NodeId, InstallSnapshotError>>),
    Admin(AdminReply),
}

#[derive(Debug, thiserror::Error)]
pub enum FrameError {
    #[error("raft link i/o: {0}")]
    Io(#[from] std::io::Error),
    #[error("a raft frame of {0} bytes is over the limit")]
    TooLarge(usize),
    #[error("a raft frame does not decode: {0}")]
    Decode(String),
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

/// Serves this node's Raft to its peers (and operators' calls) until the
/// listener fails.
pub async fn serve(listener: TcpListener, raft: Raft, secret: Arc<[u8]>, handover: Handover) {
    let token = cluster_token(&secret);
    loop {
        let Ok((stream, peer)) = listener.accept().await else {
            tokio::time::sleep(Duration::from_millis(100)).await;
            continue;
        };
        let (raft, secret, handover) = (raft.clone(), secret.clone(), handover.clone());
        tokio::spawn(async move {
            if let Err(error) = serve_peer(stream, raft, token, secret, handover).await {
                tracing::debug!(%peer, %error, "raft peer connection ended");
            }
        });
    }
}

async fn serve_peer(mut stream: TcpStream, raft: Raft, token: [u8; 32], secret: Arc<[u8]>, handover: Handover) -> Result<(), FrameError> {
    let _ = stream.set_nodelay(true);
    let mut hello = [0u8; HELLO_BYTES];
    tokio::time::timeout(Duration::from_secs(5), stream.read_exact(&mut hello))
        .await
        .map_err(|_| FrameError::Decode("no token within 5 s".into()))??;
    if hello[..32].iter().zip(&token).fold(0u8, |acc, (a, b)| acc | (a ^ b)) != 0 {
        return Err(FrameError::Decode("not this cluster's token".into()));
    }
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
            Call::Admin(request) => Reply::Admin(crate::admin::handle(&raft, &secret, &handover, request).await),
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

/// Makes connections to peers (lazily: nothing connects until a call).
#[derive(Clone)]
pub struct TcpNetwork {
    hello: [u8; HELLO_BYTES],
}

impl TcpNetwork {
    /// The network of node `id` (named to its peers as each connection starts).
    pub fn new(secret: &[u8], id: NodeId) -> TcpNetwork {
        TcpNetwork { hello: hello(secret, id) }
    }
}

/// What a connection from node `id` (0: an operator) starts with.
pub fn hello(secret: &[u8], id: NodeId) -> [u8; HELLO_BYTES] {
    let mut hello = [0u8; HELLO_BYTES];
    hello[..32].copy_from_slice(&cluster_token(secret));
    hello[32..].copy_from_slice(&id.to_le_bytes());
    hello
}

/// One peer's connection, made on first use and again after it breaks.
pub struct TcpPeer {
    target: NodeId,
    addr: String,
    hello: [u8; HELLO_BYTES],
    stream: Option<TcpStream>,
}

impl RaftNetworkFactory<TypeConfig> for TcpNetwork {
    type Network = TcpPeer;

    async fn new_client(&mut self, target: NodeId, node: &BasicNode) -> TcpPeer {
        TcpPeer { target, addr: node.addr.clone(), hello: self.hello, stream: None }
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
            let connected = tokio::time::timeout(ttl, TcpStream::connect(&self.addr)).await;
            let mut stream = match connected {
                Ok(Ok(stream)) => stream,
                Ok(Err(error)) => return Err(CallError::Unreachable(Unreachable::new(&error))),
                Err(_) => return Err(CallError::Unreachable(Unreachable::new(&AnyError::error("connect timed out")))),
            };
            let _ = stream.set_nodelay(true);
            if let Err(error) = stream.write_all(&self.hello).await {
                return Err(CallError::Unreachable(Unreachable::new(&error)));
            }
            self.stream = Some(stream);
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
