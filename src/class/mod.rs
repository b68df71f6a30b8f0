//! The typed front end: [`ClassAllocator<T>`], its owning handle [`ClassBox`], and the
//! borrowed per-thread handle [`LocalCache`].

mod class_box;
mod local;
pub(crate) mod owned;
mod raw;
pub(crate) mod recycle;
pub(crate) mod thin;

pub use class_box::ClassBox;
pub use local::LocalCache;
use raw::FreeOnUnwind;

use std::alloc::Layout;
use std::fmt;
use std::marker::PhantomData;
use std::mem::MaybeUninit;

use crate::config::{CacheMode, Config};
use crate::core::backing::ObjectHooks;
use crate::core::budget::ByteBudget;
use crate::core::cache::{self, Hints};
use crate::core::engine::Engine;
use crate::error::AllocError;
use crate::rows::Stats;
use crate::sync::{const_fn, Arc, ArcRef, LazyArc};

/// An allocator of objects of one type, with per-CPU or per-thread caches (see
/// [`CacheMode`]).
///
/// Allocation returns a [`ClassBox`] handle that owns the object; dropping the handle runs
/// `T`'s destructor and keeps the memory in the cache nearest the dropping thread (its
/// CPU's, or its own) for the next allocation. It is usually a `static`:
///
/// ```
/// use proxalloc::ClassAllocator;
///
/// struct Request { id: u64, path: String }
/// static REQUESTS: ClassAllocator<Request> = ClassAllocator::new("requests");
///
/// let r = REQUESTS.alloc(Request { id: 7, path: "/".into() });
/// assert_eq!(r.id, 7);
/// drop(r); // runs Request's destructor; its memory stays in this CPU's (or thread's) cache
/// assert_eq!(REQUESTS.stats().live, 0);
/// ```
///
/// It can also be an owned value; dropping it returns what the CPUs, the dropping thread
/// and the depot cache to the system allocator at once, and what other threads cache at
/// each one's next slow path or exit. Handles borrow their allocator, so none can outlive it:
///
/// ```compile_fail
/// use proxalloc::{ClassAllocator, ClassBox};
/// let escaped: ClassBox<'static, u32>;
/// {
///     let local = ClassAllocator::<u32>::new("local");
///     escaped = local.alloc(1); // error: `local` does not live long enough
/// }
/// ```
// `repr(C)` with the hints first: the fast paths read them at the allocator's own
// address, with no offset to add first.
#[repr(C)]
pub struct ClassAllocator<T> {
    /// How the fast paths find this thread's cache without touching the engine.
    pub(crate) hints: Hints,
    name: &'static str,
    config: Config,
    /// Set for a [`RecyclingAllocator`](crate::RecyclingAllocator)'s inner allocator:
    /// cached objects are then live values.
    hooks: Option<ObjectHooks>,
    /// A budget shared with other allocators (a pool block source's classes), instead
    /// of one of `config.depot_bytes`.
    budget: Option<Arc<ByteBudget>>,
    /// The engine, created on first use.
    engine: LazyArc<Engine>,
    _type: PhantomData<fn(T) -> T>,
}

/// `N` uninitialised bytes aligned to 64 (a cache line): the object type of the
/// byte-sized classes, pool blocks and I/O buffers.
#[repr(C, align(64))]
pub(crate) struct RawBytes<const N: usize>(MaybeUninit<[u8; N]>);

// The allocator never holds a `T` (only raw memory), so it can be shared and sent
// whatever `T` is; `ClassBox<T>` carries `T`'s own `Send`/`Sync`.

impl<T> ClassAllocator<T> {
    const_fn! {
        /// An allocator named `name`, with the default [`Config`].
        ///
        /// ```
        /// use proxalloc::{ClassAllocator, Config};
        /// static WORDS: ClassAllocator<u64> = ClassAllocator::new("doc-class-new");
        /// assert_eq!(*WORDS.alloc(42), 42);
        /// assert_eq!(*WORDS.config(), Config::new());
        /// ```
        pub fn new(name: &'static str) -> Self {
            Self::with_config(name, Config::new())
        }
    }

    const_fn! {
        /// An allocator named `name` with `config`.
        ///
        /// ```
        /// use proxalloc::{ClassAllocator, Config};
        /// static FRAMES: ClassAllocator<[u8; 1024]> = ClassAllocator::with_config(
        ///     "doc-class-with-config",
        ///     Config::new().magazine_size(16).depot_bytes(256 << 10),
        /// );
        /// let f = FRAMES.alloc([7; 1024]);
        /// assert_eq!(f[1023], 7);
        /// assert_eq!(*FRAMES.config(), Config::new().magazine_size(16).depot_bytes(256 << 10));
        /// ```
        pub fn with_config(name: &'static str, config: Config) -> Self {
            Self::with_parts(name, config, None, None)
        }
    }

    const_fn! {
        /// An allocator with object hooks (recycling) and/or a shared depot budget.
        pub(crate) fn with_parts(
            name: &'static str,
            config: Config,
            hooks: Option<ObjectHooks>,
            budget: Option<Arc<ByteBudget>>,
        ) -> Self {
            ClassAllocator {
                name,
                config,
                hooks,
                budget,
                engine: LazyArc::new(),
                hints: Hints::unset(),
                _type: PhantomData,
            }
        }
    }

    /// The allocator's name, as given to [`new`](Self::new) or
    /// [`with_config`](Self::with_config); the stats dumps list the allocator under it.
    ///
    /// ```
    /// use proxalloc::ClassAllocator;
    /// static SESSIONS: ClassAllocator<u64> = ClassAllocator::new("doc-class-name");
    /// assert_eq!(SESSIONS.name(), "doc-class-name");
    /// assert_eq!(SESSIONS.stats().name, "doc-class-name");
    /// ```
    pub fn name(&self) -> &'static str {
        self.name
    }

    /// The configuration it was built with.
    ///
    /// ```
    /// use proxalloc::{ClassAllocator, Config};
    /// static CONNS: ClassAllocator<[u8; 512]> =
    ///     ClassAllocator::with_config("doc-class-config", Config::new().max_live(10_000));
    /// assert_eq!(*CONNS.config(), Config::new().max_live(10_000));
    /// ```
    pub fn config(&self) -> &Config {
        &self.config
    }

    /// The caching mode in effect: the configured one, except that `PROXALLOC_BYPASS`
    /// forces [`CacheMode::Bypass`], and [`CacheMode::PerCpu`] falls back to
    /// [`CacheMode::ThreadCaches`] where per-CPU caches cannot work (see
    /// [`Stats::mode`](crate::Stats::mode)).
    ///
    /// ```
    /// use proxalloc::{CacheMode, ClassAllocator, Config, BYPASS_ENV};
    /// static DIRECT: ClassAllocator<u64> =
    ///     ClassAllocator::with_config("doc-class-mode-bypass", Config::new().mode(CacheMode::Bypass));
    /// static SHARED: ClassAllocator<u64> =
    ///     ClassAllocator::with_config("doc-class-mode-depot", Config::new().mode(CacheMode::DepotOnly));
    /// assert_eq!(DIRECT.mode(), CacheMode::Bypass);
    /// if std::env::var_os(BYPASS_ENV).is_none() {
    ///     assert_eq!(SHARED.mode(), CacheMode::DepotOnly); // as configured
    /// }
    /// ```
    pub fn mode(&self) -> CacheMode {
        self.engine().mode()
    }

    /// The engine, created on first use.
    #[inline(always)]
    pub(crate) fn engine(&self) -> &Engine {
        match self.engine.get() {
            Some(e) => e,
            None => self.init_engine(),
        }
    }

    #[cold]
    fn init_engine(&self) -> &Engine {
        let fresh = Arc::new(Engine::new(
            self.name,
            Layout::new::<T>(),
            self.config,
            self.hooks,
            self.budget.clone(),
        ));
        let (e, lost) = self.engine.publish(fresh);
        match lost {
            None => {
                self.hints.set(e);
                crate::registry::register::<Engine>(&self.engine.arc());
            }
            Some(ours) => {
                // SAFETY: ours was never published or used (it releases nothing).
                unsafe { cache::shutdown(&ours) };
            }
        }
        e
    }

    /// The engine if the allocator was ever used (stats and trims of a family of
    /// allocators, such as a buffer allocator's classes, skip the unused ones rather
    /// than create their engines).
    pub(crate) fn used_engine(&self) -> Option<&Engine> {
        self.engine.get()
    }

    /// The engine as an `Arc`, for registering a thread cache (see [`ArcRef`]).
    pub(crate) fn engine_arc(&self) -> ArcRef<Engine> {
        self.engine();
        self.engine.arc()
    }

    /// Allocates an object holding `value`.
    ///
    /// # Aborts
    /// If the backing allocator fails or a [`Config::max_live`] cap is reached (see
    /// [`try_alloc`](Self::try_alloc)): through [`std::alloc::handle_alloc_error`], which
    /// aborts the process by default.
    ///
    /// ```
    /// use proxalloc::ClassAllocator;
    /// struct Conn { fd: i32, buffered: Vec<u8> }
    /// static CONNS: ClassAllocator<Conn> = ClassAllocator::new("doc-class-alloc");
    /// let mut c = CONNS.alloc(Conn { fd: 3, buffered: Vec::new() });
    /// c.buffered.extend_from_slice(b"HTTP/1.1 200 OK"); // derefs to the object
    /// assert_eq!((c.fd, c.buffered.len()), (3, 15));
    /// assert_eq!(CONNS.stats().live, 1);
    /// ```
    #[inline(always)]
    #[must_use = "dropping the handle frees the object at once"]
    pub fn alloc(&self, value: T) -> ClassBox<'_, T> {
        self.try_alloc(value)
            .unwrap_or_else(|_| std::alloc::handle_alloc_error(Layout::new::<T>()))
    }

    /// Allocates an object and constructs it with `init`, writing the result straight
    /// into the object's memory.
    ///
    /// If `init` panics, the memory goes back to the cache and the panic continues.
    ///
    /// ```
    /// use proxalloc::ClassAllocator;
    /// static TABLES: ClassAllocator<[u32; 256]> = ClassAllocator::new("doc-class-alloc-with");
    /// let t = TABLES.alloc_with(|| std::array::from_fn(|i| i as u32 * 2));
    /// assert_eq!(t[100], 200);
    ///
    /// // A panicking constructor gives the memory back: nothing stays live.
    /// let r = std::panic::catch_unwind(|| TABLES.alloc_with(|| panic!("bad input")).len());
    /// assert!(r.is_err());
    /// drop(t);
    /// assert_eq!(TABLES.stats().live, 0);
    /// ```
    #[inline(always)]
    #[must_use = "dropping the handle frees the object at once"]
    pub fn alloc_with(&self, init: impl FnOnce() -> T) -> ClassBox<'_, T> {
        match self.try_alloc_with(init) {
            Ok(h) => h,
            Err(AllocError) => std::alloc::handle_alloc_error(Layout::new::<T>()),
        }
    }

    /// Allocates an object holding `value`, or returns an error (dropping `value`) if the
    /// backing allocator fails, or if a [`Config::max_live`] cap is reached.
    ///
    /// A thread's first allocation registers its cache: if the global allocator fails
    /// there, the object comes straight from the backing allocator (the next slow path
    /// tries again). The crate's other bookkeeping still ends the process on failure, as
    /// `Box::new` does: the allocator's shared state, made once at its first use in the
    /// process; the C library's record of the thread-exit hook, made at a thread's first
    /// registration (glibc's `malloc`, which aborts if it fails); and, with misuse
    /// detection on (debug builds, the `debug-checks` feature), its table of live
    /// objects.
    ///
    /// ```
    /// use proxalloc::{AllocError, ClassAllocator, Config};
    /// static SEATS: ClassAllocator<u64> =
    ///     ClassAllocator::with_config("doc-class-try-alloc", Config::new().max_live(1));
    /// let first = SEATS.try_alloc(1).expect("under the cap");
    /// assert_eq!(SEATS.try_alloc(2).err(), Some(AllocError)); // the cap is reached
    /// drop(first);
    /// assert_eq!(*SEATS.try_alloc(3).unwrap(), 3);
    /// ```
    #[inline(always)]
    #[must_use = "dropping the result frees the object at once"]
    pub fn try_alloc(&self, value: T) -> Result<ClassBox<'_, T>, AllocError> {
        // Not through `try_alloc_with`: moving a large `value` into a closure and out
        // again costs extra copies. Built by the caller before the call, `value` still
        // lands straight in the object, because nothing on the fast path is opaque to
        // the compiler's alias analysis (see `sync::relaxed`).
        let object = self.alloc_raw()?;
        // SAFETY: valid, aligned, uninitialised memory for one `T`.
        unsafe { object.as_ptr().write(value) };
        // SAFETY: fresh memory of this allocator, now initialised, owned by nobody else.
        Ok(unsafe { ClassBox::from_raw(self, object) })
    }

    /// Allocates an object constructed by `init`, or returns an error without calling
    /// `init` if the backing allocator fails or a [`Config::max_live`] cap is reached.
    ///
    /// ```
    /// use proxalloc::ClassAllocator;
    /// static NAMES: ClassAllocator<String> = ClassAllocator::new("names");
    /// let name = NAMES.try_alloc_with(|| "proxalloc".to_string()).expect("out of memory");
    /// assert_eq!(*name, "proxalloc");
    /// ```
    #[inline(always)]
    #[must_use = "dropping the result frees the object at once"]
    pub fn try_alloc_with(&self, init: impl FnOnce() -> T) -> Result<ClassBox<'_, T>, AllocError> {
        let object = self.alloc_raw()?;
        // Frees the memory if `init` unwinds.
        let guard = FreeOnUnwind {
            alloc: self,
            object,
        };
        // SAFETY: `object` is valid, aligned, uninitialised memory for one `T`.
        unsafe { object.as_ptr().write(init()) };
        std::mem::forget(guard);
        // SAFETY: fresh memory of this allocator, now initialised, owned by nobody else.
        Ok(unsafe { ClassBox::from_raw(self, object) })
    }

    /// Allocates an object and lets `init` initialise it in place, for large types
    /// that should never be built on the stack.
    ///
    /// # Safety
    /// `init` must fully initialise the value before it returns. (If it unwinds, the
    /// memory is recycled and nothing is dropped.)
    ///
    /// ```
    /// use proxalloc::ClassAllocator;
    /// let bufs = ClassAllocator::<[u64; 4096]>::new("bufs");
    /// // SAFETY: every element is written.
    /// let b = unsafe {
    ///     bufs.alloc_in_place(|uninit| {
    ///         let p = uninit.as_mut_ptr().cast::<u64>();
    ///         for i in 0..4096 { p.add(i).write(i as u64); }
    ///     })
    /// };
    /// assert_eq!(b[4095], 4095);
    /// ```
    #[must_use = "dropping the handle frees the object at once"]
    pub unsafe fn alloc_in_place(&self, init: impl FnOnce(&mut MaybeUninit<T>)) -> ClassBox<'_, T> {
        // SAFETY: forwarded.
        unsafe { self.try_alloc_in_place(init) }
            .unwrap_or_else(|_| std::alloc::handle_alloc_error(Layout::new::<T>()))
    }

    /// Like [`alloc_in_place`](Self::alloc_in_place), but returns an error without calling
    /// `init` if the backing allocator fails.
    ///
    /// # Safety
    /// As for [`alloc_in_place`](Self::alloc_in_place).
    ///
    /// ```
    /// use proxalloc::{AllocError, ClassAllocator};
    /// let huge = ClassAllocator::<[u8; 1 << 44]>::new("huge");
    /// // SAFETY: `init` is never called, as the allocation fails.
    /// let r = unsafe { huge.try_alloc_in_place(|_| unreachable!()) };
    /// assert_eq!(r.err(), Some(AllocError));
    /// ```
    #[must_use = "dropping the result frees the object at once"]
    pub unsafe fn try_alloc_in_place(
        &self,
        init: impl FnOnce(&mut MaybeUninit<T>),
    ) -> Result<ClassBox<'_, T>, AllocError> {
        let object = self.alloc_raw()?;
        let guard = FreeOnUnwind {
            alloc: self,
            object,
        };
        // SAFETY: valid, aligned memory for one `T`; `MaybeUninit` accepts any contents.
        init(unsafe { &mut *object.as_ptr().cast::<MaybeUninit<T>>() });
        std::mem::forget(guard);
        // SAFETY: fresh memory of this allocator, now initialised, owned by nobody else.
        Ok(unsafe { ClassBox::from_raw(self, object) })
    }

    /// Gives back to the system allocator everything the CPUs' caches hold (per-CPU
    /// caches), everything this thread caches, everything the depot caches, and what every
    /// other thread's cache grew to (its stash, taken at once), and returns the number of
    /// bytes released. Each other thread keeps its two magazines (per-thread caches), which only it may touch: `trim` asks it to flush them, and it does at
    /// its next slow path on any allocator, when it leaves a `with_local` call, when it
    /// calls [`release_thread_cache`](Self::release_thread_cache), or when it exits; a
    /// later `trim` returns what it gave to the depot. [`trim_all`](crate::trim_all) does
    /// the same for every allocator.
    ///
    /// ```
    /// use proxalloc::ClassAllocator;
    /// static PAGES: ClassAllocator<[u8; 4096]> = ClassAllocator::new("doc-class-trim");
    /// drop((0..100).map(|_| PAGES.alloc([0; 4096])).collect::<Vec<_>>());
    /// assert!(PAGES.stats().cached_bytes() > 0); // freed objects stay cached...
    /// assert!(PAGES.trim() >= 4096);
    /// assert_eq!(PAGES.stats().reserved_bytes(), 0); // ...until trimmed
    /// ```
    pub fn trim(&self) -> usize {
        let released = cache::trim(self.engine()) * std::mem::size_of::<T>();
        crate::core::backing::release_to_os();
        released
    }

    /// Gives back what of this allocator went unused since the previous call (of this
    /// or of [`trim_idle`](crate::trim_idle)), and returns those bytes: the objects at the
    /// bottom of the depot that no thread took in the interval, the stash of every
    /// thread cache that made no allocation or free in it (and that thread is asked to
    /// flush its two magazines), or everything, as [`trim`](Self::trim), if the allocator
    /// made no operation at all. The first call only starts the interval.
    ///
    /// ```
    /// use proxalloc::{ClassAllocator, Config};
    /// // Small magazines and no stash, so that the freed objects go to the depot.
    /// static MSGS: ClassAllocator<[u8; 64]> = ClassAllocator::with_config(
    ///     "doc-class-trim-idle",
    ///     Config::new().magazine_size(8).thread_cache_growth_bytes(0),
    /// );
    /// drop((0..100).map(|_| MSGS.alloc([0; 64])).collect::<Vec<_>>());
    /// let pause = || std::thread::sleep(std::time::Duration::from_millis(5));
    /// assert_eq!(MSGS.trim_idle(), 0); // the first call starts the interval
    /// // Busy: 40 objects taken and given back, most of them through the depot.
    /// drop((0..40).map(|_| MSGS.alloc([1; 64])).collect::<Vec<_>>());
    /// pause();
    /// let unused = MSGS.trim_idle(); // what no refill reached goes back...
    /// assert!(unused > 0 && MSGS.stats().cached_in_depot > 0); // ...the rest stays
    /// pause();
    /// MSGS.trim_idle(); // idle for a whole interval: everything goes
    /// assert_eq!(MSGS.stats().reserved_bytes(), 0);
    /// ```
    pub fn trim_idle(&self) -> usize {
        let released = cache::trim_idle(self.engine()) * std::mem::size_of::<T>();
        crate::core::backing::release_to_os();
        released
    }

    /// Hands this thread's cached objects to the depot and forgets this thread's cache
    /// (a worker about to idle for long, or a thread whose thread-local destructors may
    /// not run). The next allocation on this thread makes a new cache. A
    /// [`CacheMode::PerCpu`] allocator's caches belong to CPUs, not threads: this
    /// releases only a per-thread cache the thread may have (if it could not use rseq),
    /// and [`trim`](Self::trim) takes every CPU's (every CPU's that no slow path holds at
    /// that moment, while `membarrier` fences work: see `stats::percpu_status`).
    ///
    /// ```
    /// use proxalloc::{CacheMode, ClassAllocator, Config};
    /// static JOBS: ClassAllocator<[u64; 8]> = ClassAllocator::with_config(
    ///     "doc-class-release",
    ///     Config::new().mode(CacheMode::ThreadCaches),
    /// );
    /// drop(JOBS.alloc([0; 8]));
    /// assert_eq!(JOBS.stats().cached_in_threads, 1);
    /// JOBS.release_thread_cache(); // e.g. before this worker idles for long
    /// let s = JOBS.stats();
    /// assert_eq!((s.cached_in_threads, s.cached_in_depot), (0, 1));
    /// ```
    pub fn release_thread_cache(&self) {
        cache::release_thread_cache(self.engine());
    }

    /// A snapshot of this allocator's counters.
    ///
    /// ```
    /// use proxalloc::ClassAllocator;
    /// static MSGS: ClassAllocator<[u8; 128]> = ClassAllocator::new("doc-class-stats");
    /// let a = MSGS.alloc([0; 128]);
    /// drop(MSGS.alloc([1; 128]));
    /// let s = MSGS.stats();
    /// assert_eq!((s.allocs, s.frees, s.live), (2, 1, 1));
    /// assert_eq!(s.object_size, 128);
    /// # drop(a);
    /// ```
    pub fn stats(&self) -> Stats {
        self.engine().stats()
    }
}

impl<T> Drop for ClassAllocator<T> {
    fn drop(&mut self) {
        if let Some(engine) = self.engine.take() {
            // SAFETY: `&mut self`: no handle or borrow of the allocator is left, so no
            // thread can be using it; the allocator's strong count is given up here.
            let released = unsafe { cache::shutdown(&engine) };
            // Here, not in the shutdown: an engine that lost the race to be published is
            // shut down on an allocation's slow path, which must not walk glibc's heap;
            // and for what this allocator released alone (see `release_dropped_to_os`).
            crate::core::backing::release_dropped_to_os(released);
        }
    }
}

impl<T> fmt::Debug for ClassAllocator<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ClassAllocator")
            .field("name", &self.name)
            .field("type", &std::any::type_name::<T>())
            .field("config", &self.config)
            .finish_non_exhaustive()
    }
}

#[cfg(all(test, not(proxalloc_loom)))]
#[path = "tests/class.rs"]
mod tests;
