//! Fault injection: allocations that fail on command, the Nth one or random ones from a
//! seed, for objects, magazine slot arrays and pool blocks.
//!
//! Object memory and slot arrays come from the global allocator, so this binary installs
//! one that fails allocations of one exact layout on the thread that armed it (nothing
//! else here allocates those layouts: a failing `Vec` growth in the test itself would
//! abort). Pool blocks also come from a user's [`BlockAllocator`] that fails on command.
//!
//! Checked: `try_*` returns `AllocError` and nothing changes; the panicking forms fail
//! the documented way (`handle_alloc_error`: the process aborts with the standard
//! message; checked in a child process); after failures the allocator still works, its
//! stats stay exact, `max_live` permits are not lost, and trimming returns everything
//! (ASan's leak check runs this binary too, see `.ci/sanitizers`).

#[path = "common/books.rs"]
mod books;
#[path = "common/net_bytes.rs"]
mod net_bytes;

use net_bytes::NetCounting;
use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use proxalloc::{
    AllocError, BlockAllocator, BlockSource, CacheMode, ClassAllocator, Config, Pool, Recycle,
    RecyclingAllocator,
};

// ---------------------------------------------------------------------------------------
// The failing global allocator

/// Which allocations fail.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Mode {
    Off,
    /// Only the Nth candidate (1-based).
    Nth(u64),
    /// Every candidate from the Nth on.
    From(u64),
    /// Each candidate with this chance per mille, from a seeded generator.
    Random(u32),
}

/// This thread's plan: candidates are allocations of exactly `layout` (of any layout
/// where `size` is 0).
#[derive(Clone, Copy, Debug)]
struct Plan {
    size: usize,
    align: usize,
    mode: Mode,
    seen: u64,
    failed: u64,
    rng: u64,
}

const OFF: Plan = Plan {
    size: 0,
    align: 0,
    mode: Mode::Off,
    seen: 0,
    failed: 0,
    rng: 0,
};

std::thread_local! {
    // `const`-initialised and without destructors: usable inside the global allocator,
    // at any point of the thread's life, without allocating.
    static PLAN: Cell<Plan> = const { Cell::new(OFF) };
}

fn splitmix64(state: &mut u64) -> u64 {
    *state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
    let mut z = *state;
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

fn should_fail(layout: Layout) -> bool {
    PLAN.try_with(|p| {
        let mut plan = p.get();
        let candidate =
            plan.size == 0 || (layout.size(), layout.align()) == (plan.size, plan.align);
        if plan.mode == Mode::Off || !candidate {
            return false;
        }
        plan.seen += 1;
        let fail = match plan.mode {
            Mode::Off => false,
            Mode::Nth(n) => plan.seen == n,
            Mode::From(n) => plan.seen >= n,
            Mode::Random(per_mille) => splitmix64(&mut plan.rng) % 1000 < u64::from(per_mille),
        };
        plan.failed += u64::from(fail);
        p.set(plan);
        fail
    })
    .unwrap_or(false)
}

#[global_allocator]
static GLOBAL: NetCounting = NetCounting { fail: should_fail };

/// Failures armed on this thread until dropped; reports what it saw.
struct Armed;

impl Armed {
    fn new(layout: Layout, mode: Mode, seed: u64) -> Self {
        PLAN.with(|p| {
            p.set(Plan {
                size: layout.size(),
                align: layout.align(),
                mode,
                seen: 0,
                failed: 0,
                rng: seed,
            })
        });
        Armed
    }

    /// Failures armed on this thread for allocations of every layout.
    fn any_layout(mode: Mode) -> Self {
        Self::new(Layout::new::<()>(), mode, 0)
    }

    /// (candidates seen, failures injected) so far.
    fn counts(&self) -> (u64, u64) {
        let p = PLAN.with(Cell::get);
        (p.seen, p.failed)
    }
}

impl Drop for Armed {
    fn drop(&mut self) {
        PLAN.with(|p| p.set(OFF));
    }
}

// ---------------------------------------------------------------------------------------
// Test objects: layouts nothing else in this binary allocates

static OBJS_MADE: AtomicU64 = AtomicU64::new(0);
static OBJS_DROPPED: AtomicU64 = AtomicU64::new(0);

/// 256 bytes, 256-aligned: no layout of the crate's own (a thread cache is 64-aligned, and
/// 128-aligned and 256 bytes in debug builds).
#[repr(C, align(256))]
struct Obj {
    id: u64,
    _pad: [u8; 248],
}

impl Obj {
    fn new(id: u64) -> Self {
        OBJS_MADE.fetch_add(1, Ordering::Relaxed);
        Obj { id, _pad: [0; 248] }
    }
}

impl Drop for Obj {
    fn drop(&mut self) {
        OBJS_DROPPED.fetch_add(1, Ordering::Relaxed);
    }
}

const OBJ: Layout = Layout::new::<Obj>();
/// Magazines of 13 objects: slot arrays of 104 bytes, 8-aligned.
const MAG: usize = 13;
const SLOTS: Layout = match Layout::from_size_align(MAG * 8, 8) {
    Ok(l) => l,
    Err(_) => panic!(),
};

/// Per-thread caches by name: registration, sweeps and stale caches are what these tests
/// fail (a default build's default, per-CPU caches, registers none).
fn config() -> Config {
    Config::new()
        .mode(CacheMode::ThreadCaches)
        .magazine_size(MAG)
        .depot_bytes(64 << 10)
}

/// Tests share the object counters: one at a time.
static SERIAL: Mutex<()> = Mutex::new(());

fn serial() -> std::sync::MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|e| e.into_inner())
}

/// Objects made and not dropped, since `base`.
fn objs_alive(base: (u64, u64)) -> i64 {
    (OBJS_MADE.load(Ordering::Relaxed) - base.0) as i64
        - (OBJS_DROPPED.load(Ordering::Relaxed) - base.1) as i64
}

fn objs_base() -> (u64, u64) {
    (
        OBJS_MADE.load(Ordering::Relaxed),
        OBJS_DROPPED.load(Ordering::Relaxed),
    )
}

fn assert_exact<T>(a: &ClassAllocator<T>, live: usize) {
    let s = a.stats();
    assert!(s.is_consistent(), "{s}");
    assert_eq!(s.live, live as u64, "{s}");
    assert_eq!(s.allocs - s.frees, live as u64, "{s}");
}

/// [`assert_exact`], and (at a quiescent point: every other thread joined) nothing lost
/// inside the allocator.
fn assert_nothing_lost<T>(a: &ClassAllocator<T>, live: usize) {
    assert_exact(a, live);
    books::assert_nothing_lost(a, live as u64);
    assert_exact(a, live);
}

// ---------------------------------------------------------------------------------------
// Objects

#[test]
fn object_failures_make_try_alloc_return_an_error_and_change_nothing() {
    let _s = serial();
    let base = objs_base();
    let a = ClassAllocator::<Obj>::with_config("fault-objects", config());
    {
        let armed = Armed::new(OBJ, Mode::From(1), 0);
        for i in 0..10 {
            assert_eq!(a.try_alloc(Obj::new(i)).err(), Some(AllocError));
            assert_eq!(
                a.try_alloc_with(|| unreachable!("init runs only with memory"))
                    .err(),
                Some(AllocError)
            );
            // SAFETY: `init` is never called: the allocation fails.
            let r = unsafe { a.try_alloc_in_place(|_| unreachable!()) };
            assert_eq!(r.err(), Some(AllocError));
            a.with_local(|c| {
                assert_eq!(c.try_alloc(Obj::new(i)).err(), Some(AllocError));
                let r = c.try_alloc_with(|| unreachable!("init runs only with memory"));
                assert_eq!(r.err(), Some(AllocError));
            });
        }
        assert_eq!(armed.counts(), (50, 50));
    }
    // The values given to a failed `try_alloc` were dropped, and nothing was counted.
    assert_eq!(objs_alive(base), 0);
    let s = a.stats();
    assert_eq!(
        (s.allocs, s.frees, s.backing_allocs, s.live),
        (0, 0, 0, 0),
        "{s}"
    );
    // It works once memory is back.
    let x = a.alloc(Obj::new(1));
    assert_eq!(x.id, 1);
    assert_exact(&a, 1);
    drop(x);
    assert!(a.trim() > 0);
    assert_eq!(a.stats().reserved_bytes(), 0);
}

#[test]
fn the_nth_object_allocation_fails_and_only_it() {
    let _s = serial();
    let a = ClassAllocator::<Obj>::with_config("fault-nth", config());
    // Nothing cached: every allocation reaches the backing allocator.
    let armed = Armed::new(OBJ, Mode::Nth(3), 0);
    let results: Vec<_> = (0..5).map(|i| a.try_alloc(Obj::new(i))).collect();
    let ok: Vec<bool> = results.iter().map(Result::is_ok).collect();
    assert_eq!(ok, [true, true, false, true, true]);
    assert_eq!(armed.counts(), (5, 1));
    drop(armed);
    assert_exact(&a, 4);
    drop(results);
    assert_nothing_lost(&a, 0);
}

#[test]
fn random_object_failures_keep_the_books_exact() {
    let _s = serial();
    let base = objs_base();
    let a = ClassAllocator::<Obj>::with_config("fault-random-objects", config());
    let mut held = Vec::new();
    let mut rng = 0x00b1_ec75_u64;
    let mut failures = 0;
    {
        let _armed = Armed::new(OBJ, Mode::Random(300), 0xfa11);
        for step in 0..4000u64 {
            let r = splitmix64(&mut rng);
            if r % 100 < 55 {
                match a.try_alloc(Obj::new(step)) {
                    Ok(b) => held.push(b),
                    Err(AllocError) => failures += 1,
                }
            } else if !held.is_empty() {
                let i = (r >> 8) as usize % held.len();
                let b = held.swap_remove(i);
                drop(b);
            }
            if step % 97 == 0 {
                assert_exact(&a, held.len());
                assert_eq!(objs_alive(base), held.len() as i64);
            }
        }
    }
    assert!(failures > 100, "{failures} failures injected");
    assert_exact(&a, held.len());
    drop(held);
    assert_exact(&a, 0);
    a.trim();
    assert_eq!(a.stats().reserved_bytes(), 0);
    assert_eq!(objs_alive(base), 0);
}

#[test]
fn failed_allocations_give_their_max_live_permits_back() {
    let _s = serial();
    const CAP: usize = 8;
    let a = ClassAllocator::<Obj>::with_config("fault-capped", config().max_live(CAP));
    let mut held = Vec::new();
    let mut rng = 7u64;
    {
        let _armed = Armed::new(OBJ, Mode::Random(400), 0xcab);
        for step in 0..3000u64 {
            let r = splitmix64(&mut rng);
            if r % 2 == 0 {
                if let Ok(b) = a.try_alloc(Obj::new(step)) {
                    held.push(b);
                }
                assert!(held.len() <= CAP);
            } else if !held.is_empty() {
                held.swap_remove((r >> 8) as usize % held.len());
            }
        }
    }
    drop(held);
    // Every permit is back: exactly `max_live` objects can be had, and no more.
    let all: Vec<_> = (0..CAP)
        .map(|i| {
            a.try_alloc(Obj::new(i as u64))
                .expect("a permit was lost to a failed allocation")
        })
        .collect();
    assert_eq!(a.try_alloc(Obj::new(99)).err(), Some(AllocError));
    assert_exact(&a, CAP);
    drop(all);
    a.trim();
    assert_eq!(a.stats().reserved_bytes(), 0);
}

/// A recycled value of a layout of its own (96 bytes, 32-aligned).
#[repr(C, align(32))]
struct Rv {
    _bytes: [u8; 96],
}

static RV_CREATED: AtomicU64 = AtomicU64::new(0);

impl Recycle for Rv {
    fn create() -> Self {
        RV_CREATED.fetch_add(1, Ordering::Relaxed);
        Rv { _bytes: [0; 96] }
    }
    fn recycle(&mut self) -> bool {
        true
    }
}

#[test]
fn recycling_try_get_fails_without_creating() {
    let _s = serial();
    let r = RecyclingAllocator::<Rv>::with_config("fault-recycled", config().max_live(4));
    let created = RV_CREATED.load(Ordering::Relaxed);
    {
        let _armed = Armed::new(Layout::new::<Rv>(), Mode::From(1), 0);
        for _ in 0..10 {
            assert_eq!(r.try_get().err(), Some(AllocError));
        }
    }
    assert_eq!(
        RV_CREATED.load(Ordering::Relaxed),
        created,
        "create ran without memory"
    );
    // The cap's permits all came back.
    let all: Vec<_> = (0..4)
        .map(|_| r.try_get().expect("a permit was lost"))
        .collect();
    assert_eq!(r.try_get().err(), Some(AllocError));
    drop(all);
    let s = r.stats();
    assert!(s.is_consistent() && s.live == 0, "{s}");
    r.trim();
    assert_eq!(r.stats().reserved_bytes(), 0);
}

/// A thread's first allocation registers its cache (the table's boxes and vectors, the
/// allocator's cache list): an out-of-memory there must not abort a `try_alloc`. Each
/// round makes 40 new allocators (so their cache lists must grow, and the thread's table
/// boxes caches past its 32 inline ones, with their addresses kept beside them), and fails the Nth allocation of any layout on a
/// new thread that makes its first `try_alloc` in each, until a round has no Nth
/// allocation.
#[test]
fn out_of_memory_while_registering_a_threads_cache_is_an_error_not_an_abort() {
    let _s = serial();
    let base = objs_base();
    let mut n = 1;
    loop {
        let allocators: Vec<_> = (0..40)
            .map(|_| ClassAllocator::<Obj>::with_config("fault-register", config()))
            .collect();
        for a in &allocators {
            assert_eq!(a.stats().threads, 0); // the engine exists before any failure
        }
        let (seen, failed, errors) = std::thread::scope(|s| {
            s.spawn(|| {
                let mut held = Vec::with_capacity(allocators.len());
                let mut values: Vec<_> = (0..allocators.len() as u64).map(Obj::new).collect();
                let armed = Armed::any_layout(Mode::Nth(n));
                for a in &allocators {
                    held.push(a.try_alloc(values.pop().unwrap()));
                }
                let (seen, failed) = armed.counts();
                drop(armed);
                let errors = held.iter().filter(|r| r.is_err()).count();
                for (a, r) in allocators.iter().zip(&held) {
                    // A cache registered, or none (the allocation took the backing
                    // allocator's path): never half of one.
                    let s = a.stats();
                    assert!(s.threads <= 1 && s.is_consistent(), "round {n}: {s}");
                    assert_eq!(s.live, u64::from(r.is_ok()), "round {n}: {s}");
                }
                (seen, failed, errors)
            })
            .join()
            .unwrap()
        });
        // Only an object's own allocation may fail a `try_alloc`; a failed registration
        // falls back to the backing allocator.
        assert!(
            errors as u64 <= failed,
            "round {n}: {errors} errors, {failed} failures"
        );
        for a in &allocators {
            assert_nothing_lost(a, 0);
            assert_eq!(
                a.stats().threads,
                0,
                "round {n}: a cache outlived its thread"
            );
        }
        if seen < n {
            break;
        }
        n += 1;
    }
    assert!(
        n > 40,
        "only {n} allocations on the path: registration was not exercised"
    );
    assert_eq!(objs_alive(base), 0);
}

/// Without memory at all, a new thread's `try_alloc` (and `with_local`'s) returns an
/// error.
#[test]
fn a_new_thread_without_memory_gets_an_error_from_try_alloc() {
    let _s = serial();
    let base = objs_base();
    let a = ClassAllocator::<Obj>::with_config(
        "fault-register-none",
        config().mode(CacheMode::ThreadCaches),
    );
    drop(a.alloc(Obj::new(0)));
    std::thread::scope(|s| {
        s.spawn(|| {
            let (v, w) = (Obj::new(1), Obj::new(2));
            let armed = Armed::any_layout(Mode::From(1));
            let r = a.try_alloc(v).map(|_| ());
            let local = a.with_local(|c| c.try_alloc(w).map(|_| ()));
            let counts = armed.counts();
            drop(armed);
            assert_eq!((r, local), (Err(AllocError), Err(AllocError)));
            assert!(counts.1 >= 2, "{counts:?}");
        })
        // Joined here, not at the scope's end: a join waits for the thread's
        // thread-local teardown, which retires its caches.
        .join()
        .unwrap();
    });
    assert_nothing_lost(&a, 0);
    assert_eq!(objs_alive(base), 0);
}

/// A slow path ends with a sweep of the thread's caches, which retires the cache of an
/// allocator dropped meanwhile: out of memory, the sweep leaves it for a later one
/// instead of aborting (`try_alloc` takes slow paths).
#[test]
fn out_of_memory_in_a_sweep_is_not_an_abort() {
    let _s = serial();
    let base = objs_base();
    let old = Mutex::new(Some(ClassAllocator::<Obj>::with_config(
        "fault-sweep-old",
        config(),
    )));
    let b = ClassAllocator::<Obj>::with_config("fault-sweep-b", config());
    let barrier = std::sync::Barrier::new(2);
    std::thread::scope(|s| {
        let t = s.spawn(|| {
            {
                let g = old.lock().unwrap();
                let a = g.as_ref().unwrap();
                drop(a.alloc(Obj::new(0)));
                a.trim(); // registered, holding nothing
            }
            drop(b.alloc(Obj::new(1)));
            b.trim(); // registered, holding nothing: the next allocation is a slow path
            barrier.wait();
            barrier.wait(); // the old allocator is dropped
            let v = Obj::new(2);
            let armed = Armed::any_layout(Mode::From(1));
            let r = b.try_alloc(v).map(|_| ());
            drop(armed);
            assert_eq!(r, Err(AllocError));
            // With memory back, a later sweep retires the dead cache.
            for i in 0..300 {
                drop(b.alloc(Obj::new(i)));
                b.trim();
            }
        });
        barrier.wait();
        drop(old.lock().unwrap().take());
        barrier.wait();
        t.join().unwrap();
    });
    assert_nothing_lost(&b, 0);
    assert_eq!(objs_alive(base), 0);
}

/// A thread whose cache of a dropped allocator is still in its table (no slow path
/// since the drop) meets an out-of-memory while registering the allocator that reuses
/// the index: the stale cache is retired into the garbage list, which must not grow
/// by an aborting push.
#[test]
fn out_of_memory_while_replacing_a_stale_cache_is_an_error_not_an_abort() {
    let _s = serial();
    let base = objs_base();
    let mut n = 1;
    loop {
        let old = Mutex::new(Some(ClassAllocator::<Obj>::with_config(
            "fault-stale-old",
            config(),
        )));
        let new = std::sync::OnceLock::new();
        let barrier = std::sync::Barrier::new(2);
        let (seen, failed) = std::thread::scope(|s| {
            let t = s.spawn(|| {
                {
                    let g = old.lock().unwrap();
                    let a = g.as_ref().unwrap();
                    drop(a.alloc(Obj::new(0)));
                    a.trim(); // the cache stays registered, and holds nothing
                }
                barrier.wait(); // the old allocator is dropped, the new one made
                barrier.wait();
                let b: &ClassAllocator<Obj> = new.get().unwrap();
                let v = Obj::new(1);
                let armed = Armed::any_layout(Mode::Nth(n));
                let r = b.try_alloc(v).map(|_| ());
                let counts = armed.counts();
                drop(armed);
                let _ = r;
                counts
            });
            barrier.wait();
            drop(old.lock().unwrap().take());
            let b = ClassAllocator::<Obj>::with_config("fault-stale-new", config());
            assert_eq!(b.stats().threads, 0); // its engine exists (and took the index)
            let _ = new.set(b);
            barrier.wait();
            t.join().unwrap()
        });
        let b = new.get().unwrap();
        assert_nothing_lost(b, 0);
        assert_eq!(b.stats().threads, 0, "round {n}");
        assert!(failed <= 1);
        if seen < n {
            break;
        }
        n += 1;
    }
    assert!(n > 2, "only {n} allocations on the path");
    assert_eq!(objs_alive(base), 0);
}

// ---------------------------------------------------------------------------------------
// Slot arrays

#[test]
fn slot_array_failures_send_frees_to_the_backing_allocator() {
    let _s = serial();
    let a = ClassAllocator::<Obj>::with_config("fault-slots", config());
    let objs: Vec<_> = (0..50).map(|i| a.alloc(Obj::new(i))).collect();
    {
        // No magazine can get storage: every free goes to the backing allocator.
        let armed = Armed::new(SLOTS, Mode::From(1), 0);
        drop(objs);
        assert!(armed.counts().1 > 0, "no slot array was asked for");
    }
    let s = a.stats();
    assert!(s.is_consistent(), "{s}");
    assert_eq!((s.live, s.frees, s.backing_frees), (0, 50, 50), "{s}");
    assert_eq!(s.reserved_objects(), 0, "{s}");
    // With memory back, magazines work again.
    drop((0..50).map(|i| a.alloc(Obj::new(i))).collect::<Vec<_>>());
    assert!(a.stats().cached_in_threads > 0);
    assert_exact(&a, 0);
    a.trim();
    assert_eq!(a.stats().reserved_bytes(), 0);
}

/// What a full depot sends back (evicted magazines, here every spill: the depot's
/// budget is 0) is collected without allocating, so frees, a flush and a trim go through
/// with every allocation of the thread failing. (The list of evictions was a `Vec`,
/// whose first push aborted the test binary: "memory allocation of 64 bytes failed".)
#[test]
fn evictions_need_no_memory_frees_flushes_and_trims_work_with_none() {
    let _s = serial();
    let base = objs_base();
    let cfg = Config::new().magazine_size(MAG).depot_bytes(0);
    let a = ClassAllocator::<Obj>::with_config("fault-evictions", cfg);
    const N: u64 = 10 * MAG as u64;
    // A round without failures makes the magazines; the second round's frees evict.
    drop((0..N).map(|i| a.alloc(Obj::new(i))).collect::<Vec<_>>());
    let objs: Vec<_> = (0..N).map(|i| a.alloc(Obj::new(i))).collect();
    let overflows = a.stats().overflows;
    {
        let armed = Armed::any_layout(Mode::From(1));
        drop(objs);
        a.release_thread_cache();
        a.trim();
        drop(armed);
    }
    let s = a.stats();
    assert!(s.overflows > overflows, "no eviction happened: {s}");
    assert_exact(&a, 0);
    assert_eq!(s.reserved_objects(), 0, "{s}");
    assert_eq!(objs_alive(base), 0);
    // Memory back: the allocator works as before.
    drop((0..N).map(|i| a.alloc(Obj::new(i))).collect::<Vec<_>>());
    assert_nothing_lost(&a, 0);
}

/// A thread that exits while the global allocator fails everything it asks for still
/// retires its caches of every allocator it used (their room was reserved when the
/// caches were registered); the thread-exit teardown pushed each onto a `Vec`, whose
/// growth aborted the process.
#[test]
fn a_thread_exit_needs_no_memory() {
    let _s = serial();
    let base = objs_base();
    let cfg = Config::new()
        .mode(CacheMode::ThreadCaches)
        .magazine_size(MAG);
    let allocators: Arc<Vec<ClassAllocator<Obj>>> = Arc::new(
        (0..5)
            .map(|_| ClassAllocator::with_config("fault-thread-exit", cfg))
            .collect(),
    );
    let all = allocators.clone();
    std::thread::spawn(move || {
        for (i, a) in all.iter().enumerate() {
            drop(
                (0..3 * MAG as u64)
                    .map(|j| a.alloc(Obj::new(j)))
                    .collect::<Vec<_>>(),
            );
            assert!(
                a.stats().cached_in_threads > 0,
                "allocator {i} caches nothing"
            );
        }
        drop(all);
        // Armed through the thread's exit: the plan is a `const` thread-local with no
        // destructor, so it stays armed while the other thread-locals are destroyed.
        std::mem::forget(Armed::any_layout(Mode::From(1)));
    })
    .join()
    .unwrap();
    for a in allocators.iter() {
        assert_exact(a, 0);
        let s = a.stats();
        assert_eq!((s.threads, s.cached_in_threads), (0, 0), "{s}");
        assert_nothing_lost(a, 0);
    }
    assert_eq!(objs_alive(base), 0);
}

/// `trim_all`, what a program calls when memory runs out, works without any: its list
/// of the process's allocators cannot be allocated, so it walks the registry entry by
/// entry. (It collected the list into a `Vec`, and aborted: "memory allocation of 64
/// bytes failed".)
/// An allocator whose depot holds what `n` objects left (made, freed, and this thread's
/// cache released: per-thread caches, which that releases).
fn with_objects_in_its_depot(name: &'static str, n: u64) -> ClassAllocator<Obj> {
    let a = ClassAllocator::<Obj>::with_config(name, config().mode(CacheMode::ThreadCaches));
    drop((0..n).map(|i| a.alloc(Obj::new(i))).collect::<Vec<_>>());
    a.release_thread_cache();
    assert!(a.stats().cached_in_depot > 0);
    a
}

#[test]
fn trim_all_needs_no_memory() {
    let _s = serial();
    let a = with_objects_in_its_depot("fault-trim-all", 5 * MAG as u64);
    let released = {
        let armed = Armed::any_layout(Mode::From(1));
        let released = proxalloc::trim_all();
        assert!(armed.counts().1 > 0, "trim_all asked for no memory");
        released
    };
    assert!(
        released >= 5 * MAG * OBJ.size(),
        "released {released} bytes"
    );
    let s = a.stats();
    assert_eq!((s.cached_in_depot, s.reserved_objects()), (0, 0), "{s}");
}

/// A recycled value whose drop, once `PARK` is set, waits until `GO`: it holds a trim in
/// the middle of a walk over the registered allocators.
#[repr(C, align(64))]
struct Parking {
    _bytes: [u8; 192],
}

static PARK: AtomicBool = AtomicBool::new(false);
static PARKED: AtomicBool = AtomicBool::new(false);
static GO: AtomicBool = AtomicBool::new(false);

impl Recycle for Parking {
    fn create() -> Self {
        Parking { _bytes: [0; 192] }
    }
    fn recycle(&mut self) -> bool {
        true
    }
}

impl Drop for Parking {
    fn drop(&mut self) {
        if PARK.swap(false, Ordering::AcqRel) {
            PARKED.store(true, Ordering::Release);
            // Yields only: this runs on a thread where every allocation fails.
            while !GO.load(Ordering::Acquire) {
                std::thread::yield_now();
            }
        }
    }
}

/// Out of memory, `trim_all` walks the registry one entry at a time. An allocator
/// registered meanwhile (here by another thread, while the walk waits in a recycled
/// value's drop) must not make it miss a live one: a registration used to drop the dead
/// entries first, which moved every later entry down by one, so the entry after the one
/// being trimmed was never reached.
#[test]
fn a_registration_during_an_out_of_memory_trim_all_skips_no_allocator() {
    let _s = serial();
    let dead = ClassAllocator::<u64>::with_config(
        "fault-walk-dead",
        Config::new().mode(CacheMode::ThreadCaches),
    );
    drop(dead.alloc(1));
    let parking = RecyclingAllocator::<Parking>::with_config(
        "fault-walk-parking",
        Config::new().mode(CacheMode::ThreadCaches),
    );
    drop(parking.get());
    parking.release_thread_cache();
    let after = with_objects_in_its_depot("fault-walk-after", 2 * MAG as u64);
    // A dead entry ahead of `parking`'s in the list.
    drop(dead);
    PARKED.store(false, Ordering::Relaxed);
    GO.store(false, Ordering::Relaxed);
    std::thread::scope(|s| {
        s.spawn(|| {
            let start = std::time::Instant::now();
            while !PARKED.load(Ordering::Acquire) {
                if start.elapsed().as_secs() > 60 {
                    GO.store(true, Ordering::Release);
                    panic!("the trim never dropped the recycled value");
                }
                std::thread::yield_now();
            }
            // Registers (this thread's allocations do not fail) while the walk waits.
            let newcomer = ClassAllocator::<u64>::with_config(
                "fault-walk-newcomer",
                Config::new().mode(CacheMode::ThreadCaches),
            );
            drop(newcomer.alloc(2));
            GO.store(true, Ordering::Release);
        });
        let _armed = Armed::any_layout(Mode::From(1));
        PARK.store(true, Ordering::Release);
        proxalloc::trim_all();
    });
    let s = after.stats();
    assert_eq!(s.cached_in_depot, 0, "the walk missed an allocator: {s}");
    assert_eq!(parking.stats().reserved_bytes(), 0);
}

#[test]
fn random_slot_array_failures_keep_the_books_exact() {
    let _s = serial();
    let base = objs_base();
    let a = ClassAllocator::<Obj>::with_config(
        "fault-random-slots",
        config()
            .depot_bytes(4 * MAG * 256)
            .thread_cache_growth_bytes(8 * MAG * 256),
    );
    drop(a.alloc(Obj::new(0))); // registers this thread's cache before anything fails
    let mut held = Vec::new();
    let mut rng = 0x5107_u64;
    let seen;
    {
        let armed = Armed::new(SLOTS, Mode::Random(500), 0x5eed);
        for step in 0..6000u64 {
            let r = splitmix64(&mut rng);
            // Bursts of several magazines, so magazines are made, spilled, trimmed.
            match r % 10 {
                0..=4 => held.push(a.alloc(Obj::new(step))),
                5..=8 => {
                    if !held.is_empty() {
                        held.swap_remove((r >> 8) as usize % held.len());
                    }
                }
                _ => {
                    if r % 50 == 9 {
                        a.trim();
                    } else if r % 50 == 19 {
                        a.release_thread_cache();
                    } else {
                        held.truncate(held.len() / 2);
                    }
                }
            }
            if step % 89 == 0 {
                assert_exact(&a, held.len());
            }
        }
        seen = armed.counts();
    }
    assert!(seen.1 > 20, "{seen:?}: too few slot arrays failed");
    drop(held);
    assert_exact(&a, 0);
    a.trim();
    assert_eq!(a.stats().reserved_bytes(), 0);
    assert_eq!(objs_alive(base), 0);
}

/// Issue 21 suspected that a failed slot-array allocation leaves a magazine index
/// claimed and never used. It did: the depot's new magazine claimed the next index (and
/// installed its segment of descriptors) before it asked for the slots, and on failure
/// forgot the descriptor. Under sustained failure every free that needed a magazine
/// claimed one more index, so the table grew (130 KB over these 4096 frees) with no
/// magazine to show for it, and after 2^24 failures the allocator could never make a
/// magazine again. Now the descriptor waits on the empty stack for its storage.
#[test]
fn failed_slot_array_allocations_do_not_grow_the_magazine_table() {
    let _s = serial();
    const N: usize = 4096;
    let a = ClassAllocator::<Obj>::with_config("fault-slot-indices", config());
    // Registered on this thread, objects in hand; nothing cached.
    let objs: Vec<_> = (0..N).map(|i| a.alloc(Obj::new(i as u64))).collect();
    net_bytes::start_counting();
    let armed = Armed::new(SLOTS, Mode::From(1), 0);
    drop(objs); // every free asks for a magazine, and is refused its slots
    let (_, failed) = armed.counts();
    drop(armed);
    let net = net_bytes::stop_counting();
    assert_eq!(failed as usize, N, "one slot array asked for per free");
    // The objects went back to the system; anything beyond them stayed allocated.
    let kept = net + (N * OBJ.size()) as isize;
    assert!(
        kept <= 1024,
        "{N} failed slot-array allocations left {kept} bytes allocated (descriptor segments for \
         indices that were claimed and never used)"
    );
}

// ---------------------------------------------------------------------------------------
// Pool blocks

/// A block allocator that fails on command (any thread), counting what it holds.
#[derive(Default)]
struct FailingBlocks {
    /// 0: never; n: fail from the nth request on.
    fail_from: AtomicU64,
    /// Chance per mille of a random failure (0: none).
    random: AtomicU64,
    rng: Mutex<u64>,
    requests: AtomicU64,
    failures: AtomicU64,
    blocks: AtomicI64,
    bytes: AtomicI64,
}

impl FailingBlocks {
    fn fail_from(&self, n: u64) {
        self.requests.store(0, Ordering::Relaxed);
        self.fail_from.store(n, Ordering::Relaxed);
    }
}

// SAFETY: memory from `System` with the caller's layout, given back there.
unsafe impl BlockAllocator for FailingBlocks {
    fn alloc_block(&self, layout: Layout) -> Option<NonNull<u8>> {
        let n = self.requests.fetch_add(1, Ordering::Relaxed) + 1;
        let from = self.fail_from.load(Ordering::Relaxed);
        let random = self.random.load(Ordering::Relaxed);
        let fail = (from != 0 && n >= from)
            || (random != 0 && splitmix64(&mut self.rng.lock().unwrap()) % 1000 < random);
        if fail {
            self.failures.fetch_add(1, Ordering::Relaxed);
            return None;
        }
        // SAFETY: block layouts are never zero-sized.
        let p = NonNull::new(unsafe { System.alloc(layout) })?;
        self.blocks.fetch_add(1, Ordering::Relaxed);
        self.bytes
            .fetch_add(layout.size() as i64, Ordering::Relaxed);
        Some(p)
    }

    unsafe fn free_block(&self, ptr: NonNull<u8>, layout: Layout) {
        self.blocks.fetch_sub(1, Ordering::Relaxed);
        self.bytes
            .fetch_sub(layout.size() as i64, Ordering::Relaxed);
        // SAFETY: allocated above with this layout.
        unsafe { System.dealloc(ptr.as_ptr(), layout) }
    }
}

static CLEANUPS: AtomicUsize = AtomicUsize::new(0);

#[test]
fn pool_block_failures_make_try_alloc_return_an_error() {
    // Serial too: its source registers, which prunes the registry (a test of the
    // registry's walk relies on a dead entry staying in it).
    let _s = serial();
    let blocks = Arc::new(FailingBlocks::default());
    let source = BlockSource::with_block_allocator(64 << 10, blocks.clone());
    {
        let mut pool = Pool::with_source(&source);
        pool.on_clear(|| {
            CLEANUPS.fetch_add(1, Ordering::Relaxed);
        });
        let first = *pool.alloc(1u64); // the first block
        assert_eq!(first, 1);
        blocks.fail_from(1);
        // Too big for the first block: a new block is needed, and refused.
        let (err, back) = pool.try_alloc([7u8; 9000]).unwrap_err();
        assert_eq!((err, back[0]), (AllocError, 7));
        let large = Layout::from_size_align(200_000, 64).unwrap();
        assert_eq!(pool.try_alloc_layout(large).err(), Some(AllocError));
        let stats = pool.stats();
        assert_eq!(stats.blocks, 1, "{stats:?}");
        assert_eq!(blocks.failures.load(Ordering::Relaxed), 2);
        // Small requests still fit the block the pool has.
        assert_eq!(pool.alloc_str("still here"), "still here");
        blocks.fail_from(0);
        let big = pool.try_alloc([9u8; 9000]).expect("memory is back");
        assert_eq!(big[8999], 9);
        assert!(pool.try_alloc_layout(large).is_ok());
        pool.clear();
        assert_eq!(CLEANUPS.load(Ordering::Relaxed), 1, "the cleanup ran once");
    }
    drop(source);
    assert_eq!(blocks.blocks.load(Ordering::Relaxed), 0, "blocks leaked");
    assert_eq!(blocks.bytes.load(Ordering::Relaxed), 0);
}

#[test]
fn random_pool_block_failures_lose_no_block() {
    let _s = serial(); // as above
    let blocks = Arc::new(FailingBlocks::default());
    blocks.random.store(250, Ordering::Relaxed);
    *blocks.rng.lock().unwrap() = 0xb10c;
    let source = BlockSource::with_block_allocator(128 << 10, blocks.clone());
    let mut rng = 11u64;
    let mut failures = 0;
    for _ in 0..40 {
        let mut pool = Pool::with_source(&source);
        let mut written: Vec<(usize, usize, u8)> = Vec::new();
        for _ in 0..60 {
            let r = splitmix64(&mut rng);
            let size = [16, 700, 6000, 20_000, 70_000, 300_000][(r % 6) as usize];
            let layout = Layout::from_size_align(size, 16).unwrap();
            match pool.try_alloc_layout(layout) {
                Ok(p) => {
                    let pattern = (r >> 16) as u8;
                    // SAFETY: `size` fresh bytes of the pool.
                    unsafe { p.as_ptr().write_bytes(pattern, size) };
                    written.push((p.as_ptr() as usize, size, pattern));
                }
                Err(AllocError) => failures += 1,
            }
            if r % 17 == 0 {
                let sub = pool.subpool();
                let _ = sub.try_alloc_layout(layout);
            }
        }
        for &(addr, len, pattern) in &written {
            // SAFETY: written above; the pool is not cleared yet.
            let bytes = unsafe { std::slice::from_raw_parts(addr as *const u8, len) };
            assert!(
                bytes.iter().all(|&b| b == pattern),
                "an allocation was overwritten"
            );
        }
        let stats = pool.stats();
        let used: usize = written.iter().map(|w| w.1).sum();
        assert!(stats.used_bytes >= used, "{stats:?} < {used}");
        pool.clear();
        assert_eq!(pool.stats().used_bytes, 0);
    }
    assert!(failures > 20, "{failures} failures");
    source.trim();
    drop(source);
    assert_eq!(blocks.blocks.load(Ordering::Relaxed), 0, "blocks leaked");
}

#[test]
fn global_source_pool_blocks_fail_through_the_global_allocator() {
    let _s = serial();
    // A pool on the global source takes 8 KiB blocks of the first class (64-aligned).
    let block = Layout::from_size_align(8 << 10, 64).unwrap();
    let pool = Pool::new();
    let armed = Armed::new(block, Mode::From(1), 0);
    // Trimmed, so no 8 KiB block is cached anywhere and the class must allocate.
    BlockSource::global().trim();
    let r = pool.try_alloc(5u32);
    let counts = armed.counts();
    drop(armed);
    assert_eq!(r.err().map(|e| e.0), Some(AllocError), "{counts:?}");
    assert_eq!(*pool.alloc(6u32), 6);
}

// ---------------------------------------------------------------------------------------
// The panicking forms: `handle_alloc_error`, which aborts

const CHILD: &str = "PROXALLOC_FAULT_CHILD";

/// In a child process started by `alloc_failures_abort_with_the_standard_message`: arms
/// a failure and calls one of the forms that cannot return an error. Returning at all is
/// the failure the parent looks for. (Without the variable it does nothing.)
#[test]
fn child_process_entry() {
    let Ok(case) = std::env::var(CHILD) else {
        return;
    };
    static STATIC: ClassAllocator<Obj> = ClassAllocator::new("fault-child");
    let arc = Arc::new(ClassAllocator::<Obj>::new("fault-child-arc"));
    let recycled = RecyclingAllocator::<Rv>::new("fault-child-recycled");
    let capped =
        ClassAllocator::<Obj>::with_config("fault-child-capped", Config::new().max_live(0));
    let blocks = Arc::new(FailingBlocks::default());
    let source = BlockSource::with_block_allocator(1 << 20, blocks.clone());
    let _armed = Armed::new(
        if case == "recycling-get" {
            Layout::new::<Rv>()
        } else {
            OBJ
        },
        Mode::From(1),
        0,
    );
    match case.as_str() {
        "alloc" => drop(STATIC.alloc(Obj::new(1))),
        "alloc-with" => drop(STATIC.alloc_with(|| Obj::new(2))),
        "alloc-arc" => drop(arc.alloc_arc(Obj::new(3))),
        "with-local" => STATIC.with_local(|c| drop(c.alloc(Obj::new(4)))),
        "recycling-get" => drop(recycled.get()),
        "capped-alloc" => drop(capped.alloc(Obj::new(5))),
        "pool-alloc" => {
            blocks.fail_from(1);
            let pool = Pool::with_source(&source);
            let _ = pool.alloc([0u8; 100]);
        }
        other => panic!("unknown case {other}"),
    }
    std::process::exit(0); // it did not abort: the parent reports this
}

#[test]
fn alloc_failures_abort_with_the_standard_message() {
    let exe = std::env::current_exe().unwrap();
    for (case, bytes) in [
        ("alloc", 256),
        ("alloc-with", 256),
        ("alloc-arc", 256),
        ("with-local", 256),
        ("recycling-get", 96),
        ("capped-alloc", 256),
        ("pool-alloc", 100),
    ] {
        let out = std::process::Command::new(&exe)
            .args([
                "--exact",
                "child_process_entry",
                "--nocapture",
                "--test-threads=1",
            ])
            .env(CHILD, case)
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(
            !out.status.success(),
            "{case}: the child returned normally\n{stderr}"
        );
        #[cfg(unix)]
        {
            use std::os::unix::process::ExitStatusExt;
            assert_eq!(
                out.status.signal(),
                Some(6),
                "{case}: not SIGABRT: {:?}\n{stderr}",
                out.status
            );
        }
        let expected = format!("memory allocation of {bytes} bytes failed");
        assert!(
            stderr.contains(&expected),
            "{case}: no {expected:?} in\n{stderr}"
        );
    }
}

/// A sweep that meets two dead allocators' caches while the global allocator fails:
/// the first retired cache's garbage needs no memory, the second's does, so the sweep
/// must stop there (`Garbage::reserve_one`) and leave that cache to a later sweep or
/// the thread's exit, not push into a vector it could not grow (an abort).
#[test]
fn a_sweep_out_of_memory_leaves_the_second_dead_cache_for_later() {
    let _s = serial();
    let a = Arc::new(ClassAllocator::<u64>::with_config(
        "fault-sweep-dead-a",
        config(),
    ));
    let b = Arc::new(ClassAllocator::<u64>::with_config(
        "fault-sweep-dead-b",
        config(),
    ));
    let c = ClassAllocator::<u64>::with_config("fault-sweep-live", config());
    let registered = std::sync::Barrier::new(2);
    let dropped = std::sync::Barrier::new(2);
    std::thread::scope(|s| {
        let (a2, b2) = (a.clone(), b.clone());
        let (c, registered, dropped) = (&c, &registered, &dropped);
        s.spawn(move || {
            drop((0..3).map(|i| a2.alloc(i)).collect::<Vec<_>>());
            drop((0..3).map(|i| b2.alloc(i)).collect::<Vec<_>>());
            drop(c.alloc(0));
            drop((a2, b2));
            registered.wait();
            dropped.wait();
            {
                let _armed = Armed::any_layout(Mode::From(1));
                // The first from the loaded magazine, the second on the slow path,
                // whose sweep finds both dead caches (the shutdowns asked for it).
                let first = c.try_alloc(1).expect("from the loaded magazine");
                let _ = c.try_alloc(2);
                drop(first);
            }
            drop(c.alloc(3));
        });
        registered.wait();
        drop(a);
        drop(b);
        dropped.wait();
    });
    let s = c.stats();
    assert_eq!(s.live, 0, "{s}");
}
