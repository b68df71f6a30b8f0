//! The administrative paths attacked: a recycling allocator whose cached values hold
//! handles of it, so that its last `Arc` drops inside `trim_all` or a thread's exit;
//! exact counts after many threads (more than CPUs) mixing cross-thread frees, trims,
//! `trim_idle` and `release_thread_cache`, proved by a trim that leaves nothing
//! reserved; destructors that re-enter their allocator inside `with_local`; `max_live`
//! permits conserved through panicking constructors and destructors. In every cache
//! mode. From an adversarial review (2026-12-07) that found no bug.
use proxalloc::*;
use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};
use std::sync::{Arc, Mutex, MutexGuard};

#[path = "common/books.rs"]
mod books;

fn serial() -> MutexGuard<'static, ()> {
    static S: Mutex<()> = Mutex::new(());
    S.lock().unwrap_or_else(|e| e.into_inner())
}

static CREATED: AtomicUsize = AtomicUsize::new(0);
static DROPPED: AtomicUsize = AtomicUsize::new(0);

/// A recycled value that may keep a handle of its own allocator (a cycle through the Arc).
struct Node(Option<OwnedRecycled<Node>>);
impl Recycle for Node {
    fn create() -> Self {
        CREATED.fetch_add(1, SeqCst);
        Node(None)
    }
    fn recycle(&mut self) -> bool {
        true // keeps the inner handle: cached values keep the allocator alive
    }
}
impl Drop for Node {
    fn drop(&mut self) {
        DROPPED.fetch_add(1, SeqCst);
    }
}

fn cycle_last_arc_dropped_inside_trim_all(mode: CacheMode) {
    let (c0, d0) = (CREATED.load(SeqCst), DROPPED.load(SeqCst));
    let a = Arc::new(RecyclingAllocator::<Node>::with_config(
        "adv-cycle",
        Config::new().mode(mode).magazine_size(4),
    ));
    // Build values that each hold a handle of the allocator, then cache them.
    let mut outer = Vec::new();
    for _ in 0..10 {
        let mut h = a.get_arc();
        h.0 = Some(a.get_arc());
        outer.push(h);
    }
    drop(outer); // the outer values are cached, each still holding an inner handle
    let weak = Arc::downgrade(&a);
    drop(a); // only the cached values keep it alive now
             // trim_all destroys cached values; their inner handles are recycled, and the last
             // Arc goes with one of them: the allocator drops inside trim_all.
    for _ in 0..4 {
        trim_all();
    }
    let (c, d) = (CREATED.load(SeqCst) - c0, DROPPED.load(SeqCst) - d0);
    assert!(
        weak.upgrade().is_none(),
        "{mode:?}: the allocator outlived the trims"
    );
    assert_eq!(c, d, "{mode:?}: every value dropped exactly once");
}

#[test]
fn cycle_thread_caches() {
    let _s = serial();
    cycle_last_arc_dropped_inside_trim_all(CacheMode::ThreadCaches);
}
#[test]
fn cycle_percpu() {
    let _s = serial();
    cycle_last_arc_dropped_inside_trim_all(CacheMode::PerCpu);
}
#[test]
fn cycle_depot_only() {
    let _s = serial();
    cycle_last_arc_dropped_inside_trim_all(CacheMode::DepotOnly);
}
#[test]
fn cycle_bypass() {
    let _s = serial();
    cycle_last_arc_dropped_inside_trim_all(CacheMode::Bypass);
}

fn cycle_last_arc_dropped_at_thread_exit(mode: CacheMode, depot: usize) {
    let (c0, d0) = (CREATED.load(SeqCst), DROPPED.load(SeqCst));
    let a = Arc::new(RecyclingAllocator::<Node>::with_config(
        "adv-cycle-exit",
        Config::new().mode(mode).magazine_size(4).depot_bytes(depot),
    ));
    let weak = Arc::downgrade(&a);
    std::thread::spawn(move || {
        let mut outer = Vec::new();
        for _ in 0..10 {
            let mut h = a.get_arc();
            h.0 = Some(a.get_arc());
            outer.push(h);
        }
        drop(outer);
        drop(a);
    })
    .join()
    .unwrap();
    for _ in 0..3 {
        trim_all();
    }
    let (c, d) = (CREATED.load(SeqCst) - c0, DROPPED.load(SeqCst) - d0);
    assert!(
        weak.upgrade().is_none(),
        "{mode:?}, depot {depot}: the allocator outlived the trims"
    );
    assert_eq!(
        c, d,
        "{mode:?}, depot {depot}: every value dropped exactly once"
    );
}

#[test]
fn cycle_exit_thread_caches() {
    let _s = serial();
    cycle_last_arc_dropped_at_thread_exit(CacheMode::ThreadCaches, 0);
    cycle_last_arc_dropped_at_thread_exit(CacheMode::ThreadCaches, 1 << 20);
}
#[test]
fn cycle_exit_percpu() {
    let _s = serial();
    cycle_last_arc_dropped_at_thread_exit(CacheMode::PerCpu, 0);
    cycle_last_arc_dropped_at_thread_exit(CacheMode::PerCpu, 1 << 20);
}
#[test]
fn cycle_exit_depot_only() {
    let _s = serial();
    cycle_last_arc_dropped_at_thread_exit(CacheMode::DepotOnly, 0);
    cycle_last_arc_dropped_at_thread_exit(CacheMode::DepotOnly, 1 << 20);
}

/// Exact counters at a quiescent point: many threads (more than CPUs, so per-CPU slow
/// paths meet busy caches and use the spare magazine), cross-thread frees, trims,
/// trim_idle and release_thread_cache from every thread.
fn exact_counts(mode: CacheMode) {
    let a: &'static ClassAllocator<[u64; 2]> = Box::leak(Box::new(ClassAllocator::with_config(
        "adv-exact",
        Config::new().mode(mode).magazine_size(4).depot_bytes(512),
    )));
    let (tx, rx) = std::sync::mpsc::channel::<Vec<ClassBox<'static, [u64; 2]>>>();
    let rx = Arc::new(Mutex::new(rx));
    let total = Arc::new(AtomicUsize::new(0));
    let mut hs = Vec::new();
    for t in 0..8u64 {
        let (tx, rx, total) = (tx.clone(), rx.clone(), total.clone());
        hs.push(std::thread::spawn(move || {
            let mut seed = t * 7919 + 1;
            let mut keep = Vec::new();
            for i in 0..4000u64 {
                seed ^= seed << 13;
                seed ^= seed >> 7;
                seed ^= seed << 17;
                match seed % 16 {
                    0..=7 => {
                        keep.push(a.alloc([i; 2]));
                        total.fetch_add(1, SeqCst);
                    }
                    8..=10 => {
                        keep.pop();
                    }
                    11 => {
                        let batch: Vec<_> = keep.drain(..keep.len() / 2).collect();
                        let _ = tx.send(batch);
                    }
                    12 => {
                        if let Ok(b) = rx.lock().unwrap().try_recv() {
                            drop(b);
                        }
                    }
                    13 => {
                        if i % 5 == 0 {
                            a.trim();
                        }
                    }
                    14 => {
                        if i % 7 == 0 {
                            a.trim_idle();
                        }
                    }
                    _ => {
                        a.release_thread_cache();
                    }
                }
            }
            drop(keep);
        }));
    }
    drop(tx);
    for h in hs {
        h.join().unwrap();
    }
    while let Ok(b) = rx.lock().unwrap().try_recv() {
        drop(b);
    }
    let s = a.stats();
    let n = total.load(SeqCst) as u64;
    assert!(s.is_consistent(), "{s}");
    assert_eq!((s.allocs, s.frees, s.live), (n, n, 0), "{s}");
    // Every other thread exited and this one's cache goes with the trim: nothing may stay
    // reserved (a lost object would show here), nor cached anywhere.
    books::assert_nothing_lost(a, 0);
    let s = a.stats();
    assert_eq!(s.cached_in_threads, 0, "{s}");
}

#[test]
fn exact_percpu() {
    exact_counts(CacheMode::PerCpu);
}
#[test]
fn exact_threads() {
    exact_counts(CacheMode::ThreadCaches);
}
#[test]
fn exact_depot_only() {
    exact_counts(CacheMode::DepotOnly);
}
#[test]
fn exact_bypass() {
    exact_counts(CacheMode::Bypass);
}

/// Objects whose destructor re-enters their own allocator inside `with_local`: releases
/// the thread cache, trims, allocates and frees, reads stats; for an allocator past the
/// inline caches (boxed) and an inline one.
struct Reenter(&'static ClassAllocator<Reenter>, u32);
impl Drop for Reenter {
    fn drop(&mut self) {
        if self.1 > 0 {
            let a = self.0;
            a.release_thread_cache();
            a.trim();
            let inner = a.alloc(Reenter(a, self.1 - 1));
            a.with_local(|lc| {
                let x = lc.alloc(Reenter(a, 0));
                lc.free(x);
            });
            drop(inner);
            let _ = a.stats();
            trim_all();
            a.release_thread_cache();
        }
    }
}

fn reenter_in_with_local(a: &'static ClassAllocator<Reenter>) {
    a.with_local(|lc| {
        let mut v = Vec::new();
        for i in 0..6 {
            v.push(lc.alloc(Reenter(a, i % 3)));
        }
        for h in v.drain(..) {
            lc.free(h);
        }
        a.release_thread_cache();
        let h = lc.alloc(Reenter(a, 2));
        drop(h);
        let h = lc.alloc(Reenter(a, 1));
        lc.free(h);
    });
    let s = a.stats();
    assert!(s.is_consistent(), "{s}");
    assert_eq!(s.live, 0, "{s}");
}

#[test]
fn reentrant_destructors_in_with_local() {
    let _s = serial();
    // Push indices past the inline caches (kept alive).
    let keep: Vec<&'static ClassAllocator<u8>> = (0..40)
        .map(|_| &*Box::leak(Box::new(ClassAllocator::<u8>::new("adv-filler"))))
        .collect();
    for k in &keep {
        drop(k.alloc(1));
    }
    for mode in [
        CacheMode::ThreadCaches,
        CacheMode::DepotOnly,
        CacheMode::PerCpu,
    ] {
        let a: &'static ClassAllocator<Reenter> = Box::leak(Box::new(ClassAllocator::with_config(
            "adv-reenter",
            Config::new().mode(mode).magazine_size(2).depot_bytes(64),
        )));
        reenter_in_with_local(a);
        std::thread::spawn(move || reenter_in_with_local(a))
            .join()
            .unwrap();
        let s = a.stats();
        assert!(s.is_consistent() && s.live == 0, "{s}");
        a.trim();
    }
}

struct Flaky(u64);
impl Drop for Flaky {
    fn drop(&mut self) {
        if self.0 % 5 == 0 {
            panic!("flaky drop");
        }
    }
}

/// After panicking constructors and destructors, refusals, cross-thread frees and thread
/// exits, exactly `max_live` objects can be live again.
fn permits_conserved(mode: CacheMode) {
    const CAP: usize = 64;
    let a: &'static ClassAllocator<Flaky> = Box::leak(Box::new(ClassAllocator::with_config(
        "adv-capped",
        Config::new().mode(mode).max_live(CAP).magazine_size(4),
    )));
    let prev = std::panic::take_hook();
    if std::env::var_os("ADV_LOUD").is_none() {
        std::panic::set_hook(Box::new(|_| {}));
    }
    let (tx, rx) = std::sync::mpsc::channel::<Vec<ClassBox<'static, Flaky>>>();
    let mut hs = Vec::new();
    for t in 0..4u64 {
        let tx = tx.clone();
        hs.push(std::thread::spawn(move || {
            let mut keep = Vec::new();
            for i in 0..2000u64 {
                let k = i * 4 + t;
                match k % 9 {
                    0 => {
                        let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                            a.try_alloc_with(|| -> Flaky { panic!("init") })
                        }));
                    }
                    1..=3 => {
                        if let Ok(Ok(h)) =
                            std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                                a.try_alloc(Flaky(k))
                            }))
                        {
                            keep.push(h);
                        }
                    }
                    4 => {
                        let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                            drop(keep.pop())
                        }));
                    }
                    5 => {
                        let b: Vec<_> = keep.drain(..keep.len() / 2).collect();
                        let _ = tx.send(b);
                    }
                    6 => a.with_local(|lc| {
                        if let Ok(Ok(h)) =
                            std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                                lc.try_alloc(Flaky(k))
                            }))
                        {
                            let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                                lc.free(h)
                            }));
                        }
                    }),
                    7 => a.release_thread_cache(),
                    _ => {
                        a.trim();
                    }
                }
            }
            for h in keep {
                let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| drop(h)));
            }
        }));
    }
    drop(tx);
    for h in hs {
        h.join().unwrap();
    }
    for b in rx.iter() {
        for h in b {
            let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| drop(h)));
        }
    }
    std::panic::set_hook(prev);
    let s = a.stats();
    assert!(s.is_consistent() && s.live == 0, "{s}");
    let mut got = Vec::new();
    while let Ok(h) = a.try_alloc(Flaky(1)) {
        got.push(h);
        assert!(got.len() <= CAP, "more than max_live live objects");
    }
    assert_eq!(got.len(), CAP, "permits lost");
}

#[test]
fn permits_threads() {
    let _s = serial();
    permits_conserved(CacheMode::ThreadCaches);
}
#[test]
fn permits_depot_only() {
    let _s = serial();
    permits_conserved(CacheMode::DepotOnly);
}
#[test]
fn permits_bypass() {
    let _s = serial();
    permits_conserved(CacheMode::Bypass);
}
#[test]
fn permits_percpu() {
    let _s = serial();
    permits_conserved(CacheMode::PerCpu);
}
