//! # proxalloc
//!
//! A per-thread caching object allocator for servers that allocate and free the same few
//! object types millions of times a second.
//!
//! - [`ClassAllocator<T>`] hands out objects of one type through an owning handle,
//!   [`ClassBox`], whose `Drop` runs `T`'s destructor and recycles the memory.
//! - Each thread keeps freed objects in two *magazines* (Bonwick's loaded and previous),
//!   so the common allocation and free touch only thread-local memory, with no atomic
//!   read-modify-write and no lock.
//! - Threads exchange whole magazines with a lock-free *depot*, one CAS per magazine; the
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
// allocator-api2's `nightly` makes its `Allocator` the standard library's unstable one,
// which `&Pool` then implements: that needs the feature gate here too.
#![cfg_attr(feature = "nightly", feature(allocator_api))]
#![cfg_attr(proxalloc_loom, allow(dead_code, unreachable_pub))]

mod class;
mod config;
mod core;
mod debug;
mod error;
mod pool;
mod registry;
pub mod stats;
mod sync;

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
pub use stats::Stats;

/// Gives every cached object of every allocator in the process back to the system
/// allocator: each allocator's depot, the calling thread's caches and what every other
/// thread's caches grew to (their stashes) now, and returns those bytes. Other threads'
/// two magazines per allocator belong to their threads, which alone may touch them:
/// `trim_all` asks each of them to flush, and each does at its next slow path on any
/// allocator, when it leaves a `with_local` call, or when it exits; a later `trim_all`
/// then returns what they gave to the depots. See `docs/tuning.md` for what can and
/// cannot come back.
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
