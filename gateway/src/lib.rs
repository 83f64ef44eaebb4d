//! gpux-gateway: the WebSocket edge of the exchange. It owns everything
//! about a connection: admission (caps per IP, on logins pending and on all
//! connections, handshake and login deadlines), TLS, the ed25519 challenge
//! login checked end to end here, the codec (JSON text or bincode binary,
//! chosen by the client's first frame), per-connection rate and in-flight
//! limits, and the fan-out of the sequencer's frames and market-data feeds
//! to sockets (outbox, slow consumers, resync).
//!
//! The REST read API ([`rest`]) is the same edge over HTTP: one short
//! session per request.
//!
//! It talks to the sequencer only through [`link`]: typed `Request`s in, and
//! `Outgoing` frames out through each connection's `Outbound`. It knows
//! nothing of the journal, the engine's state or the ledger.

pub mod admission;
pub mod conflation;
pub mod idempotency;
pub mod limits;
pub mod link;
pub mod metrics;
pub mod remote;
pub mod rest;
mod server;
pub mod verifier;
pub mod wire;

pub use server::*;
