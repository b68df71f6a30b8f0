//! A user's block allocator under a `BlockSource`: every block of every class and every
//! large block comes from it, and all of them go back to it.

use std::alloc::{GlobalAlloc, Layout, System};
use std::collections::HashMap;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use proxalloc::{BlockAllocator, BlockSource, Pool, BLOCK_ALIGN, BLOCK_CLASSES};

/// Hands out blocks from `System` and remembers each one until it comes back.
#[derive(Default)]
struct Counting {
    live: Mutex<HashMap<usize, Layout>>,
    allocs: AtomicUsize,
    frees: AtomicUsize,
    fail: AtomicBool,
    panic_on_free: AtomicBool,
}

impl Counting {
    fn holds(&self, p: NonNull<u8>) -> bool {
        self.live
            .lock()
            .unwrap()
            .contains_key(&(p.as_ptr() as usize))
    }

    fn live(&self) -> usize {
        self.live.lock().unwrap().len()
    }
}

// SAFETY: memory from `System`, with the requested layout.
unsafe impl BlockAllocator for Counting {
    fn alloc_block(&self, layout: Layout) -> Option<NonNull<u8>> {
        assert!(layout.size() >= BLOCK_CLASSES[0] && layout.align() == BLOCK_ALIGN);
        if self.fail.load(Ordering::Relaxed) {
            return None;
        }
        // SAFETY: non-zero size.
        let p = NonNull::new(unsafe { System.alloc(layout) })?;
        self.live
            .lock()
            .unwrap()
            .insert(p.as_ptr() as usize, layout);
        self.allocs.fetch_add(1, Ordering::Relaxed);
        Some(p)
    }

    unsafe fn free_block(&self, ptr: NonNull<u8>, layout: Layout) {
        let known = self.live.lock().unwrap().remove(&(ptr.as_ptr() as usize));
        assert_eq!(
            known,
            Some(layout),
            "a block this allocator did not hand out"
        );
        self.frees.fetch_add(1, Ordering::Relaxed);
        // SAFETY: allocated in `alloc_block` with `layout`.
        unsafe { System.dealloc(ptr.as_ptr(), layout) };
        if self.panic_on_free.load(Ordering::Relaxed) {
            panic!("free_block panics (on purpose)");
        }
    }
}

#[test]
fn every_block_comes_from_the_hook_and_goes_back() {
    let hook = Arc::new(Counting::default());
    let source = BlockSource::with_block_allocator(256 << 10, hook.clone());

    // Blocks of every class and large ones, straight from the source.
    let sizes = [1, 9000, 20_000, 40_000, 100_000, 300_000];
    let blocks: Vec<_> = sizes.iter().map(|&s| source.alloc(s).unwrap()).collect();
    for b in &blocks {
        assert!(hook.holds(b.ptr), "block of {} B not from the hook", b.size);
    }
    let dedicated = source.alloc_dedicated(70_000).unwrap();
    assert!(hook.holds(dedicated.ptr));
    // Small dedicated blocks (0 included) are the 8 KiB class's: never a zero-sized or
    // sub-class layout for the hook.
    for s in [0, 1, 4096, 8192] {
        let b = source.alloc_dedicated(s).unwrap();
        assert_eq!(b.size, 8 << 10, "alloc_dedicated({s})");
        assert!(hook.holds(b.ptr));
        // SAFETY: from `source`, unchanged, not used again.
        unsafe { source.free(b) };
    }

    // Pools on other threads, with large and class blocks, dropped there. (Joined, not
    // scoped: a join also waits for the thread's exit, which flushes its caches.)
    let source = Arc::new(source);
    let workers: Vec<_> = (0..3u64)
        .map(|t| {
            let source = source.clone();
            std::thread::spawn(move || {
                let mut pool = Pool::with_source(&source);
                let rounds = if cfg!(miri) { 3 } else { 50 };
                for round in 0..rounds {
                    for i in 0..200 {
                        let _ = pool.alloc([t, round, i]);
                    }
                    let _ = pool.alloc_slice_fill_with(10_000 + round as usize * 100, |i| i);
                    pool.clear();
                }
            })
        })
        .collect();
    for w in workers {
        w.join().unwrap();
    }
    let source = Arc::into_inner(source).unwrap();

    let [c8, c16, c32, c64, large] = source.stats();
    let from_backing: u64 = [c8, c16, c32, c64, large]
        .iter()
        .map(|s| s.backing_allocs)
        .sum();
    assert_eq!(from_backing as usize, hook.allocs.load(Ordering::Relaxed));
    assert!(hook.allocs.load(Ordering::Relaxed) > sizes.len());

    for b in blocks.into_iter().chain([dedicated]) {
        // SAFETY: from `source`, not used again.
        unsafe { source.free(b) };
    }
    // Trimming gives the cached blocks (and this thread's) back to the hook at once.
    source.trim();
    assert_eq!(hook.live(), 0, "trim left blocks out");
    let _ = Pool::with_source(&source).alloc_str("one more block");
    drop(source);
    assert_eq!(hook.live(), 0, "blocks not returned to the hook");
    assert_eq!(
        hook.allocs.load(Ordering::Relaxed),
        hook.frees.load(Ordering::Relaxed)
    );
    // The source kept no reference to the hook.
    assert_eq!(Arc::strong_count(&hook), 1);
}

#[test]
fn blocks_beyond_max_free_go_back_to_the_hook_at_once() {
    let hook = Arc::new(Counting::default());
    let source = BlockSource::with_block_allocator(0, hook.clone());
    let blocks: Vec<_> = (0..10).map(|_| source.alloc(200_000).unwrap()).collect();
    assert_eq!(hook.live(), 10);
    for b in blocks {
        // SAFETY: from `source`, not used again.
        unsafe { source.free(b) };
    }
    assert_eq!(hook.live(), 0);
    assert_eq!(source.cached_bytes(), 0);
}

#[test]
fn a_failing_hook_is_an_allocation_failure() {
    let hook = Arc::new(Counting::default());
    hook.fail.store(true, Ordering::Relaxed);
    let source = BlockSource::with_block_allocator(1 << 20, hook.clone());
    assert!(source.alloc(8 << 10).is_none());
    assert!(source.alloc(1 << 20).is_none());
    let pool = Pool::with_source(&source);
    assert!(pool.try_alloc_layout(Layout::new::<u64>()).is_err());
    assert_eq!(source.stats().iter().map(|s| s.live).sum::<u64>(), 0);
    hook.fail.store(false, Ordering::Relaxed);
    assert_eq!(pool.alloc_str("now it works"), "now it works");
}

#[test]
#[cfg_attr(
    miri,
    ignore = "the panic's payload is forgotten on purpose, which Miri reports as a leak"
)]
fn a_panicking_free_block_is_contained() {
    let hook = Arc::new(Counting::default());
    let source = BlockSource::with_block_allocator(0, hook.clone());
    let a = source.alloc(8 << 10).unwrap();
    let b = source.alloc(1 << 20).unwrap();
    hook.panic_on_free.store(true, Ordering::Relaxed);
    // SAFETY: from `source`, not used again.
    unsafe {
        source.free(a);
        source.free(b);
    }
    source.trim();
    drop(source);
    // The hook freed each block before it panicked; nothing unwound out of the source.
    assert_eq!(hook.live(), 0);
}

/// A block allocator that panics on its k-th request and fails the (k+2)-th, under a pool
/// making class, large and page-aligned requests across `clear` and drop: each failure
/// reaches the caller (a panic or an error), the pool's books stay sane, and every block
/// goes back to the allocator in the end.
#[test]
fn a_block_allocator_that_panics_or_fails_midway_loses_no_block() {
    #[derive(Default)]
    struct Flaky {
        live: std::sync::atomic::AtomicIsize,
        calls: AtomicUsize,
        panic_at: AtomicUsize,
        fail_at: AtomicUsize,
    }
    // SAFETY: memory from `System`, with the requested layout.
    unsafe impl BlockAllocator for Flaky {
        fn alloc_block(&self, layout: Layout) -> Option<NonNull<u8>> {
            let n = self.calls.fetch_add(1, Ordering::SeqCst) + 1;
            if n == self.panic_at.load(Ordering::SeqCst) {
                panic!("alloc_block panics (on purpose)");
            }
            if n == self.fail_at.load(Ordering::SeqCst) {
                return None;
            }
            assert!(layout.size() >= BLOCK_CLASSES[0]);
            self.live.fetch_add(1, Ordering::SeqCst);
            // SAFETY: a non-zero size (checked above).
            NonNull::new(unsafe { System.alloc(layout) })
        }
        unsafe fn free_block(&self, ptr: NonNull<u8>, layout: Layout) {
            self.live.fetch_sub(1, Ordering::SeqCst);
            // SAFETY: allocated in `alloc_block` with `layout`.
            unsafe { System.dealloc(ptr.as_ptr(), layout) }
        }
    }

    let flaky = Arc::new(Flaky::default());
    {
        let source = BlockSource::with_block_allocator(1 << 20, flaky.clone());
        let rounds = if cfg!(miri) { 3 } else { 12 };
        for k in 1..rounds {
            flaky.calls.store(0, Ordering::SeqCst);
            flaky.panic_at.store(k, Ordering::SeqCst);
            flaky.fail_at.store(k + 2, Ordering::SeqCst);
            let mut pool = Pool::with_source(&source);
            let sizes = [100, 9000, 20_000, 40_000, 70_000, 200_000, 10, 60_000];
            for (i, &size) in sizes.iter().cycle().take(24).enumerate() {
                let align = if i % 3 == 0 { 4096 } else { 8 };
                let layout = Layout::from_size_align(size, align).unwrap();
                let got = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                    pool.try_alloc_layout(layout)
                }));
                if let Ok(Ok(p)) = got {
                    assert_eq!(p.as_ptr() as usize % align, 0);
                    // SAFETY: `size` bytes handed out by the pool.
                    unsafe { p.as_ptr().write_bytes(0xAB, size) };
                }
                let s = pool.stats();
                assert!(s.used_bytes <= s.retained_bytes, "{s:?}");
            }
            pool.clear();
            assert_eq!(pool.alloc_str("after clear"), "after clear");
        }
        source.release_thread_cache();
        let live: u64 = source.stats().iter().map(|s| s.live).sum();
        assert_eq!(live, 0, "blocks still counted live: {:?}", source.stats());
    }
    assert_eq!(
        flaky.live.load(Ordering::SeqCst),
        0,
        "blocks that never went back to the block allocator"
    );
}
