//! The statistics counters of a thread cache (and of an engine's retired caches and
//! shared owners): bumped by one thread, read by any.

use crate::sync::StatCounter;

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
    pub(crate) fn reset(&self) {
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
