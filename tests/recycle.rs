//! Recycling allocators: constructed values are reset and reused; every value is created
//! and dropped exactly once however it leaves (refused, over budget, trim, shutdown).

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};

use proxalloc::{CacheMode, Config, Recycle, RecyclingAllocator, Stats};

/// A header list that counts creations and drops in per-test counters.
struct Headers {
    fields: Vec<(String, String)>,
    counters: &'static Counters,
}

struct Counters {
    created: AtomicUsize,
    dropped: AtomicUsize,
    recycled: AtomicUsize,
    panic_in_recycle: AtomicUsize,
    panic_in_create: AtomicUsize,
}

impl Counters {
    const fn new() -> Self {
        Counters {
            created: AtomicUsize::new(0),
            dropped: AtomicUsize::new(0),
            recycled: AtomicUsize::new(0),
            panic_in_recycle: AtomicUsize::new(0),
            panic_in_create: AtomicUsize::new(0),
        }
    }
    fn live_values(&self) -> usize {
        self.created.load(Relaxed) - self.dropped.load(Relaxed)
    }
}

impl Drop for Headers {
    fn drop(&mut self) {
        self.counters.dropped.fetch_add(1, Relaxed);
    }
}

/// Each test gets its own header type so counters do not mix between parallel tests.
macro_rules! headers_type {
    ($name:ident, $counters:ident) => {
        static $counters: Counters = Counters::new();
        struct $name(Headers);
        impl Recycle for $name {
            fn create() -> Self {
                if $counters.panic_in_create.load(Relaxed) > 0 {
                    $counters.panic_in_create.fetch_sub(1, Relaxed);
                    panic!("create failed");
                }
                $counters.created.fetch_add(1, Relaxed);
                $name(Headers {
                    fields: Vec::new(),
                    counters: &$counters,
                })
            }
            fn recycle(&mut self) -> bool {
                if $counters.panic_in_recycle.load(Relaxed) > 0 {
                    $counters.panic_in_recycle.fetch_sub(1, Relaxed);
                    panic!("recycle failed");
                }
                $counters.recycled.fetch_add(1, Relaxed);
                if self.0.fields.len() > 20 {
                    return false; // grew past the bound: drop it
                }
                for (n, v) in &mut self.0.fields {
                    n.clear();
                    v.clear();
                }
                true
            }
        }
    };
}

fn assert_conserved(s: &Stats) {
    assert!(s.is_consistent(), "objects lost or counted twice: {s}");
}

#[test]
fn values_are_reused_with_their_buffers() {
    headers_type!(H, C);
    let a = RecyclingAllocator::<H>::new("reuse");
    for round in 0..100 {
        let mut h = a.get();
        if h.0.fields.is_empty() {
            h.0.fields
                .resize(20, (String::with_capacity(32), String::with_capacity(64)));
        }
        assert!(
            h.0.fields.iter().all(|(n, v)| n.is_empty() && v.is_empty()),
            "round {round}"
        );
        for (i, (n, v)) in h.0.fields.iter_mut().enumerate() {
            n.push_str("x-header");
            v.push_str(&i.to_string());
        }
    }
    assert_eq!(C.created.load(Relaxed), 1, "one value served every round");
    assert_eq!(C.recycled.load(Relaxed), 100);
    drop(a);
    assert_eq!(
        C.live_values(),
        0,
        "dropping the allocator drops cached values"
    );
}

#[test]
fn refused_values_are_dropped_and_counts_stay_exact() {
    headers_type!(H, C);
    let a = RecyclingAllocator::<H>::new("refuse");
    let mut big = a.get();
    big.0.fields.resize(21, Default::default());
    drop(big); // over the bound: dropped, object released
    assert_eq!(C.dropped.load(Relaxed), 1);
    let s = a.stats();
    assert_eq!((s.allocs, s.frees, s.live), (1, 1, 0), "{s}");
    assert_eq!(s.reserved_objects(), 0, "{s}");
    assert_conserved(&s);
    drop(a.get());
    assert_eq!(C.created.load(Relaxed), 2);
}

#[test]
fn trim_and_budget_drop_cached_values() {
    headers_type!(H, C);
    let cfg = Config::new()
        .magazine_size(4)
        .depot_bytes(8 * std::mem::size_of::<H>());
    let a = RecyclingAllocator::<H>::with_config("budget", cfg);
    let v: Vec<_> = (0..100).map(|_| a.get()).collect();
    drop(v);
    let s = a.stats();
    assert!(s.overflows > 0, "{s}");
    assert_eq!(
        C.live_values() as u64,
        s.cached_in_threads + s.cached_in_depot,
        "{s}"
    );
    a.trim();
    let s = a.stats();
    assert_eq!(s.reserved_objects(), 0, "{s}");
    assert_eq!(C.live_values(), 0, "trim drops what it releases");
}

#[test]
fn panics_in_create_and_recycle_leave_the_allocator_consistent() {
    headers_type!(H, C);
    let a = RecyclingAllocator::<H>::new("panics");
    C.panic_in_create.store(1, Relaxed);
    assert!(catch_unwind(AssertUnwindSafe(|| drop(a.get()))).is_err());
    let s = a.stats();
    assert_eq!(
        (s.allocs, s.backing_allocs, s.reserved_objects()),
        (0, 0, 0),
        "{s}"
    );

    let h = a.get();
    C.panic_in_recycle.store(1, Relaxed);
    assert!(catch_unwind(AssertUnwindSafe(|| drop(h))).is_err());
    assert_eq!(
        C.live_values(),
        0,
        "the value whose recycle panicked was dropped"
    );
    let s = a.stats();
    assert_eq!((s.live, s.reserved_objects()), (0, 0), "{s}");
    assert_conserved(&s);
    drop(a.get());
    assert_eq!(a.stats().live, 0);
}

#[test]
fn values_recycled_on_other_threads_are_reused() {
    headers_type!(H, C);
    let a = RecyclingAllocator::<H>::with_config(
        "threads",
        Config::new().mode(CacheMode::ThreadCaches).magazine_size(8),
    );
    std::thread::scope(|s| {
        let (tx, rx) = std::sync::mpsc::sync_channel(16);
        s.spawn(|| {
            for _ in 0..2000 {
                tx.send(a.get()).unwrap();
            }
            drop(tx);
            a.release_thread_cache();
        });
        s.spawn(|| {
            for h in rx {
                drop(h);
            }
            a.release_thread_cache();
        });
    });
    let s = a.stats();
    assert_eq!((s.allocs, s.frees, s.live), (2000, 2000, 0), "{s}");
    assert!(
        (C.created.load(Relaxed) as u64) < 2000,
        "values came back through the depot"
    );
    assert_eq!(C.live_values() as u64, s.cached_in_depot, "{s}");
    drop(a);
    assert_eq!(C.live_values(), 0);
}

#[test]
fn bypass_mode_creates_and_drops_every_time() {
    headers_type!(H, C);
    let a = RecyclingAllocator::<H>::with_config("bypass", Config::new().mode(CacheMode::Bypass));
    for _ in 0..10 {
        drop(a.get());
    }
    assert_eq!((C.created.load(Relaxed), C.dropped.load(Relaxed)), (10, 10));
}
