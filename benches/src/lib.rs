//! Shared workload generators for the benchmarks.
