//! Pool benchmarks, contenders interleaved in one run (minimum per-operation time over
//! the samples; median for the two-thread run):
//!
//! - W6: 200 allocations of pseudo-random 8–256 B sizes, then clear: proxalloc `Pool`
//!   vs bumpalo (`reset`), typed-arena (a fresh arena per round: it cannot be cleared),
//!   and malloc/free per allocation (glibc, mimalloc).
//! - PoolVec push of 1..=64 elements vs bumpalo's `Vec` and std `Vec`.
//! - create-use-clear loop of a pool on each of two threads.
//!
//! `cargo bench --bench pool -- [rounds]`
//!
//! For instruction counts, `w6-pool N` or `w6-bumpalo N` runs only that W6 loop, N
//! samples of 10,000 allocations each (after one warm-up sample), and prints nothing:
//!
//! ```sh
//! B=$(cargo bench --bench pool --no-run 2>&1 | grep -o 'target/[^)]*')
//! valgrind --tool=callgrind --callgrind-out-file=/dev/null $B w6-pool 0    # baseline
//! valgrind --tool=callgrind --callgrind-out-file=/dev/null $B w6-pool 100  # minus it, / 1e6
//! ```

use std::alloc::{GlobalAlloc, Layout, System};
use std::hint::black_box;
use std::time::Instant;

use proxalloc::{Pool, PoolVec};

const ALLOCS: usize = 200;

/// The W6 sizes: 8..=256 bytes, a fixed pseudo-random sequence.
fn sizes() -> Vec<usize> {
    let mut x = 0x2545_F491_4F6C_DD1Du64;
    (0..ALLOCS)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            8 + (x % 249) as usize
        })
        .collect()
}

const ROUNDS_PER_SAMPLE: usize = 50;

fn w6_pool(sizes: &[usize], pool: &mut Pool<'static>) {
    for _ in 0..ROUNDS_PER_SAMPLE {
        for &s in sizes {
            let p = pool.alloc_layout(Layout::from_size_align(s, 8).unwrap());
            // SAFETY: `s` bytes of fresh pool memory.
            unsafe { p.as_ptr().write(s as u8) };
            black_box(p);
        }
        pool.clear();
    }
}

fn w6_bumpalo(sizes: &[usize], bump: &mut bumpalo::Bump) {
    for _ in 0..ROUNDS_PER_SAMPLE {
        for &s in sizes {
            let p = bump.alloc_layout(Layout::from_size_align(s, 8).unwrap());
            // SAFETY: `s` bytes of fresh arena memory.
            unsafe { p.as_ptr().write(s as u8) };
            black_box(p);
        }
        bump.reset();
    }
}

fn w6_typed_arena(sizes: &[usize]) {
    for _ in 0..ROUNDS_PER_SAMPLE {
        let arena = typed_arena::Arena::<u8>::new();
        for &s in sizes {
            // SAFETY: only the first byte is written, through `MaybeUninit`.
            let b = unsafe { arena.alloc_uninitialized(s) };
            b[0].write(s as u8);
            black_box(b.as_ptr());
        }
    }
}

fn w6_global<A: GlobalAlloc>(a: &A, sizes: &[usize], live: &mut Vec<(*mut u8, Layout)>) {
    for _ in 0..ROUNDS_PER_SAMPLE {
        for &s in sizes {
            let layout = Layout::from_size_align(s, 8).unwrap();
            // SAFETY: non-zero layout; freed below with the same layout.
            let p = unsafe { a.alloc(layout) };
            // SAFETY: fresh block of `s` bytes.
            unsafe { p.write(s as u8) };
            live.push((p, layout));
        }
        for (p, layout) in live.drain(..) {
            // SAFETY: allocated above with this layout.
            unsafe { a.dealloc(p, layout) };
        }
    }
}

const PUSH_SAMPLE: usize = 2000;

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

/// One thread's create-use-clear loop: a fresh pool per iteration, 200 allocations.
fn create_use_drop(sizes: &[usize], iters: usize) {
    for _ in 0..iters {
        let pool = Pool::new();
        for &s in sizes {
            black_box(pool.alloc_layout(Layout::from_size_align(s, 8).unwrap()));
        }
    }
}

fn create_use_drop_bumpalo(sizes: &[usize], iters: usize) {
    for _ in 0..iters {
        let bump = bumpalo::Bump::new();
        for &s in sizes {
            black_box(bump.alloc_layout(Layout::from_size_align(s, 8).unwrap()));
        }
    }
}

fn two_threads(f: fn(&[usize], usize), sizes: &[usize], iters: usize) -> f64 {
    let start = Instant::now();
    std::thread::scope(|s| {
        for _ in 0..2 {
            s.spawn(|| f(sizes, iters));
        }
    });
    start.elapsed().as_nanos() as f64 / (2 * iters) as f64
}

fn min(v: &[f64]) -> f64 {
    v.iter().copied().fold(f64::INFINITY, f64::min)
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn table(title: &str, unit: &str, rows: &[(&str, f64)]) {
    let base = rows[0].1;
    println!("\n{title}");
    println!("| contender | {unit} | vs proxalloc |");
    println!("| --- | ---: | ---: |");
    for (name, v) in rows {
        println!("| {name} | {v:.2} | {:.2}x |", v / base);
    }
}

/// `w6-pool N` / `w6-bumpalo N`: only that loop (see the module comment).
fn only(which: &str, samples: usize) {
    let sizes = sizes();
    match which {
        "w6-pool" => {
            let mut pool = Pool::new();
            for _ in 0..samples + 1 {
                w6_pool(&sizes, &mut pool);
            }
        }
        "w6-bumpalo" => {
            let mut bump = bumpalo::Bump::new();
            for _ in 0..samples + 1 {
                w6_bumpalo(&sizes, &mut bump);
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
    let rounds: usize = std::env::args()
        .skip(1)
        .find_map(|a| a.parse().ok())
        .unwrap_or(100);
    let sizes = sizes();
    let mut pool = Pool::new();
    let mut bump = bumpalo::Bump::new();
    let mut live = Vec::with_capacity(ALLOCS);
    let per = (ROUNDS_PER_SAMPLE * ALLOCS) as f64;
    let mut w6: [Vec<f64>; 5] = Default::default();
    let mut push: [Vec<f64>; 3] = Default::default();
    let mut threads: [Vec<f64>; 2] = Default::default();
    let time = |f: &mut dyn FnMut()| {
        let t = Instant::now();
        f();
        t.elapsed().as_nanos() as f64
    };
    for r in 0..rounds + 1 {
        let samples = [
            time(&mut || w6_pool(&sizes, &mut pool)) / per,
            time(&mut || w6_bumpalo(&sizes, &mut bump)) / per,
            time(&mut || w6_typed_arena(&sizes)) / per,
            time(&mut || w6_global(&System, &sizes, &mut live)) / per,
            time(&mut || w6_global(&mimalloc::MiMalloc, &sizes, &mut live)) / per,
        ];
        let pushes = (PUSH_SAMPLE * 65 / 2) as f64;
        let p = [
            time(&mut || push_pool(&mut pool)) / pushes,
            time(&mut || push_bumpalo(&mut bump)) / pushes,
            time(&mut || push_std()) / pushes,
        ];
        let t = [
            two_threads(create_use_drop, &sizes, 200),
            two_threads(create_use_drop_bumpalo, &sizes, 200),
        ];
        if r == 0 {
            continue; // warm-up
        }
        for (v, x) in w6.iter_mut().zip(samples) {
            v.push(x);
        }
        for (v, x) in push.iter_mut().zip(p) {
            v.push(x);
        }
        for (v, x) in threads.iter_mut().zip(t) {
            v.push(x);
        }
    }
    table(
        &format!("W6: 200 allocations of 8-256 B, then clear (min of {rounds} samples)"),
        "ns/allocation",
        &[
            ("proxalloc Pool", min(&w6[0])),
            ("bumpalo (reset)", min(&w6[1])),
            ("typed-arena (new arena per round)", min(&w6[2])),
            ("malloc/free (glibc)", min(&w6[3])),
            ("malloc/free (mimalloc)", min(&w6[4])),
        ],
    );
    table(
        &format!("PoolVec push of 1..=64 u64 (min of {rounds} samples)"),
        "ns/push",
        &[
            ("proxalloc PoolVec", min(&push[0])),
            ("bumpalo Vec", min(&push[1])),
            ("std Vec", min(&push[2])),
        ],
    );
    let [mut t0, mut t1] = threads;
    table(
        &format!("create, 200 allocations, drop: a pool per iteration on each of 2 threads (median of {rounds})"),
        "ns/iteration",
        &[
            ("proxalloc Pool::new", median(&mut t0)),
            ("bumpalo Bump::new", median(&mut t1)),
        ],
    );
}
