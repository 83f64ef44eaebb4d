//! One apply path: the exchange (live and in recovery), the simulator and
//! the audit all change the market through `gpux_market::MarketState::apply`,
//! so the same journal must give the same state hash in each. These tests
//! guard that they keep sharing it: a second copy of the apply logic that
//! drifted would show up here as a different hash.

mod common;

use std::path::Path;

use gpux_engine::EngineConfig;
use gpux_exchange::snapshots::SnapshotStore;
use gpux_journal::{Journal, JournalEntry};
use gpux_market::MarketState;
use gpux_sim::{Sim, SimConfig};

/// The audit's replay of a journal file, and its state hash.
fn audit_hash(journal: &Path) -> u64 {
    let mut market = MarketState::new(EngineConfig::demo()).expect("demo config");
    gpux_audit::replay_journal(journal, &mut market, &mut std::io::sink(), false).expect("the audit replays the journal");
    market.state_hash()
}

/// The exchange's recovery from a data directory (no snapshot: the whole journal).
fn recovered_hash(data_dir: &Path) -> u64 {
    let journal = Journal::open(&data_dir.join("journal.redb")).expect("journal");
    common::recover(journal, data_dir).expect("the exchange recovers").state_hash()
}

/// A simulated day (trades, leases, signed usage reports, cheats, restarts)
/// written to an exchange journal file: the exchange's recovery and the
/// audit both end at the simulator's state.
#[test]
fn a_simulated_days_journal_gives_the_simulators_state_in_the_exchange_and_the_audit() {
    let mut sim = Sim::new(SimConfig { suppliers: 30, renters: 120, days: 1, record_journal: true, ..SimConfig::small(5) });
    sim.run(|_| {});
    let entries = sim.exchange.journal();
    let reports = entries.iter().filter(|e| e.usage_report().is_some()).count();
    let observations = entries.iter().filter(|e| matches!(e, JournalEntry::Liveness { .. })).count();
    // Every supplier's host key is bound, and the key of every other renter
    // (those that sign liveness observations of their leases).
    let bindings = entries.iter().filter(|e| matches!(e, JournalEntry::BindKey { .. })).count();
    assert!(
        entries.len() > 2_000 && reports > 200 && observations > 100 && bindings == 30 + 60,
        "{} entries, {reports} reports, {observations} liveness observations, {bindings} key bindings",
        entries.len()
    );
    assert!(sim.exchange.ledger().transfer_count() > 1_000, "money moved");
    let expected = sim.exchange.market().state_hash();

    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("journal.redb");
    {
        let mut journal = Journal::open(&path).expect("journal");
        for batch in entries.chunks(4_096) {
            journal.append(batch).expect("append");
        }
    }
    assert_eq!(audit_hash(&path), expected, "the audit reaches the simulator's state");
    assert_eq!(recovered_hash(dir.path()), expected, "the exchange's recovery reaches the simulator's state");
}

/// The journal's oldest entries archived (docs/operations.md "Archiving the
/// journal"): the exchange restarts from its snapshot and the rest, the audit
/// replays the archive and the journal as one, and without a snapshot the
/// archive, restored, gives the whole journal back.
#[test]
fn an_archived_journal_recovers_from_its_snapshot_audits_whole_and_restores() {
    use gpux_exchange::archive::{self, ArchiveRefused};
    let mut sim = Sim::new(SimConfig { suppliers: 20, renters: 60, days: 1, record_journal: true, ..SimConfig::small(7) });
    sim.run(|_| {});
    let entries = sim.exchange.journal();
    let expected = sim.exchange.market().state_hash();
    let dir = tempfile::tempdir().expect("temp dir");
    let (journal_path, archive_path) = (dir.path().join("journal.redb"), dir.path().join("archive-2026.redb"));
    {
        let mut journal = Journal::open(&journal_path).expect("journal");
        for batch in entries.chunks(4_096) {
            journal.append(batch).expect("append");
        }
    }
    assert!(matches!(
        archive::archive(dir.path(), None, &archive_path).map_err(|e| e.downcast::<ArchiveRefused>()),
        Err(Ok(ArchiveRefused::NoSnapshot))
    ));
    // A snapshot two thirds in, as the exchange writes them.
    let snapshot_seq = entries.len() as u64 * 2 / 3;
    let mut market = MarketState::new(EngineConfig::demo()).expect("demo config");
    for entry in &entries[..snapshot_seq as usize] {
        market.apply(entry).expect("applies");
    }
    let snapshots = SnapshotStore::open(&dir.path().join("snapshots.redb")).expect("snapshots");
    snapshots.write(&gpux_exchange::snapshots::Snapshot { journal_seq: snapshot_seq, market }).expect("a snapshot");
    drop(snapshots);

    match archive::archive(dir.path(), Some(snapshot_seq + 2), &archive_path).map_err(|e| e.downcast::<ArchiveRefused>()) {
        Err(Ok(ArchiveRefused::AfterTheSnapshot { snapshot, .. })) => assert_eq!(snapshot, snapshot_seq),
        other => panic!("past the snapshot: {other:?}"),
    }
    let outcome = archive::archive(dir.path(), None, &archive_path).expect("archived");
    assert_eq!((outcome.copied, outcome.first_kept), (snapshot_seq, snapshot_seq + 1));

    assert_eq!(recovered_hash(dir.path()), expected, "the exchange restarts from the snapshot and the rest");
    let mut market = MarketState::new(EngineConfig::demo()).expect("demo config");
    let replayed = gpux_audit::replay_journals(&[&archive_path, &journal_path], &mut market, &mut std::io::sink(), false).expect("replays");
    assert_eq!((replayed, market.state_hash()), (entries.len() as u64, expected), "the audit of the archive and the rest");
    let mut market = MarketState::new(EngineConfig::demo()).expect("demo config");
    let alone = gpux_audit::replay_journals(&[&journal_path], &mut market, &mut std::io::sink(), false);
    assert!(format!("{:#}", alone.expect_err("not from entry 1")).contains("name the archives"));
    let reader = gpux_journal::JournalReader::open(&journal_path).expect("reader");
    assert_eq!(reader.genesis_listing().expect("the listing, kept").currency, EngineConfig::demo().currency);
    drop(reader);

    // No snapshot serves (one an older version wrote): the recovery says
    // what is missing; restored, the journal is whole again.
    std::fs::remove_file(dir.path().join("snapshots.redb")).expect("drop the snapshots");
    let journal = Journal::open(&journal_path).expect("journal");
    let refused = common::recover(journal, dir.path());
    let Err(refused) = refused else { panic!("recovered without the archived entries") };
    assert!(refused.contains("gpux-exchange journal restore"), "{refused}");
    assert_eq!(archive::restore(dir.path(), &archive_path).expect("restored"), snapshot_seq);
    assert_eq!(audit_hash(&journal_path), expected, "the journal is whole again");
    assert_eq!(recovered_hash(dir.path()), expected);
}

/// A live exchange traded on by the live simulated market (real sockets):
/// the state hash it prints when it stops is the one the audit and a
/// recovery reach from its journal.
#[test]
fn a_live_exchanges_journal_gives_its_state_in_the_audit_and_a_recovery() {
    let dir = tempfile::tempdir().expect("temp dir");
    let operator = ed25519_dalek::SigningKey::from_bytes(&[42; 32]);
    let mut config = gpux_test_exchange::config(dir.path(), operator.verifying_key().to_bytes());
    config.billing = common::demo_billing();
    config.job_store = None;
    let mut exchange = gpux_test_exchange::InProcess::start(config);
    let url = exchange.url.clone();
    let options = gpux_sim::live::LiveOptions { url, operator_key: operator, suppliers: 4, renters: 6, seed: 9 };
    std::thread::spawn(move || {
        let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
        // Ends with an error when the exchange stops; that is the point.
        let _ = runtime.block_on(gpux_sim::live::run(options));
    });
    // The live suppliers report usage every 10 s of a lease: 25 s holds
    // trades, leases and a round or two of reports.
    std::thread::sleep(std::time::Duration::from_secs(25));
    let printed = exchange.stop().expect("the exchange stops cleanly");

    let journal_path = dir.path().join("journal.redb");
    let entries = gpux_journal::JournalReader::open(&journal_path).expect("journal").entries_after(0).expect("entries");
    let reports = entries.iter().filter(|e| e.usage_report().is_some()).count();
    assert!(reports >= 1, "the live market reported usage: {reports} reports in {} entries", entries.len());
    assert_eq!(audit_hash(&journal_path), printed, "the audit reaches the state the exchange stopped at");
    // The stop wrote a snapshot; a recovery from the journal alone must agree too.
    std::fs::remove_file(dir.path().join("snapshots.redb")).expect("drop the snapshots");
    assert_eq!(recovered_hash(dir.path()), printed, "a recovery from the journal alone reaches it");
}

/// Sub-accounts, scoped keys (added and revoked) and a lease resold on the
/// resale book, as journal entries: the audit and a recovery reach the
/// state the market reached applying them.
#[test]
fn sub_accounts_keys_and_a_resold_lease_replay_alike_in_the_audit_and_a_recovery() {
    use gpux_engine::*;
    const T0: u64 = 1_796_223_660_000;
    const HOUR: u64 = 3_600_000;
    let mut market = MarketState::new(EngineConfig::demo()).expect("demo config");
    let mut entries = Vec::new();
    let mut apply = |entry: JournalEntry| -> Vec<Event> {
        let applied = market.apply(&entry).expect("applies");
        entries.push(entry);
        applied.events
    };
    let at = |at_ms: u64, command: Command| JournalEntry::Engine(Input { at_ms, command });
    let (renter, supplier, sub) = (AccountId(0), AccountId(1), AccountId(2));
    // As an exchange's journal starts (else its recovery adds these entries).
    apply(JournalEntry::SignatureRule { rule: gpux_settlement::SignatureRule::Zip215 });
    apply(JournalEntry::JobRules { version: gpux_market::jobs::JOB_RULES });
    apply(at(T0, Command::SetLateReportWindow { window_ms: gpux_exchange::LATE_REPORT_WINDOW_MS_DEFAULT }));
    apply(at(T0, Command::SetShareRules { version: gpux_engine::limits::SHARE_RULES }));
    apply(at(T0, Command::OpenAccount { role: Role::Aggregator }));
    apply(JournalEntry::BindKey { public_key: [1; 32], account: renter });
    apply(at(T0, Command::OpenAccount { role: Role::Supplier }));
    apply(JournalEntry::BindKey { public_key: [2; 32], account: supplier });
    apply(at(T0, Command::Deposit { account: renter, amount_minor: 100_000_000 }));
    apply(at(T0, Command::OpenSubAccount { parent: renter }));
    apply(at(T0, Command::MoveFunds { parent: renter, sub_account: sub, amount_minor: 40_000_000, to_sub_account: true }));
    let limits = AccountLimits { max_open_orders: Some(5), max_order_minor: None, max_held_minor: Some(30_000_000) };
    apply(at(T0, Command::SetAccountLimits { parent: renter, sub_account: sub, limits }));
    let scopes = gpux_protocol::Scopes::of(&[gpux_protocol::Scope::Read, gpux_protocol::Scope::Trade]);
    apply(JournalEntry::AddKey {
        at_ms: T0,
        by: renter,
        account: sub,
        public_key: [3; 32],
        scopes,
        expires_at_ms: None,
        label: "c".into(),
    });
    apply(JournalEntry::AddKey {
        at_ms: T0,
        by: renter,
        account: sub,
        public_key: [4; 32],
        scopes,
        expires_at_ms: Some(T0 + HOUR),
        label: String::new(),
    });
    apply(JournalEntry::RevokeKey { at_ms: T0, by: renter, public_key: [3; 32] });
    for index in 0..2 {
        let register = Command::register(supplier, "h", &format!("GPU-{index}"), GpuSpec::h100_sxm());
        apply(at(T0, register));
    }
    let spot = InstrumentId(0);
    let mut ask = NewOrder::limit(supplier, 1, spot, Side::Sell, 2_000_000, 2);
    ask.supply = Some(GpuSet { host: HostId(0), gpu_mask: 0b11 });
    apply(at(T0, Command::place(ask)));
    let mut bid = NewOrder::limit(sub, 2, spot, Side::Buy, 2_000_000, 2);
    bid.duration = LeaseDuration::Hours(4);
    let events = apply(at(T0, Command::place(bid)));
    let lease = events.iter().find_map(|e| match e.kind {
        EventKind::LeaseCreated { lease, .. } => Some(lease),
        _ => None,
    });
    let lease = lease.expect("the sub-account rents");
    let offer = Command::OfferLease {
        account: sub,
        lease,
        client_order_id: 3,
        price_minor_per_gpu_hour: 2_500_000,
        time_in_force: TimeInForce::Gtc,
    };
    let events = apply(at(T0 + HOUR, offer));
    let book = events.iter().find_map(|e| match e.kind {
        EventKind::OrderAccepted { instrument, side: Side::Sell, .. } => Some(instrument),
        _ => None,
    });
    let mut take = NewOrder::limit(renter, 4, book.expect("the resale book"), Side::Buy, 2_500_000, 2);
    take.duration = LeaseDuration::Hours(3);
    let events = apply(at(T0 + HOUR, Command::place(take)));
    assert!(events.iter().any(|e| matches!(e.kind, EventKind::LeaseEnded { reason: LeaseEndReason::Resold, .. })), "resold");
    apply(at(T0 + 2 * HOUR, Command::Tick));
    let expected = market.state_hash();

    let dir = tempfile::tempdir().expect("temp dir");
    {
        let mut journal = Journal::open(&dir.path().join("journal.redb")).expect("journal");
        journal.append(&entries).expect("append");
    }
    assert_eq!(audit_hash(&dir.path().join("journal.redb")), expected, "the audit reaches the market's state");
    assert_eq!(recovered_hash(dir.path()), expected, "a recovery reaches it too");
}
