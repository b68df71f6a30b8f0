//! The counter list (`for_each_counter!`) is the one place a counter is defined: `probe`,
//! a line of the list that only the crate's tests have, reaches every consumer (the
//! counters and their sums, `Stats` and its `Display`, the dump's rows and columns,
//! deltas, serde, the metrics export) with no other code.

use super::Counters;
use crate::{stats, ClassAllocator};

#[test]
fn a_counter_added_in_one_line_reaches_stats_rows_dumps_serde_and_metrics() {
    let a = ClassAllocator::<u64>::new("counters-probe");
    drop(a.alloc(1));
    let base = stats::snapshot();
    // What a retiring cache does with its counters: added to the engine's.
    let cache = Counters::new();
    cache.probe.add_shared(5);
    a.engine().retired.add_shared(&cache);
    a.engine().retired.probe.add_shared(2);

    let s = a.stats();
    assert_eq!(s.probe, 7);
    assert!(s.counters().contains(&("probe", 7)));
    assert!(s.to_string().contains("probe 7"), "{s}");
    assert!(s.is_consistent(), "{s}");

    let row = stats::Row::from(&s);
    assert_eq!(row.probe, 7);
    let mut out = Vec::new();
    stats::dump(&mut out).unwrap();
    let text = String::from_utf8(out).unwrap();
    let header: Vec<&str> = text.lines().next().unwrap().split_whitespace().collect();
    let column = header
        .iter()
        .position(|h| *h == "probe")
        .expect("a probe column");
    let line = text
        .lines()
        .find(|l| l.starts_with("counters-probe"))
        .unwrap();
    assert_eq!(line.split_whitespace().nth(column), Some("7"), "{text}");
    let delta = stats::table_since(&base);
    let since = delta
        .rows
        .iter()
        .find(|r| r.name == "counters-probe")
        .unwrap();
    assert_eq!((since.probe, since.allocs), (7, 0));
    assert!(delta.total.probe >= 7);

    #[cfg(feature = "serde")]
    {
        let json = serde_json::to_value(s).unwrap();
        assert_eq!(json["probe"], 7);
        let back: stats::Row = serde_json::from_value(serde_json::to_value(&row).unwrap()).unwrap();
        assert_eq!(back, row);
    }
    #[cfg(feature = "metrics")]
    assert!(stats::metric_names().contains(&"proxalloc_probe_total"));

    // Zeroed with the rest when a cache is reused.
    cache.reset();
    assert_eq!(cache.probe.get(), 0);

    // The books the probe was added to stay exact: once trimmed, nothing is reserved
    // that is not live (`is_consistent` alone would count a lost object as cached).
    a.trim();
    let s = a.stats();
    assert!(s.is_consistent(), "{s}");
    assert_eq!((s.live, s.reserved_objects()), (0, 0), "{s}");
}
