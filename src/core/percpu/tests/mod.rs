//! The hard cases made to happen: many more threads than CPUs, threads that hop
//! between CPUs (`sched_setaffinity`), a spin inside every sequence so that
//! preemption lands there (the abort count must rise), and a trimmer reclaiming every
//! CPU's magazines from another thread meanwhile. Every value is accounted for.

use std::collections::HashSet;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

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

/// The tests here set the process-wide injected delay and count aborts.
use rseq::TEST_SERIAL as SERIAL;

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
    let pause = || std::thread::sleep(crate::core::idle::MIN_IDLE_INTERVAL * 3);
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
    // Two magazines a CPU, and the spare magazine that slow paths use while their CPU's
    // cache is busy (more often the busier the machine: a run beside other builds once
    // ended with it holding objects).
    assert!(
        s.cached_in_threads <= 2 * 8 * rseq_cpus() + 8,
        "at most two magazines a CPU and the spare: {s}"
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
    rseq::ncpu() as u64
}

/// Moves the calling thread to `cpu` and says whether it runs there now (false where
/// the CPU is offline or not allowed to this process).
fn try_pin(cpu: usize) -> bool {
    pin_to(cpu);
    // SAFETY: no preconditions.
    usize::try_from(unsafe { libc::sched_getcpu() }) == Ok(cpu)
}

/// Pins the calling thread to the CPU it runs on, so that every operation after meets the
/// same CPU's cache: the CPU, or `None` (with a note, the thread unpinned) where that
/// cannot be done.
fn pin_here() -> Option<usize> {
    // SAFETY: no preconditions.
    let here = unsafe { libc::sched_getcpu() };
    match usize::try_from(here) {
        Ok(cpu) if try_pin(cpu) => Some(cpu),
        _ => {
            unpin();
            eprintln!("cannot pin this thread to a CPU here: nothing to test");
            None
        }
    }
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
    if pin_here().is_none() {
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
    let _s = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let probe = ClassAllocator::<u64>::with_config("probe", Config::new().mode(CacheMode::PerCpu));
    if probe.mode() == CacheMode::PerCpu {
        // Threads hopping CPUs mid-sequence, and the trimmer's fences, abort some.
        assert!(
            aborts > 0,
            "no sequence was ever aborted: the test tests nothing"
        );
    }
}

/// A `membarrier` fence that fails (injected) never lets a reclaim take a CPU's cache:
/// its magazines stay, the failure is counted, and registering again mends one failure;
/// when that does not help, per-CPU caches go off for good, each CPU's cache is retired
/// into the depot at its next slow path, and every object is still accounted for.
#[test]
fn a_failed_fence_leaves_the_cpus_magazines_and_is_counted() {
    use crate::core::rseq::fence::{self, hooks};
    let _s = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    /// Puts back what the test changes for the whole process, even if it fails.
    struct Restore;
    impl Drop for Restore {
        fn drop(&mut self) {
            hooks::FAIL_FENCES.store(0, Ordering::SeqCst);
            fence::reset_for_tests();
            unpin();
        }
    }
    let _restore = Restore;
    let Some(a) = per_cpu_allocator("percpu-fence-fails") else {
        return;
    };
    let Some(here) = pin_here() else {
        return;
    };
    let fill = || drop((0..12).map(|i| a.alloc(i)).collect::<Vec<_>>());
    fill();
    let cached = a.stats().cached_in_threads;
    assert!(cached > 0, "the CPU's magazines hold objects");
    let failures = fence::failures();

    // One failure, mended by registering again: the trim goes through.
    hooks::FAIL_FENCES.store(1, Ordering::SeqCst);
    a.trim();
    assert_eq!(fence::failures(), failures + 1, "the failure is counted");
    assert!(fence::disabled().is_none(), "a mended failure");
    let s = a.stats();
    assert_eq!(s.cached_in_threads + s.cached_in_depot, 0, "{s}");

    // Failures registering again does not mend: the trim leaves the magazines.
    fill();
    let before = a.stats();
    assert!(before.cached_in_threads > 0, "{before}");
    hooks::FAIL_FENCES.store(2, Ordering::SeqCst);
    a.trim();
    hooks::FAIL_FENCES.store(0, Ordering::SeqCst);
    let after = a.stats();
    assert_eq!(fence::failures(), failures + 3, "the fence and its retry");
    assert!(fence::disabled().is_some(), "off for good");
    assert_eq!(
        after.cached_in_threads, before.cached_in_threads,
        "the CPU's magazines stay where they are: {after}"
    );
    assert_eq!(after.backing_frees, before.backing_frees, "{after}");
    assert_eq!(a.mode(), CacheMode::ThreadCaches, "the mode says so");
    let status = crate::stats::percpu_status();
    assert!(!status.available && status.disabled.is_some(), "{status:?}");
    let mut dump = Vec::new();
    crate::stats::dump(&mut dump).unwrap();
    let dump = String::from_utf8(dump).unwrap();
    assert!(dump.contains("per-CPU caches are off"), "{dump}");

    // Per-thread caches from now on: the next slow path retires this CPU's cache into
    // the depot, and every object is accounted for.
    let held: Vec<_> = (0..40).map(|i| a.alloc(i)).collect();
    let s = a.stats();
    assert!(s.is_consistent() && s.live == 40, "{s}");
    drop(held);
    assert!(
        a.engine().percpu().unwrap().caches[here]
            .word
            .load(Ordering::Relaxed)
            & rseq::LEN_MASK
            == rseq::RETIRED,
        "this CPU's cache retired"
    );
    unpin();
    a.release_thread_cache();
    a.trim();
    let s = a.stats();
    assert!(s.is_consistent() && s.live == 0, "{s}");
    assert_eq!(s.reserved_bytes(), 0, "nothing left anywhere: {s}");
    assert_eq!(s.backing_allocs, s.backing_frees, "{s}");
}

/// A slow path that finds its CPU's cache held by another thread's slow path keeps the
/// object in the spare magazine (then the depot), never the backing allocator, and an
/// allocation there takes it back; a reclaim takes the spare magazine too.
#[test]
fn a_busy_cpu_cache_spills_to_the_spare_magazine_not_the_system() {
    use crate::core::rseq::inject::FakeArea;
    let _s = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let Some(a) = per_cpu_allocator("percpu-busy") else {
        return;
    };
    let e = a.engine();
    let pc = e.percpu().unwrap();
    let (holder, other) = (FakeArea::on(0), FakeArea::on(0));
    // The holder's slow path takes CPU 0's cache (and keeps it: a detach, no install).
    // SAFETY: a fake area and a live engine's caches.
    let held = unsafe { rseq::detach(holder.ptr(), pc.base(), rseq::ncpu()) };
    let (cpu, word) = held.expect("CPU 0's cache, free to take");
    assert_eq!(cpu, 0);
    let objects: Vec<_> = (0..20).map(|_| e.alloc_backing().unwrap()).collect();
    for &p in &objects {
        // SAFETY: a live object of the engine, given up.
        assert!(unsafe { pc.free(&e.shared(), other.ptr(), p) }, "taken");
    }
    let s = a.stats();
    assert_eq!(s.backing_frees, 0, "a busy free went to the system: {s}");
    assert_eq!(s.cached_in_threads + s.cached_in_depot, 20, "{s}");
    assert!(
        s.cached_in_depot >= 16,
        "full spare magazines go to the depot: {s}"
    );
    // Allocations on the busy CPU take them back.
    let again: Vec<_> = (0..20).map(|_| pc.alloc(&e.shared(), other.ptr())).collect();
    assert!(
        again.iter().all(Option::is_some),
        "served from the spare and the depot"
    );
    let s = a.stats();
    assert_eq!(s.backing_allocs, 20, "{s}");
    assert!(s.is_consistent() && s.live == 20, "{s}");
    let mut again = again.into_iter().flatten();
    for p in again.by_ref().take(5) {
        // SAFETY: as above.
        assert!(unsafe { pc.free(&e.shared(), other.ptr(), p) });
    }
    for p in again {
        // SAFETY: as above.
        unsafe { e.free_backing(p) };
    }
    // The holder gives the cache back as it was; a reclaim takes the spare magazine.
    pc.caches[0].word.store(word, Ordering::Release);
    a.trim();
    let s = a.stats();
    assert_eq!(s.cached_in_threads + s.cached_in_depot, 0, "{s}");
    assert_eq!(s.backing_frees, 20, "{s}");
    assert!(s.is_consistent() && s.live == 0, "{s}");
}
