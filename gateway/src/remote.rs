//! A gateway in its own process (`gpux-gateway`, issue 19): the same
//! [`crate::serve`] as the exchange's embedded gateway, with its requests
//! carried to the sequencer over a link ([`crate::wire`]) instead of an
//! in-process channel.
//!
//! The bridge keeps one link open to the exchange's `--link-listen`
//! address. Each client connection is announced (`Up::Connect`) and its
//! requests forwarded (`Up::Request`); what comes down is handed to the
//! connection's own queue, exactly as the sequencer hands it to an embedded
//! gateway's. Market data comes down once per gateway (`Down::Feed`) and
//! is published on a broadcast channel per feed here, which every
//! subscribed connection of this gateway reads on its own task; a
//! connection's feed starts at its `Down::FeedStart`, which the link
//! carries in the sequencer's order right after the connection's snapshot.
//!
//! When the link breaks (the exchange stopped or is unreachable), every
//! client connection of this gateway is closed `sequencer_unavailable`
//! (clients reconnect and resend orders under their client order ids, which
//! the exchange deduplicates), connections opened meanwhile are closed the
//! same way, and the bridge links again: to the next of its addresses
//! first, then each in turn, then after a backoff of 100 ms doubling to 2 s
//! per round.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use gpux_engine::InstrumentId;
use gpux_protocol::{Channel, ErrorCode};
use tokio::io::{AsyncWriteExt, BufReader, BufWriter};
use tokio::net::TcpStream;
use tokio::sync::{broadcast, mpsc, watch};

use crate::link::{Body, ConnectionId, Outbound, Outgoing, Request, SharedFrame, FEED_FRAMES_MAX};
use crate::wire::{self, Down, Peer, Up, WireError};

use crate::limits::BRIDGE_QUEUE_MAX;

/// Where the bridge links to and who it says it is.
#[derive(Clone, Debug)]
pub struct RemoteConfig {
    /// The exchange's `--link-listen` addresses (host:port), tried in turn
    /// from the last one that answered (the first at start).
    pub sequencers: Vec<String>,
    /// This gateway's name (the exchange's logs name links by it).
    pub name: String,
    /// [`wire::link_token`] of the exchange's `link.secret`.
    pub token: [u8; 32],
    /// Frames each feed buffers for its slowest subscriber here.
    pub feed_frames_max: usize,
    /// Link over TLS, trusting these certificates (`--link-tls-ca`): the
    /// exchange's certificate must name the host of the address linked to.
    pub tls: Option<Arc<tokio_rustls::rustls::ClientConfig>>,
}

impl RemoteConfig {
    pub fn new(sequencers: Vec<String>, name: String, secret: &[u8]) -> RemoteConfig {
        RemoteConfig { sequencers, name, token: wire::link_token(secret), feed_frames_max: FEED_FRAMES_MAX, tls: None }
    }
}

/// The bridge's state: this gateway's connections and feeds.
struct Bridge {
    connections: HashMap<ConnectionId, Outbound>,
    feeds: HashMap<(Channel, InstrumentId), broadcast::Sender<Arc<SharedFrame>>>,
    feed_frames_max: usize,
}

impl Bridge {
    /// Hands a connection what the sequencer sent it; one that cannot take
    /// more is told it is too slow (it closes, and its `Disconnect` goes up).
    fn deliver(&self, connection: ConnectionId, outgoing: Outgoing) {
        let Some(outbound) = self.connections.get(&connection) else { return };
        if outbound.frames.try_send(outgoing).is_err() {
            outbound.too_slow.notify_one();
        }
    }

    fn down(&mut self, down: Down) {
        match down {
            Down::Frame { connection, message } => self.deliver(connection, Outgoing::Frame(SharedFrame::new(message))),
            Down::Login { connection, outcome } => self.deliver(connection, Outgoing::Login(outcome)),
            Down::Close { connection, code } => self.deliver(connection, Outgoing::Close(code)),
            Down::FeedStart { connection, channel, instrument } => {
                let capacity = self.feed_frames_max;
                let feed = self.feeds.entry((channel, instrument)).or_insert_with(|| broadcast::channel(capacity).0).subscribe();
                self.deliver(connection, Outgoing::FeedStart { channel, instrument, feed });
            }
            Down::FeedEnd { connection, channel, instrument } => self.deliver(connection, Outgoing::FeedEnd { channel, instrument }),
            Down::Feed { channel, instrument, message } => {
                if let Some(feed) = self.feeds.get(&(channel, instrument)) {
                    // Nobody subscribed here any more is fine.
                    let _ = feed.send(SharedFrame::new(message));
                }
            }
            Down::TooSlow { connection } => {
                if let Some(outbound) = self.connections.get(&connection) {
                    outbound.too_slow.notify_one();
                }
            }
        }
    }

    /// The link is gone: every connection is closed `sequencer_unavailable`.
    fn lost(&mut self) {
        for outbound in self.connections.values() {
            let _ = outbound.frames.try_send(Outgoing::Close(ErrorCode::SequencerUnavailable));
        }
        self.connections.clear();
        self.feeds.clear();
    }

    /// A request while no link is up: a new connection is closed at once
    /// (its `Disconnect` follows and is dropped); others were closed with
    /// their link and are dropped.
    fn refuse(&mut self, request: Request) {
        if let Request { body: Body::Connect { outbound, .. }, .. } = request {
            let _ = outbound.frames.try_send(Outgoing::Close(ErrorCode::SequencerUnavailable));
        }
    }
}

/// Runs the bridge until `shutdown` or until every sender of `requests` is
/// gone (the gateway stopped): `crate::serve` sends into `requests`.
pub async fn bridge(config: RemoteConfig, requests: crossbeam_channel::Receiver<Request>, mut shutdown: watch::Receiver<bool>) {
    // The gateway's connections send on a crossbeam channel (as to the
    // embedded sequencer); a thread moves them onto the runtime.
    let (forward, mut inbox) = mpsc::channel::<Request>(BRIDGE_QUEUE_MAX);
    std::thread::Builder::new()
        .name("gateway-bridge".into())
        .spawn(move || {
            while let Ok(request) = requests.recv() {
                if forward.blocking_send(request).is_err() {
                    break;
                }
            }
        })
        .expect("a thread for the bridge");
    let mut bridge = Bridge { connections: HashMap::new(), feeds: HashMap::new(), feed_frames_max: config.feed_frames_max };
    let mut backoff = Duration::from_millis(100);
    // Which address to try next: the one that last answered, else the next.
    let mut next = 0;
    loop {
        if *shutdown.borrow() {
            return;
        }
        // One round over every address before backing off.
        let mut linked = None;
        for offset in 0..config.sequencers.len().max(1) {
            let index = (next + offset) % config.sequencers.len().max(1);
            let Some(address) = config.sequencers.get(index) else { break };
            match connect(address, &config).await {
                Ok(stream) => {
                    next = index;
                    linked = Some((address.clone(), stream));
                    break;
                }
                Err(error) => tracing::warn!(sequencer = %address, %error, "no link to the exchange"),
            }
        }
        if let Some((address, stream)) = linked {
            {
                backoff = Duration::from_millis(100);
                tracing::info!(sequencer = %address, "link open");
                let ended = run_link(stream, &mut bridge, &mut inbox, &mut shutdown).await;
                bridge.lost();
                match ended {
                    Ok(Ended::Stopped) => return,
                    Ok(Ended::Closed) => tracing::warn!(sequencer = %address, "the exchange closed the link"),
                    Err(error) => tracing::warn!(sequencer = %address, %error, "link lost"),
                }
                // Fail over: the next address first.
                next += 1;
            }
        }
        // Until the next try, new connections are refused.
        let wait = tokio::time::sleep(backoff);
        tokio::pin!(wait);
        loop {
            tokio::select! {
                _ = &mut wait => break,
                request = inbox.recv() => match request {
                    Some(request) => bridge.refuse(request),
                    None => return,
                },
                _ = shutdown.changed() => return,
            }
        }
        backoff = (backoff * 2).min(Duration::from_secs(2));
    }
}

async fn connect(address: &str, config: &RemoteConfig) -> Result<wire::LinkStream, WireError> {
    let tcp = tokio::time::timeout(Duration::from_secs(5), TcpStream::connect(address))
        .await
        .map_err(|_| WireError::Protocol("connecting took over 5 s".into()))??;
    let _ = tcp.set_nodelay(true);
    let mut stream: wire::LinkStream = match &config.tls {
        None => Box::new(tcp),
        Some(tls) => {
            let name = gpux_protocol::tls::server_name(address).map_err(|e| WireError::Protocol(e.to_string()))?;
            let connector = tokio_rustls::TlsConnector::from(tls.clone());
            let secured = tokio::time::timeout(Duration::from_secs(5), connector.connect(name, tcp))
                .await
                .map_err(|_| WireError::Protocol("no TLS handshake within 5 s".into()))?
                .map_err(|e| WireError::Protocol(format!("TLS: {e}")))?;
            Box::new(secured)
        }
    };
    let hello = tokio::time::timeout(
        Duration::from_secs(5),
        wire::handshake(&mut stream, Peer::Gateway { name: config.name.clone() }, config.token),
    )
    .await
    .map_err(|_| WireError::Protocol("no handshake within 5 s".into()))??;
    match hello.peer {
        Peer::Sequencer { .. } => Ok(stream),
        other => Err(WireError::Protocol(format!("linked to {other:?}, not a sequencer"))),
    }
}

enum Ended {
    /// The gateway is stopping.
    Stopped,
    /// The exchange closed the link.
    Closed,
}

async fn run_link(
    stream: wire::LinkStream,
    bridge: &mut Bridge,
    inbox: &mut mpsc::Receiver<Request>,
    shutdown: &mut watch::Receiver<bool>,
) -> Result<Ended, WireError> {
    let (reader, writer) = tokio::io::split(stream);
    let mut writer = BufWriter::new(writer);
    // Frames are read on their own task so a long write never holds them up.
    let (downs, mut down_inbox) = mpsc::channel::<Result<Down, WireError>>(1024);
    let reading = tokio::spawn(async move {
        let mut reader = BufReader::new(reader);
        loop {
            let frame = wire::read_frame::<_, Down>(&mut reader).await;
            let end = !matches!(frame, Ok(Some(_)));
            let sent = match frame {
                Ok(Some(down)) => downs.send(Ok(down)).await,
                Ok(None) => downs.send(Err(WireError::Closed)).await,
                Err(error) => downs.send(Err(error)).await,
            };
            if end || sent.is_err() {
                break;
            }
        }
    });
    let result = loop {
        tokio::select! {
            down = down_inbox.recv() => match down {
                Some(Ok(down)) => bridge.down(down),
                Some(Err(WireError::Closed)) | None => break Ok(Ended::Closed),
                Some(Err(error)) => break Err(error),
            },
            request = inbox.recv() => {
                let Some(request) = request else { break Ok(Ended::Stopped) };
                let up = match request {
                    Request { connection, body: Body::Connect { outbound }, .. } => {
                        bridge.connections.insert(connection, outbound);
                        Up::Connect { connection }
                    }
                    // A connection of an earlier link (closed with it) is
                    // not this link's: what it still sends is dropped.
                    request if !bridge.connections.contains_key(&request.connection()) => continue,
                    request => {
                        if let Request { connection, body: Body::Disconnect { .. }, .. } = &request {
                            bridge.connections.remove(connection);
                        }
                        Up::Request(request)
                    }
                };
                if let Err(error) = wire::write_frame(&mut writer, &up).await {
                    break Err(error);
                }
                if inbox.is_empty() {
                    if let Err(error) = writer.flush().await {
                        break Err(error.into());
                    }
                }
            }
            _ = shutdown.changed() => break Ok(Ended::Stopped),
        }
    };
    reading.abort();
    result
}
