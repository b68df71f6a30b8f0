//! The one place that names concurrency primitives.
//!
//! Everything the loom models must see (atomics that carry a protocol, cells that hold
//! data handed between threads, thread-locals, mutexes, `Arc`, and the raw allocations of
//! object memory) comes from here. Under `--cfg proxalloc_loom` these are loom's types, so the
//! models check every ordering and every allocation; otherwise they are std's.
//!
//! Every atomic of the crate comes from here, except the per-CPU caches' (`core::percpu`,
//! `core::rseq`), which never exist under loom: rseq is unavailable there, and loom
//! cannot model the sequences' assembly or a CPU. These deliberately stay std under loom,
//! each for the reason given:
//! - [`StatCounter`]: statistics counters carry no protocol (nothing is published through
//!   them), and modelling them would multiply the state space for nothing.
//! - [`process`]: process-wide registration (dense table indices for the thread-cache
//!   table, instance numbers) and an allocator's copies of its engine's numbers (hints: a
//!   stale one only sends the caller down the slow path; the per-CPU array's pointer is
//!   null under loom), touched only outside any modelled protocol. (Under loom the free list of table indices is one per model
//!   execution, still std: see `core::ids`.)
//! - The misuse-detection table (`debug`) and the registry behind `stats::all` and
//!   `trim_all` (empty under loom) are std mutexes: bookkeeping beside the allocator's
//!   protocols, not part of them.
//!
//! It also keeps the loom difference out of constructors: [`const_fn!`] declares a
//! constructor once (`const` under std only), and [`LazyArc`] is the lazily created,
//! once-published engine cell of every allocator.

#[cfg(proxalloc_loom)]
mod imp {
    pub(crate) use loom::alloc::{alloc, dealloc};
    pub(crate) use loom::cell::UnsafeCell;
    pub(crate) use loom::sync::atomic::{AtomicBool, AtomicPtr, AtomicU32, AtomicU64, AtomicUsize};
    pub(crate) use loom::sync::{Arc, Mutex, MutexGuard};

    /// A thread-local with a `const` initialiser under std; loom's macro takes no
    /// `const` block, so the same declaration is initialised lazily there.
    macro_rules! const_thread_local {
        (static $name:ident: $t:ty = $init:expr;) => {
            loom::thread_local! { static $name: $t = $init; }
        };
    }
    pub(crate) use const_thread_local;
}

#[cfg(not(proxalloc_loom))]
mod imp {
    pub(crate) use std::alloc::{alloc, dealloc};
    pub(crate) use std::sync::atomic::{AtomicBool, AtomicPtr, AtomicU32, AtomicU64, AtomicUsize};
    pub(crate) use std::sync::{Arc, Mutex, MutexGuard};

    /// A thread-local with a `const` initialiser (see the loom twin).
    macro_rules! const_thread_local {
        (static $name:ident: $t:ty = $init:expr;) => {
            std::thread_local! { static $name: $t = const { $init }; }
        };
    }
    pub(crate) use const_thread_local;

    /// `std::cell::UnsafeCell` with loom's closure-based access API, so code written
    /// against the facade compiles unchanged for both.
    #[derive(Debug)]
    #[repr(transparent)]
    pub(crate) struct UnsafeCell<T>(std::cell::UnsafeCell<T>);

    impl<T> UnsafeCell<T> {
        pub(crate) const fn new(value: T) -> Self {
            Self(std::cell::UnsafeCell::new(value))
        }

        #[allow(dead_code)] // loom's API, kept for parity
        #[inline(always)]
        pub(crate) fn with<R>(&self, f: impl FnOnce(*const T) -> R) -> R {
            f(self.0.get())
        }

        #[inline(always)]
        pub(crate) fn with_mut<R>(&self, f: impl FnOnce(*mut T) -> R) -> R {
            f(self.0.get())
        }
    }
}

pub(crate) use imp::*;
pub(crate) use std::sync::atomic::Ordering;

/// Declares a `const fn` under std, a plain `fn` under loom (whose primitives have no
/// `const` constructors), so that each constructor is written once. Under std the
/// constructors of allocators must be `const`: they initialise `static`s.
macro_rules! const_fn {
    ($(#[$attr:meta])* $vis:vis fn $($rest:tt)*) => {
        #[cfg(not(proxalloc_loom))]
        $(#[$attr])* $vis const fn $($rest)*
        #[cfg(proxalloc_loom)]
        $(#[$attr])* $vis fn $($rest)*
    };
}
pub(crate) use const_fn;

/// An `Arc<T>` created on first use, then kept until the cell is dropped: how a
/// `static` allocator gets its engine. Publication is one CAS; readers pay one acquire
/// load (a plain load on x86), and under loom the models check that protocol too.
pub(crate) struct LazyArc<T> {
    /// Null, or a pointer from `Arc::into_raw` (provenance over the whole allocation)
    /// whose strong count the cell holds.
    ptr: AtomicPtr<T>,
}

/// A borrow of a [`LazyArc`]'s value as an `Arc`, for code that needs `&Arc<T>`. Under
/// std it is the cell's own count, never dropped; under loom, which tracks every count,
/// a counted clone.
#[cfg(not(proxalloc_loom))]
pub(crate) type ArcRef<T> = std::mem::ManuallyDrop<Arc<T>>;
#[cfg(proxalloc_loom)]
pub(crate) type ArcRef<T> = Arc<T>;

impl<T> LazyArc<T> {
    const_fn! {
        /// An empty cell.
        pub(crate) fn new() -> Self {
            Self { ptr: AtomicPtr::new(std::ptr::null_mut()) }
        }
    }

    /// The value, if it was published.
    #[inline(always)]
    pub(crate) fn get(&self) -> Option<&T> {
        // Acquire pairs with the Release of `publish`: the value's fields are visible.
        let p = self.ptr.load(Ordering::Acquire);
        // SAFETY: a published value lives until the cell is dropped (it holds a count).
        unsafe { p.as_ref() }
    }

    /// Publishes `fresh` unless a value was published first: returns the published value
    /// and, when another thread won, `fresh` back to its caller.
    #[cold]
    pub(crate) fn publish(&self, fresh: Arc<T>) -> (&T, Option<Arc<T>>) {
        let raw = Arc::into_raw(fresh).cast_mut();
        match self.ptr.compare_exchange(
            std::ptr::null_mut(),
            raw,
            Ordering::AcqRel,
            Ordering::Acquire,
        ) {
            // SAFETY: just published; lives until the cell is dropped.
            Ok(_) => (unsafe { &*raw }, None),
            // SAFETY: `raw` was never published, so this is its only count; `winner` is
            // published and lives until the cell is dropped.
            Err(winner) => unsafe { (&*winner, Some(Arc::from_raw(raw))) },
        }
    }

    /// The published value as an `Arc`.
    ///
    /// # Panics
    /// If nothing was published (a bug: callers publish first).
    pub(crate) fn arc(&self) -> ArcRef<T> {
        let p = self.ptr.load(Ordering::Acquire);
        assert!(!p.is_null(), "LazyArc::arc before publish");
        // SAFETY: `p` came from `Arc::into_raw` and the cell's count keeps it alive; under
        // std the result is never dropped (the cell keeps its count), under loom it is a
        // clone with its own count.
        let cell_count = std::mem::ManuallyDrop::new(unsafe { Arc::from_raw(p) });
        #[cfg(not(proxalloc_loom))]
        return cell_count;
        #[cfg(proxalloc_loom)]
        return Arc::clone(&cell_count);
    }

    /// Takes the value out (the cell's count with it), leaving the cell empty.
    pub(crate) fn take(&mut self) -> Option<Arc<T>> {
        let p = self.ptr.swap(std::ptr::null_mut(), Ordering::Acquire);
        // SAFETY: `p` came from `Arc::into_raw`, and the cell's count now passes to the
        // caller.
        (!p.is_null()).then(|| unsafe { Arc::from_raw(p) })
    }
}

/// Locks a facade mutex, ignoring poison: no code in this crate panics while holding one
/// of its locks (user code never runs under them), so the protected state is consistent.
pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// A statistics counter written by one thread and read by any.
///
/// The owner bumps it with a relaxed load and store (a plain `add` to memory on x86, no
/// locked instruction); readers load it relaxed. It is an atomic only so that a reader
/// racing the owner is not a data race.
#[derive(Debug, Default)]
pub(crate) struct StatCounter(std::sync::atomic::AtomicU64);

impl StatCounter {
    pub(crate) const fn new() -> Self {
        Self(std::sync::atomic::AtomicU64::new(0))
    }

    /// Adds `n`. Only the owning thread may call this (two writers would lose counts).
    /// It runs on the fast paths, so it goes through [`relaxed`] (see there why).
    #[inline(always)]
    pub(crate) fn bump(&self, n: u64) {
        self.0.store(
            self.0.load(Ordering::Relaxed).wrapping_add(n),
            Ordering::Relaxed,
        );
    }

    /// Adds one (owner only, as [`bump`](Self::bump)): the fast paths' form, whose
    /// constant needs no register.
    #[inline(always)]
    pub(crate) fn bump_one(&self) {
        relaxed::increment_u64(&self.0);
    }

    /// Adds `n` from any thread (a locked add: slow paths only).
    pub(crate) fn add_shared(&self, n: u64) {
        self.0.fetch_add(n, Ordering::Relaxed);
    }

    /// Subtracts `n` from any thread (a locked sub: slow paths only).
    pub(crate) fn sub_shared(&self, n: u64) {
        self.0.fetch_sub(n, Ordering::Relaxed);
    }

    pub(crate) fn get(&self) -> u64 {
        self.0.load(Ordering::Relaxed)
    }

    /// Sets it to zero (the owner, while no other thread can read it).
    pub(crate) fn reset(&self) {
        self.0.store(0, Ordering::Relaxed);
    }
}

/// `Relaxed` loads and stores of std atomics that the optimiser sees as plain memory
/// accesses, for the fast paths.
///
/// LLVM's alias analysis treats every atomic access stronger than "unordered", `Relaxed`
/// included, as reading and writing all memory. The fast path of
/// [`ClassAllocator::alloc`](crate::ClassAllocator::alloc) takes a value the caller
/// built before the call and writes it into the object; with an atomic access in
/// between, the compiler can no longer build the value in place, so it builds it on the
/// stack and copies it, and the copy's loads straddle the stores that built it (a
/// store-forwarding stall; measured: `docs/benchmarks.md#atomics-on-the-fast-path`).
/// The atomics on those paths are the allocator's offset and instance
/// hints (read) and the thread cache's statistics counters (written by their owner, read
/// by anyone).
///
/// On x86-64 and AArch64 an aligned 4- or 8-byte `mov`/`ldr`/`str` is single-copy
/// atomic: it *is* a `Relaxed` access, so doing it in inline assembly keeps the program
/// free of data races while the compiler sees a load that only reads memory, or a store
/// it cannot see into (which it knows cannot touch a value whose address never escaped).
/// Elsewhere, under Miri (which cannot run assembly) and under loom, these are ordinary
/// atomics. Only `Relaxed` semantics are offered: nothing may be published through them.
/// ThreadSanitizer does not see accesses made in assembly, so it checks neither these
/// nor their races; they carry no protocol, which is what makes that acceptable.
#[cfg(all(
    any(target_arch = "x86_64", target_arch = "aarch64"),
    not(miri),
    not(proxalloc_loom)
))]
pub(crate) mod relaxed {
    use std::sync::atomic::AtomicU64;

    /// The instructions: `mov` on x86-64, `ldr` on AArch64.
    #[cfg(target_arch = "x86_64")]
    macro_rules! insn {
        // A 32-bit load into `a` at `p + i` and a 64-bit load into `b` at `p + n`.
        (load_pair) => {
            "mov {a:e}, dword ptr [{p} + {i}]\nmov {b}, qword ptr [{p} + {n}]"
        };
        // No instruction: a comment naming the register.
        (none) => {
            "/* {p} */"
        };
    }
    #[cfg(target_arch = "aarch64")]
    macro_rules! insn {
        (load_pair) => {
            "ldr {a:w}, [{p}, #{i}]\nldr {b}, [{p}, #{n}]"
        };
        (none) => {
            "// {p}"
        };
    }

    /// A `Relaxed` load, then a `Relaxed` store of the value plus one: not an atomic
    /// increment (another writer's store in between would be lost), for counters with
    /// one writer. On x86-64 one unlocked `add` to memory, whose read and write are each
    /// single-copy atomic; a load, an add and a store on AArch64.
    #[inline(always)]
    pub(crate) fn increment_u64(a: &AtomicU64) {
        // SAFETY: an aligned, single-copy-atomic load and store of the atomic's own
        // memory: a `Relaxed` load and a `Relaxed` store.
        unsafe {
            #[cfg(target_arch = "x86_64")]
            std::arch::asm!(
                "add qword ptr [{p}], 1",
                p = in(reg) a.as_ptr(),
                options(nostack),
            );
            #[cfg(target_arch = "aarch64")]
            std::arch::asm!(
                "ldr {t}, [{p}]",
                "add {t}, {t}, #1",
                "str {t}, [{p}]",
                p = in(reg) a.as_ptr(),
                t = out(reg) _,
                options(nostack, preserves_flags),
            );
        }
    }

    /// `Relaxed` loads of the `AtomicU32` at byte offset `I` and the `AtomicU64` at
    /// byte offset `N` of `base`, in one block: one base register serves both (two
    /// separate loads each need their own address computed).
    ///
    /// # Safety
    /// `base + I` and `base + N` are a live `AtomicU32` and `AtomicU64`.
    #[inline(always)]
    pub(crate) unsafe fn load_u32_u64<const I: usize, const N: usize>(
        base: *const u8,
    ) -> (usize, u64) {
        // `a` is loaded as 32 bits into a 64-bit register, which zero-extends it: the
        // caller's index needs no second extension.
        let (a, b): (usize, u64);
        // SAFETY: aligned, single-copy-atomic loads of two atomics (the caller's
        // contract): `Relaxed` loads. `a` is a plain output, so it never shares the
        // base's register, which the second load still reads.
        unsafe {
            std::arch::asm!(
                insn!(load_pair),
                p = in(reg) base,
                i = const I,
                n = const N,
                a = out(reg) a,
                b = lateout(reg) b,
                options(nostack, preserves_flags, readonly, pure),
            )
        };
        (a, b)
    }

    /// `p` unchanged, through an assembly block with no instruction: to the optimiser a
    /// value in a register that it cannot see into. The fast paths' lookup takes the
    /// thread's table address through it, so that every access to a cache is
    /// `[base + offset + field]` from one register holding the table's address;
    /// otherwise LLVM folds the thread-local's address into some accesses as `fs:`-relative
    /// operands and keeps a second register for the others, and in a loop of
    /// allocations that register pressure spills the allocators' addresses to the stack
    /// and reloads one before every operation (measured:
    /// `docs/benchmarks.md#the-request-shapes-regression`). It costs no instruction: the
    /// block is `pure` and reads no memory, so it is hoisted with the address.
    #[inline(always)]
    // The block holds the pointer in a register and touches no memory, which is what
    // `nomem` says.
    #[allow(clippy::pointers_in_nomem_asm_block)]
    pub(crate) fn opaque<T>(mut p: *mut T) -> *mut T {
        // SAFETY: no instruction; the pointer comes back as it went in, with its
        // provenance.
        unsafe {
            std::arch::asm!(
                insn!(none),
                p = inout(reg) p,
                options(nostack, preserves_flags, nomem, pure),
            )
        };
        p
    }
}

/// Other targets, Miri (which cannot run assembly) and loom (where `StatCounter` stays
/// std, see the module docs): ordinary `Relaxed` atomics.
#[cfg(not(all(
    any(target_arch = "x86_64", target_arch = "aarch64"),
    not(miri),
    not(proxalloc_loom)
)))]
pub(crate) mod relaxed {
    use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};

    /// `Relaxed` loads of the `AtomicU32` at byte offset `I` and the `AtomicU64` at
    /// byte offset `N` of `base`.
    ///
    /// # Safety
    /// `base + I` and `base + N` are a live `AtomicU32` and `AtomicU64`.
    #[inline(always)]
    pub(crate) unsafe fn load_u32_u64<const I: usize, const N: usize>(
        base: *const u8,
    ) -> (usize, u64) {
        // SAFETY: per the contract.
        let (a, b) = unsafe {
            (
                &*base.add(I).cast::<AtomicU32>(),
                &*base.add(N).cast::<AtomicU64>(),
            )
        };
        (
            a.load(Ordering::Relaxed) as usize,
            b.load(Ordering::Relaxed),
        )
    }

    /// A `Relaxed` load, then a `Relaxed` store of the value plus one (one writer only).
    #[inline(always)]
    pub(crate) fn increment_u64(a: &AtomicU64) {
        a.store(a.load(Ordering::Relaxed).wrapping_add(1), Ordering::Relaxed)
    }

    /// `p` unchanged (the assembly version's purpose is code generation only).
    #[inline(always)]
    pub(crate) fn opaque<T>(p: *mut T) -> *mut T {
        p
    }
}

/// Process-wide std primitives that loom does not model (see the module docs).
pub(crate) mod process {
    pub(crate) use std::sync::atomic::{AtomicU32, AtomicU64};
    pub(crate) use std::sync::Mutex;
}

#[cfg(all(test, not(proxalloc_loom)))]
mod tests {
    use super::{relaxed, StatCounter};
    use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};

    #[test]
    fn relaxed_accesses_see_and_are_seen_by_atomics() {
        let a = AtomicU64::new(u64::MAX - 1);
        relaxed::increment_u64(&a);
        assert_eq!(a.load(Ordering::Relaxed), u64::MAX);
        relaxed::increment_u64(&a); // wraps
        assert_eq!(a.load(Ordering::Relaxed), 0);
    }

    /// The owner bumps through the assembly path while another thread reads: the reader
    /// never sees the count go back, and after the join it sees every bump.
    #[test]
    fn stat_counter_bumps_are_visible_to_other_threads() {
        const BUMPS: u64 = if cfg!(miri) { 500 } else { 100_000 };
        let c = StatCounter::new();
        let done = std::sync::atomic::AtomicBool::new(false);
        std::thread::scope(|s| {
            s.spawn(|| {
                let mut last = 0;
                while !done.load(Ordering::Acquire) {
                    let now = c.get();
                    assert!(now >= last, "counter went back from {last} to {now}");
                    last = now;
                }
            });
            for i in 0..BUMPS {
                if i % 2 == 0 {
                    c.bump(1);
                } else {
                    c.bump_one();
                }
            }
            done.store(true, Ordering::Release);
        });
        assert_eq!(c.get(), BUMPS);
        c.bump(u64::MAX); // wraps, as an atomic add would
        assert_eq!(c.get(), BUMPS - 1);
    }

    /// The paired load reads each field at its offset, whole, with the 32-bit one
    /// zero-extended (a garbage upper half would make every index miss the table).
    #[test]
    fn the_paired_load_reads_both_fields_at_their_offsets() {
        #[repr(C)]
        struct Pair {
            before: AtomicU32,
            small: AtomicU32,
            big: AtomicU64,
        }
        const SMALL: usize = std::mem::offset_of!(Pair, small);
        const BIG: usize = std::mem::offset_of!(Pair, big);
        let p = Pair {
            before: AtomicU32::new(u32::MAX),
            small: AtomicU32::new(0x8000_0001),
            big: AtomicU64::new(0xfedc_ba98_7654_3210),
        };
        let read = || {
            // SAFETY: the offsets of `p`'s two atomics.
            unsafe { relaxed::load_u32_u64::<SMALL, BIG>(std::ptr::from_ref(&p).cast()) }
        };
        assert_eq!(read(), (0x8000_0001, 0xfedc_ba98_7654_3210));
        p.small.store(7, Ordering::Relaxed);
        p.big.store(u64::MAX, Ordering::Relaxed);
        assert_eq!(read(), (7, u64::MAX));
        assert_eq!(p.before.load(Ordering::Relaxed), u32::MAX);
    }
}

/// loom models of [`LazyArc`]: what a reader finds through `get` was written before the
/// value was published.
#[cfg(all(test, proxalloc_loom))]
mod loom_lazy_arc {
    use super::{Arc, LazyArc, UnsafeCell};
    use loom::thread;

    /// A value whose field is written after construction and before publication, through
    /// loom's cell: a reader that does not synchronise with the publication reads it
    /// concurrently with that write, which loom reports as a causality violation.
    struct Payload(UnsafeCell<u64>);

    fn payload(v: u64) -> Arc<Payload> {
        let p = Arc::new(Payload(UnsafeCell::new(0)));
        // SAFETY: not shared yet.
        p.0.with_mut(|x| unsafe { *x = v });
        p
    }

    fn read(p: &Payload) -> u64 {
        // SAFETY: written only before publication (or, in the must-fail model, after).
        p.0.with(|x| unsafe { *x })
    }

    /// Takes the value out (the cell itself has no destructor: its owner takes it).
    fn empty(cell: Arc<LazyArc<Payload>>) -> Option<Arc<Payload>> {
        let Ok(mut cell) = Arc::try_unwrap(cell) else {
            panic!("a thread kept the cell")
        };
        let v = cell.take();
        assert!(cell.get().is_none(), "take left the value");
        v
    }

    /// Two threads find the cell empty and publish at once, or one finds the other's
    /// value: either way both read one value, whole (a `Relaxed` load in `get` fails
    /// this model as a causality violation).
    #[test]
    fn both_threads_see_one_value_whole() {
        loom::model(|| {
            let cell = Arc::new(LazyArc::<Payload>::new());
            let c1 = Arc::clone(&cell);
            let t = thread::spawn(move || {
                let (v, _lost) = c1.publish(payload(1));
                read(v)
            });
            let mine = match cell.get() {
                Some(v) => read(v),
                None => {
                    let (v, lost) = cell.publish(payload(2));
                    if let Some(lost) = lost {
                        assert_eq!(read(&lost), 2, "the loser gets its own value back");
                    }
                    read(v)
                }
            };
            let theirs = t.join().unwrap();
            assert_eq!(mine, theirs, "two values published");
            assert_eq!(read(&cell.arc()), mine);
            let v = empty(cell).expect("nothing was published");
            assert_eq!(read(&v), mine);
        });
    }

    /// Must fail: the value is written after it is published, so a reader that finds it
    /// races the write, whatever the orderings. Shows that the model above can see a
    /// reader that is not synchronised with the writes it reads.
    #[test]
    #[should_panic(expected = "Causality violation")]
    fn a_write_after_publication_is_caught() {
        loom::model(|| {
            let cell = Arc::new(LazyArc::<Payload>::new());
            let c1 = Arc::clone(&cell);
            let t = thread::spawn(move || {
                let (v, _) = c1.publish(payload(0));
                // SAFETY: deliberately unsound: readers may hold the value.
                v.0.with_mut(|x| unsafe { *x = 1 });
            });
            if let Some(v) = cell.get() {
                read(v);
            }
            t.join().unwrap();
            empty(cell);
        });
    }
}
