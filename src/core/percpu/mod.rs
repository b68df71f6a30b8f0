//! Per-CPU caches (`CacheMode::PerCpu`): for each allocator, each CPU holds a loaded and
//! a previous magazine, reached through restartable sequences ([`rseq`]), so the memory
//! caches hold grows with the number of CPUs, not threads, and any thread can reclaim it.
//!
//! # Who touches a CPU's cache
//! A CPU's cache is a 64-byte [`CpuCache`]; its *word* (see [`rseq`]) says who may touch
//! the rest:
//! - a **length** (the loaded magazine's, 0 with a capacity of 0 when none is loaded):
//!   the fast paths of threads running on that CPU pop and push in one sequence each,
//!   committing the new word. Nobody else writes.
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
//!   Fast paths' commits always change the count, so no stale commit can rewrite the
//!   same word; a detach's does not, but it commits `DETACHED`, which no reclaimer's
//!   word is, and a retire commits `RETIRED`, which none is either. If
//!   the fence fails, the reclaimer puts the word back (unless a commit already did) and
//!   leaves the magazines where they are (see [`rseq::fence`]).
//! - [`rseq::RETIRED`]: after a fence failed for good, each CPU's cache is retired at the
//!   next slow path on that CPU (its magazines to the depot), and the allocator's threads
//!   use per-thread caches from then on. Nobody touches a retired cache again.
//!
//! # When the cache is busy
//! A slow path that finds its CPU's cache held (by another thread's slow path, or a
//! reclaimer) does not go to the backing allocator: it uses the allocator's *spare*
//! magazine, shared by every thread under a lock that no fast path takes, which takes
//! frees until it is full (then it goes to the depot and an empty one replaces it) and
//! gives them back to allocations (then it is refilled from the depot). So a burst of
//! threads, many more than CPUs, keeps its objects in the caches and the depot.
//!
//! # Counting without a second store
//! Each commit adds one to the word's operation count, so a CPU's pops plus pushes is
//! the count. Pops minus pushes is what left the loaded magazine: the holder of a
//! detached cache adds `installed length - length at detach` to the cache's `net`, and
//! its own pop or push too. So `allocs = (ops + net) / 2` and `frees = (ops - net) / 2`,
//! exact whenever no slow path is half done (`Engine::stats` reads them racily, like
//! every counter). The spare magazine's operations are counted on the engine.

use std::ptr::{self, NonNull};
// std atomics and lock, not the `sync` facade's: per-CPU caches never exist under loom
// (rseq is unavailable there, and loom cannot model the sequences' asm or a CPU).
use std::sync::atomic::{AtomicI64, AtomicPtr, AtomicU32, AtomicU64, Ordering};
use std::sync::Mutex;

use super::exchange::{Evictions, MagazinePair, SharedSupply};
use super::magazine::Magazine;
use super::rseq;
use super::thread_cache::Counts;

/// One CPU's cache of one allocator. The sequences read `word`, `slots` and `cap` at
/// [`rseq::WORD`], [`rseq::SLOTS`] and [`rseq::CAP`]; the rest is the holder's (see the
/// module docs), kept in atomics so that stats may read `installed` and `net` at any
/// time.
#[repr(C, align(64))]
#[derive(Debug)]
pub(crate) struct CpuCache {
    pub(super) word: AtomicU64,
    /// Slot array of the loaded magazine (written by the holder, before it publishes).
    slots: AtomicPtr<*mut u8>,
    /// How far the fast paths may fill the loaded magazine: its capacity, or 0 when none
    /// is loaded (written by the holder, before it publishes).
    cap: AtomicU32,
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

// The sequences address a CPU's cache as `base + (cpu << CACHE_SHIFT)`.
const _: () = {
    assert!(std::mem::size_of::<CpuCache>() == 1 << rseq::CACHE_SHIFT);
    assert!(std::mem::offset_of!(CpuCache, word) == rseq::WORD);
    assert!(std::mem::offset_of!(CpuCache, slots) == rseq::SLOTS);
    assert!(std::mem::offset_of!(CpuCache, cap) == rseq::CAP);
};

/// An engine's per-CPU caches.
#[derive(Debug)]
pub(crate) struct PerCpu {
    pub(super) caches: Box<[CpuCache]>,
    /// The spare magazine of busy slow paths (see the module docs), or null.
    spare: Mutex<SpareMagazine>,
}

/// The spare magazine, owned by whoever holds the lock.
#[derive(Debug)]
struct SpareMagazine(*const Magazine);

// SAFETY: the descriptor is the engine's, and only the lock's holder touches it.
unsafe impl Send for SpareMagazine {}

impl PerCpu {
    /// Caches for every CPU number the kernel may report, all empty; `None` where rseq
    /// cannot be used, or a fence failed for good (the allocator then uses per-thread
    /// caches).
    pub(crate) fn new() -> Option<Self> {
        if !rseq::available() || rseq::fence::disabled().is_some() {
            return None;
        }
        let caches: Box<[CpuCache]> = (0..rseq::ncpu())
            .map(|_| CpuCache {
                word: AtomicU64::new(0),
                slots: AtomicPtr::new(ptr::null_mut()),
                cap: AtomicU32::new(0),
                loaded: AtomicPtr::new(ptr::null_mut()),
                previous: AtomicPtr::new(ptr::null_mut()),
                installed: AtomicU64::new(0),
                net: AtomicI64::new(0),
            })
            .collect();
        Some(PerCpu {
            caches,
            spare: Mutex::new(SpareMagazine(ptr::null())),
        })
    }

    /// Where CPU 0's cache is: CPU `n`'s is at `base + (n << rseq::CACHE_SHIFT)`, for every
    /// `n` below [`rseq::ncpu`] (what the fast paths get through the allocator's hints).
    #[inline(always)]
    pub(crate) fn base(&self) -> usize {
        self.caches.as_ptr() as usize
    }

    fn ncpu(&self) -> u32 {
        self.caches.len() as u32
    }

    /// Adds every CPU's allocations and frees to `n` (see the module docs).
    pub(crate) fn read_counts(&self, n: &mut Counts) {
        for c in self.caches.iter() {
            let word = c.word.load(Ordering::Relaxed);
            let mut net = c.net.load(Ordering::Relaxed);
            if !rseq::is_state(word) {
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
    /// magazine's).
    taken: u64,
    /// Operations done by the holder, and their pops minus pushes.
    ops: u64,
    net: i64,
    /// The cache's magazines, the loaded one's length written back into it.
    pair: MagazinePair<'p>,
}

impl<'p> Held<'p> {
    /// Takes over a cache whose word was `taken` when this thread detached or stopped
    /// it; its magazines hold `cap` objects each.
    ///
    /// # Safety
    /// The calling thread holds the cache (see the module docs), whose magazines are
    /// descriptors of the engine's table.
    unsafe fn new(cache: &'p CpuCache, taken: u64, cap: usize) -> Self {
        debug_assert!(
            matches!(
                rseq::len(cache.word.load(Ordering::Relaxed)),
                rseq::DETACHED | rseq::STOPPED
            ),
            "a CPU cache taken without detaching or stopping it"
        );
        debug_assert!(!rseq::is_state(taken), "a held cache taken from a state");
        let loaded = NonNull::new(cache.loaded.load(Ordering::Relaxed));
        let previous = NonNull::new(cache.previous.load(Ordering::Relaxed));
        let len = rseq::len(taken);
        // SAFETY: magazines this holder owns now; descriptors live as long as the table.
        let loaded = loaded.map(|m| unsafe { &*m.as_ptr() });
        // SAFETY: as above.
        let previous = previous.map(|m| unsafe { &*m.as_ptr() });
        let mut net = 0;
        if let Some(m) = loaded {
            // The loaded magazine's length lived in the word: write it back.
            // SAFETY: owned by this holder.
            unsafe { m.with_rounds(|r| r.len = len as usize) };
            net = cache.installed.load(Ordering::Relaxed) as i64 - len as i64;
        } else {
            debug_assert_eq!(len, 0, "a length with no magazine loaded");
        }
        Held {
            cache,
            taken,
            ops: 0,
            net,
            pair: MagazinePair {
                loaded,
                previous,
                capacity: cap,
            },
        }
    }

    /// Pops the loaded magazine (holder's own operation, counted like a fast path's).
    fn pop(&mut self) -> Option<NonNull<u8>> {
        let m = self.pair.loaded?;
        // SAFETY: owned by this holder.
        let p = unsafe { m.pop_round() }?;
        self.ops += 1;
        self.net += 1;
        Some(p)
    }

    /// Pushes onto the loaded magazine; false when full or absent.
    fn push(&mut self, p: NonNull<u8>) -> bool {
        let Some(m) = self.pair.loaded else {
            return false;
        };
        // SAFETY: owned by this holder; the pair's capacity is the magazines'.
        let pushed = unsafe { m.push_round(p, self.pair.capacity) };
        if pushed {
            self.ops += 1;
            self.net -= 1;
        }
        pushed
    }

    /// Gives the cache back, with `len` as its word's length or state: its magazines and
    /// counts first, then the word (a release store: whoever next reads it sees the
    /// rest). From any CPU: while the word is a state, nobody else writes the cache.
    fn publish(self, len: u64) {
        let c = self.cache;
        c.net.fetch_add(self.net, Ordering::Relaxed);
        let pair = &self.pair;
        c.previous.store(
            pair.previous
                .map_or(ptr::null_mut(), |m| ptr::from_ref(m).cast_mut()),
            Ordering::Relaxed,
        );
        let slots = match pair.loaded {
            // SAFETY: owned by this holder until the store below.
            Some(m) => unsafe { m.with_rounds(|r| r.slots) },
            None => ptr::null_mut(),
        };
        c.loaded.store(
            pair.loaded
                .map_or(ptr::null_mut(), |m| ptr::from_ref(m).cast_mut()),
            Ordering::Relaxed,
        );
        c.slots.store(slots, Ordering::Relaxed);
        let loaded = pair.loaded.is_some();
        c.cap.store(
            if loaded { pair.capacity as u32 } else { 0 },
            Ordering::Relaxed,
        );
        c.installed
            .store(if loaded { len } else { 0 }, Ordering::Relaxed);
        let word = rseq::with_len(self.taken, len) + self.ops * rseq::ONE_OP;
        c.word.store(word, Ordering::Release);
    }

    /// Gives the cache back for the fast paths: the loaded magazine's length in the word.
    fn install(self) {
        let len = self.pair.loaded_len() as u64;
        self.publish(len);
    }

    /// Gives the cache back retired: nothing loaded, its word [`rseq::RETIRED`] for good (a
    /// state of its own, so that no reclaimer's `STOPPED` word can ever equal it: a detach
    /// and a retire change no count).
    fn retire(self) {
        debug_assert!(self.pair.loaded.is_none() && self.pair.previous.is_none());
        self.publish(rseq::RETIRED);
    }
}

impl PerCpu {
    /// Takes this CPU's cache for the calling thread's slow path, whose rseq area is
    /// `area`, and keeps the CPU's number as the thread's. `None` when another thread
    /// holds or reclaims it, or it is retired.
    fn detach(&self, area: *mut u8, cap: usize) -> Option<Held<'_>> {
        // SAFETY: this thread's registered area; `self` is a live allocator's caches.
        let Some((cpu, word)) = (unsafe { rseq::detach(area, self.base(), self.ncpu()) }) else {
            // Busy (or retired): the thread still keeps the CPU it runs on, so that its
            // fast paths try that CPU's cache next, not the one it left.
            // SAFETY: as above.
            if let Some(cpu) = unsafe { rseq::current_cpu(area) } {
                rseq::set_cpu(cpu);
            }
            return None;
        };
        rseq::set_cpu(cpu);
        // SAFETY: detached by this thread; the magazines are the allocator's.
        Some(unsafe { Held::new(&self.caches[cpu as usize], word, cap) })
    }

    /// The per-CPU slow path of an allocation on the calling thread, whose rseq area is
    /// `area`: take this CPU's cache, refill it from `depot` by the exchange rules, pop,
    /// give it back; if the cache is busy, the spare magazine. `None` when nothing is
    /// cached (or per-CPU caches are off for good, and this CPU's cache was just
    /// retired: see [`retire_here`](Self::retire_here)); the caller then goes to a
    /// thread cache or the backing allocator.
    pub(crate) fn alloc<'p>(
        &'p self,
        depot: &impl SharedSupply<'p>,
        area: *mut u8,
    ) -> Option<NonNull<u8>> {
        // No second try of the fast path's sequence, which has just failed (or did not
        // run, the area not set up yet): the detached cache below is popped first.
        let Some(mut h) = self.detach(area, depot.capacity()) else {
            return self.spare_alloc(depot);
        };
        let p = if h.pair.loaded_len() > 0 || h.pair.refill(depot) {
            h.pop()
        } else {
            None
        };
        h.install();
        p
    }

    /// The per-CPU slow path of a free (see [`alloc`](Self::alloc)): false when `p` was
    /// not taken (no magazine can be had); the caller then gives it to the backing
    /// allocator.
    ///
    /// # Safety
    /// `p` is an object of the allocator that nobody uses any more.
    pub(crate) unsafe fn free<'p>(
        &'p self,
        depot: &impl SharedSupply<'p>,
        area: *mut u8,
        p: NonNull<u8>,
    ) -> bool {
        let Some(mut h) = self.detach(area, depot.capacity()) else {
            // SAFETY: forwarded.
            return unsafe { self.spare_free(depot, p) };
        };
        let mut evictions = Evictions::default();
        let pushed = h.push(p)
            || match h.pair.make_room(depot) {
                Some(evicted) => {
                    evictions = evicted;
                    h.push(p)
                }
                None => false,
            };
        h.install();
        // After the install: releasing may run destructors (user code).
        depot.release(evictions);
        pushed
    }

    /// An object from the spare magazine (refilled from the depot when empty), for a
    /// slow path whose CPU cache is busy; counted on the engine.
    fn spare_alloc<'p>(&'p self, depot: &impl SharedSupply<'p>) -> Option<NonNull<u8>> {
        let p = {
            let mut spare = self.spare.lock().unwrap_or_else(|e| e.into_inner());
            // SAFETY: the spare magazine is the lock holder's.
            let mut mag = unsafe { spare.0.as_ref() };
            // SAFETY: as above.
            if mag.is_none_or(|m| unsafe { m.len() } == 0) {
                if let Some(full) = depot.full() {
                    if let Some(empty) = mag.take() {
                        depot.give_empty(empty);
                    }
                    mag = Some(full);
                    spare.0 = full;
                }
            }
            // SAFETY: as above.
            mag.and_then(|m| unsafe { m.pop_round() })
        };
        if p.is_some() {
            depot.count(1, 0);
        }
        p
    }

    /// Keeps `p` in the spare magazine (sent to the depot when full, an empty one taking
    /// its place), for a slow path whose CPU cache is busy; counted on the engine. False
    /// when no magazine can be had.
    ///
    /// # Safety
    /// As for [`free`](Self::free).
    unsafe fn spare_free<'p>(&'p self, depot: &impl SharedSupply<'p>, p: NonNull<u8>) -> bool {
        let cap = depot.capacity();
        let mut evictions = Evictions::default();
        let pushed = {
            let mut spare = self.spare.lock().unwrap_or_else(|e| e.into_inner());
            // SAFETY: the spare magazine is the lock holder's.
            let mut mag = unsafe { spare.0.as_ref() };
            // SAFETY: as above.
            if mag.is_none_or(|m| unsafe { m.len() } >= cap) {
                if let Some(full) = mag.take() {
                    evictions.push(depot.give_full(full));
                }
                mag = depot.empty();
                spare.0 = mag.map_or(ptr::null(), ptr::from_ref);
            }
            // SAFETY: as above.
            mag.is_some_and(|m| unsafe { m.push_round(p, cap) })
        };
        // After the lock: releasing may run destructors (user code).
        depot.release(evictions);
        if pushed {
            depot.count(0, 1);
        }
        pushed
    }

    /// The spare magazine to the depot (a trim's, or the allocator's drop).
    fn spare_to_depot<'p>(&'p self, depot: &impl SharedSupply<'p>, evictions: &mut Evictions) {
        let mut spare = self.spare.lock().unwrap_or_else(|e| e.into_inner());
        // SAFETY: the spare magazine is the lock holder's, handed over here.
        if let Some(m) = unsafe { spare.0.as_ref() } {
            evictions.push(depot.give_full(m));
        }
        spare.0 = ptr::null();
    }

    /// Per-CPU caches are off for good ([`rseq::fence::disabled`]): if this CPU's cache
    /// still holds magazines, hands them to the depot and retires the cache, so that no
    /// object stays where no reclaimer can reach it. Called by slow paths on the calling
    /// thread (whose area is `area`) before they use its thread cache instead.
    pub(crate) fn retire_here<'p>(&'p self, depot: &impl SharedSupply<'p>, area: *mut u8) {
        let Some(mut h) = self.detach(area, depot.capacity()) else {
            return;
        };
        let mut evictions = Evictions::default();
        for mag in h.pair.take_both() {
            evictions.push(depot.give_full(mag));
        }
        h.retire();
        depot.release(evictions);
    }

    /// Takes every CPU's magazines from any thread (`trim`, `trim_all`): stops each CPU's
    /// cache, fences the CPU, and hands both magazines to the depot (whose trim then
    /// releases them), and the spare magazine too. A CPU whose cache a slow path holds is
    /// skipped (its magazines come back with a later trim), and so is every CPU once a
    /// fence fails (their magazines stay where they are: see [`rseq::fence`]; after a
    /// failure for good, each goes to the depot at its CPU's next slow path). Returns the
    /// evictions to release.
    ///
    /// The caller holds the allocator's cache-list lock (reclaimers and the allocator's
    /// drop take it, so no two of them hold one CPU's cache; the lock is on no fast or
    /// slow path), and the allocator is alive.
    pub(crate) fn reclaim<'p>(&'p self, depot: &impl SharedSupply<'p>) -> Evictions {
        let mut evictions = Evictions::default();
        self.spare_to_depot(depot, &mut evictions);
        if rseq::fence::disabled().is_some() {
            // No fence works: each CPU's cache goes to the depot at its next slow path.
            return evictions;
        }
        for (cpu, cache) in self.caches.iter().enumerate() {
            match stop(cache, cpu as u32, depot.capacity()) {
                Stop::Held(h) => empty_held(h, depot, &mut evictions),
                Stop::Skipped => {}
                // No fence works now: the other CPUs would fail alike.
                Stop::FenceFailed => break,
            }
        }
        evictions
    }

    /// The allocator is being dropped (no thread can be using it; the caller holds the
    /// cache-list lock, so no reclaimer is at work): every CPU's magazines go back, their
    /// objects released (the engine is dead, so the depot evicts them), and the spare
    /// magazine's. Returns the evictions to release.
    pub(crate) fn shutdown<'p>(&'p self, depot: &impl SharedSupply<'p>) -> Evictions {
        let mut evictions = Evictions::default();
        self.spare_to_depot(depot, &mut evictions);
        for cache in self.caches.iter() {
            let word = cache.word.load(Ordering::Acquire);
            debug_assert!(
                rseq::len(word) != rseq::DETACHED,
                "a CPU cache held while its allocator drops"
            );
            if rseq::is_state(word) {
                // Retired: nothing in it.
                continue;
            }
            // Nobody else can touch the cache any more (no thread uses the allocator,
            // and the last sequences on it happened before the drop): stop it plainly.
            cache
                .word
                .store(rseq::with_len(word, rseq::STOPPED), Ordering::Relaxed);
            // SAFETY: stopped by this thread, with no sequence that could commit.
            let h = unsafe { Held::new(cache, word, depot.capacity()) };
            empty_held(h, depot, &mut evictions);
        }
        evictions
    }
}

/// Hands a held cache's magazines to the depot and leaves it empty.
fn empty_held<'p>(mut h: Held<'p>, depot: &impl SharedSupply<'p>, evictions: &mut Evictions) {
    for mag in h.pair.take_both() {
        evictions.push(depot.give_full(mag));
    }
    h.install();
}

/// What [`stop`] did.
enum Stop<'p> {
    /// The cache is this thread's now.
    Held(Held<'p>),
    /// It holds nothing, or a slow path or another reclaimer holds it, or it is retired.
    Skipped,
    /// The fence failed: the cache is as it was (see [`rseq::fence`]).
    FenceFailed,
}

/// Stops `cache` (CPU `cpu`'s, whose magazines hold `cap` objects) from another thread,
/// for reclaim. See the module docs for why the fence and the second read make the CAS
/// safe against sequences in flight, and why a failed fence puts the word back.
fn stop(cache: &CpuCache, cpu: u32, cap: usize) -> Stop<'_> {
    let mut word = cache.word.load(Ordering::Acquire);
    loop {
        if rseq::is_state(word) || cache.loaded.load(Ordering::Relaxed).is_null() {
            return Stop::Skipped;
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
        if rseq::fence_cpu(cpu).is_err() {
            // A sequence that read `word` may still commit over `stopped` (the cache is
            // as it read it, so its commit is a valid word); otherwise the word goes back.
            let _ =
                cache
                    .word
                    .compare_exchange(stopped, word, Ordering::Release, Ordering::Relaxed);
            return Stop::FenceFailed;
        }
        let now = cache.word.load(Ordering::Acquire);
        if now == stopped {
            // SAFETY: stopped by this thread, with no sequence left that could commit
            // over it; the magazines are the engine's.
            return Stop::Held(unsafe { Held::new(cache, word, cap) });
        }
        // A sequence that read `word` committed after the CAS: start from its word.
        word = now;
    }
}

rseq::with_rseq! {
    #[cfg(test)]
    mod tests;
    #[cfg(test)]
    #[path = "tests/injection.rs"]
    mod injection_tests;
}
