//! gpux-sim: a deterministic market simulator that drives the real engine,
//! settlement and ledger with thousands of simulated suppliers, renters and
//! aggregators, injects faults and cheats, and reports what the market did.
//!
//! The simulator runs the exchange's own state machines in-process on
//! simulated time (`exchange`), so a week of market runs in minutes and the
//! same seed always produces byte-identical output: every random draw comes
//! from one seeded stream, the event queue breaks ties by insertion order, and
//! nothing iterates a randomly seeded hash map. The live mode (`live`) instead
//! drives the real exchange process over WebSockets, as real clients do.

pub mod config;
pub mod exchange;
pub mod live;
pub mod market;
pub mod metrics;
pub mod population;
pub mod report;

pub use config::SimConfig;
pub use market::Sim;
