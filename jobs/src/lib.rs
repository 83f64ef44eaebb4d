//! Jobs on the renter's side (issue "Jobs"; docs/jobs.md): what a renter
//! submits is a job, not a lease. This crate holds what is decided before
//! the exchange sees the job, on the renter's machine, without I/O beyond
//! reading the code directory:
//!
//! - `spec`: the job file (TOML), checked whole with typed errors;
//! - `bundle`: the code directory packed the same way wherever it is
//!   packed, named by its SHA-256, and unpacked without escaping its place;
//! - `detect`: the framework and its version from requirements.txt,
//!   pyproject.toml, environment.yml, setup.py and imports;
//! - `catalogue`: preset images per framework and vendor stack, pinned by
//!   digest, and what the job needs installed on top;
//! - `plan`: the memory a model needs per GPU and the class that meets it
//!   at the lowest expected cost from the live books, with why each other
//!   one lost (`gpux job submit --dry-run` prints it).
//!
//! The job's life at the exchange (bids, delivery, resume from checkpoints,
//! its bill) is market state like a lease's, in `gpux-market`.

pub mod bundle;
pub mod catalogue;
pub mod detect;
pub mod plan;
pub mod spec;

pub use catalogue::{Catalogue, CatalogueError, Image, ImageChoice};
pub use detect::{detect, DetectError, Detection, Framework, Requirement};
pub use plan::{alternatives, memory_mib_per_gpu, plan, Candidate, Market, Plan, Verdict};
pub use spec::{JobSpec, SpecError};
