//! [`ClassAllocator::with_local`] and the [`LocalCache`] it lends: this thread's cache of
//! one allocator, in hand, for event loops that allocate and free many objects in one turn.

use std::alloc::Layout;
use std::fmt;
use std::marker::PhantomData;

use super::raw::FreeOnUnwind;
use super::{ClassAllocator, ClassBox};
use crate::core::cache::Pinned;
use crate::core::engine::Engine;
use crate::error::AllocError;

/// This thread's cache of one allocator, in hand: see [`ClassAllocator::with_local`].
/// Allocations and frees through it skip the thread-local lookup (a per-CPU or capped
/// allocator holds no thread cache there: its operations take the allocator's own
/// paths).
///
/// ```
/// use proxalloc::{ClassAllocator, LocalCache};
/// static PACKETS: ClassAllocator<[u8; 64]> = ClassAllocator::new("doc-local-cache");
/// fn echo(cache: &LocalCache<'static, [u8; 64]>, byte: u8) -> u8 {
///     let p = cache.alloc([byte; 64]);
///     let first = p[0];
///     cache.free(p);
///     first
/// }
/// assert_eq!(PACKETS.with_local(|cache| echo(cache, 9)), 9);
/// assert_eq!(PACKETS.stats().live, 0);
/// ```
pub struct LocalCache<'a, T> {
    pub(super) alloc: &'a ClassAllocator<T>,
    /// This thread's cache, pinned for the whole `with_local` call.
    pub(super) cache: Pinned,
    pub(super) _not_send: PhantomData<*mut ()>,
}

impl<T> ClassAllocator<T> {
    /// Runs `f` with this thread's cache in hand, so allocations and frees in `f` skip
    /// the thread-local lookup: for event-loop workers that own their thread, with
    /// per-thread caches. A per-CPU allocator (the default with the `percpu` feature) or
    /// a capped one has no thread cache to hold: `f` still runs, and its operations take
    /// the allocator's ordinary fast paths. On the way out it honours flush requests that
    /// `trim_all` posted meanwhile (an event loop that only ever hits its cache takes no
    /// slow path that would).
    ///
    /// ```
    /// use proxalloc::ClassAllocator;
    /// static EVENTS: ClassAllocator<[u8; 64]> = ClassAllocator::new("events");
    /// let total = EVENTS.with_local(|cache| {
    ///     (0..1000).map(|i| {
    ///         let e = cache.alloc([i as u8; 64]);
    ///         let first = e[0] as u64;
    ///         cache.free(e);
    ///         first
    ///     }).sum::<u64>()
    /// });
    /// assert!(total > 0);
    /// ```
    ///
    /// The handle is shared (`&LocalCache`), so two of them, from nested calls, cannot
    /// be swapped or moved out of the call that made them:
    ///
    /// ```compile_fail
    /// use proxalloc::ClassAllocator;
    /// static A: ClassAllocator<u8> = ClassAllocator::new("a");
    /// A.with_local(|outer| A.with_local(|inner| std::mem::swap(outer, inner)));
    /// ```
    ///
    /// # Panics
    /// If calls for one allocator nest more than 65,535 deep on one thread (the count of
    /// pins on its cache is 16 bits).
    pub fn with_local<'a, R>(&'a self, f: impl FnOnce(&LocalCache<'a, T>) -> R) -> R {
        // Pinned, so `release_thread_cache` (called from `f`) flushes the cache instead
        // of retiring it; unpinned on the way out, where flush requests are honoured.
        f(&LocalCache {
            alloc: self,
            cache: Pinned::new(&self.engine_arc()),
            _not_send: PhantomData,
        })
    }
}

// The object paths are `inline(always)`, like `ClassAllocator::alloc`: with plain
// `#[inline]`, a generic caller (the harness's W1) kept `alloc_with` a call, which cost
// every pair (measured: `docs/benchmarks.md#localcache-inlined`).
impl<'a, T> LocalCache<'a, T> {
    #[inline]
    fn engine(&self) -> &'a Engine {
        self.alloc.engine()
    }

    /// Allocates an object holding `value` (see [`ClassAllocator::alloc`]).
    ///
    /// ```
    /// use proxalloc::ClassAllocator;
    /// static EVENTS: ClassAllocator<(u32, u32)> = ClassAllocator::new("doc-local-alloc");
    /// let sum = EVENTS.with_local(|cache| {
    ///     let e = cache.alloc((2, 3));
    ///     e.0 + e.1 // `e` drops here, through the allocator's ordinary fast path
    /// });
    /// assert_eq!(sum, 5);
    /// ```
    #[inline(always)]
    #[must_use = "dropping the handle frees the object at once"]
    pub fn alloc(&self, value: T) -> ClassBox<'a, T> {
        self.alloc_with(|| value)
    }

    /// Allocates an object constructed by `init` (see [`ClassAllocator::alloc_with`]).
    ///
    /// ```
    /// use proxalloc::ClassAllocator;
    /// static ROWS: ClassAllocator<[u16; 32]> = ClassAllocator::new("doc-local-alloc-with");
    /// let last = ROWS.with_local(|cache| {
    ///     let row = cache.alloc_with(|| std::array::from_fn(|i| i as u16));
    ///     let last = row[31];
    ///     cache.free(row);
    ///     last
    /// });
    /// assert_eq!(last, 31);
    /// ```
    #[inline(always)]
    #[must_use = "dropping the handle frees the object at once"]
    pub fn alloc_with(&self, init: impl FnOnce() -> T) -> ClassBox<'a, T> {
        match self.try_alloc_with(init) {
            Ok(h) => h,
            Err(AllocError) => std::alloc::handle_alloc_error(Layout::new::<T>()),
        }
    }

    /// Allocates an object holding `value`, or returns an error (dropping `value`) if the
    /// backing allocator fails or a [`Config::max_live`](crate::Config::max_live) cap is
    /// reached (see [`ClassAllocator::try_alloc`]).
    ///
    /// ```
    /// use proxalloc::{AllocError, ClassAllocator, Config};
    /// static SEATS: ClassAllocator<u64> =
    ///     ClassAllocator::with_config("doc-local-try-alloc", Config::new().max_live(1));
    /// SEATS.with_local(|cache| {
    ///     let first = cache.try_alloc(1).expect("under the cap");
    ///     assert_eq!(cache.try_alloc(2).err(), Some(AllocError)); // the cap is reached
    ///     cache.free(first);
    ///     assert_eq!(*cache.try_alloc(3).unwrap(), 3);
    /// });
    /// ```
    #[inline(always)]
    #[must_use = "dropping the result frees the object at once"]
    pub fn try_alloc(&self, value: T) -> Result<ClassBox<'a, T>, AllocError> {
        self.try_alloc_with(|| value)
    }

    /// Allocates an object constructed by `init`, or returns an error without calling
    /// `init` (see [`try_alloc`](Self::try_alloc)). If `init` panics, the memory goes
    /// back to the cache and the panic continues.
    ///
    /// ```
    /// use proxalloc::ClassAllocator;
    /// static NAMES: ClassAllocator<String> = ClassAllocator::new("doc-local-try-alloc-with");
    /// let len = NAMES.with_local(|cache| {
    ///     let name = cache.try_alloc_with(|| "proxalloc".to_string()).expect("out of memory");
    ///     name.len()
    /// });
    /// assert_eq!(len, 9);
    /// ```
    #[inline(always)]
    #[must_use = "dropping the result frees the object at once"]
    pub fn try_alloc_with(&self, init: impl FnOnce() -> T) -> Result<ClassBox<'a, T>, AllocError> {
        if self.cache.direct() {
            return self.alloc.try_alloc_with(init);
        }
        let object = self.cache.alloc(self.engine()).ok_or(AllocError)?;
        self.alloc.on_alloc(object);
        let object = object.cast::<T>();
        let guard = FreeOnUnwind {
            alloc: self.alloc,
            object,
        };
        // SAFETY: valid uninitialised memory for one `T`.
        unsafe { object.as_ptr().write(init()) };
        std::mem::forget(guard);
        // SAFETY: fresh memory of this allocator, now initialised, owned by nobody else.
        Ok(unsafe { ClassBox::from_raw(self.alloc, object) })
    }

    /// Drops an object and recycles its memory into this cache.
    ///
    /// # Panics
    /// If `object` came from a different allocator.
    ///
    /// ```
    /// use proxalloc::ClassAllocator;
    /// static BUFS: ClassAllocator<Vec<u8>> = ClassAllocator::new("doc-local-free");
    /// BUFS.with_local(|cache| {
    ///     let b = cache.alloc(vec![0; 16]);
    ///     cache.free(b); // drops the `Vec`, recycles the memory into this cache
    /// });
    /// let s = BUFS.stats();
    /// assert_eq!((s.live, s.cached_in_threads), (0, 1));
    /// ```
    ///
    /// ```should_panic
    /// use proxalloc::ClassAllocator;
    /// static A: ClassAllocator<u8> = ClassAllocator::new("doc-local-free-a");
    /// static B: ClassAllocator<u8> = ClassAllocator::new("doc-local-free-b");
    /// let b = B.alloc(1);
    /// A.with_local(|cache| cache.free(b)); // panics: `b` belongs to `B`
    /// ```
    #[inline(always)]
    pub fn free(&self, object: ClassBox<'_, T>) {
        assert!(
            std::ptr::eq(object.alloc, self.alloc),
            "proxalloc: object freed into a different allocator ({:?}) than its own ({:?})",
            self.alloc.name,
            object.alloc.name,
        );
        if self.cache.direct() {
            return drop(object);
        }
        let ptr = ClassBox::into_raw(object);
        let guard = FreeOnUnwind {
            alloc: self.alloc,
            object: ptr,
        };
        // SAFETY: the handle owned an initialised value; dropped exactly once here.
        unsafe { ptr.as_ptr().drop_in_place() };
        std::mem::forget(guard);
        let p = ptr.cast::<u8>();
        self.alloc.on_free(p);
        // SAFETY: the memory is this allocator's and no longer used.
        unsafe { self.cache.free(self.engine(), p) }
    }
}

impl<T> fmt::Debug for LocalCache<'_, T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LocalCache")
            .field("allocator", &self.alloc.name)
            .finish_non_exhaustive()
    }
}
