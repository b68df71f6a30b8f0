//! Adaptive thread caches: a thread that holds many objects at once grows a stash of
//! full magazines (granted from the process-wide thread-cache budget) instead of going
//! through the depot every magazine; the grant comes back when the thread is flushed,
//! trimmed from another thread, goes idle or exits.
//!
//! The budget is process-wide, so these tests run one at a time under `SERIAL`.

use std::sync::{mpsc, Mutex, MutexGuard};

use proxalloc::{CacheMode, ClassAllocator, Config};

static SERIAL: Mutex<()> = Mutex::new(());

fn serial() -> MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|e| e.into_inner())
}

#[path = "common/books.rs"]
mod books;
use books::assert_nothing_lost;

/// One round of a batch: `n` objects live at once, then all freed.
fn batch(a: &ClassAllocator<[u64; 8]>, n: u64) {
    let live: Vec<_> = (0..n).map(|i| a.alloc([i; 8])).collect();
    for (i, x) in live.iter().enumerate() {
        assert_eq!(x[0], i as u64);
    }
}

#[test]
fn a_batchy_thread_stops_going_to_the_depot() {
    let _s = serial();
    let a = ClassAllocator::<[u64; 8]>::with_config(
        "growth-batch",
        Config::new()
            .mode(CacheMode::ThreadCaches)
            .magazine_size(16),
    );
    for _ in 0..3 {
        batch(&a, 1024);
    }
    let warm = a.stats();
    for _ in 0..20 {
        batch(&a, 1024);
    }
    let s = a.stats();
    assert_eq!(
        s.refills, warm.refills,
        "refilled from the depot after growing: {s}"
    );
    assert_eq!(
        s.spills, warm.spills,
        "spilled to the depot after growing: {s}"
    );
    assert!(s.is_consistent() && s.live == 0, "{s}");
    let granted = proxalloc::thread_cache_budget().0;
    assert!(
        granted >= 60 * 16 * 64,
        "the stash holds ~62 magazines: {granted}"
    );
    a.release_thread_cache();
    assert_eq!(proxalloc::thread_cache_budget().0, 0, "the grant came back");
    assert_nothing_lost(&a, 0);
}

#[test]
fn a_thread_without_budget_keeps_two_magazines() {
    let _s = serial();
    proxalloc::set_thread_cache_budget(0);
    let a = ClassAllocator::<[u64; 8]>::with_config(
        "growth-none",
        Config::new()
            .mode(CacheMode::ThreadCaches)
            .magazine_size(16),
    );
    for _ in 0..5 {
        batch(&a, 256);
    }
    let before = a.stats();
    batch(&a, 256);
    let s = a.stats();
    assert!(
        s.refills > before.refills,
        "no budget: still through the depot: {s}"
    );
    assert_eq!(proxalloc::thread_cache_budget().0, 0);
    proxalloc::set_thread_cache_budget(32 << 20);
}

#[test]
fn growth_is_bounded_per_thread_by_the_config() {
    let _s = serial();
    let a = ClassAllocator::<[u64; 8]>::with_config(
        "growth-capped",
        Config::new()
            .mode(CacheMode::ThreadCaches)
            .magazine_size(16)
            .thread_cache_growth_bytes(4 * 16 * 64),
    );
    for _ in 0..5 {
        batch(&a, 1024);
    }
    assert!(proxalloc::thread_cache_budget().0 <= 4 * 16 * 64);
    let s = a.stats();
    assert!(s.cached_in_threads <= (2 + 4) * 16 + 16, "{s}");
    drop(a);
    assert_eq!(
        proxalloc::thread_cache_budget().0,
        0,
        "the drop took the grant back"
    );
}

/// An idle thread's grown part is reclaimable from any thread at once: `trim` takes the
/// stash (and its grant) without waiting for the owner, who is asked to flush the rest
/// at its next slow path.
fn an_idle_threads_stash_is_taken_at_once_by(
    name: &'static str,
    trim: impl FnOnce(&ClassAllocator<[u64; 8]>) -> usize,
) {
    let _s = serial();
    let wide = ClassAllocator::<[u64; 8]>::with_config(
        name,
        Config::new()
            .mode(CacheMode::ThreadCaches)
            .magazine_size(16),
    );
    let (ready_tx, ready_rx) = mpsc::channel();
    let (done_tx, done_rx) = mpsc::channel::<()>();
    std::thread::scope(|s| {
        let wide = &wide;
        let worker = s.spawn(move || {
            for _ in 0..4 {
                batch(wide, 1024);
            }
            ready_tx.send(()).unwrap();
            // Idle from here on (no slow path honours requests) until the main thread is
            // done, or has failed: the sender drops then.
            let _ = done_rx.recv();
        });
        let release_worker = done_tx;
        ready_rx.recv().unwrap();
        let before = wide.stats();
        assert!(before.cached_in_threads >= 900, "{before}");
        assert!(proxalloc::thread_cache_budget().0 > 0);
        let released = trim(wide);
        let after = wide.stats();
        assert!(
            after.cached_in_threads <= 2 * 16,
            "only the idle thread's two magazines stay: {after}"
        );
        assert!(released >= (before.cached_in_threads - 32) as usize * 64);
        assert_eq!(proxalloc::thread_cache_budget().0, 0);
        // Joined here, not at the scope's end: a join waits for the worker's
        // thread-local teardown, which flushes its two magazines.
        drop(release_worker);
        worker.join().unwrap();
    });
    let s = wide.stats();
    assert!(s.is_consistent() && s.live == 0, "{s}");
    assert_nothing_lost(&wide, 0);
}

#[test]
fn trim_all_takes_an_idle_threads_stash_at_once() {
    an_idle_threads_stash_is_taken_at_once_by("growth-idle-trim-all", |_| proxalloc::trim_all());
}

/// The allocator's own `trim` takes other threads' stashes too (it left them: 1,024
/// objects in 64 magazines, though its docs said other threads hold two magazines).
#[test]
fn an_allocators_trim_takes_an_idle_threads_stash_at_once() {
    an_idle_threads_stash_is_taken_at_once_by("growth-idle-trim", |a| a.trim());
}

/// Thread exit gives the grant back.
#[test]
fn thread_exit_returns_the_grant() {
    let _s = serial();
    static A: ClassAllocator<[u64; 8]> = ClassAllocator::with_config(
        "growth-exit",
        Config::new()
            .mode(CacheMode::ThreadCaches)
            .magazine_size(16),
    );
    let a = &A;
    // A joined `std::thread` has run its thread-locals' destructors, the cache's
    // teardown among them (a scoped thread is joined before them, so a test would have
    // to wait and guess how long).
    std::thread::spawn(|| {
        for _ in 0..4 {
            batch(&A, 512);
        }
        assert!(proxalloc::thread_cache_budget().0 > 0);
    })
    .join()
    .unwrap();
    assert_eq!(
        proxalloc::thread_cache_budget().0,
        0,
        "the exiting thread kept its grant"
    );
    let s = a.stats();
    assert!(
        s.is_consistent() && s.live == 0 && s.cached_in_threads == 0,
        "{s}"
    );
    assert_nothing_lost(a, 0);
}
