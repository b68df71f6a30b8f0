//! loom models of the core, built only by `--cfg proxalloc_loom` test builds (see
//! `.ci/run`; the `loom` profile keeps debug assertions on, which some models rely on).
//!
//! - [`loom_stack`]: the magazine stack (the depot's), with must-fail narrow generations.
//! - [`loom_class_alloc`]: the whole allocator: magazine exchange, the depot budget,
//!   trim, thread exit, cross-thread frees, the allocator's drop, the engine's
//!   publication.
//! - [`loom_admin`]: administrators (`trim_all`, `stats`, shutdown) meeting owners.
//! - [`loom_lifecycle`]: what owners must do for administrators: honour flush requests,
//!   retire a dead allocator's cache, run the idle collector, hand back a stash and
//!   spare empties after the allocator died, keep the stash within its grant.
//! - [`loom_capped`]: `Config::max_live`'s permits.
//!
//! Magazines hold one or two objects, so a handful of operations reach every slow path.
//! Object memory comes from `loom::alloc`, so an object that is never returned to the
//! backing allocator fails a model as a leak, and one returned twice fails it too.

mod loom_admin;
mod loom_capped;
mod loom_class_alloc;
mod loom_lifecycle;
mod loom_stack;

use std::ptr::NonNull;

use loom::sync::Arc;
use loom::thread;

use super::budget;
use super::engine::Engine;
use super::magazine::cached_bytes;
use super::table::{self, Lookup};
use super::thread_cache::Holdings;
use crate::registry::Registered;
use crate::{CacheMode, ClassAllocator, Config, Stats};

type Alloc = ClassAllocator<u64>;

/// An allocator of `u64`s with `magazine`-object magazines and a depot of
/// `depot_objects`. Its engine is created here, before any thread starts: the race to
/// create it is modelled on its own (`loom_class_alloc::first_use_*`), not in every
/// model.
fn allocator(magazine: usize, depot_objects: usize) -> Alloc {
    let cfg = Config::new()
        .magazine_size(magazine)
        .depot_bytes(depot_objects * cached_bytes(8));
    let a = ClassAllocator::with_config("loom", cfg);
    a.mode();
    a
}

/// An allocator that caches nothing: each allocation is a slow path (and so a point
/// where the thread sweeps its caches), with no magazine traffic to explore.
fn bypass_allocator() -> Alloc {
    let a = ClassAllocator::with_config("loom-bypass", Config::new().mode(CacheMode::Bypass));
    a.mode();
    a
}

/// Every object is in exactly one place.
fn assert_conserved(s: &Stats) {
    assert!(s.is_consistent(), "objects lost or counted twice: {s}");
}

/// Allocates `n` objects, checks none is handed out twice, frees them.
fn churn(a: &Alloc, n: u64) {
    let v: Vec<_> = (0..n).map(|i| a.alloc(i)).collect();
    for (i, x) in v.iter().enumerate() {
        assert_eq!(**x, i as u64, "an object was handed out twice");
    }
}

/// Drops the allocator (the last reference) so its shutdown runs inside the model.
fn finish(a: Arc<Alloc>) {
    let Ok(a) = Arc::try_unwrap(a) else {
        panic!("a thread kept the allocator")
    };
    drop(a);
}

fn spawn_with(a: &Arc<Alloc>, f: impl FnOnce(&Alloc) + Send + 'static) -> thread::JoinHandle<()> {
    let a = Arc::clone(a);
    thread::spawn(move || f(&a))
}

/// loom's `join` returns before the joined thread's thread-local destructors run (std's
/// waits for them): waits until no thread cache of `a` is left. Each yield lets an
/// exiting thread run, so a bounded wait suffices.
fn wait_for_exits(a: &Alloc) {
    let mut waits = 0;
    while a.stats().threads > 0 {
        waits += 1;
        assert!(waits < 50, "an exiting thread's cache was never retired");
        thread::yield_now();
    }
}

/// The engine's table index and instance number: how a thread finds its cache.
fn key(e: &Engine) -> (u32, u64) {
    (e.index(), e.instance())
}

/// What this thread's cache of the allocator `key` holds (`None`: it has none).
fn holdings(key: (u32, u64)) -> Option<Holdings> {
    match table::lookup(key.0, key.1) {
        Lookup::Cache(owner) => Some(owner.holdings()),
        Lookup::Unregistered | Lookup::TornDown => None,
    }
}

/// Bytes granted to thread caches' stashes, all threads together (per model execution).
fn granted() -> usize {
    budget::thread_cache_budget().used()
}

/// What one full magazine of `a` is charged to a stash's grant.
fn magazine_bytes(a: &Alloc) -> usize {
    a.engine_arc().magazine_bytes
}

/// A raw object pointer that may cross threads (the object it points to is `Send`).
struct SendPtr(NonNull<u64>);
// SAFETY: it points to a `u64` owned by whoever holds the `SendPtr`.
unsafe impl Send for SendPtr {}

/// An allocator as the process-wide registry holds it (`stats::all`, `trim_all`): the
/// engine, which the registry reaches without the allocator. (Under loom the registry
/// itself lists nothing.)
struct Admin(Arc<Engine>);

impl Admin {
    fn of(a: &Alloc) -> Self {
        Admin(a.engine_arc())
    }

    /// What `trim_all` does to this allocator.
    fn trim(&self) -> usize {
        Registered::trim(&*self.0)
    }

    /// What `trim_idle` does to this allocator.
    fn trim_idle(&self) -> usize {
        Registered::trim_idle(&*self.0)
    }

    /// What `stats::all` reads of this allocator.
    fn stats(&self) -> Option<Stats> {
        Registered::stats(&*self.0)
    }
}

/// Sets the idle collector's period for the rest of the model (restored on drop).
struct GcPeriod(u32);

impl GcPeriod {
    fn set(period: u32) -> Self {
        GcPeriod(table::loom_hooks::GC_PERIOD.with(|p| p.replace(period)))
    }
}

impl Drop for GcPeriod {
    fn drop(&mut self) {
        table::loom_hooks::GC_PERIOD.with(|p| p.set(self.0));
    }
}

/// Some models rely on the crate's debug assertions (an empty magazine is never evicted;
/// a stash stays within its grant): build them with `--profile loom`, as `.ci/run` does.
#[test]
#[allow(clippy::assertions_on_constants)] // a failing test, not a failed build, says why
fn models_are_built_with_debug_assertions() {
    assert!(
        cfg!(debug_assertions),
        "build the loom models with `--profile loom` (or `-C debug-assertions`)"
    );
}
