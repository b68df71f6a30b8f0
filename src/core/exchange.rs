//! The magazine exchange rules, written once for both kinds of owner of a loaded and a
//! previous magazine: a thread cache ([`ThreadCache`](super::thread_cache::ThreadCache))
//! and a CPU's cache ([`percpu`](super::percpu)).
//!
//! Bonwick's rules, on a [`MagazinePair`]: when the loaded magazine is empty (an
//! allocation) or full (a free), swap it with the previous one if that helps; otherwise
//! trade with the supply, a full magazine for the empty previous one, or an empty
//! magazine for the full previous one, and the loaded magazine becomes the previous. Two consecutive exchanges are then at
//! least a magazine's worth of operations apart, whatever the pattern. What differs
//! between the owners is only where magazines come from and go ([`Supply`]): a thread
//! cache tries its stash and its kept empties before the depot and grows its stash on
//! demand; a CPU's cache trades with the depot directly.
//!
//! The rules run no user code: what the depot's budget refuses comes back as
//! [`Evictions`], released by the caller once the owner is consistent again.

use std::ptr::NonNull;

use super::depot::{Depot, Eviction};
use super::magazine::{Magazine, NIL};
use crate::sync::Ordering;

/// A loaded and a previous magazine and their capacity: the one type both kinds of owner
/// keep their magazines in while the rules run. A CPU's cache is unpacked into one when a
/// thread holds it ([`percpu`](super::percpu)); a thread cache packs its loaded magazine
/// back into one for its slow path (its fast paths keep it unpacked:
/// [`OwnerPart`](super::thread_cache::OwnerPart)). The magazines are the caller's for as
/// long as it holds the pair.
#[derive(Debug)]
pub(crate) struct MagazinePair<'m> {
    pub(crate) loaded: Option<&'m Magazine>,
    pub(crate) previous: Option<&'m Magazine>,
    /// Capacity of each magazine.
    pub(crate) capacity: usize,
}

/// Where one owner's magazines come from and go.
pub(crate) trait Supply<'m> {
    /// A full magazine (counted as a refill when it comes from the depot), or `None`.
    fn full(&self) -> Option<&'m Magazine>;
    /// An empty magazine with slot storage, or `None` (no memory for one).
    fn empty(&self) -> Option<&'m Magazine>;
    /// Takes back an empty magazine (never evicted).
    fn give_empty(&self, mag: &'m Magazine);
    /// Takes back a full magazine; what the depot's budget refuses comes back.
    fn give_full(&self, mag: &'m Magazine) -> Option<Eviction>;
}

/// A [`Supply`] shared by every thread (CPUs' caches, the spare magazine): it also
/// releases evictions and counts the operations of owners that have no counters.
pub(crate) trait SharedSupply<'m>: Supply<'m> {
    /// Capacity of each magazine.
    fn capacity(&self) -> usize;
    /// Releases evicted objects (may run user code: call with nothing held).
    fn release(&self, evictions: Evictions) -> usize;
    /// Counts allocations and frees made by an owner without counters of its own.
    fn count(&self, allocs: u64, frees: u64);
}

impl<'m> MagazinePair<'m> {
    /// Makes the loaded magazine non-empty, for an allocation that found it empty: swap
    /// with a non-empty previous, or trade the empty previous for a full one. False when
    /// the supply has no full magazine.
    #[inline]
    pub(crate) fn refill(&mut self, supply: &impl Supply<'m>) -> bool {
        if self.previous_len().is_some_and(|n| n > 0) {
            self.swap();
            return true;
        }
        let Some(full) = supply.full() else {
            return false;
        };
        // The previous magazine is empty (else it would have been swapped in).
        if let Some(previous) = self.previous.take() {
            supply.give_empty(previous);
        }
        self.rotate(full);
        true
    }

    /// Makes room in the loaded magazine, for a free that found it full: swap with a
    /// non-full previous, or trade the full previous for an empty one. `None` when the
    /// supply has no empty magazine; otherwise what the depot's budget refused.
    #[inline]
    pub(crate) fn make_room(&mut self, supply: &impl Supply<'m>) -> Option<Evictions> {
        if self.previous_len().is_some_and(|n| n < self.capacity) {
            self.swap();
            return Some(Evictions::default());
        }
        let empty = supply.empty()?;
        let mut evictions = Evictions::default();
        // The previous magazine is full (else it would have been swapped in).
        if let Some(previous) = self.previous.take() {
            evictions.push(supply.give_full(previous));
        }
        self.rotate(empty);
        Some(evictions)
    }

    /// Objects in the loaded magazine (0 when none is loaded).
    pub(crate) fn loaded_len(&self) -> usize {
        // SAFETY: the holder's magazine.
        self.loaded.map_or(0, |m| unsafe { m.len() })
    }

    /// Objects in the previous magazine, if there is one.
    fn previous_len(&self) -> Option<usize> {
        // SAFETY: the holder's magazine.
        self.previous.map(|m| unsafe { m.len() })
    }

    /// Swaps the loaded and the previous magazine (either may be absent).
    pub(crate) fn swap(&mut self) {
        std::mem::swap(&mut self.loaded, &mut self.previous);
    }

    /// The loaded magazine (if any) becomes the previous one, of which there is none,
    /// and `mag` (with slot storage) is loaded.
    fn rotate(&mut self, mag: &'m Magazine) {
        debug_assert!(self.previous.is_none(), "a previous magazine would be lost");
        self.previous = self.loaded.replace(mag);
    }

    /// Takes both magazines out (loaded first), leaving the pair empty.
    pub(crate) fn take_both(&mut self) -> impl Iterator<Item = &'m Magazine> {
        [self.loaded.take(), self.previous.take()]
            .into_iter()
            .flatten()
    }
}

/// Evicted magazines, released together once nothing is borrowed: a chain of the
/// magazines themselves, in the order evicted, linked through their `next` words (an
/// evicted magazine is its evicter's, as one about to be pushed is), each holding its
/// count to keep. Collecting evictions never allocates, so no free, flush, trim or
/// thread exit can fail for want of memory here.
#[derive(Debug)]
#[must_use = "evicted objects must be released with `Engine::release`"]
pub(crate) struct Evictions {
    /// Index of the first evicted magazine, or [`NIL`].
    first: u32,
    /// The last one, whose link the next eviction goes into.
    last: Option<NonNull<Magazine>>,
}

impl Default for Evictions {
    fn default() -> Self {
        Evictions {
            first: NIL,
            last: None,
        }
    }
}

impl Evictions {
    /// Adds an eviction (if any) to the chain.
    pub(crate) fn push(&mut self, eviction: Option<Eviction>) {
        let Some(eviction) = eviction else {
            return;
        };
        let mag = eviction.end_chain();
        // SAFETY: the evictions own every magazine on their chain, `mag` included.
        let index = unsafe { mag.as_ref() }.index;
        match self.last {
            // SAFETY: as above.
            Some(last) => unsafe { last.as_ref() }
                .next
                .store(index, Ordering::Relaxed),
            None => self.first = index,
        }
        self.last = Some(mag);
    }

    /// Releases the evicted objects to the backing allocator of `depot`, whose evictions
    /// these are (running destructors, for a recycling allocator): call with no lock held
    /// and no cache borrowed. Returns the number of objects released.
    pub(crate) fn release(self, depot: &Depot) -> usize {
        // SAFETY: a chain of `depot`'s evictions, owned here.
        unsafe { depot.evict_chain(self.first) }
    }
}
