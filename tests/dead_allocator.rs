//! An allocator dropped on one thread while another thread's cache for it has grown: a
//! stash of full magazines and spare empty ones. The other thread retires that cache at
//! its next slow path on *any* allocator, or when it exits; either way every object goes
//! back exactly once and nothing panics.
//!
//! The thread-cache budget is process-wide, so these tests run one at a time.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{mpsc, Arc, Mutex, MutexGuard};

use proxalloc::{CacheMode, ClassAllocator, Config, OwnedRecycled, Recycle, RecyclingAllocator};

static SERIAL: Mutex<()> = Mutex::new(());

fn serial() -> MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|e| e.into_inner())
}

static CREATED: AtomicUsize = AtomicUsize::new(0);
static DROPPED: AtomicUsize = AtomicUsize::new(0);

/// A recycled value that counts its constructions and destructions.
struct Counted(#[allow(dead_code)] [u64; 2]);

impl Recycle for Counted {
    fn create() -> Self {
        CREATED.fetch_add(1, Ordering::SeqCst);
        Counted([7; 2])
    }
    fn recycle(&mut self) -> bool {
        true
    }
}

impl Drop for Counted {
    fn drop(&mut self) {
        DROPPED.fetch_add(1, Ordering::SeqCst);
    }
}

type Shared = Arc<RecyclingAllocator<Counted>>;

fn grown_allocator() -> Shared {
    Arc::new(RecyclingAllocator::with_config(
        "dead-allocator",
        Config::new().mode(CacheMode::ThreadCaches).magazine_size(4),
    ))
}

/// Grows this thread's cache of `a`: batches larger than two magazines make it spill and
/// refill, which grants it a stash; a last batch, freed on another thread, takes full
/// magazines from the stash and keeps the emptied ones as spares. Returns that batch.
fn grow_stash_and_spares(a: &Shared) -> Vec<OwnedRecycled<Counted>> {
    for _ in 0..4 {
        let live: Vec<_> = (0..64).map(|_| a.get()).collect();
        drop(live);
    }
    (0..20).map(|_| a.get_arc()).collect()
}

/// Runs `worker` on a thread that first grows its cache of a shared allocator; the main
/// thread then drops the last reference to the allocator, and `worker` runs after that.
fn after_the_allocator_dies(worker: impl FnOnce() + Send + 'static) {
    let (created, dropped) = (
        CREATED.load(Ordering::SeqCst),
        DROPPED.load(Ordering::SeqCst),
    );
    let a = grown_allocator();
    let (grown_tx, grown_rx) = mpsc::channel();
    let (dead_tx, dead_rx) = mpsc::channel::<()>();
    let t = {
        let a = Arc::clone(&a);
        std::thread::spawn(move || {
            let last_batch = grow_stash_and_spares(&a);
            drop(a);
            grown_tx.send(last_batch).unwrap();
            dead_rx.recv().unwrap();
            worker();
        })
    };
    drop(grown_rx.recv().unwrap()); // freed into this thread's cache
    assert!(
        proxalloc::thread_cache_budget().0 > 0,
        "the worker's cache grew"
    );
    drop(a); // the last reference: the allocator shuts down here
    dead_tx.send(()).unwrap();
    t.join().expect("the worker thread panicked");
    assert_eq!(
        CREATED.load(Ordering::SeqCst) - created,
        DROPPED.load(Ordering::SeqCst) - dropped,
        "every value constructed is dropped exactly once"
    );
    assert_eq!(proxalloc::thread_cache_budget().0, 0, "the grant came back");
}

#[test]
fn a_dead_allocators_grown_cache_is_retired_at_another_allocators_slow_path() {
    let _s = serial();
    after_the_allocator_dies(|| {
        static OTHER: ClassAllocator<u64> = ClassAllocator::with_config(
            "dead-allocator-other",
            Config::new().mode(CacheMode::ThreadCaches),
        );
        // Enough to leave the first magazine: a slow path, which sweeps this thread's
        // caches (the dead allocator announced its shutdown).
        let v: Vec<_> = (0..200).map(|i| OTHER.alloc(i)).collect();
        drop(v);
        // The retired cache's table index can pass to a new allocator.
        let fresh = ClassAllocator::<u64>::with_config(
            "dead-allocator-fresh",
            Config::new().mode(CacheMode::ThreadCaches),
        );
        let w: Vec<_> = (0..200).map(|i| fresh.alloc(i)).collect();
        assert!(w.iter().enumerate().all(|(i, x)| **x == i as u64));
        drop(w);
        assert_eq!(fresh.stats().live, 0);
    });
}

#[test]
fn a_dead_allocators_grown_cache_is_retired_at_thread_exit() {
    let _s = serial();
    after_the_allocator_dies(|| {});
}
