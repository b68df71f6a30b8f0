//! Allocator statistics.

use std::fmt;

/// A snapshot of one allocator's counters, from
/// [`ClassAllocator::stats`](crate::ClassAllocator::stats).
///
/// Counters are summed over every thread cache when read. While other threads are
/// allocating the snapshot is not atomic (each counter is read once, at a slightly
/// different moment); when they are quiescent it is exact, and then
/// `live + cached_in_threads + cached_in_depot == backing_allocs - backing_frees`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct Stats {
    /// The allocator's name.
    pub name: &'static str,
    /// Size of one object in bytes.
    pub object_size: usize,
    /// Objects handed to users.
    pub allocs: u64,
    /// Objects given back by users.
    pub frees: u64,
    /// Objects in users' hands now (`allocs - frees`): cached objects are not counted.
    pub live: u64,
    /// Free objects held in thread caches (all threads).
    pub cached_in_threads: u64,
    /// Free objects held in the depot.
    pub cached_in_depot: u64,
    /// Objects obtained from the backing allocator.
    pub backing_allocs: u64,
    /// Objects returned to the backing allocator.
    pub backing_frees: u64,
    /// Full magazines a thread took from the depot.
    pub refills: u64,
    /// Full magazines a thread gave to the depot (and the depot kept).
    pub spills: u64,
    /// Magazines whose objects went to the backing allocator because the depot budget
    /// was full.
    pub overflows: u64,
    /// Thread caches currently registered.
    pub threads: usize,
}

impl Stats {
    /// Objects currently obtained from the backing allocator and not returned.
    pub fn reserved_objects(&self) -> u64 {
        self.backing_allocs.saturating_sub(self.backing_frees)
    }

    /// Bytes currently obtained from the backing allocator and not returned.
    pub fn reserved_bytes(&self) -> u64 {
        self.reserved_objects() * self.object_size as u64
    }

    /// Bytes of free objects cached in thread caches and the depot.
    pub fn cached_bytes(&self) -> u64 {
        (self.cached_in_threads + self.cached_in_depot) * self.object_size as u64
    }
}

impl fmt::Display for Stats {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}: size {} B, live {}, cached {} in threads + {} in depot, reserved {} B; \
             allocs {}, frees {}, refills {}, spills {}, overflows {}, backing {}/{}",
            self.name,
            self.object_size,
            self.live,
            self.cached_in_threads,
            self.cached_in_depot,
            self.reserved_bytes(),
            self.allocs,
            self.frees,
            self.refills,
            self.spills,
            self.overflows,
            self.backing_allocs,
            self.backing_frees,
        )
    }
}
