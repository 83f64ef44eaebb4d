//! Criterion benchmarks of settlement's hot paths: verifying usage report
//! signatures one at a time and in batches of 64, the whole report path
//! (signature, chain, interval, metering) and posting ledger transfers.
//!
//! Run: `cargo bench -p gpux-benches --bench settlement`; figures in
//! docs/PERFORMANCE.md.

use criterion::{criterion_group, criterion_main, BatchSize, Criterion, Throughput};
use ed25519_dalek::SigningKey;
use gpux_engine::{AccountId, Event, EventKind, HoldReason, LeaseId, OrderId};
use gpux_protocol::{genesis_hash, UsageBody, UsageReport};
use gpux_settlement::ledger::Ledger;
use gpux_settlement::{LeaseTerms, Settlement};

const REPORTS: usize = 1_000;

fn chain(key: &SigningKey) -> Vec<UsageReport> {
    let mut reports: Vec<UsageReport> = Vec::with_capacity(REPORTS);
    for index in 0..REPORTS as u64 {
        let prev_hash = reports.last().map_or_else(genesis_hash, |r| r.hash());
        let body = UsageBody {
            lease: LeaseId(1),
            gpu_uuid: "GPU-a".into(),
            seq: index as u32 + 1,
            start_ms: 1_000_000 + index * 10_000,
            end_ms: 1_000_000 + (index + 1) * 10_000,
            available_ms: 10_000,
            utilisation_percent: 80,
            memory_used_mib_max: 1_000,
            unhealthy_samples: 0,
            prev_hash,
            readings: None,
        };
        reports.push(UsageReport::sign(body, key));
    }
    reports
}

fn settlement_benches(c: &mut Criterion) {
    let key = SigningKey::from_bytes(&[9; 32]);
    let public_key = key.verifying_key().to_bytes();
    let reports = chain(&key);
    let terms = LeaseTerms {
        lease: LeaseId(1),
        supplier: AccountId(1),
        gpu_uuids: vec!["GPU-a".into()],
        start_ms: 1_000_000,
        end_ms: None,
        price_minor_per_gpu_hour: 2_000_000,
        billing_closed: false,
    };
    let mut group = c.benchmark_group("settlement");
    group.sample_size(20);
    group.throughput(Throughput::Elements(REPORTS as u64));
    group.bench_function("verify_signature", |b| b.iter(|| reports.iter().filter(|r| r.verify(&public_key)).count()));
    let batches: Vec<Vec<(&UsageReport, [u8; 32])>> =
        reports.chunks(64).map(|chunk| chunk.iter().map(|r| (r, public_key)).collect()).collect();
    group.bench_function("verify_batch_64", |b| b.iter(|| batches.iter().filter(|batch| gpux_protocol::verify_batch(batch)).count()));
    group.bench_function("report_verify_chain_meter", |b| {
        b.iter_batched(
            Settlement::default,
            |mut settlement| {
                for report in &reports {
                    settlement.report(AccountId(1), &public_key, Some(&terms), report, u64::MAX / 2).expect("honest report");
                }
                settlement
            },
            BatchSize::SmallInput,
        )
    });
    let events: Vec<Event> = (0..REPORTS as u64)
        .flat_map(|i| {
            let account = AccountId((i % 64) as u32);
            [
                Event { seq: 3 * i + 1, at_ms: 0, kind: EventKind::FundsDeposited { account, amount_minor: 1_000 } },
                Event {
                    seq: 3 * i + 2,
                    at_ms: 0,
                    kind: EventKind::FundsHeld { account, amount_minor: 600, reason: HoldReason::Order(OrderId(i)) },
                },
                Event {
                    seq: 3 * i + 3,
                    at_ms: 0,
                    kind: EventKind::FundsReleased { account, amount_minor: 600, reason: HoldReason::Order(OrderId(i)) },
                },
            ]
        })
        .collect();
    group.throughput(Throughput::Elements(events.len() as u64));
    group.bench_function("ledger_post", |b| {
        b.iter_batched(
            Ledger::new,
            |mut ledger| {
                for event in &events {
                    ledger.apply(event).expect("posts");
                }
                ledger
            },
            BatchSize::SmallInput,
        )
    });
    group.finish();
}

criterion_group!(benches, settlement_benches);
criterion_main!(benches);
