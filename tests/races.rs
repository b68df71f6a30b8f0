//! Races on `max_live`'s permits, run many times: the test sets up the interleaving that
//! matters and repeats it, counting how often the promise breaks. The windows are a few
//! instructions wide and cannot be forced from outside the crate, so this is a bounded
//! number of tries, not a proof; loom models are where the exact interleavings belong.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Barrier};

use proxalloc::{ClassAllocator, Config};

/// `Config::max_live` promises a refusal only when `max_live` objects really are live.
/// Permits move between the shared count and threads' caches in batches; a batch being
/// moved (drawn but not yet added to the drawing thread's cache, or given back by a
/// cache but not yet added to the shared count) is in neither place, and a thread about
/// to be refused seizes only what caches hold.
///
/// Here one thread holds `max_live - 2` objects and allocates and frees one more, while
/// another allocates and frees one: at most `max_live` are ever live, so no `try_alloc`
/// may fail.
///
/// It has not failed here (200,000 rounds a side, debug and release): the thread that
/// would be refused must draw, lock the cache list and seize while the other thread sits
/// between drawing a batch and adding it to its cache, a window of a few instructions
/// that only a preemption holds open. The exact interleaving is for a loom model (the
/// permits are std atomics today, invisible to loom).
#[test]
fn a_capped_allocator_refuses_only_at_max_live() {
    const CAP: usize = 64;
    const ROUNDS: u64 = 200_000;
    // Batches of 4 permits (max_live / 16, under the magazine size).
    let a = Arc::new(ClassAllocator::<u64>::with_config(
        "race-max-live",
        Config::new().magazine_size(8).max_live(CAP),
    ));
    let refused = Arc::new(AtomicU64::new(0));
    let start = Arc::new(Barrier::new(2));
    let churn = {
        let (a, refused, start) = (a.clone(), refused.clone(), start.clone());
        std::thread::spawn(move || {
            start.wait();
            for i in 0..ROUNDS {
                match a.try_alloc(i) {
                    Ok(x) => drop(x),
                    Err(_) => {
                        refused.fetch_add(1, Ordering::Relaxed);
                    }
                }
            }
        })
    };
    let held: Vec<_> = (0..CAP as u64 - 2).map(|i| a.alloc(i)).collect();
    start.wait();
    for i in 0..ROUNDS {
        match a.try_alloc(i) {
            Ok(x) => drop(x),
            Err(_) => {
                refused.fetch_add(1, Ordering::Relaxed);
            }
        }
    }
    churn.join().unwrap();
    drop(held);
    let refused = refused.load(Ordering::Relaxed);
    assert_eq!(
        refused,
        0,
        "{refused} of {} allocations refused with at most {CAP} objects live",
        2 * ROUNDS
    );
}
