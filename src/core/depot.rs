//! The depot: one per allocator, shared by all threads. Two lock-free stacks of
//! magazines (full ones and empty ones) and a byte budget on the objects it holds.
//!
//! The stacks are [`MagazineStack`]s (Treiber stacks with a generation-tagged head: see
//! [`stack`](super::stack) for their ABA argument and orderings).
//!
//! # Orderings
//! - `cached` (objects, for stats) and the byte budget are only numbers: `Relaxed`
//!   throughout. A spill reserves bytes before it pushes and a refill releases them
//!   after it pops, so the budget's count is never below what the stacks hold and never
//!   above its limit.
//!
//! # One cache line
//! Both stack heads, the `cached` count and (for a depot with a budget of its own, as
//! every class allocator's is) the budget's words share one cache line: a magazine
//! exchange (a spill and an empty taken, or a refill and an empty given back) touches
//! the depot's line once, where with one line per word a thread refilling from what
//! another spilled missed on four (W4's producer and consumer do one exchange each per
//! batch). A depot whose budget is shared (a block source's classes) keeps it apart,
//! and then counts `cached` itself; with a budget of its own, `cached` is the budget's
//! bytes over each object's charge, so a spill or a refill is two read-modify-writes,
//! not three.

use std::ptr::NonNull;

use crossbeam_utils::CachePadded;

use super::backing::Backing;
use super::budget::{BudgetCount, ByteBudget};
use super::magazine::{cached_bytes, Magazine, MagazineTable, NIL};
use super::stack::{for_each_in_chain, MagazineStack};
use crate::sync::{Arc, AtomicUsize, Ordering};

/// Where [`Depot::put`] put a magazine.
#[derive(Debug)]
#[must_use = "an eviction holds objects that must be released with `Depot::evict`"]
pub enum Put {
    /// It was empty: onto the empty stack.
    Empty,
    /// Its objects fit the budget: onto the full stack (a spill).
    Cached,
    /// Not all of its objects fit the budget: the magazine comes back to the caller, to
    /// be finished with [`Depot::evict`] once the caller's cache is consistent and it
    /// holds no lock (releasing objects may run a recycling allocator's destructors,
    /// which may re-enter any allocator).
    Evicted(Eviction),
}

/// A magazine handed back by [`Depot::put`]: its first `keep` objects are charged
/// to the budget and go to the full stack; the rest go back to the backing allocator.
#[derive(Debug)]
#[must_use = "an eviction holds objects that must be released with `Depot::evict`"]
pub struct Eviction {
    mag: NonNull<Magazine>,
    keep: usize,
}

impl Eviction {
    /// Whether some of the objects stay cached (a partial spill).
    pub fn keeps_some(&self) -> bool {
        self.keep > 0
    }

    /// Makes the eviction's magazine the end of a chain of evictions: the count to keep
    /// goes into the magazine, its link to [`NIL`]. The caller links it after the
    /// chain's previous end, and finishes the chain with [`Depot::evict_chain`].
    pub fn end_chain(self) -> NonNull<Magazine> {
        let Eviction { mag, keep } = self;
        // SAFETY: an eviction owns its magazine (see `Depot::put`).
        let m = unsafe { mag.as_ref() };
        // SAFETY: as above.
        unsafe { m.with_rounds(|r| r.keep = keep) };
        // Owned, so nobody follows this link but the chain's holder; a thread with a
        // stale depot head may still read it, hence the atomic.
        m.next.store(NIL, Ordering::Relaxed);
        mag
    }
}

/// The words of a depot that every thread's exchange touches, on one cache line.
#[derive(Debug)]
struct Line {
    full: MagazineStack,
    empty: MagazineStack,
    /// Objects on the full stack (an upper bound while a pop is in flight; for stats),
    /// counted only when the budget is shared (see [`Depot::cached_objects`]).
    cached: AtomicUsize,
    /// The budget, when the depot has one of its own.
    own_budget: BudgetCount,
}

/// The shared level of one allocator.
#[derive(Debug)]
pub struct Depot {
    table: MagazineTable,
    line: CachePadded<Line>,
    /// A budget the full stack's objects are charged to together with other depots' (a
    /// pool block source's classes share one `max_free`); `None`: the depot's own, on
    /// its line.
    shared_budget: Option<Arc<ByteBudget>>,
    /// Bytes charged to the budget per cached object.
    charge: usize,
    backing: Backing,
    /// The fewest objects the full stack held since [`trim_cold`](Self::trim_cold) last
    /// ran (or since the depot was made: 0). The magazines at the bottom of the stack that
    /// hold that many were not taken in the interval (the stack is LIFO). A hint, so std
    /// even under loom: nothing is published through it, and a lost update only keeps or
    /// releases one interval's worth more.
    low_water: crate::sync::process::AtomicU64,
}

/// The budget a [`Depot`] charges its objects to.
#[derive(Debug)]
pub enum DepotBudget {
    /// Its own, of this many bytes.
    Own(usize),
    /// One shared with other depots.
    Shared(Arc<ByteBudget>),
}

const _: () = assert!(
    std::mem::size_of::<Line>() <= 64,
    "a depot's line outgrew one"
);

impl Depot {
    /// A depot for objects from `backing`, `capacity` objects per magazine, whose cached
    /// objects are charged to `budget` (each with its slot: [`cached_bytes`]), with
    /// `generation_bits`-wide stack generations.
    pub fn new(
        backing: Backing,
        capacity: usize,
        budget: DepotBudget,
        generation_bits: u32,
    ) -> Self {
        let (own, shared_budget) = match budget {
            DepotBudget::Own(limit) => (limit, None),
            DepotBudget::Shared(b) => (0, Some(b)),
        };
        Depot {
            table: MagazineTable::new(capacity),
            line: CachePadded::new(Line {
                full: MagazineStack::new(generation_bits),
                empty: MagazineStack::new(generation_bits),
                cached: AtomicUsize::new(0),
                own_budget: BudgetCount::new(own),
            }),
            shared_budget,
            charge: cached_bytes(backing.object_size()),
            backing,
            low_water: crate::sync::process::AtomicU64::new(0),
        }
    }

    /// Charges each cached object its own bytes only, not its slot: for a budget shared
    /// with memory that has no slots (a block source's `max_free`, which its large-block
    /// cache also draws on, counts block bytes as APR's does).
    pub fn charging_object_bytes_only(mut self) -> Self {
        debug_assert!(
            self.shared_budget.is_some(),
            "an own budget derives its count of objects from the charge"
        );
        self.charge = self.backing.object_size();
        self
    }

    /// The budget the full stack's objects are charged to.
    fn budget(&self) -> &BudgetCount {
        match &self.shared_budget {
            Some(b) => b,
            None => &self.line.own_budget,
        }
    }

    /// Counts `n` objects onto the full stack (before the push, so a concurrent pop
    /// cannot subtract first). With an own budget the budget's bytes are the count.
    fn count_cached(&self, n: usize) {
        if self.shared_budget.is_some() {
            self.line.cached.fetch_add(n, Ordering::Relaxed);
        }
    }

    /// Where this depot's objects come from and go back to.
    pub fn backing(&self) -> &Backing {
        &self.backing
    }

    /// The descriptor with `index`.
    ///
    /// # Safety
    /// `index` names a magazine of this depot's table, reached from one its caller owns
    /// (a stash or kept chain).
    pub unsafe fn magazine(&self, index: u32) -> &Magazine {
        // SAFETY: forwarded.
        unsafe { self.table.get(index) }
    }

    /// Walks a chain of this depot's magazines that the caller owns, from the index of
    /// its top ([`NIL`]: empty), as a taken stash is (see [`for_each_in_chain`]).
    ///
    /// # Safety
    /// The chain links magazines of this depot's table, and the caller owns it.
    pub unsafe fn for_each_in_stash<'t>(&'t self, top: u32, f: impl FnMut(&'t Magazine)) {
        if top != NIL {
            // SAFETY: forwarded.
            let first = unsafe { self.magazine(top) };
            for_each_in_chain(&self.table, first, f);
        }
    }

    /// Objects per full magazine.
    pub fn capacity(&self) -> usize {
        self.table.capacity()
    }

    /// Free objects held on the full stack now (an upper bound while a spill or a
    /// refill is in flight).
    pub fn cached_objects(&self) -> usize {
        match self.shared_budget {
            Some(_) => self.line.cached.load(Ordering::Relaxed),
            // Every charge of an own budget is for objects on the full stack (`charge`
            // is at least a slot's bytes, never 0, for an own budget).
            None => self.line.own_budget.used() / self.charge,
        }
    }

    /// A magazine holding objects, owned by the caller, or `None` if the depot has none.
    pub fn take_full(&self) -> Option<&Magazine> {
        let mag = self.line.full.pop(&self.table)?;
        // SAFETY: popped, so owned here.
        let n = unsafe { mag.len() };
        self.uncharge(n);
        self.note_low_water();
        Some(mag)
    }

    /// Lowers the low-water mark to the objects on the full stack now, if that is lower.
    fn note_low_water(&self) {
        // Relaxed loads and a rare store, not a `fetch_min`: the store comes only at a
        // new minimum of the interval, and the mark's line is one no exchange writes
        // otherwise. A mark at 0 (where it stays unless `trim_idle` is used) can go no
        // lower, so the stack's count is not even read.
        let low = self.low_water.load(Ordering::Relaxed);
        if low == 0 {
            return;
        }
        let now = self.cached_objects() as u64;
        if now < low {
            self.low_water.store(now, Ordering::Relaxed);
        }
    }

    /// Gives back the objects that no thread took from the full stack since the last
    /// call (its bottom magazines, as many objects as its low-water mark), keeps the rest,
    /// and starts the next interval. Returns the number of objects released.
    pub fn trim_cold(&self) -> usize {
        // Taken (0 left in its place): a second caller meanwhile finds no cold part,
        // instead of this interval's mark against what this call is about to push back.
        let cold = self.low_water.swap(0, Ordering::Relaxed) as usize;
        let Some(first) = self.line.full.take_all(&self.table) else {
            return 0;
        };
        let mut total = 0;
        for_each_in_chain(&self.table, first, |mag| {
            // SAFETY: the detached chain is owned here.
            total += unsafe { mag.len() };
        });
        // The warm part, from the top: what was pushed after the interval's low point.
        let warm = total.saturating_sub(cold);
        let mut kept = 0;
        let mut last_kept = None;
        for_each_in_chain(&self.table, first, |mag| {
            if kept < warm {
                // SAFETY: owned here.
                kept += unsafe { mag.len() };
                last_kept = Some(mag);
            }
        });
        let cold_first = match last_kept {
            None => Some(first),
            Some(last) => {
                let next = last.next.load(Ordering::Relaxed);
                // The warm magazines go back before any object is released (releasing
                // may run a recycling allocator's destructors, which may allocate).
                self.line.full.push_chain(first, last);
                // SAFETY: a link of the owned chain names a descriptor of this table.
                (next != NIL).then(|| unsafe { self.table.get(next) })
            }
        };
        // SAFETY: the cold part of the detached chain is owned here.
        let released = cold_first.map_or(0, |first| unsafe { self.release_chain(first) });
        self.low_water
            .store(self.cached_objects() as u64, Ordering::Relaxed);
        released
    }

    /// What `n` cached objects are charged to the budget.
    fn bytes(&self, n: usize) -> usize {
        n * self.charge
    }

    /// Accounts for `n` objects leaving the full stack.
    fn uncharge(&self, n: usize) {
        if self.shared_budget.is_some() {
            self.line.cached.fetch_sub(n, Ordering::Relaxed);
        }
        self.budget().release(self.bytes(n));
    }

    /// Hands over a magazine: an empty one goes to the empty stack, one holding objects
    /// to the full stack if the budget takes all of them. Otherwise the budget is
    /// charged for as many as fit and the magazine comes back as an [`Eviction`], which
    /// the caller finishes with [`evict`](Self::evict). No object is destroyed here.
    ///
    /// # Safety
    /// The caller owns `mag`; it must not use it afterwards (except through the
    /// eviction).
    pub unsafe fn put(&self, mag: &Magazine) -> Put {
        // SAFETY: owned by the caller.
        let n = unsafe { mag.len() };
        if n == 0 {
            self.line.empty.push(mag);
            return Put::Empty;
        }
        let keep = self.budget().reserve_up_to(n, self.charge);
        if keep < n {
            return Put::Evicted(Eviction {
                mag: NonNull::from(mag),
                keep,
            });
        }
        self.count_cached(n);
        self.line.full.push(mag);
        Put::Cached
    }

    /// Finishes an eviction: the objects the budget did not take go back to the backing
    /// allocator (running destructors, for a recycling allocator), and the magazine goes
    /// to the full stack with the rest, or to the empty stack. Returns the number of
    /// objects released.
    ///
    /// # Safety
    /// `eviction` came from this depot ([`put`](Self::put) or
    /// [`evict_all`](Self::evict_all)).
    pub unsafe fn evict(&self, eviction: Eviction) -> usize {
        let Eviction { mag, keep } = eviction;
        // SAFETY: a descriptor of this depot's table, per the contract.
        let mag = unsafe { mag.as_ref() };
        // SAFETY: an eviction owns its magazine; `slots[keep..len]` are objects of
        // `backing`, not charged to the budget.
        let released = unsafe {
            mag.with_rounds(|r| {
                let n = r.len - keep;
                self.backing
                    .dealloc_all(std::slice::from_raw_parts(r.slots.add(keep), n));
                r.len = keep;
                n
            })
        };
        if keep > 0 {
            self.count_cached(keep);
            self.line.full.push(mag);
        } else {
            self.line.empty.push(mag);
        }
        released
    }

    /// Finishes every eviction on a chain made with [`Eviction::end_chain`], first to
    /// last, as [`evict`](Self::evict) does. Returns the number of objects released.
    ///
    /// # Safety
    /// `first` is [`NIL`] or the first magazine of such a chain of this depot's
    /// evictions, owned by the caller.
    pub unsafe fn evict_chain(&self, first: u32) -> usize {
        if first == NIL {
            return 0;
        }
        let mut released = 0;
        // SAFETY: per the contract, a descriptor of this depot's table.
        let first = unsafe { self.table.get(first) };
        for_each_in_chain(&self.table, first, |mag| {
            // SAFETY: each magazine on the chain is an eviction the caller owns, with its
            // count to keep recorded by `end_chain` (its link was read before this).
            released += unsafe {
                let keep = mag.with_rounds(|r| r.keep);
                self.evict(Eviction {
                    mag: NonNull::from(mag),
                    keep,
                })
            };
        });
        released
    }

    /// An empty magazine with slot storage, owned by the caller: a recycled one, or a new
    /// one. `None` only when memory for a new magazine cannot be had.
    pub fn take_empty(&self) -> Option<&Magazine> {
        let mag = match self.line.empty.pop(&self.table) {
            Some(mag) => mag,
            None => self.table.create_descriptor()?,
        };
        // SAFETY: popped or just created, so owned here.
        if unsafe { self.table.ensure_slots(mag) } {
            Some(mag)
        } else {
            // Kept on the empty stack (whose magazines may lack storage), so the next
            // attempt retries its storage instead of claiming another index.
            self.line.empty.push(mag);
            None
        }
    }

    /// An eviction of every object in `mag`, charged to nothing (for an allocator that
    /// is gone, whose depot keeps nothing).
    ///
    /// # Safety
    /// The caller owns `mag`, and gives it up.
    pub unsafe fn evict_all(&self, mag: &Magazine) -> Eviction {
        Eviction {
            mag: NonNull::from(mag),
            keep: 0,
        }
    }

    /// Returns every object in `mag` to the backing allocator.
    ///
    /// # Safety
    /// The caller owns `mag`.
    pub unsafe fn release_objects(&self, mag: &Magazine) {
        // SAFETY: owned by the caller; `slots[..len]` are objects from `backing`.
        unsafe {
            mag.with_rounds(|r| {
                if r.len > 0 {
                    self.backing
                        .dealloc_all(std::slice::from_raw_parts(r.slots, r.len));
                    r.len = 0;
                }
            })
        }
    }

    /// Gives the objects of a chain of full magazines taken off the full stack back to
    /// the backing allocator, and the magazines to the empty stack. Returns the number
    /// of objects released.
    ///
    /// # Safety
    /// The caller owns the chain from `first` (detached from the full stack, its
    /// objects still charged to the budget), and gives it up.
    unsafe fn release_chain(&self, first: &Magazine) -> usize {
        let mut released = 0;
        let mut last = first;
        for_each_in_chain(&self.table, first, |mag| {
            // SAFETY: owned here, per the contract.
            let n = unsafe { mag.len() };
            self.uncharge(n);
            // SAFETY: as above.
            unsafe { self.release_objects(mag) };
            released += n;
            last = mag;
        });
        self.line.empty.push_chain(first, last);
        released
    }

    /// Gives every cached object back to the backing allocator, and frees the slot
    /// storage of every idle empty magazine. Returns the number of objects released.
    /// Magazines that threads push meanwhile stay cached.
    pub fn trim(&self) -> usize {
        self.low_water.store(0, Ordering::Relaxed);
        let released = match self.line.full.take_all(&self.table) {
            // SAFETY: the detached chain is owned here.
            Some(first) => unsafe { self.release_chain(first) },
            None => 0,
        };
        if let Some(first) = self.line.empty.take_all(&self.table) {
            let mut last = first;
            for_each_in_chain(&self.table, first, |mag| {
                // SAFETY: the detached chain is owned here, and its magazines are empty.
                unsafe { self.table.release_slots(mag) };
                last = mag;
            });
            self.line.empty.push_chain(first, last);
        }
        released
    }
}

impl Drop for Depot {
    /// Releases the objects still on the full stack. Magazines that thread caches held
    /// are not here: every cache holds its allocator's engine alive, so by the time the
    /// depot drops, each cache has given its magazines back or released their objects
    /// (see `engine`); a trimmer holds the engine alive too.
    fn drop(&mut self) {
        self.trim();
    }
}

#[cfg(all(test, not(proxalloc_loom)))]
#[path = "tests/depot.rs"]
mod tests;
