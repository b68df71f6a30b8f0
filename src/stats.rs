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
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct Stats {
    /// The allocator's name.
    pub name: &'static str,
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
    pub fn reserved_objects(&self) -> u64 {
        self.backing_allocs.saturating_sub(self.backing_frees)
    }

    /// Bytes currently obtained from the backing allocator and not returned.
    pub fn reserved_bytes(&self) -> u64 {
        self.reserved_objects() * self.object_size as u64
    }

    /// Whether every object is accounted for exactly once: `live == allocs - frees` and
    /// `live + cached_in_threads + cached_in_depot` equals the objects reserved from the
    /// backing allocator. Always true of a snapshot taken while no other thread
    /// allocates or frees.
    pub fn is_consistent(&self) -> bool {
        self.allocs.checked_sub(self.frees) == Some(self.live)
            && self.live + self.cached_in_threads + self.cached_in_depot == self.reserved_objects()
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

/// Stats of every allocator in the process that has been used and not dropped, in the
/// order they were first used.
pub fn all() -> Vec<Stats> {
    crate::registry::all_stats()
}

/// A baseline of every allocator's stats, for [`dump_since`].
#[derive(Clone, Debug, Default)]
pub struct Snapshot {
    rows: Vec<Stats>,
}

impl Snapshot {
    /// The rows captured.
    pub fn rows(&self) -> &[Stats] {
        &self.rows
    }
}

/// Captures every allocator's stats now.
pub fn snapshot() -> Snapshot {
    Snapshot { rows: all() }
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

/// One row of the dump: the numeric columns of [`HEADER`] after name and size.
fn columns(s: &Stats) -> [i128; 9] {
    [
        s.live,
        s.cached_in_threads,
        s.cached_in_depot,
        s.reserved_bytes(),
        s.allocs,
        s.frees,
        s.refills,
        s.spills,
        s.backing_allocs,
    ]
    .map(i128::from)
}

fn write_row(w: &mut impl io::Write, name: &str, size: &str, cols: &[i128; 9]) -> io::Result<()> {
    write!(w, "{name:<24} {size:>8}")?;
    for c in cols {
        write!(w, " {c:>14}")?;
    }
    writeln!(w)
}

fn write_table(w: &mut impl io::Write, rows: &[(String, String, [i128; 9])]) -> io::Result<()> {
    write!(w, "{:<24} {:>8}", HEADER[0], HEADER[1])?;
    for h in &HEADER[2..] {
        write!(w, " {h:>14}")?;
    }
    writeln!(w)?;
    let mut total = [0i128; 9];
    for (name, size, cols) in rows {
        write_row(w, name, size, cols)?;
        for (t, c) in total.iter_mut().zip(cols) {
            *t += c;
        }
    }
    write_row(w, "TOTAL", "", &total)
}

/// Writes one row per allocator (name, object size, live objects (in users' hands only),
/// objects cached in thread caches and in the depot, bytes reserved from the system,
/// allocations, frees, refills, spills, backing allocations) and a total row.
///
/// A server typically calls it from a signal-handling thread or an admin endpoint; see
/// `examples/stats_dump.rs`.
pub fn dump(w: &mut impl io::Write) -> io::Result<()> {
    let rows: Vec<_> = all()
        .iter()
        .map(|s| (s.name.to_string(), s.object_size.to_string(), columns(s)))
        .collect();
    write_table(w, &rows)
}

/// Like [`dump`], but every number is the change since `base` (allocators created since
/// then count from zero; those dropped since then are left out).
pub fn dump_since(base: &Snapshot, w: &mut impl io::Write) -> io::Result<()> {
    let rows: Vec<_> = all()
        .iter()
        .map(|s| {
            let mut cols = columns(s);
            if let Some(b) = base.rows.iter().find(|b| b.id == s.id) {
                for (c, old) in cols.iter_mut().zip(columns(b)) {
                    *c -= old;
                }
            }
            (s.name.to_string(), s.object_size.to_string(), cols)
        })
        .collect();
    write_table(w, &rows)
}
