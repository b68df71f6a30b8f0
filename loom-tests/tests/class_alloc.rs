//! Models of the whole allocator: magazine exchange between threads, the depot budget,
//! trim, the thread-exit flush, cross-thread frees and the allocator's drop.
//!
//! Magazines hold one or two objects, so a handful of operations reach every slow path.
//! Object memory comes from `loom::alloc`, so an object that is never returned to the
//! backing allocator fails the model as a leak; every model also checks the accounting.
#![cfg(proxalloc_loom)]

use std::ptr::NonNull;

use loom::sync::Arc;
use loom::thread;
use proxalloc::{ClassAllocator, ClassBox, Config, Stats};

type Alloc = ClassAllocator<u64>;

fn allocator(magazine: usize, depot_objects: usize) -> Arc<Alloc> {
    let cfg = Config::new()
        .magazine_size(magazine)
        .depot_bytes(depot_objects * 8);
    let a = ClassAllocator::with_config("loom", cfg);
    // Creates the engine here, before any thread starts: the race to create it is
    // modelled once, in `first_use_from_two_threads_publishes_one_engine`, not in every
    // model.
    a.mode();
    Arc::new(a)
}

/// Every object is in exactly one place.
fn assert_conserved(s: &Stats) {
    assert!(s.is_consistent(), "objects lost or counted twice: {s}");
}

/// Allocates `n` objects, checks none is handed out twice, frees them.
fn churn(a: &Alloc, n: u64) {
    let v: Vec<_> = (0..n).map(|i| a.alloc(i)).collect();
    for (i, x) in v.iter().enumerate() {
        assert_eq!(**x, i as u64, "an object was handed out twice");
    }
}

/// Drops the allocator (the last reference) so its shutdown runs inside the model.
fn finish(a: Arc<Alloc>) {
    let Ok(a) = Arc::try_unwrap(a) else {
        panic!("a thread kept the allocator")
    };
    drop(a);
}

fn spawn_with(a: &Arc<Alloc>, f: impl FnOnce(&Alloc) + Send + 'static) -> thread::JoinHandle<()> {
    let a = Arc::clone(a);
    thread::spawn(move || f(&a))
}

/// Two threads use a new allocator at once: each builds an engine, one CAS publishes
/// one of them, and the loser shuts its own down. Both threads must then work through
/// the published engine, every object counted once in its stats. (Loom does reach the
/// losing path here. It does not report a `Relaxed` load of the engine pointer in
/// `LazyArc::get`, tried: that ordering rests on the argument written at `sync::LazyArc`.)
#[test]
fn first_use_from_two_threads_publishes_one_engine() {
    loom::model(|| {
        let cfg = Config::new().magazine_size(1).depot_bytes(8);
        let a = Arc::new(ClassAllocator::<u64>::with_config("loom", cfg));
        let t = spawn_with(&a, |a| churn(a, 1));
        churn(&a, 1);
        t.join().unwrap();
        let s = a.stats();
        assert_conserved(&s);
        assert_eq!(s.live, 0);
        finish(a);
    });
}

/// A producer fills and spills magazines while a consumer refills from the depot.
#[test]
fn producer_spills_while_consumer_refills() {
    loom::model(|| {
        let a = allocator(1, 8);
        let producer = spawn_with(&a, |a| {
            churn(a, 3);
            a.release_thread_cache();
        });
        let consumer = spawn_with(&a, |a| {
            churn(a, 2);
            a.release_thread_cache();
        });
        producer.join().unwrap();
        consumer.join().unwrap();
        let s = a.stats();
        assert_eq!((s.allocs, s.live, s.threads), (5, 0, 0), "{s}");
        assert_conserved(&s);
        finish(a);
    });
}

/// Two threads spill past a one-magazine budget: the depot never holds more than the
/// budget, and overflow goes back to the backing allocator (the leak check sees it).
#[test]
fn spills_over_budget_from_two_threads() {
    loom::model(|| {
        let a = allocator(1, 1);
        let workers: Vec<_> = (0..2)
            .map(|_| {
                spawn_with(&a, |a| {
                    churn(a, 3);
                    assert!(a.stats().cached_in_depot <= 1, "over budget");
                    a.release_thread_cache();
                })
            })
            .collect();
        for w in workers {
            w.join().unwrap();
        }
        let s = a.stats();
        assert!(s.cached_in_depot <= 1, "{s}");
        assert_eq!(s.cached_in_threads, 0, "{s}");
        assert!(s.overflows > 0, "{s}");
        assert_conserved(&s);
        finish(a);
    });
}

/// `trim` runs while a thread spills and refills.
#[test]
fn trim_races_spills_and_refills() {
    loom::model(|| {
        let a = allocator(1, 8);
        let worker = spawn_with(&a, |a| {
            churn(a, 3);
            a.release_thread_cache();
            churn(a, 1);
            a.release_thread_cache();
        });
        a.trim();
        worker.join().unwrap();
        assert_conserved(&a.stats());
        a.trim();
        let s = a.stats();
        assert_eq!((s.cached_in_depot, s.cached_in_threads), (0, 0), "{s}");
        assert_eq!(s.backing_allocs, s.backing_frees, "{s}");
        finish(a);
    });
}

/// A thread exits (its thread-local destructor flushes its cache) while another thread
/// allocates. After both are joined no thread cache is left and nothing is lost.
#[test]
fn thread_exit_flush_races_allocation() {
    loom::model(|| {
        let a = allocator(1, 8);
        let exiting = spawn_with(&a, |a| churn(a, 3));
        let other = spawn_with(&a, |a| {
            churn(a, 2);
            a.release_thread_cache();
        });
        exiting.join().unwrap();
        other.join().unwrap();
        // loom's `join` returns before the joined thread's thread-local destructors run
        // (std's waits for them), so wait for the flush to unregister the cache; each
        // yield lets the exiting thread run, so a bounded wait suffices.
        let mut waits = 0;
        while a.stats().threads > 0 {
            waits += 1;
            assert!(waits < 50, "the exiting thread's cache was never flushed");
            thread::yield_now();
        }
        let s = a.stats();
        assert_eq!(s.cached_in_threads, 0, "{s}");
        assert_conserved(&s);
        finish(a);
    });
}

/// A raw pointer that may cross threads (the object it points to is `Send`).
struct SendPtr(NonNull<u64>);
// SAFETY: it points to a `u64` owned by whoever holds the `SendPtr`.
unsafe impl Send for SendPtr {}

/// A handle allocated on one thread is dropped on another, into that thread's cache.
#[test]
fn cross_thread_free_of_a_handle() {
    loom::model(|| {
        let a = allocator(2, 8);
        let a1 = Arc::clone(&a);
        let made = thread::spawn(move || {
            let v: Vec<SendPtr> = (0..3)
                .map(|i| SendPtr(ClassBox::into_raw(a1.alloc(40 + i))))
                .collect();
            churn(&a1, 1);
            v
        });
        let ptrs = made.join().unwrap();
        let a2 = Arc::clone(&a);
        let freer = thread::spawn(move || {
            for (i, p) in ptrs.into_iter().enumerate() {
                // SAFETY: from `into_raw` on this allocator; this thread owns it now.
                let h = unsafe { ClassBox::from_raw(&*a2, p.0) };
                assert_eq!(*h, 40 + i as u64);
            }
            churn(&a2, 2);
        });
        freer.join().unwrap();
        let s = a.stats();
        assert_eq!((s.allocs, s.frees, s.live), (6, 6, 0), "{s}");
        assert_conserved(&s);
        finish(a);
    });
}

/// The allocator is dropped after its threads have joined, with objects left in the
/// depot: shutdown must return every object (the leak check fails otherwise).
#[test]
fn drop_after_join_returns_everything() {
    loom::model(|| {
        let a = allocator(1, 8);
        let workers: Vec<_> = (0..2).map(|_| spawn_with(&a, |a| churn(a, 2))).collect();
        for w in workers {
            w.join().unwrap();
        }
        assert_conserved(&a.stats());
        finish(a);
    });
}

/// The allocator is dropped while a thread that used it is still running (it holds a
/// cache but no reference): shutdown and that thread's exit flush race.
#[test]
fn drop_races_thread_exit() {
    loom::model(|| {
        let a = allocator(1, 8);
        let a1 = Arc::clone(&a);
        let (tx, rx) = loom::sync::mpsc::channel::<()>();
        let worker = thread::spawn(move || {
            churn(&a1, 2);
            drop(a1);
            tx.send(()).unwrap();
        });
        rx.recv().unwrap();
        finish(a);
        worker.join().unwrap();
    });
}
