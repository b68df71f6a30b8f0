//! Metrics export: `stats::for_each`, dumps as data (`stats::table`), their serde round
//! trip (feature `serde`) and the `metrics` facade (feature `metrics`).

use proxalloc::{stats, ClassAllocator};

/// Held by the tests that make block sources, so that sums over all sources are exact.
#[cfg(any(feature = "serde", feature = "metrics"))]
static SOURCES: std::sync::Mutex<()> = std::sync::Mutex::new(());

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
    use proxalloc::{BlockSource, Pool};

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

    #[test]
    fn pool_and_source_stats_survive_json() {
        let _sources = SOURCES.lock().unwrap_or_else(|e| e.into_inner());
        let source = BlockSource::new(2 << 20);
        let pool = Pool::with_source(&source);
        let _ = pool.alloc_str("serialized");
        let s = pool.stats();
        let json = serde_json::to_string(&s).unwrap();
        assert!(
            json.contains(&format!(r#""used_bytes":{}"#, s.used_bytes)),
            "{json}"
        );
        assert_eq!(
            serde_json::from_str::<proxalloc::PoolStats>(&json).unwrap(),
            s
        );

        let src = source.source_stats();
        let json = serde_json::to_string(&src).unwrap();
        assert!(json.contains(r#""max_free":2097152"#), "{json}");
        assert_eq!(
            serde_json::from_str::<proxalloc::BlockSourceStats>(&json).unwrap(),
            src
        );
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
    use proxalloc::{BlockSource, Pool};

    use super::*;

    /// A metric's kind (`"gauge"`, ...), unit and help text, as described.
    type Description = (&'static str, Option<Unit>, String);

    /// A recorder that keeps the last value of each `metric{labels}`, and each metric's
    /// description.
    #[derive(Default)]
    struct Capture {
        values: Arc<Mutex<BTreeMap<String, f64>>>,
        described: Mutex<BTreeMap<String, Description>>,
    }

    struct Cell(Arc<Mutex<BTreeMap<String, f64>>>, String);

    impl CounterFn for Cell {
        fn increment(&self, v: u64) {
            *self.0.lock().unwrap().entry(self.1.clone()).or_default() += v as f64;
        }
        fn absolute(&self, v: u64) {
            // "At least" `v`, as the `metrics` crate's contract has it.
            let mut values = self.0.lock().unwrap();
            let e = values.entry(self.1.clone()).or_default();
            *e = e.max(v as f64);
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
                self.values.clone(),
                format!("{}{{{}}}", key.name(), labels.join(",")),
            ))
        }

        fn describe(
            &self,
            kind: &'static str,
            key: KeyName,
            unit: Option<Unit>,
            help: SharedString,
        ) {
            self.described
                .lock()
                .unwrap()
                .insert(key.as_str().to_string(), (kind, unit, help.to_string()));
        }
    }

    impl Recorder for Capture {
        fn describe_counter(&self, key: KeyName, unit: Option<Unit>, help: SharedString) {
            self.describe("counter", key, unit, help);
        }
        fn describe_gauge(&self, key: KeyName, unit: Option<Unit>, help: SharedString) {
            self.describe("gauge", key, unit, help);
        }
        fn describe_histogram(&self, key: KeyName, unit: Option<Unit>, help: SharedString) {
            self.describe("histogram", key, unit, help);
        }
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

    /// Held by every call of `record_metrics` here, and across a test's calls where
    /// another test's call between them would change what they see: the names the
    /// previous call reported are the process's, whichever recorder it used.
    static RECORDING: Mutex<()> = Mutex::new(());

    /// `record_metrics` into `capture`.
    fn record(capture: &Capture) {
        let _one_at_a_time = RECORDING.lock().unwrap_or_else(|e| e.into_inner());
        metrics::with_local_recorder(capture, stats::record_metrics);
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
        record(&capture);
        let values = capture.values.lock().unwrap();
        let get = |m: &str| values[&format!("{m}{{allocator=export-metrics}}")];
        assert_eq!(get("proxalloc_live_objects"), 5.0);
        assert_eq!(get("proxalloc_allocs_total"), 6.0);
        assert_eq!(get("proxalloc_frees_total"), 1.0);
        assert_eq!(get("proxalloc_reserved_bytes"), 6.0 * 32.0);
        assert_eq!(get("proxalloc_cached_bytes"), 32.0, "the freed one, cached");
        assert!(values.contains_key("proxalloc_threads{allocator=export-metrics}"));
        drop((held_a, held_b));
    }

    /// The last allocator of a name dropped: the next call zeroes that name's metrics
    /// instead of leaving its gauges at their last values.
    #[test]
    fn a_dropped_allocators_gauges_go_to_zero() {
        let a = ClassAllocator::<[u8; 48]>::new("export-metrics-dropped");
        let held: Vec<_> = (0..4).map(|_| a.alloc([0; 48])).collect();
        let capture = Capture::default();
        let get = |m: &str| {
            capture.values.lock().unwrap()[&format!("{m}{{allocator=export-metrics-dropped}}")]
        };
        // No other test's call between these two: it would zero the dropped name in
        // its own recorder, and this one would not see it go.
        let both = RECORDING.lock().unwrap_or_else(|e| e.into_inner());
        metrics::with_local_recorder(&capture, stats::record_metrics);
        assert_eq!(get("proxalloc_live_objects"), 4.0);
        assert_eq!(get("proxalloc_reserved_bytes"), 4.0 * 48.0);
        drop(held);
        drop(a);
        metrics::with_local_recorder(&capture, stats::record_metrics);
        drop(both);
        for m in [
            "proxalloc_live_objects",
            "proxalloc_thread_cached_objects",
            "proxalloc_depot_cached_objects",
            "proxalloc_cached_bytes",
            "proxalloc_reserved_bytes",
        ] {
            assert_eq!(get(m), 0.0, "{m} after the allocator's drop");
        }
        // A counter keeps its largest value.
        assert_eq!(get("proxalloc_allocs_total"), 4.0);
    }

    /// A recorder that calls `record_metrics` back from inside a call: the inner call
    /// returns at once (it would wait on the outer call's lock for ever).
    #[test]
    fn a_recorder_that_calls_back_does_not_deadlock() {
        struct CallsBack(Capture);
        impl Recorder for CallsBack {
            fn describe_counter(&self, key: KeyName, unit: Option<Unit>, help: SharedString) {
                self.0.describe_counter(key, unit, help);
            }
            fn describe_gauge(&self, key: KeyName, unit: Option<Unit>, help: SharedString) {
                self.0.describe_gauge(key, unit, help);
            }
            fn describe_histogram(&self, key: KeyName, unit: Option<Unit>, help: SharedString) {
                self.0.describe_histogram(key, unit, help);
            }
            fn register_counter(&self, key: &Key, m: &Metadata<'_>) -> Counter {
                stats::record_metrics();
                self.0.register_counter(key, m)
            }
            fn register_gauge(&self, key: &Key, m: &Metadata<'_>) -> Gauge {
                stats::record_metrics();
                self.0.register_gauge(key, m)
            }
            fn register_histogram(&self, key: &Key, m: &Metadata<'_>) -> Histogram {
                self.0.register_histogram(key, m)
            }
        }
        let a = ClassAllocator::<[u8; 40]>::new("export-metrics-calls-back");
        drop(a.alloc([0; 40]));
        let recorder = CallsBack(Capture::default());
        let _one_at_a_time = RECORDING.lock().unwrap_or_else(|e| e.into_inner());
        metrics::with_local_recorder(&recorder, stats::record_metrics);
        let values = recorder.0.values.lock().unwrap();
        assert_eq!(
            values["proxalloc_allocs_total{allocator=export-metrics-calls-back}"],
            1.0
        );
    }

    #[test]
    fn every_metric_is_described_with_its_kind_and_unit() {
        let a = ClassAllocator::<u64>::new("export-described");
        let x = a.alloc(1);
        let capture = Capture::default();
        record(&capture);
        let values = capture.values.lock().unwrap();
        let described = capture.described.lock().unwrap();
        let names: std::collections::BTreeSet<&str> =
            values.keys().map(|k| &k[..k.find('{').unwrap()]).collect();
        assert!(names.len() >= 18, "{names:?}");
        for name in names {
            let (kind, unit, help) = described
                .get(name)
                .unwrap_or_else(|| panic!("{name} is not described"));
            let expected_kind = if name.ends_with("_total") {
                "counter"
            } else {
                "gauge"
            };
            assert_eq!(*kind, expected_kind, "{name}");
            let expected_unit = if name.ends_with("_bytes") {
                Unit::Bytes
            } else {
                Unit::Count
            };
            assert_eq!(*unit, Some(expected_unit), "{name}");
            assert!(help.len() > 10 && help.ends_with('.'), "{name}: {help:?}");
        }
        assert_eq!(
            described.len(),
            18,
            "nothing described that is not recorded"
        );
        drop(x);
    }

    /// The pool-source metrics add up every source, as the per-allocator ones add up
    /// the allocators of one name.
    #[test]
    fn pool_source_metrics_add_up_every_source() {
        let _sources = SOURCES.lock().unwrap_or_else(|e| e.into_inner());
        let one = BlockSource::new(1 << 20);
        let two = BlockSource::new(3 << 20);
        let all = stats::block_sources();
        assert!(all.contains(&one.source_stats()) && all.contains(&two.source_stats()));
        let capture = Capture::default();
        record(&capture);
        let values = capture.values.lock().unwrap();
        assert_eq!(values["proxalloc_pool_sources{}"], all.len() as f64);
        let max_free: usize = all.iter().map(|s| s.max_free).sum();
        assert_eq!(values["proxalloc_pool_max_free_bytes{}"], max_free as f64);
    }

    #[test]
    fn pools_appear_through_their_block_sources() {
        let _sources = SOURCES.lock().unwrap_or_else(|e| e.into_inner());
        let source = BlockSource::new(1 << 20);
        let mut pool = Pool::with_source(&source);
        let _ = pool.alloc_str("in an 8 KiB block");
        let _ = pool.alloc_slice_fill_with(100_000, |i| i as u8); // a large block: 100 KiB
        let cached = source.alloc(100_000).unwrap(); // another, cached once freed
                                                     // SAFETY: from `source`, not used again.
        unsafe { source.free(cached) };
        let mine = source.source_stats();
        assert_eq!(
            (mine.large_live_blocks, mine.large_live_bytes),
            (1, 102_400),
            "the pool's large block: {mine:?}"
        );
        assert_eq!(
            (mine.large_cached_blocks, mine.large_cached_bytes),
            (1, 102_400)
        );
        assert_eq!((mine.max_free, mine.cached_bytes), (1 << 20, 102_400));
        let all = stats::block_sources();
        assert!(all.contains(&mine));

        let capture = Capture::default();
        record(&capture);
        let values = capture.values.lock().unwrap();
        let sum =
            |f: fn(&proxalloc::BlockSourceStats) -> u64| all.iter().map(f).sum::<u64>() as f64;
        assert_eq!(values["proxalloc_pool_sources{}"], all.len() as f64);
        assert_eq!(
            values["proxalloc_pool_max_free_bytes{}"],
            sum(|s| s.max_free as u64)
        );
        assert_eq!(
            values["proxalloc_pool_cached_bytes{}"],
            sum(|s| s.cached_bytes as u64)
        );
        assert_eq!(
            values["proxalloc_pool_large_live_bytes{}"],
            sum(|s| s.large_live_bytes)
        );
        assert_eq!(
            values["proxalloc_pool_large_cached_bytes{}"],
            sum(|s| s.large_cached_bytes)
        );
        // The large blocks' row carries their bytes, not 0 (the row counts blocks).
        assert_eq!(
            values["proxalloc_reserved_bytes{allocator=pool-blocks-large}"],
            sum(|s| s.large_live_bytes + s.large_cached_bytes)
        );
        assert!(values["proxalloc_live_objects{allocator=pool-blocks-8K}"] >= 1.0);
        drop(values);
        pool.clear();
        assert_eq!(source.source_stats().large_live_bytes, 0, "cleared");
        assert_eq!(source.source_stats().large_cached_bytes, 2 * 102_400);
    }
}
