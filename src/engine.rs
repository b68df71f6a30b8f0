//! The untyped allocator behind each [`ClassAllocator`](crate::ClassAllocator): its depot,
//! the registry of its thread caches, the magazine exchange rules (the slow paths), the
//! thread-exit flush and the shutdown that releases everything.
//!
//! # Who may touch a thread cache
//! A cache is used by its own thread through the thread-local table, and otherwise only
//! under the registry lock: by the thread-exit flush (its own thread, from the
//! thread-local destructor), by stats readers (counters only, which are atomics), and by
//! [`Engine::shutdown`]. Shutdown runs when the owning `ClassAllocator` is dropped, when
//! no thread can be inside an allocation or free (they all borrow the allocator). A
//! thread may still be running its thread-local destructors then (scoped threads are
//! joined before those finish), so both shutdown and the exit flush take the lock, and
//! the flush does nothing once `alive` is false.

use std::alloc::Layout;
use std::ptr::NonNull;

use crate::backing::{Backing, ObjectHooks};
use crate::budget::ByteBudget;
use crate::cache::{self, slots, Counters, Counts, ThreadCache};
use crate::config::{bypass_from_env, CacheMode, Config};
use crate::depot::{Depot, Put};
use crate::magazine::{self, Magazine};
use crate::registry::Source;
use crate::stats::Stats;
use crate::sync::{self, Arc, Mutex};

/// Thread caches of one engine.
#[derive(Debug)]
struct Registry {
    /// False once the allocator is dropped: caches are then already freed.
    alive: bool,
    caches: Vec<*mut ThreadCache>,
}

// SAFETY: the raw pointers are owned boxes handed between threads only under the
// registry mutex, as described in the module docs.
unsafe impl Send for Registry {}

/// The untyped engine of one allocator.
#[derive(Debug)]
pub(crate) struct Engine {
    slot: u32,
    instance: u64,
    name: &'static str,
    mode: CacheMode,
    depot: Depot,
    registry: Mutex<Registry>,
    /// Counters of retired caches and of operations after thread-local teardown.
    retired: Counters,
}

impl Engine {
    /// An engine for objects of `layout`.
    pub(crate) fn new(
        name: &'static str,
        layout: Layout,
        config: Config,
        hooks: Option<ObjectHooks>,
        budget: Option<Arc<ByteBudget>>,
    ) -> Self {
        let mode = if bypass_from_env() {
            CacheMode::Bypass
        } else {
            config.mode
        };
        let capacity = config.magazine_capacity(layout.size());
        let budget = budget.unwrap_or_else(|| Arc::new(ByteBudget::new(config.depot_bytes)));
        let (slot, instance) = slots::claim();
        Engine {
            slot,
            instance,
            name,
            mode,
            depot: Depot::new(
                Backing::new(layout, hooks),
                capacity,
                budget,
                config.generation_bits,
            ),
            registry: Mutex::new(Registry {
                alive: true,
                caches: Vec::new(),
            }),
            retired: Counters::new(),
        }
    }

    pub(crate) fn slot(&self) -> u32 {
        self.slot
    }

    pub(crate) fn instance(&self) -> u64 {
        self.instance
    }

    pub(crate) fn mode(&self) -> CacheMode {
        self.mode
    }

    fn backing(&self) -> &Backing {
        self.depot.backing()
    }

    fn capacity(&self) -> usize {
        self.depot.capacity()
    }

    /// A magazine descriptor pointer held by one of this engine's caches, as a reference.
    ///
    /// # Safety
    /// `mag` is a descriptor of this engine's table (descriptors live as long as it).
    unsafe fn mag(&self, mag: NonNull<Magazine>) -> &Magazine {
        // SAFETY: forwarded from the caller.
        unsafe { mag.as_ref() }
    }

    /// Slow path of an allocation: the loaded magazine is empty (or caching is off).
    #[cold]
    #[inline(never)]
    pub(crate) fn alloc_slow(&self, c: &mut ThreadCache) -> Option<NonNull<u8>> {
        if !c.detached {
            cache::tick(c);
            match self.mode {
                CacheMode::ThreadCaches => {
                    if self.refill(c) {
                        return c.pop();
                    }
                }
                CacheMode::DepotOnly => {
                    if let Some(p) = self.take_one(c) {
                        c.counters.allocs.bump(1);
                        return Some(p);
                    }
                }
                CacheMode::Bypass => {}
            }
        }
        let p = self.backing().alloc()?;
        c.counters.allocs.bump(1);
        Some(p)
    }

    /// Slow path of a free: the loaded magazine is full (or caching is off).
    ///
    /// # Safety
    /// `p` is an object of this engine that nobody uses any more.
    #[cold]
    #[inline(never)]
    pub(crate) unsafe fn free_slow(&self, c: &mut ThreadCache, p: NonNull<u8>) {
        if !c.detached {
            cache::tick(c);
            match self.mode {
                CacheMode::ThreadCaches => {
                    if self.make_room(c) {
                        let pushed = c.push(p);
                        debug_assert!(pushed);
                        return;
                    }
                }
                CacheMode::DepotOnly => {
                    if self.give_one(c, p) {
                        c.counters.frees.bump(1);
                        return;
                    }
                }
                CacheMode::Bypass => {}
            }
        }
        // SAFETY: forwarded from the caller.
        unsafe { self.backing().dealloc(p) };
        c.counters.frees.bump(1);
    }

    /// Makes the loaded magazine non-empty: swap with a non-empty previous, or exchange
    /// with the depot. False when neither has objects.
    fn refill(&self, c: &mut ThreadCache) -> bool {
        debug_assert_eq!(c.loaded_len(), 0);
        // SAFETY: the cache owns its previous magazine.
        if c.previous().is_some_and(|p| unsafe { p.len() } > 0) {
            c.swap(self.capacity());
            return true;
        }
        let Some(full) = self.depot.take_full() else {
            return false;
        };
        c.counters.refills.bump(1);
        self.exchange(c, full);
        true
    }

    /// Makes room in the loaded magazine: swap with a non-full previous, or exchange
    /// with the depot. False when the depot cannot supply an empty magazine.
    fn make_room(&self, c: &mut ThreadCache) -> bool {
        debug_assert_eq!(c.loaded_len(), c.loaded_cap());
        let cap = self.capacity();
        // SAFETY: the cache owns its previous magazine.
        if c.previous().is_some_and(|p| unsafe { p.len() } < cap) {
            c.swap(cap);
            return true;
        }
        let Some(empty) = self.depot.take_empty() else {
            return false;
        };
        self.exchange(c, empty);
        true
    }

    /// The depot exchange: `previous` goes to the depot (to the full stack if it holds
    /// objects, else to the empty one), the loaded magazine becomes `previous`, and
    /// `fresh` (owned by the caller) is loaded. Both slow paths end here, with one
    /// magazine that can serve the next `capacity` operations and one that cannot.
    fn exchange(&self, c: &mut ThreadCache, fresh: &Magazine) {
        if let Some(prev) = c.take_previous() {
            // SAFETY: a descriptor of this engine's table.
            self.put(c, unsafe { self.mag(prev) });
        }
        let loaded = c.unload();
        c.set_previous(loaded);
        c.load(fresh, self.capacity());
    }

    /// Depot-only allocation: one object from a full (one-object) magazine.
    fn take_one(&self, c: &ThreadCache) -> Option<NonNull<u8>> {
        let mag = self.depot.take_full()?;
        c.counters.refills.bump(1);
        // SAFETY: popped, so owned here; a magazine on the full stack is non-empty.
        let p = unsafe {
            mag.with_rounds(|r| {
                r.len -= 1;
                magazine::slot(r.slots, r.len)
            })
        };
        self.put(c, mag);
        Some(p)
    }

    /// Depot-only free: one object into an empty magazine pushed as full.
    fn give_one(&self, c: &ThreadCache, p: NonNull<u8>) -> bool {
        let Some(mag) = self.depot.take_empty() else {
            return false;
        };
        // SAFETY: owned here; an empty magazine with storage has room for one.
        unsafe {
            mag.with_rounds(|r| {
                *r.slots.add(r.len) = p.as_ptr();
                r.len += 1;
            });
        }
        self.put(c, mag);
        true
    }

    /// Hands both of `c`'s magazines to the depot (which keeps them within its budget).
    fn flush(&self, c: &mut ThreadCache) {
        let loaded = c.unload();
        let previous = c.take_previous();
        for mag in [loaded, previous].into_iter().flatten() {
            // SAFETY: a descriptor of this engine's table.
            self.put(c, unsafe { self.mag(mag) });
        }
    }

    /// Adds a retiring (or stand-in) cache's counters to the engine's.
    pub(crate) fn fold(&self, c: &ThreadCache) {
        self.retired.add_shared(&c.counters);
    }

    /// Hands `mag` (owned by `c`) to the depot and counts where it went.
    fn put(&self, c: &ThreadCache, mag: &Magazine) {
        // SAFETY: owned by the cache, now handed over.
        match unsafe { self.depot.put_full(mag) } {
            Put::Empty => {}
            Put::Cached => c.counters.spills.bump(1),
            Put::Partial => {
                c.counters.spills.bump(1);
                c.counters.overflows.bump(1);
            }
            Put::Overflowed => c.counters.overflows.bump(1),
        }
    }

    /// Creates and registers a cache for this thread. `None` if thread-local storage is
    /// being torn down.
    #[cold]
    pub(crate) fn register(engine: &Arc<Engine>) -> Option<*mut ThreadCache> {
        let cache = cache::install(engine)?;
        sync::lock(&engine.registry).caches.push(cache);
        Some(cache)
    }

    /// Takes back an object whose value is already gone (a recycling allocator's object
    /// that refused to be recycled): straight to the backing allocator, counted as a free.
    ///
    /// # Safety
    /// `p` is an object of this engine that nobody uses any more, with no live value.
    #[cold]
    pub(crate) unsafe fn release_dead(&self, p: NonNull<u8>) {
        // SAFETY: forwarded from the caller.
        unsafe { self.backing().dealloc_dead(p) };
        self.retired.frees.add_shared(1);
    }

    /// Runs one allocation without a registered cache (thread-local teardown).
    #[cold]
    pub(crate) fn alloc_detached(&self) -> Option<NonNull<u8>> {
        let mut c = ThreadCache::new(self.instance, true);
        let p = self.alloc_slow(&mut c);
        self.fold(&c);
        p
    }

    /// Runs one free without a registered cache (thread-local teardown).
    ///
    /// # Safety
    /// As for [`free_slow`](Self::free_slow).
    #[cold]
    pub(crate) unsafe fn free_detached(&self, p: NonNull<u8>) {
        let mut c = ThreadCache::new(self.instance, true);
        // SAFETY: forwarded.
        unsafe { self.free_slow(&mut c, p) };
        self.fold(&c);
    }

    /// Thread exit (or release): unregisters this thread's `cache` and hands its
    /// magazines to the depot, unless the allocator is gone (shutdown emptied it then).
    /// The cache's memory belongs to its thread's table.
    ///
    /// # Safety
    /// `cache` was registered with this engine by the calling thread, which will not use
    /// it again for this engine.
    pub(crate) unsafe fn retire_cache(&self, cache: *mut ThreadCache) {
        let mut reg = sync::lock(&self.registry);
        if !reg.alive {
            return;
        }
        let Some(pos) = reg.caches.iter().position(|&c| c == cache) else {
            debug_assert!(false, "retiring a cache that is not registered");
            return;
        };
        reg.caches.swap_remove(pos);
        // SAFETY: removed from the registry under the lock, and its thread is done with
        // it.
        let c = unsafe { &mut *cache };
        self.flush(c);
        self.fold(c);
    }

    /// The idle collector found `c` (this thread's cache) unused for a whole period: give
    /// one magazine back to the depot, the previous one first. Under the registry lock,
    /// because the allocator may be being dropped on another thread.
    pub(crate) fn release_idle_magazine(&self, c: &mut ThreadCache) {
        let reg = sync::lock(&self.registry);
        if !reg.alive {
            return;
        }
        if let Some(mag) = c.take_previous().or_else(|| c.unload()) {
            // SAFETY: a descriptor of this engine's table.
            self.put(c, unsafe { self.mag(mag) });
        }
        drop(reg);
    }

    /// Hands this thread's magazines to the depot and forgets this thread's cache
    /// (only flushes it while a `with_local` call holds it).
    pub(crate) fn release_thread_cache(&self) {
        if let cache::Lookup::Cache(c) = cache::lookup(self.slot, self.instance) {
            // SAFETY: this thread's own cache; no reference to it is live here.
            let c = unsafe { &mut *c };
            if c.pinned() {
                self.flush(c);
                return;
            }
        }
        cache::uninstall(self);
    }

    /// Flushes this thread's cache to the depot, then gives everything the depot caches
    /// back to the backing allocator. Returns the number of objects released.
    pub(crate) fn trim(&self) -> usize {
        if let cache::Lookup::Cache(c) = cache::lookup(self.slot, self.instance) {
            // SAFETY: this thread's own cache; no reference to it is live here.
            self.flush(unsafe { &mut *c });
        }
        let released = self.depot.trim();
        crate::backing::release_to_os(released * self.backing().object_size());
        released
    }

    /// The allocator is being dropped: frees every cache and returns every cached object
    /// to the backing allocator.
    ///
    /// # Safety
    /// No thread can use the allocator any more (its owner is being dropped).
    pub(crate) unsafe fn shutdown(&self) {
        let mut reg = sync::lock(&self.registry);
        reg.alive = false;
        for cache in reg.caches.drain(..) {
            // SAFETY: registered caches stay allocated until their thread retires them
            // under this lock, and no thread uses this allocator's caches any more. The
            // emptied cache stays with its thread's table, which frees it.
            let c = unsafe { &mut *cache };
            c.unload();
            c.take_previous();
            self.fold(c);
        }
        // SAFETY: no cache holds magazines any more and no thread uses the depot.
        unsafe { self.depot.release_everything() };
        drop(reg);
        slots::release(self.slot);
    }

    /// A snapshot of the counters.
    pub(crate) fn stats(&self) -> Stats {
        let object_size = self.backing().object_size();
        let mut n = Counts::default();
        let threads;
        {
            let reg = sync::lock(&self.registry);
            self.retired.read_into(&mut n);
            threads = reg.caches.len();
            for &c in &reg.caches {
                // SAFETY: registered caches stay allocated while the lock is held; only
                // their atomic counters are read.
                let c = unsafe { &*c };
                c.counters.read_into(&mut n);
            }
        }
        let backing_allocs = self.backing().allocs();
        let backing_frees = self.backing().frees();
        let live = n.allocs.saturating_sub(n.frees);
        let cached_in_depot = self.depot.cached_objects() as u64;
        let reserved = backing_allocs.saturating_sub(backing_frees);
        Stats {
            name: self.name,
            id: self.instance,
            object_size,
            allocs: n.allocs,
            frees: n.frees,
            live,
            cached_in_threads: reserved.saturating_sub(live + cached_in_depot),
            cached_in_depot,
            backing_allocs,
            backing_frees,
            refills: n.refills,
            spills: n.spills,
            overflows: n.overflows,
            threads,
        }
    }
}

impl Source for Engine {
    fn stats(&self) -> Option<Stats> {
        if !sync::lock(&self.registry).alive {
            return None;
        }
        Some(Engine::stats(self))
    }

    fn trim(&self) -> usize {
        if !sync::lock(&self.registry).alive {
            return 0;
        }
        Engine::trim(self) * self.backing().object_size()
    }
}
