//! Models of what an owner thread must do for others: honour a flush request at its
//! next slow path, retire a dead allocator's cache at a slow path on another
//! allocator, give back what it grew when idle, hand back its stash and spare empty
//! magazines once the allocator is gone, and keep its stash within its grant.
//!
//! Each worker looks at its own cache (`holdings`) at the points where the protocol
//! promises something and hands what it saw to the main thread, which checks it: a
//! request ignored, a cache left behind or a grant kept fails the model where it
//! happens, not only as a leak at the end. (A panic on a loom thread other than the
//! main one aborts the test binary: loom's objects cannot be dropped while it unwinds.)

use loom::sync::{mpsc, Arc};
use loom::thread;

use super::{
    allocator, bypass_allocator, churn, finish, granted, holdings, key, magazine_bytes,
    wait_for_exits, Admin, Alloc, GcPeriod, SendPtr,
};
use crate::core::table;
use crate::core::thread_cache::Holdings;
use crate::ClassBox;

/// Grows this thread's stash of `a` (one-object magazines) to its grant: spills two
/// magazines to the depot, takes both back (which grants the stash two), then frees
/// into it until it holds both.
/// Returns what the cache then holds (the caller checks it: see the module docs).
fn grow_stash(a: &Alloc) -> Holdings {
    churn(a, 4);
    churn(a, 4);
    holdings(key(&a.engine_arc())).expect("a cache")
}

/// Objects allocated on one thread, to be freed on another.
fn take(a: &Alloc, n: u64) -> Vec<SendPtr> {
    (0..n)
        .map(|i| SendPtr(ClassBox::into_raw(a.alloc(i))))
        .collect()
}

fn free_all(a: &Alloc, objects: Vec<SendPtr>) {
    for p in objects {
        // SAFETY: from `into_raw` on this allocator; this thread owns it now.
        drop(unsafe { ClassBox::from_raw(a, p.0) });
    }
}

/// One slow path on this thread (`b` caches nothing), where it sweeps its caches if
/// another thread posted flush requests or dropped an allocator.
fn slow_path(b: &Alloc) {
    drop(b.alloc(0));
}

/// The allocator is dropped while a thread holds a grown stash of it and spare empty
/// magazines kept for that stash (its objects were freed on another thread). Shutdown
/// takes the stash; the thread hands the rest back at its next slow path on another
/// allocator, which may race the drop or follow it. Nothing may be lost or released
/// twice, the grant goes back, and an empty magazine handed back is never evicted (a
/// debug assertion).
#[test]
fn drop_while_a_thread_holds_a_stash_and_empties() {
    loom::model(|| {
        let b = Arc::new(bypass_allocator());
        let a = Arc::new(allocator(1, 8));
        let (tx, rx) = mpsc::channel();
        let (dropped_tx, dropped_rx) = mpsc::channel::<()>();
        let worker = {
            let (a, b) = (Arc::clone(&a), Arc::clone(&b));
            thread::spawn(move || {
                let k = key(&a.engine_arc());
                grow_stash(&a);
                // Pops one stash magazine and keeps the empty one it replaces.
                let objects = take(&a, 3);
                let h = holdings(k).unwrap();
                drop(a);
                tx.send(objects).unwrap();
                slow_path(&b); // races the drop
                dropped_rx.recv().unwrap();
                slow_path(&b); // retires the dead allocator's cache, if not done yet
                (h, holdings(k).is_some())
            })
        };
        free_all(&a, rx.recv().unwrap());
        finish(a);
        dropped_tx.send(()).unwrap();
        let (h, kept) = worker.join().unwrap();
        assert!(h.stash >= 1 && h.empties >= 1, "setup: {h:?}");
        assert!(!kept, "a dead allocator's cache was not retired");
        assert_eq!(granted(), 0, "the stash's grant was kept");
        wait_for_exits(&b);
        finish(b);
    });
}

/// `trim_all` asks a thread to flush its cache; the thread honours the request at its
/// next slow path on any allocator, before it exits or releases anything. While the
/// request is posted, a slow path that sees its epoch must act on it (the request and
/// the epoch are ordered: a sweep that sees the epoch but misses the request would
/// leave the cache full until an idle pass).
#[test]
fn flush_request_is_honoured_at_the_next_slow_path() {
    loom::model(|| {
        let b = Arc::new(bypass_allocator());
        let a = Arc::new(allocator(1, 8));
        let (warm_tx, warm_rx) = mpsc::channel();
        let (trimmed_tx, trimmed_rx) = mpsc::channel::<()>();
        let worker = {
            let (a, b) = (Arc::clone(&a), Arc::clone(&b));
            thread::spawn(move || {
                let k = key(&a.engine_arc());
                churn(&a, 2);
                slow_path(&b); // registers with `b`
                let warm = holdings(k).unwrap();
                warm_tx.send(()).unwrap();
                slow_path(&b); // races the trim
                let racing = (table::seen_epoch() > 0).then(|| holdings(k).unwrap());
                trimmed_rx.recv().unwrap();
                slow_path(&b);
                (warm, racing, holdings(k).unwrap())
            })
        };
        warm_rx.recv().unwrap();
        Admin::of(&a).trim();
        trimmed_tx.send(()).unwrap();
        let (warm, racing, after) = worker.join().unwrap();
        assert!(!warm.is_empty(), "setup: {warm:?}");
        if let Some(h) = racing {
            assert!(h.is_empty(), "saw the flush epoch, kept the cache: {h:?}");
        }
        assert!(after.is_empty(), "flush request not honoured: {after:?}");
        wait_for_exits(&a);
        let s = a.stats();
        assert_eq!((s.live, s.cached_in_threads), (0, 0), "{s}");
        assert!(s.is_consistent(), "{s}");
        finish(a);
        finish(b);
    });
}

/// A thread's cache of an allocator that another thread drops is retired at the
/// thread's next slow path on another allocator: its objects go back to the system and
/// the table entry lets go of the engine. While the drop runs, a slow path that sees
/// its epoch must retire the cache.
#[test]
fn dead_allocators_cache_is_retired_at_another_allocators_slow_path() {
    loom::model(|| {
        let b = Arc::new(bypass_allocator());
        let a = Arc::new(allocator(1, 8));
        let engine = a.engine_arc();
        let k = key(&engine);
        let (warm_tx, warm_rx) = mpsc::channel();
        let (dropped_tx, dropped_rx) = mpsc::channel::<()>();
        let worker = {
            let (a, b) = (Arc::clone(&a), Arc::clone(&b));
            thread::spawn(move || {
                churn(&a, 2);
                drop(a);
                slow_path(&b);
                let warm = holdings(k).is_some();
                warm_tx.send(()).unwrap();
                slow_path(&b); // races the drop
                let racing = (table::seen_epoch() > 0).then(|| holdings(k).is_some());
                dropped_rx.recv().unwrap();
                slow_path(&b);
                (warm, racing, holdings(k).is_some())
            })
        };
        warm_rx.recv().unwrap();
        finish(a);
        dropped_tx.send(()).unwrap();
        let (warm, racing, kept) = worker.join().unwrap();
        assert!(warm, "setup: no cache");
        assert_ne!(racing, Some(true), "saw the drop's epoch, kept the cache");
        assert!(!kept, "a dead allocator's cache was not retired");
        // The worker's table let go of the engine and released what its cache held (the
        // worker is joined, but its thread-locals may not be gone yet: only the
        // retirement at its slow path can have done this).
        assert_eq!(
            Arc::strong_count(&engine),
            1,
            "the worker still holds the engine"
        );
        let backing = engine.backing();
        assert_eq!(backing.allocs(), backing.frees(), "objects left behind");
        drop(engine);
        finish(b);
    });
}

/// The idle collector runs (a one-slow-path period): a thread that stops using `a` gives
/// back, pass by pass, its stash and grant, then its previous and loaded magazines,
/// while `trim_all` takes the stash from another thread. Each magazine goes back once
/// and the grant returns to the budget.
#[test]
fn idle_collector_gives_back_a_stash_while_trim_all_takes_it() {
    loom::model(|| {
        let b = Arc::new(bypass_allocator());
        let a = Arc::new(allocator(1, 8));
        let mb = magazine_bytes(&a);
        let (tx, rx) = mpsc::channel();
        let worker = {
            let (a, b) = (Arc::clone(&a), Arc::clone(&b));
            thread::spawn(move || {
                let k = key(&a.engine_arc());
                let grown = grow_stash(&a);
                slow_path(&b); // registers with `b`
                tx.send(()).unwrap();
                let _period = GcPeriod::set(1);
                // One pass to see `a` idle, then one for the stash and grant, one for
                // each magazine.
                for _ in 0..4 {
                    slow_path(&b);
                }
                (grown, holdings(k).unwrap())
            })
        };
        rx.recv().unwrap();
        Admin::of(&a).trim();
        let (grown, idle) = worker.join().unwrap();
        assert_eq!((grown.stash, grown.grant), (2, 2 * mb), "setup: {grown:?}");
        assert!(idle.is_empty(), "an idle cache kept {idle:?}");
        assert_eq!(granted(), 0, "a grant was kept");
        wait_for_exits(&a);
        let s = a.stats();
        assert_eq!((s.live, s.cached_in_threads), (0, 0), "{s}");
        assert!(s.is_consistent(), "{s}");
        finish(a);
        finish(b);
    });
}

/// `trim_all` takes a stash and its grant while the owner, having checked that its grant
/// has room, pushes magazines onto the stash; the trim also asks the owner to flush.
/// Returns what the owner's cache holds afterwards: before its next slow path
/// (`next_slow_path` false) or after it.
fn stash_push_races_trim_all(next_slow_path: bool) {
    loom::model(move || {
        let b = Arc::new(bypass_allocator());
        let a = Arc::new(allocator(1, 8));
        let mb = magazine_bytes(&a);
        let (tx, rx) = mpsc::channel();
        let (done_tx, done_rx) = mpsc::channel::<()>();
        let worker = {
            let (a, b) = (Arc::clone(&a), Arc::clone(&b));
            thread::spawn(move || {
                let k = key(&a.engine_arc());
                let grown = grow_stash(&a);
                slow_path(&b); // registers with `b`
                               // Back to an empty stash and two empty magazines kept for it...
                let objects = take(&a, 4);
                tx.send(()).unwrap();
                // ...then the frees push two magazines onto the stash, racing the trim.
                free_all(&a, objects);
                done_rx.recv().unwrap();
                if next_slow_path {
                    slow_path(&b);
                }
                (grown, holdings(k).unwrap())
            })
        };
        rx.recv().unwrap();
        Admin::of(&a).trim();
        done_tx.send(()).unwrap();
        let (grown, h) = worker.join().unwrap();
        assert_eq!((grown.stash, grown.grant), (2, 2 * mb), "setup: {grown:?}");
        assert!(
            h.stash as usize * mb <= h.grant,
            "a stash beyond its grant: {h:?}"
        );
        wait_for_exits(&a);
        assert_eq!(granted(), 0, "a grant was kept");
        finish(a);
        finish(b);
    });
}

/// Once the owner has taken its next slow path after the trim, its stash is within its
/// grant: the flush request that came with the trim gave the stash back.
#[test]
fn stash_is_within_its_grant_after_the_next_slow_path() {
    stash_push_races_trim_all(true);
}

/// Even before the owner's next slow path, its stash is within its grant: a push that
/// read the stash's head before the trim took the grant and the stash fails its CAS
/// (every take changes the head, an empty stash's too) and finds the grant gone. This
/// failed ("a stash beyond its grant: stash 1, grant 0") while a take of an empty stash
/// left its head as it was.
#[test]
fn stash_is_within_its_grant_even_before_the_next_slow_path() {
    stash_push_races_trim_all(false);
}
