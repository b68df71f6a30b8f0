//! Pins that keep a thread's cache registered while a `LocalCache` points at it.

use super::{Owner, ThreadCache};

/// Keeps a thread's cache from being retired by `release_thread_cache` while a
/// `LocalCache` points at it.
pub(crate) struct Pin(*const ThreadCache);

impl Pin {
    /// Pins this thread's registered cache.
    pub(crate) fn new(cache: Owner<'_>) -> Self {
        let pins = cache.pins.get().checked_add(1);
        cache
            .pins
            .set(pins.expect("proxalloc: with_local nested 65535 deep"));
        Pin(cache.cache)
    }
}

impl Drop for Pin {
    fn drop(&mut self) {
        // SAFETY: a pinned cache is not freed until its thread exits, this pin lives on
        // that thread's stack, and no owner borrow is live where a pin drops.
        unsafe { (*self.0).pins.set((*self.0).pins.get() - 1) };
    }
}
