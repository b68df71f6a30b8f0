//! The randomized stress engine, in the manner of mimalloc's `test-stress`: worker threads
//! (more than there are cores) run seeded random operations over a mix of allocators and
//! handles, pass handles to each other, exit and are replaced, while an administrator
//! thread trims, reads stats and squeezes the thread-cache budget. Every few thousand
//! operations a coordinator stops everything at a quiescent point and checks the books;
//! at the end, with every thread gone and everything trimmed, nothing may be left.
//!
//! Shared by the `stress` test (short, bounded runs) and `examples/stress.rs` (soaks).
//!
//! What is checked:
//! - every value constructed is dropped exactly once: values carry an id and a seal, a
//!   registry of live ids catches a double drop, a corrupted value, or a value handed out
//!   to two holders at once (each holder remembers the id it was given);
//! - at quiescent points, per allocator: `Stats::is_consistent` and `live` equal to the
//!   handles the test holds; a capped allocator never has more than `max_live` out;
//! - at the end, after a `trim_all`: zero live objects and zero reserved bytes in every
//!   allocator, every recycled value and pool value dropped, every pool block back with
//!   its block allocator, and no thread-cache grant outstanding.
//!
//! A run is reproducible from its seed as far as threads allow: each worker's operations
//! come from a generator seeded by `(seed, slot, generation)`; what other threads did
//! meanwhile (and so what a worker finds in its mailbox) depends on scheduling.

#![allow(dead_code)] // each includer uses a different part of the report

use std::alloc::Layout;
use std::cell::Cell;
use std::collections::HashSet;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::ptr::NonNull;
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, Once, OnceLock, Weak};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use proxalloc::{
    static_class, stats, BlockAllocator, BlockSource, CacheMode, ClassAllocator, ClassBox, Config,
    Owned, OwnedRecycled, Pool, Recycle, Recycled, RecyclingAllocator, StaticClass, Thin,
};

// ---------------------------------------------------------------------------------------
// Knobs and report

/// What a run does.
#[derive(Clone, Debug)]
pub struct Knobs {
    /// Everything random in the run derives from it.
    pub seed: u64,
    /// Worker slots (each runs one thread at a time; a thread that exits is replaced).
    pub threads: usize,
    /// Stop after this many worker operations (all threads together)...
    pub ops: u64,
    /// ...or after this long, whichever comes first.
    pub duration: Option<Duration>,
    /// Mean operations a worker thread runs before it exits and is replaced.
    pub thread_life: u64,
    /// Worker operations between quiescent checks.
    pub check_every: u64,
    /// Whether run-time allocators are dropped while the run goes on (their last handle
    /// may then drop on any thread, while other threads still cache their magazines).
    pub drop_allocators: bool,
    /// Chance per mille that a recycled value's `create`, `recycle` or `drop`, or a pool
    /// cleanup, panics.
    pub panic_per_mille: u32,
    /// Print progress lines.
    pub verbose: bool,
}

impl Knobs {
    /// A short run: bounded operations, seconds at most in a debug build.
    pub fn short(seed: u64) -> Self {
        Knobs {
            seed,
            threads: 6,
            ops: 40_000,
            duration: None,
            thread_life: 1_500,
            check_every: 10_000,
            drop_allocators: true,
            panic_per_mille: 20,
            verbose: false,
        }
    }
}

/// What a run did.
#[derive(Clone, Debug, Default)]
pub struct Report {
    pub seed: u64,
    pub ops: u64,
    pub threads_spawned: u64,
    pub quiescent_checks: u64,
    pub allocators_created: u64,
    pub allocators_dropped: u64,
    pub values_tracked: u64,
    pub recycled_values: u64,
    pub refusals_at_cap: u64,
    pub injected_panics: u64,
    pub handoffs: u64,
    pub pools: u64,
    pub admin_passes: u64,
    pub elapsed: Duration,
}

impl std::fmt::Display for Report {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "seed {:#x}: {} ops in {:.2?}, {} threads spawned, {} quiescent checks, \
             {} run-time allocators ({} dropped mid-run), {} values, {} recycled values, \
             {} refusals at a cap, {} injected panics, {} hand-offs, {} pools, {} admin passes",
            self.seed,
            self.ops,
            self.elapsed,
            self.threads_spawned,
            self.quiescent_checks,
            self.allocators_created,
            self.allocators_dropped,
            self.values_tracked,
            self.recycled_values,
            self.refusals_at_cap,
            self.injected_panics,
            self.handoffs,
            self.pools,
            self.admin_passes,
        )
    }
}

// ---------------------------------------------------------------------------------------
// Random numbers

/// splitmix64: small, seedable, and good enough to pick operations.
#[derive(Clone, Debug)]
pub struct Rng(u64);

fn splitmix64(state: &mut u64) -> u64 {
    *state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
    let mut z = *state;
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

impl Rng {
    pub fn new(seed: u64) -> Self {
        let mut s = seed;
        Rng(splitmix64(&mut s))
    }

    /// A generator for one of several streams of `seed` (a slot and a generation).
    pub fn derive(seed: u64, a: u64, b: u64) -> Self {
        let mut s =
            seed ^ a.wrapping_mul(0xA24B_AED4_963E_E407) ^ b.wrapping_mul(0x9FB2_1C65_1E98_DF25);
        Rng(splitmix64(&mut s))
    }

    pub fn next(&mut self) -> u64 {
        splitmix64(&mut self.0)
    }

    /// Uniform in `0..n` (`n > 0`).
    pub fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }

    pub fn per_mille(&mut self, p: u32) -> bool {
        (self.next() % 1000) < u64::from(p)
    }
}

// ---------------------------------------------------------------------------------------
// Violations: recorded, never panicked on where the panic could be swallowed (a value's
// destructor run by the allocator catches panics) or abort a thread-local destructor.

static VIOLATIONS: Mutex<Vec<String>> = Mutex::new(Vec::new());
static VIOLATION_COUNT: AtomicUsize = AtomicUsize::new(0);

fn violation(msg: String) {
    VIOLATION_COUNT.fetch_add(1, Ordering::Relaxed);
    let mut v = VIOLATIONS.lock().unwrap_or_else(|e| e.into_inner());
    if v.len() < 32 {
        v.push(msg);
    }
}

fn take_violations() -> Vec<String> {
    std::mem::take(&mut *VIOLATIONS.lock().unwrap_or_else(|e| e.into_inner()))
}

// ---------------------------------------------------------------------------------------
// Injected panics

/// The payload of a panic the engine injects (the panic hook keeps it quiet). It has
/// memory, so a payload that the allocator catches and fails to drop shows up in
/// AddressSanitizer's leak check (see `found_by_stress.rs`).
pub struct Injected(#[allow(dead_code)] [u64; 4]);

static INJECTED: AtomicU64 = AtomicU64::new(0);

std::thread_local! {
    /// This thread's chaos: generator state and the chance per mille (0: never).
    static CHAOS: Cell<(u64, u32)> = const { Cell::new((0, 0)) };
}

fn set_chaos(seed: u64, per_mille: u32) {
    CHAOS.with(|c| c.set((seed, per_mille)));
}

/// Whether this thread should inject a failure now (never while unwinding: a second
/// panic would abort).
fn chaos() -> bool {
    if std::thread::panicking() {
        return false;
    }
    CHAOS
        .try_with(|c| {
            let (mut s, p) = c.get();
            if p == 0 {
                return false;
            }
            let r = splitmix64(&mut s);
            c.set((s, p));
            r % 1000 < u64::from(p)
        })
        .unwrap_or(false)
}

/// Panics (with an [`Injected`] payload) at this thread's chance; `_what` names the
/// place, for whoever reads the call.
fn maybe_panic(_what: &'static str) {
    if chaos() {
        INJECTED.fetch_add(1, Ordering::Relaxed);
        std::panic::panic_any(Injected([0; 4]));
    }
}

/// Keeps injected panics off stderr; every other panic goes to the previous hook.
fn quiet_injected_panics() {
    static HOOK: Once = Once::new();
    HOOK.call_once(|| {
        let previous = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            if info.payload().downcast_ref::<Injected>().is_none() {
                previous(info);
            }
        }));
    });
}

// ---------------------------------------------------------------------------------------
// Tracked values

fn seal(id: u64) -> u64 {
    id.wrapping_mul(0x2545_F491_4F6C_DD1D) ^ 0x5EA1_5EA1_5EA1_5EA1
}

/// Live ids of one family of values, sharded to keep the lock short.
struct Tracker {
    name: &'static str,
    shards: [Mutex<Option<HashSet<u64>>>; 16],
    next: AtomicU64,
    constructed: AtomicU64,
    dropped: AtomicU64,
}

impl Tracker {
    const fn new(name: &'static str) -> Self {
        Tracker {
            name,
            shards: [const { Mutex::new(None) }; 16],
            next: AtomicU64::new(1),
            constructed: AtomicU64::new(0),
            dropped: AtomicU64::new(0),
        }
    }

    fn construct(&self) -> u64 {
        let id = self.next.fetch_add(1, Ordering::Relaxed);
        let mut shard = self.shards[(id % 16) as usize]
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        if !shard.get_or_insert_with(HashSet::new).insert(id) {
            violation(format!("{}: id {id} constructed twice", self.name));
        }
        self.constructed.fetch_add(1, Ordering::Relaxed);
        id
    }

    fn destruct(&self, id: u64, sealed: u64) {
        if sealed != seal(id) {
            violation(format!(
                "{}: value {id} dropped with a broken seal {sealed:#x} (corrupted or freed memory)",
                self.name
            ));
            return;
        }
        let removed = self.shards[(id % 16) as usize]
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .as_mut()
            .is_some_and(|s| s.remove(&id));
        if !removed {
            violation(format!("{}: value {id} dropped twice", self.name));
        }
        self.dropped.fetch_add(1, Ordering::Relaxed);
    }

    /// Values constructed and not dropped.
    pub fn live(&self) -> u64 {
        self.constructed.load(Ordering::Relaxed) - self.dropped.load(Ordering::Relaxed)
    }

    pub fn constructed(&self) -> u64 {
        self.constructed.load(Ordering::Relaxed)
    }
}

static VALS: Tracker = Tracker::new("class values");
static RECYCLED_VALS: Tracker = Tracker::new("recycled values");
static POOL_VALS: Tracker = Tracker::new("pool-owned values");
static ZSTS_MADE: AtomicU64 = AtomicU64::new(0);
static ZSTS_DROPPED: AtomicU64 = AtomicU64::new(0);

/// A value of a class allocator: an id, its seal, and `N` bytes that repeat the id.
struct Val<const N: usize> {
    id: u64,
    seal: u64,
    pad: [u8; N],
}

impl<const N: usize> Val<N> {
    fn new() -> Self {
        let id = VALS.construct();
        Val {
            id,
            seal: seal(id),
            pad: [id as u8; N],
        }
    }

    /// Checks the value is the one the holder was given.
    fn check(&self, expected: u64, what: &str) {
        if self.id != expected
            || self.seal != seal(expected)
            || self.pad.iter().any(|&b| b != expected as u8)
        {
            violation(format!(
                "{what}: holder of value {expected} finds id {} seal {:#x} (handed out twice, or corrupted)",
                self.id, self.seal
            ));
        }
    }
}

impl<const N: usize> Drop for Val<N> {
    fn drop(&mut self) {
        if self.pad.iter().any(|&b| b != self.id as u8) {
            violation(format!("value {}: padding corrupted", self.id));
        }
        VALS.destruct(self.id, self.seal);
    }
}

/// A zero-sized value, counted (it has no room for an id).
struct Zst;

impl Zst {
    fn new() -> Self {
        ZSTS_MADE.fetch_add(1, Ordering::Relaxed);
        Zst
    }
}

impl Drop for Zst {
    fn drop(&mut self) {
        ZSTS_DROPPED.fetch_add(1, Ordering::Relaxed);
    }
}

/// A value owned by a pool (`alloc_owned`), dropped when the pool is cleared.
struct PoolVal {
    id: u64,
    seal: u64,
}

impl PoolVal {
    fn new() -> Self {
        let id = POOL_VALS.construct();
        PoolVal { id, seal: seal(id) }
    }
}

impl Drop for PoolVal {
    fn drop(&mut self) {
        POOL_VALS.destruct(self.id, self.seal);
    }
}

/// A recycled value: its own id for life, and the holder it is lent to (0 while cached).
struct Rv {
    id: u64,
    seal: u64,
    holder: u64,
    buf: Vec<u8>,
}

static HOLDERS: AtomicU64 = AtomicU64::new(1);

impl Recycle for Rv {
    fn create() -> Self {
        maybe_panic("Recycle::create");
        reenter(false);
        let id = RECYCLED_VALS.construct();
        Rv {
            id,
            seal: seal(id),
            holder: 0,
            buf: Vec::new(),
        }
    }

    fn recycle(&mut self) -> bool {
        if self.seal != seal(self.id) {
            violation(format!(
                "recycled value {}: broken seal at recycle",
                self.id
            ));
        }
        maybe_panic("Recycle::recycle");
        self.holder = 0;
        self.buf.clear();
        // Refused now and then: the value is then dropped instead of cached.
        !chaos()
    }
}

impl Drop for Rv {
    fn drop(&mut self) {
        RECYCLED_VALS.destruct(self.id, self.seal);
        reenter(true);
        maybe_panic("Rv::drop");
    }
}

/// Off for the final trims: objects a destructor frees while `trim_all` releases would
/// stay in the trimming thread's cache, as any user code's would after the call.
static REENTER: AtomicBool = AtomicBool::new(true);

std::thread_local! {
    /// Whether this thread is inside `reenter`, and how many calls it has seen.
    static REENTRY: Cell<(bool, u32)> = const { Cell::new((false, 0)) };
}

/// Every fifth `create` or drop of a recycled value on a thread uses allocators from
/// inside the allocator (these run in slow paths, trims, releases and thread-exit
/// teardowns): an allocation and free on another allocator and, from a drop, a value of
/// the recycling allocator itself. Not recursively.
fn reenter(from_drop: bool) {
    if !REENTER.load(Ordering::Relaxed) {
        return;
    }
    let go = REENTRY
        .try_with(|r| {
            let (inside, n) = r.get();
            r.set((inside, n.wrapping_add(1)));
            !inside && n % 5 == 0
        })
        .unwrap_or(false);
    if !go {
        return;
    }
    struct Outside;
    impl Drop for Outside {
        fn drop(&mut self) {
            let _ = REENTRY.try_with(|r| r.set((false, r.get().1)));
        }
    }
    REENTRY.with(|r| r.set((true, r.get().1)));
    let _outside = Outside;
    let v = Val::<8>::new();
    let id = v.id;
    let b = SMALL.alloc(v);
    let hold = Hold::of(&SMALL_HELD);
    b.check(id, "re-entered");
    drop(hold);
    drop(b);
    if from_drop {
        if let Ok(mut r) = RECYCLED.try_get() {
            let h = Hold::of(&RECYCLED_HELD);
            let holder = r.lend();
            r.check(holder);
            drop(h);
            drop(r);
        }
    }
}

impl Rv {
    /// Takes the value for a new holder; it must not be lent to anyone.
    fn lend(&mut self) -> u64 {
        if self.holder != 0 {
            violation(format!(
                "recycled value {} handed out while lent to holder {}",
                self.id, self.holder
            ));
        }
        let h = HOLDERS.fetch_add(1, Ordering::Relaxed);
        self.holder = h;
        self.buf.extend_from_slice(&h.to_le_bytes());
        h
    }

    fn check(&self, holder: u64) {
        if self.holder != holder || self.seal != seal(self.id) {
            violation(format!(
                "recycled value {}: holder {holder} finds holder {} (handed out twice?)",
                self.id, self.holder
            ));
        }
    }
}

// ---------------------------------------------------------------------------------------
// The allocators

/// Handles the test holds of one allocator.
struct Held(AtomicI64);

impl Held {
    const fn new() -> Self {
        Held(AtomicI64::new(0))
    }
    fn get(&self) -> i64 {
        self.0.load(Ordering::Relaxed)
    }
}

/// Where a handle is counted: a static allocator's count, or a run-time allocator's.
enum Counter {
    Static(&'static Held),
    Rt(Arc<Rt>),
    Rec(Arc<RtRec>),
}

impl Counter {
    fn held(&self) -> &Held {
        match self {
            Counter::Static(h) => h,
            Counter::Rt(rt) => &rt.held,
            Counter::Rec(rt) => &rt.held,
        }
    }
}

/// One handle counted as held while this lives. Made after the allocation succeeds,
/// and dropped before the handle (it is the first field of every `Item` variant), so
/// the count never exceeds what is live; and a handle dropped by unwinding is uncounted
/// like any other.
struct Hold(Counter);

impl Hold {
    /// Counts one more handle; returns the token and the count now.
    fn new(c: Counter) -> (Self, i64) {
        let n = c.held().0.fetch_add(1, Ordering::Relaxed) + 1;
        (Hold(c), n)
    }

    fn of(h: &'static Held) -> Self {
        Self::new(Counter::Static(h)).0
    }
}

impl Drop for Hold {
    fn drop(&mut self) {
        self.0.held().0.fetch_sub(1, Ordering::Relaxed);
    }
}

const CAP: usize = 24;

// Per-CPU caches where rseq works (per-thread ones elsewhere).
static PLAIN: ClassAllocator<Val<40>> = ClassAllocator::with_config(
    "stress-plain",
    Config::new()
        .mode(CacheMode::PerCpu)
        .magazine_size(3)
        .depot_bytes(512)
        .thread_cache_growth_bytes(1024),
);
// Per-thread caches by name where a stash's growth is part of what is stressed (the
// default build's default is per-CPU caches, which `PLAIN` and `RECYCLED` cover).
static SMALL: ClassAllocator<Val<8>> = ClassAllocator::with_config(
    "stress-small",
    Config::new()
        .mode(CacheMode::ThreadCaches)
        .magazine_size(1)
        .depot_bytes(0)
        .thread_cache_growth_bytes(96),
);
static CAPPED: ClassAllocator<Val<16>> = ClassAllocator::with_config(
    "stress-capped",
    Config::new()
        .magazine_size(2)
        .depot_bytes(128)
        .thread_cache_growth_bytes(256)
        .max_live(CAP),
);
static ZSTS: ClassAllocator<Zst> = ClassAllocator::with_config(
    "stress-zst",
    Config::new()
        .mode(CacheMode::ThreadCaches)
        .magazine_size(4)
        .depot_bytes(0)
        .thread_cache_growth_bytes(64),
);
static SHARED: ClassAllocator<Val<32>> = ClassAllocator::with_config(
    "stress-depot-only",
    Config::new().mode(CacheMode::DepotOnly).depot_bytes(640),
);
static_class!(ThinVals: Val<24> = "stress-thin", Config::new().mode(CacheMode::ThreadCaches).magazine_size(2).depot_bytes(96).thread_cache_growth_bytes(512));
static RECYCLED: RecyclingAllocator<Rv> = RecyclingAllocator::with_config(
    "stress-recycled",
    Config::new()
        .mode(CacheMode::PerCpu)
        .magazine_size(2)
        .depot_bytes(256)
        .thread_cache_growth_bytes(512),
);

static PLAIN_HELD: Held = Held::new();
static SMALL_HELD: Held = Held::new();
static CAPPED_HELD: Held = Held::new();
static ZSTS_HELD: Held = Held::new();
static SHARED_HELD: Held = Held::new();
static THIN_HELD: Held = Held::new();
static RECYCLED_HELD: Held = Held::new();

/// A run-time class allocator and the handles the test holds of it.
struct Rt {
    alloc: Arc<ClassAllocator<Val<24>>>,
    held: Held,
    cap: Option<usize>,
}

/// A run-time recycling allocator and the handles the test holds of it.
struct RtRec {
    alloc: Arc<RecyclingAllocator<Rv>>,
    held: Held,
    cap: Option<usize>,
}

const RT_NAMES: [&str; 4] = ["stress-rt-a", "stress-rt-b", "stress-rt-c", "stress-rt-d"];

fn rt_config(rng: &mut Rng) -> (Config, Option<usize>) {
    let mut c = Config::new()
        .magazine_size(1 + rng.below(4))
        .depot_bytes([0, 64, 256, 4096][rng.below(4)])
        .thread_cache_growth_bytes([0, 48, 480, 1 << 16][rng.below(4)]);
    if rng.per_mille(100) {
        c = c.mode(CacheMode::DepotOnly);
    } else if rng.per_mille(300) {
        c = c.mode(CacheMode::PerCpu);
    } else if rng.per_mille(500) {
        // By name: the other branch is the build's default, per-CPU in a default build.
        c = c.mode(CacheMode::ThreadCaches);
    }
    let cap = rng.per_mille(250).then(|| 1 + rng.below(12));
    if let Some(cap) = cap {
        c = c.max_live(cap);
    }
    (c, cap)
}

// ---------------------------------------------------------------------------------------
// Pool blocks from a counting block allocator

static BLOCKS_OUT: AtomicI64 = AtomicI64::new(0);
static BLOCK_BYTES_OUT: AtomicI64 = AtomicI64::new(0);

struct CountingBlocks;

// SAFETY: memory from `System` with the caller's layout, returned there with it.
unsafe impl BlockAllocator for CountingBlocks {
    fn alloc_block(&self, layout: Layout) -> Option<NonNull<u8>> {
        // SAFETY: block layouts are never zero-sized.
        let p =
            NonNull::new(unsafe { std::alloc::GlobalAlloc::alloc(&std::alloc::System, layout) })?;
        BLOCKS_OUT.fetch_add(1, Ordering::Relaxed);
        BLOCK_BYTES_OUT.fetch_add(layout.size() as i64, Ordering::Relaxed);
        Some(p)
    }

    unsafe fn free_block(&self, ptr: NonNull<u8>, layout: Layout) {
        BLOCKS_OUT.fetch_sub(1, Ordering::Relaxed);
        BLOCK_BYTES_OUT.fetch_sub(layout.size() as i64, Ordering::Relaxed);
        // SAFETY: allocated by `alloc_block` with this layout.
        unsafe { std::alloc::GlobalAlloc::dealloc(&std::alloc::System, ptr.as_ptr(), layout) }
    }
}

/// A block source with a small `max_free`, whose blocks are counted. Lives for the
/// process (pools that move between threads need a `'static` source).
fn block_source() -> &'static BlockSource {
    static SOURCE: OnceLock<&'static BlockSource> = OnceLock::new();
    SOURCE.get_or_init(|| {
        Box::leak(Box::new(BlockSource::with_block_allocator(
            96 << 10,
            Arc::new(CountingBlocks),
        )))
    })
}

static CLEANUPS_REGISTERED: AtomicU64 = AtomicU64::new(0);
static CLEANUPS_DONE: AtomicU64 = AtomicU64::new(0);

/// A pool and what was written into it, to be checked before it is cleared.
struct PoolItem {
    pool: Pool<'static>,
    /// (address, length, pattern byte) of each allocation since the last clear.
    written: Vec<(usize, usize, u8)>,
    /// Cleanups registered and not yet run or cancelled.
    pending_cleanups: u64,
}

impl PoolItem {
    fn new(rng: &mut Rng) -> Self {
        let pool = if rng.per_mille(300) {
            Pool::new()
        } else {
            Pool::with_source(block_source())
        };
        PoolItem {
            pool,
            written: Vec::new(),
            pending_cleanups: 0,
        }
    }

    fn work(&mut self, rng: &mut Rng) {
        for _ in 0..1 + rng.below(6) {
            match rng.below(10) {
                0..=4 => {
                    let size = [1, 24, 300, 5000, 70_000, 150_000][rng.below(6)];
                    let align = [1, 8, 16, 64, 4096][rng.below(5)];
                    let layout = Layout::from_size_align(size, align).unwrap();
                    if let Ok(p) = self.pool.try_alloc_layout(layout) {
                        if p.as_ptr() as usize % align != 0 {
                            violation(format!(
                                "pool: {size}-byte allocation misaligned for {align}"
                            ));
                        }
                        let pattern = rng.next() as u8;
                        // SAFETY: `size` fresh bytes of the pool, valid until it is cleared.
                        unsafe { p.as_ptr().write_bytes(pattern, size) };
                        self.written.push((p.as_ptr() as usize, size, pattern));
                    }
                }
                5 | 6 => {
                    let _ = self.pool.alloc_owned(PoolVal::new());
                }
                7 => {
                    CLEANUPS_REGISTERED.fetch_add(1, Ordering::Relaxed);
                    let key = self.pool.on_clear(|| {
                        CLEANUPS_DONE.fetch_add(1, Ordering::Relaxed);
                        maybe_panic("pool cleanup");
                    });
                    if rng.per_mille(300) {
                        CLEANUPS_DONE.fetch_add(1, Ordering::Relaxed);
                        self.pool.cancel(key);
                    } else {
                        self.pending_cleanups += 1;
                    }
                }
                _ => {
                    // The iterpool idiom: a subpool, used and dropped.
                    let registered = &CLEANUPS_REGISTERED;
                    let _ = catch_unwind(AssertUnwindSafe(|| {
                        self.pool.scope(|sub| {
                            let words = sub.alloc_slice_fill_with(64, |i| i as u64);
                            let _ = sub.alloc_owned(PoolVal::new());
                            registered.fetch_add(1, Ordering::Relaxed);
                            sub.on_clear(|| {
                                CLEANUPS_DONE.fetch_add(1, Ordering::Relaxed);
                                maybe_panic("subpool cleanup");
                            });
                            if words[63] != 63 {
                                violation("subpool: allocation overwritten".into());
                            }
                        })
                    }));
                }
            }
        }
    }

    /// Every byte written since the last clear is still there: no block was handed to
    /// two pools, or twice to one.
    fn verify(&self) {
        for &(addr, len, pattern) in &self.written {
            // SAFETY: written above, and the pool has not been cleared since.
            let bytes = unsafe { std::slice::from_raw_parts(addr as *const u8, len) };
            if let Some(i) = bytes.iter().position(|&b| b != pattern) {
                violation(format!(
                    "pool: byte {i} of a {len}-byte allocation overwritten ({:#x} != {pattern:#x})",
                    bytes[i]
                ));
                return;
            }
        }
    }

    fn clear(&mut self) {
        self.verify();
        self.written.clear();
        self.pending_cleanups = 0;
        let _ = catch_unwind(AssertUnwindSafe(|| self.pool.clear()));
        if self.pool.stats().used_bytes != 0 || self.pool.stats().cleanups != 0 {
            violation(format!("pool: {:?} after clear", self.pool.stats()));
        }
    }

    fn finish(self) {
        self.verify();
        let _ = catch_unwind(AssertUnwindSafe(move || drop(self.pool)));
    }
}

// ---------------------------------------------------------------------------------------
// Handles

/// A handle the test holds, with what its holder expects to find in it. The `Hold`
/// comes first: it drops first.
enum Item {
    Plain(Hold, ClassBox<'static, Val<40>>, u64),
    Small(Hold, ClassBox<'static, Val<8>>, u64),
    Capped(Hold, ClassBox<'static, Val<16>>, u64),
    Zst(Hold, ClassBox<'static, Zst>),
    Shared(Hold, ClassBox<'static, Val<32>>, u64),
    Thin(Hold, Thin<ThinVals>, u64),
    Rt(Hold, Owned<Val<24>>, u64),
    Recycled(Hold, Recycled<'static, Rv>, u64),
    RtRecycled(Hold, OwnedRecycled<Rv>, u64),
    Pool(Box<PoolItem>),
}

impl Item {
    /// Checks the handle and frees it (sometimes by moving the value out); a panic from
    /// a recycled value's `recycle` or `drop` is caught.
    fn free(self, rng: &mut Rng) {
        let into_inner = rng.per_mille(200);
        let _ = catch_unwind(AssertUnwindSafe(move || match self {
            Item::Plain(hold, b, id) => {
                b.check(id, "plain");
                drop(hold);
                if into_inner {
                    drop(ClassBox::into_inner(b));
                }
            }
            Item::Small(hold, b, id) => {
                b.check(id, "small");
                drop(hold);
            }
            Item::Capped(hold, b, id) => {
                b.check(id, "capped");
                drop(hold);
            }
            Item::Zst(hold, b) => {
                drop(hold);
                drop(b);
            }
            Item::Shared(hold, b, id) => {
                b.check(id, "depot-only");
                drop(hold);
            }
            Item::Thin(hold, t, id) => {
                t.check(id, "thin");
                drop(hold);
                if into_inner {
                    drop(Thin::into_inner(t));
                }
            }
            Item::Rt(hold, o, id) => {
                o.check(id, "run-time");
                drop(hold);
                if into_inner {
                    drop(Owned::into_inner(o));
                }
            }
            Item::Recycled(hold, r, holder) => {
                r.check(holder);
                drop(hold);
            }
            Item::RtRecycled(hold, r, holder) => {
                r.check(holder);
                drop(hold);
            }
            Item::Pool(mut p) => {
                if into_inner {
                    p.clear();
                }
                (*p).finish();
            }
        }));
    }
}

// ---------------------------------------------------------------------------------------
// Shared state of a run

struct Ctx {
    knobs: Knobs,
    stop: AtomicBool,
    ops: AtomicU64,
    /// Quiescence: the coordinator sets `pause`; every worker and the administrator
    /// parks at its next operation boundary and counts itself in `parked`.
    pause: AtomicBool,
    parked: AtomicUsize,
    mailboxes: Vec<Mutex<Vec<Item>>>,
    runtime: Mutex<Vec<Arc<Rt>>>,
    runtime_rec: Mutex<Vec<Arc<RtRec>>>,
    /// Every run-time allocator ever made, to check the survivors.
    all_runtime: Mutex<Vec<Weak<Rt>>>,
    all_runtime_rec: Mutex<Vec<Weak<RtRec>>>,
    created: AtomicU64,
    dropped: AtomicU64,
    refusals: AtomicU64,
    handoffs: AtomicU64,
    pools: AtomicU64,
    admin_passes: AtomicU64,
}

impl Ctx {
    fn pause_point(&self) {
        if self.pause.load(Ordering::Acquire) {
            self.parked.fetch_add(1, Ordering::AcqRel);
            while self.pause.load(Ordering::Acquire) {
                std::thread::sleep(Duration::from_micros(100));
            }
            self.parked.fetch_sub(1, Ordering::AcqRel);
        }
    }

    fn pick_rt(&self, rng: &mut Rng) -> Option<Arc<Rt>> {
        let list = self.runtime.lock().unwrap();
        (!list.is_empty()).then(|| list[rng.below(list.len())].clone())
    }

    fn pick_rt_rec(&self, rng: &mut Rng) -> Option<Arc<RtRec>> {
        let list = self.runtime_rec.lock().unwrap();
        (!list.is_empty()).then(|| list[rng.below(list.len())].clone())
    }

    fn create_runtime(&self, rng: &mut Rng) {
        let name = RT_NAMES[rng.below(RT_NAMES.len())];
        if rng.per_mille(300) {
            let mut list = self.runtime_rec.lock().unwrap();
            if list.len() < 3 {
                let (config, cap) = rt_config(rng);
                let rt = Arc::new(RtRec {
                    alloc: Arc::new(RecyclingAllocator::with_config(name, config)),
                    held: Held::new(),
                    cap,
                });
                self.all_runtime_rec
                    .lock()
                    .unwrap()
                    .push(Arc::downgrade(&rt));
                list.push(rt);
                self.created.fetch_add(1, Ordering::Relaxed);
            }
        } else {
            let mut list = self.runtime.lock().unwrap();
            if list.len() < 5 {
                let (config, cap) = rt_config(rng);
                let rt = Arc::new(Rt {
                    alloc: Arc::new(ClassAllocator::with_config(name, config)),
                    held: Held::new(),
                    cap,
                });
                self.all_runtime.lock().unwrap().push(Arc::downgrade(&rt));
                list.push(rt);
                self.created.fetch_add(1, Ordering::Relaxed);
            }
        }
    }

    /// Drops the registry's reference to a run-time allocator: it dies with its last
    /// handle, on whichever thread drops that.
    fn drop_runtime(&self, rng: &mut Rng) {
        if rng.per_mille(500) {
            let mut list = self.runtime.lock().unwrap();
            if !list.is_empty() {
                let i = rng.below(list.len());
                let rt = list.swap_remove(i);
                drop(list);
                drop(rt);
                self.dropped.fetch_add(1, Ordering::Relaxed);
            }
        } else {
            let mut list = self.runtime_rec.lock().unwrap();
            if !list.is_empty() {
                let i = rng.below(list.len());
                let rt = list.swap_remove(i);
                drop(list);
                drop(rt);
                self.dropped.fetch_add(1, Ordering::Relaxed);
            }
        }
    }
}

// ---------------------------------------------------------------------------------------
// Workers

fn alloc_one(ctx: &Ctx, rng: &mut Rng) -> Option<Item> {
    Some(match rng.below(11) {
        0 | 1 => {
            let v = Val::new();
            let id = v.id;
            let b = if rng.per_mille(300) {
                PLAIN.alloc_with(|| v)
            } else {
                PLAIN.alloc(v)
            };
            Item::Plain(Hold::of(&PLAIN_HELD), b, id)
        }
        2 => {
            let v = Val::new();
            let id = v.id;
            let b = SMALL.alloc(v);
            Item::Small(Hold::of(&SMALL_HELD), b, id)
        }
        3 => {
            let v = Val::new();
            let id = v.id;
            match CAPPED.try_alloc(v) {
                Ok(b) => {
                    let (hold, n) = Hold::new(Counter::Static(&CAPPED_HELD));
                    if n > CAP as i64 {
                        violation(format!("capped: {n} handles held, max_live is {CAP}"));
                    }
                    Item::Capped(hold, b, id)
                }
                Err(_) => {
                    ctx.refusals.fetch_add(1, Ordering::Relaxed);
                    return None;
                }
            }
        }
        4 => {
            let b = ZSTS.alloc(Zst::new());
            Item::Zst(Hold::of(&ZSTS_HELD), b)
        }
        5 => {
            let v = Val::new();
            let id = v.id;
            let b = SHARED.alloc(v);
            Item::Shared(Hold::of(&SHARED_HELD), b, id)
        }
        6 => {
            let v = Val::new();
            let id = v.id;
            let t = ThinVals::alloc(v);
            Item::Thin(Hold::of(&THIN_HELD), t, id)
        }
        7 | 8 => {
            let rt = ctx.pick_rt(rng)?;
            let v = Val::new();
            let id = v.id;
            match rt.alloc.try_alloc_arc(v) {
                Ok(o) => {
                    let cap = rt.cap;
                    let (hold, n) = Hold::new(Counter::Rt(rt));
                    if cap.is_some_and(|cap| n > cap as i64) {
                        violation(format!(
                            "run-time capped: {n} handles held, max_live is {}",
                            cap.unwrap()
                        ));
                    }
                    Item::Rt(hold, o, id)
                }
                Err(_) if rt.cap.is_some() => {
                    ctx.refusals.fetch_add(1, Ordering::Relaxed);
                    return None;
                }
                Err(_) => {
                    violation("run-time: an uncapped try_alloc_arc failed".into());
                    return None;
                }
            }
        }
        9 => {
            // `create` may panic (injected): nothing is handed out then.
            let mut r = catch_unwind(|| RECYCLED.get()).ok()?;
            let holder = r.lend();
            Item::Recycled(Hold::of(&RECYCLED_HELD), r, holder)
        }
        _ => {
            let rt = ctx.pick_rt_rec(rng)?;
            let mut r = match catch_unwind(AssertUnwindSafe(|| rt.alloc.try_get_arc())) {
                Ok(Ok(r)) => r,
                Ok(Err(_)) if rt.cap.is_some() => {
                    ctx.refusals.fetch_add(1, Ordering::Relaxed);
                    return None;
                }
                Ok(Err(_)) => {
                    violation("run-time recycling: an uncapped try_get_arc failed".into());
                    return None;
                }
                Err(_) => return None, // an injected panic in `create`
            };
            let holder = r.lend();
            let cap = rt.cap;
            let (hold, n) = Hold::new(Counter::Rec(rt));
            if cap.is_some_and(|cap| n > cap as i64) {
                violation(format!(
                    "run-time recycling capped: {n} handles held, max_live is {}",
                    cap.unwrap()
                ));
            }
            Item::RtRecycled(hold, r, holder)
        }
    })
}

/// A burst through `with_local`: allocations and frees on the borrowed cache, some
/// handles kept afterwards.
fn local_burst(rng: &mut Rng, held: &mut Vec<Item>) {
    let n = 1 + rng.below(24);
    let keep = rng.per_mille(500);
    let kept: Vec<Item> = PLAIN.with_local(|cache| {
        let mut mine: Vec<(Hold, ClassBox<'static, Val<40>>, u64)> = Vec::new();
        for step in 0..n {
            if step == n / 2 && rng.per_mille(250) {
                // Inside the borrowed cache: administration of the same allocator (the
                // pinned cache is flushed, not retired), and nested borrows.
                match rng.below(5) {
                    0 => PLAIN.release_thread_cache(),
                    1 => {
                        if rng.per_mille(500) {
                            PLAIN.trim();
                        } else {
                            PLAIN.trim_idle();
                        }
                    }
                    2 => {
                        proxalloc::trim_all();
                    }
                    3 => PLAIN.with_local(|inner| {
                        let v = Val::new();
                        let id = v.id;
                        let b = inner.alloc(v);
                        let hold = Hold::of(&PLAIN_HELD);
                        b.check(id, "nested local");
                        drop(hold);
                        cache.free(b);
                    }),
                    _ => SMALL.with_local(|other| {
                        let v = Val::new();
                        let id = v.id;
                        let b = other.alloc(v);
                        let hold = Hold::of(&SMALL_HELD);
                        b.check(id, "other local");
                        drop(hold);
                        other.free(b);
                    }),
                }
            }
            if !mine.is_empty() && rng.per_mille(400) {
                let (hold, b, id) = mine.swap_remove(rng.below(mine.len()));
                b.check(id, "local");
                drop(hold);
                cache.free(b);
            } else {
                let v = Val::new();
                let id = v.id;
                let b = cache.alloc(v);
                mine.push((Hold::of(&PLAIN_HELD), b, id));
            }
        }
        if keep {
            mine.into_iter()
                .map(|(hold, b, id)| Item::Plain(hold, b, id))
                .collect()
        } else {
            for (hold, b, id) in mine {
                b.check(id, "local");
                drop(hold);
                cache.free(b);
            }
            Vec::new()
        }
    });
    held.extend(kept);
    if rng.per_mille(300) {
        // Zero-sized objects through a borrowed cache: everything freed inside.
        ZSTS.with_local(|cache| {
            let zs: Vec<_> = (0..n)
                .map(|_| {
                    let z = cache.alloc(Zst::new());
                    (Hold::of(&ZSTS_HELD), z)
                })
                .collect();
            for (hold, z) in zs {
                drop(hold);
                cache.free(z);
            }
        });
    }
}

/// A burst through a run-time allocator's borrowed cache (its handles borrow the `Arc`,
/// so everything is freed inside). Not on a capped one: `LocalCache::alloc` has no `try_`
/// form, and at the cap it fails like an allocation failure (an abort).
fn local_burst_runtime(ctx: &Ctx, rng: &mut Rng) {
    let Some(rt) = ctx.pick_rt(rng).filter(|rt| rt.cap.is_none()) else {
        return;
    };
    let n = 1 + rng.below(16);
    rt.alloc.with_local(|cache| {
        let mut mine = Vec::new();
        for _ in 0..n {
            if !mine.is_empty() && rng.per_mille(400) {
                let (hold, b, id): (Hold, ClassBox<'_, Val<24>>, u64) =
                    mine.swap_remove(rng.below(mine.len()));
                b.check(id, "run-time local");
                drop(hold);
                cache.free(b);
            } else {
                let v = Val::new();
                let id = v.id;
                let b = cache.alloc(v);
                mine.push((Hold::new(Counter::Rt(rt.clone())).0, b, id));
            }
        }
        for (hold, b, id) in mine {
            b.check(id, "run-time local");
            drop(hold);
            cache.free(b);
        }
    });
}

fn worker(ctx: &Ctx, slot: usize, mut rng: Rng, life: u64) {
    set_chaos(rng.next(), ctx.knobs.panic_per_mille);
    let mut held: Vec<Item> = Vec::new();
    for _ in 0..life {
        if ctx.stop.load(Ordering::Relaxed) {
            break;
        }
        ctx.pause_point();
        step(ctx, slot, &mut rng, &mut held);
        ctx.ops.fetch_add(1, Ordering::Relaxed);
    }
    // On the way out: some handles go to other threads, the rest are freed here, or
    // left for the thread-exit teardown to meet in the caches.
    while let Some(item) = held.pop() {
        if rng.per_mille(300) {
            let to = rng.below(ctx.mailboxes.len());
            ctx.mailboxes[to].lock().unwrap().push(item);
            ctx.handoffs.fetch_add(1, Ordering::Relaxed);
        } else {
            item.free(&mut rng);
        }
    }
}

fn step(ctx: &Ctx, slot: usize, rng: &mut Rng, held: &mut Vec<Item>) {
    match rng.below(100) {
        0..=31 => {
            if let Some(item) = alloc_one(ctx, rng) {
                held.push(item);
            }
        }
        32..=56 => {
            if !held.is_empty() {
                let i = rng.below(held.len());
                held.swap_remove(i).free(rng);
            }
        }
        57..=62 => {
            // A burst of one kind, several magazines' worth; often freed and allocated
            // again, so the thread spills to the depot, refills, and its stash grows.
            let kind_seed = rng.next();
            let n = 4 + rng.below(40);
            let burst = || -> Vec<Item> {
                (0..n)
                    .filter_map(|_| alloc_one(ctx, &mut Rng::new(kind_seed)))
                    .collect()
            };
            let mut items = burst();
            for _ in 0..rng.below(4) {
                for item in items.drain(..) {
                    item.free(rng);
                }
                items = burst();
            }
            held.extend(items);
        }
        63..=68 => {
            let n = rng.below(held.len() + 1);
            for _ in 0..n {
                let i = rng.below(held.len());
                held.swap_remove(i).free(rng);
            }
        }
        69..=73 => {
            for _ in 0..1 + rng.below(4) {
                if held.is_empty() {
                    break;
                }
                let item = held.swap_remove(rng.below(held.len()));
                let to = rng.below(ctx.mailboxes.len());
                ctx.mailboxes[to].lock().unwrap().push(item);
                ctx.handoffs.fetch_add(1, Ordering::Relaxed);
            }
        }
        74..=78 => {
            let got = std::mem::take(&mut *ctx.mailboxes[slot].lock().unwrap());
            held.extend(got);
        }
        79..=80 => local_burst(rng, held),
        81 => local_burst_runtime(ctx, rng),
        82 if rng.per_mille(200) => {
            // A block source of its own, used by a pool and dropped with it: its classes'
            // caches on this thread go when it drops.
            let source = BlockSource::with_block_allocator(32 << 10, Arc::new(CountingBlocks));
            {
                let pool = Pool::with_source(&source);
                for _ in 0..1 + rng.below(20) {
                    let size = [8, 900, 9000, 40_000, 100_000][rng.below(5)];
                    let layout = Layout::from_size_align(size, 16).unwrap();
                    let _ = pool.try_alloc_layout(layout);
                }
                let _ = pool.alloc_owned(PoolVal::new());
            }
            if rng.per_mille(500) {
                source.trim();
            }
            drop(source);
        }
        82..=84 => {
            // Pool work: a new pool, or more work on one this thread holds.
            let pos = held.iter().position(|i| matches!(i, Item::Pool(_)));
            match pos {
                Some(i) if rng.per_mille(700) => {
                    if let Item::Pool(p) = &mut held[i] {
                        if rng.per_mille(250) {
                            p.clear();
                        } else {
                            p.work(rng);
                        }
                    }
                }
                _ => {
                    let mut p = Box::new(PoolItem::new(rng));
                    p.work(rng);
                    ctx.pools.fetch_add(1, Ordering::Relaxed);
                    held.push(Item::Pool(p));
                }
            }
        }
        85..=86 => ctx.create_runtime(rng),
        87 => {
            if ctx.knobs.drop_allocators {
                ctx.drop_runtime(rng);
            }
        }
        88..=90 => match rng.below(6) {
            0 => PLAIN.release_thread_cache(),
            1 => CAPPED.release_thread_cache(),
            2 => RECYCLED.release_thread_cache(),
            3 => ThinVals::allocator().release_thread_cache(),
            4 => block_source().release_thread_cache(),
            _ => {
                if let Some(rt) = ctx.pick_rt(rng) {
                    rt.alloc.release_thread_cache();
                }
            }
        },
        91..=92 => {
            let _ = match rng.below(7) {
                0 => SMALL.trim(),
                1 => ZSTS.trim(),
                2 => RECYCLED.trim(),
                3 => block_source().trim(),
                4 => RECYCLED.trim_idle(),
                5 => ctx.pick_rt(rng).map_or(0, |rt| rt.alloc.trim_idle()),
                _ => ctx.pick_rt(rng).map_or(0, |rt| rt.alloc.trim()),
            };
        }
        93 => {
            let s = match rng.below(3) {
                0 => PLAIN.stats(),
                1 => CAPPED.stats(),
                _ => SHARED.stats(),
            };
            if s.live > s.allocs {
                violation(format!("stats: live above allocs: {s}"));
            }
        }
        _ => {
            // Keep what a thread holds bounded.
            while held.len() > 300 {
                let i = rng.below(held.len());
                held.swap_remove(i).free(rng);
            }
        }
    }
}

// ---------------------------------------------------------------------------------------
// The administrator

fn admin(ctx: &Ctx, mut rng: Rng, budget: usize) {
    let mut squeezed = false;
    while !ctx.stop.load(Ordering::Relaxed) {
        ctx.pause_point();
        match rng.below(8) {
            0 => {
                proxalloc::trim_all();
            }
            1 => {
                // What went unused since the last call: the busy caches keep theirs.
                proxalloc::trim_idle();
            }
            2 => {
                let _ = match rng.below(6) {
                    0 => PLAIN.trim(),
                    1 => CAPPED.trim(),
                    2 => SHARED.trim(),
                    3 => PLAIN.trim_idle(),
                    4 => block_source().trim_idle(),
                    _ => ThinVals::allocator().trim(),
                };
            }
            3 => {
                for s in stats::all() {
                    if s.live > s.allocs {
                        violation(format!("stats::all: live above allocs: {s}"));
                    }
                }
            }
            4 => {
                let _ = stats::dump(&mut std::io::sink());
            }
            5 => {
                // Tiny budgets and back: grants are refused, then granted again.
                if squeezed {
                    proxalloc::set_thread_cache_budget(budget);
                } else {
                    proxalloc::set_thread_cache_budget([0, 1, 64, 2048][rng.below(4)]);
                }
                squeezed = !squeezed;
            }
            6 => {
                let _ = stats::table();
            }
            _ => {
                if let Some(rt) = ctx.pick_rt(&mut rng) {
                    let _ = rt.alloc.stats();
                    rt.alloc.trim();
                }
            }
        }
        ctx.admin_passes.fetch_add(1, Ordering::Relaxed);
        std::thread::sleep(Duration::from_micros(rng.below(300) as u64));
    }
    proxalloc::set_thread_cache_budget(budget);
}

// ---------------------------------------------------------------------------------------
// Checks

/// The books at a quiescent point: every worker and the administrator are parked
/// between operations, and every thread that exited has been joined (its thread-local
/// teardown has run).
fn check_quiescent(ctx: &Ctx, at: &str) {
    fn class<T>(name: &str, a: &ClassAllocator<T>, held: i64, at: &str) {
        let s = a.stats();
        if !s.is_consistent() {
            violation(format!("{at}: {name}: stats inconsistent: {s}"));
        }
        if s.live as i64 != held {
            violation(format!(
                "{at}: {name}: live {} but the test holds {held}: {s}",
                s.live
            ));
        }
    }
    class("plain", &PLAIN, PLAIN_HELD.get(), at);
    class("small", &SMALL, SMALL_HELD.get(), at);
    class("capped", &CAPPED, CAPPED_HELD.get(), at);
    class("zst", &ZSTS, ZSTS_HELD.get(), at);
    class("depot-only", &SHARED, SHARED_HELD.get(), at);
    class("thin", ThinVals::allocator(), THIN_HELD.get(), at);
    let rs = RECYCLED.stats();
    if !rs.is_consistent() || rs.live as i64 != RECYCLED_HELD.get() {
        violation(format!(
            "{at}: recycled: live {} vs held {}: {rs}",
            rs.live,
            RECYCLED_HELD.get()
        ));
    }
    let mut val_held = PLAIN_HELD.get()
        + SMALL_HELD.get()
        + CAPPED_HELD.get()
        + SHARED_HELD.get()
        + THIN_HELD.get();
    let survivors: Vec<Arc<Rt>> = ctx
        .all_runtime
        .lock()
        .unwrap()
        .iter()
        .filter_map(Weak::upgrade)
        .collect();
    for rt in &survivors {
        class(rt.alloc.name(), &rt.alloc, rt.held.get(), at);
        val_held += rt.held.get();
    }
    let rec_survivors: Vec<Arc<RtRec>> = ctx
        .all_runtime_rec
        .lock()
        .unwrap()
        .iter()
        .filter_map(Weak::upgrade)
        .collect();
    let mut rec_held = RECYCLED_HELD.get();
    for rt in &rec_survivors {
        let s = rt.alloc.stats();
        if !s.is_consistent() || s.live as i64 != rt.held.get() {
            violation(format!(
                "{at}: {}: live {} vs held {}: {s}",
                s.name,
                s.live,
                rt.held.get()
            ));
        }
        rec_held += rt.held.get();
    }
    if VALS.live() as i64 != val_held {
        violation(format!(
            "{at}: {} class values alive, but the test holds {val_held} handles",
            VALS.live()
        ));
    }
    if (RECYCLED_VALS.live() as i64) < rec_held {
        violation(format!(
            "{at}: {} recycled values alive, fewer than the {rec_held} lent",
            RECYCLED_VALS.live()
        ));
    }
    let zsts = ZSTS_MADE.load(Ordering::Relaxed) - ZSTS_DROPPED.load(Ordering::Relaxed);
    if zsts as i64 != ZSTS_HELD.get() {
        violation(format!(
            "{at}: {zsts} zero-sized values alive, {} held",
            ZSTS_HELD.get()
        ));
    }
    // Dropping the upgraded references here may drop an allocator, on this thread.
    drop(survivors);
    drop(rec_survivors);
}

/// The end: every thread joined, every handle freed, `trim_all` from this thread.
fn check_end(ctx: &Ctx) {
    REENTER.store(false, Ordering::Relaxed);
    // Run-time allocators still registered: checked alive, then dropped.
    let rts: Vec<Arc<Rt>> = std::mem::take(&mut *ctx.runtime.lock().unwrap());
    let recs: Vec<Arc<RtRec>> = std::mem::take(&mut *ctx.runtime_rec.lock().unwrap());
    proxalloc::trim_all();
    for rt in &rts {
        let s = rt.alloc.stats();
        if s.live != 0 || s.reserved_bytes() != 0 || !s.is_consistent() {
            violation(format!("end: {} keeps memory after trim_all: {s}", s.name));
        }
        if Arc::strong_count(rt) != 1 {
            violation(format!(
                "end: {} still referenced {} times",
                s.name,
                Arc::strong_count(rt)
            ));
        }
    }
    for rt in &recs {
        let s = rt.alloc.stats();
        if s.live != 0 || s.reserved_bytes() != 0 || !s.is_consistent() {
            violation(format!("end: {} keeps memory after trim_all: {s}", s.name));
        }
    }
    drop(rts);
    drop(recs);
    for w in ctx.all_runtime.lock().unwrap().iter() {
        if w.strong_count() != 0 {
            violation("end: a run-time allocator outlived every handle".into());
        }
    }
    for w in ctx.all_runtime_rec.lock().unwrap().iter() {
        if w.strong_count() != 0 {
            violation("end: a run-time recycling allocator outlived every handle".into());
        }
    }
    block_source().trim();
    proxalloc::trim_all();
    fn empty<T>(a: &ClassAllocator<T>) {
        let s = a.stats();
        if s.live != 0 || s.reserved_bytes() != 0 || s.reserved_objects() != 0 || !s.is_consistent()
        {
            violation(format!("end: {} keeps memory after trim_all: {s}", s.name));
        }
    }
    empty(&PLAIN);
    empty(&SMALL);
    empty(&CAPPED);
    empty(&ZSTS);
    empty(&SHARED);
    empty(ThinVals::allocator());
    let rs = RECYCLED.stats();
    if rs.live != 0 || rs.reserved_objects() != 0 {
        violation(format!(
            "end: {} keeps memory after trim_all: {rs}",
            rs.name
        ));
    }
    for s in block_source().stats() {
        if s.live != 0 || s.reserved_objects() != 0 {
            violation(format!("end: pool blocks kept after trim: {s}"));
        }
    }
    let out = BLOCKS_OUT.load(Ordering::Relaxed);
    if out != 0 {
        violation(format!(
            "end: {out} pool blocks ({} bytes) not given back to their block allocator",
            BLOCK_BYTES_OUT.load(Ordering::Relaxed)
        ));
    }
    for (t, what) in [
        (&VALS, "class"),
        (&RECYCLED_VALS, "recycled"),
        (&POOL_VALS, "pool-owned"),
    ] {
        if t.live() != 0 {
            violation(format!("end: {} {what} values never dropped", t.live()));
        }
    }
    let zsts = ZSTS_MADE.load(Ordering::Relaxed) - ZSTS_DROPPED.load(Ordering::Relaxed);
    if zsts != 0 {
        violation(format!("end: {zsts} zero-sized values never dropped"));
    }
    let registered = CLEANUPS_REGISTERED.load(Ordering::Relaxed);
    let done = CLEANUPS_DONE.load(Ordering::Relaxed);
    if registered != done {
        violation(format!(
            "end: {registered} pool cleanups registered, {done} run or cancelled"
        ));
    }
    let (granted, _) = proxalloc::thread_cache_budget();
    if granted != 0 {
        violation(format!(
            "end: {granted} bytes of thread-cache budget still granted"
        ));
    }
}

// ---------------------------------------------------------------------------------------
// The run

/// One slot's thread, and which generation of the slot it is.
struct Slot {
    handle: Option<JoinHandle<()>>,
    generation: u64,
}

/// Runs the stress with `knobs`; returns what it did, or every invariant it saw broken
/// (each message prefixed with the seed).
pub fn run(knobs: Knobs) -> Result<Report, Vec<String>> {
    static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());
    let _serial = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    quiet_injected_panics();
    take_violations();
    VIOLATION_COUNT.store(0, Ordering::Relaxed);
    let started = Instant::now();
    let injected_before = INJECTED.load(Ordering::Relaxed);
    let vals_before = VALS.constructed();
    let rec_before = RECYCLED_VALS.constructed();
    let (_, budget) = proxalloc::thread_cache_budget();
    // A small process-wide budget, so grants run out and come back.
    proxalloc::set_thread_cache_budget(16 << 10);

    let ctx = Arc::new(Ctx {
        mailboxes: (0..knobs.threads).map(|_| Mutex::new(Vec::new())).collect(),
        knobs: knobs.clone(),
        stop: AtomicBool::new(false),
        ops: AtomicU64::new(0),
        pause: AtomicBool::new(false),
        parked: AtomicUsize::new(0),
        runtime: Mutex::new(Vec::new()),
        runtime_rec: Mutex::new(Vec::new()),
        all_runtime: Mutex::new(Vec::new()),
        all_runtime_rec: Mutex::new(Vec::new()),
        created: AtomicU64::new(0),
        dropped: AtomicU64::new(0),
        refusals: AtomicU64::new(0),
        handoffs: AtomicU64::new(0),
        pools: AtomicU64::new(0),
        admin_passes: AtomicU64::new(0),
    });
    let mut report = Report {
        seed: knobs.seed,
        ..Report::default()
    };
    let spawn = |slot: usize, generation: u64, report: &mut Report| -> JoinHandle<()> {
        let mut rng = Rng::derive(knobs.seed, slot as u64 + 1, generation);
        let life = 1 + rng.below(2 * knobs.thread_life as usize) as u64;
        let ctx = ctx.clone();
        report.threads_spawned += 1;
        std::thread::Builder::new()
            .name(format!("stress-{slot}-{generation}"))
            .spawn(move || worker(&ctx, slot, rng, life))
            .expect("spawn a worker")
    };
    let mut slots: Vec<Slot> = (0..knobs.threads)
        .map(|s| Slot {
            handle: Some(spawn(s, 0, &mut report)),
            generation: 0,
        })
        .collect();
    let admin_thread = {
        let ctx = ctx.clone();
        let rng = Rng::derive(knobs.seed, 0, 0);
        std::thread::Builder::new()
            .name("stress-admin".into())
            .spawn(move || admin(&ctx, rng, 16 << 10))
            .expect("spawn the administrator")
    };
    let mut worker_panics = Vec::new();
    let join = |h: JoinHandle<()>, worker_panics: &mut Vec<String>| {
        if let Err(e) = h.join() {
            let msg = e
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| e.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "a non-string panic".into());
            worker_panics.push(format!("a worker panicked: {msg}"));
        }
    };
    let mut next_check = knobs.check_every;
    let mut last_progress = Instant::now();
    loop {
        let ops = ctx.ops.load(Ordering::Relaxed);
        let out_of_time = knobs.duration.is_some_and(|d| started.elapsed() >= d);
        if ops >= knobs.ops || out_of_time || !worker_panics.is_empty() {
            break;
        }
        // Replace threads that exited.
        for (s, slot) in slots.iter_mut().enumerate() {
            if slot.handle.as_ref().is_some_and(JoinHandle::is_finished) {
                join(slot.handle.take().unwrap(), &mut worker_panics);
                slot.generation += 1;
                slot.handle = Some(spawn(s, slot.generation, &mut report));
            }
        }
        if ops >= next_check {
            next_check = ops + knobs.check_every;
            ctx.pause.store(true, Ordering::Release);
            loop {
                for slot in slots.iter_mut() {
                    if slot.handle.as_ref().is_some_and(JoinHandle::is_finished) {
                        join(slot.handle.take().unwrap(), &mut worker_panics);
                    }
                }
                let running = slots.iter().filter(|s| s.handle.is_some()).count() + 1;
                if ctx.parked.load(Ordering::Acquire) == running {
                    break;
                }
                std::thread::sleep(Duration::from_micros(200));
            }
            check_quiescent(&ctx, &format!("after {ops} ops"));
            report.quiescent_checks += 1;
            ctx.pause.store(false, Ordering::Release);
        }
        if knobs.verbose && last_progress.elapsed() >= Duration::from_secs(5) {
            last_progress = Instant::now();
            eprintln!(
                "stress seed {:#x}: {ops} ops, {:.0?}, {} violations so far",
                knobs.seed,
                started.elapsed(),
                VIOLATION_COUNT.load(Ordering::Relaxed)
            );
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    ctx.stop.store(true, Ordering::Relaxed);
    for slot in slots.iter_mut() {
        if let Some(h) = slot.handle.take() {
            join(h, &mut worker_panics);
        }
    }
    join(admin_thread, &mut worker_panics);
    // Handles still in mailboxes are freed here, on the coordinator.
    let mut rng = Rng::derive(knobs.seed, u64::MAX, 0);
    for mailbox in &ctx.mailboxes {
        let items = std::mem::take(&mut *mailbox.lock().unwrap());
        for item in items {
            item.free(&mut rng);
        }
    }
    check_quiescent(&ctx, "at the end, before trim");
    report.quiescent_checks += 1;
    check_end(&ctx);
    proxalloc::set_thread_cache_budget(budget);

    report.ops = ctx.ops.load(Ordering::Relaxed);
    report.allocators_created = ctx.created.load(Ordering::Relaxed);
    report.allocators_dropped = ctx.dropped.load(Ordering::Relaxed);
    report.values_tracked = VALS.constructed() - vals_before;
    report.recycled_values = RECYCLED_VALS.constructed() - rec_before;
    report.refusals_at_cap = ctx.refusals.load(Ordering::Relaxed);
    report.injected_panics = INJECTED.load(Ordering::Relaxed) - injected_before;
    report.handoffs = ctx.handoffs.load(Ordering::Relaxed);
    report.pools = ctx.pools.load(Ordering::Relaxed);
    report.admin_passes = ctx.admin_passes.load(Ordering::Relaxed);
    report.elapsed = started.elapsed();

    let mut problems = worker_panics;
    problems.extend(take_violations());
    let total = VIOLATION_COUNT.load(Ordering::Relaxed);
    if problems.is_empty() {
        Ok(report)
    } else {
        let mut out: Vec<String> = problems
            .into_iter()
            .map(|p| format!("stress seed {:#x}: {p}", knobs.seed))
            .collect();
        out.push(format!(
            "stress seed {:#x}: {total} violations in all; rerun with --seed {:#x} ({report})",
            knobs.seed, knobs.seed
        ));
        Err(out)
    }
}
