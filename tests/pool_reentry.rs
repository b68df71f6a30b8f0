//! Where pools meet user code and failure: a pool's slow path re-entered by a recycled
//! value's destructor, a cleanup's panic payload that panics when dropped, and layouts
//! too large for any block. Each test failed on the code before its fix (the first
//! under Miri only: natively the pool's state happened to stay consistent).

use std::alloc::Layout;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering::SeqCst};
use std::sync::Arc;

use proxalloc::{BlockSource, CacheMode, Config, Pool, Recycle, RecyclingAllocator};

// ---- 1. Pool::alloc_slow holds `&mut State` across BlockSource::alloc, which can run
// user code (a Recycle value's Drop, from the class slow path's sweep) that re-enters
// the same pool through a thread-local. Miri: Stacked/Tree Borrows violation.

static REENTER: AtomicBool = AtomicBool::new(false);
static REENTERED: AtomicBool = AtomicBool::new(false);

thread_local! {
    static TL_POOL: Pool<'static> = Pool::new();
}

struct Reenter(#[allow(dead_code)] u64);

impl Recycle for Reenter {
    fn create() -> Self {
        Reenter(0)
    }
    fn recycle(&mut self) -> bool {
        true
    }
}

impl Drop for Reenter {
    fn drop(&mut self) {
        if REENTER.swap(false, SeqCst) {
            TL_POOL.with(|p| {
                let _ = p.alloc_str("allocated from inside a Recycle value's Drop");
            });
            REENTERED.store(true, SeqCst);
        }
    }
}

// A zero depot budget: a flush sends the value to the backing allocator (runs its Drop).
// Per-thread caches: the flush must be this thread's, at its next slow path (a per-CPU
// cache would be reclaimed by `trim_all` itself, on its thread).
static RE: RecyclingAllocator<Reenter> = RecyclingAllocator::with_config(
    "pool-reentry-recycled",
    Config::new().mode(CacheMode::ThreadCaches).depot_bytes(0),
);

#[test]
fn pool_slow_path_is_reentered_by_a_recycle_drop() {
    drop(RE.get()); // one live value cached in this thread's loaded magazine
                    // Posts a flush request to this thread's RE cache and bumps the flush epoch.
    std::thread::spawn(|| {
        proxalloc::trim_all();
    })
    .join()
    .unwrap();
    REENTER.store(true, SeqCst);
    TL_POOL.with(|p| {
        // First allocation: Pool::alloc_slow -> BlockSource::alloc -> the 8 KiB class's
        // slow path -> sweep -> flush RE's cache -> Reenter::drop -> TL_POOL again,
        // while alloc_slow's `st` (&mut State) is live.
        let s = p.alloc_str("outer");
        assert_eq!(s, "outer");
    });
    assert!(
        REENTERED.load(SeqCst),
        "the value's Drop ran inside the pool's slow path and allocated from the pool"
    );
}

// ---- 2. Pool::run_cleanups drops the second panic payload; a payload whose Drop
// panics unwinds out of Pool::drop: remaining cleanups never run, blocks never go back.

struct Bomb;

impl Drop for Bomb {
    fn drop(&mut self) {
        panic!("a panic payload whose Drop panics");
    }
}

#[test]
fn pool_drop_survives_a_payload_whose_drop_panics() {
    let src = BlockSource::new(1 << 20);
    let ran = Arc::new(AtomicUsize::new(0));
    let pool = Pool::with_source(&src);
    let _ = pool.alloc_str("x");
    let r = ran.clone();
    let _ = pool.on_clear(move || {
        r.fetch_add(1, SeqCst);
    });
    let _ = pool.on_clear(|| std::panic::panic_any(Bomb));
    let _ = pool.on_clear(|| panic!("the first cleanup panics"));
    let _ = catch_unwind(AssertUnwindSafe(|| drop(pool)));
    src.release_thread_cache();
    let live: u64 = src.stats().iter().map(|s| s.live).sum();
    assert_eq!(
        (ran.load(SeqCst), live),
        (1, 0),
        "(cleanups run, blocks still out): an earlier cleanup was skipped and the pool's \
         blocks leaked"
    );
}

/// A pool dropped while its thread unwinds, whose cleanup panics with a payload whose
/// own `Drop` panics: the pool's `Drop` cannot pass the panic on (a second one would
/// abort), and must not let the payload's panic out either.
#[test]
fn pool_dropped_while_unwinding_contains_a_payload_whose_drop_panics() {
    let src = BlockSource::new(1 << 20);
    let ran = Arc::new(AtomicUsize::new(0));
    let r = ran.clone();
    let unwound = catch_unwind(AssertUnwindSafe(|| {
        let pool = Pool::with_source(&src);
        let _ = pool.alloc_str("x");
        let _ = pool.on_clear(move || {
            r.fetch_add(1, SeqCst);
        });
        let _ = pool.on_clear(|| std::panic::panic_any(Bomb));
        panic!("the scope that owns the pool panics");
    }));
    assert!(unwound.is_err());
    src.release_thread_cache();
    let live: u64 = src.stats().iter().map(|s| s.live).sum();
    assert_eq!(
        (ran.load(SeqCst), live),
        (1, 0),
        "(cleanups run, blocks still out)"
    );
}

// ---- 3. try_alloc_layout panics (instead of returning Err) for a layout whose block
// size overflows Layout.

#[test]
#[cfg_attr(miri, ignore)]
fn pool_try_alloc_layout_of_a_huge_layout_is_an_error_not_a_panic() {
    let src = BlockSource::new(0);
    let pool = Pool::with_source(&src);
    let layout = Layout::from_size_align(isize::MAX as usize - 63, 64).unwrap();
    let r = catch_unwind(AssertUnwindSafe(|| pool.try_alloc_layout(layout).is_err()));
    assert_eq!(r.ok(), Some(true), "try_alloc_layout panicked");
}

// ---- 4. Large::alloc counts the allocation before it can fail: a failed large block
// stays "live" in the stats forever.

#[test]
#[cfg_attr(miri, ignore)]
fn failed_large_block_is_not_counted_live() {
    let src = BlockSource::new(0);
    assert!(src.alloc(1 << 62).is_none());
    assert_eq!(
        src.stats()[4].live,
        0,
        "a block that was never handed out counts as live"
    );
}
