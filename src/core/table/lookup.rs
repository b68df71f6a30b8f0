//! Finding this thread's cache for an allocator: the fast paths' lookup (an inline
//! cache at a masked offset, no calls), the boxed caches' lookup, and the slow paths'.

use super::{Table, INLINE_CACHES, LOCAL};
use crate::core::thread_cache::{Owner, ThreadCache};
use crate::sync;

/// What [`lookup`] found.
pub(crate) enum Lookup {
    /// This thread's cache for the engine.
    Cache(Owner<'static>),
    /// This thread has no cache for the engine (yet, or any more after teardown).
    Unregistered,
    /// Thread-local storage is gone (loom only: std's table outlives teardown).
    TornDown,
}

/// Finds this thread's cache for the allocator `(index, instance)`, or says why there is
/// none: [`lookup_fast`], then the boxed caches of higher indices (the slow paths' lookup).
#[inline]
pub(crate) fn lookup(index: u32, instance: u64) -> Lookup {
    let index = index as usize;
    if let Some(offset) = inline_offset(index) {
        if let Some(cache) = lookup_fast(offset as usize, instance) {
            return Lookup::Cache(cache);
        }
    }
    LOCAL
        .try_with(|table| {
            if index < INLINE_CACHES {
                Lookup::Unregistered
            } else {
                lookup_more(table, index, instance)
            }
        })
        .unwrap_or(Lookup::TornDown)
}

/// Bytes of one inline cache in the table.
pub(super) const CACHE_BYTES: usize = std::mem::size_of::<ThreadCache>();

/// Whether an offset can be brought into the table with a mask: both sizes are powers
/// of two (a cache is two lines; four in debug builds); loom's atomics make a cache
/// larger, and the lookup then checks the offset instead.
const MASKABLE: bool = CACHE_BYTES.is_power_of_two() && INLINE_CACHES.is_power_of_two();

/// The mask that maps any offset to the start of an inline cache (when [`MASKABLE`]).
const OFFSET_MASK: usize = (INLINE_CACHES * CACHE_BYTES - 1) & !(CACHE_BYTES - 1);

#[cfg(not(proxalloc_loom))]
const _: () = assert!(MASKABLE, "the fast paths' lookup masks its offset");

/// Where the inline cache of allocator `index` is in a thread's table, in bytes (what
/// [`hint_offset`] gives for an inline index). `None` for an index whose caches are boxed.
pub(crate) const fn inline_offset(index: usize) -> Option<u32> {
    if index < INLINE_CACHES {
        hint_offset(index)
    } else {
        None
    }
}

/// What an allocator's hints keep as its offset: [`inline_offset`] for an inline index,
/// and for a boxed one the offset its cache would have if the inline block went on (so
/// [`lookup_boxed`] gets the index back, and [`lookup_fast`], which masks it, lands on
/// some inline cache, never this allocator's). `None` past `u32`.
pub(crate) const fn hint_offset(index: usize) -> Option<u32> {
    match index.checked_mul(CACHE_BYTES) {
        Some(offset) if offset <= u32::MAX as usize => Some(offset as u32),
        _ => None,
    }
}

/// The lookup for an allocator whose caches are boxed, from its hints ([`hint_offset`]
/// and its instance): this thread's boxed cache for it, or `None` (an inline offset, no
/// cache yet, a stale one, teardown), which the slow paths sort out with [`lookup`]. It
/// makes no calls; the front end runs it out of line, after the inline lookup missed,
/// so that allocators past the inline ones skip the slow path's checks and calls.
///
/// The witness it returns is not kept across code that may run user code (see
/// [`Owner`]).
#[inline(always)]
pub(crate) fn lookup_boxed(offset: usize, instance: u64) -> Option<Owner<'static>> {
    let index = offset / CACHE_BYTES;
    if index < INLINE_CACHES {
        return None;
    }
    LOCAL
        .try_with(|table| boxed_cache(table, index, instance))
        .ok()
        .flatten()
}

/// `offset` brought to the start of an inline cache: masked (so any offset lands on
/// one), or where the sizes do not allow a mask, checked (`None` for one that is no
/// cache's start).
#[inline(always)]
pub(super) fn cache_start(offset: usize) -> Option<usize> {
    if MASKABLE {
        Some(offset & OFFSET_MASK)
    } else if offset < INLINE_CACHES * CACHE_BYTES && offset % CACHE_BYTES == 0 {
        Some(offset)
    } else {
        None
    }
}

/// The fast paths' lookup: the inline cache at `offset` (see [`inline_offset`]) if its
/// instance is `instance`, in the same cache line as the cache's fast-path fields, or
/// `None` for anything else (a boxed cache, no cache, teardown), which
/// [`lookup_boxed`] or the slow paths (with [`lookup`]) sort out. It makes no calls, so
/// the fast paths around it make none either.
///
/// Any `offset` is safe: it is masked into the table (one `and`, where an index would
/// take a bounds check and a multiply), and an offset that is no allocator's, or a
/// boxed allocator's, lands on a cache whose instance does not match. Hints that must
/// match no cache keep an instance no engine has.
///
/// The witness it returns is not kept across code that may run user code (see
/// [`Owner`]); `'static` stands for "until this thread retires the cache".
#[inline(always)]
pub(crate) fn lookup_fast(offset: usize, instance: u64) -> Option<Owner<'static>> {
    let offset = cache_start(offset)?;
    LOCAL
        .try_with(|table| {
            // The table's address as one opaque register value (see `sync::relaxed::opaque`:
            // left to LLVM, it costs allocation loops a reload from the stack per
            // operation).
            let base = sync::relaxed::opaque(table.fast());
            // SAFETY: `offset` is the start of an inline cache (masked or checked
            // above); entries are always valid caches, and the owner part is never
            // borrowed across a call into the allocator.
            let cache = unsafe { base.byte_add(offset) };
            // SAFETY: as above; this thread owns the table. An inline cache lives as
            // long as the thread.
            (unsafe { ThreadCache::instance(cache) } == instance)
                .then(|| unsafe { Owner::new(&table.key(), cache) })
        })
        .ok()
        .flatten()
}

#[cold]
fn lookup_more(table: &Table, index: usize, instance: u64) -> Lookup {
    boxed_cache(table, index, instance).map_or(Lookup::Unregistered, Lookup::Cache)
}

/// This thread's boxed cache of `index` (at least [`INLINE_CACHES`]) if its instance is
/// `instance`.
#[inline(always)]
fn boxed_cache(table: &Table, index: usize, instance: u64) -> Option<Owner<'static>> {
    // SAFETY: this thread's table; `rest` is only borrowed mutably by table operations,
    // which run no user code and so never around a lookup.
    let cache = unsafe { table.cache(index) };
    // SAFETY: a non-null entry is a boxed cache owned by the table, live until the
    // thread's teardown; this thread owns it.
    (!cache.is_null() && unsafe { ThreadCache::instance(cache) } == instance)
        .then(|| unsafe { Owner::new(&table.key(), cache) })
}
