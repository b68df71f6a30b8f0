//! The fast paths' side of the cache seam: [`Hints`], the copies of an engine's numbers
//! that every allocation and free reads to find its cache (this CPU's, through a
//! restartable sequence, or this thread's, through the table) without touching the
//! engine.

use std::ptr::NonNull;

use crate::config::PERCPU_FIRST;
use crate::core::engine::Engine;
use crate::core::rseq;
use crate::core::table;
use crate::core::thread_cache::Owner;
use crate::sync::{self, const_fn};

#[cfg(doc)]
use super::{alloc, free};
#[cfg(doc)]
use crate::core::percpu::PerCpu;

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
/// inline fast paths serve is the build's choice ([`PERCPU_FIRST`], the `percpu`
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
    /// [`PERCPU_FIRST`]) or this thread's, or `None` (with nothing changed) when
    /// [`miss_alloc`](Self::miss_alloc), then [`alloc`], must run. It makes no calls, so a
    /// caller's value can be built straight into the object.
    #[inline(always)]
    pub(crate) fn alloc(&self) -> Option<NonNull<u8>> {
        if PERCPU_FIRST {
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
        let other = if PERCPU_FIRST {
            self.thread_alloc()
        } else {
            self.cpu_alloc()
        };
        other.or_else(|| self.boxed_alloc())
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
            let other = if PERCPU_FIRST {
                self.thread_free(p)
            } else {
                self.cpu_free(p)
            };
            other || self.boxed_free(p)
        }
    }

    /// The fast path of a free: `p` into this CPU's loaded magazine (with
    /// [`PERCPU_FIRST`]) or this thread's; false (with nothing changed) when
    /// [`miss_free`](Self::miss_free), then [`free`], must run.
    ///
    /// # Safety
    /// `p` is an object of the hints' engine that nobody uses any more.
    #[inline(always)]
    pub(crate) unsafe fn free(&self, p: NonNull<u8>) -> bool {
        // SAFETY: forwarded.
        unsafe {
            if PERCPU_FIRST {
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

    /// A per-CPU allocator's fast path (inline with [`PERCPU_FIRST`], else in the
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
/// Inlined into every allocation site with [`PERCPU_FIRST`], else run by the front
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
