//! gpux-supplier-agent: the daemon a GPU owner runs on each host.
//!
//! It reads the host's GPUs through a small vendor-neutral trait
//! (`backend::GpuBackend`), with a real NVML implementation (`nvml`),
//! backends over the vendor tools of AMD, Huawei Ascend, Cambricon and
//! Iluvatar (`vendor`) and a scripted fake for tests and demos (`fake`); proves its host key to the
//! exchange (`keys`); registers the GPUs, keeps the owner's offers on the
//! books, withdraws GPUs that turn unhealthy, and hands leases to a
//! delivery hook (`session`), all as the owner's config says (`config`).
//! With the `cuda` feature, NVML hosts compute hardware challenges on the
//! GPU with cuBLAS (`cuda`).

pub mod backend;
pub mod config;
#[cfg(feature = "cuda")]
pub mod cuda;
pub mod delivery;
pub mod fake;
pub mod firewall;
pub mod keys;
pub mod limits;
pub mod nvml;
pub mod probe;
pub mod reports;
pub mod saved;
pub mod session;
pub mod vendor_tools;
