//! The sequences on a hand-made array of caches, on a fake CPU (see `inject.rs`): pop,
//! push and detach keep every pointer once, count their operations, fail in every state
//! and on a CPU the thread has left.

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};

use super::inject::FakeArea;
use super::*;

/// A cache as the sequences see one: the word, the slot array, the capacity.
#[repr(C, align(64))]
struct Cache {
    word: AtomicU64,
    slots: *mut *mut u8,
    cap: AtomicU32,
}

const _: () = assert!(std::mem::size_of::<Cache>() == 1 << CACHE_SHIFT);

/// One empty cache per slot array, each with the array's length as its capacity.
fn caches_over<const N: usize>(arrays: &mut [[*mut u8; N]]) -> Vec<Cache> {
    arrays
        .iter_mut()
        .map(|a| Cache {
            word: AtomicU64::new(0),
            slots: a.as_mut_ptr(),
            cap: AtomicU32::new(N as u32),
        })
        .collect()
}

#[test]
fn pop_push_and_detach_keep_every_pointer_once_and_count_operations() {
    const NCPU: u32 = 4;
    let mut arrays: Vec<[*mut u8; 4]> = vec![[std::ptr::null_mut(); 4]; NCPU as usize];
    let caches = caches_over(&mut arrays);
    let base = caches.as_ptr() as usize;
    let at = |cpu: u32| base + ((cpu as usize) << CACHE_SHIFT);
    let area = FakeArea::on(2);
    let a = area.ptr();
    let tokens: Vec<*mut u8> = (1..=5usize).map(|i| (i * 8) as *mut u8).collect();
    // SAFETY (every sequence below): a fake area and caches that live here; CPUs below 4.
    let pushed: Vec<bool> = tokens
        .iter()
        .map(|&t| unsafe { push(a, 2, at(2), t) })
        .collect();
    assert_eq!(pushed, [true, true, true, true, false], "room for four");
    let c = &caches[2];
    let word = c.word.load(Ordering::Relaxed);
    assert_eq!((len(word), ops(word)), (4, 4));
    // On a CPU the thread has left, both fail and change nothing.
    area.move_to(1);
    unsafe {
        assert!(pop(a, 2, at(2)).is_null());
        assert!(!push(a, 2, at(2), tokens[4]));
    }
    assert_eq!(c.word.load(Ordering::Relaxed), word);
    area.move_to(2);
    let mut popped: Vec<*mut u8> = (0..5).map(|_| unsafe { pop(a, 2, at(2)) }).collect();
    assert!(popped[4].is_null(), "four in, four out");
    popped.truncate(4);
    popped.reverse();
    assert_eq!(popped, tokens[..4], "last in, first out");
    let word = c.word.load(Ordering::Relaxed);
    assert_eq!((len(word), ops(word)), (0, 8));
    // A capacity of 0 (no magazine) refuses both.
    c.cap.store(0, Ordering::Relaxed);
    unsafe {
        assert!(!push(a, 2, at(2), tokens[0]));
        assert!(pop(a, 2, at(2)).is_null());
    }
    c.cap.store(4, Ordering::Relaxed);
    // Detach finds the cache from `cpu_id` itself.
    let (cpu, before) = unsafe { detach(a, base, NCPU) }.expect("a length, not a state");
    assert_eq!((cpu, before), (2, word));
    assert_eq!(c.word.load(Ordering::Relaxed), with_len(word, DETACHED));
    // Every sequence fails on a state.
    for state in [DETACHED, STOPPED] {
        c.word.store(with_len(word, state), Ordering::Relaxed);
        unsafe {
            assert!(pop(a, 2, at(2)).is_null());
            assert!(!push(a, 2, at(2), tokens[0]));
            assert!(detach(a, base, NCPU).is_none());
        }
        assert_eq!(c.word.load(Ordering::Relaxed), with_len(word, state));
    }
    // An unregistered area (`cpu_id` -1) or a CPU past the array: detach refuses.
    area.move_to(u32::MAX);
    assert!(unsafe { detach(a, base, NCPU) }.is_none());
    area.move_to(NCPU);
    assert!(unsafe { detach(a, base, NCPU) }.is_none());
    assert_eq!(super::inject::unarmed(), 0, "a sequence ran unarmed");
}

/// The registered area of this thread, where rseq works, runs the same sequences with the
/// kernel watching: pops and pushes on its own CPU (as the thread last saw it; a move
/// fails them, as it should).
#[test]
fn sequences_run_on_the_threads_real_area() {
    if !available() || thread_area().is_null() {
        eprintln!("rseq unavailable here: nothing to test");
        return;
    }
    let n = ncpu();
    let mut arrays: Vec<[*mut u8; 2]> = vec![[std::ptr::null_mut(); 2]; n as usize];
    let caches = caches_over(&mut arrays);
    let base = caches.as_ptr() as usize;
    let token = 64 as *mut u8;
    let (mut pushes, mut pops) = (0u64, 0u64);
    for _ in 0..1000 {
        let t = thread();
        let cache = base + ((t.cpu as usize) << CACHE_SHIFT);
        // SAFETY: this thread's registered area; `t.cpu` is below `ncpu`.
        if unsafe { push(t.area, t.cpu, cache, token) } {
            pushes += 1;
        }
        // SAFETY: as above.
        let p = unsafe { pop(t.area, t.cpu, cache) };
        if !p.is_null() {
            assert_eq!(p, token);
            pops += 1;
        }
        // What a slow path does when the thread has moved.
        // SAFETY: this thread's live area.
        let cpu = unsafe { super::area::cpu_id(t.area) };
        if cpu < n {
            set_cpu(cpu);
        }
    }
    assert!(pops > 0, "no push and pop ever ran on the thread's CPU");
    let (lens, count): (u64, u64) = caches.iter().fold((0, 0), |(l, o), c| {
        let w = c.word.load(Ordering::Relaxed);
        (l + len(w), o + ops(w))
    });
    assert_eq!(
        lens,
        pushes - pops,
        "every token pushed is popped or still cached"
    );
    assert_eq!(count, pushes + pops, "every commit counted");
}
