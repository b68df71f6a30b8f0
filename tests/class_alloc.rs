//! Behaviour and exact accounting of `ClassAllocator` in one and many threads.

use std::collections::hash_map::DefaultHasher;
use std::hash::{Hash, Hasher};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc;
use std::sync::Arc;

use proxalloc::{AllocError, CacheMode, ClassAllocator, ClassBox, Config, Stats};

/// The invariant every quiescent snapshot satisfies: each object is in exactly one place.
fn assert_conserved(s: &Stats) {
    assert!(s.is_consistent(), "objects lost or counted twice: {s}");
}

/// After `trim` with nothing live and no thread caches left: nothing cached, every
/// backing allocation returned.
fn assert_all_returned(a: &ClassAllocator<impl Sized>) {
    a.trim();
    let s = a.stats();
    assert_conserved(&s);
    assert_eq!(s.live, 0, "{s}");
    assert_eq!(s.cached_in_threads, 0, "{s}");
    assert_eq!(s.cached_in_depot, 0, "{s}");
    assert_eq!(s.backing_allocs, s.backing_frees, "{s}");
}

/// `CacheMode::default()` follows the build: per-CPU caches with the `percpu` feature on
/// Linux x86-64, per-thread caches elsewhere, under Miri, and in ThreadSanitizer builds
/// (`proxalloc_tsan`, set by the build script from `-Zsanitizer=thread`), which compile
/// no restartable sequences: there a per-CPU allocator says it uses thread caches, and
/// per-CPU caches are not available.
#[test]
fn the_default_mode_follows_the_build() {
    let percpu_first = cfg!(all(
        feature = "percpu",
        target_os = "linux",
        target_arch = "x86_64",
        not(miri),
        not(proxalloc_loom),
        not(proxalloc_tsan)
    ));
    let expected = if percpu_first {
        CacheMode::PerCpu
    } else {
        CacheMode::ThreadCaches
    };
    assert_eq!(CacheMode::default(), expected);
    // `.ci/sanitizers` says which sanitizer runs: the build script must have seen
    // ThreadSanitizer, and only it (1: TSan, 0: another sanitizer).
    let tsan_build = cfg!(proxalloc_tsan);
    match std::env::var("PROXALLOC_TEST_EXPECT_TSAN").as_deref() {
        Ok("1") => assert!(
            tsan_build,
            "a ThreadSanitizer run whose build has no `proxalloc_tsan`: build.rs did not see -Zsanitizer=thread"
        ),
        Ok("0") => assert!(
            !tsan_build,
            "`proxalloc_tsan` in a build without ThreadSanitizer"
        ),
        _ => {}
    }
    if tsan_build {
        let a = ClassAllocator::<u64>::with_config(
            "tsan-asks-for-percpu",
            Config::new().mode(CacheMode::PerCpu),
        );
        drop(a.alloc(1));
        assert_eq!(a.mode(), CacheMode::ThreadCaches);
        assert!(!proxalloc::stats::percpu_status().available);
    }
}

#[test]
fn single_thread_accounting_is_exact() {
    let a = ClassAllocator::<[u64; 8]>::with_config("single", Config::new().magazine_size(16));
    let mut expected_allocs = 0;
    for batch in [1usize, 15, 16, 17, 100, 1000, 3] {
        let v: Vec<_> = (0..batch).map(|i| a.alloc([i as u64; 8])).collect();
        expected_allocs += batch as u64;
        let s = a.stats();
        assert_eq!((s.allocs, s.live), (expected_allocs, batch as u64));
        assert_conserved(&s);
        for (i, h) in v.iter().enumerate() {
            assert_eq!(h[0], i as u64, "object overwritten");
        }
        drop(v);
        assert_eq!(a.stats().live, 0);
    }
    let s = a.stats();
    assert!(
        s.refills > 0 && s.spills > 0,
        "the depot was never used: {s}"
    );
    assert!(
        s.backing_allocs < expected_allocs,
        "nothing was reused: {s}"
    );
    assert_all_returned(&a);
}

#[test]
fn freed_objects_are_reused_lifo() {
    // Per-thread caches: a CPU's cache is LIFO too, but the thread may move between CPUs.
    let a = ClassAllocator::<u64>::with_config("lifo", Config::new().mode(CacheMode::ThreadCaches));
    let p = ClassBox::as_ptr(&a.alloc(1));
    let q = ClassBox::as_ptr(&a.alloc(2));
    assert_eq!(p, q, "the object just freed is handed out next");
}

#[test]
fn values_are_dropped_exactly_once() {
    static DROPS: AtomicUsize = AtomicUsize::new(0);
    struct Counted(#[allow(dead_code)] u32);
    impl Drop for Counted {
        fn drop(&mut self) {
            DROPS.fetch_add(1, Ordering::Relaxed);
        }
    }
    let a = ClassAllocator::<Counted>::new("drops");
    let v: Vec<_> = (0..500).map(|i| a.alloc(Counted(i))).collect();
    drop(v);
    assert_eq!(DROPS.load(Ordering::Relaxed), 500);
    let inner = ClassBox::into_inner(a.alloc(Counted(1)));
    assert_eq!(
        DROPS.load(Ordering::Relaxed),
        500,
        "into_inner must not drop"
    );
    drop(inner);
    assert_eq!(DROPS.load(Ordering::Relaxed), 501);
    assert_eq!(a.stats().live, 0);
}

#[test]
fn raw_round_trip_and_leak() {
    let a = ClassAllocator::<String>::new("raw");
    let raw = ClassBox::into_raw(a.alloc("hello".to_string()));
    assert_eq!(a.stats().live, 1);
    // SAFETY: from `into_raw` on this allocator, owned by nobody else.
    let back = unsafe { ClassBox::from_raw(&a, raw) };
    assert_eq!(*back, "hello");
    drop(back);
    assert_eq!(a.stats().live, 0);
    let leaked: &mut String = ClassBox::leak(a.alloc("leak".into()));
    leaked.push('!');
    assert_eq!(leaked, "leak!");
    assert_eq!(a.stats().live, 1, "a leaked object stays live");
    // SAFETY: the leaked pointer came from this allocator and is not used again.
    drop(unsafe { ClassBox::from_raw(&a, std::ptr::NonNull::from(leaked)) });
    assert_all_returned(&a);
}

#[test]
fn handle_forwards_traits() {
    let a = ClassAllocator::<String>::new("traits");
    let x = a.alloc("abc".to_string());
    let y = a.alloc("abc".to_string());
    let z = a.alloc("abd".to_string());
    assert_eq!(x, y);
    assert!(x < z);
    assert_eq!(format!("{x}|{x:?}"), "abc|\"abc\"");
    let hash = |v: &dyn Fn(&mut DefaultHasher)| {
        let mut h = DefaultHasher::new();
        v(&mut h);
        h.finish()
    };
    assert_eq!(hash(&|h| x.hash(h)), hash(&|h| "abc".to_string().hash(h)));
    assert_eq!(ClassBox::allocator(&x).name(), "traits");
}

#[test]
fn zero_sized_and_over_aligned_types() {
    #[repr(align(64))]
    struct Line([u8; 64]);
    #[repr(align(4096))]
    struct Page([u8; 4096]);
    #[derive(Debug, PartialEq)]
    struct Unit;

    let units = ClassAllocator::<Unit>::new("units");
    let v: Vec<_> = (0..300).map(|_| units.alloc(Unit)).collect();
    assert!(v.iter().all(|u| **u == Unit));
    drop(v);
    assert_all_returned(&units);

    let lines = ClassAllocator::<Line>::new("lines");
    let pages = ClassAllocator::<Page>::new("pages");
    for round in 0..3 {
        let l: Vec<_> = (0..200).map(|i| lines.alloc(Line([i as u8; 64]))).collect();
        let p: Vec<_> = (0..40)
            .map(|i| pages.alloc(Page([i as u8; 4096])))
            .collect();
        for (i, x) in l.iter().enumerate() {
            assert_eq!(ClassBox::as_ptr(x) as usize % 64, 0, "round {round}");
            assert_eq!(x.0[63], i as u8);
        }
        for (i, x) in p.iter().enumerate() {
            assert_eq!(ClassBox::as_ptr(x) as usize % 4096, 0, "round {round}");
            assert_eq!(x.0[4095], i as u8);
        }
    }
    assert_all_returned(&lines);
    assert_all_returned(&pages);
}

#[test]
#[cfg_attr(miri, ignore = "Miri's allocator grants any size")]
fn try_alloc_reports_failure_and_the_allocator_stays_usable() {
    let huge = ClassAllocator::<[u8; 1 << 44]>::new("huge");
    // SAFETY: `init` is never called: the allocation fails. (`try_alloc_with` would
    // need a 16 TiB stack slot for its return value in debug builds.)
    let r = unsafe { huge.try_alloc_in_place(|_| unreachable!()) };
    assert_eq!(r.err(), Some(AllocError));
    let s = huge.stats();
    assert_eq!((s.allocs, s.backing_allocs), (0, 0), "{s}");

    let small = ClassAllocator::<u32>::new("small");
    assert_eq!(*small.try_alloc(5).unwrap(), 5);
}

/// A value whose destructor panics when it holds `true`.
struct Bomb(bool);

impl Drop for Bomb {
    fn drop(&mut self) {
        if self.0 {
            panic!("boom in drop");
        }
    }
}

/// A constructor that panics, then a destructor that panics, through `alloc_with` and
/// `free` (with one other object of `a` live): each object goes back to the cache, and
/// the counts stay exact.
fn panics_recycle_their_objects<'a>(
    a: &'a ClassAllocator<Bomb>,
    alloc_with: impl Fn(&dyn Fn() -> Bomb) -> ClassBox<'a, Bomb>,
    free: impl Fn(ClassBox<'a, Bomb>),
) {
    let r = catch_unwind(AssertUnwindSafe(|| alloc_with(&|| panic!("boom in new"))));
    assert!(r.is_err());
    let s = a.stats();
    assert_eq!(
        s.live, 1,
        "the object of a failed constructor is recycled: {s}"
    );
    assert_conserved(&s);

    let armed = alloc_with(&|| Bomb(true));
    let r = catch_unwind(AssertUnwindSafe(|| free(armed)));
    assert!(r.is_err());
    let s = a.stats();
    assert_eq!(
        s.live, 1,
        "the object of a panicking destructor is recycled: {s}"
    );
    assert_conserved(&s);
}

#[test]
fn panicking_constructor_and_destructor_leave_counts_right() {
    let a = ClassAllocator::<Bomb>::new("bombs");
    let keep = a.alloc(Bomb(false));
    panics_recycle_their_objects(&a, |f| a.alloc_with(f), drop);
    let again: Vec<_> = (0..100).map(|_| a.alloc(Bomb(false))).collect();
    assert_eq!(a.stats().live, 101);
    drop(again);
    drop(keep);
    assert_all_returned(&a);
}

#[test]
fn depot_budget_bounds_what_is_cached() {
    // 64 B objects, 8 per magazine, a depot budget of 4 magazines.
    let cfg = Config::new()
        .mode(CacheMode::ThreadCaches)
        .magazine_size(8)
        .depot_bytes(4 * 8 * 64);
    let a = ClassAllocator::<[u8; 64]>::with_config("budget", cfg);
    let v: Vec<_> = (0..if cfg!(miri) { 500 } else { 10_000 })
        .map(|_| a.alloc([0; 64]))
        .collect();
    drop(v);
    let s = a.stats();
    assert_conserved(&s);
    assert!(s.cached_in_depot <= 32, "{s}");
    assert!(s.cached_in_threads <= 16, "{s}");
    assert!(s.overflows > 0, "{s}");
    assert_eq!(
        s.reserved_objects(),
        s.cached_in_depot + s.cached_in_threads
    );
    assert_all_returned(&a);
}

#[test]
fn thread_cache_bound_shrinks_magazines_of_large_objects() {
    let cfg = Config::new()
        .mode(CacheMode::ThreadCaches)
        .magazine_size(64)
        .thread_cache_bytes(8 * 1024);
    let a = ClassAllocator::<[u8; 1024]>::with_config("big", cfg);
    drop((0..100).map(|_| a.alloc([0; 1024])).collect::<Vec<_>>());
    let s = a.stats();
    assert!(
        s.cached_in_threads <= 8,
        "two magazines of four 1 KiB objects: {s}"
    );
    assert_conserved(&s);
    assert_all_returned(&a);
}

#[test]
fn bypass_and_depot_only_modes_account_exactly() {
    for mode in [CacheMode::Bypass, CacheMode::DepotOnly] {
        let a = ClassAllocator::<u64>::with_config("mode", Config::new().mode(mode));
        assert_eq!(a.mode(), mode);
        for _ in 0..3 {
            drop((0..100).map(|i| a.alloc(i)).collect::<Vec<_>>());
        }
        let s = a.stats();
        assert_eq!(
            (s.allocs, s.frees, s.cached_in_threads),
            (300, 300, 0),
            "{mode:?}: {s}"
        );
        match mode {
            CacheMode::Bypass => assert_eq!(s.backing_allocs, 300),
            _ => assert_eq!(s.backing_allocs, 100, "depot-only reuses through the depot"),
        }
        assert_all_returned(&a);
    }
}

#[test]
fn local_cache_allocates_and_frees() {
    let a = ClassAllocator::<[u32; 4]>::with_config("local", Config::new().magazine_size(8));
    let kept = a.with_local(|c| {
        let mut kept = Vec::new();
        for i in 0..1000u32 {
            let x = c.alloc([i; 4]);
            if i % 10 == 0 {
                kept.push(x);
            } else {
                c.free(x);
            }
        }
        kept
    });
    assert_eq!(a.stats().live, 100);
    assert!(kept.iter().enumerate().all(|(i, x)| x[3] == 10 * i as u32));
    drop(kept);
    assert_all_returned(&a);
}

#[test]
#[should_panic(expected = "different allocator")]
fn local_cache_rejects_foreign_objects() {
    let a = ClassAllocator::<u8>::new("a");
    let b = ClassAllocator::<u8>::new("b");
    let x = b.alloc(1);
    a.with_local(|c| c.free(x));
}

/// As `panicking_constructor_and_destructor_leave_counts_right`, through a `LocalCache`:
/// the object of a constructor or destructor that panics goes back to the cache.
#[test]
fn local_cache_recycles_the_objects_of_panicking_constructors_and_destructors() {
    // Uncapped: a capped allocator's `LocalCache` takes the allocator's own paths.
    let a = ClassAllocator::<Bomb>::new("local-bombs");
    a.with_local(|c| {
        let keep = c.alloc(Bomb(false));
        panics_recycle_their_objects(&a, |f| c.alloc_with(f), |x| c.free(x));
        c.free(keep);
    });
    assert_all_returned(&a);
}

#[test]
fn release_thread_cache_inside_with_local_only_flushes() {
    let a = ClassAllocator::<u64>::new("pinned");
    a.with_local(|c| {
        let x = c.alloc(1);
        c.free(x);
        a.release_thread_cache();
        let y = c.alloc(2);
        c.free(y);
    });
    a.release_thread_cache();
    assert_eq!(a.stats().threads, 0);
    assert_all_returned(&a);
}

#[test]
fn cross_thread_frees_account_exactly() {
    const BATCHES: u64 = if cfg!(miri) { 10 } else { 200 };
    let a = ClassAllocator::<[u64; 4]>::with_config("cross", Config::new().magazine_size(8));
    let (tx, rx) = mpsc::sync_channel::<Vec<ClassBox<'_, [u64; 4]>>>(4);
    std::thread::scope(|s| {
        s.spawn(|| {
            for batch in 0..BATCHES {
                tx.send((0..64).map(|i| a.alloc([batch, i, 0, 0])).collect())
                    .unwrap();
            }
            drop(tx);
            a.release_thread_cache();
        });
        s.spawn(|| {
            let mut expect = 0;
            for batch in rx {
                for (i, x) in batch.iter().enumerate() {
                    assert_eq!((x[0], x[1]), (expect, i as u64));
                }
                expect += 1;
            }
            assert_eq!(expect, BATCHES);
            a.release_thread_cache();
        });
    });
    let s = a.stats();
    assert_eq!(
        (s.allocs, s.frees, s.threads),
        (64 * BATCHES, 64 * BATCHES, 0),
        "{s}"
    );
    assert!(
        s.refills > 0,
        "the producer refilled from the consumer's spills: {s}"
    );
    assert_all_returned(&a);
}

#[test]
fn exiting_thread_gives_its_cache_back() {
    let a = Arc::new(ClassAllocator::<u64>::with_config(
        "exit",
        Config::new().mode(CacheMode::ThreadCaches),
    ));
    let a2 = Arc::clone(&a);
    std::thread::spawn(move || drop((0..100).map(|i| a2.alloc(i)).collect::<Vec<_>>()))
        .join()
        .unwrap();
    let s = a.stats();
    assert_eq!(
        s.threads, 0,
        "the exiting thread unregistered its cache: {s}"
    );
    assert_eq!(s.cached_in_threads, 0, "{s}");
    assert_eq!(s.cached_in_depot, 100, "its objects are in the depot: {s}");
    assert_conserved(&s);
    assert_all_returned(&a);
}

#[test]
fn free_during_thread_local_teardown_does_not_panic_or_leak() {
    static LATE: ClassAllocator<Vec<u8>> = ClassAllocator::new("late");
    struct FreesOnExit(Option<ClassBox<'static, Vec<u8>>>);
    impl Drop for FreesOnExit {
        fn drop(&mut self) {
            // Whether or not proxalloc's own thread-local is gone yet, this must work.
            drop(self.0.take());
            drop(LATE.alloc(vec![1]));
        }
    }
    thread_local! {
        static HOLDER: std::cell::RefCell<FreesOnExit> = const { std::cell::RefCell::new(FreesOnExit(None)) };
    }
    for _ in 0..4 {
        std::thread::spawn(|| {
            let x = LATE.alloc(vec![1, 2, 3]);
            HOLDER.with(|h| h.borrow_mut().0 = Some(x));
        })
        .join()
        .unwrap();
    }
    let s = LATE.stats();
    assert_eq!((s.allocs, s.frees, s.live), (8, 8, 0), "{s}");
    assert_conserved(&s);
    assert_all_returned(&LATE);
}

/// Allocators past a thread's inline caches have boxed caches, whose addresses the
/// thread's table also keeps for the boxed lookup; the thread-exit teardown frees the
/// boxes, and an allocation from a later thread-local destructor must find none of them
/// (Miri and ASan, which run this binary, see a use of a freed box). 140 allocators
/// alive at once cover the indices whose addresses the table keeps and those past them.
#[test]
fn boxed_caches_are_out_of_reach_after_the_thread_exit_teardown() {
    static ALL: std::sync::OnceLock<Vec<ClassAllocator<u64>>> = std::sync::OnceLock::new();
    struct UsesAllOnExit;
    impl Drop for UsesAllOnExit {
        fn drop(&mut self) {
            for a in ALL.get().unwrap() {
                let b = a.alloc(7);
                assert_eq!(*b, 7);
            }
        }
    }
    thread_local! {
        static LATE: UsesAllOnExit = const { UsesAllOnExit };
    }
    let all = ALL.get_or_init(|| {
        (0..140)
            .map(|_| ClassAllocator::new("boxed-exit"))
            .collect()
    });
    std::thread::spawn(|| {
        // Registered before the thread's first allocation arms the teardown, so
        // destroyed after it.
        LATE.with(|_| ());
        for a in ALL.get().unwrap() {
            drop((0..3).map(|i| a.alloc(i)).collect::<Vec<_>>());
        }
    })
    .join()
    .unwrap();
    for a in all {
        let s = a.stats();
        assert_eq!((s.live, s.threads), (0, 0), "{s}");
        assert_eq!(s.allocs, 4, "{s}");
        assert_conserved(&s);
        assert_all_returned(a);
    }
}

/// A small deterministic generator, so failures reproduce.
struct XorShift(u64);
impl XorShift {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
}

#[test]
fn many_threads_random_ops_match_a_model() {
    const THREADS: usize = 16;
    let ops = if cfg!(miri) { 200 } else { 20_000 };
    let a = ClassAllocator::<[u64; 3]>::with_config(
        "stress",
        Config::new().magazine_size(8).depot_bytes(64 * 24),
    );
    let channels: Vec<_> = (0..THREADS)
        .map(|_| mpsc::channel::<ClassBox<'_, [u64; 3]>>())
        .collect();
    let senders: Vec<_> = channels.iter().map(|(tx, _)| tx.clone()).collect();
    let totals: Vec<(u64, u64)> = std::thread::scope(|s| {
        let handles: Vec<_> = channels
            .into_iter()
            .enumerate()
            .map(|(t, (_, rx))| {
                let senders = senders.clone();
                let a = &a;
                s.spawn(move || {
                    let mut rng = XorShift(0x9E37_79B9_7F4A_7C15 ^ (t as u64 + 1));
                    // The model: every object we hold carries (thread, serial, checksum).
                    let mut held: Vec<ClassBox<'_, [u64; 3]>> = Vec::new();
                    let (mut allocs, mut frees) = (0u64, 0u64);
                    for serial in 0..ops {
                        held.extend(rx.try_iter());
                        let r = rng.next();
                        match r % 8 {
                            0..=3 => {
                                let v = [t as u64, serial, (t as u64) ^ serial];
                                held.push(a.alloc(v));
                                allocs += 1;
                            }
                            4..=5 if !held.is_empty() => {
                                let x = held.swap_remove((r >> 8) as usize % held.len());
                                assert_eq!(x[0] ^ x[1], x[2], "object corrupted");
                                drop(x);
                                frees += 1;
                            }
                            6 if !held.is_empty() => {
                                let x = held.swap_remove((r >> 8) as usize % held.len());
                                let _ = senders[(r >> 40) as usize % THREADS].send(x);
                            }
                            _ => {}
                        }
                    }
                    drop(senders);
                    (allocs, frees, held)
                })
            })
            .collect();
        drop(senders);
        let results: Vec<_> = handles.into_iter().map(|h| h.join().unwrap()).collect();
        results
            .into_iter()
            .map(|(allocs, mut frees, held)| {
                for x in held {
                    assert_eq!(x[0] ^ x[1], x[2], "object corrupted");
                    frees += 1;
                }
                (allocs, frees)
            })
            .collect()
    });
    let allocs: u64 = totals.iter().map(|t| t.0).sum();
    let frees: u64 = totals.iter().map(|t| t.1).sum();
    let s = a.stats();
    assert!(frees <= allocs);
    assert_eq!(s.allocs, allocs, "{s}");
    assert_conserved(&s);
    // Objects still in channels were dropped with them (counted by the allocator only).
    assert_eq!(s.live, 0, "{s}");
    assert_eq!(s.frees, s.allocs);
    assert_all_returned(&a);
}

#[test]
fn idle_thread_cache_drains_gradually() {
    let idle = ClassAllocator::<[u64; 2]>::with_config(
        "idle",
        Config::new().mode(CacheMode::ThreadCaches).magazine_size(8),
    );
    let busy = ClassAllocator::<u64>::with_config(
        "busy",
        Config::new().mode(CacheMode::ThreadCaches).magazine_size(4),
    );
    std::thread::scope(|s| {
        s.spawn(|| {
            drop((0..14).map(|i| idle.alloc([i; 2])).collect::<Vec<_>>());
            let cached = |a: &ClassAllocator<[u64; 2]>| a.stats().cached_in_threads;
            assert!(
                cached(&idle) > 8,
                "both magazines hold objects: {}",
                idle.stats()
            );
            // Churn on another allocator: each batch of 64 crosses magazine boundaries,
            // so the slow path runs (and ticks the idle collector) often.
            let mut passes = 0;
            while cached(&idle) > 0 {
                for _ in 0..16 {
                    drop((0..64).map(|i| busy.alloc(i)).collect::<Vec<_>>());
                }
                passes += 1;
                assert!(
                    passes < 100,
                    "the idle cache never drained: {}",
                    idle.stats()
                );
            }
            let s = idle.stats();
            assert_eq!(s.cached_in_depot, 14, "{s}");
            assert_eq!(
                s.threads, 1,
                "the cache stays registered, only emptied: {s}"
            );
            // A drained cache still works.
            drop(idle.alloc([0; 2]));
            idle.release_thread_cache();
            busy.release_thread_cache();
        });
    });
}
