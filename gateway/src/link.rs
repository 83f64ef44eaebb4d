//! The typed contract between the gateway and the sequencer: what a
//! connection asks (`Request`), what the sequencer sends back (`Outgoing`,
//! through each connection's `Outbound`), and the exchange clock both read.
//! Everything here is plain data, so the link could later run over a socket.

use std::sync::{Arc, OnceLock};
use std::time::{SystemTime, UNIX_EPOCH};

use gpux_engine::{AccountId, Command, InstrumentId, LeaseId, Role};
use gpux_protocol::{encode_server_binary, encode_server_text, Channel, DeliveryState, ErrorCode, Scope, Scopes, ServerMessage};
use serde::{Deserialize, Serialize};
use tokio::sync::{broadcast, mpsc, Notify};
use tokio_tungstenite::tungstenite::protocol::frame::Utf8Bytes;
use tokio_tungstenite::tungstenite::{Bytes, Message};

pub type ConnectionId = u64;

/// A server message encoded at most once per format and shared by every
/// connection it goes to.
pub struct SharedFrame {
    message: ServerMessage,
    text: OnceLock<Utf8Bytes>,
    binary: OnceLock<Bytes>,
}

impl SharedFrame {
    pub fn new(message: ServerMessage) -> Arc<Self> {
        Arc::new(SharedFrame { message, text: OnceLock::new(), binary: OnceLock::new() })
    }
    pub fn text(&self) -> &str {
        self.text_bytes().as_str()
    }
    pub fn binary(&self) -> &[u8] {
        self.binary_bytes()
    }
    /// The frame as a WebSocket message in the connection's format: the
    /// encoding is shared (reference-counted), not copied per connection.
    pub fn ws_message(&self, binary: bool) -> Message {
        if binary {
            Message::Binary(self.binary_bytes().clone())
        } else {
            Message::Text(self.text_bytes().clone())
        }
    }
    pub fn message(&self) -> &ServerMessage {
        &self.message
    }
    fn text_bytes(&self) -> &Utf8Bytes {
        self.text.get_or_init(|| Utf8Bytes::from(encode_server_text(&self.message)))
    }
    fn binary_bytes(&self) -> &Bytes {
        self.binary.get_or_init(|| Bytes::from(encode_server_binary(&self.message)))
    }
}

/// What the sequencer sends one connection: its own frames (answers,
/// private events, snapshots), and the start and end of the market-data
/// feeds it subscribed to. Market data itself is published once per feed on
/// a broadcast channel that every subscriber reads on its own task, so the
/// sequencer's cost does not grow with the number of subscribers.
pub enum Outgoing {
    Frame(Arc<SharedFrame>),
    FeedStart {
        channel: Channel,
        instrument: InstrumentId,
        feed: broadcast::Receiver<Arc<SharedFrame>>,
    },
    FeedEnd {
        channel: Channel,
        instrument: InstrumentId,
    },
    /// How a login the gateway forwarded (`Request::Authenticate`) ended:
    /// an acceptance comes before its `authenticated` frame (the session is
    /// a session before the client can know it), a refusal after its
    /// `error` frame (the fresh challenge follows the error).
    Login(LoginOutcome),
    /// Close the connection with this reason once what is queued before it
    /// is written (its key was revoked or expired).
    Close(ErrorCode),
}

/// The sequencer's answer to a verified login.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum LoginOutcome {
    Accepted {
        account: AccountId,
        role: Role,
        /// The account's participant: its parent for a sub-account, else
        /// itself (the REST answers' share, docs/market-rules.md "Shared
        /// limits").
        participant: AccountId,
    },
    /// No account for the key (and no role to open one), or not an operator's key.
    Refused,
}

/// Where the sequencer sends a connection's frames, and how it tells a
/// connection that fell behind to close.
#[derive(Clone)]
pub struct Outbound {
    pub frames: Frames,
    pub too_slow: Arc<Notify>,
}

impl Outbound {
    /// A connection of a gateway in this process.
    pub fn local(frames: mpsc::Sender<Outgoing>, too_slow: Arc<Notify>) -> Outbound {
        Outbound { frames: Frames::Local(frames), too_slow }
    }
}

/// A connection's queue: its own channel (a gateway in this process), or
/// its gateway's link (`Link`), which carries every connection of that
/// gateway and the feeds it subscribed to in the sequencer's order.
#[derive(Clone)]
pub enum Frames {
    Local(mpsc::Sender<Outgoing>),
    Link { link: LinkSender, connection: ConnectionId },
}

/// Why a frame was not queued.
#[derive(Debug, PartialEq, Eq)]
pub enum QueueError {
    /// The queue is full (the connection, or its gateway's link, is too slow).
    Full,
    /// Nobody reads it any more.
    Closed,
}

impl Frames {
    /// Queues a frame without waiting.
    pub fn try_send(&self, outgoing: Outgoing) -> Result<(), QueueError> {
        match self {
            Frames::Local(frames) => frames.try_send(outgoing).map_err(|error| match error {
                mpsc::error::TrySendError::Full(_) => QueueError::Full,
                mpsc::error::TrySendError::Closed(_) => QueueError::Closed,
            }),
            Frames::Link { link, connection } => {
                let connection = *connection;
                link.try_send(match outgoing {
                    Outgoing::Frame(frame) => crate::wire::Down::Frame { connection, message: frame.message().clone() },
                    // The gateway feeds its connections from its own copy of
                    // the feed, which the link carries once (`LinkSender`).
                    Outgoing::FeedStart { channel, instrument, feed: _ } => {
                        crate::wire::Down::FeedStart { connection, channel, instrument }
                    }
                    Outgoing::FeedEnd { channel, instrument } => crate::wire::Down::FeedEnd { connection, channel, instrument },
                    Outgoing::Login(outcome) => crate::wire::Down::Login { connection, outcome },
                    Outgoing::Close(code) => crate::wire::Down::Close { connection, code },
                })
            }
        }
    }

    /// The link this queue goes through, if it is a remote gateway's.
    pub fn link(&self) -> Option<&LinkSender> {
        match self {
            Frames::Local(_) => None,
            Frames::Link { link, .. } => Some(link),
        }
    }
}

pub use crate::limits::{FEED_FRAMES_MAX, LINK_QUEUE_FRAMES_MAX};

/// The sequencer's side of one remote gateway's link: every frame for the
/// gateway's connections and every update of the feeds it subscribed to go
/// through this one queue, so the gateway sees them in the sequencer's
/// order (a connection's feed starts exactly after its snapshot).
#[derive(Clone)]
pub struct LinkSender {
    pub id: u64,
    queue: mpsc::Sender<crate::wire::Down>,
    /// Set when the queue overflowed: the link server closes the link.
    broken: Arc<Notify>,
}

impl LinkSender {
    /// A link's queue; the receiver is the link's writer, `broken` is
    /// notified when the queue overflows.
    pub fn new(id: u64, frames_max: usize) -> (LinkSender, mpsc::Receiver<crate::wire::Down>, Arc<Notify>) {
        let (queue, receiver) = mpsc::channel(frames_max);
        let broken = Arc::new(Notify::new());
        (LinkSender { id, queue, broken: broken.clone() }, receiver, broken)
    }

    pub fn try_send(&self, down: crate::wire::Down) -> Result<(), QueueError> {
        self.queue.try_send(down).map_err(|error| match error {
            mpsc::error::TrySendError::Full(_) => {
                self.broken.notify_one();
                QueueError::Full
            }
            mpsc::error::TrySendError::Closed(_) => QueueError::Closed,
        })
    }
}

/// A request from a connection to the sequencer: who sent it, the id its
/// answer carries (0 for the gateway's own requests, which get none:
/// `Connect`, `Disconnect`, `Resync`), and what it asks.
#[derive(Serialize, Deserialize)]
pub struct Request {
    pub connection: ConnectionId,
    pub id: u64,
    pub body: Body,
}

/// What a request asks (docs/protocol.md names each client message's).
#[derive(Serialize, Deserialize)]
pub enum Body {
    /// The gateway verified the signature; bind or look up the key.
    Authenticate {
        public_key: [u8; 32],
        role: Option<Role>,
        cancel_on_disconnect: bool,
        /// Whether the session is the account's presence (a WebSocket
        /// session: it gets the account's pushed events, and its end may
        /// cancel orders or be a supplier's disconnect), or one REST
        /// request's, which is none of these.
        presence: bool,
        /// An operator's invitation (`auth.invite`), for a first login.
        invite: Option<String>,
        /// The client's address, for the rate of accounts opened from one
        /// address (none for a REST request, which opens no account).
        address: Option<std::net::IpAddr>,
    },
    Command {
        command: Command,
    },
    Subscribe {
        channel: Channel,
        instrument: InstrumentId,
    },
    Unsubscribe {
        channel: Channel,
        instrument: InstrumentId,
    },
    Instruments {},
    OpenOrders {
        after: Option<u64>,
    },
    Leases {
        after: Option<u64>,
    },
    Stats {
        instrument: InstrumentId,
    },
    SupplierStats {
        supplier: AccountId,
    },
    RenterStats {
        renter: AccountId,
    },
    BookOffers {
        instrument: InstrumentId,
        offset: u32,
        after: Option<gpux_engine::OfferCursor>,
    },
    SearchOffers {
        search: Box<gpux_protocol::search::OfferSearch>,
    },
    Usage {
        report: Box<gpux_protocol::UsageReport>,
        /// The key the gateway verified the report's signature against
        /// under ZIP-215, if it verified (the session's login key).
        checked_by: Option<[u8; 32]>,
    },
    Balance {},
    Statement {
        after: Option<u64>,
    },
    /// The statement newest first, before a transfer id.
    RecentStatement {
        before: Option<u64>,
    },
    MyGpus {
        offset: u32,
    },
    Disconnect {
        /// The exchange closed it because it is stopping (not the client's
        /// doing: no fact of a supplier's record).
        exchange_stopping: bool,
    },
    /// The connection fell more than the feed's buffer behind one of its
    /// feeds and dropped it: send a fresh book snapshot (the conflated book)
    /// and restart the feed from now.
    Resync {
        channel: Channel,
        instrument: InstrumentId,
    },
    /// A bid with a workload for the leases it fills (validated by the gateway).
    Bid {
        command: Box<Command>,
        workload: Option<Box<gpux_protocol::Workload>>,
        /// Replace a lease this bid fills if its host fails it.
        rematch: bool,
        /// The renter's volumes mounted into each lease it fills (shapes
        /// checked by the gateway).
        #[serde(default)]
        volumes: Vec<gpux_protocol::VolumeMount>,
    },
    /// Lease delivery: workloads, host keys, statuses, logs.
    Delivery {
        request: DeliveryRequest,
    },
    /// A host's answer to a hardware challenge (hex already decoded).
    Challenge {
        request: ChallengeRequest,
    },
    /// A renter's signed liveness observation of its lease.
    Liveness {
        report: Box<gpux_protocol::LivenessReport>,
    },
    /// Sub-accounts and API keys (hex already decoded), and invoices.
    Access {
        request: AccessRequest,
    },
    /// The exchange's public key (public).
    ExchangeKey {},
    /// The listing the engine runs (public).
    Listing {},
    /// A lease's recent telemetry (its renter or supplier).
    LeaseTelemetry {
        lease: LeaseId,
    },
    /// Market history from the journal's index: trades and candles
    /// (public), the account's fills.
    History {
        request: HistoryRequest,
    },
    /// An instrument's book now, once (public).
    Book {
        instrument: InstrumentId,
    },
    /// Jobs (docs/protocol.md "Jobs").
    Job {
        request: JobRequest,
    },
    /// A renter's GPU probe observation of its lease (signed by the probe).
    GpuProbe {
        report: Box<gpux_protocol::GpuProbeReport>,
    },
    /// Services (docs/protocol.md "Services").
    Service {
        request: ServiceRequest,
    },
    /// Volumes (docs/protocol.md "Volumes").
    Volume {
        request: VolumeRequest,
    },
    /// In process only: over a socket a gateway sends `wire::Up::Connect`
    /// and the link server makes the connection's `Outbound`. Last, and
    /// it must stay last: serde numbers variants by position when encoding
    /// but skips this one when decoding, so one before others would shift
    /// them (`wire::tests` catch it).
    #[serde(skip)]
    Connect {
        outbound: Outbound,
    },
}

/// Market history (docs/protocol.md "History").
#[derive(Serialize, Deserialize)]
pub enum HistoryRequest {
    Trades { instrument: InstrumentId, before_seq: Option<u64> },
    Candles { instrument: InstrumentId, interval: gpux_protocol::CandleInterval, before_ms: Option<u64> },
    Fills { before: Option<gpux_protocol::FillCursor> },
}

/// Jobs (docs/protocol.md "Jobs").
#[derive(Serialize, Deserialize)]
pub enum JobRequest {
    Submit { job: Box<gpux_protocol::JobSubmission> },
    Status { job: gpux_protocol::JobId },
    List { offset: u32 },
    Cancel { job: gpux_protocol::JobId },
    StoreToken { job: Option<gpux_protocol::JobId>, lease: Option<LeaseId>, volume: Option<String> },
    Bill { job: gpux_protocol::JobId, offset: u32 },
    Resize { job: gpux_protocol::JobId, gpus: u32 },
}

/// Volumes (docs/protocol.md "Volumes").
#[derive(Serialize, Deserialize)]
pub enum VolumeRequest {
    Create { name: String, size_gib: u32 },
    List,
    Delete { name: String },
}

/// Services (docs/protocol.md "Services").
#[derive(Serialize, Deserialize)]
pub enum ServiceRequest {
    Create { spec: Box<gpux_protocol::ServiceSpec>, floor: Option<gpux_protocol::ServiceFloor> },
    Status { service: gpux_protocol::ServiceId },
    List { offset: u32 },
    Scale { service: gpux_protocol::ServiceId, replicas: u32 },
    Delete { service: gpux_protocol::ServiceId },
    Load { service: gpux_protocol::ServiceId, router: u32, load: gpux_protocol::ServiceLoad },
    Update { service: gpux_protocol::ServiceId, run: gpux_protocol::ServiceRun },
    Bill { service: gpux_protocol::ServiceId, offset: u32 },
}

/// Sub-accounts and keys (docs/protocol.md "Sub-accounts", "Keys and scopes").
#[derive(Serialize, Deserialize)]
pub enum AccessRequest {
    OpenSubAccount,
    MoveFunds { sub_account: AccountId, amount_minor: u64, to_sub_account: bool },
    SetLimits { sub_account: AccountId, limits: gpux_engine::AccountLimits },
    SubAccounts { offset: u32 },
    AddKey { account: Option<AccountId>, public_key: [u8; 32], scopes: Scopes, expires_at_ms: Option<u64>, label: String },
    RevokeKey { public_key: [u8; 32] },
    Keys { account: Option<AccountId> },
    Invoice { period: String, account: Option<AccountId>, offset: u32 },
    Spend,
}

/// The hardware challenge's steps (docs/protocol.md "Hardware challenges").
#[derive(Serialize, Deserialize)]
pub enum ChallengeRequest {
    Commit {
        challenge: u64,
        commitment: [u8; 32],
    },
    /// `challenge_opening` (`memory: false`) or `memory_opening`.
    Opening {
        challenge: u64,
        leaves: Vec<gpux_protocol::memory::LeafOpening>,
        memory: bool,
    },
}

impl Request {
    pub fn new(connection: ConnectionId, id: u64, body: Body) -> Request {
        Request { connection, id, body }
    }

    /// The id of the client request this carries (answered by a message
    /// with the same id); `None` for the gateway's own notices.
    pub fn id(&self) -> Option<u64> {
        (!self.body.is_notice()).then_some(self.id)
    }

    /// The connection this request came from, to rewrite (the link server
    /// maps a remote gateway's connection ids into its own range).
    pub fn connection_mut(&mut self) -> &mut ConnectionId {
        &mut self.connection
    }

    /// The connection this request came from.
    pub fn connection(&self) -> ConnectionId {
        self.connection
    }

    /// The scope a key needs to send this request ([`Body::scope`]).
    pub fn scope(&self) -> Option<Scope> {
        self.body.scope()
    }
}

impl Body {
    /// The scope a key needs to send this request (docs/protocol.md "Keys
    /// and scopes"); `None` for public requests and the gateway's own.
    pub fn scope(&self) -> Option<Scope> {
        match self {
            Body::Command { command, .. } => Some(command_scope(command)),
            Body::Bid { .. }
            | Body::Job { request: JobRequest::Submit { .. } | JobRequest::Cancel { .. } | JobRequest::Resize { .. }, .. } => {
                Some(Scope::Trade)
            }
            Body::Job { request: JobRequest::StoreToken { lease: Some(_), .. }, .. } => Some(Scope::Deliver),
            // A renter's volume token writes the volume's files.
            Body::Job { request: JobRequest::StoreToken { volume: Some(_), .. }, .. } => Some(Scope::Trade),
            Body::Job { .. } => Some(Scope::Read),
            // A router's load moves a service only within the bounds its
            // renter set: the router's read key may send it.
            Body::Service {
                request:
                    ServiceRequest::Status { .. } | ServiceRequest::List { .. } | ServiceRequest::Load { .. } | ServiceRequest::Bill { .. },
            } => Some(Scope::Read),
            Body::Service { .. } => Some(Scope::Trade),
            Body::Volume { request: VolumeRequest::List } => Some(Scope::Read),
            Body::Volume { .. } => Some(Scope::Trade),
            Body::OpenOrders { .. }
            | Body::Leases { .. }
            | Body::LeaseTelemetry { .. }
            | Body::History { request: HistoryRequest::Fills { .. }, .. }
            | Body::Balance { .. }
            | Body::Statement { .. }
            | Body::RecentStatement { .. }
            | Body::MyGpus { .. }
            | Body::Delivery { request: DeliveryRequest::Query { .. }, .. }
            | Body::Access {
                request:
                    AccessRequest::SubAccounts { .. } | AccessRequest::Keys { .. } | AccessRequest::Invoice { .. } | AccessRequest::Spend,
                ..
            } => Some(Scope::Read),
            Body::Usage { .. } | Body::Delivery { .. } | Body::Challenge { .. } | Body::Liveness { .. } | Body::GpuProbe { .. } => {
                Some(Scope::Deliver)
            }
            Body::Access { .. } => Some(Scope::Manage),
            Body::Connect { .. }
            | Body::Authenticate { .. }
            | Body::Subscribe { .. }
            | Body::Unsubscribe { .. }
            | Body::Instruments { .. }
            | Body::Stats { .. }
            | Body::SupplierStats { .. }
            | Body::RenterStats { .. }
            | Body::BookOffers { .. }
            | Body::SearchOffers { .. }
            | Body::ExchangeKey { .. }
            | Body::Listing { .. }
            | Body::History { .. }
            | Body::Book { .. }
            | Body::Disconnect { .. }
            | Body::Resync { .. } => None,
        }
    }

    /// Whether a connection that has not logged in may send this: market
    /// data and public records, as on any exchange. The one list: the
    /// WebSocket gateway, the REST API and the sequencer's scope check ask
    /// here, and a new request does not compile until it is placed.
    pub fn is_public(&self) -> bool {
        match self {
            Body::Subscribe { .. }
            | Body::Unsubscribe { .. }
            | Body::Instruments {}
            | Body::Stats { .. }
            | Body::SupplierStats { .. }
            | Body::RenterStats { .. }
            | Body::BookOffers { .. }
            | Body::SearchOffers { .. }
            | Body::ExchangeKey {}
            | Body::Listing {}
            | Body::Book { .. }
            | Body::History { request: HistoryRequest::Trades { .. } | HistoryRequest::Candles { .. } } => true,
            Body::History { request: HistoryRequest::Fills { .. } }
            | Body::Authenticate { .. }
            | Body::Command { .. }
            | Body::OpenOrders { .. }
            | Body::Leases { .. }
            | Body::Usage { .. }
            | Body::Balance {}
            | Body::Statement { .. }
            | Body::RecentStatement { .. }
            | Body::MyGpus { .. }
            | Body::Bid { .. }
            | Body::Delivery { .. }
            | Body::Challenge { .. }
            | Body::Liveness { .. }
            | Body::GpuProbe { .. }
            | Body::Access { .. }
            | Body::LeaseTelemetry { .. }
            | Body::Job { .. }
            | Body::Service { .. }
            | Body::Volume { .. }
            | Body::Disconnect { .. }
            | Body::Resync { .. }
            | Body::Connect { .. } => false,
        }
    }

    /// The gateway's own notices about a connection, which carry no client
    /// request id and get no answer.
    pub fn is_notice(&self) -> bool {
        matches!(self, Body::Connect { .. } | Body::Disconnect { .. } | Body::Resync { .. })
    }
}

/// The scope of an engine command a client sends.
fn command_scope(command: &Command) -> Scope {
    match command {
        Command::Place { .. }
        | Command::CancelOrder { .. }
        | Command::ReplaceOrder { .. }
        | Command::MassCancel { .. }
        | Command::OfferLease { .. } => Scope::Trade,
        Command::EndLease { .. } | Command::Register { .. } | Command::SetGpuOnline { .. } | Command::FailLeaseDelivery { .. } => {
            Scope::Deliver
        }
        Command::Withdraw { .. } | Command::Payout { .. } | Command::Deposit { .. } => Scope::Withdraw,
        // Nothing else comes from a client but sub-account management; the
        // market's own commands never pass a scope check.
        _ => Scope::Manage,
    }
}

/// The delivery requests (docs/protocol.md "Lease delivery").
#[derive(Serialize, Deserialize)]
pub enum DeliveryRequest {
    SetWorkload {
        lease: LeaseId,
        workload: Box<gpux_protocol::Workload>,
    },
    SetEncryptionKey {
        key: [u8; 32],
        signature: String,
    },
    HostKey {
        lease: LeaseId,
    },
    Status {
        lease: LeaseId,
        state: DeliveryState,
    },
    Query {
        lease: LeaseId,
    },
    Logs {
        lease: LeaseId,
        tail_bytes: u32,
    },
    LogsReply {
        request: u64,
        data: String,
        truncated: bool,
    },
    /// A renter's command for its lease's workload (checked against the
    /// limits by the gateway).
    Exec {
        lease: LeaseId,
        command: Vec<String>,
        timeout_ms: u32,
    },
    ExecReply {
        request: u64,
        outcome: gpux_protocol::delivery::ExecOutcome,
    },
    /// A cluster member's signed interconnect probe.
    FabricProbe {
        report: Box<gpux_protocol::FabricProbeReport>,
    },
}

/// The exchange's clock: the wall clock plus an offset (`--clock-offset-ms`),
/// zero in production; demos and tests move the exchange's time ahead to
/// reach a reserved window's start without waiting for it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Clock {
    pub offset_ms: i64,
}

impl Clock {
    /// The exchange's time now, in ms since the Unix epoch.
    pub fn now_ms(&self) -> u64 {
        let wall = SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64);
        wall.saturating_add_signed(self.offset_ms)
    }
}
