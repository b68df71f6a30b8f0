//! `Config::max_live`: a cap on live objects, exact across threads.

use std::sync::{Barrier, Mutex};

use proxalloc::{AllocError, ClassAllocator, ClassBox, Config};

#[path = "common/books.rs"]
mod books;
use books::assert_nothing_lost;

#[test]
fn the_cap_refuses_the_next_allocation_until_one_is_freed() {
    let a = ClassAllocator::<u64>::with_config("cap-one-thread", Config::new().max_live(3));
    let held: Vec<_> = (0..3).map(|i| a.try_alloc(i).unwrap()).collect();
    assert_eq!(a.try_alloc(3).err(), Some(AllocError));
    assert_eq!(a.try_alloc_with(|| 3).err(), Some(AllocError));
    drop(held);
    let again: Vec<_> = (0..3).map(|i| a.try_alloc(i).unwrap()).collect();
    assert!(a.try_alloc(9).is_err());
    drop(again);
    let s = a.stats();
    assert_eq!((s.live, s.allocs, s.frees), (0, 6, 6), "{s}");
}

/// Two threads allocate until refused, free each other's objects, and fill up again:
/// each time, exactly `max_live` objects are live when both have been refused.
#[test]
fn two_threads_are_refused_at_exactly_the_cap() {
    const CAP: usize = 100;
    let a = ClassAllocator::<[u64; 4]>::with_config(
        "cap-two-threads",
        Config::new().max_live(CAP).magazine_size(8),
    );
    let barrier = Barrier::new(2);
    let pile: Mutex<Vec<ClassBox<'_, [u64; 4]>>> = Mutex::new(Vec::new());
    let rounds = if cfg!(miri) { 2 } else { 50 };
    std::thread::scope(|s| {
        let mut threads = Vec::new();
        for t in 0..2u64 {
            let (a, barrier, pile) = (&a, &barrier, &pile);
            threads.push(s.spawn(move || {
                for round in 0..rounds {
                    let mut mine = Vec::new();
                    while let Ok(h) = a.try_alloc([t, round, 0, 0]) {
                        mine.push(h);
                    }
                    pile.lock().unwrap().extend(mine);
                    barrier.wait();
                    assert_eq!(pile.lock().unwrap().len(), CAP, "round {round}");
                    barrier.wait();
                    // Each thread frees half of the pile, most of it the other's objects.
                    let half: Vec<_> = {
                        let mut p = pile.lock().unwrap();
                        let n = p.len().div_ceil(2);
                        p.drain(..n).collect()
                    };
                    drop(half);
                    barrier.wait();
                }
            }));
        }
        // Joined one by one, not at the scope's end: a join waits for the thread's
        // thread-local teardown, which flushes its cache.
        for h in threads {
            h.join().unwrap();
        }
    });
    pile.lock().unwrap().clear();
    let s = a.stats();
    assert_eq!(s.live, 0, "{s}");
    assert!(s.is_consistent(), "{s}");
    assert_nothing_lost(&a, 0);
}

#[test]
fn with_local_respects_the_cap() {
    let a = ClassAllocator::<u64>::with_config("cap-local", Config::new().max_live(2));
    a.with_local(|c| {
        let x = c.alloc(1);
        let y = c.alloc(2);
        assert!(a.try_alloc(3).is_err());
        c.free(x);
        let z = a.try_alloc(4).unwrap();
        assert_eq!((*y, *z), (2, 4));
    });
    assert_eq!(a.stats().live, 0);
}

/// A thread that exits gives its permits back.
#[test]
fn an_exiting_thread_gives_its_permits_back() {
    let a = ClassAllocator::<u64>::with_config(
        "cap-exit",
        Config::new().max_live(64).magazine_size(16),
    );
    std::thread::scope(|s| {
        s.spawn(|| drop((0..10).map(|i| a.alloc(i)).collect::<Vec<_>>()));
    });
    let all: Vec<_> = std::iter::from_fn(|| a.try_alloc(0).ok())
        .take(100)
        .collect();
    assert_eq!(all.len(), 64);
}
