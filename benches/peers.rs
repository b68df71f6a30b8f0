//! The peer comparison under criterion: W1–W4 for 64 B objects (W1/W2 also 256 B) and
//! the W5 request mix on one and two threads, every contender of `benches/suite`.
//! `cargo bench --bench peers`; `python3 scripts/bench_chart.py` then draws
//! `docs/benchmarks.svg` from criterion's estimates. For ratios measured interleaved in
//! one run, use `cargo bench --bench peers_interleaved`.

mod suite;

use std::time::Duration;

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use suite::contenders::{contenders, mixes, Entry, Work};
use suite::total;

fn group(c: &mut Criterion, name: &str, list: &[Entry], work: fn(u64) -> Work, per_iter: u64) {
    let mut g = c.benchmark_group(name);
    g.throughput(Throughput::Elements(per_iter));
    for e in list {
        if (e.run)(work(1)).is_none() {
            continue;
        }
        g.bench_function(e.name, |b| {
            b.iter_custom(|iters| total((e.run)(work(iters)).unwrap() * per_iter as f64, iters))
        });
    }
    g.finish();
}

fn all(c: &mut Criterion) {
    let c64 = contenders::<64>();
    let c256 = contenders::<256>();
    group(c, "w1-pair-64B", &c64, Work::W1, 1);
    group(c, "w1-pair-256B", &c256, Work::W1, 1);
    group(c, "w2-batch-64B", &c64, Work::W2, 1024);
    group(c, "w2-batch-256B", &c256, Work::W2, 1024);
    group(
        c,
        "w3-two-threads-64B",
        &c64,
        |n| Work::W3(n.div_ceil(4).max(1)),
        1024,
    );
    group(c, "w4-remote-free-64B", &c64, |n| Work::W4(n.max(1)), 64);
    for (name, two) in [
        ("w5-request-mix-1-thread", false),
        ("w5-request-mix-2-threads", true),
    ] {
        let mut g = c.benchmark_group(name);
        g.throughput(Throughput::Elements(1));
        for m in mixes() {
            g.bench_function(m.name, |b| {
                b.iter_custom(|iters| total((m.run)(two, iters.max(1)), iters))
            });
        }
        g.finish();
    }
}

criterion_group! {
    name = benches;
    config = Criterion::default()
        .sample_size(10)
        .warm_up_time(Duration::from_millis(200))
        .measurement_time(Duration::from_millis(800));
    targets = all
}
criterion_main!(benches);
