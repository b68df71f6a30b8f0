//! Pooled I/O buffers against `BytesMut` under glibc's malloc, mimalloc and jemalloc as
//! global allocators: the targets' three workloads.
//!
//! - `lifecycle`: take a 2 KiB buffer, fill it (one 2 KiB `put_slice`), freeze it, clone
//!   the `Bytes` twice, drop all three (ns per lifecycle);
//! - `reuse`: take, fill, drop, with no freeze (the buffer used as a `BufMut` only);
//! - `handoff`, two threads: one takes, fills and freezes, and hands the `Bytes` through
//!   a 256-slot queue to the other, which drops it (ns per buffer; hyper's pattern of a
//!   body written by one task and sent by another). Both threads spin on the queue's
//!   shared lines for every buffer, so this measures the queue's coherence traffic as
//!   much as the allocators (see docs/benchmarks.md; `HANDOFF_WORK=k` gives the
//!   producer `k` spins of other work a buffer, to see the allocators where the queue is
//!   not the bottleneck);
//! - `handoff-batch`, two threads: the same, but the buffers travel 32 at a time, in
//!   `Vec`s that the consumer sends back empty (a server's write of a chunk list), so
//!   the queue's cost is spread over 32 buffers and the allocators' cross-thread costs
//!   show (ns per buffer).
//!
//! The contenders:
//! - `BytesMut`, under each global allocator;
//! - `PooledBuf`, from a `BufferAllocator::new()` (per-CPU caches in the default build,
//!   per-thread caches without the `percpu` feature);
//! - `PooledBuf-threads`, the same classes with per-thread caches by name;
//! - `slot`: a 2 KiB object of a plain class allocator, filled and frozen through
//!   `Bytes::from_owner` (what any pool on this engine pays: the rest is `PooledBuf`'s
//!   own);
//! - `floor`: what no pool can avoid: the fill into one reused buffer, and, frozen, the
//!   `Bytes::from_owner` box and reference counts over a static slice.
//!
//! A buffer's global allocator is the process's, chosen before its first allocation
//! (the showdown's `Global`), so the parent runs one child process per global allocator
//! and round, interleaved: round 1 glibc, mimalloc, jemalloc, round 2 again... Each child
//! runs every contender alternately, `reps` samples each, and
//! prints its best sample (one thread) or its median (two threads); the parent reports
//! the minimum over rounds (one thread) and the median over rounds (two threads), and
//! every contender's ratio to the best `BytesMut`.
//!
//! `cargo run --release -p proxalloc-tools --bin buffers -- [ROUNDS]` (default 7). For a
//! profiler, one contender alone: `ONLY=reuse,PooledBuf SHOWDOWN_GLOBAL=jemalloc
//! target/release/buffers --child 3`.

#[path = "../../../examples/showdown/global.rs"]
#[allow(dead_code)]
mod global;

use std::collections::BTreeMap;
use std::hint::black_box;
use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Barrier};
use std::time::Instant;

use bytes::{BufMut, Bytes, BytesMut};
use crossbeam_queue::ArrayQueue;
use proxalloc::{BufferAllocator, CacheMode, ClassAllocator, ClassBox, Config, PooledBuf};

#[global_allocator]
static GLOBAL: global::Global<tikv_jemallocator::Jemalloc> =
    global::Global::new(Some(tikv_jemallocator::Jemalloc));

static BUFS: BufferAllocator = BufferAllocator::new();
/// The same classes with per-thread caches by name: in the default build (per-CPU caches
/// first) the mode a `BufferAllocator::new()` does not use, measured beside it in every
/// child so the two modes are compared in one interleaved run.
static BUFS_THREADS: BufferAllocator =
    BufferAllocator::with_config(Config::new().mode(CacheMode::ThreadCaches));

const SIZE: usize = 2048;
const CONTENDERS: [&str; 5] = [
    "BytesMut",
    "PooledBuf",
    "PooledBuf-threads",
    "slot",
    "floor",
];
const WORKLOADS: [&str; 4] = ["lifecycle", "reuse", "handoff", "handoff-batch"];
/// Buffers per queue entry in `handoff-batch`.
const BATCH: usize = 32;

/// Whether a workload runs on two threads (median figures) rather than one (minimum).
fn two_threads(workload: &str) -> bool {
    workload.starts_with("handoff")
}

/// What one contender does: take a buffer of `SIZE`, fill it, and either drop it or
/// freeze it.
trait Contender {
    fn filled(src: &[u8]) -> Self;
    fn freeze(self) -> Bytes;
}

impl Contender for BytesMut {
    #[inline(always)]
    fn filled(src: &[u8]) -> Self {
        let mut b = BytesMut::with_capacity(SIZE);
        b.put_slice(src);
        b
    }
    #[inline(always)]
    fn freeze(self) -> Bytes {
        BytesMut::freeze(self)
    }
}

/// A buffer of `SIZE` from `bufs`, filled with `src`: `PooledBuf` and `PooledBuf-threads`
/// differ only in the allocator.
#[inline(always)]
fn pooled_filled(bufs: &'static BufferAllocator, src: &[u8]) -> PooledBuf {
    let mut b = bufs.alloc(SIZE);
    b.put_slice(src);
    b
}

impl Contender for PooledBuf {
    #[inline(always)]
    fn filled(src: &[u8]) -> Self {
        pooled_filled(&BUFS, src)
    }
    #[inline(always)]
    fn freeze(self) -> Bytes {
        PooledBuf::freeze(self)
    }
}

/// A [`PooledBuf`] of [`BUFS_THREADS`] (per-thread caches).
struct ThreadsBuf(PooledBuf);

impl Contender for ThreadsBuf {
    #[inline(always)]
    fn filled(src: &[u8]) -> Self {
        ThreadsBuf(pooled_filled(&BUFS_THREADS, src))
    }
    #[inline(always)]
    fn freeze(self) -> Bytes {
        self.0.freeze()
    }
}

/// A 2 KiB object of a plain class allocator (the engine under the 2 KiB buffer class,
/// without `PooledBuf`'s handle: no length, class or source to carry), filled with a
/// copy, frozen through `Bytes::from_owner`: what any pool on this engine pays, so the
/// distance to `PooledBuf` is the buffer type's own cost.
#[repr(C, align(64))]
struct Slot([u8; SIZE]);

static SLOTS: ClassAllocator<Slot> = ClassAllocator::new("buffers-bench-slot");

struct SlotBuf(ClassBox<'static, Slot>);

impl AsRef<[u8]> for SlotBuf {
    fn as_ref(&self) -> &[u8] {
        &self.0 .0
    }
}

impl Contender for SlotBuf {
    #[inline(always)]
    fn filled(src: &[u8]) -> Self {
        assert_eq!(src.len(), SIZE, "a slot is filled whole");
        // SAFETY: the closure initialises all of `Slot`'s bytes: `src` is `SIZE` long,
        // and a slot's memory cannot overlap the caller's slice.
        SlotBuf(unsafe {
            SLOTS.alloc_in_place(|m| {
                std::ptr::copy_nonoverlapping(src.as_ptr(), m.as_mut_ptr().cast::<u8>(), SIZE)
            })
        })
    }
    #[inline(always)]
    fn freeze(self) -> Bytes {
        Bytes::from_owner(self)
    }
}

/// What no pool can avoid: the fill (into one reused buffer, no allocation) and, once
/// frozen, `Bytes::from_owner`'s box and reference counts (over a static slice).
struct Floor;

static FLOOR_BYTES: [u8; SIZE] = [0x5A; SIZE];

impl Contender for Floor {
    #[inline(always)]
    fn filled(src: &[u8]) -> Self {
        #[repr(align(64))]
        struct A([u8; SIZE]);
        thread_local! { static BUF: std::cell::RefCell<Box<A>> = std::cell::RefCell::new(Box::new(A([0; SIZE]))); }
        BUF.with_borrow_mut(|b| {
            b.0[..src.len()].copy_from_slice(src);
            black_box(&b.0[..]);
        });
        Floor
    }
    #[inline(always)]
    fn freeze(self) -> Bytes {
        Bytes::from_owner(&FLOOR_BYTES[..])
    }
}

fn lifecycle<C: Contender>(n: u64, src: &[u8]) -> f64 {
    let t = Instant::now();
    for _ in 0..n {
        let b = C::filled(black_box(src)).freeze();
        let (c1, c2) = (b.clone(), b.clone());
        black_box((&b, &c1, &c2));
        drop((b, c1, c2));
    }
    t.elapsed().as_nanos() as f64 / n as f64
}

fn reuse<C: Contender>(n: u64, src: &[u8]) -> f64 {
    let t = Instant::now();
    for _ in 0..n {
        let b = C::filled(black_box(src));
        black_box(&b);
    }
    t.elapsed().as_nanos() as f64 / n as f64
}

/// `HANDOFF_WORK=k`: the `handoff` producer spins `k` times (`spin_loop`) per buffer
/// before queueing it, as a server does other work between bodies; 0 by default. With
/// none, both threads spend most of their time on the queue's lines (see the module
/// docs).
fn producer_work() -> u32 {
    std::env::var("HANDOFF_WORK").map_or(0, |s| {
        s.parse()
            .expect("HANDOFF_WORK: a number of spins per buffer")
    })
}

fn handoff<C: Contender>(n: u64, src: &[u8]) -> f64 {
    let queue = Arc::new(ArrayQueue::<Bytes>::new(256));
    let start = Arc::new(Barrier::new(2));
    let done = Arc::new(AtomicBool::new(false));
    let consumer = {
        let (queue, start, done) = (queue.clone(), start.clone(), done.clone());
        std::thread::spawn(move || {
            start.wait();
            let mut got = 0u64;
            while got < n {
                match queue.pop() {
                    Some(b) => {
                        black_box(&b);
                        drop(b);
                        got += 1;
                    }
                    None if done.load(Ordering::Relaxed) => break,
                    None => std::hint::spin_loop(),
                }
            }
        })
    };
    let work = producer_work();
    start.wait();
    let t = Instant::now();
    for _ in 0..n {
        let mut b = C::filled(black_box(src)).freeze();
        for _ in 0..work {
            std::hint::spin_loop();
        }
        while let Err(back) = queue.push(b) {
            b = back;
            std::hint::spin_loop();
        }
    }
    consumer.join().unwrap();
    done.store(true, Ordering::Relaxed);
    t.elapsed().as_nanos() as f64 / n as f64
}

fn handoff_batch<C: Contender>(n: u64, src: &[u8]) -> f64 {
    let batches = n.div_ceil(BATCH as u64);
    let queue = Arc::new(ArrayQueue::<Vec<Bytes>>::new(8));
    // The batches' `Vec`s go round: allocated here, sent back empty by the consumer.
    let returned = Arc::new(ArrayQueue::<Vec<Bytes>>::new(16));
    for _ in 0..16 {
        returned.push(Vec::with_capacity(BATCH)).unwrap();
    }
    let start = Arc::new(Barrier::new(2));
    let consumer = {
        let (queue, returned, start) = (queue.clone(), returned.clone(), start.clone());
        std::thread::spawn(move || {
            start.wait();
            for _ in 0..batches {
                let mut batch = loop {
                    match queue.pop() {
                        Some(b) => break b,
                        None => std::hint::spin_loop(),
                    }
                };
                for b in batch.drain(..) {
                    black_box(&b);
                    drop(b);
                }
                returned.push(batch).expect("as many batches as slots");
            }
        })
    };
    start.wait();
    let t = Instant::now();
    for _ in 0..batches {
        let mut batch = loop {
            match returned.pop() {
                Some(b) => break b,
                None => std::hint::spin_loop(),
            }
        };
        for _ in 0..BATCH {
            batch.push(C::filled(black_box(src)).freeze());
        }
        while let Err(back) = queue.push(batch) {
            batch = back;
            std::hint::spin_loop();
        }
    }
    consumer.join().unwrap();
    t.elapsed().as_nanos() as f64 / (batches * BATCH as u64) as f64
}

fn run_one(workload: &str, contender: &str, n: u64, src: &[u8]) -> f64 {
    match (workload, contender) {
        ("lifecycle", "BytesMut") => lifecycle::<BytesMut>(n, src),
        ("lifecycle", "PooledBuf") => lifecycle::<PooledBuf>(n, src),
        ("lifecycle", "PooledBuf-threads") => lifecycle::<ThreadsBuf>(n, src),
        ("lifecycle", "slot") => lifecycle::<SlotBuf>(n, src),
        ("lifecycle", "floor") => lifecycle::<Floor>(n, src),
        ("reuse", "BytesMut") => reuse::<BytesMut>(n, src),
        ("reuse", "PooledBuf") => reuse::<PooledBuf>(n, src),
        ("reuse", "PooledBuf-threads") => reuse::<ThreadsBuf>(n, src),
        ("reuse", "slot") => reuse::<SlotBuf>(n, src),
        ("reuse", "floor") => reuse::<Floor>(n, src),
        ("handoff", "BytesMut") => handoff::<BytesMut>(n, src),
        ("handoff", "PooledBuf") => handoff::<PooledBuf>(n, src),
        ("handoff", "PooledBuf-threads") => handoff::<ThreadsBuf>(n, src),
        ("handoff", "slot") => handoff::<SlotBuf>(n, src),
        ("handoff", "floor") => handoff::<Floor>(n, src),
        ("handoff-batch", "BytesMut") => handoff_batch::<BytesMut>(n, src),
        ("handoff-batch", "PooledBuf") => handoff_batch::<PooledBuf>(n, src),
        ("handoff-batch", "PooledBuf-threads") => handoff_batch::<ThreadsBuf>(n, src),
        ("handoff-batch", "slot") => handoff_batch::<SlotBuf>(n, src),
        ("handoff-batch", "floor") => handoff_batch::<Floor>(n, src),
        _ => panic!("no workload {workload:?} with contender {contender:?}: workloads {WORKLOADS:?}, contenders {CONTENDERS:?}"),
    }
}

/// A child: every workload and contender, interleaved, `reps` samples each; prints
/// `workload contender ns` lines (min for one thread, median for two).
fn child(reps: usize) {
    let src = [0x5Au8; SIZE];
    // `ONLY=workload,contender`: that one alone, for a profiler.
    if let Ok(only) = std::env::var("ONLY") {
        let (w, c) = only.split_once(',').expect("ONLY=workload,contender");
        for _ in 0..reps {
            println!("{w} {c} {:.2}", run_one(w, c, 2_000_000, &src));
        }
        return;
    }
    // Warm every contender: the pooled classes' caches and the global allocator's.
    for w in WORKLOADS {
        for c in CONTENDERS {
            run_one(w, c, 20_000, &src);
        }
    }
    let mut samples: BTreeMap<(&str, &str), Vec<f64>> = BTreeMap::new();
    for _ in 0..reps {
        for w in WORKLOADS {
            let n = if two_threads(w) { 100_000 } else { 200_000 };
            for c in CONTENDERS {
                samples
                    .entry((w, c))
                    .or_default()
                    .push(run_one(w, c, n, &src));
            }
        }
    }
    for ((w, c), mut v) in samples {
        v.sort_by(f64::total_cmp);
        let figure = if two_threads(w) { v[v.len() / 2] } else { v[0] };
        println!("{w} {c} {figure:.2}");
    }
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.first().map(String::as_str) == Some("--child") {
        child(args.get(1).and_then(|s| s.parse().ok()).unwrap_or(5));
        return;
    }
    let rounds: usize = args.first().and_then(|s| s.parse().ok()).unwrap_or(7);
    let exe = std::env::current_exe().expect("own path");
    // (workload, global, contender) -> one figure per round.
    let mut figures: BTreeMap<(String, String, String), Vec<f64>> = BTreeMap::new();
    for round in 0..rounds {
        for kind in global::Kind::ALL {
            let out = Command::new(&exe)
                .args(["--child", "5"])
                .env(global::ENV, kind.flag())
                .output()
                .expect("run a child");
            assert!(out.status.success(), "child under {} failed", kind.flag());
            for line in String::from_utf8_lossy(&out.stdout).lines() {
                let mut f = line.split_whitespace();
                let (w, c, ns) = (f.next().unwrap(), f.next().unwrap(), f.next().unwrap());
                figures
                    .entry((w.to_string(), kind.flag().to_string(), c.to_string()))
                    .or_default()
                    .push(ns.parse().unwrap());
            }
        }
        eprintln!("round {} of {rounds} done", round + 1);
    }
    println!(
        "# {rounds} rounds; one thread: min over rounds, two threads: median; ratio to the best BytesMut"
    );
    println!(
        "# PooledBuf's classes: {:?} (this build's default mode), PooledBuf-threads': ThreadCaches",
        CacheMode::default()
    );
    println!("| workload | global | contender | ns | vs best `BytesMut` |");
    println!("| --- | --- | --- | ---: | ---: |");
    for w in WORKLOADS {
        let pick = |mut v: Vec<f64>| {
            v.sort_by(f64::total_cmp);
            if two_threads(w) {
                v[v.len() / 2]
            } else {
                v[0]
            }
        };
        let rows: Vec<(String, String, f64)> = figures
            .iter()
            .filter(|((fw, _, _), _)| fw == w)
            .map(|((_, g, c), v)| (g.clone(), c.clone(), pick(v.clone())))
            .collect();
        let best = rows
            .iter()
            .filter(|(_, c, _)| c == "BytesMut")
            .map(|r| r.2)
            .fold(f64::INFINITY, f64::min);
        for (g, c, ns) in rows {
            println!("| {w} | {g} | `{c}` | {ns:.1} | {:.2}× |", ns / best);
        }
    }
}
