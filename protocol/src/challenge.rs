//! The hardware challenge's arithmetic (docs/market-rules.md "Verified
//! hardware", docs/protocol.md "Hardware challenges"): what a GPU computes,
//! how it commits to the answer, and how the exchange checks the answer
//! cheaply. Both sides must agree on it byte for byte.
//!
//! The work: `C = A x B` for two `n x n` matrices drawn from a seed, with
//! entries in -2..=2. Every product entry is an integer of magnitude at
//! most `4n`, exact in f32 (and in f16 inputs with f32 accumulation, as
//! tensor cores do) for any `n` up to 2^22, so a GPU, a CPU and the
//! exchange all get the same integers.
//!
//! The answer, in two steps:
//! 1. **Commit**: the hash of every row of `C` (SHA-256 of its entries as
//!    little-endian i32), and the commitment: SHA-256 of those row hashes
//!    in order. Its arrival time is what the exchange times.
//! 2. **Open**: the exchange then names `k` rows (drawn after the commitment
//!    arrived); the prover sends those rows and all row hashes. The exchange
//!    checks the row hashes against the commitment, each opened row against
//!    its hash, and recomputes each opened row as `A_i x B`: `O(k n^2)` work
//!    against the prover's `O(n^3)`.
//!
//! Freivalds' check alone (`A(Br) = Cr` for a random `r`) does not bind a
//! prover that knows `A`, `B` and `r`: it can compute `A(Br)` in `O(n^2)`
//! without ever forming `C`. Committing to every row before any row is
//! named does: a prover that skipped a share `f` of the rows (or got them
//! wrong) is caught with probability `1 - (1 - f)^k`.

use sha2::{Digest, Sha256};

/// The largest matrix side a challenge may ask for: its answer must fit a
/// frame (every entry is exact far beyond it).
pub const CHALLENGE_N_MAX: u32 = gpux_engine::limits::CHALLENGE_N_MAX;
/// Rows the exchange opens.
pub const CHALLENGE_OPENED_ROWS: usize = 8;

/// Why an answer is refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ChallengeError {
    #[error("the row hashes do not hash to the commitment")]
    CommitmentMismatch,
    #[error("expected one row hash per row")]
    RowHashCount,
    #[error("an opened row was not asked for, or is missing")]
    WrongRows,
    #[error("an opened row does not match its committed hash")]
    RowNotCommitted,
    #[error("an opened row is not the product's row")]
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
}

/// SplitMix64's finaliser.
fn mix(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// The challenge's two matrices, row-major, entries in -2..=2: `A` from
/// the seed's stream 1, `B` from stream 2.
pub fn matrices(seed: &[u8; 32], n: u32) -> (Vec<i8>, Vec<i8>) {
    let draw = |domain| {
        let mut stream = Stream::new(seed, domain);
        (0..n as usize * n as usize).map(|_| (stream.next() % 5) as i8 - 2).collect::<Vec<i8>>()
    };
    (draw(1), draw(2))
}

/// Row `i` of `A x B` (what the exchange recomputes for an opened row).
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

/// The whole product, as an honest prover without a GPU computes it.
pub fn product(a: &[i8], b: &[i8], n: u32) -> Vec<Vec<i32>> {
    (0..n).map(|i| product_row(a, b, n, i)).collect()
}

/// A prover's answer, computed: the product's row hashes and commitment,
/// and the rows kept for the opening.
pub struct Answer {
    pub rows: Vec<Vec<i32>>,
    pub row_hashes: Vec<[u8; 32]>,
    pub commitment: [u8; 32],
}

impl Answer {
    /// Commits to a computed product.
    pub fn commit(rows: Vec<Vec<i32>>) -> Answer {
        let row_hashes: Vec<[u8; 32]> = rows.iter().map(|row| row_hash(row)).collect();
        let commitment = commitment(&row_hashes);
        Answer { rows, row_hashes, commitment }
    }

    /// The rows asked for, as `challenge_opening` carries them.
    pub fn open(&self, asked: &[u32]) -> OpenedRows {
        asked.iter().filter_map(|&row| self.rows.get(row as usize).map(|entries| (row, entries.clone()))).collect()
    }
}

pub fn row_hash(row: &[i32]) -> [u8; 32] {
    let mut hasher = Sha256::new();
    for entry in row {
        hasher.update(entry.to_le_bytes());
    }
    hasher.finalize().into()
}

/// The commitment to a product: SHA-256 of its row hashes in order.
pub fn commitment(row_hashes: &[[u8; 32]]) -> [u8; 32] {
    let mut hasher = Sha256::new();
    for hash in row_hashes {
        hasher.update(hash);
    }
    hasher.finalize().into()
}

/// The rows the exchange opens: `CHALLENGE_OPENED_ROWS` distinct rows (all
/// of them if `n` is smaller), drawn from a seed the exchange picks after
/// the commitment arrived.
pub fn rows_to_open(open_seed: &[u8; 32], n: u32) -> Vec<u32> {
    let mut stream = Stream::new(open_seed, 3);
    let want = CHALLENGE_OPENED_ROWS.min(n as usize);
    let mut rows: Vec<u32> = Vec::with_capacity(want);
    while rows.len() < want {
        let row = (stream.next() % n as u64) as u32;
        if !rows.contains(&row) {
            rows.push(row);
        }
    }
    rows.sort_unstable();
    rows
}

/// Opened rows: `(row index, its entries)`.
pub type OpenedRows = Vec<(u32, Vec<i32>)>;

/// Checks an opening: `row_hashes` hash to `committed`, and each opened row
/// (exactly the rows asked for, in order) has its committed hash and is
/// row `i` of `A x B`.
pub fn verify_opening(
    seed: &[u8; 32],
    n: u32,
    committed: &[u8; 32],
    row_hashes: &[[u8; 32]],
    asked: &[u32],
    opened: &[(u32, Vec<i32>)],
) -> Result<(), ChallengeError> {
    if row_hashes.len() != n as usize {
        return Err(ChallengeError::RowHashCount);
    }
    if commitment(row_hashes) != *committed {
        return Err(ChallengeError::CommitmentMismatch);
    }
    if opened.len() != asked.len() || opened.iter().zip(asked).any(|((row, _), asked)| row != asked) {
        return Err(ChallengeError::WrongRows);
    }
    let (a, b) = matrices(seed, n);
    for (row, entries) in opened {
        if row_hash(entries) != row_hashes[*row as usize] {
            return Err(ChallengeError::RowNotCommitted);
        }
        if *entries != product_row(&a, &b, n, *row) {
            return Err(ChallengeError::WrongProduct);
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    const SEED: [u8; 32] = [7; 32];
    const OPEN: [u8; 32] = [9; 32];

    /// An honest prover's full answer: row hashes and the opened rows.
    fn answer(product: &[Vec<i32>], asked: &[u32]) -> (Vec<[u8; 32]>, OpenedRows) {
        let hashes = product.iter().map(|row| row_hash(row)).collect();
        let opened = asked.iter().map(|&i| (i, product[i as usize].clone())).collect();
        (hashes, opened)
    }

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
    }

    #[test]
    fn an_honest_answer_verifies() {
        let n = 64;
        let (a, b) = matrices(&SEED, n);
        let product = product(&a, &b, n);
        // The float path a GPU takes gives the same integers.
        let (af, bf): (Vec<f32>, Vec<f32>) = (a.iter().map(|&v| v as f32).collect(), b.iter().map(|&v| v as f32).collect());
        for i in [0usize, 17, 63] {
            let row: Vec<i32> =
                (0..n as usize).map(|j| (0..n as usize).map(|k| af[i * 64 + k] * bf[k * 64 + j]).sum::<f32>() as i32).collect();
            assert_eq!(row, product[i]);
        }
        let asked = rows_to_open(&OPEN, n);
        assert_eq!(asked.len(), CHALLENGE_OPENED_ROWS);
        let (hashes, opened) = answer(&product, &asked);
        assert_eq!(verify_opening(&SEED, n, &commitment(&hashes), &hashes, &asked, &opened), Ok(()));
    }

    #[test]
    fn wrong_or_uncommitted_answers_are_refused() {
        let n = 32;
        let (a, b) = matrices(&SEED, n);
        let honest = product(&a, &b, n);
        let asked = rows_to_open(&OPEN, n);
        let (hashes, opened) = answer(&honest, &asked);
        let committed = commitment(&hashes);

        // A wrong product, committed consistently: caught by recomputation.
        let mut wrong = honest.clone();
        wrong[asked[0] as usize][3] += 1;
        let (wrong_hashes, wrong_opened) = answer(&wrong, &asked);
        let check = verify_opening(&SEED, n, &commitment(&wrong_hashes), &wrong_hashes, &asked, &wrong_opened);
        assert_eq!(check, Err(ChallengeError::WrongProduct));
        // The right rows opened against a commitment to something else.
        assert_eq!(verify_opening(&SEED, n, &commitment(&wrong_hashes), &hashes, &asked, &opened), Err(ChallengeError::CommitmentMismatch));
        // A row changed after committing.
        let mut changed = opened.clone();
        changed[1].1[0] += 1;
        assert_eq!(verify_opening(&SEED, n, &committed, &hashes, &asked, &changed), Err(ChallengeError::RowNotCommitted));
        // Other rows than asked, or too few hashes.
        let mut shifted = opened.clone();
        shifted[0].0 = (asked[0] + 1) % n;
        assert_eq!(verify_opening(&SEED, n, &committed, &hashes, &asked, &shifted), Err(ChallengeError::WrongRows));
        assert_eq!(verify_opening(&SEED, n, &committed, &hashes[1..], &asked, &opened), Err(ChallengeError::RowHashCount));
        // Another challenge's answer.
        assert_eq!(verify_opening(&[8; 32], n, &committed, &hashes, &asked, &opened), Err(ChallengeError::WrongProduct));
    }

    /// A prover that computed only half the rows (and committed zeros for
    /// the rest) is caught unless every opened row falls in its half:
    /// about 1 in 2^8 for 8 opened rows. Over 200 draws of the opened rows
    /// it is caught at least 190 times (expected: 199.2).
    #[test]
    fn a_lazy_prover_is_caught_by_the_opened_rows() {
        let n = 64;
        let (a, b) = matrices(&SEED, n);
        let mut lazy = product(&a, &b, n);
        for row in lazy.iter_mut().skip(n as usize / 2) {
            row.iter_mut().for_each(|entry| *entry = 0);
        }
        let hashes: Vec<[u8; 32]> = lazy.iter().map(|row| row_hash(row)).collect();
        let committed = commitment(&hashes);
        let caught = (0..200u8)
            .filter(|draw| {
                let asked = rows_to_open(&[*draw; 32], n);
                let opened: OpenedRows = asked.iter().map(|&i| (i, lazy[i as usize].clone())).collect();
                verify_opening(&SEED, n, &committed, &hashes, &asked, &opened).is_err()
            })
            .count();
        assert!(caught >= 190, "caught {caught} of 200");
    }
}
