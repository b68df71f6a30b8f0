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

use crate::rows::BlockSourceStats;
pub use crate::rows::Stats;

#[cfg(feature = "metrics")]
mod metrics;
mod table;

#[cfg(all(test, feature = "metrics"))]
pub(crate) use metrics::names as metric_names;
#[cfg(feature = "metrics")]
pub use metrics::record_metrics;
pub use table::{dump, dump_since, table, table_since, Row, Table};

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

/// How proxalloc has asked the system allocator to return free memory to the OS.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub struct SystemTrims {
    /// Requests made so far: each calls the hook set with
    /// [`set_system_trim`](crate::set_system_trim), or by default glibc's
    /// `malloc_trim(0)` on Linux with glibc (elsewhere the request is counted and nothing
    /// is called). A request the hook itself would make is skipped and not counted. [`trim_all`](crate::trim_all) makes one
    /// every time, and one more before its trims if `given_since` is not 0; the other
    /// trims make one once `given_since` reaches 1 MiB; an allocator's or a block
    /// source's drop, only when it releases 1 MiB itself (the last handle of an
    /// allocator shared by `Arc` may drop it on any thread's free). Nothing else on an
    /// allocation or a free.
    pub requests: u64,
    /// Bytes of objects and blocks that proxalloc gave the global allocator in batches
    /// (spills over a depot budget, trims, flushes, drops), and pool large blocks as they
    /// are freed, since its last request: glibc keeps them in its bins, resident, until
    /// someone asks. Single objects freed one at a time (bypass mode, a thread without a
    /// cache) and the memory of a user's [`BlockAllocator`](crate::BlockAllocator) are
    /// not counted.
    pub given_since: u64,
}

/// How proxalloc has asked the system allocator for memory back, process-wide.
///
/// ```
/// use proxalloc::{ClassAllocator, Config};
/// // No depot: whatever a thread's cache cannot keep goes to the global allocator.
/// static SPILLS: ClassAllocator<[u8; 4096]> =
///     ClassAllocator::with_config("doc-system-trims", Config::new().depot_bytes(0));
/// let before = proxalloc::stats::system_trims().requests;
/// drop((0..1000).map(|_| SPILLS.alloc([0; 4096])).collect::<Vec<_>>());
/// proxalloc::trim_all(); // always asks
/// let after = proxalloc::stats::system_trims();
/// assert!(after.requests > before);
/// ```
pub fn system_trims() -> SystemTrims {
    let (requests, given_since) = crate::core::backing::system_trims();
    SystemTrims {
        requests,
        given_since,
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
