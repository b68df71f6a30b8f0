//! A pool of many threads that each did a burst of work and went idle: what do their
//! caches hold, and what can another thread get back?
//!
//! 256 threads (or `--threads N`) each allocate 200 objects from each of four allocators
//! (64 B, 512 B, 2 KiB, 8 KiB), free them, and block. The main thread reports RSS and the
//! bytes that proxalloc caches (in threads or CPUs, in depots, granted from the
//! process-wide thread-cache budget), calls `trim_all`, reports again, then lets the
//! threads exit. Each mode runs in a fresh process: per-thread caches (`caches`), per-CPU
//! caches (`percpu`), and every object going to the system allocator (`system`, which
//! calls glibc's `malloc_trim` where `trim_all` stands in the others).
//!
//! ```sh
//! cargo run --release -p proxalloc-tools --bin idle_threads                  # all modes, a table
//! cargo run --release -p proxalloc-tools --bin idle_threads -- --threads 1024
//! cargo run --release -p proxalloc-tools --bin idle_threads -- --one caches|percpu|system
//! cargo run --release -p proxalloc-tools --bin idle_threads -- --depot-bytes 0  # a depot budget
//! cargo run --release -p proxalloc-tools --bin idle_threads -- --trim-idle  # trim_idle first
//! ```
//!
//! `--trim-idle` calls `proxalloc::trim_idle()` twice, 5 ms apart, before `trim_all`, as a
//! server's maintenance task would, and reports RSS after it (`system` calls nothing
//! there: glibc alone gives back only what `malloc_trim` asks for).

use std::sync::{Arc, Barrier};

use proxalloc::{CacheMode, ClassAllocator, Config};
use proxalloc_tools::rss::{fresh_process, rss_kib};

const THREADS: usize = 256;
const BURST: usize = 200;

/// The thread count from `--threads N` (default [`THREADS`]).
fn threads_arg(args: &[String]) -> usize {
    args.iter()
        .position(|a| a == "--threads")
        .and_then(|i| args.get(i + 1)?.parse().ok())
        .unwrap_or(THREADS)
}

/// The depot budget from `--depot-bytes N` (default: the allocators' own).
fn depot_arg(args: &[String]) -> Option<usize> {
    let i = args.iter().position(|a| a == "--depot-bytes")?;
    Some(args.get(i + 1)?.parse().expect("--depot-bytes N"))
}

/// Whether `--trim-idle` was given.
fn trim_idle_arg(args: &[String]) -> bool {
    args.iter().any(|a| a == "--trim-idle")
}

/// glibc's `malloc_trim(0)`: what a program using the system allocator alone calls to
/// give freed memory back (the comparison's "glibc after malloc_trim").
fn malloc_trim() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        extern "C" {
            fn malloc_trim(pad: usize) -> i32;
        }
        // SAFETY: no preconditions.
        unsafe { malloc_trim(0) };
    }
}

struct Four {
    small: ClassAllocator<[u8; 64]>,
    medium: ClassAllocator<[u8; 512]>,
    large: ClassAllocator<[u8; 2048]>,
    huge: ClassAllocator<[u8; 8192]>,
}

impl Four {
    fn new(mode: CacheMode, depot_bytes: Option<usize>) -> Self {
        let cfg = Config::new().mode(mode);
        let cfg = depot_bytes.map_or(cfg, |b| cfg.depot_bytes(b));
        Four {
            small: ClassAllocator::with_config("idle-64", cfg),
            medium: ClassAllocator::with_config("idle-512", cfg),
            large: ClassAllocator::with_config("idle-2K", cfg),
            huge: ClassAllocator::with_config("idle-8K", cfg),
        }
    }

    fn burst(&self) {
        let a: Vec<_> = (0..BURST)
            .map(|i| self.small.alloc([i as u8; 64]))
            .collect();
        let b: Vec<_> = (0..BURST)
            .map(|i| self.medium.alloc([i as u8; 512]))
            .collect();
        let c: Vec<_> = (0..BURST)
            .map(|i| self.large.alloc([i as u8; 2048]))
            .collect();
        let d: Vec<_> = (0..BURST)
            .map(|i| self.huge.alloc([i as u8; 8192]))
            .collect();
        std::hint::black_box((&a, &b, &c, &d));
    }

    /// Bytes cached (threads, depots) over the four allocators, in KiB.
    fn cached_kib(&self) -> (u64, u64) {
        let rows = [
            self.small.stats(),
            self.medium.stats(),
            self.large.stats(),
            self.huge.stats(),
        ];
        let threads = rows
            .iter()
            .map(|s| s.cached_in_threads * s.object_size as u64)
            .sum::<u64>();
        let depots = rows
            .iter()
            .map(|s| s.cached_in_depot * s.object_size as u64)
            .sum::<u64>();
        (threads >> 10, depots >> 10)
    }
}

/// One mode in this process: prints one line of `key=value` figures.
fn run(mode: CacheMode, nthreads: usize, depot_bytes: Option<usize>, trim_idle: bool) {
    let four: &'static Four = Box::leak(Box::new(Four::new(mode, depot_bytes)));
    let start = rss_kib();
    let idle = Arc::new(Barrier::new(nthreads + 1));
    let exit = Arc::new(Barrier::new(nthreads + 1));
    let threads: Vec<_> = (0..nthreads)
        .map(|_| {
            let (idle, exit) = (Arc::clone(&idle), Arc::clone(&exit));
            std::thread::spawn(move || {
                four.burst();
                idle.wait();
                exit.wait();
            })
        })
        .collect();
    idle.wait();
    let (in_threads, in_depots) = four.cached_kib();
    let granted = proxalloc::thread_cache_budget().0 >> 10;
    let idle_rss = rss_kib();
    let (mut idle_released, mut idle_trimmed_rss) = (0, idle_rss);
    if trim_idle && mode != CacheMode::Bypass {
        idle_released = proxalloc::trim_idle(); // starts the interval
        std::thread::sleep(std::time::Duration::from_millis(5));
        idle_released += proxalloc::trim_idle();
        idle_released >>= 10;
        idle_trimmed_rss = rss_kib();
    }
    let released = proxalloc::trim_all() >> 10;
    if mode == CacheMode::Bypass {
        malloc_trim();
    }
    let (in_threads_after, in_depots_after) = four.cached_kib();
    let trimmed_rss = rss_kib();
    exit.wait();
    for t in threads {
        t.join().unwrap();
    }
    let (in_threads_exit, _) = four.cached_kib();
    println!(
        "mode={:?} start={start} idle_rss={idle_rss} in_threads={in_threads} in_depots={in_depots} \
         granted={granted} idle_released={idle_released} idle_trimmed_rss={idle_trimmed_rss} \
         released={released} trimmed_rss={trimmed_rss} \
         in_threads_after={in_threads_after} in_depots_after={in_depots_after} \
         exit_rss={} in_threads_exit={in_threads_exit}",
        four.small.mode(),
        rss_kib()
    );
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let nthreads = threads_arg(&args);
    let depot = depot_arg(&args);
    let trim_idle = trim_idle_arg(&args);
    if let Some(i) = args.iter().position(|a| a == "--one") {
        match args.get(i + 1).map(String::as_str) {
            Some("caches") => run(CacheMode::ThreadCaches, nthreads, depot, trim_idle),
            Some("percpu") => run(CacheMode::PerCpu, nthreads, depot, trim_idle),
            Some("system") => run(CacheMode::Bypass, nthreads, depot, trim_idle),
            other => panic!("--one caches|percpu|system, not {other:?}"),
        }
        return;
    }
    println!("{nthreads} threads, a burst of {BURST} objects each in 4 allocators (64 B to 8 KiB), then idle; KiB");
    println!(
        "{:<8} {:>9} {:>10} {:>11} {:>10} {:>9} {:>9} {:>8} {:>9} {:>12} {:>11} {:>9}",
        "mode",
        "idle RSS",
        "in threads",
        "in depots",
        "granted",
        "trim_idle",
        "RSS after",
        "trim_all",
        "RSS after",
        "threads after",
        "depots after",
        "exit RSS"
    );
    let n = nthreads.to_string();
    for mode in ["caches", "percpu", "system"] {
        let mut child = vec!["--one", mode, "--threads", &n];
        let depot = depot.map(|b| b.to_string());
        if let Some(b) = &depot {
            child.extend(["--depot-bytes", b.as_str()]);
        }
        if trim_idle {
            child.push("--trim-idle");
        }
        let out = fresh_process(&child);
        let line = String::from_utf8_lossy(&out.stdout);
        let get = |k: &str| -> String {
            line.split_whitespace()
                .find_map(|kv| kv.strip_prefix(&format!("{k}=")).map(str::to_owned))
                .unwrap_or_default()
        };
        println!(
            "{:<8} {:>9} {:>10} {:>11} {:>10} {:>9} {:>9} {:>8} {:>9} {:>12} {:>11} {:>9}",
            mode,
            get("idle_rss"),
            get("in_threads"),
            get("in_depots"),
            get("granted"),
            get("idle_released"),
            get("idle_trimmed_rss"),
            get("released"),
            get("trimmed_rss"),
            get("in_threads_after"),
            get("in_depots_after"),
            get("exit_rss"),
        );
    }
}
