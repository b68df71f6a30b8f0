//! Deterministic reproducers of what the randomized runs (the stress run, fault
//! injection, the state machine) found, one test each; each failed before its fix.

use proxalloc::{CacheMode, ClassAllocator, ClassBox, Config, Pool, Recycle, RecyclingAllocator};

#[path = "common/net_bytes.rs"]
mod net_bytes;

use net_bytes::{net_bytes, NetCounting};

#[global_allocator]
static GLOBAL: NetCounting = NetCounting {
    fail: net_bytes::never,
};

/// Runs `f` with panics kept off stderr (printing one allocates and caches buffers).
/// The hook is the process's: one such test at a time, and `f` must not fail.
fn quietly<R>(f: impl FnOnce() -> R) -> R {
    static ONE: std::sync::Mutex<()> = std::sync::Mutex::new(());
    let _one = ONE.lock().unwrap_or_else(|e| e.into_inner());
    let hook = std::panic::take_hook();
    std::panic::set_hook(Box::new(|_| {}));
    let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(f));
    std::panic::set_hook(hook);
    r.unwrap_or_else(|p| std::panic::resume_unwind(p))
}

/// A recycled value whose destructor panics, with a 200-byte message.
struct Bomb;

impl Recycle for Bomb {
    fn create() -> Self {
        Bomb
    }
    fn recycle(&mut self) -> bool {
        true
    }
}

impl Drop for Bomb {
    fn drop(&mut self) {
        if !std::thread::panicking() {
            panic!("{}", "b".repeat(200));
        }
    }
}

/// Found by the stress run under AddressSanitizer's leak check. A panic in a value's
/// destructor run inside the allocator (a recycled value released by a trim, an
/// overflow or a thread's exit) is caught and its payload forgotten, not dropped
/// (`Backing::destroy`), so that a payload whose own `Drop` panics cannot unwind out of
/// the middle of a batch. Each such panic leaks its payload: the box, and here the
/// formatted message. Dropping the payload inside another `catch_unwind` (and forgetting
/// only what that one catches) keeps the batch safe without the leak.
#[test]
fn a_panic_caught_in_a_recycled_values_destructor_leaks_nothing() {
    let r = RecyclingAllocator::<Bomb>::with_config("found-bomb", Config::new().depot_bytes(0));
    let leaked = quietly(|| {
        drop(r.get()); // warm up: this thread's cache, magazines
        r.trim();
        net_bytes(|| {
            for _ in 0..50 {
                drop(r.get()); // cached, constructed
                r.trim(); // destroyed inside the allocator: the destructor panics
            }
        })
    });
    assert!(
        leaked < 1024,
        "50 caught destructor panics left {leaked} bytes allocated"
    );
}

/// Found with the previous one: `Pool::clear` resumes the first panic of its cleanups
/// and forgets the payloads of the others, for the same reason, leaking them.
#[test]
fn panicking_pool_cleanups_leak_nothing() {
    let mut pool = Pool::new();
    let leaked = quietly(|| {
        let _ = pool.alloc(0u8); // warm up: the pool's first block
        net_bytes(|| {
            for _ in 0..50 {
                for _ in 0..3 {
                    pool.on_clear(|| panic!("{}", "c".repeat(200)));
                }
                let first = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| pool.clear()));
                assert!(first.is_err());
            }
        })
    });
    assert!(
        leaked < 1024,
        "50 clears with three panicking cleanups each left {leaked} bytes allocated"
    );
}

/// Found by the state machine (`tests/class_state_machine.rs`: Alloc, Trim, Free, Alloc
/// with `depot_bytes(0)`). `trim` (and `trim_all`) asks every thread's cache to flush at
/// its next slow path, the calling thread's own included, and flushes the caller's cache
/// at once; the caller's request stays pending. Its next slow path, which may be the
/// free right after the trim, flushes again after that free has stored its object: the
/// object the thread just freed leaves the thread's cache (here, with no depot budget,
/// back to the system), instead of staying "in the dropping thread's cache for the next
/// allocation" as `ClassAllocator`'s docs say.
#[test]
fn an_object_freed_after_a_trim_stays_in_the_thread_cache() {
    static A: ClassAllocator<[u64; 8]> = ClassAllocator::with_config(
        "found-trim-then-free",
        // Per-thread caches: the thread may move to another CPU between the free and
        // the allocation.
        Config::new()
            .mode(CacheMode::ThreadCaches)
            .magazine_size(4)
            .depot_bytes(0),
    );
    let x = A.alloc([1; 8]);
    let addr = ClassBox::as_ptr(&x);
    A.trim();
    drop(x); // the cache is empty after the trim: a slow path
    let s = A.stats();
    assert_eq!(
        (s.cached_in_threads, s.backing_frees),
        (1, 0),
        "the object freed after the trim left this thread's cache: {s}"
    );
    let y = A.alloc([2; 8]);
    assert_eq!(ClassBox::as_ptr(&y), addr, "not the object just freed");
}
