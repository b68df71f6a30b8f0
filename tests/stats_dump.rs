//! Named stats: exactness under multi-thread use, the dump table, baselines, `trim_all`.

use proxalloc::{stats, ClassAllocator, Config};

/// Taken by `trim_all_returns_every_cached_byte_when_nothing_is_live` and by the tests
/// that count what is cached: its `trim_all` releases every allocator's and every block
/// source's cache, other tests' included.
static TRIM_ALL: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn no_trim_all() -> std::sync::MutexGuard<'static, ()> {
    TRIM_ALL.lock().unwrap_or_else(|e| e.into_inner())
}

fn dump_string() -> String {
    let mut out = Vec::new();
    stats::dump(&mut out).unwrap();
    String::from_utf8(out).unwrap()
}

/// The numeric columns of this allocator's row in a dump.
fn row(table: &str, name: &str) -> Vec<i128> {
    let line = table
        .lines()
        .find(|l| l.split_whitespace().next() == Some(name))
        .unwrap_or_else(|| panic!("no row for {name} in\n{table}"));
    line.split_whitespace()
        .skip(1)
        .map(|c| c.parse().unwrap())
        .collect()
}

#[test]
fn stats_are_exact_after_multi_thread_use() {
    let a = ClassAllocator::<[u64; 4]>::with_config("stats-mt", Config::new().magazine_size(8));
    std::thread::scope(|s| {
        for t in 0..4u64 {
            let a = &a;
            s.spawn(move || {
                for round in 0..50 {
                    let v: Vec<_> = (0..(10 + t * 7 + round % 5))
                        .map(|i| a.alloc([i; 4]))
                        .collect();
                    drop(v);
                }
            });
        }
    });
    let expected: u64 = (0..4u64)
        .map(|t| (0..50u64).map(|r| 10 + t * 7 + r % 5).sum::<u64>())
        .sum();
    let s = a.stats();
    assert_eq!((s.allocs, s.frees, s.live), (expected, expected, 0), "{s}");
    assert_eq!(
        s.live + s.cached_in_threads + s.cached_in_depot,
        s.reserved_objects(),
        "{s}"
    );
    assert!(s.refills > 0 && s.spills > 0, "{s}");
}

#[test]
fn dump_has_a_row_per_allocator_and_a_total() {
    let a = ClassAllocator::<[u8; 48]>::new("dump-a");
    let b = ClassAllocator::<[u8; 200]>::new("dump-b");
    let keep_a: Vec<_> = (0..3).map(|_| a.alloc([0; 48])).collect();
    let keep_b = b.alloc([1; 200]);
    let table = dump_string();
    let header = table.lines().next().unwrap();
    for col in [
        "name",
        "size",
        "live",
        "thread-cached",
        "depot-cached",
        "reserved-bytes",
        "allocs",
        "refills",
        "spills",
        "overflows",
        "backing-allocs",
    ] {
        assert!(header.contains(col), "missing column {col}: {header}");
    }
    // size, live, thread-cached, depot-cached, reserved bytes, allocs
    assert_eq!(row(&table, "dump-a")[..6], [48, 3, 0, 0, 3 * 48, 3]);
    assert_eq!(row(&table, "dump-b")[..6], [200, 1, 0, 0, 200, 1]);
    assert!(table.lines().last().unwrap().starts_with("TOTAL"));
    drop(keep_a);
    drop(keep_b);
    drop(b);
    assert!(
        stats::all().iter().all(|s| s.name != "dump-b"),
        "a dropped allocator leaves the list"
    );
    assert!(stats::all().iter().any(|s| s.name == "dump-a"));
}

#[test]
fn dump_since_shows_the_change() {
    let a = ClassAllocator::<u64>::new("since");
    drop(a.alloc(0));
    let base = stats::snapshot();
    assert!(base.rows().iter().any(|s| s.name == "since"));
    let held: Vec<_> = (0..5).map(|i| a.alloc(i)).collect();
    let mut out = Vec::new();
    stats::dump_since(&base, &mut out).unwrap();
    let delta = String::from_utf8(out).unwrap();
    // size stays, live +5, allocs +5
    let r = row(&delta, "since");
    assert_eq!((r[1], r[5]), (5, 5), "{delta}");
    drop(held);
}

/// A baseline row belongs to one allocator (its id), not to every allocator of its name:
/// an allocator created after the snapshot, named like one in it, shows all its counts.
#[test]
fn table_since_matches_rows_by_allocator_not_by_name() {
    let old = ClassAllocator::<u64>::new("since-twin");
    let held: Vec<_> = (0..3).map(|i| old.alloc(i)).collect();
    let base = stats::snapshot();
    let new = ClassAllocator::<u64>::new("since-twin");
    let more: Vec<_> = (0..2).map(|i| new.alloc(i)).collect();
    let table = stats::table_since(&base);
    let mut allocs: Vec<i64> = table
        .rows
        .iter()
        .filter(|r| r.name == "since-twin")
        .map(|r| r.allocs)
        .collect();
    allocs.sort_unstable();
    assert_eq!(allocs, [0, 2], "{table:?}");
    drop((held, more));
}

#[test]
fn trim_all_returns_every_cached_byte_when_nothing_is_live() {
    let _trim_all = no_trim_all();
    static A: ClassAllocator<[u8; 96]> = ClassAllocator::new("trim-all-a");
    let b = ClassAllocator::<[u8; 160]>::new("trim-all-b");
    std::thread::scope(|s| {
        s.spawn(|| {
            drop((0..300).map(|_| A.alloc([0; 96])).collect::<Vec<_>>());
            drop((0..300).map(|_| b.alloc([0; 160])).collect::<Vec<_>>());
            A.release_thread_cache();
            b.release_thread_cache();
        });
    });
    drop((0..100).map(|_| A.alloc([0; 96])).collect::<Vec<_>>());
    assert!(A.stats().cached_bytes() > 0 && b.stats().cached_bytes() > 0);
    let released = proxalloc::trim_all();
    for s in [A.stats(), b.stats()] {
        assert_eq!(
            (s.live, s.cached_in_threads, s.cached_in_depot),
            (0, 0, 0),
            "{s}"
        );
        assert_eq!(s.reserved_bytes(), 0, "{s}");
    }
    assert!(released >= 300 * 96 + 300 * 160, "released {released}");
}

/// A block source's large blocks vary in size, so their row counts blocks; the dump's
/// reserved bytes for it are the source's own: in pools' hands and cached.
#[test]
fn the_dump_shows_the_bytes_of_a_sources_large_blocks() {
    let _trim_all = no_trim_all(); // the cached block stays cached until the row is read
    let source = proxalloc::BlockSource::new(8 << 20);
    let live = source.alloc(300 << 10).expect("memory");
    let cached = source.alloc(200 << 10).expect("memory");
    // SAFETY: the block came from `source` and is not used again.
    unsafe { source.free(cached) };
    let b = stats::block_sources();
    let b = b
        .iter()
        .find(|b| b.large_live_blocks == 1 && b.large_cached_blocks == 1);
    let b = b.expect("this source's stats");
    let want = b.large_live_bytes + b.large_cached_bytes;
    assert!(want >= (500 << 10), "{b:?}");
    let table = stats::table();
    let row = table
        .rows
        .iter()
        .find(|r| r.name == "pool-blocks-large" && r.reserved_bytes == want as i64);
    assert!(
        row.is_some(),
        "no large-block row with {want} reserved bytes: {table:?}"
    );
    // SAFETY: as above.
    unsafe { source.free(live) };
}
