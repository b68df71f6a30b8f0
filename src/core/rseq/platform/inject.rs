//! Abort injection at every instruction boundary (test builds).
//!
//! The kernel aborts a sequence when its thread is preempted, migrated or signalled
//! between the start and the commit, and only then does another thread get to run on
//! that CPU. Waiting for that to happen at a given instruction is a matter of luck (the
//! kernel's own selftests widen windows with spin loops and run many threads); here it
//! is made to happen, at each point in turn:
//! - test builds put an injection point before every instruction of every sequence, from
//!   the arming to the commit, and one after the commit (`x86_64.rs`); a run meets them
//!   in order and numbers them 1, 2, ...;
//! - a test gives each thread a fake rseq area ([`FakeArea`]) whose `cpu_id` it writes
//!   itself, so two threads can be "on" the same CPU, and the kernel, which knows nothing
//!   of these areas, never aborts their sequences;
//! - [`arm`] picks a point and a thread (by its area); when that thread gets there it
//!   stops and says whether the point is inside the critical section ([`wait`]);
//! - meanwhile the test acts on the same CPU's cache from another thread, as a thread
//!   that preempted the stopped one would, or as another CPU's reclaimer would (whose
//!   fences are recorded instead of made: `fence::hooks::RECORD`);
//! - [`release`] lets the stopped thread go on, or aborts it as the kernel would (clears
//!   `rseq_cs` and jumps to the abort handler): inside the critical section after any
//!   action on its CPU or a fence of it, never outside.
//!
//! Every inside point also checks that the sequence is armed ([`unarmed`] counts those
//! that are not: a restart that skipped the arming would run unprotected).

use std::cell::UnsafeCell;
use std::sync::atomic::{AtomicPtr, AtomicU32, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use super::area::Area;

/// The point to stop at (0: none).
pub(crate) static AT: AtomicU32 = AtomicU32::new(0);
/// The area of the thread that stops there.
pub(crate) static AREA: AtomicPtr<u8> = AtomicPtr::new(std::ptr::null_mut());
/// 0: not there yet; 1: stopped inside; 2: stopped outside; 3: go on; 4: abort.
pub(crate) static STATE: AtomicU32 = AtomicU32::new(0);
/// Inside points met while `rseq_cs` was not armed.
pub(crate) static UNARMED: AtomicU64 = AtomicU64::new(0);

/// An rseq area the kernel never sees: its `cpu_id` is whatever the test writes.
pub(crate) struct FakeArea(UnsafeCell<Area>);

// SAFETY: a test's fake area is written by the test (its `cpu_id`) and by sequences
// (`rseq_cs`), plain memory either way; the tests using it hand it between threads with
// joins, and a sequence reads `cpu_id` with a plain load, as it reads the kernel's.
unsafe impl Sync for FakeArea {}

impl FakeArea {
    /// An area on CPU `cpu`.
    pub(crate) fn on(cpu: u32) -> Box<FakeArea> {
        let a = Box::new(FakeArea(UnsafeCell::new(Area::UNREGISTERED)));
        a.move_to(cpu);
        a
    }

    /// What the sequences take as the area.
    pub(crate) fn ptr(&self) -> *mut u8 {
        self.0.get().cast()
    }

    /// Moves the area's thread to `cpu`, as the kernel would write it.
    pub(crate) fn move_to(&self, cpu: u32) {
        // SAFETY: the field of this area; sequences read it with plain loads.
        unsafe { std::ptr::addr_of_mut!((*self.0.get()).cpu_id).write_volatile(cpu) }
    }
}

/// Asks the thread whose area is `area` to stop at point `n` of its next sequence.
pub(crate) fn arm(area: *mut u8, n: u32) {
    STATE.store(0, Ordering::SeqCst);
    AREA.store(area, Ordering::SeqCst);
    AT.store(n, Ordering::SeqCst);
}

/// Waits until the armed thread stops: `Some(inside)`, or `None` once `finished` says
/// its operation ended without meeting the point (the point is past its last).
pub(crate) fn wait(finished: impl Fn() -> bool) -> Option<bool> {
    let start = Instant::now();
    loop {
        match STATE.load(Ordering::SeqCst) {
            1 => return Some(true),
            2 => return Some(false),
            _ => {}
        }
        if finished() {
            // It may have stopped just before finishing was read: look once more.
            return match STATE.load(Ordering::SeqCst) {
                1 => Some(true),
                2 => Some(false),
                _ => None,
            };
        }
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "the armed thread neither stopped nor finished"
        );
        std::hint::spin_loop();
    }
}

/// Disarms the point and lets the stopped thread go on, or aborts its sequence.
pub(crate) fn release(abort: bool) {
    AT.store(0, Ordering::SeqCst);
    STATE.store(if abort { 4 } else { 3 }, Ordering::SeqCst);
}

/// Disarms the point (the armed thread finished without meeting it).
pub(crate) fn disarm() {
    AT.store(0, Ordering::SeqCst);
}

/// Inside points met unarmed so far.
pub(crate) fn unarmed() -> u64 {
    UNARMED.load(Ordering::SeqCst)
}
