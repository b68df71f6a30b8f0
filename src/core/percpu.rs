//! Per-CPU caches (`CacheMode::PerCpu`): for each allocator, each CPU holds a loaded and
//! a previous magazine, reached through restartable sequences ([`rseq`]), so the memory
//! caches hold grows with the number of CPUs, not threads, and any thread can reclaim it.
//!
//! # Who touches a CPU's cache
//! A CPU's cache is a 64-byte [`CpuCache`]; its *word* (see [`rseq`]) says who may touch
//! the rest:
//! - a **length** (the loaded magazine's): the fast paths of threads running on that
//!   CPU pop and push in one sequence each, committing the new word. Nobody else writes.
//! - [`rseq::DETACHED`]: a thread's slow path took the magazines with the `detach`
//!   sequence (on that CPU, so no sequence of another thread was in flight there: it
//!   would have been preempted, hence aborted). It alone touches the cache now, from
//!   any CPU it migrates to, and gives it back with one release store of a new word.
//!   Fast paths and other slow paths see a state and go around it.
//! - [`rseq::STOPPED`]: another thread reclaims the magazines (`trim`). It swaps the
//!   word for this state with a CAS, then fences the CPU (`membarrier`): a sequence
//!   that read the old word before the CAS may still commit until the fence aborts it,
//!   so after the fence the reclaimer reads the word again, and owns the cache only if
//!   it is still exactly its own; otherwise it starts over from the committed word.
//!   Commits always change the count, so no stale commit can rewrite the same word.
//! - [`rseq::EMPTY`]: no magazines; the next slow path on the CPU installs some.
//!
//! # Counting without a second store
//! Each commit adds one to the word's operation count, so a CPU's pops plus pushes is
//! the count. Pops minus pushes is what left the loaded magazine: the holder of a
//! detached cache adds `installed length - length at detach` to the cache's `net`, and
//! its own pop or push too. So `allocs = (ops + net) / 2` and `frees = (ops - net) / 2`,
//! exact whenever no slow path is half done (`Engine::stats` reads them racily, like
//! every counter).

use std::ptr::{self, NonNull};
// std atomics, not the `sync` facade's: per-CPU caches never exist under loom (rseq is
// unavailable there, and loom cannot model the sequences' asm or a CPU).
use std::sync::atomic::{AtomicI64, AtomicPtr, AtomicU64, Ordering};

use super::depot::Eviction;
use super::engine::{Engine, Evictions};
use super::magazine::Magazine;
use super::rseq::{self, CpuArray, Cpus};
use super::thread_cache::Counts;

/// One CPU's cache of one allocator. The fast paths' sequences read `word` and `slots`
/// at offsets 0 and 8 (see `rseq::this_cpu!`); the rest is the holder's (see the module
/// docs), kept in atomics so that stats may read `installed` and `net` at any time.
#[repr(C, align(64))]
#[derive(Debug)]
pub(crate) struct CpuCache {
    word: AtomicU64,
    /// Slot array of the loaded magazine (written by the holder, before it publishes).
    slots: AtomicPtr<*mut u8>,
    /// The loaded magazine's descriptor (its `len` is stale while loaded: the word
    /// holds it), or null.
    loaded: AtomicPtr<Magazine>,
    /// The previous magazine (its `len` is current), or null.
    previous: AtomicPtr<Magazine>,
    /// The loaded magazine's length when it was last installed.
    installed: AtomicU64,
    /// Pops minus pushes not reflected in `installed - length` (see the module docs).
    net: AtomicI64,
}

/// An engine's per-CPU caches.
#[derive(Debug)]
pub(crate) struct PerCpu {
    caches: Box<[CpuCache]>,
    /// Where they are, as the sequences read it (`array.base` is `caches`).
    array: CpuArray,
}

// SAFETY: `array.base` points into `caches`, owned alongside it; every access to the
// caches follows the module's rules (atomics, sequences on the owning CPU, holders).
unsafe impl Send for PerCpu {}
// SAFETY: as above.
unsafe impl Sync for PerCpu {}

// The sequences address a CPU's cache as `base + cpu * 64`, its word at 0 and its slot
// array at 8.
const _: () = {
    assert!(std::mem::size_of::<CpuCache>() == 64);
    assert!(std::mem::offset_of!(CpuCache, word) == 0);
    assert!(std::mem::offset_of!(CpuCache, slots) == 8);
};

/// The number of CPU numbers the kernel may report: one past the highest possible CPU
/// (`/sys/devices/system/cpu/possible`, e.g. `0-63`), or the parallelism std sees.
fn possible_cpus() -> usize {
    std::fs::read_to_string("/sys/devices/system/cpu/possible")
        .ok()
        .and_then(|s| {
            s.trim()
                .split(',')
                .filter_map(|r| r.rsplit('-').next()?.parse::<usize>().ok())
                .max()
        })
        .map(|max| max + 1)
        .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()))
}

impl PerCpu {
    /// Caches for every possible CPU, all [`rseq::EMPTY`], for magazines of `cap` objects;
    /// `None` where rseq cannot be used (the allocator then uses per-thread caches).
    pub(crate) fn new(cap: usize) -> Option<Self> {
        if !rseq::available() {
            return None;
        }
        let caches: Box<[CpuCache]> = (0..possible_cpus())
            .map(|_| CpuCache {
                word: AtomicU64::new(rseq::EMPTY),
                slots: AtomicPtr::new(ptr::null_mut()),
                loaded: AtomicPtr::new(ptr::null_mut()),
                previous: AtomicPtr::new(ptr::null_mut()),
                installed: AtomicU64::new(0),
                net: AtomicI64::new(0),
            })
            .collect();
        let array = CpuArray {
            base: caches.as_ptr().cast_mut().cast(),
            ncpu: caches.len() as u32,
            cap: cap as u32,
        };
        Some(PerCpu { caches, array })
    }

    /// What the sequences read: the array's place, count and capacity.
    #[inline(always)]
    pub(crate) fn array(&self) -> &CpuArray {
        &self.array
    }

    /// What the sequences need, for the thread with rseq area `area`.
    #[inline(always)]
    pub(crate) fn cpus(&self, area: *mut u8) -> Cpus {
        Cpus {
            area,
            array: &self.array,
        }
    }

    /// Adds every CPU's allocations and frees to `n` (see the module docs).
    pub(crate) fn read_counts(&self, n: &mut Counts) {
        for c in self.caches.iter() {
            let word = c.word.load(Ordering::Relaxed);
            let mut net = c.net.load(Ordering::Relaxed);
            if rseq::len(word) < rseq::BUSY_MIN {
                net += c.installed.load(Ordering::Relaxed) as i64 - rseq::len(word) as i64;
            }
            let ops = rseq::ops(word) as i64;
            n.allocs += ((ops + net) / 2) as u64;
            n.frees += ((ops - net) / 2) as u64;
        }
    }
}

/// A CPU's cache taken by a slow path ([`rseq::detach`]) or a reclaimer ([`stop`]): its
/// magazines, unpacked, until [`install`](Self::install) gives them back.
struct Held<'p> {
    cache: &'p CpuCache,
    /// The word when it was taken (its count goes on; its length was the loaded
    /// magazine's, or a state).
    taken: u64,
    /// Operations done by the holder, and their pops minus pushes.
    ops: u64,
    net: i64,
    loaded: Option<&'p Magazine>,
    previous: Option<&'p Magazine>,
}

impl<'p> Held<'p> {
    /// Takes over a cache whose word was `taken` when this thread detached or stopped
    /// it.
    ///
    /// # Safety
    /// The calling thread holds the cache (see the module docs), whose magazines are
    /// descriptors of `e`'s table.
    unsafe fn new(cache: &'p CpuCache, taken: u64) -> Self {
        debug_assert!(
            matches!(
                rseq::len(cache.word.load(Ordering::Relaxed)),
                rseq::DETACHED | rseq::STOPPED
            ),
            "a CPU cache taken without detaching or stopping it"
        );
        let loaded = NonNull::new(cache.loaded.load(Ordering::Relaxed));
        let previous = NonNull::new(cache.previous.load(Ordering::Relaxed));
        let len = rseq::len(taken);
        // SAFETY: magazines this holder owns now; descriptors live as long as the table.
        let loaded = loaded.map(|m| unsafe { &*m.as_ptr() });
        // SAFETY: as above.
        let previous = previous.map(|m| unsafe { &*m.as_ptr() });
        let mut net = 0;
        if let Some(m) = loaded {
            debug_assert!(len <= u64::from(u32::MAX));
            // The loaded magazine's length lived in the word: write it back.
            // SAFETY: owned by this holder.
            unsafe { m.with_rounds(|r| r.len = len as usize) };
            net = cache.installed.load(Ordering::Relaxed) as i64 - len as i64;
        } else {
            debug_assert_eq!(len, rseq::EMPTY, "a length with no magazine loaded");
        }
        Held {
            cache,
            taken,
            ops: 0,
            net,
            loaded,
            previous,
        }
    }

    fn loaded_len(&self) -> usize {
        // SAFETY: owned by this holder.
        self.loaded.map_or(0, |m| unsafe { m.len() })
    }

    /// Pops the loaded magazine (holder's own operation, counted like a fast path's).
    fn pop(&mut self) -> Option<NonNull<u8>> {
        let m = self.loaded?;
        // SAFETY: owned by this holder.
        let p = unsafe { m.pop_round() }?;
        self.ops += 1;
        self.net += 1;
        Some(p)
    }

    /// Pushes onto the loaded magazine; false when full or absent.
    fn push(&mut self, p: NonNull<u8>, cap: usize) -> bool {
        let Some(m) = self.loaded else {
            return false;
        };
        // SAFETY: owned by this holder; `cap` is the magazines' capacity.
        let pushed = unsafe { m.push_round(p, cap) };
        if pushed {
            self.ops += 1;
            self.net -= 1;
        }
        pushed
    }

    fn swap(&mut self) {
        std::mem::swap(&mut self.loaded, &mut self.previous);
    }

    /// Gives the cache back: its magazines and counts first, then the word (a release
    /// store: whoever next reads it sees the rest). From any CPU: while the word is a
    /// state, nobody else writes the cache.
    fn install(self) {
        let c = self.cache;
        c.net.fetch_add(self.net, Ordering::Relaxed);
        c.previous.store(
            self.previous
                .map_or(ptr::null_mut(), |m| ptr::from_ref(m).cast_mut()),
            Ordering::Relaxed,
        );
        let (slots, len) = match self.loaded {
            // SAFETY: owned by this holder until the store below.
            Some(m) => unsafe { m.with_rounds(|r| (r.slots, r.len as u64)) },
            None => (ptr::null_mut(), rseq::EMPTY),
        };
        c.loaded.store(
            self.loaded
                .map_or(ptr::null_mut(), |m| ptr::from_ref(m).cast_mut()),
            Ordering::Relaxed,
        );
        c.slots.store(slots, Ordering::Relaxed);
        c.installed.store(
            if self.loaded.is_some() { len } else { 0 },
            Ordering::Relaxed,
        );
        let word = rseq::with_len(self.taken, len) + self.ops * rseq::ONE_OP;
        c.word.store(word, Ordering::Release);
    }
}

impl Engine {
    /// Makes the held loaded magazine non-empty: swap with a non-empty previous, or take
    /// a full one from the depot (the previous, empty, goes to the depot). False when
    /// the depot has none.
    fn cpu_refill<'e>(&'e self, h: &mut Held<'e>) -> bool {
        // SAFETY: owned by the holder.
        if h.previous.is_some_and(|p| unsafe { p.len() } > 0) {
            h.swap();
            return true;
        }
        let Some(full) = self.depot.take_full() else {
            return false;
        };
        self.retired.refills.add_shared(1);
        if let Some(prev) = h.previous.take() {
            self.put_shared(prev);
        }
        h.previous = h.loaded.take();
        h.loaded = Some(full);
        true
    }

    /// Makes room in the held loaded magazine: swap with a non-full previous, or take an
    /// empty one from the depot (the previous, full, goes to the depot: a spill). `None`
    /// when no magazine can be had.
    fn cpu_make_room<'e>(&'e self, h: &mut Held<'e>) -> Option<Option<Eviction>> {
        let cap = self.depot.capacity();
        // SAFETY: owned by the holder.
        if h.previous.is_some_and(|p| unsafe { p.len() } < cap) {
            h.swap();
            return Some(None);
        }
        let empty = self.depot.take_empty()?;
        let evicted = h.previous.take().and_then(|prev| self.put_shared(prev));
        h.previous = h.loaded.take();
        h.loaded = Some(empty);
        Some(evicted)
    }

    /// The per-CPU slow path of an allocation on the calling thread, whose rseq area is
    /// `area`: take this CPU's cache, refill it, pop, give it back. `None` when the
    /// cache is busy (another thread holds or reclaims it: rare) or nothing is cached;
    /// the caller then goes to the backing allocator.
    pub(crate) fn cpu_alloc(&self, pc: &PerCpu, area: *mut u8) -> Option<NonNull<u8>> {
        debug_assert!(ptr::eq(pc, self.percpu.as_ref().unwrap()));
        let cpus = pc.cpus(area);
        // No second try of the fast path's sequence, which has just failed (or did not
        // run, the area not set up yet): the detached cache below is popped first.
        // SAFETY: this thread's registered area; `pc` is this engine's caches.
        let (cpu, word) = unsafe { rseq::detach(cpus) }?;
        // SAFETY: detached by this thread; the magazines are this engine's.
        let mut h = unsafe { Held::new(&pc.caches[cpu as usize], word) };
        let p = if h.loaded_len() > 0 || self.cpu_refill(&mut h) {
            h.pop()
        } else {
            None
        };
        h.install();
        p
    }

    /// The per-CPU slow path of a free (see [`cpu_alloc`](Self::cpu_alloc)): false when
    /// `p` was not taken (the cache is busy, or no magazine can be had); the caller then
    /// gives it to the backing allocator.
    ///
    /// # Safety
    /// `p` is an object of this engine that nobody uses any more.
    pub(crate) unsafe fn cpu_free(&self, pc: &PerCpu, area: *mut u8, p: NonNull<u8>) -> bool {
        let cpus = pc.cpus(area);
        // As in `cpu_alloc`: the detached cache below is pushed to first.
        // SAFETY: this thread's registered area; `pc` is this engine's caches.
        let Some((cpu, word)) = (unsafe { rseq::detach(cpus) }) else {
            return false;
        };
        // SAFETY: detached by this thread; the magazines are this engine's.
        let mut h = unsafe { Held::new(&pc.caches[cpu as usize], word) };
        let cap = self.depot.capacity();
        let mut evictions = Evictions::default();
        let pushed = h.push(p, cap)
            || match self.cpu_make_room(&mut h) {
                Some(evicted) => {
                    evictions.push(evicted);
                    h.push(p, cap)
                }
                None => false,
            };
        h.install();
        // After the install: releasing may run destructors (user code).
        self.release(evictions);
        pushed
    }

    /// Takes every CPU's magazines from any thread (`trim`, `trim_all`): stops each CPU's
    /// cache, fences the CPU, and hands both magazines to the depot (whose trim then
    /// releases them). A CPU whose cache a slow path holds is skipped: its magazines come
    /// back with the next trim. Returns the evictions to release.
    pub(crate) fn cpu_reclaim(&self, pc: &PerCpu) -> Evictions {
        let mut evictions = Evictions::default();
        // Reclaimers and the allocator's drop take the cache-list lock, so no two of
        // them hold one CPU's cache (the lock is not on any fast or slow path).
        let _list = crate::sync::lock(&self.cache_list);
        if !self.is_alive() {
            return evictions;
        }
        for (cpu, cache) in pc.caches.iter().enumerate() {
            let Some(h) = stop(cache, cpu as u32) else {
                continue;
            };
            self.empty_held(h, &mut evictions);
        }
        evictions
    }

    /// The allocator is being dropped (no thread can be using it; the caller holds the
    /// cache-list lock, so no reclaimer is at work): every CPU's magazines go back, their
    /// objects released (the engine is dead, so the depot evicts them). Returns the
    /// evictions to release.
    pub(crate) fn cpu_shutdown(&self, pc: &PerCpu) -> Evictions {
        let mut evictions = Evictions::default();
        for cache in pc.caches.iter() {
            let word = cache.word.load(Ordering::Acquire);
            debug_assert!(
                rseq::len(word) < rseq::STOPPED,
                "a CPU cache held while its allocator drops"
            );
            // Nobody else can touch the cache any more (no thread uses the allocator,
            // and the last sequences on it happened before the drop): stop it plainly.
            cache
                .word
                .store(rseq::with_len(word, rseq::STOPPED), Ordering::Relaxed);
            // SAFETY: stopped by this thread, with no sequence that could commit.
            let h = unsafe { Held::new(cache, word) };
            self.empty_held(h, &mut evictions);
        }
        evictions
    }

    /// Hands a held cache's magazines to the depot and leaves it [`rseq::EMPTY`].
    fn empty_held(&self, mut h: Held<'_>, evictions: &mut Evictions) {
        for mag in [h.loaded.take(), h.previous.take()].into_iter().flatten() {
            evictions.push(self.put_shared(mag));
        }
        h.install();
    }
}

/// Stops `cache` (CPU `cpu`'s) from another thread, for reclaim: `None` if it holds no
/// magazines, or a slow path or another reclaimer holds it. See the module docs for why
/// the fence and the second read make the CAS safe against sequences in flight.
fn stop(cache: &CpuCache, cpu: u32) -> Option<Held<'_>> {
    let mut word = cache.word.load(Ordering::Acquire);
    loop {
        if rseq::len(word) >= rseq::BUSY_MIN {
            return None;
        }
        let stopped = rseq::with_len(word, rseq::STOPPED);
        if let Err(now) =
            cache
                .word
                .compare_exchange(word, stopped, Ordering::Acquire, Ordering::Acquire)
        {
            word = now;
            continue;
        }
        rseq::fence_cpu(cpu);
        let now = cache.word.load(Ordering::Acquire);
        if now == stopped {
            // SAFETY: stopped by this thread, with no sequence left that could commit
            // over it; the magazines are the engine's.
            return Some(unsafe { Held::new(cache, word) });
        }
        // A sequence that read `word` committed after the CAS: start from its word.
        word = now;
    }
}

#[cfg(all(
    test,
    target_os = "linux",
    target_arch = "x86_64",
    not(miri),
    not(proxalloc_loom)
))]
mod tests {
    //! The hard cases made to happen: many more threads than CPUs, threads that hop
    //! between CPUs (`sched_setaffinity`), a spin inside every sequence so that
    //! preemption lands there (the abort count must rise), and a trimmer reclaiming every
    //! CPU's magazines from another thread meanwhile. Every value is accounted for.

    use std::collections::HashSet;
    use std::sync::atomic::{AtomicU64, Ordering};
    use std::sync::{Arc, Mutex};

    use crate::core::rseq;
    use crate::{CacheMode, ClassAllocator, Config};

    extern "C" {
        fn syscall(number: std::ffi::c_long, ...) -> std::ffi::c_long;
    }

    /// Moves the calling thread to `cpu` (ignored where not allowed).
    fn pin_to(cpu: usize) {
        let mut mask = [0u64; 16];
        mask[cpu / 64 % 16] |= 1 << (cpu % 64);
        // SAFETY: sched_setaffinity(0 = this thread, size, mask), a valid mask.
        unsafe { syscall(203, 0, std::mem::size_of_val(&mask), mask.as_ptr()) };
    }

    /// Lets the calling thread run on every CPU again.
    fn unpin() {
        let mask = [u64::MAX; 16];
        // SAFETY: as above.
        unsafe { syscall(203, 0, std::mem::size_of_val(&mask), mask.as_ptr()) };
    }

    static CONSTRUCTED: AtomicU64 = AtomicU64::new(0);
    static DROPPED: AtomicU64 = AtomicU64::new(0);

    /// A value that checks it is whole when dropped, and counts.
    struct Token {
        id: u64,
        check: u64,
    }

    impl Token {
        fn new(id: u64) -> Self {
            CONSTRUCTED.fetch_add(1, Ordering::Relaxed);
            Token { id, check: !id }
        }
    }

    impl Drop for Token {
        fn drop(&mut self) {
            assert_eq!(self.check, !self.id, "a value was overwritten while live");
            DROPPED.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Serialises the tests here: they set the process-wide injected delay.
    static SERIAL: Mutex<()> = Mutex::new(());

    fn xorshift(s: &mut u64) -> u64 {
        *s ^= *s << 13;
        *s ^= *s >> 7;
        *s ^= *s << 17;
        *s
    }

    /// `trim_idle` judges a per-CPU allocator by its CPU caches' operations too (a thread
    /// with an rseq area has no thread cache of it): busy, its CPU caches stay; idle for a
    /// whole interval, they go with the rest.
    #[test]
    fn trim_idle_keeps_a_busy_per_cpu_allocators_cpu_caches() {
        let _s = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
        let a = ClassAllocator::<u64>::with_config(
            "percpu-trim-idle",
            Config::new().mode(CacheMode::PerCpu).magazine_size(8),
        );
        if std::env::var_os("PROXALLOC_TEST_REQUIRE_PERCPU").is_some_and(|v| !v.is_empty()) {
            assert_eq!(a.mode(), CacheMode::PerCpu, "the allocator fell back");
        }
        if a.mode() != CacheMode::PerCpu || rseq::thread_area().is_null() {
            eprintln!("per-CPU caches unavailable here: nothing to test");
            return;
        }
        let pause = || std::thread::sleep(crate::core::admin::MIN_IDLE_INTERVAL * 3);
        let round = || drop((0..6).map(|i| a.alloc(i)).collect::<Vec<_>>());
        round();
        a.trim_idle();
        pause();
        round();
        let cached = a.stats().cached_in_threads;
        assert!(cached > 0, "the CPU caches hold the round's objects");
        a.trim_idle();
        assert_eq!(
            a.stats().cached_in_threads,
            cached,
            "a busy allocator's CPU caches"
        );
        pause();
        a.trim_idle();
        let s = a.stats();
        assert_eq!(s.reserved_objects(), 0, "idle for an interval: {s}");
    }

    /// `threads` workers (each hopping between CPUs every `hop` operations, 0: never)
    /// allocate and free at random through one per-CPU allocator, holding up to 64
    /// objects each, with `delay` spins inside every sequence; a trimmer reclaims every
    /// CPU's cache meanwhile. Returns the aborts seen.
    fn churn(threads: usize, ops: u64, hop: u64, delay: u32) -> u64 {
        let _s = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
        let a = Arc::new(ClassAllocator::<Token>::with_config(
            "percpu-churn",
            Config::new()
                .mode(CacheMode::PerCpu)
                .magazine_size(8)
                .depot_bytes(1 << 10),
        ));
        // CI sets the variable where per-CPU caches must work (its run without glibc's
        // rseq areas), so a fallback there fails instead of passing: of the allocator,
        // or of this thread (without an area its operations use a thread cache).
        if std::env::var_os("PROXALLOC_TEST_REQUIRE_PERCPU").is_some_and(|v| !v.is_empty()) {
            assert_eq!(a.mode(), CacheMode::PerCpu, "the allocator fell back");
            assert!(
                !rseq::thread_area().is_null(),
                "this thread has no rseq area"
            );
        }
        if a.mode() != CacheMode::PerCpu {
            eprintln!("per-CPU caches unavailable here: nothing to test");
            return 0;
        }
        let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
        let before = (
            CONSTRUCTED.load(Ordering::Relaxed),
            DROPPED.load(Ordering::Relaxed),
        );
        let aborts = rseq::aborts();
        rseq::INJECT_DELAY.store(delay, Ordering::Relaxed);
        let next_id = Arc::new(AtomicU64::new(1));
        let done = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let trimmer = {
            let (a, done) = (Arc::clone(&a), Arc::clone(&done));
            std::thread::spawn(move || {
                let mut trims = 0u64;
                while !done.load(Ordering::Relaxed) {
                    a.trim();
                    trims += 1;
                    std::thread::yield_now();
                }
                trims
            })
        };
        let workers: Vec<_> = (0..threads)
            .map(|t| {
                let (a, next_id) = (Arc::clone(&a), Arc::clone(&next_id));
                std::thread::spawn(move || {
                    let mut seed = 0x9e37_79b9_7f4a_7c15 ^ (t as u64 + 1);
                    let mut held = Vec::new();
                    for i in 0..ops {
                        if hop > 0 && i % hop == 0 {
                            pin_to(xorshift(&mut seed) as usize % cpus);
                        }
                        if held.len() < 64 && (held.is_empty() || xorshift(&mut seed) % 2 == 0) {
                            let id = next_id.fetch_add(1, Ordering::Relaxed);
                            held.push(a.alloc(Token::new(id)));
                        } else {
                            let k = xorshift(&mut seed) as usize % held.len();
                            let b = held.swap_remove(k);
                            assert_eq!(b.check, !b.id);
                            drop(b);
                        }
                        // Two live handles never share an object.
                        if i % 1024 == 0 {
                            let addrs: HashSet<usize> = held
                                .iter()
                                .map(|b| crate::ClassBox::as_ptr(b) as usize)
                                .collect();
                            assert_eq!(addrs.len(), held.len(), "an object handed out twice");
                        }
                    }
                    unpin();
                })
            })
            .collect();
        for w in workers {
            w.join().expect("a worker failed");
        }
        done.store(true, Ordering::Relaxed);
        let trims = trimmer.join().expect("the trimmer failed");
        rseq::INJECT_DELAY.store(0, Ordering::Relaxed);
        assert!(trims > 0);
        let s = a.stats();
        assert!(s.is_consistent(), "{s}");
        assert_eq!(s.live, 0, "{s}");
        let cached = s.cached_in_threads + s.cached_in_depot;
        assert!(
            s.cached_in_threads <= 2 * 8 * rseq_cpus(),
            "at most two magazines a CPU: {s}"
        );
        // Reclaimed from this thread, which used no CPU cache of its own.
        let released = a.trim();
        assert_eq!(
            released,
            cached as usize * std::mem::size_of::<Token>(),
            "{s}"
        );
        let s = a.stats();
        assert_eq!(s.reserved_bytes(), 0, "{s}");
        drop(a);
        assert_eq!(
            CONSTRUCTED.load(Ordering::Relaxed) - before.0,
            DROPPED.load(Ordering::Relaxed) - before.1,
            "every value dropped exactly once"
        );
        rseq::aborts() - aborts
    }

    fn rseq_cpus() -> u64 {
        super::possible_cpus() as u64
    }

    /// Moves the calling thread to `cpu` and says whether it runs there now (false where
    /// the CPU is offline or not allowed to this process).
    fn try_pin(cpu: usize) -> bool {
        pin_to(cpu);
        // SAFETY: no preconditions.
        usize::try_from(unsafe { libc::sched_getcpu() }) == Ok(cpu)
    }

    /// A per-CPU allocator of `u64`s with magazines of 8 and a depot for 1024 of them, or
    /// `None` where per-CPU caches are unavailable (a failure where CI requires them).
    fn per_cpu_allocator(name: &'static str) -> Option<ClassAllocator<u64>> {
        let a = ClassAllocator::<u64>::with_config(
            name,
            Config::new()
                .mode(CacheMode::PerCpu)
                .magazine_size(8)
                .depot_bytes(1024 * crate::core::magazine::cached_bytes(8)),
        );
        if std::env::var_os("PROXALLOC_TEST_REQUIRE_PERCPU").is_some_and(|v| !v.is_empty()) {
            assert_eq!(a.mode(), CacheMode::PerCpu, "the allocator fell back");
            assert!(
                !rseq::thread_area().is_null(),
                "this thread has no rseq area"
            );
        }
        if a.mode() != CacheMode::PerCpu || rseq::thread_area().is_null() {
            eprintln!("per-CPU caches unavailable here: nothing to test");
            return None;
        }
        Some(a)
    }

    /// Every CPU this thread may run on has a cache: an object freed on any of them stays
    /// cached, none goes back to the backing allocator.
    #[test]
    fn every_allowed_cpu_has_a_cache() {
        let _s = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
        let Some(a) = per_cpu_allocator("percpu-every-cpu") else {
            return;
        };
        // The CPUs this thread may run on, as the kernel says (not as `possible_cpus`
        // counts them), highest first: the last one is what an off-by-one array misses.
        // SAFETY: an all-zero `cpu_set_t` is an empty set.
        let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
        // SAFETY: this thread, and the size of the set it fills.
        let r = unsafe { libc::sched_getaffinity(0, std::mem::size_of_val(&set), &mut set) };
        assert_eq!(r, 0, "sched_getaffinity failed");
        let allowed = (0..libc::CPU_SETSIZE as usize)
            .rev()
            // SAFETY: `c` is below the set's size.
            .filter(|&c| unsafe { libc::CPU_ISSET(c, &set) });
        let mut tried = 0;
        for cpu in allowed {
            if !try_pin(cpu) {
                continue;
            }
            tried += 1;
            let before = a.stats();
            drop(a.alloc(cpu as u64));
            let s = a.stats();
            assert_eq!(s.backing_frees, before.backing_frees, "CPU {cpu}: {s}");
            assert_eq!(
                s.cached_in_threads,
                before.cached_in_threads + 1,
                "CPU {cpu}: {s}"
            );
        }
        unpin();
        assert!(tried > 0, "could not run on any CPU");
        assert_eq!(a.trim(), tried * 8);
    }

    /// On one CPU, frees beyond its two magazines go to the depot as full magazines
    /// (spills; none to the backing allocator), and allocations take them back
    /// (refills), each counted.
    #[test]
    fn a_cpus_full_magazines_spill_to_the_depot_and_refill_from_it() {
        let _s = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
        let Some(a) = per_cpu_allocator("percpu-spill-refill") else {
            return;
        };
        // SAFETY: no preconditions.
        let here = unsafe { libc::sched_getcpu() };
        if !usize::try_from(here).is_ok_and(try_pin) {
            unpin();
            eprintln!("cannot pin this thread to a CPU here: nothing to test");
            return;
        }
        let held: Vec<_> = (0..64).map(|i| a.alloc(i)).collect();
        let first = a.stats();
        assert_eq!(first.backing_allocs, 64, "{first}");
        drop(held);
        let s = a.stats();
        assert_eq!(
            s.backing_frees, 0,
            "a free went past the CPU's magazines: {s}"
        );
        assert_eq!(s.cached_in_threads + s.cached_in_depot, 64, "{s}");
        assert!(
            s.cached_in_threads <= 16,
            "at most two magazines a CPU: {s}"
        );
        assert_eq!(s.cached_in_depot % 8, 0, "full magazines only: {s}");
        assert_eq!(s.spills, s.cached_in_depot / 8, "{s}");
        let again: Vec<_> = (0..64).map(|i| a.alloc(i)).collect();
        let t = a.stats();
        unpin();
        assert_eq!(t.backing_allocs, 64, "every object came from a cache: {t}");
        assert_eq!(t.cached_in_threads + t.cached_in_depot, 0, "{t}");
        assert_eq!(
            t.refills, s.spills,
            "each spilled magazine refilled once: {t}"
        );
        drop(again);
    }

    #[test]
    fn many_threads_on_few_cpus_lose_nothing() {
        let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
        churn(8 * cpus, 20_000, 0, 0);
    }

    #[test]
    fn migrations_inside_sequences_abort_them_and_lose_nothing() {
        let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
        let aborts = churn(4 * cpus, 10_000, 7, 2_000);
        eprintln!("aborted sequences: {aborts}");
        let probe =
            ClassAllocator::<u64>::with_config("probe", Config::new().mode(CacheMode::PerCpu));
        if probe.mode() == CacheMode::PerCpu {
            // Threads hopping CPUs mid-sequence, and the trimmer's fences, abort some.
            assert!(
                aborts > 0,
                "no sequence was ever aborted: the test tests nothing"
            );
        }
    }
}
