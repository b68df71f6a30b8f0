//! The object paths of [`ClassAllocator`]: memory for one object from this thread's
//! cache (the fast path, inlined into callers) or the engine's slow paths, and back.
//! Everything typed (values, handles) is in the parent module; this is raw memory.

use std::mem::size_of;
use std::ptr::NonNull;

use super::ClassAllocator;
use crate::core::engine::Engine;
use crate::core::table::{self, Lookup};
use crate::core::thread_cache::ThreadCache;
use crate::debug;
use crate::error::AllocError;
use crate::sync::Arc;

impl<T> ClassAllocator<T> {
    /// This thread's cache, found without touching the engine.
    #[inline(always)]
    fn lookup(&self) -> Lookup {
        use crate::sync::Ordering;
        table::lookup(
            self.index_hint.load(Ordering::Relaxed),
            self.instance_hint.load(Ordering::Relaxed),
        )
    }

    /// This thread's inline cache, if it has one (see [`table::lookup_fast`]).
    #[inline(always)]
    fn lookup_fast(&self) -> Option<*const ThreadCache> {
        // Not `load(Relaxed)`: see `sync::relaxed` (an atomic here would make every
        // caller's value be built on the stack and copied).
        table::lookup_fast(
            crate::sync::relaxed::load_u32(&self.index_hint),
            crate::sync::relaxed::load_u64(&self.instance_hint),
        )
    }

    /// Allocates memory for one object (uninitialised), through this thread's cache.
    #[inline(always)]
    pub(crate) fn alloc_raw(&self) -> Result<NonNull<T>, AllocError> {
        match self.alloc_fast() {
            Some(p) => Ok(p),
            None => self.alloc_raw_slow(),
        }
    }

    /// The fast path alone: an object from this thread's loaded magazine, or `None`
    /// (with nothing changed) when the slow path must run. It makes no calls, so a
    /// caller's value can be built straight into the object (see `try_alloc`).
    #[inline(always)]
    fn alloc_fast(&self) -> Option<NonNull<T>> {
        let c = self.lookup_fast()?;
        // SAFETY: this thread's own cache; nothing borrows its owner part here.
        let p = unsafe { (*c).pop() }?;
        self.on_alloc(p);
        Some(p.cast())
    }

    /// Everything but the fast path: refill, registration, detached and bypass modes.
    #[cold]
    #[inline(never)]
    fn alloc_raw_slow(&self) -> Result<NonNull<T>, AllocError> {
        if self.capped() {
            let p = self.alloc_capped().ok_or(AllocError)?;
            self.on_alloc(p);
            return Ok(p.cast());
        }
        let p = match self.lookup() {
            // SAFETY: this thread's own cache; nothing borrows its owner part here.
            Lookup::Cache(c) => unsafe { self.engine().alloc_from(&*c) },
            _ => self.alloc_cold(),
        };
        let p = p.ok_or(AllocError)?;
        self.on_alloc(p);
        Ok(p.cast())
    }

    /// Whether `Config::max_live` caps this allocator.
    #[inline(always)]
    pub(super) fn capped(&self) -> bool {
        self.config.max_live != usize::MAX
    }

    /// This thread's cache, registering one if it has none (`None` without thread-local
    /// storage). Registration may run user code, so callers use the result right away.
    pub(super) fn cache_or_register(&self, e: &Arc<Engine>) -> Option<*const ThreadCache> {
        if let Lookup::Unregistered = table::lookup(e.index(), e.instance()) {
            Engine::register(e);
        }
        match table::lookup(e.index(), e.instance()) {
            Lookup::Cache(c) => Some(c),
            _ => None,
        }
    }

    /// A capped allocator's allocation: a permit, then the object.
    #[cold]
    #[inline(never)]
    fn alloc_capped(&self) -> Option<NonNull<u8>> {
        let e = self.engine_arc();
        // SAFETY: this thread's own cache; nothing borrows its owner part here.
        let c = self.cache_or_register(&e).map(|c| unsafe { &*c });
        if !e.take_credit(c) {
            return None;
        }
        /// Gives the permit back unless the allocation succeeds: if it fails, or unwinds
        /// (a recycling allocator's `create` panicked). To the shared count: the slow path
        /// may have run user code that retired this thread's cache.
        struct PermitGuard<'e>(&'e Engine);
        impl Drop for PermitGuard<'_> {
            fn drop(&mut self) {
                self.0.return_credit(None);
            }
        }
        let guard = PermitGuard(&e);
        let p = match c {
            // SAFETY: as above.
            Some(c) => unsafe { e.alloc_from(c) },
            None => e.alloc_backing(),
        };
        if p.is_some() {
            std::mem::forget(guard);
        }
        p
    }

    /// A capped allocator's free: the permit back first (the value is gone), then the
    /// memory.
    ///
    /// # Safety
    /// As for `free_raw`.
    #[cold]
    #[inline(never)]
    unsafe fn free_capped(&self, p: NonNull<u8>) {
        let e = self.engine_arc();
        // SAFETY: this thread's own cache; nothing borrows its owner part here.
        let c = self.cache_or_register(&e).map(|c| unsafe { &*c });
        e.return_credit(c);
        match c {
            // SAFETY: `p` as the caller promised.
            Some(c) => unsafe { e.free_into(c, p) },
            // SAFETY: as above.
            None => unsafe { e.free_backing(p) },
        }
    }

    /// Misuse detection: records an object handed out (compiled out of release builds
    /// without the `debug-checks` feature).
    #[inline(always)]
    pub(super) fn on_alloc(&self, p: NonNull<u8>) {
        if debug::ENABLED {
            let e = self.engine();
            debug::on_alloc(p.as_ptr() as usize, size_of::<T>(), e.instance(), self.name);
        }
    }

    /// Misuse detection: checks and poisons an object being freed.
    #[inline(always)]
    pub(crate) fn on_free(&self, p: NonNull<u8>) {
        if debug::ENABLED {
            let e = self.engine();
            debug::on_free(p.as_ptr() as usize, size_of::<T>(), e.instance(), self.name);
            if self.hooks.is_none_or(|h| h.values.is_none()) {
                // SAFETY: the object's memory is ours until it is recycled below, and it
                // holds no value (a recycling allocator's objects stay live: no poison).
                unsafe { p.as_ptr().write_bytes(debug::POISON, size_of::<T>()) };
            }
        }
    }

    /// No cache yet: registers one (which may run user code: see `table::install`),
    /// then looks again; without thread-local storage, the backing allocator.
    #[cold]
    #[inline(never)]
    fn alloc_cold(&self) -> Option<NonNull<u8>> {
        let e = self.engine_arc();
        match self.cache_or_register(&e) {
            // SAFETY: this thread's own cache; nothing borrows its owner part here.
            Some(c) => unsafe { e.alloc_from(&*c) },
            None => e.alloc_backing(),
        }
    }

    /// Returns one object's memory (its value already dropped or moved out) through this
    /// thread's cache.
    ///
    /// # Safety
    /// `p` came from this allocator and nobody uses it any more.
    #[inline(always)]
    pub(crate) unsafe fn free_raw(&self, p: NonNull<T>) {
        let p = p.cast::<u8>();
        self.on_free(p);
        if let Some(c) = self.lookup_fast() {
            // SAFETY: this thread's own cache; nothing borrows its owner part here.
            if unsafe { (*c).push(p) } {
                return;
            }
        }
        // SAFETY: forwarded from the caller.
        unsafe { self.free_raw_slow(p) }
    }

    /// Everything but the fast path of `free_raw` (`p` already checked and poisoned).
    ///
    /// # Safety
    /// As for `free_raw`.
    #[cold]
    #[inline(never)]
    unsafe fn free_raw_slow(&self, p: NonNull<u8>) {
        if self.capped() {
            // SAFETY: forwarded from the caller.
            return unsafe { self.free_capped(p) };
        }
        match self.lookup() {
            // SAFETY: this thread's own cache, nothing borrows its owner part here; `p`
            // as the caller promised.
            Lookup::Cache(c) => unsafe { self.engine().free_into(&*c, p) },
            // SAFETY: forwarded from the caller.
            _ => unsafe { self.free_cold(p) },
        }
    }

    #[cold]
    #[inline(never)]
    unsafe fn free_cold(&self, p: NonNull<u8>) {
        let e = self.engine_arc();
        match self.cache_or_register(&e) {
            // SAFETY: this thread's own cache, nothing borrows its owner part here; `p`
            // as the caller promised.
            Some(c) => unsafe { e.free_into(&*c, p) },
            // SAFETY: forwarded from the caller.
            None => unsafe { e.free_backing(p) },
        }
    }
}

/// Gives an object's memory back (without dropping anything in it) if construction unwinds.
pub(super) struct FreeOnUnwind<'a, T> {
    pub(super) alloc: &'a ClassAllocator<T>,
    pub(super) object: NonNull<T>,
}

impl<T> Drop for FreeOnUnwind<'_, T> {
    #[inline(always)]
    fn drop(&mut self) {
        // SAFETY: the memory came from `alloc` and holds no value.
        unsafe { self.alloc.free_raw(self.object) };
    }
}
