//! Footprint after a spike: RSS before, at a spike of one million live 64-byte objects,
//! after freeing them, and after `trim()` (proxalloc) — each contender in a fresh process.
//! `proxalloc-spread` holds the same spike in 100 allocators (640 KiB each, below the
//! 1 MiB at which one allocator's trim asks glibc for memory back) and trims them all with
//! `trim_all`.
//!
//! ```sh
//! cargo run --release -p proxalloc-tools --bin spike_footprint            # every contender
//! cargo run --release -p proxalloc-tools --bin spike_footprint -- proxalloc
//! ```

use proxalloc::{CacheMode, ClassAllocator};
use proxalloc_tools::contenders::{
    leak, ArrayQueuePool, Contender, Proxalloc, SystemBox, ViaGlobal,
};
use proxalloc_tools::rss::{fresh_process, rss_kib};
use proxalloc_tools::runner::header;
use proxalloc_tools::workloads::{spike, Obj};

const LIVE: u64 = 1_000_000;
const CONTENDERS: [&str; 6] = [
    "proxalloc",
    "proxalloc-spread",
    "box-system",
    "mimalloc",
    "jemalloc",
    "arrayqueue-pool",
];

/// The spike on `c`: (RSS at the spike, after the free).
fn on<C: Contender<'static, Obj<64>>>(c: &'static C) -> (u64, u64) {
    spike(c, LIVE, Obj::<64>::new, rss_kib)
}

/// (before, at spike, after free, after trim) in KiB.
fn run(name: &str) -> (u64, u64, u64, Option<u64>) {
    let before = rss_kib();
    let (spike, freed) = match name {
        "proxalloc" => {
            let p = Proxalloc::new(CacheMode::ThreadCaches);
            let (spike, freed) = on(p);
            p.0.trim();
            return (before, spike, freed, Some(rss_kib()));
        }
        "proxalloc-spread" => {
            const SPREAD: u64 = 100;
            let allocs: Vec<&'static ClassAllocator<Obj<64>>> = (0..SPREAD)
                .map(|_| &*Box::leak(Box::new(ClassAllocator::new("spike-spread"))))
                .collect();
            let held: Vec<_> = (0..LIVE)
                .map(|i| allocs[(i % SPREAD) as usize].alloc(Obj::<64>::new(i)))
                .collect();
            std::hint::black_box(&held);
            let spike = rss_kib();
            drop(held);
            let freed = rss_kib();
            proxalloc::trim_all();
            return (before, spike, freed, Some(rss_kib()));
        }
        "box-system" => on(leak(SystemBox)),
        "mimalloc" => on(leak(ViaGlobal(mimalloc::MiMalloc))),
        "jemalloc" => on(leak(ViaGlobal(tikv_jemallocator::Jemalloc))),
        // A queue that holds every object: the pool keeps all it was given back.
        "arrayqueue-pool" => on(leak(ArrayQueuePool(crossbeam_queue::ArrayQueue::new(
            LIVE as usize,
        )))),
        other => panic!("unknown contender {other:?}; one of {CONTENDERS:?}"),
    };
    (before, spike, freed, None)
}

fn main() {
    if let Some(name) = std::env::args().nth(1) {
        let (before, spike, freed, trimmed) = run(&name);
        let pct = |x: u64| format!("{:+.0}%", (x as f64 / before as f64 - 1.0) * 100.0);
        println!(
            "| {name} | {before} | {spike} | {freed} ({}) | {} |",
            pct(freed),
            trimmed.map_or("—".to_string(), |t| format!("{t} ({})", pct(t)))
        );
        return;
    }
    println!("spike of {LIVE} live 64 B objects (RSS in KiB; change against before)");
    print!(
        "{}",
        header(&[
            "contender",
            "before",
            "at spike",
            "after free",
            "after trim"
        ])
    );
    for c in CONTENDERS {
        print!("{}", String::from_utf8_lossy(&fresh_process(&[c]).stdout));
    }
}
