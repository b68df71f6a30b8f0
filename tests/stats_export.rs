//! Metrics export: `stats::for_each`, dumps as data (`stats::table`), their serde round
//! trip (feature `serde`) and the `metrics` facade (feature `metrics`).

use proxalloc::{stats, ClassAllocator};

#[test]
fn for_each_sees_what_all_sees() {
    let a = ClassAllocator::<[u8; 72]>::new("export-for-each");
    let held: Vec<_> = (0..5).map(|_| a.alloc([0; 72])).collect();
    let mut seen = Vec::new();
    stats::for_each(|s| {
        if s.id == a.stats().id {
            seen.push(*s);
        }
    });
    assert_eq!(seen.len(), 1);
    assert_eq!(
        (seen[0].name, seen[0].live, seen[0].object_size),
        ("export-for-each", 5, 72)
    );
    // `f` may use allocators itself: no allocator lock is held while it runs.
    stats::for_each(|_| drop(a.alloc([1; 72])));
    drop(held);
}

#[test]
fn table_matches_the_text_dump() {
    let a = ClassAllocator::<[u8; 40]>::new("export-table");
    let held: Vec<_> = (0..3).map(|_| a.alloc([0; 40])).collect();
    let table = stats::table();
    let row = table
        .rows
        .iter()
        .find(|r| r.name == "export-table")
        .unwrap();
    assert_eq!(row.object_size, Some(40));
    assert_eq!((row.live, row.reserved_bytes, row.allocs), (3, 120, 3));
    assert_eq!(table.total.name, "TOTAL");
    assert_eq!(table.total.object_size, None);
    assert_eq!(
        table.total.live,
        table.rows.iter().map(|r| r.live).sum::<i64>()
    );
    let mut text = Vec::new();
    table.write(&mut text).unwrap();
    let text = String::from_utf8(text).unwrap();
    let line = text
        .lines()
        .find(|l| l.starts_with("export-table"))
        .unwrap();
    let cols: Vec<&str> = line.split_whitespace().collect();
    assert_eq!(cols[1..4], ["40", "3", "0"]);

    let base = stats::snapshot();
    drop(held);
    let delta = stats::table_since(&base);
    let row = delta
        .rows
        .iter()
        .find(|r| r.name == "export-table")
        .unwrap();
    assert_eq!((row.live, row.frees, row.allocs), (-3, 3, 0));
}

#[cfg(feature = "serde")]
mod serde_round_trip {
    use super::*;

    #[test]
    fn a_dump_survives_json() {
        let a = ClassAllocator::<[u64; 6]>::new("export-serde");
        let held: Vec<_> = (0..4).map(|_| a.alloc([0; 6])).collect();
        let table = stats::table();
        let json = serde_json::to_string(&table).unwrap();
        assert!(json.contains(r#""name":"export-serde""#), "{json}");
        assert!(
            json.contains(r#""total":{"name":"TOTAL","object_size":null"#),
            "{json}"
        );
        let back: stats::Table = serde_json::from_str(&json).unwrap();
        assert_eq!(back, table);
        drop(held);
    }

    #[test]
    fn stats_and_snapshots_survive_json_from_a_short_lived_string() {
        let a = ClassAllocator::<u32>::new("export-serde-stats");
        let x = a.alloc(1);
        let s = a.stats();
        // Deserialized from a `String` that is dropped afterwards: the name is interned.
        let json = serde_json::to_string(&s).unwrap();
        let back: proxalloc::Stats = serde_json::from_str(&json).unwrap();
        drop(json);
        assert_eq!(back, s);

        let snap = stats::snapshot();
        let json = serde_json::to_string(&snap).unwrap();
        let back: stats::Snapshot = serde_json::from_str(&json).unwrap();
        assert_eq!(back, snap);
        // A baseline read back works as the original does.
        drop(x);
        let delta = stats::table_since(&back);
        let row = delta
            .rows
            .iter()
            .find(|r| r.name == "export-serde-stats")
            .unwrap();
        assert_eq!((row.live, row.frees), (-1, 1));
    }
}

#[cfg(feature = "metrics")]
mod metrics_facade {
    use std::collections::BTreeMap;
    use std::sync::{Arc, Mutex};

    use metrics::{
        Counter, CounterFn, Gauge, GaugeFn, Histogram, Key, KeyName, Metadata, Recorder,
        SharedString, Unit,
    };

    use super::*;

    /// A recorder that keeps the last value of each `metric{allocator}`.
    #[derive(Default)]
    struct Capture(Arc<Mutex<BTreeMap<String, f64>>>);

    struct Cell(Arc<Mutex<BTreeMap<String, f64>>>, String);

    impl CounterFn for Cell {
        fn increment(&self, v: u64) {
            *self.0.lock().unwrap().entry(self.1.clone()).or_default() += v as f64;
        }
        fn absolute(&self, v: u64) {
            self.0.lock().unwrap().insert(self.1.clone(), v as f64);
        }
    }

    impl GaugeFn for Cell {
        fn increment(&self, v: f64) {
            *self.0.lock().unwrap().entry(self.1.clone()).or_default() += v;
        }
        fn decrement(&self, v: f64) {
            *self.0.lock().unwrap().entry(self.1.clone()).or_default() -= v;
        }
        fn set(&self, v: f64) {
            self.0.lock().unwrap().insert(self.1.clone(), v);
        }
    }

    impl Capture {
        fn cell(&self, key: &Key) -> Arc<Cell> {
            let labels: Vec<String> = key
                .labels()
                .map(|l| format!("{}={}", l.key(), l.value()))
                .collect();
            Arc::new(Cell(
                self.0.clone(),
                format!("{}{{{}}}", key.name(), labels.join(",")),
            ))
        }
    }

    impl Recorder for Capture {
        fn describe_counter(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}
        fn describe_gauge(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}
        fn describe_histogram(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}
        fn register_counter(&self, key: &Key, _: &Metadata<'_>) -> Counter {
            Counter::from_arc(self.cell(key))
        }
        fn register_gauge(&self, key: &Key, _: &Metadata<'_>) -> Gauge {
            Gauge::from_arc(self.cell(key))
        }
        fn register_histogram(&self, _: &Key, _: &Metadata<'_>) -> Histogram {
            Histogram::noop()
        }
    }

    #[test]
    fn record_metrics_sets_gauges_and_counters_by_name() {
        // Two allocators with one name: their rows are added up.
        let a = ClassAllocator::<[u8; 32]>::new("export-metrics");
        let b = ClassAllocator::<[u8; 32]>::new("export-metrics");
        let held_a: Vec<_> = (0..3).map(|_| a.alloc([0; 32])).collect();
        let held_b: Vec<_> = (0..2).map(|_| b.alloc([0; 32])).collect();
        drop(a.alloc([0; 32]));
        let capture = Capture::default();
        metrics::with_local_recorder(&capture, stats::record_metrics);
        let values = capture.0.lock().unwrap();
        let get = |m: &str| values[&format!("{m}{{allocator=export-metrics}}")];
        assert_eq!(get("proxalloc_live_objects"), 5.0);
        assert_eq!(get("proxalloc_allocs_total"), 6.0);
        assert_eq!(get("proxalloc_frees_total"), 1.0);
        assert_eq!(get("proxalloc_reserved_bytes"), 6.0 * 32.0);
        assert!(values.contains_key("proxalloc_threads{allocator=export-metrics}"));
        drop((held_a, held_b));
    }
}
