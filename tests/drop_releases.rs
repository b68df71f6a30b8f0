//! Dropping an allocator returns every object it caches, in every thread, to the system
//! allocator. Checked with a global allocator that counts blocks of the test type's
//! unusual layout (nothing else in this binary allocates 1536-byte, 512-aligned blocks).

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicIsize, Ordering};
use std::sync::{mpsc, Arc, Barrier};

use proxalloc::{CacheMode, ClassAllocator, Config};

#[repr(align(512))]
struct Marked(#[allow(dead_code)] [u8; 1536]);

static MARKED_BLOCKS: AtomicIsize = AtomicIsize::new(0);

struct Counting;

// SAFETY: forwards to `System`, only counting.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        if layout == Layout::new::<Marked>() {
            MARKED_BLOCKS.fetch_add(1, Ordering::Relaxed);
        }
        // SAFETY: forwarded.
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        if layout == Layout::new::<Marked>() {
            MARKED_BLOCKS.fetch_sub(1, Ordering::Relaxed);
        }
        // SAFETY: forwarded.
        unsafe { System.dealloc(ptr, layout) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

/// Allocator drop and live threads: the dropping thread's cache and the depot are
/// released at once; each other thread releases what its cache holds at its next slow
/// path (any allocator's) or at exit, since only the owner may touch its magazines.
#[test]
fn dropping_the_allocator_releases_objects_cached_by_live_threads() {
    const THREADS: usize = 4;
    static OTHER: ClassAllocator<u64> = ClassAllocator::with_config(
        "drop-releases-other",
        Config::new().mode(CacheMode::ThreadCaches),
    );
    let a = Arc::new(ClassAllocator::<Marked>::with_config(
        "marked",
        Config::new().mode(CacheMode::ThreadCaches),
    ));
    let used = Arc::new(Barrier::new(THREADS + 1));
    let mut pokes = Vec::new();
    let (done_tx, done_rx) = mpsc::channel::<usize>();
    let threads: Vec<_> = (0..THREADS)
        .map(|t| {
            let (a, used, done_tx) = (Arc::clone(&a), Arc::clone(&used), done_tx.clone());
            let (poke_tx, poke_rx) = mpsc::channel::<()>();
            pokes.push(poke_tx);
            std::thread::spawn(move || {
                // Leave objects in this thread's cache, then stop using the allocator
                // but stay alive.
                drop(
                    (0..50 + t)
                        .map(|_| a.alloc(Marked([t as u8; 1536])))
                        .collect::<Vec<_>>(),
                );
                drop(a);
                used.wait();
                // A poke: one slow path on another allocator, then report back.
                if poke_rx.recv().is_ok() {
                    drop(OTHER.alloc(t as u64));
                    done_tx.send(t).unwrap();
                }
                let _ = poke_rx.recv();
            })
        })
        .collect();
    used.wait();
    let s = a.stats();
    assert_eq!(s.threads, THREADS);
    assert!(s.cached_in_threads > 0, "{s}");
    let in_threads = s.cached_in_threads as isize;
    assert!(MARKED_BLOCKS.load(Ordering::Relaxed) > 0);
    // The last reference: the allocator drops while its threads still hold caches.
    let Ok(a) = Arc::try_unwrap(a) else {
        panic!("threads dropped their references")
    };
    drop(a);
    let after_drop = MARKED_BLOCKS.load(Ordering::Relaxed);
    assert!(
        after_drop <= in_threads,
        "only what idle threads cache may remain: {after_drop} > {in_threads}"
    );
    // Two threads take a slow path: their caches are released then.
    for poke in &pokes[..2] {
        poke.send(()).unwrap();
    }
    for _ in 0..2 {
        done_rx.recv().unwrap();
    }
    let after_pokes = MARKED_BLOCKS.load(Ordering::Relaxed);
    assert!(
        after_pokes < after_drop || after_drop == 0,
        "a slow path releases the dead allocator's objects ({after_pokes} vs {after_drop})"
    );
    drop(pokes);
    for t in threads {
        t.join().unwrap();
    }
    assert_eq!(
        MARKED_BLOCKS.load(Ordering::Relaxed),
        0,
        "cached objects leaked"
    );

    // A new allocator may reuse the dropped one's table index.
    let b =
        ClassAllocator::<Marked>::with_config("after", Config::new().mode(CacheMode::ThreadCaches));
    drop(
        (0..10)
            .map(|_| b.alloc(Marked([0; 1536])))
            .collect::<Vec<_>>(),
    );
    assert_eq!(b.stats().live, 0);
    drop(b);
    assert_eq!(MARKED_BLOCKS.load(Ordering::Relaxed), 0);
}
