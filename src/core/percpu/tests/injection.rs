//! Every sequence faces an abort at each instruction boundary, with another thread acting
//! on the same CPU's cache at that moment (see `rseq::inject`): deterministically, in
//! every run, on fake CPUs.
//!
//! For each operation of a *victim* thread (a fast pop or push, a slow-path allocation
//! or free), each *action* (none, a fast pop or push, a slow-path allocation or free by
//! another thread on the same CPU, or a reclaim of every CPU's cache from elsewhere) and
//! each injection point of the victim's sequence, in order: the victim stops at the
//! point, the action runs, and the victim is aborted (inside the critical section, if
//! anything ran on its CPU or fenced it) or goes on (outside it). Then the books must
//! balance exactly: no object handed out twice, none lost, every count right, the cache
//! reclaimable to the last object. The abort counts per point are printed.

use std::collections::{BTreeMap, HashSet};
use std::ptr::NonNull;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use crate::core::engine::Engine;
use crate::core::rseq::{self, fence::hooks, inject, inject::FakeArea};
use crate::{CacheMode, ClassAllocator, Config};

/// The fake CPU the victim and the local actions run on; the reclaimer fences it.
const CPU: u32 = 1;
/// Objects a magazine holds in these tests.
const CAP: usize = 4;

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Op {
    /// The fast path's pop (the `pop` sequence).
    Pop,
    /// The fast path's push (the `push` sequence).
    Push,
    /// A slow-path allocation (the `detach` sequence, then the held cache).
    SlowAlloc,
    /// A slow-path free.
    SlowFree,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Action {
    /// Nothing runs; the victim is preempted (aborted, inside).
    Nothing,
    Pop,
    Push,
    SlowAlloc,
    SlowFree,
    /// Every CPU's cache reclaimed (`trim`), as from another CPU: fences, no preemption.
    Reclaim,
}

const ACTIONS: [Action; 6] = [
    Action::Nothing,
    Action::Pop,
    Action::Push,
    Action::SlowAlloc,
    Action::SlowFree,
    Action::Reclaim,
];

/// One allocator under test, the objects handed out of it, and the two fake areas.
struct Scene {
    a: ClassAllocator<u64>,
    live: HashSet<usize>,
    victim: Box<FakeArea>,
    actor: Box<FakeArea>,
}

/// An object address, for the books.
fn addr(p: NonNull<u8>) -> usize {
    p.as_ptr() as usize
}

impl Scene {
    fn new() -> Option<Scene> {
        let a = ClassAllocator::<u64>::with_config(
            "percpu-injection",
            Config::new()
                .mode(CacheMode::PerCpu)
                .magazine_size(CAP)
                .depot_bytes(1 << 12),
        );
        if a.mode() != CacheMode::PerCpu || rseq::ncpu() <= CPU {
            return None;
        }
        Some(Scene {
            a,
            live: HashSet::new(),
            victim: FakeArea::on(CPU),
            actor: FakeArea::on(CPU),
        })
    }

    fn engine(&self) -> &Engine {
        self.a.engine()
    }

    /// CPU `CPU`'s cache, as the fast paths address it.
    fn cache(&self) -> usize {
        let pc = self.engine().percpu().expect("a per-CPU engine");
        pc.base() + ((CPU as usize) << rseq::CACHE_SHIFT)
    }

    /// Records an object handed out: never one that is live already.
    fn took(&mut self, p: NonNull<u8>, who: &str) {
        assert!(
            self.live.insert(addr(p)),
            "{who}: an object handed out twice ({p:p})"
        );
    }

    /// A live object back from the books (the test's to free).
    fn give(&mut self) -> Option<NonNull<u8>> {
        let p = *self.live.iter().next()?;
        self.live.remove(&p);
        NonNull::new(p as *mut u8)
    }

    /// Runs `op` with `area`, on the calling thread; what it handed out, if anything.
    /// A free gives back `freed`.
    fn run(e: &Engine, cache: usize, area: *mut u8, op: Op, freed: Option<NonNull<u8>>) -> Run {
        let pc = e.percpu().expect("a per-CPU engine");
        match op {
            // SAFETY: a fake area; `cache` is CPU `CPU`'s of a live engine, below its count.
            Op::Pop => Run::Took(NonNull::new(unsafe { rseq::pop(area, CPU, cache) })),
            Op::Push => {
                let p = freed.expect("something to free");
                // SAFETY: as above; `p` is a live object of the engine, given up here.
                Run::Freed(unsafe { rseq::push(area, CPU, cache, p.as_ptr()) }, p)
            }
            Op::SlowAlloc => Run::Took(pc.alloc(&e.shared(), area)),
            Op::SlowFree => {
                let p = freed.expect("something to free");
                // SAFETY: as above.
                Run::Freed(unsafe { pc.free(&e.shared(), area, p) }, p)
            }
        }
    }

    /// Books the result of a run: an object taken is live; one not freed (the fast path
    /// refused it) stays live.
    fn book(&mut self, r: Run, who: &str) {
        match r {
            Run::Took(Some(p)) => self.took(p, who),
            Run::Took(None) => {}
            Run::Freed(true, _) => {}
            Run::Freed(false, p) => self.took(p, who),
        }
    }

    /// An object for a free: a live one, or a new one from the backing allocator.
    fn object(&mut self) -> NonNull<u8> {
        match self.give() {
            Some(p) => p,
            None => self.engine().alloc_backing().expect("memory"),
        }
    }

    /// Puts `n` objects in CPU `CPU`'s loaded magazine (through its slow path, which
    /// installs one, then fast pushes).
    fn fill(&mut self, n: usize) {
        for _ in 0..n {
            let p = self.object();
            let r = Self::run(
                self.engine(),
                self.cache(),
                self.actor.ptr(),
                Op::SlowFree,
                Some(p),
            );
            self.book(r, "fill");
        }
    }

    /// The action, by the actor (on the calling thread).
    fn act(&mut self, action: Action) {
        let (cache, area) = (self.cache(), self.actor.ptr());
        let r = match action {
            Action::Nothing => return,
            Action::Pop => Self::run(self.engine(), cache, area, Op::Pop, None),
            Action::SlowAlloc => Self::run(self.engine(), cache, area, Op::SlowAlloc, None),
            Action::Push | Action::SlowFree => {
                let p = self.object();
                let op = if action == Action::Push {
                    Op::Push
                } else {
                    Op::SlowFree
                };
                Self::run(self.engine(), cache, area, op, Some(p))
            }
            Action::Reclaim => {
                let e = self.engine();
                assert!(e.percpu().is_some(), "a per-CPU engine");
                e.reclaim_cpus();
                return;
            }
        };
        self.book(r, "the actor");
    }

    /// The books after the scene: every object the test holds freed, the caches
    /// reclaimed, and everything back in the backing allocator, with exact counts.
    fn close(mut self, what: &str) {
        while let Some(p) = self.give() {
            // SAFETY: a live object of the engine, given up here.
            unsafe { self.engine().free_backing(p) };
        }
        let s = self.a.stats();
        assert!(s.is_consistent(), "{what}: {s}");
        assert_eq!(s.live, 0, "{what}: an object the test never got back: {s}");
        self.a.trim();
        let s = self.a.stats();
        assert_eq!(s.reserved_bytes(), 0, "{what}: objects left cached: {s}");
        assert_eq!(
            s.backing_allocs, s.backing_frees,
            "{what}: every object back exactly once: {s}"
        );
    }
}

/// What one run of an operation did.
enum Run {
    Took(Option<NonNull<u8>>),
    Freed(bool, NonNull<u8>),
}

// SAFETY: object addresses handed between the test's threads with joins.
unsafe impl Send for Run {}

/// A victim's area and the engine, sent to the victim thread.
struct Victim {
    e: *const Engine,
    cache: usize,
    area: *mut u8,
    freed: Option<NonNull<u8>>,
}

// SAFETY: the engine outlives the victim thread (joined before the scene closes); the
// area is a fake one that only the victim's sequences touch meanwhile.
unsafe impl Send for Victim {}

/// Runs `op` on a victim thread stopped at point `n`, with `action` in between. `None`
/// once `n` is past the operation's last point; else `Some(inside, aborted)`.
fn scene(op: Op, action: Action, n: u32, preload: usize) -> Option<(bool, bool)> {
    let mut sc = Scene::new()?;
    sc.fill(preload);
    let freed = matches!(op, Op::Push | Op::SlowFree).then(|| sc.object());
    let v = Victim {
        e: sc.engine(),
        cache: sc.cache(),
        area: sc.victim.ptr(),
        freed,
    };
    hooks::FENCED.store(0, Ordering::SeqCst);
    let aborts = rseq::aborts();
    inject::arm(sc.victim.ptr(), n);
    let finished = Arc::new(AtomicBool::new(false));
    let thread = {
        let finished = Arc::clone(&finished);
        std::thread::spawn(move || {
            let v = v;
            // SAFETY: see `Victim`.
            let e = unsafe { &*v.e };
            let r = Scene::run(e, v.cache, v.area, op, v.freed);
            finished.store(true, Ordering::SeqCst);
            r
        })
    };
    let stop = inject::wait(|| finished.load(Ordering::SeqCst));
    let result = match stop {
        None => {
            inject::disarm();
            None
        }
        Some(inside) => {
            sc.act(action);
            let fenced = hooks::FENCED.load(Ordering::SeqCst) & (1 << CPU) != 0;
            let abort = inside && (action != Action::Reclaim || fenced);
            inject::release(abort);
            Some((inside, abort))
        }
    };
    let r = thread.join().expect("the victim failed");
    sc.book(r, "the victim");
    if let Some((_, true)) = result {
        assert!(
            rseq::aborts() > aborts,
            "{op:?} {action:?} point {n}: an abort that did not happen ({aborts} -> {})",
            rseq::aborts()
        );
    }
    let what = format!("{op:?} stopped at point {n}, then {action:?}");
    sc.close(&what);
    result
}

#[test]
fn every_sequence_survives_an_abort_and_another_thread_at_each_instruction() {
    let _s = rseq::TEST_SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    if Scene::new().is_none() {
        eprintln!(
            "per-CPU caches unavailable here (or fewer than two CPU numbers): nothing to test"
        );
        return;
    }
    hooks::RECORD.store(true, Ordering::SeqCst);
    /// Fences are made again after the test, even if it fails.
    struct Unrecord;
    impl Drop for Unrecord {
        fn drop(&mut self) {
            hooks::RECORD.store(false, Ordering::SeqCst);
            inject::disarm();
        }
    }
    let _unrecord = Unrecord;
    let unarmed = inject::unarmed();
    // Per operation and action: the points met, and how many of them aborted.
    let mut report: BTreeMap<(Op, Action), (u32, u32, Vec<u32>)> = BTreeMap::new();
    for op in [Op::Pop, Op::Push, Op::SlowAlloc, Op::SlowFree] {
        for action in ACTIONS {
            // Two loaded objects: room for a pop and a push, either way.
            let mut n = 1;
            while let Some((inside, aborted)) = scene(op, action, n, 2) {
                let e = report.entry((op, action)).or_default();
                e.0 += 1;
                if inside {
                    e.1 += 1;
                }
                if aborted {
                    e.2.push(n);
                }
                n += 1;
                assert!(n < 200, "a sequence with no end of points");
            }
        }
        // At the edges: a pop of the last object, a push into the last slot, while the
        // actor takes that object or that slot.
        let (edge, action) = match op {
            Op::Pop | Op::SlowAlloc => (1, Action::Pop),
            Op::Push | Op::SlowFree => (CAP - 1, Action::Push),
        };
        let mut n = 1;
        while scene(op, action, n, edge).is_some() {
            n += 1;
        }
    }
    assert_eq!(inject::unarmed(), unarmed, "a sequence ran unarmed");
    println!("injection points per operation and action: points met, inside, aborted at:");
    for ((op, action), (points, inside, aborted)) in &report {
        println!("  {op:?} / {action:?}: {points} points, {inside} inside, aborted at {aborted:?}");
    }
    // Every sequence met its points, most of them inside its critical section.
    for op in [Op::Pop, Op::Push, Op::SlowAlloc, Op::SlowFree] {
        let (points, inside, _) = &report[&(op, Action::Pop)];
        assert!(
            *inside > 5 && *points > *inside,
            "{op:?}: {points} points, {inside} inside"
        );
    }
}
