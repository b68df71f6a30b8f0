//! A fixed number of W1 pairs (allocate, write, free one 64-byte object), for counting
//! instructions with callgrind when tuning the fast path:
//!
//! ```sh
//! cargo build --release -p proxalloc-tools --bin pair_loop
//! valgrind --tool=callgrind --callgrind-out-file=/dev/null target/release/pair_loop 1000000
//! valgrind --tool=callgrind --callgrind-out-file=/dev/null target/release/pair_loop 1000000 owned
//! valgrind --tool=callgrind --callgrind-out-file=/dev/null target/release/pair_loop 1000000 local
//! ```
//! (The total divided by the pair count, minus the start-up cost measured with 0 pairs,
//! is the per-pair instruction count.) With `owned`, the pairs go through an
//! `Arc<ClassAllocator>` and `Owned` handles instead of a `static` and `ClassBox`; with
//! `local`, through the `static`'s `with_local` cache (allocated and freed with
//! `LocalCache::alloc` and `LocalCache::free`, no thread-local lookup).
//!
//! Not the harness's W1 on purpose: this pair is a `static` allocator's, in a function of
//! its own, the loop on which the fast path's instruction counts have always been taken
//! (`docs/benchmarks.md#fast-path-instruction-counts`), so the figures stay comparable.

use std::sync::Arc;

use proxalloc::{CacheMode, ClassAllocator, Config, LocalCache};

// Per-thread caches by name, as the counts were always taken (the default build's default
// is per-CPU caches: `percpu_pair`).
static OBJS: ClassAllocator<[u64; 8]> =
    ClassAllocator::with_config("pair-loop", Config::new().mode(CacheMode::ThreadCaches));
static CPU_OBJS: ClassAllocator<[u64; 8]> =
    ClassAllocator::with_config("pair-loop-percpu", Config::new().mode(CacheMode::PerCpu));

#[inline(never)]
fn pair(i: u64) {
    let h = OBJS.alloc([i; 8]);
    std::hint::black_box(&*h);
}

#[inline(never)]
fn percpu_pair(i: u64) {
    let h = CPU_OBJS.alloc([i; 8]);
    std::hint::black_box(&*h);
}

#[inline(never)]
fn owned_pair(a: &Arc<ClassAllocator<[u64; 8]>>, i: u64) {
    let h = a.alloc_arc([i; 8]);
    std::hint::black_box(&*h);
}

#[inline(never)]
fn local_pair(cache: &LocalCache<'static, [u64; 8]>, i: u64) {
    let h = cache.alloc([i; 8]);
    std::hint::black_box(&*h);
    cache.free(h);
}

fn main() {
    let mut args = std::env::args().skip(1);
    let n: u64 = args
        .next()
        .and_then(|s| s.parse().ok())
        .unwrap_or(10_000_000);
    match args.next().as_deref() {
        Some("owned") => {
            let a = Arc::new(ClassAllocator::new("pair-loop-owned"));
            for i in 0..n {
                owned_pair(&a, i);
            }
        }
        Some("local") => OBJS.with_local(|cache| {
            for i in 0..n {
                local_pair(cache, i);
            }
        }),
        Some("percpu") => {
            // Under valgrind (no rseq) this falls back to per-thread caches: time it.
            eprintln!("pair-loop-percpu runs in {:?}", CPU_OBJS.mode());
            for i in 0..n {
                percpu_pair(i);
            }
        }
        Some(other) => panic!("unknown mode {other:?}: owned, local, percpu, or none"),
        None => {
            for i in 0..n {
                pair(i);
            }
        }
    }
}
