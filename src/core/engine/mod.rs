//! The untyped allocator behind each [`ClassAllocator`](crate::ClassAllocator): its depot,
//! the list of its thread caches, and the magazine exchange rules (the slow paths). What
//! other threads and the allocator's lifecycle do to it is in [`admin`](super::admin).
//!
//! # No user code in the middle
//! Releasing objects runs a recycling allocator's destructors, and creating one runs
//! its constructor: user code, which may re-enter any allocator, this one included. It
//! never runs under the cache-list lock or while a cache's owner part is borrowed: the
//! depot hands back what does not fit its budget as an [`Eviction`], collected into
//! [`Evictions`] and released by [`Engine::release`] once the cache is consistent.
//! Backing allocations and frees are counted on the engine's own counters, so a slow
//! path never touches its cache after user code ran (which may have retired it).

use std::alloc::Layout;
use std::ptr::NonNull;

use super::admin::Admin;
use super::backing::{Backing, ObjectHooks};
use super::budget::{self, ByteBudget};
use super::depot::{Depot, DepotBudget, Eviction, Put};
use super::exchange::Evictions;
use super::ids;

mod supply;

use super::magazine::{self, Magazine, NIL};
use super::percpu::PerCpu;
use super::thread_cache::{Counters, Counts, Owner, ThreadCache};
use crate::config::{bypass_from_env, CacheMode, Config};
use crate::rows::Stats;
use crate::sync::Arc;
pub(crate) use supply::SharedDepot;
use supply::ThreadSupply;

/// The untyped engine of one allocator.
#[derive(Debug)]
pub(crate) struct Engine {
    pub(super) index: u32,
    pub(super) instance: u64,
    pub(super) name: &'static str,
    /// How the thread caches work: never `PerCpu` (per-CPU caches are `percpu`, and
    /// [`mode`](Self::mode) derives the mode in effect from both).
    pub(super) thread_mode: CacheMode,
    pub(super) depot: Depot,
    /// The per-CPU caches, for `CacheMode::PerCpu` where rseq works (`mode` is then
    /// `PerCpu`; threads that cannot use rseq still use per-thread caches).
    pub(super) percpu: Option<PerCpu>,
    /// The administrative side: the registered thread caches and what other threads do
    /// through them.
    pub(super) admin: Admin,
    /// Counters of retired caches, and of operations that went straight to the backing
    /// allocator (counted here so a slow path never touches its cache after user code).
    pub(super) retired: Counters,
    /// What one full magazine is charged to a stash's grant: its objects and their slots
    /// (so zero-sized objects are charged too).
    pub(super) magazine_bytes: usize,
    /// Most bytes one thread's stash may be granted.
    pub(super) max_grant: usize,
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
        let capped = config.max_live != usize::MAX;
        // Per-CPU caches where they can work (and the allocator is not capped: permits
        // are counted per thread cache); per-thread caches otherwise.
        let percpu = match mode {
            CacheMode::PerCpu if !capped => PerCpu::new(),
            _ => None,
        };
        let capacity = config.magazine_capacity(layout.size(), percpu.is_some());
        // A per-CPU allocator's threads without an rseq area use thread caches.
        let thread_mode = match mode {
            CacheMode::PerCpu => CacheMode::ThreadCaches,
            mode => mode,
        };
        let depot = |budget| {
            Depot::new(
                Backing::new(layout, hooks),
                capacity,
                budget,
                config.generation_bits,
            )
        };
        let depot = match budget {
            // `depot_bytes`: objects and their slots, so zero-sized objects are bounded too.
            None => depot(DepotBudget::Own(config.depot_bytes)),
            // A budget shared with others (a block source's `max_free`) counts their bytes.
            Some(shared) => depot(DepotBudget::Shared(shared)).charging_object_bytes_only(),
        };
        let (index, instance) = ids::claim();
        Engine {
            index,
            instance,
            name,
            thread_mode,
            depot,
            percpu,
            admin: Admin::new(
                config.max_live,
                (config.max_live / 16).clamp(1, capacity.min(u32::MAX as usize / 4)) as u32,
            ),
            retired: Counters::new(),
            magazine_bytes: capacity * magazine::cached_bytes(layout.size()),
            max_grant: match mode {
                CacheMode::ThreadCaches | CacheMode::PerCpu => config.thread_cache_growth_bytes,
                CacheMode::DepotOnly | CacheMode::Bypass => 0,
            },
        }
    }

    pub(crate) fn index(&self) -> u32 {
        self.index
    }

    pub(crate) fn instance(&self) -> u64 {
        self.instance
    }

    /// The caching mode in effect: per-CPU caches fall back to thread caches, for good,
    /// once a `membarrier` fence has failed (see `rseq::fence`).
    pub(crate) fn mode(&self) -> CacheMode {
        match &self.percpu {
            Some(_) if super::rseq::fence::disabled().is_none() => CacheMode::PerCpu,
            _ => self.thread_mode,
        }
    }

    /// Whether `Config::max_live` caps the allocator.
    pub(crate) fn capped(&self) -> bool {
        self.admin.capped()
    }

    /// The per-CPU caches, if the allocator has them.
    #[inline(always)]
    pub(crate) fn percpu(&self) -> Option<&PerCpu> {
        self.percpu.as_ref()
    }

    /// The depot as the supply of magazines no thread cache owns (CPUs' caches).
    pub(crate) fn shared(&self) -> SharedDepot<'_> {
        SharedDepot(self)
    }

    /// Every CPU's magazines to the depot ([`PerCpu::reclaim`]), under the cache-list
    /// lock as every reclaim is; nothing for a dead allocator or one without CPU caches.
    /// Returns the objects released (those the depot's budget refused).
    pub(crate) fn reclaim_cpus(&self) -> usize {
        let Some(pc) = &self.percpu else {
            return 0;
        };
        match self.admin.reclaim_cpus(pc, &self.shared()) {
            Some(evictions) => self.release(evictions),
            None => 0,
        }
    }

    /// Whether the allocator still exists (a hint off the cache-list lock).
    pub(crate) fn is_alive(&self) -> bool {
        self.admin.is_alive()
    }

    /// The administrative side (see [`Admin`]).
    pub(crate) fn admin(&self) -> &Admin {
        &self.admin
    }

    pub(super) fn backing(&self) -> &Backing {
        self.depot.backing()
    }

    fn capacity(&self) -> usize {
        self.depot.capacity()
    }

    /// A magazine descriptor pointer held by one of this engine's caches, as a reference.
    ///
    /// # Safety
    /// `mag` is a descriptor of this engine's table (descriptors live as long as it).
    pub(super) unsafe fn mag(&self, mag: NonNull<Magazine>) -> &Magazine {
        // SAFETY: forwarded from the caller.
        unsafe { mag.as_ref() }
    }

    /// The exchange rules for an allocation that found the loaded magazine empty:
    /// refill it (from the previous magazine, the stash or the depot) and pop, or, with
    /// no thread caching, take one object from the depot. `None` when there is nothing
    /// cached: the caller goes to the backing allocator. Runs no user code.
    ///
    /// # Safety
    /// `c` is this thread's registered cache for this engine, with no reference from
    /// its owner part live.
    #[inline]
    pub(crate) unsafe fn refill_and_pop(&self, c: Owner<'_>) -> Option<NonNull<u8>> {
        debug_assert_eq!(
            c.instance_of(),
            self.instance,
            "a cache of another allocator"
        );
        match self.thread_mode {
            // SAFETY: forwarded.
            CacheMode::ThreadCaches => unsafe { self.refill(c) }.then(|| c.pop()).flatten(),
            CacheMode::DepotOnly => self.take_one(c).inspect(|_| c.counters.allocs.bump(1)),
            CacheMode::Bypass | CacheMode::PerCpu => None,
        }
    }

    /// The exchange rules for a free that found the loaded magazine full: make room
    /// (swap with the previous magazine, or exchange with the stash or the depot) and
    /// push `p`, or, with no thread caching, hand it to the depot in a magazine of its
    /// own; then release what the depot's budget refused (which may run user code, the
    /// cache being consistent by then). False when `p` was not taken (bypass, or no
    /// memory for a magazine): the caller gives it to the backing allocator.
    ///
    /// # Safety
    /// `p` is an object of this engine that nobody uses any more; `c` is as for
    /// [`refill_and_pop`](Self::refill_and_pop).
    #[inline]
    pub(crate) unsafe fn make_room_and_push(&self, c: Owner<'_>, p: NonNull<u8>) -> bool {
        debug_assert_eq!(
            c.instance_of(),
            self.instance,
            "a cache of another allocator"
        );
        let done = match self.thread_mode {
            // SAFETY: forwarded; `make_room` runs no user code.
            CacheMode::ThreadCaches => unsafe { self.make_room(c) }.inspect(|_| {
                let pushed = c.push(p);
                debug_assert!(pushed);
            }),
            CacheMode::DepotOnly => self.give_one(c, p).inspect(|_| c.counters.frees.bump(1)),
            CacheMode::Bypass | CacheMode::PerCpu => None,
        };
        done.map(|evictions| self.release(evictions)).is_some()
    }

    /// One object straight from the backing allocator (constructed, for a recycling
    /// allocator: user code), counted on the engine.
    pub(crate) fn alloc_backing(&self) -> Option<NonNull<u8>> {
        let p = self.backing().alloc()?;
        self.retired.allocs.add_shared(1);
        Some(p)
    }

    /// One object straight back to the backing allocator (destroyed, for a recycling
    /// allocator: user code), counted on the engine.
    ///
    /// # Safety
    /// `p` is an object of this engine that nobody uses any more.
    pub(crate) unsafe fn free_backing(&self, p: NonNull<u8>) {
        self.retired.frees.add_shared(1);
        // SAFETY: forwarded from the caller.
        unsafe { self.backing().dealloc(p) };
    }

    /// Makes the loaded magazine non-empty: the exchange rules, with the stash and the
    /// depot as the supply. False when neither has objects.
    ///
    /// # Safety
    /// As for [`refill_and_pop`](Self::refill_and_pop).
    #[inline]
    unsafe fn refill(&self, c: Owner<'_>) -> bool {
        // SAFETY: forwarded; released before this returns, and the rules run no user
        // code.
        let o = unsafe { c.owned() };
        debug_assert_eq!(o.loaded_len(), 0);
        // SAFETY: the cache's magazines are descriptors of this engine's table.
        let mut pair = unsafe { o.take_pair(self.capacity()) };
        let refilled = pair.refill(&ThreadSupply { engine: self, c });
        o.put_pair(pair);
        refilled
    }

    /// Magazines the stash of `c` may hold under its grant.
    fn stash_capacity(&self, c: Owner<'_>) -> u32 {
        (c.grant() / self.magazine_bytes).min(u32::MAX as usize) as u32
    }

    /// A refill from the depot after spills to it: the thread needed back what it gave
    /// away, so its stash may keep that many magazines from now on, granted from the
    /// process-wide budget (tcmalloc's per-thread caches grow the same way, on
    /// demonstrated demand). A thread that only frees (a consumer) or only allocates (a
    /// producer) never grows.
    fn grow(&self, c: Owner<'_>) {
        let spills = c.take_spills() as usize;
        if spills == 0 {
            return;
        }
        let room = self.max_grant.saturating_sub(c.grant()) / self.magazine_bytes;
        let want = spills.min(room);
        if want > 0 {
            let got = budget::thread_cache_budget().reserve_up_to(want, self.magazine_bytes);
            c.add_grant(got * self.magazine_bytes);
            // An administrator may take the grant meanwhile (to zero), never add to it.
            debug_assert!(c.grant() <= self.max_grant, "a grant beyond max_grant");
        }
    }

    /// Makes room in the loaded magazine: the exchange rules, with the stash and the
    /// depot as the supply. `None` when the depot cannot supply an empty magazine.
    ///
    /// # Safety
    /// As for [`refill_and_pop`](Self::refill_and_pop).
    #[inline]
    unsafe fn make_room(&self, c: Owner<'_>) -> Option<Evictions> {
        // SAFETY: forwarded; released before this returns, and the rules run no user
        // code.
        let o = unsafe { c.owned() };
        debug_assert_eq!(o.loaded_len(), o.loaded_cap());
        // SAFETY: the cache's magazines are descriptors of this engine's table.
        let mut pair = unsafe { o.take_pair(self.capacity()) };
        let evictions = pair.make_room(&ThreadSupply { engine: self, c });
        o.put_pair(pair);
        evictions
    }

    /// Depot-only allocation: one object from a full (one-object) magazine.
    fn take_one(&self, c: Owner<'_>) -> Option<NonNull<u8>> {
        let mag = self.depot.take_full()?;
        c.counters.refills.bump(1);
        // SAFETY: popped, so owned here.
        let p = unsafe { mag.pop_round() };
        debug_assert!(p.is_some(), "a magazine on the full stack is never empty");
        self.put_empty(c, mag);
        p
    }

    /// Depot-only free: one object into an empty magazine pushed as full.
    fn give_one(&self, c: Owner<'_>, p: NonNull<u8>) -> Option<Evictions> {
        let mag = self.depot.take_empty()?;
        // SAFETY: owned here; an empty magazine with storage has room for one.
        let pushed = unsafe { mag.push_round(p, self.depot.capacity()) };
        debug_assert!(pushed);
        let mut evictions = Evictions::default();
        evictions.push(self.put(c, mag));
        Some(evictions)
    }

    /// Hands both of `c`'s magazines to the depot (which keeps them within its budget).
    ///
    /// # Safety
    /// As for [`refill_and_pop`](Self::refill_and_pop) (the cache may be pinned).
    pub(crate) unsafe fn flush(&self, c: Owner<'_>) -> Evictions {
        // SAFETY: forwarded; nothing below runs user code.
        let o = unsafe { c.owned() };
        let loaded = o.unload();
        let previous = o.take_previous();
        let mut evictions = Evictions::default();
        for mag in [loaded, previous].into_iter().flatten() {
            // SAFETY: a descriptor of this engine's table.
            evictions.push(self.put(c, unsafe { self.mag(mag) }));
        }
        self.give_back_stash(c, &mut evictions);
        evictions
    }

    /// The owner hands what its cache grew back: the stash's magazines to the depot, the
    /// kept empties to the empty stack, the grant to the process-wide budget. False when
    /// there was nothing to give.
    pub(super) fn give_back_stash(&self, c: Owner<'_>, evictions: &mut Evictions) -> bool {
        // SAFETY: the owner's own cache.
        let stash = unsafe { ThreadCache::stash_take(&*c) };
        // SAFETY: as above.
        let grant = unsafe { ThreadCache::take_grant(&*c) };
        // SAFETY: a stash chain of this engine's table, taken above.
        unsafe {
            self.depot
                .for_each_in_stash(stash, |mag| evictions.push(self.put(c, mag)))
        };
        // SAFETY: kept empties are descriptors of this engine's table.
        while let Some(m) = c.take_empty(|i| unsafe { self.depot.magazine(i) }) {
            self.put_empty(c, m);
        }
        budget::return_grant(grant);
        stash != NIL || grant > 0
    }

    /// Hands an empty magazine (owned by `c`) to the depot's empty stack.
    fn put_empty(&self, c: Owner<'_>, mag: &Magazine) {
        let evicted = self.put(c, mag);
        debug_assert!(evicted.is_none(), "an empty magazine is never evicted");
    }

    /// Hands `mag` (owned by `c`) to the depot and counts where it went; what the budget
    /// does not take comes back to be released. Once the allocator is gone every object
    /// comes back; an empty magazine still goes to the empty stack (the depot lives until
    /// the engine drops, and frees it then), so an empty magazine is never evicted.
    pub(super) fn put(&self, c: Owner<'_>, mag: &Magazine) -> Option<Eviction> {
        let (eviction, spills, overflows) = self.put_uncounted(mag);
        c.counters.spills.bump(spills);
        c.counters.overflows.bump(overflows);
        eviction
    }

    /// Hands `mag` (owned by the caller) to the depot; returns the eviction to finish,
    /// and the spills and overflows to count.
    fn put_uncounted(&self, mag: &Magazine) -> (Option<Eviction>, u64, u64) {
        // SAFETY: owned by the caller (the count is read before the hand-over).
        if !self.is_alive() && unsafe { mag.len() } > 0 {
            // SAFETY: owned by the caller, now handed over.
            return (Some(unsafe { self.depot.evict_all(mag) }), 0, 0);
        }
        // SAFETY: owned by the caller, now handed over.
        match unsafe { self.depot.put(mag) } {
            Put::Empty => (None, 0, 0),
            Put::Cached => (None, 1, 0),
            Put::Evicted(e) => {
                let spilled = u64::from(e.keeps_some());
                (Some(e), spilled, 1)
            }
        }
    }

    /// Releases evicted objects to the backing allocator (running destructors, for a
    /// recycling allocator). Call with no lock held and no cache borrowed. Returns the
    /// number of objects released.
    pub(crate) fn release(&self, evictions: Evictions) -> usize {
        evictions.release(&self.depot)
    }

    /// Thread exit, `release_thread_cache`, or a sweep that found the allocator gone:
    /// hands this thread's `c` magazines over and takes it out of the cache list (its
    /// counters go to the engine's, its permits back). No user code runs.
    ///
    /// # Safety
    /// `c` was registered with this engine by the calling thread, which will not use it
    /// again for this engine, with no reference from its owner part live.
    pub(crate) unsafe fn retire_cache(&self, c: Owner<'_>) -> Evictions {
        // SAFETY: forwarded.
        let evictions = unsafe { self.flush(c) };
        self.admin.forget(c, &self.retired);
        evictions
    }

    /// The idle collector found `c` (this thread's cache) unused for a whole period: the
    /// stash and its grant go back, or if there were none, one magazine (the previous
    /// one first).
    ///
    /// # Safety
    /// As for [`refill_and_pop`](Self::refill_and_pop).
    pub(crate) unsafe fn release_idle_magazine(&self, c: Owner<'_>) -> Evictions {
        let mut evictions = Evictions::default();
        // The stash and its grant go first, all at once: a thread idle for a period has
        // no use for what it grew to.
        if !self.give_back_stash(c, &mut evictions) {
            // SAFETY: forwarded; nothing below runs user code.
            let o = unsafe { c.owned() };
            if let Some(mag) = o.take_previous().or_else(|| o.unload()) {
                // SAFETY: a descriptor of this engine's table.
                evictions.push(self.put(c, unsafe { self.mag(mag) }));
            }
        }
        evictions
    }

    /// The allocator is being dropped (the caller has retired this thread's cache): the
    /// administrative side takes what other threads and CPUs hold, the depot is released
    /// now, and every other thread releases its cache at its next slow path or exit (the
    /// engine stays alive, held by those threads' tables, until they have). It does not
    /// ask the OS for memory back: an engine that lost the race to be published is shut
    /// down on an allocation's slow path (`ClassAllocator::drop` asks). Returns the bytes
    /// released.
    ///
    /// # Safety
    /// No thread can allocate or free through the allocator any more (its owner is being
    /// dropped).
    pub(crate) unsafe fn shutdown(&self) -> usize {
        let shared = self.shared();
        // SAFETY: forwarded.
        let released = unsafe {
            self.admin
                .shutdown(&self.depot, self.percpu.as_ref().map(|pc| (pc, &shared)))
        };
        let released = released + self.depot.trim();
        ids::release(self.index);
        released * self.backing().object_size()
    }

    /// A snapshot of the counters.
    pub(crate) fn stats(&self) -> Stats {
        let mut n = Counts::default();
        let threads = self.admin.read_counts(&self.retired, &mut n);
        if let Some(pc) = &self.percpu {
            pc.read_counts(&mut n);
        }
        let backing_allocs = self.backing().allocs();
        let backing_frees = self.backing().frees();
        let live = n.allocs.saturating_sub(n.frees);
        let cached_in_depot = self.depot.cached_objects() as u64;
        let reserved = backing_allocs.saturating_sub(backing_frees);
        Stats {
            name: self.name,
            id: self.instance,
            object_size: self.backing().object_size(),
            live,
            cached_in_threads: reserved.saturating_sub(live + cached_in_depot),
            cached_in_depot,
            backing_allocs,
            backing_frees,
            threads,
            mode: self.mode(),
            ..Stats::default()
        }
        .with_counts(&n)
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
        if self.capped() {
            // The object was live: its permit goes back, as a recycled one's does.
            self.admin.return_credit(None);
        }
    }
}
