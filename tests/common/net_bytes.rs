//! A global allocator for integration tests: it counts the net bytes one thread
//! allocates while asked to, and fails the allocations a test's `fail` function picks.
//! Test files include it with `#[path = "common/net_bytes.rs"] mod net_bytes;`.

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;

std::thread_local! {
    // `const`-initialised and without a destructor: usable inside the global allocator,
    // at any point of the thread's life, without allocating.
    /// Net bytes this thread allocated while `Some`.
    static NET: Cell<Option<isize>> = const { Cell::new(None) };
}

fn count(delta: isize) {
    let _ = NET.try_with(|n| {
        if let Some(v) = n.get() {
            n.set(Some(v + delta));
        }
    });
}

/// Starts counting this thread's net bytes from zero.
pub fn start_counting() {
    NET.with(|n| n.set(Some(0)));
}

/// Stops counting and returns the net bytes this thread allocated since
/// [`start_counting`].
pub fn stop_counting() -> isize {
    NET.with(|n| n.replace(None))
        .expect("start_counting was called")
}

/// Net bytes `f` left allocated on this thread.
#[allow(dead_code)] // not every including file measures a closure
pub fn net_bytes(f: impl FnOnce()) -> isize {
    start_counting();
    f();
    stop_counting()
}

/// Forwards to `System`, counting; `alloc` returns null where `fail` says so (`realloc`
/// never fails: a `Vec` growing inside a test must not).
pub struct NetCounting {
    pub fail: fn(Layout) -> bool,
}

/// A `fail` that never fails.
#[allow(dead_code)] // not every including file injects no failures
pub fn never(_: Layout) -> bool {
    false
}

// SAFETY: forwards to `System`; a failure is a null return, as `GlobalAlloc` allows.
unsafe impl GlobalAlloc for NetCounting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        if (self.fail)(layout) {
            return std::ptr::null_mut();
        }
        count(layout.size() as isize);
        // SAFETY: forwarded.
        unsafe { System.alloc(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        count(-(layout.size() as isize));
        // SAFETY: forwarded.
        unsafe { System.dealloc(ptr, layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        count(new_size as isize - layout.size() as isize);
        // SAFETY: forwarded.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}
