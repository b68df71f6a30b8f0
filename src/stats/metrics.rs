//! Export to the `metrics` crate's facade (the `metrics` feature).

use metrics::Unit;

use crate::rows::BlockSourceStats;

/// A metric's kind.
#[derive(Clone, Copy)]
enum Kind {
    Gauge,
    /// Set to its absolute value at each call.
    Counter,
}

/// One exported metric: its name, kind, unit, help text, and where its value comes from.
struct Metric<R: 'static> {
    name: &'static str,
    kind: Kind,
    unit: Unit,
    help: &'static str,
    value: fn(&R) -> u64,
}

// An allocator's row, with its bytes where the row counts blocks of varying sizes (a
// source's `pool-blocks-large`).
use crate::registry::Measured as Row;

/// Per allocator name, labelled `allocator`: these gauges, then a counter for each of
/// `core::counters` (generated), then the backing allocator's two.
const GAUGES: [Metric<Row>; 6] = [
    Metric {
        name: "proxalloc_live_objects",
        kind: Kind::Gauge,
        unit: Unit::Count,
        help: "Objects in users' hands (allocated and not yet freed).",
        value: |r| r.stats.live,
    },
    Metric {
        name: "proxalloc_thread_cached_objects",
        kind: Kind::Gauge,
        unit: Unit::Count,
        help: "Free objects held in threads' or CPUs' caches.",
        value: |r| r.stats.cached_in_threads,
    },
    Metric {
        name: "proxalloc_depot_cached_objects",
        kind: Kind::Gauge,
        unit: Unit::Count,
        help: "Free objects held in the shared depot.",
        value: |r| r.stats.cached_in_depot,
    },
    Metric {
        name: "proxalloc_cached_bytes",
        kind: Kind::Gauge,
        unit: Unit::Bytes,
        help: "Bytes of free objects cached in threads' or CPUs' caches and the depot.",
        value: |r| r.cached_bytes,
    },
    Metric {
        name: "proxalloc_reserved_bytes",
        kind: Kind::Gauge,
        unit: Unit::Bytes,
        help: "Bytes held from the backing allocator (live and cached objects).",
        value: |r| r.reserved_bytes,
    },
    Metric {
        name: "proxalloc_threads",
        kind: Kind::Gauge,
        unit: Unit::Count,
        help: "Thread caches registered.",
        value: |r| r.stats.threads as u64,
    },
];

const BACKING: [Metric<Row>; 2] = [
    Metric {
        name: "proxalloc_backing_allocs_total",
        kind: Kind::Counter,
        unit: Unit::Count,
        help: "Objects obtained from the backing allocator.",
        value: |r| r.stats.backing_allocs,
    },
    Metric {
        name: "proxalloc_backing_frees_total",
        kind: Kind::Counter,
        unit: Unit::Count,
        help: "Objects returned to the backing allocator.",
        value: |r| r.stats.backing_frees,
    },
];

macro_rules! counter_metrics {
    ($($(#[$attr:meta])* $name:ident $column:literal $doc:literal;)*) => {
        /// A counter metric for each of `core::counters`: `proxalloc_<name>_total`.
        // (Pushes: an entry may carry a `cfg`, which `vec![]`'s elements cannot.)
        #[allow(clippy::vec_init_then_push)]
        fn counter_metrics() -> Vec<Metric<Row>> {
            let mut v = Vec::new();
            $($(#[$attr])* v.push(Metric {
                name: concat!("proxalloc_", stringify!($name), "_total"),
                kind: Kind::Counter,
                unit: Unit::Count,
                help: $doc,
                value: |r: &Row| r.stats.$name,
            });)*
            v
        }
    };
}
crate::core::counters::for_each_counter!(counter_metrics! {});

/// The per-allocator metrics' names (for the crate's tests).
#[cfg(test)]
pub(crate) fn names() -> Vec<&'static str> {
    per_allocator().iter().map(|m| m.name).collect()
}

/// Every per-allocator metric, in the export's order.
fn per_allocator() -> Vec<Metric<Row>> {
    let mut v = GAUGES.to_vec();
    v.extend(counter_metrics());
    v.extend(BACKING);
    v
}

// Copy whatever the row type (a derive would ask `R: Copy`): the fields are all `Copy`.
impl<R> Clone for Metric<R> {
    fn clone(&self) -> Self {
        *self
    }
}

impl<R> Copy for Metric<R> {}

/// Over all pool block sources, without labels.
const POOL_SOURCES: [Metric<BlockSourceStats>; 5] = [
    Metric {
        name: "proxalloc_pool_max_free_bytes",
        kind: Kind::Gauge,
        unit: Unit::Bytes,
        help: "Pool block sources' max_free budgets: free block bytes they may cache.",
        value: |s| s.max_free as u64,
    },
    Metric {
        name: "proxalloc_pool_cached_bytes",
        kind: Kind::Gauge,
        unit: Unit::Bytes,
        help: "Bytes of free pool blocks cached under max_free (block-class depots and large buckets).",
        value: |s| s.cached_bytes as u64,
    },
    Metric {
        name: "proxalloc_pool_large_live_bytes",
        kind: Kind::Gauge,
        unit: Unit::Bytes,
        help: "Bytes of large pool blocks (beyond the 64 KiB class) in pools' hands.",
        value: |s| s.large_live_bytes,
    },
    Metric {
        name: "proxalloc_pool_large_cached_bytes",
        kind: Kind::Gauge,
        unit: Unit::Bytes,
        help: "Bytes of large pool blocks cached for reuse.",
        value: |s| s.large_cached_bytes,
    },
    Metric {
        name: "proxalloc_pool_sources",
        kind: Kind::Gauge,
        unit: Unit::Count,
        help: "Pool block sources alive.",
        value: |_| 1,
    },
];

/// Describes every metric (name, unit, help text) to the installed recorder: what a
/// Prometheus exporter prints as `# HELP` (and uses as the unit) for each.
fn describe() {
    let names = per_allocator()
        .into_iter()
        .map(|m| (m.name, m.kind, m.unit, m.help))
        .chain(
            POOL_SOURCES
                .iter()
                .map(|m| (m.name, m.kind, m.unit, m.help)),
        );
    for (name, kind, unit, help) in names {
        match kind {
            Kind::Gauge => metrics::describe_gauge!(name, unit, help),
            Kind::Counter => metrics::describe_counter!(name, unit, help),
        }
    }
}

/// Sets `metric` to `v`, with `labels`.
fn set<R>(metric: &Metric<R>, v: u64, labels: &[(&'static str, &'static str)]) {
    let labels: Vec<metrics::Label> = labels
        .iter()
        .map(|&(k, v)| metrics::Label::from_static_parts(k, v))
        .collect();
    match metric.kind {
        Kind::Gauge => metrics::gauge!(metric.name, labels).set(v as f64),
        Kind::Counter => metrics::counter!(metric.name, labels).absolute(v),
    }
}

/// The allocator names the previous [`record_metrics`] call reported.
static REPORTED: std::sync::Mutex<Vec<&'static str>> = std::sync::Mutex::new(Vec::new());

/// Records every allocator's stats and the pool block sources' numbers through the
/// [`metrics`] crate's facade, into whatever recorder the program installed (a
/// Prometheus exporter, StatsD, ...). Call it periodically or before each scrape; each
/// call sets the current values, and describes every metric (its unit and help text,
/// which a Prometheus exporter prints as `# HELP`), so the descriptions reach a recorder
/// installed after the first call too.
///
/// Rows with the same name are added up (several pool block sources share their
/// rows' names), and every metric has the label `allocator` = the name:
///
/// | metric | kind | unit | value |
/// | --- | --- | --- | --- |
/// | `proxalloc_live_objects` | gauge | count | objects in users' hands |
/// | `proxalloc_thread_cached_objects` | gauge | count | free objects in thread or CPU caches |
/// | `proxalloc_depot_cached_objects` | gauge | count | free objects in the depot |
/// | `proxalloc_cached_bytes` | gauge | bytes | free objects cached (threads or CPUs, and depot) |
/// | `proxalloc_reserved_bytes` | gauge | bytes | held from the backing allocator |
/// | `proxalloc_threads` | gauge | count | thread caches registered |
/// | `proxalloc_allocs_total` | counter | count | objects handed out |
/// | `proxalloc_frees_total` | counter | count | objects given back |
/// | `proxalloc_refills_total` | counter | count | magazines taken from the depot |
/// | `proxalloc_spills_total` | counter | count | magazines given to the depot |
/// | `proxalloc_overflows_total` | counter | count | magazines freed past the depot budget |
/// | `proxalloc_backing_allocs_total` | counter | count | objects from the backing allocator |
/// | `proxalloc_backing_frees_total` | counter | count | objects returned to it |
///
/// Pools appear through their block sources. Each block class is a row
/// (`pool-blocks-8K` … `pool-blocks-64K`: `live` is blocks that pools hold, the bytes
/// gauges their bytes); `pool-blocks-large` is the large blocks, whose bytes gauges
/// count their actual sizes. Over all sources, without labels:
///
/// | metric | kind | unit | value |
/// | --- | --- | --- | --- |
/// | `proxalloc_pool_max_free_bytes` | gauge | bytes | the sources' `max_free` budgets |
/// | `proxalloc_pool_cached_bytes` | gauge | bytes | free blocks cached under them |
/// | `proxalloc_pool_large_live_bytes` | gauge | bytes | large blocks in pools' hands |
/// | `proxalloc_pool_large_cached_bytes` | gauge | bytes | large blocks cached |
/// | `proxalloc_pool_sources` | gauge | count | block sources alive |
///
/// Counters are set with `absolute` to their sums over the name's live allocators, which
/// a recorder keeps only if larger (the `metrics` crate's contract): a counter does not
/// go down when an allocator of its name is dropped. When the last allocator of a name is
/// gone, the next call sets that name's gauges to 0, once, so they do not keep showing
/// objects and bytes that no longer exist. Calls are serialised (a second thread's call
/// waits for the first); a call made from inside one, by a recorder, returns at once.
/// Which names were reported is kept for the process, not per recorder.
///
/// ```
/// use proxalloc::{stats, ClassAllocator};
/// static REQS: ClassAllocator<[u8; 128]> = ClassAllocator::new("doc-metrics-reqs");
/// let r = REQS.alloc([0; 128]);
/// // With a recorder installed (`metrics::set_global_recorder`), e.g. every 10 s:
/// stats::record_metrics();
/// # drop(r);
/// ```
pub fn record_metrics() {
    std::thread_local! {
        /// Set while this thread is inside `record_metrics` (a recorder calling it back).
        static INSIDE: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
    }
    /// Clears `INSIDE` however the call ends.
    struct Leave;
    impl Drop for Leave {
        fn drop(&mut self) {
            let _ = INSIDE.try_with(|i| i.set(false));
        }
    }
    if INSIDE.try_with(|i| i.replace(true)).unwrap_or(true) {
        return;
    }
    let _leave = Leave;
    // One call at a time, from the registry's snapshot to the last value set: the names
    // it reports must be the ones it set, or a call with an older snapshot could zero a
    // name a newer one reported. (A poisoned lock only means another call panicked in a
    // recorder: the list is still a list.)
    let mut reported = REPORTED
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    describe();
    let per_allocator = per_allocator();
    /// One name's rows added up.
    struct Sum {
        name: &'static str,
        values: Vec<u64>,
    }
    let mut sums: Vec<Sum> = Vec::new();
    let mut sources = [0u64; POOL_SOURCES.len()];
    for row in crate::registry::all_measured() {
        if let Some(s) = &row.source {
            for (t, m) in sources.iter_mut().zip(&POOL_SOURCES) {
                *t = t.saturating_add((m.value)(s));
            }
        }
        let stats = row.stats;
        let i = match sums.iter().position(|t| t.name == stats.name) {
            Some(i) => i,
            None => {
                sums.push(Sum {
                    name: stats.name,
                    values: vec![0; per_allocator.len()],
                });
                sums.len() - 1
            }
        };
        for (t, m) in sums[i].values.iter_mut().zip(&per_allocator) {
            *t = t.saturating_add((m.value)(&row));
        }
    }
    for sum in &sums {
        for (m, &v) in per_allocator.iter().zip(&sum.values) {
            set(m, v, &[("allocator", sum.name)]);
        }
    }
    // Names reported before and gone now: their gauges to 0, once, or they would stay at
    // their last values for as long as the exporter runs. (Counters are left: a recorder
    // keeps a counter's largest value.)
    for gone in reported
        .iter()
        .filter(|n| !sums.iter().any(|s| s.name == **n))
    {
        for m in per_allocator
            .iter()
            .filter(|m| matches!(m.kind, Kind::Gauge))
        {
            set(m, 0, &[("allocator", gone)]);
        }
    }
    reported.clear();
    reported.extend(sums.iter().map(|s| s.name));
    for (m, v) in POOL_SOURCES.iter().zip(sources) {
        set(m, v, &[]);
    }
}
