//! Whether per-CPU caches can work in this process, and each thread's rseq area: glibc's
//! (2.35 and later register one in every thread they start), or one registered here where
//! glibc registers none.

use std::cell::{Cell, UnsafeCell};
use std::ffi::{c_char, c_long, c_void};
// std atomics, not the `sync` facade's: this module is compiled out under loom.
use std::sync::atomic::{AtomicU32, AtomicU64, AtomicU8, Ordering};

use super::super::Thread;

/// Every rseq area of the process is registered with this signature (glibc's), and the
/// four bytes before each abort handler must match it.
pub(super) const RSEQ_SIG: u32 = 0x5305_3053;
pub(super) const SYS_RSEQ: c_long = 334;

/// The name of the environment variable that turns per-CPU caches off when set to `0`,
/// `off`, `false` or `no` (read once, at the first per-CPU allocator's first use): for
/// debuggers (single-stepping inside a sequence restarts it forever). ThreadSanitizer
/// builds need no switch: they compile no sequences (`proxalloc_tsan`, see `rseq`).
pub(crate) const PERCPU_ENV: &str = "PROXALLOC_PERCPU";

extern "C" {
    pub(super) fn syscall(number: c_long, ...) -> c_long;
    fn dlsym(handle: *mut c_void, symbol: *const c_char) -> *mut c_void;
}

/// The kernel's `struct rseq`, for an area registered here.
#[repr(C, align(32))]
pub(super) struct Area {
    pub(super) cpu_id_start: u32,
    pub(super) cpu_id: u32,
    pub(super) rseq_cs: u64,
    pub(super) flags: u32,
    pub(super) node_id: u32,
    pub(super) mm_cid: u32,
    pub(super) _reserved: u32,
}

impl Area {
    /// An area the kernel has not registered (its `cpu_id` is -1 until it does).
    pub(super) const UNREGISTERED: Area = Area {
        cpu_id_start: 0,
        cpu_id: u32::MAX,
        rseq_cs: 0,
        flags: 0,
        node_id: 0,
        mm_cid: 0,
        _reserved: 0,
    };
}

std::thread_local! {
    /// This thread's area and the CPU it last ran on, as the fast paths read them: the
    /// area is null until the thread's first per-CPU slow path sets it up (and stays null
    /// where rseq cannot be used here).
    static THREAD: Cell<Thread> = const {
        Cell::new(Thread { area: std::ptr::null_mut(), cpu: 0 })
    };
    /// Set when this thread's area could not be set up: it is not tried again (a failed
    /// registration is a system call, and a thread whose rseq belongs to someone else,
    /// another allocator's own registration, say, would otherwise make one at every slow
    /// path of every per-CPU allocator).
    static NO_AREA: Cell<bool> = const { Cell::new(false) };
    /// The area registered for this thread when glibc registered none. The kernel writes
    /// it on every return to user space; nothing here makes a reference to it.
    static OWN_AREA: UnsafeCell<Area> = const {
        UnsafeCell::new(Area::UNREGISTERED)
    };
}

/// How this process uses rseq, decided once.
const UNKNOWN: u8 = 0;
const GLIBC: u8 = 1;
const OWN: u8 = 2;
const UNAVAILABLE: u8 = 3;
static MODE: AtomicU8 = AtomicU8::new(UNKNOWN);
/// glibc's `__rseq_offset`: its area's distance from the thread pointer.
static GLIBC_OFFSET: AtomicU64 = AtomicU64::new(0);
/// The number of CPU numbers the kernel may report (see [`ncpu`]), once known.
static NCPU: AtomicU32 = AtomicU32::new(0);
/// System calls made to register [`OWN_AREA`] (all threads), for tests.
#[cfg(test)]
pub(crate) static REGISTRATIONS: AtomicU64 = AtomicU64::new(0);

/// Whether per-CPU caches can work in this process: glibc registers its threads' rseq
/// areas, or this crate can register its own, `membarrier` can fence a CPU's sequences
/// (for another thread's reclaim), and [`PERCPU_ENV`] does not turn them off. Decided
/// once, by the first call (see `detect`); every later call, on any thread, gets that
/// answer. A thread that cannot get an area then uses per-thread caches ([`thread_area`]
/// is null there). A fence that fails later turns them off again ([`super::fence`]).
pub(crate) fn available() -> bool {
    let mode = match MODE.load(Ordering::Acquire) {
        UNKNOWN => {
            let mode = detect();
            // The first answer stored is everyone's (racing first calls may differ where
            // their threads' rseq does, see `detect`).
            match MODE.compare_exchange(UNKNOWN, mode, Ordering::AcqRel, Ordering::Acquire) {
                Ok(_) => mode,
                Err(first) => first,
            }
        }
        mode => mode,
    };
    mode != UNAVAILABLE
}

/// [`available`]'s answer if it has been decided, without deciding it (which may
/// register this thread's rseq area): for stats, which must not change the process.
pub(crate) fn decided() -> Option<bool> {
    match MODE.load(Ordering::Acquire) {
        UNKNOWN => None,
        mode => Some(mode != UNAVAILABLE),
    }
}

fn detect() -> u8 {
    let off = std::env::var_os(PERCPU_ENV).and_then(|v| v.into_string().ok());
    if let Some(v) = off {
        if matches!(
            v.to_ascii_lowercase().as_str(),
            "0" | "off" | "false" | "no"
        ) {
            return UNAVAILABLE;
        }
    }
    if !super::fence::register() {
        return UNAVAILABLE;
    }
    if ncpu() == 0 {
        return UNAVAILABLE;
    }
    if let Some(offset) = glibc_offset() {
        // glibc registers every thread it starts (and zeroes `__rseq_size` when it
        // cannot), whatever this thread's own state.
        GLIBC_OFFSET.store(offset as u64, Ordering::Relaxed);
        return GLIBC;
    }
    // No glibc areas: this crate registers its own, and the first thread to ask tries.
    // Where it is refused, someone else registers areas (a statically linked glibc, whose
    // symbols `dlsym` cannot see, or another allocator's own), most likely for every
    // thread: per-CPU caches stay off for the process, since a per-CPU allocator's
    // threads without an area use per-thread caches (and `mode()` would say `PerCpu` for
    // what are thread caches everywhere).
    if register_own() {
        OWN
    } else {
        UNAVAILABLE
    }
}

/// The number of CPU numbers the kernel may report: one past the highest possible CPU
/// (`/sys/devices/system/cpu/possible`, e.g. `0-63`), or the parallelism std sees. Every
/// per-CPU allocator has this many caches, and a thread keeps a CPU number only below it.
pub(crate) fn ncpu() -> u32 {
    let n = NCPU.load(Ordering::Relaxed);
    if n != 0 {
        return n;
    }
    let n = std::fs::read_to_string("/sys/devices/system/cpu/possible")
        .ok()
        .and_then(|s| {
            s.trim()
                .split(',')
                .filter_map(|r| r.rsplit('-').next()?.parse::<u32>().ok())
                .max()
        })
        .map(|max| max.saturating_add(1))
        .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get() as u32))
        // CPU numbers in the sequences are shifted into a byte offset of a `usize`.
        .min(1 << 24);
    // Racing first callers may compute different numbers (a read of sysfs that fails
    // for one): the first stored is everyone's, since every engine's cache array and
    // every thread's CPU number are checked against it.
    match NCPU.compare_exchange(0, n.max(1), Ordering::Relaxed, Ordering::Relaxed) {
        Ok(_) => n.max(1),
        Err(first) => first,
    }
}

/// glibc's `__rseq_offset` if glibc registers rseq areas (`__rseq_size != 0`).
fn glibc_offset() -> Option<isize> {
    // SAFETY: dlsym with RTLD_DEFAULT (null) and NUL-terminated names; the symbols, where
    // they exist, are glibc's `const unsigned int __rseq_size` and
    // `const ptrdiff_t __rseq_offset`, set before any thread runs.
    unsafe {
        let size = dlsym(std::ptr::null_mut(), c"__rseq_size".as_ptr()).cast::<u32>();
        let offset = dlsym(std::ptr::null_mut(), c"__rseq_offset".as_ptr()).cast::<isize>();
        (!size.is_null() && !offset.is_null() && size.read() != 0).then(|| offset.read())
    }
}

/// The thread pointer (`fs:[0]` holds the TCB's own address on glibc and musl).
#[inline(always)]
fn thread_pointer() -> usize {
    let tp: usize;
    // SAFETY: reads the TCB's self pointer; no side effects.
    unsafe {
        core::arch::asm!("mov {}, qword ptr fs:[0]", out(reg) tp, options(nostack, readonly, preserves_flags));
    }
    tp
}

fn glibc_area(offset: isize) -> *mut u8 {
    (thread_pointer() as isize + offset) as *mut u8
}

/// The `cpu_id` of the area at `area`: a CPU number, or -1 / -2 (as `u32`) where the
/// area is not registered.
///
/// # Safety
/// `area` is this thread's rseq area.
pub(crate) unsafe fn cpu_id(area: *mut u8) -> u32 {
    // SAFETY: per the contract; the kernel writes the field, so it is read volatile.
    unsafe { area.add(4).cast::<u32>().read_volatile() }
}

/// Whether the area at `area` is registered (its `cpu_id` is a CPU, not -1 or -2).
///
/// # Safety
/// As for [`cpu_id`].
unsafe fn registered(area: *mut u8) -> bool {
    // SAFETY: forwarded.
    (unsafe { cpu_id(area) } as i32) >= 0
}

/// Registers [`OWN_AREA`] for this thread; true when the kernel has it (registered now,
/// or before: `detect` registers the first thread's, and the kernel refuses a second
/// registration of the same area).
fn register_own() -> bool {
    OWN_AREA
        .try_with(|a| {
            let area = a.get();
            // SAFETY: this thread's own area; the kernel keeps `cpu_id` current once the
            // area is registered (and it is -1 until then).
            if unsafe { registered(area.cast()) } {
                return true;
            }
            #[cfg(test)]
            REGISTRATIONS.fetch_add(1, Ordering::Relaxed);
            // SAFETY: a 32-byte, 32-aligned area that lives until the thread exits
            // (static TLS with no destructor), registered with glibc's signature.
            let r = unsafe { syscall(SYS_RSEQ, area, 32u32, 0, RSEQ_SIG) };
            // SAFETY: as above; the kernel fills `cpu_id` on success.
            r == 0 && unsafe { registered(area.cast()) }
        })
        .unwrap_or(false)
}

/// This thread's area, set up on first use (with the CPU it runs on now); null where
/// rseq cannot be used (the process-wide mode says so, the thread's registration failed,
/// or its thread-locals are being destroyed).
pub(crate) fn thread_area() -> *mut u8 {
    let area = thread().area;
    if !area.is_null() || NO_AREA.try_with(Cell::get).unwrap_or(true) {
        return area;
    }
    let area = match MODE.load(Ordering::Acquire) {
        GLIBC => {
            let a = glibc_area(GLIBC_OFFSET.load(Ordering::Relaxed) as isize);
            // SAFETY: this thread's glibc area.
            if unsafe { registered(a) } {
                a
            } else {
                std::ptr::null_mut()
            }
        }
        OWN if register_own() => OWN_AREA
            .try_with(|a| a.get().cast::<u8>())
            .unwrap_or(std::ptr::null_mut()),
        _ => std::ptr::null_mut(),
    };
    // SAFETY: this thread's area (registered, if not null).
    let cpu = if area.is_null() {
        0
    } else {
        unsafe { cpu_id(area) }
    };
    if area.is_null() || cpu >= ncpu() {
        let _ = NO_AREA.try_with(|c| c.set(true));
        return std::ptr::null_mut();
    }
    let _ = THREAD.try_with(|c| c.set(Thread { area, cpu }));
    area
}

/// The calling thread's area and the CPU it last ran on, as the fast paths read them:
/// one thread-local load (no liveness check: the thread-local has no destructor).
#[inline(always)]
pub(crate) fn thread() -> Thread {
    THREAD.try_with(Cell::get).unwrap_or(Thread {
        area: std::ptr::null_mut(),
        cpu: 0,
    })
}

/// The CPU the thread whose area is `area` runs on, as its area says now (outside any
/// sequence: a hint), if it is one a thread may keep (below [`ncpu`]).
///
/// # Safety
/// `area` is this thread's rseq area (or a test's fake one).
pub(crate) unsafe fn current_cpu(area: *mut u8) -> Option<u32> {
    // SAFETY: forwarded.
    let cpu = unsafe { cpu_id(area) };
    (cpu < ncpu()).then_some(cpu)
}

/// Keeps `cpu` as the CPU this thread runs on (a slow path found it so; below [`ncpu`]).
pub(crate) fn set_cpu(cpu: u32) {
    debug_assert!(cpu < ncpu());
    let _ = THREAD.try_with(|c| {
        let mut t = c.get();
        if !t.area.is_null() {
            t.cpu = cpu;
            c.set(t);
        }
    });
}

#[cfg(test)]
#[path = "tests/area.rs"]
mod tests;
