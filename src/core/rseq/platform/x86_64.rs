//! The sequences, in `asm!` for x86-64: [`pop`] and [`push`] (the fast paths) and
//! [`detach`] (the slow path's way into a CPU's cache).
//!
//! Each is one `asm!` block: it arms the area's `rseq_cs` with its descriptor (a 32-byte
//! record in the `__rseq_cs` section: the start, the length up to the post-commit label,
//! the abort handler), runs from the start label to its commit (the one store that
//! publishes its work, last), and fails by jumping past it. Inside, registers are only
//! inputs (never changed) and scratch outputs (written before read), so a restart after
//! an abort recomputes everything; nothing calls out; the only store before the commit
//! is a push's slot store past the loaded length, which no one reads until the commit
//! makes it part of the magazine. The abort handler, in its own section after the
//! signature the kernel checks, counts the abort and starts over at the arming (the
//! kernel cleared `rseq_cs`).
//!
//! Test builds put an injection point before every instruction from the arming to the
//! commit and one after the commit (see `inject.rs`): numbered in the order a run meets
//! them, each can stop the sequence there while a test acts on the same cache, then let
//! it go on or abort it as the kernel would.

use std::sync::atomic::AtomicU64;
#[cfg(test)]
use std::sync::atomic::Ordering;

/// Sequences the kernel (or, in test builds, an injection point) aborted, process-wide.
static ABORTS: AtomicU64 = AtomicU64::new(0);

/// Test builds spin this many rounds inside every sequence, just before its commit, so
/// that real preemption lands inside sequences and aborts really happen.
#[cfg(test)]
pub(crate) static INJECT_DELAY: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);

/// Sequences aborted in this process.
#[cfg(test)]
pub(crate) fn aborts() -> u64 {
    ABORTS.load(Ordering::Relaxed)
}

/// An injection point inside the critical section (test builds; nothing otherwise):
/// counts the point in `{k}`, checks that the sequence is armed, and if the test asked
/// for this point on this area, stops until it says go on (3) or abort (4). Flags are
/// kept (in AH, which the sequences leave to it): a point may sit between a compare and
/// its jump.
#[cfg(test)]
macro_rules! inside {
    () => {
        concat!(
            "lahf\n",
            "cmp qword ptr [{area} + 8], 0\n",
            "jne 21f\n",
            "lock inc qword ptr [rip + {unarmed}]\n",
            "21:\n",
            "lea {k:e}, [{k:e} + 1]\n",
            "cmp {k:e}, dword ptr [rip + {inj_at}]\n",
            "jne 27f\n",
            "cmp {area}, qword ptr [rip + {inj_area}]\n",
            "jne 27f\n",
            "mov dword ptr [rip + {inj_state}], 1\n",
            "22:\n",
            "pause\n",
            "cmp dword ptr [rip + {inj_state}], 3\n",
            "jb 22b\n",
            "je 27f\n",
            // An abort, as the kernel makes one: `rseq_cs` cleared, to the handler.
            "mov qword ptr [{area} + 8], 0\n",
            "jmp 6f\n",
            "27:\n",
            "sahf\n",
        )
    };
}
#[cfg(not(test))]
macro_rules! inside {
    () => {
        ""
    };
}

/// An injection point outside the critical section (before the arming, after the
/// commit): as [`inside!`], but never aborted (the kernel aborts only inside).
#[cfg(test)]
macro_rules! outside {
    () => {
        concat!(
            "lahf\n",
            "lea {k:e}, [{k:e} + 1]\n",
            "cmp {k:e}, dword ptr [rip + {inj_at}]\n",
            "jne 27f\n",
            "cmp {area}, qword ptr [rip + {inj_area}]\n",
            "jne 27f\n",
            "mov dword ptr [rip + {inj_state}], 2\n",
            "22:\n",
            "pause\n",
            "cmp dword ptr [rip + {inj_state}], 3\n",
            "jb 22b\n",
            "27:\n",
            "sahf\n",
        )
    };
}
#[cfg(not(test))]
macro_rules! outside {
    () => {
        ""
    };
}

/// Test builds spin [`INJECT_DELAY`] rounds (in EAX, which they keep for the points).
#[cfg(test)]
macro_rules! delay {
    () => {
        concat!(
            "mov eax, dword ptr [rip + {delay}]\n",
            "24:\n",
            "test eax, eax\n",
            "jz 25f\n",
            "sub eax, 1\n",
            "jmp 24b\n",
            "25:\n",
        )
    };
}
#[cfg(not(test))]
macro_rules! delay {
    () => {
        ""
    };
}

/// Test builds count the injection points met in `{k}`, from 0 at the sequence's entry
/// (a restart counts on).
#[cfg(test)]
macro_rules! count_points {
    () => {
        "xor {k:e}, {k:e}\n"
    };
}
#[cfg(not(test))]
macro_rules! count_points {
    () => {
        ""
    };
}

/// A whole sequence: `{t}` (a scratch register the body may reuse) arms the area, label
/// 4 starts the critical section, every instruction of the body gets an injection point
/// before it, the last one is the commit, label 5 ends the critical section, one more
/// point follows, and failures jump to label 9, past it.
macro_rules! sequence {
    ($($body:expr),* $(,)?) => {
        concat!(
            count_points!(),
            "2:\n",
            outside!(),
            "lea {t}, [rip + 3f]\n",
            outside!(),
            "mov qword ptr [{area} + 8], {t}\n",
            "4:\n",
            $(inside!(), $body, "\n",)*
            "5:\n",
            outside!(),
            "9:\n",
            ".pushsection __rseq_cs, \"aw\"\n",
            ".balign 32\n",
            "3:\n",
            ".long 0, 0\n",
            ".quad 4b, 5b - 4b, 6f\n",
            ".popsection\n",
            ".pushsection __rseq_failure, \"ax\"\n",
            ".byte 0x0f, 0xb9, 0x3d\n",
            ".long 0x53053053\n",
            "6:\n",
            "lock inc qword ptr [rip + {aborts}]\n",
            "jmp 2b\n",
            ".popsection\n",
        )
    };
}

/// `asm!` with a sequence's operands, plus, in test builds, the injection points' and the
/// delay's (an operand cannot carry `#[cfg]` before Rust 1.89, and the MSRV is 1.84): `k`
/// counts injection points, and RAX is theirs.
#[cfg(test)]
macro_rules! rseq_asm {
    ($template:expr, $($operands:tt)*) => {
        core::arch::asm!(
            $template,
            $($operands)*
            k = out(reg) _,
            out("rax") _,
            delay = sym INJECT_DELAY,
            unarmed = sym super::inject::UNARMED,
            inj_at = sym super::inject::AT,
            inj_area = sym super::inject::AREA,
            inj_state = sym super::inject::STATE,
            options(nostack),
        )
    };
}
#[cfg(not(test))]
macro_rules! rseq_asm {
    ($template:expr, $($operands:tt)*) => {
        core::arch::asm!($template, $($operands)* options(nostack))
    };
}

/// Pops the loaded magazine of the cache at `cache` (CPU `cpu`'s): an object, or null if
/// the thread does not run on `cpu` (or its area is unregistered), the magazine is empty,
/// or the cache is in a state.
///
/// # Safety
/// `area` is this thread's registered rseq area (or a test's fake one); `cache` is where
/// CPU `cpu`'s cache of a live array is (see the module docs of `rseq`) whenever `cpu` is
/// below the array's CPU count, and `cpu` is.
#[inline(always)]
pub(crate) unsafe fn pop(area: *mut u8, cpu: u32, cache: usize) -> *mut u8 {
    let out: *mut u8;
    // SAFETY: per the contract. Within the sequence, registers are only scratch outputs
    // (never inputs modified), the one store is the commit, and nothing calls out; a
    // replay recomputes everything from the inputs (`out` is zeroed inside).
    unsafe {
        rseq_asm!(
            sequence!(
                "xor {t:e}, {t:e}",
                "cmp dword ptr [{area} + 4], {cpu:e}",
                "jne 9f",
                "mov {w}, qword ptr [{cache}]",
                "movzx {l:e}, {w:x}",
                "sub {l:e}, 1",
                "cmp {l:e}, dword ptr [{cache} + 16]",
                "jae 9f",
                "mov {t}, qword ptr [{cache} + 8]",
                "mov {t}, qword ptr [{t} + {l} * 8]",
                "add {w}, 0xffff",
                delay!(),
                "mov qword ptr [{cache}], {w}",
            ),
            area = in(reg) area,
            cpu = in(reg) cpu,
            cache = in(reg) cache,
            t = out(reg) out,
            w = out(reg) _,
            l = out(reg) _,
            aborts = sym ABORTS,
        );
    }
    out
}

/// Pushes `p` onto the loaded magazine of the cache at `cache` (see [`pop`]): false if
/// the thread does not run on `cpu`, the magazine is full (or there is none), or the
/// cache is in a state.
///
/// # Safety
/// As for [`pop`].
#[inline(always)]
pub(crate) unsafe fn push(area: *mut u8, cpu: u32, cache: usize, p: *mut u8) -> bool {
    let ok: u64;
    // SAFETY: as in `pop`. The store of `p` into the slot past the length is speculative:
    // until the commit, no one reads that slot.
    unsafe {
        rseq_asm!(
            sequence!(
                "xor {t:e}, {t:e}",
                "cmp dword ptr [{area} + 4], {cpu:e}",
                "jne 9f",
                "mov {w}, qword ptr [{cache}]",
                "movzx {l:e}, {w:x}",
                "cmp {l:e}, dword ptr [{cache} + 16]",
                "jae 9f",
                "mov {t}, qword ptr [{cache} + 8]",
                "mov qword ptr [{t} + {l} * 8], {p}",
                "mov {t:e}, 1",
                "add {w}, 0x10001",
                delay!(),
                "mov qword ptr [{cache}], {w}",
            ),
            area = in(reg) area,
            cpu = in(reg) cpu,
            cache = in(reg) cache,
            p = in(reg) p,
            t = out(reg) ok,
            w = out(reg) _,
            l = out(reg) _,
            aborts = sym ABORTS,
        );
    }
    ok != 0
}

/// Takes the running CPU's cache for this thread's slow path: if its word holds a length,
/// commits it as [`DETACHED`](crate::core::rseq::DETACHED) (its count kept) and returns
/// `(cpu, the word before)`; `None` if another thread holds or reclaims it, it is
/// retired, or the area is not registered. The caller then owns the CPU's magazines until it stores a new word.
/// The CPU number is read inside the sequence (`base + (cpu << 6)` is the cache).
///
/// # Safety
/// `area` as for [`pop`]; `base` is a live array of `ncpu` caches.
#[inline]
pub(crate) unsafe fn detach(area: *mut u8, base: usize, ncpu: u32) -> Option<(u32, u64)> {
    let got: u64;
    let word: u64;
    // SAFETY: as in `pop`.
    unsafe {
        rseq_asm!(
            sequence!(
                "xor {got:e}, {got:e}",
                "mov {c:e}, dword ptr [{area} + 4]",
                "cmp {c:e}, {ncpu:e}",
                "jae 9f",
                "lea {n}, [{c} + 1]",
                "shl {c}, 6",
                "add {c}, {base}",
                "mov {w}, qword ptr [{c}]",
                "movzx {t:e}, {w:x}",
                "cmp {t:e}, 0xfffd",
                "jae 9f",
                "mov {t}, {w}",
                "or {t}, 0xffff",
                "mov {got}, {n}",
                delay!(),
                "mov qword ptr [{c}], {t}",
            ),
            area = in(reg) area,
            base = in(reg) base,
            ncpu = in(reg) ncpu,
            got = out(reg) got,
            w = out(reg) word,
            c = out(reg) _,
            n = out(reg) _,
            t = out(reg) _,
            aborts = sym ABORTS,
        );
    }
    (got != 0).then(|| ((got - 1) as u32, word))
}

// The sequences address a cache's word at 0, its slot array at 8 and its capacity at 16,
// and CPU `n`'s cache at `base + (n << 6)`.
const _: () = {
    use crate::core::rseq::{CACHE_SHIFT, CAP, DETACHED, RETIRED, SLOTS, STOPPED, WORD};
    assert!(WORD == 0 && SLOTS == 8 && CAP == 16 && CACHE_SHIFT == 6);
    // `detach` refuses every state: from `RETIRED` up.
    assert!(RETIRED == 0xfffd && STOPPED == 0xfffe && DETACHED == 0xffff);
};
