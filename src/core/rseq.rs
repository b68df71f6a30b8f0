//! Restartable sequences (Linux `rseq(2)`): the platform layer of the per-CPU caches.
//!
//! A restartable sequence is a short run of instructions that the kernel restarts (at
//! an abort handler) if the thread is preempted, migrated or signalled inside it, so a
//! sequence that reads the current CPU number, works on that CPU's data and ends with
//! one store (the *commit*) runs as if it owned the CPU, with no atomic instruction.
//!
//! This module decides once per process whether per-CPU caches can work
//! ([`available`]), finds each thread's rseq area (glibc's, or one registered here),
//! fences a CPU for another thread's reclaim (`membarrier`), and holds the three
//! sequences the caches use ([`pop`], [`push`], [`detach`]), in `asm!` for x86_64.
//! Everywhere else (other platforms and architectures, Miri, loom) `available` is false
//! and the per-CPU caches fall back to per-thread ones.
//!
//! # The word a sequence works on
//! Each CPU's cache has one `u64` *word*: the loaded magazine's length in the low 16
//! bits and a count of operations above them. A pop commits `word - 1 + (1 << 16)`, a
//! push `word + 1 + (1 << 16)`. Lengths from [`BUSY_MIN`] up are not lengths but states
//! in which both fast paths fail: [`EMPTY`] (no magazines), [`STOPPED`] (another thread
//! is reclaiming the CPU's magazines) and [`DETACHED`] (a thread's slow path holds
//! them). The operation count lets the caches count allocations and frees exactly
//! without a second store (see `percpu.rs`).

/// The low 16 bits of a word: the loaded magazine's length, or a state.
pub(crate) const LEN_MASK: u64 = 0xffff;
/// One operation, in a word's count.
pub(crate) const ONE_OP: u64 = 1 << 16;
/// Lengths from here up are states, never lengths (magazines hold at most
/// `MAX_MAGAZINE_SIZE` objects).
pub(crate) const BUSY_MIN: u64 = 0xfffd;
/// No magazines loaded: the next slow path on the CPU installs some.
pub(crate) const EMPTY: u64 = 0xfffd;
/// Another thread is taking the CPU's magazines (`trim`): a slow path that finds it
/// goes around the CPU's cache.
pub(crate) const STOPPED: u64 = 0xfffe;
/// A thread's slow path holds the CPU's magazines.
pub(crate) const DETACHED: u64 = 0xffff;

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

/// Where an allocator's per-CPU caches are, as the sequences read it from memory:
/// `base` is an array of 64-byte caches indexed by CPU number (`ncpu` of them), each
/// starting with its word (`u64`) and its loaded magazine's slot array
/// (`*mut *mut u8`); `cap` is the magazine capacity (below [`BUSY_MIN`]).
#[repr(C)]
#[derive(Debug)]
pub(crate) struct CpuArray {
    pub(crate) base: *mut u8,
    pub(crate) ncpu: u32,
    pub(crate) cap: u32,
}

// The sequences read `ncpu` at 8 and `cap` at 12.
const _: () = {
    assert!(std::mem::offset_of!(CpuArray, ncpu) == 8);
    assert!(std::mem::offset_of!(CpuArray, cap) == 12);
};

/// What a sequence works on: the calling thread's rseq area and an allocator's array.
#[derive(Clone, Copy)]
#[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))] // read by the x86-64 sequences
pub(crate) struct Cpus {
    pub(crate) area: *mut u8,
    pub(crate) array: *const CpuArray,
}

pub(crate) use imp::*;

#[cfg(all(
    target_os = "linux",
    target_arch = "x86_64",
    not(miri),
    not(proxalloc_loom)
))]
mod imp {
    use super::Cpus;
    use std::cell::{Cell, UnsafeCell};
    use std::ffi::{c_char, c_long, c_void};
    // std atomics, not the `sync` facade's: this module is compiled out under loom.
    use std::sync::atomic::{AtomicU32, AtomicU64, AtomicU8, Ordering};

    /// Every rseq area of the process is registered with this signature (glibc's), and
    /// the four bytes before each abort handler must match it.
    const RSEQ_SIG: u32 = 0x5305_3053;
    const SYS_RSEQ: c_long = 334;
    const SYS_MEMBARRIER: c_long = 324;
    const MEMBARRIER_CMD_PRIVATE_EXPEDITED_RSEQ: c_long = 1 << 7;
    const MEMBARRIER_CMD_REGISTER_PRIVATE_EXPEDITED_RSEQ: c_long = 1 << 8;
    const MEMBARRIER_CMD_FLAG_CPU: c_long = 1;

    /// The name of the environment variable that turns per-CPU caches off when set to
    /// `0`, `off`, `false` or `no` (read once, at the first per-CPU allocator's first
    /// use): for ThreadSanitizer, which cannot see the hand-off between threads on one
    /// CPU, and for debuggers (single-stepping inside a sequence restarts it forever).
    pub(crate) const PERCPU_ENV: &str = "PROXALLOC_PERCPU";

    extern "C" {
        fn syscall(number: c_long, ...) -> c_long;
        fn dlsym(handle: *mut c_void, symbol: *const c_char) -> *mut c_void;
    }

    /// The kernel's `struct rseq`, for an area registered here.
    #[repr(C, align(32))]
    struct Area {
        cpu_id_start: u32,
        cpu_id: u32,
        rseq_cs: u64,
        flags: u32,
        node_id: u32,
        mm_cid: u32,
        _reserved: u32,
    }

    impl Area {
        /// An area the kernel has not registered (its `cpu_id` is -1 until it does).
        const UNREGISTERED: Area = Area {
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
        /// This thread's rseq area (glibc's or [`OWN_AREA`]), or null until the thread's
        /// first per-CPU slow path sets it (it stays null if rseq cannot be used here).
        static AREA: Cell<*mut u8> = const { Cell::new(std::ptr::null_mut()) };
        /// Set when this thread's area could not be set up: it is not tried again (a
        /// failed registration is a system call, and a thread whose rseq belongs to
        /// someone else, another allocator's own registration, say, would otherwise
        /// make one at every slow path of every per-CPU allocator).
        static NO_AREA: Cell<bool> = const { Cell::new(false) };
        /// The area registered for this thread when glibc registered none. The kernel
        /// writes it on every return to user space; nothing here makes a reference to it.
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
    /// Sequences the kernel aborted (all sequences of the process), for tests and stats.
    static ABORTS: AtomicU64 = AtomicU64::new(0);
    /// System calls made to register [`OWN_AREA`] (all threads), for tests.
    #[cfg(test)]
    pub(crate) static REGISTRATIONS: AtomicU64 = AtomicU64::new(0);
    /// Test builds spin this many rounds inside every sequence before its commit, so
    /// that preemption lands inside sequences and aborts really happen.
    #[cfg(test)]
    pub(crate) static INJECT_DELAY: AtomicU32 = AtomicU32::new(0);
    #[cfg(not(test))]
    #[allow(dead_code)] // only test builds read it
    static INJECT_DELAY: AtomicU32 = AtomicU32::new(0);

    /// Whether per-CPU caches can work in this process: glibc registers its threads'
    /// rseq areas, or this crate can register its own, `membarrier` can fence a CPU's
    /// sequences (for another thread's reclaim), and [`PERCPU_ENV`] does not turn them
    /// off. Decided once, by the first call (see [`detect`]); every later call, on any
    /// thread, gets that answer. A thread that cannot get an area then uses per-thread
    /// caches ([`thread_area`] is null there).
    pub(crate) fn available() -> bool {
        let mode = match MODE.load(Ordering::Acquire) {
            UNKNOWN => {
                let mode = detect();
                // The first answer stored is everyone's (racing first calls may differ
                // where their threads' rseq does, see `detect`).
                match MODE.compare_exchange(UNKNOWN, mode, Ordering::AcqRel, Ordering::Acquire) {
                    Ok(_) => mode,
                    Err(first) => first,
                }
            }
            mode => mode,
        };
        mode != UNAVAILABLE
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
        // SAFETY: the command takes no pointer; it fails harmlessly where unsupported.
        let fence = unsafe {
            syscall(
                SYS_MEMBARRIER,
                MEMBARRIER_CMD_REGISTER_PRIVATE_EXPEDITED_RSEQ,
                0,
                0,
            )
        };
        if fence != 0 {
            return UNAVAILABLE;
        }
        if let Some(offset) = glibc_offset() {
            // glibc registers every thread it starts (and zeroes `__rseq_size` when it
            // cannot), whatever this thread's own state.
            GLIBC_OFFSET.store(offset as u64, Ordering::Relaxed);
            return GLIBC;
        }
        // No glibc areas: this crate registers its own, and the first thread to ask
        // tries. Where it is refused, someone else registers areas (a statically linked
        // glibc, whose symbols `dlsym` cannot see, or another allocator's own), most
        // likely for every thread: per-CPU caches stay off for the process, since a
        // per-CPU allocator's threads without an area use per-thread caches (and
        // `mode()` would say `PerCpu` for what are thread caches everywhere).
        if register_own() {
            OWN
        } else {
            UNAVAILABLE
        }
    }

    /// glibc's `__rseq_offset` if glibc registers rseq areas (`__rseq_size != 0`).
    fn glibc_offset() -> Option<isize> {
        // SAFETY: dlsym with RTLD_DEFAULT (null) and NUL-terminated names; the symbols,
        // where they exist, are glibc's `const unsigned int __rseq_size` and
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

    /// Whether the area at `area` is registered (its `cpu_id` is a CPU, not -1 or -2).
    ///
    /// # Safety
    /// `area` is this thread's rseq area.
    unsafe fn registered(area: *mut u8) -> bool {
        // SAFETY: per the contract; the kernel writes the field, so it is read volatile.
        (unsafe { area.add(4).cast::<u32>().read_volatile() } as i32) >= 0
    }

    /// Registers [`OWN_AREA`] for this thread; true when the kernel has it (registered
    /// now, or before: `detect` registers the first thread's, and the kernel refuses a
    /// second registration of the same area).
    fn register_own() -> bool {
        OWN_AREA
            .try_with(|a| {
                let area = a.get();
                // SAFETY: this thread's own area; the kernel keeps `cpu_id` current once
                // the area is registered (and it is -1 until then).
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

    /// This thread's area, set up on first use; null where rseq cannot be used (the
    /// process-wide mode says so, the thread's registration failed, or its thread-locals
    /// are being destroyed).
    pub(crate) fn thread_area() -> *mut u8 {
        let area = current_area();
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
        let _ = AREA.try_with(|c| c.set(area));
        if area.is_null() {
            let _ = NO_AREA.try_with(|c| c.set(true));
        }
        area
    }

    /// This thread's area if it was set up (null otherwise): the fast paths' read, one
    /// thread-local load.
    #[inline(always)]
    pub(crate) fn current_area() -> *mut u8 {
        AREA.try_with(Cell::get).unwrap_or(std::ptr::null_mut())
    }

    /// Aborts every sequence running on `cpu` and returns once that CPU has passed a
    /// full memory barrier: after it, no sequence that began before the call can
    /// commit, and this thread sees every store the CPU made.
    pub(crate) fn fence_cpu(cpu: u32) {
        // SAFETY: no pointer arguments; registration happened in `detect`.
        let r = unsafe {
            syscall(
                SYS_MEMBARRIER,
                MEMBARRIER_CMD_PRIVATE_EXPEDITED_RSEQ,
                MEMBARRIER_CMD_FLAG_CPU,
                cpu as c_long,
            )
        };
        // A CPU that does not exist (or is offline) runs none of our sequences.
        debug_assert!(
            r == 0 || std::io::Error::last_os_error().raw_os_error() == Some(6), // ENXIO
            "membarrier fence failed: {}",
            std::io::Error::last_os_error()
        );
    }

    /// Sequences the kernel has aborted in this process.
    #[cfg_attr(not(test), allow(dead_code))]
    pub(crate) fn aborts() -> u64 {
        ABORTS.load(Ordering::Relaxed)
    }

    /// The start of every sequence: arms the area's `rseq_cs` with the sequence's
    /// descriptor (label 3, in the `__rseq_cs` section), then label 4 starts the
    /// sequence. The descriptor's fields are the start (4), the length up to the
    /// post-commit label (5) and the abort handler (6), which sits in its own section
    /// after the signature, counts the abort and starts over at 2 (the kernel cleared
    /// `rseq_cs`).
    macro_rules! sequence {
        ($($body:expr),* $(,)?) => {
            concat!(
                "2:\n",
                "lea {t}, [rip + 3f]\n",
                "mov qword ptr [{area} + 8], {t}\n",
                "4:\n",
                $($body, "\n",)*
                "5:\n",
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

    /// Test builds spin inside each sequence, just before the commit (see
    /// `INJECT_DELAY`); other builds have nothing there.
    #[cfg(test)]
    macro_rules! delay {
        () => {
            concat!(
                "mov {d:e}, dword ptr [rip + {delay}]\n",
                "7:\n",
                "test {d:e}, {d:e}\n",
                "jz 8f\n",
                "sub {d:e}, 1\n",
                "jmp 7b\n",
                "8:"
            )
        };
    }
    #[cfg(not(test))]
    macro_rules! delay {
        () => {
            ""
        };
    }

    /// `asm!` with a sequence's operands, plus the injected delay's in test builds (an
    /// operand cannot carry `#[cfg]` before Rust 1.89, and the MSRV is 1.84).
    #[cfg(test)]
    macro_rules! rseq_asm {
        ($template:expr, $($operands:tt)*) => {
            core::arch::asm!(
                $template,
                $($operands)*
                d = out(reg) _,
                delay = sym INJECT_DELAY,
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

    /// The per-CPU cache of the running CPU, into `{c}` (whose low 32 bits held the CPU
    /// number): `base + cpu * 64`. Jumps to the end (fails) if the CPU number is not below
    /// `ncpu` (an unregistered area reads as CPU `u32::MAX`). The array's fields are read
    /// from memory, not registers: the sequences then need two registers fewer, which
    /// keeps the callers of the fast paths from saving one more.
    macro_rules! this_cpu {
        () => {
            concat!(
                "mov {c:e}, dword ptr [{area} + 4]\n",
                "cmp {c:e}, dword ptr [{arr} + 8]\n",
                "jae 5f\n",
                "shl {c}, 6\n",
                "add {c}, qword ptr [{arr}]"
            )
        };
    }

    /// Pops the running CPU's loaded magazine: an object, or null (the magazine is empty,
    /// or the cache is in a state, or the area is not this thread's registered one).
    ///
    /// # Safety
    /// `cpus.area` is this thread's registered area and `cpus` describes a live array of
    /// caches whose words and slot arrays follow the rules of `percpu.rs`.
    #[inline(always)]
    pub(crate) unsafe fn pop(cpus: Cpus) -> *mut u8 {
        let out: *mut u8;
        // SAFETY: per the contract. Within the sequence, registers are only scratch
        // outputs (never inputs modified), the one store is the commit, and nothing
        // calls out; a replay recomputes everything from the inputs.
        unsafe {
            rseq_asm!(
                sequence!(
                    "xor {out:e}, {out:e}",
                    this_cpu!(),
                    "mov {w}, qword ptr [{c}]",
                    "movzx {l:e}, {w:x}",
                    "sub {l:e}, 1",
                    "cmp {l:e}, dword ptr [{arr} + 12]",
                    "jae 5f",
                    "mov {t}, qword ptr [{c} + 8]",
                    "mov {out}, qword ptr [{t} + {l} * 8]",
                    "add {w}, 0xffff",
                    delay!(),
                    "mov qword ptr [{c}], {w}",
                ),
                area = in(reg) cpus.area,
                arr = in(reg) cpus.array,
                out = out(reg) out,
                c = out(reg) _,
                w = out(reg) _,
                l = out(reg) _,
                t = out(reg) _,
                aborts = sym ABORTS,
            );
        }
        out
    }

    /// Pushes `p` onto the running CPU's loaded magazine; false when it is full, or the
    /// cache is in a state, or the area is not this thread's registered one.
    ///
    /// # Safety
    /// As for [`pop`].
    #[inline(always)]
    pub(crate) unsafe fn push(cpus: Cpus, p: *mut u8) -> bool {
        let ok: u32;
        // SAFETY: as in `pop`. The store of `p` into the slot past the length is
        // speculative: until the commit, no one reads that slot.
        unsafe {
            rseq_asm!(
                sequence!(
                    "xor {ok:e}, {ok:e}",
                    this_cpu!(),
                    "mov {w}, qword ptr [{c}]",
                    "movzx {l:e}, {w:x}",
                    "cmp {l:e}, dword ptr [{arr} + 12]",
                    "jae 5f",
                    "mov {t}, qword ptr [{c} + 8]",
                    "mov qword ptr [{t} + {l} * 8], {p}",
                    "add {w}, 0x10001",
                    "mov {ok:e}, 1",
                    delay!(),
                    "mov qword ptr [{c}], {w}",
                ),
                area = in(reg) cpus.area,
                arr = in(reg) cpus.array,
                p = in(reg) p,
                ok = out(reg) ok,
                c = out(reg) _,
                w = out(reg) _,
                l = out(reg) _,
                t = out(reg) _,
                aborts = sym ABORTS,
            );
        }
        ok != 0
    }

    /// Takes the running CPU's magazines for this thread's slow path: if the CPU's word
    /// holds a length (or [`super::EMPTY`]), commits it as [`super::DETACHED`] (its count
    /// kept) and returns `(cpu, the word before)`; `None` if another thread holds them or
    /// is reclaiming them, or the area is not this thread's registered one. The caller
    /// then owns the CPU's magazines until it stores a new word.
    ///
    /// # Safety
    /// As for [`pop`].
    #[inline]
    pub(crate) unsafe fn detach(cpus: Cpus) -> Option<(u32, u64)> {
        let got: u64;
        let word: u64;
        // SAFETY: as in `pop`.
        unsafe {
            rseq_asm!(
                sequence!(
                    "xor {got:e}, {got:e}",
                    "mov {c:e}, dword ptr [{area} + 4]",
                    "cmp {c:e}, dword ptr [{arr} + 8]",
                    "jae 5f",
                    "lea {n}, [{c} + 1]",
                    "shl {c}, 6",
                    "add {c}, qword ptr [{arr}]",
                    "mov {w}, qword ptr [{c}]",
                    "movzx {t:e}, {w:x}",
                    "cmp {t:e}, 0xfffe",
                    "jae 5f",
                    "mov {t}, {w}",
                    "or {t}, 0xffff",
                    "mov {got}, {n}",
                    delay!(),
                    "mov qword ptr [{c}], {t}",
                ),
                area = in(reg) cpus.area,
                arr = in(reg) cpus.array,
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

    #[cfg(test)]
    mod own_area_tests {
        use super::*;

        /// Set in the child process of
        /// `without_glibcs_areas_our_own_serve_and_a_refused_one_is_asked_for_once`.
        const OWN_AREA_CHILD: &str = "PROXALLOC_TEST_OWN_AREA_CHILD";

        /// The child's side: glibc registers no area (its tunable says so), so this process
        /// registers its own, and the detecting thread must be able to use it; a thread
        /// whose rseq is someone else's is refused once and not asked for again, and an
        /// allocator first used there is still per-CPU for the others.
        #[test]
        #[ignore = "run in a child process by its parent test"]
        fn own_areas_child() {
            if std::env::var_os(OWN_AREA_CHILD).is_none() {
                return;
            }
            if glibc_offset().is_some() {
                println!("glibc registers areas despite its tunable: nothing to test");
                return;
            }
            use crate::{CacheMode, ClassAllocator, Config};
            // The first thread to ask registers its own area, which decides for the
            // process (the detecting thread of the old code was refused as a duplicate).
            assert!(
                available(),
                "rseq works here (the parent checked): our own area must"
            );
            assert!(!thread_area().is_null(), "this thread's own area");
            let a = std::sync::Arc::new(ClassAllocator::<u64>::with_config(
                "own-areas",
                Config::new().mode(CacheMode::PerCpu),
            ));
            let on_foreign = a.clone();
            std::thread::spawn(move || {
                std::thread_local! {
                    static FOREIGN: UnsafeCell<Area> = const {
                        UnsafeCell::new(Area::UNREGISTERED)
                    };
                }
                // Another library's registration, as tcmalloc makes where glibc makes none.
                // SAFETY: a 32-byte, 32-aligned area living until the thread exits.
                let r = FOREIGN.with(|a| unsafe { syscall(SYS_RSEQ, a.get(), 32u32, 0, RSEQ_SIG) });
                assert_eq!(r, 0, "the foreign registration");
                let before = REGISTRATIONS.load(Ordering::Relaxed);
                assert!(available(), "decided for the process, not for this thread");
                // The allocator's first use (its engine is built on this thread, which
                // has no area) and this thread's operations, in a per-thread cache.
                drop((0..1000).map(|i| on_foreign.alloc(i)).collect::<Vec<_>>());
                assert_eq!(on_foreign.mode(), CacheMode::PerCpu);
                assert_eq!(on_foreign.stats().threads, 1, "this thread's own cache");
                // Which the inline fast path serves, as any allocator's thread cache (not
                // the slow path at every operation).
                let p = on_foreign
                    .hints
                    .alloc()
                    .expect("the fast path serves a thread without an area");
                // SAFETY: just taken from this allocator, unused.
                assert!(unsafe { on_foreign.hints.free(p) }, "and takes the free");
                for _ in 0..100 {
                    assert!(thread_area().is_null());
                }
                let asked = REGISTRATIONS.load(Ordering::Relaxed) - before;
                assert_eq!(asked, 1, "asked for once");
            })
            .join()
            .unwrap();
            drop((0..1000).map(|i| a.alloc(i)).collect::<Vec<_>>());
            // A thread with an area makes no thread cache of a per-CPU allocator (the
            // foreign thread's went at its exit), so the inline lookup, which per-CPU
            // allocators' hints now take too, misses here and the CPU caches serve.
            assert!(
                a.hints.alloc().is_none(),
                "a thread cache on a thread with an area"
            );
            let s = a.stats();
            assert_eq!(s.threads, 0, "{s}");
            assert!(s.is_consistent() && s.live == 0 && s.allocs == 2001, "{s}");
            println!("own areas: checked");
        }

        #[test]
        fn without_glibcs_areas_our_own_serve_and_a_refused_one_is_asked_for_once() {
            if !available() {
                eprintln!("rseq unavailable here: nothing to test");
                return;
            }
            let out = std::process::Command::new(std::env::current_exe().unwrap())
                .args([
                    "--exact",
                    "core::rseq::imp::own_area_tests::own_areas_child",
                ])
                .args(["--include-ignored", "--nocapture", "--test-threads=1"])
                .env("GLIBC_TUNABLES", "glibc.pthread.rseq=0")
                .env(OWN_AREA_CHILD, "1")
                .output()
                .unwrap();
            let stdout = String::from_utf8_lossy(&out.stdout);
            assert!(
                out.status.success()
                    && (stdout.contains("own areas: checked")
                        || stdout.contains("glibc registers areas")),
                "child: {}\n{stdout}\n{}",
                out.status,
                String::from_utf8_lossy(&out.stderr)
            );
        }
    }
}

/// Where rseq is not available: nothing here is ever called but [`available`], which
/// says no, so the per-CPU caches fall back to per-thread ones.
#[cfg(not(all(
    target_os = "linux",
    target_arch = "x86_64",
    not(miri),
    not(proxalloc_loom)
)))]
mod imp {
    /// See the Linux version.
    #[allow(dead_code)] // the same items on every platform; not all are used everywhere
    pub(crate) const PERCPU_ENV: &str = "PROXALLOC_PERCPU";

    /// Never, here.
    pub(crate) fn available() -> bool {
        false
    }

    /// Never a CPU to fence here.
    pub(crate) fn fence_cpu(_cpu: u32) {}

    /// None here.
    #[allow(dead_code)] // as `PERCPU_ENV`
    pub(crate) fn aborts() -> u64 {
        0
    }

    /// No area here.
    #[inline(always)]
    pub(crate) fn current_area() -> *mut u8 {
        std::ptr::null_mut()
    }

    /// No area here.
    pub(crate) fn thread_area() -> *mut u8 {
        std::ptr::null_mut()
    }

    use super::Cpus;

    /// Never called (no area).
    #[inline(always)]
    pub(crate) unsafe fn pop(_: Cpus) -> *mut u8 {
        std::ptr::null_mut()
    }

    /// Never called (no area).
    #[inline(always)]
    pub(crate) unsafe fn push(_: Cpus, _: *mut u8) -> bool {
        false
    }

    /// Never called (no area).
    pub(crate) unsafe fn detach(_: Cpus) -> Option<(u32, u64)> {
        None
    }
}

#[cfg(all(
    test,
    target_os = "linux",
    target_arch = "x86_64",
    not(miri),
    not(proxalloc_loom)
))]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicU64, Ordering};

    /// A cache as the sequences see one: the word, then the slot array.
    #[repr(C, align(64))]
    struct Cache {
        word: AtomicU64,
        slots: *mut *mut u8,
    }

    fn ncpu() -> u32 {
        std::thread::available_parallelism().map_or(1, |n| n.get()) as u32 + 64
    }

    #[test]
    fn pop_push_and_detach_keep_every_pointer_once_and_count_operations() {
        if !available() || thread_area().is_null() {
            eprintln!("rseq unavailable here: nothing to test");
            return;
        }
        let n = ncpu();
        let mut arrays: Vec<[*mut u8; 4]> = vec![[std::ptr::null_mut(); 4]; n as usize];
        let caches: Vec<Cache> = arrays
            .iter_mut()
            .map(|a| Cache {
                word: AtomicU64::new(0),
                slots: a.as_mut_ptr(),
            })
            .collect();
        let array = CpuArray {
            base: caches.as_ptr() as *mut u8,
            ncpu: n,
            cap: 4,
        };
        let cpus = Cpus {
            area: thread_area(),
            array: &array,
        };
        let tokens: Vec<*mut u8> = (1..=3usize).map(|i| (i * 8) as *mut u8).collect();
        let mut pushed = 0;
        for &t in &tokens {
            // SAFETY: this thread's area; the caches and their slot arrays live here.
            pushed += usize::from(unsafe { push(cpus, t) });
        }
        assert_eq!(pushed, 3, "room for four on every CPU");
        let total = |f: fn(u64) -> u64| {
            caches
                .iter()
                .map(|c| f(c.word.load(Ordering::Relaxed)))
                .sum::<u64>()
        };
        assert_eq!((total(len), total(ops)), (3, 3));
        // Pop until every CPU's magazine is empty (the thread may migrate meanwhile).
        let mut popped = Vec::new();
        while total(len) > 0 {
            // SAFETY: as above.
            let p = unsafe { pop(cpus) };
            if !p.is_null() {
                popped.push(p);
            }
        }
        popped.sort();
        assert_eq!(popped, tokens);
        assert_eq!(total(ops), 6);
        // SAFETY: as above.
        let (cpu, word) = unsafe { detach(cpus) }.expect("a length, not a state");
        let c = &caches[cpu as usize];
        assert_eq!(len(word), 0);
        assert_eq!(c.word.load(Ordering::Relaxed), with_len(word, DETACHED));
        // Both fast paths fail on a detached CPU, as on the other states.
        for state in [DETACHED, STOPPED, EMPTY] {
            for c in &caches {
                c.word.store(with_len(0, state), Ordering::Relaxed);
            }
            // SAFETY: as above.
            unsafe {
                assert!(pop(cpus).is_null());
                assert!(!push(cpus, tokens[0]));
                assert_eq!(detach(cpus).is_some(), state == EMPTY);
            }
        }
    }
}
