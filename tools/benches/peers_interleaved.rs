//! The peer comparison, interleaved: each round runs one sample of every contender on
//! every workload (W1–W4 at 64 and 256 B, W5 on one and two threads, its objects written
//! at their ends and zeroed whole), so machine state
//! changes hit all alike. Single-thread workloads report the minimum over the rounds,
//! two-thread ones the median; ratios are within the run. Writes the tables to stdout
//! and as CSV to the workspace's `target/peers.csv` (or the `--csv` path).
//!
//! `cargo bench -p proxalloc-tools --bench peers_interleaved -- [rounds] [--csv PATH]
//! [--only NAME,..] [--tables TEXT,..] [--spread]` (default 30 rounds; `--only
//! lower-bound,proxalloc --tables W3` runs those contenders on the W3 tables alone;
//! `--spread` also prints each cell's percentiles)

use proxalloc_tools::lineup::{contenders, peer_mixes, Work, PEER_SUITE};
use proxalloc_tools::runner::{Args, Runner, Stat};
use proxalloc_tools::workloads::{Ends, Obj, Zeroed};

fn main() {
    let mut args = Args::parse(30);
    // The CSV the chart script and earlier runs expect, unless `--csv` says otherwise.
    args.csv
        .get_or_insert_with(|| proxalloc_tools::runner::target_dir().join("peers.csv"));
    let c64 = contenders::<Obj<64>>(&PEER_SUITE);
    let c256 = contenders::<Obj<256>>(&PEER_SUITE);
    // W5 twice: objects written at their first and last word (the request mix as the
    // targets define it), and objects zeroed whole (10.75 KiB of stores a request).
    let mix = [
        ("W5 request mix", peer_mixes::<Ends>()),
        ("W5 zeroed mix", peer_mixes::<Zeroed>()),
    ];
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
    for (mix_name, mixes) in &mix {
        for (threads, two, stat) in [
            ("1 thread", false, Stat::Min),
            ("2 threads", true, Stat::Median),
        ] {
            let t = run.table(
                format!("{mix_name}, {threads}"),
                "ns/request",
                stat,
                "lower-bound",
            );
            for m in mixes {
                run.cell(t, m.name, m.peer, move || Some((m.run)(two, 500)));
            }
        }
    }
    run.run(args.rounds);
    run.report(&args);
}
