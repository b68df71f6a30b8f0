//! The peer comparison, interleaved: each round runs one sample of every contender on
//! every workload (W1–W4 at 64 and 256 B, W5 on one and two threads), so machine state
//! changes hit all alike. Single-thread workloads report the minimum over the rounds,
//! two-thread ones the median; ratios are within the run. Writes the tables to stdout
//! and as CSV to the workspace's `target/peers.csv` (or the `--csv` path).
//!
//! `cargo bench -p proxalloc-tools --bench peers_interleaved -- [rounds] [--csv PATH]
//! [--only NAME,..] [--tables TEXT,..]` (default 30 rounds; `--only lower-bound,proxalloc
//! --tables W3` runs those contenders on the W3 tables alone)

use proxalloc_tools::lineup::{contenders, peer_mixes, Work, PEER_SUITE};
use proxalloc_tools::runner::{Args, Runner, Stat};
use proxalloc_tools::workloads::Obj;

fn main() {
    let mut args = Args::parse(30);
    // The CSV the chart script and earlier runs expect, unless `--csv` says otherwise.
    args.csv
        .get_or_insert_with(|| proxalloc_tools::runner::target_dir().join("peers.csv"));
    let c64 = contenders::<Obj<64>>(&PEER_SUITE);
    let c256 = contenders::<Obj<256>>(&PEER_SUITE);
    let mix = peer_mixes();
    // The two-thread workloads run on two long-lived workers; "W3 two new threads"
    // starts two threads for each sample, so it includes their first use (the floor's
    // new threads fill their stacks from malloc: no floor there). "W4 polled" is W4
    // with a polled queue for the channel, so no thread sleeps in the kernel.
    let workloads = [
        ("W1 pair", Work::W1(20_000), Stat::Min),
        ("W2 batch", Work::W2(10), Stat::Min),
        ("W3 two threads", Work::W3(10), Stat::Median),
        ("W3 two new threads", Work::W3New(10), Stat::Median),
        ("W4 remote free", Work::W4(1000), Stat::Median),
        ("W4 polled", Work::W4Polled(1000), Stat::Median),
    ];
    let mut run = Runner::new("lower bound");
    run.restrict(&args);
    for (size, list) in [(64, &c64), (256, &c256)] {
        for (name, w, stat) in workloads {
            // 256 B: no W3 on new threads.
            if size == 256 && matches!(w, Work::W3New(_)) {
                continue;
            }
            let t = run.table(format!("{name} {size} B"), "ns/object", stat, "lower-bound");
            for c in list.iter() {
                run.cell(t, c.name, c.peer, move || (c.run)(w));
            }
        }
    }
    for (name, two, stat) in [
        ("W5 request mix, 1 thread", false, Stat::Min),
        ("W5 request mix, 2 threads", true, Stat::Median),
    ] {
        let t = run.table(name, "ns/request", stat, "lower-bound");
        for m in &mix {
            run.cell(t, m.name, m.peer, move || Some((m.run)(two, 500)));
        }
    }
    run.run(args.rounds);
    run.report(&args);
}
