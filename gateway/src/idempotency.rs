//! The answers of REST writes by idempotency key (docs/rest.md "Writes"):
//! a write retried with the same `Idempotency-Key` by the same signing key
//! is answered from here instead of being applied again, for
//! [`WINDOW_MS`]. Per node and in memory: a restarted exchange or another
//! node of a cluster does not know the key (the docs say what a client does
//! then).
//!
//! Bounded: each signing key keeps its [`PER_SIGNER_MAX`] latest answers
//! and each participant (an account and its sub-accounts, every key of
//! them) its [`PER_PARTICIPANT_MAX`] (their own oldest go first); all
//! together at most [`ENTRIES_MAX`] answers and [`BYTES_MAX`] bytes. When
//! those are full, the participant that keeps the most answers forgets its
//! oldest answered one for a new write of another, so a participant is
//! refused (`Full`) only while every answer it could give up is still in
//! flight or it keeps the most itself; a write is never applied without its
//! key being kept.

use std::collections::{BTreeSet, HashMap, VecDeque};

use gpux_engine::AccountId;

/// How long an answer is kept for a retry: an hour.
pub const WINDOW_MS: u64 = 60 * 60 * 1_000;
pub use crate::limits::{
    IDEMPOTENCY_BYTES_MAX as BYTES_MAX, IDEMPOTENCY_ENTRIES_MAX as ENTRIES_MAX, IDEMPOTENCY_KEY_CHARS_MAX as KEY_CHARS_MAX,
    IDEMPOTENCY_PER_PARTICIPANT_MAX as PER_PARTICIPANT_MAX, IDEMPOTENCY_PER_SIGNER_MAX as PER_SIGNER_MAX,
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
    /// No room: the signer's, the participant's or the table's answers are
    /// all in flight, or the table is full and this participant keeps the
    /// most. Refuse, apply nothing.
    Full,
}

struct Entry {
    fingerprint: [u8; 32],
    created_ms: u64,
    participant: AccountId,
    answer: Option<Stored>,
}

type Signer = [u8; 32];
type Key = (Signer, String);

#[derive(Default)]
pub struct Idempotency {
    entries: HashMap<Key, Entry>,
    /// Each signer's keys, oldest first.
    by_signer: HashMap<Signer, VecDeque<String>>,
    /// Each participant's keys, oldest first.
    by_participant: HashMap<AccountId, VecDeque<Key>>,
    /// Participants by how many answers they keep (the heaviest last).
    by_count: BTreeSet<(usize, AccountId)>,
    /// Every entry by creation, for expiry (stale items are skipped).
    by_age: VecDeque<(u64, Signer, String)>,
    bytes: usize,
}

/// Whether a key is one: 1 to [`KEY_CHARS_MAX`] of `A-Z a-z 0-9 - _ . :`.
pub fn valid_key(key: &str) -> bool {
    (1..=KEY_CHARS_MAX).contains(&key.len()) && key.bytes().all(|b| b.is_ascii_alphanumeric() || b"-_.:".contains(&b))
}

impl Idempotency {
    /// A write by `signer`, a key of `participant`'s, under `key`, whose
    /// method, path and body hash to `fingerprint`, at `now_ms` (a
    /// monotonic clock).
    pub fn begin(&mut self, participant: AccountId, signer: Signer, key: &str, fingerprint: [u8; 32], now_ms: u64) -> Begin {
        self.expire(now_ms);
        if let Some(entry) = self.entries.get(&(signer, key.to_string())) {
            return match &entry.answer {
                _ if entry.fingerprint != fingerprint => Begin::Reused,
                Some(stored) => Begin::Replay(stored.clone()),
                None => Begin::InProgress,
            };
        }
        let signer_held = self.by_signer.get(&signer).map_or(0, VecDeque::len);
        if signer_held >= PER_SIGNER_MAX && !self.drop_oldest_answered_of_signer(signer) {
            // All of them in flight: as many writes as its share holds.
            return Begin::Full;
        }
        if self.held(participant) >= PER_PARTICIPANT_MAX && !self.drop_oldest_answered_of(participant) {
            return Begin::Full;
        }
        while self.entries.len() >= ENTRIES_MAX || self.bytes >= BYTES_MAX {
            // The participant that keeps the most gives up its oldest
            // answer; one that keeps no more than this one is not made to.
            let heaviest = self.by_count.last().map(|&(_, heaviest)| heaviest).filter(|&h| self.held(h) > self.held(participant));
            let dropped = match heaviest {
                Some(heaviest) => self.drop_oldest_answered_of(heaviest),
                None => false,
            };
            if !dropped {
                return Begin::Full;
            }
        }
        let full_key = (signer, key.to_string());
        self.entries.insert(full_key.clone(), Entry { fingerprint, created_ms: now_ms, participant, answer: None });
        self.by_signer.entry(signer).or_default().push_back(key.to_string());
        let before = self.held(participant);
        self.by_participant.entry(participant).or_default().push_back(full_key);
        self.recount(participant, before);
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

    /// Answers `participant` keeps now.
    pub fn held(&self, participant: AccountId) -> usize {
        self.by_participant.get(&participant).map_or(0, VecDeque::len)
    }

    fn recount(&mut self, participant: AccountId, before: usize) {
        self.by_count.remove(&(before, participant));
        let now = self.held(participant);
        if now > 0 {
            self.by_count.insert((now, participant));
        }
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

    fn answered(&self, key: &Key) -> bool {
        self.entries.get(key).is_some_and(|e| e.answer.is_some())
    }

    /// Drops `signer`'s oldest answered entry; false when all are in flight.
    fn drop_oldest_answered_of_signer(&mut self, signer: Signer) -> bool {
        let Some(keys) = self.by_signer.get(&signer) else { return false };
        let oldest = keys.iter().find(|key| self.answered(&(signer, (*key).clone()))).cloned();
        match oldest {
            Some(key) => {
                self.remove(signer, &key);
                true
            }
            None => false,
        }
    }

    /// Drops `participant`'s oldest answered entry; false when all are in flight.
    fn drop_oldest_answered_of(&mut self, participant: AccountId) -> bool {
        let Some(keys) = self.by_participant.get(&participant) else { return false };
        let oldest = keys.iter().find(|key| self.answered(key)).cloned();
        match oldest {
            Some((signer, key)) => {
                self.remove(signer, &key);
                true
            }
            None => false,
        }
    }

    fn remove(&mut self, signer: Signer, key: &str) {
        let full_key = (signer, key.to_string());
        let Some(entry) = self.entries.remove(&full_key) else { return };
        self.bytes -= entry.answer.map_or(0, |a| a.body.len());
        if let Some(keys) = self.by_signer.get_mut(&signer) {
            keys.retain(|k| k != key);
            if keys.is_empty() {
                self.by_signer.remove(&signer);
            }
        }
        let before = self.held(entry.participant);
        if let Some(keys) = self.by_participant.get_mut(&entry.participant) {
            keys.retain(|k| *k != full_key);
            if keys.is_empty() {
                self.by_participant.remove(&entry.participant);
            }
        }
        self.recount(entry.participant, before);
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

    /// Each signer its own participant, numbered by its first byte.
    fn of(signer: [u8; 32]) -> AccountId {
        AccountId(signer[0] as u32)
    }

    #[test]
    fn a_retry_is_answered_again_and_another_write_under_the_key_is_refused() {
        let mut table = Idempotency::default();
        let (alice, bob) = ([1; 32], [2; 32]);
        assert_eq!(table.begin(of(alice), alice, "k1", [7; 32], 0), Begin::New);
        assert_eq!(table.begin(of(alice), alice, "k1", [7; 32], 1), Begin::InProgress);
        table.finish(alice, "k1", answer("{\"journal_seq\":3}"));
        assert_eq!(table.begin(of(alice), alice, "k1", [7; 32], 2), Begin::Replay(stored("{\"journal_seq\":3}")));
        assert_eq!(table.begin(of(alice), alice, "k1", [8; 32], 3), Begin::Reused);
        // Keys are each signer's own.
        assert_eq!(table.begin(of(bob), bob, "k1", [8; 32], 4), Begin::New);
        // A write that never reached the exchange is forgotten: the retry runs.
        table.finish(bob, "k1", None);
        assert_eq!(table.begin(of(bob), bob, "k1", [8; 32], 5), Begin::New);
    }

    #[test]
    fn answers_expire_after_the_window_and_in_flight_writes_do_not() {
        let mut table = Idempotency::default();
        let alice = [1; 32];
        assert_eq!(table.begin(of(alice), alice, "done", [1; 32], 0), Begin::New);
        table.finish(alice, "done", answer("a"));
        assert_eq!(table.begin(of(alice), alice, "slow", [2; 32], 10), Begin::New);
        assert_eq!(table.begin(of(alice), alice, "done", [1; 32], WINDOW_MS - 1), Begin::Replay(stored("a")));
        assert_eq!(table.begin(of(alice), alice, "other", [3; 32], WINDOW_MS + 20), Begin::New);
        assert_eq!(table.begin(of(alice), alice, "done", [1; 32], WINDOW_MS + 21), Begin::New, "expired: a new write");
        assert_eq!(table.begin(of(alice), alice, "slow", [2; 32], WINDOW_MS + 22), Begin::InProgress);
        assert_eq!(table.bytes, 0);
    }

    #[test]
    fn a_signer_keeps_its_latest_answers_and_cannot_fill_the_table() {
        let mut table = Idempotency::default();
        let alice = [1; 32];
        for n in 0..PER_SIGNER_MAX + 10 {
            assert_eq!(table.begin(of(alice), alice, &format!("k{n}"), [0; 32], n as u64), Begin::New, "{n}");
            table.finish(alice, &format!("k{n}"), answer("x"));
        }
        assert_eq!(table.len(), PER_SIGNER_MAX);
        assert_eq!(table.begin(of(alice), alice, "k9", [0; 32], 5_000), Begin::New, "its oldest went");
        assert!(matches!(table.begin(of(alice), alice, "k2000", [1; 32], 5_001), Begin::New));
        // A signer whose every kept write is in flight gets no more.
        let bob = [2; 32];
        for n in 0..PER_SIGNER_MAX {
            assert_eq!(table.begin(of(bob), bob, &format!("k{n}"), [0; 32], 6_000), Begin::New);
        }
        assert_eq!(table.begin(of(bob), bob, "one-more", [0; 32], 6_001), Begin::Full);
        assert_eq!(table.begin(of(alice), alice, "k3000", [0; 32], 6_002), Begin::New, "others go on");
    }

    /// Issue 61: two accounts with 33 keys each filled the whole table and
    /// every account's writes were refused for up to an hour. A
    /// participant's keys together keep `PER_PARTICIPANT_MAX` answers.
    #[test]
    fn a_participants_keys_together_keep_its_share_and_cannot_fill_the_table() {
        let mut table = Idempotency::default();
        let aggregator = AccountId(7);
        let signers = (PER_PARTICIPANT_MAX / PER_SIGNER_MAX) * 4;
        for signer in 0..signers as u8 {
            for n in 0..PER_SIGNER_MAX / 4 + 10 {
                assert_eq!(table.begin(aggregator, [signer; 32], &n.to_string(), [0; 32], 0), Begin::New);
                table.finish([signer; 32], &n.to_string(), answer("x"));
            }
        }
        assert_eq!(table.held(aggregator), PER_PARTICIPANT_MAX, "its own oldest went");
        assert_eq!(table.len(), PER_PARTICIPANT_MAX);
        assert_eq!(table.begin(AccountId(9), [200; 32], "k", [0; 32], 1), Begin::New, "another participant writes");
    }

    #[test]
    fn a_full_table_takes_room_from_the_participant_that_keeps_the_most() {
        let mut table = Idempotency::default();
        // Each participant's share, from distinct signers, until the table is full.
        let participants = ENTRIES_MAX / PER_PARTICIPANT_MAX;
        for p in 0..participants {
            for s in 0..PER_PARTICIPANT_MAX / PER_SIGNER_MAX {
                let signer = [(p * 8 + s) as u8; 32];
                for n in 0..PER_SIGNER_MAX {
                    assert_eq!(table.begin(AccountId(p as u32), signer, &n.to_string(), [0; 32], 0), Begin::New);
                    table.finish(signer, &n.to_string(), answer("x"));
                }
            }
        }
        assert_eq!(table.len(), ENTRIES_MAX);
        // A newcomer is answered: the heaviest forgets its oldest answer.
        let newcomer = AccountId(1_000);
        assert_eq!(table.begin(newcomer, [250; 32], "k", [0; 32], 1), Begin::New);
        assert_eq!(table.len(), ENTRIES_MAX);
        assert_eq!(table.held(newcomer), 1);
        // Kept answers still replay.
        assert_eq!(table.begin(AccountId(0), [0; 32], "1000", [0; 32], 1), Begin::Replay(stored("x")));
        // The one that gave it up takes it back from whoever keeps the most now.
        let gave = (0..participants as u32).map(AccountId).find(|&p| table.held(p) < PER_PARTICIPANT_MAX).expect("one gave up");
        assert_eq!(table.begin(gave, [251; 32], "back", [0; 32], 2), Begin::New);
        assert_eq!(table.held(gave), PER_PARTICIPANT_MAX);
        let short: Vec<AccountId> = (0..participants as u32).map(AccountId).filter(|&p| table.held(p) < PER_PARTICIPANT_MAX).collect();
        assert_eq!(short.len(), 1, "one other participant gave one up: {short:?}");
        assert_eq!(table.begin(newcomer, [250; 32], "k2", [0; 32], WINDOW_MS), Begin::New, "room once answers expire");
    }

    #[test]
    fn the_whole_table_full_of_writes_in_flight_refuses_new_ones() {
        let mut table = Idempotency::default();
        for p in 0..(ENTRIES_MAX / PER_PARTICIPANT_MAX) as u32 {
            for s in 0..(PER_PARTICIPANT_MAX / PER_SIGNER_MAX) as u32 {
                let signer = [(p * 8 + s) as u8; 32];
                for n in 0..PER_SIGNER_MAX {
                    assert_eq!(table.begin(AccountId(p), signer, &n.to_string(), [0; 32], 0), Begin::New);
                }
            }
        }
        assert_eq!(table.begin(AccountId(1_000), [250; 32], "k", [0; 32], 1), Begin::Full, "nothing answered to give up");
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
