//! Property tests of the one apply path over random journals that mix every
//! kind of entry: orders that trade into leases, time passing, signed usage
//! reports (honest, resent, forged, out of chain), delivery statuses (a
//! host's failure calls for its follow-up command), workloads and host keys,
//! hardware challenges answered right, wrong, late or never, and renters'
//! signed liveness observations (reachable, unreachable, forged) that
//! dispute reported time.
//!
//! Time jumps of hours let leases end, close their bills and leave the hot
//! state (archived), so snapshots hold engines with holes in their leases.
//!
//! - A snapshot taken at any entry, encoded and decoded as the exchange
//!   stores it, then fed the rest of the journal reaches the same state hash
//!   and the same ledger as the market that never stopped.
//! - Money balances after every entry, and the ledger's transfer ids only grow.
//! - Market data is numbered 1, 2, 3... per feed; every private event goes
//!   to exactly the accounts it concerns.

use std::collections::BTreeMap;

use ed25519_dalek::SigningKey;
use gpux_engine::*;
use gpux_market::{Audience, JournalEntry, MarketState};
use gpux_protocol::{DeliveryState, FailureCode, Fault, LivenessBody, LivenessReport, ServerMessage, UsageBody, UsageReport};
use gpux_settlement::ledger::LedgerAccount;
use proptest::prelude::*;

/// 2026-12-02T15:01:00Z.
const T0: u64 = 1_796_223_660_000;
const SPOT: InstrumentId = InstrumentId(0);
const LATE_WINDOW_MS: u64 = 2 * 3_600_000;

#[derive(Clone, Debug)]
enum Op {
    Advance {
        ms: u64,
    },
    Bid {
        quantity: u32,
        ticks: u64,
        hours: u32,
    },
    Ask {
        mask: u64,
        ticks: u64,
    },
    Report {
        pick: usize,
        gpu: usize,
        minutes: u64,
        tamper: u8,
    },
    Status {
        pick: usize,
        state: u8,
    },
    EndLease {
        pick: usize,
    },
    /// A hardware challenge of GPU `gpu`, answered as `answer` says (0:
    /// right, 1: wrong product, 2: never opened, 3: never committed),
    /// `delay_ms` after its issue.
    Challenge {
        gpu: u32,
        answer: u8,
        delay_ms: u64,
    },
    /// The renter's observation of a lease over the next `minutes` (0: a
    /// reachable one, 1: unreachable, 2: signed by another key).
    Liveness {
        pick: usize,
        minutes: u64,
        kind: u8,
    },
    /// The supplier's last session closes.
    Disconnect,
    /// The renter's GPU probe over the next `minutes`: GPUs of `absent`'s
    /// mask seen absent (bit 2: signed by another key).
    GpuProbe {
        pick: usize,
        minutes: u64,
        absent: u8,
    },
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        2 => prop_oneof![0..30 * 60_000u64, 60 * 60_000..3 * 60 * 60_000u64].prop_map(|ms| Op::Advance { ms }),
        3 => (1..3u32, 0..6u64, 0..3u32).prop_map(|(quantity, ticks, hours)| Op::Bid { quantity, ticks, hours }),
        3 => (1..4u64, 0..6u64).prop_map(|(mask, ticks)| Op::Ask { mask, ticks }),
        5 => (any::<usize>(), 0..3usize, 1..20u64, 0..8u8).prop_map(|(pick, gpu, minutes, tamper)| Op::Report { pick, gpu, minutes, tamper }),
        2 => (any::<usize>(), 0..5u8).prop_map(|(pick, state)| Op::Status { pick, state }),
        1 => any::<usize>().prop_map(|pick| Op::EndLease { pick }),
        1 => (0..2u32, 0..4u8, 0..5_000u64).prop_map(|(gpu, answer, delay_ms)| Op::Challenge { gpu, answer, delay_ms }),
        2 => (any::<usize>(), 1..30u64, 0..3u8).prop_map(|(pick, minutes, kind)| Op::Liveness { pick, minutes, kind }),
        1 => Just(Op::Disconnect),
        2 => (any::<usize>(), 1..30u64, 0..8u8).prop_map(|(pick, minutes, absent)| Op::GpuProbe { pick, minutes, absent }),
    ]
}

/// Plays the sequencer's part: stamps entries, journals them, applies the
/// follow-up commands the market calls for as their own entries.
struct Harness {
    market: MarketState,
    journal: Vec<JournalEntry>,
    now_ms: u64,
    supplier: AccountId,
    renter: AccountId,
    key: SigningKey,
    renter_key: SigningKey,
    leases: Vec<LeaseId>,
    /// The end of the renter's last observation of each lease.
    observed: BTreeMap<LeaseId, u64>,
    /// The end of the renter's last probe observation of each lease.
    probed: BTreeMap<LeaseId, u64>,
    /// (lease, gpu uuid) -> (next seq, previous hash, last end)
    chains: BTreeMap<(LeaseId, String), (u32, String, u64)>,
    next_order: u64,
    next_transfer: u64,
    feed_seq: BTreeMap<(bool, InstrumentId), u64>,
    /// Outcomes of the usage reports, in order.
    outcomes: Vec<Result<gpux_settlement::UsageOutcome, gpux_protocol::UsageRejectCode>>,
    /// Every ledger transfer posted, in order.
    transfers: Vec<gpux_settlement::ledger::Transfer>,
    /// Each `DisputeDecided`: (disputed, proven, refunded, fee refunded, paid).
    decided: Vec<(u64, u64, u64, u64, u64)>,
}

impl Harness {
    fn new() -> Harness {
        let key = SigningKey::from_bytes(&[3; 32]);
        let mut session = Harness {
            market: MarketState::new(EngineConfig::demo()).expect("demo config"),
            journal: Vec::new(),
            now_ms: T0,
            supplier: AccountId(0),
            renter: AccountId(1),
            key,
            renter_key: SigningKey::from_bytes(&[4; 32]),
            leases: Vec::new(),
            observed: BTreeMap::new(),
            probed: BTreeMap::new(),
            chains: BTreeMap::new(),
            next_order: 1,
            next_transfer: 0,
            feed_seq: BTreeMap::new(),
            outcomes: Vec::new(),
            transfers: Vec::new(),
            decided: Vec::new(),
        };
        // Bills with reports missing at the grace are provisional for two
        // hours (the exchange's default is a day): runs reach both ends.
        session.command(Command::SetLateReportWindow { window_ms: LATE_WINDOW_MS });
        session.command(Command::OpenAccount { role: Role::Supplier });
        session.apply(JournalEntry::BindKey { public_key: session.key.verifying_key().to_bytes(), account: AccountId(0) });
        session.command(Command::OpenAccount { role: Role::Renter });
        session.apply(JournalEntry::BindKey { public_key: session.renter_key.verifying_key().to_bytes(), account: AccountId(1) });
        session.command(Command::Deposit { account: AccountId(1), amount_minor: 500_000_000 });
        for index in 0..2 {
            let spec = GpuSpec::h100_sxm();
            session.command(Command::register(AccountId(0), "h", &format!("GPU-{index}"), spec));
        }
        session
    }

    fn command(&mut self, command: Command) {
        self.apply(JournalEntry::Engine(Input { at_ms: self.now_ms, command }));
    }

    fn apply(&mut self, entry: JournalEntry) {
        let applied = self.market.apply(&entry).expect("the ledger accepts every entry");
        self.journal.push(entry);
        self.outcomes.extend(applied.usage);
        assert_eq!(self.market.ledger().sum(), 0, "money balances");
        for transfer in &applied.transfers {
            assert!(transfer.id >= self.next_transfer, "transfer ids only grow");
            self.next_transfer = transfer.id + 1;
        }
        self.transfers.extend(&applied.transfers);
        for notice in &applied.notices {
            match (&notice.message, notice.to) {
                (ServerMessage::BookUpdate { instrument, seq, .. }, Audience::Feed(..)) => self.next_feed_seq(false, *instrument, *seq),
                (ServerMessage::Trade { instrument, seq, .. }, Audience::Feed(..)) => self.next_feed_seq(true, *instrument, *seq),
                (ServerMessage::Private { event, .. }, Audience::Accounts(accounts)) => {
                    assert_eq!(accounts, self.market.accounts_of(event), "a private event goes to the accounts it concerns")
                }
                (
                    ServerMessage::Workload { .. } | ServerMessage::Delivery { .. } | ServerMessage::LeaseReplaced { .. },
                    Audience::Accounts(_),
                ) => {}
                (ServerMessage::GpuChallenge { .. } | ServerMessage::GpuMemoryChallenge { .. }, Audience::Accounts(accounts)) => {
                    assert_eq!(accounts, [Some(self.supplier), None])
                }
                (message, to) => panic!("unexpected notice {message:?} to {to:?}"),
            }
        }
        for event in &applied.events {
            match event.kind {
                EventKind::LeaseCreated { lease, .. } => self.leases.push(lease),
                EventKind::DisputeDecided { disputed_gpu_ms, proven_gpu_ms, refunded_minor, fee_refunded_minor, paid_minor, .. } => {
                    self.decided.push((disputed_gpu_ms, proven_gpu_ms, refunded_minor, fee_refunded_minor, paid_minor))
                }
                _ => {}
            }
        }
        for command in applied.follow_ups {
            self.command(command);
        }
    }

    fn next_feed_seq(&mut self, trades: bool, instrument: InstrumentId, seq: u64) {
        let last = self.feed_seq.entry((trades, instrument)).or_insert(0);
        assert_eq!(seq, *last + 1, "market data is numbered without gaps");
        *last = seq;
    }

    fn lease(&self, pick: usize) -> Option<LeaseId> {
        (!self.leases.is_empty()).then(|| self.leases[pick % self.leases.len()])
    }

    fn run(&mut self, op: &Op) {
        match *op {
            Op::Advance { ms } => {
                self.now_ms += ms;
                self.command(Command::Tick);
            }
            Op::Bid { quantity, ticks, hours } => {
                let duration = if hours == 0 { LeaseDuration::UntilCancelled } else { LeaseDuration::Hours(hours) };
                let price = 1_500_000 + ticks * 100_000;
                let order = NewOrder { duration, ..NewOrder::limit(self.renter, self.next_order, SPOT, Side::Buy, price, quantity) };
                self.next_order += 1;
                self.command(Command::place(order));
            }
            Op::Ask { mask, ticks } => {
                let price = 1_500_000 + ticks * 100_000;
                let supply = Some(GpuSet { host: HostId(0), gpu_mask: mask });
                let quantity = mask.count_ones();
                let order = NewOrder { supply, ..NewOrder::limit(self.supplier, self.next_order, SPOT, Side::Sell, price, quantity) };
                self.next_order += 1;
                self.command(Command::place(order));
            }
            Op::Report { pick, gpu, minutes, tamper } => {
                let Some(lease) = self.lease(pick) else { return };
                let Some(info) = self.market.engine().lease(lease) else { return };
                // Mostly the lease's own GPUs; sometimes one it does not have.
                let uuid = match info.gpus.get(gpu % 3) {
                    Some(id) => self.market.engine().gpu(*id).expect("a leased GPU exists").uuid,
                    None => "GPU-elsewhere".to_string(),
                };
                let (seq, prev_hash, last_end) =
                    self.chains.get(&(lease, uuid.clone())).cloned().unwrap_or((1, gpux_protocol::genesis_hash(), info.start_ms));
                let end_ms = (last_end + minutes * 60_000).min(self.now_ms);
                let body = UsageBody {
                    lease,
                    gpu_uuid: uuid.clone(),
                    seq,
                    start_ms: last_end,
                    end_ms,
                    available_ms: end_ms.saturating_sub(last_end),
                    utilisation_percent: 90,
                    memory_used_mib_max: 1_000,
                    unhealthy_samples: 0,
                    prev_hash,
                    readings: None,
                };
                let report = match tamper {
                    // Forged: signed by another key.
                    0 => UsageReport::sign(body, &SigningKey::from_bytes(&[9; 32])),
                    // Out of chain: a wrong previous hash.
                    1 => UsageReport::sign(UsageBody { prev_hash: "00".repeat(32), ..body }, &self.key),
                    _ => UsageReport::sign(body, &self.key),
                };
                if tamper >= 2 {
                    self.chains.insert((lease, uuid), (seq + 1, report.hash(), end_ms));
                }
                self.apply(JournalEntry::UsageReport { at_ms: self.now_ms, account: self.supplier, report: report.clone() });
                if tamper == 7 {
                    // A resend of the same report.
                    self.apply(JournalEntry::UsageReport { at_ms: self.now_ms, account: self.supplier, report });
                }
            }
            Op::Status { pick, state } => {
                let Some(lease) = self.lease(pick) else { return };
                let state = match state {
                    0 => DeliveryState::Starting,
                    1 => DeliveryState::Running { endpoints: Vec::new(), ssh: None, restarts: 0 },
                    2 => DeliveryState::Exited { code: 1 },
                    3 => DeliveryState::Failed { code: FailureCode::PullFailed, fault: Fault::Renter, reason: "no such image".into() },
                    _ => DeliveryState::Failed { code: FailureCode::HostError, fault: Fault::Host, reason: "disk full".into() },
                };
                // The sequencer's check before journaling.
                if self.market.check_delivery_status(self.supplier, lease, &state).is_ok() {
                    self.apply(JournalEntry::DeliveryStatus { at_ms: self.now_ms, account: self.supplier, lease, state });
                }
            }
            Op::EndLease { pick } => {
                let Some(lease) = self.lease(pick) else { return };
                self.command(Command::EndLease { account: self.renter, lease });
            }
            Op::Challenge { gpu, answer, delay_ms } => {
                self.challenge(GpuId(gpu), answer, delay_ms, 16);
            }
            Op::Disconnect => self.apply(JournalEntry::SupplierDisconnected { at_ms: self.now_ms, account: self.supplier }),
            Op::GpuProbe { pick, minutes, absent } => {
                let Some(lease) = self.lease(pick) else { return };
                let Some(info) = self.market.engine().lease(lease) else { return };
                if absent & 4 != 0 && !self.probed.contains_key(&lease) {
                    return; // the lease's first observation pins its probe's key
                }
                let start_ms = self.probed.get(&lease).copied().unwrap_or(info.start_ms);
                let end_ms = (start_ms + minutes * 60_000).min(self.now_ms).min(info.ended_at_ms.unwrap_or(u64::MAX));
                let gpus = info
                    .gpus
                    .iter()
                    .enumerate()
                    .map(|(i, gpu)| gpux_protocol::ProbeGpu {
                        uuid: self.market.engine().gpu(*gpu).expect("a leased GPU exists").uuid,
                        present_samples: if absent & (1 << i) != 0 { 0 } else { 3 },
                        utilisation_percent_mean: 40,
                        memory_used_mib_max: 100,
                    })
                    .collect();
                let body = gpux_protocol::GpuProbeBody { lease, start_ms, end_ms, samples: 3, gpus };
                let key = SigningKey::from_bytes(if absent & 4 != 0 { &[8; 32] } else { &[23; 32] });
                let report = gpux_protocol::GpuProbeReport::sign(body, &key);
                // The sequencer's check before journaling.
                let checked = self.market.check_gpu_probe(self.renter, &report, self.now_ms);
                if absent & 4 != 0 {
                    assert!(checked.is_err(), "another key than the lease's probe's");
                }
                if checked.is_ok() {
                    self.probed.insert(lease, end_ms);
                    self.apply(JournalEntry::GpuProbe { at_ms: self.now_ms, account: self.renter, report: Box::new(report) });
                }
            }
            Op::Liveness { pick, minutes, kind } => {
                let Some(lease) = self.lease(pick) else { return };
                let Some(info) = self.market.engine().lease(lease) else { return };
                let start_ms = self.observed.get(&lease).copied().unwrap_or(info.start_ms);
                let end_ms = (start_ms + minutes * 60_000).min(self.now_ms).min(info.ended_at_ms.unwrap_or(u64::MAX));
                let body = LivenessBody { lease, start_ms, end_ms, reachable: kind == 0 };
                let key = if kind == 2 { SigningKey::from_bytes(&[8; 32]) } else { self.renter_key.clone() };
                let report = LivenessReport::sign(body, &key);
                // The sequencer's check before journaling.
                let checked = self.market.check_liveness(self.renter, &report, self.now_ms);
                if kind == 2 {
                    assert!(checked.is_err(), "another key's signature");
                }
                if checked.is_ok() {
                    self.observed.insert(lease, end_ms);
                    self.apply(JournalEntry::Liveness { at_ms: self.now_ms, account: self.renter, report });
                }
            }
        }
    }

    /// Plays one hardware challenge through the sequencer's steps (checks
    /// before journaling, as the sequencer makes them). Returns its id.
    fn challenge(&mut self, gpu: GpuId, answer: u8, delay_ms: u64, n: u32) -> u64 {
        use gpux_protocol::challenge::{matrices, product};
        use gpux_protocol::memory::CpuProof;
        let seed = [gpu.0 as u8 + 1; 32];
        self.apply(JournalEntry::ChallengeIssued { at_ms: self.now_ms, gpu, seed, n });
        let challenge = self.market.challenges().expired(u64::MAX).into_iter().max().expect("issued");
        self.now_ms += delay_ms;
        if answer == 3 {
            self.now_ms += gpux_market::challenges::CHALLENGE_ANSWER_MS;
            for expired in self.market.challenges().expired(self.now_ms) {
                self.apply(JournalEntry::ChallengeExpired { at_ms: self.now_ms, challenge: expired });
            }
            return challenge;
        }
        let (a, b) = matrices(&seed, n);
        let mut words = product(&a, &b, n);
        if answer == 1 {
            words.iter_mut().for_each(|word| *word = word.wrapping_add(1));
        }
        let computed = CpuProof::new(words);
        assert_eq!(self.market.challenges().check_commit(self.supplier, challenge, self.now_ms), Ok(()));
        let (commitment, open_seed) = (computed.root(), [7; 32]);
        self.apply(JournalEntry::ChallengeCommitted { at_ms: self.now_ms, account: self.supplier, challenge, commitment, open_seed });
        if answer == 2 {
            self.now_ms += gpux_market::challenges::CHALLENGE_ANSWER_MS;
            self.command(Command::Tick);
            for expired in self.market.challenges().expired(self.now_ms) {
                self.apply(JournalEntry::ChallengeExpired { at_ms: self.now_ms, challenge: expired });
            }
            return challenge;
        }
        let asked = self.market.challenges().get(challenge).expect("open").rows_to_open();
        let opened = computed.open(&asked);
        let verdict =
            self.market.challenges().check_opening(self.supplier, challenge, false, &opened, self.now_ms).expect("a well-formed opening");
        self.apply(JournalEntry::ChallengeAnswered { at_ms: self.now_ms, account: self.supplier, challenge, verdict });
        challenge
    }

    /// A memory challenge of `passes` over `2^words_log2` words answered
    /// after `delay_ms`: 0 right, 1 a pass short (wrong), 3 never.
    fn memory_challenge(&mut self, gpu: GpuId, answer: u8, delay_ms: u64, words_log2: u32, passes: u32) -> u64 {
        use gpux_protocol::memory::{CpuProof, Params};
        let seed = [gpu.0 as u8 + 9; 32];
        self.apply(JournalEntry::MemoryChallengeIssued { at_ms: self.now_ms, gpu, seed, words_log2, passes });
        let challenge = self.market.challenges().expired(u64::MAX).into_iter().max().expect("issued");
        self.now_ms += delay_ms;
        if answer == 3 {
            self.now_ms += gpux_market::challenges::CHALLENGE_ANSWER_MS;
            for expired in self.market.challenges().expired(self.now_ms) {
                self.apply(JournalEntry::ChallengeExpired { at_ms: self.now_ms, challenge: expired });
            }
            return challenge;
        }
        let proof = CpuProof::new(Params::new(&seed, words_log2, if answer == 1 { passes - 1 } else { passes }).compute());
        assert_eq!(self.market.challenges().check_commit(self.supplier, challenge, self.now_ms), Ok(()));
        let (commitment, open_seed) = (proof.root(), [8; 32]);
        self.apply(JournalEntry::ChallengeCommitted { at_ms: self.now_ms, account: self.supplier, challenge, commitment, open_seed });
        let asked = self.market.challenges().get(challenge).expect("open").rows_to_open();
        let verdict = self
            .market
            .challenges()
            .check_opening(self.supplier, challenge, true, &proof.open(&asked), self.now_ms)
            .expect("a well-formed opening");
        self.apply(JournalEntry::ChallengeAnswered { at_ms: self.now_ms, account: self.supplier, challenge, verdict });
        challenge
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 128, ..ProptestConfig::default() })]

    #[test]
    fn a_decoded_snapshot_at_any_entry_replays_to_the_same_state(ops in prop::collection::vec(op(), 1..200), cut in any::<prop::sample::Index>()) {
        let mut live = Harness::new();
        let mut snapshot = None;
        let cut = cut.index(ops.len());
        for (index, op) in ops.iter().enumerate() {
            if index == cut {
                let bytes = gpux_protocol::encode_record(&live.market);
                snapshot = Some((gpux_protocol::decode_snapshot::<MarketState>(&bytes).expect("a snapshot decodes"), live.journal.len()));
            }
            live.run(op);
        }
        let (mut restored, from) = snapshot.expect("the cut is inside the run");
        for entry in &live.journal[from..] {
            restored.apply(entry).expect("replay applies what the live market applied");
        }
        prop_assert_eq!(restored.state_hash(), live.market.state_hash());
        prop_assert_eq!(format!("{:?}", restored.ledger()), format!("{:?}", live.market.ledger()));

        // And from the very start, as the audit replays a journal.
        let mut audit = MarketState::new(EngineConfig::demo()).expect("demo config");
        for entry in &live.journal {
            audit.apply(entry).expect("the audit applies the journal");
        }
        prop_assert_eq!(audit.state_hash(), live.market.state_hash());
    }
}

/// A host's own failure calls for the lease to end `delivery_failed`: the
/// market says so (`follow_ups`) and does not do it itself, so a replay that
/// meets the journaled follow-up entry does not end the lease twice.
#[test]
fn a_host_failure_calls_for_its_follow_up_command_and_leaves_it_to_the_journal() {
    let mut session = Harness::new();
    session.run(&Op::Ask { mask: 1, ticks: 0 });
    session.run(&Op::Bid { quantity: 1, ticks: 0, hours: 2 });
    let lease = session.lease(0).expect("a lease");
    let state = DeliveryState::Failed { code: FailureCode::HostError, fault: Fault::Host, reason: "disk full".into() };
    let entry = JournalEntry::DeliveryStatus { at_ms: session.now_ms, account: session.supplier, lease, state };
    let mut bare = session.market.clone();
    let applied = bare.apply(&entry).expect("applies");
    assert_eq!(applied.follow_ups, [Command::FailLeaseDelivery { account: session.supplier, lease }]);
    assert!(bare.engine().lease(lease).expect("lease").active, "the market does not end the lease by itself");
    session.apply(entry);
    let info = session.market.engine().lease(lease).expect("lease");
    assert!(!info.active, "the journaled follow-up ended it");
    assert!(matches!(session.journal.last(), Some(JournalEntry::Engine(Input { command: Command::FailLeaseDelivery { .. }, .. }))));
}

/// A bid that carries a workload trades only with suppliers whose hosts can
/// take one (they published an encryption key): it skips the others' asks
/// (which keep their place for bids without a workload), and fills once the
/// supplier published its key. Its lease, covered by re-match, is replaced
/// when the host fails it, at up to the opted-in bid's limit: here above
/// the failed lease's price, where the only GPU left is offered.
#[test]
fn a_workload_bid_skips_hosts_that_cannot_deliver_and_its_replacement_pays_up_to_its_limit() {
    let mut session = Harness::new();
    let (renter, supplier) = (session.renter, session.supplier);
    let workload = Box::new(gpux_protocol::Workload::image("localhost/app:1"));
    let workload_bid = |session: &mut Harness, price: u64, rematch: bool| {
        let client_order_id = session.next_order;
        session.next_order += 1;
        session.apply(JournalEntry::BidWorkload { account: renter, client_order_id, workload: workload.clone() });
        if rematch {
            session.apply(JournalEntry::BidRematch { account: renter, client_order_id });
        }
        let order = NewOrder { time_in_force: TimeInForce::Ioc, ..NewOrder::limit(renter, client_order_id, SPOT, Side::Buy, price, 1) };
        let before = session.leases.len();
        session.command(Command::place(order));
        session.leases[before..].first().copied()
    };
    session.run(&Op::Ask { mask: 0b01, ticks: 0 });
    assert_eq!(workload_bid(&mut session, 1_500_000, false), None, "no lease from a host that cannot take the workload");
    let key = gpux_protocol::delivery::EncryptionKey::from_bytes([5; 32]);
    let signature = key.certify(&session.key);
    session.apply(JournalEntry::EncryptionKey { account: supplier, key: key.public(), signature });
    let lease = workload_bid(&mut session, 1_900_000, true).expect("a lease once the supplier delivers");
    assert_eq!(session.market.engine().lease(lease).expect("lease").price_minor_per_gpu_hour, 1_500_000);

    // The only other GPU is offered above the failed lease's price, within the bid's limit.
    session.run(&Op::Ask { mask: 0b10, ticks: 3 });
    let state = DeliveryState::Failed { code: FailureCode::EngineUnavailable, fault: Fault::Host, reason: "engine down".into() };
    session.apply(JournalEntry::DeliveryStatus { at_ms: session.now_ms, account: supplier, lease, state });
    let replacement = *session.leases.last().expect("leases");
    assert_ne!(replacement, lease, "the failed lease was replaced");
    let info = session.market.engine().lease(replacement).expect("replacement");
    assert_eq!((info.price_minor_per_gpu_hour, info.renter), (1_800_000, renter));
    let taken = session.market.deliveries().lease(replacement).and_then(|d| d.workload.clone());
    assert_eq!(taken, Some(workload), "the replacement took over the workload");
}

/// A workload that asked to end its lease on exit (`gpux run ... -- CMD`):
/// its host's `exited` calls for the renter's own end, journaled as a
/// follow-up; a lease whose workload did not ask stays billed.
#[test]
fn a_workload_that_ends_its_lease_on_exit_ends_it_as_the_renter_would() {
    let mut session = Harness::new();
    let (renter, supplier) = (session.renter, session.supplier);
    let key = gpux_protocol::delivery::EncryptionKey::from_bytes([5; 32]);
    let signature = key.certify(&session.key);
    session.apply(JournalEntry::EncryptionKey { account: supplier, key: key.public(), signature });
    let mut leases = Vec::new();
    for (mask, end_lease_on_exit) in [(0b01, true), (0b10, false)] {
        session.run(&Op::Ask { mask, ticks: 0 });
        let workload = Box::new(gpux_protocol::Workload { end_lease_on_exit, ..gpux_protocol::Workload::image("localhost/app:1") });
        let client_order_id = session.next_order;
        session.next_order += 1;
        session.apply(JournalEntry::BidWorkload { account: renter, client_order_id, workload });
        let order = NewOrder { time_in_force: TimeInForce::Ioc, ..NewOrder::limit(renter, client_order_id, SPOT, Side::Buy, 1_500_000, 1) };
        let before = session.leases.len();
        session.command(Command::place(order));
        leases.push(*session.leases[before..].first().expect("a lease"));
    }
    for &lease in &leases {
        let entry =
            JournalEntry::DeliveryStatus { at_ms: session.now_ms, account: supplier, lease, state: DeliveryState::Exited { code: 0 } };
        let applied = session.market.clone().apply(&entry).expect("applies");
        let asked = lease == leases[0];
        assert_eq!(applied.follow_ups == [Command::EndLease { account: renter, lease }], asked, "lease {lease:?}");
        session.apply(entry);
    }
    assert!(!session.market.engine().lease(leases[0]).expect("lease").active, "ended on exit");
    assert!(session.market.engine().lease(leases[1]).expect("lease").active, "kept: its workload did not ask");
}

/// Host-side delivery failures in a row show in the host's and supplier's
/// public records (the back-off their agent keeps doubles with them), and
/// end when a workload of theirs reaches `running`.
#[test]
fn host_failures_in_a_row_are_on_the_record_until_a_workload_runs() {
    let mut session = Harness::new();
    let supplier = session.supplier;
    let failed = DeliveryState::Failed { code: FailureCode::EngineUnavailable, fault: Fault::Host, reason: "engine down".into() };
    let in_row = |session: &Harness| {
        let (host, account) =
            (session.market.reliability().host(HostId(0), session.now_ms), session.market.reliability().supplier(supplier, session.now_ms));
        (host.failed_deliveries_in_row, account.failed_deliveries_in_row)
    };
    for (mask, expected) in [(0b01, 1), (0b10, 2)] {
        session.run(&Op::Ask { mask, ticks: 0 });
        session.run(&Op::Bid { quantity: 1, ticks: 0, hours: 1 });
        let lease = *session.leases.last().expect("a lease");
        session.apply(JournalEntry::DeliveryStatus { at_ms: session.now_ms, account: supplier, lease, state: failed.clone() });
        assert!(!session.market.engine().lease(lease).expect("lease").active);
        assert_eq!(in_row(&session), (expected, expected));
    }
    // Both GPUs are offline now (the agent's health check brings them back).
    for gpu in [GpuId(0), GpuId(1)] {
        session.command(Command::SetGpuOnline { account: supplier, gpu, online: true });
    }
    session.run(&Op::Ask { mask: 0b01, ticks: 0 });
    session.run(&Op::Bid { quantity: 1, ticks: 0, hours: 1 });
    let lease = *session.leases.last().expect("a lease");
    let running = DeliveryState::Running { endpoints: Vec::new(), ssh: None, restarts: 0 };
    session.apply(JournalEntry::DeliveryStatus { at_ms: session.now_ms, account: supplier, lease, state: running });
    assert_eq!(in_row(&session), (0, 0), "a workload that runs ends the run of failures");
    assert_eq!(session.market.reliability().host(HostId(0), session.now_ms).failed_deliveries, 2, "the window still counts both");
}

/// A hardware challenge through the market: a right answer in time
/// verifies the GPU, a right answer too slow for the class takes it out of
/// the class, a wrong product rejects it, silence unverifies it; each is
/// the follow-up `RecordChallenge` the journal holds, counted in the
/// supplier's record. Steps out of turn, another's challenge and malformed
/// openings are errors, and change nothing.
#[test]
fn a_hardware_challenge_is_issued_committed_opened_and_recorded() {
    use gpux_protocol::ErrorCode;
    let mut session = Harness::new();
    let gpu = GpuId(0);
    let last_outcome = |session: &Harness| session.market.engine().gpu(gpu).and_then(|g| g.challenge).map(|c| c.outcome);

    // Its memory bandwidth first (the class asks for both).
    session.memory_challenge(gpu, 0, 10, 16, 8);
    assert!(!session.market.engine().gpu(gpu).expect("gpu").verified, "one kind of two");
    // 2 x 256^3 = 33.6 MFLOP in 50 ms: 671 MFLOP/s.
    session.challenge(gpu, 0, 50, 256);
    assert_eq!(last_outcome(&session), Some(ChallengeOutcome::Passed));
    assert!(session.market.engine().gpu(gpu).expect("gpu").verified);
    assert!(matches!(
        session.journal.last(),
        Some(JournalEntry::Engine(Input {
            command: Command::RecordChallenge { answer: ChallengeAnswer::Correct { n: 256, elapsed_ms: 50 }, .. },
            ..
        }))
    ));
    // In 4 s: 8 MFLOP/s, below the class's 10.
    session.challenge(gpu, 0, 4_000, 256);
    assert_eq!(last_outcome(&session), Some(ChallengeOutcome::TooSlow));
    assert!(session.market.engine().gpu(gpu).expect("gpu").classes.is_empty());
    session.challenge(gpu, 2, 10, 16);
    assert_eq!(last_outcome(&session), Some(ChallengeOutcome::Unanswered), "committed, never opened");
    session.challenge(gpu, 3, 10, 16);
    assert_eq!(last_outcome(&session), Some(ChallengeOutcome::Unanswered), "never committed");
    session.challenge(gpu, 1, 10, 16);
    assert_eq!(last_outcome(&session), Some(ChallengeOutcome::WrongAnswer));
    let record = session.market.reliability().supplier(session.supplier, session.now_ms);
    assert_eq!(
        (record.challenges_passed, record.challenges_too_slow, record.challenges_unanswered, record.challenges_failed),
        (2, 1, 2, 1),
        "the memory challenge counts too"
    );

    // Errors: nothing is journaled for them.
    session.apply(JournalEntry::ChallengeIssued { at_ms: session.now_ms, gpu: GpuId(1), seed: [5; 32], n: 16 });
    let open = session.market.challenges().expired(u64::MAX)[0];
    let challenges = session.market.challenges();
    let now = session.now_ms;
    assert_eq!(challenges.check_commit(session.renter, open, now), Err(ErrorCode::UnknownChallenge), "another's challenge");
    assert_eq!(challenges.check_commit(session.supplier, open + 1, now), Err(ErrorCode::UnknownChallenge), "never issued");
    assert_eq!(challenges.check_commit(session.supplier, open - 1, now), Err(ErrorCode::UnknownChallenge), "already answered");
    let late = now + gpux_market::challenges::CHALLENGE_ANSWER_MS;
    assert_eq!(challenges.check_commit(session.supplier, open, late), Err(ErrorCode::UnknownChallenge), "expired");
    assert_eq!(
        challenges.check_opening(session.supplier, open, false, &[], now),
        Err(ErrorCode::ChallengeOutOfOrder),
        "open before commit"
    );
    session.apply(JournalEntry::ChallengeCommitted {
        at_ms: now,
        account: session.supplier,
        challenge: open,
        commitment: [0; 32],
        open_seed: [1; 32],
    });
    let challenges = session.market.challenges();
    assert_eq!(challenges.check_commit(session.supplier, open, now), Err(ErrorCode::ChallengeOutOfOrder), "a second commitment");
    // n = 16: one leaf of 256 entries, the root its hash (no path).
    let leaf = |leaf: u32, words: usize, path: usize| gpux_protocol::memory::LeafOpening {
        leaf,
        words: vec![0; words],
        path: vec!["00".repeat(32); path],
    };
    let supplier = session.supplier;
    for (malformed, why) in [
        (vec![leaf(0, 256, 0); 9], "more leaves than are opened"),
        (vec![leaf(1, 256, 0)], "no leaf 1"),
        (vec![leaf(0, 255, 0)], "a short leaf"),
        (vec![leaf(0, 256, 1)], "a path longer than the tree"),
    ] {
        assert_eq!(challenges.check_opening(supplier, open, false, &malformed, now), Err(ErrorCode::ChallengeAnswerInvalid), "{why}");
    }
    assert_eq!(
        challenges.check_opening(supplier, open, true, &[leaf(0, 256, 0)], now),
        Err(ErrorCode::ChallengeAnswerInvalid),
        "a memory opening"
    );
    // Well formed, not the committed root: a verdict (wrong), not an error.
    assert_eq!(
        challenges.check_opening(supplier, open, false, &[leaf(0, 256, 0)], now),
        Ok(Err(gpux_protocol::challenge::ChallengeError::LeafNotCommitted))
    );
    assert!(challenges.get(open).is_some(), "still open after the errors");

    // A side from a journal's older listing (any n up to 256 then): no
    // opening can have it, so no commitment is taken (it expires unanswered).
    session.apply(JournalEntry::ChallengeIssued { at_ms: session.now_ms, gpu: GpuId(1), seed: [6; 32], n: 100 });
    let legacy = session.market.challenges().latest();
    let checked = session.market.challenges().check_commit(session.supplier, legacy, session.now_ms);
    assert_eq!(checked, Err(ErrorCode::ChallengeAnswerInvalid));
    assert_eq!(gpux_protocol::challenge::leaves_to_open(&[1; 32], 100), Vec::<u32>::new(), "and names no leaves");
}

/// A memory-bandwidth challenge through the market: issued (the owner is
/// told), committed to a Merkle root, opened leaf by leaf and recorded as
/// the follow-up `RecordChallenge`; a buffer a pass short is caught and
/// rejects the GPU; a compute opening for it, or a malformed leaf, is an
/// error that changes nothing.
#[test]
fn a_memory_challenge_is_issued_committed_opened_and_recorded() {
    use gpux_protocol::ErrorCode;
    let mut session = Harness::new();
    let gpu = GpuId(0);
    let memory = |session: &Harness| session.market.engine().gpu(gpu).and_then(|g| g.memory).map(|v| (v.outcome, v.mbps));

    // 4 x 2^16 x 25 = 6.55 MB in 20 ms: 327 MB/s.
    session.memory_challenge(gpu, 0, 20, 16, 8);
    assert_eq!(memory(&session), Some((ChallengeOutcome::Passed, 327)));
    assert!(matches!(
        session.journal.last(),
        Some(JournalEntry::Engine(Input {
            command: Command::RecordChallenge { answer: ChallengeAnswer::MemoryCorrect { words_log2: 16, passes: 8, elapsed_ms: 20 }, .. },
            ..
        }))
    ));
    session.memory_challenge(gpu, 3, 0, 16, 8);
    assert_eq!(memory(&session), Some((ChallengeOutcome::Unanswered, 0)));

    // Errors before a verdict.
    session.apply(JournalEntry::MemoryChallengeIssued { at_ms: session.now_ms, gpu, seed: [5; 32], words_log2: 12, passes: 3 });
    let open = session.market.challenges().expired(u64::MAX)[0];
    let now = session.now_ms;
    let opening = |leaf: u32, words: usize, path: usize| {
        vec![gpux_protocol::memory::LeafOpening { leaf, words: vec![0; words], path: vec!["00".repeat(32); path] }]
    };
    let challenges = session.market.challenges();
    assert_eq!(challenges.check_opening(session.supplier, open, true, &opening(0, 256, 4), now), Err(ErrorCode::ChallengeOutOfOrder));
    session.apply(JournalEntry::ChallengeCommitted {
        at_ms: now,
        account: session.supplier,
        challenge: open,
        commitment: [0; 32],
        open_seed: [1; 32],
    });
    let challenges = session.market.challenges();
    let supplier = session.supplier;
    assert_eq!(challenges.check_opening(supplier, open, false, &[], now), Err(ErrorCode::ChallengeAnswerInvalid), "a compute opening");
    assert_eq!(
        challenges.check_opening(supplier, open, true, &opening(16, 256, 4), now),
        Err(ErrorCode::ChallengeAnswerInvalid),
        "no leaf 16"
    );
    assert_eq!(challenges.check_opening(supplier, open, true, &opening(0, 255, 4), now), Err(ErrorCode::ChallengeAnswerInvalid));
    assert_eq!(challenges.check_opening(supplier, open, true, &opening(0, 256, 3), now), Err(ErrorCode::ChallengeAnswerInvalid));
    assert_eq!(challenges.check_opening(session.renter, open, true, &opening(0, 256, 4), now), Err(ErrorCode::UnknownChallenge));
    // Well formed but not the committed root: a wrong answer.
    assert_eq!(
        challenges.check_opening(supplier, open, true, &opening(0, 256, 4), now),
        Ok(Err(gpux_protocol::challenge::ChallengeError::WrongRows)),
        "not the leaves asked for"
    );
    let expired = JournalEntry::ChallengeExpired { at_ms: now + gpux_market::challenges::CHALLENGE_ANSWER_MS, challenge: open };
    session.apply(expired);

    // A pass short: caught, rejected for good.
    session.memory_challenge(gpu, 1, 10, 16, 8);
    assert_eq!(memory(&session), Some((ChallengeOutcome::WrongAnswer, 0)));
    let info = session.market.engine().gpu(gpu).expect("gpu");
    assert!(info.classes.is_empty() && !info.verified && info.challenge.is_some_and(|c| c.rejected));
}

/// The generator's entries do what they say: asks and bids trade into a
/// lease, honest reports are accepted and charge, a resend is a duplicate,
/// forged and out-of-chain reports are refused.
#[test]
fn the_generated_entries_trade_report_and_settle() {
    let mut session = Harness::new();
    session.run(&Op::Ask { mask: 3, ticks: 0 });
    session.run(&Op::Bid { quantity: 1, ticks: 2, hours: 0 });
    assert_eq!(session.leases.len(), 1, "the bid filled into a lease");
    session.run(&Op::Advance { ms: 20 * 60_000 });
    let before = session.market.ledger().transfer_count();
    for tamper in [2, 7, 0, 1] {
        session.run(&Op::Report { pick: 0, gpu: 0, minutes: 5, tamper });
    }
    use gpux_protocol::UsageRejectCode::*;
    use gpux_settlement::UsageOutcome::*;
    let outcomes: Vec<_> = session.outcomes.iter().map(|o| o.as_ref().map(|o| matches!(o, Accepted { .. })).map_err(|c| *c)).collect();
    assert_eq!(outcomes[..2], [Ok(true), Ok(true)], "{:?}", session.outcomes);
    assert!(matches!(session.outcomes[2], Ok(Duplicate)), "{:?}", session.outcomes);
    assert!(matches!(outcomes[3], Err(Forged)) && outcomes[4].is_err(), "{:?}", session.outcomes);
    assert!(session.market.ledger().transfer_count() > before, "accepted reports charged the lease");
    assert_eq!(session.market.settlement().rejections(session.supplier), 2, "the forged and the out-of-chain report were refused");
    // Both count in the supplier's reliability record, by code.
    let record = session.market.reliability().supplier(session.supplier, session.market.clock_ms());
    assert_eq!(record.refused_reports.get(&Forged), Some(&1), "{record:?}");
    assert_eq!(record.refused_reports.values().sum::<u32>(), 2, "{record:?}");
}

/// A lease leaves the hot state `LEASE_RETENTION_MS` after its bill is
/// final, reported in `Applied::archived` by the entry that archives it.
#[test]
fn a_lease_leaves_the_hot_state_an_hour_after_its_bill_is_final() {
    let mut session = Harness::new();
    session.run(&Op::Ask { mask: 1, ticks: 0 });
    session.run(&Op::Bid { quantity: 1, ticks: 0, hours: 1 });
    let lease = session.lease(0).expect("a lease");
    // The lease ends after an hour; no report came, so its bill is
    // provisional 10 minutes later and final at the end of the late-report
    // window; it stays in the hot state until an hour after that.
    session.run(&Op::Advance { ms: 70 * 60_000 + 1 });
    let info = session.market.engine().lease(lease).expect("still held");
    assert!(!info.billing_closed, "provisional: its reports are missing");
    session.run(&Op::Advance { ms: LATE_WINDOW_MS });
    let info = session.market.engine().lease(lease).expect("still held");
    assert!(info.billing_closed);
    let tick = |at_ms| JournalEntry::Engine(Input { at_ms, command: Command::Tick });
    let closed_at = T0 + 70 * 60_000 + LATE_WINDOW_MS;
    let early = session.market.apply(&tick(closed_at + gpux_market::LEASE_RETENTION_MS - 1)).expect("applies");
    assert!(early.archived.leases.is_empty());
    let due = session.market.apply(&tick(closed_at + gpux_market::LEASE_RETENTION_MS)).expect("applies");
    assert_eq!(due.archived.leases.iter().map(|l| &l.info).collect::<Vec<_>>(), vec![&info]);
    assert_eq!(session.market.engine().lease(lease), None);
}

/// A lease whose reports are missing at its grace is billed provisionally
/// (what the missing time could cost kept, the rest of its escrow
/// released), a late report within the window is billed, and the bill is
/// final when the last arrives; the renter's statement says which line was
/// which (docs/market-rules.md "Late reports").
#[test]
fn a_provisional_bill_takes_late_reports_until_it_is_final_and_the_statement_says_so() {
    use gpux_settlement::ledger::TransferKind;
    let mut session = Harness::new();
    session.run(&Op::Ask { mask: 1, ticks: 0 });
    // Open-ended: its escrow runs a prepaid horizon ahead of the use.
    session.run(&Op::Bid { quantity: 1, ticks: 0, hours: 0 });
    let lease = session.lease(0).expect("a lease");
    let report = |session: &mut Harness, minutes| session.run(&Op::Report { pick: 0, gpu: 0, minutes, tamper: 2 });
    session.run(&Op::Advance { ms: 30 * 60_000 });
    report(&mut session, 30);
    // The renter ends it at two hours; 90 minutes of reports are missing at the grace.
    session.run(&Op::Advance { ms: 90 * 60_000 });
    session.run(&Op::EndLease { pick: 0 });
    let escrow = session.market.engine().lease(lease).expect("held").escrow_minor;
    session.run(&Op::Advance { ms: 10 * 60_000 });
    let info = session.market.engine().lease(lease).expect("held");
    assert!(!info.active && !info.billing_closed, "provisional");
    let kinds = |session: &Harness| session.transfers.iter().filter(|t| t.lease == Some(lease)).map(|t| t.kind).collect::<Vec<_>>();
    assert!(kinds(&session).contains(&TransferKind::UsageCharge));
    // The missing 90 minutes' worth is kept, the rest of the escrow released.
    let missing_worth = info.price_minor_per_gpu_hour * 3 / 2;
    assert_eq!(info.escrow_minor, missing_worth);
    let released: Vec<_> = session.transfers.iter().filter(|t| t.kind == TransferKind::ProvisionalRelease).collect();
    assert_eq!(released.iter().map(|t| t.amount_minor).collect::<Vec<_>>(), vec![escrow - missing_worth]);
    assert!(released[0].description().contains("provisional bill"), "{}", released[0].description());

    // The late reports arrive an hour on: billed, and the last makes the bill final.
    session.run(&Op::Advance { ms: 60 * 60_000 });
    report(&mut session, 60);
    assert!(!session.market.engine().lease(lease).expect("held").billing_closed, "30 minutes still missing");
    report(&mut session, 30);
    let info = session.market.engine().lease(lease).expect("held");
    assert!(info.billing_closed, "final once every report arrived");
    assert_eq!(info.verified_gpu_ms, 2 * 3_600_000);
    assert_eq!(info.usage_charged_minor, 2 * info.price_minor_per_gpu_hour);
    assert_eq!(info.escrow_minor, 0);
    let late: Vec<_> = session.transfers.iter().filter(|t| t.kind == TransferKind::LateUsageCharge).collect();
    assert_eq!(late.iter().map(|t| t.amount_minor).sum::<u64>(), info.price_minor_per_gpu_hour * 3 / 2);
    assert!(late[0].description().contains("reported after its billing grace"), "{}", late[0].description());
    assert!(session.outcomes.iter().all(|o| o.is_ok()), "{:?}", session.outcomes);
    let renter = session.renter;
    assert_eq!(session.market.engine().balances(renter).expect("renter").held_minor, 0);
}

/// A provisional bill no late report completes is final at the end of the
/// window: what it kept goes back to the renter as the final bill's release.
#[test]
fn a_provisional_bill_without_late_reports_releases_what_it_kept_when_final() {
    use gpux_settlement::ledger::TransferKind;
    let mut session = Harness::new();
    session.run(&Op::Ask { mask: 1, ticks: 0 });
    session.run(&Op::Bid { quantity: 1, ticks: 0, hours: 1 });
    let lease = session.lease(0).expect("a lease");
    session.run(&Op::Advance { ms: 70 * 60_000 + 1 });
    let kept = session.market.engine().lease(lease).expect("held").escrow_minor;
    assert_eq!(kept, 1_500_000, "an hour unreported: the whole escrow kept");
    session.run(&Op::Advance { ms: LATE_WINDOW_MS });
    assert!(session.market.engine().lease(lease).expect("held").billing_closed);
    let last = session.transfers.iter().rfind(|t| t.lease == Some(lease)).expect("transfers");
    assert_eq!((last.kind, last.amount_minor), (TransferKind::FinalRelease, kept));
    assert!(last.description().contains("final bill"));
}

/// The `instruments` reply lists what is not expired: after days of hourly
/// and daily windows it keeps the calendar's size and fits a frame; an
/// expired window stays known by id for a day (`WINDOW_RETENTION_MS`), then
/// retires, reported in `Applied::archived`, so what the engine holds stays
/// flat too.
#[test]
fn the_listed_instruments_keep_the_calendars_size_and_fit_a_frame() {
    let mut market = MarketState::new(EngineConfig::demo()).expect("demo config");
    let tick = |at_ms| JournalEntry::Engine(Input { at_ms, command: Command::Tick });
    market.apply(&tick(T0)).expect("applies");
    let at_start = market.engine().listed_instruments().len();
    let mut retired = Vec::new();
    let mut held_by_day = Vec::new();
    for hour in 1..=96 {
        let applied = market.apply(&tick(T0 + hour * 3_600_000)).expect("applies");
        retired.extend(applied.archived.instruments);
        if hour % 24 == 0 {
            held_by_day.push(market.engine().instruments_held());
        }
    }
    let listed = market.engine().listed_instruments();
    assert!(listed.len() <= at_start + 8, "{} listed after 4 days, {at_start} at the start", listed.len());
    assert!(listed.iter().all(|i| i.state != InstrumentState::Expired));
    let reply = gpux_protocol::encode_server_text(&ServerMessage::Instruments { id: 1, instruments: gpux_protocol::views::of(&listed) });
    assert!(reply.len() < gpux_protocol::FRAME_BYTES_MAX, "{} bytes", reply.len());

    // Expired a day or less ago: still known; older: retired, once each.
    let held = market.engine().instruments();
    assert!(held.len() > listed.len() + 50, "the last day's expired windows stay known by id");
    assert!(retired.len() > 100, "{} retired", retired.len());
    let unique: std::collections::BTreeSet<_> = retired.iter().map(|i| i.instrument).collect();
    assert_eq!(unique.len(), retired.len(), "each window retires once");
    let now = T0 + 96 * 3_600_000;
    for window in &retired {
        let gpux_engine::ContractKind::Reserved { window_end_ms, .. } = window.contract else { panic!("only windows retire: {window:?}") };
        assert!(window_end_ms + gpux_market::WINDOW_RETENTION_MS <= now);
        assert_eq!(market.engine().instrument(window.instrument), None);
    }
    assert!(held.iter().all(|i| match i.contract {
        gpux_engine::ContractKind::Reserved { window_end_ms, .. } => window_end_ms + gpux_market::WINDOW_RETENTION_MS > now,
        _ => true,
    }));
    assert_eq!(held_by_day[2], held_by_day[3], "flat after the first day's windows retire: {held_by_day:?}");
}

/// Two-sided evidence (docs/market-rules.md "Disputes"): the renter signs
/// "unreachable" for time the supplier reported available. Whichever
/// arrives second, the overlap is disputed: the supplier's share of that
/// time's charge is held (the follow-up `HoldDisputed` is journaled), the
/// renter's record counts it, and at the final bill, with no probe to prove
/// it, the hold is paid to the supplier (a port that does not answer alone
/// proves nothing; the supplier's score is untouched). A reachable
/// observation disputes nothing. Observations out of order, too long, in
/// the future, about another's lease or signed by another key are refused.
#[test]
fn unreachable_evidence_is_held_and_paid_to_the_host_at_the_final_bill_when_nothing_proves_it() {
    use gpux_protocol::ErrorCode;
    let mut session = Harness::new();
    session.run(&Op::Ask { mask: 1, ticks: 0 });
    session.run(&Op::Bid { quantity: 1, ticks: 0, hours: 1 });
    let lease = session.lease(0).expect("a lease");
    let minute = 60_000;
    let payable = |s: &Harness| s.market.engine().balances(s.supplier).expect("supplier").payable_minor;
    let renter_funds = |s: &Harness| {
        let b = s.market.engine().balances(s.renter).expect("renter");
        b.available_minor + b.held_minor
    };
    let observe = |s: &mut Harness, from: u64, to: u64, reachable: bool| {
        let report = LivenessReport::sign(LivenessBody { lease, start_ms: T0 + from, end_ms: T0 + to, reachable }, &s.renter_key);
        let checked = s.market.check_liveness(s.renter, &report, s.now_ms);
        if checked.is_ok() {
            s.apply(JournalEntry::Liveness { at_ms: s.now_ms, account: s.renter, report });
        }
        checked
    };

    // The report first: 20 minutes at 1.5 (units per GPU-hour) charge 0.5,
    // 0.4875 to the supplier after the 2.5% fee.
    session.run(&Op::Advance { ms: 20 * minute });
    session.run(&Op::Report { pick: 0, gpu: 0, minutes: 20, tamper: 2 });
    let (payable_before, renter_before) = (payable(&session), renter_funds(&session));
    assert_eq!(observe(&mut session, 10 * minute, 20 * minute, false), Ok(()));
    assert_eq!(held(&session), Some((10 * minute, 0)), "the follow-up is journaled; nothing proven");
    assert_eq!(payable_before - payable(&session), 243_750, "half the reported time's share held");
    assert_eq!(renter_funds(&session), renter_before, "the renter is not refunded yet");
    assert_eq!(session.market.ledger().balance(LedgerAccount::DisputesHeld), 243_750);

    // The observation first, then the report of the same time.
    session.run(&Op::Advance { ms: 10 * minute });
    assert_eq!(observe(&mut session, 20 * minute, 30 * minute, false), Ok(()));
    assert_eq!(held(&session), None, "nothing reported yet for that time");
    let payable_before = payable(&session);
    session.run(&Op::Report { pick: 0, gpu: 0, minutes: 10, tamper: 2 });
    assert_eq!(held(&session), Some((10 * minute, 0)));
    let charged_share = 243_750;
    assert_eq!(payable(&session), payable_before + charged_share - charged_share, "credited, then held");

    // Reachable time disputes nothing.
    session.run(&Op::Advance { ms: 10 * minute });
    assert_eq!(observe(&mut session, 30 * minute, 40 * minute, true), Ok(()));
    session.run(&Op::Report { pick: 0, gpu: 0, minutes: 10, tamper: 2 });
    assert_eq!(held(&session), None);

    let now = session.now_ms;
    let supplier = session.market.reliability().supplier(session.supplier, now);
    assert_eq!((supplier.disputes, supplier.disputed_gpu_ms), (0, 0), "weak evidence alone costs no score");
    let renter = session.market.disputes().renter(session.renter);
    assert_eq!((renter.observations, renter.unreachable_ms, renter.disputes, renter.disputed_gpu_ms), (3, 20 * minute, 2, 20 * minute));

    // Refused, and nothing recorded.
    let journal_len = session.journal.len();
    assert_eq!(observe(&mut session, 35 * minute, 41 * minute, false), Err(ErrorCode::LivenessInvalid), "overlaps the previous one");
    assert_eq!(observe(&mut session, 40 * minute, 40 * minute, false), Err(ErrorCode::LivenessInvalid), "empty");
    assert_eq!(observe(&mut session, 40 * minute, 101 * minute, false), Err(ErrorCode::LivenessInvalid), "over an hour");
    assert_eq!(observe(&mut session, 40 * minute, 50 * minute, false), Err(ErrorCode::LivenessInvalid), "in the future");
    let body = LivenessBody { lease, start_ms: T0 + 40 * minute, end_ms: T0 + 40 * minute + 1, reachable: false };
    let forged = LivenessReport::sign(body.clone(), &SigningKey::from_bytes(&[8; 32]));
    assert_eq!(session.market.check_liveness(session.renter, &forged, now), Err(ErrorCode::LivenessInvalid), "another key");
    let theirs = LivenessReport::sign(body.clone(), &session.key);
    assert_eq!(session.market.check_liveness(session.supplier, &theirs, now), Err(ErrorCode::UnknownLease), "not the renter's lease");
    let unknown = LivenessReport::sign(LivenessBody { lease: LeaseId(99), ..body }, &session.renter_key);
    assert_eq!(session.market.check_liveness(session.renter, &unknown, now), Err(ErrorCode::UnknownLease));
    // Verified by the caller (a ZIP-215 batch): the key it was verified
    // against must be the renter's; the other rules hold all the same.
    let renter_key = session.renter_key.verifying_key().to_bytes();
    let verified = |key| gpux_market::Signature::VerifiedWith(key);
    let good = LivenessReport::sign(body.clone(), &session.renter_key);
    let other_key = SigningKey::from_bytes(&[8; 32]).verifying_key().to_bytes();
    assert_eq!(session.market.check_liveness_signed(session.renter, &forged, now, verified(other_key)), Err(ErrorCode::LivenessInvalid));
    assert_eq!(session.market.check_liveness_signed(session.renter, &good, now, verified(renter_key)), Ok(()));
    let early = LivenessReport::sign(LivenessBody { start_ms: T0 + 35 * minute, ..body.clone() }, &session.renter_key);
    assert_eq!(session.market.check_liveness_signed(session.renter, &early, now, verified(renter_key)), Err(ErrorCode::LivenessInvalid));
    assert_eq!(session.journal.len(), journal_len, "nothing journaled for them");

    // The rest of the hour reported, the lease ends, the bill is final:
    // the whole hold goes to the supplier, nothing to the renter.
    session.run(&Op::Advance { ms: 20 * minute });
    session.run(&Op::Report { pick: 0, gpu: 0, minutes: 20, tamper: 2 });
    let (payable_before, renter_before) = (payable(&session), renter_funds(&session));
    session.run(&Op::Advance { ms: 11 * minute });
    assert_eq!(decided(&session), Some((20 * minute, 0, 0, 0, 2 * 243_750)));
    assert_eq!(payable(&session), payable_before + 2 * 243_750, "the hold paid to the supplier");
    let released_escrow = renter_funds(&session) - renter_before;
    assert_eq!(session.market.engine().balances(session.renter).expect("renter").held_minor, 0);
    assert!(released_escrow < 100_000, "only the escrow's rounding went back: {released_escrow}");
    assert_eq!(session.market.ledger().balance(LedgerAccount::DisputesHeld), 0);
}

/// The last `HoldDisputed` follow-up, if the last entry is one: (disputed, proven).
fn held(s: &Harness) -> Option<(u64, u64)> {
    match s.journal.last() {
        Some(JournalEntry::Engine(Input { command: Command::HoldDisputed { disputed_gpu_ms, proven_gpu_ms, .. }, .. })) => {
            Some((*disputed_gpu_ms, *proven_gpu_ms))
        }
        _ => None,
    }
}

/// The `DisputeDecided` the session's transfers record last: (disputed,
/// proven, refunded, fee refunded, paid), from the engine's event log.
fn decided(s: &Harness) -> Option<(u64, u64, u64, u64, u64)> {
    s.decided.last().copied()
}

/// The renter's GPU probe (docs/market-rules.md "Disputes"): a GPU it saw
/// absent for time the supplier reported available is proven disputed,
/// whichever arrives first, per GPU; the supplier's score counts it, and at
/// the final bill that time's whole charge (the held share and the fee)
/// goes back to the renter, the rest of the hold to the supplier. The first
/// observation pins the lease's probe key; another key, an observation out
/// of order, for another's lease, out of range or in the future is refused.
#[test]
fn probe_absence_is_proven_and_its_whole_charge_refunded_to_the_renter_at_the_final_bill() {
    use gpux_protocol::{ErrorCode, GpuProbeBody, GpuProbeReport, ProbeGpu};
    let mut session = Harness::new();
    session.run(&Op::Ask { mask: 3, ticks: 0 });
    session.run(&Op::Bid { quantity: 2, ticks: 0, hours: 1 });
    let lease = session.lease(0).expect("a lease");
    let minute = 60_000;
    let probe_key = SigningKey::from_bytes(&[21; 32]);
    let probe = |s: &mut Harness, from: u64, to: u64, absent: &[&str], key: &SigningKey| {
        let gpus = ["GPU-0", "GPU-1"]
            .iter()
            .map(|uuid| ProbeGpu {
                uuid: uuid.to_string(),
                present_samples: if absent.contains(uuid) { 0 } else { 6 },
                utilisation_percent_mean: 50,
                memory_used_mib_max: 1_000,
            })
            .collect();
        let report = GpuProbeReport::sign(GpuProbeBody { lease, start_ms: T0 + from, end_ms: T0 + to, samples: 6, gpus }, key);
        let checked = s.market.check_gpu_probe(s.renter, &report, s.now_ms);
        if checked.is_ok() {
            s.apply(JournalEntry::GpuProbe { at_ms: s.now_ms, account: s.renter, report: Box::new(report) });
        }
        checked
    };
    let renter_available = |s: &Harness| s.market.engine().balances(s.renter).expect("renter").available_minor;
    let fees = |s: &Harness| s.market.ledger().balance(LedgerAccount::Fees);

    // Both GPUs reported for 20 minutes; the probe saw GPU-1 absent for the
    // last 10 of them: proven, held.
    session.run(&Op::Advance { ms: 20 * minute });
    session.run(&Op::Report { pick: 0, gpu: 0, minutes: 20, tamper: 2 });
    session.run(&Op::Report { pick: 0, gpu: 1, minutes: 20, tamper: 2 });
    assert_eq!(probe(&mut session, 0, 10 * minute, &[], &probe_key), Ok(()));
    assert_eq!(held(&session), None, "both present: nothing disputed");
    assert_eq!(probe(&mut session, 10 * minute, 20 * minute, &["GPU-1"], &probe_key), Ok(()));
    assert_eq!(held(&session), Some((10 * minute, 10 * minute)), "GPU-1's 10 minutes, proven");
    // The probe first, then the report of the same time.
    session.run(&Op::Advance { ms: 10 * minute });
    assert_eq!(probe(&mut session, 20 * minute, 30 * minute, &["GPU-1"], &probe_key), Ok(()));
    assert_eq!(held(&session), None, "nothing reported yet");
    session.run(&Op::Report { pick: 0, gpu: 1, minutes: 10, tamper: 2 });
    assert_eq!(held(&session), Some((10 * minute, 10 * minute)));
    session.run(&Op::Report { pick: 0, gpu: 0, minutes: 10, tamper: 2 });
    assert_eq!(held(&session), None, "GPU-0 was present");

    let supplier = session.market.reliability().supplier(session.supplier, session.now_ms);
    assert_eq!((supplier.disputes, supplier.disputed_gpu_ms), (2, 20 * minute), "proven time costs the score");

    // Refused, and nothing journaled.
    let journal_len = session.journal.len();
    let other = SigningKey::from_bytes(&[22; 32]);
    assert_eq!(probe(&mut session, 30 * minute, 31 * minute, &[], &other), Err(ErrorCode::GpuProbeInvalid), "not the lease's probe");
    assert_eq!(probe(&mut session, 25 * minute, 31 * minute, &[], &probe_key), Err(ErrorCode::GpuProbeInvalid), "overlaps");
    assert_eq!(probe(&mut session, 30 * minute, 40 * minute, &[], &probe_key), Err(ErrorCode::GpuProbeInvalid), "in the future");
    assert_eq!(probe(&mut session, 30 * minute, 30 * minute, &[], &probe_key), Err(ErrorCode::GpuProbeInvalid), "empty");
    let body = GpuProbeBody {
        lease,
        start_ms: T0 + 30 * minute,
        end_ms: T0 + 30 * minute + 1,
        samples: 1,
        gpus: vec![ProbeGpu { uuid: "GPU-0".into(), present_samples: 1, utilisation_percent_mean: 0, memory_used_mib_max: 0 }],
    };
    let signed = GpuProbeReport::sign(body.clone(), &probe_key);
    assert_eq!(
        session.market.check_gpu_probe(session.supplier, &signed, session.now_ms),
        Err(ErrorCode::GpuProbeInvalid),
        "not the renter"
    );
    let mut altered = signed.clone();
    altered.body.gpus[0].present_samples = 0;
    assert_eq!(session.market.check_gpu_probe(session.renter, &altered, session.now_ms), Err(ErrorCode::GpuProbeInvalid), "altered");
    // Verified by the caller against a key: the report's own probe key only.
    let other_key = gpux_market::Signature::VerifiedWith(other.verifying_key().to_bytes());
    let probe_verified = gpux_market::Signature::VerifiedWith(probe_key.verifying_key().to_bytes());
    assert_eq!(session.market.check_gpu_probe_signed(session.renter, &signed, session.now_ms, other_key), Err(ErrorCode::GpuProbeInvalid));
    assert_eq!(session.market.check_gpu_probe_signed(session.renter, &signed, session.now_ms, probe_verified), Ok(()));
    assert_eq!(session.journal.len(), journal_len, "nothing journaled for them");

    // The rest reported, the lease ends, the bill is final: 20 minutes of
    // GPU-1 proven: 0.5 back to the renter (0.4875 held, 0.0125 fee), the
    // hold's rest (none) to the supplier.
    session.run(&Op::Advance { ms: 30 * minute });
    session.run(&Op::Report { pick: 0, gpu: 0, minutes: 30, tamper: 2 });
    session.run(&Op::Report { pick: 0, gpu: 1, minutes: 30, tamper: 2 });
    let (available_before, fees_before) = (renter_available(&session), fees(&session));
    session.run(&Op::Advance { ms: 11 * minute });
    assert_eq!(decided(&session), Some((20 * minute, 20 * minute, 487_500, 12_500, 0)));
    let escrow_released = renter_available(&session) - available_before - 500_000;
    assert!(escrow_released < 100_000, "the refund, and the escrow's rounding: {escrow_released}");
    assert_eq!(fees(&session), fees_before - 12_500, "the fee on undelivered time is not the exchange's");
    assert_eq!(session.market.ledger().balance(LedgerAccount::DisputesHeld), 0);
}

/// Preemptions honoured late count in the supplier's record: a preempted
/// lease whose host reports its workload stopped within a minute of the
/// end is on time; one stopped later, or never before its bill closes, is
/// late. A supplier gone while it supplies leases counts a disconnect.
#[test]
fn late_preemptions_and_disconnects_during_leases_count_in_the_record() {
    const PREEMPT: InstrumentId = InstrumentId(1);
    let mut session = Harness::new();
    session.command(Command::register(AccountId(0), "h", "GPU-2", GpuSpec::h100_sxm()));
    let running = DeliveryState::Running { endpoints: Vec::new(), ssh: None, restarts: 0 };
    let mut preempted = Vec::new();
    for gpu in 0..3u32 {
        let mask = 1u64 << gpu;
        let supply = Some(GpuSet { host: HostId(0), gpu_mask: mask });
        let next = session.next_order;
        session.next_order += 3;
        let preemptible_ask = NewOrder { supply, ..NewOrder::limit(session.supplier, next, PREEMPT, Side::Sell, 800_000, 1) };
        session.command(Command::place(preemptible_ask));
        let bid = NewOrder {
            duration: LeaseDuration::UntilCancelled,
            ..NewOrder::limit(session.renter, next + 1, PREEMPT, Side::Buy, 800_000, 1)
        };
        session.command(Command::place(bid));
        let lease = *session.leases.last().expect("the preemptible lease");
        session.apply(JournalEntry::DeliveryStatus { at_ms: session.now_ms, account: session.supplier, lease, state: running.clone() });
        let spot_ask = NewOrder { supply, ..NewOrder::limit(session.supplier, next + 2, SPOT, Side::Sell, 2_000_000, 1) };
        session.command(Command::place(spot_ask));
        preempted.push(lease);
    }
    // A spot bid takes all three GPUs: each preemptible lease gets its notice.
    let bid = NewOrder { duration: LeaseDuration::Hours(4), ..NewOrder::limit(session.renter, 900, SPOT, Side::Buy, 2_000_000, 3) };
    session.command(Command::place(bid));
    session.run(&Op::Advance { ms: 30_000 });
    for lease in &preempted {
        assert!(!session.market.engine().lease(*lease).expect("held").active, "preempted");
    }
    let stopped = |session: &mut Harness, lease| {
        let entry = JournalEntry::DeliveryStatus { at_ms: session.now_ms, account: session.supplier, lease, state: DeliveryState::Stopped };
        session.apply(entry);
    };
    let late = |session: &Harness| session.market.reliability().supplier(session.supplier, session.now_ms).preemptions_late;
    session.now_ms += 10_000;
    stopped(&mut session, preempted[0]);
    assert_eq!(late(&session), 0, "stopped 10 s after the end: on time");
    session.now_ms += 2 * 60_000;
    stopped(&mut session, preempted[1]);
    assert_eq!(late(&session), 1, "stopped over a minute after the end: late");
    // The third is never reported stopped: late once its bill is final (no
    // report came: provisional at the grace, final at the window's end).
    session.run(&Op::Advance { ms: 10 * 60_000 });
    assert_eq!(late(&session), 1, "not yet: its bill is provisional");
    session.run(&Op::Advance { ms: LATE_WINDOW_MS });
    assert!(session.market.engine().lease(preempted[2]).expect("held").billing_closed);
    assert_eq!(late(&session), 2);
    let record = session.market.reliability().supplier(session.supplier, session.now_ms);
    assert_eq!(record.disconnects_during_leases, 0);

    // The supplier's agent goes while the spot leases run.
    session.apply(JournalEntry::SupplierDisconnected { at_ms: session.now_ms, account: session.supplier });
    let record = session.market.reliability().supplier(session.supplier, session.now_ms);
    assert_eq!(record.disconnects_during_leases, 1);
    assert_eq!(session.market.reliability().host(HostId(0), session.now_ms).disconnects_during_leases, 1, "and its host");
    // Without active leases it is no fact.
    let renter = session.renter;
    session.apply(JournalEntry::SupplierDisconnected { at_ms: session.now_ms, account: renter });
    assert_eq!(session.market.reliability().supplier(renter, session.now_ms).disconnects_during_leases, 0);
}

/// A journal's genesis listing replaces the listing of a market nothing has
/// happened in; anywhere later it breaks the journal and is refused.
#[test]
fn a_genesis_listing_starts_the_market_and_is_refused_after_anything_happened() {
    let mut listing = EngineConfig::demo();
    listing.currency = Currency { code: "CNY".into(), decimals: 2 };
    listing.classes.truncate(2);
    let mut market = MarketState::new(EngineConfig::demo()).expect("demo");
    assert!(market.is_pristine());
    market.apply(&JournalEntry::Genesis { listing: Box::new(listing.clone()) }).expect("genesis");
    assert_eq!(market.engine().config(), &listing);
    assert_eq!(market.engine().listed_instruments().len(), 4, "spot and preemptible of two classes, no window yet");
    market.apply(&JournalEntry::Engine(Input { at_ms: 1_000, command: Command::Tick })).expect("tick");
    assert!(!market.is_pristine());
    let error = market.apply(&JournalEntry::Genesis { listing: Box::new(EngineConfig::demo()) }).expect_err("not first");
    assert!(matches!(error, gpux_market::MarketError::GenesisNotFirst), "{error}");
    let mut broken = EngineConfig::demo();
    broken.classes.clear();
    let mut fresh = MarketState::new(EngineConfig::demo()).expect("demo");
    let error = fresh.apply(&JournalEntry::Genesis { listing: Box::new(broken) }).expect_err("invalid");
    assert!(matches!(error, gpux_market::MarketError::GenesisInvalid(ConfigError::ClassCount)), "{error}");
}
