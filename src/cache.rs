//! Per-thread caches: Bonwick's two magazines (loaded and previous), and the thread-local
//! table that finds a thread's cache for an allocator.
//!
//! The loaded magazine is kept unpacked in the cache (slot array, count, capacity), so
//! the fast paths are: find the cache, compare the count, move one pointer. The exchange
//! rules, which run only when the loaded magazine is empty (alloc) or full (free), are in
//! `#[cold]` functions in [`engine`](crate::engine).

use std::cell::{Cell, UnsafeCell};
use std::ptr::{self, NonNull};
use std::sync::atomic::AtomicBool;

use crate::budget::ByteBudget;
use crate::engine::{Engine, Evictions};
use crate::magazine::{self, Magazine, NIL};
use crate::sync::{self, Arc, AtomicU64, AtomicUsize, Ordering, StatCounter};

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

    /// Zeroes the counters (the owner, for a cache no other thread can reach).
    fn reset(&self) {
        for c in [
            &self.allocs,
            &self.frees,
            &self.refills,
            &self.spills,
            &self.overflows,
        ] {
            c.reset();
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

/// One thread's cache for one allocator.
///
/// It has two parts with different rules (see "Owner and administrator" in
/// docs/design.md):
/// - [`Owned`], behind an `UnsafeCell`: the magazines. Only the owner thread ever
///   touches it, through [`owned`](Self::owned), and never across code that may run
///   user code (a recycled value's destructor or constructor), so no reference to it is
///   live when the allocator is re-entered.
/// - the shared part: statistics counters (bumped by the owner, read by any thread under
///   the engine's registry lock) and the flush request (set by any thread, taken by the
///   owner). Both are atomics, and other threads only ever reach this part through a
///   pointer to the field, never a reference to the whole cache.
///
/// The fast paths' fields (the owned part, 48 bytes) and their two counters come first,
/// in one cache line.
#[derive(Debug)]
#[repr(C, align(64))]
pub(crate) struct ThreadCache {
    owned: UnsafeCell<Owned>,
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
    /// `allocs + frees` (truncated) when the idle collector last looked at this cache
    /// (owner only).
    gc_seen: Cell<u32>,
    /// Permits to have objects live, drawn from a capped allocator's shared count (see
    /// `Config::max_live`); the owner takes and returns them, a refused thread takes
    /// them all back (both with read-modify-writes, so none is lost).
    credits: std::sync::atomic::AtomicU32,
    /// Live [`Pin`]s: while non-zero the cache must not be retired (owner only).
    pins: Cell<u16>,
    /// How many empties are kept (owner only).
    empty_count: Cell<u16>,
    /// Magazines spilled to the depot since the last refill from it (owner only): the
    /// demand that was not kept, which the next refill grants the stash room for.
    spills_since_refill: Cell<u16>,
    /// Set by `trim_all` or a dying allocator on another thread: the owner flushes the
    /// cache at its next slow path. A hint (nothing is published through it), so it is a
    /// std atomic even under loom.
    flush_request: AtomicBool,
}

/// Packs a stash head.
const fn stash_head(len: u32, top: u32) -> u64 {
    ((len as u64) << 32) | top as u64
}

/// Unpacks a stash head into `(len, top)`.
fn stash_parts(head: u64) -> (u32, u32) {
    ((head >> 32) as u32, head as u32)
}

/// The owner-only part of a [`ThreadCache`].
#[derive(Debug)]
#[repr(C)]
pub(crate) struct Owned {
    /// Instance number of the engine this cache belongs to ([`EMPTY`] when unused).
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
}

impl ThreadCache {
    #[cfg(not(proxalloc_loom))]
    pub(crate) const fn new(instance: u64) -> Self {
        Self::with_stash(
            instance,
            AtomicU64::new(stash_head(0, NIL)),
            AtomicUsize::new(0),
        )
    }

    /// Under loom the stash is a loom atomic, which is not `const`.
    #[cfg(proxalloc_loom)]
    pub(crate) fn new(instance: u64) -> Self {
        Self::with_stash(
            instance,
            AtomicU64::new(stash_head(0, NIL)),
            AtomicUsize::new(0),
        )
    }

    const fn with_stash(instance: u64, stash: AtomicU64, grant: AtomicUsize) -> Self {
        ThreadCache {
            owned: UnsafeCell::new(Owned::empty(instance)),
            counters: Counters::new(),
            flush_request: AtomicBool::new(false),
            pins: Cell::new(0),
            credits: std::sync::atomic::AtomicU32::new(0),
            gc_seen: Cell::new(0),
            stash,
            grant,
            empties: Cell::new(ptr::null()),
            empty_count: Cell::new(0),
            spills_since_refill: Cell::new(0),
        }
    }

    /// The owner-only part.
    ///
    /// # Safety
    /// Called on the owner thread, with no other reference from `owned` live; the
    /// result is not kept across code that may run user code.
    #[inline(always)]
    #[allow(clippy::mut_from_ref)] // the UnsafeCell and the contract above make it unique
    pub(crate) unsafe fn owned(&self) -> &mut Owned {
        // SAFETY: per the contract, this is the only reference into the cell.
        unsafe { &mut *self.owned.get() }
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
    /// engine's registry lock is held).
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

    /// Whether a [`Pin`] holds this cache (owner only).
    pub(crate) fn pinned(&self) -> bool {
        self.pins.get() > 0
    }

    /// Makes this retired cache a fresh, empty one of `instance`, in place and only
    /// through the cell and the atomics (never a write of the whole struct): a slow path
    /// further up this thread's stack may still hold a shared reference to it, if user
    /// code it ran retired the cache and registered its allocator again.
    ///
    /// # Safety
    /// Called on the owner thread, with no reference from `owned` live; the cache holds
    /// no magazines and is in no engine's registry.
    unsafe fn reset(&self, instance: u64) {
        // SAFETY: per the contract, the only access to the cell.
        unsafe { *self.owned.get() = Owned::empty(instance) };
        self.counters.reset();
        self.flush_request.store(false, Ordering::Relaxed);
        self.pins.set(0);
        self.credits.store(0, Ordering::Relaxed);
        self.gc_seen.set(0);
        debug_assert_eq!(stash_parts(self.stash.load(Ordering::Relaxed)).1, NIL);
        debug_assert_eq!(self.grant.load(Ordering::Relaxed), 0);
        debug_assert!(self.empties.get().is_null());
        self.spills_since_refill.set(0);
    }

    /// Takes one permit (owner); false when it holds none.
    pub(crate) fn take_credit(&self) -> bool {
        self.credits
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| n.checked_sub(1))
            .is_ok()
    }

    /// Adds `n` permits (owner); returns how many it then holds.
    pub(crate) fn add_credits(&self, n: u32) -> u32 {
        self.credits.fetch_add(n, Ordering::Relaxed) + n
    }

    /// Takes `n` permits back if it holds at least that many (owner).
    pub(crate) fn give_back_credits(&self, n: u32) -> bool {
        self.credits
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |have| {
                have.checked_sub(n)
            })
            .is_ok()
    }

    /// Takes every permit (any thread).
    ///
    /// # Safety
    /// As for [`counters`](Self::counters).
    pub(crate) unsafe fn seize_credits(this: *const ThreadCache) -> u32 {
        // SAFETY: per the contract; only the atomic field is borrowed.
        unsafe { (*ptr::addr_of!((*this).credits)).swap(0, Ordering::Relaxed) }
    }

    /// Magazines in the stash now.
    pub(crate) fn stash_len(&self) -> u32 {
        stash_parts(self.stash.load(Ordering::Relaxed)).0
    }

    /// Bytes of the process-wide budget this cache holds.
    pub(crate) fn grant(&self) -> usize {
        self.grant.load(Ordering::Relaxed)
    }

    /// Adds `bytes` (already reserved from the process-wide budget) to the grant (owner).
    pub(crate) fn add_grant(&self, bytes: usize) {
        self.grant.fetch_add(bytes, Ordering::Relaxed);
    }

    /// Takes the whole grant, to give it back to the process-wide budget (any thread).
    ///
    /// # Safety
    /// As for [`counters`](Self::counters).
    pub(crate) unsafe fn take_grant(this: *const ThreadCache) -> usize {
        // SAFETY: per the contract; only the atomic field is borrowed.
        unsafe { (*ptr::addr_of!((*this).grant)).swap(0, Ordering::Relaxed) }
    }

    /// Pushes `mag` (full, owned by this cache) onto the stash (owner only).
    pub(crate) fn stash_push(&self, mag: &Magazine) {
        let mut head = self.stash.load(Ordering::Relaxed);
        loop {
            let (len, top) = stash_parts(head);
            mag.next.store(top, Ordering::Relaxed);
            // Release: the rounds and link written before this become visible to an
            // administrator that takes the stash (its swap is Acquire).
            match self.stash.compare_exchange_weak(
                head,
                stash_head(len + 1, mag.index),
                Ordering::Release,
                Ordering::Relaxed,
            ) {
                Ok(_) => return,
                Err(now) => head = now,
            }
        }
    }

    /// Pops the stash's top magazine (owner only); `get` resolves an index.
    pub(crate) fn stash_pop<'t>(&self, get: impl Fn(u32) -> &'t Magazine) -> Option<&'t Magazine> {
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
                stash_head(len - 1, next),
                Ordering::Acquire,
                Ordering::Acquire,
            ) {
                Ok(_) => return Some(mag),
                Err(now) => head = now,
            }
        }
    }

    /// Takes the whole stash (any thread): returns the top index of the chain, now owned
    /// by the caller ([`NIL`] when empty).
    ///
    /// # Safety
    /// As for [`counters`](Self::counters).
    pub(crate) unsafe fn stash_take(this: *const ThreadCache) -> u32 {
        // SAFETY: per the contract; only the atomic field is borrowed. Acquire pairs
        // with the owner's Release pushes, so the chain's rounds and links are visible.
        let old =
            unsafe { (*ptr::addr_of!((*this).stash)).swap(stash_head(0, NIL), Ordering::AcqRel) };
        stash_parts(old).1
    }

    /// Keeps an empty magazine for later (owner only); false when `limit` are kept.
    pub(crate) fn keep_empty(&self, mag: &Magazine, limit: u32) -> bool {
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

    /// Takes a kept empty magazine (owner only); `get` resolves an index.
    pub(crate) fn take_empty<'t>(&self, get: impl Fn(u32) -> &'t Magazine) -> Option<&'t Magazine> {
        // SAFETY: kept magazines are descriptors of the engine's table, which outlives
        // the cache's use of them.
        let mag: &'t Magazine = unsafe { self.empties.get().as_ref() }?;
        let next = mag.next.load(Ordering::Relaxed);
        self.empties
            .set(if next == NIL { ptr::null() } else { get(next) });
        self.empty_count.set(self.empty_count.get() - 1);
        Some(mag)
    }

    /// Counts a spill to the depot (owner only).
    pub(crate) fn note_spill(&self) {
        self.spills_since_refill
            .set(self.spills_since_refill.get().saturating_add(1));
    }

    /// The spills since the last refill, resetting the count (owner only).
    pub(crate) fn take_spills(&self) -> u16 {
        self.spills_since_refill.replace(0)
    }

    /// Takes a pending flush request (owner only).
    pub(crate) fn take_flush_request(&self) -> bool {
        self.flush_request.load(Ordering::Relaxed)
            && self.flush_request.swap(false, Ordering::Relaxed)
    }

    /// Fast path: pops the loaded magazine.
    ///
    /// # Safety
    /// As for [`owned`](Self::owned).
    #[inline(always)]
    pub(crate) unsafe fn pop(&self) -> Option<NonNull<u8>> {
        // SAFETY: forwarded; the borrow ends before this returns.
        let o = unsafe { self.owned() };
        if o.len == 0 {
            return None;
        }
        o.len -= 1;
        // SAFETY: `slots[..len + 1]` are valid objects of the loaded magazine.
        let object = unsafe { magazine::slot(o.slots, o.len) };
        // After the read: the compiler cannot see through the counter's store, so it
        // would reload `slots` and `len` after it.
        self.counters.allocs.bump(1);
        Some(object)
    }

    /// Fast path: pushes onto the loaded magazine; false when it is full.
    ///
    /// # Safety
    /// As for [`owned`](Self::owned).
    #[inline(always)]
    pub(crate) unsafe fn push(&self, object: NonNull<u8>) -> bool {
        // SAFETY: forwarded; the borrow ends before this returns.
        let o = unsafe { self.owned() };
        if o.len == o.cap {
            return false;
        }
        // SAFETY: `len < cap`, inside the loaded magazine's slot array.
        unsafe { *o.slots.add(o.len) = object.as_ptr() };
        o.len += 1;
        self.counters.frees.bump(1);
        true
    }
}

impl Owned {
    const fn empty(instance: u64) -> Self {
        Owned {
            instance,
            slots: ptr::null_mut(),
            len: 0,
            cap: 0,
            loaded: ptr::null(),
            previous: ptr::null(),
        }
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
        debug_assert!(self.previous.is_null(), "a previous magazine would be lost");
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
pub(crate) struct Pin(*const ThreadCache);

impl Pin {
    /// Pins `cache`, this thread's registered cache.
    ///
    /// # Safety
    /// `cache` is this thread's cache, and no reference from its `owned` is live.
    pub(crate) unsafe fn new(cache: *const ThreadCache) -> Self {
        // SAFETY: per the contract.
        unsafe {
            let pins = (*cache).pins.get().checked_add(1);
            (*cache)
                .pins
                .set(pins.expect("proxalloc: with_local nested 65535 deep"));
        }
        Pin(cache)
    }
}

impl Drop for Pin {
    fn drop(&mut self) {
        // SAFETY: a pinned cache is not freed until its thread exits, this pin lives on
        // that thread's stack, and no owner borrow is live where a pin drops.
        unsafe { (*self.0).pins.set((*self.0).pins.get() - 1) };
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

/// Default of the process-wide thread-cache budget: 32 MiB.
pub(crate) const DEFAULT_THREAD_CACHE_BUDGET: usize = 32 << 20;

/// Bytes that thread caches may grow by, all threads and allocators together (each
/// cache holds a grant from it for its stash).
#[cfg(not(proxalloc_loom))]
static THREAD_CACHE_BUDGET: ByteBudget = ByteBudget::new(DEFAULT_THREAD_CACHE_BUDGET);

// Under loom, one per model execution (see `FLUSH_EPOCH`).
#[cfg(proxalloc_loom)]
loom::lazy_static! {
    static ref THREAD_CACHE_BUDGET: ByteBudget = ByteBudget::new(DEFAULT_THREAD_CACHE_BUDGET);
}

/// The process-wide thread-cache budget.
pub(crate) fn thread_cache_budget() -> &'static ByteBudget {
    &THREAD_CACHE_BUDGET
}

/// Tells every thread to sweep its caches at its next slow path.
pub(crate) fn announce_flush_requests() {
    FLUSH_EPOCH.fetch_add(1, Ordering::Release);
}

/// Work left over from a table operation, done once the table and every cache are
/// consistent and nothing is borrowed: releasing evicted objects (which runs a
/// recycling allocator's destructors, user code that may re-enter any allocator), and
/// dropping engines (the last reference frees a dead allocator's depot).
#[derive(Default)]
pub(crate) struct Garbage {
    items: Vec<(Arc<Engine>, Evictions)>,
}

impl Garbage {
    fn push(&mut self, engine: Arc<Engine>, evictions: Evictions) {
        self.items.push((engine, evictions));
    }

    /// Releases everything; returns the number of objects released.
    pub(crate) fn release(self) -> usize {
        let mut released = 0;
        for (engine, evictions) in self.items {
            released += engine.release(evictions);
            drop(engine);
        }
        released
    }
}

/// A thread's caches, indexed by the dense slot number of each allocator it has used.
///
/// The table owns its caches: it retires them at thread exit, on
/// `release_thread_cache`, when their allocator is gone, and when a slot passes to a new
/// allocator. A stale entry is still a valid cache whose instance number matches nobody,
/// and [`lookup`] may read it.
///
/// Off loom the table itself needs no destructor, so std gives the thread-local a
/// `const` initialiser and no lazy-initialisation or liveness check: the fast paths
/// address it directly. The thread-exit work is done by a separate thread-local,
/// [`ExitHook`], armed when the thread registers its first cache.
///
/// Methods that borrow `rest` or a cache's owner part run no user code: what needs it
/// comes back as [`Garbage`], released after the borrow ends.
struct Table {
    fast: UnsafeCell<[ThreadCache; FAST_SLOTS]>,
    /// Everything else, boxed on first registration and freed at thread exit.
    rest: Cell<*mut Rest>,
    /// Set when the thread-exit teardown has run: no new cache may be registered.
    torn_down: Cell<bool>,
    /// Slow-path entries on this thread since the idle collector last ran.
    gc_clock: Cell<u32>,
    /// [`FLUSH_EPOCH`] when this thread last swept its caches.
    seen_epoch: Cell<u64>,
}

#[derive(Default)]
struct Rest {
    /// Boxed caches of slots `FAST_SLOTS..`, at `slot - FAST_SLOTS` (null when none).
    more: Vec<*mut ThreadCache>,
    /// Per slot: the engine of a registered cache, kept alive so the thread-exit flush
    /// can reach it (and so a dead allocator's magazines stay valid until this thread
    /// has released what its cache holds).
    owners: Vec<Option<Arc<Engine>>>,
}

impl Rest {
    /// The cache of `slot` (null for a boxed slot never used).
    fn cache(&self, fast: *mut ThreadCache, slot: usize) -> *mut ThreadCache {
        if slot < FAST_SLOTS {
            // SAFETY: in bounds of the inline array.
            return unsafe { fast.add(slot) };
        }
        self.more
            .get(slot - FAST_SLOTS)
            .copied()
            .unwrap_or(ptr::null_mut())
    }

    /// Retires the cache of `slot`, if registered: it leaves its engine's registry and
    /// hands its magazines over, and the entry becomes unused. No user code runs.
    ///
    /// # Safety
    /// Called by the owning thread, with no reference into the cache's owner part live.
    unsafe fn retire(&mut self, fast: *mut ThreadCache, slot: usize, garbage: &mut Garbage) {
        let Some(engine) = self.owners.get_mut(slot).and_then(Option::take) else {
            return;
        };
        let c = self.cache(fast, slot);
        // SAFETY: a registered cache of this thread, per the caller's contract.
        unsafe {
            debug_assert!(!(*c).pinned(), "retiring a pinned cache");
            let evictions = engine.retire_cache(&*c);
            (*c).owned().instance = EMPTY;
            garbage.push(engine, evictions);
        }
    }
}

impl Table {
    #[cfg(not(proxalloc_loom))]
    const fn new() -> Self {
        Self::with_caches([const { ThreadCache::new(EMPTY) }; FAST_SLOTS])
    }

    #[cfg(proxalloc_loom)]
    fn new() -> Self {
        Self::with_caches(std::array::from_fn(|_| ThreadCache::new(EMPTY)))
    }

    const fn with_caches(fast: [ThreadCache; FAST_SLOTS]) -> Self {
        Table {
            fast: UnsafeCell::new(fast),
            rest: Cell::new(ptr::null_mut()),
            torn_down: Cell::new(false),
            gc_clock: Cell::new(0),
            seen_epoch: Cell::new(0),
        }
    }

    fn fast(&self) -> *mut ThreadCache {
        self.fast.get().cast::<ThreadCache>()
    }

    /// Runs `f` on `rest` (if the thread has one).
    ///
    /// # Safety
    /// Called by the owning thread; `f` runs no user code and does not re-enter the
    /// table.
    unsafe fn with_rest<R>(&self, f: impl FnOnce(&mut Rest) -> R) -> Option<R> {
        // SAFETY: `rest` is null or a live box owned by this thread's table, and per
        // the contract nothing else borrows it while `f` runs.
        unsafe { self.rest.get().as_mut() }.map(f)
    }

    /// The cache of `slot`, if it has one (in use or stale).
    ///
    /// # Safety
    /// Called by the owning thread.
    unsafe fn cache(&self, slot: usize) -> *mut ThreadCache {
        if slot < FAST_SLOTS {
            // SAFETY: in bounds of the inline array.
            return unsafe { self.fast().add(slot) };
        }
        // SAFETY: per the caller's contract; a lookup runs no user code.
        unsafe { self.with_rest(|rest| rest.cache(self.fast(), slot)) }.unwrap_or(ptr::null_mut())
    }

    /// A fresh cache for `engine` in its slot (which `engine` has no cache in),
    /// registered with the engine; a stale cache in that slot (its allocator was
    /// dropped) is retired first, into `garbage`. `None` once the thread is tearing
    /// down its thread-locals.
    ///
    /// # Safety
    /// Called by the owning thread, with no reference into the table live.
    unsafe fn create(
        &self,
        engine: &Arc<Engine>,
        garbage: &mut Garbage,
    ) -> Option<*mut ThreadCache> {
        if self.torn_down.get() {
            return None;
        }
        if self.rest.get().is_null() {
            if !arm_exit_hook() {
                return None;
            }
            self.rest.set(Box::into_raw(Box::default()));
        }
        let fast = self.fast();
        // SAFETY: per the contract; nothing in here runs user code.
        unsafe {
            self.with_rest(|rest| {
                let slot = engine.slot() as usize;
                if rest.owners.len() <= slot {
                    rest.owners.resize_with(slot + 1, || None);
                }
                rest.retire(fast, slot, garbage);
                rest.owners[slot] = Some(engine.clone());
                let c = if slot < FAST_SLOTS {
                    fast.add(slot)
                } else {
                    if rest.more.len() <= slot - FAST_SLOTS {
                        rest.more.resize(slot - FAST_SLOTS + 1, ptr::null_mut());
                    }
                    let entry = &mut rest.more[slot - FAST_SLOTS];
                    if entry.is_null() {
                        *entry = Box::into_raw(Box::new(ThreadCache::new(EMPTY)));
                    }
                    *entry
                };
                // The old cache is retired: no magazines, and no other thread can reach
                // it (it left its engine's registry).
                (*c).reset(engine.instance());
                engine.adopt(c);
                c
            })
        }
    }

    /// Sweeps this thread's caches: a cache whose allocator is gone is retired, one
    /// with a flush request is flushed, and (on an idle pass) one that served nothing
    /// since the previous idle pass gives one magazine back (so an idle cache drains in
    /// two passes).
    ///
    /// # Safety
    /// Called by the owning thread, with no reference into the table live.
    unsafe fn sweep(&self, idle_pass: bool, garbage: &mut Garbage) {
        let fast = self.fast();
        // SAFETY: per the contract; engines' retire/flush/put run no user code.
        unsafe {
            self.with_rest(|rest| {
                for slot in 0..rest.owners.len() {
                    let Some(engine) = rest.owners[slot].as_ref() else {
                        continue;
                    };
                    if !engine.is_alive() {
                        rest.retire(fast, slot, garbage);
                        continue;
                    }
                    let c = &*rest.cache(fast, slot);
                    if c.take_flush_request() {
                        let evictions = engine.flush(c);
                        garbage.push(engine.clone(), evictions);
                    } else if idle_pass {
                        let ops = (c.counters.allocs.get() + c.counters.frees.get()) as u32;
                        if ops == c.gc_seen.get() {
                            let evictions = engine.release_idle_magazine(c);
                            garbage.push(engine.clone(), evictions);
                        }
                        c.gc_seen.set(ops);
                    }
                }
            });
        }
    }

    /// Thread exit: retires every cache and frees what the table allocated.
    ///
    /// # Safety
    /// Called by the owning thread, with no reference into the table live; the thread
    /// makes no further registrations.
    unsafe fn teardown(&self) -> Garbage {
        self.torn_down.set(true);
        let mut garbage = Garbage::default();
        let rest = self.rest.replace(ptr::null_mut());
        if rest.is_null() {
            return garbage;
        }
        // SAFETY: a live box owned by the table, now unreachable from it.
        let mut rest = unsafe { Box::from_raw(rest) };
        for slot in 0..rest.owners.len() {
            // SAFETY: per the contract.
            unsafe { rest.retire(self.fast(), slot, &mut garbage) };
        }
        for c in rest.more.drain(..).filter(|c| !c.is_null()) {
            // SAFETY: boxed caches owned by this table, retired above (so no other
            // thread can reach them).
            drop(unsafe { Box::from_raw(c) });
        }
        garbage
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
        if let Ok(garbage) = LOCAL.try_with(|t| unsafe { t.teardown() }) {
            garbage.release();
        }
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
        unsafe { self.teardown() }.release();
    }
}

#[cfg(proxalloc_loom)]
fn arm_exit_hook() -> bool {
    true
}

/// What [`lookup`] found.
pub(crate) enum Lookup {
    /// This thread's cache for the engine.
    Cache(*const ThreadCache),
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
pub(crate) fn lookup_fast(slot: u32, instance: u64) -> Option<*const ThreadCache> {
    let slot = slot as usize;
    if slot >= FAST_SLOTS {
        return None;
    }
    LOCAL
        .try_with(|table| {
            // SAFETY: in bounds; entries are always valid caches, and the owner part is
            // never borrowed across a call into the allocator.
            let cache = unsafe { table.fast().add(slot) };
            // SAFETY: as above; this thread owns the table.
            (unsafe { ThreadCache::instance(cache) } == instance).then_some(cache.cast_const())
        })
        .ok()
        .flatten()
}

#[cold]
fn lookup_more(table: &Table, slot: usize, instance: u64) -> Lookup {
    // SAFETY: this thread's table.
    let cache = unsafe { table.cache(slot) };
    // SAFETY: a non-null entry is a boxed cache owned by the table.
    if !cache.is_null() && unsafe { ThreadCache::instance(cache) } == instance {
        Lookup::Cache(cache)
    } else {
        Lookup::Unregistered
    }
}

/// Creates and registers this thread's cache for `engine` (which must have none); does
/// nothing if the thread is tearing down its thread-locals. It may run user code (the
/// destructors of values a dropped allocator left in the slot's old cache), so callers
/// look the cache up again afterwards.
pub(crate) fn install(engine: &Arc<Engine>) {
    let mut garbage = Garbage::default();
    // SAFETY: this thread's table; no reference into it is live.
    let _ = LOCAL.try_with(|t| unsafe { t.create(engine, &mut garbage) });
    garbage.release();
}

/// Counts a slow-path entry on this thread and sweeps its caches when the idle
/// collector is due or another thread asked for flushes. Called at the end of slow
/// paths, when no cache is borrowed.
pub(crate) fn after_slow_path() {
    sweep_when_due(true);
}

/// Honours flush requests posted since this thread last looked (a `with_local` call's
/// exit: an event loop may never take a slow path).
pub(crate) fn honour_flush_requests() {
    sweep_when_due(false);
}

fn sweep_when_due(slow_path: bool) {
    let garbage = LOCAL.try_with(|t| {
        let mut idle_pass = false;
        if slow_path {
            let n = t.gc_clock.get() + 1;
            idle_pass = n >= GC_PERIOD;
            t.gc_clock.set(if idle_pass { 0 } else { n });
        }
        // Acquire pairs with `announce_flush_requests`' Release: a thread that sees the
        // new epoch also sees the flush requests and dead engines posted before it (with
        // Relaxed, a weak-memory CPU could skip them until the next idle pass).
        let epoch = FLUSH_EPOCH.load(Ordering::Acquire);
        if !idle_pass && epoch == t.seen_epoch.get() {
            return None;
        }
        t.seen_epoch.set(epoch);
        let mut garbage = Garbage::default();
        // SAFETY: this thread's table; callers hold no borrow of it or of a cache.
        unsafe { t.sweep(idle_pass, &mut garbage) };
        Some(garbage)
    });
    if let Ok(Some(garbage)) = garbage {
        garbage.release();
    }
}

/// Retires this thread's cache for `engine` (its magazines go to the depot) and frees
/// its table entry for reuse. Returns the number of objects released to the backing
/// allocator (what the depot's budget did not take).
pub(crate) fn uninstall(engine: &Engine) -> usize {
    let mut garbage = Garbage::default();
    let _ = LOCAL.try_with(|t| {
        let slot = engine.slot() as usize;
        // SAFETY: this thread's table; no reference into it is live.
        unsafe {
            let c = t.cache(slot);
            if !c.is_null() && ThreadCache::instance(c) == engine.instance() {
                let fast = t.fast();
                t.with_rest(|rest| rest.retire(fast, slot, &mut garbage));
            }
        }
    });
    garbage.release()
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

#[cfg(all(test, not(proxalloc_loom)))]
mod tests {
    use super::*;

    /// The fast paths touch the owned part and the `allocs`/`frees` counters: one line.
    #[test]
    fn fast_path_fields_share_one_cache_line() {
        let c = ThreadCache::new(EMPTY);
        let base = std::ptr::addr_of!(c) as usize;
        let frees_end = std::ptr::addr_of!(c.counters.frees) as usize + 8;
        assert_eq!(std::mem::align_of::<ThreadCache>(), 64);
        assert!(
            frees_end - base <= 64,
            "counters end at byte {}",
            frees_end - base
        );
    }
}
