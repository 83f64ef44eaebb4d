//! Hardware challenges as the exchange's sequencer issues them
//! (docs/market-rules.md "Verified hardware"): every GPU as it is listed,
//! its memory bandwidth right after its first answer, then the two in turn
//! at random times while it is idle. The answers are real products and
//! real passes over memory, committed and opened through the market's
//! checks; only the round trip is drawn: 1 to 4 ms for an honest GPU, 8 to
//! 30 ms for a slower card than the model it claims (the demo class's
//! minimum of 10 MFLOP/s allows 6.5 ms for the simulator's `n` of 32, its
//! 10 MB/s 5.3 ms for the simulator's 2^10 words and 4 passes). A host that
//! is down does not answer, and its challenge expires.

use gpux_market::JournalEntry;
use gpux_protocol::challenge::{matrices, product};
use gpux_protocol::memory::{CpuProof, Params};
use rand::RngCore;

use super::*;

/// The simulator's matrices: smaller than the demo class's 256, so a week of
/// challenges costs seconds (the rate follows `n`: see the module's note).
pub(super) const CHALLENGE_N: u32 = 32;
/// The simulator's memory challenge: 2^10 words, 4 passes (53 KB moved),
/// smaller than the demo class's for the same reason.
const MEMORY_WORDS_LOG2: u32 = 10;
const MEMORY_PASSES: u32 = 4;
/// The mean time between two challenges of an idle GPU (the exchange's default).
const CHALLENGE_INTERVAL_MS: u64 = 6 * MS_PER_HOUR;

impl Sim {
    /// The kind a supplier's challenges are counted under.
    fn hardware_kind(&self, supplier: usize) -> Option<SupplierCheat> {
        self.population.suppliers[supplier].cheat.filter(|cheat| cheat.is_hardware())
    }

    /// Counts the suppliers of each kind and schedules every GPU's first
    /// challenge within a minute of its listing.
    pub(super) fn schedule_first_challenges(&mut self) {
        for supplier in 0..self.suppliers.len() {
            let kind = self.hardware_kind(supplier);
            self.metrics.challenges.entry(kind).or_default().suppliers += 1;
            for gpu in self.suppliers[supplier].gpus.clone() {
                let at = START_MS + self.challenge_rng.random_range(0..60_000);
                self.schedule(at, Action::Challenge(gpu));
            }
        }
    }

    /// Challenges a GPU: its memory if that is next, else its compute;
    /// `periodic` schedules the next one.
    pub(super) fn challenge_gpu(&mut self, gpu: GpuId, periodic: bool) {
        if periodic {
            let interval = CHALLENGE_INTERVAL_MS / 2 + self.challenge_rng.random_range(0..CHALLENGE_INTERVAL_MS);
            self.schedule(self.now_ms + interval, Action::Challenge(gpu));
        }
        let supplier = self.gpu_supplier[gpu.0 as usize] as usize;
        let Some(target) = self.exchange.engine().challenge_target(gpu) else { return };
        // Rejected GPUs are not challenged again; busy or unreachable ones wait.
        if target.n.is_none() || !target.idle || self.suppliers[supplier].is_down || self.exchange.market().challenges().in_flight(gpu) {
            return;
        }
        let mut seed = [0u8; 32];
        self.challenge_rng.fill_bytes(&mut seed);
        let mut events = Vec::new();
        let at_ms = self.now_ms;
        let entry = match target.memory_next {
            true => JournalEntry::MemoryChallengeIssued { at_ms, gpu, seed, words_log2: MEMORY_WORDS_LOG2, passes: MEMORY_PASSES },
            false => JournalEntry::ChallengeIssued { at_ms, gpu, seed, n: CHALLENGE_N },
        };
        self.exchange.challenge(entry, &mut events);
        self.observe(&events);
        let challenge = self.exchange.market().challenges().latest();
        let kind = self.hardware_kind(supplier);
        self.metrics.challenges.entry(kind).or_default().issued += 1;
        let round_trip_ms = if kind == Some(SupplierCheat::SlowGpu) {
            self.challenge_rng.random_range(8..=30)
        } else {
            self.challenge_rng.random_range(1..=4)
        };
        self.schedule(self.now_ms + round_trip_ms, Action::ChallengeAnswer(challenge, gpu));
    }

    pub(super) fn answer_challenge(&mut self, challenge: u64, gpu: GpuId) {
        let supplier = self.gpu_supplier[gpu.0 as usize] as usize;
        let Some(pending) = self.exchange.market().challenges().get(challenge).cloned() else { return };
        if self.suppliers[supplier].is_down {
            self.schedule(pending.expires_at_ms(), Action::ChallengeExpire(challenge));
            return;
        }
        let account = self.suppliers[supplier].account;
        if let Some((words_log2, passes)) = pending.memory {
            return self.answer_memory_challenge(challenge, account, &pending.seed, words_log2, passes);
        }
        let (a, b) = matrices(&pending.seed, pending.n);
        let mut words = product(&a, &b, pending.n);
        if self.hardware_kind(supplier) == Some(SupplierCheat::WrongProduct) {
            // Plausible but wrong (a card that cannot keep the precision):
            // every entry off by one.
            words.iter_mut().for_each(|word| *word = word.wrapping_add(1));
        }
        let answer = CpuProof::new(words);
        let now = self.now_ms;
        self.exchange.market().challenges().check_commit(account, challenge, now).expect("the simulator commits in turn and in time");
        let mut open_seed = [0u8; 32];
        self.challenge_rng.fill_bytes(&mut open_seed);
        let mut events = Vec::new();
        let commit = JournalEntry::ChallengeCommitted { at_ms: now, account, challenge, commitment: answer.root(), open_seed };
        self.exchange.challenge(commit, &mut events);
        let asked = self.exchange.market().challenges().get(challenge).expect("committed").rows_to_open();
        let opened = answer.open(&asked);
        let verdict =
            self.exchange.market().challenges().check_opening(account, challenge, false, &opened, now).expect("a well-formed opening");
        self.exchange.challenge(JournalEntry::ChallengeAnswered { at_ms: now, account, challenge, verdict }, &mut events);
        self.observe(&events);
    }

    /// The memory challenge answered honestly (the hardware cheaters lie
    /// about their model, which shows in the round trip, not the result).
    fn answer_memory_challenge(&mut self, challenge: u64, account: gpux_engine::AccountId, seed: &[u8; 32], words_log2: u32, passes: u32) {
        let proof = CpuProof::new(Params::new(seed, words_log2, passes).compute());
        let now = self.now_ms;
        self.exchange.market().challenges().check_commit(account, challenge, now).expect("the simulator commits in turn and in time");
        let mut open_seed = [0u8; 32];
        self.challenge_rng.fill_bytes(&mut open_seed);
        let mut events = Vec::new();
        let commit = JournalEntry::ChallengeCommitted { at_ms: now, account, challenge, commitment: proof.root(), open_seed };
        self.exchange.challenge(commit, &mut events);
        let asked = self.exchange.market().challenges().get(challenge).expect("committed").rows_to_open();
        let verdict = self
            .exchange
            .market()
            .challenges()
            .check_opening(account, challenge, true, &proof.open(&asked), now)
            .expect("a well-formed opening");
        self.exchange.challenge(JournalEntry::ChallengeAnswered { at_ms: now, account, challenge, verdict }, &mut events);
        self.observe(&events);
    }

    pub(super) fn expire_challenge(&mut self, challenge: u64) {
        if self.exchange.market().challenges().get(challenge).is_none_or(|p| p.expires_at_ms() > self.now_ms) {
            return;
        }
        let mut events = Vec::new();
        self.exchange.challenge(JournalEntry::ChallengeExpired { at_ms: self.now_ms, challenge }, &mut events);
        self.observe(&events);
    }

    /// A challenge's result, against what the simulator knows the supplier is.
    pub(super) fn on_gpu_challenged(&mut self, gpu: GpuId, outcome: gpux_engine::ChallengeOutcome, classes_mask: u64) {
        use gpux_engine::ChallengeOutcome::*;
        let supplier = self.gpu_supplier[gpu.0 as usize] as usize;
        self.gpu_disqualified[gpu.0 as usize] = classes_mask == 0;
        let kind = self.hardware_kind(supplier);
        let first_answer = !self.suppliers[supplier].challenge_answered && outcome != Unanswered;
        let first_catch = !self.suppliers[supplier].challenge_caught && matches!(outcome, TooSlow | WrongAnswer);
        let since_start = self.now_ms - START_MS;
        let stats = self.metrics.challenges.entry(kind).or_default();
        stats.outcomes[match outcome {
            Passed => 0,
            TooSlow => 1,
            WrongAnswer => 2,
            Unanswered => 3,
        }] += 1;
        if first_answer {
            stats.suppliers_answered += 1;
        }
        if first_catch {
            stats.suppliers_caught += 1;
            stats.time_to_catch_ms.push(since_start);
        }
        self.suppliers[supplier].challenge_answered |= first_answer;
        self.suppliers[supplier].challenge_caught |= first_catch;
    }
}
