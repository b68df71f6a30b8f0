//! Models of the magazine stack (the depot's tagged Treiber stack, `core/stack.rs`): the textbook ABA interleaving, with the
//! generation field wide enough (must pass) and too narrow or absent (must fail).
//!
//! Each magazine's `len` field doubles as a payload: the owner writes it before every push
//! and every popper reads it, through loom's `UnsafeCell`, so a push or pop with too weak
//! an ordering shows up as a causality violation.

use loom::sync::Arc;
use loom::thread;

use crate::core::magazine::{Magazine, MagazineTable};
use crate::core::stack::{for_each_in_chain, MagazineStack};

struct Fixture {
    table: MagazineTable,
    stack: MagazineStack,
}

impl Fixture {
    /// A stack holding magazines 2, 1, 0 (0 on top), each stamped with its index.
    fn new(generation_bits: u32) -> Arc<Self> {
        let f = Fixture {
            table: MagazineTable::new(1),
            stack: MagazineStack::new(generation_bits),
        };
        let mags: Vec<&Magazine> = (0..3).map(|_| f.table.create().unwrap()).collect();
        for m in mags.into_iter().rev() {
            stamp(m);
            f.stack.push(m);
        }
        Arc::new(f)
    }

    /// Pops a magazine and checks its stamp (a read that must happen after the push's
    /// write); returns its index.
    fn pop(&self) -> Option<u32> {
        let m = self.stack.pop(&self.table)?;
        // SAFETY: popped, so owned by this thread.
        let stamp = unsafe { m.with_rounds(|r| r.len) };
        assert_eq!(
            stamp,
            m.index as usize + 100,
            "payload not visible after pop"
        );
        Some(m.index)
    }

    /// Pushes magazine `index` back after re-stamping it.
    fn push(&self, index: u32) {
        // SAFETY: `index` was created by this table; the caller owns it.
        let m = unsafe { self.table.get(index) };
        stamp(m);
        self.stack.push(m);
    }

    /// Pops everything left, bounded so that a cycle fails instead of spinning.
    fn drain(&self) -> Vec<u32> {
        let mut out = Vec::new();
        while let Some(i) = self.pop() {
            out.push(i);
            assert!(out.len() <= 3, "cycle in the stack: {out:?}");
        }
        out
    }
}

/// Writes the payload, as an owner does before pushing.
fn stamp(m: &Magazine) {
    // SAFETY: the caller owns `m`.
    unsafe { m.with_rounds(|r| r.len = m.index as usize + 100) };
}

/// One thread pops once while main pops a, pops b and pushes a back: the interleaving in
/// which an untagged stack lets the other thread's stale CAS install `b`, which main owns.
fn aba(generation_bits: u32) {
    loom::model(move || {
        let f = Fixture::new(generation_bits);
        let f1 = Arc::clone(&f);
        let t = thread::spawn(move || f1.pop());
        let a = f.pop();
        let b = f.pop();
        if let Some(a) = a {
            f.push(a);
        }
        let mut all: Vec<u32> = [t.join().unwrap(), b].into_iter().flatten().collect();
        all.extend(f.drain());
        all.sort_unstable();
        assert_eq!(all, [0, 1, 2], "a magazine was handed out twice or lost");
    });
}

#[test]
fn aba_with_32_bit_generation() {
    aba(32);
}

#[test]
fn aba_with_2_bit_generation_that_cannot_wrap_here() {
    // Main pops only twice, so a 2-bit generation cannot come back to its old value.
    aba(2);
}

#[test]
#[should_panic(expected = "handed out twice or lost")]
fn aba_with_1_bit_generation_wraps_and_fails() {
    aba(1);
}

#[test]
#[should_panic(expected = "handed out twice or lost")]
fn aba_without_generation_fails() {
    aba(0);
}

/// Two threads each pop and push back twice against each other: pushes and pops racing
/// pushes, with payload hand-off checked every time.
#[test]
fn concurrent_pop_push_conserves() {
    loom::model(|| {
        let f = Fixture::new(32);
        let workers: Vec<_> = (0..2)
            .map(|_| {
                let f = Arc::clone(&f);
                thread::spawn(move || {
                    for _ in 0..2 {
                        if let Some(i) = f.pop() {
                            f.push(i);
                        }
                    }
                })
            })
            .collect();
        for w in workers {
            w.join().unwrap();
        }
        let mut all = f.drain();
        all.sort_unstable();
        assert_eq!(all, [0, 1, 2]);
    });
}

/// `take_all` (trim's detach) racing a push: every magazine ends up either in the
/// detached chain or on the stack, once.
#[test]
fn take_all_races_push() {
    loom::model(|| {
        let f = Fixture::new(32);
        let held = f.pop().unwrap();
        let f1 = Arc::clone(&f);
        let t = thread::spawn(move || f1.push(held));
        let mut detached = Vec::new();
        if let Some(first) = f.stack.take_all(&f.table) {
            for_each_in_chain(&f.table, first, |m| detached.push(m.index));
        }
        t.join().unwrap();
        detached.extend(f.drain());
        detached.sort_unstable();
        assert_eq!(detached, [0, 1, 2]);
    });
}
