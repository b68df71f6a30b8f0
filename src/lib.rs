//! # proxalloc
//!
//! A per-thread caching object allocator for servers that allocate and free the same few
//! object types millions of times a second.
//!
//! - [`ClassAllocator<T>`] hands out objects of one type through an owning handle,
//!   [`Pooled`], whose `Drop` runs `T`'s destructor and recycles the memory.
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
#![cfg_attr(loom, allow(dead_code, unreachable_pub))]

mod backing;
mod cache;
mod class;
mod config;
mod depot;
mod engine;
mod magazine;
mod stats;
mod sync;

pub use class::{AllocError, ClassAllocator, LocalCache, Pooled};
pub use config::{CacheMode, Config, BYPASS_ENV, MAX_MAGAZINE_SIZE};
pub use stats::Stats;

/// Internals for the `loom-tests` crate. Not API: present only under `--cfg loom`.
#[cfg(loom)]
#[doc(hidden)]
pub mod __loom {
    pub use crate::backing::Backing;
    pub use crate::depot::{for_each_in_chain, Depot, MagazineStack};
    pub use crate::magazine::{Magazine, MagazineTable, NIL};
}
