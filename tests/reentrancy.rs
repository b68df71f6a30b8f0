//! Re-entrancy and lifecycle scenarios an adversarial review tried against the public
//! API: per-CPU allocators used every way at once, destructors and `Recycle` hooks that
//! re-enter trim/stats/`with_local`, users' thread-local destructors that allocate
//! before and after the crate's exit hook, a capped allocator's permits while a cache
//! retires, and the thread-cache budget cut to zero under a grown stash. Each ends with
//! exact books: consistent stats, nothing live or reserved, every value dropped once.

use proxalloc::{
    pformat, set_thread_cache_budget, stats, thread_cache_budget, trim_all, BlockSource, CacheMode,
    ClassAllocator, ClassBox, Config, Pool, Recycle, RecyclingAllocator,
};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering::SeqCst};
use std::sync::{Arc, Mutex, MutexGuard};

fn serial() -> MutexGuard<'static, ()> {
    static S: Mutex<()> = Mutex::new(());
    S.lock().unwrap_or_else(|e| e.into_inner())
}

#[path = "common/books.rs"]
mod books;

/// Consistent books with `live` objects live, and (at a quiescent point: every other
/// thread joined) nothing lost inside the allocator.
fn check<T>(a: &ClassAllocator<T>, live: u64) {
    let s = a.stats();
    assert!(s.is_consistent(), "inconsistent {s}");
    assert_eq!(s.live, live, "{s}");
    books::assert_nothing_lost(a, live);
}

/// A per-CPU allocator from three threads: `alloc_arc`, `release_thread_cache`, `trim`
/// and `with_local` (`try_alloc` included) interleaved, handles freed on a fourth thread.
#[test]
fn percpu_everything() {
    let _s = serial();
    let a = Arc::new(ClassAllocator::<[u64; 4]>::with_config(
        "adv-pc",
        Config::new().mode(CacheMode::PerCpu).magazine_size(4),
    ));
    let mut hs = vec![];
    for t in 0..3 {
        let a = a.clone();
        hs.push(std::thread::spawn(move || {
            let mut keep = vec![];
            for i in 0..5000u64 {
                keep.push(a.alloc_arc([i; 4]));
                if i % 3 == 0 {
                    keep.pop();
                }
                if i % 7 == 0 {
                    a.release_thread_cache();
                }
                if i % 97 == 0 {
                    a.trim();
                }
                if i % 11 == 0 {
                    a.with_local(|c| {
                        let x = c.alloc([t; 4]);
                        let y = c.try_alloc([1; 4]).unwrap();
                        c.free(x);
                        drop(y);
                    });
                }
            }
            keep
        }));
    }
    let kept: Vec<_> = hs.into_iter().flat_map(|h| h.join().unwrap()).collect();
    check(&a, kept.len() as u64);
    let k2 = std::thread::spawn(move || drop(kept)).join();
    k2.unwrap();
    check(&a, 0);
    trim_all();
    let s = a.stats();
    assert_eq!(s.reserved_objects(), 0, "{s}");
}

static PCR_CREATED: AtomicUsize = AtomicUsize::new(0);
static PCR_ARM: AtomicBool = AtomicBool::new(true);
static PCR_DROPPED: AtomicUsize = AtomicUsize::new(0);
static PCR: RecyclingAllocator<Pcr> = RecyclingAllocator::with_config(
    "adv-pcr",
    Config::new()
        .mode(CacheMode::PerCpu)
        .magazine_size(2)
        .depot_bytes(64),
);
struct Pcr(u64);
impl Recycle for Pcr {
    fn create() -> Self {
        PCR_CREATED.fetch_add(1, SeqCst);
        Pcr(0)
    }
    fn recycle(&mut self) -> bool {
        self.0 += 1;
        self.0 % 5 != 0
    }
}
impl Drop for Pcr {
    fn drop(&mut self) {
        PCR_DROPPED.fetch_add(1, SeqCst);
        thread_local!(static DEPTH: std::cell::Cell<u32> = const { std::cell::Cell::new(0) });
        if !PCR_ARM.load(SeqCst) || DEPTH.with(|d| d.get()) >= 2 {
            return;
        }
        DEPTH.with(|d| d.set(d.get() + 1));
        struct Dec;
        impl Drop for Dec {
            fn drop(&mut self) {
                DEPTH.with(|d| d.set(d.get() - 1));
            }
        }
        let _dec = Dec;
        if self.0 % 2 == 0 {
            PCR.trim();
        } else {
            trim_all();
        }
        let _ = PCR.stats();
        let v: Vec<_> = (0..3).map(|_| PCR.get()).collect();
        // avoid infinite recursion: mark them
        for mut x in v {
            x.0 = 1;
            std::mem::drop(x);
        }
    }
}

/// A per-CPU recycling allocator whose values' destructors trim (this allocator, then
/// every one), read stats and make and drop values, under a 64-byte depot budget.
#[test]
fn percpu_recycling_reentrant_trim() {
    let _s = serial();
    let mut hs = vec![];
    for _ in 0..2 {
        hs.push(std::thread::spawn(|| {
            for _ in 0..200 {
                let v: Vec<_> = (0..10).map(|_| PCR.get()).collect();
                drop(v);
                PCR.trim();
            }
        }));
    }
    for h in hs {
        h.join().unwrap();
    }
    PCR_ARM.store(false, SeqCst);
    let mut n = 0;
    while PCR.trim() > 0 {
        n += 1;
        assert!(n < 1000);
    }
    trim_all();
    PCR.trim();
    let s = PCR.stats();
    assert!(s.is_consistent(), "{s}");
    assert_eq!(s.live, 0, "{s}");
    assert_eq!(s.reserved_objects(), 0, "{s}");
    assert_eq!(PCR_CREATED.load(SeqCst), PCR_DROPPED.load(SeqCst));
}

static TX_PLAIN: ClassAllocator<[u8; 48]> =
    ClassAllocator::with_config("adv-tx-plain", Config::new().mode(CacheMode::ThreadCaches));
static TX_CAP: ClassAllocator<[u8; 48]> =
    ClassAllocator::with_config("adv-tx-cap", Config::new().max_live(8));
static TX_PC: ClassAllocator<[u8; 48]> =
    ClassAllocator::with_config("adv-tx-pc", Config::new().mode(CacheMode::PerCpu));
static TX_CREATED: AtomicUsize = AtomicUsize::new(0);
static TX_DROPPED: AtomicUsize = AtomicUsize::new(0);
struct TxR(u64);
impl Recycle for TxR {
    fn create() -> Self {
        TX_CREATED.fetch_add(1, SeqCst);
        TxR(0)
    }
    fn recycle(&mut self) -> bool {
        true
    }
}
impl Drop for TxR {
    fn drop(&mut self) {
        TX_DROPPED.fetch_add(1, SeqCst);
    }
}
static TX_REC: RecyclingAllocator<TxR> =
    RecyclingAllocator::with_config("adv-tx-rec", Config::new().magazine_size(2));

fn exercise(tag: u8) {
    let mut v = vec![];
    for i in 0..if cfg!(miri) { 20u32 } else { 200 } {
        v.push(TX_PLAIN.alloc([tag; 48]));
        if let Ok(x) = TX_CAP.try_alloc([tag; 48]) {
            if i % 2 == 0 {
                v.push(x)
            }
        }
        v.push(TX_PC.alloc([tag; 48]));
        let r = TX_REC.get();
        drop(r);
        if i % 3 == 0 {
            v.clear();
        }
    }
    TX_PLAIN.with_local(|c| {
        let a = c.alloc([1; 48]);
        c.free(a);
        let _b = c.alloc([2; 48]);
    });
    TX_CAP.with_local(|c| {
        let a = c.try_alloc([1; 48]);
        drop(a);
    });
    TX_PC.with_local(|c| {
        let a = c.alloc([1; 48]);
        c.free(a);
    });
    let mut p = Pool::new();
    for _ in 0..10 {
        let _ = p.alloc_str("hello world hello world");
    }
    p.alloc_owned(TX_REC.get().0);
    p.on_clear(|| {
        drop(TX_PLAIN.alloc([9; 48]));
    });
    p.clear();
    drop(p);
    TX_PLAIN.release_thread_cache();
    TX_REC.release_thread_cache();
    drop(v);
}

struct Late(u8);
impl Drop for Late {
    fn drop(&mut self) {
        exercise(self.0);
    }
}

fn settle() {
    for _ in 0..5 {
        trim_all();
    }
    for s in [
        TX_PLAIN.stats(),
        TX_CAP.stats(),
        TX_PC.stats(),
        TX_REC.stats(),
    ] {
        assert!(s.is_consistent(), "{s}");
        assert_eq!(s.live, 0, "{s}");
        assert_eq!(s.reserved_objects(), 0, "{s}");
    }
    assert_eq!(TX_CREATED.load(SeqCst), TX_DROPPED.load(SeqCst));
}

/// Users' thread-local destructors that allocate from plain, capped, per-CPU and
/// recycling allocators, `with_local` and pools, registered before and after the crate's
/// exit hook, and one first touched inside another destructor.
#[test]
fn tls_destructors_after_and_before_exit_hook() {
    let _s = serial();
    thread_local!(static LATE: Late = const { Late(1) }); // registered before first proxalloc use: dropped after the hook
    thread_local!(static EARLY: Late = const { Late(2) });
    thread_local!(static NEW_IN_DTOR: Late = const { Late(3) });
    struct Spawner;
    impl Drop for Spawner {
        fn drop(&mut self) {
            NEW_IN_DTOR.with(|_| ());
            exercise(4);
        }
    }
    thread_local!(static SPAWNER: Spawner = const { Spawner });
    for _ in 0..3 {
        std::thread::spawn(|| {
            LATE.with(|_| ());
            exercise(0);
            EARLY.with(|_| ());
            SPAWNER.with(|_| ());
        })
        .join()
        .unwrap();
        // a thread that never touched proxalloc before its TLS dtors
        std::thread::spawn(|| {
            LATE.with(|_| ());
        })
        .join()
        .unwrap();
    }
    settle();
}

/// A capped allocator must not refuse below `max_live` while another thread frees an
/// object and retires its cache (its permits go back under the cache-list lock).
#[test]
fn capped_refusal_below_max_live_while_a_cache_retires() {
    let _s = serial();
    let a: &'static ClassAllocator<u64> = Box::leak(Box::new(ClassAllocator::with_config(
        "adv-cap-race",
        Config::new().max_live(2),
    )));
    let (to_a, a_rx) = std::sync::mpsc::sync_channel::<Option<ClassBox<'static, u64>>>(0);
    let (freed_tx, freed_rx) = std::sync::mpsc::sync_channel::<()>(0);
    let worker = std::thread::spawn(move || {
        while let Ok(Some(y)) = a_rx.recv() {
            drop(y);
            freed_tx.send(()).unwrap();
            a.release_thread_cache();
        }
    });
    let _x = a.alloc(0);
    let mut refusals = 0;
    for _ in 0..20_000 {
        let y = match a.try_alloc(1) {
            Ok(y) => y,
            Err(_) => {
                std::thread::yield_now();
                continue;
            }
        };
        to_a.send(Some(y)).unwrap();
        freed_rx.recv().unwrap();
        // Only `_x` is live now: max_live is 2, so this must succeed.
        match a.try_alloc(2) {
            Ok(z) => drop(z),
            Err(_) => refusals += 1,
        }
    }
    to_a.send(None).unwrap();
    worker.join().unwrap();
    assert_eq!(refusals, 0, "try_alloc refused below max_live");
}

/// The process-wide thread-cache budget cut to zero while a thread holds a grown
/// stash, then pools with large blocks: everything comes back on `trim_all`.
#[test]
fn budget_zero_while_stashes_and_pool_large_blocks_trim() {
    let _s = serial();
    static G: ClassAllocator<[u8; 64]> =
        ClassAllocator::with_config("adv-grow", Config::new().magazine_size(8));
    let (tx, rx) = std::sync::mpsc::channel::<()>();
    let (ready_tx, ready_rx) = std::sync::mpsc::channel::<()>();
    let h = std::thread::spawn(move || {
        for _ in 0..50 {
            let v: Vec<_> = (0..512).map(|_| G.alloc([0; 64])).collect();
            drop(v);
        }
        ready_tx.send(()).unwrap();
        rx.recv().unwrap();
        for _ in 0..50 {
            let v: Vec<_> = (0..512).map(|_| G.alloc([0; 64])).collect();
            drop(v);
        }
        let s = G.stats();
        assert!(s.is_consistent(), "{s}");
    });
    ready_rx.recv().unwrap();
    set_thread_cache_budget(0);
    tx.send(()).unwrap();
    h.join().unwrap();
    trim_all();
    let s = G.stats();
    assert!(s.is_consistent(), "{s}");
    assert_eq!(s.reserved_objects(), 0, "{s}");
    assert_eq!(thread_cache_budget().0, 0);
    set_thread_cache_budget(32 << 20);

    let mut p = Pool::new();
    for _ in 0..3 {
        let _big = p.alloc_slice_fill_with(300_000, |i| i as u8);
        let _v = pformat!(p, "{}", 5);
        p.clear();
    }
    drop(p);
    trim_all();
    for s in stats::all() {
        if s.name.starts_with("pool-blocks") {
            assert_eq!(s.live, 0, "{s}");
            assert_eq!(s.reserved_objects(), 0, "{s}");
        }
    }
    assert_eq!(BlockSource::global().cached_bytes(), 0);
}

static WL_P: ClassAllocator<[u64; 2]> =
    ClassAllocator::with_config("adv-wl-p", Config::new().magazine_size(2));
static WL_ARM: AtomicBool = AtomicBool::new(true);
static WL_C: AtomicUsize = AtomicUsize::new(0);
static WL_D: AtomicUsize = AtomicUsize::new(0);
static WL_R: RecyclingAllocator<WlR> = RecyclingAllocator::with_config(
    "adv-wl-r",
    Config::new().magazine_size(2).depot_bytes(100).max_live(40),
);
thread_local!(static WL_DEPTH: std::cell::Cell<u32> = const { std::cell::Cell::new(0) });
struct WlR(u64);
fn guarded(f: impl FnOnce()) {
    if !WL_ARM.load(SeqCst) || WL_DEPTH.with(|d| d.get()) >= 3 {
        return;
    }
    WL_DEPTH.with(|d| d.set(d.get() + 1));
    f();
    WL_DEPTH.with(|d| d.set(d.get() - 1));
}
impl Recycle for WlR {
    fn create() -> Self {
        WL_C.fetch_add(1, SeqCst);
        guarded(|| {
            WL_R.release_thread_cache();
            let _ = WL_R.stats();
            if WL_C.load(SeqCst) % 3 == 0 {
                WL_R.trim();
            }
            WL_P.release_thread_cache();
        });
        WlR(0)
    }
    fn recycle(&mut self) -> bool {
        self.0 += 1;
        guarded(|| {
            WL_R.release_thread_cache();
            drop(WL_R.try_get());
            WL_P.trim();
        });
        self.0 % 4 != 0
    }
}
impl Drop for WlR {
    fn drop(&mut self) {
        WL_D.fetch_add(1, SeqCst);
        guarded(|| {
            WL_P.with_local(|c| {
                let a = c.alloc([1, 2]);
                WL_P.release_thread_cache();
                trim_all();
                let b = c.alloc([3, 4]);
                WL_P.with_local(|c2| {
                    let x = c2.alloc([5, 6]);
                    c.free(a);
                    c2.free(x);
                });
                drop(WL_R.try_get());
                WL_P.trim();
                c.free(b);
            });
        });
    }
}

/// `Recycle` hooks and destructors (some run by `trim_all`) that re-enter their own and
/// another allocator: `release_thread_cache`, `trim`, nested `with_local`, `try_get`;
/// afterwards the cap still admits exactly `max_live` values.
#[test]
fn with_local_inside_destructors_run_by_trim_all_and_hooks_reentering() {
    let _s = serial();
    let mut hs = vec![];
    for _ in 0..2 {
        hs.push(std::thread::spawn(|| {
            for i in 0..if cfg!(miri) { 2 } else { 300 } {
                let v: Vec<_> = (0..if cfg!(miri) { 4 } else { 12 })
                    .filter_map(|_| WL_R.try_get().ok())
                    .collect();
                WL_P.with_local(|c| {
                    let a = c.alloc([0, 0]);
                    drop(v);
                    c.free(a);
                });
                if i % 5 == 0 {
                    trim_all();
                }
                if i % 7 == 0 {
                    WL_R.release_thread_cache();
                }
            }
        }));
    }
    for h in hs {
        h.join().unwrap();
    }
    WL_ARM.store(false, SeqCst);
    for _ in 0..5 {
        trim_all();
    }
    for s in [WL_P.stats(), WL_R.stats()] {
        assert!(s.is_consistent(), "{s}");
        assert_eq!(s.live, 0, "{s}");
        assert_eq!(s.reserved_objects(), 0, "{s}");
    }
    assert_eq!(WL_C.load(SeqCst), WL_D.load(SeqCst));
    // the cap must still allow 40 live
    let v: Vec<_> = (0..40)
        .map(|_| WL_R.try_get().expect("under the cap"))
        .collect();
    assert!(WL_R.try_get().is_err());
    drop(v);
}

static TI_ARMED: AtomicBool = AtomicBool::new(false);
static TI_CREATED: AtomicUsize = AtomicUsize::new(0);
static TI_DROPPED: AtomicUsize = AtomicUsize::new(0);
static TI_NESTED: AtomicUsize = AtomicUsize::new(0);
// Small magazines and no stash: freed values go to the depot, whose cold part
// `trim_idle` releases (running these destructors).
static TI: RecyclingAllocator<Ti> = RecyclingAllocator::with_config(
    "adv-trim-idle",
    Config::new().magazine_size(2).thread_cache_growth_bytes(0),
);
struct Ti(#[allow(dead_code)] [u64; 4]);
impl Recycle for Ti {
    fn create() -> Self {
        TI_CREATED.fetch_add(1, SeqCst);
        Ti([0; 4])
    }
    fn recycle(&mut self) -> bool {
        true
    }
}
impl Drop for Ti {
    fn drop(&mut self) {
        TI_DROPPED.fetch_add(1, SeqCst);
        // Once per destructor that `trim_idle` runs: allocate from the allocator being
        // trimmed (the warm part is back in the depot by now), trim it again from inside,
        // read its stats.
        if TI_ARMED.swap(false, SeqCst) {
            TI_NESTED.fetch_add(1, SeqCst);
            let v: Vec<_> = (0..4).map(|_| TI.get()).collect();
            drop(v);
            TI.trim_idle();
            assert!(TI.stats().is_consistent());
            TI_ARMED.store(true, SeqCst);
        }
    }
}

/// The destructors that `trim_idle` runs as it releases the depot's cold part allocate
/// from the same allocator and call `trim_idle` again: nothing is lost or dropped twice.
#[test]
fn destructors_run_by_trim_idle_allocate_and_trim_again() {
    let _s = serial();
    let pause = || std::thread::sleep(std::time::Duration::from_millis(3));
    drop((0..40).map(|_| TI.get()).collect::<Vec<_>>());
    assert_eq!(TI.trim_idle(), 0, "the first call starts the interval");
    pause();
    // Busy: some values taken from the depot and given back; the rest stays cold.
    drop((0..6).map(|_| TI.get()).collect::<Vec<_>>());
    TI_ARMED.store(true, SeqCst);
    assert!(TI.trim_idle() > 0, "the cold part");
    assert!(TI_NESTED.load(SeqCst) > 0, "no destructor re-entered");
    pause();
    TI.trim_idle();
    TI_ARMED.store(false, SeqCst);
    while TI.trim() > 0 {}
    let s = TI.stats();
    assert!(s.is_consistent(), "{s}");
    assert_eq!((s.live, s.reserved_objects()), (0, 0), "{s}");
    assert_eq!(TI_CREATED.load(SeqCst), TI_DROPPED.load(SeqCst));
}
