//! Criterion benchmarks of the single-thread fast paths (W1 pair, W2 batch of 1024 live
//! objects, 64 B), proxalloc's paths against the system allocator, mimalloc and the lower
//! bound (`lineup::FAST_PATH`). `cargo bench -p proxalloc-tools --bench class_alloc`.
//! For ratios measured interleaved in one run, use
//! `cargo bench -p proxalloc-tools --bench interleaved`.

use std::time::Duration;

use criterion::{criterion_group, criterion_main, Criterion};
use proxalloc_tools::criterion_groups::group;
use proxalloc_tools::lineup::{contenders, Work, FAST_PATH};
use proxalloc_tools::workloads::{Words, BATCH};

fn all(c: &mut Criterion) {
    let list = contenders::<Words>(&FAST_PATH);
    group(c, "fastpath-w1-pair-64B", &list, Work::W1, 1, 1);
    // Throughput in operations: an allocation and a free per object.
    group(
        c,
        "fastpath-w2-batch1024-64B",
        &list,
        Work::W2,
        BATCH,
        2 * BATCH,
    );
}

criterion_group! {
    name = benches;
    config = Criterion::default().warm_up_time(Duration::from_millis(300)).measurement_time(Duration::from_secs(1));
    targets = all
}
criterion_main!(benches);
