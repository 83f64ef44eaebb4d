//! The hardware challenge's arithmetic (docs/market-rules.md "Verified
//! hardware", docs/protocol.md "Hardware challenges"): what a GPU computes,
//! how it commits to the answer, and how the exchange checks the answer
//! cheaply. Both sides must agree on it byte for byte.
//!
//! The work: `C = A x B` for two `n x n` matrices drawn from a seed, with
//! entries in -2..=2 (`n` a power of two, 16 to 16 384). Every product
//! entry is an integer of magnitude at most `4n`, exact in f32 (and in f16
//! inputs with f32 accumulation, as tensor cores do) for any `n` up to
//! 2^22, so a GPU, a CPU and the exchange all get the same integers.
//!
//! The answer, in two steps, as for the memory challenge (`memory.rs`):
//! 1. **Commit**: `C` row-major as 32-bit words (each entry's two's
//!    complement), cut into leaves of 256 words, committed to by the root
//!    of the memory challenge's Merkle tree. Its arrival time is what the
//!    exchange times.
//! 2. **Open**: the exchange then names 8 leaves (drawn after the root
//!    arrived); the prover sends each with its path to the root. The
//!    exchange checks every path and recomputes 16 entries of each opened
//!    leaf as dot products of a row of `A` and a column of `B`, drawing
//!    those entries straight from the seed (no matrix is ever formed on
//!    its side): `O(n)` work per entry, about `136 n` draws in all, against
//!    the prover's `O(n^3)`.
//!
//! Freivalds' check alone (`A(Br) = Cr` for a random `r`) does not bind a
//! prover that knows `A`, `B` and `r`: it can compute `A(Br)` in `O(n^2)`
//! without ever forming `C`. Committing to every entry before any is named
//! does: a prover that skipped or faked a share `f` of the entries (spread
//! over the product) is caught with probability about `1 - (1 - f)^128`;
//! one that skipped a share `f` of whole leaves, `1 - (1 - f)^8`.

use crate::memory::{self, CpuProof, LeafOpening};

/// The smallest and largest matrix sides a challenge may ask for (a
/// power of two between them): the product must fill at least one leaf,
/// and a GPU holds the largest (four 1 GiB buffers).
pub const CHALLENGE_N_MIN: u32 = gpux_engine::limits::CHALLENGE_N_MIN;
pub const CHALLENGE_N_MAX: u32 = gpux_engine::limits::CHALLENGE_N_MAX;

/// Why an answer is refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ChallengeError {
    /// Row-hash commitments (before the Merkle tree): kept so that journals
    /// that recorded them still decode.
    #[error("the row hashes do not hash to the commitment")]
    CommitmentMismatch,
    #[error("expected one row hash per row")]
    RowHashCount,
    /// Other leaves (rows, before the Merkle tree) than asked, or missing ones.
    #[error("an opened leaf was not asked for, or is missing")]
    WrongRows,
    #[error("an opened row does not match its committed hash")]
    RowNotCommitted,
    /// Compute challenge: a checked entry of an opened leaf is not the product's.
    #[error("an opened leaf holds an entry that is not the product's")]
    WrongProduct,
    /// Memory challenge: an opened leaf's path does not lead to the committed root.
    #[error("an opened leaf does not hash to the committed root")]
    LeafNotCommitted,
    /// Memory challenge: a checked word of an opened leaf is not the passes' result.
    #[error("an opened leaf holds a word the passes do not give")]
    WrongWords,
}

/// A deterministic stream of numbers from a seed: the state starts at
/// `domain x 0x9e3779b97f4a7c15` and absorbs the seed's four little-endian
/// words (`state = mix(state ^ word)`); each draw adds 0x9e3779b97f4a7c15 to
/// the state and returns `mix(state)` (SplitMix64). Both sides must draw
/// exactly this.
pub(crate) struct Stream {
    state: u64,
}

const GOLDEN: u64 = 0x9e37_79b9_7f4a_7c15;

impl Stream {
    pub(crate) fn new(seed: &[u8; 32], domain: u64) -> Stream {
        let mut state = domain.wrapping_mul(GOLDEN);
        for word in seed.chunks_exact(8) {
            state = mix(state ^ u64::from_le_bytes(word.try_into().expect("8 bytes")));
        }
        Stream { state }
    }

    pub(crate) fn next(&mut self) -> u64 {
        self.state = self.state.wrapping_add(GOLDEN);
        mix(self.state)
    }

    /// Draw `k` (0-based) of a fresh stream, without the ones before it:
    /// `mix(state + (k + 1) x 0x9e3779b97f4a7c15)`.
    pub(crate) fn at(&self, k: u64) -> u64 {
        mix(self.state.wrapping_add(k.wrapping_add(1).wrapping_mul(GOLDEN)))
    }
}

/// A stream's state after absorbing the seed: with it a GPU kernel draws
/// any entry by itself (draw `k` is `mix(origin + (k + 1) x
/// 0x9e3779b97f4a7c15)`, SplitMix64's finaliser).
pub fn stream_origin(seed: &[u8; 32], domain: u64) -> u64 {
    Stream::new(seed, domain).state
}

/// SplitMix64's finaliser.
fn mix(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// Whether `n` is a matrix side a challenge may ask for.
pub fn n_valid(n: u32) -> bool {
    n.is_power_of_two() && (CHALLENGE_N_MIN..=CHALLENGE_N_MAX).contains(&n)
}

/// The product's size in words, as a power of two: `2 log2 n`.
pub fn words_log2(n: u32) -> u32 {
    2 * n.trailing_zeros()
}

/// A matrix entry as drawn: `draw % 5 - 2`.
fn entry(draw: u64) -> i8 {
    (draw % 5) as i8 - 2
}

/// The challenge's two matrices, row-major, entries in -2..=2: `A` from
/// the seed's stream 1, `B` from stream 2, entry `k` the stream's draw `k`.
pub fn matrices(seed: &[u8; 32], n: u32) -> (Vec<i8>, Vec<i8>) {
    let draw = |domain| {
        let mut stream = Stream::new(seed, domain);
        (0..n as usize * n as usize).map(|_| entry(stream.next())).collect::<Vec<i8>>()
    };
    (draw(1), draw(2))
}

/// Row `i` of `A x B`.
pub fn product_row(a: &[i8], b: &[i8], n: u32, i: u32) -> Vec<i32> {
    let n = n as usize;
    let mut row = vec![0i32; n];
    for (k, &a_ik) in a[i as usize * n..(i as usize + 1) * n].iter().enumerate() {
        if a_ik == 0 {
            continue;
        }
        for (entry, &b_kj) in row.iter_mut().zip(&b[k * n..(k + 1) * n]) {
            *entry += a_ik as i32 * b_kj as i32;
        }
    }
    row
}

/// The whole product as the words committed to: row-major, each entry's
/// two's complement. What an honest prover without a GPU computes.
pub fn product(a: &[i8], b: &[i8], n: u32) -> Vec<u32> {
    (0..n).flat_map(|i| product_row(a, b, n, i)).map(|entry| entry as u32).collect()
}

/// The honest CPU prover: the product of the challenge of `seed` and `n`,
/// committed.
pub fn cpu_proof(seed: &[u8; 32], n: u32) -> CpuProof {
    let (a, b) = matrices(seed, n);
    CpuProof::new(product(&a, &b, n))
}

/// The leaves the exchange opens: those of the memory challenge's rule
/// ([`memory::leaves_to_open`]) over the product's `n^2` words (none for a
/// side no challenge may have).
pub fn leaves_to_open(open_seed: &[u8; 32], n: u32) -> Vec<u32> {
    if !n_valid(n) {
        return Vec::new();
    }
    memory::leaves_to_open(open_seed, words_log2(n))
}

/// Whether an opening is well formed for the challenge of `n` (checked
/// before any verdict, as [`memory::well_formed`]).
pub fn well_formed(n: u32, opened: &[LeafOpening]) -> bool {
    n_valid(n) && memory::well_formed(words_log2(n), opened)
}

/// Entries of the product drawn straight from the seed, as the exchange
/// checks them: each a dot product of a row of `A` (kept while the next
/// entry asked for is in the same row) and a column of `B`.
struct Entries {
    a: Stream,
    b: Stream,
    n: u64,
    row: Option<(u64, Vec<i8>)>,
}

impl Entries {
    fn new(seed: &[u8; 32], n: u32) -> Entries {
        Entries { a: Stream::new(seed, 1), b: Stream::new(seed, 2), n: n as u64, row: None }
    }

    /// The word at `index` (row-major) of the product.
    fn word(&mut self, index: u64) -> u32 {
        let (n, i, j) = (self.n, index / self.n, index % self.n);
        if self.row.as_ref().is_none_or(|(row, _)| *row != i) {
            self.row = Some((i, (0..n).map(|k| entry(self.a.at(i * n + k))).collect()));
        }
        let (_, row) = self.row.as_ref().expect("just set");
        let dot: i32 = row.iter().enumerate().map(|(k, &a_ik)| a_ik as i32 * entry(self.b.at(k as u64 * n + j)) as i32).sum();
        dot as u32
    }
}

/// Checks an opening: exactly the leaves asked for, in order, each leading
/// to the committed root by its path, and each checked entry the
/// product's. Expects a [`well_formed`] opening.
pub fn verify_opening(
    seed: &[u8; 32],
    n: u32,
    root: &[u8; 32],
    open_seed: &[u8; 32],
    opened: &[LeafOpening],
) -> Result<(), ChallengeError> {
    let mut entries = Entries::new(seed, n);
    memory::verify_leaves(words_log2(n), root, open_seed, opened, ChallengeError::WrongProduct, |i| entries.word(i))
}

#[cfg(test)]
mod tests {
    use super::*;

    const SEED: [u8; 32] = [7; 32];
    const OPEN: [u8; 32] = [9; 32];

    #[test]
    fn the_draw_is_fixed_by_the_seed_and_the_entries_are_small() {
        let (a, b) = matrices(&SEED, 16);
        assert_eq!(matrices(&SEED, 16), (a.clone(), b.clone()), "deterministic");
        assert_ne!(matrices(&[8; 32], 16).0, a, "another seed, other matrices");
        assert_ne!(a, b, "A and B come from different streams");
        assert!(a.iter().chain(&b).all(|v| (-2..=2).contains(v)));
        for value in -2..=2i8 {
            assert!(a.contains(&value), "every value occurs");
        }
        // A known value pins the stream, so agents in any language can check theirs.
        // (Checked against an independent Python rendering of the stream as documented.)
        assert_eq!(&a[..8], &[2, 1, -2, -2, -2, 1, 1, -1], "the documented stream");
        // Any entry can be drawn by itself (what the exchange and a GPU kernel do).
        let stream = Stream::new(&SEED, 2);
        assert!((0..256u64).all(|k| entry(stream.at(k)) == b[k as usize]));
        assert_eq!(stream_origin(&SEED, 2), stream.state);
    }

    #[test]
    fn the_sides_allowed_are_powers_of_two_that_fill_a_leaf() {
        assert!(n_valid(16) && n_valid(256) && n_valid(16_384));
        assert!(!n_valid(0) && !n_valid(8) && !n_valid(48) && !n_valid(32_768));
        assert_eq!((words_log2(16), words_log2(16_384)), (8, 28));
    }

    #[test]
    fn an_honest_answer_verifies() {
        let n = 64;
        let (a, b) = matrices(&SEED, n);
        let product = product(&a, &b, n);
        // The float path a GPU takes gives the same integers.
        let (af, bf): (Vec<f32>, Vec<f32>) = (a.iter().map(|&v| v as f32).collect(), b.iter().map(|&v| v as f32).collect());
        for i in [0usize, 17, 63] {
            for j in [0usize, 5, 63] {
                let entry = (0..64).map(|k| af[i * 64 + k] * bf[k * 64 + j]).sum::<f32>() as i32;
                assert_eq!(entry as u32, product[i * 64 + j]);
            }
        }
        // The exchange's entry-by-entry recomputation is the product, everywhere.
        let mut entries = Entries::new(&SEED, n);
        assert!((0..(n * n) as u64).all(|i| entries.word(i) == product[i as usize]));
        assert!(product.iter().any(|&w| (w as i32) < 0), "negative entries occur");

        let proof = cpu_proof(&SEED, n);
        let asked = leaves_to_open(&OPEN, n);
        assert_eq!(asked.len(), memory::MEMORY_OPENED_LEAVES);
        let opened = proof.open(&asked);
        assert!(well_formed(n, &opened));
        assert_eq!(verify_opening(&SEED, n, &proof.root(), &OPEN, &opened), Ok(()));
        // The smallest: one leaf, the root its hash.
        let single = cpu_proof(&SEED, 16);
        let opened = single.open(&leaves_to_open(&OPEN, 16));
        assert_eq!((opened.len(), opened[0].path.len()), (1, 0));
        assert_eq!(verify_opening(&SEED, 16, &single.root(), &OPEN, &opened), Ok(()));
    }

    #[test]
    fn wrong_or_uncommitted_answers_are_refused() {
        let n = 32;
        let proof = cpu_proof(&SEED, n);
        let asked = leaves_to_open(&OPEN, n);
        let opened = proof.open(&asked);
        let root = proof.root();

        // A wrong product, committed consistently: caught by recomputation.
        let (a, b) = matrices(&SEED, n);
        let wrong = CpuProof::new(product(&a, &b, n).into_iter().map(|w| w.wrapping_add(1)).collect());
        let check = verify_opening(&SEED, n, &wrong.root(), &OPEN, &wrong.open(&asked));
        assert_eq!(check, Err(ChallengeError::WrongProduct));
        // Another challenge's answer.
        let other = cpu_proof(&[8; 32], n);
        assert_eq!(verify_opening(&SEED, n, &other.root(), &OPEN, &other.open(&asked)), Err(ChallengeError::WrongProduct));
        // An entry changed after committing, or the right leaves against another root.
        let mut changed = opened.clone();
        changed[1].words[0] ^= 1;
        assert_eq!(verify_opening(&SEED, n, &root, &OPEN, &changed), Err(ChallengeError::LeafNotCommitted));
        assert_eq!(verify_opening(&SEED, n, &wrong.root(), &OPEN, &opened), Err(ChallengeError::LeafNotCommitted));
        // Other leaves than asked, or too few.
        let mut shifted = opened.clone();
        shifted[0].leaf ^= 1;
        assert_eq!(verify_opening(&SEED, n, &root, &OPEN, &shifted), Err(ChallengeError::WrongRows));
        assert_eq!(verify_opening(&SEED, n, &root, &OPEN, &opened[1..]), Err(ChallengeError::WrongRows));
        // Malformed openings are told apart before any verdict.
        let mut long_leaf = opened.clone();
        long_leaf[0].words.push(0);
        assert!(!well_formed(n, &long_leaf));
        assert!(!well_formed(n, &cpu_proof(&SEED, 64).open(&leaves_to_open(&OPEN, 64))), "a larger product's leaves");
        assert!(!well_formed(48, &opened), "not a side a challenge has");
    }

    /// A prover that computed only half the product (and committed zeros
    /// for the rest) is caught unless every opened leaf falls in its half:
    /// about 1 in 2^8 for 8 opened leaves. Over 200 draws it is caught at
    /// least 190 times (expected: 199.2).
    #[test]
    fn a_lazy_prover_is_caught_by_the_opened_leaves() {
        let n = 64;
        let (a, b) = matrices(&SEED, n);
        let mut lazy = product(&a, &b, n);
        let half = lazy.len() / 2;
        lazy[half..].iter_mut().for_each(|entry| *entry = 0);
        let proof = CpuProof::new(lazy);
        let caught = (0..200u8)
            .filter(|draw| {
                let open = [*draw; 32];
                verify_opening(&SEED, n, &proof.root(), &open, &proof.open(&leaves_to_open(&open, n))).is_err()
            })
            .count();
        assert!(caught >= 190, "caught {caught} of 200");
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(64))]

        /// Against a reference model of what the exchange looks at: a
        /// prover that commits (consistently) to a product with one entry
        /// changed is caught exactly when that entry is one of the checked
        /// entries of the opened leaves; otherwise its answer verifies, as
        /// an honest one always does.
        #[test]
        fn one_wrong_entry_is_caught_exactly_when_it_is_checked(
            log2 in 4u32..=6,
            seed in proptest::prelude::any::<[u8; 32]>(),
            open in proptest::prelude::any::<[u8; 32]>(),
            index in proptest::prelude::any::<proptest::sample::Index>(),
            checked_pick in proptest::prelude::any::<proptest::sample::Index>(),
            pick_checked in proptest::prelude::any::<bool>(),
        ) {
            let n = 1u32 << log2;
            let (a, b) = matrices(&seed, n);
            let mut words = product(&a, &b, n);
            let leaves = leaves_to_open(&open, n);
            let checked: Vec<usize> = leaves
                .iter()
                .zip(memory::words_to_check(&open, leaves.len()))
                .flat_map(|(leaf, offsets)| offsets.into_iter().map(move |o| *leaf as usize * memory::LEAF_WORDS + o))
                .collect();
            let honest = CpuProof::new(words.clone());
            proptest::prop_assert_eq!(verify_opening(&seed, n, &honest.root(), &open, &honest.open(&leaves)), Ok(()));
            // Half the cases change a checked entry, the others any entry.
            let changed = if pick_checked { checked[checked_pick.index(checked.len())] } else { index.index(words.len()) };
            words[changed] = words[changed].wrapping_add(1);
            let cheat = CpuProof::new(words);
            let verdict = verify_opening(&seed, n, &cheat.root(), &open, &cheat.open(&leaves));
            let expected = if checked.contains(&changed) { Err(ChallengeError::WrongProduct) } else { Ok(()) };
            proptest::prop_assert_eq!(verdict, expected, "entry {} changed", changed);
        }
    }

    /// The exchange's check of the largest challenge stays small: 8 leaves
    /// of 16 entries, each a dot product of length 16 384 drawn from the
    /// seed (no matrix formed).
    #[test]
    fn checking_the_largest_challenge_is_bounded() {
        let n = CHALLENGE_N_MAX;
        let started = std::time::Instant::now();
        let mut entries = Entries::new(&SEED, n);
        let leaves = leaves_to_open(&OPEN, n);
        let mut words = 0;
        for leaf in &leaves {
            for offset in 0..memory::MEMORY_CHECKED_WORDS as u64 {
                std::hint::black_box(entries.word(*leaf as u64 * memory::LEAF_WORDS as u64 + offset * 13));
                words += 1;
            }
        }
        let checked = started.elapsed();
        // The bare ceiling: the same number of draws (a row of A per leaf,
        // a column of B per entry), summed and nothing else.
        let started = std::time::Instant::now();
        let stream = Stream::new(&SEED, 2);
        let draws = (leaves.len() as u64 + words) * n as u64;
        let sum = (0..draws).fold(0u64, |sum, k| sum.wrapping_add(stream.at(k)));
        std::hint::black_box(sum);
        eprintln!("recomputing {words} entries at n = {n}: {checked:?}; {draws} bare draws: {:?}", started.elapsed());
        assert_eq!(words, 128);
        assert_eq!(memory::leaf_count(words_log2(n)), 1 << 20);
    }
}
