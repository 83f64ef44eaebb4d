//! The sequencer without IO: a memory journal and memory snapshots stand in
//! for the redb files, requests are handed over as the gateway would, and
//! what comes back is read from each connection's queue.

use std::collections::BTreeSet;
use std::sync::Arc;

use gpux_engine::{AccountId, Command, EngineConfig, Role};
use gpux_gateway::link::{Body, Clock, ConnectionId, DeliveryRequest, HistoryRequest, Outbound, Outgoing, Request};
use gpux_journal::{JournalEntry, MemoryJournal};
use gpux_market::MarketState;
use gpux_protocol::{DeliveryState, ErrorCode, ServerMessage};
use tokio::sync::{mpsc, Notify};

use super::{BillingPolicy, Sequencer, SequencerError};
use crate::metrics::Metrics;
use crate::snapshots::MemorySnapshots;

const OPERATOR: [u8; 32] = [9; 32];

fn recover(journal: &MemoryJournal, snapshots: &MemorySnapshots) -> (Sequencer, super::Recovery) {
    recover_at(journal, snapshots, 0)
}

/// A restart with the exchange clock `offset_ms` ahead of the wall clock.
fn recover_at(journal: &MemoryJournal, snapshots: &MemorySnapshots, offset_ms: i64) -> (Sequencer, super::Recovery) {
    recover_with(journal, snapshots, EngineConfig::demo(), offset_ms)
}

fn recover_with(
    journal: &MemoryJournal,
    snapshots: &MemorySnapshots,
    config: EngineConfig,
    offset_ms: i64,
) -> (Sequencer, super::Recovery) {
    let billing = BillingPolicy {
        fee_bps: config.fee_bps,
        grace_ms: config.billing_grace_ms,
        late_window_ms: crate::LATE_REPORT_WINDOW_MS_DEFAULT,
        storage_minor_per_gib_month: 0,
    };
    let market = MarketState::new(config).expect("demo config");
    let operators: BTreeSet<[u8; 32]> = [OPERATOR].into_iter().collect();
    Sequencer::recover(
        market,
        None,
        Box::new(journal.clone()),
        snapshots.clone(),
        operators,
        Arc::new(Metrics::default()),
        billing,
        Clock { offset_ms },
    )
    .expect("recovers")
}

/// The operator (connection 1) logs in, and a new supplier (connection 2)
/// and a new renter (connection 3) open their accounts. The operator's
/// client is returned too: its connection's queue lives as long as it does.
fn operator_supplier_and_renter(sequencer: &mut Sequencer) -> (Client, Client, Client) {
    let (operator, connect_operator) = Client::connect(1);
    let (supplier, connect_supplier) = Client::connect(2);
    let (renter, connect_renter) = Client::connect(3);
    sequencer
        .process(vec![
            connect_operator,
            operator.login(1, OPERATOR, None),
            connect_supplier,
            supplier.login(1, [2; 32], Some(Role::Supplier)),
            connect_renter,
            renter.login(1, [3; 32], Some(Role::Renter)),
        ])
        .expect("commits");
    (operator, supplier, renter)
}

/// A connection's end of its queue.
struct Client {
    connection: ConnectionId,
    frames: mpsc::Receiver<Outgoing>,
}

impl Client {
    fn connect(connection: ConnectionId) -> (Client, Request) {
        let (frames, receiver) = mpsc::channel(1024);
        let outbound = Outbound::local(frames, Arc::new(Notify::new()));
        (Client { connection, frames: receiver }, Request { connection, id: 0, body: Body::Connect { outbound } })
    }

    fn login(&self, id: u64, key: [u8; 32], role: Option<Role>) -> Request {
        Request {
            connection: self.connection,
            id,
            body: Body::Authenticate { public_key: key, role, cancel_on_disconnect: false, presence: true, invite: None, address: None },
        }
    }

    /// The messages queued so far (controls left out).
    fn received(&mut self) -> Vec<ServerMessage> {
        let mut messages = Vec::new();
        while let Ok(outgoing) = self.frames.try_recv() {
            if let Outgoing::Frame(frame) = outgoing {
                messages.push(frame.message().clone());
            }
        }
        messages
    }

    fn account(&mut self) -> AccountId {
        self.received()
            .iter()
            .find_map(|m| match m {
                ServerMessage::Authenticated { account, .. } => Some(*account),
                _ => None,
            })
            .expect("logged in")
    }
}

/// A sequencer with one renter logged in on connection 1, and its
/// journaled request `id`: a cancel of an order it does not have (refused,
/// journaled all the same).
fn one_renter() -> (MemoryJournal, Sequencer, Client, impl Fn(u64) -> Request) {
    let journal = MemoryJournal::default();
    let snapshots = MemorySnapshots::default();
    let (mut sequencer, _) = recover(&journal, &snapshots);
    let (mut client, connect) = Client::connect(1);
    sequencer.process(vec![connect, client.login(1, [1; 32], Some(Role::Renter))]).expect("commits");
    let account = client.account();
    let cancel = move |id: u64| Request {
        connection: 1,
        id,
        body: Body::Command { command: Command::CancelOrder { account, order: gpux_engine::OrderId(id) } },
    };
    (journal, sequencer, client, cancel)
}

/// Pipelined commit: a batch's answers wait for its own commit, which
/// runs while the next batch is applied; a query releases behind the batch
/// in flight, never ahead of it; the answers reach the connection in the
/// order of its requests.
#[test]
fn a_batch_in_flight_is_released_only_after_its_commit_and_in_order() {
    let (journal, mut sequencer, mut client, cancel) = one_renter();
    let entries = journal.entries().len();
    sequencer.step(vec![cancel(2)], None).expect("applied, handed to the journal thread");
    assert!(client.received().is_empty(), "no answer before its commit");
    sequencer.step(vec![cancel(3)], None).expect("the first committed, the second handed over");
    // The answers (private events of the account come too).
    let ids = |messages: Vec<ServerMessage>| messages.iter().filter_map(|m| m.answer_to()).collect::<Vec<_>>();
    assert_eq!(ids(client.received()), [2], "the first batch's answer, once it is on disk; not the second's");
    assert!(journal.entries().len() > entries, "the first batch is on disk (the second may be too, unreleased)");
    // A query waits for the batch in flight, then answers after it.
    sequencer.step(vec![Request { connection: 1, id: 4, body: Body::Balance {} }], None).expect("answers");
    assert_eq!(ids(client.received()), [3, 4]);
    // A batch without entries behind one in flight: released with it, after it.
    sequencer.step(vec![cancel(5)], None).expect("handed over");
    sequencer.step(Vec::new(), None).expect("nothing to journal");
    assert!(client.received().is_empty());
    sequencer.settle().expect("commits");
    assert_eq!(ids(client.received()), [5]);
    assert!(journal.entries().len() >= entries + 3);
}

/// A failed commit of the batch in flight stops the sequencer at the next
/// step: nothing of it, nor of the batch applied meanwhile, was sent.
#[test]
fn a_failed_commit_in_flight_releases_neither_it_nor_the_batch_after_it() {
    let (journal, mut sequencer, mut client, cancel) = one_renter();
    let before = journal.entries().len();
    journal.fail_appends(true);
    sequencer.step(vec![cancel(2)], None).expect("handed to the journal thread, whose commit fails");
    let Err(SequencerError::Journal { committed, .. }) = sequencer.step(vec![cancel(3)], None) else {
        panic!("the sequencer stops when it learns the commit failed")
    };
    assert_eq!(committed, before as u64, "the last entry on disk");
    assert!(client.received().is_empty(), "no answer went out for what is not on disk");
    assert_eq!(journal.entries().len(), before);
}

/// Acknowledged means durable: when the journal cannot be written, the
/// batch's answers are never sent and the sequencer stops with the cause.
#[test]
fn nothing_of_a_batch_is_released_when_its_commit_fails() {
    let (journal, snapshots) = (MemoryJournal::default(), MemorySnapshots::default());
    let (mut sequencer, _) = recover(&journal, &snapshots);
    let (mut client, connect) = Client::connect(1);
    sequencer.process(vec![connect]).expect("commits (the engine's first tick lists the windows)");
    let before = journal.entries().len();
    journal.fail_appends(true);
    let login = client.login(1, [1; 32], Some(Role::Renter));
    let result = sequencer.process(vec![login]);
    let Err(SequencerError::Journal { committed, state_hash, .. }) = result else { panic!("the sequencer stops on a failed commit") };
    assert_eq!(committed, before as u64, "the last entry on disk");
    let recovered = recover(&journal, &MemorySnapshots::default()).1.state_hash;
    assert_eq!(state_hash, Some(recovered), "the hash it names is what a restart recovers");
    assert!(client.received().is_empty(), "no answer went out for what is not on disk");
    assert_eq!(journal.entries().len(), before, "nothing was appended");
}

/// On redb files whose storage fails at redb's seam: the journal goes on
/// committing while every snapshot fails, and when the journal itself
/// fails the sequencer stops naming the last entry on disk and the state
/// hash a restart on a healthy disk then recovers.
#[test]
fn on_failing_disks_the_journal_outlives_the_snapshots_and_stops_with_what_a_restart_recovers() {
    use gpux_journal::faults::{Fault, Faults, FaultyBackend};
    use gpux_journal::Journal;
    let dir = tempfile::tempdir().expect("temp dir");
    let (journal_path, snapshots_path) = (dir.path().join("journal.redb"), dir.path().join("snapshots.redb"));
    let open =
        |path: &std::path::Path| std::fs::OpenOptions::new().read(true).write(true).create(true).truncate(false).open(path).expect("file");
    let (journal_faults, snapshot_faults) = (Faults::default(), Faults::default());
    let journal =
        Journal::open_with_backend(FaultyBackend::new(open(&journal_path), journal_faults.clone()).expect("backend")).expect("open");
    let (file, switch) = (snapshots_path.clone(), snapshot_faults.clone());
    let snapshots = crate::snapshots::SnapshotStore::open_with(&snapshots_path, move || {
        let handle = std::fs::OpenOptions::new().read(true).write(true).create(true).truncate(false).open(&file)?;
        Ok(redb::Builder::new().create_with_backend(FaultyBackend::new(handle, switch.clone())?)?)
    })
    .expect("open")
    .with_every(5);
    let config = EngineConfig::demo();
    let billing = BillingPolicy {
        fee_bps: config.fee_bps,
        grace_ms: config.billing_grace_ms,
        late_window_ms: crate::LATE_REPORT_WINDOW_MS_DEFAULT,
        storage_minor_per_gib_month: 0,
    };
    let operators: BTreeSet<[u8; 32]> = [OPERATOR].into_iter().collect();
    let metrics = Arc::new(Metrics::default());
    let (mut sequencer, _) = Sequencer::recover(
        MarketState::new(config.clone()).expect("demo"),
        None,
        Box::new(journal),
        snapshots,
        operators.clone(),
        metrics.clone(),
        billing,
        Clock { offset_ms: 0 },
    )
    .expect("recovers");

    // Every snapshot write fails: the journal commits every batch.
    snapshot_faults.set(Fault::WriteError);
    let mut clients = Vec::new();
    for i in 0..30u8 {
        let (client, connect) = Client::connect(10 + i as ConnectionId);
        let login = client.login(1, [i + 20; 32], Some(Role::Renter));
        sequencer.process(vec![connect, login]).expect("the journal commits while the snapshots fail");
        clients.push(client);
    }
    // The writer thread tries on its own time: wait for its first failure.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while metrics.snapshots.failed.get() == 0 {
        assert!(std::time::Instant::now() < deadline, "a snapshot was tried and failed");
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    assert_eq!(metrics.snapshots.written.get(), 0);

    // The journal's disk fills: the sequencer stops and says what a restart recovers.
    journal_faults.set(Fault::NoSpace);
    let (mut late, connect) = Client::connect(99);
    let login = late.login(1, [99; 32], Some(Role::Renter));
    let Err(SequencerError::Journal { committed, state_hash, .. }) = sequencer.process(vec![connect, login]) else {
        panic!("the sequencer stops on the failed commit")
    };
    assert!(late.received().is_empty(), "nothing of the failed batch was acknowledged");
    drop(sequencer);

    // A restart on a healthy disk recovers exactly that.
    let journal = Journal::open(&journal_path).expect("reopen");
    assert_eq!(journal.next_seq() - 1, committed, "the last entry on disk is the one named");
    let (_, recovery) = Sequencer::recover(
        MarketState::new(config).expect("demo"),
        None,
        Box::new(journal),
        crate::snapshots::SnapshotStore::open(&snapshots_path).expect("reopen"),
        operators,
        Arc::new(Metrics::default()),
        billing,
        Clock { offset_ms: 0 },
    )
    .expect("recovers");
    assert_eq!(Some(recovery.state_hash), state_hash, "the state hash named is the one recovered");
}

/// Issue 61: after EIO on every `fdatasync` a restart recovered one entry
/// more than the failure line named: redb wrote the batch, only its sync
/// failed. The line names both states a restart may give (the batch is
/// never answered either way), and the restart gives one of them.
#[test]
fn a_failed_fsync_names_both_states_a_restart_may_recover_and_it_recovers_one() {
    use gpux_journal::faults::{Fault, Faults, FaultyBackend};
    use gpux_journal::Journal;
    let dir = tempfile::tempdir().expect("temp dir");
    let (journal_path, snapshots_path) = (dir.path().join("journal.redb"), dir.path().join("snapshots.redb"));
    let file = std::fs::OpenOptions::new().read(true).write(true).create(true).truncate(false).open(&journal_path).expect("file");
    let faults = Faults::default();
    let journal = Journal::open_with_backend(FaultyBackend::new(file, faults.clone()).expect("backend")).expect("open");
    let config = EngineConfig::demo();
    let billing = BillingPolicy {
        fee_bps: config.fee_bps,
        grace_ms: config.billing_grace_ms,
        late_window_ms: crate::LATE_REPORT_WINDOW_MS_DEFAULT,
        storage_minor_per_gib_month: 0,
    };
    let operators: BTreeSet<[u8; 32]> = [OPERATOR].into_iter().collect();
    let recover = |journal: Box<dyn gpux_journal::JournalStore>| {
        Sequencer::recover(
            MarketState::new(config.clone()).expect("demo"),
            None,
            journal,
            crate::snapshots::SnapshotStore::open(&snapshots_path).expect("snapshots"),
            operators.clone(),
            Arc::new(Metrics::default()),
            billing,
            Clock { offset_ms: 0 },
        )
        .expect("recovers")
    };
    let (mut sequencer, _) = recover(Box::new(journal));
    let (mut client, connect) = Client::connect(1);
    sequencer.process(vec![connect]).expect("commits");
    faults.set(Fault::SyncError);
    let login = client.login(1, [7; 32], Some(Role::Renter));
    let error = sequencer.process(vec![login]).expect_err("the sync fails");
    let line = error.to_string();
    let SequencerError::Journal { committed, state_hash: Some(state_hash), unanswered: Some((unanswered_seq, unanswered_hash)), .. } =
        error
    else {
        panic!("both states named: {line}")
    };
    assert!(unanswered_seq > committed, "{line}");
    assert!(line.contains(&format!("{state_hash:016x}")) && line.contains(&format!("{unanswered_hash:016x}")), "{line}");
    assert!(client.received().is_empty(), "nothing of the failed batch was answered");
    drop(sequencer);
    let (_, recovery) = recover(Box::new(Journal::open(&journal_path).expect("reopen")));
    assert!(
        [state_hash, unanswered_hash].contains(&recovery.state_hash),
        "the restart recovers one of the states named: {:016x}; {line}",
        recovery.state_hash
    );
}

/// One durable commit per batch, however many requests it holds; each gets
/// its answer after it.
#[test]
fn a_batch_is_one_commit_and_each_request_is_answered() {
    let (journal, snapshots) = (MemoryJournal::default(), MemorySnapshots::default());
    let (mut sequencer, _) = recover(&journal, &snapshots);
    // The engine's first tick (it lists the reserved windows) commits on its own.
    sequencer.process(Vec::new()).expect("commits");
    let (commits, first) = (journal.commits(), journal.entries().len());
    let mut clients = Vec::new();
    let mut batch = Vec::new();
    for connection in 1..=3 {
        let (client, connect) = Client::connect(connection);
        batch.push(connect);
        batch.push(client.login(7, [connection as u8; 32], Some(Role::Renter)));
        clients.push(client);
    }
    sequencer.process(batch).expect("commits");
    assert_eq!(journal.commits(), commits + 1, "one commit for the batch");
    let entries = journal.entries().split_off(first);
    assert_eq!(entries.len(), 6, "each new account: its opening and its key binding");
    assert!(matches!(entries[1], JournalEntry::BindKey { public_key, .. } if public_key == [1; 32]));
    let accounts: BTreeSet<AccountId> = clients.iter_mut().map(Client::account).collect();
    assert_eq!(accounts.len(), 3, "three accounts");
}

/// A restart on the same journal and snapshots reaches the same state and
/// answers queries the same; the clean stop's snapshot leaves no tail.
#[test]
fn a_restart_reaches_the_same_state_from_the_snapshot_and_the_journal() {
    let (journal, snapshots) = (MemoryJournal::default(), MemorySnapshots::default());
    let (mut sequencer, _) = recover(&journal, &snapshots);
    let (mut operator, connect) = Client::connect(1);
    sequencer.process(vec![connect, operator.login(1, OPERATOR, None)]).expect("commits");
    let (mut renter, connect) = Client::connect(2);
    sequencer.process(vec![connect, renter.login(1, [2; 32], Some(Role::Renter))]).expect("commits");
    let account = renter.account();
    operator.received();
    let deposit = Command::Deposit { account, amount_minor: 5_000_000 };
    sequencer.process(vec![Request { connection: 1, id: 2, body: Body::Command { command: deposit } }]).expect("commits");
    assert!(matches!(operator.received().last(), Some(ServerMessage::Ack { id: 2, .. })));
    sequencer.process(vec![Request { connection: 2, id: 3, body: Body::Balance {} }]).expect("answers");
    let balance = renter.received().into_iter().find(|m| matches!(m, ServerMessage::Balance { .. })).expect("a balance");
    assert!(matches!(balance, ServerMessage::Balance { available_minor: 5_000_000, .. }), "{balance:?}");

    // A clean stop: everything committed and a last snapshot written.
    let (requests, inbox) = crossbeam_channel::bounded(1);
    drop(requests);
    let stopped_at = sequencer.run(inbox).expect("a clean stop");
    let entries = journal.entries().len() as u64;
    assert_eq!(snapshots.journal_seqs().last(), Some(&entries), "the last snapshot includes every entry");

    let (mut restarted, recovery) = recover(&journal, &snapshots);
    assert_eq!((recovery.snapshot_seq, recovery.entries, recovery.state_hash), (entries, 0, stopped_at));
    let (mut again, connect) = Client::connect(5);
    restarted
        .process(vec![connect, again.login(1, [2; 32], None), Request { connection: 5, id: 3, body: Body::Balance {} }])
        .expect("answers");
    let messages = again.received();
    assert!(matches!(messages[0], ServerMessage::Authenticated { account: a, .. } if a == account), "the key finds its account");
    assert_eq!(messages[1], balance, "the same answer after the restart");

    // And from the journal alone, without the snapshot.
    let (_, replayed) = recover(&journal, &MemorySnapshots::default());
    assert_eq!((replayed.snapshot_seq, replayed.entries, replayed.state_hash), (0, entries, stopped_at));
}

/// A lease an hour past its final bill leaves the market and is written to
/// the journal's archive in the same commit; the renter's `leases` still
/// list it, after the current ones.
#[test]
fn an_archived_lease_is_still_listed_from_the_journals_archive() {
    use gpux_engine::{GpuSet, GpuSpec, HostId, InstrumentId, LeaseDuration, NewOrder, Side};
    const HOUR_MS: i64 = 3_600_000;
    let (journal, snapshots) = (MemoryJournal::default(), MemorySnapshots::default());
    let (mut sequencer, _) = recover(&journal, &snapshots);
    let (_operator, mut supplier, mut renter) = operator_supplier_and_renter(&mut sequencer);
    let (supplier_account, renter_account) = (supplier.account(), renter.account());
    let command = |connection, id, command| Request { connection, id, body: Body::Command { command } };
    let spot = InstrumentId(0);
    let ask = NewOrder {
        supply: Some(GpuSet { host: HostId(0), gpu_mask: 1 }),
        ..NewOrder::limit(supplier_account, 1, spot, Side::Sell, 2_000_000, 1)
    };
    let bid = NewOrder { duration: LeaseDuration::Hours(1), ..NewOrder::limit(renter_account, 1, spot, Side::Buy, 2_000_000, 1) };
    let register = Command::register(supplier_account, "h", "GPU-0", GpuSpec::h100_sxm());
    sequencer
        .process(vec![
            command(1, 2, Command::Deposit { account: renter_account, amount_minor: 100_000_000 }),
            command(2, 2, register),
            command(2, 3, Command::place(ask)),
            command(3, 2, Command::place(bid)),
        ])
        .expect("commits");
    let lease = sequencer.market.engine().leases_of(renter_account, None, 10).0.first().map(|l| l.lease).expect("the bid filled");
    let exited = DeliveryState::Exited { code: 3 };
    let status = DeliveryRequest::Status { lease, state: exited.clone() };
    sequencer.process(vec![Request { connection: 2, id: 4, body: Body::Delivery { request: status } }]).expect("commits");
    drop(sequencer);

    // No report came, so its bill was provisional at the grace and is final
    // at the end of the late-report window (a day): 26 hours on it is
    // final, but recent.
    let (mut later, _) = recover_at(&journal, &snapshots, 26 * HOUR_MS);
    later.process(vec![command(0, 0, Command::Tick)]).expect("commits");
    assert!(later.market.engine().lease(lease).is_some_and(|l| l.billing_closed));
    drop(later);

    // An hour after that, the next entry archives it.
    let (mut archiving, _) = recover_at(&journal, &snapshots, 27 * HOUR_MS);
    let (mut renter, connect) = Client::connect(9);
    archiving
        .process(vec![
            connect,
            renter.login(1, [3; 32], None),
            Request { connection: 9, id: 2, body: Body::Command { command: Command::Tick } },
        ])
        .expect("commits");
    assert_eq!(archiving.market.engine().lease(lease), None, "gone from the hot state");
    renter.received();
    archiving.process(vec![Request { connection: 9, id: 3, body: Body::Leases { after: None } }]).expect("answers");
    let listed = renter.received().into_iter().find_map(|m| match m {
        ServerMessage::Leases { leases, next_after, .. } => Some((leases, next_after)),
        _ => None,
    });
    let (leases, next_after) = listed.expect("a leases answer");
    assert_eq!((leases.iter().map(|l| l.lease).collect::<Vec<_>>(), next_after), (vec![lease], None));
    assert!(leases[0].billing_closed && !leases[0].active);

    // Its delivery record went to the archive with it: the last status still answers.
    let query = |id| Request { connection: 9, id, body: Body::Delivery { request: DeliveryRequest::Query { lease } } };
    archiving.process(vec![query(4)]).expect("answers");
    let answer = renter.received().into_iter().find_map(|m| match m {
        ServerMessage::LeaseDelivery { state, .. } => Some(state),
        _ => None,
    });
    assert_eq!(answer, Some(Some(exited)));
    assert_eq!(archiving.market.deliveries().sizes().1, 0, "the hot state forgot it");
    // Someone else's archived lease is unknown to the asker.
    let (mut stranger, connect) = Client::connect(10);
    archiving.process(vec![connect, stranger.login(1, [7; 32], Some(Role::Renter))]).expect("commits");
    stranger.received();
    archiving
        .process(vec![Request { connection: 10, id: 5, body: Body::Delivery { request: DeliveryRequest::Query { lease } } }])
        .expect("answers");
    assert!(
        stranger.received().iter().any(|m| matches!(m, ServerMessage::Error { code: ErrorCode::UnknownLease, .. })),
        "a stranger is told unknown_lease"
    );
}

/// `supplier_stats` answers anyone, logged in or not, with the record the
/// market keeps: here one closed hour-long lease with nothing verified
/// (unrated: under 10 GPU-hours), on the supplier's one host.
#[test]
fn supplier_stats_are_public_and_count_a_closed_lease() {
    use gpux_engine::{GpuSet, GpuSpec, HostId, InstrumentId, LeaseDuration, NewOrder, Side};
    let (journal, snapshots) = (MemoryJournal::default(), MemorySnapshots::default());
    let (mut sequencer, _) = recover(&journal, &snapshots);
    let (_operator, mut supplier, mut renter) = operator_supplier_and_renter(&mut sequencer);
    let (supplier_account, renter_account) = (supplier.account(), renter.account());
    let command = |connection, id, command| Request { connection, id, body: Body::Command { command } };
    let ask = NewOrder {
        supply: Some(GpuSet { host: HostId(0), gpu_mask: 1 }),
        ..NewOrder::limit(supplier_account, 1, InstrumentId(0), Side::Sell, 2_000_000, 1)
    };
    let bid =
        NewOrder { duration: LeaseDuration::Hours(1), ..NewOrder::limit(renter_account, 1, InstrumentId(0), Side::Buy, 2_000_000, 1) };
    let register = Command::register(supplier_account, "rack-1", "GPU-0", GpuSpec::h100_sxm());
    sequencer
        .process(vec![
            command(1, 2, Command::Deposit { account: renter_account, amount_minor: 100_000_000 }),
            command(2, 2, register),
            command(2, 3, Command::place(ask)),
            command(3, 2, Command::place(bid)),
        ])
        .expect("commits");
    drop(sequencer);
    // 26 hours on, the lease ended and its bill is final (no report came:
    // provisional at the grace, final at the end of the day's late-report
    // window).
    let (mut later, _) = recover_at(&journal, &snapshots, 26 * 3_600_000);
    let (mut stranger, connect) = Client::connect(9);
    later.process(vec![connect, Request { connection: 0, id: 0, body: Body::Command { command: Command::Tick } }]).expect("commits");
    let ask_stats = |supplier| Request { connection: 9, id: 7, body: Body::SupplierStats { supplier } };
    later.process(vec![ask_stats(supplier_account), ask_stats(renter_account)]).expect("answers");
    let answers = stranger.received();
    let stats = answers.iter().find_map(|m| match m {
        ServerMessage::SupplierStats { supplier, window_days, record, hosts, hosts_more, .. } => {
            Some((*supplier, *window_days, record.clone(), hosts.clone(), *hosts_more))
        }
        _ => None,
    });
    let (supplier, window_days, record, hosts, hosts_more) = stats.expect("a supplier_stats answer");
    assert_eq!((supplier, window_days, hosts_more), (supplier_account, 30, false));
    assert_eq!((record.leases_closed, record.leased_gpu_ms, record.verified_gpu_ms, record.score_bps), (1, 3_600_000, 0, None));
    assert_eq!(hosts.iter().map(|h| (h.host, h.host_name.as_str(), &h.record)).collect::<Vec<_>>(), [(HostId(0), "rack-1", &record)]);
    assert!(
        answers.iter().any(|m| matches!(m, ServerMessage::Error { code: ErrorCode::UnknownSupplier, id: Some(7), .. })),
        "a renter is not a supplier: {answers:?}"
    );
}

/// Re-match end to end: a spot bid that opted in fills on host a; the host
/// fails it; the exchange ends the lease, takes its GPU off the market, and
/// places the renter's fill-or-kill bid at its bid's limit, which fills
/// on host b; the new lease gets the workload and the renter hears of the
/// replacement. With no other GPU left, the next failure says so.
#[test]
fn a_lease_whose_host_fails_it_is_replaced_on_another_host_with_its_workload() {
    use gpux_engine::{GpuSet, GpuSpec, HostId, InstrumentId, LeaseDuration, NewOrder, Side};
    use gpux_protocol::{FailureCode, Fault, Workload};
    let (journal, snapshots) = (MemoryJournal::default(), MemorySnapshots::default());
    let (mut sequencer, _) = recover(&journal, &snapshots);
    let (_operator, mut supplier, mut renter) = operator_supplier_and_renter(&mut sequencer);
    let (supplier_account, renter_account) = (supplier.account(), renter.account());
    let command = |connection, id, command| Request { connection, id, body: Body::Command { command } };
    let register = |host: &str, uuid: &str| Command::register(supplier_account, host, uuid, GpuSpec::h100_sxm());
    let ask = |client_order_id, host| NewOrder {
        supply: Some(GpuSet { host: HostId(host), gpu_mask: 1 }),
        ..NewOrder::limit(supplier_account, client_order_id, InstrumentId(0), Side::Sell, 2_000_000, 1)
    };
    sequencer
        .process(vec![
            command(1, 2, Command::Deposit { account: renter_account, amount_minor: 100_000_000 }),
            command(2, 2, register("a", "GPU-a")),
            command(2, 3, register("b", "GPU-b")),
            command(2, 4, Command::place(ask(1, 0))),
            command(2, 5, Command::place(ask(2, 1))),
        ])
        .expect("commits");
    let bid =
        NewOrder { duration: LeaseDuration::Hours(2), ..NewOrder::limit(renter_account, 1, InstrumentId(0), Side::Buy, 2_500_000, 1) };
    let workload = Box::new(Workload::image("docker.io/library/busybox:latest"));
    // The supplier's hosts take workloads (its key as the market records
    // it; the request's signature check is the gateway test's).
    sequencer.journal(JournalEntry::EncryptionKey { account: supplier_account, key: [7; 32], signature: String::new() }).expect("applies");
    sequencer
        .process(vec![Request {
            connection: 3,
            id: 2,
            body: Body::Bid {
                command: Box::new(Command::place(bid)),
                workload: Some(workload.clone()),
                rematch: true,
                volumes: Vec::new(),
            },
        }])
        .expect("commits");
    let leases = |sequencer: &Sequencer| sequencer.market.engine().leases_of(renter_account, None, 10).0;
    let first = leases(&sequencer)[0].clone();
    assert_eq!(first.price_minor_per_gpu_hour, 2_000_000, "filled at the ask's price");
    let host_of = |sequencer: &Sequencer, lease: &gpux_engine::LeaseInfo| sequencer.market.engine().gpu(lease.gpus[0]).map(|g| g.host);
    assert_eq!(host_of(&sequencer, &first), Some(HostId(0)));
    renter.received();
    supplier.received();

    let failed = DeliveryState::Failed { code: FailureCode::HostError, fault: Fault::Host, reason: "the container engine is down".into() };
    let status = |id, lease| Request {
        connection: 2,
        id,
        body: Body::Delivery { request: DeliveryRequest::Status { lease, state: failed.clone() } },
    };
    sequencer.process(vec![status(6, first.lease)]).expect("commits");
    let now = leases(&sequencer);
    let replacement = now.iter().find(|l| l.lease != first.lease).expect("a replacement lease").clone();
    assert!(!now.iter().find(|l| l.lease == first.lease).expect("the failed lease").active);
    assert_eq!(host_of(&sequencer, &replacement), Some(HostId(1)), "not on the host that failed");
    assert_eq!((replacement.price_minor_per_gpu_hour, replacement.gpus.len()), (2_000_000, 1));
    assert_eq!(sequencer.market.engine().gpu(first.gpus[0]).map(|g| g.online), Some(false), "the failed GPU left the market");
    let to_renter = renter.received();
    assert!(
        to_renter.contains(&ServerMessage::LeaseReplaced { lease: first.lease, replacement: Some(replacement.lease) }),
        "{to_renter:?}"
    );
    let to_supplier = supplier.received();
    assert!(
        to_supplier
            .iter()
            .any(|m| matches!(m, ServerMessage::Workload { lease, workload: w } if *lease == replacement.lease && *w == workload)),
        "the replacement's host gets the workload: {to_supplier:?}"
    );

    // Host b fails it too: no GPU left at the price, and the renter is told.
    sequencer.process(vec![status(7, replacement.lease)]).expect("commits");
    assert_eq!(leases(&sequencer).len(), 2, "no third lease");
    let to_renter = renter.received();
    assert!(to_renter.contains(&ServerMessage::LeaseReplaced { lease: replacement.lease, replacement: None }), "{to_renter:?}");

    // A replay of the journal reaches the same market.
    let live = sequencer.market.state_hash();
    drop(sequencer);
    let (_, replayed) = recover(&journal, &MemorySnapshots::default());
    assert_eq!(replayed.state_hash, live);
}

/// A supplier whose last session closes while it supplies a lease gets a
/// journaled disconnect in its record; one the exchange closed because it
/// is stopping does not (not the supplier's doing), nor one without leases.
#[test]
fn a_supplier_gone_during_its_leases_is_journaled_but_not_when_the_exchange_stops() {
    use gpux_engine::{GpuSet, GpuSpec, HostId, InstrumentId, LeaseDuration, NewOrder, Side};
    let (journal, snapshots) = (MemoryJournal::default(), MemorySnapshots::default());
    let (mut sequencer, _) = recover(&journal, &snapshots);
    let (_operator, mut supplier, mut renter) = operator_supplier_and_renter(&mut sequencer);
    let (supplier_account, renter_account) = (supplier.account(), renter.account());
    let command = |connection, id, command| Request { connection, id, body: Body::Command { command } };
    let disconnects = |journal: &MemoryJournal| {
        journal
            .entries()
            .iter()
            .filter(|e| matches!(e, JournalEntry::SupplierDisconnected { account, .. } if *account == supplier_account))
            .count()
    };
    let register = Command::register(supplier_account, "rack-1", "GPU-0", GpuSpec::h100_sxm());
    sequencer.process(vec![command(2, 2, register)]).expect("commits");
    // Gone without a lease: nothing to record.
    sequencer.process(vec![Request { connection: 2, id: 0, body: Body::Disconnect { exchange_stopping: false } }]).expect("commits");
    assert_eq!(disconnects(&journal), 0);

    let (back, connect) = Client::connect(4);
    sequencer.process(vec![connect, back.login(1, [2; 32], None)]).expect("commits");
    let ask = NewOrder {
        supply: Some(GpuSet { host: HostId(0), gpu_mask: 1 }),
        ..NewOrder::limit(supplier_account, 1, InstrumentId(0), Side::Sell, 2_000_000, 1)
    };
    let bid =
        NewOrder { duration: LeaseDuration::Hours(1), ..NewOrder::limit(renter_account, 1, InstrumentId(0), Side::Buy, 2_000_000, 1) };
    sequencer
        .process(vec![
            command(1, 2, Command::Deposit { account: renter_account, amount_minor: 100_000_000 }),
            command(4, 2, Command::place(ask)),
            command(3, 2, Command::place(bid)),
        ])
        .expect("commits");
    assert_eq!(sequencer.market.engine().active_leases_supplied(supplier_account).len(), 1);
    // Closed by a stopping exchange: not the supplier's fact.
    sequencer.process(vec![Request { connection: 4, id: 0, body: Body::Disconnect { exchange_stopping: true } }]).expect("commits");
    assert_eq!(disconnects(&journal), 0);
    let (again, connect) = Client::connect(5);
    sequencer.process(vec![connect, again.login(1, [2; 32], None)]).expect("commits");
    sequencer.process(vec![Request { connection: 5, id: 0, body: Body::Disconnect { exchange_stopping: false } }]).expect("commits");
    assert_eq!(disconnects(&journal), 1, "gone during its lease");
    let record = sequencer.market.reliability().supplier(supplier_account, sequencer.market.clock_ms());
    assert_eq!(record.disconnects_during_leases, 1);
    drop((supplier, again, back));
}

/// History comes from the journal's index; when it cannot be read, each
/// history request is answered `history_unavailable` and nothing else
/// changes (the market goes on).
#[test]
fn history_the_journal_cannot_give_is_history_unavailable() {
    let (journal, snapshots) = (MemoryJournal::default(), MemorySnapshots::default());
    let (mut sequencer, _) = recover(&journal, &snapshots);
    let (_operator, _supplier, mut renter) = operator_supplier_and_renter(&mut sequencer);
    renter.received();
    let spot = gpux_engine::InstrumentId(0);
    let requests = |connection| {
        vec![
            Request { connection, id: 5, body: Body::History { request: HistoryRequest::Trades { instrument: spot, before_seq: None } } },
            Request {
                connection,
                id: 6,
                body: Body::History {
                    request: HistoryRequest::Candles { instrument: spot, interval: gpux_protocol::CandleInterval::Day, before_ms: None },
                },
            },
            Request { connection, id: 7, body: Body::History { request: HistoryRequest::Fills { before: None } } },
        ]
    };
    sequencer.process(requests(3)).expect("commits");
    let answers = renter.received();
    assert!(matches!(answers[0], ServerMessage::Trades { id: 5, .. }), "{answers:?}");
    assert!(matches!(answers[1], ServerMessage::Candles { id: 6, .. }), "{answers:?}");
    assert!(matches!(answers[2], ServerMessage::Fills { id: 7, .. }), "{answers:?}");
    journal.fail_reads(true);
    sequencer.process(requests(3)).expect("the market goes on");
    let codes = error_codes(renter.received());
    assert_eq!(codes, [5, 6, 7].map(|id| (Some(id), ErrorCode::HistoryUnavailable)));
}

/// Each answer's id and error code (panics on an answer that is not an error).
fn error_codes(answers: Vec<ServerMessage>) -> Vec<(Option<u64>, ErrorCode)> {
    answers
        .into_iter()
        .map(|m| match m {
            ServerMessage::Error { id, code, .. } => (id, code),
            other => panic!("an error, not {other:?}"),
        })
        .collect()
}

/// What the journal keeps beyond history (statements, archived leases)
/// answers `journal_unavailable` when it cannot be read: never an empty
/// statement, a page of leases without the archived ones, or `unknown_lease`
/// for a lease that may be in the archive. The market goes on, and the
/// same requests are answered once the journal reads again.
#[test]
fn reads_the_journal_cannot_give_are_journal_unavailable_never_an_empty_answer() {
    let (journal, snapshots) = (MemoryJournal::default(), MemorySnapshots::default());
    let (mut sequencer, _) = recover(&journal, &snapshots);
    let (_operator, _supplier, mut renter) = operator_supplier_and_renter(&mut sequencer);
    renter.received();
    let archived = gpux_engine::LeaseId(999);
    let requests = |connection| {
        vec![
            Request { connection, id: 5, body: Body::Statement { after: None } },
            Request { connection, id: 6, body: Body::RecentStatement { before: None } },
            Request { connection, id: 7, body: Body::Leases { after: None } },
            Request { connection, id: 8, body: Body::LeaseTelemetry { lease: archived } },
        ]
    };
    journal.fail_reads(true);
    sequencer.process(requests(3)).expect("the market goes on");
    let codes = error_codes(renter.received());
    assert_eq!(codes, [5, 6, 7, 8].map(|id| (Some(id), ErrorCode::JournalUnavailable)));
    journal.fail_reads(false);
    sequencer.process(requests(3)).expect("commits");
    let answers = renter.received();
    assert!(matches!(answers[0], ServerMessage::Statement { id: 5, .. }), "{answers:?}");
    assert!(matches!(answers[1], ServerMessage::RecentStatement { id: 6, .. }), "{answers:?}");
    assert!(matches!(answers[2], ServerMessage::Leases { id: 7, .. }), "{answers:?}");
    assert!(matches!(answers[3], ServerMessage::Error { id: Some(8), code: ErrorCode::UnknownLease, .. }), "{answers:?}");
}

/// A class whose challenge side comes from a journal's older listing (any
/// side up to 256 was valid before the product was committed as a Merkle
/// tree) still applies, and its GPUs are not challenged: no opening of such
/// a side can be checked. A side of today's rules is challenged as the GPU
/// registers.
#[test]
fn a_challenge_side_of_an_older_listing_applies_and_is_not_challenged() {
    use gpux_engine::GpuSpec;
    for (n, challenged) in [(100u32, false), (256, true)] {
        let mut config = EngineConfig::demo();
        for spec in config.classes.iter_mut().filter_map(|class| class.challenge.as_mut()) {
            spec.n = n;
        }
        assert_eq!(config.validate(), Ok(()), "a journal's listing");
        assert_eq!(config.validate_listing().is_ok(), challenged, "a new listing");
        let (journal, snapshots) = (MemoryJournal::default(), MemorySnapshots::default());
        let (mut sequencer, _) = recover_with(&journal, &snapshots, config, 0);
        let (_operator, mut supplier, _renter) = operator_supplier_and_renter(&mut sequencer);
        let account = supplier.account();
        let register = Command::register(account, "a", "GPU-a", GpuSpec::h100_sxm());
        sequencer.process(vec![Request { connection: 2, id: 2, body: Body::Command { command: register } }]).expect("commits");
        sequencer.process(Vec::new()).expect("commits");
        let issued = journal.entries().iter().any(|entry| matches!(entry, JournalEntry::ChallengeIssued { .. }));
        assert_eq!(issued, challenged, "n = {n}");
    }
}

/// `lease_logs` waits are a table every renter shares: one renter whose
/// host stays silent holds at most its account's share (4), over as many
/// connections as it opens; another renter of the same host is still served.
#[test]
fn one_renters_unanswered_log_requests_hold_only_its_share() {
    use gpux_engine::{GpuSet, GpuSpec, HostId, InstrumentId, LeaseDuration, NewOrder, Side};
    let (journal, snapshots) = (MemoryJournal::default(), MemorySnapshots::default());
    let (mut sequencer, _) = recover(&journal, &snapshots);
    let (_operator, mut supplier, mut renter) = operator_supplier_and_renter(&mut sequencer);
    let (supplier_account, renter_account) = (supplier.account(), renter.account());
    let (other, connect_other) = Client::connect(20);
    sequencer.process(vec![connect_other, other.login(1, [4; 32], Some(Role::Renter))]).expect("commits");
    let mut other = other;
    let other_account = other.account();
    let command = |connection, id, command| Request { connection, id, body: Body::Command { command } };
    let ask = NewOrder {
        supply: Some(GpuSet { host: HostId(0), gpu_mask: 0b11 }),
        ..NewOrder::limit(supplier_account, 1, InstrumentId(0), Side::Sell, 2_000_000, 2)
    };
    let bid = |account, client_order_id| NewOrder {
        duration: LeaseDuration::Hours(1),
        ..NewOrder::limit(account, client_order_id, InstrumentId(0), Side::Buy, 2_000_000, 1)
    };
    let register = |uuid: &str| Command::register(supplier_account, "silent", uuid, GpuSpec::h100_sxm());
    sequencer
        .process(vec![
            command(1, 2, Command::Deposit { account: renter_account, amount_minor: 100_000_000 }),
            command(1, 3, Command::Deposit { account: other_account, amount_minor: 100_000_000 }),
            command(2, 2, register("GPU-s0")),
            command(2, 3, register("GPU-s1")),
            command(2, 4, Command::place(ask)),
            command(3, 2, Command::place(bid(renter_account, 1))),
            command(20, 2, Command::place(bid(other_account, 1))),
        ])
        .expect("commits");
    let lease_of = |sequencer: &Sequencer, account| sequencer.market.engine().leases_of(account, None, 10).0[0].lease;
    let (mine, theirs) = (lease_of(&sequencer, renter_account), lease_of(&sequencer, other_account));
    let logs = |connection, lease| Request {
        connection,
        id: 9,
        body: Body::Delivery { request: DeliveryRequest::Logs { lease, tail_bytes: 100 } },
    };
    // The renter's own connection and four more, all its account.
    let mut connections = vec![(3, None)];
    for connection in 30..34 {
        let (client, connect) = Client::connect(connection);
        sequencer.process(vec![connect, client.login(1, [3; 32], Some(Role::Renter))]).expect("commits");
        connections.push((connection, Some(client)));
    }
    renter.received();
    for (connection, _) in &connections {
        sequencer.process(vec![logs(*connection, mine)]).expect("answers");
    }
    let refused =
        |client: &mut Client| client.received().iter().any(|m| matches!(m, ServerMessage::Error { code: ErrorCode::RateLimited, .. }));
    assert!(!refused(&mut renter), "within the share");
    let mut fifth = connections.pop().and_then(|(_, client)| client).expect("a client");
    assert!(refused(&mut fifth), "a fifth wait of one account is refused");
    for (_, client) in connections.iter_mut() {
        if let Some(client) = client {
            assert!(!refused(client), "within the share");
        }
    }
    other.received();
    sequencer.process(vec![logs(20, theirs)]).expect("answers");
    assert!(!refused(&mut other), "another renter of the same silent host is still served");
    let asked = supplier.received().iter().filter(|m| matches!(m, ServerMessage::LogsWanted { .. })).count();
    assert_eq!(asked, 5, "the host was asked four times for one renter and once for the other");

    // Issue 61: 272 sub-accounts filled the table. A sub-account of the
    // renter is the same participant: its own lease's logs wait in the
    // renter's share, already full.
    use gpux_gateway::link::AccessRequest;
    let access = |connection, id, request| Request { connection, id, body: Body::Access { request } };
    sequencer.process(vec![access(3, 40, AccessRequest::OpenSubAccount)]).expect("commits");
    let sub = renter
        .received()
        .iter()
        .find_map(|m| match m {
            ServerMessage::SubAccountOpened { account, .. } => Some(*account),
            _ => None,
        })
        .expect("opened");
    let scopes = gpux_protocol::Scopes::of(&[gpux_protocol::Scope::Read, gpux_protocol::Scope::Trade, gpux_protocol::Scope::Deliver]);
    let ask = NewOrder {
        supply: Some(GpuSet { host: HostId(0), gpu_mask: 0b100 }),
        ..NewOrder::limit(supplier_account, 2, InstrumentId(0), Side::Sell, 2_000_000, 1)
    };
    sequencer
        .process(vec![
            access(3, 41, AccessRequest::MoveFunds { sub_account: sub, amount_minor: 50_000_000, to_sub_account: true }),
            access(
                3,
                42,
                AccessRequest::AddKey { account: Some(sub), public_key: [77; 32], scopes, expires_at_ms: None, label: String::new() },
            ),
            command(2, 5, register("GPU-s2")),
            command(2, 6, Command::place(ask)),
        ])
        .expect("commits");
    let answers = renter.received();
    assert!(answers.iter().any(|m| matches!(m, ServerMessage::KeyAdded { .. })), "{answers:?}");
    let (mut sub_client, connect_sub) = Client::connect(40);
    sequencer.process(vec![connect_sub, sub_client.login(1, [77; 32], None)]).expect("commits");
    sequencer.process(vec![command(40, 2, Command::place(bid(sub, 1)))]).expect("commits");
    let sub_lease = lease_of(&sequencer, sub);
    sub_client.received();
    sequencer.process(vec![logs(40, sub_lease)]).expect("answers");
    let got = sub_client.received();
    assert!(
        got.iter().any(|m| matches!(m, ServerMessage::Error { code: ErrorCode::RateLimited, .. })),
        "a sub-account's wait counts in its parent's share: {got:?}"
    );
}

/// `open_orders` pages by a cursor: orders that close between two pages
/// (some already listed, some not yet) move no other order past the
/// reader, so every order open throughout is listed exactly once. (Paged
/// by offset, cancelling listed orders shifted unlisted ones past it.)
#[test]
fn open_orders_page_by_a_cursor_while_orders_close() {
    use gpux_engine::{InstrumentId, NewOrder, OrderId, Side};
    let (journal, snapshots) = (MemoryJournal::default(), MemorySnapshots::default());
    let (mut sequencer, _) = recover(&journal, &snapshots);
    let (_operator, _supplier, mut renter) = operator_supplier_and_renter(&mut sequencer);
    let renter_account = renter.account();
    let command = |connection, id, command| Request { connection, id, body: Body::Command { command } };
    sequencer.process(vec![command(1, 2, Command::Deposit { account: renter_account, amount_minor: 1_000_000_000_000 })]).expect("commits");
    // In batches the renter's queue holds (its answers are drained between).
    for batch in 0..9u64 {
        let bids = (batch * 50..(batch + 1) * 50).map(|n| {
            let bid = NewOrder::limit(renter_account, 1_000 + n, InstrumentId(0), Side::Buy, 1_000_000 + n * 1_000, 1);
            command(3, 10 + n, Command::place(bid))
        });
        sequencer.process(bids.collect()).expect("commits");
        renter.received();
    }
    let page = |sequencer: &mut Sequencer, renter: &mut Client, after: Option<u64>| {
        renter.received();
        sequencer.process(vec![Request { connection: 3, id: 999, body: Body::OpenOrders { after } }]).expect("answers");
        renter
            .received()
            .into_iter()
            .find_map(|m| match m {
                ServerMessage::Orders { orders, next_after, .. } => Some((orders.iter().map(|o| o.order).collect::<Vec<_>>(), next_after)),
                _ => None,
            })
            .expect("an orders page")
    };
    let every = sequencer.market.engine().open_orders(renter_account).into_iter().map(|o| o.order).collect::<Vec<_>>();
    assert_eq!(every.len(), 450);

    let mut listed: Vec<OrderId> = Vec::new();
    let mut closed = std::collections::BTreeSet::new();
    let (mut after, mut pages) = (None, 0);
    loop {
        let (orders, next) = page(&mut sequencer, &mut renter, after);
        listed.extend(&orders);
        pages += 1;
        // Between pages, every third order closes: listed ones and ones to come.
        let cancels: Vec<Request> = every
            .iter()
            .enumerate()
            .filter(|(i, order)| i % 3 == pages % 3 && !closed.contains(*order))
            .take(60)
            .map(|(i, order)| command(3, 5_000 + i as u64, Command::CancelOrder { account: renter_account, order: *order }))
            .collect();
        for cancel in &cancels {
            if let Request { body: Body::Command { command: Command::CancelOrder { order, .. }, .. }, .. } = cancel {
                closed.insert(*order);
            }
        }
        sequencer.process(cancels).expect("commits");
        match next {
            Some(next) => after = Some(next),
            None => break,
        }
    }
    assert!(pages >= 3, "{pages} pages");
    let unique: std::collections::BTreeSet<OrderId> = listed.iter().copied().collect();
    assert_eq!(unique.len(), listed.len(), "no order listed twice");
    let open_throughout: Vec<OrderId> = every.iter().filter(|o| !closed.contains(*o)).copied().collect();
    let missing: Vec<&OrderId> = open_throughout.iter().filter(|o| !unique.contains(*o)).collect();
    assert!(missing.is_empty(), "{} orders open throughout were never listed: {missing:?}", missing.len());
}

/// A request that needs a login, from a connection that has none (a link
/// that broke the gateway's rule, `Body::is_public`): refused
/// `not_authenticated`, never answered with silence or applied; a public
/// one is answered.
#[test]
fn a_request_needing_a_login_from_a_connection_without_one_is_refused() {
    let (journal, snapshots) = (MemoryJournal::default(), MemorySnapshots::default());
    let (mut sequencer, _) = recover(&journal, &snapshots);
    sequencer.process(Vec::new()).expect("commits");
    let (mut stranger, connect) = Client::connect(40);
    let entries = journal.entries().len();
    let withdraw = Command::Withdraw { account: AccountId(0), amount_minor: 1 };
    let batch = vec![
        connect,
        Request::new(40, 1, Body::Balance {}),
        Request::new(40, 2, Body::Command { command: withdraw }),
        Request::new(40, 3, Body::Instruments {}),
    ];
    sequencer.process(batch).expect("commits");
    let answers = stranger.received();
    assert_eq!(error_codes(answers[..2].to_vec()), [(Some(1), ErrorCode::NotAuthenticated), (Some(2), ErrorCode::NotAuthenticated)]);
    assert!(matches!(answers[2], ServerMessage::Instruments { id: 3, .. }), "{:?}", answers[2]);
    assert_eq!(journal.entries().len(), entries, "nothing journaled");
}
