//! The untyped core: everything between a typed front end and the system allocator.
//!
//! From the fast path outwards:
//! - [`table`]: each thread's table of caches, indexed by allocator; registration, the
//!   idle collector, flush sweeps and the thread-exit teardown.
//! - [`thread_cache`]: one thread's cache for one allocator (loaded and previous
//!   magazines, the stash it grows into, a capped allocator's permits).
//! - [`engine`]: one allocator's untyped state and the magazine exchange rules (the
//!   slow paths); [`admin`]: what other threads do to it (stats, trim, shutdown).
//! - [`depot`]: the lock-free stacks of full and empty magazines shared by all threads.
//! - [`magazine`]: magazine descriptors and their slot arrays.
//! - [`budget`]: byte budgets (a depot's, the process-wide thread-cache budget).
//! - [`backing`]: where object memory comes from and goes back to.
//! - [`ids`]: table indices and instance numbers.

pub(crate) mod admin;
pub(crate) mod backing;
pub(crate) mod budget;
pub(crate) mod cache;
pub(crate) mod counters;
pub(crate) mod depot;
pub(crate) mod engine;
pub(crate) mod exchange;
pub(crate) mod idle;
pub(crate) mod ids;
pub(crate) mod magazine;
pub(crate) mod percpu;
pub(crate) mod rseq;
pub(crate) mod stack;
pub(crate) mod table;
pub(crate) mod thread_cache;

#[cfg(all(test, proxalloc_loom))]
mod tests;
