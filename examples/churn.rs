//! Per-request churn, three ways: the TS-1684 experiment in miniature.
//!
//! An "accept" thread allocates a request-state object per request and hands batches of
//! them to worker threads; each worker allocates the request's header objects, touches
//! everything, and frees it all (the request state on a different thread from the one that
//! allocated it). The same workload runs with proxalloc's CPU caches (the default with
//! the `percpu` feature, where rseq works), its thread caches, with the caches
//! disabled (depot only: Traffic Server's global freelist), and with every object going
//! straight to the system allocator (bypass). It prints requests per second for each and
//! the allocators' stats.
//!
//! ```sh
//! cargo run --release --example churn            # about 8 seconds
//! cargo run --release --example churn -- 1 4     # seconds per mode, worker threads
//! ```

use std::sync::mpsc;
use std::time::{Duration, Instant};

use proxalloc::{CacheMode, ClassAllocator, ClassBox, Config};

/// Per-request state, as a proxy keeps it.
#[allow(dead_code)]
struct RequestState {
    id: u64,
    method: u8,
    flags: u32,
    scratch: [u8; 448],
}

/// One parsed header field (name and value as offsets into the request buffer).
#[allow(dead_code)]
struct Header {
    name: (u32, u32),
    value: (u32, u32),
    hash: u64,
    next: u64,
    pad: [u64; 4],
}

const HEADERS_PER_REQUEST: u64 = 12;
const BATCH: usize = 32;

struct Allocators {
    requests: ClassAllocator<RequestState>,
    headers: ClassAllocator<Header>,
}

impl Allocators {
    fn new(mode: CacheMode) -> Self {
        let cfg = Config::new().mode(mode);
        Allocators {
            requests: ClassAllocator::with_config("request-state", cfg),
            headers: ClassAllocator::with_config("header", cfg),
        }
    }
}

/// Runs the workload for `duration` and returns the number of requests served.
fn run(a: &Allocators, workers: usize, duration: Duration) -> u64 {
    std::thread::scope(|s| {
        let mut senders = Vec::new();
        let mut handles = Vec::new();
        for _ in 0..workers {
            let (tx, rx) = mpsc::sync_channel::<Vec<ClassBox<'_, RequestState>>>(4);
            senders.push(tx);
            handles.push(s.spawn(move || {
                let mut served = 0u64;
                let mut checksum = 0u64;
                for batch in rx {
                    for mut req in batch {
                        req.flags |= 1;
                        let headers: Vec<_> = (0..HEADERS_PER_REQUEST)
                            .map(|i| {
                                a.headers.alloc(Header {
                                    name: (i as u32, 8),
                                    value: (i as u32 + 8, 16),
                                    hash: req.id ^ i,
                                    next: 0,
                                    pad: [0; 4],
                                })
                            })
                            .collect();
                        checksum =
                            checksum.wrapping_add(headers.iter().map(|h| h.hash).sum::<u64>());
                        served += 1;
                    }
                }
                std::hint::black_box(checksum);
                served
            }));
        }
        let start = Instant::now();
        let mut id = 0u64;
        'accept: loop {
            for tx in &senders {
                if start.elapsed() >= duration {
                    break 'accept;
                }
                let batch: Vec<_> = (0..BATCH)
                    .map(|_| {
                        id += 1;
                        a.requests.alloc(RequestState {
                            id,
                            method: 1,
                            flags: 0,
                            scratch: [0; 448],
                        })
                    })
                    .collect();
                tx.send(batch).expect("worker alive");
            }
        }
        drop(senders);
        handles.into_iter().map(|h| h.join().unwrap()).sum()
    })
}

fn main() {
    let mut args = std::env::args().skip(1);
    let secs: f64 = args.next().and_then(|s| s.parse().ok()).unwrap_or(2.0);
    let workers: usize = args.next().and_then(|s| s.parse().ok()).unwrap_or(2);
    let duration = Duration::from_secs_f64(secs);
    println!(
        "per-request churn: 1 accept thread + {workers} workers, {HEADERS_PER_REQUEST} headers per request, {secs} s per mode\n"
    );
    let modes = [
        ("proxalloc (CPU caches)", CacheMode::PerCpu),
        ("proxalloc (thread caches)", CacheMode::ThreadCaches),
        ("depot only (global freelist)", CacheMode::DepotOnly),
        ("bypass (system allocator)", CacheMode::Bypass),
    ];
    let mut results = Vec::new();
    for (label, mode) in modes {
        let a = Allocators::new(mode);
        let served = run(&a, workers, duration);
        let rate = served as f64 / secs;
        results.push((label, rate, a.requests.stats(), a.headers.stats()));
    }
    let best = results[0].1;
    println!("{:<30} {:>14} {:>10}", "mode", "requests/s", "vs first");
    for (label, rate, _, _) in &results {
        println!("{label:<30} {rate:>14.0} {:>9.2}x", rate / best);
    }
    println!("\nallocator stats after each run (live must be 0):");
    for (label, _, req, hdr) in &results {
        println!("[{label}]\n  {req}\n  {hdr}");
        assert_eq!(req.live + hdr.live, 0, "objects leaked");
    }
}
