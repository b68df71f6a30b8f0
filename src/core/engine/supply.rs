//! The exchange rules' supplies for an engine's owners: a thread cache's
//! (its stash and kept empties, then the depot), and the depot as the supply of owners
//! no thread owns (CPUs' caches, the spare magazine).

use super::Engine;
use crate::core::depot::Eviction;
use crate::core::exchange::{Evictions, SharedSupply, Supply};
use crate::core::magazine::Magazine;
use crate::core::thread_cache::Owner;

/// A thread cache's supply: its stash and kept empties first, then the depot (a refill
/// from the depot grows the stash; a full magazine the stash's grant cannot take is a
/// spill).
pub(super) struct ThreadSupply<'e> {
    pub(super) engine: &'e Engine,
    pub(super) c: Owner<'e>,
}

impl<'e> Supply<'e> for ThreadSupply<'e> {
    fn full(&self) -> Option<&'e Magazine> {
        let (e, c) = (self.engine, self.c);
        // SAFETY: stash indices name descriptors of this engine's table.
        if let Some(full) = c.stash_pop(|i| unsafe { e.depot.magazine(i) }) {
            return Some(full);
        }
        let full = e.depot.take_full()?;
        c.counters.refills.bump(1);
        e.grow(c);
        Some(full)
    }

    fn empty(&self) -> Option<&'e Magazine> {
        let (e, c) = (self.engine, self.c);
        // SAFETY: kept empties are descriptors of this engine's table.
        c.take_empty(|i| unsafe { e.depot.magazine(i) })
            .or_else(|| e.depot.take_empty())
    }

    fn give_empty(&self, mag: &'e Magazine) {
        let (e, c) = (self.engine, self.c);
        // Kept for the stash's next fill, or to the depot.
        if !c.keep_empty(mag, e.stash_capacity(c)) {
            e.put_empty(c, mag);
        }
    }

    fn give_full(&self, mag: &'e Magazine) -> Option<Eviction> {
        let (e, c) = (self.engine, self.c);
        if c.stash_push_within_grant(mag, e.magazine_bytes) {
            return None;
        }
        c.note_spill();
        e.put(c, mag)
    }
}

/// The supply of magazines no thread cache owns (CPUs' caches, the spare magazine):
/// the depot, counted on the engine's own counters.
#[derive(Clone, Copy)]
pub(crate) struct SharedDepot<'e>(pub(crate) &'e Engine);

impl<'e> Supply<'e> for SharedDepot<'e> {
    fn full(&self) -> Option<&'e Magazine> {
        let full = self.0.depot.take_full()?;
        self.0.retired.refills.add_shared(1);
        Some(full)
    }

    fn empty(&self) -> Option<&'e Magazine> {
        self.0.depot.take_empty()
    }

    fn give_empty(&self, mag: &'e Magazine) {
        let evicted = self.give_full(mag);
        debug_assert!(evicted.is_none(), "an empty magazine is never evicted");
    }

    fn give_full(&self, mag: &'e Magazine) -> Option<Eviction> {
        let (eviction, spills, overflows) = self.0.put_uncounted(mag);
        if spills > 0 {
            self.0.retired.spills.add_shared(spills);
        }
        if overflows > 0 {
            self.0.retired.overflows.add_shared(overflows);
        }
        eviction
    }
}

impl<'e> SharedSupply<'e> for SharedDepot<'e> {
    fn capacity(&self) -> usize {
        self.0.capacity()
    }

    fn release(&self, evictions: Evictions) -> usize {
        self.0.release(evictions)
    }

    fn count(&self, allocs: u64, frees: u64) {
        if allocs > 0 {
            self.0.retired.allocs.add_shared(allocs);
        }
        if frees > 0 {
            self.0.retired.frees.add_shared(frees);
        }
    }
}
