//! Workloads and contenders shared by the criterion benchmarks and the interleaved
//! ratio runner. Every contender allocates, writes and frees the same 64-byte object.
#![allow(dead_code)]

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::UnsafeCell;
use std::hint::black_box;
use std::ptr::NonNull;

use proxalloc::{CacheMode, ClassAllocator, Config};

/// The 64-byte object of W1 and W2.
#[derive(Clone, Copy)]
#[repr(C)]
pub struct Obj(pub [u64; 8]);

impl Obj {
    #[inline(always)]
    pub fn new(i: u64) -> Self {
        Obj([i; 8])
    }
}

/// Live objects in W2.
pub const BATCH: usize = 1024;

/// A contender: W1 runs `iters` alloc/write/free pairs; W2 runs `rounds` rounds of
/// [`BATCH`] allocations followed by [`BATCH`] frees.
pub trait Contender {
    const NAME: &'static str;
    fn w1(iters: u64);
    fn w2(rounds: u64);
}

static PROXALLOC: ClassAllocator<Obj> = ClassAllocator::new("bench-obj");
static DEPOT_ONLY: ClassAllocator<Obj> =
    ClassAllocator::with_config("bench-obj-depot", Config::new().mode(CacheMode::DepotOnly));

/// W2 for a proxalloc allocator through the thread-local path.
fn proxalloc_w2(a: &ClassAllocator<Obj>, rounds: u64) {
    let mut live = Vec::with_capacity(BATCH);
    for r in 0..rounds {
        for i in 0..BATCH as u64 {
            live.push(a.alloc(Obj::new(r ^ i)));
        }
        black_box(&live);
        live.clear();
    }
}

fn proxalloc_w1(a: &ClassAllocator<Obj>, iters: u64) {
    for i in 0..iters {
        let h = a.alloc(Obj::new(i));
        black_box(&*h);
    }
}

/// proxalloc, thread caches, through the thread-local lookup.
pub struct Proxalloc;
impl Contender for Proxalloc {
    const NAME: &'static str = "proxalloc";
    fn w1(iters: u64) {
        proxalloc_w1(&PROXALLOC, iters);
    }
    fn w2(rounds: u64) {
        proxalloc_w2(&PROXALLOC, rounds);
    }
}

/// proxalloc through `with_local` (no per-operation lookup).
pub struct ProxallocLocal;
impl Contender for ProxallocLocal {
    const NAME: &'static str = "proxalloc-local";
    fn w1(iters: u64) {
        PROXALLOC.with_local(|c| {
            for i in 0..iters {
                let h = c.alloc(Obj::new(i));
                black_box(&*h);
                c.free(h);
            }
        });
    }
    fn w2(rounds: u64) {
        PROXALLOC.with_local(|c| {
            let mut live = Vec::with_capacity(BATCH);
            for r in 0..rounds {
                for i in 0..BATCH as u64 {
                    live.push(c.alloc(Obj::new(r ^ i)));
                }
                black_box(&live);
                for h in live.drain(..) {
                    c.free(h);
                }
            }
        });
    }
}

/// proxalloc with the thread caches disabled: every operation goes to the depot.
pub struct DepotOnly;
impl Contender for DepotOnly {
    const NAME: &'static str = "depot-only";
    fn w1(iters: u64) {
        proxalloc_w1(&DEPOT_ONLY, iters);
    }
    fn w2(rounds: u64) {
        proxalloc_w2(&DEPOT_ONLY, rounds);
    }
}

/// `Box<Obj>` under the system allocator (glibc malloc): no global allocator is
/// installed in the bench binaries.
pub struct SystemBox;
impl Contender for SystemBox {
    const NAME: &'static str = "box-system";
    fn w1(iters: u64) {
        for i in 0..iters {
            let b = Box::new(Obj::new(i));
            black_box(&*b);
        }
    }
    fn w2(rounds: u64) {
        let mut live = Vec::with_capacity(BATCH);
        for r in 0..rounds {
            for i in 0..BATCH as u64 {
                live.push(Box::new(Obj::new(r ^ i)));
            }
            black_box(&live);
            live.clear();
        }
    }
}

/// Raw alloc/write/free through a `GlobalAlloc`, called directly.
fn global_w1<A: GlobalAlloc>(a: &A, iters: u64) {
    let layout = Layout::new::<Obj>();
    for i in 0..iters {
        // SAFETY: non-zero layout; the block is written, read and freed once.
        unsafe {
            let p = a.alloc(layout).cast::<Obj>();
            p.write(Obj::new(i));
            black_box(&*p);
            a.dealloc(p.cast(), layout);
        }
    }
}

fn global_w2<A: GlobalAlloc>(a: &A, rounds: u64) {
    let layout = Layout::new::<Obj>();
    let mut live: Vec<*mut Obj> = Vec::with_capacity(BATCH);
    for r in 0..rounds {
        for i in 0..BATCH as u64 {
            // SAFETY: non-zero layout; each block is written once and freed below.
            unsafe {
                let p = a.alloc(layout).cast::<Obj>();
                p.write(Obj::new(r ^ i));
                live.push(p);
            }
        }
        black_box(&live);
        for p in live.drain(..) {
            // SAFETY: allocated above with this layout.
            unsafe { a.dealloc(p.cast(), layout) };
        }
    }
}

/// mimalloc through its `GlobalAlloc` impl (not installed as the global allocator).
pub struct Mimalloc;
impl Contender for Mimalloc {
    const NAME: &'static str = "mimalloc";
    fn w1(iters: u64) {
        global_w1(&mimalloc::MiMalloc, iters);
    }
    fn w2(rounds: u64) {
        global_w2(&mimalloc::MiMalloc, rounds);
    }
}

thread_local! {
    static STACK: UnsafeCell<Vec<NonNull<Obj>>> = const { UnsafeCell::new(Vec::new()) };
}

/// The lower bound: a thread-local `Vec` of free pointers used as a stack, no
/// synchronisation, no accounting, no bound.
pub struct LowerBound;
impl LowerBound {
    #[inline(always)]
    fn alloc(v: Obj) -> NonNull<Obj> {
        // SAFETY: this thread's stack, not borrowed elsewhere.
        let p = STACK
            .with(|s| unsafe { (*s.get()).pop() })
            .unwrap_or_else(|| {
                // SAFETY: non-zero layout.
                NonNull::new(unsafe { System.alloc(Layout::new::<Obj>()) }.cast()).unwrap()
            });
        // SAFETY: valid memory for one Obj.
        unsafe { p.as_ptr().write(v) };
        p
    }
    #[inline(always)]
    fn free(p: NonNull<Obj>) {
        // SAFETY: this thread's stack, not borrowed elsewhere.
        STACK.with(|s| unsafe { (*s.get()).push(p) });
    }
}
impl Contender for LowerBound {
    const NAME: &'static str = "lower-bound";
    fn w1(iters: u64) {
        for i in 0..iters {
            let p = Self::alloc(Obj::new(i));
            // SAFETY: initialised above.
            black_box(unsafe { p.as_ref() });
            Self::free(p);
        }
    }
    fn w2(rounds: u64) {
        let mut live = Vec::with_capacity(BATCH);
        for r in 0..rounds {
            for i in 0..BATCH as u64 {
                live.push(Self::alloc(Obj::new(r ^ i)));
            }
            black_box(&live);
            for p in live.drain(..) {
                Self::free(p);
            }
        }
    }
}

/// Runs `f` and returns its wall time in nanoseconds.
pub fn time(f: impl FnOnce()) -> f64 {
    let start = std::time::Instant::now();
    f();
    start.elapsed().as_nanos() as f64
}
