//! Per-thread caches: Bonwick's two magazines (loaded and previous), and the thread-local
//! table that finds a thread's cache for an allocator.
//!
//! The loaded magazine is kept unpacked in the cache (slot array, count, capacity), so
//! the fast paths are: find the cache, compare the count, move one pointer. The exchange
//! rules, which run only when the loaded magazine is empty (alloc) or full (free), are in
//! `#[cold]` functions in [`engine`](crate::engine).

use std::cell::{Cell, UnsafeCell};
use std::ptr::{self, NonNull};

use crate::engine::Engine;
use crate::magazine::{self, Magazine};
use crate::sync::{self, Arc, StatCounter};

/// Counters of one cache (or of all retired caches of an engine).
#[derive(Debug, Default)]
pub(crate) struct Counters {
    /// Allocations served to users (any path).
    pub(crate) allocs: StatCounter,
    /// Frees received from users (any path).
    pub(crate) frees: StatCounter,
    /// Magazines taken from the depot's full stack.
    pub(crate) refills: StatCounter,
    /// Magazines given to the depot that it kept.
    pub(crate) spills: StatCounter,
    /// Magazines given to the depot whose objects went to the backing allocator
    /// because the budget was full.
    pub(crate) overflows: StatCounter,
}

/// [`Counters`] read out as numbers.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct Counts {
    pub(crate) allocs: u64,
    pub(crate) frees: u64,
    pub(crate) refills: u64,
    pub(crate) spills: u64,
    pub(crate) overflows: u64,
}

impl Counters {
    pub(crate) const fn new() -> Self {
        Counters {
            allocs: StatCounter::new(),
            frees: StatCounter::new(),
            refills: StatCounter::new(),
            spills: StatCounter::new(),
            overflows: StatCounter::new(),
        }
    }

    /// Adds these counters' values to `sum`.
    pub(crate) fn read_into(&self, sum: &mut Counts) {
        sum.allocs += self.allocs.get();
        sum.frees += self.frees.get();
        sum.refills += self.refills.get();
        sum.spills += self.spills.get();
        sum.overflows += self.overflows.get();
    }

    /// Adds `other`'s values to these counters from any thread.
    pub(crate) fn add_shared(&self, other: &Counters) {
        let mut n = Counts::default();
        other.read_into(&mut n);
        self.allocs.add_shared(n.allocs);
        self.frees.add_shared(n.frees);
        self.refills.add_shared(n.refills);
        self.spills.add_shared(n.spills);
        self.overflows.add_shared(n.overflows);
    }
}

/// One thread's cache for one allocator. Only its thread touches the magazine state;
/// other threads read the counters (atomics) under the allocator's registry lock. The
/// fields the fast paths touch come first, in one cache line.
#[derive(Debug)]
#[repr(C, align(64))]
pub(crate) struct ThreadCache {
    /// Instance number of the engine this cache belongs to (immutable).
    pub(crate) instance: u64,
    /// Slot array of the loaded magazine (dangling when `cap == 0`).
    slots: *mut *mut u8,
    /// Objects in the loaded magazine.
    len: usize,
    /// Capacity of the loaded magazine; 0 when there is none, so both fast paths fall
    /// through to the slow path.
    cap: usize,
    /// The loaded magazine's descriptor (its `len` is stale while it is loaded).
    loaded: *const Magazine,
    /// The previous magazine, or null; its descriptor's `len` is current.
    previous: *const Magazine,
    /// What this cache did, bumped by its thread only.
    pub(crate) counters: Counters,
    /// True for a stand-in cache used after thread-local teardown: its slow paths go
    /// straight to the backing allocator and it never holds magazines.
    pub(crate) detached: bool,
    /// Live [`Pin`]s: while non-zero the cache must not be retired.
    pins: usize,
    /// `allocs + frees` when the idle collector last looked at this cache.
    gc_seen: u64,
}

impl ThreadCache {
    pub(crate) const fn new(instance: u64, detached: bool) -> Self {
        ThreadCache {
            instance,
            slots: ptr::null_mut(),
            len: 0,
            cap: 0,
            loaded: ptr::null(),
            previous: ptr::null(),
            counters: Counters::new(),
            detached,
            pins: 0,
            gc_seen: 0,
        }
    }

    /// Whether a [`Pin`] holds this cache.
    pub(crate) fn pinned(&self) -> bool {
        self.pins > 0
    }

    /// Fast path: pops the loaded magazine.
    #[inline(always)]
    pub(crate) fn pop(&mut self) -> Option<NonNull<u8>> {
        if self.len == 0 {
            return None;
        }
        self.len -= 1;
        // SAFETY: `slots[..len + 1]` are valid objects of the loaded magazine.
        let object = unsafe { magazine::slot(self.slots, self.len) };
        // After the read: the compiler cannot see through the counter's store, so it
        // would reload `slots` and `len` after it.
        self.counters.allocs.bump(1);
        Some(object)
    }

    /// Fast path: pushes onto the loaded magazine; false when it is full.
    #[inline(always)]
    pub(crate) fn push(&mut self, object: NonNull<u8>) -> bool {
        if self.len == self.cap {
            return false;
        }
        // SAFETY: `len < cap`, inside the loaded magazine's slot array.
        unsafe { *self.slots.add(self.len) = object.as_ptr() };
        self.len += 1;
        self.counters.frees.bump(1);
        true
    }

    pub(crate) fn previous(&self) -> Option<&Magazine> {
        // SAFETY: a non-null `previous` is a descriptor of the engine's table, which
        // outlives every cache of the engine.
        unsafe { self.previous.as_ref() }
    }

    /// Objects in the loaded magazine.
    pub(crate) fn loaded_len(&self) -> usize {
        self.len
    }

    /// Capacity of the loaded magazine (0 when none).
    pub(crate) fn loaded_cap(&self) -> usize {
        self.cap
    }

    /// Removes the loaded magazine (writing its count back); the caller owns it.
    pub(crate) fn unload(&mut self) -> Option<NonNull<Magazine>> {
        let mag = NonNull::new(self.loaded.cast_mut())?;
        let len = self.len;
        // SAFETY: a non-null `loaded` is a live descriptor, owned by this cache.
        unsafe { mag.as_ref().with_rounds(|r| r.len = len) };
        self.loaded = ptr::null();
        self.slots = ptr::null_mut();
        self.len = 0;
        self.cap = 0;
        Some(mag)
    }

    /// Makes `mag` (owned by the caller, with slot storage) the loaded magazine. There
    /// must be no loaded magazine.
    pub(crate) fn load(&mut self, mag: &Magazine, capacity: usize) {
        debug_assert!(self.loaded.is_null());
        // SAFETY: the caller hands over ownership.
        let (slots, len) = unsafe { mag.with_rounds(|r| (r.slots, r.len)) };
        debug_assert!(!slots.is_null() && len <= capacity);
        self.slots = slots;
        self.len = len;
        self.cap = capacity;
        self.loaded = mag;
    }

    /// Removes the previous magazine; the caller owns it.
    pub(crate) fn take_previous(&mut self) -> Option<NonNull<Magazine>> {
        let mag = NonNull::new(self.previous.cast_mut());
        self.previous = ptr::null();
        mag
    }

    /// Makes `mag` (owned by the caller) the previous magazine. There must be none.
    pub(crate) fn set_previous(&mut self, mag: Option<NonNull<Magazine>>) {
        debug_assert!(self.previous.is_null());
        self.previous = mag.map_or(ptr::null(), |m| m.as_ptr());
    }

    /// Swaps loaded and previous (either may be absent).
    pub(crate) fn swap(&mut self, capacity: usize) {
        let loaded = self.unload();
        if let Some(prev) = self.take_previous() {
            // SAFETY: the previous magazine is a live descriptor owned by this cache.
            self.load(unsafe { prev.as_ref() }, capacity);
        }
        self.set_previous(loaded);
    }
}

/// Keeps a thread's cache from being retired by `release_thread_cache` while a
/// `LocalCache` points at it.
pub(crate) struct Pin(*mut ThreadCache);

impl Pin {
    /// Pins `cache`, this thread's registered cache.
    pub(crate) fn new(cache: *mut ThreadCache) -> Self {
        // SAFETY: this thread's own cache, alive (it is registered) and not borrowed.
        unsafe { (*cache).pins += 1 };
        Pin(cache)
    }
}

impl Drop for Pin {
    fn drop(&mut self) {
        // SAFETY: a pinned cache is not freed until its thread exits, and this pin lives
        // on that thread's stack.
        unsafe { (*self.0).pins -= 1 };
    }
}

/// Instance number of an unused table entry (engines are numbered from 1).
const EMPTY: u64 = 0;

/// Allocators whose slot is below this keep this thread's cache inline in the
/// thread-local block (`FAST_SLOTS * size_of::<ThreadCache>()` bytes per thread), so the
/// fast paths reach it with no pointer chase; higher slots use boxed caches found
/// through a vector (a cold path).
const FAST_SLOTS: usize = 16;

/// Slow-path entries on a thread between two runs of its idle collector. Each slow path
/// stands for at least a magazine's worth of operations on one cache (see the exchange
/// rules), so this is a count of operations, not of time.
pub(crate) const GC_PERIOD: u32 = 256;

/// A thread's caches, indexed by the dense slot number of each allocator it has used.
///
/// The table owns its caches: it empties or frees them at thread exit, on
/// `release_thread_cache`, and when a slot passes to a new allocator. So a stale entry
/// (left by an allocator that was dropped) is still a valid cache whose instance number
/// matches nobody, and [`lookup`] may read it.
///
/// Off loom the table itself needs no destructor, so std gives the thread-local a
/// `const` initialiser and no lazy-initialisation or liveness check: the fast paths
/// address it directly. The thread-exit work is done by a separate thread-local,
/// [`ExitHook`], armed when the thread registers its first cache.
struct Table {
    fast: UnsafeCell<[ThreadCache; FAST_SLOTS]>,
    /// Everything else, boxed on first registration and freed at thread exit.
    rest: Cell<*mut Rest>,
    /// Set when the thread-exit teardown has run: no new cache may be registered.
    torn_down: Cell<bool>,
    /// Slow-path entries on this thread since the idle collector last ran.
    gc_clock: Cell<u32>,
    /// Set while the idle collector runs (it may run user destructors, which may
    /// allocate: it must not start again inside itself).
    collecting: Cell<bool>,
}

#[derive(Default)]
struct Rest {
    /// Boxed caches of slots `FAST_SLOTS..`, at `slot - FAST_SLOTS` (null when none).
    more: Vec<*mut ThreadCache>,
    /// Per slot: the engine of a registered cache, kept alive so the thread-exit flush
    /// can reach it (or see that its allocator is gone).
    owners: Vec<Option<Arc<Engine>>>,
}

impl Table {
    const fn new() -> Self {
        Table {
            fast: UnsafeCell::new([const { ThreadCache::new(EMPTY, false) }; FAST_SLOTS]),
            rest: Cell::new(ptr::null_mut()),
            torn_down: Cell::new(false),
            gc_clock: Cell::new(0),
            collecting: Cell::new(false),
        }
    }

    /// The cache of `slot`, if it has one (in use or stale).
    ///
    /// # Safety
    /// Called by the owning thread, with no reference into the table live.
    unsafe fn cache(&self, slot: usize) -> *mut ThreadCache {
        if slot < FAST_SLOTS {
            // SAFETY: in bounds of the inline array.
            return unsafe { self.fast.get().cast::<ThreadCache>().add(slot) };
        }
        // SAFETY: per the caller's contract; `rest` is null or a live box.
        match unsafe { self.rest.get().as_ref() } {
            Some(rest) => rest
                .more
                .get(slot - FAST_SLOTS)
                .copied()
                .unwrap_or(ptr::null_mut()),
            None => ptr::null_mut(),
        }
    }

    /// A fresh cache for `engine` in its slot, replacing a stale one; `None` once the
    /// thread is tearing down its thread-locals.
    ///
    /// # Safety
    /// As for [`cache`](Self::cache).
    unsafe fn create(&self, engine: &Arc<Engine>) -> Option<*mut ThreadCache> {
        if self.torn_down.get() {
            return None;
        }
        if self.rest.get().is_null() {
            if !arm_exit_hook() {
                return None;
            }
            self.rest.set(Box::into_raw(Box::default()));
        }
        // SAFETY: per the caller's contract; just made non-null.
        let rest = unsafe { &mut *self.rest.get() };
        let slot = engine.slot() as usize;
        if rest.owners.len() <= slot {
            rest.owners.resize_with(slot + 1, || None);
        }
        // A previous owner of the slot was dropped (slots are reused only then); its
        // shutdown already emptied this thread's cache for it, which is overwritten here.
        rest.owners[slot] = Some(engine.clone());
        let fresh = ThreadCache::new(engine.instance(), false);
        if slot < FAST_SLOTS {
            // SAFETY: as in `cache`; the old value holds nothing that needs dropping.
            let c = unsafe { self.cache(slot) };
            // SAFETY: as above.
            unsafe { c.write(fresh) };
            return Some(c);
        }
        if rest.more.len() <= slot - FAST_SLOTS {
            rest.more.resize(slot - FAST_SLOTS + 1, ptr::null_mut());
        }
        let entry = &mut rest.more[slot - FAST_SLOTS];
        if entry.is_null() {
            *entry = Box::into_raw(Box::new(fresh));
        } else {
            // SAFETY: a boxed cache owned by this table.
            unsafe { entry.write(fresh) };
        }
        Some(*entry)
    }

    /// Retires the cache of `slot` with its engine and marks the entry unused.
    ///
    /// # Safety
    /// As for [`cache`](Self::cache).
    unsafe fn retire(&self, slot: usize) {
        // SAFETY: per the caller's contract; `rest` is null or a live box.
        let Some(rest) = (unsafe { self.rest.get().as_mut() }) else {
            return;
        };
        let Some(engine) = rest.owners.get_mut(slot).and_then(Option::take) else {
            return;
        };
        // SAFETY: per the caller's contract; a registered cache is valid.
        unsafe {
            let c = self.cache(slot);
            engine.retire_cache(c);
            (*c).instance = EMPTY;
        }
    }

    /// The idle collector: every [`GC_PERIOD`] slow-path entries on this thread, each
    /// cache of this thread that served no operation since the previous pass gives one
    /// magazine back to its depot (so an idle cache drains in two passes).
    ///
    /// # Safety
    /// As for [`cache`](Self::cache); `busy` is the cache whose slow path is running.
    unsafe fn tick(&self, busy: *mut ThreadCache) {
        let n = self.gc_clock.get() + 1;
        if n < GC_PERIOD || self.collecting.get() {
            self.gc_clock.set(n);
            return;
        }
        self.gc_clock.set(0);
        self.collecting.set(true);
        let mut slot = 0;
        loop {
            // SAFETY: per the caller's contract; re-borrowed each round because the
            // collector may run user code that registers caches.
            let engine = match unsafe { self.rest.get().as_ref() }.map(|r| r.owners.get(slot)) {
                Some(Some(Some(engine))) => engine.clone(),
                Some(Some(None)) => {
                    slot += 1;
                    continue;
                }
                _ => break,
            };
            // SAFETY: per the caller's contract.
            let c = unsafe { self.cache(slot) };
            slot += 1;
            // The busy cache is borrowed by the running slow path: not even a read of it
            // may go through another pointer.
            if c == busy {
                continue;
            }
            // SAFETY: a cache of this thread's table, not the one in use.
            let cache = unsafe { &mut *c };
            if cache.instance != engine.instance() {
                continue;
            }
            let ops = cache.counters.allocs.get() + cache.counters.frees.get();
            if ops == cache.gc_seen {
                engine.release_idle_magazine(cache);
            }
            cache.gc_seen = ops;
        }
        self.collecting.set(false);
    }

    /// Thread exit: retires every cache and frees what the table allocated.
    ///
    /// # Safety
    /// As for [`cache`](Self::cache); the thread makes no further registrations.
    unsafe fn teardown(&self) {
        self.torn_down.set(true);
        let rest = self.rest.get();
        if rest.is_null() {
            return;
        }
        // SAFETY: a live box owned by the table.
        let slots = unsafe { (*rest).owners.len() };
        for slot in 0..slots {
            // SAFETY: per the caller's contract.
            unsafe { self.retire(slot) };
        }
        self.rest.set(ptr::null_mut());
        // SAFETY: owned by the table and no longer reachable from it.
        let rest = unsafe { Box::from_raw(rest) };
        for c in rest.more.into_iter().filter(|c| !c.is_null()) {
            // SAFETY: boxed caches owned by this table, retired above.
            drop(unsafe { Box::from_raw(c) });
        }
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
        let _ = LOCAL.try_with(|t| unsafe { t.teardown() });
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
        unsafe { self.teardown() };
    }
}

#[cfg(proxalloc_loom)]
fn arm_exit_hook() -> bool {
    true
}

/// What [`lookup`] found.
pub(crate) enum Lookup {
    /// This thread's cache for the engine.
    Cache(*mut ThreadCache),
    /// This thread has no cache for the engine (yet, or any more after teardown).
    Unregistered,
    /// Thread-local storage is gone (loom only: std's table outlives teardown).
    TornDown,
}

/// Finds this thread's cache for the allocator `(slot, instance)`, or says why there is
/// none: [`lookup_fast`], then the boxed caches of higher slots (the slow paths' lookup).
#[inline]
pub(crate) fn lookup(slot: u32, instance: u64) -> Lookup {
    if let Some(cache) = lookup_fast(slot, instance) {
        return Lookup::Cache(cache);
    }
    LOCAL
        .try_with(|table| {
            let slot = slot as usize;
            if slot < FAST_SLOTS {
                Lookup::Unregistered
            } else {
                lookup_more(table, slot, instance)
            }
        })
        .unwrap_or(Lookup::TornDown)
}

/// The fast paths' lookup: a bounds check and a compare of the instance, in the same
/// cache line as the cache's fast-path fields. It finds this thread's inline cache for
/// `(slot, instance)`, or `None` for anything else (a boxed cache, no cache, teardown),
/// which the slow paths sort out with [`lookup`]. It makes no calls, so the fast paths
/// around it make none either.
#[inline(always)]
pub(crate) fn lookup_fast(slot: u32, instance: u64) -> Option<*mut ThreadCache> {
    let slot = slot as usize;
    if slot >= FAST_SLOTS {
        return None;
    }
    LOCAL
        .try_with(|table| {
            // SAFETY: in bounds; entries are always valid caches, touched only by this
            // thread and never re-entrantly while a reference to one is live.
            let cache = unsafe { table.fast.get().cast::<ThreadCache>().add(slot) };
            // SAFETY: as above.
            (unsafe { (*cache).instance } == instance).then_some(cache)
        })
        .ok()
        .flatten()
}

#[cold]
fn lookup_more(table: &Table, slot: usize, instance: u64) -> Lookup {
    // SAFETY: as in `lookup_fast`.
    let cache = unsafe { table.cache(slot) };
    // SAFETY: a non-null entry is a boxed cache owned by the table.
    if !cache.is_null() && unsafe { (*cache).instance } == instance {
        Lookup::Cache(cache)
    } else {
        Lookup::Unregistered
    }
}

/// Creates this thread's cache for `engine` (which must have none) in the thread's
/// table; `None` if the thread is tearing down its thread-locals.
pub(crate) fn install(engine: &Arc<Engine>) -> Option<*mut ThreadCache> {
    // SAFETY: this thread's table; no reference into it is live.
    LOCAL
        .try_with(|t| unsafe { t.create(engine) })
        .ok()
        .flatten()
}

/// Counts a slow-path entry of `busy` (this thread's cache) and runs the idle collector
/// when it is due.
pub(crate) fn tick(busy: *mut ThreadCache) {
    // SAFETY: this thread's table; the slow path holds no reference into it besides
    // `busy`, which the collector skips.
    let _ = LOCAL.try_with(|t| unsafe { t.tick(busy) });
}

/// Retires this thread's cache for `engine` (its magazines go to the depot) and frees
/// its table entry for reuse.
pub(crate) fn uninstall(engine: &Engine) {
    let _ = LOCAL.try_with(|t| {
        let slot = engine.slot() as usize;
        // SAFETY: this thread's table; no reference into it is live.
        unsafe {
            let c = t.cache(slot);
            if !c.is_null() && (*c).instance == engine.instance() {
                t.retire(slot);
            }
        }
    });
}

/// Dense slot numbers for allocators, reused after an allocator is dropped, and unique
/// instance numbers that tell a slot's successive owners apart.
pub(crate) mod slots {
    use crate::sync::process::{AtomicU64, Mutex};
    use crate::sync::Ordering;

    struct SlotPool {
        next: u32,
        free: Vec<u32>,
    }

    static POOL: Mutex<SlotPool> = Mutex::new(SlotPool {
        next: 0,
        free: Vec::new(),
    });
    static INSTANCES: AtomicU64 = AtomicU64::new(1);

    /// A number unique in the process (never 0), for engines and other stats sources.
    pub(crate) fn fresh_instance() -> u64 {
        INSTANCES.fetch_add(1, Ordering::Relaxed)
    }

    /// A free slot and a fresh instance number (never 0, which marks an empty entry).
    pub(crate) fn claim() -> (u32, u64) {
        let instance = fresh_instance();
        let mut pool = POOL.lock().unwrap_or_else(|e| e.into_inner());
        let slot = match pool.free.pop() {
            Some(s) => s,
            None => {
                pool.next = pool.next.checked_add(1).expect("too many live allocators");
                pool.next - 1
            }
        };
        (slot, instance)
    }

    /// Returns a slot for reuse.
    pub(crate) fn release(slot: u32) {
        let mut pool = POOL.lock().unwrap_or_else(|e| e.into_inner());
        pool.free.push(slot);
    }
}
