//! The plain rows every layer reports its numbers in: [`Stats`] (one allocator) and
//! [`BlockSourceStats`] (one pool block source). A leaf, so that the engine, the
//! registry, the pools and the stats functions that gather rows all name them from
//! below (re-exported as `proxalloc::Stats`, `proxalloc::stats::Stats` and
//! `proxalloc::BlockSourceStats`).

use std::fmt;

use crate::core::counters::{for_each_counter, Counts};

// The struct is generated with the counters of `core::counters` as its fields.
macro_rules! define_stats {
    ($($(#[$attr:meta])* $name:ident $column:literal $doc:literal;)*) => {
        /// A snapshot of one allocator's counters, from
        /// [`ClassAllocator::stats`](crate::ClassAllocator::stats).
        ///
        /// Counters are summed over every thread and CPU cache when read. While other threads are
        /// allocating the snapshot is not atomic (each counter is read once, at a slightly
        /// different moment); when they are quiescent it is exact, and then
        /// `live + cached_in_threads + cached_in_depot == backing_allocs - backing_frees`.
        ///
        /// ```
        /// use proxalloc::ClassAllocator;
        /// let a = ClassAllocator::<[u8; 32]>::new("doc-stats");
        /// let x = a.alloc([0; 32]);
        /// drop(a.alloc([1; 32]));
        /// let s = a.stats();
        /// assert_eq!((s.name, s.object_size, s.allocs, s.frees, s.live), ("doc-stats", 32, 2, 1, 1));
        /// assert!(s.is_consistent());
        /// println!("{s}"); // one line: live, cached, reserved bytes, counters
        /// # drop(x);
        /// ```
        #[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
        #[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
        pub struct Stats {
            /// The allocator's name. (Deserialized, it is a copy kept for the rest of the
            /// process, one per distinct name: deserialize untrusted input as [`Row`](crate::stats::Row)s.)
            //
            // (Spelt `core::primitive::str` so that serde's derive does not borrow it from the
            // input, which would let `Stats` deserialize only from `'static` data.)
            #[cfg_attr(feature = "serde", serde(deserialize_with = "de_name"))]
            pub name: &'static core::primitive::str,
            /// A number unique to this allocator instance in the process (names may repeat),
            /// used to match rows of a [`Snapshot`](crate::stats::Snapshot) with later ones.
            pub id: u64,
            /// Size of one object in bytes.
            pub object_size: usize,
            $($(#[$attr])* #[doc = $doc] pub $name: u64,)*
            /// Objects in users' hands now (`allocs - frees`): cached objects are not counted.
            pub live: u64,
            /// Free objects held in thread caches (all threads), or in CPU caches with
            /// [`CacheMode::PerCpu`](crate::CacheMode::PerCpu): the objects reserved and
            /// neither live nor in the depot (see [`is_consistent`](Self::is_consistent)).
            pub cached_in_threads: u64,
            /// Free objects held in the depot.
            pub cached_in_depot: u64,
            /// Objects obtained from the backing allocator.
            pub backing_allocs: u64,
            /// Objects returned to the backing allocator.
            pub backing_frees: u64,
            /// Thread caches currently registered (with per-CPU caches: threads that could not
            /// use rseq).
            pub threads: usize,
            /// The caching mode the allocator runs in: what its `Config` asked for, except that
            /// [`CacheMode::PerCpu`](crate::CacheMode::PerCpu) falls back to
            /// [`ThreadCaches`](crate::CacheMode::ThreadCaches) where per-CPU caches cannot work,
            /// and the environment can force [`Bypass`](crate::CacheMode::Bypass).
            pub mode: crate::CacheMode,
        }

        impl Stats {
            /// These stats with their counters set from `n`.
            pub(crate) fn with_counts(mut self, n: &Counts) -> Self {
                $($(#[$attr])* { self.$name = n.$name; })*
                self
            }

            /// Every counter, as its dump column's name and its value, in the list's
            /// order (see `core::counters`).
            // (Pushes: an entry may carry a `cfg`, which `vec![]`'s elements cannot.)
            #[allow(clippy::vec_init_then_push)]
            pub(crate) fn counters(&self) -> Vec<(&'static str, u64)> {
                let mut v = Vec::new();
                $($(#[$attr])* v.push(($column, self.$name));)*
                v
            }
        }
    };
}
for_each_counter!(define_stats! {});

impl Stats {
    /// Objects currently obtained from the backing allocator and not returned.
    ///
    /// ```
    /// let a = proxalloc::ClassAllocator::<u64>::new("doc-reserved-objects");
    /// let held: Vec<_> = (0..3).map(|i| a.alloc(i)).collect();
    /// assert_eq!(a.stats().reserved_objects(), 3);
    /// # drop(held);
    /// ```
    pub fn reserved_objects(&self) -> u64 {
        self.backing_allocs.saturating_sub(self.backing_frees)
    }

    /// Bytes currently obtained from the backing allocator and not returned.
    ///
    /// ```
    /// let a = proxalloc::ClassAllocator::<[u8; 100]>::new("doc-reserved-bytes");
    /// let x = a.alloc([0; 100]);
    /// assert_eq!(a.stats().reserved_bytes(), 100);
    /// # drop(x);
    /// ```
    pub fn reserved_bytes(&self) -> u64 {
        self.reserved_objects() * self.object_size as u64
    }

    /// Whether the counters agree: no more frees than allocations, `live == allocs -
    /// frees`, and `live + cached_in_threads + cached_in_depot` equals the objects
    /// reserved from the backing allocator. Always true of a snapshot taken while no
    /// other thread allocates or frees.
    ///
    /// What it cannot see: the objects in thread and CPU caches belong to their threads
    /// and are not counted one by one when a snapshot is taken (that would read memory
    /// other threads write); `cached_in_threads` is what is reserved and neither live nor
    /// in the depot. So an object lost inside the allocator would show up as cached, and
    /// this check only fails where the counters contradict each other outright. To prove
    /// that nothing is lost, let the other threads exit (their caches go to the depot),
    /// [`trim`](crate::ClassAllocator::trim), and check that
    /// [`reserved_objects`](Self::reserved_objects) equals `live`.
    ///
    /// ```
    /// let a = proxalloc::ClassAllocator::<u32>::new("doc-consistent");
    /// drop((0..100).map(|i| a.alloc(i)).collect::<Vec<_>>());
    /// assert!(a.stats().is_consistent());
    /// ```
    pub fn is_consistent(&self) -> bool {
        self.allocs.checked_sub(self.frees) == Some(self.live)
            && self.live + self.cached_in_threads + self.cached_in_depot == self.reserved_objects()
    }

    /// Bytes of free objects cached in thread or CPU caches and the depot.
    ///
    /// ```
    /// let a = proxalloc::ClassAllocator::<[u8; 64]>::new("doc-cached-bytes");
    /// drop(a.alloc([0; 64])); // the object stays in this CPU's (or thread's) cache
    /// assert_eq!(a.stats().cached_bytes(), 64);
    /// a.trim();
    /// assert_eq!(a.stats().cached_bytes(), 0);
    /// ```
    pub fn cached_bytes(&self) -> u64 {
        (self.cached_in_threads + self.cached_in_depot) * self.object_size as u64
    }
}

impl fmt::Display for Stats {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}: size {} B, live {}, cached {} in threads + {} in depot, reserved {} B; ",
            self.name,
            self.object_size,
            self.live,
            self.cached_in_threads,
            self.cached_in_depot,
            self.reserved_bytes(),
        )?;
        for (column, value) in self.counters() {
            write!(f, "{column} {value}, ")?;
        }
        write!(f, "backing {}/{}", self.backing_allocs, self.backing_frees)
    }
}

/// A block source's numbers that its five [`Stats`] rows do not carry: its `max_free`
/// budget and what is charged to it, and its large blocks in bytes (their row counts
/// blocks, as their sizes vary). From [`BlockSource::source_stats`](crate::BlockSource::source_stats), or for every source
/// in the process from [`stats::block_sources`](crate::stats::block_sources).
///
/// Pools themselves are not listed anywhere: a server makes one per request, and
/// listing each would take a process-wide lock per pool. Their memory shows here and
/// in their source's rows (`live` of the `pool-blocks-*` rows is the blocks that pools
/// hold); a pool's own numbers are [`Pool::stats`](crate::Pool::stats).
///
/// ```
/// let source = proxalloc::BlockSource::new(1 << 20);
/// let big = source.alloc(100_000).unwrap(); // a large block: 25 × 4 KiB
/// let s = source.source_stats();
/// assert_eq!((s.max_free, s.large_live_blocks, s.large_live_bytes), (1 << 20, 1, 102_400));
/// // SAFETY: from `source`, not used again.
/// unsafe { source.free(big) };
/// let s = source.source_stats();
/// assert_eq!((s.large_live_bytes, s.large_cached_bytes, s.cached_bytes), (0, 102_400, 102_400));
/// ```
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub struct BlockSourceStats {
    /// The [`Stats::id`] of the source's `pool-blocks-large` row, which tells sources
    /// apart.
    pub id: u64,
    /// The budget of free blocks the source may cache, in bytes.
    pub max_free: usize,
    /// Bytes of free blocks cached and charged to `max_free` (the block classes' depots
    /// and the large buckets; not the blocks in threads' own caches).
    pub cached_bytes: usize,
    /// Large blocks in pools' hands.
    pub large_live_blocks: u64,
    /// Bytes of the large blocks in pools' hands.
    pub large_live_bytes: u64,
    /// Large blocks cached in the buckets.
    pub large_cached_blocks: u64,
    /// Bytes of the large blocks cached in the buckets.
    pub large_cached_bytes: u64,
}

/// Reads a [`Stats::name`] as a `&'static str`: each distinct name is copied once and
/// kept for the rest of the process, so deserializing names chosen by an attacker
/// without bound grows memory without bound (read untrusted dumps as [`Row`]s, whose
/// names are `String`s).
#[cfg(feature = "serde")]
fn de_name<'de, D: serde::Deserializer<'de>>(d: D) -> Result<&'static str, D::Error> {
    use std::collections::HashSet;
    use std::sync::Mutex;
    static NAMES: Mutex<Option<HashSet<&'static str>>> = Mutex::new(None);
    let name = <std::borrow::Cow<'de, str> as serde::Deserialize>::deserialize(d)?;
    let mut names = NAMES.lock().unwrap_or_else(|e| e.into_inner());
    let names = names.get_or_insert_with(HashSet::new);
    Ok(match names.get(&*name) {
        Some(&s) => s,
        None => {
            let s: &'static str = Box::leak(name.into_owned().into_boxed_str());
            names.insert(s);
            s
        }
    })
}
