//! A lock-free stack of magazines: the depot's full and empty stacks, and the chains
//! that trims and evictions detach whole. One CAS per push, pop or whole detach.
//!
//! # ABA
//! The stack is a Treiber stack of magazine *indices*. The head is one `AtomicU64`
//! packing `(generation << 24) | index` (indices fit in [`INDEX_BITS`] = 24 bits, which
//! leaves 40 for the generation); every successful pop advances the generation. A pop
//! that read head `(g, A)` and `A.next = B` can only succeed if the head is still
//! `(g, A)`; for the head to get back to `A` after `A` left, `A` must have been popped,
//! which advanced the generation, so the stale pop fails, until the generation wraps:
//! 2^40 pops while one thread sits between two instructions, which at a hundred million
//! pops a second is three hours. (Only loom models narrow the field, to check that a
//! wrap really loses a magazine; no public knob does.)
//!
//! Descriptors are immortal (see [`magazine`](super::magazine)), so a stale `next`
//! read hits valid memory, and `next` is atomic, so the read is not a data race.
//!
//! # Orderings
//! - push: the owner writes the rounds and `next`, then CASes the head with `Release`.
//! - pop: loads the head with `Acquire` (so `next` of the head is at least as new as the
//!   push that published it), reads `next` `Relaxed`, and CASes with `Acquire`, which
//!   synchronises with the push that published the magazine (and, because every head
//!   update is a read-modify-write, with every earlier push in its release sequence):
//!   the popper then sees the rounds as the pusher left them.

use super::magazine::{Magazine, MagazineTable, INDEX_BITS, NIL};
use crate::sync::{AtomicU64, Ordering};

/// A lock-free stack of magazines, with a generation-tagged head. Unpadded: a depot
/// keeps its two stacks on one cache line (see the depot's "One cache line").
#[derive(Debug)]
pub struct MagazineStack {
    head: AtomicU64,
    generation_mask: u64,
}

/// Widest generation field: everything above the index.
pub const MAX_GENERATION_BITS: u32 = 64 - INDEX_BITS;

#[inline]
fn pack(generation: u64, index: u32) -> u64 {
    (generation << INDEX_BITS) | u64::from(index)
}

#[inline]
fn unpack(head: u64) -> (u64, u32) {
    (head >> INDEX_BITS, (head & u64::from(NIL)) as u32)
}

impl MagazineStack {
    /// An empty stack whose generation field is `generation_bits` wide (clamped to
    /// `0..=MAX_GENERATION_BITS`).
    pub fn new(generation_bits: u32) -> Self {
        let bits = generation_bits.min(MAX_GENERATION_BITS);
        let generation_mask = (1u64 << bits) - 1;
        MagazineStack {
            head: AtomicU64::new(pack(0, NIL)),
            generation_mask,
        }
    }

    /// Pushes `mag`, which the caller owns; ownership passes to the stack.
    pub fn push(&self, mag: &Magazine) {
        self.push_chain(mag, mag);
    }

    /// Pushes the chain `first ..= last` (linked through `next`, all owned by the caller)
    /// with one CAS.
    pub fn push_chain(&self, first: &Magazine, last: &Magazine) {
        let mut head = self.head.load(Ordering::Relaxed);
        loop {
            let (generation, top) = unpack(head);
            last.next.store(top, Ordering::Relaxed);
            // Release: the rounds and links written before this CAS become visible to
            // whoever pops `first`.
            match self.head.compare_exchange_weak(
                head,
                pack(generation, first.index),
                Ordering::Release,
                Ordering::Relaxed,
            ) {
                Ok(_) => return,
                Err(now) => head = now,
            }
        }
    }

    /// Pops a magazine; the caller owns it afterwards.
    pub fn pop<'t>(&self, table: &'t MagazineTable) -> Option<&'t Magazine> {
        // May read a stale link if the top was popped meanwhile; then the generation
        // has moved and the CAS fails.
        self.detach(table, |top| top.next.load(Ordering::Relaxed))
    }

    /// Detaches the whole stack with one CAS; the caller owns the returned chain (walk
    /// it with `next`, ending at [`NIL`]).
    pub fn take_all<'t>(&self, table: &'t MagazineTable) -> Option<&'t Magazine> {
        self.detach(table, |_| NIL)
    }

    /// Replaces the top magazine with `rest(top)` (its link, or [`NIL`] for everything),
    /// advancing the generation; returns the old top, now owned by the caller.
    #[inline]
    fn detach<'t>(
        &self,
        table: &'t MagazineTable,
        rest: impl Fn(&Magazine) -> u32,
    ) -> Option<&'t Magazine> {
        let mut head = self.head.load(Ordering::Acquire);
        loop {
            let (generation, top) = unpack(head);
            if top == NIL {
                return None;
            }
            // SAFETY: `top` came from a push of a descriptor created in `table`.
            let mag = unsafe { table.get(top) };
            match self.head.compare_exchange_weak(
                head,
                pack(generation.wrapping_add(1) & self.generation_mask, rest(mag)),
                Ordering::Acquire,
                Ordering::Acquire,
            ) {
                Ok(_) => return Some(mag),
                Err(now) => head = now,
            }
        }
    }
}

/// Walks a chain owned by the caller, yielding each magazine after reading its link (so
/// the callback may push it elsewhere, which rewrites the link).
pub fn for_each_in_chain<'t>(
    table: &'t MagazineTable,
    first: &'t Magazine,
    mut f: impl FnMut(&'t Magazine),
) {
    let mut cur = Some(first);
    while let Some(mag) = cur {
        let next = mag.next.load(Ordering::Relaxed);
        // SAFETY: links in an owned chain name descriptors of `table`.
        cur = (next != NIL).then(|| unsafe { table.get(next) });
        f(mag);
    }
}

#[cfg(all(test, not(proxalloc_loom)))]
#[path = "tests/stack.rs"]
mod tests;
