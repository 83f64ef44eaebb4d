//! Hardware challenges in flight (docs/market-rules.md "Verified
//! hardware"): issued to a GPU's owner, committed, opened, then recorded in
//! the engine by a follow-up `RecordChallenge` command. Pure state, changed
//! only by journal entries; the seeds come from the sequencer's randomness
//! and are journaled, so replay needs none.

use std::collections::BTreeMap;

use gpux_engine::{AccountId, ChallengeAnswer, GpuId};
use gpux_protocol::challenge::{self, ChallengeError};
use gpux_protocol::memory;
use gpux_protocol::ErrorCode;
use serde::{Deserialize, Serialize};

/// How long a challenge waits for its commitment, and then for its opening.
pub const CHALLENGE_ANSWER_MS: u64 = 60_000;

/// One challenge in flight.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Pending {
    pub gpu: GpuId,
    pub owner: AccountId,
    pub seed: [u8; 32],
    pub n: u32,
    pub issued_ms: u64,
    pub commit: Option<Commit>,
    /// A memory challenge's `(words_log2, passes)` (`n` is 0 then); `None`:
    /// the compute challenge.
    pub memory: Option<(u32, u32)>,
}

/// A challenge's commitment, and the seed of the rows it must open.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Commit {
    pub commitment: [u8; 32],
    pub open_seed: [u8; 32],
    pub at_ms: u64,
}

impl Pending {
    /// When it expires unanswered: [`CHALLENGE_ANSWER_MS`] after its issue,
    /// or after its commitment once committed.
    pub fn expires_at_ms(&self) -> u64 {
        self.commit.as_ref().map_or(self.issued_ms, |c| c.at_ms) + CHALLENGE_ANSWER_MS
    }

    /// The leaves its opening must show.
    pub fn rows_to_open(&self) -> Vec<u32> {
        let Some(commit) = &self.commit else { return Vec::new() };
        match self.memory {
            None => challenge::leaves_to_open(&commit.open_seed, self.n),
            Some((words_log2, _)) => memory::leaves_to_open(&commit.open_seed, words_log2),
        }
    }
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Challenges {
    pending: BTreeMap<u64, Pending>,
    /// The next challenge's id (ids are never reused).
    next: u64,
}

impl Challenges {
    /// Opens a challenge; returns its id.
    pub(crate) fn issue(&mut self, gpu: GpuId, owner: AccountId, seed: [u8; 32], n: u32, at_ms: u64) -> u64 {
        self.next += 1;
        self.pending.insert(self.next, Pending { gpu, owner, seed, n, issued_ms: at_ms, commit: None, memory: None });
        self.next
    }

    /// Opens a memory challenge of `(words_log2, passes)`; returns its id.
    pub(crate) fn issue_memory(&mut self, gpu: GpuId, owner: AccountId, seed: [u8; 32], memory: (u32, u32), at_ms: u64) -> u64 {
        self.next += 1;
        self.pending.insert(self.next, Pending { gpu, owner, seed, n: 0, issued_ms: at_ms, commit: None, memory: Some(memory) });
        self.next
    }

    pub(crate) fn commit(&mut self, challenge: u64, commitment: [u8; 32], open_seed: [u8; 32], at_ms: u64) {
        if let Some(pending) = self.pending.get_mut(&challenge) {
            pending.commit = Some(Commit { commitment, open_seed, at_ms });
        }
    }

    /// Closes a challenge with its verdict (`None`: expired) and says what
    /// the engine records for its GPU.
    pub(crate) fn close(&mut self, challenge: u64, verdict: Option<Result<(), ChallengeError>>) -> Option<(GpuId, ChallengeAnswer)> {
        let pending = self.pending.remove(&challenge)?;
        let answer = match (verdict, &pending.commit, pending.memory) {
            (Some(Ok(())), Some(commit), None) => {
                ChallengeAnswer::Correct { n: pending.n, elapsed_ms: commit.at_ms.saturating_sub(pending.issued_ms) }
            }
            (Some(Ok(())), Some(commit), Some((words_log2, passes))) => {
                ChallengeAnswer::MemoryCorrect { words_log2, passes, elapsed_ms: commit.at_ms.saturating_sub(pending.issued_ms) }
            }
            (Some(_), _, None) => ChallengeAnswer::Wrong,
            (Some(_), _, Some(_)) => ChallengeAnswer::MemoryWrong,
            (None, _, None) => ChallengeAnswer::Unanswered,
            (None, _, Some(_)) => ChallengeAnswer::MemoryUnanswered,
        };
        Some((pending.gpu, answer))
    }

    pub fn get(&self, challenge: u64) -> Option<&Pending> {
        self.pending.get(&challenge)
    }

    /// Whether a challenge of this GPU is in flight.
    pub fn in_flight(&self, gpu: GpuId) -> bool {
        self.pending.values().any(|p| p.gpu == gpu)
    }

    /// Challenges whose answer is overdue at `now_ms`.
    pub fn expired(&self, now_ms: u64) -> Vec<u64> {
        self.pending.iter().filter(|(_, p)| p.expires_at_ms() <= now_ms).map(|(id, _)| *id).collect()
    }

    /// The newest challenge's id (0 before the first).
    pub fn latest(&self) -> u64 {
        self.next
    }

    pub fn len(&self) -> usize {
        self.pending.len()
    }

    pub fn is_empty(&self) -> bool {
        self.pending.is_empty()
    }

    /// Checks a commitment before it is journaled. A compute challenge
    /// whose side no opening can have (issued under a journal's older
    /// listing, before the product was committed as a Merkle tree) takes no
    /// commitment: it expires unanswered.
    pub fn check_commit(&self, account: AccountId, challenge: u64, now_ms: u64) -> Result<(), ErrorCode> {
        let pending = self.open_for(account, challenge, now_ms)?;
        if pending.commit.is_some() {
            return Err(ErrorCode::ChallengeOutOfOrder);
        }
        if pending.memory.is_none() && !challenge::n_valid(pending.n) {
            return Err(ErrorCode::ChallengeAnswerInvalid);
        }
        Ok(())
    }

    /// Checks an opening before its verdict is journaled: a malformed or
    /// out-of-turn opening is an error (nothing recorded); a well-formed one
    /// has a verdict, right or wrong. `memory`: a `memory_opening` (a
    /// `challenge_opening` otherwise); opening a challenge of the other kind
    /// is malformed.
    pub fn check_opening(
        &self,
        account: AccountId,
        challenge: u64,
        memory: bool,
        opened: &[memory::LeafOpening],
        now_ms: u64,
    ) -> Result<Result<(), ChallengeError>, ErrorCode> {
        let pending = self.open_for(account, challenge, now_ms)?;
        let Some(commit) = &pending.commit else { return Err(ErrorCode::ChallengeOutOfOrder) };
        match (pending.memory, memory) {
            (None, false) => {
                if !challenge::well_formed(pending.n, opened) {
                    return Err(ErrorCode::ChallengeAnswerInvalid);
                }
                Ok(challenge::verify_opening(&pending.seed, pending.n, &commit.commitment, &commit.open_seed, opened))
            }
            (Some((words_log2, passes)), true) => {
                if !memory::well_formed(words_log2, opened) {
                    return Err(ErrorCode::ChallengeAnswerInvalid);
                }
                Ok(memory::verify_opening(&pending.seed, words_log2, passes, &commit.commitment, &commit.open_seed, opened))
            }
            _ => Err(ErrorCode::ChallengeAnswerInvalid),
        }
    }

    fn open_for(&self, account: AccountId, challenge: u64, now_ms: u64) -> Result<&Pending, ErrorCode> {
        self.pending.get(&challenge).filter(|p| p.owner == account && p.expires_at_ms() > now_ms).ok_or(ErrorCode::UnknownChallenge)
    }
}
