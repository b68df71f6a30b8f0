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
pub(crate) struct Pinned(Held);

/// What a [`Pinned`] holds.
enum Held {
    /// This thread's cache, pinned (the pin is held for its drop).
    Cache(Owner<'static>, #[allow(dead_code)] Pin),
    /// No cache: no thread-local storage (objects go straight to and from the backing
    /// allocator).
    Backing,
    /// A direct engine: its operations take the allocator's own paths.
    Direct,
}

impl Pinned {
    /// Pins this thread's cache for `e` (registering one), unless `e` is direct.
    pub(crate) fn new(e: &Arc<Engine>) -> Self {
        if e.capped() || e.percpu().is_some() {
            return Pinned(Held::Direct);
        }
        Pinned(match cache_or_register(e) {
            Some(c) => Held::Cache(c, Pin::new(c)),
            None => Held::Backing,
        })
    }

    /// Whether the engine's operations must take the allocator's own paths (it is
    /// capped, or has per-CPU caches), not this.
    #[inline(always)]
    pub(crate) fn direct(&self) -> bool {
        matches!(self.0, Held::Direct)
    }

    /// An object of `e` (the engine this was pinned for); see [`alloc`](super::alloc). Not for direct
    /// engines.
    #[inline(always)]
    pub(crate) fn alloc(&self, e: &Engine) -> Option<NonNull<u8>> {
        debug_assert!(!self.direct());
        match &self.0 {
            // SAFETY: this thread's cache for `e`, pinned for the whole call; nothing
            // borrows its owner part between calls into the allocator.
            Held::Cache(c, _) => unsafe { alloc_from(e, *c) },
            // (A direct engine's callers never come here: see `direct`.)
            Held::Backing | Held::Direct => e.alloc_backing(),
        }
    }

    /// Gives `p` back to `e` (the engine this was pinned for). Not for direct engines.
    ///
    /// # Safety
    /// As for [`free`](super::free).
    #[inline(always)]
    pub(crate) unsafe fn free(&self, e: &Engine, p: NonNull<u8>) {
        debug_assert!(!self.direct());
        match &self.0 {
            // SAFETY: as in `alloc`; `p` as promised.
            Held::Cache(c, _) => unsafe { free_into(e, *c, p) },
            // SAFETY: forwarded.
            Held::Backing | Held::Direct => unsafe { e.free_backing(p) },
        }
    }
}

impl Drop for Pinned {
    fn drop(&mut self) {
        // The pin goes first: a flush honoured now may retire the cache.
        self.0 = Held::Backing;
        table::honour_flush_requests();
    }
}
