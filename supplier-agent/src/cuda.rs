//! The hardware challenge on an NVIDIA GPU (cargo feature `cuda`): the
//! seeded matrices go to the GPU as f32 and cuBLAS multiplies them (SGEMM),
//! so the rate the exchange measures is the GPU's, not the host CPU's
//! (docs/agent.md "Hardware challenges"). The CUDA driver is loaded at run
//! time (cudarc's dynamic loading): an agent built with the feature still
//! starts on a machine without one, and its challenges fail with a
//! `Query` error instead of computing on the CPU.
//!
//! Every entry of the product is an integer of magnitude at most `4 n`
//! (entries -2..=2, `n` at most 256), exact in f32, so the GPU's answer is
//! the CPU's to the bit whatever order cuBLAS sums in.
//!
//! What ran where: on an NVIDIA H200 with CUDA 13.0's cuBLAS (2026-12-04,
//! `scripts/gpu-check`; docs/agent.md "What ran where"): the product equals
//! the CPU's and the exchange's challenge passed. `cuda_product_matches_the_cpu`
//! is the check to run on a GPU (`GPUX_REQUIRE_GPU=1` makes a missing GPU
//! fail it): `cargo test -p gpux-supplier-agent --features cuda cuda`.

use std::sync::Arc;

use cudarc::cublas::sys::cublasOperation_t;
use cudarc::cublas::{CudaBlas, Gemm, GemmConfig};
use cudarc::driver::{CudaContext, CudaStream};

use crate::backend::BackendError;

fn cuda_error(what: &str, error: impl std::fmt::Debug) -> BackendError {
    BackendError::Query { what: format!("CUDA {what}"), detail: format!("{error:?}") }
}

/// `GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx`, as NVML writes a GPU's UUID.
fn uuid_text(bytes: &[u8; 16]) -> String {
    let hex = |range: std::ops::Range<usize>| bytes[range].iter().map(|b| format!("{b:02x}")).collect::<String>();
    format!("GPU-{}-{}-{}-{}-{}", hex(0..4), hex(4..6), hex(6..8), hex(8..10), hex(10..16))
}

/// Whether the CUDA driver and cuBLAS can be loaded (cudarc panics on a
/// call into a library it cannot load, so this is asked first).
pub fn available() -> bool {
    // SAFETY: only tries to open the shared libraries.
    #[allow(unsafe_code)]
    unsafe {
        cudarc::driver::sys::is_culib_present() && cudarc::cublas::sys::is_culib_present()
    }
}

/// The CUDA context of the device whose UUID NVML reports as `uuid` (CUDA
/// numbers devices in its own order). MIG slices are not CUDA devices of
/// their own here: their challenge is refused.
fn context_of(uuid: &str) -> Result<Arc<CudaContext>, BackendError> {
    if !available() {
        return Err(BackendError::Query {
            what: "CUDA".into(),
            detail: "the CUDA driver (libcuda) or cuBLAS (libcublas) cannot be loaded".into(),
        });
    }
    let count = CudaContext::device_count().map_err(|e| cuda_error("device count", e))?;
    for ordinal in 0..count.max(0) as usize {
        let context = CudaContext::new(ordinal).map_err(|e| cuda_error("context", e))?;
        let raw = context.uuid().map_err(|e| cuda_error("uuid", e))?;
        let bytes: [u8; 16] = raw.bytes.map(|b| b as u8);
        if uuid_text(&bytes).eq_ignore_ascii_case(uuid) {
            return Ok(context);
        }
    }
    Err(BackendError::Query {
        what: "CUDA device".into(),
        detail: format!("no CUDA device has UUID {uuid} (a MIG slice is challenged on its parent GPU only)"),
    })
}

/// `A x B` for the challenge of `seed` and `n`, computed by cuBLAS on the
/// GPU `uuid`; rows in order.
pub fn product(uuid: &str, seed: &[u8; 32], n: u32) -> Result<Vec<Vec<i32>>, BackendError> {
    let context = context_of(uuid)?;
    let stream: Arc<CudaStream> = context.default_stream();
    let (a, b) = gpux_protocol::challenge::matrices(seed, n);
    let to_f32 = |m: &[i8]| m.iter().map(|&v| f32::from(v)).collect::<Vec<f32>>();
    let a = stream.clone_htod(&to_f32(&a)).map_err(|e| cuda_error("copy A", e))?;
    let b = stream.clone_htod(&to_f32(&b)).map_err(|e| cuda_error("copy B", e))?;
    let size = n as usize * n as usize;
    let mut c = stream.alloc_zeros::<f32>(size).map_err(|e| cuda_error("allocate C", e))?;
    let blas = CudaBlas::new(stream.clone()).map_err(|e| cuda_error("cuBLAS", e))?;
    let n_int = n as i32;
    // cuBLAS is column-major: a row-major matrix is its transpose there, so
    // the row-major C = A B is the column-major C^T = B^T A^T: B first.
    let config = GemmConfig {
        transa: cublasOperation_t::CUBLAS_OP_N,
        transb: cublasOperation_t::CUBLAS_OP_N,
        m: n_int,
        n: n_int,
        k: n_int,
        alpha: 1.0f32,
        lda: n_int,
        ldb: n_int,
        beta: 0.0f32,
        ldc: n_int,
    };
    // SAFETY: the three buffers hold n x n f32 each, as the config says.
    #[allow(unsafe_code)]
    let computed = unsafe { blas.gemm(config, &b, &a, &mut c) };
    computed.map_err(|e| cuda_error("SGEMM", e))?;
    let c = stream.clone_dtoh(&c).map_err(|e| cuda_error("copy C", e))?;
    Ok(c.chunks(n as usize).map(|row| row.iter().map(|&v| v as i32).collect()).collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn uuids_are_written_as_nvml_writes_them() {
        let bytes = [0x5f, 0x0c, 0x6a, 0x2e, 0, 0, 0x40, 0, 0x80, 0, 0, 0, 0, 0, 0, 1];
        assert_eq!(uuid_text(&bytes), "GPU-5f0c6a2e-0000-4000-8000-000000000001");
    }

    /// Runs only where a CUDA GPU is: the GPU's product is the CPU's.
    /// `GPUX_REQUIRE_GPU=1` (scripts/gpu-check) makes a missing GPU a
    /// failure instead of a skip.
    #[test]
    fn cuda_product_matches_the_cpu() {
        let skip = |why: String| {
            assert!(std::env::var_os("GPUX_REQUIRE_GPU").is_none(), "GPUX_REQUIRE_GPU is set: {why}");
            eprintln!("{why}: skipped");
        };
        if !available() {
            return skip("no CUDA driver or cuBLAS".into());
        }
        let count = match CudaContext::device_count() {
            Ok(count) => count,
            Err(error) => return skip(format!("no CUDA driver ({error:?})")),
        };
        if count == 0 {
            return skip("no CUDA device".into());
        }
        let context = CudaContext::new(0).expect("device 0");
        let bytes: [u8; 16] = context.uuid().expect("uuid").bytes.map(|b| b as u8);
        let seed = [7u8; 32];
        let started = std::time::Instant::now();
        let rows = product(&uuid_text(&bytes), &seed, 256).expect("computes");
        eprintln!("256^3 on the GPU (with context and copies): {:?}", started.elapsed());
        let (a, b) = gpux_protocol::challenge::matrices(&seed, 256);
        assert_eq!(rows, gpux_protocol::challenge::product(&a, &b, 256));
    }
}
