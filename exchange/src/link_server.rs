//! The sequencer's side of remote gateways' links (issue 19; the frames are
//! `gpux_gateway::wire`): `gpux-exchange --link-listen ADDR` accepts
//! `gpux-gateway` processes, each of which serves clients of its own and
//! forwards their requests here.
//!
//! Per link: a handshake (magic, version, fresh nonces, then each side's
//! proof of the exchange's `link.secret` over both nonces: a link speaks
//! for any account, so only a gateway that holds the secret may open one,
//! and a captured handshake is worth nothing), then two tasks. The reader turns `Up`
//! frames into the sequencer's requests, mapping the gateway's connection
//! ids into this link's range (`link << 40 | id`, above every id of the
//! exchange's own gateway) so no two gateways' connections meet; a request
//! naming a connection the gateway never announced breaks the link. The
//! writer drains the link's one queue (`LinkSender`), into which the
//! sequencer puts every frame of the gateway's connections and every update
//! of the feeds they subscribed to, once per link, in its own order. A link
//! that falls `LINK_QUEUE_FRAMES_MAX` frames behind is closed; when a link
//! ends, each of its connections is disconnected as if its client had left.

use std::collections::BTreeSet;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use crossbeam_channel::Sender;
use gpux_gateway::link::{Body, ConnectionId, Frames, LinkSender, Outbound, Request, LINK_QUEUE_FRAMES_MAX};
use gpux_gateway::wire::{self, Peer, Up, WireError};
use gpux_protocol::peer_auth::{HandshakePool, Throttle};
use tokio::io::{AsyncWriteExt, BufReader, BufWriter};
use tokio::net::TcpListener;
use tokio::sync::{watch, Notify};

/// Where a link's connection ids start: the exchange's own gateway numbers
/// its connections below this.
pub const LINK_CONNECTION_BASE: ConnectionId = 1 << 40;
pub use crate::limits::LINKS_MAX;
pub use crate::limits::LINK_HANDSHAKES_MAX;
/// How long a peer has to finish the handshake.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(5);
/// At most one warning per this long for refused or failed handshakes (the
/// rest are counted in the next one and in `gpux_links_ended_total`).
const REFUSAL_LOG_EVERY: Duration = Duration::from_secs(10);

/// The exchange's link secret: `link.secret` in the data directory, 32
/// random bytes made on first use (readable by the exchange's user only).
pub fn load_or_create_secret(data_dir: &Path) -> anyhow::Result<Vec<u8>> {
    use gpux_protocol::secret_file::{self, SecretFileError};
    let path = data_dir.join("link.secret");
    // The secret is the file's text (64 hex digits when made here).
    match secret_file::read(&path) {
        Ok(secret) => Ok(secret),
        Err(SecretFileError::Missing(_)) => {
            let hex = hex::encode(secret_file::random_key());
            secret_file::create(&path, hex.as_bytes()).map_err(|e| anyhow::anyhow!("the link secret: {e}"))?;
            Ok(hex.into_bytes())
        }
        Err(error) => Err(anyhow::anyhow!("the link secret: {error}")),
    }
}

/// Accepts gateways' links until shutdown.
pub async fn serve_links(
    listener: TcpListener,
    core: Sender<Request>,
    secret: Vec<u8>,
    tls: Option<tokio_rustls::TlsAcceptor>,
    metrics: Arc<crate::metrics::Metrics>,
    mut shutdown: watch::Receiver<bool>,
) {
    let token = wire::link_token(&secret);
    let open = Arc::new(AtomicU64::new(0));
    let handshaking: Arc<Handshakes> = Arc::new(HandshakePool::new(LINK_HANDSHAKES_MAX));
    let refusals = Arc::new(RefusalLog(Throttle::new(REFUSAL_LOG_EVERY)));
    let mut next_link: u64 = 1;
    loop {
        let (stream, peer) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(accepted) => accepted,
                Err(error) => {
                    tracing::warn!(%error, "link accept failed");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            },
            _ = shutdown.changed() => break,
        };
        if open.load(Ordering::Relaxed) as usize >= LINKS_MAX {
            refusals.warn(&format!("link refused from {peer}: {LINKS_MAX} links open"));
            metrics.links_ended.with_label_values(&["refused"]).inc();
            continue;
        }
        let link = next_link;
        next_link += 1;
        let (cancel, cancelled) = tokio::sync::oneshot::channel();
        if let Some(oldest) = handshaking.enter(link, gpux_protocol::peer_auth::address_key(peer.ip()), cancel) {
            let _ = oldest.send(());
        }
        let (core, open, shutdown, metrics, tls) = (core.clone(), open.clone(), shutdown.clone(), metrics.clone(), tls.clone());
        let (handshaking, refusals) = (handshaking.clone(), refusals.clone());
        tokio::spawn(async move {
            let admitted = Admission { link, handshaking: &handshaking, cancelled, open: &open, tls };
            let (linked, outcome) = run_link(stream, admitted, core, token, &metrics, shutdown).await;
            let cause = match outcome {
                Ok(()) => {
                    tracing::info!(%peer, link, "link closed");
                    "closed"
                }
                Err(error) => {
                    // A link that was open is worth a line each; handshakes
                    // that fail (a flood, a wrong secret) are summed.
                    if linked {
                        tracing::warn!(%peer, link, %error, "link ended");
                    } else {
                        refusals.warn(&format!("link handshake from {peer} failed: {error}"));
                    }
                    match error {
                        WireError::Token => "token",
                        WireError::TooSlow => "too_slow",
                        _ => "broken",
                    }
                }
            };
            metrics.links_ended.with_label_values(&[cause]).inc();
            if linked {
                open.fetch_sub(1, Ordering::Relaxed);
            }
        });
    }
}

/// Connections in their handshake, oldest first, each with what drops it.
type Handshakes = HandshakePool<tokio::sync::oneshot::Sender<()>>;

/// A connection in its handshake: its place in the handshakes' pool (left
/// when the handshake ends, or taken by a newcomer: `cancelled`), and the
/// count of open links it joins once it showed the secret.
struct Admission<'a> {
    link: u64,
    handshaking: &'a Handshakes,
    cancelled: tokio::sync::oneshot::Receiver<()>,
    open: &'a AtomicU64,
    /// TLS first, when the link port has an identity (`--link-tls-cert`).
    tls: Option<tokio_rustls::TlsAcceptor>,
}

/// Runs one link: the handshake (within its pool), then the link itself.
/// Returns whether it became an open link, and how it ended.
async fn run_link(
    tcp: tokio::net::TcpStream,
    admission: Admission<'_>,
    core: Sender<Request>,
    token: [u8; 32],
    metrics: &crate::metrics::Metrics,
    shutdown: watch::Receiver<bool>,
) -> (bool, Result<(), WireError>) {
    let Admission { link, handshaking, cancelled, open, tls } = admission;
    let _ = tcp.set_nodelay(true);
    let mut stream: Option<wire::LinkStream> = None;
    let handshake = tokio::time::timeout(HANDSHAKE_TIMEOUT, async {
        let mut secured: wire::LinkStream = match tls {
            None => Box::new(tcp),
            Some(acceptor) => Box::new(acceptor.accept(tcp).await.map_err(|e| WireError::Protocol(format!("TLS: {e}")))?),
        };
        let hello = wire::handshake(&mut secured, Peer::Sequencer { node: 0 }, token).await;
        stream = Some(secured);
        hello
    });
    let hello = tokio::select! {
        hello = handshake => hello.map_err(|_| WireError::Protocol("no handshake within 5 s".into())).and_then(|hello| hello),
        _ = cancelled => Err(WireError::Protocol(format!("dropped for a newer connection: {LINK_HANDSHAKES_MAX} handshakes waiting"))),
    };
    handshaking.leave(link);
    let checked = hello.and_then(|hello| match hello.peer {
        // Its proof over this connection's nonce verified in the handshake.
        Peer::Gateway { name } => Ok(name),
        other => Err(WireError::Protocol(format!("a link from {other:?}, not a gateway"))),
    });
    let name = match checked {
        Ok(name) => name,
        Err(error) => return (false, Err(error)),
    };
    let stream = stream.expect("a handshake that succeeded kept its stream");
    open.fetch_add(1, Ordering::Relaxed);
    (true, serve_link(stream, link, name, core, metrics, shutdown).await)
}

/// An open link: its queue's writer, and its reader until it ends.
async fn serve_link(
    stream: wire::LinkStream,
    link: u64,
    name: String,
    core: Sender<Request>,
    metrics: &crate::metrics::Metrics,
    mut shutdown: watch::Receiver<bool>,
) -> Result<(), WireError> {
    tracing::info!(link, gateway = %name, "link open");
    metrics.links_open.inc();
    let (reader, writer) = tokio::io::split(stream);
    let (sender, mut queue, broken) = LinkSender::new(link, LINK_QUEUE_FRAMES_MAX);
    // The writer: the link's one queue, in the sequencer's order.
    let writing = tokio::spawn(async move {
        let mut writer = BufWriter::new(writer);
        while let Some(down) = queue.recv().await {
            wire::write_frame(&mut writer, &down).await?;
            if queue.is_empty() {
                writer.flush().await?;
            }
        }
        Ok::<(), WireError>(())
    });
    let connections = read_link(reader, link, &core, sender, &broken, &mut shutdown).await;
    writing.abort();
    // Whatever ended the link, its clients are gone: disconnect each
    // connection as the exchange's own gateway does when a client leaves.
    let (connections, result) = connections;
    for connection in connections {
        let _ = core.send(Request { connection, id: 0, body: Body::Disconnect { exchange_stopping: *shutdown.borrow() } });
    }
    metrics.links_open.dec();
    result
}

/// Reads a link's `Up` frames into the sequencer until the link ends;
/// returns the connections it announced (in the exchange's numbering).
async fn read_link(
    reader: tokio::io::ReadHalf<wire::LinkStream>,
    link: u64,
    core: &Sender<Request>,
    sender: LinkSender,
    broken: &Notify,
    shutdown: &mut watch::Receiver<bool>,
) -> (BTreeSet<ConnectionId>, Result<(), WireError>) {
    let mut reader = BufReader::new(reader);
    let mut connections = BTreeSet::new();
    let base = link << 40;
    let result = loop {
        let up: Up = tokio::select! {
            frame = wire::read_frame(&mut reader) => match frame {
                Ok(Some(up)) => up,
                Ok(None) => break Ok(()),
                Err(error) => break Err(error),
            },
            _ = broken.notified() => break Err(WireError::TooSlow),
            _ = shutdown.changed() => break Ok(()),
        };
        let request = match up {
            Up::Connect { connection } => {
                if connection == 0 || connection >= LINK_CONNECTION_BASE || !connections.insert(base | connection) {
                    break Err(WireError::Protocol(format!("connection {connection} announced twice or out of range")));
                }
                // The sequencer's frames for it go down this link.
                let outbound = Outbound { frames: Frames::Link { link: sender.clone(), connection }, too_slow: Arc::new(Notify::new()) };
                Request { connection: base | connection, id: 0, body: Body::Connect { outbound } }
            }
            Up::Request(mut request) => {
                let connection = request.connection_mut();
                if !connections.contains(&(base | *connection)) {
                    break Err(WireError::Protocol(format!("a request of connection {connection}, never announced")));
                }
                *connection |= base;
                if let Request { connection, body: Body::Disconnect { .. }, .. } = &request {
                    connections.remove(connection);
                }
                request
            }
        };
        if core.send(request).is_err() {
            break Ok(()); // the sequencer stopped
        }
    };
    (connections, result)
}

/// Warnings about refused or failed handshakes, at most one per
/// `REFUSAL_LOG_EVERY`, with the count of those not logged since.
struct RefusalLog(Throttle);

impl RefusalLog {
    fn warn(&self, what: &str) {
        if let Some(suppressed) = self.0.should_log() {
            tracing::warn!(suppressed, "{what}");
        }
    }
}
