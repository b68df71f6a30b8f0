//! The cache seam: how a front end reaches the cache nearest to the running code for
//! one allocator: this thread's cache (found through the thread-local [`table`]), or,
//! for a per-CPU allocator, this CPU's ([`percpu`](super::percpu), through restartable
//! sequences). Whatever kind of cache serves an allocator, the class layer calls these
//! functions and nothing below them.
//!
//! - [`Hints`]: the fast paths (inlined into every allocation and free): find the cache
//!   from copies of the engine's numbers, pop or push one pointer.
//! - [`alloc`], [`free`]: everything else, for one object: register a cache, the
//!   engine's exchange rules, the sweep that ends a slow path, capped allocators'
//!   permits, the backing allocator when there is no cache.
//! - [`Pinned`]: the cache in hand for a `with_local` call.
//! - [`release_thread_cache`], [`trim`], [`shutdown`] and the registry's view of an
//!   engine ([`Registered`]): what reaches this thread's cache besides objects.
//!
//! The witness that the calling thread owns a cache ([`Owner`]) is built by the table
//! and used here and in the engine; it never leaves `core`.

use std::ptr::NonNull;

use super::engine::Engine;
use super::idle::IdleInterval;
use super::percpu::PerCpu;
use super::rseq;
use super::table::{self, Lookup};
use super::thread_cache::Owner;
use crate::registry::Registered;
use crate::rows::Stats;
use crate::sync::Arc;

mod hints;
mod pinned;

pub(crate) use hints::Hints;
pub(crate) use pinned::Pinned;

/// This thread's cache for `e`, registering one if it has none (`None` without
/// thread-local storage). Registration may run user code (see [`table::install`]), so
/// the witness comes from a lookup after it.
#[inline]
fn cache_or_register(e: &Arc<Engine>) -> Option<Owner<'static>> {
    match table::lookup(e.index(), e.instance()) {
        Lookup::Cache(c) => Some(c),
        Lookup::TornDown => None,
        Lookup::Unregistered => register(e),
    }
}

/// Registers this thread's cache for `e` and looks it up (see [`cache_or_register`]).
#[cold]
fn register(e: &Arc<Engine>) -> Option<Owner<'static>> {
    table::install(e);
    match table::lookup(e.index(), e.instance()) {
        Lookup::Cache(c) => Some(c),
        _ => None,
    }
}

/// An object from `c` (this thread's cache for `e`): its loaded magazine, else the slow
/// path.
///
/// # Safety
/// `c` is this thread's registered cache for `e`.
#[inline(always)]
unsafe fn alloc_from(e: &Engine, c: Owner<'_>) -> Option<NonNull<u8>> {
    match c.pop() {
        Some(p) => Some(p),
        // SAFETY: forwarded.
        None => unsafe { alloc_slow(e, c) },
    }
}

/// The loaded magazine was empty: the engine's exchange rules, then the sweep that ends
/// every slow path (the idle collector, flush requests; it may run user code, so `c` is
/// not used after it), then the backing allocator if nothing was cached.
///
/// # Safety
/// As for [`alloc_from`].
#[cold]
#[inline(never)]
unsafe fn alloc_slow(e: &Engine, c: Owner<'_>) -> Option<NonNull<u8>> {
    // SAFETY: forwarded; no reference into the owner part is live.
    let got = unsafe { e.refill_and_pop(c) };
    table::after_slow_path();
    got.or_else(|| e.alloc_backing())
}

/// Frees `p` into `c` (this thread's cache for `e`): its loaded magazine, else the slow
/// path.
///
/// # Safety
/// As for [`alloc_from`]; `p` is an object of `e` that nobody uses any more.
#[inline(always)]
unsafe fn free_into(e: &Engine, c: Owner<'_>, p: NonNull<u8>) {
    if !c.push(p) {
        // SAFETY: forwarded.
        unsafe { free_slow(e, c, p) }
    }
}

/// The loaded magazine was full: the engine's exchange rules and the sweep, or the
/// backing allocator if the engine could not take `p`.
///
/// # Safety
/// As for [`free_into`].
#[cold]
#[inline(never)]
unsafe fn free_slow(e: &Engine, c: Owner<'_>, p: NonNull<u8>) {
    // SAFETY: forwarded.
    if unsafe { e.make_room_and_push(c, p) } {
        table::after_slow_path();
    } else {
        // SAFETY: forwarded.
        unsafe { e.free_backing(p) }
    }
}

/// An object of `e`, by every path the fast path does not cover: a capped allocator's
/// permit, a cache to register, a refill, or the backing allocator when there is no
/// cache. `None` when memory (or a permit) cannot be had. Inlined into the front end's
/// own out-of-line slow path, so a refill costs one call more than the fast path, not
/// two.
#[inline(always)]
pub(crate) fn alloc(e: &Arc<Engine>) -> Option<NonNull<u8>> {
    if e.capped() {
        return alloc_capped(e);
    }
    if let Some(pc) = e.percpu() {
        let area = rseq::thread_area();
        if !area.is_null() {
            if rseq::fence::disabled().is_none() {
                return alloc_cpu_slow(e, pc, area);
            }
            // Per-CPU caches are off for good: this CPU's goes to the depot, and a thread
            // cache serves from now on.
            pc.retire_here(&e.shared(), area);
        }
    }
    match cache_or_register(e) {
        // SAFETY: this thread's cache for `e`, just looked up.
        Some(c) => unsafe { alloc_from(e, c) },
        None => e.alloc_backing(),
    }
}

/// A per-CPU allocation that the fast path could not serve (see [`PerCpu::alloc`]).
#[cold]
#[inline(never)]
fn alloc_cpu_slow(e: &Engine, pc: &PerCpu, area: *mut u8) -> Option<NonNull<u8>> {
    let got = pc.alloc(&e.shared(), area);
    // The sweep ends every slow path, a CPU's too: this thread's caches of per-thread
    // allocators honour flush requests and the idle collector even where per-CPU
    // allocators take all its slow paths.
    table::after_slow_path();
    got.or_else(|| e.alloc_backing())
}

/// A per-CPU free that the fast path could not take (see [`PerCpu::free`]).
///
/// # Safety
/// As for [`free`].
#[cold]
#[inline(never)]
unsafe fn free_cpu_slow(e: &Engine, pc: &PerCpu, area: *mut u8, p: NonNull<u8>) {
    // SAFETY: forwarded.
    if unsafe { pc.free(&e.shared(), area, p) } {
        // As in `alloc_cpu_slow`.
        table::after_slow_path();
    } else {
        // SAFETY: forwarded.
        unsafe { e.free_backing(p) }
    }
}

/// Gives `p` back to `e` by every path the fast path does not cover (see [`alloc`]).
///
/// # Safety
/// `p` is an object of `e` that nobody uses any more.
#[inline(always)]
pub(crate) unsafe fn free(e: &Arc<Engine>, p: NonNull<u8>) {
    if e.capped() {
        // SAFETY: forwarded.
        return unsafe { free_capped(e, p) };
    }
    if let Some(pc) = e.percpu() {
        let area = rseq::thread_area();
        if !area.is_null() {
            if rseq::fence::disabled().is_none() {
                // SAFETY: forwarded.
                return unsafe { free_cpu_slow(e, pc, area, p) };
            }
            // As in `alloc`.
            pc.retire_here(&e.shared(), area);
        }
    }
    match cache_or_register(e) {
        // SAFETY: this thread's cache for `e`, just looked up; `p` as promised.
        Some(c) => unsafe { free_into(e, c, p) },
        // SAFETY: forwarded.
        None => unsafe { e.free_backing(p) },
    }
}

/// A capped allocator's allocation: a permit, then the object.
#[cold]
fn alloc_capped(e: &Arc<Engine>) -> Option<NonNull<u8>> {
    let c = cache_or_register(e);
    if !e.admin().take_credit(c) {
        return None;
    }
    /// Gives the permit back unless the allocation succeeds: if it fails, or unwinds
    /// (a recycling allocator's `create` panicked). To the shared count: the slow path
    /// may have run user code that retired this thread's cache.
    struct PermitGuard<'e>(&'e Engine);
    impl Drop for PermitGuard<'_> {
        fn drop(&mut self) {
            self.0.admin().return_credit(None);
        }
    }
    let guard = PermitGuard(e);
    let p = match c {
        // SAFETY: this thread's cache for `e`; `take_credit` ran no user code.
        Some(c) => unsafe { alloc_from(e, c) },
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
/// As for [`free`].
#[cold]
unsafe fn free_capped(e: &Arc<Engine>, p: NonNull<u8>) {
    let c = cache_or_register(e);
    e.admin().return_credit(c);
    match c {
        // SAFETY: this thread's cache for `e`; `return_credit` ran no user code.
        Some(c) => unsafe { free_into(e, c, p) },
        // SAFETY: forwarded.
        None => unsafe { e.free_backing(p) },
    }
}

/// Hands this thread's magazines for `e` to the depot and forgets this thread's cache
/// (only flushes it while a `with_local` call holds it). Returns the number of objects
/// released to the backing allocator (what the depot did not take).
pub(crate) fn release_thread_cache(e: &Engine) -> usize {
    if let Lookup::Cache(c) = table::lookup(e.index(), e.instance()) {
        if c.pinned() {
            // SAFETY: this thread's cache for `e`; no reference into it is live here.
            let evictions = unsafe { e.flush(c) };
            return e.release(evictions);
        }
    }
    table::uninstall(e)
}

/// Gives back everything of `e` cached that can be reached now: every thread's stash
/// (taken at once; each owner is also asked to flush its two magazines at its next slow
/// path), this thread's cache, and the depot. Returns the number of objects released
/// (0 for a dead allocator: its caches are their owners' to release).
pub(crate) fn trim(e: &Engine) -> usize {
    // Every CPU's magazines first (to the depot, whose trim below releases them).
    let from_cpus = e.reclaim_cpus();
    let Some(mut released) = e.admin().trim_stashes(&e.depot) else {
        return 0;
    };
    released += from_cpus;
    // Looked up after the stashes' release, which may have run user code.
    if let Lookup::Cache(c) = table::lookup(e.index(), e.instance()) {
        // The request `trim_stashes` set on this cache is honoured now: left pending,
        // the next slow path would flush what this thread frees after the trim.
        c.take_flush_request();
        // SAFETY: this thread's cache for `e`; no reference into it is live here.
        let evictions = unsafe { e.flush(c) };
        released += e.release(evictions);
    }
    released + e.depot.trim()
}

/// Gives back what of `e` went unused since the previous call: the stash of every
/// thread cache that made no allocation or free since then (whose owner is also asked to
/// flush its two magazines, and this thread's cache is flushed now), and the depot's
/// objects that no thread took since then (all of them, and every CPU's magazines, if
/// the allocator made no operation at all). The first call only starts the interval.
/// Returns the number of objects released (0 for a dead allocator).
pub(crate) fn trim_idle(e: &Engine) -> usize {
    let interval = e
        .admin()
        .trim_idle_stashes(&e.depot, &e.retired, e.percpu());
    let (mut released, engine_idle) = match interval {
        None | Some(IdleInterval::TooShort) => return 0,
        Some(IdleInterval::Ended {
            released,
            engine_idle,
        }) => (released, engine_idle),
    };
    if engine_idle {
        released += e.reclaim_cpus();
    }
    // Looked up after the stashes' release, which may have run user code.
    if let Lookup::Cache(c) = table::lookup(e.index(), e.instance()) {
        if c.take_flush_request() {
            // SAFETY: this thread's cache for `e`; no reference into it is live here.
            let evictions = unsafe { e.flush(c) };
            released += e.release(evictions);
        }
    }
    if engine_idle {
        released + e.depot.trim()
    } else {
        released + e.depot.trim_cold()
    }
}

/// The allocator of `e` is being dropped: this thread's cache is retired now; the depot
/// and other threads' stashes are released, and other threads are asked to retire
/// their caches (see [`Engine::shutdown`]). Returns the bytes released.
///
/// # Safety
/// As for [`Engine::shutdown`].
pub(crate) unsafe fn shutdown(e: &Engine) -> usize {
    table::uninstall(e);
    // SAFETY: forwarded.
    unsafe { e.shutdown() }
}

impl Registered for Engine {
    fn stats(&self) -> Option<Stats> {
        self.is_alive().then(|| Engine::stats(self))
    }

    /// `trim_all`: [`trim`], in bytes.
    fn trim(&self) -> usize {
        trim(self) * self.backing().object_size()
    }

    /// `trim_idle`: [`trim_idle`], in bytes.
    fn trim_idle(&self) -> usize {
        trim_idle(self) * self.backing().object_size()
    }
}

#[cfg(all(test, not(proxalloc_loom)))]
#[path = "../tests/cache.rs"]
mod tests;
