//! Interleaved ratio runner for the fast paths: W1 and W2 (64 B) for proxalloc's paths,
//! the lower bound and the two general allocators (`lineup::FAST_PATH`), every contender
//! one sample in turn, round after round. Reports the minimum per-object time and the
//! ratios to the lower bound and to the best peer.
//!
//! `cargo bench -p proxalloc-tools --bench interleaved -- [rounds] [--csv PATH]`
//! (default 200 rounds).

use proxalloc_tools::lineup::{contenders, Work, FAST_PATH};
use proxalloc_tools::runner::{Args, Runner, Stat};
use proxalloc_tools::workloads::Words;

fn main() {
    let args = Args::parse(200);
    let list = contenders::<Words>(&FAST_PATH);
    let mut run = Runner::new("lower bound");
    let w1 = run.table(
        "W1 pair: alloc, write, free one 64 B object",
        "ns/object",
        Stat::Min,
        "lower-bound",
    );
    let w2 = run.table(
        "W2 batch: 1024 live 64 B objects, then free all (per object: alloc + free)",
        "ns/object",
        Stat::Min,
        "lower-bound",
    );
    for c in &list {
        run.cell(w1, c.name, c.peer, || (c.run)(Work::W1(20_000)));
        run.cell(w2, c.name, c.peer, || (c.run)(Work::W2(20)));
    }
    run.run(args.rounds);
    run.report(&args);
}
