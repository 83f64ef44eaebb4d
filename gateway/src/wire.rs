//! The link over a socket (issue 19, part 1): the typed contract of
//! [`crate::link`] as frames on a byte stream (TCP or a Unix socket), so a
//! gateway can run as its own process.
//!
//! A stream starts with a handshake: each side writes a [`Hello`] (magic,
//! link version, who it is) and reads the other's; a different version or
//! a peer that is not a gpux link is refused before anything else is read.
//! Then each frame is a little-endian `u32` length and that many bytes of
//! bincode (the protocol's binary encoding, standard configuration), at
//! most [`LINK_FRAME_BYTES_MAX`]: a longer length is refused before any of
//! it is read or allocated.
//!
//! Gateway to sequencer: [`Up`]. A connection is announced with
//! `Up::Connect` (no `Outbound` travels: the sequencer's side of the link
//! makes one per remote connection and forwards what it receives as
//! [`Down`] frames tagged with the connection). Sequencer to gateway:
//! [`Down`]. Market data travels once per gateway: `Down::Feed` carries one
//! update of a feed, and the gateway hands it to each of its connections
//! subscribed to that feed (`Down::FeedStart` marks where a connection's
//! feed begins, right after its snapshot, in the stream's order).
//!
//! The exchange's side is `gpux_exchange::link_server`; the gateway's is
//! [`crate::remote`] (the `gpux-gateway` process).

use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

use crate::link::{ConnectionId, LoginOutcome, Request};
use gpux_engine::InstrumentId;
use gpux_protocol::{Channel, ErrorCode, ServerMessage};

/// This build's link version; both ends must speak the same.
pub const LINK_VERSION: u16 = 7;
/// What a link stream starts with.
pub const LINK_MAGIC: [u8; 8] = *b"gpuxlink";
pub use crate::limits::LINK_FRAME_BYTES_MAX;
/// The domain of the link handshake's proofs.
const LINK_DOMAIN: &[u8] = b"gpux-link-v2";

/// The first frame of each side.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Hello {
    pub magic: [u8; 8],
    pub version: u16,
    pub peer: Peer,
    /// A fresh random nonce: the other side's proof covers it, so no
    /// captured handshake works again.
    pub nonce: [u8; 32],
}

/// The second frame of each side: HMAC-SHA256, keyed with [`link_token`]
/// of the exchange's `link.secret`, over both nonces, the side's role (the
/// gateway connects, the sequencer accepts) and the peer it says it is
/// (`gpux_protocol::peer_auth`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Proof {
    pub proof: [u8; 32],
}

/// The key both ends of a link prove: SHA-256 of `gpux-link-v1:` and the
/// secret. It never travels: each handshake sends only proofs over fresh
/// nonces (the link's frames after it travel in clear: run links on
/// loopback or a private network).
pub fn link_token(secret: &[u8]) -> [u8; 32] {
    use sha2::Digest;
    let mut hasher = sha2::Sha256::new();
    hasher.update(b"gpux-link-v1:");
    hasher.update(secret);
    hasher.finalize().into()
}

/// A link's byte stream: plain TCP, or TLS over it (`--link-tls-*`).
pub trait LinkIo: AsyncRead + AsyncWrite + Unpin + Send + 'static {}
impl<T: AsyncRead + AsyncWrite + Unpin + Send + 'static> LinkIo for T {}
pub type LinkStream = Box<dyn LinkIo>;

/// Who is at an end of a link.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Peer {
    /// A gateway, by the name its operator gave it (for logs and metrics).
    Gateway { name: String },
    /// A sequencer node.
    Sequencer { node: u64 },
}

/// Gateway to sequencer.
#[derive(Serialize, Deserialize)]
pub enum Up {
    /// A client connection opened on the gateway.
    Connect { connection: ConnectionId },
    /// One of a connection's requests (never `Request::Connect`).
    Request(Request),
}

/// Sequencer to gateway.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub enum Down {
    /// A frame for one connection: an answer, a private event, a snapshot.
    Frame { connection: ConnectionId, message: ServerMessage },
    /// How a login the gateway forwarded ended.
    Login { connection: ConnectionId, outcome: LoginOutcome },
    /// Close the connection with this reason once what is before it is written.
    Close { connection: ConnectionId, code: ErrorCode },
    /// The connection's feed starts here (after its snapshot).
    FeedStart { connection: ConnectionId, channel: Channel, instrument: InstrumentId },
    /// The connection's feed ends here.
    FeedEnd { connection: ConnectionId, channel: Channel, instrument: InstrumentId },
    /// One update of a feed, once for all of this gateway's subscribers.
    Feed { channel: Channel, instrument: InstrumentId, message: ServerMessage },
    /// The connection's queue in the sequencer is full: close it `slow_consumer`.
    TooSlow { connection: ConnectionId },
}

/// Why a link stream failed. Each ends the link (the gateway then reconnects).
#[derive(Debug, thiserror::Error)]
pub enum WireError {
    #[error("link i/o: {0}")]
    Io(#[from] std::io::Error),
    #[error("a link frame of {0} bytes is over the limit of {LINK_FRAME_BYTES_MAX}")]
    TooLarge(usize),
    #[error("a link frame does not decode: {0}")]
    Decode(String),
    #[error("the peer is not a gpux link")]
    NotALink,
    #[error("the peer speaks link version {theirs}, this side {LINK_VERSION}")]
    Version { theirs: u16 },
    #[error("the link closed")]
    Closed,
    #[error("the gateway's link token is not the exchange's (link.secret)")]
    Token,
    #[error("the link broke the protocol: {0}")]
    Protocol(String),
    #[error("the gateway fell {} frames behind on its link", crate::link::LINK_QUEUE_FRAMES_MAX)]
    TooSlow,
}

fn config() -> impl bincode::config::Config {
    bincode::config::standard().with_limit::<LINK_FRAME_BYTES_MAX>()
}

/// Encodes one frame (length and body), ready to write.
pub fn encode_frame<T: Serialize>(value: &T) -> Result<Vec<u8>, WireError> {
    let mut frame = vec![0; 4];
    bincode::serde::encode_into_std_write(value, &mut frame, config()).map_err(|e| WireError::Decode(e.to_string()))?;
    let length = frame.len() - 4;
    if length > LINK_FRAME_BYTES_MAX {
        return Err(WireError::TooLarge(length));
    }
    frame[..4].copy_from_slice(&(length as u32).to_le_bytes());
    Ok(frame)
}

/// Writes one frame.
pub async fn write_frame<W: AsyncWrite + Unpin, T: Serialize>(writer: &mut W, value: &T) -> Result<(), WireError> {
    writer.write_all(&encode_frame(value)?).await?;
    Ok(())
}

/// Reads one frame; `Ok(None)` when the stream ends cleanly between frames.
pub async fn read_frame<R: AsyncRead + Unpin, T: DeserializeOwned>(reader: &mut R) -> Result<Option<T>, WireError> {
    let mut length = [0u8; 4];
    match reader.read_exact(&mut length).await {
        Ok(_) => {}
        Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => return Ok(None),
        Err(e) => return Err(e.into()),
    }
    let length = u32::from_le_bytes(length) as usize;
    if length > LINK_FRAME_BYTES_MAX {
        return Err(WireError::TooLarge(length));
    }
    let mut body = vec![0; length];
    reader.read_exact(&mut body).await.map_err(|e| match e.kind() {
        std::io::ErrorKind::UnexpectedEof => WireError::Closed,
        _ => WireError::Io(e),
    })?;
    let (value, used) = bincode::serde::decode_from_slice(&body, config()).map_err(|e| WireError::Decode(e.to_string()))?;
    if used != length {
        return Err(WireError::Decode(format!("{} bytes after the value", length - used)));
    }
    Ok(Some(value))
}

/// Writes this side's `Hello`, reads the peer's and checks it: the same
/// magic and link version.
pub async fn handshake<S: AsyncRead + AsyncWrite + Unpin>(stream: &mut S, peer: Peer, key: [u8; 32]) -> Result<Hello, WireError> {
    use gpux_protocol::peer_auth::{self, Role};
    let mine = peer_auth::nonce();
    write_frame(stream, &Hello { magic: LINK_MAGIC, version: LINK_VERSION, peer: peer.clone(), nonce: mine }).await?;
    stream.flush().await?;
    let theirs: Hello = match read_frame(stream).await {
        Ok(Some(hello)) => hello,
        Ok(None) => return Err(WireError::Closed),
        // Whatever is not a hello frame is not a link (an HTTP client, say).
        Err(WireError::Decode(_) | WireError::TooLarge(_)) => return Err(WireError::NotALink),
        Err(other) => return Err(other),
    };
    if theirs.magic != LINK_MAGIC {
        return Err(WireError::NotALink);
    }
    if theirs.version != LINK_VERSION {
        return Err(WireError::Version { theirs: theirs.version });
    }
    // The gateway connects; the sequencer accepts. Two ends of one role
    // each expect the other role's proof, and fail.
    let (role, other_role, initiator, responder) = match peer {
        Peer::Gateway { .. } => (Role::Initiator, Role::Responder, mine, theirs.nonce),
        Peer::Sequencer { .. } => (Role::Responder, Role::Initiator, theirs.nonce, mine),
    };
    let statement = |peer: &Peer| bincode::serde::encode_to_vec(peer, config()).map_err(|e| WireError::Decode(e.to_string()));
    let proof = peer_auth::proof(&key, LINK_DOMAIN, role, &initiator, &responder, &statement(&peer)?);
    write_frame(stream, &Proof { proof }).await?;
    stream.flush().await?;
    let their_proof: Proof = match read_frame(stream).await? {
        Some(proof) => proof,
        None => return Err(WireError::Closed),
    };
    let expected = peer_auth::proof(&key, LINK_DOMAIN, other_role, &initiator, &responder, &statement(&theirs.peer)?);
    if !peer_auth::same(&expected, &their_proof.proof) {
        return Err(WireError::Token);
    }
    Ok(theirs)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::link::{AccessRequest, Body, ChallengeRequest, DeliveryRequest, HistoryRequest};
    use gpux_engine::{AccountId, Command, LeaseId, Role};

    /// One of each request the gateway forwards (every `Request` variant
    /// but the in-process `Connect`), as `Up` frames.
    fn every_up() -> Vec<Up> {
        let c = 7;
        let report = gpux_protocol::UsageReport {
            body: gpux_protocol::UsageBody {
                lease: LeaseId(3),
                gpu_uuid: "GPU-1".into(),
                seq: 1,
                start_ms: 10,
                end_ms: 20,
                available_ms: 10,
                utilisation_percent: 50,
                memory_used_mib_max: 1,
                unhealthy_samples: 0,
                prev_hash: gpux_protocol::genesis_hash(),
                readings: Some(gpux_protocol::Readings { temperature_c_max: Some(70), power_w_mean: None }),
            },
            signature: "ab".repeat(64),
        };
        let requests = vec![
            Request {
                connection: c,
                id: 1,
                body: Body::Authenticate {
                    public_key: [5; 32],
                    role: Some(Role::Renter),
                    cancel_on_disconnect: true,
                    presence: true,
                    invite: Some("gpux-invite-v1.renter.1.00.00".into()),
                    address: Some(std::net::IpAddr::from([10, 0, 0, 7])),
                },
            },
            Request {
                connection: c,
                id: 2,
                body: Body::Command { command: Command::MassCancel { account: AccountId(4), instrument: None } },
            },
            Request { connection: c, id: 3, body: Body::Subscribe { channel: Channel::Book, instrument: InstrumentId(1) } },
            Request { connection: c, id: 4, body: Body::Unsubscribe { channel: Channel::Trades, instrument: InstrumentId(1) } },
            Request { connection: c, id: 5, body: Body::Instruments {} },
            Request { connection: c, id: 6, body: Body::OpenOrders { after: Some(10) } },
            Request { connection: c, id: 7, body: Body::Leases { after: None } },
            Request { connection: c, id: 8, body: Body::Stats { instrument: InstrumentId(2) } },
            Request { connection: c, id: 9, body: Body::SupplierStats { supplier: AccountId(9) } },
            Request { connection: c, id: 10, body: Body::RenterStats { renter: AccountId(9) } },
            Request {
                connection: c,
                id: 11,
                body: Body::BookOffers {
                    instrument: InstrumentId(2),
                    offset: 5,
                    after: Some(gpux_engine::OfferCursor { price_minor_per_gpu_hour: 7, priority: 8 }),
                },
            },
            Request { connection: c, id: 12, body: Body::Usage { report: Box::new(report), checked_by: Some([6; 32]) } },
            Request {
                connection: c,
                id: 30,
                body: Body::SearchOffers {
                    search: Box::new(gpux_protocol::search::OfferSearch {
                        min_gpu_memory_gb: 24,
                        regions: vec!["eu-west".into()],
                        sort: gpux_protocol::search::OfferSort::PricePerGb,
                        ..Default::default()
                    }),
                },
            },
            Request { connection: c, id: 13, body: Body::Balance {} },
            Request { connection: c, id: 14, body: Body::Statement { after: Some(3) } },
            Request { connection: c, id: 15, body: Body::RecentStatement { before: None } },
            Request { connection: c, id: 16, body: Body::MyGpus { offset: 0 } },
            Request { connection: c, id: 0, body: Body::Disconnect { exchange_stopping: false } },
            Request { connection: c, id: 0, body: Body::Resync { channel: Channel::Book, instrument: InstrumentId(1) } },
            Request {
                connection: c,
                id: 17,
                body: Body::Bid {
                    command: Box::new(Command::MassCancel { account: AccountId(4), instrument: None }),
                    workload: None,
                    rematch: true,
                    volumes: Vec::new(),
                },
            },
            Request { connection: c, id: 18, body: Body::Delivery { request: DeliveryRequest::HostKey { lease: LeaseId(3) } } },
            Request {
                connection: c,
                id: 19,
                body: Body::Delivery { request: DeliveryRequest::LogsReply { request: 4, data: "log".into(), truncated: false } },
            },
            Request {
                connection: c,
                id: 20,
                body: Body::Challenge {
                    request: ChallengeRequest::Opening {
                        challenge: 1,
                        leaves: vec![gpux_protocol::memory::LeafOpening { leaf: 0, words: vec![u32::MAX, 2], path: Vec::new() }],
                        memory: false,
                    },
                },
            },
            Request {
                connection: c,
                id: 31,
                body: Body::Challenge {
                    request: ChallengeRequest::Opening {
                        challenge: 2,
                        leaves: vec![gpux_protocol::memory::LeafOpening { leaf: 3, words: vec![1, 2], path: vec!["ab".repeat(32)] }],
                        memory: true,
                    },
                },
            },
            Request {
                connection: c,
                id: 29,
                body: Body::Delivery {
                    request: DeliveryRequest::FabricProbe {
                        report: Box::new(gpux_protocol::FabricProbeReport {
                            body: gpux_protocol::FabricProbeBody {
                                lease: LeaseId(3),
                                job: gpux_protocol::JobId(2),
                                attempt: 1,
                                ranks: 2,
                                rank: 1,
                                bytes: 1 << 20,
                                elapsed_us: 100,
                            },
                            signature: "cd".repeat(64),
                        }),
                    },
                },
            },
            Request {
                connection: c,
                id: 28,
                body: Body::Liveness {
                    report: Box::new(gpux_protocol::LivenessReport {
                        body: gpux_protocol::LivenessBody { lease: LeaseId(3), start_ms: 1, end_ms: 2, reachable: true },
                        signature: "cd".repeat(64),
                    }),
                },
            },
            Request {
                connection: c,
                id: 29,
                body: Body::GpuProbe {
                    report: Box::new(gpux_protocol::GpuProbeReport {
                        body: gpux_protocol::GpuProbeBody {
                            lease: LeaseId(3),
                            start_ms: 1,
                            end_ms: 2,
                            samples: 1,
                            gpus: vec![gpux_protocol::ProbeGpu {
                                uuid: "GPU-a".into(),
                                present_samples: 0,
                                utilisation_percent_mean: 0,
                                memory_used_mib_max: 0,
                            }],
                        },
                        probe_key: "ab".repeat(32),
                        signature: "cd".repeat(64),
                    }),
                },
            },
            Request {
                connection: c,
                id: 21,
                body: Body::Access { request: AccessRequest::Invoice { period: "2026-11".into(), account: None, offset: 0 } },
            },
            Request {
                connection: c,
                id: 22,
                body: Body::Access {
                    request: AccessRequest::MoveFunds { sub_account: AccountId(5), amount_minor: 100, to_sub_account: true },
                },
            },
            Request { connection: c, id: 23, body: Body::ExchangeKey {} },
            Request { connection: c, id: 24, body: Body::Listing {} },
            Request { connection: c, id: 25, body: Body::LeaseTelemetry { lease: LeaseId(3) } },
            Request {
                connection: c,
                id: 26,
                body: Body::History { request: HistoryRequest::Trades { instrument: InstrumentId(1), before_seq: Some(9) } },
            },
            Request { connection: c, id: 27, body: Body::Book { instrument: InstrumentId(1) } },
            Request {
                connection: c,
                id: 28,
                body: Body::Job { request: crate::link::JobRequest::Status { job: gpux_protocol::JobId(4) } },
            },
            Request {
                connection: c,
                id: 31,
                body: Body::Service { request: crate::link::ServiceRequest::Scale { service: gpux_protocol::ServiceId(2), replicas: 3 } },
            },
            Request {
                connection: c,
                id: 32,
                body: Body::Volume { request: crate::link::VolumeRequest::Create { name: "data".into(), size_gib: 10 } },
            },
        ];
        let mut ups = vec![Up::Connect { connection: c }];
        ups.extend(requests.into_iter().map(Up::Request));
        ups
    }

    /// Which variant a request is: a match without a wildcard, so a new
    /// `Request` variant does not compile until it is added here and to
    /// `every_up`.
    fn variant(request: &Request) -> usize {
        match &request.body {
            Body::Authenticate { .. } => 0,
            Body::Command { .. } => 1,
            Body::Subscribe { .. } => 2,
            Body::Unsubscribe { .. } => 3,
            Body::Instruments { .. } => 4,
            Body::OpenOrders { .. } => 5,
            Body::Leases { .. } => 6,
            Body::Stats { .. } => 7,
            Body::SupplierStats { .. } => 8,
            Body::RenterStats { .. } => 9,
            Body::BookOffers { .. } => 10,
            Body::Usage { .. } => 11,
            Body::Balance { .. } => 12,
            Body::Statement { .. } => 13,
            Body::RecentStatement { .. } => 14,
            Body::MyGpus { .. } => 15,
            Body::Disconnect { .. } => 16,
            Body::Resync { .. } => 17,
            Body::Bid { .. } => 18,
            Body::Delivery { .. } => 19,
            Body::Challenge { .. } => 20,
            Body::Liveness { .. } => 21,
            Body::Access { .. } => 22,
            Body::ExchangeKey { .. } => 23,
            Body::Listing { .. } => 24,
            Body::LeaseTelemetry { .. } => 25,
            Body::History { .. } => 26,
            Body::Book { .. } => 27,
            Body::Job { .. } => 28,
            Body::GpuProbe { .. } => 29,
            Body::SearchOffers { .. } => 30,
            Body::Service { .. } => 31,
            Body::Volume { .. } => 32,
            Body::Connect { .. } => usize::MAX,
        }
    }

    #[test]
    fn the_samples_hold_every_request_that_crosses_the_link() {
        let mut seen = [false; 33];
        for up in every_up() {
            if let Up::Request(request) = up {
                seen[variant(&request)] = true;
            }
        }
        assert_eq!(seen.iter().position(|seen| !seen), None, "a request variant has no sample");
    }

    /// Public means no scope: every request a stranger may send needs
    /// none, and every other one but the login and the gateway's own
    /// notices needs one.
    #[test]
    fn public_requests_and_scopes_agree() {
        for up in every_up() {
            let Up::Request(request) = up else { continue };
            let body = &request.body;
            let own = matches!(body, Body::Authenticate { .. }) || body.is_notice();
            assert_eq!(body.scope().is_none(), body.is_public() || own, "variant {}", variant(&request));
            assert_eq!(request.id(), (!body.is_notice()).then_some(request.id));
        }
    }

    fn every_down() -> Vec<Down> {
        let c = 9;
        vec![
            Down::Frame { connection: c, message: ServerMessage::Pong { id: 1, server_time_ms: 5 } },
            Down::Login {
                connection: c,
                outcome: LoginOutcome::Accepted { account: AccountId(3), role: Role::Supplier, participant: AccountId(3) },
            },
            Down::Login { connection: c, outcome: LoginOutcome::Refused },
            Down::Close { connection: c, code: ErrorCode::KeyRevoked },
            Down::FeedStart { connection: c, channel: Channel::Book, instrument: InstrumentId(2) },
            Down::FeedEnd { connection: c, channel: Channel::Book, instrument: InstrumentId(2) },
            Down::Feed {
                channel: Channel::Book,
                instrument: InstrumentId(2),
                message: ServerMessage::BookUpdate {
                    instrument: InstrumentId(2),
                    seq: 4,
                    side: gpux_engine::Side::Sell,
                    price_minor_per_gpu_hour: 1_000,
                    quantity: 3,
                },
            },
            Down::TooSlow { connection: c },
        ]
    }

    #[tokio::test]
    async fn every_frame_crosses_a_stream_unchanged_in_order() {
        let (mut gateway, mut sequencer) = tokio::io::duplex(1 << 20);
        let ups = every_up();
        for up in &ups {
            write_frame(&mut gateway, up).await.expect("written");
        }
        drop(gateway);
        // Compared by their encoding: the same bytes again after decoding.
        for up in &ups {
            let read: Up = read_frame(&mut sequencer).await.expect("reads").expect("a frame");
            assert_eq!(encode_frame(&read).expect("in memory"), encode_frame(up).expect("in memory"));
        }
        assert!(read_frame::<_, Up>(&mut sequencer).await.expect("a clean end").is_none(), "the stream ends between frames");
    }

    #[tokio::test]
    async fn down_frames_round_trip() {
        let (mut a, mut b) = tokio::io::duplex(1 << 16);
        for down in every_down() {
            write_frame(&mut a, &down).await.expect("written");
            let read: Down = read_frame(&mut b).await.expect("reads").expect("a frame");
            assert_eq!(format!("{read:?}"), format!("{down:?}"));
        }
    }

    #[test]
    fn the_in_process_connect_never_goes_on_the_wire() {
        let (frames, _) = tokio::sync::mpsc::channel(1);
        let outbound = crate::link::Outbound::local(frames, Default::default());
        let connect = Up::Request(Request { connection: 1, id: 0, body: Body::Connect { outbound } });
        assert!(matches!(encode_frame(&connect), Err(WireError::Decode(_))));
    }

    #[tokio::test]
    async fn an_oversize_length_is_refused_before_it_is_read() {
        let (mut a, mut b) = tokio::io::duplex(64);
        let length = (LINK_FRAME_BYTES_MAX as u32 + 1).to_le_bytes();
        a.write_all(&length).await.expect("in memory");
        // Nothing of the body is sent: a reader that waited for it would hang.
        match read_frame::<_, Down>(&mut b).await {
            Err(WireError::TooLarge(n)) => assert_eq!(n, LINK_FRAME_BYTES_MAX + 1),
            other => panic!("expected too_large, got {:?}", other.map(|_| ())),
        }
    }

    #[tokio::test]
    async fn a_frame_cut_short_or_garbled_is_an_error_not_a_value() {
        let (mut a, mut b) = tokio::io::duplex(1 << 16);
        let frame = encode_frame(&every_down()[0]).expect("in memory");
        a.write_all(&frame[..frame.len() - 1]).await.expect("in memory");
        drop(a);
        assert!(matches!(read_frame::<_, Down>(&mut b).await, Err(WireError::Closed)));
        let (mut a, mut b) = tokio::io::duplex(1 << 16);
        let mut garbled = frame.clone();
        garbled[4] = 200; // no such variant
        a.write_all(&garbled).await.expect("in memory");
        assert!(matches!(read_frame::<_, Down>(&mut b).await, Err(WireError::Decode(_))));
    }

    #[tokio::test]
    async fn the_handshake_admits_the_same_version_and_refuses_others() {
        let (mut a, mut b) = tokio::io::duplex(1 << 16);
        let token = link_token(b"secret");
        let gateway = tokio::spawn(async move { handshake(&mut a, Peer::Gateway { name: "g1".into() }, token).await.map(|h| h.peer) });
        let sequencer = handshake(&mut b, Peer::Sequencer { node: 1 }, token).await.expect("same version");
        assert_eq!(sequencer.peer, Peer::Gateway { name: "g1".into() });
        assert_ne!(link_token(b"secret"), link_token(b"other"));
        assert_eq!(gateway.await.expect("in memory").expect("same version"), Peer::Sequencer { node: 1 });

        // A peer of another version.
        let (mut a, mut b) = tokio::io::duplex(1 << 16);
        let other = Hello { magic: LINK_MAGIC, version: LINK_VERSION + 1, peer: Peer::Sequencer { node: 2 }, nonce: [0; 32] };
        write_frame(&mut a, &other).await.expect("in memory");
        assert!(
            matches!(handshake(&mut b, Peer::Gateway { name: "g".into() }, token).await, Err(WireError::Version { theirs }) if theirs == LINK_VERSION + 1)
        );

        // Something that is not a link at all (an HTTP request).
        let (mut a, mut b) = tokio::io::duplex(1 << 16);
        a.write_all(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n").await.expect("in memory");
        assert!(matches!(handshake(&mut b, Peer::Sequencer { node: 1 }, token).await, Err(WireError::NotALink)));
    }

    /// Issue 41: the hello once carried a fixed hash of the secret, so one
    /// captured handshake opened a link for ever. Now each side proves the
    /// key over the other's fresh nonce: a wrong key fails on both sides, and
    /// a recorded handshake replayed to the exchange fails.
    #[tokio::test]
    async fn a_wrong_key_or_a_replayed_handshake_opens_no_link() {
        let (mut a, mut b) = tokio::io::duplex(1 << 16);
        let gateway =
            tokio::spawn(async move { handshake(&mut a, Peer::Gateway { name: "g1".into() }, link_token(b"guess")).await.map(|h| h.peer) });
        let sequencer = handshake(&mut b, Peer::Sequencer { node: 1 }, link_token(b"secret")).await;
        assert!(matches!(sequencer, Err(WireError::Token)), "the exchange refuses a wrong key");
        assert!(matches!(gateway.await.expect("in memory"), Err(WireError::Token)), "the gateway refuses an exchange without the key");

        // Record what a real gateway sends in a good handshake.
        let token = link_token(b"secret");
        let (mut a, mut b) = tokio::io::duplex(1 << 16);
        let recorded = tokio::spawn(async move {
            let hello = Hello { magic: LINK_MAGIC, version: LINK_VERSION, peer: Peer::Gateway { name: "g1".into() }, nonce: [7; 32] };
            write_frame(&mut a, &hello).await.expect("in memory");
            let sequencer_hello: Hello = read_frame(&mut a).await.expect("read").expect("a hello");
            let proof = gpux_protocol::peer_auth::proof(
                &token,
                LINK_DOMAIN,
                gpux_protocol::peer_auth::Role::Initiator,
                &[7; 32],
                &sequencer_hello.nonce,
                &bincode::serde::encode_to_vec(&hello.peer, config()).expect("encodes"),
            );
            write_frame(&mut a, &Proof { proof }).await.expect("in memory");
            let _: Option<Proof> = read_frame(&mut a).await.expect("the exchange's proof");
            (hello, Proof { proof })
        });
        handshake(&mut b, Peer::Sequencer { node: 1 }, token).await.expect("the real gateway links");
        let (hello, proof) = recorded.await.expect("in memory");
        // Replayed word for word to a new connection: the exchange's nonce differs.
        let (mut a, mut b) = tokio::io::duplex(1 << 16);
        write_frame(&mut a, &hello).await.expect("in memory");
        write_frame(&mut a, &proof).await.expect("in memory");
        assert!(matches!(handshake(&mut b, Peer::Sequencer { node: 1 }, token).await, Err(WireError::Token)));
    }
}
