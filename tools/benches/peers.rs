//! The peer comparison under criterion: W1–W4 for 64 B objects (W1/W2 also 256 B) and
//! the W5 request mix (each object written at its first and last word) on one and two
//! threads, every contender of the peer suite
//! (`lineup::PEER_SUITE`, and for W5 `lineup::peer_mixes`).
//! `cargo bench -p proxalloc-tools --bench peers`; `python3 scripts/bench_chart.py` then
//! draws `docs/benchmarks.svg` from criterion's estimates. For ratios measured
//! interleaved in one run, use `cargo bench -p proxalloc-tools --bench peers_interleaved`.

use std::time::Duration;

use criterion::{criterion_group, criterion_main, Criterion};
use proxalloc_tools::criterion_groups::{group, mix_group};
use proxalloc_tools::lineup::{contenders, peer_mixes, Work, PEER_SUITE};
use proxalloc_tools::workloads::{Ends, Obj, BATCH};

fn all(c: &mut Criterion) {
    let c64 = contenders::<Obj<64>>(&PEER_SUITE);
    let c256 = contenders::<Obj<256>>(&PEER_SUITE);
    group(c, "w1-pair-64B", &c64, Work::W1, 1, 1);
    group(c, "w1-pair-256B", &c256, Work::W1, 1, 1);
    group(c, "w2-batch-64B", &c64, Work::W2, BATCH, BATCH);
    group(c, "w2-batch-256B", &c256, Work::W2, BATCH, BATCH);
    group(
        c,
        "w3-two-threads-64B",
        &c64,
        |n| Work::W3(n.div_ceil(4).max(1)),
        BATCH,
        BATCH,
    );
    group(
        c,
        "w4-remote-free-64B",
        &c64,
        |n| Work::W4(n.max(1)),
        64,
        64,
    );
    // One set of W5 allocators for both groups: every allocator in use takes a table
    // index, and with W1–W4's ten the process stays within a thread's 32 inline caches
    // (the zeroed mix, whose allocators would pass them, is the interleaved runner's).
    let mixes = peer_mixes::<Ends>();
    mix_group(c, "w5-request-mix-1-thread", &mixes, false);
    mix_group(c, "w5-request-mix-2-threads", &mixes, true);
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
