//! Every bound of the exchange process in one place (engine/src/limits.rs's
//! and gateway/src/limits.rs's habit): what one connection, one account,
//! one address, one link and everything together may hold, with the
//! relations between them asserted at compile time. The modules that use
//! a bound re-export it where it was; docs/operations.md and
//! docs/protocol.md "Limits and abuse" state them for users.

use std::time::Duration;

// The sequencer's queue (lib.rs).
/// Requests queued for the sequencer before clients are told to slow down.
pub const SEQUENCER_QUEUE_MAX: usize = 1 << 16;

// The sequencer (sequencer/mod.rs): a batch, one connection's subscriptions, the logs relay.
/// Requests handled in one batch at most (one journal commit).
pub const BATCH_MAX: usize = 4096;
/// Subscriptions one connection may hold.
pub const SUBSCRIPTIONS_PER_CONNECTION_MAX: usize = 64;
/// How long a renter's `lease_logs` waits for the host.
pub const LOGS_WAIT_MS: u64 = 10_000;
/// `lease_logs` requests waiting at once, exchange-wide (one per connection).
pub const LOGS_PENDING_MAX: usize = 1024;
/// Of those, one renter participant's (an account and its sub-accounts,
/// over all their connections): a renter whose host stays silent holds at
/// most this many places for 10 s each.
pub const LOGS_PENDING_PER_ACCOUNT_MAX: usize = 4;
/// Of those, waiting on one supplier participant's hosts: a silent host (or a renter
/// and host of one owner) cannot hold every other renter's place.
pub const LOGS_PENDING_PER_SUPPLIER_MAX: usize = 64;

// Opening accounts (sequencer/opening.rs).
/// Accounts one address may open per hour by default (open mode).
pub const ACCOUNTS_PER_ADDRESS_HOUR_DEFAULT: u32 = 20;
/// Addresses whose openings are counted at once; a newcomer past it is
/// refused `rate_limited` until an hour-old count is dropped.
pub const OPENING_ADDRESSES_MAX: usize = 65_536;

// Remote gateways' links (link_server.rs).
/// Links open at once (each is a gateway process; a handful is normal).
pub const LINKS_MAX: usize = 64;
/// Connections still in their handshake (not yet shown to hold the
/// secret): a pool of their own, apart from the links, so silent
/// connections never keep a real gateway from linking. When it is full the
/// oldest handshake is dropped for the newcomer: a gateway's handshake takes
/// a round trip, so a flood would have to arrive faster than that to crowd
/// it out.
pub const LINK_HANDSHAKES_MAX: usize = 16;

// The HTTP listener of the console, REST and metrics (http.rs).
/// The whole exchange on one HTTP connection must be over within this time.
pub const HTTP_REQUEST_TIMEOUT: Duration = Duration::from_secs(5);
/// The request head must have arrived within this time.
pub const HTTP_HEAD_TIMEOUT: Duration = Duration::from_secs(2);
/// HTTP connections at once on each of the metrics and console listeners.
pub const HTTP_CONNECTIONS_MAX: usize = 64;
/// HTTP connections at once from one IP address on each listener.
pub const HTTP_CONNECTIONS_PER_IP_MAX: usize = 16;
/// The largest request head read.
pub const HTTP_HEAD_BYTES_MAX: usize = 8 * 1024;

// The job store (job_store.rs): per object, per account, in flight.
/// Bytes one request may put (a bundle is at most 256 MiB; a checkpoint
/// file as large as this needs splitting by the workload).
pub const OBJECT_BYTES_MAX: u64 = 1 << 30;
/// Objects listed at most (and kept at most per account).
pub const OBJECTS_PER_ACCOUNT_MAX: usize = 10_000;
/// The default share of the store per account (`--job-store-quota-mib`).
pub const QUOTA_BYTES_DEFAULT: u64 = 20 << 30;
/// The journal's reserve on the data directory's file system unless
/// `--disk-reserve-mib` says otherwise (disk.rs).
pub const DISK_RESERVE_BYTES_DEFAULT: u64 = 256 << 20;

/// Puts in flight at once on the store (each streams its body to the
/// backend through at most `PUT_CHUNK_BYTES` x 3 of memory).
pub const PUTS_IN_FLIGHT_MAX: usize = 16;
/// Puts in flight at once by one uploader: a renter participant (an account
/// and its sub-accounts), or one host's lease.
pub const PUTS_PER_UPLOADER_MAX: usize = 2;
const _: () = assert!(PUTS_PER_UPLOADER_MAX * 8 <= PUTS_IN_FLIGHT_MAX, "filling the uploads takes 8 uploaders");
/// A put's body moves to the backend in parts of this size (S3's least
/// part), at most two parts in flight.
pub const PUT_CHUNK_BYTES: usize = 5 << 20;
/// A put whose body sends nothing for this long is cut off
/// (`408 upload_stalled`).
pub const PUT_IDLE: Duration = Duration::from_secs(10);
/// After `PUT_RATE_GRACE`, a put must have averaged at least this rate
/// since (`408 upload_too_slow`), so a trickle cannot hold a slot for the
/// request's 10 minutes.
pub const PUT_RATE_MIN_BYTES_PER_S: u64 = 256 << 10;
pub const PUT_RATE_GRACE: Duration = Duration::from_secs(30);
/// Bytes of a key.
pub const KEY_BYTES_MAX: usize = 1024;

// The invoices' worker (invoices.rs).
/// Invoice jobs waiting at most; more are refused `invoice_unavailable`.
pub const INVOICE_QUEUE_MAX: usize = 64;
/// Of those, one participant's (an account and its sub-accounts together):
/// a burst from one never fills the queue for the others.
pub const INVOICE_QUEUE_PER_PARTICIPANT_MAX: usize = 4;
const _: () = assert!(INVOICE_QUEUE_PER_PARTICIPANT_MAX * 16 <= INVOICE_QUEUE_MAX, "sixteen participants fit at once");
/// Built invoices kept for the pages that follow the first.
pub const CACHED_MAX: usize = 32;

// Snapshots (snapshots.rs).
/// What a snapshot must leave free on the data directory's file system
/// after twice its size (docs/operations.md "Disk space").
pub const SNAPSHOT_RESERVE_BYTES: u64 = 256 << 20;
/// Snapshots kept (older ones are deleted when a new one is written).
pub const SNAPSHOTS_KEPT: usize = 2;

// A cluster (cluster.rs).
/// The smallest cluster secret accepted, in bytes.
pub const CLUSTER_SECRET_BYTES_MIN: usize = 16;

const _: () = {
    assert!(BATCH_MAX <= SEQUENCER_QUEUE_MAX, "a batch is taken from the queue");
    assert!(LOGS_PENDING_PER_ACCOUNT_MAX < LOGS_PENDING_PER_SUPPLIER_MAX && LOGS_PENDING_PER_SUPPLIER_MAX < LOGS_PENDING_MAX);
    assert!(LINK_HANDSHAKES_MAX <= LINKS_MAX, "handshakes in progress are links too");
    assert!(HTTP_CONNECTIONS_PER_IP_MAX < HTTP_CONNECTIONS_MAX, "one address cannot take every HTTP connection");
    assert!(HTTP_HEAD_TIMEOUT.as_millis() < HTTP_REQUEST_TIMEOUT.as_millis(), "the head comes within the request's time");
    assert!(OBJECT_BYTES_MAX <= QUOTA_BYTES_DEFAULT, "one object fits the default quota");
    assert!(CACHED_MAX <= INVOICE_QUEUE_MAX);
    assert!(SNAPSHOTS_KEPT >= 2, "a valid snapshot stays while the next is written");
};
