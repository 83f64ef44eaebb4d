//! The README's run command with `--sim`: the live simulated market trades
//! on the real exchange over real WebSockets. An anonymous watcher (market
//! data is public) subscribes to every spot and preemptible book and must see
//! bids, asks and trades appear within a minute and a half.

mod common;

use std::time::{Duration, Instant};

use common::*;
use gpux_engine::InstrumentId;
use gpux_protocol::{Channel, ServerMessage};

#[tokio::test]
async fn the_live_simulated_market_trades_over_the_real_gateway() {
    let dir = tempfile::tempdir().expect("temp dir");
    let exchange = Exchange::start_with(dir.path(), None, &["--sim", "--sim-suppliers", "8", "--sim-renters", "24"]);
    await_trading(&exchange.addr).await;
    // The simulated hosts answer their hardware challenges (on this CPU, at
    // the demo listing's CPU-sized terms): their offers show verified GPUs.
    let mut watcher = Client::connect(&exchange.addr).await;
    // (An anonymous connection stays open while it follows a feed.)
    let id = watcher.id();
    watcher.request_subscribe(id, Channel::Trades, InstrumentId(0)).await;
    let started = Instant::now();
    loop {
        let mut verified = 0;
        for instrument in 0..8 {
            let id = watcher.id();
            let message = gpux_protocol::ClientMessage::BookOffers { id, instrument: InstrumentId(instrument), offset: 0, after: None };
            if let ServerMessage::BookOffers { offers, .. } = watcher.request(message).await {
                verified += offers.iter().map(|o| o.gpus_verified).sum::<u32>();
            }
        }
        if verified > 0 {
            break;
        }
        assert!(started.elapsed() < Duration::from_secs(60), "no offer of the live market shows a verified GPU");
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// The README runs `--sim` twice on one data directory: the second run's
/// traders are the first run's (same keys, same GPUs) and trade again,
/// without a warning line from the market's own orders.
#[tokio::test]
async fn the_live_market_trades_again_after_a_restart_on_the_same_data() {
    let dir = tempfile::tempdir().expect("temp dir");
    let log = dir.path().join("exchange.log");
    let data = dir.path().join("data");
    let args = ["--sim", "--sim-suppliers", "4", "--sim-renters", "8"];
    let mut first = Exchange::start_logged(&data, &log, "warn", &args);
    await_trading(&first.addr).await;
    first.terminate();
    let first_run = std::fs::read_to_string(&log).expect("log").len();
    let second = Exchange::start_logged(&data, &log, "warn", &args);
    await_trading(&second.addr).await;
    let log = std::fs::read_to_string(&log).expect("log")[first_run..].to_string();
    assert!(!log.contains("live simulated market stopped"), "{log}");
    assert!(!log.contains("WARN"), "the live market's own orders warn nobody:\n{log}");
}

/// A job submitted on the demo market: `--sim`'s simulated hosts deliver
/// nothing (they publish no encryption key), so the job's bid never trades
/// with their asks (docs/jobs.md "A job's life"), although the simulated
/// renters' bids take those asks at the same prices.
#[tokio::test]
async fn a_job_on_the_live_simulated_market_never_lands_on_a_host_that_cannot_deliver() {
    use gpux_engine::Role;
    use gpux_protocol::{ClientMessage, JobRun, JobState, JobSubmission};
    let dir = tempfile::tempdir().expect("temp dir");
    let operator = key(1);
    let exchange = Exchange::start_with(dir.path(), Some(&operator), &["--sim", "--sim-suppliers", "8", "--sim-renters", "24"]);
    await_trading(&exchange.addr).await;
    let (mut renter, account) = Client::login(&exchange.addr, &key(90), Role::Renter).await;
    let (mut admin, _) = Client::login(&exchange.addr, &operator, Role::Operator).await;
    let id = admin.id();
    admin.request(ClientMessage::Deposit { id, account, amount_minor: 1_000_000_000_000 }).await;
    let id = renter.id();
    let ServerMessage::Instruments { instruments, .. } = renter.request(ClientMessage::Instruments { id }).await else {
        panic!("instruments")
    };
    let h100 = instruments.iter().find(|i| i.instrument == InstrumentId(0)).expect("the H100 spot book");
    // At the book's highest price: every ask is within the job's limit.
    let limit = h100.price_max_minor_per_gpu_hour / h100.tick_minor.max(1) * h100.tick_minor.max(1);
    let run = JobRun::in_image("localhost/gpux-py:1", &["python3", "train.py"]);
    let job = JobSubmission::one_host("on-the-demo-market", InstrumentId(0), 1, limit, 1, limit * 4, run);
    let id = renter.id();
    let ServerMessage::Job { job, .. } = renter.request(ClientMessage::SubmitJob { id, job: Box::new(job) }).await else {
        panic!("the job is taken")
    };
    let started = Instant::now();
    let mut asks_seen = 0;
    while started.elapsed() < Duration::from_secs(15) {
        let id = renter.id();
        if let ServerMessage::BookOffers { offers, .. } =
            renter.request(ClientMessage::BookOffers { id, instrument: InstrumentId(0), offset: 0, after: None }).await
        {
            asks_seen += offers.len();
        }
        let id = renter.id();
        let ServerMessage::Job { job: info, .. } = renter.request(ClientMessage::JobStatus { id, job: job.job }).await else {
            panic!("the job's status")
        };
        assert!(matches!(info.state, JobState::Bidding { .. }), "the job went to a simulated host: {:?}", info.state);
        assert!(info.leases.is_empty(), "{:?}", info.leases);
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    assert!(asks_seen > 0, "the simulated hosts offered H100s within the job's limit all along");
}

async fn await_trading(addr: &str) {
    let mut watcher = Client::connect(addr).await;
    for instrument in 0..8 {
        for channel in [Channel::Book, Channel::Trades] {
            let id = watcher.id();
            watcher.request_subscribe(id, channel, InstrumentId(instrument)).await;
        }
    }
    let (mut bids, mut asks, mut trades) = (0, 0, 0);
    let started = Instant::now();
    while trades < 3 || bids == 0 || asks == 0 {
        assert!(started.elapsed() < Duration::from_secs(90), "after 90 s: {bids} bid updates, {asks} ask updates, {trades} trades");
        // A ping bounds each wait: everything before its pong is market data.
        let id = watcher.id();
        watcher.send(&gpux_protocol::ClientMessage::Ping { id }).await;
        loop {
            match watcher.recv().await {
                ServerMessage::Pong { id: pong, .. } if pong == id => break,
                ServerMessage::BookUpdate { side: gpux_engine::Side::Buy, quantity, .. } if quantity > 0 => bids += 1,
                ServerMessage::BookUpdate { side: gpux_engine::Side::Sell, quantity, .. } if quantity > 0 => asks += 1,
                ServerMessage::Trade { .. } => trades += 1,
                _ => {}
            }
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}
