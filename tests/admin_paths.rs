//! Where administrative paths (`stats`, `trim`, `trim_all`, an allocator's drop, thread
//! exit, the idle collector) meet owner threads and user code run by destroy hooks.
//! Each test is a regression test: it failed on the code before the fix it guards.
//!
//! Tests in this file share process-wide state (`trim_all` reaches every allocator), so
//! they run one at a time under `SERIAL`.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{mpsc, Arc, Mutex, MutexGuard};
use std::time::Duration;

use proxalloc::{CacheMode, ClassAllocator, Config, Recycle, Recycled, RecyclingAllocator};

static SERIAL: Mutex<()> = Mutex::new(());

fn serial() -> MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|e| e.into_inner())
}

/// Nothing lost inside the allocator (a `ClassAllocator` or a `RecyclingAllocator`):
/// `is_consistent` cannot see an object dropped in a spill, flush or trim (it would count
/// as cached), so at a quiescent point (every other thread joined, its cache flushed at
/// exit) trim until nothing more comes back (destructors that trims run may free more),
/// and check that what is still reserved from the backing allocator is exactly what is
/// live, and what is live is what the test still holds.
macro_rules! assert_nothing_lost {
    ($a:expr, $still_held:expr) => {{
        let a = &$a;
        let mut rounds = 0;
        while a.trim() > 0 {
            rounds += 1;
            assert!(rounds < 100, "trim never settles");
        }
        let s = a.stats();
        assert!(s.is_consistent(), "{s}");
        assert_eq!(s.live, $still_held, "{s}");
        assert_eq!(
            s.reserved_objects(),
            s.live,
            "objects lost inside the allocator: {s}"
        );
    }};
}

/// Runs `f` on a thread and waits for it, failing instead of hanging if it deadlocks.
/// (A guard against a hang, not a timing assertion: the limit is minutes.)
fn finishes<R: Send + 'static>(what: &str, f: impl FnOnce() -> R + Send + 'static) -> R {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let r = catch_unwind(AssertUnwindSafe(f));
        let _ = tx.send(r);
    });
    match rx.recv_timeout(Duration::from_secs(if cfg!(miri) { 3600 } else { 120 })) {
        Ok(Ok(r)) => r,
        Ok(Err(p)) => std::panic::resume_unwind(p),
        Err(_) => panic!("{what}: deadlocked"),
    }
}

/// `trim_all` detaches the depot's chain and destroys its values while the allocator is
/// dropped on another thread. Shutdown used to walk every magazine, including the trimmer's
/// chain: those values were dropped twice.
#[test]
fn trim_all_racing_an_allocators_drop_drops_each_value_once() {
    static CREATED: AtomicUsize = AtomicUsize::new(0);
    static DROPPED: AtomicUsize = AtomicUsize::new(0);
    static PARK: AtomicBool = AtomicBool::new(false);
    static PARKED: Mutex<Option<mpsc::Sender<()>>> = Mutex::new(None);
    static RESUME: Mutex<Option<mpsc::Receiver<()>>> = Mutex::new(None);

    struct Parker;
    impl Recycle for Parker {
        fn create() -> Self {
            CREATED.fetch_add(1, Ordering::SeqCst);
            Parker
        }
        fn recycle(&mut self) -> bool {
            true
        }
    }
    impl Drop for Parker {
        fn drop(&mut self) {
            DROPPED.fetch_add(1, Ordering::SeqCst);
            // The first value the trimmer destroys holds the race window open.
            if PARK.swap(false, Ordering::SeqCst) {
                PARKED.lock().unwrap().take().unwrap().send(()).unwrap();
                let resume = RESUME.lock().unwrap().take().unwrap();
                resume.recv().unwrap();
            }
        }
    }

    let _serial = serial();
    let a = Arc::new(RecyclingAllocator::<Parker>::with_config(
        "parker",
        Config::new().magazine_size(4),
    ));
    // Values in the depot: made here, handed over by releasing this thread's cache.
    let held: Vec<Recycled<'_, Parker>> = (0..16).map(|_| a.get()).collect();
    drop(held);
    a.release_thread_cache();
    assert!(a.stats().cached_in_depot > 0);

    let (parked_tx, parked_rx) = mpsc::channel();
    let (resume_tx, resume_rx) = mpsc::channel();
    *PARKED.lock().unwrap() = Some(parked_tx);
    *RESUME.lock().unwrap() = Some(resume_rx);
    PARK.store(true, Ordering::SeqCst);
    let trimmer = std::thread::spawn(proxalloc::trim_all);
    parked_rx.recv().unwrap(); // the trimmer owns the depot's chain and is parked
    let dropper = std::thread::spawn(move || drop(Arc::try_unwrap(a).ok().unwrap()));
    dropper.join().unwrap();
    resume_tx.send(()).unwrap();
    trimmer.join().unwrap();
    assert_eq!(
        DROPPED.load(Ordering::SeqCst),
        CREATED.load(Ordering::SeqCst),
        "every value dropped exactly once"
    );
}

/// ABA protection that safe code cannot switch off is a compile-time property
/// (`Config::generation_bits` does not exist outside the crate's loom models): see the
/// `compile_fail` example on `Config`. Here: the depot's generation no longer wraps within
/// reach of a test, so a depot-only allocator hammered from two threads never hands one
/// object out twice.
#[test]
fn depot_only_objects_are_never_handed_out_twice() {
    let _serial = serial();
    let a = ClassAllocator::<u64>::with_config(
        "depot-only-aba",
        Config::new().mode(proxalloc::CacheMode::DepotOnly),
    );
    let rounds = if cfg!(miri) { 50 } else { 20_000 };
    std::thread::scope(|s| {
        for t in 0..2u64 {
            let a = &a;
            s.spawn(move || {
                for i in 0..rounds {
                    let x = a.alloc(t << 32 | i);
                    let y = a.alloc(!(t << 32 | i));
                    assert_eq!(*x, t << 32 | i, "an object was handed out twice");
                    assert_eq!(*y, !(t << 32 | i), "an object was handed out twice");
                }
            });
        }
    });
    let s = a.stats();
    assert!(s.is_consistent() && s.live == 0, "{s}");
    assert_nothing_lost!(a, 0);
}

/// `stats()` read a cache through a reference to the whole cache while its owner held
/// `&mut` to it; `trim_all` ran meanwhile. Miri (in CI) flags the aliasing; here every
/// snapshot must also be consistent and the final accounting exact.
#[test]
fn stats_and_trim_all_run_while_another_thread_allocates() {
    static OBJECTS: ClassAllocator<[u64; 4]> = ClassAllocator::with_config(
        "stats-vs-owner",
        Config::new()
            .mode(CacheMode::ThreadCaches)
            .magazine_size(4)
            .depot_bytes(64),
    );
    let _serial = serial();
    let rounds = if cfg!(miri) { 30 } else { 20_000 };
    let stop = AtomicBool::new(false);
    std::thread::scope(|s| {
        let owner = s.spawn(|| {
            for i in 0..rounds {
                let v: Vec<_> = (0..(i % 11)).map(|j| OBJECTS.alloc([j; 4])).collect();
                drop(v);
            }
            stop.store(true, Ordering::SeqCst);
        });
        let mut last_allocs = 0;
        while !stop.load(Ordering::SeqCst) {
            let s = OBJECTS.stats();
            // A snapshot taken while the owner runs is approximate (allocs and frees
            // are read one after the other), but totals never go back.
            assert!(s.allocs >= last_allocs, "counts went back: {s}");
            last_allocs = s.allocs;
            proxalloc::trim_all();
            if cfg!(miri) {
                std::thread::yield_now();
            }
        }
        owner.join().unwrap();
    });
    let s = OBJECTS.stats();
    assert_eq!(s.live, 0, "{s}");
    assert!(s.is_consistent(), "{s}");
    assert_nothing_lost!(OBJECTS, 0);
}

/// A destructor that panics with a payload whose own `Drop` panics. The second panic used
/// to escape the destroy hook in the middle of a batch, and the batch's remaining values
/// were later destroyed again.
#[test]
fn a_panic_payload_that_panics_when_dropped_leaves_the_allocator_consistent() {
    static CREATED: AtomicUsize = AtomicUsize::new(0);
    static DROPPED: AtomicUsize = AtomicUsize::new(0);
    struct Payload;
    impl Drop for Payload {
        fn drop(&mut self) {
            panic!("the payload panics too");
        }
    }
    struct Bomb;
    impl Recycle for Bomb {
        fn create() -> Self {
            CREATED.fetch_add(1, Ordering::SeqCst);
            Bomb
        }
        fn recycle(&mut self) -> bool {
            true
        }
    }
    impl Drop for Bomb {
        fn drop(&mut self) {
            DROPPED.fetch_add(1, Ordering::SeqCst);
            std::panic::panic_any(Payload);
        }
    }
    let _serial = serial();
    let a = RecyclingAllocator::<Bomb>::with_config("bombs", Config::new().magazine_size(4));
    drop((0..10).map(|_| a.get()).collect::<Vec<_>>());
    let trimmed = catch_unwind(AssertUnwindSafe(|| a.trim()));
    assert!(trimmed.is_ok(), "a panic escaped trim");
    assert_eq!(DROPPED.load(Ordering::SeqCst), 10);
    let s = a.stats();
    assert!(s.is_consistent() && s.reserved_bytes() == 0, "{s}");
    drop(a);
    assert_eq!(
        DROPPED.load(Ordering::SeqCst),
        CREATED.load(Ordering::SeqCst)
    );
}

/// User code (a cached value's `Drop`) ran under an allocator's registry lock during
/// shutdown, thread-exit retire and the idle collector; a `Drop` that reads stats or frees
/// often enough to tick the collector deadlocked.
#[test]
#[cfg_attr(
    miri,
    ignore = "guards a deadlock, not UB; thousands of slow paths are too slow under Miri"
)]
fn destructors_that_read_stats_and_churn_other_allocators_do_not_deadlock() {
    static CHURN: ClassAllocator<u64> =
        ClassAllocator::with_config("snoop-churn", Config::new().magazine_size(1));
    static SNOOPS: AtomicUsize = AtomicUsize::new(0);
    struct Snoop;
    impl Recycle for Snoop {
        fn create() -> Self {
            Snoop
        }
        fn recycle(&mut self) -> bool {
            true
        }
    }
    impl Drop for Snoop {
        fn drop(&mut self) {
            // Every allocator's stats (each takes its registry lock) and enough slow
            // paths on another allocator to run this thread's idle collector.
            let rows = proxalloc::stats::all();
            assert!(!rows.is_empty());
            for i in 0..600 {
                drop(CHURN.alloc(i));
                let v: Vec<_> = (0..3).map(|j| CHURN.alloc(j)).collect();
                drop(v);
            }
            SNOOPS.fetch_add(1, Ordering::SeqCst);
        }
    }
    let _serial = serial();
    finishes("shutdown, retire and collector running destructors", || {
        let a = Arc::new(RecyclingAllocator::<Snoop>::with_config(
            "snoop",
            Config::new().magazine_size(2).depot_bytes(0),
        ));
        // Thread exit with values cached, then the idle collector, then shutdown.
        let a2 = Arc::clone(&a);
        std::thread::spawn(move || drop((0..6).map(|_| a2.get()).collect::<Vec<_>>()))
            .join()
            .unwrap();
        drop((0..6).map(|_| a.get()).collect::<Vec<_>>());
        for i in 0..2000 {
            drop(CHURN.alloc(i));
            let v: Vec<_> = (0..3).map(|j| CHURN.alloc(j)).collect();
            drop(v);
        }
        drop((0..6).map(|_| a.get()).collect::<Vec<_>>());
        drop(Arc::try_unwrap(a).ok().unwrap());
    });
    assert!(SNOOPS.load(Ordering::SeqCst) > 0);
}

/// A cached value owning another value of the same allocator. Destroying it (over the depot
/// budget) frees the child into the same cache, re-entering the exchange that was
/// destroying it; the outer exchange then overwrote a magazine.
#[test]
fn destroying_a_value_that_frees_into_the_same_allocator_loses_nothing() {
    static CREATED: AtomicUsize = AtomicUsize::new(0);
    static DROPPED: AtomicUsize = AtomicUsize::new(0);
    static NODES: RecyclingAllocator<Node> =
        RecyclingAllocator::with_config("nodes", Config::new().magazine_size(2).depot_bytes(0));
    struct Node {
        child: Option<Recycled<'static, Node>>,
    }
    impl Recycle for Node {
        fn create() -> Self {
            CREATED.fetch_add(1, Ordering::SeqCst);
            Node { child: None }
        }
        fn recycle(&mut self) -> bool {
            true // keeps its child: the child is freed when the node is destroyed
        }
    }
    impl Drop for Node {
        fn drop(&mut self) {
            DROPPED.fetch_add(1, Ordering::SeqCst);
        }
    }
    let _serial = serial();
    for _ in 0..if cfg!(miri) { 2 } else { 50 } {
        let parents: Vec<_> = (0..24)
            .map(|_| {
                let mut p = NODES.get();
                if p.child.is_none() {
                    p.child = Some(NODES.get());
                }
                p
            })
            .collect();
        drop(parents);
    }
    // Destroying a parent frees its child into this thread's cache again: the macro
    // trims until nothing comes back.
    assert_nothing_lost!(NODES, 0);
    assert_eq!(
        DROPPED.load(Ordering::SeqCst),
        CREATED.load(Ordering::SeqCst)
    );
}

/// `trim()` did not count objects its flush sent straight to the backing allocator (a depot
/// budget of zero).
#[test]
fn trim_counts_what_the_flush_released() {
    let _serial = serial();
    let a = ClassAllocator::<[u8; 64]>::with_config(
        "trim-counts",
        Config::new().mode(CacheMode::ThreadCaches).depot_bytes(0),
    );
    drop((0..10).map(|_| a.alloc([0; 64])).collect::<Vec<_>>());
    assert_eq!(a.stats().cached_in_threads, 10);
    assert_eq!(a.trim(), 640);
    assert_eq!(a.stats().reserved_bytes(), 0);
}

/// `trim_all` reaches other threads' caches: it asks, and each owner flushes at its next
/// slow path, on any allocator. A worker fills its thread cache of `wide`, then for each
/// of `steps`: `trim_all` runs, the worker runs `poke(step)` (its only slow paths), and
/// the worker's cache must have been flushed to the depot.
fn flush_requests_are_honoured_by(
    wide: &'static ClassAllocator<[u8; 256]>,
    steps: &[&'static str],
    mut poke: impl FnMut(usize) + Send + 'static,
) {
    let _serial = serial();
    let (cached_tx, cached_rx) = mpsc::channel();
    let (go_tx, go_rx) = mpsc::channel::<()>();
    let n = steps.len();
    let worker = std::thread::spawn(move || {
        for step in 0..n {
            drop((0..100).map(|_| wide.alloc([1; 256])).collect::<Vec<_>>());
            cached_tx.send(()).unwrap();
            go_rx.recv().unwrap();
            poke(step);
            cached_tx.send(()).unwrap();
            go_rx.recv().unwrap();
        }
    });
    for step in steps {
        cached_rx.recv().unwrap();
        let before = wide.stats();
        assert!(before.cached_in_threads >= 32, "{before}");
        proxalloc::trim_all();
        assert!(
            wide.stats().cached_in_threads > 0,
            "the worker's cache is its own"
        );
        go_tx.send(()).unwrap();
        cached_rx.recv().unwrap();
        let after = wide.stats();
        assert_eq!(
            after.cached_in_threads, 0,
            "{step} did not honour the flush request: {after}"
        );
        assert!(after.cached_in_depot > 0, "flushed into the depot: {after}");
        go_tx.send(()).unwrap();
    }
    worker.join().unwrap();
    proxalloc::trim_all();
    assert_eq!(wide.stats().reserved_bytes(), 0);
}

#[test]
fn trim_all_asks_other_threads_and_they_flush_at_their_next_slow_path() {
    static WIDE: ClassAllocator<[u8; 256]> =
        ClassAllocator::with_config("trim-all-wide", Config::new().mode(CacheMode::ThreadCaches));
    static POKE: ClassAllocator<u64> = ClassAllocator::with_config(
        "trim-all-poke",
        Config::new().mode(CacheMode::ThreadCaches).magazine_size(1),
    );
    // A fresh allocator's first use is a slow path.
    flush_requests_are_honoured_by(&WIDE, &["a thread cache's slow path"], |_| {
        drop(POKE.alloc(1))
    });
}

/// The same with a per-CPU allocator's slow paths as the only ones the worker takes: with
/// per-CPU caches the default, a thread's few thread caches (a block source's, say)
/// would otherwise wait for one of their own slow paths to honour a `trim_all`. (Where
/// per-CPU caches cannot work, the pokes are a thread cache's slow paths.)
#[test]
fn a_per_cpu_slow_path_honours_flush_requests_for_thread_caches() {
    static WIDE: ClassAllocator<[u8; 256]> = ClassAllocator::with_config(
        "trim-all-wide-2",
        Config::new().mode(CacheMode::ThreadCaches),
    );
    static POKE: ClassAllocator<u64> = ClassAllocator::with_config(
        "trim-all-poke-cpu",
        Config::new().mode(CacheMode::PerCpu).magazine_size(1),
    );
    let mut held = Vec::new();
    flush_requests_are_honoured_by(
        &WIDE,
        &[
            "a per-CPU allocation's slow path",
            "a per-CPU free's slow path",
        ],
        move |step| {
            if step == 0 {
                // A fresh per-CPU allocator: its CPU's cache is empty.
                held = (0..3).map(|i| POKE.alloc(i)).collect();
            } else {
                // Three frees into magazines of one.
                held.clear();
            }
        },
    );
}

/// A destructor run by an eviction retires this thread's cache and registers the allocator
/// again, while the slow path that ran it still holds a reference to the cache. Re-creating
/// the cache must not write the whole struct (Miri, in CI, flags that under Stacked
/// Borrows); here the accounting must also stay exact.
#[test]
fn a_destructor_that_recreates_this_threads_cache() {
    static ARM: AtomicBool = AtomicBool::new(false);
    static RE: RecyclingAllocator<Re> =
        RecyclingAllocator::with_config("recreate", Config::new().magazine_size(2).depot_bytes(0));
    struct Re(#[allow(dead_code)] u64);
    impl Recycle for Re {
        fn create() -> Self {
            Re(0)
        }
        fn recycle(&mut self) -> bool {
            true
        }
    }
    impl Drop for Re {
        fn drop(&mut self) {
            if ARM.swap(false, Ordering::SeqCst) {
                RE.release_thread_cache();
                drop(RE.get());
            }
        }
    }
    let _serial = serial();
    let v: Vec<_> = (0..6).map(|_| RE.get()).collect();
    ARM.store(true, Ordering::SeqCst);
    drop(v);
    assert!(!ARM.load(Ordering::SeqCst), "the destructor ran");
    let s = RE.stats();
    assert!(s.is_consistent(), "{s}");
    assert_eq!(s.live, 0, "{s}");
    assert_nothing_lost!(RE, 0);
}

/// An administrator beside an owner whose caches are inline and boxed: `trim_all` and
/// `stats` on one thread while another allocates and frees through 48 allocators (past
/// the 32 inline caches), under Miri too. The books are exact once the owner is done.
/// (Serial: a `trim_all` loop empties every allocator's depot and stashes, and flushes
/// its caches, which tests that count what is cached cannot have beside them.)
#[test]
fn trim_all_and_stats_beside_an_owner_with_boxed_caches() {
    let _serial = serial();
    let rounds = if cfg!(miri) { 1 } else { 200 };
    let all: Vec<ClassAllocator<u64>> = (0..48)
        .map(|_| {
            ClassAllocator::with_config("boxed-admin", Config::new().mode(CacheMode::ThreadCaches))
        })
        .collect();
    let done = AtomicBool::new(false);
    std::thread::scope(|s| {
        let owner = s.spawn(|| {
            for r in 0..rounds {
                for a in &all {
                    drop((0..4).map(|i| a.alloc(r * 4 + i)).collect::<Vec<_>>());
                }
            }
            done.store(true, Ordering::Release);
        });
        while !done.load(Ordering::Acquire) {
            proxalloc::trim_all();
            // Not a quiescent point: the snapshot may be torn, only its reading is
            // checked here (for races, under Miri); the books are checked at the end.
            for a in &all {
                std::hint::black_box(a.stats());
            }
            std::thread::yield_now();
        }
        // Joined here, not at the scope's end: a join waits for the owner's
        // thread-local teardown, which flushes its caches.
        owner.join().unwrap();
    });
    for a in &all {
        let s = a.stats();
        assert_eq!(
            (s.live, s.allocs, s.frees),
            (0, rounds * 4, rounds * 4),
            "{s}"
        );
        assert!(s.is_consistent(), "objects lost or counted twice: {s}");
        assert_nothing_lost!(a, 0);
    }
}
