//! The memory-bandwidth challenge's arithmetic (docs/market-rules.md
//! "Verified hardware", docs/protocol.md "Hardware challenges"): what a GPU
//! computes, how it commits to the result, and how the exchange checks a
//! few words of it cheaply. Both sides must agree on it bit for bit.
//!
//! The work, over `W = 2^words_log2` 32-bit words and `P` passes:
//! - the initial buffer `x0[i] = fmix32(i ^ key0)`;
//! - pass `p` (1..=P) writes a second buffer
//!   `xp[i] = fmix32((x(p-1)[i] + rotl(x(p-1)[(i + o_p) mod W], 7)) ^ key_p)`,
//!   two streaming reads and one write per word, so an honest GPU moves
//!   `4 W (1 + 3 P)` bytes, bound by its memory bandwidth;
//! - `key0`, and each pass's offset `o_p` (1..W) and key `key_p`, are drawn
//!   from the seed's stream 4, in that order.
//!
//! The commitment: a binary SHA-256 Merkle tree over the final buffer cut
//! into leaves of [`LEAF_WORDS`] words (leaf hash `SHA-256(0x00 || words
//! as little-endian u32)`, node `SHA-256(0x01 || left || right)`); the
//! commitment is its root. The exchange then names
//! [`MEMORY_OPENED_LEAVES`] leaves (drawn after the root arrived); the
//! prover sends each leaf's words and its path to the root. The exchange
//! checks every path and recomputes [`MEMORY_CHECKED_WORDS`] words of each
//! opened leaf from the `2^P` initial words each depends on.
//!
//! Why a prover cannot shortcut the memory: a final word depends on `2^P`
//! initial words through `2^P - 1` mixes, so computing the buffer without
//! keeping it costs `2^(P+1)` mixes per word instead of `P` passes over
//! memory; at 10 passes that is ~16 000 integer operations per word against
//! ~124 bytes of memory traffic, far slower on any GPU. A prover that
//! skipped or faked a share `f` of the words is caught with probability
//! about `1 - (1 - f)^(8 x 16)`.

use sha2::{Digest, Sha256};

use crate::challenge::{ChallengeError, Stream};

/// Words per Merkle leaf (1 KiB).
pub const LEAF_WORDS: usize = 256;
/// Leaves the exchange opens.
pub const MEMORY_OPENED_LEAVES: usize = 8;
/// Words of each opened leaf the exchange recomputes.
pub const MEMORY_CHECKED_WORDS: usize = 16;

/// MurmurHash3's 32-bit finaliser: the one mix of the challenge.
pub fn fmix32(mut h: u32) -> u32 {
    h ^= h >> 16;
    h = h.wrapping_mul(0x85eb_ca6b);
    h ^= h >> 13;
    h = h.wrapping_mul(0xc2b2_ae35);
    h ^ (h >> 16)
}

/// One pass's step: the new word at `i` from the old words at `i` and `i + o_p`.
pub fn step(key: u32, at: u32, ahead: u32) -> u32 {
    fmix32(at.wrapping_add(ahead.rotate_left(7)) ^ key)
}

/// A memory challenge's parameters, drawn from its seed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Params {
    pub words_log2: u32,
    pub key0: u32,
    /// `(o_p, key_p)` for passes 1..=P.
    pub passes: Vec<(u64, u32)>,
}

impl Params {
    pub fn new(seed: &[u8; 32], words_log2: u32, passes: u32) -> Params {
        let words = 1u64 << words_log2;
        let mut stream = Stream::new(seed, 4);
        let key0 = stream.next() as u32;
        let passes = (0..passes)
            .map(|_| {
                let offset = 1 + stream.next() % (words - 1);
                (offset, stream.next() as u32)
            })
            .collect();
        Params { words_log2, key0, passes }
    }

    pub fn words(&self) -> u64 {
        1u64 << self.words_log2
    }

    fn mask(&self) -> u64 {
        self.words() - 1
    }

    /// The initial word at `i`.
    pub fn initial(&self, i: u64) -> u32 {
        fmix32(i as u32 ^ self.key0)
    }

    /// The word at `i` after `pass` passes, from the initial words alone
    /// (what the exchange does for a checked word: `2^(pass+1)` mixes).
    pub fn word_after(&self, pass: usize, i: u64) -> u32 {
        if pass == 0 {
            return self.initial(i);
        }
        let (offset, key) = self.passes[pass - 1];
        step(key, self.word_after(pass - 1, i), self.word_after(pass - 1, (i + offset) & self.mask()))
    }

    /// The final buffer, as an honest prover without a GPU computes it.
    pub fn compute(&self) -> Vec<u32> {
        let words = self.words() as usize;
        let mask = self.mask() as usize;
        let mut current: Vec<u32> = (0..words as u64).map(|i| self.initial(i)).collect();
        let mut next = vec![0u32; words];
        for &(offset, key) in &self.passes {
            let offset = offset as usize;
            for (i, out) in next.iter_mut().enumerate() {
                *out = step(key, current[i], current[(i + offset) & mask]);
            }
            std::mem::swap(&mut current, &mut next);
        }
        current
    }
}

/// The bytes an honest prover moves: the initial write, then two reads and
/// a write per word and pass.
pub fn bytes_moved(words_log2: u32, passes: u32) -> u64 {
    4 * (1u64 << words_log2) * (1 + 3 * passes as u64)
}

pub fn leaf_hash(words: &[u32]) -> [u8; 32] {
    let mut hasher = Sha256::new();
    hasher.update([0u8]);
    for word in words {
        hasher.update(word.to_le_bytes());
    }
    hasher.finalize().into()
}

pub fn node_hash(left: &[u8; 32], right: &[u8; 32]) -> [u8; 32] {
    let mut hasher = Sha256::new();
    hasher.update([1u8]);
    hasher.update(left);
    hasher.update(right);
    hasher.finalize().into()
}

/// How many leaves a buffer of `2^words_log2` words has.
pub fn leaf_count(words_log2: u32) -> u64 {
    (1u64 << words_log2) / LEAF_WORDS as u64
}

/// One opened leaf, as `memory_opening` carries it.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct LeafOpening {
    pub leaf: u32,
    /// Its [`LEAF_WORDS`] words.
    pub words: Vec<u32>,
    /// The sibling hashes from the leaf up to the root, hex.
    pub path: Vec<String>,
}

/// A prover's committed result: the final buffer and its Merkle tree (the
/// CPU prover's; a GPU backend keeps both on the GPU).
pub struct CpuProof {
    words: Vec<u32>,
    /// Level 0: the leaf hashes; the last level: the root alone.
    levels: Vec<Vec<[u8; 32]>>,
}

impl CpuProof {
    pub fn new(words: Vec<u32>) -> CpuProof {
        let mut levels = vec![words.chunks(LEAF_WORDS).map(leaf_hash).collect::<Vec<_>>()];
        while levels.last().expect("a level").len() > 1 {
            let level = levels.last().expect("a level").chunks(2).map(|pair| node_hash(&pair[0], &pair[1])).collect();
            levels.push(level);
        }
        CpuProof { words, levels }
    }

    pub fn root(&self) -> [u8; 32] {
        self.levels.last().expect("a level")[0]
    }

    /// The leaves asked for (those past the end are left out).
    pub fn open(&self, leaves: &[u32]) -> Vec<LeafOpening> {
        leaves
            .iter()
            .filter(|&&leaf| (leaf as usize) < self.levels[0].len())
            .map(|&leaf| {
                let start = leaf as usize * LEAF_WORDS;
                let path = (0..self.levels.len() - 1).map(|level| hex::encode(self.levels[level][(leaf as usize >> level) ^ 1])).collect();
                LeafOpening { leaf, words: self.words[start..start + LEAF_WORDS].to_vec(), path }
            })
            .collect()
    }
}

/// The leaves the exchange opens: [`MEMORY_OPENED_LEAVES`] distinct leaves
/// (all of them if there are fewer), drawn from the open seed's stream 5.
pub fn leaves_to_open(open_seed: &[u8; 32], words_log2: u32) -> Vec<u32> {
    // A buffer smaller than a leaf (no challenge has one) opens nothing.
    let count = leaf_count(words_log2);
    let want = (MEMORY_OPENED_LEAVES as u64).min(count) as usize;
    let mut stream = Stream::new(open_seed, 5);
    let mut leaves: Vec<u32> = Vec::with_capacity(want);
    while leaves.len() < want {
        let leaf = (stream.next() % count) as u32;
        if !leaves.contains(&leaf) {
            leaves.push(leaf);
        }
    }
    leaves.sort_unstable();
    leaves
}

/// The words within each opened leaf the exchange recomputes: for the
/// opened leaves in order, [`MEMORY_CHECKED_WORDS`] offsets each from the
/// open seed's stream 6.
pub(crate) fn words_to_check(open_seed: &[u8; 32], leaves: usize) -> Vec<Vec<usize>> {
    let mut stream = Stream::new(open_seed, 6);
    (0..leaves).map(|_| (0..MEMORY_CHECKED_WORDS).map(|_| (stream.next() % LEAF_WORDS as u64) as usize).collect()).collect()
}

/// Whether an opening is well formed for a buffer of `2^words_log2` words
/// (checked before any verdict: a malformed one is an error, not a wrong
/// answer): each leaf in range with [`LEAF_WORDS`] words and a path of the
/// tree's height in hex hashes, at most [`MEMORY_OPENED_LEAVES`] leaves.
pub fn well_formed(words_log2: u32, opened: &[LeafOpening]) -> bool {
    let height = leaf_count(words_log2).trailing_zeros() as usize;
    opened.len() <= MEMORY_OPENED_LEAVES
        && opened.iter().all(|o| {
            (o.leaf as u64) < leaf_count(words_log2)
                && o.words.len() == LEAF_WORDS
                && o.path.len() == height
                && o.path.iter().all(|h| h.len() == 64 && hex::decode(h).is_ok())
        })
}

/// Checks an opening: exactly the leaves asked for, in order, each leading
/// to the committed root by its path, and each checked word the passes'
/// result. Expects a [`well_formed`] opening.
pub fn verify_opening(
    seed: &[u8; 32],
    words_log2: u32,
    passes: u32,
    root: &[u8; 32],
    open_seed: &[u8; 32],
    opened: &[LeafOpening],
) -> Result<(), ChallengeError> {
    let params = Params::new(seed, words_log2, passes);
    verify_leaves(words_log2, root, open_seed, opened, ChallengeError::WrongWords, |i| params.word_after(passes as usize, i))
}

/// Checks an opening of any buffer committed as a Merkle tree of
/// [`LEAF_WORDS`]-word leaves (the memory challenge's, and the compute
/// challenge's product): exactly the leaves [`leaves_to_open`] names, in
/// order, each leading to `root` by its path, and
/// [`MEMORY_CHECKED_WORDS`] words of each (drawn from the open seed's
/// stream 6) equal to `word(index)`; `wrong` is the error of a word that
/// differs. Expects a [`well_formed`] opening.
pub(crate) fn verify_leaves(
    words_log2: u32,
    root: &[u8; 32],
    open_seed: &[u8; 32],
    opened: &[LeafOpening],
    wrong: ChallengeError,
    mut word: impl FnMut(u64) -> u32,
) -> Result<(), ChallengeError> {
    let asked = leaves_to_open(open_seed, words_log2);
    if opened.len() != asked.len() || opened.iter().zip(&asked).any(|(o, asked)| o.leaf != *asked) {
        return Err(ChallengeError::WrongRows);
    }
    for opening in opened {
        let mut hash = leaf_hash(&opening.words);
        for (level, sibling) in opening.path.iter().enumerate() {
            let mut other = [0u8; 32];
            hex::decode_to_slice(sibling, &mut other).map_err(|_| ChallengeError::LeafNotCommitted)?;
            hash = if (opening.leaf >> level) & 1 == 0 { node_hash(&hash, &other) } else { node_hash(&other, &hash) };
        }
        if hash != *root {
            return Err(ChallengeError::LeafNotCommitted);
        }
    }
    for (opening, offsets) in opened.iter().zip(words_to_check(open_seed, opened.len())) {
        for offset in offsets {
            let i = opening.leaf as u64 * LEAF_WORDS as u64 + offset as u64;
            if opening.words.get(offset) != Some(&word(i)) {
                return Err(wrong);
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    const SEED: [u8; 32] = [7; 32];
    const OPEN: [u8; 32] = [9; 32];

    #[test]
    fn the_draw_is_fixed_by_the_seed() {
        let params = Params::new(&SEED, 12, 4);
        assert_eq!(params, Params::new(&SEED, 12, 4), "deterministic");
        assert_ne!(params, Params::new(&[8; 32], 12, 4));
        assert_eq!(params.passes.len(), 4);
        assert!(params.passes.iter().all(|(offset, _)| (1..4096).contains(offset)));
        // Pins the stream and the mix, so agents in any language can check theirs.
        assert_eq!(fmix32(0), 0);
        assert_eq!(fmix32(1), 0x514e_28b7, "MurmurHash3's fmix32");
        let first = params.compute()[..2].to_vec();
        assert_eq!(first, vec![params.word_after(4, 0), params.word_after(4, 1)]);
    }

    /// The exchange's word-by-word recomputation equals the honest pass
    /// over the whole buffer, everywhere (including the wrap at the end).
    #[test]
    fn recomputed_words_equal_the_passes() {
        let params = Params::new(&SEED, 9, 5);
        let buffer = params.compute();
        for i in 0..params.words() {
            assert_eq!(buffer[i as usize], params.word_after(5, i), "word {i}");
        }
    }

    #[test]
    fn an_honest_answer_verifies_and_its_tree_is_a_merkle_tree() {
        let (log2, passes) = (14, 6);
        let proof = CpuProof::new(Params::new(&SEED, log2, passes).compute());
        let asked = leaves_to_open(&OPEN, log2);
        assert_eq!(asked.len(), MEMORY_OPENED_LEAVES);
        let opened = proof.open(&asked);
        assert!(well_formed(log2, &opened));
        assert_eq!(verify_opening(&SEED, log2, passes, &proof.root(), &OPEN, &opened), Ok(()));
        // One leaf: the root is its hash and the path is empty.
        let single = CpuProof::new(Params::new(&SEED, 8, 2).compute());
        let opened = single.open(&leaves_to_open(&OPEN, 8));
        assert_eq!((opened.len(), opened[0].path.len()), (1, 0));
        assert_eq!(verify_opening(&SEED, 8, 2, &single.root(), &OPEN, &opened), Ok(()));
    }

    #[test]
    fn wrong_or_uncommitted_answers_are_refused() {
        let (log2, passes) = (12, 4);
        let proof = CpuProof::new(Params::new(&SEED, log2, passes).compute());
        let asked = leaves_to_open(&OPEN, log2);
        let opened = proof.open(&asked);
        let root = proof.root();

        // Fewer passes, committed consistently: the checked words are wrong.
        let short = CpuProof::new(Params::new(&SEED, log2, passes - 1).compute());
        assert_eq!(verify_opening(&SEED, log2, passes, &short.root(), &OPEN, &short.open(&asked)), Err(ChallengeError::WrongWords));
        // Another seed's buffer.
        let other = CpuProof::new(Params::new(&[8; 32], log2, passes).compute());
        assert_eq!(verify_opening(&SEED, log2, passes, &other.root(), &OPEN, &other.open(&asked)), Err(ChallengeError::WrongWords));
        // A word changed after committing.
        let mut changed = opened.clone();
        changed[2].words[5] ^= 1;
        assert_eq!(verify_opening(&SEED, log2, passes, &root, &OPEN, &changed), Err(ChallengeError::LeafNotCommitted));
        // Against another root.
        assert_eq!(verify_opening(&SEED, log2, passes, &[0; 32], &OPEN, &opened), Err(ChallengeError::LeafNotCommitted));
        // Other leaves than asked.
        let mut shifted = opened.clone();
        shifted[0].leaf ^= 1;
        assert_eq!(verify_opening(&SEED, log2, passes, &root, &OPEN, &shifted), Err(ChallengeError::WrongRows));
        assert_eq!(verify_opening(&SEED, log2, passes, &root, &OPEN, &opened[1..]), Err(ChallengeError::WrongRows));
        // Malformed openings are told apart before any verdict.
        let mut short_path = opened.clone();
        short_path[0].path.pop();
        assert!(!well_formed(log2, &short_path));
        let mut long_leaf = opened.clone();
        long_leaf[0].words.push(0);
        assert!(!well_formed(log2, &long_leaf));
        let mut bad_hex = opened.clone();
        bad_hex[0].path[0] = "zz".repeat(32);
        assert!(!well_formed(log2, &bad_hex));
    }

    /// A prover that kept only half the buffer right (the rest zeros, yet
    /// committed) is caught unless every opened leaf falls in its half:
    /// about 1 in 2^8. Over 100 draws it is caught at least 95 times.
    #[test]
    fn a_lazy_prover_is_caught_by_the_opened_leaves() {
        let (log2, passes) = (13, 3);
        let mut words = Params::new(&SEED, log2, passes).compute();
        let half = words.len() / 2;
        words[half..].iter_mut().for_each(|w| *w = 0);
        let proof = CpuProof::new(words);
        let caught = (0..100u8)
            .filter(|draw| {
                let open = [*draw; 32];
                verify_opening(&SEED, log2, passes, &proof.root(), &open, &proof.open(&leaves_to_open(&open, log2))).is_err()
            })
            .count();
        assert!(caught >= 95, "caught {caught} of 100");
    }

    /// The exchange's check at the most passes allowed stays small: 8 x 16
    /// words x 2^13 mixes.
    #[test]
    fn checking_the_deepest_challenge_is_bounded() {
        let params = Params::new(&SEED, 32, gpux_engine::limits::MEMORY_PASSES_MAX);
        let started = std::time::Instant::now();
        for i in 0..(MEMORY_OPENED_LEAVES * MEMORY_CHECKED_WORDS) as u64 {
            std::hint::black_box(params.word_after(params.passes.len(), i * 7919));
        }
        eprintln!(
            "recomputing {} words at {} passes: {:?}",
            MEMORY_OPENED_LEAVES * MEMORY_CHECKED_WORDS,
            params.passes.len(),
            started.elapsed()
        );
        assert_eq!(bytes_moved(10, 2), 4 * 1024 * 7);
        assert_eq!(leaf_count(32), 1 << 24);
    }
}
