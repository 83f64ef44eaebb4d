//! Hardware challenges (docs/market-rules.md "Verified hardware"): the
//! sequencer issues them (at registration, then at random times while a GPU
//! is idle and its owner connected), expires those not answered in time,
//! and checks each answer before journaling it. The seeds come from the
//! operating system's randomness and are journaled; when to challenge is
//! this process's own schedule, not market state (a restart draws a new one).

use gpux_engine::{AccountId, ChallengeOutcome, EventKind, GpuId};
use gpux_market::JournalEntry;
use gpux_protocol::ServerMessage;

use super::{error, Sequencer};
use gpux_gateway::link::{ChallengeRequest, ConnectionId};

/// The mean time between two challenges of an idle GPU (default).
pub const CHALLENGE_INTERVAL_MS_DEFAULT: u64 = 6 * gpux_engine::time::MS_PER_HOUR;

/// When each GPU is next due for a challenge.
#[derive(Default)]
pub(super) struct Schedule {
    /// Mean time between challenges; each wait is drawn uniformly from half
    /// to one and a half of it.
    pub interval_ms: u64,
    due: std::collections::BTreeMap<GpuId, u64>,
    /// GPUs registered since the last check: challenged at once.
    registered: Vec<GpuId>,
    checked_ms: u64,
}

fn random_bytes() -> [u8; 32] {
    let mut bytes = [0u8; 32];
    getrandom::fill(&mut bytes).expect("the operating system's randomness");
    bytes
}

impl Schedule {
    fn wait_ms(&self) -> u64 {
        let draw = u64::from_le_bytes(random_bytes()[..8].try_into().expect("8 bytes"));
        self.interval_ms / 2 + draw % self.interval_ms.max(1)
    }
}

impl Sequencer {
    /// Sets the mean time between an idle GPU's challenges and schedules
    /// every registered GPU within it (`--challenge-interval-ms`).
    pub fn set_challenge_interval_ms(&mut self, interval_ms: u64) {
        self.challenges.interval_ms = interval_ms.max(1);
        let now = self.market.clock_ms();
        for gpu in (0..self.market.engine().gpu_count()).map(GpuId) {
            let due = now + self.challenges.wait_ms();
            self.challenges.due.insert(gpu, due);
        }
    }

    /// Notes GPUs registered by an entry's events, and GPUs whose compute
    /// challenge was just answered and whose memory bandwidth is next: both
    /// are challenged at the next check.
    pub(super) fn note_registrations(&mut self, events: &[gpux_engine::Event]) {
        for event in events {
            match event.kind {
                EventKind::GpuRegistered { gpu, .. } => self.challenges.registered.push(gpu),
                EventKind::GpuChallenged { gpu, outcome: ChallengeOutcome::Passed | ChallengeOutcome::TooSlow, .. }
                    if self.market.engine().challenge_target(gpu).is_some_and(|t| t.memory_next) =>
                {
                    self.challenges.registered.push(gpu)
                }
                _ => {}
            }
        }
    }

    /// Issues the challenges due and expires the overdue ones; called once
    /// per batch, does its work at most once a second (and at once for new
    /// registrations).
    pub(super) fn run_challenges(&mut self) {
        let now = self.market.clock_ms();
        for challenge in self.market.challenges().expired(now) {
            if self.journal(JournalEntry::ChallengeExpired { at_ms: now, challenge }).is_none() {
                return;
            }
        }
        let mut candidates = std::mem::take(&mut self.challenges.registered);
        if now >= self.challenges.checked_ms + 1_000 {
            self.challenges.checked_ms = now;
            candidates.extend(self.challenges.due.iter().filter(|(_, due)| **due <= now).map(|(gpu, _)| *gpu));
        }
        for gpu in candidates {
            let next = now + self.challenges.wait_ms();
            self.challenges.due.insert(gpu, next);
            let Some(target) = self.market.engine().challenge_target(gpu) else { continue };
            let entry = match (target.memory_next, target.memory, target.n) {
                (true, Some((words_log2, passes)), _) => {
                    JournalEntry::MemoryChallengeIssued { at_ms: now, gpu, seed: random_bytes(), words_log2, passes }
                }
                // A side from a journal's older listing has no opening the
                // market can check: such a class is not challenged.
                (_, _, Some(n)) if gpux_protocol::challenge::n_valid(n) => {
                    JournalEntry::ChallengeIssued { at_ms: now, gpu, seed: random_bytes(), n }
                }
                _ => continue,
            };
            let connected = self.sessions.is_present(target.owner);
            if !target.idle || !connected || self.market.challenges().in_flight(gpu) {
                continue;
            }
            self.metrics.challenges_issued.inc();
            if self.journal(entry).is_none() {
                return;
            }
        }
    }

    pub(super) fn challenge(&mut self, connection: ConnectionId, id: u64, request: ChallengeRequest) {
        let Some(account) = self.account(connection) else { return };
        let reply = match request {
            ChallengeRequest::Commit { challenge, commitment } => match self.commit(account, id, challenge, commitment) {
                Some(reply) => reply,
                None => return,
            },
            ChallengeRequest::Opening { challenge, leaves, memory } => {
                let now = self.market.clock_ms();
                let checked = self.market.challenges().check_opening(account, challenge, memory, &leaves, now);
                match self.answered(account, id, challenge, checked) {
                    Some(reply) => reply,
                    None => return,
                }
            }
        };
        self.reply(connection, reply);
    }

    /// An opening's verdict, journaled; or the error that kept it from one.
    /// None: the batch failed.
    fn answered(
        &mut self,
        account: AccountId,
        id: u64,
        challenge: u64,
        checked: Result<Result<(), gpux_protocol::challenge::ChallengeError>, gpux_protocol::ErrorCode>,
    ) -> Option<ServerMessage> {
        match checked {
            Err(code) => Some(error(Some(id), code)),
            Ok(verdict) => {
                let entry = JournalEntry::ChallengeAnswered { at_ms: self.market.clock_ms(), account, challenge, verdict };
                let (journal_seq, _) = self.journal(entry)?;
                Some(ServerMessage::Ack { id, journal_seq, order: None })
            }
        }
    }

    /// A commitment: journaled with the seed of the rows to open, which the
    /// reply names. None: the batch failed.
    fn commit(&mut self, account: AccountId, id: u64, challenge: u64, commitment: [u8; 32]) -> Option<ServerMessage> {
        let now = self.market.clock_ms();
        if let Err(code) = self.market.challenges().check_commit(account, challenge, now) {
            return Some(error(Some(id), code));
        }
        let entry = JournalEntry::ChallengeCommitted { at_ms: now, account, challenge, commitment, open_seed: random_bytes() };
        let (journal_seq, _) = self.journal(entry)?;
        let rows = self.market.challenges().get(challenge).map(|p| p.rows_to_open()).unwrap_or_default();
        Some(ServerMessage::ChallengeRows { id, journal_seq, challenge, rows })
    }
}
