//! What other threads, and an allocator's lifecycle, do to an engine: registering a
//! thread's cache, retiring it, `release_thread_cache`, `trim`, `stats`, `trim_all` and
//! the shutdown when the allocator is dropped.
//!
//! # Owner and administrator
//! A thread cache's magazines (its [`OwnerPart`](super::thread_cache::OwnerPart) part) are touched by
//! its own thread only: the fast and slow paths, its idle collector and sweeps, its
//! thread-exit teardown. Every other thread is an administrator: `stats` reads the
//! caches' counters (atomics) under the cache-list lock, which also keeps registered
//! caches allocated; `trim_all` and the allocator's shutdown *ask* the owners, by
//! setting each cache's flush request and bumping a process-wide epoch that every
//! thread checks on its slow paths. Shutdown releases the depot; each owner releases
//! what its cache holds for a dead allocator when it next sweeps or exits. The engine
//! itself lives until the last cache is retired (each thread's table holds it), so a
//! late owner still finds valid magazines, and whatever reaches the depot after
//! shutdown is released when the engine drops.

use super::engine::{Engine, Listed};
use super::exchange::Evictions;
use super::idle::{IdleInterval, Seen};
use super::ids;
use super::thread_cache::{self, Counts, Owner, ThreadCache};
use crate::rows::Stats;
use crate::sync::{self, Ordering};

/// Adds a newly created cache of this thread to the engine's cache list; false (and
/// nothing added) where the global allocator cannot grow the list.
#[must_use]
pub(crate) fn adopt(e: &Engine, cache: *const ThreadCache) -> bool {
    let mut list = sync::lock(&e.cache_list);
    if list.caches.try_reserve(1).is_err() {
        return false;
    }
    list.caches.push(Listed::new(cache));
    true
}

/// Thread exit, `release_thread_cache`, or a sweep that found the allocator gone:
/// takes this thread's `c` out of the cache list (its counters go to the engine's)
/// and hands its magazines over. No user code runs.
///
/// # Safety
/// `c` was registered with this engine by the calling thread, which will not use it
/// again for this engine, with no reference from its owner part live.
pub(crate) unsafe fn retire_cache(e: &Engine, c: Owner<'_>) -> Evictions {
    // SAFETY: forwarded.
    let evictions = unsafe { e.flush(c) };
    let mut list = sync::lock(&e.cache_list);
    // A dead engine's cache list is already empty, and its stats are never read again.
    if let Some(pos) = list.caches.iter().position(|l| std::ptr::eq(l.cache, &*c)) {
        list.caches.swap_remove(pos);
        e.retired.add_shared(&c.counters);
    }
    // SAFETY: this thread's own cache.
    let credits = unsafe { ThreadCache::seize_credits(&*c) };
    e.available.fetch_add(credits as usize, Ordering::Relaxed);
    evictions
}

/// The idle collector found `c` (this thread's cache) unused for a whole period: give
/// one magazine back to the depot, the previous one first.
///
/// # Safety
/// As for [`Engine::refill_and_pop`].
pub(crate) unsafe fn release_idle_magazine(e: &Engine, c: Owner<'_>) -> Evictions {
    let mut evictions = Evictions::default();
    // The stash and its grant go first, all at once: a thread idle for a period has
    // no use for what it grew to.
    if !e.give_back_stash(c, &mut evictions) {
        // SAFETY: forwarded; nothing below runs user code.
        let o = unsafe { c.owned() };
        if let Some(mag) = o.take_previous().or_else(|| o.unload()) {
            // SAFETY: a descriptor of this engine's table.
            evictions.push(e.put(c, unsafe { e.mag(mag) }));
        }
    }
    evictions
}

/// The part of a trim that reaches other threads: under the cache-list lock, takes
/// every registered cache's stash and grant and asks its owner to flush the rest;
/// then releases the stashes (running destructors, for a recycling allocator).
/// Returns the number of objects released, or `None` for a dead allocator, whose
/// caches are their owners' to release.
pub(crate) fn trim_stashes(e: &Engine) -> Option<usize> {
    let mut stashes = Evictions::default();
    {
        let list = sync::lock(&e.cache_list);
        if !e.is_alive() {
            return None;
        }
        for c in list.caches.iter().map(|l| l.cache) {
            // SAFETY: registered caches stay allocated while the lock is held.
            unsafe {
                ThreadCache::request_flush(c);
                seize_stash(e, c, &mut stashes);
            }
        }
    }
    thread_cache::announce_flush_requests();
    Some(e.release(stashes))
}

/// The part of `trim_idle` that reaches other threads: under the cache-list lock,
/// takes the stash and grant of every cache that made no allocation or free since
/// the previous call saw it, and asks its owner to flush the rest (once: not again
/// while it stays idle); then releases the stashes. `None` for a dead allocator,
/// whose caches are their owners' to release.
pub(crate) fn trim_idle_stashes(e: &Engine) -> Option<IdleInterval> {
    let mut stashes = Evictions::default();
    let mut asked = false;
    let engine_idle;
    {
        let mut list = sync::lock(&e.cache_list);
        if !e.is_alive() {
            return None;
        }
        if list.idle_watch.too_soon() {
            return Some(IdleInterval::TooShort);
        }
        let mut total = Counts::default();
        e.retired.read_into(&mut total);
        for listed in &mut list.caches {
            let c = listed.cache;
            let mut n = Counts::default();
            // SAFETY: registered caches stay allocated while the lock is held; only
            // their atomic counters are read (see `stats`).
            unsafe { ThreadCache::counters(c) }.read_into(&mut n);
            let now = Seen::at(n.ops());
            if listed.trim_seen.replace(now) == Some(now) {
                // SAFETY: as above; only atomic fields are touched.
                unsafe {
                    if !listed.asked {
                        ThreadCache::request_flush(c);
                        asked = true;
                    }
                    seize_stash(e, c, &mut stashes);
                }
                listed.asked = true;
            } else {
                listed.asked = false;
            }
            total.allocs += n.allocs;
            total.frees += n.frees;
        }
        if let Some(pc) = &e.percpu {
            pc.read_counts(&mut total);
        }
        engine_idle = list.idle_watch.end(total.ops());
    }
    if asked {
        thread_cache::announce_flush_requests();
    }
    Some(IdleInterval::Ended {
        released: e.release(stashes),
        engine_idle,
    })
}

/// The end of a trim: gives everything the depot caches back to the backing
/// allocator. Returns the objects released in all (`released` before this, and the
/// depot's). Asking the C allocator to return memory to the OS is the caller's, once
/// for everything its call released (see [`release_to_os`](super::backing::release_to_os)).
pub(crate) fn trim_depot(e: &Engine, released: usize) -> usize {
    released + e.depot.trim()
}

/// The allocator is being dropped (the caller has retired this thread's cache): the
/// depot is released now; every other thread is asked to release its cache at its
/// next slow path or exit (the engine stays alive, held by those threads' tables,
/// until they have).
///
/// # Safety
/// No thread can allocate or free through the allocator any more (its owner is being
/// dropped).
pub(crate) unsafe fn shutdown(e: &Engine) {
    let mut stashes = Evictions::default();
    let mut from_cpus = Evictions::default();
    {
        let mut list = sync::lock(&e.cache_list);
        e.alive.store(false, Ordering::Release);
        for c in list.caches.drain(..).map(|l| l.cache) {
            // SAFETY: registered caches stay allocated while the lock is held.
            unsafe {
                ThreadCache::request_flush(c);
                seize_stash(e, c, &mut stashes);
            }
        }
        // Under the lock, as every reclaim of CPU caches is (`Engine::reclaim_cpus`): a
        // `trim_all` that holds this engine may be reclaiming them right now.
        if let Some(pc) = &e.percpu {
            from_cpus = pc.shutdown(&e.shared());
        }
    }
    thread_cache::announce_flush_requests();
    let released = e.release(from_cpus) + e.release(stashes);
    let released = trim_depot(e, released);
    super::backing::release_to_os(released * e.backing().object_size());
    ids::release(e.index);
}

/// An administrator takes the stash of a registered cache, and its grant (which it
/// gives back to the process-wide budget), adding the stash's magazines to
/// `evictions`, to be released whole once the lock is dropped (running destructors,
/// for a recycling allocator).
///
/// # Safety
/// `c` is registered with this engine and the cache-list lock is held.
unsafe fn seize_stash(e: &Engine, c: *const ThreadCache, evictions: &mut Evictions) {
    // SAFETY: forwarded; only atomic fields are touched.
    let top = unsafe {
        Engine::return_grant(ThreadCache::take_grant(c));
        ThreadCache::stash_take(c)
    };
    e.for_each_in_stash(top, |mag| {
        // SAFETY: the seized chain is ours, to give up.
        evictions.push(Some(unsafe { e.depot.evict_all(mag) }))
    });
}

/// A snapshot of the counters.
pub(crate) fn stats(e: &Engine) -> Stats {
    let object_size = e.backing().object_size();
    let mut n = Counts::default();
    let threads;
    {
        let list = sync::lock(&e.cache_list);
        e.retired.read_into(&mut n);
        threads = list.caches.len();
        for c in list.caches.iter().map(|l| l.cache) {
            // SAFETY: registered caches stay allocated while the lock is held; only
            // their atomic counters are read, through a reference to that field
            // alone (the owner may be using its magazines meanwhile).
            unsafe { ThreadCache::counters(c) }.read_into(&mut n);
        }
    }
    if let Some(pc) = &e.percpu {
        pc.read_counts(&mut n);
    }
    let backing_allocs = e.backing().allocs();
    let backing_frees = e.backing().frees();
    let live = n.allocs.saturating_sub(n.frees);
    let cached_in_depot = e.depot.cached_objects() as u64;
    let reserved = backing_allocs.saturating_sub(backing_frees);
    Stats {
        name: e.name,
        id: e.instance,
        object_size,
        live,
        cached_in_threads: reserved.saturating_sub(live + cached_in_depot),
        cached_in_depot,
        backing_allocs,
        backing_frees,
        threads,
        mode: e.mode(),
        ..Stats::default()
    }
    .with_counts(&n)
}
