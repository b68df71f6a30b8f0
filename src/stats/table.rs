//! Dumps: [`Row`]s and [`Table`]s of every allocator's numbers, or of their changes
//! since a [`Snapshot`], printed in the manner of Traffic Server's
//! `ink_freelists_dump`.

use std::io;

use super::{all, Snapshot, Stats};

// The struct is generated with a column for each counter of `core::counters`.
macro_rules! define_row {
    ($($(#[$attr:meta])* $name:ident $column:literal $doc:literal;)*) => {
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
            /// Free objects in thread caches (or CPU caches).
            pub thread_cached: i64,
            /// Free objects in the depot.
            pub depot_cached: i64,
            /// Bytes obtained from the backing allocator and not returned.
            pub reserved_bytes: i64,
            $($(#[$attr])* #[doc = $doc] pub $name: i64,)*
            /// Objects obtained from the backing allocator.
            pub backing_allocs: i64,
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
                    $($(#[$attr])* $name: signed(s.$name),)*
                    backing_allocs: signed(s.backing_allocs),
                }
            }

            /// The numeric columns, in the dump's order.
            fn columns(&self) -> Vec<i64> {
                let mut v = vec![
                    self.live,
                    self.thread_cached,
                    self.depot_cached,
                    self.reserved_bytes,
                ];
                $($(#[$attr])* v.push(self.$name);)*
                v.push(self.backing_allocs);
                v
            }

            /// The numeric columns, in the dump's order, to write.
            fn columns_mut(&mut self) -> Vec<&mut i64> {
                let mut v = vec![
                    &mut self.live,
                    &mut self.thread_cached,
                    &mut self.depot_cached,
                    &mut self.reserved_bytes,
                ];
                $($(#[$attr])* v.push(&mut self.$name);)*
                v.push(&mut self.backing_allocs);
                v
            }
        }

        /// The dump's column headers, in its order.
        fn header() -> Vec<&'static str> {
            let mut v = vec![
                "name",
                "size",
                "live",
                "thread-cached",
                "depot-cached",
                "reserved-bytes",
            ];
            $($(#[$attr])* v.push($column);)*
            v.push("backing-allocs");
            v
        }
    };
}
crate::core::counters::for_each_counter!(define_row! {});

/// A counter as a row's number (counters never reach `i64::MAX` in practice; they
/// saturate there).
fn signed(v: u64) -> i64 {
    i64::try_from(v).unwrap_or(i64::MAX)
}

impl Row {
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
        let header = header();
        write!(w, "{:<24} {:>8}", header[0], header[1])?;
        for h in &header[2..] {
            write!(w, " {h:>14}")?;
        }
        writeln!(w)?;
        for row in &self.rows {
            row.write(w)?;
        }
        self.total.write(w)
    }
}

/// Every allocator's row now, and their total: [`dump`] as data.
///
/// ```
/// let table = proxalloc::stats::table();
/// assert_eq!(table.rows.len(), proxalloc::stats::all().len());
/// ```
pub fn table() -> Table {
    let rows = crate::registry::all_measured().into_iter().map(|m| {
        let mut row = Row::of(&m.stats);
        row.reserved_bytes = signed(m.reserved_bytes);
        row
    });
    Table::new(rows.collect())
}

/// Every allocator's change since `base`, and the total: [`dump_since`] as data
/// (allocators created since then count from zero; those dropped since then are left
/// out). A [`Snapshot`] keeps no bytes of a block source's large blocks, so their
/// `pool-blocks-large` rows show no change of reserved bytes here ([`table`] shows them).
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
/// objects cached in thread or CPU caches and in the depot, bytes reserved from the system,
/// allocations, frees, refills, spills, overflows (one column per counter), backing
/// allocations) and a total row.
///
/// A server typically calls it from a signal-handling thread or an admin endpoint; see
/// `examples/stats_dump.rs`. [`table`] gives the same rows as data.
///
/// ```
/// // E.g. from an admin endpoint, or a thread that waits for SIGUSR1:
/// proxalloc::stats::dump(&mut std::io::stderr()).unwrap();
/// ```
pub fn dump(w: &mut impl io::Write) -> io::Result<()> {
    table().write(w)?;
    percpu_note(w)
}

/// After a dump's table: a line on per-CPU caches, where a `membarrier` fence failed
/// (see [`super::percpu_status`]); nothing otherwise.
fn percpu_note(w: &mut impl io::Write) -> io::Result<()> {
    let s = super::percpu_status();
    match (&s.disabled, s.fence_failures) {
        (Some(why), n) => writeln!(
            w,
            "note: per-CPU caches are off: {why} ({n} fence failures); per-CPU allocators use per-thread caches"
        ),
        (None, 0) => Ok(()),
        (None, n) => writeln!(
            w,
            "note: {n} membarrier fences failed and were retried after registering again; per-CPU caches work"
        ),
    }
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
    table_since(base).write(w)?;
    percpu_note(w)
}
