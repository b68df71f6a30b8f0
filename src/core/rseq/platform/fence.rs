//! Fences for reclaiming another CPU's cache, and what a failed one does.
//!
//! `membarrier(MEMBARRIER_CMD_PRIVATE_EXPEDITED_RSEQ, MEMBARRIER_CMD_FLAG_CPU, cpu)`
//! aborts every sequence of this process running on `cpu` and returns once that CPU has
//! passed a full barrier: after it, no sequence that began before the call can commit.
//! A reclaimer (`trim`) relies on that to take a CPU's magazines while the CPU's threads
//! go on running. The command needs the process to have registered for it (once, at
//! detection), and can fail: under a seccomp filter that refuses `membarrier`, or in a
//! child after `fork` on a kernel that does not carry the registration over.
//!
//! A failed fence never lets a reclaimer take a cache (the caller puts the CPU's word
//! back and leaves its magazines where they are), and it is counted. The registration is
//! then made again and the fence retried once; if that fails too, per-CPU caches are off
//! for the rest of the process ([`disabled`]): allocators made later get per-thread
//! caches, existing per-CPU allocators hand each CPU's magazines to their depot at the
//! next slow path on that CPU and use per-thread caches from then on (until then, that
//! CPU's threads go on using its cache, and a trim cannot take it), and the stats dump
//! says why.

use std::ffi::c_long;
use std::sync::atomic::{AtomicI32, AtomicU64, Ordering};

use super::super::FenceFailed;
use super::area::syscall;

const SYS_MEMBARRIER: c_long = 324;
const MEMBARRIER_CMD_PRIVATE_EXPEDITED_RSEQ: c_long = 1 << 7;
const MEMBARRIER_CMD_REGISTER_PRIVATE_EXPEDITED_RSEQ: c_long = 1 << 8;
const MEMBARRIER_CMD_FLAG_CPU: c_long = 1;
const ENXIO: i32 = 6;

/// Fences that failed (each attempt counted, a retry's too).
static FAILURES: AtomicU64 = AtomicU64::new(0);
/// 0 while per-CPU caches are on; the `errno` of the fence that turned them off after.
static DISABLED: AtomicI32 = AtomicI32::new(0);

/// The `errno` of the last failed system call on this thread.
fn errno() -> i32 {
    std::io::Error::last_os_error().raw_os_error().unwrap_or(0)
}

/// Registers the process for fences; true when it is (again: a second registration is
/// harmless).
pub(crate) fn register() -> bool {
    #[cfg(test)]
    if hooks::FAIL_REGISTER.load(Ordering::Relaxed) {
        return false;
    }
    // SAFETY: the command takes no pointer; it fails harmlessly where unsupported.
    unsafe {
        syscall(
            SYS_MEMBARRIER,
            MEMBARRIER_CMD_REGISTER_PRIVATE_EXPEDITED_RSEQ,
            0,
            0,
        ) == 0
    }
}

/// One fence, as the kernel answers it.
fn fence_once(cpu: u32) -> Result<(), FenceFailed> {
    #[cfg(test)]
    {
        let fail = hooks::FAIL_FENCES
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| n.checked_sub(1));
        if fail.is_ok() {
            return Err(FenceFailed(1)); // EPERM, as a seccomp filter answers
        }
        if hooks::RECORD.load(Ordering::Relaxed) {
            if cpu < 64 {
                hooks::FENCED.fetch_or(1 << cpu, Ordering::SeqCst);
            }
            return Ok(());
        }
    }
    // SAFETY: no pointer arguments.
    let r = unsafe {
        syscall(
            SYS_MEMBARRIER,
            MEMBARRIER_CMD_PRIVATE_EXPEDITED_RSEQ,
            MEMBARRIER_CMD_FLAG_CPU,
            cpu as c_long,
        )
    };
    match r {
        0 => Ok(()),
        // A CPU that does not exist (or is offline) runs none of our sequences.
        _ if errno() == ENXIO => Ok(()),
        _ => Err(FenceFailed(errno())),
    }
}

/// Aborts every sequence running on `cpu` and returns once that CPU has passed a full
/// memory barrier: after it, no sequence that began before the call can commit, and this
/// thread sees every store the CPU made. On failure nothing is fenced (see the module
/// docs): the caller must not take the CPU's cache.
pub(crate) fn fence_cpu(cpu: u32) -> Result<(), FenceFailed> {
    let Err(e) = fence_once(cpu) else {
        return Ok(());
    };
    FAILURES.fetch_add(1, Ordering::Relaxed);
    if register() {
        match fence_once(cpu) {
            Ok(()) => return Ok(()),
            Err(_) => {
                FAILURES.fetch_add(1, Ordering::Relaxed);
            }
        }
    }
    // The first failure that could not be mended turns per-CPU caches off; later ones
    // keep its `errno`.
    let _ = DISABLED.compare_exchange(0, e.0.max(1), Ordering::Release, Ordering::Relaxed);
    Err(e)
}

/// Why per-CPU caches are off for the rest of the process, if a fence failed for good.
pub(crate) fn disabled() -> Option<FenceFailed> {
    match DISABLED.load(Ordering::Acquire) {
        0 => None,
        e => Some(FenceFailed(e)),
    }
}

/// Fences that failed in this process (each attempt, a retry's too).
pub(crate) fn failures() -> u64 {
    FAILURES.load(Ordering::Relaxed)
}

/// Turns per-CPU caches back on after a test that turned them off.
#[cfg(test)]
pub(crate) fn reset_for_tests() {
    DISABLED.store(0, Ordering::Release);
}

/// Test hooks: fail this many fences (then work again); fail registrations while set;
/// record fences in [`FENCED`] instead of making them (for the sequences' injection tests,
/// whose CPUs are fake).
#[cfg(test)]
pub(crate) mod hooks {
    use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64};
    pub(crate) static FAIL_FENCES: AtomicU32 = AtomicU32::new(0);
    pub(crate) static FAIL_REGISTER: AtomicBool = AtomicBool::new(false);
    pub(crate) static RECORD: AtomicBool = AtomicBool::new(false);
    /// One bit per fenced CPU below 64, while [`RECORD`] is set.
    pub(crate) static FENCED: AtomicU64 = AtomicU64::new(0);
}
