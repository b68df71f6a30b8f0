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
use std::io;

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
/// exporter needs. With the `metrics` feature, [`record_metrics`] does this for the
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

/// One row of a dump ([`table`], [`table_since`]): an allocator's numbers, or their
/// changes since a baseline (which may be negative), or the total of a table. The
/// fields are the dump's columns. Unlike [`Stats`] its name is a `String`, so rows read
/// back from anywhere (with the `serde` feature) cost no interning.
///
/// ```
/// use proxalloc::{stats::Row, ClassAllocator};
/// let a = ClassAllocator::<u64>::new("doc-row");
/// let x = a.alloc(7);
/// let row = Row::from(&a.stats());
/// assert_eq!((row.name.as_str(), row.object_size, row.live), ("doc-row", Some(8), 1));
/// # drop(x);
/// ```
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub struct Row {
    /// The allocator's name (`"TOTAL"` in a table's total).
    pub name: String,
    /// Size of one object in bytes (`None` in a table's total; `Some(0)` for the large
    /// pool blocks, which vary in size: that row counts blocks).
    pub object_size: Option<usize>,
    /// Objects in users' hands.
    pub live: i64,
    /// Free objects in thread caches.
    pub thread_cached: i64,
    /// Free objects in the depot.
    pub depot_cached: i64,
    /// Bytes obtained from the backing allocator and not returned.
    pub reserved_bytes: i64,
    /// Objects handed to users.
    pub allocs: i64,
    /// Objects given back by users.
    pub frees: i64,
    /// Full magazines taken from the depot.
    pub refills: i64,
    /// Full magazines given to the depot.
    pub spills: i64,
    /// Objects obtained from the backing allocator.
    pub backing_allocs: i64,
}

/// A counter as a row's number (counters never reach `i64::MAX` in practice; they
/// saturate there).
fn signed(v: u64) -> i64 {
    i64::try_from(v).unwrap_or(i64::MAX)
}

impl Row {
    /// The row of one allocator's stats.
    fn of(s: &Stats) -> Row {
        Row {
            name: s.name.to_string(),
            object_size: Some(s.object_size),
            live: signed(s.live),
            thread_cached: signed(s.cached_in_threads),
            depot_cached: signed(s.cached_in_depot),
            reserved_bytes: signed(s.reserved_bytes()),
            allocs: signed(s.allocs),
            frees: signed(s.frees),
            refills: signed(s.refills),
            spills: signed(s.spills),
            backing_allocs: signed(s.backing_allocs),
        }
    }

    /// The numeric columns, in the dump's order.
    fn columns(&self) -> [i64; 9] {
        [
            self.live,
            self.thread_cached,
            self.depot_cached,
            self.reserved_bytes,
            self.allocs,
            self.frees,
            self.refills,
            self.spills,
            self.backing_allocs,
        ]
    }

    fn columns_mut(&mut self) -> [&mut i64; 9] {
        [
            &mut self.live,
            &mut self.thread_cached,
            &mut self.depot_cached,
            &mut self.reserved_bytes,
            &mut self.allocs,
            &mut self.frees,
            &mut self.refills,
            &mut self.spills,
            &mut self.backing_allocs,
        ]
    }

    fn write(&self, w: &mut impl io::Write) -> io::Result<()> {
        let size = self.object_size.map(|s| s.to_string()).unwrap_or_default();
        write!(w, "{:<24} {size:>8}", self.name)?;
        for c in self.columns() {
            write!(w, " {c:>14}")?;
        }
        writeln!(w)
    }
}

impl From<&Stats> for Row {
    fn from(s: &Stats) -> Row {
        Row::of(s)
    }
}

/// A dump as data: one [`Row`] per allocator and their total, what [`dump`] and
/// [`dump_since`] print. With the `serde` feature it serializes (and reads back) as
/// `{"rows": [...], "total": {...}}`, for an admin endpoint that answers in JSON.
///
/// ```
/// use proxalloc::{stats, ClassAllocator};
/// static MSGS: ClassAllocator<[u8; 64]> = ClassAllocator::new("doc-table-msgs");
/// let m = MSGS.alloc([0; 64]);
/// let table = stats::table();
/// let row = table.rows.iter().find(|r| r.name == "doc-table-msgs").unwrap();
/// assert_eq!((row.live, row.reserved_bytes), (1, 64));
/// assert!(table.total.live >= 1);
/// let mut text = Vec::new();
/// table.write(&mut text).unwrap(); // the same text as `stats::dump`
/// # drop(m);
/// ```
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub struct Table {
    /// One row per allocator, in the order of [`all`].
    pub rows: Vec<Row>,
    /// The column sums of `rows`, named `"TOTAL"`, without an object size.
    pub total: Row,
}

impl Table {
    /// A table of `rows` and their total.
    fn new(rows: Vec<Row>) -> Table {
        let mut total = Row {
            name: "TOTAL".to_string(),
            ..Row::default()
        };
        for row in &rows {
            for (t, c) in total.columns_mut().into_iter().zip(row.columns()) {
                *t = t.saturating_add(c);
            }
        }
        Table { rows, total }
    }

    /// Writes the table as [`dump`] does: a header, one line per row and the total.
    ///
    /// ```
    /// let mut out = Vec::new();
    /// proxalloc::stats::table().write(&mut out).unwrap();
    /// let text = String::from_utf8(out).unwrap();
    /// assert!(text.starts_with("name"));
    /// assert!(text.lines().last().unwrap().starts_with("TOTAL"));
    /// ```
    pub fn write(&self, w: &mut impl io::Write) -> io::Result<()> {
        write!(w, "{:<24} {:>8}", HEADER[0], HEADER[1])?;
        for h in &HEADER[2..] {
            write!(w, " {h:>14}")?;
        }
        writeln!(w)?;
        for row in &self.rows {
            row.write(w)?;
        }
        self.total.write(w)
    }
}

const HEADER: [&str; 11] = [
    "name",
    "size",
    "live",
    "thread-cached",
    "depot-cached",
    "reserved-bytes",
    "allocs",
    "frees",
    "refills",
    "spills",
    "backing-allocs",
];

/// Every allocator's row now, and their total: [`dump`] as data.
///
/// ```
/// let table = proxalloc::stats::table();
/// assert_eq!(table.rows.len(), proxalloc::stats::all().len());
/// ```
pub fn table() -> Table {
    Table::new(all().iter().map(Row::of).collect())
}

/// Every allocator's change since `base`, and the total: [`dump_since`] as data
/// (allocators created since then count from zero; those dropped since then are left
/// out).
///
/// ```
/// use proxalloc::{stats, ClassAllocator};
/// static EVENTS: ClassAllocator<[u8; 24]> = ClassAllocator::new("doc-table-since");
/// drop(EVENTS.alloc([0; 24]));
/// let base = stats::snapshot();
/// drop((0..5).map(|_| EVENTS.alloc([1; 24])).collect::<Vec<_>>());
/// let delta = stats::table_since(&base);
/// let row = delta.rows.iter().find(|r| r.name == "doc-table-since").unwrap();
/// assert_eq!((row.allocs, row.frees, row.live), (5, 5, 0));
/// ```
pub fn table_since(base: &Snapshot) -> Table {
    Table::new(
        all()
            .iter()
            .map(|s| {
                let mut row = Row::of(s);
                if let Some(b) = base.rows.iter().find(|b| b.id == s.id) {
                    let old = Row::of(b);
                    for (c, o) in row.columns_mut().into_iter().zip(old.columns()) {
                        *c = c.saturating_sub(o);
                    }
                }
                row
            })
            .collect(),
    )
}

/// Writes one row per allocator (name, object size, live objects (in users' hands only),
/// objects cached in thread caches and in the depot, bytes reserved from the system,
/// allocations, frees, refills, spills, backing allocations) and a total row.
///
/// A server typically calls it from a signal-handling thread or an admin endpoint; see
/// `examples/stats_dump.rs`. [`table`] gives the same rows as data.
///
/// ```
/// // E.g. from an admin endpoint, or a thread that waits for SIGUSR1:
/// proxalloc::stats::dump(&mut std::io::stderr()).unwrap();
/// ```
pub fn dump(w: &mut impl io::Write) -> io::Result<()> {
    table().write(w)
}

/// Like [`dump`], but every number is the change since `base` (allocators created since
/// then count from zero; those dropped since then are left out).
///
/// ```
/// use proxalloc::{stats, ClassAllocator};
/// static EVENTS: ClassAllocator<[u8; 16]> = ClassAllocator::new("doc-dump-since");
/// let base = stats::snapshot();
/// drop((0..10).map(|_| EVENTS.alloc([0; 16])).collect::<Vec<_>>());
/// let mut out = Vec::new();
/// stats::dump_since(&base, &mut out).unwrap();
/// let text = String::from_utf8(out).unwrap();
/// let row = text.lines().find(|l| l.starts_with("doc-dump-since")).unwrap();
/// // name, size, live, thread-cached, depot-cached, reserved bytes, allocs, ...
/// assert_eq!(row.split_whitespace().nth(6), Some("10"));
/// ```
pub fn dump_since(base: &Snapshot, w: &mut impl io::Write) -> io::Result<()> {
    table_since(base).write(w)
}

/// Records every allocator's stats through the [`metrics`] crate's facade, into whatever
/// recorder the program installed (a Prometheus exporter, StatsD, ...). Call it
/// periodically or before each scrape; each call sets the current values.
///
/// Rows with the same name are added up (several pool block sources share their
/// rows' names), and every metric has the label `allocator` = the name:
///
/// | metric | kind | value |
/// | --- | --- | --- |
/// | `proxalloc_live_objects` | gauge | objects in users' hands |
/// | `proxalloc_thread_cached_objects` | gauge | free objects in thread caches |
/// | `proxalloc_depot_cached_objects` | gauge | free objects in the depot |
/// | `proxalloc_reserved_bytes` | gauge | bytes held from the backing allocator |
/// | `proxalloc_threads` | gauge | thread caches registered |
/// | `proxalloc_allocs_total` | counter | objects handed out |
/// | `proxalloc_frees_total` | counter | objects given back |
/// | `proxalloc_refills_total` | counter | magazines taken from the depot |
/// | `proxalloc_spills_total` | counter | magazines given to the depot |
/// | `proxalloc_overflows_total` | counter | magazines freed past the depot budget |
/// | `proxalloc_backing_allocs_total` | counter | objects from the backing allocator |
/// | `proxalloc_backing_frees_total` | counter | objects returned to it |
///
/// Counters are set to their absolute values; one goes down only when an allocator
/// of that name is dropped (exporters read that as a counter reset).
///
/// ```
/// use proxalloc::{stats, ClassAllocator};
/// static REQS: ClassAllocator<[u8; 128]> = ClassAllocator::new("doc-metrics-reqs");
/// let r = REQS.alloc([0; 128]);
/// // With a recorder installed (`metrics::set_global_recorder`), e.g. every 10 s:
/// stats::record_metrics();
/// # drop(r);
/// ```
#[cfg(feature = "metrics")]
pub fn record_metrics() {
    /// One name's rows added up.
    #[derive(Default)]
    struct Sum {
        name: &'static str,
        gauges: [u64; 5],
        counters: [u64; 7],
    }
    const GAUGES: [&str; 5] = [
        "proxalloc_live_objects",
        "proxalloc_thread_cached_objects",
        "proxalloc_depot_cached_objects",
        "proxalloc_reserved_bytes",
        "proxalloc_threads",
    ];
    const COUNTERS: [&str; 7] = [
        "proxalloc_allocs_total",
        "proxalloc_frees_total",
        "proxalloc_refills_total",
        "proxalloc_spills_total",
        "proxalloc_overflows_total",
        "proxalloc_backing_allocs_total",
        "proxalloc_backing_frees_total",
    ];
    let mut sums: Vec<Sum> = Vec::new();
    for_each(|s| {
        let i = match sums.iter().position(|t| t.name == s.name) {
            Some(i) => i,
            None => {
                sums.push(Sum {
                    name: s.name,
                    ..Sum::default()
                });
                sums.len() - 1
            }
        };
        let sum = &mut sums[i];
        let gauges = [
            s.live,
            s.cached_in_threads,
            s.cached_in_depot,
            s.reserved_bytes(),
            s.threads as u64,
        ];
        let counters = [
            s.allocs,
            s.frees,
            s.refills,
            s.spills,
            s.overflows,
            s.backing_allocs,
            s.backing_frees,
        ];
        for (t, v) in sum.gauges.iter_mut().zip(gauges) {
            *t = t.saturating_add(v);
        }
        for (t, v) in sum.counters.iter_mut().zip(counters) {
            *t = t.saturating_add(v);
        }
    });
    for sum in &sums {
        let name = sum.name;
        for (metric, v) in GAUGES.into_iter().zip(sum.gauges) {
            metrics::gauge!(metric, "allocator" => name).set(v as f64);
        }
        for (metric, v) in COUNTERS.into_iter().zip(sum.counters) {
            metrics::counter!(metric, "allocator" => name).absolute(v);
        }
    }
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
