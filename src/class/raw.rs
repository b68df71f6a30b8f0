//! The object paths of [`ClassAllocator`]: memory for one object from this CPU's or this
//! thread's cache (the fast path, inlined into callers) or the slow paths, both through the cache
//! seam ([`crate::core::cache`]), and back.
//! Everything typed (values, handles) is in the parent module; this is raw memory.

use std::mem::size_of;
use std::ptr::NonNull;

use super::ClassAllocator;
use crate::core::cache;
use crate::debug;
use crate::error::AllocError;

impl<T> ClassAllocator<T> {
    /// Allocates memory for one object (uninitialised), through this CPU's or thread's
    /// cache.
    #[inline(always)]
    pub(crate) fn alloc_raw(&self) -> Result<NonNull<T>, AllocError> {
        match self.alloc_fast() {
            Some(p) => Ok(p),
            None => self.alloc_miss(),
        }
    }

    /// The fast path alone: an object from the inline cache's loaded magazine (this CPU's
    /// with the `percpu` feature, else this thread's; see `Hints::alloc`), or `None`
    /// (with nothing changed) when the slow path must run. It makes no calls, so a
    /// caller's value can be built straight into the object (see `try_alloc`).
    #[inline(always)]
    fn alloc_fast(&self) -> Option<NonNull<T>> {
        let p = self.hints.alloc()?;
        self.on_alloc(p);
        Some(p.cast())
    }

    /// Everything but the fast path (see [`cache::alloc`]).
    #[cold]
    #[inline(never)]
    fn alloc_raw_slow(&self) -> Result<NonNull<T>, AllocError> {
        #[cfg(test)]
        slow_entries::count();
        let p = cache::alloc(&self.engine_arc()).ok_or(AllocError)?;
        self.on_alloc(p);
        Ok(p.cast())
    }

    /// The inline fast path missed: the other kind of cache's fast path (the thread
    /// lookup with the `percpu` feature, a per-CPU allocator's sequence without it), then
    /// a boxed cache's (an allocator past the thread table's inline caches), all in
    /// `Hints::miss_alloc`, else the slow path. Out of line, but small, so
    /// that such an allocation costs one short call. (`#[cold]` for the inline fast
    /// path's sake: a call the caller believes hot makes it save registers.)
    #[cold]
    #[inline(never)]
    fn alloc_miss(&self) -> Result<NonNull<T>, AllocError> {
        match self.hints.miss_alloc() {
            Some(p) => {
                self.on_alloc(p);
                Ok(p.cast())
            }
            None => self.alloc_raw_slow(),
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

    /// Returns one object's memory (its value already dropped or moved out) through this
    /// CPU's or thread's cache.
    ///
    /// # Safety
    /// `p` came from this allocator and nobody uses it any more.
    #[inline(always)]
    pub(crate) unsafe fn free_raw(&self, p: NonNull<T>) {
        let p = p.cast::<u8>();
        self.on_free(p);
        // SAFETY: forwarded from the caller.
        if !unsafe { self.hints.free(p) } {
            // SAFETY: forwarded from the caller.
            unsafe { self.free_miss(p) }
        }
    }

    /// Everything but the fast path of `free_raw` (`p` already checked and poisoned).
    ///
    /// # Safety
    /// As for `free_raw`.
    #[cold]
    #[inline(never)]
    unsafe fn free_raw_slow(&self, p: NonNull<u8>) {
        #[cfg(test)]
        slow_entries::count();
        // SAFETY: forwarded from the caller.
        unsafe { cache::free(&self.engine_arc(), p) }
    }

    /// The inline fast path of a free missed: a per-CPU allocator's sequence, then a
    /// boxed cache's (see [`alloc_miss`](Self::alloc_miss)), else the slow path.
    ///
    /// # Safety
    /// As for `free_raw`.
    #[cold]
    #[inline(never)]
    unsafe fn free_miss(&self, p: NonNull<u8>) {
        // SAFETY: forwarded from the caller.
        unsafe {
            if !self.hints.miss_free(p) {
                self.free_raw_slow(p)
            }
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

/// `ClassAllocator`'s slow paths (every handle's and the buffers', not `with_local`'s)
/// taken on this thread, counted in the crate's tests: that a
/// warm cache serves every operation without one is a property no result shows (a
/// fast path that misses still works, through the slow path), so a test counts them.
#[cfg(test)]
pub(crate) mod slow_entries {
    use std::cell::Cell;

    std::thread_local! {
        static ENTRIES: Cell<u64> = const { Cell::new(0) };
    }

    pub(super) fn count() {
        ENTRIES.with(|n| n.set(n.get() + 1));
    }

    /// Slow paths taken on this thread so far.
    pub(crate) fn taken() -> u64 {
        ENTRIES.with(Cell::get)
    }
}
