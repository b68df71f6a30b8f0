//! Races on `max_live`'s permits, run many times: the test sets up the interleaving that
//! matters and repeats it, counting how often the promise breaks. The windows are a few
//! instructions wide and cannot be forced from outside the crate, so this is a bounded
//! number of tries, not a proof; loom models are where the exact interleavings belong.

use std::sync::Barrier;

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
/// A batch in flight was once invisible to a refused thread (fixed: the draw and the
/// credit happen under the cache-list lock); the loom model
/// `loom_capped::a_batch_in_flight_is_never_invisible_to_a_refused_thread` holds that
/// interleaving exactly. This test repeats the real thing, 200,000 rounds a side.
#[test]
fn a_capped_allocator_refuses_only_at_max_live() {
    const CAP: usize = 64;
    const ROUNDS: u64 = 200_000;
    // Batches of 4 permits (max_live / 16, under the magazine size).
    let a = ClassAllocator::<u64>::with_config(
        "race-max-live",
        Config::new().magazine_size(8).max_live(CAP),
    );
    let start = Barrier::new(2);
    // Allocates and frees one object `ROUNDS` times; returns the refusals.
    let churn = || {
        start.wait();
        (0..ROUNDS).filter(|&i| a.try_alloc(i).is_err()).count()
    };
    let held: Vec<_> = (0..CAP as u64 - 2).map(|i| a.alloc(i)).collect();
    let refused = std::thread::scope(|s| {
        let other = s.spawn(churn);
        churn() + other.join().unwrap()
    });
    drop(held);
    assert_eq!(
        refused,
        0,
        "{refused} of {} allocations refused with at most {CAP} objects live",
        2 * ROUNDS
    );
}
