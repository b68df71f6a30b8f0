//! The workloads as criterion benchmark groups (for `class_alloc` and `peers`): one group
//! per workload, one function per contender, timed by the workload itself
//! (`iter_custom`), so criterion measures the same loop as the interleaved runner.

use std::time::Duration;

use criterion::{Criterion, Throughput};

use super::lineup::{Entry, MixEntry, Work};

/// Nanoseconds per object, times objects, as a `Duration` (for `iter_custom`).
pub fn total(ns_per: f64, n: u64) -> Duration {
    Duration::from_nanos((ns_per * n as f64) as u64)
}

/// Group `name`: every contender of `list` that takes the workload. `work` turns
/// criterion's iteration count into the workload; each iteration is `objects` objects,
/// reported as `elements` elements of throughput.
pub fn group(
    c: &mut Criterion,
    name: &str,
    list: &[Entry],
    work: fn(u64) -> Work,
    objects: u64,
    elements: u64,
) {
    let mut g = c.benchmark_group(name);
    g.throughput(Throughput::Elements(elements));
    for e in list {
        if (e.run)(work(1)).is_none() {
            continue;
        }
        g.bench_function(e.name, |b| {
            b.iter_custom(|iters| total((e.run)(work(iters)).unwrap() * objects as f64, iters))
        });
    }
    g.finish();
}

/// Group `name`: a W5 mix (the objects `list` was made for), one request per iteration,
/// on two threads if `two`.
pub fn mix_group(c: &mut Criterion, name: &str, list: &[MixEntry], two: bool) {
    let mut g = c.benchmark_group(name);
    g.throughput(Throughput::Elements(1));
    for m in list {
        g.bench_function(m.name, |b| {
            b.iter_custom(|iters| total((m.run)(two, iters.max(1)), iters))
        });
    }
    g.finish();
}
