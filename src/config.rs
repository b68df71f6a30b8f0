//! Allocator configuration: sizes, budgets and the caching mode.

/// How a [`ClassAllocator`](crate::ClassAllocator) caches freed objects, chosen with
/// [`Config::mode`].
///
/// ```
/// use proxalloc::{CacheMode, ClassAllocator, Config};
/// static PLAIN: ClassAllocator<[u8; 32]> =
///     ClassAllocator::with_config("doc-cache-mode", Config::new().mode(CacheMode::Bypass));
/// drop(PLAIN.alloc([0; 32]));
/// let s = PLAIN.stats();
/// assert_eq!(PLAIN.mode(), CacheMode::Bypass);
/// assert_eq!((s.backing_allocs, s.backing_frees, s.cached_in_threads), (1, 1, 0)); // nothing cached
/// assert_eq!(Config::new().mode(CacheMode::default()), Config::new()); // the default
/// ```
///
/// The default is [`PerCpu`](CacheMode::PerCpu) with the `percpu` feature (on by default)
/// on Linux x86-64, and [`ThreadCaches`](CacheMode::ThreadCaches) otherwise. The build's
/// default mode is the one whose fast path is inlined into every allocation and free;
/// the other mode's fast path runs behind a call, one lookup later (inlining both costs
/// the callers of either). So a per-thread allocator in a default build, or a per-CPU
/// one in a build without `percpu`, works as documented but takes longer per operation:
/// to make per-thread caches the fast ones, build without default features.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub enum CacheMode {
    /// Per-thread magazine caches in front of the shared depot (the default without the
    /// `percpu` feature, or off Linux x86-64).
    ThreadCaches,
    /// Per-CPU magazine caches in front of the shared depot, on Linux x86_64 with
    /// restartable sequences (`rseq`, Linux 4.18+) and `membarrier`'s rseq fence (Linux
    /// 5.10+): each CPU holds a loaded and a previous magazine per allocator, so what the
    /// caches hold grows with the number of CPUs, not threads (a server with a thousand
    /// mostly idle threads caches for its CPUs only), and `trim`/`trim_all` take it back
    /// from any thread. The fast paths are one restartable sequence each, with no atomic
    /// instruction. The default with the `percpu` feature (on by default).
    ///
    /// Where per-CPU caches cannot work (another platform, no rseq or membarrier, Miri,
    /// ThreadSanitizer builds, valgrind, the environment variable `PROXALLOC_PERCPU=off`,
    /// or an allocator capped with [`Config::max_live`]), the allocator uses per-thread
    /// caches instead:
    /// [`ClassAllocator::mode`](crate::ClassAllocator::mode) and [`Stats::mode`](crate::Stats::mode)
    /// say which it got. A thread whose rseq registration failed uses a per-thread cache
    /// of a per-CPU allocator.
    ///
    /// ```
    /// use proxalloc::{CacheMode, ClassAllocator, Config};
    /// static CONNS: ClassAllocator<[u8; 256]> =
    ///     ClassAllocator::with_config("doc-per-cpu", Config::new().mode(CacheMode::PerCpu));
    /// drop(CONNS.alloc([0; 256]));
    /// let mode = CONNS.mode(); // PerCpu on Linux x86_64 with rseq; else ThreadCaches
    /// assert!(matches!(mode, CacheMode::PerCpu | CacheMode::ThreadCaches));
    /// assert_eq!(CONNS.stats().mode, mode);
    /// ```
    PerCpu,
    /// No per-thread caching: every allocation and free goes to the shared depot, one
    /// object per magazine. This is Traffic Server's global freelist without its proxy
    /// allocators, kept to reproduce the TS-1684 comparison.
    DepotOnly,
    /// Every allocation and free goes straight to the backing (global) allocator, like
    /// Traffic Server's `-F`: use it under valgrind or sanitizers, or to compare.
    Bypass,
}

/// Whether the inline fast paths are the per-CPU sequences, with the thread caches'
/// lookup out of line, and `PerCpu` the default mode (the `percpu` feature, where
/// restartable sequences are compiled: the condition of `core::rseq`'s `with_rseq!`,
/// which checks that the two agree), rather than the other way round: one kind of
/// cache is inlined into every allocation site, since carrying both costs the callers of
/// either (`docs/benchmarks.md`).
pub(crate) const PERCPU_FIRST: bool = cfg!(all(
    feature = "percpu",
    target_os = "linux",
    target_arch = "x86_64",
    not(miri),
    not(proxalloc_loom),
    not(proxalloc_tsan)
));

impl CacheMode {
    /// The default mode: [`PerCpu`](CacheMode::PerCpu) where the `percpu` feature
    /// inlines its fast path, else [`ThreadCaches`](CacheMode::ThreadCaches).
    pub(crate) const DEFAULT: CacheMode = if PERCPU_FIRST {
        CacheMode::PerCpu
    } else {
        CacheMode::ThreadCaches
    };
}

impl Default for CacheMode {
    /// [`PerCpu`](CacheMode::PerCpu) in a build with the `percpu` feature on Linux
    /// x86-64 (not under Miri or ThreadSanitizer), [`ThreadCaches`](CacheMode::ThreadCaches)
    /// otherwise.
    fn default() -> Self {
        CacheMode::DEFAULT
    }
}

/// Name of the environment variable that forces [`CacheMode::Bypass`] on every allocator
/// when it is set to `1`, `true`, `yes` or `on`. It is read once per allocator, when the
/// allocator is first used.
///
/// ```
/// use proxalloc::{CacheMode, ClassAllocator, BYPASS_ENV};
/// assert_eq!(BYPASS_ENV, "PROXALLOC_BYPASS");
/// // As if the program ran under `PROXALLOC_BYPASS=1` (say, under valgrind):
/// std::env::set_var(BYPASS_ENV, "1");
/// static TRACED: ClassAllocator<u64> = ClassAllocator::new("doc-bypass-env");
/// assert_eq!(TRACED.mode(), CacheMode::Bypass); // read now, at first use
/// ```
pub const BYPASS_ENV: &str = "PROXALLOC_BYPASS";

/// Tuning for one [`ClassAllocator`](crate::ClassAllocator).
///
/// Built with `const` methods, so a configured allocator can still be a `static`:
///
/// ```
/// use proxalloc::{ClassAllocator, Config};
/// static HEADERS: ClassAllocator<[u8; 256]> = ClassAllocator::with_config(
///     "headers",
///     Config::new().magazine_size(32).depot_bytes(1 << 20),
/// );
/// let h = HEADERS.alloc([0; 256]);
/// assert_eq!(h.len(), 256);
/// ```
///
/// No knob can turn off the depot's ABA protection: the generation width is fixed
/// outside the crate's own loom models.
///
/// ```compile_fail
/// let narrow = proxalloc::Config::new().generation_bits(0); // no such method
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Config {
    pub(crate) magazine_size: usize,
    pub(crate) depot_bytes: usize,
    pub(crate) thread_cache_bytes: usize,
    pub(crate) thread_cache_growth_bytes: usize,
    pub(crate) cpu_cache_bytes: usize,
    pub(crate) max_live: usize,
    pub(crate) mode: CacheMode,
    pub(crate) generation_bits: u32,
}

/// Largest accepted magazine size; larger values are clamped to it.
///
/// ```
/// use proxalloc::{Config, MAX_MAGAZINE_SIZE};
/// assert_eq!(MAX_MAGAZINE_SIZE, 1024);
/// assert_eq!(
///     Config::new().magazine_size(1 << 20),
///     Config::new().magazine_size(MAX_MAGAZINE_SIZE),
/// );
/// ```
pub const MAX_MAGAZINE_SIZE: usize = 1024;

impl Config {
    /// Default objects per magazine of an allocator with per-thread caches: 128, where
    /// the thread cache's byte bound
    /// ([`DEFAULT_THREAD_CACHE_BYTES`](Self::DEFAULT_THREAD_CACHE_BYTES)) allows it, that
    /// is for objects of up to 64 bytes; larger objects get fewer (32 of 256 bytes).
    /// [`magazine_size`](Self::magazine_size) sets one size for every mode instead of each
    /// mode's default.
    ///
    /// ```
    /// use proxalloc::{CacheMode, ClassAllocator, Config};
    /// assert_eq!(Config::DEFAULT_MAGAZINE_SIZE, 128);
    /// static SMALL: ClassAllocator<u64> = ClassAllocator::with_config(
    ///     "doc-default-magazine",
    ///     Config::new().mode(CacheMode::ThreadCaches),
    /// );
    /// drop((0..300).map(|i| SMALL.alloc(i)).collect::<Vec<_>>());
    /// assert!(SMALL.stats().cached_in_threads <= 2 * 128); // two magazines
    /// ```
    pub const DEFAULT_MAGAZINE_SIZE: usize = 128;
    /// Default objects per magazine of an allocator with per-CPU caches: 512, where the CPU
    /// cache's byte bound ([`DEFAULT_CPU_CACHE_BYTES`](Self::DEFAULT_CPU_CACHE_BYTES))
    /// allows it, that is for objects of up to 128 bytes. Per-CPU caches are few (one per
    /// CPU, not per thread), so they can afford larger magazines, and with no stash to
    /// grow into, a batch of objects larger than two magazines would go through the shared
    /// depot.
    ///
    /// ```
    /// use proxalloc::Config;
    /// assert_eq!(Config::DEFAULT_CPU_MAGAZINE_SIZE, 512);
    /// ```
    pub const DEFAULT_CPU_MAGAZINE_SIZE: usize = 512;
    /// Default bound on bytes of free objects one CPU caches for one allocator in its
    /// loaded and previous magazines (per-CPU caches).
    ///
    /// ```
    /// use proxalloc::Config;
    /// assert_eq!(Config::DEFAULT_CPU_CACHE_BYTES, 128 << 10); // 128 KiB
    /// assert_eq!(
    ///     Config::new(),
    ///     Config::new().cpu_cache_bytes(Config::DEFAULT_CPU_CACHE_BYTES),
    /// );
    /// ```
    pub const DEFAULT_CPU_CACHE_BYTES: usize = 128 << 10;
    /// Default budget for bytes of free objects held in the depot (per allocator).
    ///
    /// ```
    /// use proxalloc::Config;
    /// assert_eq!(Config::DEFAULT_DEPOT_BYTES, 2 << 20); // 2 MiB
    /// assert_eq!(Config::new(), Config::new().depot_bytes(Config::DEFAULT_DEPOT_BYTES));
    /// ```
    pub const DEFAULT_DEPOT_BYTES: usize = 2 << 20;
    /// Default bound on bytes of free objects one thread caches for one allocator in its
    /// loaded and previous magazines.
    ///
    /// ```
    /// use proxalloc::Config;
    /// assert_eq!(Config::DEFAULT_THREAD_CACHE_BYTES, 16 << 10); // 16 KiB
    /// assert_eq!(
    ///     Config::new(),
    ///     Config::new().thread_cache_bytes(Config::DEFAULT_THREAD_CACHE_BYTES),
    /// );
    /// ```
    pub const DEFAULT_THREAD_CACHE_BYTES: usize = 16 << 10;
    /// Default bound on the bytes one thread's cache may grow by for one allocator (its
    /// stash of further full magazines), granted from the process-wide thread-cache
    /// budget (see [`set_thread_cache_budget`](crate::set_thread_cache_budget)).
    ///
    /// ```
    /// use proxalloc::Config;
    /// assert_eq!(Config::DEFAULT_THREAD_CACHE_GROWTH_BYTES, 1 << 20); // 1 MiB
    /// assert_eq!(
    ///     Config::new(),
    ///     Config::new().thread_cache_growth_bytes(Config::DEFAULT_THREAD_CACHE_GROWTH_BYTES),
    /// );
    /// ```
    pub const DEFAULT_THREAD_CACHE_GROWTH_BYTES: usize = 1 << 20;

    /// The defaults: 128-object magazines for per-thread caches
    /// ([`DEFAULT_MAGAZINE_SIZE`](Self::DEFAULT_MAGAZINE_SIZE)) and 512-object ones for
    /// per-CPU caches ([`DEFAULT_CPU_MAGAZINE_SIZE`](Self::DEFAULT_CPU_MAGAZINE_SIZE),
    /// under a 128 KiB bound per CPU: [`DEFAULT_CPU_CACHE_BYTES`](Self::DEFAULT_CPU_CACHE_BYTES)),
    /// a 2 MiB depot budget
    /// ([`DEFAULT_DEPOT_BYTES`](Self::DEFAULT_DEPOT_BYTES)), a 16 KiB bound on a thread
    /// cache's two magazines ([`DEFAULT_THREAD_CACHE_BYTES`](Self::DEFAULT_THREAD_CACHE_BYTES)),
    /// which may grow by up to 1 MiB more under the process-wide budget
    /// ([`DEFAULT_THREAD_CACHE_GROWTH_BYTES`](Self::DEFAULT_THREAD_CACHE_GROWTH_BYTES)),
    /// no cap on live objects, and the default [`CacheMode`] (per-CPU caches with the
    /// `percpu` feature on Linux x86-64, per-thread caches otherwise).
    ///
    /// ```
    /// use proxalloc::{ClassAllocator, Config};
    /// const DEFAULTS: Config = Config::new(); // usable in `const` and `static` items
    /// assert_eq!(DEFAULTS, Config::default());
    /// static ITEMS: ClassAllocator<u64> = ClassAllocator::with_config("doc-config-new", DEFAULTS);
    /// assert_eq!(*ITEMS.config(), *ClassAllocator::<u64>::new("doc-config-new-2").config());
    /// ```
    pub const fn new() -> Self {
        Config {
            // 0: each mode's default (see `magazine_capacity`).
            magazine_size: 0,
            depot_bytes: Self::DEFAULT_DEPOT_BYTES,
            thread_cache_bytes: Self::DEFAULT_THREAD_CACHE_BYTES,
            thread_cache_growth_bytes: Self::DEFAULT_THREAD_CACHE_GROWTH_BYTES,
            cpu_cache_bytes: Self::DEFAULT_CPU_CACHE_BYTES,
            max_live: usize::MAX,
            mode: CacheMode::DEFAULT,
            // As wide as the depot's head allows (it clamps).
            generation_bits: u32::MAX,
        }
    }

    /// Objects per magazine (clamped to `1..=MAX_MAGAZINE_SIZE`), in every mode, in place
    /// of each mode's default ([`DEFAULT_MAGAZINE_SIZE`](Self::DEFAULT_MAGAZINE_SIZE),
    /// [`DEFAULT_CPU_MAGAZINE_SIZE`](Self::DEFAULT_CPU_MAGAZINE_SIZE)). Each trip to the
    /// depot moves this many objects, so larger magazines mean fewer shared operations
    /// and more memory held per thread (or CPU).
    ///
    /// ```
    /// use proxalloc::{CacheMode, ClassAllocator, Config};
    /// // Out-of-range sizes are clamped, never rejected:
    /// assert_eq!(Config::new().magazine_size(0), Config::new().magazine_size(1));
    /// static SMALL: ClassAllocator<u64> = ClassAllocator::with_config(
    ///     "doc-config-magazine",
    ///     Config::new().mode(CacheMode::ThreadCaches).magazine_size(4),
    /// );
    /// drop((0..20).map(|i| SMALL.alloc(i)).collect::<Vec<_>>());
    /// // This thread keeps at most two magazines of 4; the rest went to the depot. (A CPU
    /// // keeps two too, but a thread may run on several CPUs meanwhile.)
    /// let s = SMALL.stats();
    /// assert!(s.cached_in_threads <= 8);
    /// assert_eq!(s.cached_in_threads + s.cached_in_depot, 20);
    /// ```
    pub const fn magazine_size(mut self, objects: usize) -> Self {
        self.magazine_size = if objects == 0 {
            1
        } else if objects > MAX_MAGAZINE_SIZE {
            MAX_MAGAZINE_SIZE
        } else {
            objects
        };
        self
    }

    /// Byte budget for free objects kept in the depot. A spill that would go over it
    /// returns that magazine's objects to the backing allocator instead. `0` caches
    /// nothing in the depot. Each cached object is charged its size plus its slot in a
    /// magazine (one pointer), so the budget bounds zero-sized objects too.
    ///
    /// ```
    /// use proxalloc::{CacheMode, ClassAllocator, Config};
    /// static NO_DEPOT: ClassAllocator<[u8; 64]> = ClassAllocator::with_config(
    ///     "doc-config-depot",
    ///     Config::new().mode(CacheMode::ThreadCaches).depot_bytes(0),
    /// );
    /// drop(NO_DEPOT.alloc([0; 64]));
    /// NO_DEPOT.release_thread_cache(); // would hand the object to the depot...
    /// let s = NO_DEPOT.stats();
    /// assert_eq!(s.cached_in_depot, 0); // ...which keeps nothing: back to the system
    /// assert_eq!(s.reserved_bytes(), 0);
    /// ```
    pub const fn depot_bytes(mut self, bytes: usize) -> Self {
        self.depot_bytes = bytes;
        self
    }

    /// Bound on the bytes of free objects one thread caches (in its two magazines). For
    /// large objects it shrinks the magazine below [`magazine_size`](Self::magazine_size),
    /// never below one object.
    ///
    /// ```
    /// use proxalloc::{CacheMode, ClassAllocator, Config};
    /// // 4 KiB objects under an 8 KiB bound: magazines of one object, not 128.
    /// static PAGES: ClassAllocator<[u8; 4096]> = ClassAllocator::with_config(
    ///     "doc-config-thread-bytes",
    ///     Config::new().mode(CacheMode::ThreadCaches).thread_cache_bytes(8 << 10),
    /// );
    /// drop((0..10).map(|_| PAGES.alloc([0; 4096])).collect::<Vec<_>>());
    /// assert!(PAGES.stats().cached_in_threads <= 2);
    /// ```
    pub const fn thread_cache_bytes(mut self, bytes: usize) -> Self {
        self.thread_cache_bytes = bytes;
        self
    }

    /// How far one thread's cache may grow beyond its two magazines (default 1 MiB): a
    /// thread that spills magazines to the depot and then needs them back keeps that
    /// many in its own stash from then on, so a request or batch that holds many objects
    /// stops going through the shared depot. Growth is granted from the process-wide
    /// thread-cache budget and returned when the thread goes idle, is trimmed (by
    /// `trim_all` or the allocator's `trim`), or exits; `0` keeps every thread at two
    /// magazines. Each stashed object is charged its size plus its slot in a magazine
    /// (one pointer), so the bound holds for zero-sized objects too.
    ///
    /// ```
    /// use proxalloc::{CacheMode, ClassAllocator, Config};
    /// static FLAT: ClassAllocator<u64> = ClassAllocator::with_config(
    ///     "doc-config-growth",
    ///     Config::new()
    ///         .mode(CacheMode::ThreadCaches) // per-CPU caches have no stash to grow
    ///         .magazine_size(4)
    ///         .thread_cache_growth_bytes(0),
    /// );
    /// // Batches larger than two magazines, again and again: with no growth, this
    /// // thread never caches more than its two magazines of 4.
    /// for _ in 0..3 {
    ///     drop((0..32).map(|i| FLAT.alloc(i)).collect::<Vec<_>>());
    ///     assert!(FLAT.stats().cached_in_threads <= 8);
    /// }
    /// ```
    pub const fn thread_cache_growth_bytes(mut self, bytes: usize) -> Self {
        self.thread_cache_growth_bytes = bytes;
        self
    }

    /// Bound on the bytes of free objects one CPU caches for the allocator (in its two
    /// magazines), where it has per-CPU caches: as
    /// [`thread_cache_bytes`](Self::thread_cache_bytes) is for a thread's, it shrinks the
    /// magazine for large objects, never below one object.
    ///
    /// ```
    /// use proxalloc::{CacheMode, ClassAllocator, Config};
    /// // 4 KiB objects under a 16 KiB bound: magazines of two objects.
    /// static PAGES: ClassAllocator<[u8; 4096]> = ClassAllocator::with_config(
    ///     "doc-config-cpu-bytes",
    ///     Config::new().mode(CacheMode::PerCpu).cpu_cache_bytes(16 << 10),
    /// );
    /// drop((0..10).map(|_| PAGES.alloc([0; 4096])).collect::<Vec<_>>());
    /// // Where per-CPU caches run, each CPU keeps at most two magazines of two.
    /// # let cpus = std::thread::available_parallelism().map_or(1, |n| n.get()) as u64;
    /// assert!(PAGES.stats().cached_in_threads <= 4 * cpus.max(2));
    /// ```
    pub const fn cpu_cache_bytes(mut self, bytes: usize) -> Self {
        self.cpu_cache_bytes = bytes;
        self
    }

    /// A cap on live objects: once `n` objects of the allocator are in users' hands,
    /// `try_alloc` returns [`AllocError`](crate::AllocError) (and `alloc` fails like an
    /// allocation failure) until one is freed. Exact across threads: each thread draws
    /// permits in small batches from a shared count, and a thread about to be refused
    /// first takes back the permits other threads hold.
    ///
    /// The price: a capped allocator's every allocation and free takes the slow path
    /// (a few nanoseconds more; no atomics on the uncapped allocators' fast paths).
    ///
    /// ```
    /// use proxalloc::{AllocError, ClassAllocator, Config};
    /// let conns = ClassAllocator::<[u8; 256]>::with_config("conns", Config::new().max_live(2));
    /// let a = conns.alloc([0; 256]);
    /// let b = conns.alloc([1; 256]);
    /// assert_eq!(conns.try_alloc([2; 256]).err(), Some(AllocError));
    /// drop(a);
    /// assert!(conns.try_alloc([2; 256]).is_ok());
    /// # drop(b);
    /// ```
    pub const fn max_live(mut self, n: usize) -> Self {
        self.max_live = n;
        self
    }

    /// Selects the caching mode.
    ///
    /// ```
    /// use proxalloc::{CacheMode, ClassAllocator, Config};
    /// static SHARED: ClassAllocator<u64> =
    ///     ClassAllocator::with_config("doc-config-mode", Config::new().mode(CacheMode::DepotOnly));
    /// drop(SHARED.alloc(1));
    /// let s = SHARED.stats();
    /// assert_eq!((s.cached_in_threads, s.cached_in_depot), (0, 1)); // straight to the depot
    /// ```
    pub const fn mode(mut self, mode: CacheMode) -> Self {
        self.mode = mode;
        self
    }

    /// Width of the depot's ABA generation field (default and maximum 40). Only the
    /// crate's own loom models (`--cfg proxalloc_loom`) can narrow it, to check that a
    /// wrap-around really loses a magazine: with 0 or 1 bits the depot has no ABA
    /// protection, so no build that users run offers this knob.
    #[cfg(proxalloc_loom)]
    #[doc(hidden)]
    pub const fn generation_bits(mut self, bits: u32) -> Self {
        self.generation_bits = bits; // the depot clamps it to its head's width
        self
    }

    /// Objects per magazine for objects of `size` bytes, under both bounds, for an
    /// allocator whose caches are per CPU (`per_cpu`: the mode asked for them, and they
    /// work here) or per thread.
    pub(crate) fn magazine_capacity(&self, size: usize, per_cpu: bool) -> usize {
        let (default, bytes) = if per_cpu {
            (Self::DEFAULT_CPU_MAGAZINE_SIZE, self.cpu_cache_bytes)
        } else {
            (Self::DEFAULT_MAGAZINE_SIZE, self.thread_cache_bytes)
        };
        match self.mode {
            CacheMode::DepotOnly => 1,
            CacheMode::ThreadCaches | CacheMode::PerCpu | CacheMode::Bypass => {
                let by_bytes = match size {
                    0 => usize::MAX,
                    s => bytes / (2 * s),
                };
                let objects = match self.magazine_size {
                    0 => default,
                    n => n,
                };
                objects.min(by_bytes).max(1)
            }
        }
    }
}

impl Default for Config {
    fn default() -> Self {
        Config::new()
    }
}

/// Whether [`BYPASS_ENV`] asks for bypass mode.
pub(crate) fn bypass_from_env() -> bool {
    match std::env::var_os(BYPASS_ENV) {
        Some(v) => matches!(
            v.to_str().map(str::to_ascii_lowercase).as_deref(),
            Some("1" | "true" | "yes" | "on")
        ),
        None => false,
    }
}
