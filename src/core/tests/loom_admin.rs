//! Models of administrators meeting owners: `trim_all` racing an allocator's drop,
//! `stats` racing a thread that exits or retires its cache, and shutdown racing a
//! thread's exit flush.

use loom::sync::atomic::{AtomicBool, Ordering};
use loom::sync::Arc;
use loom::thread;

use super::{allocator, churn, finish, granted, spawn_with, wait_for_exits, Admin};

/// `trim_all` holds the depot's chain (detached, being released) while the allocator is
/// dropped on another thread: each object is released exactly once.
#[test]
fn trim_all_races_the_allocators_drop() {
    loom::model(|| {
        let a = allocator(1, 8);
        churn(&a, 3);
        a.release_thread_cache(); // three one-object magazines in the depot
        let admin = Admin::of(&a);
        let trimmer = thread::spawn(move || {
            admin.trim();
        });
        drop(a);
        trimmer.join().unwrap();
    });
}

/// `stats` reads while a thread allocates and exits (its counters move from its cache
/// to the engine's under the cache-list lock): totals never go back.
#[test]
fn stats_race_a_thread_that_exits() {
    loom::model(|| {
        let a = Arc::new(allocator(1, 8));
        let worker = {
            let a = Arc::clone(&a);
            thread::spawn(move || churn(&a, 2))
        };
        let admin = Admin::of(&a);
        let first = admin.stats().unwrap();
        let second = admin.stats().unwrap();
        assert!(second.allocs >= first.allocs, "{first} then {second}");
        assert!(second.frees >= first.frees, "{first} then {second}");
        worker.join().unwrap();
        wait_for_exits(&a);
        let s = a.stats();
        assert_eq!((s.allocs, s.frees, s.live), (2, 2, 0), "{s}");
        assert!(s.is_consistent(), "{s}");
        drop(admin);
        finish(a);
    });
}

/// `stats` reads while a thread retires its cache (`release_thread_cache`: its counters
/// leave the list for the engine's): the cache is counted once, in one or the other, so
/// no read misses what an earlier one saw.
#[test]
fn stats_count_a_retiring_cache_once() {
    loom::model(|| {
        let a = Arc::new(allocator(1, 8));
        let churned = Arc::new(AtomicBool::new(false));
        let worker = {
            let (a, churned) = (Arc::clone(&a), Arc::clone(&churned));
            thread::spawn(move || {
                churn(&a, 1);
                churned.store(true, Ordering::Release);
                a.release_thread_cache();
            })
        };
        let admin = Admin::of(&a);
        // The first read after the worker's operations, so that it sees them.
        while !churned.load(Ordering::Acquire) {
            thread::yield_now();
        }
        let first = admin.stats().unwrap();
        let second = admin.stats().unwrap();
        assert!(second.allocs >= first.allocs, "{first} then {second}");
        assert!(second.frees >= first.frees, "{first} then {second}");
        worker.join().unwrap();
        let s = a.stats();
        assert_eq!((s.allocs, s.frees, s.live), (1, 1, 0), "{s}");
        drop(admin);
        finish(a);
    });
}

/// The allocator is dropped (its last reference, on whichever thread lets go last)
/// while a thread that cached objects exits: the objects go back exactly once, by the
/// exiting thread if the allocator is already gone.
#[test]
fn shutdown_races_thread_exit() {
    loom::model(|| {
        let a = Arc::new(allocator(1, 8));
        let worker = {
            let a = Arc::clone(&a);
            thread::spawn(move || {
                churn(&a, 2);
                drop(a);
            })
        };
        drop(a);
        worker.join().unwrap();
    });
}

/// `trim_idle`, twice (the second call may find the worker idle since the first and take
/// its stash, and releases the depot's cold part), while the worker grows, pops and
/// refills its stash: nothing is lost or released twice, and the grant goes back.
#[test]
fn trim_idle_takes_a_stash_and_the_cold_depot_while_the_owner_uses_them() {
    loom::model(|| {
        let a = Arc::new(allocator(1, 8));
        let admin = Admin::of(&a);
        let worker = spawn_with(&a, |a| {
            churn(a, 3);
            churn(a, 3);
            a.release_thread_cache();
        });
        admin.trim_idle();
        admin.trim_idle();
        worker.join().unwrap();
        let s = a.stats();
        assert!(s.is_consistent(), "{s}");
        assert_eq!((s.live, s.cached_in_threads), (0, 0), "{s}");
        assert_eq!(granted(), 0, "a grant was kept");
        // Nobody used the allocator since: an idle interval releases everything.
        admin.trim_idle();
        admin.trim_idle();
        let s = a.stats();
        assert_eq!(s.reserved_objects(), 0, "{s}");
        drop(admin);
        finish(a);
    });
}

/// A thread that grew a stash (it spilled a magazine, then needed it back) pushes and
/// pops it while `trim_all` takes the whole stash from another thread: nothing is lost
/// or released twice, and the grant goes back to the process-wide budget.
#[test]
fn trim_all_takes_a_stash_while_its_owner_uses_it() {
    loom::model(|| {
        let a = Arc::new(allocator(1, 8));
        let admin = Admin::of(&a);
        let worker = {
            let a = Arc::clone(&a);
            thread::spawn(move || {
                churn(&a, 3); // spills one magazine
                churn(&a, 3); // refills it: the stash may hold one; the free fills it
                churn(&a, 3); // pops the stash (unless the trimmer took it)
                a.release_thread_cache();
            })
        };
        admin.trim();
        worker.join().unwrap();
        let s = a.stats();
        assert!(s.is_consistent(), "{s}");
        assert_eq!((s.live, s.cached_in_threads), (0, 0), "{s}");
        assert_eq!(granted(), 0, "a grant was kept");
        drop(admin);
        finish(a);
    });
}
