//! Engine throughput and per-command latency on the realistic mixed flow
//! (60% add, 30% cancel, 10% cross on a 10k-order book), measured outside
//! criterion so the percentiles come from every single command.
//!
//! Run: `cargo run --release -p gpux-benches --bin engine-latency [commands]`.
//! Throughput is timed over the whole replay with no per-command clock reads;
//! latency is a second replay on a fresh engine with `Instant::now()` around
//! each `apply` (the two clock reads add ~40 ns to every sample).

use std::time::Instant;

use gpux_benches::mixed_flow;
use hdrhistogram::Histogram;

fn main() {
    let commands: usize = std::env::args().nth(1).map_or(1_000_000, |arg| arg.parse().expect("commands is a number"));
    eprintln!("generating {commands} commands on a 10k-order book...");
    let generation = Instant::now();
    let workload = match std::env::var("GPUX_BENCH_WORKLOAD").as_deref() {
        Ok("cross10") => gpux_benches::crosses(20_000, 10, commands, 42),
        _ => mixed_flow(10_000, commands, 42),
    };
    eprintln!("generated in {:.1} s; replaying", generation.elapsed().as_secs_f64());
    let repeats: usize = std::env::var("GPUX_BENCH_REPEATS").map_or(1, |v| v.parse().expect("GPUX_BENCH_REPEATS is a number"));
    for _ in 1..repeats {
        // Extra throughput-only replays, for profilers attached after generation.
        let mut engine = workload.prepared_engine();
        for input in &workload.measured {
            engine.apply(input);
        }
    }

    let mut engine = workload.prepared_engine();
    let mut events = 0usize;
    let started = Instant::now();
    for input in &workload.measured {
        events += engine.apply(input).len();
    }
    let elapsed = started.elapsed();
    let per_second = workload.measured.len() as f64 / elapsed.as_secs_f64();
    println!(
        "throughput: {:.2} M commands/s ({} commands, {} events, {:.1} ms)",
        per_second / 1e6,
        workload.measured.len(),
        events,
        elapsed.as_secs_f64() * 1e3
    );

    let mut engine = workload.prepared_engine();
    let mut histogram = Histogram::<u64>::new_with_bounds(1, 10_000_000_000, 3).expect("valid bounds");
    let mut slowest = Vec::new();
    for (index, input) in workload.measured.iter().enumerate() {
        let started = Instant::now();
        let events = engine.apply(input).len();
        let nanos = started.elapsed().as_nanos().max(1) as u64;
        histogram.record(nanos).expect("in range");
        if nanos > 1_000_000 {
            slowest.push((index, nanos, events));
        }
    }
    if std::env::var_os("GPUX_BENCH_BY_KIND").is_some() {
        let mut engine = workload.prepared_engine();
        let mut by_kind: Vec<(&str, Histogram<u64>)> = ["add", "cancel", "ioc"]
            .into_iter()
            .map(|kind| (kind, Histogram::<u64>::new_with_bounds(1, 10_000_000_000, 3).expect("valid bounds")))
            .collect();
        for input in &workload.measured {
            let kind = match &input.command {
                gpux_engine::Command::Place { order, .. } if order.time_in_force == gpux_engine::TimeInForce::Ioc => 2,
                gpux_engine::Command::Place { .. } => 0,
                _ => 1,
            };
            let started = Instant::now();
            engine.apply(input);
            by_kind[kind].1.record(started.elapsed().as_nanos().max(1) as u64).expect("in range");
        }
        for (kind, histogram) in &by_kind {
            println!(
                "{kind}: n {} p50 {} p99 {} mean {:.0}",
                histogram.len(),
                histogram.value_at_quantile(0.5),
                histogram.value_at_quantile(0.99),
                histogram.mean()
            );
        }
    }
    if std::env::var_os("GPUX_BENCH_SHOW_SLOW").is_some() {
        for (index, nanos, events) in slowest {
            eprintln!("slow: #{index} {nanos} ns, {events} events: {:?}", workload.measured[index].command);
        }
    }
    println!(
        "latency ns: p50 {} p90 {} p99 {} p99.9 {} p99.99 {} max {}",
        histogram.value_at_quantile(0.5),
        histogram.value_at_quantile(0.9),
        histogram.value_at_quantile(0.99),
        histogram.value_at_quantile(0.999),
        histogram.value_at_quantile(0.9999),
        histogram.max()
    );
}
