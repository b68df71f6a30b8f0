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
use crate::sync::{self, const_fn, Arc};

mod pinned;

pub(crate) use pinned::Pinned;

/// What the fast paths need to find this thread's (or this CPU's) cache of one engine,
/// kept by its front end so that they never touch the engine. Only hints (std atomics
/// even under loom: nothing is published through them): until they are set they match
/// no cache, and a mismatch takes the slow path, which uses the engine's own numbers.
///
/// The first two words are read together by one assembly block on every allocation and
/// free ([`Hints::offset_and_instance`]): the byte offset of the allocator's inline cache
/// in a thread's table and its instance number ([`table::lookup_fast`]). An allocator
/// whose caches are boxed (an index past the inline ones) keeps its instance and an
/// offset past the inline block ([`table::hint_offset`]): the inline lookup masks it and
/// misses, and the front end's out-of-line [`Hints::boxed_alloc`] and
/// [`Hints::boxed_free`] find the boxed cache.
///
/// A per-CPU allocator's hints carry the same two words, and in a third the address of
/// its CPU caches ([`PerCpu::base`]; 0 for other allocators). Which kind of cache the
/// inline fast paths serve is the build's choice ([`rseq::PERCPU_FIRST`], the `percpu`
/// feature): with it, [`Hints::alloc`] is the CPU's sequence ([`Hints::cpu_alloc`]) and
/// the thread lookup runs in the front end's miss path ([`Hints::miss_alloc`]); without
/// it, the other way round. A thread with an rseq area never has a thread cache of a
/// per-CPU allocator; a thread without one uses a thread cache, which the thread lookup
/// serves as any allocator's. (Both kinds inline, or a flag tested inline, cost the
/// callers of either: `docs/benchmarks.md#per-cpu-fast-path-placements`.)
#[derive(Debug)]
#[repr(C)]
pub(crate) struct Hints {
    /// The cache's byte offset in a thread's table, or past its inline block for boxed
    /// caches (see [`table::hint_offset`]).
    offset: sync::process::AtomicU32,
    instance: sync::process::AtomicU64,
    /// A per-CPU engine's [`PerCpu::base`] (0 for other engines).
    cpus: sync::process::AtomicU64,
}

impl Hints {
    const_fn! {
        /// Hints that match no cache: an instance number no engine has (not even an
        /// unused entry's), at the first cache's offset.
        pub(crate) fn unset() -> Self {
            Hints {
                offset: sync::process::AtomicU32::new(0),
                instance: sync::process::AtomicU64::new(u64::MAX),
                cpus: sync::process::AtomicU64::new(0),
            }
        }
    }

    /// Points the hints at `engine`'s caches. A capped allocator leaves the instance
    /// unset, so its fast paths never match and every operation counts its permit on
    /// the slow path.
    pub(crate) fn set(&self, engine: &Engine) {
        use crate::sync::Ordering;
        if let Some(pc) = engine.percpu() {
            // Release, paired with `cpus`'s Acquire: the caches, written before, are
            // visible to a thread that reads the address.
            self.cpus.store(pc.base() as u64, Ordering::Release);
        }
        let Some(offset) = table::hint_offset(engine.index() as usize) else {
            return;
        };
        // Either order is safe: a fast path that reads one new hint and one old one
        // compares an instance no engine has, or this engine's instance with the first
        // inline cache's, which is another engine's or (index 0) this one's own. (A boxed
        // engine's instance is in no inline cache, whatever offset is read with it.)
        self.offset.store(offset, Ordering::Relaxed);
        if !engine.capped() {
            self.instance.store(engine.instance(), Ordering::Relaxed);
        }
    }

    /// A per-CPU engine's caches' address, 0 for other engines. Read only out of line
    /// (the miss path), so an ordinary atomic load: Acquire, a plain `mov` on x86-64.
    #[inline(always)]
    fn cpus(&self) -> usize {
        self.cpus.load(sync::Ordering::Acquire) as usize
    }

    /// This thread's inline cache, if it has one (see [`table::lookup_fast`]).
    #[inline(always)]
    fn owner(&self) -> Option<Owner<'static>> {
        let (offset, instance) = self.offset_and_instance();
        table::lookup_fast(offset, instance)
    }

    /// This thread's boxed cache, if the hints are a boxed allocator's and it has one
    /// (see [`table::lookup_boxed`]).
    #[inline(always)]
    fn boxed_owner(&self) -> Option<Owner<'static>> {
        let (offset, instance) = self.offset_and_instance();
        table::lookup_boxed(offset, instance)
    }

    /// The offset and instance hints, read as the fast paths read them.
    #[inline(always)]
    pub(crate) fn offset_and_instance(&self) -> (usize, u64) {
        // Not `load(Relaxed)`: see `sync::relaxed` (an atomic here would make every
        // caller's value be built on the stack and copied).
        const OFFSET: usize = std::mem::offset_of!(Hints, offset);
        const INSTANCE: usize = std::mem::offset_of!(Hints, instance);
        // SAFETY: the two fields are `self`'s atomics.
        unsafe { sync::relaxed::load_u32_u64::<OFFSET, INSTANCE>(std::ptr::from_ref(self).cast()) }
    }

    /// The fast path of an allocation: an object from this CPU's loaded magazine (with
    /// [`rseq::PERCPU_FIRST`]) or this thread's, or `None` (with nothing changed) when
    /// [`miss_alloc`](Self::miss_alloc), then [`alloc`], must run. It makes no calls, so a
    /// caller's value can be built straight into the object.
    #[inline(always)]
    pub(crate) fn alloc(&self) -> Option<NonNull<u8>> {
        if rseq::PERCPU_FIRST {
            self.cpu_alloc()
        } else {
            self.thread_alloc()
        }
    }

    /// This thread's inline cache popped (see [`table::lookup_fast`]).
    #[inline(always)]
    pub(crate) fn thread_alloc(&self) -> Option<NonNull<u8>> {
        self.owner()?.pop()
    }

    /// What [`alloc`](Self::alloc) leaves to the front end's out-of-line miss path before
    /// the slow path: the fast path of the kind of cache the inline one does not serve
    /// (a per-CPU allocator's sequence, or a thread cache), then a boxed thread cache's
    /// (an allocator past the thread table's inline caches). `None`, nothing changed,
    /// when [`alloc`] must run.
    #[inline(always)]
    pub(crate) fn miss_alloc(&self) -> Option<NonNull<u8>> {
        if rseq::PERCPU_FIRST {
            self.thread_alloc().or_else(|| self.boxed_alloc())
        } else {
            self.cpu_alloc().or_else(|| self.boxed_alloc())
        }
    }

    /// The free of [`miss_alloc`](Self::miss_alloc): false (nothing changed) when [`free`]
    /// must run.
    ///
    /// # Safety
    /// As for [`free`](Self::free).
    #[inline(always)]
    pub(crate) unsafe fn miss_free(&self, p: NonNull<u8>) -> bool {
        // SAFETY: forwarded.
        unsafe {
            if rseq::PERCPU_FIRST {
                self.thread_free(p) || self.boxed_free(p)
            } else {
                self.cpu_free(p) || self.boxed_free(p)
            }
        }
    }

    /// The fast path of a free: `p` into this CPU's loaded magazine (with
    /// [`rseq::PERCPU_FIRST`]) or this thread's; false (with nothing changed) when
    /// [`miss_free`](Self::miss_free), then [`free`], must run.
    ///
    /// # Safety
    /// `p` is an object of the hints' engine that nobody uses any more.
    #[inline(always)]
    pub(crate) unsafe fn free(&self, p: NonNull<u8>) -> bool {
        // SAFETY: forwarded.
        unsafe {
            if rseq::PERCPU_FIRST {
                self.cpu_free(p)
            } else {
                self.thread_free(p)
            }
        }
    }

    /// `p` pushed into this thread's inline cache.
    ///
    /// # Safety
    /// As for [`free`](Self::free).
    #[inline(always)]
    pub(crate) unsafe fn thread_free(&self, p: NonNull<u8>) -> bool {
        match self.owner() {
            Some(c) => c.push(p),
            None => false,
        }
    }

    /// An allocator with boxed caches (see [`table::lookup_boxed`]): an object from this
    /// thread's loaded magazine, or `None` (nothing changed; always for an inline
    /// allocator) when [`alloc`] must run. Not inlined into allocation
    /// sites: the front end's miss path calls it.
    #[inline(always)]
    pub(crate) fn boxed_alloc(&self) -> Option<NonNull<u8>> {
        self.boxed_owner()?.pop()
    }

    /// The free of [`boxed_alloc`](Self::boxed_alloc): false (nothing changed) when
    /// [`free`] must run.
    ///
    /// # Safety
    /// As for [`free`](Self::free).
    #[inline(always)]
    pub(crate) unsafe fn boxed_free(&self, p: NonNull<u8>) -> bool {
        match self.boxed_owner() {
            Some(c) => c.push(p),
            None => false,
        }
    }

    /// A per-CPU allocator's fast path (inline with [`rseq::PERCPU_FIRST`], else in the
    /// front end's miss path): an object from this CPU's loaded magazine, or `None`
    /// (nothing changed; always for other allocators) when the thread has no rseq area,
    /// has moved, or the magazine is empty.
    #[inline(always)]
    pub(crate) fn cpu_alloc(&self) -> Option<NonNull<u8>> {
        match self.cpus() {
            0 => None,
            base => cpu_pop(base),
        }
    }

    /// The free of [`cpu_alloc`](Self::cpu_alloc): false (nothing changed) when the slow
    /// path must run.
    ///
    /// # Safety
    /// As for [`free`](Self::free).
    #[inline(always)]
    pub(crate) unsafe fn cpu_free(&self, p: NonNull<u8>) -> bool {
        match self.cpus() {
            0 => false,
            // SAFETY: forwarded.
            base => unsafe { cpu_push(base, p) },
        }
    }
}

/// A per-CPU allocator's fast path, for the caches at `base`: this CPU's loaded
/// magazine popped, or `None` (nothing changed) when the thread has no rseq area, has
/// moved to another CPU, or the magazine is empty (see `rseq`).
///
/// Inlined into every allocation site with [`rseq::PERCPU_FIRST`], else run by the front
/// end's `#[cold]` miss path after the thread lookup: inlined beside the per-thread
/// lookup at every site, the sequence made per-CPU operations as fast as per-thread ones
/// but per-thread allocators' callers slower, since every caller then carried both paths
/// (measured: `docs/benchmarks.md#per-cpu-fast-path-placements`), so the build picks one.
#[inline(always)]
fn cpu_pop(base: usize) -> Option<NonNull<u8>> {
    let t = rseq::thread();
    if t.area.is_null() {
        return None;
    }
    let cache = base.wrapping_add((t.cpu as usize) << rseq::CACHE_SHIFT);
    // SAFETY: this thread's registered area; `t.cpu` is a CPU number below the count of
    // every per-CPU engine's caches, `base` a live engine's (the hints' allocator is
    // borrowed by the caller).
    NonNull::new(unsafe { rseq::pop(t.area, t.cpu, cache) })
}

/// A per-CPU allocator's free fast path (see [`cpu_pop`]): false when `p` was not taken.
///
/// # Safety
/// `p` is an object of the engine whose caches are at `base` that nobody uses any more.
#[inline(always)]
unsafe fn cpu_push(base: usize, p: NonNull<u8>) -> bool {
    let t = rseq::thread();
    if t.area.is_null() {
        return false;
    }
    let cache = base.wrapping_add((t.cpu as usize) << rseq::CACHE_SHIFT);
    // SAFETY: as in `cpu_pop`; `p` as the caller promised.
    unsafe { rseq::push(t.area, t.cpu, cache, p.as_ptr()) }
}

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
/// their caches (see [`Engine::shutdown`]).
///
/// # Safety
/// As for [`Engine::shutdown`].
pub(crate) unsafe fn shutdown(e: &Engine) {
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
