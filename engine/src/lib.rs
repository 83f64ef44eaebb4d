//! gpux-engine: the deterministic matching engine of the gpux exchange.
//!
//! The engine is a pure state machine: [`Engine::apply`] takes one sequenced
//! [`Input`] (a [`Command`] and the time it was sequenced at) and appends the
//! numbered [`Event`]s it caused to a caller-owned buffer. It reads no clock,
//! draws no random numbers and performs no I/O, so the same journal of inputs
//! always rebuilds the same state and the same events; [`Engine::state_hash`]
//! makes that checkable.
//!
//! The one design decision that shapes everything else: GPU capacity is not
//! fungible. An ask is backed by concrete GPUs on one host (or, in a reserved
//! window, by contracts its seller holds), and the engine tracks what every GPU
//! is doing over time, so matching skips asks that cannot serve a bid's lease
//! and the same GPU is never sold twice for overlapping time.

pub mod book;
mod chunked;
pub mod command;
pub mod config;
pub mod engine;
pub mod event;
pub mod gpus;
pub mod ids;
pub mod limits;
pub mod state_hash;
pub mod stored;
pub mod time;
mod timer_heap;

pub use command::*;
pub use config::*;
pub use engine::{
    probe_bears_out, Balances, ChallengeTarget, ContractInfo, ContractKind, ContractOutcome, Engine, FabricId, FabricInfo, FabricProbe,
    GpuInfo, GpuVerification, InstrumentInfo, InstrumentState, LeaseInfo, ListingChangeError, MemberAddress, MemoryVerification,
    OfferCursor, OfferInfo, OrderInfo, SpendStatus, SubAccountInfo,
};
pub use event::*;
pub use ids::*;
