//! Fair shares (issue 41) as an attacker with ordinary accounts would try
//! them, against the real binary over real sockets: fake GPUs and armed
//! stops pile up only to each account's share, each refusal says why, a
//! victim account keeps being served, and the exchange's memory stays
//! bounded while it happens (resident memory grows by less than 64 MiB).

mod common;

use std::collections::HashMap;

use common::*;
use gpux_engine::*;
use gpux_protocol::*;

const USD_1: u64 = 1_000_000;
const USD_3: u64 = 3_000_000;

/// Resident memory of a process, in KiB (`VmRSS`).
fn resident_kib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("/proc status");
    let line = status.lines().find(|line| line.starts_with("VmRSS:")).expect("VmRSS");
    line.split_whitespace().nth(1).expect("a number").parse().expect("KiB")
}

/// Sends the messages 1 000 at a time (a connection may have 1 024 in
/// flight), reading an answer to each: the count of acknowledgements and of
/// each refusal code.
async fn pipelined(client: &mut Client, messages: Vec<ClientMessage>) -> (usize, HashMap<RejectCode, usize>) {
    let (mut acked, mut refused) = (0, HashMap::new());
    for chunk in messages.chunks(1_000) {
        for message in chunk {
            client.send_nowait(message).await;
        }
        client.flush().await;
        let mut answered = 0;
        while answered < chunk.len() {
            match client.recv().await {
                ServerMessage::Ack { .. } => acked += 1,
                ServerMessage::Reject { code, .. } => *refused.entry(code).or_insert(0) += 1,
                ServerMessage::Error { code, .. } => panic!("gateway error {code:?}"),
                _ => continue,
            }
            answered += 1;
        }
    }
    (acked, refused)
}

fn register(id: u64, host: &str, gpu: u32) -> ClientMessage {
    ClientMessage::RegisterGpu {
        id,
        host: host.into(),
        gpu_uuid: format!("GPU-{host}-{gpu}"),
        spec: GpuSpec::h100_sxm(),
        region: None,
        zone: None,
        fabric: None,
    }
}

fn stop_bid(id: u64, client_order_id: u64) -> ClientMessage {
    let mut order = OrderTicket::limit(client_order_id, InstrumentId(0), Side::Buy, USD_1, 1);
    order.stop_price_minor_per_gpu_hour = USD_3;
    ClientMessage::NewOrder { id, order, workload: None }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fake_gpus_and_armed_stops_stop_at_each_accounts_share_and_a_victim_is_served() {
    let dir = tempfile::tempdir().expect("temp dir");
    let exchange = Exchange::start(dir.path(), Some(&key(1)));
    let pid = exchange.child.id();
    let (mut operator, _) = Client::login(&exchange.addr, &key(1), Role::Operator).await;
    let before_kib = resident_kib(pid);

    // Fake GPUs: one unfunded supplier registers a host's worth that never
    // answer their challenges, then is refused; an honest supplier is not.
    let (mut faker, _) = Client::login(&exchange.addr, &key(2), Role::Supplier).await;
    let flood: Vec<ClientMessage> = (0..200).map(|gpu| register(100 + gpu as u64, &format!("fake-{}", gpu / 64), gpu % 64)).collect();
    let (acked, refused) = pipelined(&mut faker, flood).await;
    assert_eq!(acked, limits::GPUS_UNPROVEN_PER_ACCOUNT_MAX as usize, "{refused:?}");
    assert_eq!(refused.get(&RejectCode::GpusAwaitingChallenge), Some(&(200 - acked)), "{refused:?}");
    let (mut honest, _) = Client::login(&exchange.addr, &key(3), Role::Supplier).await;
    let (acked, refused) = pipelined(&mut honest, (0..8).map(|gpu| register(10 + gpu as u64, "honest", gpu)).collect()).await;
    assert_eq!((acked, refused.len()), (8, 0), "{refused:?}");

    // Armed stops: each holds its bid's funds, and one account arms at most
    // its share, however much money it has.
    let (mut attacker, attacker_account) = Client::login(&exchange.addr, &key(4), Role::Renter).await;
    let (mut victim, victim_account) = Client::login(&exchange.addr, &key(5), Role::Renter).await;
    for (id, account) in [(2, attacker_account), (3, victim_account)] {
        let deposit = ClientMessage::Deposit { id, account, amount_minor: 1 << 40 };
        assert!(matches!(operator.request(deposit).await, ServerMessage::Ack { .. }));
    }
    let share = limits::STOPS_ARMED_PER_ACCOUNT_MAX as u64;
    let (acked, refused) = pipelined(&mut attacker, (0..share + 50).map(|n| stop_bid(1_000 + n, n)).collect()).await;
    assert_eq!(acked as u64, share, "{refused:?}");
    assert_eq!(refused.get(&RejectCode::TooManyStops), Some(&50), "{refused:?}");
    let held = match attacker.request(ClientMessage::Balance { id: 2 }).await {
        ServerMessage::Balance { held_minor, .. } => held_minor,
        other => panic!("{other:?}"),
    };
    assert!(held >= share * USD_1, "every armed stop holds its bid's funds: {held}");
    let (acked, refused) = pipelined(&mut victim, vec![stop_bid(2, 1)]).await;
    assert_eq!((acked, refused.len()), (1, 0), "the victim arms its stop: {refused:?}");
    // An account without the funds arms nothing.
    let (mut poor, _) = Client::login(&exchange.addr, &key(6), Role::Renter).await;
    let (_, refused) = pipelined(&mut poor, vec![stop_bid(2, 1)]).await;
    assert_eq!(refused.get(&RejectCode::InsufficientFunds), Some(&1));

    let grown_kib = resident_kib(pid).saturating_sub(before_kib);
    assert!(grown_kib < 64 * 1024, "the exchange grew {grown_kib} KiB during the attack");
}

/// The key of sub-account `n` (more than `key`'s 256).
fn sub_key(n: u16) -> ed25519_dalek::SigningKey {
    let mut seed = [0xa5u8; 32];
    seed[..2].copy_from_slice(&n.to_le_bytes());
    ed25519_dalek::SigningKey::from_bytes(&seed)
}

/// Opens `count` sub-accounts of the parent, funds each and adds a key for
/// it (`sub_key`).
async fn open_sub_accounts(parent: &mut Client, count: u16) {
    for n in 0..count {
        let id = parent.id();
        let ServerMessage::SubAccountOpened { account, .. } = parent.request(ClientMessage::OpenSubAccount { id }).await else {
            panic!("a sub-account")
        };
        let id = parent.id();
        let moved =
            parent.request(ClientMessage::MoveFunds { id, sub_account: account, amount_minor: 1 << 34, to_sub_account: true }).await;
        assert!(matches!(moved, ServerMessage::Ack { .. }), "{moved:?}");
        let id = parent.id();
        let public_key = hex::encode(sub_key(n).verifying_key().to_bytes());
        let scopes = Scopes::of(&[Scope::Read, Scope::Trade, Scope::Deliver]);
        let add = ClientMessage::AddKey { id, account: Some(account), public_key, scopes, expires_at_ms: None, label: "sub".into() };
        assert!(matches!(parent.request(add).await, ServerMessage::KeyAdded { .. }));
    }
}

/// Logs in as sub-account `n`.
async fn as_sub_account(exchange: &Exchange, n: u16) -> Client {
    let mut client = Client::connect(&exchange.addr).await;
    let auth = client.auth_message(&sub_key(n), None);
    client.send(&auth).await;
    client.recv_until(|m| matches!(m, ServerMessage::Authenticated { .. }).then_some(())).await;
    client
}

/// Issue 61: one aggregator with US$1,049 filled the exchange's armed-stop
/// table through 256 sub-accounts, and two filled the jobs table. An account
/// and its sub-accounts now hold one participant's share together
/// (docs/market-rules.md "Shared limits"): 300 sub-accounts of one
/// aggregator, each registering an unproven GPU, arming 16 stops and
/// submitting a job, fill the aggregator's share and no more, and a victim
/// keeps working.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_aggregators_sub_accounts_share_its_stops_and_jobs_and_a_victim_is_served() {
    use gpux_protocol::jobs::limits::JOBS_LIVE_PER_PARTICIPANT_MAX;
    let dir = tempfile::tempdir().expect("temp dir");
    let exchange = Exchange::start(dir.path(), Some(&key(1)));
    let (mut operator, _) = Client::login(&exchange.addr, &key(1), Role::Operator).await;
    let (mut aggregator, aggregator_account) = Client::login(&exchange.addr, &key(7), Role::Aggregator).await;
    let (mut victim, victim_account) = Client::login(&exchange.addr, &key(8), Role::Renter).await;
    for (id, account) in [(2, aggregator_account), (3, victim_account)] {
        let deposit = ClientMessage::Deposit { id, account, amount_minor: 1 << 44 };
        assert!(matches!(operator.request(deposit).await, ServerMessage::Ack { .. }));
    }
    const SUBS: u16 = 300;
    open_sub_accounts(&mut aggregator, SUBS).await;
    let job = |id: u64| {
        let run = JobRun::in_image("localhost/gpux-py:1", &["python3", "train.py"]);
        let job = JobSubmission::one_host(&format!("job-{id}"), InstrumentId(0), 1, 10_000, 1, 100_000, run);
        ClientMessage::SubmitJob { id, job: Box::new(job) }
    };
    let (mut stops_armed, mut stops_refused, mut jobs_taken, mut jobs_refused) = (0u64, 0u64, 0usize, 0usize);
    let (mut gpus_taken, mut gpus_refused) = (0usize, 0usize);
    for n in 0..SUBS {
        let mut sub = as_sub_account(&exchange, n).await;
        // A GPU that never answers its challenge, on a host of its own.
        let (acked, refused) = pipelined(&mut sub, vec![register(50, &format!("sub-{n}"), 0)]).await;
        gpus_taken += acked;
        gpus_refused += refused.get(&RejectCode::GpusAwaitingChallenge).copied().unwrap_or(0);
        let (acked, refused) = pipelined(&mut sub, (0..16).map(|i| stop_bid(100 + i, i)).collect()).await;
        stops_armed += acked as u64;
        stops_refused += refused.get(&RejectCode::TooManyStops).copied().unwrap_or(0) as u64;
        assert_eq!(acked + refused.get(&RejectCode::TooManyStops).copied().unwrap_or(0), 16, "sub-account {n}: {refused:?}");
        let id = sub.id();
        match sub.request(job(id)).await {
            ServerMessage::Job { .. } => jobs_taken += 1,
            ServerMessage::Error { code: ErrorCode::TooManyJobs, .. } => jobs_refused += 1,
            other => panic!("{other:?}"),
        }
    }
    let share = limits::STOPS_ARMED_PER_PARTICIPANT_MAX as u64;
    assert_eq!((stops_armed, stops_refused), (share, u64::from(SUBS) * 16 - share), "the participant's share of stops, no more");
    assert_eq!((jobs_taken, jobs_refused), (JOBS_LIVE_PER_PARTICIPANT_MAX, SUBS as usize - JOBS_LIVE_PER_PARTICIPANT_MAX));
    let unproven = limits::GPUS_UNPROVEN_PER_PARTICIPANT_MAX as usize;
    assert_eq!((gpus_taken, gpus_refused), (unproven, SUBS as usize - unproven), "one host's worth of unproven GPUs, no more");
    let (mut supplier, _) = Client::login(&exchange.addr, &key(9), Role::Supplier).await;
    let (acked, refused) = pipelined(&mut supplier, (0..8).map(|gpu| register(10 + gpu as u64, "honest", gpu)).collect()).await;
    assert_eq!((acked, refused.len()), (8, 0), "another supplier registers: {refused:?}");
    let (_, refused) = pipelined(&mut aggregator, vec![stop_bid(900, 900)]).await;
    assert_eq!(refused.get(&RejectCode::TooManyStops), Some(&1), "the parent itself");
    // The victim, another participant, arms its stops and submits its job.
    let (acked, refused) = pipelined(&mut victim, (0..16).map(|i| stop_bid(2 + i, 1 + i)).collect()).await;
    assert_eq!((acked, refused.len()), (16, 0), "the victim arms its stops: {refused:?}");
    let id = victim.id();
    assert!(matches!(victim.request(job(id)).await, ServerMessage::Job { .. }), "the victim's job is taken");
}
