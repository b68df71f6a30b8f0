//! Object caching in Bonwick's sense: objects that own buffers are reset on free instead
//! of dropped, so their capacity survives to the next request. A general-purpose
//! allocator cannot do this; it only ever sees raw memory.

use std::fmt;
use std::marker::PhantomData;
use std::ops::{Deref, DerefMut};
use std::ptr::NonNull;

use crate::class::ClassAllocator;
use crate::config::Config;
use crate::core::backing::{ObjectHooks, ValueHooks};
use crate::error::AllocError;
use crate::rows::Stats;
use crate::sync::const_fn;

/// A type whose values can be reset for reuse.
///
/// ```
/// use proxalloc::Recycle;
///
/// /// Parsed request headers: the strings keep their capacity between requests.
/// struct Headers { fields: Vec<(String, String)>, used: usize }
///
/// impl Recycle for Headers {
///     fn create() -> Self {
///         Headers { fields: Vec::new(), used: 0 }
///     }
///     fn recycle(&mut self) -> bool {
///         // A request with a huge header list would pin its buffers forever: drop it.
///         if self.fields.len() > 100 {
///             return false;
///         }
///         for (name, value) in &mut self.fields {
///             name.clear();
///             value.clear();
///         }
///         self.used = 0;
///         true
///     }
/// }
/// ```
///
/// A recycling allocator keeps values after their handles are gone, hands them to
/// whichever thread asks next, and destroys them on whichever thread trims, flushes or
/// drops its caches, possibly after the allocator itself is gone (a `trim_all` in flight,
/// another thread's cache released at its next slow path or exit). So a `Recycle` type
/// must be `Send` and `'static`: it may neither stay on one thread nor borrow anything.
///
/// ```compile_fail
/// use proxalloc::Recycle;
/// use std::rc::Rc;
/// struct Shared(Rc<u8>);
/// impl Recycle for Shared { // error: `Rc<u8>` cannot be sent between threads safely
///     fn create() -> Self { Shared(Rc::new(0)) }
///     fn recycle(&mut self) -> bool { true }
/// }
/// ```
///
/// ```compile_fail
/// use proxalloc::Recycle;
/// struct Borrowing<'a>(Option<&'a u64>);
/// impl<'a> Recycle for Borrowing<'a> { // error: the type may not live long enough
///     fn create() -> Self { Borrowing(None) }
///     fn recycle(&mut self) -> bool { true }
/// }
/// ```
pub trait Recycle: Sized + Send + 'static {
    /// A fresh value, for when no recycled one is cached.
    ///
    /// ```
    /// use proxalloc::{Recycle, RecyclingAllocator};
    /// struct Buf(Vec<u8>);
    /// impl Recycle for Buf {
    ///     fn create() -> Self { Buf(Vec::with_capacity(512)) } // sized for the common case
    ///     fn recycle(&mut self) -> bool { self.0.clear(); true }
    /// }
    /// static BUFS: RecyclingAllocator<Buf> = RecyclingAllocator::new("doc-recycle-create");
    /// assert!(BUFS.get().0.capacity() >= 512); // nothing cached yet: made by `create`
    /// ```
    fn create() -> Self;

    /// Resets `self` for its next user, or returns `false` to have it dropped instead
    /// (for example when a buffer grew past a bound; shrinking it with `shrink_to` and
    /// returning `true` is the other choice). If it panics, the value is dropped and the
    /// panic continues (if the value's `Drop` panics too, that is a panic during
    /// unwinding, and Rust aborts the process).
    ///
    /// ```
    /// use proxalloc::{Recycle, RecyclingAllocator};
    /// struct Buf(Vec<u8>);
    /// impl Recycle for Buf {
    ///     fn create() -> Self { Buf(Vec::new()) }
    ///     fn recycle(&mut self) -> bool {
    ///         self.0.clear();
    ///         self.0.capacity() <= 4096 // a buffer that grew past 4 KiB is dropped
    ///     }
    /// }
    /// static BUFS: RecyclingAllocator<Buf> = RecyclingAllocator::new("doc-recycle-recycle");
    /// let mut small = BUFS.get();
    /// small.0.extend_from_slice(&[1; 100]);
    /// drop(small); // cleared and kept
    /// assert_eq!(BUFS.stats().cached_in_threads, 1);
    /// let mut big = BUFS.get();
    /// assert!(big.0.is_empty()); // the recycled value, reset
    /// big.0.resize(1 << 20, 0);
    /// drop(big); // refused: dropped, not cached
    /// assert_eq!(BUFS.stats().cached_in_threads, 0);
    /// ```
    fn recycle(&mut self) -> bool;
}

/// Constructs a `T` in place (a [`ValueHooks::construct`]).
///
/// # Safety
/// `p` is valid, aligned, uninitialised memory for a `T`.
unsafe fn construct<T: Recycle>(p: *mut u8) {
    // SAFETY: per the contract.
    unsafe { p.cast::<T>().write(T::create()) };
}

/// Drops a `T` in place (a [`ValueHooks::destroy`]).
///
/// # Safety
/// `p` holds a live `T` that is not used again.
unsafe fn destroy<T>(p: *mut u8) {
    // SAFETY: per the contract.
    unsafe { p.cast::<T>().drop_in_place() };
}

/// An allocator that caches *constructed* objects: [`get`](Self::get) hands out a
/// recycled value (or a fresh one from [`Recycle::create`]), and dropping the handle calls
/// [`Recycle::recycle`] and keeps the value, buffers and all, in the CPU's (or the
/// thread's) cache.
///
/// Cached values are dropped when they leave the caches: over the depot budget, on
/// `trim`/`trim_all`, and when the allocator is dropped (the CPUs', the depot's and the
/// dropping thread's at once; another thread's at that thread's next slow path or exit,
/// on that thread).
///
/// ```
/// use proxalloc::{Recycle, RecyclingAllocator};
///
/// #[derive(Default)]
/// struct Body(Vec<u8>);
/// impl Recycle for Body {
///     fn create() -> Self { Body(Vec::with_capacity(4096)) }
///     fn recycle(&mut self) -> bool { self.0.clear(); self.0.capacity() <= 1 << 20 }
/// }
///
/// static BODIES: RecyclingAllocator<Body> = RecyclingAllocator::new("bodies");
///
/// let mut b = BODIES.get();
/// b.0.extend_from_slice(b"hello");
/// let buffer = b.0.as_ptr();
/// drop(b); // cleared, kept
/// let again = BODIES.get();
/// assert!(again.0.is_empty());
/// assert_eq!(again.0.as_ptr(), buffer, "the same buffer, no allocation");
/// ```
///
/// Values are `Send + 'static` (see [`Recycle`]), so the allocator can be a `static`
/// shared by every thread.
pub struct RecyclingAllocator<T: Recycle> {
    inner: ClassAllocator<T>,
}

impl<T: Recycle> RecyclingAllocator<T> {
    const HOOKS: ObjectHooks = ObjectHooks {
        values: Some(ValueHooks {
            construct: construct::<T>,
            destroy: destroy::<T>,
        }),
        memory: None,
    };

    const_fn! {
        /// An allocator named `name`, with the default [`Config`].
        ///
        /// ```
        /// use proxalloc::{Recycle, RecyclingAllocator};
        /// struct Buf(Vec<u8>);
        /// impl Recycle for Buf {
        ///     fn create() -> Self { Buf(Vec::with_capacity(4096)) }
        ///     fn recycle(&mut self) -> bool { self.0.clear(); true }
        /// }
        /// static BUFS: RecyclingAllocator<Buf> = RecyclingAllocator::new("doc-recycling-new");
        /// assert!(BUFS.get().0.capacity() >= 4096);
        /// ```
        pub fn new(name: &'static str) -> Self {
            Self::with_config(name, Config::new())
        }
    }

    const_fn! {
        /// An allocator named `name` with `config`.
        ///
        /// ```
        /// use proxalloc::{Config, Recycle, RecyclingAllocator};
        /// #[derive(Default)]
        /// struct Headers(Vec<(String, String)>);
        /// impl Recycle for Headers {
        ///     fn create() -> Self { Headers::default() }
        ///     fn recycle(&mut self) -> bool { self.0.clear(); self.0.capacity() <= 64 }
        /// }
        /// static HEADERS: RecyclingAllocator<Headers> =
        ///     RecyclingAllocator::with_config("doc-recycling-config", Config::new().magazine_size(16));
        /// assert!(HEADERS.get().0.is_empty());
        /// ```
        pub fn with_config(name: &'static str, config: Config) -> Self {
            RecyclingAllocator {
                inner: ClassAllocator::with_parts(name, config, Some(Self::HOOKS), None),
            }
        }
    }

    /// A recycled value, or a fresh one.
    ///
    /// # Panics
    /// If the backing allocator fails (see [`try_get`](Self::try_get)); and if
    /// [`Recycle::create`] panics (the memory is returned first).
    ///
    /// ```
    /// use proxalloc::{Recycle, RecyclingAllocator};
    /// struct Line(String);
    /// impl Recycle for Line {
    ///     fn create() -> Self { Line(String::new()) }
    ///     fn recycle(&mut self) -> bool { self.0.clear(); true }
    /// }
    /// static LINES: RecyclingAllocator<Line> = RecyclingAllocator::new("doc-recycling-get");
    /// let mut l = LINES.get();
    /// l.0.push_str("GET / HTTP/1.1");
    /// drop(l); // cleared and cached, its buffer kept
    /// assert!(LINES.get().0.capacity() >= 14);
    /// ```
    #[inline]
    #[must_use = "dropping the handle returns the object to the cache at once"]
    pub fn get(&self) -> Recycled<'_, T> {
        self.try_get()
            .unwrap_or_else(|_| std::alloc::handle_alloc_error(std::alloc::Layout::new::<T>()))
    }

    /// A recycled value, or a fresh one; an error if the backing allocator fails.
    ///
    /// ```
    /// use proxalloc::{Recycle, RecyclingAllocator};
    /// struct Scratch(Vec<u64>);
    /// impl Recycle for Scratch {
    ///     fn create() -> Self { Scratch(Vec::new()) }
    ///     fn recycle(&mut self) -> bool { self.0.clear(); true }
    /// }
    /// static SCRATCH: RecyclingAllocator<Scratch> = RecyclingAllocator::new("doc-recycling-try");
    /// let s = SCRATCH.try_get().expect("out of memory");
    /// assert!(s.0.is_empty());
    /// ```
    #[inline]
    #[must_use = "dropping the result returns the object to the cache at once"]
    pub fn try_get(&self) -> Result<Recycled<'_, T>, AllocError> {
        Ok(Recycled {
            ptr: self.inner.alloc_raw()?,
            alloc: self,
            _owns: PhantomData,
        })
    }

    /// The allocator's name.
    ///
    /// ```
    /// # use proxalloc::{Recycle, RecyclingAllocator};
    /// # struct B(Vec<u8>);
    /// # impl Recycle for B { fn create() -> Self { B(Vec::new()) } fn recycle(&mut self) -> bool { true } }
    /// let bufs = RecyclingAllocator::<B>::new("doc-recycling-name");
    /// assert_eq!(bufs.name(), "doc-recycling-name");
    /// ```
    pub fn name(&self) -> &'static str {
        self.inner.name()
    }

    /// A snapshot of the counters (see [`ClassAllocator::stats`]).
    ///
    /// ```
    /// # use proxalloc::{Recycle, RecyclingAllocator};
    /// # struct B(Vec<u8>);
    /// # impl Recycle for B { fn create() -> Self { B(Vec::new()) } fn recycle(&mut self) -> bool { true } }
    /// let bufs = RecyclingAllocator::<B>::new("doc-recycling-stats");
    /// drop(bufs.get());
    /// let s = bufs.stats();
    /// assert_eq!((s.allocs, s.live, s.cached_in_threads), (1, 0, 1)); // cached, still constructed
    /// ```
    pub fn stats(&self) -> Stats {
        self.inner.stats()
    }

    /// Drops every value the CPUs, this thread, the depot and other threads' stashes cache, as
    /// [`ClassAllocator::trim`](crate::ClassAllocator::trim) does; returns the bytes
    /// released.
    ///
    /// ```
    /// # use proxalloc::{Recycle, RecyclingAllocator};
    /// # struct B(Vec<u8>);
    /// # impl Recycle for B { fn create() -> Self { B(Vec::new()) } fn recycle(&mut self) -> bool { true } }
    /// let bufs = RecyclingAllocator::<B>::new("doc-recycling-trim");
    /// drop(bufs.get());
    /// assert!(bufs.trim() > 0); // the cached value is dropped, its memory freed
    /// assert_eq!(bufs.stats().cached_in_threads, 0);
    /// ```
    pub fn trim(&self) -> usize {
        self.inner.trim()
    }

    /// Drops the values that went unused since the previous call, as
    /// [`ClassAllocator::trim_idle`](crate::ClassAllocator::trim_idle) does; returns the
    /// bytes released.
    ///
    /// ```
    /// # use proxalloc::{Recycle, RecyclingAllocator};
    /// # struct B(Vec<u8>);
    /// # impl Recycle for B { fn create() -> Self { B(Vec::new()) } fn recycle(&mut self) -> bool { true } }
    /// let bufs = RecyclingAllocator::<B>::new("doc-recycling-trim-idle");
    /// drop(bufs.get());
    /// assert_eq!(bufs.trim_idle(), 0); // starts the interval
    /// std::thread::sleep(std::time::Duration::from_millis(5));
    /// assert!(bufs.trim_idle() > 0); // unused since: dropped, memory freed
    /// assert_eq!(bufs.stats().cached_in_threads, 0);
    /// ```
    pub fn trim_idle(&self) -> usize {
        self.inner.trim_idle()
    }

    /// Hands this thread's cached values to the depot and forgets this thread's cache. A
    /// per-CPU allocator's values are the CPUs' (see
    /// [`ClassAllocator::release_thread_cache`](crate::ClassAllocator::release_thread_cache)).
    ///
    /// ```
    /// # use proxalloc::{CacheMode, Config, Recycle, RecyclingAllocator};
    /// # struct B(Vec<u8>);
    /// # impl Recycle for B { fn create() -> Self { B(Vec::new()) } fn recycle(&mut self) -> bool { true } }
    /// let bufs = RecyclingAllocator::<B>::with_config(
    ///     "doc-recycling-release",
    ///     Config::new().mode(CacheMode::ThreadCaches),
    /// );
    /// drop(bufs.get());
    /// bufs.release_thread_cache(); // e.g. before a worker thread goes idle for long
    /// assert_eq!(bufs.stats().cached_in_depot, 1);
    /// ```
    pub fn release_thread_cache(&self) {
        self.inner.release_thread_cache()
    }
}

impl<T: Recycle> fmt::Debug for RecyclingAllocator<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RecyclingAllocator")
            .field("inner", &self.inner)
            .finish()
    }
}

/// A value from a [`RecyclingAllocator`]; dropping it recycles the value.
///
/// ```
/// use proxalloc::{Recycle, Recycled, RecyclingAllocator};
/// struct Msg(String);
/// impl Recycle for Msg {
///     fn create() -> Self { Msg(String::new()) }
///     fn recycle(&mut self) -> bool { self.0.clear(); true }
/// }
/// static MSGS: RecyclingAllocator<Msg> = RecyclingAllocator::new("doc-recycled");
/// let mut m: Recycled<'static, Msg> = MSGS.get();
/// m.0.push_str("hi"); // derefs to the value
/// assert_eq!(m.0, "hi");
/// ```
pub struct Recycled<'a, T: Recycle> {
    ptr: NonNull<T>,
    alloc: &'a RecyclingAllocator<T>,
    _owns: PhantomData<T>,
}

// SAFETY: the handle owns its `T` exclusively, like `Box<T>`.
unsafe impl<T: Recycle + Send> Send for Recycled<'_, T> {}
// SAFETY: `&Recycled<T>` only gives out `&T`.
unsafe impl<T: Recycle + Sync> Sync for Recycled<'_, T> {}

/// Drops the value and frees its memory if `recycle` (or the drop) unwinds.
struct DropOnUnwind<'h, 'a, T: Recycle>(&'h Recycled<'a, T>);

impl<T: Recycle> Drop for DropOnUnwind<'_, '_, T> {
    fn drop(&mut self) {
        // SAFETY: `recycle` unwound, so the handle's drop will not run `free`.
        unsafe { self.0.discard() };
    }
}

impl<T: Recycle> Recycled<'_, T> {
    /// Drops the value and gives its memory straight back (it is not recycled).
    ///
    /// # Safety
    /// Called once, from the handle's drop.
    unsafe fn discard(&self) {
        let inner = &self.alloc.inner;
        let p = self.ptr.cast::<u8>();
        /// Frees the memory even if `T::drop` unwinds.
        struct Release<'i, T>(&'i ClassAllocator<T>, NonNull<u8>);
        impl<T> Drop for Release<'_, T> {
            fn drop(&mut self) {
                self.0.on_free(self.1);
                // SAFETY: the object's value is gone and nobody uses it.
                unsafe { self.0.engine().release_dead(self.1) };
            }
        }
        let _release = Release(inner, p);
        // SAFETY: the handle owns a live value, dropped exactly once here.
        unsafe { self.ptr.as_ptr().drop_in_place() };
    }
}

impl<T: Recycle> Drop for Recycled<'_, T> {
    fn drop(&mut self) {
        let mut ptr = self.ptr;
        let guard = DropOnUnwind(self);
        // SAFETY: the handle owns a live value; no other reference to it is used while
        // `recycle` runs.
        let keep = T::recycle(unsafe { ptr.as_mut() });
        std::mem::forget(guard);
        if keep {
            // SAFETY: the object holds a live, reset value, as a recycling allocator's
            // cached objects must; nobody else uses it.
            unsafe { self.alloc.inner.free_raw(self.ptr) };
        } else {
            // SAFETY: called once.
            unsafe { self.discard() };
        }
    }
}

impl<T: Recycle> Deref for Recycled<'_, T> {
    type Target = T;
    #[inline]
    fn deref(&self) -> &T {
        // SAFETY: the handle owns a live value.
        unsafe { self.ptr.as_ref() }
    }
}

impl<T: Recycle> DerefMut for Recycled<'_, T> {
    #[inline]
    fn deref_mut(&mut self) -> &mut T {
        // SAFETY: the handle owns a live value, exclusively.
        unsafe { self.ptr.as_mut() }
    }
}

impl<T: Recycle + fmt::Debug> fmt::Debug for Recycled<'_, T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&**self, f)
    }
}

/// A value from a [`RecyclingAllocator`] owned through an `Arc` of it: `'static`, for
/// allocators built at run time (see [`Owned`](crate::Owned), whose costs it shares).
/// Dropping it recycles the value as [`Recycled`] does.
///
/// ```
/// use std::sync::Arc;
/// use proxalloc::{Recycle, RecyclingAllocator};
///
/// struct Buf(Vec<u8>);
/// impl Recycle for Buf {
///     fn create() -> Self { Buf(Vec::with_capacity(1024)) }
///     fn recycle(&mut self) -> bool { self.0.clear(); true }
/// }
/// let bufs = Arc::new(RecyclingAllocator::<Buf>::new("bufs"));
/// let mut b = bufs.get_arc();
/// b.0.extend_from_slice(b"moved into a thread");
/// let n = std::thread::spawn(move || b.0.len()).join().unwrap();
/// assert_eq!(n, 19);
/// ```
pub struct OwnedRecycled<T: Recycle> {
    ptr: NonNull<T>,
    alloc: std::sync::Arc<RecyclingAllocator<T>>,
}

// SAFETY: the handle owns its `T` exclusively, like `Box<T>`; `Recycle` values are
// `Send`.
unsafe impl<T: Recycle> Send for OwnedRecycled<T> {}
// SAFETY: `&OwnedRecycled<T>` only gives out `&T`.
unsafe impl<T: Recycle + Sync> Sync for OwnedRecycled<T> {}

impl<T: Recycle> RecyclingAllocator<T> {
    /// A recycled value, or a fresh one, owned through a clone of this `Arc`.
    ///
    /// # Panics
    /// As for [`get`](Self::get).
    ///
    /// ```
    /// use std::sync::Arc;
    /// use proxalloc::{OwnedRecycled, Recycle, RecyclingAllocator};
    /// struct Scratch(Vec<u64>);
    /// impl Recycle for Scratch {
    ///     fn create() -> Self { Scratch(Vec::new()) }
    ///     fn recycle(&mut self) -> bool { self.0.clear(); true }
    /// }
    /// let scratch = Arc::new(RecyclingAllocator::<Scratch>::new("doc-recycling-get-arc"));
    /// let mut s: OwnedRecycled<Scratch> = scratch.get_arc();
    /// s.0.push(1);
    /// assert_eq!(Arc::strong_count(&scratch), 2); // the handle holds the allocator
    /// drop(s); // recycled into this CPU's (or thread's) cache
    /// assert_eq!(Arc::strong_count(&scratch), 1);
    /// assert!(scratch.get_arc().0.is_empty());
    /// ```
    #[must_use = "dropping the handle recycles the value at once"]
    pub fn get_arc(self: &std::sync::Arc<Self>) -> OwnedRecycled<T> {
        self.try_get_arc()
            .unwrap_or_else(|_| std::alloc::handle_alloc_error(std::alloc::Layout::new::<T>()))
    }

    /// Like [`get_arc`](Self::get_arc), but an error when the backing allocator fails or
    /// a [`max_live`](Config::max_live) cap is reached.
    ///
    /// ```
    /// use std::sync::Arc;
    /// use proxalloc::{Config, Recycle, RecyclingAllocator};
    /// struct Ticket(u8);
    /// impl Recycle for Ticket {
    ///     fn create() -> Self { Ticket(0) }
    ///     fn recycle(&mut self) -> bool { true }
    /// }
    /// let tickets = Arc::new(RecyclingAllocator::<Ticket>::with_config(
    ///     "doc-try-get-arc", Config::new().max_live(1)));
    /// let one = tickets.try_get_arc().unwrap();
    /// assert!(tickets.try_get_arc().is_err());
    /// drop(one);
    /// assert!(tickets.try_get_arc().is_ok());
    /// ```
    #[must_use = "dropping the result recycles the value at once"]
    pub fn try_get_arc(self: &std::sync::Arc<Self>) -> Result<OwnedRecycled<T>, AllocError> {
        let handle = std::mem::ManuallyDrop::new(self.try_get()?);
        Ok(OwnedRecycled {
            ptr: handle.ptr,
            alloc: std::sync::Arc::clone(self),
        })
    }
}

impl<T: Recycle> Drop for OwnedRecycled<T> {
    fn drop(&mut self) {
        // The borrowed handle does the recycling; the `Arc` field drops after it.
        drop(Recycled {
            ptr: self.ptr,
            alloc: &*self.alloc,
            _owns: PhantomData,
        });
    }
}

impl<T: Recycle> Deref for OwnedRecycled<T> {
    type Target = T;
    #[inline]
    fn deref(&self) -> &T {
        // SAFETY: the handle owns a live value.
        unsafe { self.ptr.as_ref() }
    }
}

impl<T: Recycle> DerefMut for OwnedRecycled<T> {
    #[inline]
    fn deref_mut(&mut self) -> &mut T {
        // SAFETY: the handle owns a live value, exclusively.
        unsafe { self.ptr.as_mut() }
    }
}

impl<T: Recycle + fmt::Debug> fmt::Debug for OwnedRecycled<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&**self, f)
    }
}
