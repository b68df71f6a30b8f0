//! Periodic trims under load: two threads churn through one allocator (rounds of 1024
//! objects of 64 bytes, as W2) while a third, after a burst of 200,000 objects, sits
//! idle; the main thread calls `proxalloc::trim_idle()`, `proxalloc::trim_all()`, or
//! nothing, every 10 ms for 2 s. Reports the busy threads' rounds, the objects the
//! allocator took from the system allocator meanwhile (what the trims made the busy
//! threads take again), and what the allocator holds at the end. Each mode in a fresh
//! process; `--all` runs every mode three times, alternating.
//!
//! ```sh
//! cargo run --release -p proxalloc-tools --bin trim_idle -- --all
//! cargo run --release -p proxalloc-tools --bin trim_idle -- trim-idle   # one mode
//! ```

use std::hint::black_box;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Barrier;
use std::time::{Duration, Instant};

use proxalloc::{CacheMode, ClassAllocator, Config};
use proxalloc_tools::rss::{fresh_process, rss_kib};
use proxalloc_tools::runner::header;

const MODES: [&str; 3] = ["none", "trim-idle", "trim-all"];
const BURST: usize = 200_000;
const ROUND: usize = 1024;
const PERIOD: Duration = Duration::from_millis(10);
const RUN: Duration = Duration::from_secs(2);

// Per-thread caches, as measured in docs/benchmarks.md (idle threads' stashes are what
// `trim_idle` takes from them).
static OBJECTS: ClassAllocator<[u64; 8]> = ClassAllocator::with_config(
    "trim-idle-objects",
    Config::new().mode(CacheMode::ThreadCaches),
);

/// (rounds of the busy threads, objects taken from the system while the trims ran,
/// bytes the allocator holds at the end, RSS at the end in KiB).
fn run(mode: &str) -> (u64, u64, u64, u64) {
    let trim: fn() -> usize = match mode {
        "none" => || 0,
        "trim-idle" => proxalloc::trim_idle,
        "trim-all" => proxalloc::trim_all,
        other => panic!("unknown mode {other:?}; one of {MODES:?}"),
    };
    let stop = AtomicBool::new(false);
    let rounds = AtomicU64::new(0);
    // The burst, the busy threads' first rounds, and the main thread: all set up before
    // the measured part.
    let ready = Barrier::new(4);
    let done = Barrier::new(2);
    let (rounds, taken, held) = std::thread::scope(|s| {
        s.spawn(|| {
            drop(
                (0..BURST)
                    .map(|i| OBJECTS.alloc([i as u64; 8]))
                    .collect::<Vec<_>>(),
            );
            ready.wait();
            done.wait(); // idle until the end
        });
        for _ in 0..2 {
            s.spawn(|| {
                let mut live = Vec::with_capacity(ROUND);
                let round = |live: &mut Vec<_>| {
                    live.extend((0..ROUND).map(|i| OBJECTS.alloc([i as u64; 8])));
                    black_box(&*live);
                    live.clear();
                };
                round(&mut live);
                ready.wait();
                while !stop.load(Ordering::Relaxed) {
                    round(&mut live);
                    rounds.fetch_add(1, Ordering::Relaxed);
                }
            });
        }
        ready.wait();
        let before = OBJECTS.stats().backing_allocs;
        let start = Instant::now();
        while start.elapsed() < RUN {
            std::thread::sleep(PERIOD);
            trim();
        }
        stop.store(true, Ordering::Relaxed);
        let taken = OBJECTS.stats().backing_allocs - before;
        done.wait();
        (
            rounds.load(Ordering::Relaxed),
            taken,
            OBJECTS.stats().reserved_bytes(),
        )
    });
    (rounds, taken, held, rss_kib())
}

fn main() {
    let arg = std::env::args().nth(1).unwrap_or_else(|| "--all".into());
    if arg != "--all" {
        let (rounds, taken, held, rss) = run(&arg);
        println!("| {arg} | {rounds} | {taken} | {} | {rss} |", held >> 10);
        return;
    }
    println!(
        "periodic trims: 2 busy threads x rounds of {ROUND} x 64 B, 1 idle thread after a burst of {BURST}, a trim every {PERIOD:?} for {RUN:?}"
    );
    print!(
        "{}",
        header(&[
            "mode",
            "busy rounds",
            "objects from the system during the trims",
            "held at the end (KiB)",
            "RSS at the end (KiB)",
        ])
    );
    for _ in 0..3 {
        for m in MODES {
            print!("{}", String::from_utf8_lossy(&fresh_process(&[m]).stdout));
        }
    }
}
