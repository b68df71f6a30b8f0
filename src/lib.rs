//! # proxalloc
//!
//! A per-CPU and per-thread caching object allocator for servers that allocate and free
//! the same few object types millions of times a second.
//!
//! - [`ClassAllocator<T>`] hands out objects of one type through an owning handle,
//!   [`ClassBox`], whose `Drop` runs `T`'s destructor and recycles the memory.
//! - Each CPU (on Linux x86-64, through restartable sequences) or each thread (elsewhere,
//!   and wherever rseq cannot be used) keeps freed objects in two *magazines* (Bonwick's
//!   loaded and previous), so the common allocation and free touch no shared cache line,
//!   with no atomic read-modify-write and no lock. Which one is the default, and inlined
//!   into every allocation site, is the build's choice: the `percpu` feature (on by
//!   default) picks per-CPU caches, whose memory follows CPUs rather than threads (see
//!   [`CacheMode`]).
//! - Caches exchange whole magazines with a lock-free *depot*, one CAS per magazine; the
//!   depot holds at most a byte budget of free objects and gives the rest back to the
//!   system allocator. [`ClassAllocator::trim`] releases what it caches.
//!
//! ```
//! use proxalloc::ClassAllocator;
//!
//! #[derive(Default)]
//! struct Request { id: u64, headers: Vec<(String, String)> }
//!
//! static REQUESTS: ClassAllocator<Request> = ClassAllocator::new("requests");
//!
//! let handles: Vec<_> = (0..100).map(|id| REQUESTS.alloc(Request { id, ..Default::default() })).collect();
//! assert_eq!(REQUESTS.stats().live, 100);
//! drop(handles);
//! assert_eq!(REQUESTS.stats().live, 0);
//! ```
//!
//! See `docs/design.md` in the repository for the layers, the ABA scheme and every
//! memory ordering.
#![warn(missing_docs)]
#![cfg_attr(docsrs, feature(doc_cfg))]
// allocator-api2's `nightly` feature makes its `Allocator` the standard library's unstable
// one, which `&Pool` then implements: that needs the feature gate here too. It is a cfg,
// not a feature, so that `--all-features` cannot turn it on: allocator-api2's `nightly`
// breaks hashbrown (which dropped support for it), so a graph with both fails to build.
// A nightly user who wants `std`'s `Allocator` enables allocator-api2's `nightly` in their
// own Cargo.toml and builds with `RUSTFLAGS="--cfg proxalloc_nightly"` (docs/tuning.md).
#![cfg_attr(proxalloc_nightly, feature(allocator_api))]
#![cfg_attr(proxalloc_loom, allow(dead_code, unreachable_pub))]

#[cfg(all(feature = "bytes", not(proxalloc_loom)))]
mod buffer;
mod class;
mod config;
mod core;
mod debug;
mod error;
mod pool;
mod registry;
mod rows;
pub mod stats;
mod sync;

#[cfg(all(feature = "bytes", not(proxalloc_loom)))]
#[cfg_attr(docsrs, doc(cfg(feature = "bytes")))]
pub use buffer::{
    BufferAllocator, BufferError, BufferStats, LeakLevel, LiveBuffer, PooledBuf, BUFFER_ALIGN,
    BUFFER_CLASSES,
};
pub use class::owned::Owned;
pub use class::recycle::{OwnedRecycled, Recycle, Recycled, RecyclingAllocator};
pub use class::thin::{StaticClass, Thin};
pub use class::{ClassAllocator, ClassBox, LocalCache};
pub use config::{CacheMode, Config, BYPASS_ENV, MAX_MAGAZINE_SIZE};
pub use debug::POISON;
pub use error::AllocError;
pub use pool::{
    BlockAllocator, BlockSource, CleanupKey, Pool, PoolStats, PoolVec, PoolWriter, RawBlock,
    SubPool, BLOCK_ALIGN, BLOCK_CLASSES, DEFAULT_MAX_FREE,
};
pub use rows::{BlockSourceStats, Stats};

/// The allocator-api2 crate (version 0.2) whose [`Allocator`](allocator_api2::alloc::Allocator)
/// `&Pool` implements: collections from it, or from crates built on it such as hashbrown
/// (0.15 to 0.17), live in a [`Pool`] through `new_in(&pool)`. Name it through this path
/// (`proxalloc::allocator_api2::vec::Vec`) or depend on `allocator-api2 = "0.2"`: a
/// program that depends on another version (`cargo add allocator-api2` picks 0.4) has two
/// distinct `Allocator` traits, and `&Pool` implements 0.4's only with the
/// `allocator-api2-04` feature.
///
/// ```
/// use proxalloc::allocator_api2::vec::Vec;
/// let pool = proxalloc::Pool::new();
/// let mut v: Vec<u32, &proxalloc::Pool> = Vec::new_in(&pool);
/// v.extend([1, 2, 3]);
/// assert_eq!(v.iter().sum::<u32>(), 6);
/// ```
pub use allocator_api2;

/// allocator-api2 version 0.4 (feature `allocator-api2-04`), whose
/// [`Allocator`](allocator_api2_04::alloc::Allocator) `&Pool` implements too, for
/// programs whose collections are built on that version.
///
/// ```
/// use proxalloc::allocator_api2_04::vec::Vec;
/// let pool = proxalloc::Pool::new();
/// let mut v = Vec::new_in(&pool);
/// v.extend_from_slice(b"0.4");
/// assert_eq!(&v[..], b"0.4");
/// ```
#[cfg(feature = "allocator-api2-04")]
pub use allocator_api2_04;

/// Gives every cached object of every allocator in the process back to the system
/// allocator: each allocator's depot, every CPU's caches of per-CPU allocators, pool
/// block sources' large blocks, the calling thread's caches and what every other
/// thread's caches grew to (their stashes) now, and returns those bytes. Other threads'
/// two magazines per allocator belong to their threads, which alone may touch them:
/// `trim_all` asks each of them to flush, and each does at its next slow path on any
/// allocator, when it leaves a `with_local` call, or when it exits; a later `trim_all`
/// then returns what they gave to the depots. Then, with glibc, it asks glibc for its
/// free memory back (`malloc_trim`), always, and before the trims too if proxalloc gave
/// glibc anything since its last request: what proxalloc gave glibc before (spills over
/// a depot budget, small trims) stays in glibc's bins until someone asks. See
/// `docs/tuning.md` for what can and cannot come back, and
/// [`stats::system_trims`] for the requests.
///
/// ```
/// use proxalloc::ClassAllocator;
/// static BUFS: ClassAllocator<[u8; 512]> = ClassAllocator::new("trim-all-bufs");
/// drop((0..1000).map(|_| BUFS.alloc([0; 512])).collect::<Vec<_>>());
/// assert!(proxalloc::trim_all() >= 1000 * 512);
/// assert_eq!(BUFS.stats().reserved_bytes(), 0);
/// ```
pub fn trim_all() -> usize {
    registry::trim_all()
}

/// Gives back what went unused since the previous call, for every allocator in the
/// process, and returns those bytes: the magazines at the bottom of each depot that no
/// thread took in the interval (a depot's working set is what its refills reached), the
/// stash of every thread cache that made no allocation or free in the interval (whose
/// thread is asked to flush its two magazines, as [`trim_all`] asks), everything an
/// allocator caches if it made no operation at all, and a pool block source's large
/// blocks if none was taken. The first call only starts the interval, and a call less
/// than a millisecond after the previous one does nothing (in an interval that short
/// every cache would look idle).
///
/// Call it periodically from one maintenance task (every few seconds, say; the interval
/// is per allocator and shared by every caller, this function's and the allocators'
/// own `trim_idle`, so two tasks calling it would shorten each other's intervals): an
/// idle allocator is emptied over two calls, and an idle thread's stash with it (its two
/// magazines per allocator come back when it next runs, as after `trim_all`), while a
/// busy one keeps what it used, so memory comes back after a burst without the refills
/// that a periodic `trim_all` would cost (Bonwick's depot working set, which his
/// magazine allocator reaps from on memory pressure). With glibc, it then asks glibc for
/// its free memory back (`malloc_trim`) if proxalloc has given glibc 1 MiB or more since
/// its last request, by this release or by spills over depot budgets since.
///
/// ```
/// use proxalloc::{ClassAllocator, Config};
/// static QUIET: ClassAllocator<[u8; 256]> =
///     ClassAllocator::with_config("doc-trim-idle", Config::new().thread_cache_growth_bytes(0));
/// drop((0..1000).map(|_| QUIET.alloc([0; 256])).collect::<Vec<_>>());
/// let cached = QUIET.stats().cached_bytes();
/// proxalloc::trim_idle(); // starts the interval
/// std::thread::sleep(std::time::Duration::from_millis(5)); // nothing uses QUIET meanwhile
/// assert!(proxalloc::trim_idle() >= cached as usize);
/// assert_eq!(QUIET.stats().reserved_bytes(), 0);
/// ```
pub fn trim_idle() -> usize {
    registry::trim_idle()
}

/// Sets what proxalloc calls when it asks the global allocator for its free memory back
/// ([`stats::system_trims`] says when: every [`trim_all`], other trims once it has given
/// the global allocator 1 MiB since the last request). `None`, the default, is glibc's
/// `malloc_trim(0)` on Linux with glibc and nothing elsewhere, which does nothing for
/// memory that went to another global allocator: a program that installs one sets that
/// allocator's own call, such as jemalloc's `arena.<i>.purge` (every arena's free pages
/// back to the OS; not its thread caches) or mimalloc's `mi_collect(true)` (the calling
/// thread's heap, and the free memory of mimalloc's arenas, but not pages that other
/// threads' heaps hold: those go back on mimalloc's own purge schedule). glibc's
/// `malloc_trim` still matters there for what C libraries allocate: call it from the
/// hook too if so. docs/tuning.md has both calls.
///
/// The hook runs on the thread that trims (or drops an allocator), with no lock of
/// proxalloc held, so it may allocate; several threads may run it at once, and a request
/// that began before `set_system_trim` returned may still call the previous hook. A
/// request the hook makes itself (a trim inside it) is skipped, not counted, its bytes
/// kept for the next request; a hook must not wait for a trim on another thread, which
/// would call it again. A panic in it is caught and discarded.
///
/// ```
/// use std::sync::atomic::{AtomicUsize, Ordering};
/// static CALLS: AtomicUsize = AtomicUsize::new(0);
/// // With mimalloc installed, this would call `libmimalloc_sys::mi_collect(true)`.
/// proxalloc::set_system_trim(Some(|| {
///     CALLS.fetch_add(1, Ordering::Relaxed);
/// }));
/// proxalloc::trim_all(); // always asks
/// assert!(CALLS.load(Ordering::Relaxed) >= 1);
/// proxalloc::set_system_trim(None); // glibc's malloc_trim again
/// ```
pub fn set_system_trim(trim: Option<fn()>) {
    crate::core::backing::set_system_trim(trim);
}

/// Sets the process-wide thread-cache budget: the bytes by which all threads' caches,
/// over all allocators, may grow beyond their first two magazines (default 32 MiB). A
/// thread cache grows (see [`Config::thread_cache_growth_bytes`]) only with a grant from
/// this budget, and gives its grant back when it goes idle, is flushed by [`trim_all`]
/// (which takes other threads' grown parts at once) or exits, so what thread caches
/// hold stays bounded whatever the number of threads. Lowering it takes effect as
/// grants come back.
///
/// ```
/// proxalloc::set_thread_cache_budget(8 << 20);
/// assert_eq!(proxalloc::thread_cache_budget().1, 8 << 20);
/// ```
pub fn set_thread_cache_budget(bytes: usize) {
    crate::core::budget::thread_cache_budget().set_limit(bytes);
}

/// The process-wide thread-cache budget: `(bytes granted to thread caches now, limit)`.
///
/// ```
/// let (granted, limit) = proxalloc::thread_cache_budget();
/// assert_eq!(limit, 32 << 20); // the default, unless set_thread_cache_budget changed it
/// assert!(granted <= limit);
/// ```
pub fn thread_cache_budget() -> (usize, usize) {
    let b = crate::core::budget::thread_cache_budget();
    (b.used(), b.limit())
}

/// The README's Rust examples, run as doc tests so they stay true.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
pub struct ReadmeDoctests;
