//! The exchange as the simulator runs it: the real engine, the real
//! settlement and the real ledger, driven in-process on simulated time, with
//! the journal and snapshots the exchange process keeps so that a simulated
//! restart rebuilds the state by replay and proves it came back the same.
//!
//! Every command and every usage report passes through here, exactly as
//! through the exchange's sequencer: journaled, applied, its events posted to
//! the ledger (a ledger error stops the run: money must balance).

use gpux_engine::{AccountId, Engine, EngineConfig, Event, Input};
use gpux_protocol::UsageReport;
use gpux_settlement::ledger::Ledger;
use gpux_settlement::{settle_report, Settlement, UsageOutcome, UsageRejectCode};
use rustc_hash::FxHashMap;

/// One journaled entry: a command, or a usage report (whose outcome replay
/// recomputes, as the exchange's recovery does).
#[derive(Clone)]
enum JournalEntry {
    Input(Input),
    Report { at_ms: u64, account: AccountId, report: Box<UsageReport> },
}

#[derive(Clone)]
struct State {
    engine: Engine,
    settlement: Settlement,
    ledger: Ledger,
}

pub struct SimExchange {
    state: State,
    /// Host keys by account, as the gateway learns them at login.
    keys: FxHashMap<AccountId, [u8; 32]>,
    /// The last snapshot and the journal since it; `None` when not recording.
    snapshot: Option<(State, Vec<JournalEntry>)>,
    pub events_applied: u64,
    pub transfers_posted: u64,
    pub reports_settled: u64,
}

/// Encoded sizes of the exchange's state, bytes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct HotState {
    pub engine: u64,
    pub settlement: u64,
    pub ledger: u64,
}

/// What a restart found: the state hash before and after replay.
pub struct RestartCheck {
    pub replayed_entries: u64,
    pub hash_before: u64,
    pub hash_after: u64,
    pub ledger_matches: bool,
}

impl SimExchange {
    pub fn new() -> Self {
        let engine = Engine::new(EngineConfig::demo()).expect("the demo config is valid");
        SimExchange {
            state: State { engine, settlement: Settlement::default(), ledger: Ledger::new() },
            keys: FxHashMap::default(),
            snapshot: None,
            events_applied: 0,
            transfers_posted: 0,
            reports_settled: 0,
        }
    }

    pub fn engine(&self) -> &Engine {
        &self.state.engine
    }

    /// Drops settlement state of leases whose billing closed, as the
    /// exchange does when it takes a snapshot.
    pub fn forget_closed(&mut self) {
        let engine = &self.state.engine;
        self.state.settlement.forget_closed(|lease| engine.lease(lease).is_none_or(|l| l.billing_closed));
    }

    /// The encoded size of the state a snapshot holds: engine, settlement
    /// and ledger, in bytes (what grows with the market's history).
    pub fn hot_state_bytes(&self) -> HotState {
        HotState {
            engine: gpux_protocol::encode_record(&self.state.engine).len() as u64,
            settlement: gpux_protocol::encode_record(&self.state.settlement).len() as u64,
            ledger: gpux_protocol::encode_record(&self.state.ledger).len() as u64,
        }
    }

    pub fn ledger(&self) -> &Ledger {
        &self.state.ledger
    }

    pub fn settlement(&self) -> &Settlement {
        &self.state.settlement
    }

    pub fn register_key(&mut self, account: AccountId, public_key: [u8; 32]) {
        self.keys.insert(account, public_key);
    }

    /// Sequences one command; its events are appended to `events`.
    pub fn apply(&mut self, input: Input, events: &mut Vec<Event>) {
        let applied = self.state.engine.apply(&input);
        events.extend_from_slice(applied);
        let from = events.len() - applied.len();
        self.post(&events[from..]);
        if let Some((_, journal)) = &mut self.snapshot {
            journal.push(JournalEntry::Input(input));
        }
    }

    /// Settles one usage report received at `at_ms` from `account`.
    pub fn report(
        &mut self,
        at_ms: u64,
        account: AccountId,
        report: &UsageReport,
        events: &mut Vec<Event>,
    ) -> Result<UsageOutcome, UsageRejectCode> {
        self.reports_settled += 1;
        let key = self.keys.get(&account).copied().unwrap_or([0; 32]);
        let (outcome, settled) = settle_report(&mut self.state.engine, &mut self.state.settlement, &key, at_ms, account, report);
        self.post(&settled);
        events.extend_from_slice(&settled);
        if let Some((_, journal)) = &mut self.snapshot {
            journal.push(JournalEntry::Report { at_ms, account, report: Box::new(report.clone()) });
        }
        outcome
    }

    fn post(&mut self, events: &[Event]) {
        self.events_applied += events.len() as u64;
        for event in events {
            let transfers = self.state.ledger.apply(event).expect("the ledger accepts every engine event");
            self.transfers_posted += transfers.len() as u64;
        }
        debug_assert_eq!(self.state.ledger.sum(), 0);
    }

    /// Takes a snapshot (as the exchange does periodically) and journals
    /// everything after it.
    pub fn snapshot(&mut self) {
        self.forget_closed();
        self.snapshot = Some((self.state.clone(), Vec::new()));
    }

    /// Simulates a crash and restart: throws the live state away, restores the
    /// last snapshot and replays the journal since it, then compares with the
    /// state the crash threw away.
    pub fn restart(&mut self) -> Option<RestartCheck> {
        let (snapshot, journal) = self.snapshot.take()?;
        let hash_before = self.state.engine.state_hash();
        let ledger_before = format!("{:?}", self.state.ledger);
        let mut state = snapshot;
        for entry in &journal {
            match entry {
                JournalEntry::Input(input) => {
                    let events = state.engine.apply(input).to_vec();
                    for event in &events {
                        state.ledger.apply(event).expect("replay posts what the live run posted");
                    }
                }
                JournalEntry::Report { at_ms, account, report } => {
                    let key = self.keys.get(account).copied().unwrap_or([0; 32]);
                    let (_, events) = settle_report(&mut state.engine, &mut state.settlement, &key, *at_ms, *account, report);
                    for event in &events {
                        state.ledger.apply(event).expect("replay posts what the live run posted");
                    }
                }
            }
        }
        let check = RestartCheck {
            replayed_entries: journal.len() as u64,
            hash_before,
            hash_after: state.engine.state_hash(),
            ledger_matches: format!("{:?}", state.ledger) == ledger_before,
        };
        self.state = state;
        Some(check)
    }
}

impl Default for SimExchange {
    fn default() -> Self {
        SimExchange::new()
    }
}
