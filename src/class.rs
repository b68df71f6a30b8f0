//! The typed front end: [`ClassAllocator<T>`], its owning handle [`ClassBox`], and the
//! borrowed per-thread handle [`LocalCache`].

use std::alloc::Layout;
use std::borrow::{Borrow, BorrowMut};
use std::cmp::Ordering as CmpOrdering;
use std::fmt;
use std::hash::{Hash, Hasher};
use std::marker::PhantomData;
use std::mem::{size_of, ManuallyDrop, MaybeUninit};
use std::ops::{Deref, DerefMut};
use std::ptr::NonNull;

use crate::backing::ObjectHooks;
use crate::budget::ByteBudget;
use crate::cache::{self, Lookup, ThreadCache};
use crate::config::{CacheMode, Config};
use crate::debug;
use crate::engine::Engine;
use crate::stats::Stats;
use crate::sync::Arc;

/// The backing allocator could not supply memory for an object (or a
/// [`Config::max_live`] cap refused one).
///
/// ```
/// use proxalloc::{AllocError, ClassAllocator, Config};
/// static NONE: ClassAllocator<u32> =
///     ClassAllocator::with_config("doc-class-alloc-error", Config::new().max_live(0));
/// let err = NONE.try_alloc(1).unwrap_err();
/// assert_eq!(err, AllocError);
/// assert_eq!(err.to_string(), "memory allocation failed");
/// let _: &dyn std::error::Error = &err;
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct AllocError;

impl fmt::Display for AllocError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("memory allocation failed")
    }
}

impl std::error::Error for AllocError {}

/// An allocator of objects of one type, with per-thread caches.
///
/// Allocation returns a [`ClassBox`] handle that owns the object; dropping the handle runs
/// `T`'s destructor and keeps the memory in the dropping thread's cache for the next
/// allocation. It is usually a `static`:
///
/// ```
/// use proxalloc::ClassAllocator;
///
/// struct Request { id: u64, path: String }
/// static REQUESTS: ClassAllocator<Request> = ClassAllocator::new("requests");
///
/// let r = REQUESTS.alloc(Request { id: 7, path: "/".into() });
/// assert_eq!(r.id, 7);
/// drop(r); // runs Request's destructor; the slot stays in this thread's cache
/// assert_eq!(REQUESTS.stats().live, 0);
/// ```
///
/// It can also be an owned value; dropping it returns every object cached anywhere to the
/// system allocator. Handles borrow their allocator, so none can outlive it:
///
/// ```compile_fail
/// use proxalloc::{ClassAllocator, ClassBox};
/// let escaped: ClassBox<'static, u32>;
/// {
///     let local = ClassAllocator::<u32>::new("local");
///     escaped = local.alloc(1); // error: `local` does not live long enough
/// }
/// ```
pub struct ClassAllocator<T> {
    name: &'static str,
    config: Config,
    /// Set for a [`RecyclingAllocator`](crate::RecyclingAllocator)'s inner allocator:
    /// cached objects are then live values.
    hooks: Option<ObjectHooks>,
    /// A budget shared with other allocators (a pool block source's classes), instead
    /// of one of `config.depot_bytes`.
    budget: Option<Arc<ByteBudget>>,
    #[cfg(not(proxalloc_loom))]
    engine: crate::sync::AtomicPtr<Engine>,
    /// Copies of the engine's slot and instance numbers, so the fast paths find the
    /// thread's cache without touching the engine. Only hints: until they are set they
    /// match no cache, and a mismatch takes the cold path, which uses the engine's own.
    #[cfg(not(proxalloc_loom))]
    slot_hint: crate::sync::AtomicU32,
    #[cfg(not(proxalloc_loom))]
    instance_hint: crate::sync::AtomicU64,
    #[cfg(proxalloc_loom)]
    engine: Arc<Engine>,
    _type: PhantomData<fn(T) -> T>,
}

// The allocator never holds a `T` (only raw memory), so it can be shared and sent
// whatever `T` is; `ClassBox<T>` carries `T`'s own `Send`/`Sync`.

impl<T> ClassAllocator<T> {
    /// An allocator named `name`, with the default [`Config`].
    ///
    /// ```
    /// use proxalloc::{ClassAllocator, Config};
    /// static WORDS: ClassAllocator<u64> = ClassAllocator::new("doc-class-new");
    /// assert_eq!(*WORDS.alloc(42), 42);
    /// assert_eq!(*WORDS.config(), Config::new());
    /// ```
    #[cfg(not(proxalloc_loom))]
    pub const fn new(name: &'static str) -> Self {
        Self::with_config(name, Config::new())
    }

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
    #[cfg(not(proxalloc_loom))]
    pub const fn with_config(name: &'static str, config: Config) -> Self {
        Self::with_parts(name, config, None, None)
    }

    /// An allocator with object hooks (recycling) and/or a shared depot budget.
    #[cfg(not(proxalloc_loom))]
    pub(crate) const fn with_parts(
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
            engine: crate::sync::AtomicPtr::new(std::ptr::null_mut()),
            slot_hint: crate::sync::AtomicU32::new(u32::MAX),
            instance_hint: crate::sync::AtomicU64::new(u64::MAX),
            _type: PhantomData,
        }
    }

    /// An allocator named `name`, with the default [`Config`].
    #[cfg(proxalloc_loom)]
    pub fn new(name: &'static str) -> Self {
        Self::with_config(name, Config::new())
    }

    /// An allocator named `name` with `config`. (Under loom the engine is built eagerly,
    /// inside the model.)
    #[cfg(proxalloc_loom)]
    pub fn with_config(name: &'static str, config: Config) -> Self {
        Self::with_parts(name, config, None, None)
    }

    /// An allocator with object hooks (recycling) and/or a shared depot budget.
    #[cfg(proxalloc_loom)]
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
            budget: budget.clone(),
            engine: Arc::new(Engine::new(name, Layout::new::<T>(), config, hooks, budget)),
            _type: PhantomData,
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

    /// The caching mode in effect (the configured one, unless `PROXALLOC_BYPASS` forced
    /// [`CacheMode::Bypass`]).
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

    /// The engine, created on first use. The pointer is the one `Arc::into_raw` gave
    /// (with provenance over the whole `Arc` allocation, which `engine_arc` needs).
    #[cfg(not(proxalloc_loom))]
    #[inline(always)]
    fn engine_ptr(&self) -> *const Engine {
        use crate::sync::Ordering;
        let p = self.engine.load(Ordering::Acquire);
        if p.is_null() {
            return self.init_engine();
        }
        p
    }

    #[cfg(not(proxalloc_loom))]
    #[inline(always)]
    pub(crate) fn engine(&self) -> &Engine {
        // SAFETY: a published engine lives until this allocator is dropped.
        unsafe { &*self.engine_ptr() }
    }

    #[cfg(not(proxalloc_loom))]
    #[cold]
    fn init_engine(&self) -> *const Engine {
        use crate::sync::Ordering;
        let fresh = Arc::into_raw(Arc::new(Engine::new(
            self.name,
            Layout::new::<T>(),
            self.config,
            self.hooks,
            self.budget.clone(),
        )));
        // Release publishes the engine's fields to the Acquire load in `engine_ptr`.
        match self.engine.compare_exchange(
            std::ptr::null_mut(),
            fresh.cast_mut(),
            Ordering::AcqRel,
            Ordering::Acquire,
        ) {
            Ok(_) => {
                // SAFETY: just published; lives until this allocator is dropped.
                let e = unsafe { &*fresh };
                self.slot_hint.store(e.slot(), Ordering::Relaxed);
                // A capped allocator keeps its instance hint unset, so its fast paths
                // never match and every operation counts its permit on the slow path.
                if !self.capped() {
                    self.instance_hint.store(e.instance(), Ordering::Relaxed);
                }
                let engine: Arc<Engine> = Arc::clone(&self.engine_arc());
                crate::registry::register(&(engine as Arc<dyn crate::registry::Registered>));
                fresh
            }
            Err(winner) => {
                // SAFETY: ours was never published or used: shut it down and free it.
                unsafe {
                    let ours = Arc::from_raw(fresh);
                    ours.shutdown();
                }
                winner
            }
        }
    }

    #[cfg(proxalloc_loom)]
    #[inline(always)]
    pub(crate) fn engine(&self) -> &Engine {
        &self.engine
    }

    /// This thread's cache, found without touching the engine.
    #[cfg(not(proxalloc_loom))]
    #[inline(always)]
    fn lookup(&self) -> Lookup {
        use crate::sync::Ordering;
        cache::lookup(
            self.slot_hint.load(Ordering::Relaxed),
            self.instance_hint.load(Ordering::Relaxed),
        )
    }

    /// This thread's inline cache, if it has one (see [`cache::lookup_fast`]).
    #[cfg(not(proxalloc_loom))]
    #[inline(always)]
    fn lookup_fast(&self) -> Option<*const ThreadCache> {
        // Not `load(Relaxed)`: see `sync::relaxed` (an atomic here would make every
        // caller's value be built on the stack and copied).
        cache::lookup_fast(
            crate::sync::relaxed::load_u32(&self.slot_hint),
            crate::sync::relaxed::load_u64(&self.instance_hint),
        )
    }

    #[cfg(proxalloc_loom)]
    #[inline(always)]
    fn lookup_fast(&self) -> Option<*const ThreadCache> {
        if self.capped() {
            return None;
        }
        cache::lookup_fast(self.engine.slot(), self.engine.instance())
    }

    #[cfg(proxalloc_loom)]
    #[inline(always)]
    fn lookup(&self) -> Lookup {
        cache::lookup(self.engine.slot(), self.engine.instance())
    }

    /// The engine as an `Arc` (borrowed: not counted), for registering a thread cache.
    #[cfg(not(proxalloc_loom))]
    fn engine_arc(&self) -> ManuallyDrop<Arc<Engine>> {
        let e = self.engine_ptr();
        // SAFETY: the allocator holds one strong count, made by `Arc::into_raw`, and the
        // result is never dropped, so that count is not given up.
        ManuallyDrop::new(unsafe { Arc::from_raw(e) })
    }

    /// Under loom a counted clone (loom tracks every count, and this one is dropped).
    #[cfg(proxalloc_loom)]
    pub(crate) fn engine_arc(&self) -> Arc<Engine> {
        self.engine.clone()
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
    fn capped(&self) -> bool {
        self.config.max_live != usize::MAX
    }

    /// This thread's cache, registering one if it has none (`None` without thread-local
    /// storage). Registration may run user code, so callers use the result right away.
    fn cache_or_register(&self, e: &Arc<Engine>) -> Option<*const ThreadCache> {
        if let Lookup::Unregistered = cache::lookup(e.slot(), e.instance()) {
            Engine::register(e);
        }
        match cache::lookup(e.slot(), e.instance()) {
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
    fn on_alloc(&self, p: NonNull<u8>) {
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

    /// No cache yet: registers one (which may run user code: see `cache::install`),
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

    /// Allocates an object holding `value`.
    ///
    /// # Panics
    /// If the backing allocator fails (see [`try_alloc`](Self::try_alloc)), through
    /// [`std::alloc::handle_alloc_error`].
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
    /// ```
    /// use proxalloc::{AllocError, ClassAllocator, Config};
    /// static SLOTS: ClassAllocator<u64> =
    ///     ClassAllocator::with_config("doc-class-try-alloc", Config::new().max_live(1));
    /// let first = SLOTS.try_alloc(1).expect("under the cap");
    /// assert_eq!(SLOTS.try_alloc(2).err(), Some(AllocError)); // the cap is reached
    /// drop(first);
    /// assert_eq!(*SLOTS.try_alloc(3).unwrap(), 3);
    /// ```
    #[inline(always)]
    #[must_use = "dropping the result frees the object at once"]
    pub fn try_alloc(&self, value: T) -> Result<ClassBox<'_, T>, AllocError> {
        // Not through `try_alloc_with`: moving a large `value` into a closure and out
        // again costs extra copies. Built by the caller before the call, `value` still
        // lands straight in the object, because nothing on the fast path is opaque to
        // the compiler's alias analysis (see `sync::relaxed`).
        let slot = self.alloc_raw()?;
        // SAFETY: valid, aligned, uninitialised memory for one `T`.
        unsafe { slot.as_ptr().write(value) };
        // SAFETY: a fresh slot of this allocator, now initialised, owned by nobody else.
        Ok(unsafe { ClassBox::from_raw(self, slot) })
    }

    /// Allocates an object constructed by `init`, or returns an error without calling
    /// `init` if the backing allocator fails.
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
        let slot = self.alloc_raw()?;
        // Returns the slot if `init` unwinds.
        let guard = SlotGuard { alloc: self, slot };
        // SAFETY: `slot` is valid, aligned, uninitialised memory for one `T`.
        unsafe { slot.as_ptr().write(init()) };
        std::mem::forget(guard);
        // SAFETY: a fresh slot of this allocator, now initialised, owned by nobody else.
        Ok(unsafe { ClassBox::from_raw(self, slot) })
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
    ///     bufs.alloc_in_place(|slot| {
    ///         let p = slot.as_mut_ptr().cast::<u64>();
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
        let slot = self.alloc_raw()?;
        let guard = SlotGuard { alloc: self, slot };
        // SAFETY: valid, aligned memory for one `T`; `MaybeUninit` accepts any contents.
        init(unsafe { &mut *slot.as_ptr().cast::<MaybeUninit<T>>() });
        std::mem::forget(guard);
        // SAFETY: a fresh slot of this allocator, now initialised, owned by nobody else.
        Ok(unsafe { ClassBox::from_raw(self, slot) })
    }

    /// Gives everything this thread caches and everything the depot caches back to the
    /// system allocator, and returns the number of bytes released. Objects cached by
    /// other threads stay with them (each thread's cache holds at most two magazines;
    /// they come back when the thread exits or calls
    /// [`release_thread_cache`](Self::release_thread_cache), and at the thread's next
    /// slow path after a [`trim_all`](crate::trim_all) or this allocator's drop).
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
        self.engine().trim() * std::mem::size_of::<T>()
    }

    /// Hands this thread's cached objects to the depot and forgets this thread's cache
    /// (a worker about to idle for long, or a thread whose thread-local destructors may
    /// not run). The next allocation on this thread makes a new cache.
    ///
    /// ```
    /// use proxalloc::ClassAllocator;
    /// static JOBS: ClassAllocator<[u64; 8]> = ClassAllocator::new("doc-class-release");
    /// drop(JOBS.alloc([0; 8]));
    /// assert_eq!(JOBS.stats().cached_in_threads, 1);
    /// JOBS.release_thread_cache(); // e.g. before this worker idles for long
    /// let s = JOBS.stats();
    /// assert_eq!((s.cached_in_threads, s.cached_in_depot), (0, 1));
    /// ```
    pub fn release_thread_cache(&self) {
        self.engine().release_thread_cache();
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

    /// Runs `f` with this thread's cache in hand, so allocations and frees in `f` skip
    /// the thread-local lookup: for event-loop workers that own their thread. On the way
    /// out it honours flush requests that `trim_all` posted meanwhile (an event loop
    /// that only ever hits its cache takes no slow path that would).
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
    pub fn with_local<'a, R>(&'a self, f: impl FnOnce(&LocalCache<'a, T>) -> R) -> R {
        // Without thread-local storage: no cache, straight to the backing allocator.
        let cache = self.cache_or_register(&self.engine_arc());
        // Keeps `release_thread_cache` (called from `f`) from retiring the cache.
        // SAFETY: this thread's cache; nothing borrows its owner part here.
        let pin = cache.map(|c| unsafe { cache::Pin::new(c) });
        let result = f(&LocalCache {
            alloc: self,
            cache,
            _not_send: PhantomData,
        });
        drop(pin);
        cache::honour_flush_requests();
        result
    }
}

impl<T> Drop for ClassAllocator<T> {
    fn drop(&mut self) {
        #[cfg(not(proxalloc_loom))]
        {
            let p = *self.engine.get_mut();
            if p.is_null() {
                return;
            }
            // SAFETY: `&mut self`: no handle or borrow of the allocator is left, so no
            // thread can be using it; the allocator's strong count is given up here.
            unsafe {
                let engine = Arc::from_raw(p);
                engine.shutdown();
            }
        }
        #[cfg(proxalloc_loom)]
        // SAFETY: as above.
        unsafe {
            self.engine.shutdown()
        };
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

/// Gives a slot back (without dropping anything in it) if construction unwinds.
struct SlotGuard<'a, T> {
    alloc: &'a ClassAllocator<T>,
    slot: NonNull<T>,
}

impl<T> Drop for SlotGuard<'_, T> {
    #[inline(always)]
    fn drop(&mut self) {
        // SAFETY: the slot came from `alloc` and holds no value.
        unsafe { self.alloc.free_raw(self.slot) };
    }
}

/// An object owned through a [`ClassAllocator`]: dropping it runs `T`'s destructor and
/// recycles the memory into the dropping thread's cache.
///
/// ```
/// use proxalloc::{ClassAllocator, ClassBox};
/// static NUMS: ClassAllocator<Vec<u32>> = ClassAllocator::new("doc-pooled");
/// let mut v: ClassBox<'static, Vec<u32>> = NUMS.alloc(vec![1, 2]);
/// v.push(3); // `DerefMut` to the object
/// assert_eq!(*v, [1, 2, 3]);
/// let moved = std::thread::spawn(move || v.len()).join().unwrap(); // `Send`: `Vec` is
/// assert_eq!(moved, 3);
/// assert_eq!(NUMS.stats().live, 0); // freed on the other thread
/// ```
///
/// It is `Send`/`Sync` exactly when `T` is. A handle to a `!Send` type stays on its
/// thread:
///
/// ```compile_fail
/// use proxalloc::ClassAllocator;
/// use std::rc::Rc;
/// static RCS: ClassAllocator<Rc<u8>> = ClassAllocator::new("rcs");
/// let h = RCS.alloc(Rc::new(1));
/// std::thread::spawn(move || drop(h)); // error: `Rc<u8>` cannot be sent between threads
/// ```
pub struct ClassBox<'a, T> {
    ptr: NonNull<T>,
    alloc: &'a ClassAllocator<T>,
    _owns: PhantomData<T>,
}

// SAFETY: the handle owns its `T` exclusively (like `Box<T>`); the allocator reference is
// to a `Sync` allocator.
unsafe impl<T: Send> Send for ClassBox<'_, T> {}
// SAFETY: `&ClassBox<T>` only gives out `&T`.
unsafe impl<T: Sync> Sync for ClassBox<'_, T> {}

impl<'a, T> ClassBox<'a, T> {
    /// The allocator this object came from. (An associated function, not a method, so
    /// that it cannot shadow a method of `T`: call it as `ClassBox::allocator(&handle)`.)
    ///
    /// ```
    /// use proxalloc::{ClassAllocator, ClassBox};
    /// static IDS: ClassAllocator<u64> = ClassAllocator::new("doc-pooled-allocator");
    /// let id = IDS.alloc(9);
    /// assert!(std::ptr::eq(ClassBox::allocator(&id), &IDS));
    /// assert_eq!(ClassBox::allocator(&id).name(), "doc-pooled-allocator");
    /// ```
    pub fn allocator(this: &Self) -> &'a ClassAllocator<T> {
        this.alloc
    }

    /// Moves the value out and recycles the memory.
    ///
    /// ```
    /// use proxalloc::{ClassAllocator, ClassBox};
    /// static LINES: ClassAllocator<String> = ClassAllocator::new("doc-pooled-into-inner");
    /// let line = LINES.alloc("GET / HTTP/1.1".to_string());
    /// let owned: String = ClassBox::into_inner(line);
    /// assert_eq!(owned, "GET / HTTP/1.1");
    /// assert_eq!(LINES.stats().live, 0); // the slot is back in the cache
    /// ```
    pub fn into_inner(this: Self) -> T {
        let this = ManuallyDrop::new(this);
        // SAFETY: the handle owns an initialised value, read exactly once here.
        let value = unsafe { this.ptr.as_ptr().read() };
        // SAFETY: the slot came from `alloc` and its value was moved out.
        unsafe { this.alloc.free_raw(this.ptr) };
        value
    }

    /// Gives up ownership without dropping or recycling; the object stays allocated.
    /// Pair with [`from_raw`](Self::from_raw) or [`ClassAllocator`]-aware code.
    ///
    /// ```
    /// use proxalloc::{ClassAllocator, ClassBox};
    /// static NODES: ClassAllocator<u64> = ClassAllocator::new("doc-pooled-into-raw");
    /// let raw = ClassBox::into_raw(NODES.alloc(5)); // e.g. stored in an intrusive list
    /// assert_eq!(NODES.stats().live, 1);
    /// // SAFETY: `raw` came from `into_raw` on an object of `NODES`, and is used once.
    /// let back = unsafe { ClassBox::from_raw(&NODES, raw) };
    /// assert_eq!(*back, 5);
    /// ```
    pub fn into_raw(this: Self) -> NonNull<T> {
        ManuallyDrop::new(this).ptr
    }

    /// Rebuilds a handle from [`into_raw`](Self::into_raw).
    ///
    /// # Safety
    /// `ptr` is an object of `alloc` holding an initialised value (as `into_raw` gives
    /// out), and no other handle owns it.
    ///
    /// ```
    /// use proxalloc::{ClassAllocator, ClassBox};
    /// static TIMERS: ClassAllocator<u32> = ClassAllocator::new("doc-pooled-from-raw");
    /// let p = ClassBox::into_raw(TIMERS.alloc(30));
    /// // SAFETY: `p` is an initialised object of `TIMERS` that no handle owns.
    /// let h = unsafe { ClassBox::from_raw(&TIMERS, p) };
    /// assert_eq!(ClassBox::as_ptr(&h), p.as_ptr().cast_const());
    /// drop(h); // dropped and recycled as usual
    /// assert_eq!(TIMERS.stats().live, 0);
    /// ```
    pub unsafe fn from_raw(alloc: &'a ClassAllocator<T>, ptr: NonNull<T>) -> Self {
        ClassBox {
            ptr,
            alloc,
            _owns: PhantomData,
        }
    }

    /// Leaks the object: it is never dropped and its memory never recycled.
    ///
    /// ```
    /// use proxalloc::{ClassAllocator, ClassBox};
    /// static SETTINGS: ClassAllocator<u32> = ClassAllocator::new("doc-pooled-leak");
    /// let forever: &'static mut u32 = ClassBox::leak(SETTINGS.alloc(1));
    /// *forever += 1;
    /// assert_eq!(*forever, 2);
    /// assert_eq!(SETTINGS.stats().live, 1); // still counted as live
    /// ```
    pub fn leak(this: Self) -> &'a mut T {
        // SAFETY: the value is initialised and owned; it is never freed.
        unsafe { &mut *Self::into_raw(this).as_ptr() }
    }

    /// A raw pointer to the object (the handle keeps ownership).
    ///
    /// ```
    /// use proxalloc::{ClassAllocator, ClassBox};
    /// static KEYS: ClassAllocator<u64> = ClassAllocator::new("doc-pooled-as-ptr");
    /// let k = KEYS.alloc(11);
    /// let p = ClassBox::as_ptr(&k);
    /// assert_eq!(p, &*k as *const u64);
    /// // SAFETY: `k` still owns the object, so it is live.
    /// assert_eq!(unsafe { *p }, 11);
    /// ```
    pub fn as_ptr(this: &Self) -> *const T {
        this.ptr.as_ptr()
    }
}

impl<T> Drop for ClassBox<'_, T> {
    #[inline(always)]
    fn drop(&mut self) {
        if std::mem::needs_drop::<T>() {
            // Recycles the slot even if `T::drop` unwinds.
            let guard = SlotGuard {
                alloc: self.alloc,
                slot: self.ptr,
            };
            // SAFETY: the handle owns an initialised value, dropped exactly once here.
            unsafe { self.ptr.as_ptr().drop_in_place() };
            std::mem::forget(guard);
        }
        // SAFETY: the slot came from `alloc` and its value is gone.
        unsafe { self.alloc.free_raw(self.ptr) };
    }
}

impl<T> Deref for ClassBox<'_, T> {
    type Target = T;
    #[inline]
    fn deref(&self) -> &T {
        // SAFETY: the handle owns an initialised value.
        unsafe { self.ptr.as_ref() }
    }
}

impl<T> DerefMut for ClassBox<'_, T> {
    #[inline]
    fn deref_mut(&mut self) -> &mut T {
        // SAFETY: the handle owns an initialised value, exclusively.
        unsafe { self.ptr.as_mut() }
    }
}

impl<T> AsRef<T> for ClassBox<'_, T> {
    fn as_ref(&self) -> &T {
        self
    }
}

impl<T> AsMut<T> for ClassBox<'_, T> {
    fn as_mut(&mut self) -> &mut T {
        self
    }
}

impl<T> Borrow<T> for ClassBox<'_, T> {
    fn borrow(&self) -> &T {
        self
    }
}

impl<T> BorrowMut<T> for ClassBox<'_, T> {
    fn borrow_mut(&mut self) -> &mut T {
        self
    }
}

impl<T: fmt::Debug> fmt::Debug for ClassBox<'_, T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&**self, f)
    }
}

impl<T: fmt::Display> fmt::Display for ClassBox<'_, T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&**self, f)
    }
}

impl<T> fmt::Pointer for ClassBox<'_, T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Pointer::fmt(&self.ptr, f)
    }
}

impl<T: PartialEq> PartialEq for ClassBox<'_, T> {
    fn eq(&self, other: &Self) -> bool {
        **self == **other
    }
}

impl<T: Eq> Eq for ClassBox<'_, T> {}

impl<T: PartialOrd> PartialOrd for ClassBox<'_, T> {
    fn partial_cmp(&self, other: &Self) -> Option<CmpOrdering> {
        (**self).partial_cmp(&**other)
    }
}

impl<T: Ord> Ord for ClassBox<'_, T> {
    fn cmp(&self, other: &Self) -> CmpOrdering {
        (**self).cmp(&**other)
    }
}

impl<T: Hash> Hash for ClassBox<'_, T> {
    fn hash<H: Hasher>(&self, state: &mut H) {
        (**self).hash(state)
    }
}

/// This thread's cache of one allocator, in hand: see [`ClassAllocator::with_local`].
/// Allocations and frees through it skip the thread-local lookup.
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
    alloc: &'a ClassAllocator<T>,
    /// This thread's cache, pinned for the whole `with_local` call; `None` once
    /// thread-local storage is gone (then everything goes to the backing allocator).
    cache: Option<*const ThreadCache>,
    _not_send: PhantomData<*mut ()>,
}

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
    ///     e.0 + e.1 // `e` drops here, through the thread-local lookup
    /// });
    /// assert_eq!(sum, 5);
    /// ```
    #[inline]
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
    #[inline]
    #[must_use = "dropping the handle frees the object at once"]
    pub fn alloc_with(&self, init: impl FnOnce() -> T) -> ClassBox<'a, T> {
        if self.alloc.capped() {
            return self.alloc.alloc_with(init);
        }
        let slot = match self.cache {
            // SAFETY: this thread's pinned cache, alive for the whole `with_local` call;
            // nothing borrows its owner part between calls into the allocator.
            Some(c) => unsafe { self.engine().alloc_from(&*c) },
            None => self.engine().alloc_backing(),
        };
        let slot = slot.unwrap_or_else(|| std::alloc::handle_alloc_error(Layout::new::<T>()));
        self.alloc.on_alloc(slot);
        let slot = slot.cast::<T>();
        let guard = SlotGuard {
            alloc: self.alloc,
            slot,
        };
        // SAFETY: valid uninitialised memory for one `T`.
        unsafe { slot.as_ptr().write(init()) };
        std::mem::forget(guard);
        // SAFETY: a fresh slot of this allocator, now initialised, owned by nobody else.
        unsafe { ClassBox::from_raw(self.alloc, slot) }
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
    ///     cache.free(b); // drops the `Vec`, recycles the slot into this cache
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
    #[inline]
    pub fn free(&self, object: ClassBox<'_, T>) {
        assert!(
            std::ptr::eq(object.alloc, self.alloc),
            "proxalloc: object freed into a different allocator ({:?}) than its own ({:?})",
            self.alloc.name,
            object.alloc.name,
        );
        if self.alloc.capped() {
            return drop(object);
        }
        let ptr = ClassBox::into_raw(object);
        let guard = SlotGuard {
            alloc: self.alloc,
            slot: ptr,
        };
        // SAFETY: the handle owned an initialised value; dropped exactly once here.
        unsafe { ptr.as_ptr().drop_in_place() };
        std::mem::forget(guard);
        let p = ptr.cast::<u8>();
        self.alloc.on_free(p);
        match self.cache {
            // SAFETY: see `alloc_with`; the slot is ours and no longer used.
            Some(c) => unsafe { self.engine().free_into(&*c, p) },
            // SAFETY: as above.
            None => unsafe { self.engine().free_backing(p) },
        }
    }
}

impl<T> fmt::Debug for LocalCache<'_, T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LocalCache")
            .field("allocator", &self.alloc.name)
            .finish_non_exhaustive()
    }
}
