use super::Hints;
use crate::core::idle::MIN_IDLE_INTERVAL_OVERRIDE;
use crate::core::table::{self, Lookup};
use crate::core::thread_cache::Holdings;
use crate::{CacheMode, ClassAllocator, Config};
use std::sync::mpsc;
use std::time::Duration;

/// Unset hints read as an instance no engine has, and find no cache.
#[test]
fn unset_hints_match_no_cache() {
    let unset = Hints::unset();
    assert_eq!(unset.offset_and_instance(), (0, u64::MAX));
    assert!(unset.alloc().is_none());
}

/// What a worker thread is told to do with the allocator.
enum Step {
    /// Allocate this many objects and free them.
    Round(usize),
    /// Allocate this many objects and keep them (no free).
    Keep(usize),
    /// Free the kept objects.
    Free,
    /// Report what its cache holds.
    Report,
}

/// Longer than `MIN_IDLE_INTERVAL`, so that the next `trim_idle` counts.
fn pause() {
    std::thread::sleep(crate::core::idle::MIN_IDLE_INTERVAL * 3);
}

/// `trim_idle` takes the stash of a cache that made no operation since the previous
/// call (and asks its owner to flush), and leaves a busy cache's, also one that only
/// allocated or only freed; the first call only starts the interval, and one sooner
/// than the minimum interval does nothing.
#[test]
fn trim_idle_takes_the_stash_of_an_idle_cache_only() {
    let a = ClassAllocator::<[u8; 64]>::with_config(
        "cache-trim-idle",
        Config::new().mode(CacheMode::ThreadCaches).magazine_size(8),
    );
    let e = a.engine_arc();
    let key = (e.index(), e.instance());
    std::thread::scope(|s| {
        let worker = |steps: mpsc::Receiver<Step>, reports: mpsc::Sender<Holdings>| {
            let a = &a;
            move || {
                let mut kept = Vec::new();
                for step in steps {
                    match step {
                        Step::Round(n) => {
                            drop((0..n).map(|_| a.alloc([0; 64])).collect::<Vec<_>>())
                        }
                        Step::Keep(n) => kept.extend((0..n).map(|_| a.alloc([0; 64]))),
                        Step::Free => kept.clear(),
                        Step::Report => match table::lookup(key.0, key.1) {
                            Lookup::Cache(c) => reports.send(c.holdings()).unwrap(),
                            _ => panic!("the worker has no cache"),
                        },
                    }
                }
            }
        };
        let (idle_steps, idle_rx) = mpsc::channel();
        let (busy_steps, busy_rx) = mpsc::channel();
        let (idle_tx, idle_reports) = mpsc::channel();
        let (busy_tx, busy_reports) = mpsc::channel();
        let idle_worker = s.spawn(worker(idle_rx, idle_tx));
        let busy_worker = s.spawn(worker(busy_rx, busy_tx));
        let report = |steps: &mpsc::Sender<Step>, reports: &mpsc::Receiver<Holdings>| {
            steps.send(Step::Report).unwrap();
            reports.recv().unwrap()
        };
        // A first round spills; the second refills, which grants the stash room
        // for what the next frees spill.
        for steps in [&idle_steps, &busy_steps] {
            for _ in 0..3 {
                steps.send(Step::Round(400)).unwrap();
            }
        }
        let idle = report(&idle_steps, &idle_reports);
        let busy = report(&busy_steps, &busy_reports);
        assert!(idle.stash > 0 && busy.stash > 0, "{idle:?} {busy:?}");
        assert_eq!(a.trim_idle(), 0, "the first call only starts the interval");
        assert_eq!(report(&idle_steps, &idle_reports), idle);
        pause();
        busy_steps.send(Step::Round(400)).unwrap();
        let busy = report(&busy_steps, &busy_reports);
        let in_depot = a.stats().cached_in_depot;
        let released = a.trim_idle();
        let from_depot = in_depot - a.stats().cached_in_depot;
        let idle_after = report(&idle_steps, &idle_reports);
        let busy_after = report(&busy_steps, &busy_reports);
        assert_eq!(
            (
                idle_after.stash,
                idle_after.grant,
                idle_after.flush_requested
            ),
            (0, 0, true),
            "the idle cache's stash"
        );
        assert_eq!(busy_after, busy, "the busy cache was left as it was");
        assert_eq!(
            released,
            (idle.stash as usize * 8 + from_depot as usize) * 64,
            "the idle stash, whole, and the depot's cold part"
        );
        // Too soon after the call above (the minimum interval made an hour for this
        // one call, so that no clock decides): the busy cache, which made no
        // operation since, keeps its stash.
        MIN_IDLE_INTERVAL_OVERRIDE.with(|o| o.set(Some(Duration::from_secs(3600))));
        let too_soon = a.trim_idle();
        MIN_IDLE_INTERVAL_OVERRIDE.with(|o| o.set(None));
        assert_eq!(too_soon, 0);
        assert_eq!(report(&busy_steps, &busy_reports), busy);
        // A cache that only allocates, then one that only frees, is busy too.
        for step in [Step::Keep(300), Step::Free] {
            pause();
            busy_steps.send(step).unwrap();
            let busy = report(&busy_steps, &busy_reports);
            a.trim_idle();
            let after = report(&busy_steps, &busy_reports);
            assert_eq!(after, busy, "a cache that only allocated or only freed");
        }
        // The idle worker flushes at its next slow path and goes on.
        idle_steps.send(Step::Round(400)).unwrap();
        let idle = report(&idle_steps, &idle_reports);
        assert!(!idle.flush_requested, "{idle:?}");
        // Joined here, not at the scope's end: a join waits for the workers'
        // thread-local teardown, which flushes their caches.
        drop((idle_steps, busy_steps));
        idle_worker.join().unwrap();
        busy_worker.join().unwrap();
    });
    let s = a.stats();
    assert!(s.is_consistent(), "{s}");
    assert_eq!(s.live, 0, "{s}");
    // Nothing lost inside the allocator (`is_consistent` would count it as cached):
    // with both workers gone, a trim leaves nothing reserved.
    a.trim();
    let s = a.stats();
    assert!(s.is_consistent(), "{s}");
    assert_eq!((s.live, s.reserved_objects()), (0, 0), "{s}");
}
