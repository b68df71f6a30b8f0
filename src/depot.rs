//! The depot: one per allocator, shared by all threads. Two lock-free stacks of
//! magazines (full ones and empty ones) and a byte budget on the objects it holds.
//!
//! # The stacks and ABA
//! Each stack is a Treiber stack of magazine *indices*. The head is one `AtomicU64`
//! packing `(generation << 32) | index`; every successful pop advances the generation
//! (masked to [`Config::generation_bits`](crate::Config)). A pop that read head `(g, A)`
//! and `A.next = B` can only succeed if the head is still `(g, A)`; for the head to get
//! back to `A` after `A` left, `A` must have been popped, which advanced the generation,
//! so the stale pop fails (until the generation wraps: 2^32 pops by default, while one
//! thread sits between two instructions). Pushes need no generation step: a push's CAS
//! only asserts the head it links to, and that is right whenever the CAS succeeds.
//!
//! Descriptors are immortal (see [`magazine`](crate::magazine)), so a stale `next`
//! read hits valid memory, and `next` is atomic, so the read is not a data race.
//!
//! # Orderings
//! - push: the owner writes the rounds and `next`, then CASes the head with `Release`.
//! - pop: loads the head with `Acquire` (so `next` of the head is at least as new as the
//!   push that published it), reads `next` `Relaxed`, and CASes with `Acquire`, which
//!   synchronises with the push that published the magazine (and, because every head
//!   update is a read-modify-write, with every earlier push in its release sequence):
//!   the popper then sees the rounds as the pusher left them.
//! - `cached` (objects, for stats) and the byte budget are only numbers: `Relaxed`
//!   throughout. A spill reserves bytes before it pushes and a refill releases them
//!   after it pops, so the budget's count is never below what the stacks hold and never
//!   above its limit.

use crossbeam_utils::CachePadded;

use crate::backing::Backing;
use crate::budget::ByteBudget;
use crate::magazine::{Magazine, MagazineTable, NIL};
use crate::sync::{Arc, AtomicU64, AtomicUsize, Ordering};

/// A lock-free stack of magazines, with a generation-tagged head.
#[derive(Debug)]
pub struct MagazineStack {
    head: CachePadded<AtomicU64>,
    generation_mask: u32,
}

#[inline]
fn pack(generation: u32, index: u32) -> u64 {
    (u64::from(generation) << 32) | u64::from(index)
}

#[inline]
fn unpack(head: u64) -> (u32, u32) {
    ((head >> 32) as u32, head as u32)
}

impl MagazineStack {
    /// An empty stack whose generation field is `generation_bits` wide (0..=32).
    pub fn new(generation_bits: u32) -> Self {
        let generation_mask = match generation_bits {
            0 => 0,
            b if b >= 32 => u32::MAX,
            b => (1u32 << b) - 1,
        };
        MagazineStack {
            head: CachePadded::new(AtomicU64::new(pack(0, NIL))),
            generation_mask,
        }
    }

    /// Pushes `mag`, which the caller owns; ownership passes to the stack.
    pub fn push(&self, mag: &Magazine) {
        self.push_chain(mag, mag);
    }

    /// Pushes the chain `first ..= last` (linked through `next`, all owned by the caller)
    /// with one CAS.
    pub fn push_chain(&self, first: &Magazine, last: &Magazine) {
        let mut head = self.head.load(Ordering::Relaxed);
        loop {
            let (generation, top) = unpack(head);
            last.next.store(top, Ordering::Relaxed);
            // Release: the rounds and links written before this CAS become visible to
            // whoever pops `first`.
            match self.head.compare_exchange_weak(
                head,
                pack(generation, first.index),
                Ordering::Release,
                Ordering::Relaxed,
            ) {
                Ok(_) => return,
                Err(now) => head = now,
            }
        }
    }

    /// Pops a magazine; the caller owns it afterwards.
    pub fn pop<'t>(&self, table: &'t MagazineTable) -> Option<&'t Magazine> {
        // May read a stale link if the top was popped meanwhile; then the generation
        // has moved and the CAS fails.
        self.detach(table, |top| top.next.load(Ordering::Relaxed))
    }

    /// Detaches the whole stack with one CAS; the caller owns the returned chain (walk
    /// it with `next`, ending at [`NIL`]).
    pub fn take_all<'t>(&self, table: &'t MagazineTable) -> Option<&'t Magazine> {
        self.detach(table, |_| NIL)
    }

    /// Replaces the top magazine with `rest(top)` (its link, or [`NIL`] for everything),
    /// advancing the generation; returns the old top, now owned by the caller.
    #[inline]
    fn detach<'t>(
        &self,
        table: &'t MagazineTable,
        rest: impl Fn(&Magazine) -> u32,
    ) -> Option<&'t Magazine> {
        let mut head = self.head.load(Ordering::Acquire);
        loop {
            let (generation, top) = unpack(head);
            if top == NIL {
                return None;
            }
            // SAFETY: `top` came from a push of a descriptor created in `table`.
            let mag = unsafe { table.get(top) };
            match self.head.compare_exchange_weak(
                head,
                pack(generation.wrapping_add(1) & self.generation_mask, rest(mag)),
                Ordering::Acquire,
                Ordering::Acquire,
            ) {
                Ok(_) => return Some(mag),
                Err(now) => head = now,
            }
        }
    }
}

/// Walks a chain owned by the caller, yielding each magazine after reading its link (so
/// the callback may push it elsewhere, which rewrites the link).
pub fn for_each_in_chain<'t>(
    table: &'t MagazineTable,
    first: &'t Magazine,
    mut f: impl FnMut(&'t Magazine),
) {
    let mut cur = Some(first);
    while let Some(mag) = cur {
        let next = mag.next.load(Ordering::Relaxed);
        // SAFETY: links in an owned chain name descriptors of `table`.
        cur = (next != NIL).then(|| unsafe { table.get(next) });
        f(mag);
    }
}

/// Where [`Depot::put_full`] put a magazine.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Put {
    /// It was empty: onto the empty stack.
    Empty,
    /// Its objects fit the budget: onto the full stack (a spill).
    Cached,
    /// Some of its objects fit: those stay on the full stack, the rest went back to the
    /// backing allocator.
    Partial,
    /// Its objects did not fit: they went back to the backing allocator, the magazine
    /// onto the empty stack.
    Overflowed,
}

/// The shared level of one allocator.
#[derive(Debug)]
pub struct Depot {
    table: MagazineTable,
    full: MagazineStack,
    empty: MagazineStack,
    /// Objects on the full stack (an upper bound while a pop is in flight; for stats).
    cached: CachePadded<AtomicUsize>,
    /// The byte budget the full stack's objects are charged to (possibly shared with
    /// other depots, as a pool block source's classes share one `max_free`).
    budget: Arc<ByteBudget>,
    backing: Backing,
}

impl Depot {
    /// A depot for objects from `backing`, `capacity` objects per magazine, whose cached
    /// objects are charged to `budget`, with `generation_bits`-wide stack generations.
    pub fn new(
        backing: Backing,
        capacity: usize,
        budget: Arc<ByteBudget>,
        generation_bits: u32,
    ) -> Self {
        Depot {
            table: MagazineTable::new(capacity),
            full: MagazineStack::new(generation_bits),
            empty: MagazineStack::new(generation_bits),
            cached: CachePadded::new(AtomicUsize::new(0)),
            budget,
            backing,
        }
    }

    /// Where this depot's objects come from and go back to.
    pub fn backing(&self) -> &Backing {
        &self.backing
    }

    /// Objects per full magazine.
    pub fn capacity(&self) -> usize {
        self.table.capacity()
    }

    /// Free objects held on the full stack now.
    pub fn cached_objects(&self) -> usize {
        self.cached.load(Ordering::Relaxed)
    }

    /// A magazine holding objects, owned by the caller, or `None` if the depot has none.
    pub fn take_full(&self) -> Option<&Magazine> {
        let mag = self.full.pop(&self.table)?;
        // SAFETY: popped, so owned here.
        let n = unsafe { mag.len() };
        self.uncharge(n);
        Some(mag)
    }

    /// Bytes of `n` objects.
    fn bytes(&self, n: usize) -> usize {
        n * self.backing.object_size()
    }

    /// Accounts for `n` objects leaving the full stack.
    fn uncharge(&self, n: usize) {
        self.cached.fetch_sub(n, Ordering::Relaxed);
        self.budget.release(self.bytes(n));
    }

    /// Hands over a magazine: an empty one goes to the empty stack; one holding objects
    /// to the full stack with as many of them as the budget can take, the rest going back
    /// to the backing allocator (with none kept, the empty magazine goes to the empty
    /// stack).
    ///
    /// # Safety
    /// The caller owns `mag`; it must not use it afterwards.
    pub unsafe fn put_full(&self, mag: &Magazine) -> Put {
        // SAFETY: owned by the caller.
        let n = unsafe { mag.len() };
        if n == 0 {
            self.empty.push(mag);
            return Put::Empty;
        }
        let keep = self.budget.reserve_up_to(n, self.backing.object_size());
        if keep > 0 {
            if keep < n {
                // SAFETY: owned by the caller; `slots[keep..n]` are objects of `backing`.
                unsafe {
                    mag.with_rounds(|r| {
                        self.backing
                            .dealloc_all(std::slice::from_raw_parts(r.slots.add(keep), n - keep));
                        r.len = keep;
                    })
                };
            }
            // Counted before the push, so a concurrent pop cannot subtract first.
            self.cached.fetch_add(keep, Ordering::Relaxed);
            self.full.push(mag);
            if keep == n {
                Put::Cached
            } else {
                Put::Partial
            }
        } else {
            // SAFETY: owned by the caller.
            unsafe { self.release_objects(mag) };
            self.empty.push(mag);
            Put::Overflowed
        }
    }

    /// An empty magazine with slot storage, owned by the caller: a recycled one, or a new
    /// one. `None` only when memory for a new magazine cannot be had.
    pub fn take_empty(&self) -> Option<&Magazine> {
        match self.empty.pop(&self.table) {
            Some(mag) => {
                // SAFETY: popped, so owned here.
                if unsafe { self.table.ensure_slots(mag) } {
                    Some(mag)
                } else {
                    self.empty.push(mag);
                    None
                }
            }
            None => self.table.create(),
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

    /// Gives every cached object back to the backing allocator, and frees the slot
    /// storage of every idle empty magazine. Returns the number of objects released.
    /// Magazines that threads push meanwhile stay cached.
    pub fn trim(&self) -> usize {
        let mut released = 0;
        if let Some(first) = self.full.take_all(&self.table) {
            let mut last = first;
            for_each_in_chain(&self.table, first, |mag| {
                // SAFETY: the detached chain is owned here.
                let n = unsafe { mag.len() };
                self.uncharge(n);
                // SAFETY: owned here.
                unsafe { self.release_objects(mag) };
                released += n;
                last = mag;
            });
            self.empty.push_chain(first, last);
        }
        if let Some(first) = self.empty.take_all(&self.table) {
            let mut last = first;
            for_each_in_chain(&self.table, first, |mag| {
                // SAFETY: the detached chain is owned here, and its magazines are empty.
                unsafe { self.table.release_slots(mag) };
                last = mag;
            });
            self.empty.push_chain(first, last);
        }
        released
    }

    /// Returns every object in every magazine (on the stacks or still held by thread
    /// caches) to the backing allocator. The depot is unusable afterwards, except to be
    /// dropped.
    ///
    /// # Safety
    /// No other thread uses the depot or any of its magazines any more, and no thread
    /// cache will use its magazines again.
    pub unsafe fn release_everything(&self) {
        // SAFETY: exclusive use per the caller's contract.
        unsafe {
            self.table.for_each_magazine(|mag| {
                if mag.with_rounds(|r| !r.slots.is_null()) {
                    self.release_objects(mag);
                }
            });
        }
        self.uncharge(self.cached.load(Ordering::Relaxed));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::alloc::Layout;

    fn depot(capacity: usize, budget_objects: usize) -> Depot {
        Depot::new(
            Backing::new(Layout::new::<u64>(), None),
            capacity,
            Arc::new(ByteBudget::new(budget_objects * 8)),
            32,
        )
    }

    /// Fills a magazine from `depot` with fresh objects.
    fn filled(depot: &Depot, n: usize) -> &Magazine {
        let mag = depot.take_empty().unwrap();
        // SAFETY: owned here.
        unsafe {
            mag.with_rounds(|r| {
                for i in 0..n {
                    *r.slots.add(i) = depot.backing().alloc().unwrap().as_ptr();
                }
                r.len = n;
            })
        };
        mag
    }

    #[test]
    fn stack_is_lifo_and_conserves() {
        let table = MagazineTable::new(1);
        let stack = MagazineStack::new(32);
        let mags: Vec<_> = (0..5).map(|_| table.create().unwrap()).collect();
        for m in &mags {
            stack.push(m);
        }
        let popped: Vec<u32> = std::iter::from_fn(|| stack.pop(&table).map(|m| m.index)).collect();
        assert_eq!(popped, [4, 3, 2, 1, 0]);
        assert!(stack.take_all(&table).is_none());
    }

    #[test]
    fn generation_advances_on_pop_and_wraps_under_its_mask() {
        let table = MagazineTable::new(1);
        let stack = MagazineStack::new(2);
        let m = table.create().unwrap();
        for round in 1..=5u32 {
            stack.push(m);
            assert!(stack.pop(&table).is_some());
            let (generation, top) = unpack(stack.head.load(Ordering::Relaxed));
            assert_eq!((generation, top), (round & 3, NIL));
        }
    }

    #[test]
    fn budget_bounds_cached_objects_and_overflow_returns_to_backing() {
        let d = depot(4, 8);
        let puts: Vec<Put> = (0..3)
            .map(|_| {
                let m = filled(&d, 4);
                // SAFETY: owned.
                unsafe { d.put_full(m) }
            })
            .collect();
        assert_eq!(puts, [Put::Cached, Put::Cached, Put::Overflowed]);
        assert_eq!(d.cached_objects(), 8);
        assert_eq!(d.backing().frees(), 4);
        let m = d.take_full().unwrap();
        assert_eq!(d.cached_objects(), 4);
        // SAFETY: owned.
        unsafe {
            d.release_objects(m);
            d.put_full(m);
        }
        assert_eq!(d.trim(), 4);
        assert_eq!(d.cached_objects(), 0);
        assert_eq!(d.backing().allocs(), d.backing().frees());
    }

    #[test]
    fn trim_releases_storage_and_magazines_are_reused() {
        let d = depot(2, 100);
        let a = filled(&d, 2);
        let ai = a.index;
        // SAFETY: owned.
        unsafe { d.put_full(a) };
        d.trim();
        let b = d.take_empty().unwrap();
        assert_eq!(b.index, ai, "the trimmed magazine is recycled");
        // SAFETY: owned.
        assert!(unsafe { b.with_rounds(|r| !r.slots.is_null()) });
        // SAFETY: owned.
        unsafe { d.put_full(b) };
    }

    #[test]
    fn concurrent_spill_and_refill_conserve_objects() {
        let d = depot(4, 1 << 20);
        let rounds = if cfg!(miri) { 20 } else { 2000 };
        let taken: Vec<Vec<usize>> = std::thread::scope(|s| {
            let producers: Vec<_> = (0..2)
                .map(|_| {
                    s.spawn(|| {
                        for _ in 0..rounds {
                            let m = filled(&d, 4);
                            // SAFETY: owned.
                            unsafe { d.put_full(m) };
                        }
                    })
                })
                .collect();
            let consumers: Vec<_> = (0..2)
                .map(|_| {
                    s.spawn(|| {
                        let mut got = Vec::new();
                        for _ in 0..rounds {
                            if let Some(m) = d.take_full() {
                                // SAFETY: owned.
                                unsafe {
                                    m.with_rounds(|r| {
                                        got.extend((0..r.len).map(|i| *r.slots.add(i) as usize));
                                    });
                                    d.release_objects(m);
                                    d.put_full(m);
                                }
                            }
                        }
                        got
                    })
                })
                .collect();
            producers.into_iter().for_each(|p| p.join().unwrap());
            consumers.into_iter().map(|c| c.join().unwrap()).collect()
        });
        let consumed: usize = taken.iter().map(Vec::len).sum();
        let trimmed = d.trim();
        assert_eq!(
            consumed + trimmed,
            2 * rounds * 4,
            "objects lost or duplicated"
        );
        assert_eq!(d.backing().allocs(), d.backing().frees());
        assert_eq!(d.backing().allocs(), (2 * rounds * 4) as u64);
    }
}
