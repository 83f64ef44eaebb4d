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
    let mut watcher = Client::connect(&exchange.addr).await;
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
