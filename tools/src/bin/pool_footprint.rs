//! W7, the Subversion pattern: 200,000 iterations, each allocating 1–8 buffers of
//! 1–64 KiB into a per-iteration pool and clearing it, with a 1 MiB buffer every 1000th
//! iteration. Reports peak RSS and RSS after the last clear, also over the RSS at start
//! (which varies by a hundred KiB or so from process to process), for one contender per
//! process (run each in a fresh process; `--all` does that for every contender). The
//! pool contenders also print, on stderr, where the source's blocks are at the end: in
//! the thread's cache, in the depots, and how many were taken from the system.
//!
//! ```sh
//! cargo run --release -p proxalloc-tools --bin pool_footprint -- --all
//! cargo run --release -p proxalloc-tools --bin pool_footprint -- pool-2M   # one contender
//! ```

use std::alloc::System;

use proxalloc::{BlockSource, Pool};
use proxalloc_tools::arenas::MallocFree;
use proxalloc_tools::rss::{fresh_process, memory_kib};
use proxalloc_tools::runner::header;
use proxalloc_tools::workloads::{w7, W7_ITERATIONS};

const CONTENDERS: [&str; 5] = ["pool-2M", "pool-4M", "pool-unlimited", "bumpalo", "malloc"];

/// (RSS at start, peak RSS, RSS after the last clear) in KiB.
fn run(contender: &str) -> (u64, u64, u64) {
    let start = memory_kib().rss;
    match contender {
        "bumpalo" => w7(&mut bumpalo::Bump::new()),
        // At most 9 buffers an iteration.
        "malloc" => w7(&mut MallocFree::new(System, 16)),
        name => {
            let max_free = match name {
                "pool-2M" => 2 << 20,
                "pool-4M" => 4 << 20,
                "pool-unlimited" => usize::MAX,
                other => panic!("unknown contender {other:?}; one of {CONTENDERS:?}"),
            };
            let source = BlockSource::new(max_free);
            let mut pool = Pool::with_source(&source);
            w7(&mut pool);
            let m = memory_kib();
            for st in source.stats() {
                eprintln!(
                    "  {name} {}: {} in threads, {} in depot, {} reserved, {} backing allocs",
                    st.name,
                    st.cached_in_threads,
                    st.cached_in_depot,
                    st.reserved_objects(),
                    st.backing_allocs
                );
            }
            eprintln!(
                "  {name}: source caches {} KiB (max_free {} KiB)",
                source.cached_bytes() >> 10,
                if max_free == usize::MAX {
                    u64::MAX
                } else {
                    (max_free >> 10) as u64
                }
            );
            return (start, m.peak, m.rss);
        }
    }
    let m = memory_kib();
    (start, m.peak, m.rss)
}

fn main() {
    let arg = std::env::args().nth(1).unwrap_or_else(|| "--all".into());
    if arg == "--all" {
        println!("W7: {W7_ITERATIONS} iterations of 1-8 buffers of 1-64 KiB, 1 MiB every 1000th (RSS in KiB)");
        print!(
            "{}",
            header(&[
                "contender",
                "RSS at start",
                "peak RSS",
                "peak over start",
                "RSS after last clear",
                "retained over start",
            ])
        );
        for c in CONTENDERS {
            let out = fresh_process(&[c]);
            print!("{}", String::from_utf8_lossy(&out.stdout));
            eprint!("{}", String::from_utf8_lossy(&out.stderr));
        }
        return;
    }
    let (start, peak, end) = run(&arg);
    println!(
        "| {arg} | {start} | {peak} | {} | {end} | {} |",
        peak as i64 - start as i64,
        end as i64 - start as i64
    );
}
