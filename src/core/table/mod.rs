//! The thread-local table that finds a thread's cache for an allocator, and what runs
//! around it on the owner thread: registration, the idle collector and flush sweeps,
//! deferred release of what a sweep frees ([`Garbage`]), and the thread-exit teardown.

use std::cell::{Cell, UnsafeCell};
use std::ptr;

use super::engine::Engine;
use super::exchange::Evictions;
use super::idle::Seen;
use super::ids::EMPTY;
use super::thread_cache::{self, Owner, OwnerKey, ThreadCache};
use crate::sync::{self, Arc};

mod lookup;

#[cfg(all(test, not(proxalloc_loom)))]
pub(crate) use lookup::inline_offset;
pub(crate) use lookup::{hint_offset, lookup, lookup_boxed, lookup_fast, Lookup};

/// Allocators whose index is below this keep this thread's cache inline in the
/// thread-local block (`INLINE_CACHES * size_of::<ThreadCache>()` bytes per thread, paid
/// by every thread of the process, so it is kept small), so the fast paths reach it with
/// no pointer chase; higher indices use boxed caches found through a vector, by a short
/// out-of-line path ([`lookup_boxed`]).
#[cfg(not(proxalloc_loom))]
pub(crate) const INLINE_CACHES: usize = 32;
/// Loom's caches are larger (its atomics), and a loom thread's stack must hold a table.
#[cfg(proxalloc_loom)]
pub(crate) const INLINE_CACHES: usize = 16;

/// Boxed caches whose address the table keeps in thread-local storage too (indices
/// `INLINE_CACHES..INLINE_CACHES + DIRECT_BOXED`, 8 bytes each per thread), so that
/// [`lookup_boxed`] reaches them with one load more than the inline lookup (the
/// address, then the cache); higher indices go through the vector in `Rest`.
pub(crate) const DIRECT_BOXED: usize = 96;

/// Slow-path entries on a thread between two runs of its idle collector. Each slow path
/// stands for at least a magazine's worth of operations on one cache (see the exchange
/// rules), so this is a count of operations, not of time.
pub(crate) const GC_PERIOD: u32 = 256;

/// The idle collector's period: [`GC_PERIOD`], which the loom models may shorten (256
/// slow paths are far beyond what a model can run).
#[inline]
fn gc_period() -> u32 {
    #[cfg(proxalloc_loom)]
    return loom_hooks::GC_PERIOD.with(Cell::get);
    #[cfg(not(proxalloc_loom))]
    GC_PERIOD
}

/// Knobs of the loom build that the models turn.
#[cfg(proxalloc_loom)]
pub(crate) mod loom_hooks {
    use std::cell::Cell;

    std::thread_local! {
        /// The idle collector's period for the model running on this OS thread. A std
        /// thread-local, not loom's: loom runs all of a model's threads on the OS thread
        /// that called `loom::model`, so they all see the value, and it is no
        /// synchronisation for loom to explore.
        pub(crate) static GC_PERIOD: Cell<u32> = const { Cell::new(super::GC_PERIOD) };
    }
}

/// Work left over from a table operation, done once the table and every cache are
/// consistent and nothing is borrowed: releasing evicted objects (which runs a
/// recycling allocator's destructors, user code that may re-enter any allocator), and
/// dropping engines (the last reference frees a dead allocator's depot).
///
/// The first item takes no memory: a thread's `release_thread_cache`, or a slow path
/// that retires one stale cache, never allocates here.
#[derive(Default)]
pub(crate) struct Garbage {
    first: Option<(Arc<Engine>, Evictions)>,
    more: Vec<(Arc<Engine>, Evictions)>,
}

impl Garbage {
    fn push(&mut self, engine: Arc<Engine>, evictions: Evictions) {
        match self.first {
            None => self.first = Some((engine, evictions)),
            Some(_) => self.more.push((engine, evictions)),
        }
    }

    /// Room for one more item, or `None` where the global allocator fails.
    fn reserve_one(&mut self) -> Option<()> {
        match self.first {
            None => Some(()),
            Some(_) => self.more.try_reserve(1).ok(),
        }
    }

    /// Releases everything; returns the number of objects released.
    pub(crate) fn release(self) -> usize {
        let mut released = 0;
        for (engine, evictions) in self.first.into_iter().chain(self.more) {
            released += engine.release(evictions);
            drop(engine);
        }
        released
    }
}

/// `Box::into_raw(Box::new(value))`, or `None` where the global allocator fails
/// (`Box::new` would abort, and registering a cache must not abort a `try_alloc`).
fn try_box<T>(value: T) -> Option<*mut T> {
    const { assert!(size_of::<T>() > 0) };
    let layout = std::alloc::Layout::new::<T>();
    // SAFETY: `T` is not zero-sized (checked at compile time above).
    let p = unsafe { std::alloc::alloc(layout) }.cast::<T>();
    if p.is_null() {
        return None;
    }
    // SAFETY: fresh memory, aligned and sized for one `T`; it becomes a `Box<T>`'s
    // (same global allocator, same layout) when the table frees it.
    unsafe { p.write(value) };
    Some(p)
}

/// A thread's caches, indexed by the dense table index of each allocator it has used.
///
/// The table owns its caches: it retires them at thread exit, on
/// `release_thread_cache`, when their allocator is gone, and when an index passes to a new
/// allocator. A stale entry is still a valid cache whose instance number matches nobody,
/// and [`lookup()`] may read it.
///
/// Off loom the table itself needs no destructor, so std gives the thread-local a
/// `const` initialiser and no lazy-initialisation or liveness check: the fast paths
/// address it directly. The thread-exit work is done by a separate thread-local,
/// [`ExitHook`], armed when the thread registers its first cache.
///
/// Methods that borrow `rest` or a cache's owner part run no user code: what needs it
/// comes back as [`Garbage`], released after the borrow ends.
struct Table {
    fast: UnsafeCell<[ThreadCache; INLINE_CACHES]>,
    /// The first [`DIRECT_BOXED`] boxed caches (null where none), as in `Rest::more`:
    /// set when a box is made, cleared at teardown before the boxes are freed.
    boxed: [Cell<*mut ThreadCache>; DIRECT_BOXED],
    /// Everything else, boxed on first registration and freed at thread exit.
    rest: Cell<*mut Rest>,
    /// Set when the thread-exit teardown has run: no new cache may be registered.
    torn_down: Cell<bool>,
    /// Slow-path entries on this thread since the idle collector last ran.
    gc_clock: Cell<u32>,
    /// The flush epoch ([`thread_cache::flush_epoch`]) when this thread last swept its caches.
    seen_epoch: Cell<u64>,
}

#[derive(Default)]
struct Rest {
    /// Boxed caches of indices `INLINE_CACHES..`, at `index - INLINE_CACHES` (null when none).
    more: Vec<*mut ThreadCache>,
    /// Per index: the engine of a registered cache, kept alive so the thread-exit flush
    /// can reach it (and so a dead allocator's magazines stay valid until this thread
    /// has released what its cache holds).
    owners: Vec<Option<Arc<Engine>>>,
    /// Room for the thread-exit teardown's garbage, one item per index of `owners`,
    /// reserved when a registration makes `owners` longer: a thread exit then allocates
    /// nothing here (the global allocator may be out of memory by then).
    exit_room: Vec<(Arc<Engine>, Evictions)>,
}

impl Rest {
    /// The cache of `index` (null for a boxed entry never used).
    fn cache(&self, fast: *mut ThreadCache, index: usize) -> *mut ThreadCache {
        if index < INLINE_CACHES {
            // SAFETY: in bounds of the inline array.
            return unsafe { fast.add(index) };
        }
        self.more
            .get(index - INLINE_CACHES)
            .copied()
            .unwrap_or(ptr::null_mut())
    }

    /// Retires the cache of `index`, if registered: it leaves its engine's cache list and
    /// hands its magazines over, and the entry becomes unused. No user code runs.
    ///
    /// # Safety
    /// Called by the owning thread (whose table gave `key`), with no reference into the
    /// cache's owner part live.
    unsafe fn retire(
        &mut self,
        key: &OwnerKey,
        fast: *mut ThreadCache,
        index: usize,
        garbage: &mut Garbage,
    ) {
        let Some(engine) = self.owners.get_mut(index).and_then(Option::take) else {
            return;
        };
        // SAFETY: a registered cache of this thread, per the caller's contract.
        let c = unsafe { Owner::new(key, self.cache(fast, index)) };
        debug_assert!(!c.pinned(), "retiring a pinned cache");
        // SAFETY: this thread's cache, which it will not use again for `engine`.
        let evictions = unsafe { engine.retire_cache(c) };
        // SAFETY: no other borrow of the owner part is live.
        unsafe { c.owned().instance = EMPTY };
        garbage.push(engine, evictions);
    }
}

impl Table {
    #[cfg(not(proxalloc_loom))]
    const fn new() -> Self {
        Self::with_caches([const { ThreadCache::new(EMPTY) }; INLINE_CACHES])
    }

    #[cfg(proxalloc_loom)]
    fn new() -> Self {
        Self::with_caches(std::array::from_fn(|_| ThreadCache::new(EMPTY)))
    }

    const fn with_caches(fast: [ThreadCache; INLINE_CACHES]) -> Self {
        Table {
            fast: UnsafeCell::new(fast),
            boxed: [const { Cell::new(ptr::null_mut()) }; DIRECT_BOXED],
            rest: Cell::new(ptr::null_mut()),
            torn_down: Cell::new(false),
            gc_clock: Cell::new(0),
            seen_epoch: Cell::new(0),
        }
    }

    fn fast(&self) -> *mut ThreadCache {
        self.fast.get().cast::<ThreadCache>()
    }

    /// The key to this table's caches (see [`OwnerKey`]).
    #[inline(always)]
    fn key(&self) -> OwnerKey {
        // SAFETY: called on the thread that owns this table (the only way to reach it is
        // through the thread-local).
        unsafe { OwnerKey::new(self as *const Table as usize) }
    }

    /// Runs `f` on `rest` (if the thread has one).
    ///
    /// # Safety
    /// Called by the owning thread; `f` runs no user code and does not re-enter the
    /// table.
    unsafe fn with_rest<R>(&self, f: impl FnOnce(&mut Rest) -> R) -> Option<R> {
        // SAFETY: `rest` is null or a live box owned by this thread's table, and per
        // the contract nothing else borrows it while `f` runs.
        unsafe { self.rest.get().as_mut() }.map(f)
    }

    /// The cache of `index`, if it has one (in use or stale). Inlined into the boxed
    /// lookup, which runs at every operation of an allocator past the inline caches;
    /// the search of the table's vector beyond the kept addresses is not.
    ///
    /// # Safety
    /// Called by the owning thread.
    #[inline(always)]
    unsafe fn cache(&self, index: usize) -> *mut ThreadCache {
        if index < INLINE_CACHES {
            // SAFETY: in bounds of the inline array.
            return unsafe { self.fast().add(index) };
        }
        if let Some(direct) = self.boxed.get(index - INLINE_CACHES) {
            return direct.get();
        }
        // SAFETY: per the caller's contract.
        unsafe { self.far_cache(index) }
    }

    /// [`cache`](Self::cache) past the kept addresses: the table's vector.
    ///
    /// # Safety
    /// As for [`cache`](Self::cache).
    #[inline(never)]
    unsafe fn far_cache(&self, index: usize) -> *mut ThreadCache {
        // SAFETY: per the caller's contract; a lookup runs no user code.
        unsafe { self.with_rest(|rest| rest.cache(self.fast(), index)) }.unwrap_or(ptr::null_mut())
    }

    /// A fresh cache for `engine` at its index (which `engine` has no cache in),
    /// registered with the engine; a stale cache at that index (its allocator was
    /// dropped) is retired first, into `garbage`. `None` once the thread is tearing
    /// down its thread-locals.
    ///
    /// # Safety
    /// Called by the owning thread, with no reference into the table live.
    unsafe fn create(
        &self,
        engine: &Arc<Engine>,
        garbage: &mut Garbage,
    ) -> Option<*mut ThreadCache> {
        if self.torn_down.get() {
            return None;
        }
        if self.rest.get().is_null() {
            if !arm_exit_hook() {
                return None;
            }
            self.rest.set(try_box(Rest::default())?);
        }
        let fast = self.fast();
        let key = self.key();
        // SAFETY: per the contract; nothing in here runs user code.
        unsafe {
            self.with_rest(|rest| {
                // Every allocation first, where a failure changes nothing: a `try_alloc`
                // that meets an out-of-memory here goes on without a cache, and
                // returns an error only if the backing allocator fails too.
                let index = engine.index() as usize;
                if rest.owners.len() <= index {
                    let more = index + 1 - rest.owners.len();
                    rest.owners.try_reserve(more).ok()?;
                    rest.exit_room.try_reserve(index + 1).ok()?;
                    rest.owners.resize_with(index + 1, || None);
                }
                let c = if index < INLINE_CACHES {
                    fast.add(index)
                } else {
                    if rest.more.len() <= index - INLINE_CACHES {
                        let more = index - INLINE_CACHES + 1 - rest.more.len();
                        rest.more.try_reserve(more).ok()?;
                        rest.more.resize(index - INLINE_CACHES + 1, ptr::null_mut());
                    }
                    let entry = &mut rest.more[index - INLINE_CACHES];
                    if entry.is_null() {
                        *entry = try_box(ThreadCache::new(EMPTY))?;
                        if let Some(direct) = self.boxed.get(index - INLINE_CACHES) {
                            direct.set(*entry);
                        }
                    }
                    *entry
                };
                if rest.owners[index].is_some() {
                    garbage.reserve_one()?; // for the stale cache `retire` hands over
                }
                rest.retire(&key, fast, index, garbage);
                // The old cache is retired: no magazines, and no other thread can reach
                // it (it left its engine's cache list).
                (*c).reset(engine.instance(), &key);
                if !engine.admin().adopt(c) {
                    // Out of memory for the cache list: as never registered.
                    // SAFETY: `c` is this table's live cache, just reset for this
                    // thread (the witness's requirement); no other borrow of its owner
                    // part is live, and it is in no list, so no other thread reaches it.
                    Owner::new(&key, c).owned().instance = EMPTY;
                    return None;
                }
                rest.owners[index] = Some(engine.clone());
                Some(c)
            })
            .flatten()
        }
    }

    /// Sweeps this thread's caches: a cache whose allocator is gone is retired, one
    /// with a flush request is flushed, and (on an idle pass) one that served nothing
    /// since the previous idle pass gives back its stash and kept empties if it has any,
    /// else one magazine (so an idle cache drains in two passes, three with a stash).
    ///
    /// # Safety
    /// Called by the owning thread, with no reference into the table live.
    unsafe fn sweep(&self, idle_pass: bool, garbage: &mut Garbage) {
        let fast = self.fast();
        let key = self.key();
        // SAFETY: per the contract; engines' retire/flush/put run no user code.
        unsafe {
            self.with_rest(|rest| {
                for index in 0..rest.owners.len() {
                    let Some(engine) = rest.owners[index].as_ref() else {
                        continue;
                    };
                    // Room for what this cache may hand over, first: out of memory, the
                    // cache is left as it is until a later sweep (this is a `try_alloc`'s
                    // slow path too, which must not abort here).
                    if garbage.reserve_one().is_none() {
                        break;
                    }
                    if !engine.is_alive() {
                        rest.retire(&key, fast, index, garbage);
                        continue;
                    }
                    let c = Owner::new(&key, rest.cache(fast, index));
                    if c.take_flush_request() {
                        let evictions = engine.flush(c);
                        garbage.push(engine.clone(), evictions);
                    } else if idle_pass {
                        let now = Seen::at(c.counters.ops());
                        if c.collector_seen.replace(now) == now {
                            let evictions = engine.release_idle_magazine(c);
                            garbage.push(engine.clone(), evictions);
                        }
                    }
                }
            });
        }
    }

    /// Thread exit: retires every cache and frees what the table allocated.
    ///
    /// # Safety
    /// Called by the owning thread, with no reference into the table live; the thread
    /// makes no further registrations.
    unsafe fn teardown(&self) -> Garbage {
        self.torn_down.set(true);
        let mut garbage = Garbage::default();
        let rest = self.rest.replace(ptr::null_mut());
        if rest.is_null() {
            return garbage;
        }
        // SAFETY: a live box owned by the table, now unreachable from it.
        let mut rest = unsafe { Box::from_raw(rest) };
        // The boxes are freed below: no lookup may reach them from here on.
        for direct in &self.boxed {
            direct.set(ptr::null_mut());
        }
        // At least one item of room per index (reserved as `owners` grew): the pushes
        // below allocate nothing.
        garbage.more = std::mem::take(&mut rest.exit_room);
        debug_assert!(garbage.more.capacity() >= rest.owners.len());
        for index in 0..rest.owners.len() {
            // SAFETY: per the contract.
            unsafe { rest.retire(&self.key(), self.fast(), index, &mut garbage) };
        }
        for c in rest.more.drain(..).filter(|c| !c.is_null()) {
            // SAFETY: boxed caches owned by this table, retired above (so no other
            // thread can reach them).
            drop(unsafe { Box::from_raw(c) });
        }
        garbage
    }
}

sync::const_thread_local! {
    static LOCAL: Table = Table::new();
}

/// Runs the table's teardown when the thread exits (std builds). A separate
/// thread-local so that the table itself has no destructor and needs no liveness check.
#[cfg(not(proxalloc_loom))]
struct ExitHook;

#[cfg(not(proxalloc_loom))]
impl Drop for ExitHook {
    fn drop(&mut self) {
        // SAFETY: thread-local destructors run on the owning thread, outside any
        // allocator call; `LOCAL` has no destructor, so it is still accessible.
        if let Ok(garbage) = LOCAL.try_with(|t| unsafe { t.teardown() }) {
            garbage.release();
        }
    }
}

#[cfg(not(proxalloc_loom))]
std::thread_local! {
    static EXIT_HOOK: ExitHook = const { ExitHook };
}

/// Registers the thread-exit teardown; false if the thread's thread-locals are already
/// being destroyed.
#[cfg(not(proxalloc_loom))]
fn arm_exit_hook() -> bool {
    EXIT_HOOK.try_with(|_| ()).is_ok()
}

/// Under loom the table's own destructor does the teardown (loom drops a thread's
/// thread-locals in no fixed order, so a separate hook could outlive the table).
#[cfg(proxalloc_loom)]
impl Drop for Table {
    fn drop(&mut self) {
        // SAFETY: the owning thread is exiting.
        unsafe { self.teardown() }.release();
    }
}

#[cfg(proxalloc_loom)]
fn arm_exit_hook() -> bool {
    true
}

/// Creates and registers this thread's cache for `engine` (which must have none); does
/// nothing if the thread is tearing down its thread-locals. It may run user code (the
/// destructors of values a dropped allocator left in the index's old cache), so callers
/// look the cache up again afterwards.
pub(crate) fn install(engine: &Arc<Engine>) {
    let mut garbage = Garbage::default();
    // SAFETY: this thread's table; no reference into it is live.
    let _ = LOCAL.try_with(|t| unsafe { t.create(engine, &mut garbage) });
    garbage.release();
}

/// Counts a slow-path entry on this thread and sweeps its caches when the idle
/// collector is due or another thread asked for flushes. Called at the end of slow
/// paths, when no cache is borrowed.
pub(crate) fn after_slow_path() {
    sweep_when_due(true);
}

/// Honours flush requests posted since this thread last looked (a `with_local` call's
/// exit: an event loop may never take a slow path).
pub(crate) fn honour_flush_requests() {
    sweep_when_due(false);
}

fn sweep_when_due(slow_path: bool) {
    let garbage = LOCAL.try_with(|t| {
        let mut idle_pass = false;
        if slow_path {
            let n = t.gc_clock.get() + 1;
            idle_pass = n >= gc_period();
            t.gc_clock.set(if idle_pass { 0 } else { n });
        }
        let epoch = thread_cache::flush_epoch();
        if !idle_pass && epoch == t.seen_epoch.get() {
            return None;
        }
        t.seen_epoch.set(epoch);
        let mut garbage = Garbage::default();
        // SAFETY: this thread's table; callers hold no borrow of it or of a cache.
        unsafe { t.sweep(idle_pass, &mut garbage) };
        Some(garbage)
    });
    if let Ok(Some(garbage)) = garbage {
        garbage.release();
    }
}

/// The flush epoch this thread last swept at, for the loom models' checks.
#[cfg(all(test, proxalloc_loom))]
pub(crate) fn seen_epoch() -> u64 {
    LOCAL.with(|t| t.seen_epoch.get())
}

/// Retires this thread's cache for `engine` (its magazines go to the depot) and frees
/// its table entry for reuse. Returns the number of objects released to the backing
/// allocator (what the depot's budget did not take).
pub(crate) fn uninstall(engine: &Engine) -> usize {
    let mut garbage = Garbage::default();
    let _ = LOCAL.try_with(|t| {
        let index = engine.index() as usize;
        // SAFETY: this thread's table; no reference into it is live.
        unsafe {
            let c = t.cache(index);
            if !c.is_null() && ThreadCache::instance(c) == engine.instance() {
                let (fast, key) = (t.fast(), t.key());
                t.with_rest(|rest| rest.retire(&key, fast, index, &mut garbage));
            }
        }
    });
    garbage.release()
}

#[cfg(all(test, not(proxalloc_loom)))]
#[path = "../tests/table.rs"]
mod tests;
