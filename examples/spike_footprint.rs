//! Footprint after a spike: RSS before, at a spike of one million live 64-byte objects,
//! after freeing them, and after `trim()` (proxalloc) — each contender in a fresh process.
//!
//! ```sh
//! cargo run --release --example spike_footprint            # every contender
//! cargo run --release --example spike_footprint -- proxalloc
//! ```

use std::alloc::{GlobalAlloc, Layout};
use std::hint::black_box;

use proxalloc::ClassAllocator;

const LIVE: usize = 1_000_000;
const CONTENDERS: [&str; 5] = [
    "proxalloc",
    "box-system",
    "mimalloc",
    "jemalloc",
    "arrayqueue-pool",
];

#[derive(Clone, Copy)]
struct Obj(#[allow(dead_code)] [u64; 8]);

fn rss_kib() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .unwrap_or(0)
}

/// Allocates and frees through a `GlobalAlloc`: (RSS at spike, after free).
fn via_global<A: GlobalAlloc>(a: &A) -> (u64, u64) {
    let layout = Layout::new::<Obj>();
    // SAFETY: non-zero layout; every block is written once and freed once below.
    let live: Vec<*mut u8> = (0..LIVE)
        .map(|i| unsafe {
            let p = a.alloc(layout);
            p.cast::<Obj>().write(Obj([i as u64; 8]));
            p
        })
        .collect();
    black_box(&live);
    let spike = rss_kib();
    for p in live {
        // SAFETY: allocated above with this layout.
        unsafe { a.dealloc(p, layout) };
    }
    (spike, rss_kib())
}

fn run(name: &str) -> (u64, u64, u64, Option<u64>) {
    let before = rss_kib();
    match name {
        "proxalloc" => {
            static OBJS: ClassAllocator<Obj> = ClassAllocator::new("spike");
            let live: Vec<_> = (0..LIVE).map(|i| OBJS.alloc(Obj([i as u64; 8]))).collect();
            let spike = rss_kib();
            drop(live);
            let freed = rss_kib();
            OBJS.trim();
            (before, spike, freed, Some(rss_kib()))
        }
        "box-system" => {
            let live: Vec<Box<Obj>> = (0..LIVE).map(|i| Box::new(Obj([i as u64; 8]))).collect();
            black_box(&live);
            let spike = rss_kib();
            drop(live);
            (before, spike, rss_kib(), None)
        }
        "mimalloc" => {
            let (s, f) = via_global(&mimalloc::MiMalloc);
            (before, s, f, None)
        }
        "jemalloc" => {
            let (s, f) = via_global(&tikv_jemallocator::Jemalloc);
            (before, s, f, None)
        }
        "arrayqueue-pool" => {
            let q = crossbeam_queue::ArrayQueue::<Box<Obj>>::new(LIVE);
            let live: Vec<Box<Obj>> = (0..LIVE)
                .map(|i| q.pop().unwrap_or_else(|| Box::new(Obj([i as u64; 8]))))
                .collect();
            let spike = rss_kib();
            for b in live {
                let _ = q.push(b);
            }
            (before, spike, rss_kib(), None)
        }
        other => panic!("unknown contender {other:?}; one of {CONTENDERS:?}"),
    }
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
    let exe = std::env::current_exe().expect("own path");
    println!("spike of {LIVE} live 64 B objects (RSS in KiB; change against before)");
    println!("| contender | before | at spike | after free | after trim |");
    println!("| --- | ---: | ---: | ---: | ---: |");
    for c in CONTENDERS {
        let out = std::process::Command::new(&exe)
            .arg(c)
            .output()
            .expect("run contender");
        print!("{}", String::from_utf8_lossy(&out.stdout));
    }
}
