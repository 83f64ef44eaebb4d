//! Every bound of the gateway in one place (engine/src/limits.rs's habit):
//! what one connection, one address, one link and all of them together may
//! hold, with the relations between them asserted at compile time. The
//! modules that use a bound re-export it where it was; docs/protocol.md
//! "Limits and abuse" and docs/rest.md state them for users.

use gpux_protocol::FRAME_BYTES_MAX;

// Admission (admission.rs): connections in all, from one address, not yet
// logged in; descriptors kept for everything else.
pub const CONNECTIONS_MAX_DEFAULT: usize = 16_384;
pub const PER_IP_MAX_DEFAULT: usize = 256;
pub const UNAUTHENTICATED_MAX_DEFAULT: usize = 4_096;
/// Descriptors kept for everything that is not a client connection: the
/// journal and snapshot files, the metrics and console listeners and their
/// connections, the runtime's own.
pub const DESCRIPTORS_RESERVED: usize = 128;

// One connection (server.rs).
/// Frames queued for one connection before it counts as a slow consumer
/// (default). It must hold the largest burst one sequencer batch can send a
/// connection that reads promptly: at most `REQUESTS_IN_FLIGHT_MAX` answers
/// with the private events and market data around them.
pub const OUTBOUND_FRAMES_MAX: usize = 65_536;
/// Requests one connection may have waiting for an answer from the sequencer.
pub const REQUESTS_IN_FLIGHT_MAX: u32 = 1024;
/// Sustained messages per second one connection may send.
pub const MESSAGES_PER_SECOND_MAX: f64 = 5_000.0;
/// Burst above the sustained rate.
pub const MESSAGE_BURST_MAX: f64 = 10_000.0;
/// Resynchronisations one connection may need within `RESYNC_WINDOW`; one
/// more and it is closed `slow_consumer`: it cannot keep up even conflated.
pub const RESYNCS_MAX: usize = 3;
/// The WebSocket read buffer of one connection, allocated when it opens.
pub const READ_BUFFER_BYTES: usize = 8 * 1024;
/// Bytes waiting in one connection's outbox before it takes nothing new
/// (a batch may go over by what it holds).
pub const OUTBOX_BYTES_MAX: usize = 1 << 20;

// Market data and links (link.rs, remote.rs, wire.rs).
/// Frames one market-data feed buffers (default, `--feed-frames-max`); a
/// subscriber further behind loses its place and is resynchronised: a fresh
/// book snapshot, then the feed from there (`Body::Resync`).
pub const FEED_FRAMES_MAX: usize = 16_384;
/// Book levels one market-data version 2 connection holds conflated while
/// its peer reads (conflation.rs), over all its books: one further behind
/// is resynchronised with a snapshot, as in version 1. A `book_conflated`
/// of them all is about 50 KiB of JSON, a frame a client reads.
pub const CONFLATED_LEVELS_MAX: usize = 2_048;
/// Messages in one `market_data` frame at most: an update is about 110
/// bytes of JSON, so a frame stays under the 64 KiB a client reads.
pub const BATCH_MESSAGES_MAX: usize = 256;
/// Bytes in a version 2 connection's outbox up to which it still reads its
/// feeds while the peer is behind: its book updates conflate (no bytes),
/// its trades queue.
pub const OUTBOX_CONFLATING_BYTES_MAX: usize = 2 * OUTBOX_BYTES_MAX;
/// Frames a gateway's link queues in the sequencer's process before the
/// link counts as too slow and is closed (its gateway reconnects).
pub const LINK_QUEUE_FRAMES_MAX: usize = 1 << 16;
/// Requests waiting for the link (between the gateway's connections and
/// the link's writer).
pub const BRIDGE_QUEUE_MAX: usize = 1 << 14;
/// The largest link frame: one request or server message (client frames are
/// at most `FRAME_BYTES_MAX`), with room for the framing around it.
pub const LINK_FRAME_BYTES_MAX: usize = 2 * FRAME_BYTES_MAX + 4096;

// Usage reports (verifier.rs).
/// Reports verified together at most.
pub const BATCH_MAX: usize = 64;

// REST (rest.rs, idempotency.rs).
/// The largest body of a REST write: a WebSocket frame's.
pub const WRITE_BODY_BYTES_MAX: usize = FRAME_BYTES_MAX;
/// Answers one signing key keeps for retries; its oldest are dropped for newer ones.
pub const IDEMPOTENCY_PER_SIGNER_MAX: usize = 1_024;
/// Answers one participant (an account and its sub-accounts, all their
/// keys) keeps; its oldest are dropped for newer ones.
pub const IDEMPOTENCY_PER_PARTICIPANT_MAX: usize = 4_096;
/// Answers kept for all signing keys together.
pub const IDEMPOTENCY_ENTRIES_MAX: usize = 65_536;
/// Bytes of answers kept for all signing keys together.
pub const IDEMPOTENCY_BYTES_MAX: usize = 64 << 20;
/// An idempotency key's longest form, in characters.
pub const IDEMPOTENCY_KEY_CHARS_MAX: usize = 64;

// The relations the bounds rely on.
const _: () = assert!(PER_IP_MAX_DEFAULT <= CONNECTIONS_MAX_DEFAULT && UNAUTHENTICATED_MAX_DEFAULT <= CONNECTIONS_MAX_DEFAULT);
const _: () = assert!(
    REQUESTS_IN_FLIGHT_MAX as usize * 16 <= OUTBOUND_FRAMES_MAX,
    "every answer in flight, and the events around it, fits a connection's queue"
);
const _: () = assert!(MESSAGE_BURST_MAX >= MESSAGES_PER_SECOND_MAX, "a burst holds at least a second's messages");
const _: () = assert!(LINK_FRAME_BYTES_MAX > 2 * FRAME_BYTES_MAX, "a client frame, and a server message its size, fit one link frame");
const _: () = assert!(WRITE_BODY_BYTES_MAX <= FRAME_BYTES_MAX, "a REST write's body is no larger than the frame it becomes");
const _: () = assert!(IDEMPOTENCY_ENTRIES_MAX / IDEMPOTENCY_PER_SIGNER_MAX >= 64, "one signer holds at most 1/64 of the table");
const _: () = assert!(IDEMPOTENCY_ENTRIES_MAX / IDEMPOTENCY_PER_PARTICIPANT_MAX >= 16, "one participant holds at most 1/16 of the table");
const _: () = assert!(IDEMPOTENCY_PER_SIGNER_MAX <= IDEMPOTENCY_PER_PARTICIPANT_MAX);
const _: () = assert!(BATCH_MAX >= 1 && READ_BUFFER_BYTES <= FRAME_BYTES_MAX);
const _: () = assert!(BATCH_MESSAGES_MAX * 256 <= FRAME_BYTES_MAX, "a batch of updates fits the frame a client reads");
const _: () = assert!(OUTBOX_CONFLATING_BYTES_MAX > OUTBOX_BYTES_MAX);
