//! `trim_all` when the global allocator fails walks the registry by index: it must
//! reach the first registered allocator too. Its own binary, with one test, so the
//! allocator made here is the process's first registration (entry 0), which the
//! other binaries' tests cannot arrange.

#[path = "common/net_bytes.rs"]
mod net_bytes;

use std::alloc::Layout;
use std::cell::Cell;

use net_bytes::NetCounting;
use proxalloc::{CacheMode, ClassAllocator, Config};

std::thread_local! {
    static FAIL: Cell<bool> = const { Cell::new(false) };
}

/// Fails every allocation of the thread that set `FAIL`.
fn failing_here(_: Layout) -> bool {
    FAIL.try_with(Cell::get).unwrap_or(false)
}

#[global_allocator]
static GLOBAL: NetCounting = NetCounting { fail: failing_here };

#[test]
fn an_out_of_memory_trim_all_reaches_the_first_registered_allocator() {
    let first = ClassAllocator::<[u64; 4]>::with_config(
        "oom-walk-first",
        Config::new().mode(CacheMode::ThreadCaches),
    );
    drop((0..1024).map(|i| first.alloc([i; 4])).collect::<Vec<_>>());
    first.release_thread_cache();
    assert!(first.stats().cached_in_depot > 0, "{}", first.stats());
    FAIL.with(|f| f.set(true));
    let released = proxalloc::trim_all();
    FAIL.with(|f| f.set(false));
    let s = first.stats();
    assert_eq!(
        s.cached_in_depot, 0,
        "the walk by index missed entry 0: {s}"
    );
    assert!(released > 0);
}
