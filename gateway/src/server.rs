//! The WebSocket server: accepts connections, authenticates them by an
//! ed25519 challenge, decodes frames (JSON text or bincode binary), enforces
//! per-connection limits, forwards requests to the sequencer and writes what
//! the sequencer sends back.
//!
//! Every bad frame gets a coded `error` and the connection stays open, except
//! an oversize frame (the WebSocket layer cannot resynchronise after it), a
//! slow consumer and shutdown, which close with the code as the reason.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Instant;

use crossbeam_channel::{Sender, TrySendError};
use ed25519_dalek::{Signature, VerifyingKey};
use futures_util::{FutureExt, SinkExt, StreamExt};
use gpux_engine::{AccountId, Command, InstrumentId, Role};
use gpux_protocol::{
    auth_payload, decode_client_binary, decode_client_text, encode_server_binary, encode_server_text, Channel, ClientMessage, ErrorCode,
    ServerMessage, FRAME_BYTES_MAX,
};
use tokio::net::TcpListener;
use tokio::sync::{mpsc, watch, Notify};
use tokio_rustls::TlsAcceptor;
use tokio_stream::wrappers::errors::BroadcastStreamRecvError;
use tokio_stream::wrappers::BroadcastStream;
use tokio_stream::StreamMap;
use tokio_tungstenite::tungstenite::protocol::frame::coding::CloseCode;
use tokio_tungstenite::tungstenite::protocol::{CloseFrame, WebSocketConfig};
use tokio_tungstenite::tungstenite::{Error as WsError, Message};

use crate::admission::{AcceptBackoff, Admission, AdmissionLimits, Ticket};
use crate::link::{
    AccessRequest, Body, ChallengeRequest, Clock, ConnectionId, DeliveryRequest, HistoryRequest, JobRequest, LoginOutcome, Outbound,
    Outgoing, Request, ServiceRequest, SharedFrame, VolumeRequest,
};
use crate::metrics::GatewayMetrics;
use crate::verifier::Verifier;

use crate::conflation::{Batch, Conflation};
pub use crate::limits::{
    MESSAGES_PER_SECOND_MAX, MESSAGE_BURST_MAX, OUTBOUND_FRAMES_MAX, OUTBOX_BYTES_MAX, REQUESTS_IN_FLIGHT_MAX, RESYNCS_MAX,
};
use crate::limits::{OUTBOX_CONFLATING_BYTES_MAX, READ_BUFFER_BYTES};

/// Limits of a gateway: per connection, and on connections at once.
#[derive(Clone, Copy, Debug)]
pub struct GatewayLimits {
    /// Frames queued from the sequencer to one connection (answers, private
    /// events); one more closes the connection `slow_consumer`.
    pub outbound_frames_max: usize,
    /// Frames each market-data feed buffers for its slowest subscriber; a
    /// subscriber further behind is resynchronised with a fresh snapshot.
    pub feed_frames_max: usize,
    /// How long a connection may take nothing of what waits to be written
    /// to it (the peer does not read) before it is closed `slow_consumer`.
    pub write_stall: std::time::Duration,
    /// A connection that sends nothing (not even a pong to the gateway's
    /// pings) for this long is closed `idle_timeout`.
    pub idle_timeout: std::time::Duration,
    /// Caps on connections and deadlines until a connection is a session.
    pub admission: AdmissionLimits,
}

impl Default for GatewayLimits {
    fn default() -> Self {
        GatewayLimits {
            outbound_frames_max: OUTBOUND_FRAMES_MAX,
            feed_frames_max: crate::link::FEED_FRAMES_MAX,
            write_stall: WRITE_STALL_DEFAULT,
            idle_timeout: IDLE_TIMEOUT_DEFAULT,
            admission: AdmissionLimits::default(),
        }
    }
}

/// The default idle timeout; the gateway pings every third of it.
pub const IDLE_TIMEOUT_DEFAULT: std::time::Duration = std::time::Duration::from_secs(90);

/// How long a write may block before the peer counts as a slow consumer (default).
pub const WRITE_STALL_DEFAULT: std::time::Duration = std::time::Duration::from_secs(10);
/// The window of `RESYNCS_MAX`.
pub const RESYNC_WINDOW: std::time::Duration = std::time::Duration::from_secs(60);

/// How long a closing connection waits for its close frame to be written.
const CLOSE_WAIT: std::time::Duration = std::time::Duration::from_secs(5);

static NEXT_CONNECTION: AtomicU64 = AtomicU64::new(1);

/// A fresh connection id (WebSocket connections and REST sessions share them).
pub fn next_connection_id() -> ConnectionId {
    NEXT_CONNECTION.fetch_add(1, Ordering::Relaxed)
}

/// Loads a PEM certificate chain and private key into a TLS acceptor
/// (rustls with the ring provider; TLS 1.2 and 1.3).
pub fn tls_acceptor(cert_path: &std::path::Path, key_path: &std::path::Path) -> anyhow::Result<TlsAcceptor> {
    Ok(TlsAcceptor::from(gpux_protocol::tls::server_config(cert_path, key_path)?))
}

/// Accepts connections until `shutdown` turns true; with `tls`, every
/// connection must complete a TLS handshake first (wss://).
pub async fn serve(
    listener: TcpListener,
    core: Sender<Request>,
    shutdown: watch::Receiver<bool>,
    limits: GatewayLimits,
    metrics: Arc<GatewayMetrics>,
    tls: Option<TlsAcceptor>,
    clock: Clock,
) {
    let admission = Admission::new(limits.admission, metrics.clone());
    let mut backoff = AcceptBackoff::new("websocket");
    let mut accept_shutdown = shutdown.clone();
    // Usage reports of all connections are verified on these threads, in
    // batches (verifier.rs); the threads end with the last connection.
    let verifier = Verifier::start(verifier_threads(), metrics.usage_verify_batches.clone());
    loop {
        let (stream, peer) = tokio::select! {
            accepted = crate::admission::accept(&listener, &mut backoff, &metrics) => accepted,
            _ = accept_shutdown.changed() => break,
        };
        // Refused before anything is read: closing is all it costs.
        let ticket = match admission.admit(peer.ip()) {
            Ok(ticket) => ticket,
            Err(refusal) => {
                metrics.refused(refusal);
                tracing::debug!(%peer, reason = refusal.label(), "connection refused");
                continue;
            }
        };
        let _ = stream.set_nodelay(true);
        tracing::debug!(%peer, "connection accepted");
        let shared = Shared { core: core.clone(), limits, metrics: metrics.clone(), clock, verifier: verifier.clone() };
        let shutdown = shutdown.clone();
        let metrics = metrics.clone();
        let tls = tls.clone();
        tokio::spawn(async move {
            metrics.connections.inc();
            metrics.connections_total.inc();
            // TLS and the WebSocket upgrade share one deadline from accept.
            let deadline = tokio::time::Instant::now() + limits.admission.handshake_timeout;
            match tls {
                Some(acceptor) => match tokio::time::timeout_at(deadline, acceptor.accept(stream)).await {
                    Ok(Ok(secured)) => serve_connection(secured, shared, shutdown, ticket, deadline).await,
                    Ok(Err(_)) => tracing::debug!(%peer, "TLS handshake failed"),
                    Err(_) => metrics.reaped(Stage::Handshake),
                },
                None => serve_connection(stream, shared, shutdown, ticket, deadline).await,
            }
            metrics.connections.dec();
        });
    }
}

/// Why a connection was closed `slow_consumer` (the metric's `cause`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SlowCause {
    /// The sequencer's queue to it was full: private frames are never
    /// dropped, so the connection goes.
    QueueFull,
    /// It took nothing of what waits for it for the write-stall limit.
    WriteStalled,
    /// It fell behind its feeds more than `RESYNCS_MAX` times in `RESYNC_WINDOW`.
    Resyncs,
}

impl SlowCause {
    pub const ALL: [SlowCause; 3] = [SlowCause::QueueFull, SlowCause::WriteStalled, SlowCause::Resyncs];

    pub fn label(self) -> &'static str {
        match self {
            SlowCause::QueueFull => "queue_full",
            SlowCause::WriteStalled => "write_stalled",
            SlowCause::Resyncs => "resyncs",
        }
    }
}

/// The resynchronisations of one connection in the last `RESYNC_WINDOW`.
#[derive(Debug, Default)]
pub struct ResyncBudget {
    recent: std::collections::VecDeque<Instant>,
}

impl ResyncBudget {
    /// Records one at `now`; false when it is one too many.
    pub fn spend(&mut self, now: Instant) -> bool {
        while self.recent.front().is_some_and(|at| now.duration_since(*at) >= RESYNC_WINDOW) {
            self.recent.pop_front();
        }
        self.recent.push_back(now);
        self.recent.len() <= RESYNCS_MAX
    }
}

/// Where in its life a connection was closed for keeping silent.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Stage {
    /// TLS handshake or WebSocket upgrade not done in time.
    Handshake,
    /// Neither logged in nor subscribed in time.
    Login,
    /// Nothing heard for the idle timeout.
    Idle,
}

impl Stage {
    pub const ALL: [Stage; 3] = [Stage::Handshake, Stage::Login, Stage::Idle];

    pub fn label(self) -> &'static str {
        match self {
            Stage::Handshake => "handshake",
            Stage::Login => "login",
            Stage::Idle => "idle",
        }
    }
}

enum LoginState {
    Challenged { nonce: [u8; 32] },
    Authenticating,
    Authenticated { account: AccountId, role: Role },
}

struct WsConnection {
    id: ConnectionId,
    core: Sender<Request>,
    metrics: Arc<GatewayMetrics>,
    ticket: Ticket,
    /// Subscribed to a feed: an anonymous market-data reader, not a silent socket.
    subscribed: bool,
    session: LoginState,
    binary: bool,
    tokens: f64,
    refilled_at: Instant,
    /// Requests forwarded to the sequencer and not yet answered.
    awaiting: u32,
    clock: Clock,
    /// The key the session logged in with (its signature verified here):
    /// usage reports are verified against it on this connection's task,
    /// off the sequencer's thread.
    login_key: Option<[u8; 32]>,
    /// The market-data version asked at login (in force from the login's
    /// acceptance; a login without it keeps the version in force), and the
    /// one in force (1 until a login or `market_data_version` raises it):
    /// 2 batches feed messages and conflates a book this connection fell
    /// behind on.
    market_data_asked: Option<u8>,
    market_data_version: u8,
}

/// What every connection of a gateway shares.
#[derive(Clone)]
struct Shared {
    core: Sender<Request>,
    limits: GatewayLimits,
    metrics: Arc<GatewayMetrics>,
    clock: Clock,
    verifier: Verifier,
}

/// Verifier threads: one per core (they batch, so a few keep up with many
/// connections; the connections' tasks share the same cores).
fn verifier_threads() -> usize {
    std::thread::available_parallelism().map_or(1, |cores| cores.get())
}

/// A connection's market-data feeds, by channel and instrument.
type Feeds = StreamMap<(Channel, InstrumentId), BroadcastStream<Arc<SharedFrame>>>;

async fn serve_connection<S>(
    stream: S,
    shared: Shared,
    mut shutdown: watch::Receiver<bool>,
    ticket: Ticket,
    handshake_deadline: tokio::time::Instant,
) where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let Shared { core, limits, metrics, clock, verifier } = shared;
    let Some(socket) = accept_websocket(stream, handshake_deadline, &metrics).await else { return };
    let login_deadline = tokio::time::Instant::now() + limits.admission.login_timeout;
    let (mut sink, mut incoming) = socket.split();
    let (frames, mut outgoing) = mpsc::channel::<Outgoing>(limits.outbound_frames_max);
    let mut feeds = Feeds::new();
    let too_slow = Arc::new(Notify::new());
    let mut connection = WsConnection::new(core, metrics.clone(), ticket, clock);
    let Some(mut outbox) = connection.open(Outbound::local(frames, too_slow.clone())) else { return };
    let mut close: Option<ErrorCode> = None;
    // Why a `slow_consumer` close happened, for the metric.
    let mut slow: Option<SlowCause> = None;
    let mut resyncs = ResyncBudget::default();
    // Market-data version 2: the books this connection fell behind on.
    let mut conflation = Conflation::default();
    let stall = limits.write_stall;
    // WebSocket pings find dead and half-open connections (a host that lost
    // power never closes its socket); client libraries answer them on their own.
    let mut heartbeat = tokio::time::interval(limits.idle_timeout / 3);
    heartbeat.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut last_heard = Instant::now();
    // Reading never waits for writing: what is to be written waits in the
    // outbox while the peer reads, so a client that sends much before it
    // reads its answers cannot deadlock with the gateway. Over the outbox's
    // byte bound the connection takes nothing new (frames wait in the
    // sequencer's queue, market data in its feed) until the peer reads; a
    // peer that takes nothing for the stall limit is a slow consumer.
    while close.is_none() && slow.is_none() {
        if outbox.has_room() && !conflation.is_empty() {
            // The peer read enough: what it missed goes out, then the feeds.
            flush_conflation(&mut conflation, &mut outbox, &metrics, connection.binary);
        }
        let (room, busy, stalled_at) = (outbox.has_room(), outbox.busy(), outbox.stalled_at(stall));
        // A version 2 connection reads its feeds while its peer is behind
        // (books conflate, trades queue), up to a second outbox's worth.
        let reading_feeds = connection.reads_feeds(&outbox);
        tokio::select! {
            result = outbox.drive(&mut sink), if busy => if result.is_err() { break },
            // The peer may have taken something since the deadline was set.
            _ = tokio::time::sleep_until(stalled_at), if busy => if outbox.stalled_at(stall) <= tokio::time::Instant::now() {
                slow = Some(SlowCause::WriteStalled);
            },
            _ = tokio::time::sleep_until(login_deadline), if !connection.ticket.is_logged_in() && !connection.subscribed => {
                metrics.reaped(Stage::Login);
                close = Some(ErrorCode::LoginTimeout);
            }
            _ = heartbeat.tick() => {
                if last_heard.elapsed() >= limits.idle_timeout {
                    metrics.reaped(Stage::Idle);
                    close = Some(ErrorCode::IdleTimeout);
                } else {
                    outbox.push(Message::Ping(Vec::new().into()));
                }
            }
            frame = incoming.next(), if room => {
                last_heard = Instant::now();
                match connection.take_frame(frame, &verifier, &mut outbox).await {
                    Ok(()) => {}
                    Err(Some(code)) => close = Some(code),
                    Err(None) => break,
                }
            }
            Some(first) = outgoing.recv(), if room => {
                close = connection.take_outgoing(first, &mut outgoing, &mut outbox, &mut conflation, &mut feeds);
            }
            Some(first) = feeds.next(), if reading_feeds && !feeds.is_empty() => {
                slow = connection.take_feeds(first, &mut feeds, &mut outbox, &mut conflation, &mut resyncs);
            }
            _ = too_slow.notified() => slow = Some(SlowCause::QueueFull),
            _ = shutdown.changed() => close = Some(ErrorCode::ShuttingDown),
        }
    }
    if let Some(cause) = slow {
        metrics.slow_consumer(cause);
        tracing::debug!(connection = connection.id, cause = cause.label(), "slow consumer closed");
        close = Some(ErrorCode::SlowConsumer);
    }
    if let Some(code) = close {
        close_with(code, outbox, sink, incoming).await;
    }
    connection.disconnected(close == Some(ErrorCode::ShuttingDown));
}

/// The WebSocket handshake, by its deadline (a connection that misses it is
/// counted as reaped).
async fn accept_websocket<S>(
    stream: S,
    handshake_deadline: tokio::time::Instant,
    metrics: &GatewayMetrics,
) -> Option<tokio_tungstenite::WebSocketStream<S>>
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
{
    // The read buffer is allocated whole for every connection: 8 KiB rather
    // than the default 128 KiB keeps an idle connection small (docs/PERFORMANCE.md).
    let config = WebSocketConfig::default()
        .max_message_size(Some(FRAME_BYTES_MAX))
        .max_frame_size(Some(FRAME_BYTES_MAX))
        .read_buffer_size(READ_BUFFER_BYTES);
    match tokio::time::timeout_at(handshake_deadline, tokio_tungstenite::accept_async_with_config(stream, Some(config))).await {
        Ok(Ok(socket)) => Some(socket),
        Ok(Err(_)) => None,
        Err(_) => {
            metrics.reaped(Stage::Handshake);
            None
        }
    }
}

/// Market-data version 2: the books the connection fell behind on, each
/// changed level's total now, in one frame.
fn flush_conflation(conflation: &mut Conflation, outbox: &mut Outbox, metrics: &GatewayMetrics, binary: bool) {
    let mut batch = Batch::default();
    for message in conflation.drain() {
        metrics.book_conflations.inc();
        batch.push_own(message);
    }
    outbox.push(batch.take(binary));
}

/// Sends the close frame with its reason and waits, up to `CLOSE_WAIT`, for
/// the peer to read it and answer.
async fn close_with<S>(
    code: ErrorCode,
    mut outbox: Outbox,
    mut sink: futures_util::stream::SplitSink<tokio_tungstenite::WebSocketStream<S>, Message>,
    mut incoming: futures_util::stream::SplitStream<tokio_tungstenite::WebSocketStream<S>>,
) where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
{
    let reason = serde_plain_code(code);
    outbox.push(Message::Close(Some(CloseFrame { code: CloseCode::Policy, reason: reason.into() })));
    // The close frame queues behind whatever the peer has not read yet;
    // a peer that never reads is cut off after CLOSE_WAIT. Then the
    // closing handshake: the peer answers with its own close once it
    // has read ours, and only then does the socket close, so the peer
    // reads everything before it (a socket closed with unread input, or
    // one the kernel gives up on, is reset and the peer loses its tail).
    let deadline = tokio::time::Instant::now() + CLOSE_WAIT;
    // One that never logged in is not waited for: silent sockets are
    // what an attacker holds (it had no ping to answer: the login
    // deadline comes before the first one at the defaults).
    let answers = code != ErrorCode::LoginTimeout;
    let (Ok(Ok(())), true) = (tokio::time::timeout_at(deadline, outbox.drive(&mut sink)).await, answers) else { return };
    if code == ErrorCode::FrameTooLarge {
        // The WebSocket cannot read past the oversize frame: discard
        // the raw bytes until the peer closes, so it reads the reason.
        if let Ok(mut socket) = incoming.reunite(sink) {
            let mut discard = vec![0u8; 16 * 1024];
            while let Ok(Ok(read)) = tokio::time::timeout_at(deadline, tokio::io::AsyncReadExt::read(socket.get_mut(), &mut discard)).await
            {
                if read == 0 {
                    break;
                }
            }
        }
    } else {
        while let Ok(Some(Ok(message))) = tokio::time::timeout_at(deadline, incoming.next()).await {
            if message.is_close() {
                break;
            }
        }
    }
}

/// What waits to be written to one connection, in order.
#[derive(Default)]
struct Outbox {
    queue: std::collections::VecDeque<Message>,
    bytes: usize,
    /// Frames handed to the WebSocket but not yet flushed to the socket.
    unflushed: bool,
    /// The last time the peer took something (or the outbox became busy).
    progressed_at: Option<tokio::time::Instant>,
}

impl Outbox {
    fn push(&mut self, message: Message) {
        if !self.busy() {
            self.progressed_at = Some(tokio::time::Instant::now());
        }
        self.bytes += message.len();
        self.queue.push_back(message);
    }

    fn busy(&self) -> bool {
        !self.queue.is_empty() || self.unflushed
    }

    fn has_room(&self) -> bool {
        self.bytes < OUTBOX_BYTES_MAX
    }

    /// When a peer that takes nothing more counts as stalled.
    fn stalled_at(&self, stall: std::time::Duration) -> tokio::time::Instant {
        self.progressed_at.unwrap_or_else(tokio::time::Instant::now) + stall
    }

    /// Writes and flushes until the outbox is empty. Cancel-safe: what is
    /// not yet handed to the WebSocket stays queued.
    async fn drive<K>(&mut self, sink: &mut K) -> Result<(), WsError>
    where
        K: futures_util::Sink<Message, Error = WsError> + Unpin,
    {
        std::future::poll_fn(|cx| {
            // One clock read per wake-up that moved something, not per frame.
            let queued = self.queue.len();
            let poll = self.poll_drive(sink, cx);
            if self.queue.len() < queued {
                self.progressed_at = Some(tokio::time::Instant::now());
            }
            poll
        })
        .await
    }

    fn poll_drive<K>(&mut self, sink: &mut K, cx: &mut std::task::Context<'_>) -> std::task::Poll<Result<(), WsError>>
    where
        K: futures_util::Sink<Message, Error = WsError> + Unpin,
    {
        while !self.queue.is_empty() {
            std::task::ready!(sink.poll_ready_unpin(cx))?;
            let message = self.queue.pop_front().expect("not empty");
            self.bytes -= message.len();
            self.unflushed = true;
            sink.start_send_unpin(message)?;
        }
        std::task::ready!(sink.poll_flush_unpin(cx))?;
        self.unflushed = false;
        std::task::Poll::Ready(Ok(()))
    }
}

/// The snake_case name of a code, as a close reason.
fn serde_plain_code(code: ErrorCode) -> String {
    code.name().to_string()
}

impl WsConnection {
    fn new(core: Sender<Request>, metrics: Arc<GatewayMetrics>, ticket: Ticket, clock: Clock) -> WsConnection {
        WsConnection {
            id: next_connection_id(),
            core,
            metrics,
            ticket,
            subscribed: false,
            session: LoginState::Authenticating,
            binary: false,
            tokens: MESSAGE_BURST_MAX,
            refilled_at: Instant::now(),
            awaiting: 0,
            clock,
            login_key: None,
            market_data_asked: None,
            market_data_version: 1,
        }
    }

    /// Tells the sequencer of the connection (it answers through
    /// `outbound`) and puts the login challenge in a new outbox; `None` if
    /// the sequencer is gone.
    fn open(&mut self, outbound: Outbound) -> Option<Outbox> {
        self.core.send(Request { connection: self.id, id: 0, body: Body::Connect { outbound } }).ok()?;
        let challenge = self.new_challenge();
        let mut outbox = Outbox::default();
        outbox.push(self.encode(&challenge));
        Some(outbox)
    }

    /// Tells the sequencer the connection ended (it cancels what the session
    /// asked to have cancelled on disconnect; a supplier's disconnect during
    /// its leases is counted in its record unless the exchange is stopping).
    fn disconnected(&self, exchange_stopping: bool) {
        let _ = self.core.send(Request { connection: self.id, id: 0, body: Body::Disconnect { exchange_stopping } });
    }

    /// A frame from the peer, answered into the outbox. `Err(None)`: the
    /// peer closed or the socket broke; `Err(Some(code))`: close with `code`.
    async fn take_frame(
        &mut self,
        frame: Option<Result<Message, WsError>>,
        verifier: &Verifier,
        outbox: &mut Outbox,
    ) -> Result<(), Option<ErrorCode>> {
        let decoded = match frame {
            Some(Ok(Message::Text(text))) => {
                self.binary = false;
                decode_client_text(&text)
            }
            Some(Ok(Message::Binary(bytes))) => {
                self.binary = true;
                decode_client_binary(&bytes)
            }
            Some(Ok(Message::Ping(_) | Message::Pong(_) | Message::Frame(_))) => return Ok(()),
            Some(Ok(Message::Close(_))) | None => return Err(None),
            Some(Err(WsError::Capacity(_))) => return Err(Some(ErrorCode::FrameTooLarge)),
            Some(Err(_)) => return Err(None),
        };
        let replies = self.on_frame_verified(decoded, verifier).await;
        for reply in &replies {
            self.count(reply);
            outbox.push(self.encode(reply));
        }
        Ok(())
    }

    /// Whether the connection takes market data now: while its outbox has
    /// room, and for version 2 while it is under a second outbox's worth
    /// (books conflate, trades queue).
    fn reads_feeds(&self, outbox: &Outbox) -> bool {
        outbox.has_room() || (self.market_data_version >= 2 && outbox.bytes < OUTBOX_CONFLATING_BYTES_MAX)
    }

    /// What the sequencer sent, `first` and whatever else is ready while the
    /// outbox has room; feed starts and ends apply in order, so a book
    /// snapshot is queued before any update of its feed. The close code, if
    /// one came.
    fn take_outgoing(
        &mut self,
        first: Outgoing,
        outgoing: &mut mpsc::Receiver<Outgoing>,
        outbox: &mut Outbox,
        conflation: &mut Conflation,
        feeds: &mut Feeds,
    ) -> Option<ErrorCode> {
        let mut next = Some(first);
        while let Some(item) = next {
            match item {
                Outgoing::Frame(frame) => self.queue(outbox, &frame),
                Outgoing::FeedStart { channel, instrument, feed } => {
                    if channel == Channel::Book {
                        conflation.forget(instrument);
                    }
                    feeds.insert((channel, instrument), BroadcastStream::new(feed));
                }
                Outgoing::FeedEnd { channel, instrument } => {
                    if channel == Channel::Book {
                        conflation.forget(instrument);
                    }
                    feeds.remove(&(channel, instrument));
                }
                Outgoing::Login(outcome) => {
                    if let Some(challenge) = self.login(outcome) {
                        outbox.push(self.encode(&challenge));
                    }
                }
                Outgoing::Close(code) => return Some(code),
            }
            next = if outbox.has_room() { outgoing.try_recv().ok() } else { None };
        }
        None
    }

    /// Market data: `first` and whatever else the feeds have ready while the
    /// connection reads them. Version 2 batches it and conflates the book
    /// updates of a peer that is behind; a feed that lapped the connection
    /// is dropped and resynced. Why the connection is a slow consumer, if it is.
    fn take_feeds(
        &mut self,
        first: ((Channel, InstrumentId), Result<Arc<SharedFrame>, BroadcastStreamRecvError>),
        feeds: &mut Feeds,
        outbox: &mut Outbox,
        conflation: &mut Conflation,
        resyncs: &mut ResyncBudget,
    ) -> Option<SlowCause> {
        let mut next = Some(first);
        let mut batch = Batch::default();
        let batched = self.market_data_version >= 2;
        let mut slow = None;
        while let Some((key, item)) = next {
            let behind = match item {
                Ok(frame) if batched => {
                    let full = match *frame.message() {
                        ServerMessage::BookUpdate { instrument, seq, side, price_minor_per_gpu_hour, quantity }
                            if !outbox.has_room() || conflation.holds(instrument) =>
                        {
                            conflation.absorb(instrument, seq, side, price_minor_per_gpu_hour, quantity).is_err()
                        }
                        _ => {
                            batch.push_shared(frame);
                            false
                        }
                    };
                    if batch.is_full() {
                        outbox.push(batch.take(self.binary));
                    }
                    full
                }
                Ok(frame) => {
                    self.queue(outbox, &frame);
                    false
                }
                // The feed moved on past frames this connection never read.
                Err(BroadcastStreamRecvError::Lagged(_)) => true,
            };
            if behind {
                // Drop the feed at once (nothing after the gap is queued)
                // and ask for a fresh snapshot and feed.
                feeds.remove(&key);
                let (channel, instrument) = key;
                if channel == Channel::Book {
                    conflation.forget(instrument);
                }
                let resync = Request { connection: self.id, id: 0, body: Body::Resync { channel, instrument } };
                if !resyncs.spend(Instant::now()) || self.core.try_send(resync).is_err() {
                    slow = Some(SlowCause::Resyncs);
                }
            }
            next = if slow.is_none() && self.reads_feeds(outbox) { feeds.next().now_or_never().flatten() } else { None };
        }
        if !batch.is_empty() {
            outbox.push(batch.take(self.binary));
        }
        slow
    }

    fn new_challenge(&mut self) -> ServerMessage {
        let mut nonce = [0u8; 32];
        getrandom::fill(&mut nonce).expect("the OS random source is available");
        self.session = LoginState::Challenged { nonce };
        ServerMessage::Challenge { nonce: hex::encode(nonce), server_time_ms: self.clock.now_ms() }
    }

    /// Queues a frame from the sequencer in this connection's format.
    fn queue(&mut self, outbox: &mut Outbox, frame: &SharedFrame) {
        self.count(frame.message());
        outbox.push(self.encode_shared(frame));
        self.observe(frame.message());
    }

    /// Counts the error frames a connection is sent, by code.
    fn count(&self, message: &ServerMessage) {
        if let ServerMessage::Error { code, .. } = message {
            self.metrics.errors.with_label_values(&[code.name()]).inc();
        }
    }

    fn encode(&self, message: &ServerMessage) -> Message {
        if self.binary {
            Message::Binary(encode_server_binary(message).into())
        } else {
            Message::Text(encode_server_text(message).into())
        }
    }

    fn encode_shared(&self, frame: &SharedFrame) -> Message {
        frame.ws_message(self.binary)
    }

    /// Gives back a request's in-flight slot when its answer goes out.
    fn observe(&mut self, message: &ServerMessage) {
        // One source of truth for what answers a request: the protocol's own.
        if message.answer_to().is_some() {
            self.awaiting = self.awaiting.saturating_sub(1);
        }
    }

    /// Applies the sequencer's answer to a login; returns the fresh
    /// challenge to send after a refusal.
    fn login(&mut self, outcome: LoginOutcome) -> Option<ServerMessage> {
        match (outcome, &self.session) {
            (LoginOutcome::Accepted { account, role, .. }, _) => {
                self.session = LoginState::Authenticated { account, role };
                // Raised, never lowered (see `set_market_data_version`).
                self.market_data_version = self.market_data_asked.unwrap_or(1).max(self.market_data_version);
                self.ticket.logged_in();
                None
            }
            // A refused attempt burns the nonce: the next one signs a new challenge.
            (LoginOutcome::Refused, LoginState::Authenticating) => Some(self.new_challenge()),
            (LoginOutcome::Refused, _) => None,
        }
    }

    /// `market_data_version`: the feeds in `version` from the next frame
    /// on. Raised, never lowered: a version-2 connection may hold a
    /// conflated book that only version 2 can send.
    fn set_market_data_version(&mut self, id: u64, version: u8) -> ServerMessage {
        if !(1..=2).contains(&version) {
            return error(Some(id), ErrorCode::WrongType, Some(format!("market_data_version {version}: this exchange speaks 1 and 2")));
        }
        if version < self.market_data_version {
            let now = self.market_data_version;
            return error(
                Some(id),
                ErrorCode::WrongType,
                Some(format!("market_data_version {version}: this connection reads {now}, and a version is never lowered")),
            );
        }
        self.market_data_version = version;
        ServerMessage::MarketDataVersion { id, version }
    }

    fn rate_limited(&mut self) -> bool {
        let now = Instant::now();
        let elapsed = now.duration_since(self.refilled_at).as_secs_f64();
        self.refilled_at = now;
        self.tokens = (self.tokens + elapsed * MESSAGES_PER_SECOND_MAX).min(MESSAGE_BURST_MAX);
        if self.tokens < 1.0 {
            return true;
        }
        self.tokens -= 1.0;
        false
    }

    /// Handles one decoded (or undecodable) frame; returns what to answer at
    /// once. Answers that need the sequencer come back through the outbound
    /// queue. A usage report's signature is verified on this task.
    #[cfg(test)]
    fn on_frame(&mut self, decoded: Result<ClientMessage, gpux_protocol::DecodeError>) -> Vec<ServerMessage> {
        if self.rate_limited() {
            return vec![error(None, ErrorCode::RateLimited, None)];
        }
        self.handle(decoded, None)
    }

    /// `on_frame`, with a usage report's signature verified by the gateway's
    /// verifier pool (batched with other connections' reports). The
    /// connection awaits the verdict before it reads its next frame, so its
    /// requests reach the sequencer in the order it sent them.
    async fn on_frame_verified(
        &mut self,
        decoded: Result<ClientMessage, gpux_protocol::DecodeError>,
        verifier: &Verifier,
    ) -> Vec<ServerMessage> {
        if self.rate_limited() {
            return vec![error(None, ErrorCode::RateLimited, None)];
        }
        match (decoded, self.login_key, &self.session) {
            (Ok(ClientMessage::UsageReport { id, report }), Some(key), LoginState::Authenticated { .. }) => {
                let (report, verified) = verifier.verify(report, key).await;
                self.handle(Ok(ClientMessage::UsageReport { id, report }), Some(verified))
            }
            (decoded, _, _) => self.handle(decoded, None),
        }
    }

    /// A frame past the rate limit. `verified`: a usage report's verdict
    /// under ZIP-215 against the login key, when the pool gave one.
    fn handle(&mut self, decoded: Result<ClientMessage, gpux_protocol::DecodeError>, verified: Option<bool>) -> Vec<ServerMessage> {
        let message = match decoded {
            Ok(message) => message,
            Err(decode) => return vec![error(decode.id, decode.code, Some(decode.message))],
        };
        let id = message.id();
        match (&self.session, message) {
            (_, ClientMessage::Ping { id }) => vec![ServerMessage::Pong { id, server_time_ms: self.clock.now_ms() }],
            (_, ClientMessage::MarketDataVersion { id, version }) => vec![self.set_market_data_version(id, version)],
            (LoginState::Authenticated { .. }, ClientMessage::Auth { .. }) => vec![error(Some(id), ErrorCode::AlreadyAuthenticated, None)],
            (LoginState::Authenticating, ClientMessage::Auth { .. }) => {
                self.metrics.auth_failures.with_label_values(&["in_progress"]).inc();
                vec![error(Some(id), ErrorCode::AuthFailed, None)]
            }
            (_, ClientMessage::Auth { id, market_data_version: Some(version), .. }) if !(1..=2).contains(&version) => {
                vec![error(Some(id), ErrorCode::WrongType, Some(format!("market_data_version {version}: this exchange speaks 1 and 2")))]
            }
            (
                LoginState::Challenged { nonce },
                ClientMessage::Auth { id, public_key, signature, role, cancel_on_disconnect, invite, market_data_version },
            ) => {
                let nonce = *nonce;
                self.market_data_asked = market_data_version;
                match verify(&nonce, &public_key, &signature) {
                    Some(public_key) => {
                        self.session = LoginState::Authenticating;
                        self.login_key = Some(public_key);
                        self.forward(
                            id,
                            Request {
                                connection: self.id,
                                id,
                                body: Body::Authenticate {
                                    public_key,
                                    role,
                                    cancel_on_disconnect,
                                    presence: true,
                                    invite,
                                    address: Some(self.ticket.ip()),
                                },
                            },
                        )
                    }
                    None => {
                        self.metrics.auth_failures.with_label_values(&["signature"]).inc();
                        vec![error(Some(id), ErrorCode::AuthFailed, None), self.new_challenge()]
                    }
                }
            }
            (LoginState::Authenticated { account, role }, message) => {
                let (account, role) = (*account, *role);
                self.authenticated(account, role, message, verified)
            }
            // Public market data needs no login, as on any exchange.
            (_, message) => match public_request_of(self.id, message) {
                Some(request) => {
                    if let Body::Subscribe { .. } = request.body {
                        self.subscribed = true;
                    }
                    self.forward(id, request)
                }
                None => vec![error(Some(id), ErrorCode::NotAuthenticated, None)],
            },
        }
    }

    fn authenticated(&mut self, account: AccountId, role: Role, message: ClientMessage, verified: Option<bool>) -> Vec<ServerMessage> {
        let caller = Caller { connection: self.id, account, role, login_key: self.login_key };
        match request_of(&caller, message, verified) {
            Ok(request) => self.forward(request.id().unwrap_or(0), request),
            Err(Refused { id, code, message }) => vec![error(Some(id), code, message)],
        }
    }

    fn forward(&mut self, id: u64, request: Request) -> Vec<ServerMessage> {
        if self.awaiting >= REQUESTS_IN_FLIGHT_MAX {
            return vec![error(Some(id), ErrorCode::RateLimited, Some(format!("more than {REQUESTS_IN_FLIGHT_MAX} requests in flight")))];
        }
        match self.core.try_send(request) {
            Ok(()) => {
                self.awaiting += 1;
                Vec::new()
            }
            Err(TrySendError::Full(_)) => vec![error(Some(id), ErrorCode::RateLimited, Some("the exchange is saturated; retry".into()))],
            Err(TrySendError::Disconnected(_)) => vec![error(Some(id), ErrorCode::ShuttingDown, None)],
        }
    }
}

/// Who sends an authenticated request: the session's connection, account,
/// role and login key.
pub(crate) struct Caller {
    pub connection: ConnectionId,
    pub account: AccountId,
    pub role: Role,
    pub login_key: Option<[u8; 32]>,
}

/// The request of a message from a connection that has not logged in, if
/// it is one such a connection may send ([`Body::is_public`]). Built by
/// [`request_of`] for a caller with no account of its own: the account it
/// names is a placeholder that only requests needing a login would carry,
/// and those are dropped here.
fn public_request_of(connection: ConnectionId, message: ClientMessage) -> Option<Request> {
    let stranger = Caller { connection, account: AccountId(u32::MAX), role: Role::Renter, login_key: None };
    request_of(&stranger, message, None).ok().filter(|request| request.body.is_public())
}

/// A request the gateway refuses before the sequencer sees it.
pub(crate) struct Refused {
    pub id: u64,
    pub code: ErrorCode,
    pub message: Option<String>,
}

/// The sequencer request a logged-in client's message asks for, or the
/// gateway's refusal of it: the one list for WebSocket sessions and REST
/// writes (gateway/src/rest.rs).
pub(crate) fn request_of(caller: &Caller, message: ClientMessage, verified: Option<bool>) -> Result<Request, Refused> {
    let Caller { connection, account, role, login_key } = *caller;
    let id = message.id();
    let command = |command| Body::Command { command };
    let delivery = |request| Body::Delivery { request };
    let access = |request| Body::Access { request };
    // Only an operator acts on another account's funds.
    let on_behalf_of = |named: Option<AccountId>| match named {
        Some(named) if named != account && role != Role::Operator => None,
        named => Some(named.unwrap_or(account)),
    };
    let body = match message {
        ClientMessage::Subscribe { channel, instrument, .. } => Body::Subscribe { channel, instrument },
        ClientMessage::Unsubscribe { channel, instrument, .. } => Body::Unsubscribe { channel, instrument },
        ClientMessage::Instruments { .. } => Body::Instruments {},
        ClientMessage::OpenOrders { after, .. } => Body::OpenOrders { after },
        ClientMessage::Leases { after, .. } => Body::Leases { after },
        ClientMessage::Stats { instrument, .. } => Body::Stats { instrument },
        ClientMessage::SupplierStats { supplier, .. } => Body::SupplierStats { supplier },
        ClientMessage::RenterStats { renter, .. } => Body::RenterStats { renter },
        ClientMessage::SearchOffers { search, .. } => Body::SearchOffers { search },
        ClientMessage::BookOffers { instrument, offset, after, .. } => {
            Body::BookOffers { instrument, offset, after: after.map(Into::into) }
        }
        ClientMessage::MyGpus { offset, .. } => Body::MyGpus { offset },
        ClientMessage::UsageReport { report, .. } => {
            // Verified in the gateway (the verifier pool, else here) under
            // ZIP-215, the rule under which this check and the journal
            // replay's agree; the sequencer then skips it when the key is
            // the account's.
            let checked_by = login_key.filter(|key| verified.unwrap_or_else(|| report.verify_zip215(key)));
            Body::Usage { report: Box::new(report), checked_by }
        }
        ClientMessage::Balance { .. } => Body::Balance {},
        ClientMessage::Statement { after, .. } => Body::Statement { after },
        ClientMessage::RecentStatement { before, .. } => Body::RecentStatement { before },
        ClientMessage::SetSpendLimits { limits, .. } => command(Command::SetSpendLimits { account, limits }),
        ClientMessage::Spend { .. } => access(AccessRequest::Spend),
        ClientMessage::NewOrder { order, workload: None, .. } if !order.rematch && order.volumes.is_empty() => {
            command(order.into_command(account))
        }
        ClientMessage::NewOrder { mut order, workload, .. } => {
            if let Some(Err(refused)) = workload.as_ref().map(|w| w.validate()) {
                return Err(Refused { id, code: refused.into(), message: Some(refused.to_string()) });
            }
            let volumes = std::mem::take(&mut order.volumes);
            if !volumes.is_empty() {
                let refused = |message: &str| Refused { id, code: ErrorCode::VolumeInvalid, message: Some(message.to_string()) };
                gpux_protocol::VolumeMount::check_all(&volumes).map_err(refused)?;
                if workload.is_none() || order.side != gpux_engine::Side::Buy {
                    return Err(refused("volumes: only a bid with a workload mounts volumes"));
                }
            }
            let rematch = order.rematch;
            Body::Bid { command: Box::new(order.into_command(account)), workload, rematch, volumes }
        }
        ClientMessage::SetWorkload { lease, workload, .. } => {
            if let Err(refused) = workload.validate() {
                return Err(Refused { id, code: refused.into(), message: Some(refused.to_string()) });
            }
            delivery(DeliveryRequest::SetWorkload { lease, workload })
        }
        ClientMessage::SetEncryptionKey { encryption_key, signature, .. } => {
            match hex::decode(&encryption_key).ok().and_then(|bytes| <[u8; 32]>::try_from(bytes).ok()) {
                Some(key) if signature.len() == 128 => delivery(DeliveryRequest::SetEncryptionKey { key, signature }),
                _ => return Err(Refused { id, code: ErrorCode::EncryptionKeyInvalid, message: None }),
            }
        }
        ClientMessage::HostKey { lease, .. } => delivery(DeliveryRequest::HostKey { lease }),
        ClientMessage::DeliveryStatus { lease, state, .. } => delivery(DeliveryRequest::Status { lease, state }),
        ClientMessage::LeaseDelivery { lease, .. } => delivery(DeliveryRequest::Query { lease }),
        ClientMessage::LeaseLogs { lease, tail_bytes, .. } => delivery(DeliveryRequest::Logs { lease, tail_bytes }),
        ClientMessage::Logs { request, data, truncated, .. } => delivery(DeliveryRequest::LogsReply { request, data, truncated }),
        ClientMessage::LeaseExec { lease, command, timeout_ms, .. } => {
            if !gpux_protocol::delivery::exec_valid(&command, timeout_ms) {
                return Err(Refused { id, code: ErrorCode::ExecInvalid, message: None });
            }
            delivery(DeliveryRequest::Exec { lease, command, timeout_ms })
        }
        ClientMessage::ExecDone { request, outcome, .. } => delivery(DeliveryRequest::ExecReply { request, outcome: outcome.bounded() }),
        ClientMessage::FabricProbe { report, .. } => delivery(DeliveryRequest::FabricProbe { report }),
        ClientMessage::ChallengeCommit { challenge, commitment, .. } => match hash32(&commitment) {
            Some(commitment) => Body::Challenge { request: ChallengeRequest::Commit { challenge, commitment } },
            None => return Err(Refused { id, code: ErrorCode::ChallengeAnswerInvalid, message: None }),
        },
        ClientMessage::ChallengeOpening { challenge, leaves, .. } => {
            Body::Challenge { request: ChallengeRequest::Opening { challenge, leaves, memory: false } }
        }
        ClientMessage::MemoryOpening { challenge, leaves, .. } => {
            Body::Challenge { request: ChallengeRequest::Opening { challenge, leaves, memory: true } }
        }
        ClientMessage::Liveness { report, .. } => Body::Liveness { report: Box::new(report) },
        ClientMessage::GpuProbe { report, .. } => Body::GpuProbe { report },
        ClientMessage::CancelOrder { order, .. } => command(Command::CancelOrder { account, order }),
        ClientMessage::ReplaceOrder { order, price_minor_per_gpu_hour, quantity, .. } => {
            command(Command::ReplaceOrder { account, order, price_minor_per_gpu_hour, quantity })
        }
        ClientMessage::MassCancel { instrument, .. } => command(Command::MassCancel { account, instrument }),
        // A zone without a region names no region (unknown_region); a
        // fabric without a region is refused fabric_invalid.
        ClientMessage::RegisterGpu { host, gpu_uuid, spec, region, zone, fabric, .. } => command(Command::Register {
            account,
            host,
            gpu_uuid,
            spec,
            region,
            zone: zone.unwrap_or_default(),
            fabric: fabric.map(Box::new),
        }),
        ClientMessage::SetGpuOnline { gpu, online, .. } => command(Command::SetGpuOnline { account, gpu, online }),
        ClientMessage::EndLease { lease, .. } => command(Command::EndLease { account, lease }),
        ClientMessage::Withdraw { account: named, amount_minor, .. } => match on_behalf_of(named) {
            Some(account) => command(Command::Withdraw { account, amount_minor }),
            None => return Err(Refused { id, code: ErrorCode::Forbidden, message: None }),
        },
        ClientMessage::Payout { account: named, amount_minor, .. } => match on_behalf_of(named) {
            Some(account) => command(Command::Payout { account, amount_minor }),
            None => return Err(Refused { id, code: ErrorCode::Forbidden, message: None }),
        },
        ClientMessage::Deposit { account: to, amount_minor, .. } => {
            if role != Role::Operator {
                return Err(Refused { id, code: ErrorCode::Forbidden, message: None });
            }
            command(Command::Deposit { account: to, amount_minor })
        }
        ClientMessage::OpenSubAccount { .. } => access(AccessRequest::OpenSubAccount),
        ClientMessage::MoveFunds { sub_account, amount_minor, to_sub_account, .. } => {
            access(AccessRequest::MoveFunds { sub_account, amount_minor, to_sub_account })
        }
        ClientMessage::SetSubAccountLimits { sub_account, limits, .. } => access(AccessRequest::SetLimits { sub_account, limits }),
        ClientMessage::SubAccounts { offset, .. } => access(AccessRequest::SubAccounts { offset }),
        ClientMessage::AddKey { account, public_key, scopes, expires_at_ms, label, .. } => match ed25519_key(&public_key) {
            Some(public_key) => access(AccessRequest::AddKey { account, public_key, scopes, expires_at_ms, label }),
            None => return Err(Refused { id, code: ErrorCode::KeyInvalid, message: None }),
        },
        ClientMessage::RevokeKey { public_key, .. } => match hash32(&public_key) {
            Some(public_key) => access(AccessRequest::RevokeKey { public_key }),
            None => return Err(Refused { id, code: ErrorCode::KeyInvalid, message: None }),
        },
        ClientMessage::Keys { account, .. } => access(AccessRequest::Keys { account }),
        ClientMessage::Invoice { period, account, offset, .. } => access(AccessRequest::Invoice { period, account, offset }),
        ClientMessage::ExchangeKey { .. } => Body::ExchangeKey {},
        ClientMessage::Listing { .. } => Body::Listing {},
        ClientMessage::LeaseTelemetry { lease, .. } => Body::LeaseTelemetry { lease },
        ClientMessage::Trades { instrument, before_seq, .. } => {
            Body::History { request: HistoryRequest::Trades { instrument, before_seq } }
        }
        ClientMessage::Candles { instrument, interval, before_ms, .. } => {
            Body::History { request: HistoryRequest::Candles { instrument, interval, before_ms } }
        }
        ClientMessage::Fills { before, .. } => Body::History { request: HistoryRequest::Fills { before } },
        ClientMessage::Book { instrument, .. } => Body::Book { instrument },
        ClientMessage::SubmitJob { job, .. } => Body::Job { request: JobRequest::Submit { job } },
        ClientMessage::JobStatus { job, .. } => Body::Job { request: JobRequest::Status { job } },
        ClientMessage::Jobs { offset, .. } => Body::Job { request: JobRequest::List { offset } },
        ClientMessage::CancelJob { job, .. } => Body::Job { request: JobRequest::Cancel { job } },
        ClientMessage::JobStoreToken { job, lease, volume, .. } => Body::Job { request: JobRequest::StoreToken { job, lease, volume } },
        ClientMessage::CreateVolume { name, size_gib, .. } => Body::Volume { request: VolumeRequest::Create { name, size_gib } },
        ClientMessage::Volumes { .. } => Body::Volume { request: VolumeRequest::List },
        ClientMessage::DeleteVolume { name, .. } => Body::Volume { request: VolumeRequest::Delete { name } },
        ClientMessage::JobBill { job, offset, .. } => Body::Job { request: JobRequest::Bill { job, offset } },
        ClientMessage::ResizeJob { job, gpus, .. } => Body::Job { request: JobRequest::Resize { job, gpus } },
        ClientMessage::CreateService { service, floor, .. } => Body::Service { request: ServiceRequest::Create { spec: service, floor } },
        ClientMessage::ServiceStatus { service, .. } => Body::Service { request: ServiceRequest::Status { service } },
        ClientMessage::Services { offset, .. } => Body::Service { request: ServiceRequest::List { offset } },
        ClientMessage::ScaleService { service, replicas, .. } => Body::Service { request: ServiceRequest::Scale { service, replicas } },
        ClientMessage::DeleteService { service, .. } => Body::Service { request: ServiceRequest::Delete { service } },
        ClientMessage::ServiceBill { service, offset, .. } => Body::Service { request: ServiceRequest::Bill { service, offset } },
        ClientMessage::ServiceLoad { service, router, load, .. } => {
            Body::Service { request: ServiceRequest::Load { service, router, load } }
        }
        ClientMessage::UpdateService { service, run, .. } => Body::Service { request: ServiceRequest::Update { service, run } },
        ClientMessage::OfferLease { lease, price_minor_per_gpu_hour, client_order_id, time_in_force, .. } => {
            command(Command::OfferLease { account, lease, client_order_id, price_minor_per_gpu_hour, time_in_force })
        }
        ClientMessage::Auth { .. } => return Err(Refused { id, code: ErrorCode::AlreadyAuthenticated, message: None }),
        // Answered by the connection before it maps a request (`handle`).
        ClientMessage::Ping { .. } | ClientMessage::MarketDataVersion { .. } => {
            return Err(Refused {
                id,
                code: ErrorCode::UnknownMessage,
                message: Some("ping and market_data_version are a connection's own".into()),
            })
        }
    };
    Ok(Request::new(connection, id, body))
}

/// Checks an auth signature over the challenge; returns the key on success.
fn verify(nonce: &[u8; 32], public_key_hex: &str, signature_hex: &str) -> Option<[u8; 32]> {
    let public_key: [u8; 32] = hex::decode(public_key_hex).ok()?.try_into().ok()?;
    let signature: [u8; 64] = hex::decode(signature_hex).ok()?.try_into().ok()?;
    let key = VerifyingKey::from_bytes(&public_key).ok()?;
    key.verify_strict(&auth_payload(nonce), &Signature::from_bytes(&signature)).ok()?;
    Some(public_key)
}

fn error(id: Option<u64>, code: ErrorCode, detail: Option<String>) -> ServerMessage {
    ServerMessage::Error { id, code, message: detail.unwrap_or_else(|| code.message().to_string()) }
}

/// An ed25519 public key from 64 hex digits (a valid point).
fn ed25519_key(hex_text: &str) -> Option<[u8; 32]> {
    let bytes = hash32(hex_text)?;
    VerifyingKey::from_bytes(&bytes).ok()?;
    Some(bytes)
}

/// 32 bytes from 64 hex digits.
fn hash32(hex_text: &str) -> Option<[u8; 32]> {
    hex::decode(hex_text).ok().and_then(|bytes| <[u8; 32]>::try_from(bytes).ok())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_connection_may_resync_three_times_a_minute_and_not_a_fourth() {
        let start = Instant::now();
        let mut budget = ResyncBudget::default();
        for second in 0..RESYNCS_MAX as u64 {
            assert!(budget.spend(start + std::time::Duration::from_secs(second)));
        }
        assert!(!budget.spend(start + std::time::Duration::from_secs(10)), "a fourth within the minute");
    }

    #[test]
    fn resyncs_older_than_the_window_are_forgotten() {
        let start = Instant::now();
        let mut budget = ResyncBudget::default();
        for _ in 0..RESYNCS_MAX {
            assert!(budget.spend(start));
        }
        assert!(budget.spend(start + RESYNC_WINDOW), "the first three left the window");
        assert!(budget.spend(start + RESYNC_WINDOW + std::time::Duration::from_secs(1)));
        assert!(budget.spend(start + RESYNC_WINDOW + std::time::Duration::from_secs(2)));
        assert!(!budget.spend(start + RESYNC_WINDOW + std::time::Duration::from_secs(3)));
    }

    /// The gateway's frame handling under arbitrary input (docs/protocol.md
    /// "Gateway error codes"): random bytes as text and binary frames, valid
    /// messages and mutations of them, with a scripted sequencer that
    /// answers what is forwarded (and sometimes accepts a login). Whatever
    /// comes in, nothing panics, the gateway itself answers only with an
    /// error, a pong or a challenge, an unauthenticated connection forwards
    /// only login and public market-data requests, the in-flight count
    /// never passes its limit and returns to zero once everything is answered.
    mod fuzz {
        use super::*;
        use gpux_protocol::{encode_client_binary, encode_client_text, OrderTicket};
        use proptest::prelude::*;

        fn connection() -> (WsConnection, crossbeam_channel::Receiver<Request>) {
            let metrics = Arc::new(GatewayMetrics::default());
            let admission = Admission::new(AdmissionLimits::default(), metrics.clone());
            let ticket = admission.admit("127.0.0.1".parse().expect("an address")).expect("admitted");
            let (core, inbox) = crossbeam_channel::bounded(8);
            let connection = WsConnection {
                id: 1,
                core,
                metrics,
                ticket,
                subscribed: false,
                session: LoginState::Challenged { nonce: [0; 32] },
                binary: false,
                tokens: MESSAGE_BURST_MAX,
                refilled_at: Instant::now(),
                awaiting: 0,
                clock: Clock::default(),
                login_key: None,
                market_data_asked: None,
                market_data_version: 1,
            };
            (connection, inbox)
        }

        fn samples() -> Vec<ClientMessage> {
            let order = OrderTicket::limit(7, InstrumentId(0), gpux_engine::Side::Buy, 2_000_000, 1);
            vec![
                ClientMessage::Ping { id: 1 },
                ClientMessage::Auth {
                    id: 2,
                    public_key: "11".repeat(32),
                    signature: "22".repeat(64),
                    role: Some(Role::Renter),
                    cancel_on_disconnect: false,
                    invite: None,
                    market_data_version: None,
                },
                ClientMessage::Subscribe { id: 3, channel: Channel::Book, instrument: InstrumentId(0) },
                ClientMessage::Unsubscribe { id: 4, channel: Channel::Trades, instrument: InstrumentId(1) },
                ClientMessage::Instruments { id: 5 },
                ClientMessage::Balance { id: 6 },
                ClientMessage::NewOrder { id: 7, order: order.clone(), workload: None },
                ClientMessage::NewOrder { id: 8, order, workload: Some(Box::new(gpux_protocol::Workload::image("busybox"))) },
                ClientMessage::CancelOrder { id: 9, order: gpux_engine::OrderId(3) },
                ClientMessage::Deposit { id: 10, account: AccountId(1), amount_minor: 5 },
                ClientMessage::Withdraw { id: 11, account: Some(AccountId(2)), amount_minor: 5 },
                ClientMessage::SetEncryptionKey { id: 12, encryption_key: "33".repeat(32), signature: "44".repeat(64) },
                ClientMessage::LeaseLogs { id: 13, lease: gpux_engine::LeaseId(1), tail_bytes: 10 },
                ClientMessage::MassCancel { id: 14, instrument: None },
            ]
        }

        #[derive(Clone, Debug)]
        enum Frame {
            Text(String),
            Binary(Vec<u8>),
            /// A sample, mutated at one byte (text or binary) or not.
            Sample {
                pick: usize,
                binary: bool,
                mutate: Option<(prop::sample::Index, u8)>,
            },
            /// A login signed over the connection's current challenge.
            SignedAuth,
        }

        fn frame() -> impl Strategy<Value = Frame> {
            prop_oneof![
                ".{0,64}".prop_map(Frame::Text),
                prop::collection::vec(any::<u8>(), 0..96).prop_map(Frame::Binary),
                (0..14usize, any::<bool>(), proptest::option::of((any::<prop::sample::Index>(), any::<u8>())))
                    .prop_map(|(pick, binary, mutate)| Frame::Sample { pick, binary, mutate }),
                Just(Frame::SignedAuth),
            ]
        }

        fn decode(
            frame: &Frame,
            samples: &[ClientMessage],
            session: &LoginState,
        ) -> (Result<ClientMessage, gpux_protocol::DecodeError>, Option<ClientMessage>) {
            match frame {
                Frame::SignedAuth => {
                    use ed25519_dalek::Signer;
                    let key = ed25519_dalek::SigningKey::from_bytes(&[5; 32]);
                    let nonce = match session {
                        LoginState::Challenged { nonce } => *nonce,
                        _ => [0; 32],
                    };
                    let auth = ClientMessage::Auth {
                        id: 99,
                        public_key: hex::encode(key.verifying_key().to_bytes()),
                        signature: hex::encode(key.sign(&auth_payload(&nonce)).to_bytes()),
                        role: Some(Role::Renter),
                        cancel_on_disconnect: false,
                        invite: None,
                        market_data_version: None,
                    };
                    (Ok(auth.clone()), Some(auth))
                }
                Frame::Text(text) => (decode_client_text(text), None),
                Frame::Binary(bytes) => (decode_client_binary(bytes), None),
                Frame::Sample { pick, binary, mutate } => {
                    let sample = &samples[*pick];
                    let mut bytes = if *binary { encode_client_binary(sample) } else { encode_client_text(sample).into_bytes() };
                    if let Some((at, byte)) = mutate {
                        let index = at.index(bytes.len());
                        bytes[index] = *byte;
                    }
                    let decoded = if *binary {
                        decode_client_binary(&bytes)
                    } else {
                        match std::str::from_utf8(&bytes) {
                            Ok(text) => decode_client_text(text),
                            Err(_) => decode_client_binary(&[0xff]),
                        }
                    };
                    (decoded, mutate.is_none().then(|| sample.clone()))
                }
            }
        }

        /// What may travel to the sequencer before a login succeeds.
        fn public(request: &Request) -> bool {
            matches!(
                request,
                Request { body: Body::Authenticate { .. }, .. }
                    | Request { body: Body::Subscribe { .. }, .. }
                    | Request { body: Body::Unsubscribe { .. }, .. }
                    | Request { body: Body::Instruments { .. }, .. }
                    | Request { body: Body::Stats { .. }, .. }
                    | Request { body: Body::SupplierStats { .. }, .. }
                    | Request { body: Body::RenterStats { .. }, .. }
                    | Request { body: Body::BookOffers { .. }, .. }
                    | Request { body: Body::SearchOffers { .. }, .. }
                    | Request { body: Body::ExchangeKey { .. }, .. }
                    | Request { body: Body::Listing { .. }, .. }
                    | Request { body: Body::History { request: HistoryRequest::Trades { .. } | HistoryRequest::Candles { .. }, .. }, .. }
                    | Request { body: Body::Book { .. }, .. }
            )
        }

        fn request_id(request: &Request) -> Option<u64> {
            request.id()
        }

        /// The fuzz reaches the logged-in paths: a signed login, accepted,
        /// lets account requests through.
        #[test]
        fn a_signed_login_once_accepted_forwards_account_requests() {
            let samples = samples();
            let (mut connection, inbox) = connection();
            let (auth, _) = decode(&Frame::SignedAuth, &samples, &connection.session);
            assert!(connection.on_frame(auth).is_empty());
            assert!(matches!(inbox.try_recv(), Ok(Request { id: 99, body: Body::Authenticate { .. }, .. })));
            connection.login(LoginOutcome::Accepted { account: AccountId(9), role: Role::Renter, participant: AccountId(9) });
            connection.observe(&ServerMessage::Authenticated { id: 99, account: AccountId(9), role: Role::Renter });
            assert!(connection.on_frame(Ok(ClientMessage::Balance { id: 6 })).is_empty());
            assert!(matches!(inbox.try_recv(), Ok(Request { id: 6, body: Body::Balance { .. }, .. })));
        }

        proptest! {
            #![proptest_config(ProptestConfig::with_cases(512))]
            #[test]
            fn arbitrary_frames_never_break_the_gateway(
                frames in prop::collection::vec(frame(), 1..48),
                accept_login in any::<bool>(),
                answer_every in 1..6usize,
            ) {
                let samples = samples();
                let (mut connection, inbox) = connection();
                let mut unanswered: Vec<Request> = Vec::new();
                for (n, frame) in frames.iter().enumerate() {
                    let (decoded, valid) = decode(frame, &samples, &connection.session);
                    let authenticated = matches!(connection.session, LoginState::Authenticated { .. });
                    let replies = connection.on_frame(decoded);
                    for reply in &replies {
                        prop_assert!(
                            matches!(reply, ServerMessage::Error { .. } | ServerMessage::Pong { .. } | ServerMessage::Challenge { .. }),
                            "the gateway itself answered {reply:?}"
                        );
                    }
                    if let Some(ClientMessage::Ping { .. }) = valid {
                        let pong_or_limited = matches!(replies.as_slice(), [ServerMessage::Pong { .. }] | [ServerMessage::Error { code: ErrorCode::RateLimited, .. }]);
                        prop_assert!(pong_or_limited, "a ping is answered with a pong: {:?}", replies);
                    }
                    while let Ok(request) = inbox.try_recv() {
                        prop_assert!(authenticated || public(&request), "forwarded before login");
                        unanswered.push(request);
                    }
                    prop_assert!(connection.awaiting <= REQUESTS_IN_FLIGHT_MAX);
                    prop_assert_eq!(connection.awaiting as usize, unanswered.len());
                    // The scripted sequencer answers now and then.
                    if n % answer_every == 0 {
                        for request in unanswered.drain(..) {
                            let id = request_id(&request);
                            let login = matches!(request, Request { body: Body::Authenticate { .. }, .. });
                            let answer = match request {
                                Request { id, body: Body::Authenticate { .. }, .. } if accept_login => {
                                    connection.login(LoginOutcome::Accepted { account: AccountId(9), role: Role::Renter, participant: AccountId(9) });
                                    ServerMessage::Authenticated { id, account: AccountId(9), role: Role::Renter }
                                }
                                _ => ServerMessage::Error { id, code: ErrorCode::AuthFailed, message: String::new() },
                            };
                            connection.observe(&answer);
                            if login && !accept_login {
                                let challenge = connection.login(LoginOutcome::Refused);
                                prop_assert!(matches!(challenge, Some(ServerMessage::Challenge { .. })), "{:?}", challenge);
                            }
                        }
                    }
                }
                for request in unanswered.drain(..) {
                    let id = request_id(&request);
                    connection.observe(&ServerMessage::Error { id, code: ErrorCode::UnknownInstrument, message: String::new() });
                }
                prop_assert_eq!(connection.awaiting, 0, "every answered request gave its slot back");

            }
        }
    }
}
