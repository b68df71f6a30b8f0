//! The cache in hand for a `with_local` call.

use std::ptr::NonNull;

use super::{alloc_from, cache_or_register, free_into};
use crate::core::engine::Engine;
use crate::core::table;
use crate::core::thread_cache::{Owner, Pin};
use crate::sync::Arc;

/// This thread's cache for one engine, in hand for a `with_local` call: pinned, so
/// `release_thread_cache` (from user code in the call) flushes it instead of retiring
/// it. On drop it honours flush requests posted meanwhile (an event loop that only ever
/// hits its cache takes no slow path that would).
///
/// A capped or per-CPU engine holds no cache here ([`direct`](Self::direct)): its
/// operations take the allocator's own paths, which count permits or find the CPU.
pub(crate) struct Pinned {
    /// `None` without thread-local storage (objects go straight to and from the backing
    /// allocator), or for a direct engine.
    cache: Option<(Owner<'static>, Pin)>,
    direct: bool,
}

impl Pinned {
    /// Pins this thread's cache for `e` (registering one), unless `e` is direct.
    pub(crate) fn new(e: &Arc<Engine>) -> Self {
        let direct = e.capped() || e.percpu().is_some();
        Pinned {
            cache: if direct {
                None
            } else {
                cache_or_register(e).map(|c| (c, Pin::new(c)))
            },
            direct,
        }
    }

    /// Whether the engine's operations must take the allocator's own paths (it is
    /// capped, or has per-CPU caches), not this.
    #[inline(always)]
    pub(crate) fn direct(&self) -> bool {
        self.direct
    }

    /// An object of `e` (the engine this was pinned for); see [`alloc`]. Not for direct
    /// engines.
    #[inline(always)]
    pub(crate) fn alloc(&self, e: &Engine) -> Option<NonNull<u8>> {
        debug_assert!(!self.direct);
        match self.cache {
            // SAFETY: this thread's cache for `e`, pinned for the whole call; nothing
            // borrows its owner part between calls into the allocator.
            Some((c, _)) => unsafe { alloc_from(e, c) },
            None => e.alloc_backing(),
        }
    }

    /// Gives `p` back to `e` (the engine this was pinned for). Not for direct engines.
    ///
    /// # Safety
    /// As for [`free`].
    #[inline(always)]
    pub(crate) unsafe fn free(&self, e: &Engine, p: NonNull<u8>) {
        debug_assert!(!self.direct);
        match self.cache {
            // SAFETY: as in `alloc`; `p` as promised.
            Some((c, _)) => unsafe { free_into(e, c, p) },
            // SAFETY: forwarded.
            None => unsafe { e.free_backing(p) },
        }
    }
}

impl Drop for Pinned {
    fn drop(&mut self) {
        drop(self.cache.take());
        table::honour_flush_requests();
    }
}
