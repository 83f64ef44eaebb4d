//! Criterion benchmarks of the engine's hot paths, each a pre-generated
//! command stream replayed on a copy of a prepared engine (the copy is made
//! outside the timed routine). Throughput is reported per command.
//!
//! Run: `cargo bench -p gpux-benches --bench engine`. Figures and the machine
//! they came from are in docs/PERFORMANCE.md.

use criterion::{criterion_group, criterion_main, BatchSize, Criterion, Throughput};
use gpux_benches::{adds, cancels, crosses, mixed_flow, Workload};
use gpux_engine::Engine;

fn replay(group: &mut criterion::BenchmarkGroup<'_, criterion::measurement::WallTime>, name: &str, workload: &Workload) {
    let prepared: Engine = workload.prepared_engine();
    group.throughput(Throughput::Elements(workload.measured.len() as u64));
    group.bench_function(name, |bencher| {
        bencher.iter_batched(
            || prepared.clone(),
            |mut engine| {
                let mut events = 0usize;
                for input in &workload.measured {
                    events += engine.apply(input).len();
                }
                (engine, events)
            },
            BatchSize::PerIteration,
        )
    });
}

fn engine_benches(c: &mut Criterion) {
    let mut group = c.benchmark_group("engine");
    group.sample_size(20);
    replay(&mut group, "add_resting_order_10k_book", &adds(10_000, 20_000, 1));
    replay(&mut group, "cancel_10k_book", &cancels(10_000, 20_000, 2));
    replay(&mut group, "ioc_crossing_1_level", &crosses(20_000, 1, 500, 3));
    replay(&mut group, "ioc_crossing_10_levels", &crosses(20_000, 10, 100, 4));
    replay(&mut group, "mixed_60_add_30_cancel_10_cross_10k_book", &mixed_flow(10_000, 50_000, 5));
    group.finish();
}

criterion_group!(benches, engine_benches);
criterion_main!(benches);
