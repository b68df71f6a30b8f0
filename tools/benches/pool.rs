//! Pool benchmarks, contenders interleaved in one run (minimum per-operation time over
//! the samples; median for the two-thread run):
//!
//! - W6: 200 allocations of pseudo-random 8–256 B sizes, then clear: proxalloc `Pool`
//!   vs bumpalo (`reset`), typed-arena (a fresh arena per round: it cannot be cleared),
//!   and malloc/free per allocation (glibc, mimalloc).
//! - PoolVec push of 1..=64 elements vs bumpalo's `Vec` and std `Vec`.
//! - create-use-drop loop of a pool on each of two threads.
//!
//! W6 and create-use-drop are the harness's (`workloads`, over its `arenas`); the push
//! loops are this bench's own, since only it measures `PoolVec`.
//!
//! `cargo bench -p proxalloc-tools --bench pool -- [rounds] [--csv PATH]`
//! (default 100 rounds)
//!
//! For instruction counts, `w6-pool N` or `w6-bumpalo N` runs only that W6 loop, N
//! samples of 10,000 allocations each (after one warm-up sample), and prints nothing:
//!
//! ```sh
//! B=$(cargo bench -p proxalloc-tools --bench pool --no-run 2>&1 | grep -o 'target/[^)]*')
//! valgrind --tool=callgrind --callgrind-out-file=/dev/null $B w6-pool 0    # baseline
//! valgrind --tool=callgrind --callgrind-out-file=/dev/null $B w6-pool 100  # minus it, / 1e6
//! ```

use std::alloc::System;
use std::cell::RefCell;
use std::hint::black_box;

use proxalloc::{Pool, PoolVec};
use proxalloc_tools::arenas::{MallocFree, TypedArena};
use proxalloc_tools::runner::{time_per, Args, Runner, Stat};
use proxalloc_tools::workloads::{
    create_use_drop, on_two_threads, w6, W6Sizes, W6_ALLOCS, W6_ROUNDS,
};

const PUSH_SAMPLE: usize = 2000;

/// `PUSH_SAMPLE` vectors of 1..=64 pushes each, from the pool, cleared every 64 vectors.
fn push_pool(pool: &mut Pool<'static>) {
    for i in 0..PUSH_SAMPLE {
        let n = 1 + i % 64;
        let mut v = PoolVec::new_in(pool);
        for j in 0..n {
            v.push(j as u64);
        }
        black_box(&v[..]);
        drop(v);
        if i % 64 == 63 {
            pool.clear();
        }
    }
    pool.clear();
}

/// The same pushes into bumpalo's `Vec`, reset every 64 vectors.
fn push_bumpalo(bump: &mut bumpalo::Bump) {
    for i in 0..PUSH_SAMPLE {
        let n = 1 + i % 64;
        let mut v = bumpalo::collections::Vec::new_in(&*bump);
        for j in 0..n {
            v.push(j as u64);
        }
        black_box(&v[..]);
        drop(v);
        if i % 64 == 63 {
            bump.reset();
        }
    }
    bump.reset();
}

/// The same pushes into std `Vec`s (one heap allocation per growth).
fn push_std() {
    for i in 0..PUSH_SAMPLE {
        let n = 1 + i % 64;
        let mut v = Vec::new();
        for j in 0..n {
            v.push(j as u64);
        }
        black_box(&v[..]);
    }
}

/// `f` (`iters` iterations) on each of two threads at once: ns per iteration.
fn two_threads(f: impl Fn() + Sync, iters: usize) -> f64 {
    on_two_threads(f).as_nanos() as f64 / (2 * iters) as f64
}

/// `w6-pool N` / `w6-bumpalo N`: only that loop (see the module comment).
fn only(which: &str, samples: usize) {
    let sizes = W6Sizes::new();
    match which {
        "w6-pool" => {
            let mut pool = Pool::new();
            for _ in 0..samples + 1 {
                w6(&mut pool, &sizes);
            }
        }
        "w6-bumpalo" => {
            let mut bump = bumpalo::Bump::new();
            for _ in 0..samples + 1 {
                w6(&mut bump, &sizes);
            }
        }
        other => panic!("unknown loop {other:?}: w6-pool or w6-bumpalo"),
    }
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if let Some(i) = args.iter().position(|a| a.starts_with("w6-")) {
        let samples = args.get(i + 1).and_then(|a| a.parse().ok()).unwrap_or(100);
        return only(&args[i], samples);
    }
    let args = Args::parse(100);
    let sizes = W6Sizes::new();
    // The pool and the bump serve two tables each, as one allocator would.
    let pool = RefCell::new(Pool::new());
    let bump = RefCell::new(bumpalo::Bump::new());
    let mut system = MallocFree::new(System, W6_ALLOCS);
    let mut mimalloc = MallocFree::new(mimalloc::MiMalloc, W6_ALLOCS);
    let mut typed = TypedArena::new();
    let per = (W6_ROUNDS * W6_ALLOCS) as f64;
    let pushes = (PUSH_SAMPLE * 65 / 2) as f64;
    let sizes = &sizes;

    let mut run = Runner::new("proxalloc");
    let t = run.table(
        "W6: 200 allocations of 8-256 B, then clear",
        "ns/allocation",
        Stat::Min,
        "proxalloc Pool",
    );
    run.cell(t, "proxalloc Pool", false, || {
        let mut p = pool.borrow_mut();
        Some(time_per(per, || w6(&mut *p, sizes)))
    });
    run.cell(t, "bumpalo (reset)", false, || {
        let mut b = bump.borrow_mut();
        Some(time_per(per, || w6(&mut *b, sizes)))
    });
    run.cell(t, "typed-arena (new arena per round)", false, || {
        Some(time_per(per, || w6(&mut typed, sizes)))
    });
    run.cell(t, "malloc/free (glibc)", false, || {
        Some(time_per(per, || w6(&mut system, sizes)))
    });
    run.cell(t, "malloc/free (mimalloc)", false, || {
        Some(time_per(per, || w6(&mut mimalloc, sizes)))
    });
    let t = run.table(
        "PoolVec push of 1..=64 u64",
        "ns/push",
        Stat::Min,
        "proxalloc PoolVec",
    );
    run.cell(t, "proxalloc PoolVec", false, || {
        let mut p = pool.borrow_mut();
        Some(time_per(pushes, || push_pool(&mut p)))
    });
    run.cell(t, "bumpalo Vec", false, || {
        let mut b = bump.borrow_mut();
        Some(time_per(pushes, || push_bumpalo(&mut b)))
    });
    run.cell(t, "std Vec", false, || Some(time_per(pushes, push_std)));
    let t = run.table(
        "create, 200 allocations, drop: a pool per iteration on each of 2 threads",
        "ns/iteration",
        Stat::Median,
        "proxalloc Pool::new",
    );
    run.cell(t, "proxalloc Pool::new", false, || {
        Some(two_threads(|| create_use_drop(Pool::new, sizes, 200), 200))
    });
    run.cell(t, "bumpalo Bump::new", false, || {
        Some(two_threads(
            || create_use_drop(bumpalo::Bump::new, sizes, 200),
            200,
        ))
    });
    run.run(args.rounds);
    run.report(&args);
}
