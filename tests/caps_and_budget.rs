//! Caps on live objects with recycling allocators, the thread-cache budget against
//! trims and drops with parked owners, budgets of zero-sized objects, and pool growth in
//! place. The permit tests of recycling allocators failed before permits were returned
//! for discarded values and for a panicking `create`; the others held and stay as guards.

use std::sync::atomic::Ordering;
use std::sync::{mpsc, Arc, Mutex, MutexGuard};

use proxalloc::{
    AllocError, CacheMode, ClassAllocator, ClassBox, Config, Pool, Recycle, RecyclingAllocator,
};

static SERIAL: Mutex<()> = Mutex::new(());
fn serial() -> MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|e| e.into_inner())
}

#[path = "common/books.rs"]
mod books;
use books::assert_nothing_lost;

/// The thread-cache budget in use once every stash is taken back (earlier tests' threads
/// may still be tearing down with grants).
fn settled_budget() -> usize {
    proxalloc::trim_all();
    proxalloc::thread_cache_budget().0
}

struct Refused(#[allow(dead_code)] u64);
impl Recycle for Refused {
    fn create() -> Self {
        Refused(0)
    }
    fn recycle(&mut self) -> bool {
        false // never kept: every drop goes through `discard` / `release_dead`
    }
}

#[test]
fn a_capped_recycling_allocator_returns_the_permit_of_a_discarded_value() {
    let _s = serial();
    let a = RecyclingAllocator::<Refused>::with_config(
        "cap-recycle-discard",
        Config::new().max_live(2),
    );
    for i in 0..5 {
        let h = a.try_get();
        assert!(
            h.is_ok(),
            "get #{i} refused with 0 values live: {}",
            a.stats()
        );
        drop(h);
    }
}

struct Panicky(#[allow(dead_code)] u64);
impl Recycle for Panicky {
    fn create() -> Self {
        Panicky(0)
    }
    fn recycle(&mut self) -> bool {
        panic!("recycle panics")
    }
}

#[test]
fn a_capped_recycling_allocator_returns_the_permit_when_recycle_panics() {
    let _s = serial();
    let a =
        RecyclingAllocator::<Panicky>::with_config("cap-recycle-panic", Config::new().max_live(1));
    for i in 0..3 {
        let h = a.try_get();
        assert!(
            h.is_ok(),
            "get #{i} refused with 0 values live: {}",
            a.stats()
        );
        let h = h.unwrap();
        let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(move || drop(h)));
    }
}

/// Permits survive thread churn, remote frees and steals: at the end exactly `CAP`
/// objects can be live.
#[test]
fn permits_are_conserved_across_thread_churn() {
    let _s = serial();
    const CAP: usize = 64;
    static CAPPED: ClassAllocator<[u64; 2]> = ClassAllocator::with_config(
        "cap-thread-churn",
        Config::new().max_live(CAP).magazine_size(4),
    );
    let rounds = if cfg!(miri) { 2 } else { 20 };
    for r in 0..rounds {
        let (tx, rx) = mpsc::channel::<ClassBox<'static, [u64; 2]>>();
        let hs: Vec<_> = (0..3)
            .map(|t| {
                let tx = tx.clone();
                std::thread::spawn(move || {
                    let mut mine = Vec::new();
                    while let Ok(h) = CAPPED.try_alloc([t, r]) {
                        mine.push(h);
                        if mine.len() == 7 {
                            break;
                        }
                    }
                    // half freed here, half sent to main
                    let n = mine.len() / 2;
                    for h in mine.drain(..n) {
                        tx.send(h).unwrap();
                    }
                    drop(mine);
                })
            })
            .collect();
        drop(tx);
        for h in hs {
            h.join().unwrap();
        }
        let got: Vec<_> = rx.iter().collect();
        drop(got);
    }
    let all: Vec<_> = (0..CAP).map(|i| CAPPED.try_alloc([i as u64, 0])).collect();
    let ok = all.iter().filter(|h| h.is_ok()).count();
    assert_eq!(ok, CAP, "permits lost: {}", CAPPED.stats());
    assert_eq!(
        CAPPED.try_alloc([0, 0]).err(),
        Some(AllocError),
        "permits created"
    );
}

fn batch(a: &ClassAllocator<[u64; 8]>, n: u64) {
    let live: Vec<_> = (0..n).map(|i| a.alloc([i; 8])).collect();
    drop(live);
}

/// A worker grows a stash, parks; trim_all from main takes it; the worker resumes using
/// the allocator, then exits; the budget comes back to 0. Then allocator drop while a
/// parked worker holds a grown stash.
#[test]
fn the_budget_returns_to_zero_after_trim_and_drop_with_a_parked_owner() {
    let _s = serial();
    let base = settled_budget();
    let a = Arc::new(ClassAllocator::<[u64; 8]>::with_config(
        "growth-parked-trim",
        Config::new()
            .mode(CacheMode::ThreadCaches)
            .magazine_size(16),
    ));
    let n = if cfg!(miri) { 128 } else { 1024 };
    for phase in 0..2 {
        let (go_tx, go_rx) = mpsc::channel::<()>();
        let (ready_tx, ready_rx) = mpsc::channel::<()>();
        let a2 = Arc::clone(&a);
        let h = std::thread::spawn(move || {
            for _ in 0..4 {
                batch(&a2, n);
            }
            ready_tx.send(()).unwrap();
            go_rx.recv().unwrap();
            for _ in 0..4 {
                batch(&a2, n);
            }
            ready_tx.send(()).unwrap();
            go_rx.recv().unwrap();
        });
        ready_rx.recv().unwrap();
        assert!(
            proxalloc::thread_cache_budget().0 > base,
            "phase {phase}: grew"
        );
        proxalloc::trim_all();
        assert_eq!(
            proxalloc::thread_cache_budget().0,
            base,
            "phase {phase}: seized"
        );
        go_tx.send(()).unwrap();
        ready_rx.recv().unwrap();
        if phase == 1 {
            // Drop the allocator (only reference left is the worker's clone: swap it out).
            let s = a.stats();
            assert!(s.is_consistent(), "{s}");
        }
        go_tx.send(()).unwrap();
        h.join().unwrap();
        assert_eq!(
            proxalloc::thread_cache_budget().0,
            base,
            "phase {phase}: exit"
        );
        let s = a.stats();
        assert!(s.is_consistent() && s.live == 0, "{s}");
        assert_nothing_lost(&a, 0);
    }
}

/// Allocator dropped while another thread's cache holds a grown stash (parked owner).
#[test]
fn dropping_an_allocator_with_a_parked_owner_returns_its_grant() {
    let _s = serial();
    let base = settled_budget();
    let n = if cfg!(miri) { 128 } else { 1024 };
    let a = Arc::new(ClassAllocator::<[u64; 8]>::with_config(
        "growth-parked-drop",
        Config::new()
            .mode(CacheMode::ThreadCaches)
            .magazine_size(16),
    ));
    let (go_tx, go_rx) = mpsc::channel::<()>();
    let (ready_tx, ready_rx) = mpsc::channel::<()>();
    let a2 = Arc::clone(&a);
    let h = std::thread::spawn(move || {
        for _ in 0..4 {
            batch(&a2, n);
        }
        drop(a2);
        ready_tx.send(()).unwrap();
        go_rx.recv().unwrap();
        // Uses another allocator: its slow paths sweep the dead cache.
        let b = ClassAllocator::<u64>::with_config(
            "growth-parked-other",
            Config::new().mode(CacheMode::ThreadCaches),
        );
        let v: Vec<_> = (0..200).map(|i| b.alloc(i)).collect();
        drop(v);
    });
    ready_rx.recv().unwrap();
    assert!(proxalloc::thread_cache_budget().0 > base);
    let Ok(a) = Arc::try_unwrap(a) else {
        panic!("the worker kept a reference")
    };
    drop(a);
    assert_eq!(
        proxalloc::thread_cache_budget().0,
        base,
        "drop seized the grant"
    );
    go_tx.send(()).unwrap();
    h.join().unwrap();
    assert_eq!(proxalloc::thread_cache_budget().0, base);
}

// ---- Pool bump ----

#[test]
fn pool_vec_growth_does_not_overwrite_neighbours() {
    let _s = serial();
    use allocator_api2::vec::Vec as AVec;
    let pool = Pool::new();
    let mut v1: AVec<u8, &Pool> = AVec::new_in(&pool);
    v1.extend_from_slice(&[1; 13]);
    let mut v2: AVec<u8, &Pool> = AVec::new_in(&pool);
    v2.extend_from_slice(&[2; 3]);
    v1.shrink_to_fit(); // not last: nothing
    v2.shrink_to_fit(); // last
    for _ in 0..100 {
        v1.push(1);
    }
    for _ in 0..100 {
        v2.push(2);
    }
    assert!(v1.iter().all(|&x| x == 1) && v2.iter().all(|&x| x == 2));
    // zero-size then grow, high alignment
    let mut v3: AVec<u128, &Pool> = AVec::new_in(&pool);
    let mut v4: AVec<[u8; 3], &Pool> = AVec::new_in(&pool);
    for i in 0..50 {
        v3.push(i);
        v4.push([i as u8; 3]);
    }
    assert!(v3.iter().enumerate().all(|(i, &x)| x == i as u128));
    assert!(v4.iter().enumerate().all(|(i, &x)| x == [i as u8; 3]));
    assert_eq!(v3.as_ptr() as usize % 16, 0);
    v3.truncate(1);
    v3.shrink_to_fit();
    let mut v5: AVec<u8, &Pool> = AVec::new_in(&pool);
    v5.extend_from_slice(&[5; 40]);
    v3.extend(0..40u128);
    assert!(v5.iter().all(|&x| x == 5), "v5 overwritten");
}

static CREATE_PANICS: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);
struct MaybePanicky(#[allow(dead_code)] u64);
impl Recycle for MaybePanicky {
    fn create() -> Self {
        if CREATE_PANICS.load(Ordering::Relaxed) {
            panic!("create panics");
        }
        MaybePanicky(0)
    }
    fn recycle(&mut self) -> bool {
        true
    }
}

#[test]
fn a_capped_recycling_allocator_returns_the_permit_when_create_panics() {
    let _s = serial();
    let a = RecyclingAllocator::<MaybePanicky>::with_config(
        "cap-create-panic",
        Config::new().max_live(1),
    );
    CREATE_PANICS.store(true, Ordering::Relaxed);
    let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| drop(a.try_get())));
    assert!(r.is_err());
    CREATE_PANICS.store(false, Ordering::Relaxed);
    let h = a.try_get();
    assert!(h.is_ok(), "refused with 0 values live: {}", a.stats());
}

#[test]
fn a_capped_alloc_with_whose_init_panics_returns_its_permit() {
    let _s = serial();
    let a = ClassAllocator::<u64>::with_config("cap-init-panic", Config::new().max_live(1));
    for _ in 0..3 {
        let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            drop(a.alloc_with(|| panic!("init")))
        }));
        assert!(r.is_err());
    }
    assert!(a.try_alloc(1).is_ok(), "{}", a.stats());
    a.with_local(|c| {
        let x = c.alloc(5);
        assert!(a.try_alloc(2).is_err());
        c.free(x);
        let y = c.alloc(6);
        drop(y);
    });
    assert!(a.try_alloc(1).is_ok(), "{}", a.stats());
}

/// Owner pushes/pops its stash while another thread trims repeatedly.
#[test]
fn trim_all_races_an_owner_using_its_stash() {
    let _s = serial();
    let base = settled_budget();
    let a = Arc::new(ClassAllocator::<[u64; 8]>::with_config(
        "trim-all-stash-race",
        Config::new().magazine_size(4),
    ));
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let (n, rounds) = if cfg!(miri) { (48, 6) } else { (512, 2000) };
    let hs: Vec<_> = (0..2)
        .map(|t| {
            let (a, stop) = (Arc::clone(&a), Arc::clone(&stop));
            std::thread::spawn(move || {
                let mut k = 0u64;
                while !stop.load(Ordering::Relaxed) || k < 4 {
                    let live: Vec<_> = (0..n).map(|i| a.alloc([i + t; 8])).collect();
                    for (i, x) in live.iter().enumerate() {
                        assert_eq!(x[0], i as u64 + t);
                        assert_eq!(x[7], i as u64 + t);
                    }
                    drop(live);
                    k += 1;
                }
            })
        })
        .collect();
    for _ in 0..rounds {
        proxalloc::trim_all();
        std::thread::yield_now();
    }
    stop.store(true, Ordering::Relaxed);
    for h in hs {
        h.join().unwrap();
    }
    let s = a.stats();
    assert!(s.is_consistent() && s.live == 0, "{s}");
    assert_eq!(proxalloc::thread_cache_budget().0, base);
    assert_nothing_lost(&a, 0);
}

/// Budgets charge each cached object its slot in a magazine as well as its own bytes, so
/// they bound zero-sized objects too: with no depot budget the depot keeps none of them
/// (it kept every one: 100,000 objects over 1,563 spills).
#[test]
fn a_depot_budget_of_zero_keeps_no_zero_sized_object() {
    let _s = serial();
    let a = ClassAllocator::<()>::with_config(
        "zst-depot-zero",
        Config::new()
            .mode(CacheMode::ThreadCaches)
            .depot_bytes(0)
            .thread_cache_growth_bytes(0),
    );
    let n = if cfg!(miri) { 2_000 } else { 100_000 };
    drop((0..n).map(|_| a.alloc(())).collect::<Vec<_>>());
    let s = a.stats();
    assert_eq!(s.cached_in_depot, 0, "{s}");
    let mag = Config::DEFAULT_MAGAZINE_SIZE as u64;
    assert!(s.cached_in_threads <= 2 * mag, "two magazines at most: {s}");
    assert!(s.overflows > 0 && s.is_consistent() && s.live == 0, "{s}");
    assert_nothing_lost(&a, 0);
}

/// A stash's grant pays for each magazine's slots, so one grant cannot buy an unbounded
/// number of magazines of zero-sized objects (a 1 MiB grant bought 2^20 magazines, about
/// 512 MiB of slot arrays).
#[test]
fn a_stash_of_zero_sized_objects_stays_within_its_grant() {
    let _s = serial();
    let growth = 4096;
    let a = ClassAllocator::<()>::with_config(
        "zst-stash-grant",
        Config::new().thread_cache_growth_bytes(growth),
    );
    let n = if cfg!(miri) { 2_000 } else { 100_000 };
    for _ in 0..3 {
        drop((0..n).map(|_| a.alloc(())).collect::<Vec<_>>());
    }
    let s = a.stats();
    let slot = std::mem::size_of::<*mut u8>() as u64;
    let mag = Config::DEFAULT_MAGAZINE_SIZE as u64;
    assert!(
        s.cached_in_threads <= 2 * mag + growth as u64 / slot,
        "two magazines and what the grant pays for: {s}"
    );
    assert!(s.cached_in_threads > 2 * mag, "the stash did grow: {s}");
    a.release_thread_cache();
    assert_eq!(settled_budget(), 0);
}
