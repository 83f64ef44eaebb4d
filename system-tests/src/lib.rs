//! Tests only (see `tests/`): properties of the whole system that no single
//! crate can check without depending on the crates above it.
