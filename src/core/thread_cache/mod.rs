//! A thread's cache for one allocator: Bonwick's two magazines (loaded and previous),
//! the stash of full magazines it grows into, and the permits of a capped allocator.
//!
//! The loaded magazine is kept unpacked in the cache (slot array, count, capacity), so
//! the fast paths are: find the cache (see [`table`](super::table)), compare the count,
//! move one pointer. The exchange rules, which run only when the loaded magazine is
//! empty (alloc) or full (free), are in [`engine`](super::engine), called from the
//! `#[cold]` slow paths of [`cache`](super::cache).

use std::cell::{Cell, UnsafeCell};
use std::marker::PhantomData;
use std::ptr::{self, NonNull};

use super::idle::Seen;
use super::magazine::{self, Magazine, NIL};

mod owner_part;
mod pin;

pub(crate) use super::counters::{Counters, Counts};
use crate::sync::{self, const_fn, AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering};
pub(crate) use owner_part::OwnerPart;
pub(crate) use pin::Pin;

/// Bumped whenever another thread posts flush requests (`trim_all`) or an allocator
/// shuts down: each thread compares it with the value it last saw on its slow paths,
/// and sweeps its caches when it moved. One acquire load (a plain load on x86) per slow
/// path; the per-cache requests and the engines' `alive` flags are what the sweep acts
/// on.
#[cfg(not(proxalloc_loom))]
static FLUSH_EPOCH: sync::process::AtomicU64 = sync::process::AtomicU64::new(0);

// Under loom, one per model execution (a process-wide value would make thread sweeps
// depend on earlier executions, which loom rejects as non-determinism), and modelled.
#[cfg(proxalloc_loom)]
loom::lazy_static! {
    static ref FLUSH_EPOCH: sync::AtomicU64 = sync::AtomicU64::new(0);
}

/// Tells every thread to sweep its caches at its next slow path.
pub(crate) fn announce_flush_requests() {
    FLUSH_EPOCH.fetch_add(1, Ordering::Release);
}

/// The flush epoch, as a thread about to decide whether to sweep reads it.
pub(crate) fn flush_epoch() -> u64 {
    // Acquire pairs with `announce_flush_requests`' Release: a thread that sees the new
    // epoch also sees the flush requests and dead engines posted before it (with
    // Relaxed, a weak-memory CPU could skip them until the next idle pass).
    FLUSH_EPOCH.load(Ordering::Acquire)
}

/// One thread's cache for one allocator.
///
/// It has two parts with different rules (see "Owner and administrator" in
/// docs/design.md):
/// - [`OwnerPart`], behind an `UnsafeCell`: the magazines. Only the owner thread ever
///   touches it, through [`owned`](Self::owned), and never across code that may run
///   user code (a recycled value's destructor or constructor), so no reference to it is
///   live when the allocator is re-entered.
/// - the shared part: statistics counters (bumped by the owner, read by any thread under
///   the engine's cache-list lock) and the flush request (set by any thread, taken by the
///   owner). Both are atomics, and other threads only ever reach this part through a
///   pointer to the field, never a reference to the whole cache.
///
/// The fast paths' fields (the owned part, 48 bytes) and their two counters come first,
/// in one cache line. A cache is two lines, a power of two, so the fast paths' lookup
/// can mask an offset into the table (`table::lookup_fast`); debug builds' owner check
/// makes it larger, and they align it to 128 so that the tests run that same lookup.
/// (Not under loom: its caches are larger still, the lookup checks offsets there, and a
/// table of larger caches overflows the stacks of loom's threads.)
#[derive(Debug)]
#[repr(C)]
#[cfg_attr(any(not(debug_assertions), proxalloc_loom), repr(align(64)))]
#[cfg_attr(all(debug_assertions, not(proxalloc_loom)), repr(align(128)))]
pub(crate) struct ThreadCache {
    owned: UnsafeCell<OwnerPart>,
    /// What this cache did, bumped by its thread only.
    pub(crate) counters: Counters,
    /// The stash: full magazines beyond the loaded and previous ones, a stack of
    /// magazine indices linked through their `next` fields, with its length, packed as
    /// `(len << 32) | top`. Only the owner pushes and pops; any thread may take the whole
    /// stash with one swap (`trim_all`, the allocator's drop), which is what makes memory
    /// that an idle thread caches reclaimable from another thread. No ABA: only the owner
    /// pushes, and it never pushes while it pops.
    stash: AtomicU64,
    /// Bytes of the process-wide thread-cache budget this cache holds for its stash
    /// (owner grows it; owner or administrator gives it back).
    grant: AtomicUsize,
    /// Empty magazines kept for the stash's next fills (owner only), linked through
    /// `next`.
    empties: Cell<*const Magazine>,
    /// This cache's operations when the idle collector last looked at it (owner only).
    pub(super) collector_seen: Cell<Seen>,
    /// Permits to have objects live, drawn from a capped allocator's shared count (see
    /// `Config::max_live`); the owner takes and returns them, a refused thread takes
    /// them all back (both with read-modify-writes, so none is lost).
    credits: AtomicU32,
    /// Live [`Pin`]s: while non-zero the cache must not be retired (owner only).
    pins: Cell<u16>,
    /// How many empties are kept (owner only).
    empty_count: Cell<u16>,
    /// Magazines spilled to the depot since the last refill from it (owner only): the
    /// demand that was not kept, which the next refill grants the stash room for.
    spills_since_refill: Cell<u16>,
    /// Set by `trim_all` or a dying allocator on another thread: the owner flushes the
    /// cache at its next slow path. Nothing is published through the flag itself (the
    /// process-wide flush epoch orders it), so it is `Relaxed`.
    flush_request: AtomicBool,
    /// The table that registered this cache (its address), which alone may build an
    /// [`Owner`] for it: checked in debug builds.
    #[cfg(debug_assertions)]
    owner_table: Cell<usize>,
}

/// What a cache holds (see [`Owner::holdings`]).
#[cfg(test)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Holdings {
    /// Objects in the loaded magazine, if there is one.
    pub(crate) loaded: Option<usize>,
    /// Objects in the previous magazine, if there is one.
    pub(crate) previous: Option<usize>,
    /// Magazines in the stash.
    pub(crate) stash: u32,
    /// Empty magazines kept for the stash.
    pub(crate) empties: u16,
    /// Bytes of the process-wide budget granted to the stash.
    pub(crate) grant: usize,
    /// Whether a flush request is pending.
    pub(crate) flush_requested: bool,
}

#[cfg(all(test, proxalloc_loom))]
impl Holdings {
    /// Whether the cache holds no magazine and no grant (what a flush or the idle
    /// collector leaves).
    pub(crate) fn is_empty(&self) -> bool {
        self.loaded.is_none()
            && self.previous.is_none()
            && self.stash == 0
            && self.empties == 0
            && self.grant == 0
    }
}

/// A stash head is `len << 32 | takes << 24 | top`: the stash's length, a count of the
/// administrators' takes (8 bits, wrapping), and the top magazine's index (24 bits, as
/// every magazine index). The count makes every take change the head, even of an empty
/// stash, so an owner's push that read the head before a take cannot succeed after it.
const TAKES: u64 = 0xff << 24;

/// Packs a stash head (with a take count of zero).
const fn stash_head(len: u32, top: u32) -> u64 {
    ((len as u64) << 32) | top as u64
}

/// `head` with its length and top replaced, its take count kept.
fn stash_next(head: u64, len: u32, top: u32) -> u64 {
    stash_head(len, top) | (head & TAKES)
}

/// Unpacks a stash head into `(len, top)`.
fn stash_parts(head: u64) -> (u32, u32) {
    ((head >> 32) as u32, (head & u64::from(NIL)) as u32)
}

impl ThreadCache {
    const_fn! {
        /// An unused cache (`instance` [`EMPTY`](super::ids::EMPTY)) or a fresh one.
        pub(crate) fn new(instance: u64) -> Self {
            ThreadCache {
                owned: UnsafeCell::new(OwnerPart::empty(instance)),
                counters: Counters::new(),
                flush_request: AtomicBool::new(false),
                pins: Cell::new(0),
                credits: AtomicU32::new(0),
                collector_seen: Cell::new(Seen::at(0)),
                stash: AtomicU64::new(stash_head(0, NIL)),
                grant: AtomicUsize::new(0),
                empties: Cell::new(ptr::null()),
                empty_count: Cell::new(0),
                spills_since_refill: Cell::new(0),
                #[cfg(debug_assertions)]
                owner_table: Cell::new(0),
            }
        }
    }

    /// The instance number, read by the owner's lookups.
    ///
    /// # Safety
    /// Called on the owner thread, with no reference from `owned` live.
    #[inline(always)]
    pub(crate) unsafe fn instance(this: *const ThreadCache) -> u64 {
        // SAFETY: per the contract; a read through the cell's pointer, no reference.
        unsafe { (*UnsafeCell::raw_get(ptr::addr_of!((*this).owned))).instance }
    }

    /// The shared counters of the cache at `this`, for readers on any thread.
    ///
    /// # Safety
    /// `this` points to a live cache (registered caches stay allocated while their
    /// engine's cache-list lock is held).
    pub(crate) unsafe fn counters<'c>(this: *const ThreadCache) -> &'c Counters {
        // SAFETY: per the contract; only the atomic field is borrowed, never the cell.
        unsafe { &*ptr::addr_of!((*this).counters) }
    }

    /// Asks the owner to flush this cache at its next slow path (any thread).
    ///
    /// # Safety
    /// As for [`counters`](Self::counters).
    pub(crate) unsafe fn request_flush(this: *const ThreadCache) {
        // SAFETY: per the contract; only the atomic field is borrowed.
        unsafe { (*ptr::addr_of!((*this).flush_request)).store(true, Ordering::Relaxed) };
    }

    /// Makes this retired cache a fresh, empty one of `instance`, in place and only
    /// through the cell and the atomics (never a write of the whole struct): a slow path
    /// further up this thread's stack may still hold a shared reference to it, if user
    /// code it ran retired the cache and registered its allocator again.
    ///
    /// # Safety
    /// Called on the owner thread, with no reference from `owned` live; the cache holds
    /// no magazines and is in no engine's cache list; `key` is the calling thread's
    /// table's.
    pub(super) unsafe fn reset(&self, instance: u64, key: &OwnerKey) {
        // SAFETY: per the contract, the only access to the cell.
        unsafe { *self.owned.get() = OwnerPart::empty(instance) };
        self.counters.reset();
        self.flush_request.store(false, Ordering::Relaxed);
        self.pins.set(0);
        self.credits.store(0, Ordering::Relaxed);
        self.collector_seen.set(Seen::at(0));
        debug_assert_eq!(stash_parts(self.stash.load(Ordering::Relaxed)).1, NIL);
        debug_assert_eq!(self.grant.load(Ordering::Relaxed), 0);
        debug_assert!(self.empties.get().is_null());
        self.spills_since_refill.set(0);
        #[cfg(debug_assertions)]
        self.owner_table.set(key.table());
        let _ = key;
    }

    /// Takes every permit (any thread).
    ///
    /// # Safety
    /// As for [`counters`](Self::counters).
    pub(crate) unsafe fn seize_credits(this: *const ThreadCache) -> u32 {
        // SAFETY: per the contract; only the atomic field is borrowed.
        unsafe { (*ptr::addr_of!((*this).credits)).swap(0, Ordering::Relaxed) }
    }

    /// Takes the whole grant, to give it back to the process-wide budget (any thread).
    ///
    /// # Safety
    /// As for [`counters`](Self::counters).
    pub(crate) unsafe fn take_grant(this: *const ThreadCache) -> usize {
        // SAFETY: per the contract; only the atomic field is borrowed.
        unsafe { (*ptr::addr_of!((*this).grant)).swap(0, Ordering::Relaxed) }
    }

    /// Takes the whole stash (any thread): returns the top index of the chain, now owned
    /// by the caller ([`NIL`] when empty).
    ///
    /// # Safety
    /// As for [`counters`](Self::counters).
    pub(crate) unsafe fn stash_take(this: *const ThreadCache) -> u32 {
        // SAFETY: per the contract; only the atomic field is borrowed.
        let stash = unsafe { &*ptr::addr_of!((*this).stash) };
        // Acquire pairs with the owner's Release pushes, so the chain's rounds and links
        // are visible; the take count goes up, so a push that read the head before
        // cannot land in the emptied stash (see `stash_push_within_grant`).
        let taken = |head: u64| stash_head(0, NIL) | ((head & TAKES) + (1 << 24)) & TAKES;
        let old = stash
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |head| {
                Some(taken(head))
            })
            .unwrap_or_else(|head| head);
        stash_parts(old).1
    }
}

/// A thread's table, as the caches it owns know it: only the table makes one (its
/// constructor is `unsafe`, and `table.rs` is its one caller), and an [`Owner`] witness
/// is built from it.
pub(crate) struct OwnerKey {
    /// The table's address: a cache records it when registered, and in debug builds the
    /// witness checks it.
    #[cfg(debug_assertions)]
    table: usize,
}

impl OwnerKey {
    /// The key of the table at `table`.
    ///
    /// # Safety
    /// Called on the thread that owns that table.
    #[inline(always)]
    pub(super) unsafe fn new(table: usize) -> Self {
        let _ = table;
        OwnerKey {
            #[cfg(debug_assertions)]
            table,
        }
    }

    #[cfg(debug_assertions)]
    fn table(&self) -> usize {
        self.table
    }
}

/// The witness that the calling thread owns a cache: what the owner-only part of a
/// [`ThreadCache`] is reached through (its magazines, stash pushes and pops, kept
/// empties, permits, the fast paths). Only the owning thread's table builds one, from
/// its [`OwnerKey`], and it is neither `Send` nor `Sync`, so it cannot leave that thread.
///
/// It is not kept across code that may run user code (a recycled value's constructor
/// or destructor, a sweep's releases): that code may retire the cache. With debug
/// assertions on, building one checks that the cache belongs to the calling thread's
/// table.
#[derive(Clone, Copy)]
pub(crate) struct Owner<'c> {
    cache: &'c ThreadCache,
    _not_send: PhantomData<*mut ()>,
}

impl std::ops::Deref for Owner<'_> {
    type Target = ThreadCache;
    /// The shared part (counters and atomics), as any thread may reach it.
    #[inline(always)]
    fn deref(&self) -> &ThreadCache {
        self.cache
    }
}

impl<'c> Owner<'c> {
    /// A witness for `cache`.
    ///
    /// # Safety
    /// `cache` is a cache of the table that gave `key`, on that table's thread, live
    /// for `'c`.
    #[inline(always)]
    pub(super) unsafe fn new(key: &OwnerKey, cache: *const ThreadCache) -> Self {
        // SAFETY: per the contract.
        let cache = unsafe { &*cache };
        #[cfg(debug_assertions)]
        debug_assert_eq!(
            cache.owner_table.get(),
            key.table(),
            "proxalloc: a thread cache entered from a thread that does not own it"
        );
        let _ = key;
        Owner {
            cache,
            _not_send: PhantomData,
        }
    }

    /// The owner-only part.
    ///
    /// # Safety
    /// No other reference from `owned` is live ([`pop`](Self::pop) and
    /// [`push`](Self::push) make one while they run), and the result is dropped before
    /// code that may run user code (which may re-enter the allocator and use this cache).
    #[inline(always)]
    pub(crate) unsafe fn owned(self) -> &'c mut OwnerPart {
        // SAFETY: the witness proves this is the owner thread; per the contract, this is
        // the only reference into the cell.
        unsafe { &mut *self.cache.owned.get() }
    }

    /// The instance number of the engine this cache serves (for debug checks).
    pub(crate) fn instance_of(self) -> u64 {
        // SAFETY: the owner, reading through the cell's pointer (no reference).
        unsafe { ThreadCache::instance(self.cache) }
    }

    /// Whether a [`Pin`] holds this cache.
    pub(crate) fn pinned(self) -> bool {
        self.pins.get() > 0
    }

    /// Takes one permit; false when it holds none.
    pub(crate) fn take_credit(self) -> bool {
        self.credits
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| n.checked_sub(1))
            .is_ok()
    }

    /// Adds `n` permits; returns how many it then holds.
    pub(crate) fn add_credits(self, n: u32) -> u32 {
        self.credits.fetch_add(n, Ordering::Relaxed) + n
    }

    /// Takes `n` permits back if it holds at least that many.
    pub(crate) fn give_back_credits(self, n: u32) -> bool {
        self.credits
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |have| {
                have.checked_sub(n)
            })
            .is_ok()
    }

    /// Bytes of the process-wide budget this cache holds.
    pub(crate) fn grant(self) -> usize {
        self.grant.load(Ordering::Relaxed)
    }

    /// Adds `bytes` (already reserved from the process-wide budget) to the grant.
    pub(crate) fn add_grant(self, bytes: usize) {
        self.grant.fetch_add(bytes, Ordering::Relaxed);
    }

    /// Pushes `mag` (full, owned by this cache) onto the stash if the grant pays for one
    /// more magazine of `magazine_bytes`; false, with nothing changed, if it does not.
    ///
    /// The grant is checked each time the head is read, not once before: an
    /// administrator takes the grant and then the stash (`admin`'s `seize_stash`), and an
    /// owner whose CAS fails because the stash was taken reads the head again with
    /// Acquire, which pairs with the taker's update, so it sees the grant gone too. Every
    /// take changes the head (its take count), even an empty stash's, so the CAS does
    /// fail after one. With the check made once, before the loop, or with a take that
    /// left an empty stash's head unchanged, the push could land in a taken stash with no
    /// grant behind it (one magazine over, until the owner's next sweep: the loom model
    /// `stash_is_within_its_grant_even_before_the_next_slow_path` found the second).
    pub(crate) fn stash_push_within_grant(self, mag: &Magazine, magazine_bytes: usize) -> bool {
        let mut head = self.stash.load(Ordering::Acquire);
        loop {
            let (len, top) = stash_parts(head);
            let grant = self.grant.load(Ordering::Relaxed);
            if (len as usize + 1) * magazine_bytes > grant {
                return false;
            }
            mag.next.store(top, Ordering::Relaxed);
            // Release: the rounds and link written before this become visible to an
            // administrator that takes the stash (its swap is Acquire).
            match self.stash.compare_exchange_weak(
                head,
                stash_next(head, len + 1, mag.index),
                Ordering::Release,
                Ordering::Acquire,
            ) {
                Ok(_) => {
                    // Only the owner pushes, so whatever an administrator took meanwhile,
                    // the stash is now at most what the grant it was checked against
                    // covers.
                    let now = stash_parts(self.stash.load(Ordering::Relaxed)).0;
                    debug_assert!(
                        now as usize * magazine_bytes <= grant,
                        "a stash beyond its grant: {now} magazines of {magazine_bytes} bytes, \
                         {grant} bytes granted",
                    );
                    return true;
                }
                Err(now) => head = now,
            }
        }
    }

    /// Pops the stash's top magazine; `get` resolves an index.
    pub(crate) fn stash_pop<'t>(self, get: impl Fn(u32) -> &'t Magazine) -> Option<&'t Magazine> {
        let mut head = self.stash.load(Ordering::Acquire);
        loop {
            let (len, top) = stash_parts(head);
            if top == NIL {
                return None;
            }
            let mag = get(top);
            // If an administrator took the stash meanwhile it may be relinking `mag`:
            // the read is atomic, and the CAS below then fails.
            let next = mag.next.load(Ordering::Relaxed);
            match self.stash.compare_exchange_weak(
                head,
                stash_next(head, len - 1, next),
                Ordering::Acquire,
                Ordering::Acquire,
            ) {
                Ok(_) => return Some(mag),
                Err(now) => head = now,
            }
        }
    }

    /// Keeps an empty magazine for later; false when `limit` are kept.
    pub(crate) fn keep_empty(self, mag: &Magazine, limit: u32) -> bool {
        if u32::from(self.empty_count.get()) >= limit || self.empty_count.get() == u16::MAX {
            return false;
        }
        let next = self.empties.get();
        mag.next.store(
            // SAFETY: kept magazines are descriptors of the engine's table.
            unsafe { next.as_ref() }.map_or(NIL, |m| m.index),
            Ordering::Relaxed,
        );
        self.empties.set(mag);
        self.empty_count.set(self.empty_count.get() + 1);
        true
    }

    /// Takes a kept empty magazine; `get` resolves an index.
    pub(crate) fn take_empty<'t>(self, get: impl Fn(u32) -> &'t Magazine) -> Option<&'t Magazine> {
        // SAFETY: kept magazines are descriptors of the engine's table, which outlives
        // the cache's use of them.
        let mag: &'t Magazine = unsafe { self.empties.get().as_ref() }?;
        let next = mag.next.load(Ordering::Relaxed);
        self.empties
            .set(if next == NIL { ptr::null() } else { get(next) });
        self.empty_count.set(self.empty_count.get() - 1);
        Some(mag)
    }

    /// Counts a spill to the depot.
    pub(crate) fn note_spill(self) {
        self.spills_since_refill
            .set(self.spills_since_refill.get().saturating_add(1));
    }

    /// The spills since the last refill, resetting the count.
    pub(crate) fn take_spills(self) -> u16 {
        self.spills_since_refill.replace(0)
    }

    /// What this cache holds, for the tests' and loom models' checks (with no reference
    /// from its owner part live).
    #[cfg(test)]
    pub(crate) fn holdings(self) -> Holdings {
        // SAFETY: per the contract; the borrow ends here.
        let o = unsafe { self.owned() };
        // SAFETY: a previous magazine is a live descriptor owned by this cache.
        let previous = o.previous().map(|m| unsafe { m.len() });
        Holdings {
            loaded: (!o.loaded.is_null()).then_some(o.len),
            previous,
            stash: stash_parts(self.stash.load(Ordering::Relaxed)).0,
            empties: self.empty_count.get(),
            grant: self.grant(),
            flush_requested: self.flush_request.load(Ordering::Relaxed),
        }
    }

    /// Takes a pending flush request.
    pub(crate) fn take_flush_request(self) -> bool {
        self.flush_request.load(Ordering::Relaxed)
            && self.flush_request.swap(false, Ordering::Relaxed)
    }

    /// Fast path: pops the loaded magazine.
    #[inline(always)]
    pub(crate) fn pop(self) -> Option<NonNull<u8>> {
        // SAFETY: the owner, through its witness; the borrow ends before this returns,
        // and no other is live (`owned`'s contract).
        let o = unsafe { self.owned() };
        if o.len == 0 {
            return None;
        }
        o.len -= 1;
        // SAFETY: `slots[..len + 1]` are valid objects of the loaded magazine.
        let object = unsafe { magazine::slot(o.slots, o.len) };
        // After the read: the compiler cannot see through the counter's store, so it
        // would reload `slots` and `len` after it.
        self.counters.allocs.bump_one();
        Some(object)
    }

    /// Fast path: pushes onto the loaded magazine; false when it is full.
    #[inline(always)]
    pub(crate) fn push(self, object: NonNull<u8>) -> bool {
        // SAFETY: as for `pop`.
        let o = unsafe { self.owned() };
        if o.len == o.cap {
            return false;
        }
        // SAFETY: `len < cap`, inside the loaded magazine's slot array.
        unsafe { *o.slots.add(o.len) = object.as_ptr() };
        o.len += 1;
        self.counters.frees.bump_one();
        true
    }
}

#[cfg(all(test, not(proxalloc_loom)))]
#[path = "../tests/thread_cache.rs"]
mod tests;
