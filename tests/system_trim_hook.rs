//! `set_system_trim`: a program's own call in place of glibc's `malloc_trim`, run once per
//! request, with no lock of proxalloc held, not from within itself, its panic contained.
//!
//! One test in a process of its own: the hook is process-wide, and so is the count of
//! requests it is checked against. Its body runs on a thread of its own, so that a hook
//! called under a lock of proxalloc's fails the test rather than hang it.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use proxalloc::stats::system_trims;
use proxalloc::{ClassAllocator, Config};

static CALLS: AtomicUsize = AtomicUsize::new(0);

static INSIDE: ClassAllocator<[u8; 256]> = ClassAllocator::new("system-trim-hook-inside");

fn counting() {
    CALLS.fetch_add(1, Ordering::Relaxed);
}

fn calls() -> usize {
    CALLS.load(Ordering::Relaxed)
}

fn requests() -> u64 {
    system_trims().requests
}

/// A panic payload whose own `Drop` panics.
struct PanicOnDrop;

impl Drop for PanicOnDrop {
    fn drop(&mut self) {
        panic!("a panic payload that panics when dropped");
    }
}

#[test]
fn the_hook_runs_once_per_request_and_cannot_hurt_the_trim() {
    let (done, finished) = std::sync::mpsc::channel();
    let body = std::thread::spawn(move || {
        the_hook_runs_once_per_request();
        let _ = done.send(());
    });
    match finished.recv_timeout(Duration::from_secs(120)) {
        Ok(()) => body.join().unwrap(),
        // The body panicked (its sender dropped): its report says why.
        Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => {
            std::panic::resume_unwind(body.join().unwrap_err())
        }
        Err(std::sync::mpsc::RecvTimeoutError::Timeout) => {
            panic!("no end after 120 s: a deadlock around the hook")
        }
    }
}

fn the_hook_runs_once_per_request() {
    // Once per request: `trim_all` with nothing given asks once, with spills twice.
    proxalloc::set_system_trim(Some(counting));
    let before = (calls(), requests());
    proxalloc::trim_all();
    assert_eq!((calls(), requests()), (before.0 + 1, before.1 + 1));
    let tight = ClassAllocator::<[u8; 1024]>::with_config(
        "system-trim-hook-tight",
        Config::new().depot_bytes(0),
    );
    drop(
        (0..2000)
            .map(|_| tight.alloc([0; 1024]))
            .collect::<Vec<_>>(),
    );
    let before = (calls(), requests());
    proxalloc::trim_all();
    assert_eq!((calls(), requests()), (before.0 + 2, before.1 + 2));

    // A hook that allocates and frees through proxalloc, and trims: the nested trim's
    // requests are skipped (no recursion), what that trim gave stays counted for the
    // next request, and nothing deadlocks.
    proxalloc::set_system_trim(Some(|| {
        counting();
        drop((0..100).map(|_| INSIDE.alloc([1; 256])).collect::<Vec<_>>());
        proxalloc::trim_all();
    }));
    let before = (calls(), requests());
    proxalloc::trim_all();
    assert_eq!(
        calls(),
        before.0 + 1,
        "the hook ran once, not from within itself"
    );
    assert_eq!(requests(), before.1 + 1, "the nested requests are not made");
    assert!(
        system_trims().given_since >= 100 * 256,
        "what the nested trim released stays counted"
    );
    assert_eq!(INSIDE.stats().live, 0);

    // A hook that panics, once with a payload whose `Drop` panics too: the trim
    // finishes, the allocators stay usable, and the next request runs the hook again.
    proxalloc::set_system_trim(Some(|| {
        counting();
        if calls() % 2 == 0 {
            std::panic::panic_any(PanicOnDrop);
        }
        panic!("a system trim hook that fails");
    }));
    let before = (calls(), requests());
    let report = std::panic::take_hook();
    std::panic::set_hook(Box::new(|_| {})); // the panics here are expected: no report
    let released = std::panic::catch_unwind(proxalloc::trim_all);
    let again = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        drop((0..10).map(|_| tight.alloc([2; 1024])).collect::<Vec<_>>());
        proxalloc::trim_all();
    }));
    std::panic::set_hook(report);
    assert!(
        released.is_ok() && again.is_ok(),
        "the panics are contained"
    );
    let made = (requests() - before.1) as usize;
    assert!(made >= 2);
    assert_eq!(
        calls() - before.0,
        made,
        "one call per request, panics or not"
    );

    // An allocator's drop asks through the hook too (for 1 MiB of its own).
    proxalloc::set_system_trim(Some(counting));
    let big = ClassAllocator::<[u8; 1024]>::with_config(
        "system-trim-hook-big",
        Config::new().depot_bytes(4 << 20),
    );
    drop((0..1100).map(|_| big.alloc([3; 1024])).collect::<Vec<_>>());
    let before = calls();
    drop(big);
    assert_eq!(calls(), before + 1);

    // `None`: glibc's `malloc_trim` again, the hook no more.
    proxalloc::set_system_trim(None);
    let before = (calls(), requests());
    proxalloc::trim_all();
    assert_eq!(calls(), before.0);
    assert!(requests() > before.1);
}
