//! Allocator statistics: per-allocator snapshots, the process-wide list, and a dump in
//! the manner of Traffic Server's `ink_freelists_dump`.
//!
//! ```
//! use proxalloc::{stats, ClassAllocator};
//! static CONNS: ClassAllocator<[u64; 16]> = ClassAllocator::new("doc-conns");
//! let baseline = stats::snapshot();
//! let c = CONNS.alloc([0; 16]);
//! let mut out = Vec::new();
//! stats::dump(&mut out).unwrap();
//! let table = String::from_utf8(out).unwrap();
//! assert!(table.lines().any(|l| l.starts_with("doc-conns")));
//! let mut delta = Vec::new();
//! stats::dump_since(&baseline, &mut delta).unwrap();
//! drop(c);
//! ```

use std::fmt;

use crate::BlockSourceStats;

#[cfg(feature = "metrics")]
mod metrics;
mod table;

#[cfg(feature = "metrics")]
pub use metrics::record_metrics;
pub use table::{dump, dump_since, table, table_since, Row, Table};

/// A snapshot of one allocator's counters, from
/// [`ClassAllocator::stats`](crate::ClassAllocator::stats).
///
/// Counters are summed over every thread cache when read. While other threads are
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
    /// process, one per distinct name: deserialize untrusted input as [`Row`]s.)
    //
    // (Spelt `core::primitive::str` so that serde's derive does not borrow it from the
    // input, which would let `Stats` deserialize only from `'static` data.)
    #[cfg_attr(feature = "serde", serde(deserialize_with = "de_name"))]
    pub name: &'static core::primitive::str,
    /// A number unique to this allocator instance in the process (names may repeat),
    /// used to match rows of a [`Snapshot`] with later ones.
    pub id: u64,
    /// Size of one object in bytes.
    pub object_size: usize,
    /// Objects handed to users.
    pub allocs: u64,
    /// Objects given back by users.
    pub frees: u64,
    /// Objects in users' hands now (`allocs - frees`): cached objects are not counted.
    pub live: u64,
    /// Free objects held in thread caches (all threads), or in CPU caches with
    /// [`CacheMode::PerCpu`](crate::CacheMode::PerCpu).
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

    /// Whether every object is accounted for exactly once: `live == allocs - frees` and
    /// `live + cached_in_threads + cached_in_depot` equals the objects reserved from the
    /// backing allocator. Always true of a snapshot taken while no other thread
    /// allocates or frees.
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

    /// Bytes of free objects cached in thread caches and the depot.
    ///
    /// ```
    /// let a = proxalloc::ClassAllocator::<[u8; 64]>::new("doc-cached-bytes");
    /// drop(a.alloc([0; 64])); // the object stays in this thread's cache
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

/// How per-CPU caches stand in this process (`CacheMode::PerCpu`).
#[derive(Clone, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub struct PerCpuStatus {
    /// Whether per-CPU caches work here: Linux on x86-64 with restartable sequences and
    /// `membarrier`, not turned off by `PROXALLOC_PERCPU=off`, and no fence failed for
    /// good. False also before the first per-CPU allocator's first use, which decides.
    pub available: bool,
    /// `membarrier` fences (another thread's reclaim of a CPU's cache) that failed in
    /// this process, retries included. A reclaim whose fence failed and whose retry after
    /// registering again failed too left that CPU's magazines where they were and turned
    /// per-CPU caches off; a retry that worked went on as if nothing had failed.
    pub fence_failures: u64,
    /// Why per-CPU caches are off for the rest of the process, if a fence failed for
    /// good: per-CPU allocators use per-thread caches since (and `mode()` says so).
    pub disabled: Option<String>,
}

/// How per-CPU caches stand in this process; [`dump`] prints it when a fence failed.
///
/// ```
/// let s = proxalloc::stats::percpu_status();
/// assert_eq!(s.fence_failures, 0);
/// assert!(s.disabled.is_none());
/// ```
pub fn percpu_status() -> PerCpuStatus {
    let disabled = crate::core::rseq::fence::disabled();
    PerCpuStatus {
        // Not decided yet (no per-CPU allocator used): asked without deciding, which
        // could register this thread's rseq area.
        available: disabled.is_none() && crate::core::rseq::decided().unwrap_or(false),
        fence_failures: crate::core::rseq::fence::failures(),
        disabled: disabled.map(|e| e.to_string()),
    }
}

/// Stats of every allocator in the process that has been used and not dropped, in the
/// order they were first used.
///
/// ```
/// use proxalloc::{stats, ClassAllocator};
/// static JOBS: ClassAllocator<[u8; 40]> = ClassAllocator::new("doc-all-jobs");
/// let job = JOBS.alloc([0; 40]);
/// assert!(stats::all().iter().any(|s| s.name == "doc-all-jobs" && s.live == 1));
/// # drop(job);
/// ```
pub fn all() -> Vec<Stats> {
    crate::registry::all_stats()
}

/// Calls `f` with the stats of every allocator in the process that has been used and not
/// dropped (those of [`all`], in the same order): the hook for a metrics system. `f`
/// runs with no allocator lock held, so it may allocate from any allocator, and it reads
/// each allocator as [`ClassAllocator::stats`](crate::ClassAllocator::stats) does.
///
/// Names may repeat (every [`BlockSource`](crate::BlockSource) has a `pool-blocks-8K`
/// row, for instance); add up rows by name, or key them by [`Stats::id`], as the
/// exporter needs. With the `metrics` feature, `stats::record_metrics` does this for the
/// `metrics` crate's facade.
///
/// ```
/// use std::collections::BTreeMap;
/// use proxalloc::{stats, ClassAllocator};
///
/// static CONNS: ClassAllocator<[u64; 8]> = ClassAllocator::new("doc-for-each-conns");
/// let conn = CONNS.alloc([0; 8]);
///
/// // E.g. on every scrape of a Prometheus endpoint:
/// let mut live_by_name = BTreeMap::<&str, u64>::new();
/// stats::for_each(|s| *live_by_name.entry(s.name).or_default() += s.live);
/// assert_eq!(live_by_name["doc-for-each-conns"], 1);
/// # drop(conn);
/// ```
pub fn for_each(mut f: impl FnMut(&Stats)) {
    for source in crate::registry::registered() {
        if let Some(s) = source.stats() {
            f(&s);
        }
    }
}

/// The numbers of every pool [`BlockSource`](crate::BlockSource) alive in the process
/// (the global one once something has used it), in the order they were created:
/// their `max_free` budgets, what is charged to them, and their large blocks in bytes.
/// See [`BlockSourceStats`].
///
/// ```
/// let source = proxalloc::BlockSource::new(3 << 20);
/// let id = source.source_stats().id;
/// let all = proxalloc::stats::block_sources();
/// assert_eq!(all.iter().find(|s| s.id == id).unwrap().max_free, 3 << 20);
/// ```
pub fn block_sources() -> Vec<BlockSourceStats> {
    crate::registry::all_sources()
}

/// A baseline of every allocator's stats, for [`dump_since`] and [`table_since`].
///
/// With the `serde` feature it can be saved and read back (a dump's baseline across a
/// restart matches no allocator, whose ids are new, so it then counts from zero).
///
/// ```
/// use proxalloc::{stats, ClassAllocator};
/// static JOBS: ClassAllocator<u64> = ClassAllocator::new("doc-snapshot");
/// let base = stats::snapshot();
/// drop(JOBS.alloc(1));
/// let delta = stats::table_since(&base);
/// assert_eq!(delta.rows.iter().find(|r| r.name == "doc-snapshot").unwrap().allocs, 1);
/// ```
#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub struct Snapshot {
    rows: Vec<Stats>,
}

impl Snapshot {
    /// The rows captured.
    ///
    /// ```
    /// use proxalloc::{stats, ClassAllocator};
    /// static A: ClassAllocator<u32> = ClassAllocator::new("doc-snapshot-rows");
    /// drop(A.alloc(1));
    /// let base = stats::snapshot();
    /// assert!(base.rows().iter().any(|s| s.name == "doc-snapshot-rows"));
    /// ```
    pub fn rows(&self) -> &[Stats] {
        &self.rows
    }
}

/// Captures every allocator's stats now.
///
/// ```
/// let baseline = proxalloc::stats::snapshot();
/// // ... later: what changed since then
/// let mut out = Vec::new();
/// proxalloc::stats::dump_since(&baseline, &mut out).unwrap();
/// ```
pub fn snapshot() -> Snapshot {
    Snapshot { rows: all() }
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
