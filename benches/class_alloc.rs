//! Criterion benchmarks of the single-thread fast paths (W1 pair, W2 batch of 1024 live
//! objects), proxalloc against the system allocator, mimalloc and the lower bound.
//! `cargo bench --bench class_alloc`. For ratios measured interleaved in one run, use
//! `cargo bench --bench interleaved`.

mod common;

use std::time::Duration;

use common::*;
use criterion::{criterion_group, criterion_main, Criterion, Throughput};

fn bench<C: Contender>(c: &mut Criterion) {
    let mut g = c.benchmark_group("fastpath-w1-pair-64B");
    g.throughput(Throughput::Elements(1));
    g.bench_function(C::NAME, |b| {
        b.iter_custom(|iters| Duration::from_nanos(time(|| C::w1(iters)) as u64))
    });
    g.finish();
    let mut g = c.benchmark_group("fastpath-w2-batch1024-64B");
    g.throughput(Throughput::Elements(2 * BATCH as u64));
    g.bench_function(C::NAME, |b| {
        b.iter_custom(|iters| Duration::from_nanos(time(|| C::w2(iters)) as u64))
    });
    g.finish();
}

fn all(c: &mut Criterion) {
    bench::<LowerBound>(c);
    bench::<Proxalloc>(c);
    bench::<ProxallocLocal>(c);
    bench::<DepotOnly>(c);
    bench::<SystemBox>(c);
    bench::<Mimalloc>(c);
}

criterion_group! {
    name = benches;
    config = Criterion::default().warm_up_time(Duration::from_millis(300)).measurement_time(Duration::from_secs(1));
    targets = all
}
criterion_main!(benches);
