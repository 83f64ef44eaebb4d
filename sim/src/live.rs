//! The live simulated market: simulated suppliers and renters as real
//! WebSocket clients of a running exchange, so a newcomer sees books move,
//! trades print, leases start and usage reports settle in real time.
//!
//! Unlike the discrete-event simulator this runs on the wall clock and is not
//! deterministic (the network and the scheduler decide the interleaving); it
//! exists to exercise the real gateway and to make the demo alive. Every
//! participant uses only the documented protocol (docs/protocol.md) through
//! `gpux-client`: an operator funds the renters, suppliers register GPUs,
//! keep asks on the spot and preemptible books and report usage of their
//! leases; renters bid, lease and end their leases.

use std::time::Duration;

use anyhow::{Context, Result};
use ed25519_dalek::SigningKey;
use gpux_client::{now_ms, Connection};
use gpux_engine::{AccountId, EventKind, GpuSet, HostId, InstrumentId, LeaseDuration, LeaseId, Role, Side, TimeInForce};
use gpux_protocol::{genesis_hash, ClientMessage, OrderTicket, Readings, ServerMessage, UsageBody, UsageReport};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use tokio::sync::mpsc;

use crate::population::{spec_of, CLASSES};

#[derive(Clone, Debug)]
pub struct LiveOptions {
    pub url: String,
    /// A key the exchange accepts as operator (it funds the renters).
    pub operator_key: SigningKey,
    pub suppliers: u32,
    pub renters: u32,
    pub seed: u64,
}

const TICK_MINOR: u64 = 1_000;
const REPORT_EVERY_MS: u64 = 10_000;
const RENTER_DEPOSIT_MINOR: u64 = 10_000_000_000;
/// How many of a class's next hourly reserved windows its hosts offer in
/// (and renters bid in now and then), so every window shown near the
/// present has quotes.
const WINDOWS_OFFERED: usize = 3;

/// The next `WINDOWS_OFFERED` hourly windows of class `class_index` that
/// still trade, soonest first.
async fn trading_windows(connection: &mut Connection, class_index: usize) -> Result<Vec<InstrumentId>> {
    let id = connection.new_id();
    let ServerMessage::Instruments { instruments, .. } = connection.request(ClientMessage::Instruments { id }).await? else {
        anyhow::bail!("expected the instruments");
    };
    let mut windows: Vec<(u64, InstrumentId)> = instruments
        .iter()
        .filter(|i| i.class == CLASSES[class_index].name && i.state == gpux_engine::InstrumentState::Trading)
        .filter_map(|i| match i.contract {
            gpux_engine::ContractKind::Reserved { window_start_ms, window_end_ms }
                if window_end_ms - window_start_ms == gpux_engine::time::MS_PER_HOUR =>
            {
                Some((window_start_ms, i.instrument))
            }
            _ => None,
        })
        .collect();
    windows.sort_unstable();
    Ok(windows.into_iter().take(WINDOWS_OFFERED).map(|(_, instrument)| instrument).collect())
}

fn key_for(seed: u64, role: u8, index: u32) -> SigningKey {
    let mut rng = ChaCha8Rng::seed_from_u64(seed ^ ((role as u64) << 56) ^ index as u64);
    let mut secret = [0u8; 32];
    rng.fill(&mut secret);
    SigningKey::from_bytes(&secret)
}

fn price_near(rng: &mut ChaCha8Rng, class_index: usize, low_percent: u64, high_percent: u64) -> u64 {
    let list = CLASSES[class_index].list_price_minor * 70 / 100;
    (list * rng.random_range(low_percent..high_percent) / 100 / TICK_MINOR).max(1) * TICK_MINOR
}

/// Connects, retrying while the exchange starts up.
async fn connect(url: &str, key: &SigningKey, role: Role) -> Result<Connection> {
    let mut attempts = 0;
    loop {
        match Connection::open_with(url, key, Some(role), role == Role::Supplier).await {
            Ok(connection) => return Ok(connection),
            Err(error) if attempts < 50 => {
                attempts += 1;
                tracing::debug!(%error, "live market: exchange not up yet");
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            Err(error) => return Err(error.into()),
        }
    }
}

/// Runs the live market until an error (the exchange going away ends it).
pub async fn run(options: LiveOptions) -> Result<()> {
    let (fund_tx, mut fund_rx) = mpsc::channel::<AccountId>(1_024);
    let mut operator = connect(&options.url, &options.operator_key, Role::Operator).await.context("operator login")?;
    let mut tasks = tokio::task::JoinSet::new();
    for index in 0..options.suppliers {
        let options = options.clone();
        tasks.spawn(async move { supplier(options, index).await });
    }
    for index in 0..options.renters {
        let (options, fund_tx) = (options.clone(), fund_tx.clone());
        tasks.spawn(async move { renter(options, index, fund_tx).await });
    }
    drop(fund_tx);
    loop {
        tokio::select! {
            account = fund_rx.recv() => {
                let Some(account) = account else { break };
                let id = operator.new_id();
                operator.request(ClientMessage::Deposit { id, account, amount_minor: RENTER_DEPOSIT_MINOR }).await?;
            }
            finished = tasks.join_next() => match finished {
                Some(result) => result.context("a live participant panicked")??,
                None => break,
            },
        }
    }
    while let Some(result) = tasks.join_next().await {
        result.context("a live participant panicked")??;
    }
    Ok(())
}

struct LiveLease {
    lease: LeaseId,
    gpus: Vec<(u32, String)>,
    last_end_ms: Vec<u64>,
    seq: Vec<u32>,
    prev_hash: Vec<String>,
    ended: bool,
    /// False for a lease of an earlier run of the live market (found at
    /// start): its report chains were lost with that run, so it is only
    /// kept out of the asks until its renter ends it.
    reported: bool,
}

/// A host of 1-8 GPUs of one class: asks on both books, re-priced every few
/// seconds, and a signed, hash-chained usage report per leased GPU every ten.
async fn supplier(options: LiveOptions, index: u32) -> Result<()> {
    let key = key_for(options.seed, 1, index);
    let mut rng = ChaCha8Rng::seed_from_u64(options.seed.wrapping_add(index as u64 * 7_919));
    let class_index = index as usize % CLASSES.len();
    let mut connection = connect(&options.url, &key, Role::Supplier).await?;
    let host_name = format!("live-host-{index:03}");
    let gpu_count = [8u32, 8, 4, 8, 2, 8][index as usize % 6];
    // Hosts spread over the regions the exchange lists (none: no region).
    let id = connection.new_id();
    let region = match connection.request(ClientMessage::Listing { id }).await? {
        ServerMessage::Listing { listing, .. } if !listing.regions.is_empty() => {
            Some(listing.regions[index as usize % listing.regions.len()].clone())
        }
        _ => None,
    };
    for gpu in 0..gpu_count {
        let id = connection.new_id();
        let message = ClientMessage::RegisterGpu {
            id,
            host: host_name.clone(),
            gpu_uuid: format!("LIVE-{index:03}-{gpu}"),
            spec: spec_of(class_index),
            region: region.clone(),
            zone: None,
            fabric: None,
        };
        connection.request(message).await?;
    }
    let id = connection.new_id();
    // A simulated host has a handful of GPUs: one page holds them.
    let gpus = match connection.request(ClientMessage::MyGpus { id, offset: 0 }).await? {
        ServerMessage::Gpus { gpus, .. } => gpus,
        other => anyhow::bail!("expected the supplier's GPUs, got {other:?}"),
    };
    let host = gpus.first().map(|g| g.host).context("the GPUs registered")?;
    let mut host_state = HostState { index, leased_mask: 0, leases: Vec::new(), challenges: Vec::new() };
    resume_leases(&mut connection, &mut host_state, &gpus).await?;
    let mut next_reprice = 0;
    let mut next_report = now_ms() + REPORT_EVERY_MS;
    loop {
        if now_ms() >= next_reprice {
            next_reprice = now_ms() + rng.random_range(2_000..6_000);
            reprice(&mut connection, &mut rng, host, class_index, gpu_count, &mut host_state).await?;
        }
        if now_ms() >= next_report {
            next_report = now_ms() + REPORT_EVERY_MS;
            report_usage(&mut connection, &key, &mut host_state.leases).await?;
            host_state.leases.retain(|l| !l.ended);
        }
        while let Some(challenge) = host_state.challenges.pop() {
            answer_challenge(&mut connection, challenge).await?;
        }
        let Some(message) = connection.next_within(Duration::from_millis(250)).await? else { continue };
        if host_state.handle(&message, connection.account) {
            report_usage(&mut connection, &key, &mut host_state.leases).await?;
            host_state.leases.retain(|l| !l.ended);
        }
    }
}

/// Takes up the leases of an earlier run on this data directory (same
/// seed, same keys).
async fn resume_leases(connection: &mut Connection, host_state: &mut HostState, gpus: &[gpux_protocol::views::Gpu]) -> Result<()> {
    let me = connection.account;
    for info in active_leases(connection).await?.into_iter().filter(|l| l.supplier == me) {
        let bits: Vec<u32> = info.gpus.iter().filter_map(|id| gpus.iter().find(|g| g.gpu == *id)).map(|g| g.index_on_host).collect();
        host_state.leased_mask |= bits.iter().fold(0u64, |mask, bit| mask | 1 << bit);
        let n = bits.len();
        host_state.leases.push(LiveLease {
            lease: info.lease,
            gpus: bits.into_iter().map(|bit| (bit, format!("LIVE-{:03}-{bit}", host_state.index))).collect(),
            last_end_ms: vec![info.start_ms; n],
            seq: vec![0; n],
            prev_hash: vec![genesis_hash(); n],
            ended: false,
            reported: false,
        });
    }
    Ok(())
}

/// A hardware challenge of one of a live host's GPUs, to answer.
enum Challenge {
    Compute { challenge: u64, seed: String, n: u32 },
    Memory { challenge: u64, seed: String, words_log2: u32, passes: u32 },
}

/// Answers a hardware challenge honestly, as the agent's CPU backend does
/// (docs/market-rules.md "Verified hardware"): the live market's GPUs are
/// simulated on this machine's CPU, so they pass the demo listing's
/// CPU-sized challenges, which say so where "verified" is shown. Commits
/// the root, then opens the leaves the exchange names.
async fn answer_challenge(connection: &mut Connection, challenge: Challenge) -> Result<()> {
    let memory = matches!(challenge, Challenge::Memory { .. });
    let (id, seed) = match &challenge {
        Challenge::Compute { challenge: id, seed, .. } | Challenge::Memory { challenge: id, seed, .. } => (*id, seed.clone()),
    };
    let Some(seed) = hex::decode(&seed).ok().and_then(|bytes| <[u8; 32]>::try_from(bytes).ok()) else { return Ok(()) };
    let proof = tokio::task::spawn_blocking(move || match challenge {
        Challenge::Compute { n, .. } => gpux_protocol::challenge::cpu_proof(&seed, n),
        Challenge::Memory { words_log2, passes, .. } => {
            gpux_protocol::memory::CpuProof::new(gpux_protocol::memory::Params::new(&seed, words_log2, passes).compute())
        }
    })
    .await?;
    let request = connection.new_id();
    let commit = ClientMessage::ChallengeCommit { id: request, challenge: id, commitment: hex::encode(proof.root()) };
    let ServerMessage::ChallengeRows { rows, .. } = connection.request(commit).await? else { return Ok(()) };
    let request = connection.new_id();
    let leaves = proof.open(&rows);
    let opening = if memory {
        ClientMessage::MemoryOpening { id: request, challenge: id, leaves }
    } else {
        ClientMessage::ChallengeOpening { id: request, challenge: id, leaves }
    };
    connection.request(opening).await?;
    Ok(())
}

/// What a live host knows about its leases, from its private feed.
struct HostState {
    index: u32,
    leased_mask: u64,
    leases: Vec<LiveLease>,
    /// Hardware challenges received and not yet answered.
    challenges: Vec<Challenge>,
}

impl HostState {
    /// Takes one pushed message; `true` when a lease ended (time to report).
    fn handle(&mut self, message: &ServerMessage, account: AccountId) -> bool {
        match message {
            ServerMessage::GpuChallenge { challenge, seed, n, .. } => {
                self.challenges.push(Challenge::Compute { challenge: *challenge, seed: seed.clone(), n: *n });
                return false;
            }
            ServerMessage::GpuMemoryChallenge { challenge, seed, words_log2, passes, .. } => {
                let (words_log2, passes) = (*words_log2, *passes);
                self.challenges.push(Challenge::Memory { challenge: *challenge, seed: seed.clone(), words_log2, passes });
                return false;
            }
            _ => {}
        }
        let ServerMessage::Private { event, .. } = message else { return false };
        match event.kind {
            EventKind::LeaseCreated { lease, gpu_mask, start_ms, supplier, .. } if supplier == account => {
                self.leased_mask |= gpu_mask;
                let index = self.index;
                let gpus: Vec<(u32, String)> =
                    (0..64).filter(|bit| gpu_mask & (1 << bit) != 0).map(|bit| (bit, format!("LIVE-{index:03}-{bit}"))).collect();
                let n = gpus.len();
                self.leases.push(LiveLease {
                    lease,
                    gpus,
                    last_end_ms: vec![start_ms; n],
                    seq: vec![0; n],
                    prev_hash: vec![genesis_hash(); n],
                    ended: false,
                    reported: true,
                });
                false
            }
            EventKind::LeaseEnded { lease, .. } => match self.leases.iter_mut().find(|l| l.lease == lease) {
                Some(live) => {
                    live.ended = true;
                    for (bit, _) in &live.gpus {
                        self.leased_mask &= !(1 << bit);
                    }
                    true
                }
                None => false,
            },
            _ => false,
        }
    }
}

async fn reprice(
    connection: &mut Connection,
    rng: &mut ChaCha8Rng,
    host: HostId,
    class_index: usize,
    gpus: u32,
    state: &mut HostState,
) -> Result<()> {
    for kind in 0..2u32 {
        let id = connection.new_id();
        connection.request(ClientMessage::MassCancel { id, instrument: Some(InstrumentId(class_index as u32 * 2 + kind)) }).await?;
    }
    // Leases the old asks sold before the cancel arrive ahead of its answer:
    // take them in before deciding which GPUs are free.
    while let Some(message) = connection.next_within(Duration::ZERO).await? {
        state.handle(&message, connection.account);
    }
    let all = if gpus >= 64 { u64::MAX } else { (1u64 << gpus) - 1 };
    for (kind, (low, high)) in [(0u32, (90, 115)), (1, (45, 65))] {
        // The spot ask may have filled at once: its leases come before the
        // next ask is made.
        while let Some(message) = connection.next_within(Duration::ZERO).await? {
            state.handle(&message, connection.account);
        }
        let free = all & !state.leased_mask;
        let instrument = InstrumentId(class_index as u32 * 2 + kind);
        if free == 0 {
            continue;
        }
        let price = price_near(rng, class_index, low, high);
        // Asks of one reprice take ids apart mod 8 (spot, preemptible, windows).
        let mut order = OrderTicket::limit(now_ms() * 8 + kind as u64, instrument, Side::Sell, price, free.count_ones());
        order.supply = Some(GpuSet { host, gpu_mask: free });
        let id = connection.new_id();
        let answer = connection.request(ClientMessage::NewOrder { id, order, workload: None }).await?;
        if matches!(answer, ServerMessage::Reject { .. } | ServerMessage::Error { .. }) {
            tracing::warn!(?answer, "live market: a supplier's ask was refused");
        }
    }
    // The next hourly windows: every GPU the host has, a little under spot.
    for (n, window) in trading_windows(connection, class_index).await?.into_iter().enumerate() {
        let id = connection.new_id();
        connection.request(ClientMessage::MassCancel { id, instrument: Some(window) }).await?;
        let price = price_near(rng, class_index, 85, 105);
        let mut order = OrderTicket::limit(now_ms() * 8 + 2 + n as u64, window, Side::Sell, price, gpus);
        order.supply = Some(GpuSet { host, gpu_mask: all });
        let id = connection.new_id();
        let answer = connection.request(ClientMessage::NewOrder { id, order, workload: None }).await?;
        if matches!(answer, ServerMessage::Reject { .. } | ServerMessage::Error { .. }) {
            tracing::debug!(?answer, "live market: a window ask was refused (its GPUs sold in it already)");
        }
    }
    Ok(())
}

/// The account's active leases, every page.
async fn active_leases(connection: &mut Connection) -> Result<Vec<gpux_protocol::views::Lease>> {
    let (mut active, mut after) = (Vec::new(), None);
    loop {
        let id = connection.new_id();
        let ServerMessage::Leases { leases, next_after, .. } = connection.request(ClientMessage::Leases { id, after }).await? else {
            anyhow::bail!("expected the account's leases");
        };
        active.extend(leases.into_iter().filter(|l| l.active));
        match next_after {
            Some(next) => after = Some(next),
            None => return Ok(active),
        }
    }
}

/// Reports every GPU of every lease up to now (or to the lease's end, which
/// the exchange prorates: the agent learns of an end only when told).
async fn report_usage(connection: &mut Connection, key: &SigningKey, leases: &mut [LiveLease]) -> Result<()> {
    let now = now_ms().saturating_add_signed(connection.clock_offset_ms);
    for lease in leases.iter_mut().filter(|lease| lease.reported) {
        for gpu in 0..lease.gpus.len() {
            let start_ms = lease.last_end_ms[gpu];
            if now <= start_ms + 1 {
                continue;
            }
            let body = UsageBody {
                lease: lease.lease,
                gpu_uuid: lease.gpus[gpu].1.clone(),
                seq: lease.seq[gpu] + 1,
                start_ms,
                end_ms: now,
                available_ms: now - start_ms,
                utilisation_percent: 85,
                memory_used_mib_max: 30_000,
                unhealthy_samples: 0,
                prev_hash: lease.prev_hash[gpu].clone(),
                // Temperature and power as a busy H100 shows them (the console's telemetry chart).
                readings: Some(Readings {
                    temperature_c_max: Some(62 + (lease.seq[gpu] % 7)),
                    power_w_mean: Some(540 + 10 * (lease.seq[gpu] % 5)),
                }),
            };
            let report = UsageReport::sign(body, key);
            let id = connection.new_id();
            if let ServerMessage::UsageAccepted { .. } =
                connection.request(ClientMessage::UsageReport { id, report: report.clone() }).await?
            {
                lease.seq[gpu] += 1;
                lease.prev_hash[gpu] = report.hash();
                lease.last_end_ms[gpu] = now;
            }
        }
    }
    Ok(())
}

/// A renter bidding every few seconds for one or two GPUs for an hour,
/// ending each lease after a minute or so.
async fn renter(options: LiveOptions, index: u32, fund: mpsc::Sender<AccountId>) -> Result<()> {
    let key = key_for(options.seed, 2, index);
    let mut rng = ChaCha8Rng::seed_from_u64(options.seed.wrapping_add(1_000_003 + index as u64 * 104_729));
    let mut connection = connect(&options.url, &key, Role::Renter).await?;
    fund.send(connection.account).await.context("the operator task ended")?;
    // Leases of an earlier run on this data directory: nobody follows them now.
    let me = connection.account;
    for info in active_leases(&mut connection).await?.into_iter().filter(|l| l.renter == me) {
        let id = connection.new_id();
        connection.request(ClientMessage::EndLease { id, lease: info.lease }).await?;
    }
    let mut ends: Vec<(u64, LeaseId)> = Vec::new();
    let mut next_bid = now_ms() + rng.random_range(500..2_000);
    loop {
        let now = now_ms();
        if now >= next_bid {
            next_bid = now + rng.random_range(4_000..12_000);
            let class_index = rng.random_range(0..CLASSES.len());
            let kind = rng.random_range(0..2u32);
            let price = if kind == 0 { price_near(&mut rng, class_index, 75, 104) } else { price_near(&mut rng, class_index, 38, 58) };
            let mut instrument = InstrumentId(class_index as u32 * 2 + kind);
            // One bid in five is for one of the next hourly windows, below its asks.
            if rng.random_range(0..5) == 0 {
                let windows = trading_windows(&mut connection, class_index).await?;
                if !windows.is_empty() {
                    instrument = windows[rng.random_range(0..windows.len())];
                }
            }
            let mut order = OrderTicket::limit(now, instrument, Side::Buy, price, rng.random_range(1..3));
            order.time_in_force = TimeInForce::Gtt { expire_at_ms: now.saturating_add_signed(connection.clock_offset_ms) + 20_000 };
            order.duration = LeaseDuration::Hours(1);
            let id = connection.new_id();
            connection.request(ClientMessage::NewOrder { id, order, workload: None }).await?;
        }
        for (_, lease) in ends.iter().filter(|(at, _)| *at <= now) {
            let id = connection.new_id();
            connection.request(ClientMessage::EndLease { id, lease: *lease }).await?;
        }
        ends.retain(|(at, _)| *at > now);
        let Some(ServerMessage::Private { event, .. }) = connection.next_within(Duration::from_millis(200)).await? else { continue };
        if let EventKind::LeaseCreated { lease, renter, .. } = event.kind {
            if renter == connection.account {
                ends.push((now_ms() + rng.random_range(15_000..60_000), lease));
            }
        }
    }
}
