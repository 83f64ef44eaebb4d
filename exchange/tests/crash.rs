//! Acknowledged means durable. Several clients stream orders into the real
//! exchange over real sockets; the process is killed with SIGKILL at a random
//! moment, several rounds running. After each restart every acknowledged
//! order is there, and re-sending the orders that were sent but never
//! acknowledged cannot make any of them appear twice (the client order id
//! of one that did reach the journal is refused as a duplicate).

mod common;

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::*;
use gpux_engine::*;
use gpux_protocol::*;

const RENTERS: u8 = 6;
const ROUNDS: u64 = 4;

#[derive(Default)]
struct Ledger {
    sent: BTreeSet<u64>,
    acked: BTreeSet<u64>,
}

/// Places resting bids (far below any ask, so nothing trades) until the
/// connection dies.
async fn stream_orders(addr: String, seed: u8, round: u64, ledger: Arc<Mutex<Ledger>>) {
    let (mut client, _) = Client::login(&addr, &key(seed), Role::Renter).await;
    for index in 0..100_000u64 {
        let client_order_id = round * 1_000_000 + index;
        ledger.lock().expect("ledger").sent.insert(client_order_id);
        match client.try_place(ticket(client_order_id, Side::Buy, 1_000_000 + (index % 50) * 1_000, 1)).await {
            Some(ServerMessage::Ack { .. }) => {
                ledger.lock().expect("ledger").acked.insert(client_order_id);
            }
            Some(other) => panic!("an order was refused: {other:?}"),
            None => return, // The exchange was killed.
        }
    }
}

async fn open_client_order_ids(addr: &str, seed: u8) -> Vec<u64> {
    let (mut client, _) = Client::login(addr, &key(seed), Role::Renter).await;
    client.open_orders().await.iter().map(|o| o.client_order_id).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nothing_acknowledged_is_lost_when_the_process_is_killed() {
    let dir = tempfile::tempdir().expect("temp dir");
    let operator = key(1);
    let mut exchange = Exchange::start(dir.path(), Some(&operator));
    {
        let (mut admin, _) = Client::login(&exchange.addr, &operator, Role::Operator).await;
        for seed in 0..RENTERS {
            let (_, account) = Client::login(&exchange.addr, &key(10 + seed), Role::Renter).await;
            let id = admin.id();
            let reply = admin.request(ClientMessage::Deposit { id, account, amount_minor: 1 << 48 }).await;
            assert!(matches!(reply, ServerMessage::Ack { .. }));
        }
    }
    let ledgers: Vec<Arc<Mutex<Ledger>>> = (0..RENTERS).map(|_| Arc::default()).collect();
    for round in 0..ROUNDS {
        let tasks: Vec<_> = (0..RENTERS)
            .map(|seed| tokio::spawn(stream_orders(exchange.addr.clone(), 10 + seed, round, ledgers[seed as usize].clone())))
            .collect();
        // Kill once the round has had at least 150 acknowledgements (however
        // fast this machine's fsync is), then at a different moment each round.
        let acked_before: usize = ledgers.iter().map(|l| l.lock().expect("ledger").acked.len()).sum();
        for _ in 0..2_000 {
            let acked: usize = ledgers.iter().map(|l| l.lock().expect("ledger").acked.len()).sum();
            if acked >= acked_before + 150 {
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        tokio::time::sleep(Duration::from_millis((round * 277) % 800)).await;
        exchange.kill();
        for task in tasks {
            // Each ends when its connection dies (a client still logging in
            // when the kill lands ends with its harness's panic, also fine).
            let _ = task.await;
        }
        exchange = Exchange::start(dir.path(), Some(&operator));
        assert!(!exchange.recovered_line.contains("plus 0 journal entries"), "a killed process replays its journal tail");
        for seed in 0..RENTERS {
            let open: BTreeSet<u64> = open_client_order_ids(&exchange.addr, 10 + seed).await.into_iter().collect();
            let ledger = ledgers[seed as usize].lock().expect("ledger");
            let lost: Vec<_> = ledger.acked.difference(&open).collect();
            assert!(lost.is_empty(), "round {round}: acknowledged orders lost: {lost:?}");
            assert!(open.is_subset(&ledger.sent), "round {round}: an order nobody sent appeared");
        }
    }
    let total_acked: usize = ledgers.iter().map(|l| l.lock().expect("ledger").acked.len()).sum();
    eprintln!("acknowledged orders across {ROUNDS} kill rounds: {total_acked}");
    assert!(total_acked >= 600, "the test drove hundreds of acknowledged orders ({total_acked})");

    // Re-send everything that was sent but never acknowledged.
    for seed in 0..RENTERS {
        let unacked: Vec<u64> = {
            let ledger = ledgers[seed as usize].lock().expect("ledger");
            ledger.sent.difference(&ledger.acked).copied().collect()
        };
        let (mut client, _) = Client::login(&exchange.addr, &key(10 + seed), Role::Renter).await;
        for client_order_id in &unacked {
            let reply = client.place(ticket(*client_order_id, Side::Buy, 1_000_000, 1)).await;
            assert!(
                matches!(reply, ServerMessage::Ack { .. } | ServerMessage::Reject { code: RejectCode::DuplicateClientOrderId, .. }),
                "{reply:?}"
            );
        }
        let open = open_client_order_ids(&exchange.addr, 10 + seed).await;
        let unique: BTreeSet<u64> = open.iter().copied().collect();
        assert_eq!(unique.len(), open.len(), "no order appears twice");
        assert_eq!(unique, ledgers[seed as usize].lock().expect("ledger").sent, "every sent order is there exactly once");
    }
}
