//! The exchange as the simulator runs it: `gpux_market::MarketState`, the
//! state the exchange's sequencer owns, driven in-process on simulated time
//! through the same `apply(JournalEntry)` the sequencer, its recovery and
//! the audit use. The simulator keeps its own journal since the last
//! snapshot, so that a simulated restart rebuilds the state by replay and
//! proves it came back the same.
//!
//! A broken invariant (the ledger refused a posting) stops the run: money
//! must balance.

use gpux_engine::{AccountId, Command, Engine, EngineConfig, Event, Input};
use gpux_market::{Applied, JournalEntry, MarketState};
use gpux_protocol::UsageReport;
use gpux_settlement::ledger::Ledger;
use gpux_settlement::{Settlement, UsageOutcome, UsageRejectCode};

pub use gpux_market::HotState;

pub struct SimExchange {
    market: MarketState,
    /// The last snapshot and the journal since it; `None` when not recording.
    snapshot: Option<(MarketState, Vec<JournalEntry>)>,
    /// Every entry since the start, when asked for (`SimConfig::record_journal`).
    journal: Option<Vec<JournalEntry>>,
    pub events_applied: u64,
    pub transfers_posted: u64,
    pub reports_settled: u64,
    /// Journal entries applied, and their bytes as the journal encodes them
    /// (the growth docs/operations.md plans the data directory by).
    pub journal_entries: u64,
    pub journal_entry_bytes: u64,
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
        Self::with_journal(None)
    }

    /// An exchange that keeps every entry it applies, so the run's journal
    /// can be written to an exchange's journal file and replayed there.
    pub fn recording() -> Self {
        Self::with_journal(Some(Vec::new()))
    }

    fn with_journal(journal: Option<Vec<JournalEntry>>) -> Self {
        let mut exchange = SimExchange {
            market: MarketState::new(EngineConfig::demo()).expect("the demo config is valid"),
            snapshot: None,
            journal,
            events_applied: 0,
            transfers_posted: 0,
            reports_settled: 0,
            journal_entries: 0,
            journal_entry_bytes: 0,
        };
        // As the exchange does at its first start: reports are checked by ZIP-215.
        exchange.record(JournalEntry::SignatureRule { rule: gpux_settlement::SignatureRule::Zip215 });
        exchange.record(JournalEntry::JobRules { version: gpux_market::jobs::JOB_RULES });
        let version = gpux_engine::limits::SHARE_RULES;
        exchange.record(JournalEntry::Engine(Input { at_ms: 0, command: Command::SetShareRules { version } }));
        // And as its default flags say: late reports are billed for a day
        // after the grace (docs/market-rules.md "Late reports").
        let window_ms = gpux_engine::limits::LATE_REPORT_WINDOW_MS_DEFAULT;
        exchange.record(JournalEntry::Engine(Input { at_ms: 0, command: Command::SetLateReportWindow { window_ms } }));
        exchange
    }

    /// Every entry applied since the start (empty unless `recording`).
    pub fn journal(&self) -> &[JournalEntry] {
        self.journal.as_deref().unwrap_or_default()
    }

    pub fn engine(&self) -> &Engine {
        self.market.engine()
    }

    pub fn market(&self) -> &MarketState {
        &self.market
    }

    /// The encoded size of the state a snapshot holds: engine, settlement
    /// and ledger, in bytes (what grows with the market's history).
    pub fn hot_state_bytes(&self) -> HotState {
        self.market.hot_state_bytes()
    }

    pub fn ledger(&self) -> &Ledger {
        self.market.ledger()
    }

    pub fn settlement(&self) -> &Settlement {
        self.market.settlement()
    }

    /// The next usage report is `report` from `account`, verified under
    /// ZIP-215 against `key` already (as the gateway marks it).
    pub fn mark_report_checked(&mut self, account: AccountId, key: [u8; 32], report: &UsageReport) {
        self.market.mark_report_checked(account, key, report);
    }

    /// Binds an account to its public key, as the exchange does at first login.
    pub fn register_key(&mut self, account: AccountId, public_key: [u8; 32]) {
        self.record(JournalEntry::BindKey { public_key, account });
    }

    /// The supplier's hosts take workloads (the simulated hosts run jobs):
    /// it publishes the encryption key workloads' secrets are sealed to,
    /// so jobs' bids may trade with its asks (docs/market-rules.md "Delivery").
    pub fn publish_encryption_key(&mut self, account: AccountId, identity: &ed25519_dalek::SigningKey) {
        // A secret of its own, derived from the simulated identity's seed.
        let mut secret = identity.to_bytes();
        secret.iter_mut().for_each(|b| *b ^= 0x5a);
        let key = gpux_protocol::delivery::EncryptionKey::from_bytes(secret);
        self.record(JournalEntry::EncryptionKey { account, key: key.public(), signature: key.certify(identity) });
    }

    /// Sequences one command; its events are appended to `events`.
    /// Then the commands the market rules call for (a job's next bid, its
    /// leases ended), each as its own entry, as the sequencer journals them.
    pub fn apply(&mut self, input: Input, events: &mut Vec<Event>) {
        let applied = self.record(JournalEntry::Engine(input));
        events.extend_from_slice(&applied.events);
        for command in applied.follow_ups {
            let at_ms = self.market.clock_ms();
            self.apply(Input { at_ms, command }, events);
        }
    }

    /// Applies a market entry (a job's submission, a host's delivery
    /// status, a silent job lease), then the commands it calls for.
    pub fn entry(&mut self, entry: JournalEntry, events: &mut Vec<Event>) -> Applied {
        let applied = self.record(entry);
        events.extend_from_slice(&applied.events);
        for command in applied.follow_ups.clone() {
            let at_ms = self.market.clock_ms();
            self.apply(Input { at_ms, command }, events);
        }
        applied
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
        let applied = self.record(JournalEntry::usage(at_ms, account, report.clone()));
        events.extend_from_slice(&applied.events);
        let outcome = applied.usage.expect("a usage report has an outcome");
        // Time the renter's evidence disputes: withheld, as the sequencer journals it.
        for command in applied.follow_ups {
            let at_ms = self.market.clock_ms();
            self.apply(Input { at_ms, command }, events);
        }
        outcome
    }

    /// A supplier's last session closed (its host went down): a fact of its
    /// record if it supplies active leases, journaled as the sequencer does.
    pub fn supplier_disconnected(&mut self, at_ms: u64, account: AccountId) {
        if !self.market.engine().active_leases_supplied(account).is_empty() {
            self.record(JournalEntry::SupplierDisconnected { at_ms, account });
        }
    }

    /// A renter's liveness observation received at `at_ms` (checked as the
    /// sequencer checks it), then the follow-up it calls for.
    pub fn liveness(&mut self, at_ms: u64, account: AccountId, report: gpux_protocol::LivenessReport, events: &mut Vec<Event>) {
        self.evidence(JournalEntry::Liveness { at_ms, account, report }, events);
    }

    /// A renter's GPU probe observation received at `at_ms` (checked as the
    /// sequencer checks it), then the follow-up it calls for.
    pub fn gpu_probe(&mut self, at_ms: u64, account: AccountId, report: gpux_protocol::GpuProbeReport, events: &mut Vec<Event>) {
        self.evidence(JournalEntry::GpuProbe { at_ms, account, report: Box::new(report) }, events);
    }

    fn evidence(&mut self, entry: JournalEntry, events: &mut Vec<Event>) {
        let applied = self.record(entry);
        events.extend_from_slice(&applied.events);
        for command in applied.follow_ups {
            let at_ms = self.market.clock_ms();
            self.apply(Input { at_ms, command }, events);
        }
    }

    /// Applies a hardware challenge's entry, then the engine command the
    /// market calls for (as the sequencer journals it); its events are
    /// appended to `events`.
    pub fn challenge(&mut self, entry: JournalEntry, events: &mut Vec<Event>) {
        let applied = self.record(entry);
        events.extend_from_slice(&applied.events);
        for command in applied.follow_ups {
            let at_ms = self.market.clock_ms();
            self.apply(Input { at_ms, command }, events);
        }
    }

    /// Applies one entry through the market's one apply path and records it.
    fn record(&mut self, entry: JournalEntry) -> Applied {
        let applied = self.market.apply(&entry).expect("the ledger accepts every engine event");
        self.events_applied += applied.events.len() as u64;
        self.transfers_posted += applied.transfers.len() as u64;
        self.journal_entries += 1;
        self.journal_entry_bytes += gpux_protocol::encode_record(&entry).len() as u64;
        debug_assert_eq!(self.market.ledger().sum(), 0);
        if let Some(journal) = &mut self.journal {
            journal.push(entry.clone());
        }
        if let Some((_, journal)) = &mut self.snapshot {
            journal.push(entry);
        }
        applied
    }

    /// Takes a snapshot (as the exchange does periodically) and journals
    /// everything after it.
    pub fn snapshot(&mut self) {
        self.snapshot = Some((self.market.clone(), Vec::new()));
    }

    /// Simulates a crash and restart: throws the live state away, restores the
    /// last snapshot and replays the journal since it, then compares with the
    /// state the crash threw away.
    pub fn restart(&mut self) -> Option<RestartCheck> {
        let (mut market, journal) = self.snapshot.take()?;
        for entry in &journal {
            market.apply(entry).expect("replay posts what the live run posted");
        }
        let check = RestartCheck {
            replayed_entries: journal.len() as u64,
            hash_before: self.market.state_hash(),
            hash_after: market.state_hash(),
            ledger_matches: format!("{:?}", market.ledger()) == format!("{:?}", self.market.ledger()),
        };
        self.market = market;
        Some(check)
    }
}

impl Default for SimExchange {
    fn default() -> Self {
        SimExchange::new()
    }
}
