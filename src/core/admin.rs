//! The administrative side of one allocator, as one unit: the list of its thread caches
//! and what other threads do through it (`trim`, `trim_idle`, `trim_all`, the flush
//! requests, `stats`' reads, the capped allocator's permits, the shutdown when the
//! allocator is dropped). It calls into the caches (their shared part only) and hands
//! what it takes to the depot it is given; the engine holds it and is the caller.
//!
//! # Owner and administrator
//! A thread cache's magazines (its [`OwnerPart`](super::thread_cache::OwnerPart) part) are
//! touched by its own thread only: the fast and slow paths, its idle collector and
//! sweeps, its thread-exit teardown. Every other thread is an administrator: `stats`
//! reads the caches' counters (atomics) under the cache-list lock, which also keeps
//! registered caches allocated; `trim_all` and the allocator's shutdown *ask* the owners,
//! by setting each cache's flush request and bumping a process-wide epoch that every
//! thread checks on its slow paths. Shutdown releases the depot; each owner releases what
//! its cache holds for a dead allocator when it next sweeps or exits. The engine itself
//! lives until the last cache is retired (each thread's table holds it), so a late owner
//! still finds valid magazines, and whatever reaches the depot after shutdown is released
//! when the engine drops.

use super::budget;
use super::counters::Counters;
use super::depot::Depot;
use super::exchange::{Evictions, SharedSupply};
use super::idle::{IdleInterval, IdleWatch, Seen};
use super::percpu::PerCpu;
use super::thread_cache::{self, Counts, Owner, ThreadCache};
use crate::sync::{self, AtomicBool, AtomicUsize, Mutex, Ordering};

/// One allocator's administrative side (see the module docs).
#[derive(Debug)]
pub(crate) struct Admin {
    /// The thread caches registered with the allocator. The lock also keeps them
    /// allocated while it is held, serialises reclaimers of CPU caches, and orders the
    /// permits' moves (see [`take_credit`](Self::take_credit)).
    list: Mutex<CacheList>,
    /// False once the allocator is dropped. Written under the lock; read there or, as a
    /// hint, anywhere (a stale `true` only sends a magazine to the depot, which releases
    /// it when the engine drops).
    alive: AtomicBool,
    /// Permits to have objects live not held by any thread (`Config::max_live`; unused
    /// when uncapped).
    available: AtomicUsize,
    /// Permits a thread draws at once, and gives back past twice as many.
    credit_batch: u32,
    /// Whether `Config::max_live` caps the allocator.
    capped: bool,
}

/// The registered thread caches, and the allocator's `trim_idle` interval.
#[derive(Debug)]
struct CacheList {
    caches: Vec<Listed>,
    idle_watch: IdleWatch,
}

// SAFETY: the pointers are caches owned by their threads' tables, read (shared part only)
// under the cache-list mutex; a cache leaves the list under the mutex before its memory
// is reused or freed.
unsafe impl Send for CacheList {}

/// A registered thread cache, and what `trim_idle` saw of it.
#[derive(Debug)]
struct Listed {
    cache: *const ThreadCache,
    /// Its operations at the previous `trim_idle` that counted (`None` before one).
    trim_seen: Option<Seen>,
    /// Whether `trim_idle` found it idle then too, and asked it to flush already (so
    /// that a cache idle for good is not asked again at every call, each of which would
    /// make every thread sweep its table).
    asked: bool,
}

impl Admin {
    /// The administrative side of a live allocator with no cache yet; `max_live`
    /// objects at most (`usize::MAX`: uncapped), drawn by threads `credit_batch` at a
    /// time.
    pub(crate) fn new(max_live: usize, credit_batch: u32) -> Self {
        Admin {
            list: Mutex::new(CacheList {
                caches: Vec::new(),
                idle_watch: IdleWatch::default(),
            }),
            alive: AtomicBool::new(true),
            available: AtomicUsize::new(max_live),
            credit_batch,
            capped: max_live != usize::MAX,
        }
    }

    /// Whether the allocator still exists (a hint off the lock).
    #[inline]
    pub(crate) fn is_alive(&self) -> bool {
        self.alive.load(Ordering::Acquire)
    }

    /// Whether `Config::max_live` caps the allocator.
    #[inline]
    pub(crate) fn capped(&self) -> bool {
        self.capped
    }

    /// Permits in the shared count (the loom models' check that none is lost).
    #[cfg(all(test, proxalloc_loom))]
    pub(crate) fn available_permits(&self) -> usize {
        self.available.load(Ordering::Relaxed)
    }

    /// Adds a newly created cache of this thread to the list; false (and nothing added)
    /// where the global allocator cannot grow the list.
    #[must_use]
    pub(crate) fn adopt(&self, cache: *const ThreadCache) -> bool {
        let mut list = sync::lock(&self.list);
        if list.caches.try_reserve(1).is_err() {
            return false;
        }
        list.caches.push(Listed {
            cache,
            trim_seen: None,
            asked: false,
        });
        true
    }

    /// Takes this thread's retiring cache `c` (its magazines already handed over) out of
    /// the list: its counters go to `retired`, its permits back to the shared count.
    pub(crate) fn forget(&self, c: Owner<'_>, retired: &Counters) {
        let mut list = sync::lock(&self.list);
        // A dead allocator's list is already empty, and its stats are never read again.
        if let Some(pos) = list.caches.iter().position(|l| std::ptr::eq(l.cache, &*c)) {
            list.caches.swap_remove(pos);
            retired.add_shared(&c.counters);
        }
        // SAFETY: this thread's own cache.
        let credits = unsafe { ThreadCache::seize_credits(&*c) };
        self.available
            .fetch_add(credits as usize, Ordering::Relaxed);
    }

    /// The part of a trim that reaches other threads: under the lock, takes every
    /// registered cache's stash and grant and asks its owner to flush the rest; then
    /// releases the stashes to `depot`'s backing allocator (running destructors, for a
    /// recycling allocator). Returns the number of objects released, or `None` for a
    /// dead allocator, whose caches are their owners' to release.
    pub(crate) fn trim_stashes(&self, depot: &Depot) -> Option<usize> {
        let mut stashes = Evictions::default();
        {
            let list = sync::lock(&self.list);
            if !self.is_alive() {
                return None;
            }
            for c in list.caches.iter().map(|l| l.cache) {
                // SAFETY: registered caches stay allocated while the lock is held.
                unsafe {
                    ThreadCache::request_flush(c);
                    seize_stash(depot, c, &mut stashes);
                }
            }
        }
        thread_cache::announce_flush_requests();
        Some(stashes.release(depot))
    }

    /// The part of `trim_idle` that reaches other threads: under the lock, takes the
    /// stash and grant of every cache that made no allocation or free since the previous
    /// call saw it, and asks its owner to flush the rest (once: not again while it stays
    /// idle); then releases the stashes. The allocator is idle when its operations (the
    /// caches', `retired` and the CPU caches' of `percpu`) did not move. `None` for a
    /// dead allocator, whose caches are their owners' to release.
    pub(crate) fn trim_idle_stashes(
        &self,
        depot: &Depot,
        retired: &Counters,
        percpu: Option<&PerCpu>,
    ) -> Option<IdleInterval> {
        let mut stashes = Evictions::default();
        let mut asked = false;
        let engine_idle;
        {
            let mut list = sync::lock(&self.list);
            if !self.is_alive() {
                return None;
            }
            if list.idle_watch.too_soon() {
                return Some(IdleInterval::TooShort);
            }
            let mut total = Counts::default();
            retired.read_into(&mut total);
            for listed in &mut list.caches {
                let c = listed.cache;
                let mut n = Counts::default();
                // SAFETY: registered caches stay allocated while the lock is held; only
                // their atomic counters are read (see `read_counts`).
                unsafe { ThreadCache::counters(c) }.read_into(&mut n);
                let now = Seen::at(n.ops());
                if listed.trim_seen.replace(now) == Some(now) {
                    // SAFETY: as above; only atomic fields are touched.
                    unsafe {
                        if !listed.asked {
                            ThreadCache::request_flush(c);
                            asked = true;
                        }
                        seize_stash(depot, c, &mut stashes);
                    }
                    listed.asked = true;
                } else {
                    listed.asked = false;
                }
                total.allocs += n.allocs;
                total.frees += n.frees;
            }
            if let Some(pc) = percpu {
                pc.read_counts(&mut total);
            }
            engine_idle = list.idle_watch.end(total.ops());
        }
        if asked {
            thread_cache::announce_flush_requests();
        }
        Some(IdleInterval::Ended {
            released: stashes.release(depot),
            engine_idle,
        })
    }

    /// Every CPU's magazines to the depot ([`PerCpu::reclaim`] with `depot` as the
    /// supply), under the lock as every reclaim is; `None` for a dead allocator. Returns
    /// the evictions to release.
    pub(crate) fn reclaim_cpus<'p>(
        &self,
        pc: &'p PerCpu,
        depot: &impl SharedSupply<'p>,
    ) -> Option<Evictions> {
        let _list = sync::lock(&self.list);
        self.is_alive().then(|| pc.reclaim(depot))
    }

    /// The allocator is being dropped (the caller has retired this thread's cache): marks
    /// it dead, asks every other thread to release its cache at its next slow path or
    /// exit, takes their stashes and (under the lock, as every reclaim is: a `trim_all`
    /// may be reclaiming them right now) every CPU's magazines, and releases what it
    /// took. Returns the number of objects released; the depot's own are the caller's.
    ///
    /// # Safety
    /// No thread can allocate or free through the allocator any more.
    pub(crate) unsafe fn shutdown<'p>(
        &self,
        depot: &Depot,
        cpus: Option<(&'p PerCpu, &impl SharedSupply<'p>)>,
    ) -> usize {
        let mut stashes = Evictions::default();
        let mut from_cpus = Evictions::default();
        {
            let mut list = sync::lock(&self.list);
            self.alive.store(false, Ordering::Release);
            for c in list.caches.drain(..).map(|l| l.cache) {
                // SAFETY: registered caches stay allocated while the lock is held.
                unsafe {
                    ThreadCache::request_flush(c);
                    seize_stash(depot, c, &mut stashes);
                }
            }
            if let Some((pc, supply)) = cpus {
                from_cpus = pc.shutdown(supply);
            }
        }
        thread_cache::announce_flush_requests();
        from_cpus.release(depot) + stashes.release(depot)
    }

    /// Adds the registered caches' counters and `retired` (the retired caches' and the
    /// engine's own) to `n`, under the lock, so that a cache retiring meanwhile is
    /// counted once, in one or the other (each counter is still read racily); returns
    /// how many caches are registered.
    pub(crate) fn read_counts(&self, retired: &Counters, n: &mut Counts) -> usize {
        let list = sync::lock(&self.list);
        retired.read_into(n);
        for c in list.caches.iter().map(|l| l.cache) {
            // SAFETY: registered caches stay allocated while the lock is held; only
            // their atomic counters are read, through a reference to that field alone
            // (the owner may be using its magazines meanwhile).
            unsafe { ThreadCache::counters(c) }.read_into(n);
        }
        list.caches.len()
    }

    /// A permit to hand out one object of a capped allocator, for this thread (`c`, its
    /// cache, or `None` without one): from the cache's own permits, else a batch drawn
    /// from the shared count, else, once, every permit other threads hold (so a refusal
    /// means that `max_live` objects really are live). False: refused.
    ///
    /// A draw moves permits from the shared count into a cache in two steps; it holds
    /// the lock, as does a refused thread's count of every cache's permits, so no permit
    /// is ever between the two where that count would miss it (a refusal with permits in
    /// flight, under `max_live`). The lock is taken once per batch.
    pub(crate) fn take_credit(&self, c: Option<Owner<'_>>) -> bool {
        if c.is_some_and(Owner::take_credit) {
            return true;
        }
        let list = sync::lock(&self.list);
        if self.draw_credits(c) {
            return true;
        }
        for other in list.caches.iter().map(|l| l.cache) {
            // SAFETY: registered caches stay allocated while the lock is held.
            let n = unsafe { ThreadCache::seize_credits(other) };
            self.available.fetch_add(n as usize, Ordering::Relaxed);
        }
        // This thread's own permits were taken too: it draws again like anyone.
        self.draw_credits(c)
    }

    /// Draws one permit for this thread from the shared count, and a batch's spares
    /// into its cache `c`. False when the count is empty. Called under the lock (see
    /// [`take_credit`](Self::take_credit)).
    fn draw_credits(&self, c: Option<Owner<'_>>) -> bool {
        let batch = c.map_or(1, |_| self.credit_batch as usize);
        let drawn = self
            .available
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |a| {
                a.checked_sub(a.min(batch)).filter(|_| a > 0)
            });
        let Ok(before) = drawn else {
            return false;
        };
        if let Some(c) = c {
            c.add_credits(before.min(batch) as u32 - 1);
        }
        true
    }

    /// Gives back the permit of an object being freed (to `c`, this thread's cache, or
    /// to the shared count); a cache holding more than two batches returns one, under
    /// the lock for the reason [`take_credit`](Self::take_credit) gives.
    pub(crate) fn return_credit(&self, c: Option<Owner<'_>>) {
        let batch = self.credit_batch;
        match c {
            Some(c) => {
                if c.add_credits(1) > 2 * batch {
                    let _list = sync::lock(&self.list);
                    if c.give_back_credits(batch) {
                        self.available.fetch_add(batch as usize, Ordering::Relaxed);
                    }
                }
            }
            None => {
                self.available.fetch_add(1, Ordering::Relaxed);
            }
        }
    }
}

/// An administrator takes the stash of a registered cache, and its grant (which it gives
/// back to the process-wide budget), adding the stash's magazines to `evictions`, to be
/// released whole once the lock is dropped (running destructors, for a recycling
/// allocator).
///
/// # Safety
/// `c` is registered with the allocator whose depot is `depot`, and its list's lock is
/// held.
unsafe fn seize_stash(depot: &Depot, c: *const ThreadCache, evictions: &mut Evictions) {
    // SAFETY: forwarded; only atomic fields are touched.
    let top = unsafe {
        budget::return_grant(ThreadCache::take_grant(c));
        ThreadCache::stash_take(c)
    };
    // SAFETY: a stash chain of the depot's table, seized above.
    unsafe {
        depot.for_each_in_stash(top, |mag| {
            // SAFETY: the seized chain is ours, to give up.
            evictions.push(Some(depot.evict_all(mag)))
        })
    };
}
