//! Restartable sequences (Linux `rseq(2)`): the platform layer of the per-CPU caches.
//!
//! A restartable sequence is a short run of instructions that the kernel restarts (at
//! an abort handler) if the thread is preempted, migrated or signalled inside it, so a
//! sequence that checks the current CPU number, works on that CPU's data and ends with
//! one store (the *commit*) runs as if it owned the CPU, with no atomic instruction.
//!
//! - `area`: whether per-CPU caches can work in this process (decided once), and each
//!   thread's rseq area and the CPU number it last ran on ([`thread`]).
//! - `x86_64`: the three sequences the caches use ([`pop`], [`push`], [`detach`]), and in
//!   test builds the injection points between their instructions.
//! - [`fence`]: `membarrier` fences, which let another thread reclaim a CPU's cache, and
//!   what happens when one fails.
//! - `inject` (test builds): the controller that stops a sequence at any instruction
//!   boundary, acts on the same (fake) CPU's cache meanwhile, and resumes or aborts it.
//!
//! Everywhere else (other platforms and architectures, Miri, loom) [`available`] is false
//! and the per-CPU caches fall back to per-thread ones.
//!
//! # The cache a sequence works on
//! Each CPU's cache of an allocator is 64 bytes (see `percpu.rs`), and the sequences read
//! three fields of it: at [`WORD`] the *word* (`u64`), at [`SLOTS`] the loaded magazine's
//! slot array, and at [`CAP`] the capacity (`u32`) the fast paths may fill it to, 0 when no
//! magazine is loaded. The word holds the loaded magazine's length in its low 16 bits and
//! a count of operations above them: a pop commits `word - 1 + ONE_OP`, a push
//! `word + 1 + ONE_OP`. Lengths from [`RETIRED`] up are not lengths but states in which
//! every sequence fails (a length is never above the capacity, and a state always is):
//! [`RETIRED`] (the cache is out of use for good), [`STOPPED`] (another thread is
//! reclaiming the CPU's magazines) and [`DETACHED`] (a thread's slow path holds them).
//! The operation count lets the caches count allocations and frees exactly without a
//! second store.
//!
//! # Finding it
//! The fast paths do not read the CPU number to find the cache: the thread keeps the
//! number of the CPU it last ran on ([`Thread::cpu`]), the cache's address is computed
//! from it before the sequence, and the sequence's first check compares it with the
//! area's `cpu_id`. A thread that has moved fails that check and takes the slow path,
//! which finds the cache from `cpu_id` itself ([`detach`]) and keeps the new number. So
//! the address does not wait on the `cpu_id` load, and a preemption between the
//! computation and the check is harmless: the check is inside the sequence. The kernel
//! writes `cpu_id` as the ABI defines it; nothing here relies on the kernel rewriting any
//! other field.

/// Serialises the tests that set process-wide per-CPU test hooks (the injected delay,
/// the injection points, the fence hooks) or count aborts.
#[cfg(test)]
pub(crate) static TEST_SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// The low 16 bits of a word: the loaded magazine's length, or a state.
pub(crate) const LEN_MASK: u64 = 0xffff;
/// One operation, in a word's count.
pub(crate) const ONE_OP: u64 = 1 << 16;
/// The CPU's cache holds nothing and never will again: per-CPU caches were turned off
/// after a fence failed (see [`fence`]). States are the lengths from here up; magazines
/// hold at most `MAX_MAGAZINE_SIZE` objects, far below.
pub(crate) const RETIRED: u64 = 0xfffd;
/// Another thread is taking the CPU's magazines (`trim`): a slow path that finds it
/// goes around the CPU's cache.
pub(crate) const STOPPED: u64 = 0xfffe;
/// A thread's slow path holds the CPU's magazines.
pub(crate) const DETACHED: u64 = 0xffff;

/// Where the sequences read a CPU cache's fields, in bytes from its start.
pub(crate) const WORD: usize = 0;
pub(crate) const SLOTS: usize = 8;
pub(crate) const CAP: usize = 16;
/// A CPU cache is `1 << CACHE_SHIFT` bytes; CPU `n`'s is at `base + (n << CACHE_SHIFT)`.
pub(crate) const CACHE_SHIFT: u32 = 6;

/// The length (or state) in a word.
#[inline(always)]
pub(crate) const fn len(word: u64) -> u64 {
    word & LEN_MASK
}

/// The word with its length (or state) replaced by `len`, its count kept.
#[inline(always)]
pub(crate) const fn with_len(word: u64, len: u64) -> u64 {
    (word & !LEN_MASK) | len
}

/// The operations a word has counted.
#[inline(always)]
pub(crate) const fn ops(word: u64) -> u64 {
    word >> 16
}

/// Whether a word holds a state rather than a length.
#[inline(always)]
pub(crate) const fn is_state(word: u64) -> bool {
    len(word) >= RETIRED
}

/// What the fast paths need of the calling thread: its rseq area (null where the thread
/// has none, or has not set it up yet) and the CPU it last ran on (a CPU number below
/// [`ncpu`] whenever `area` is set).
#[derive(Clone, Copy, Debug)]
pub(crate) struct Thread {
    pub(crate) area: *mut u8,
    pub(crate) cpu: u32,
}

/// A fence (or a registration for fences) that failed: the `errno` it failed with.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct FenceFailed(pub(crate) i32);

impl std::fmt::Display for FenceFailed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "membarrier failed: {}",
            std::io::Error::from_raw_os_error(self.0)
        )
    }
}

/// Items compiled where restartable sequences are used: Linux on x86-64, not under Miri
/// (which cannot run the assembly), loom (which cannot model it) or ThreadSanitizer
/// (`proxalloc_tsan`, set by the build script: it cannot see the hand-off between two
/// threads through a CPU's cache, made in assembly). The one place that
/// condition is written for items; `without_rseq!` is its complement, and
/// `config::PERCPU_FIRST` (a value the config needs, below this module) is checked
/// against it here.
macro_rules! with_rseq {
    ($($item:item)*) => {
        $(
            #[cfg(all(
                target_os = "linux",
                target_arch = "x86_64",
                not(miri),
                not(proxalloc_loom),
                not(proxalloc_tsan)
            ))]
            $item
        )*
    };
}
pub(crate) use with_rseq;

/// Items compiled where [`with_rseq`]'s are not.
macro_rules! without_rseq {
    ($($item:item)*) => {
        $(
            #[cfg(not(all(
                target_os = "linux",
                target_arch = "x86_64",
                not(miri),
                not(proxalloc_loom),
                not(proxalloc_tsan)
            )))]
            $item
        )*
    };
}

with_rseq! {
    // `config::PERCPU_FIRST` writes this module's condition again, beside the feature:
    // here the two agree on the feature alone.
    const _: () = assert!(crate::config::PERCPU_FIRST == cfg!(feature = "percpu"));

    mod platform {
        pub(crate) mod area;
        pub(crate) mod fence;
        #[cfg(test)]
        pub(crate) mod inject;
        pub(crate) mod x86_64;
    }

    pub(crate) use platform::{
        area::{available, current_cpu, decided, ncpu, set_cpu, thread, thread_area},
        fence::{self, fence_cpu},
        x86_64::{detach, pop, push},
    };

    #[cfg(test)]
    pub(crate) use platform::{
        area, inject,
        x86_64::{aborts, INJECT_DELAY},
    };
}

without_rseq! {
    /// Where rseq is not available: nothing here is ever called but [`available`], which
    /// says no, so the per-CPU caches fall back to per-thread ones.
    mod unsupported {
        use super::{FenceFailed, Thread};

        /// Never, here.
        pub(crate) fn available() -> bool {
            false
        }

        /// Decided: never.
        pub(crate) fn decided() -> Option<bool> {
            Some(false)
        }

        /// No CPUs here.
        pub(crate) fn ncpu() -> u32 {
            0
        }

        /// No area here.
        #[inline(always)]
        pub(crate) fn thread() -> Thread {
            Thread {
                area: std::ptr::null_mut(),
                cpu: 0,
            }
        }

        /// No area here.
        pub(crate) fn thread_area() -> *mut u8 {
            std::ptr::null_mut()
        }

        /// Nothing to keep here.
        pub(crate) fn set_cpu(_cpu: u32) {}

        /// Never called (no area).
        pub(crate) unsafe fn current_cpu(_area: *mut u8) -> Option<u32> {
            None
        }

        /// Never a CPU to fence here.
        pub(crate) fn fence_cpu(_cpu: u32) -> Result<(), FenceFailed> {
            Ok(())
        }

        pub(crate) mod fence {
            /// Never disabled here (never enabled either).
            pub(crate) fn disabled() -> Option<super::FenceFailed> {
                None
            }

            /// Fence failures seen (none here).
            pub(crate) fn failures() -> u64 {
                0
            }
        }

        /// Never called (no area).
        #[inline(always)]
        pub(crate) unsafe fn pop(_area: *mut u8, _cpu: u32, _cache: usize) -> *mut u8 {
            std::ptr::null_mut()
        }

        /// Never called (no area).
        #[inline(always)]
        pub(crate) unsafe fn push(_area: *mut u8, _cpu: u32, _cache: usize, _p: *mut u8) -> bool {
            false
        }

        /// Never called (no area).
        pub(crate) unsafe fn detach(
            _area: *mut u8,
            _base: usize,
            _ncpu: u32,
        ) -> Option<(u32, u64)> {
            None
        }
    }

    pub(crate) use unsupported::*;

    // Where rseq is not compiled, nothing may put the per-CPU sequences first (see
    // `config::PERCPU_FIRST`).
    const _: () = assert!(!crate::config::PERCPU_FIRST);
}

with_rseq! {
    #[cfg(test)]
    mod tests;
}
