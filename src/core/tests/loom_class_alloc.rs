//! Models of the whole allocator: magazine exchange between threads, the depot budget,
//! trim, the thread-exit flush, cross-thread frees and the allocator's drop.
//!
//! Magazines hold one or two objects, so a handful of operations reach every slow path.
//! Object memory comes from `loom::alloc`, so an object that is never returned to the
//! backing allocator fails the model as a leak; every model also checks the accounting.

use loom::sync::Arc;
use loom::thread;

use super::{assert_conserved, churn, finish, spawn_with, wait_for_exits, SendPtr};
use crate::{ClassAllocator, ClassBox, Config};

/// An allocator as most models here use it, shared.
fn allocator(magazine: usize, depot_objects: usize) -> Arc<super::Alloc> {
    Arc::new(super::allocator(magazine, depot_objects))
}

/// Two threads use a new allocator at once: each builds an engine, one CAS publishes
/// one of them, and the loser shuts its own down. Both threads must then work through
/// the published engine, every object counted once in its stats.
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

/// A thread reads the stats of an allocator that another thread is using for the first
/// time: either may create and publish the engine, and the stats count what the other
/// did. (The ordering of `LazyArc::get` is checked in `sync`'s own models, not here:
/// every allocator path that reads the engine after `get` takes the cache-list lock
/// first, and loom's mutexes are sequentially consistent, which orders the reader after
/// the publisher even with a `Relaxed` load in `get`.)
#[test]
fn first_use_races_a_reader() {
    loom::model(|| {
        let cfg = Config::new().magazine_size(1).depot_bytes(8);
        let a = Arc::new(ClassAllocator::<u64>::with_config("loom", cfg));
        let t = spawn_with(&a, |a| churn(a, 1));
        let s = a.stats();
        assert!(s.allocs <= 1 && s.live <= 1, "{s}");
        t.join().unwrap();
        let s = a.stats();
        assert_eq!((s.allocs, s.frees), (1, 1), "{s}");
        assert_conserved(&s);
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

/// `trim` runs while a thread spills and refills. (On its own thread: loom's search
/// backtracks only to an object's last access, so a trim the main thread ran before the
/// worker started was never moved past the worker's spills; the model explored one
/// execution.)
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
        let trimmer = spawn_with(&a, |a| {
            a.trim();
        });
        worker.join().unwrap();
        trimmer.join().unwrap();
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
        wait_for_exits(&a);
        let s = a.stats();
        assert_eq!(s.cached_in_threads, 0, "{s}");
        assert_conserved(&s);
        finish(a);
    });
}

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
