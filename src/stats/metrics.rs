//! Export to the `metrics` crate's facade (the `metrics` feature).

use super::for_each;

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
