//! The hardware challenges on an NVIDIA GPU (cargo feature `cuda`), so the
//! rate the exchange measures is the GPU's, not the host CPU's
//! (docs/agent.md "Hardware challenges"). The compute challenge: a kernel
//! draws the seeded matrices on the GPU as f16 (entries -2..=2 are exact),
//! cuBLAS multiplies them on the tensor cores with f32 accumulation
//! (`cublasGemmEx`), a kernel turns the f32 product into its integer words,
//! and the leaf and node kernels build the Merkle tree on the GPU; only the
//! root and the opened leaves are copied back. The memory challenge runs
//! its passes and the same tree on the GPU. The CUDA driver is loaded at
//! run time (cudarc's dynamic loading): an agent built with the feature
//! still starts on a machine without one, and its challenges fail with a
//! `Query` error instead of computing on the CPU.
//!
//! Every entry of the product, and every partial sum, is an integer of
//! magnitude at most `4 n` (entries -2..=2, `n` at most 16 384: under 2^17),
//! exact in f32, so the GPU's answer is the CPU's to the bit whatever order
//! cuBLAS sums in.
//!
//! What ran where: docs/agent.md "What ran where". The checks to run on a
//! GPU (`GPUX_REQUIRE_GPU=1` makes a missing GPU fail them): `cargo test -p
//! gpux-supplier-agent --features cuda cuda`.

use std::sync::Arc;

use cudarc::cublas::sys::cublasOperation_t;
use cudarc::cublas::CudaBlas;
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

/// The challenges' kernels (protocol/src/challenge.rs and memory.rs say
/// what they compute, bit for bit): a challenge matrix, the product's
/// words, the memory challenge's initial buffer and one pass, the leaf
/// hashes and one level of Merkle nodes (SHA-256 per thread; a leaf is
/// 1 KiB, so hashing moves a small share of what the passes do). Compiled
/// by NVRTC at run time, once per process.
const KERNELS: &str = r#"
typedef unsigned int u32;
typedef unsigned long long u64;
typedef unsigned char u8;

__device__ __forceinline__ u32 fmix32(u32 h) {
    h ^= h >> 16; h *= 0x85ebca6bu; h ^= h >> 13; h *= 0xc2b2ae35u; return h ^ (h >> 16);
}

__device__ __forceinline__ u64 mix64(u64 z) {
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull; z = (z ^ (z >> 27)) * 0x94d049bb133111ebull; return z ^ (z >> 31);
}

/* A challenge matrix, row-major, as f16 bit patterns: entry k is draw k of
   the stream whose state after the seed is `origin`, % 5 - 2. */
extern "C" __global__ void gpux_matrix(unsigned short *m, u64 count, u64 origin) {
    const unsigned short halves[5] = {0xc000, 0xbc00, 0x0000, 0x3c00, 0x4000}; /* -2, -1, 0, 1, 2 as f16 */
    for (u64 k = (u64)blockIdx.x * blockDim.x + threadIdx.x; k < count; k += (u64)blockDim.x * gridDim.x) {
        m[k] = halves[mix64(origin + (k + 1) * 0x9e3779b97f4a7c15ull) % 5];
    }
}

/* The product's words: each f32 entry (an integer) as its two's complement. */
extern "C" __global__ void gpux_words(const float *c, u32 *w, u64 count) {
    for (u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x; i < count; i += (u64)blockDim.x * gridDim.x) {
        w[i] = (u32)(int)c[i];
    }
}

extern "C" __global__ void gpux_init(u32 *x, u64 words, u32 key0) {
    for (u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x; i < words; i += (u64)blockDim.x * gridDim.x) {
        x[i] = fmix32((u32)i ^ key0);
    }
}

extern "C" __global__ void gpux_pass(const u32 *in, u32 *out, u64 words, u64 offset, u32 key) {
    u64 mask = words - 1;
    for (u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x; i < words; i += (u64)blockDim.x * gridDim.x) {
        u32 a = in[i];
        u32 b = in[(i + offset) & mask];
        out[i] = fmix32((a + ((b << 7) | (b >> 25))) ^ key);
    }
}

__constant__ u32 K[64] = {
    0x428a2f98u, 0x71374491u, 0xb5c0fbcfu, 0xe9b5dba5u, 0x3956c25bu, 0x59f111f1u, 0x923f82a4u, 0xab1c5ed5u,
    0xd807aa98u, 0x12835b01u, 0x243185beu, 0x550c7dc3u, 0x72be5d74u, 0x80deb1feu, 0x9bdc06a7u, 0xc19bf174u,
    0xe49b69c1u, 0xefbe4786u, 0x0fc19dc6u, 0x240ca1ccu, 0x2de92c6fu, 0x4a7484aau, 0x5cb0a9dcu, 0x76f988dau,
    0x983e5152u, 0xa831c66du, 0xb00327c8u, 0xbf597fc7u, 0xc6e00bf3u, 0xd5a79147u, 0x06ca6351u, 0x14292967u,
    0x27b70a85u, 0x2e1b2138u, 0x4d2c6dfcu, 0x53380d13u, 0x650a7354u, 0x766a0abbu, 0x81c2c92eu, 0x92722c85u,
    0xa2bfe8a1u, 0xa81a664bu, 0xc24b8b70u, 0xc76c51a3u, 0xd192e819u, 0xd6990624u, 0xf40e3585u, 0x106aa070u,
    0x19a4c116u, 0x1e376c08u, 0x2748774cu, 0x34b0bcb5u, 0x391c0cb3u, 0x4ed8aa4au, 0x5b9cca4fu, 0x682e6ff3u,
    0x748f82eeu, 0x78a5636fu, 0x84c87814u, 0x8cc70208u, 0x90befffau, 0xa4506cebu, 0xbef9a3f7u, 0xc67178f2u};

__device__ __forceinline__ u32 rotr(u32 x, int n) { return (x >> n) | (x << (32 - n)); }

/* SHA-256 over a byte stream fed one byte at a time. */
struct Sha { u32 h[8]; u8 block[64]; u32 fill; u64 length; };

__device__ void sha_compress(Sha *s) {
    u32 w[64];
    for (int t = 0; t < 16; t++) {
        w[t] = ((u32)s->block[4 * t] << 24) | ((u32)s->block[4 * t + 1] << 16) | ((u32)s->block[4 * t + 2] << 8) | (u32)s->block[4 * t + 3];
    }
    for (int t = 16; t < 64; t++) {
        u32 s0 = rotr(w[t - 15], 7) ^ rotr(w[t - 15], 18) ^ (w[t - 15] >> 3);
        u32 s1 = rotr(w[t - 2], 17) ^ rotr(w[t - 2], 19) ^ (w[t - 2] >> 10);
        w[t] = w[t - 16] + s0 + w[t - 7] + s1;
    }
    u32 a = s->h[0], b = s->h[1], c = s->h[2], d = s->h[3], e = s->h[4], f = s->h[5], g = s->h[6], h = s->h[7];
    for (int t = 0; t < 64; t++) {
        u32 t1 = h + (rotr(e, 6) ^ rotr(e, 11) ^ rotr(e, 25)) + ((e & f) ^ (~e & g)) + K[t] + w[t];
        u32 t2 = (rotr(a, 2) ^ rotr(a, 13) ^ rotr(a, 22)) + ((a & b) ^ (a & c) ^ (b & c));
        h = g; g = f; f = e; e = d + t1; d = c; c = b; b = a; a = t1 + t2;
    }
    s->h[0] += a; s->h[1] += b; s->h[2] += c; s->h[3] += d; s->h[4] += e; s->h[5] += f; s->h[6] += g; s->h[7] += h;
}

__device__ void sha_init(Sha *s) {
    const u32 iv[8] = {0x6a09e667u, 0xbb67ae85u, 0x3c6ef372u, 0xa54ff53au, 0x510e527fu, 0x9b05688cu, 0x1f83d9abu, 0x5be0cd19u};
    for (int i = 0; i < 8; i++) s->h[i] = iv[i];
    s->fill = 0; s->length = 0;
}

__device__ void sha_byte(Sha *s, u8 byte) {
    s->block[s->fill++] = byte;
    s->length += 8;
    if (s->fill == 64) { sha_compress(s); s->fill = 0; }
}

__device__ void sha_final(Sha *s, u8 *out) {
    u64 length = s->length;
    s->block[s->fill++] = 0x80;
    if (s->fill > 56) { while (s->fill < 64) s->block[s->fill++] = 0; sha_compress(s); s->fill = 0; }
    while (s->fill < 56) s->block[s->fill++] = 0;
    for (int i = 7; i >= 0; i--) s->block[s->fill++] = (u8)(length >> (8 * i));
    sha_compress(s);
    for (int i = 0; i < 8; i++) {
        out[4 * i] = (u8)(s->h[i] >> 24); out[4 * i + 1] = (u8)(s->h[i] >> 16); out[4 * i + 2] = (u8)(s->h[i] >> 8); out[4 * i + 3] = (u8)s->h[i];
    }
}

/* Leaf hashes: SHA-256(0x00 || 256 words as little-endian u32). */
extern "C" __global__ void gpux_leaves(const u32 *x, u8 *hashes, u64 leaves) {
    for (u64 leaf = (u64)blockIdx.x * blockDim.x + threadIdx.x; leaf < leaves; leaf += (u64)blockDim.x * gridDim.x) {
        Sha s; sha_init(&s);
        sha_byte(&s, 0);
        const u32 *words = x + leaf * 256;
        for (int i = 0; i < 256; i++) {
            u32 w = words[i];
            sha_byte(&s, (u8)w); sha_byte(&s, (u8)(w >> 8)); sha_byte(&s, (u8)(w >> 16)); sha_byte(&s, (u8)(w >> 24));
        }
        sha_final(&s, hashes + leaf * 32);
    }
}

/* One level of nodes: SHA-256(0x01 || left || right). */
extern "C" __global__ void gpux_nodes(const u8 *below, u8 *above, u64 count) {
    for (u64 node = (u64)blockIdx.x * blockDim.x + threadIdx.x; node < count; node += (u64)blockDim.x * gridDim.x) {
        Sha s; sha_init(&s);
        sha_byte(&s, 1);
        for (int i = 0; i < 64; i++) sha_byte(&s, below[node * 64 + i]);
        sha_final(&s, above + node * 32);
    }
}
"#;

/// The kernels' PTX, compiled once.
fn kernels_ptx() -> Result<cudarc::nvrtc::Ptx, BackendError> {
    static PTX: std::sync::OnceLock<Result<cudarc::nvrtc::Ptx, String>> = std::sync::OnceLock::new();
    PTX.get_or_init(|| {
        // SAFETY: only tries to open the shared library.
        #[allow(unsafe_code)]
        let present = unsafe { cudarc::nvrtc::sys::is_culib_present() };
        if !present {
            return Err("NVRTC (libnvrtc) cannot be loaded".into());
        }
        cudarc::nvrtc::compile_ptx(KERNELS).map_err(|e| format!("{e:?}"))
    })
    .clone()
    .map_err(|detail| BackendError::Query { what: "CUDA kernels".into(), detail })
}

/// A grid-stride launch over `items`.
fn grid(items: u64) -> cudarc::driver::LaunchConfig {
    let blocks = items.div_ceil(256).clamp(1, 1 << 20) as u32;
    cudarc::driver::LaunchConfig { grid_dim: (blocks, 1, 1), block_dim: (256, 1, 1), shared_mem_bytes: 0 }
}

/// A challenge's result on the GPU (the product's words, or the memory
/// buffer) and every level of its Merkle tree stay on the GPU; the root and
/// the opened leaves are copied back.
pub struct GpuMerkleProof {
    stream: Arc<CudaStream>,
    words: cudarc::driver::CudaSlice<u32>,
    levels: Vec<cudarc::driver::CudaSlice<u8>>,
    root: [u8; 32],
}

/// What a GPU's challenges run on: its CUDA context and stream, the
/// kernels loaded into it, and a cuBLAS handle. Set up once per GPU and
/// process ([`kernels`]), so a challenge is timed for its work alone.
struct Kernels {
    stream: Arc<CudaStream>,
    module: Arc<cudarc::driver::CudaModule>,
    blas: CudaBlas,
}

impl Kernels {
    fn load(uuid: &str) -> Result<Kernels, BackendError> {
        let context = context_of(uuid)?;
        let module = context.load_module(kernels_ptx()?).map_err(|e| cuda_error("load the kernels", e))?;
        let stream = context.default_stream();
        let blas = CudaBlas::new(stream.clone()).map_err(|e| cuda_error("cuBLAS", e))?;
        Ok(Kernels { stream, module, blas })
    }

    fn function(&self, name: &str) -> Result<cudarc::driver::CudaFunction, BackendError> {
        self.module.load_function(name).map_err(|e| cuda_error(name, e))
    }
}

/// The GPU `uuid`'s [`Kernels`], set up on first use and kept for the
/// process (the agent's CUDA context lives as long as the agent; NVML
/// counts it as the agent's, not as the owner's work).
fn kernels(uuid: &str) -> Result<Arc<Kernels>, BackendError> {
    static LOADED: std::sync::OnceLock<std::sync::Mutex<std::collections::HashMap<String, Arc<Kernels>>>> = std::sync::OnceLock::new();
    let loaded = LOADED.get_or_init(Default::default);
    if let Some(kernels) = loaded.lock().unwrap_or_else(|poisoned| poisoned.into_inner()).get(uuid) {
        return Ok(kernels.clone());
    }
    let kernels = Arc::new(Kernels::load(uuid)?);
    loaded.lock().unwrap_or_else(|poisoned| poisoned.into_inner()).insert(uuid.to_owned(), kernels.clone());
    Ok(kernels)
}

/// Readies the GPU `uuid` for challenges before any arrives, once per
/// process: its CUDA context, the kernels (compiled by NVRTC) and cuBLAS
/// are set up, and a small challenge of each kind is answered on the GPU
/// and compared with the CPU's answer. Without the setup the first
/// challenge, the one a GPU takes as it registers, would be charged it
/// (about half a second on an H200: docs/agent.md "What ran where") and
/// could show too low a rate for its class. Without the comparison a
/// kernel that computes wrong on this GPU (a driver, a card or a bug the
/// tests never met) would commit to a wrong answer, and a wrong answer
/// rejects a GPU for good; a GPU that fails it refuses its challenges
/// instead (they expire unanswered, which costs no points), with this
/// error in the log.
pub fn self_check(uuid: &str) -> Result<(), BackendError> {
    static CHECKED: std::sync::OnceLock<std::sync::Mutex<std::collections::HashMap<String, Result<(), BackendError>>>> =
        std::sync::OnceLock::new();
    let checked = CHECKED.get_or_init(Default::default);
    if let Some(verdict) = checked.lock().unwrap_or_else(|poisoned| poisoned.into_inner()).get(uuid) {
        return verdict.clone();
    }
    let verdict = compare_with_the_cpu(uuid);
    checked.lock().unwrap_or_else(|poisoned| poisoned.into_inner()).insert(uuid.to_owned(), verdict.clone());
    verdict
}

/// A 32 x 32 product (four leaves, two levels of nodes) and a memory
/// challenge of 2^10 words and 3 passes, on the GPU and on the CPU.
fn compare_with_the_cpu(uuid: &str) -> Result<(), BackendError> {
    use crate::backend::MerkleProof;
    let seed = [0x5a; 32];
    let wrong = |what: &str| BackendError::Query {
        what: "CUDA self-check".into(),
        detail: format!(
            "the GPU's {what} is not the CPU's: this GPU's hardware challenges are refused (report it with the driver and CUDA versions)"
        ),
    };
    if product(uuid, &seed, 32)?.root() != gpux_protocol::challenge::cpu_proof(&seed, 32).root() {
        return Err(wrong("product of a 32 x 32 challenge"));
    }
    let cpu = gpux_protocol::memory::CpuProof::new(gpux_protocol::memory::Params::new(&seed, 10, 3).compute());
    if memory(uuid, &seed, 10, 3)?.root() != cpu.root() {
        return Err(wrong("memory challenge of 2^10 words"));
    }
    Ok(())
}

/// `A x B` for the challenge of `seed` and `n` on the GPU `uuid`, committed.
pub fn product(uuid: &str, seed: &[u8; 32], n: u32) -> Result<GpuMerkleProof, BackendError> {
    use cudarc::cublas::sys::{cublasComputeType_t, cublasGemmAlgo_t, cudaDataType_t};
    use cudarc::driver::{DevicePtr, DevicePtrMut, PushKernelArg};
    if !gpux_protocol::challenge::n_valid(n) {
        return Err(BackendError::Query { what: "hardware challenge".into(), detail: format!("n = {n} is not a challenge's side") });
    }
    let kernels = kernels(uuid)?;
    let (matrix, to_words) = (kernels.function("gpux_matrix")?, kernels.function("gpux_words")?);
    let stream = kernels.stream.clone();
    let size = n as u64 * n as u64;
    let alloc = |what: &str| stream.alloc_zeros::<u16>(size as usize).map_err(|e| cuda_error(what, e));
    let (mut a, mut b) = (alloc("allocate A")?, alloc("allocate B")?);
    for (m, domain) in [(&mut a, 1u64), (&mut b, 2)] {
        let origin = gpux_protocol::challenge::stream_origin(seed, domain);
        // SAFETY: the kernel writes `size` entries of a buffer of `size`.
        #[allow(unsafe_code)]
        unsafe { stream.launch_builder(&matrix).arg(m).arg(&size).arg(&origin).launch(grid(size)) }
            .map_err(|e| cuda_error("draw a matrix", e))?;
    }
    let mut c = stream.alloc_zeros::<f32>(size as usize).map_err(|e| cuda_error("allocate C", e))?;
    let (alpha, beta, side) = (1.0f32, 0.0f32, n as i32);
    {
        let (a_ptr, _a_done) = a.device_ptr(&stream);
        let (b_ptr, _b_done) = b.device_ptr(&stream);
        let (c_ptr, _c_done) = c.device_ptr_mut(&stream);
        // cuBLAS is column-major: a row-major matrix is its transpose there,
        // so the row-major C = A B is the column-major C^T = B^T A^T: B
        // first. f16 inputs, f32 output and accumulation (tensor cores).
        // SAFETY: A and B hold n x n f16, C n x n f32, as the call says.
        #[allow(unsafe_code)]
        let computed = unsafe {
            cudarc::cublas::result::gemm_ex(
                *kernels.blas.handle(),
                cublasOperation_t::CUBLAS_OP_N,
                cublasOperation_t::CUBLAS_OP_N,
                side,
                side,
                side,
                (&alpha) as *const f32 as *const _,
                b_ptr as *const std::ffi::c_void,
                cudaDataType_t::CUDA_R_16F,
                side,
                a_ptr as *const std::ffi::c_void,
                cudaDataType_t::CUDA_R_16F,
                side,
                (&beta) as *const f32 as *const _,
                c_ptr as *mut std::ffi::c_void,
                cudaDataType_t::CUDA_R_32F,
                side,
                cublasComputeType_t::CUBLAS_COMPUTE_32F,
                cublasGemmAlgo_t::CUBLAS_GEMM_DEFAULT,
            )
        };
        computed.map_err(|e| cuda_error("GEMM", e))?;
    }
    drop((a, b));
    let mut words = stream.alloc_zeros::<u32>(size as usize).map_err(|e| cuda_error("allocate the words", e))?;
    // SAFETY: both buffers hold `size` entries.
    #[allow(unsafe_code)]
    unsafe { stream.launch_builder(&to_words).arg(&c).arg(&mut words).arg(&size).launch(grid(size)) }
        .map_err(|e| cuda_error("the product's words", e))?;
    drop(c);
    commit(&kernels, stream, words, gpux_protocol::challenge::words_log2(n))
}

/// Runs the memory challenge of `seed` on the GPU `uuid`, committed.
pub fn memory(uuid: &str, seed: &[u8; 32], words_log2: u32, passes: u32) -> Result<GpuMerkleProof, BackendError> {
    use cudarc::driver::PushKernelArg;
    let kernels = kernels(uuid)?;
    let (init, pass) = (kernels.function("gpux_init")?, kernels.function("gpux_pass")?);
    let stream = kernels.stream.clone();
    let params = gpux_protocol::memory::Params::new(seed, words_log2, passes);
    let words = params.words();
    let alloc = |what: &str| stream.alloc_zeros::<u32>(words as usize).map_err(|e| cuda_error(what, e));
    let (mut current, mut next) = (alloc("allocate the buffer")?, alloc("allocate the second buffer")?);
    // SAFETY (every launch below): the kernels index only below the sizes
    // passed with them, which are the buffers' own.
    #[allow(unsafe_code)]
    unsafe { stream.launch_builder(&init).arg(&mut current).arg(&words).arg(&params.key0).launch(grid(words)) }
        .map_err(|e| cuda_error("initial buffer", e))?;
    for &(offset, key) in &params.passes {
        #[allow(unsafe_code)]
        unsafe { stream.launch_builder(&pass).arg(&current).arg(&mut next).arg(&words).arg(&offset).arg(&key).launch(grid(words)) }
            .map_err(|e| cuda_error("pass", e))?;
        std::mem::swap(&mut current, &mut next);
    }
    drop(next);
    commit(&kernels, stream, current, words_log2)
}

/// Builds the Merkle tree of `2^words_log2` words on the GPU and copies the
/// root back.
fn commit(
    kernels: &Kernels,
    stream: Arc<CudaStream>,
    words: cudarc::driver::CudaSlice<u32>,
    words_log2: u32,
) -> Result<GpuMerkleProof, BackendError> {
    use cudarc::driver::PushKernelArg;
    let (leaves_kernel, nodes) = (kernels.function("gpux_leaves")?, kernels.function("gpux_nodes")?);
    let leaf_count = gpux_protocol::memory::leaf_count(words_log2);
    let mut level = stream.alloc_zeros::<u8>(leaf_count as usize * 32).map_err(|e| cuda_error("allocate the leaf hashes", e))?;
    // SAFETY (both launches): the kernels index only below the counts
    // passed with them, which the buffers hold.
    #[allow(unsafe_code)]
    unsafe { stream.launch_builder(&leaves_kernel).arg(&words).arg(&mut level).arg(&leaf_count).launch(grid(leaf_count)) }
        .map_err(|e| cuda_error("leaf hashes", e))?;
    let mut levels = vec![level];
    let mut count = leaf_count;
    while count > 1 {
        count /= 2;
        let mut above = stream.alloc_zeros::<u8>(count as usize * 32).map_err(|e| cuda_error("allocate a tree level", e))?;
        let below = levels.last().expect("a level");
        #[allow(unsafe_code)]
        unsafe { stream.launch_builder(&nodes).arg(below).arg(&mut above).arg(&count).launch(grid(count)) }
            .map_err(|e| cuda_error("tree level", e))?;
        levels.push(above);
    }
    let root: Vec<u8> = stream.clone_dtoh(levels.last().expect("a level")).map_err(|e| cuda_error("copy the root", e))?;
    let root: [u8; 32] = root.try_into().map_err(|_| cuda_error("root", "not 32 bytes"))?;
    Ok(GpuMerkleProof { stream, words, levels, root })
}

impl crate::backend::MerkleProof for GpuMerkleProof {
    fn root(&self) -> [u8; 32] {
        self.root
    }

    fn open(&mut self, leaves: &[u32]) -> Result<Vec<gpux_protocol::memory::LeafOpening>, BackendError> {
        const LEAF: usize = gpux_protocol::memory::LEAF_WORDS;
        let count = self.levels[0].len() / 32;
        let mut opened = Vec::with_capacity(leaves.len());
        for &leaf in leaves.iter().filter(|&&leaf| (leaf as usize) < count) {
            let start = leaf as usize * LEAF;
            let words = self.stream.clone_dtoh(&self.words.slice(start..start + LEAF)).map_err(|e| cuda_error("copy a leaf", e))?;
            let mut path = Vec::with_capacity(self.levels.len() - 1);
            for (height, level) in self.levels[..self.levels.len() - 1].iter().enumerate() {
                let sibling = ((leaf as usize) >> height) ^ 1;
                let hash =
                    self.stream.clone_dtoh(&level.slice(sibling * 32..sibling * 32 + 32)).map_err(|e| cuda_error("copy a path", e))?;
                path.push(hex::encode(hash));
            }
            opened.push(gpux_protocol::memory::LeafOpening { leaf, words, path });
        }
        Ok(opened)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn uuids_are_written_as_nvml_writes_them() {
        let bytes = [0x5f, 0x0c, 0x6a, 0x2e, 0, 0, 0x40, 0, 0x80, 0, 0, 0, 0, 0, 0, 1];
        assert_eq!(uuid_text(&bytes), "GPU-5f0c6a2e-0000-4000-8000-000000000001");
    }

    /// Runs only where a CUDA GPU, cuBLAS and NVRTC are: the GPU's product
    /// commits to the CPU's root and opens what the exchange verifies; large
    /// ones print the rate they show. `GPUX_REQUIRE_GPU=1`
    /// (scripts/gpu-check) makes a missing GPU a failure instead of a skip.
    #[test]
    fn cuda_product_matches_the_cpu() {
        use crate::backend::MerkleProof;
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
        let uuid = uuid_text(&context.uuid().expect("uuid").bytes.map(|b| b as u8));
        assert_eq!(self_check(&uuid), Ok(()), "the agent's self-check passes");
        let (seed, open_seed) = ([7u8; 32], [9u8; 32]);
        for n in [16u32, 256, 1024] {
            let started = std::time::Instant::now();
            let mut proof = product(&uuid, &seed, n).expect("computes");
            eprintln!("{n}^3 on the GPU (with the context, kernels and tree): {:?}", started.elapsed());
            let cpu = gpux_protocol::challenge::cpu_proof(&seed, n);
            assert_eq!(proof.root(), cpu.root(), "n = {n}: the GPU's product and tree are the CPU's");
            let leaves = gpux_protocol::challenge::leaves_to_open(&open_seed, n);
            let opened = proof.open(&leaves).expect("opens");
            assert_eq!(opened, cpu.open(&leaves));
            assert_eq!(gpux_protocol::challenge::verify_opening(&seed, n, &proof.root(), &open_seed, &opened), Ok(()));
        }
        // Production sizes: the rate a class's minimum is set against.
        for n in [4096u32, 8192, 16_384] {
            let started = std::time::Instant::now();
            let mut proof = product(&uuid, &[3; 32], n).expect("computes");
            let elapsed = started.elapsed();
            let opened = proof.open(&gpux_protocol::challenge::leaves_to_open(&open_seed, n)).expect("opens");
            let verified = gpux_protocol::challenge::verify_opening(&[3; 32], n, &proof.root(), &open_seed, &opened);
            eprintln!(
                "n = {n}: {elapsed:?} with drawing, GEMM and tree, {} GFLOP/s; verified {verified:?}",
                2 * (n as u64).pow(3) / elapsed.as_micros().max(1) as u64 / 1_000
            );
            assert_eq!(verified, Ok(()));
        }
    }

    /// Runs only where a CUDA GPU and NVRTC are: the GPU's memory challenge
    /// commits to the CPU's root, opens what the exchange verifies, and a
    /// large one prints the bandwidth it shows.
    #[test]
    fn cuda_memory_challenge_matches_the_cpu() {
        use crate::backend::MerkleProof;
        let skip = |why: String| {
            assert!(std::env::var_os("GPUX_REQUIRE_GPU").is_none(), "GPUX_REQUIRE_GPU is set: {why}");
            eprintln!("{why}: skipped");
        };
        if !available() {
            return skip("no CUDA driver or cuBLAS".into());
        }
        match CudaContext::device_count() {
            Ok(count) if count > 0 => {}
            other => return skip(format!("no CUDA device ({other:?})")),
        }
        let context = CudaContext::new(0).expect("device 0");
        let uuid = uuid_text(&context.uuid().expect("uuid").bytes.map(|b| b as u8));
        let (seed, open_seed) = ([7u8; 32], [9u8; 32]);
        let (log2, passes) = (16, 8);
        let mut proof = memory(&uuid, &seed, log2, passes).expect("runs");
        let cpu = gpux_protocol::memory::CpuProof::new(gpux_protocol::memory::Params::new(&seed, log2, passes).compute());
        assert_eq!(proof.root(), cpu.root(), "the GPU's buffer and tree are the CPU's");
        let leaves = gpux_protocol::memory::leaves_to_open(&open_seed, log2);
        let opened = proof.open(&leaves).expect("opens");
        assert_eq!(opened, cpu.open(&leaves));
        assert_eq!(gpux_protocol::memory::verify_opening(&seed, log2, passes, &proof.root(), &open_seed, &opened), Ok(()));
        // A production-sized one: 2^30 words (4 GiB, twice that on the GPU), 10 passes.
        for (log2, passes) in [(28u32, 10u32), (30, 10)] {
            let started = std::time::Instant::now();
            let proof = memory(&uuid, &[3; 32], log2, passes).expect("runs");
            let elapsed = started.elapsed();
            let bytes = gpux_protocol::memory::bytes_moved(log2, passes);
            eprintln!(
                "2^{log2} words x {passes} passes: {:?} with hashing and copies, {} GB/s; root {}",
                elapsed,
                bytes / elapsed.as_micros().max(1) as u64 / 1_000,
                hex::encode(proof.root())
            );
        }
    }
}
