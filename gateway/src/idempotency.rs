//! The answers of REST writes by idempotency key (docs/rest.md "Writes"):
//! a write retried with the same `Idempotency-Key` by the same signing key
//! is answered from here instead of being applied again, for
//! [`WINDOW_MS`]. Per node and in memory: a restarted exchange or another
//! node of a cluster does not know the key (the docs say what a client does
//! then).
//!
//! Bounded: each signing key keeps its [`PER_SIGNER_MAX`] latest answers
//! (its own oldest go first), and all signers together at most
//! [`ENTRIES_MAX`] answers and [`BYTES_MAX`] bytes; past that a new write is
//! refused until answers expire, never applied without its key being kept.

use std::collections::{HashMap, VecDeque};

/// How long an answer is kept for a retry: an hour.
pub const WINDOW_MS: u64 = 60 * 60 * 1_000;
pub use crate::limits::{
    IDEMPOTENCY_BYTES_MAX as BYTES_MAX, IDEMPOTENCY_ENTRIES_MAX as ENTRIES_MAX, IDEMPOTENCY_KEY_CHARS_MAX as KEY_CHARS_MAX,
    IDEMPOTENCY_PER_SIGNER_MAX as PER_SIGNER_MAX,
};

/// A write's answer as it was sent: HTTP status and body.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Stored {
    pub status: u16,
    pub body: String,
}

/// What to do with a write that carries an idempotency key.
#[derive(Debug, PartialEq, Eq)]
pub enum Begin {
    /// First seen: apply it, then [`Idempotency::finish`].
    New,
    /// Answered before: send this again.
    Replay(Stored),
    /// The same write is being answered now.
    InProgress,
    /// The key was used for another write (method, path or body differ).
    Reused,
    /// The table is full of live answers: refuse, apply nothing.
    Full,
}

struct Entry {
    fingerprint: [u8; 32],
    created_ms: u64,
    answer: Option<Stored>,
}

type Signer = [u8; 32];

#[derive(Default)]
pub struct Idempotency {
    entries: HashMap<(Signer, String), Entry>,
    /// Each signer's keys, oldest first.
    by_signer: HashMap<Signer, VecDeque<String>>,
    /// Every entry by creation, for expiry (stale items are skipped).
    by_age: VecDeque<(u64, Signer, String)>,
    bytes: usize,
}

/// Whether a key is one: 1 to [`KEY_CHARS_MAX`] of `A-Z a-z 0-9 - _ . :`.
pub fn valid_key(key: &str) -> bool {
    (1..=KEY_CHARS_MAX).contains(&key.len()) && key.bytes().all(|b| b.is_ascii_alphanumeric() || b"-_.:".contains(&b))
}

impl Idempotency {
    /// A write by `signer` under `key`, whose method, path and body hash to
    /// `fingerprint`, at `now_ms` (a monotonic clock).
    pub fn begin(&mut self, signer: Signer, key: &str, fingerprint: [u8; 32], now_ms: u64) -> Begin {
        self.expire(now_ms);
        if let Some(entry) = self.entries.get(&(signer, key.to_string())) {
            return match &entry.answer {
                _ if entry.fingerprint != fingerprint => Begin::Reused,
                Some(stored) => Begin::Replay(stored.clone()),
                None => Begin::InProgress,
            };
        }
        let held = self.by_signer.get(&signer).map_or(0, VecDeque::len);
        if held >= PER_SIGNER_MAX && !self.drop_oldest_answered(signer) {
            // All of them in flight: as many writes as the table holds.
            return Begin::Full;
        }
        if self.entries.len() >= ENTRIES_MAX || self.bytes >= BYTES_MAX {
            return Begin::Full;
        }
        self.entries.insert((signer, key.to_string()), Entry { fingerprint, created_ms: now_ms, answer: None });
        self.by_signer.entry(signer).or_default().push_back(key.to_string());
        self.by_age.push_back((now_ms, signer, key.to_string()));
        Begin::New
    }

    /// The answer of a write begun with [`Begin::New`]; `None` forgets the
    /// key (the write never reached the exchange, or its outcome is not
    /// known), so a retry is applied.
    pub fn finish(&mut self, signer: Signer, key: &str, answer: Option<Stored>) {
        match answer {
            Some(stored) => {
                if let Some(entry) = self.entries.get_mut(&(signer, key.to_string())) {
                    self.bytes += stored.body.len();
                    entry.answer = Some(stored);
                }
            }
            None => self.remove(signer, key),
        }
    }

    /// Answers kept now (for tests and metrics).
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    fn expire(&mut self, now_ms: u64) {
        while let Some((created_ms, signer, key)) = self.by_age.front().cloned() {
            if now_ms.saturating_sub(created_ms) < WINDOW_MS {
                break;
            }
            self.by_age.pop_front();
            let still = self.entries.get(&(signer, key.clone())).is_some_and(|e| e.created_ms == created_ms && e.answer.is_some());
            if still {
                self.remove(signer, &key);
            }
        }
    }

    /// Drops `signer`'s oldest answered entry; false when all are in flight.
    fn drop_oldest_answered(&mut self, signer: Signer) -> bool {
        let Some(keys) = self.by_signer.get(&signer) else { return false };
        let oldest = keys.iter().find(|key| self.entries.get(&(signer, (*key).clone())).is_some_and(|e| e.answer.is_some())).cloned();
        match oldest {
            Some(key) => {
                self.remove(signer, &key);
                true
            }
            None => false,
        }
    }

    fn remove(&mut self, signer: Signer, key: &str) {
        if let Some(entry) = self.entries.remove(&(signer, key.to_string())) {
            self.bytes -= entry.answer.map_or(0, |a| a.body.len());
        }
        if let Some(keys) = self.by_signer.get_mut(&signer) {
            keys.retain(|k| k != key);
            if keys.is_empty() {
                self.by_signer.remove(&signer);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stored(body: &str) -> Stored {
        Stored { status: 200, body: body.to_string() }
    }

    fn answer(body: &str) -> Option<Stored> {
        Some(stored(body))
    }

    #[test]
    fn a_retry_is_answered_again_and_another_write_under_the_key_is_refused() {
        let mut table = Idempotency::default();
        let (alice, bob) = ([1; 32], [2; 32]);
        assert_eq!(table.begin(alice, "k1", [7; 32], 0), Begin::New);
        assert_eq!(table.begin(alice, "k1", [7; 32], 1), Begin::InProgress);
        table.finish(alice, "k1", answer("{\"journal_seq\":3}"));
        assert_eq!(table.begin(alice, "k1", [7; 32], 2), Begin::Replay(stored("{\"journal_seq\":3}")));
        assert_eq!(table.begin(alice, "k1", [8; 32], 3), Begin::Reused);
        // Keys are each signer's own.
        assert_eq!(table.begin(bob, "k1", [8; 32], 4), Begin::New);
        // A write that never reached the exchange is forgotten: the retry runs.
        table.finish(bob, "k1", None);
        assert_eq!(table.begin(bob, "k1", [8; 32], 5), Begin::New);
    }

    #[test]
    fn answers_expire_after_the_window_and_in_flight_writes_do_not() {
        let mut table = Idempotency::default();
        let alice = [1; 32];
        assert_eq!(table.begin(alice, "done", [1; 32], 0), Begin::New);
        table.finish(alice, "done", answer("a"));
        assert_eq!(table.begin(alice, "slow", [2; 32], 10), Begin::New);
        assert_eq!(table.begin(alice, "done", [1; 32], WINDOW_MS - 1), Begin::Replay(stored("a")));
        assert_eq!(table.begin(alice, "other", [3; 32], WINDOW_MS + 20), Begin::New);
        assert_eq!(table.begin(alice, "done", [1; 32], WINDOW_MS + 21), Begin::New, "expired: a new write");
        assert_eq!(table.begin(alice, "slow", [2; 32], WINDOW_MS + 22), Begin::InProgress);
        assert_eq!(table.bytes, 0);
    }

    #[test]
    fn a_signer_keeps_its_latest_answers_and_cannot_fill_the_table() {
        let mut table = Idempotency::default();
        let alice = [1; 32];
        for n in 0..PER_SIGNER_MAX + 10 {
            assert_eq!(table.begin(alice, &format!("k{n}"), [0; 32], n as u64), Begin::New, "{n}");
            table.finish(alice, &format!("k{n}"), answer("x"));
        }
        assert_eq!(table.len(), PER_SIGNER_MAX);
        assert_eq!(table.begin(alice, "k9", [0; 32], 5_000), Begin::New, "its oldest went");
        assert!(matches!(table.begin(alice, "k2000", [1; 32], 5_001), Begin::New));
        // A signer whose every kept write is in flight gets no more.
        let bob = [2; 32];
        for n in 0..PER_SIGNER_MAX {
            assert_eq!(table.begin(bob, &format!("k{n}"), [0; 32], 6_000), Begin::New);
        }
        assert_eq!(table.begin(bob, "one-more", [0; 32], 6_001), Begin::Full);
        assert_eq!(table.begin(alice, "k3000", [0; 32], 6_002), Begin::New, "others go on");
    }

    #[test]
    fn the_whole_table_full_refuses_new_writes_and_replays_kept_ones() {
        let mut table = Idempotency::default();
        for signer in 0..(ENTRIES_MAX / PER_SIGNER_MAX) as u8 {
            for n in 0..PER_SIGNER_MAX {
                assert_eq!(table.begin([signer; 32], &n.to_string(), [0; 32], 0), Begin::New);
                table.finish([signer; 32], &n.to_string(), answer("x"));
            }
        }
        assert_eq!(table.begin([255; 32], "k", [0; 32], 1), Begin::Full);
        assert_eq!(table.begin([0; 32], "5", [0; 32], 1), Begin::Replay(stored("x")));
        assert_eq!(table.begin([255; 32], "k", [0; 32], WINDOW_MS), Begin::New, "room once answers expire");
    }

    #[test]
    fn keys_are_short_and_plain() {
        for good in ["a", "order-2026-12-06T10:00:00.123", "0f3c_9", &"x".repeat(64)] {
            assert!(valid_key(good), "{good}");
        }
        for bad in ["", "with space", "ü", &"x".repeat(65), "a/b"] {
            assert!(!valid_key(bad), "{bad}");
        }
    }
}
