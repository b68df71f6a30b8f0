//! The process-wide list of allocators, for [`stats::all`](crate::stats::all),
//! [`stats::dump`](crate::stats::dump) and [`trim_all`](crate::trim_all).
//!
//! Each allocator's engine registers here when it is first used and is dropped from the
//! list once its allocator is gone. The list holds weak references, so it never keeps an
//! engine alive; it is touched only on those rare events and when someone reads it.

use crate::rows::BlockSourceStats;
use crate::rows::Stats;

/// Something that can report stats and give memory back: a class allocator's engine, or
/// a pool block source's large blocks.
pub(crate) trait Registered: Send + Sync {
    /// Its stats, or `None` once its owner is gone.
    fn stats(&self) -> Option<Stats>;
    /// Gives back what it caches (in the depot, and in the calling thread's cache);
    /// returns the bytes released. Asks nothing of the OS: `trim_all` does, once.
    fn trim(&self) -> usize;
    /// Gives back what went unused since the previous call (see
    /// [`trim_idle`](crate::trim_idle)); returns the bytes released. Asks nothing of the
    /// OS either.
    fn trim_idle(&self) -> usize;
    /// The numbers of the block source it belongs to, if it is a source's large blocks
    /// (registered once per source).
    fn source(&self) -> Option<BlockSourceStats> {
        None
    }
}

#[cfg(not(proxalloc_loom))]
mod imp {
    use std::sync::{Arc, Mutex, MutexGuard, Weak};

    use super::Registered;

    /// The entries, and how many walks by index are under way: while one is, a
    /// registration takes a dead entry's place or appends, and drops no entry, so that
    /// no live entry moves to an index the walk has passed.
    struct List {
        entries: Vec<Weak<dyn Registered>>,
        walks: usize,
    }

    static REGISTERED: Mutex<List> = Mutex::new(List {
        entries: Vec::new(),
        walks: 0,
    });

    fn list() -> MutexGuard<'static, List> {
        REGISTERED.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub(crate) fn register<R: Registered + 'static>(source: &Arc<R>) {
        let weak: Weak<dyn Registered> = Arc::downgrade(source) as Weak<R>;
        let mut list = list();
        if list.walks == 0 {
            list.entries.retain(|w| w.strong_count() > 0);
        } else if let Some(dead) = list.entries.iter_mut().find(|w| w.strong_count() == 0) {
            // Out of registration order, but nothing moves, and no growth while memory
            // is short (a walk by index means an allocation failed).
            *dead = weak;
            return;
        }
        list.entries.push(weak);
    }

    /// The registered allocators and block sources that still exist, in registration order.
    pub(crate) fn registered() -> Vec<Arc<dyn Registered>> {
        list().entries.iter().filter_map(Weak::upgrade).collect()
    }

    /// A walk by index under way, counted in the list until dropped (also when `f`
    /// unwinds).
    struct Walk;

    impl Walk {
        fn start() -> Walk {
            list().walks += 1;
            Walk
        }
    }

    impl Drop for Walk {
        fn drop(&mut self) {
            list().walks -= 1;
        }
    }

    /// Runs `f` on every registered entry that still exists, with no lock held (`f` may
    /// run user code that registers allocators), and without allocating when the
    /// global allocator fails: then the list is walked one entry at a time. Entries
    /// registered meanwhile (by another thread or by `f`'s own user code) take a dead
    /// entry's place or are appended, so no entry moves behind the walk; a new one in a
    /// dead entry's place behind it is not visited.
    pub(crate) fn for_each_registered(mut f: impl FnMut(&dyn Registered)) {
        let collected = {
            let list = list();
            let mut v = Vec::new();
            v.try_reserve_exact(list.entries.len()).ok().map(|()| {
                v.extend(list.entries.iter().filter_map(Weak::upgrade));
                v
            })
        };
        if let Some(entries) = collected {
            entries.iter().for_each(|e| f(&**e));
            return;
        }
        let _walk = Walk::start();
        for i in 0.. {
            let entry = match list().entries.get(i) {
                Some(w) => w.upgrade(),
                None => return,
            };
            if let Some(e) = entry {
                f(&*e);
            }
        }
    }
}

/// Under loom the models build allocators as plain values; nothing is listed.
#[cfg(proxalloc_loom)]
mod imp {
    use super::Registered;
    use crate::sync::Arc;

    pub(crate) fn register<R: Registered + 'static>(_: &Arc<R>) {}

    pub(crate) fn registered() -> Vec<Arc<dyn Registered>> {
        Vec::new()
    }

    pub(crate) fn for_each_registered(_: impl FnMut(&dyn Registered)) {}
}

pub(crate) use imp::{for_each_registered, register, registered};

/// Stats of every live allocator, in registration order.
pub(crate) fn all_stats() -> Vec<Stats> {
    registered().iter().filter_map(|s| s.stats()).collect()
}

/// One registered entry's stats with its bytes, and its source's numbers if it is a
/// block source's large blocks: that row counts blocks of many sizes (object size 0),
/// so its bytes are the source's, not `Stats::reserved_bytes`.
pub(crate) struct Measured {
    pub(crate) stats: Stats,
    pub(crate) reserved_bytes: u64,
    #[cfg_attr(not(feature = "metrics"), allow(dead_code))] // the metrics exporter's
    pub(crate) cached_bytes: u64,
    #[cfg_attr(not(feature = "metrics"), allow(dead_code))] // as `cached_bytes`
    pub(crate) source: Option<BlockSourceStats>,
}

/// Every live entry measured, in registration order (no lock held while each reads
/// itself).
pub(crate) fn all_measured() -> Vec<Measured> {
    registered()
        .iter()
        .filter_map(|entry| {
            let stats = entry.stats()?;
            let source = entry.source();
            let (reserved_bytes, cached_bytes) = match &source {
                Some(s) => (
                    s.large_live_bytes + s.large_cached_bytes,
                    s.large_cached_bytes,
                ),
                None => (stats.reserved_bytes(), stats.cached_bytes()),
            };
            Some(Measured {
                stats,
                reserved_bytes,
                cached_bytes,
                source,
            })
        })
        .collect()
}

/// The numbers of every live block source, in registration order.
pub(crate) fn all_sources() -> Vec<BlockSourceStats> {
    registered().iter().filter_map(|s| s.source()).collect()
}

/// Trims every live allocator, then asks the OS for the system allocator's free memory;
/// returns the bytes released. Needs no memory: a trim is what a program calls when
/// memory runs out.
pub(crate) fn trim_all() -> usize {
    trim_fully(|f| for_each_registered(f))
}

/// Trims (fully) every entry that `walk` passes to its callback, then asks the OS for the
/// system allocator's free memory whatever they released; returns the bytes released.
///
/// The last request is unconditional ([`trim_each`] asks only past a threshold) because
/// `trim_all` is the call that asks for everything. The first, before the trims, is for
/// what proxalloc gave the system allocator since its last request (spills over a depot
/// budget, small trims), if anything: asked for in two steps, glibc keeps less resident
/// than when the trims' release joins those bytes in its bins first (measured with idle
/// threads after their bursts: `docs/benchmarks.md`, "Two requests in `trim_all`").
fn trim_fully(walk: impl FnOnce(&mut dyn FnMut(&dyn Registered))) -> usize {
    crate::core::backing::release_any_to_os();
    let mut released = 0;
    walk(&mut |s| released += s.trim());
    crate::core::backing::ask_os_for_memory_back();
    released
}

/// Gives back what every live allocator left unused since the previous call; returns the
/// bytes released. Needs no memory, as `trim_all`.
pub(crate) fn trim_idle() -> usize {
    trim_each(|f| for_each_registered(f), |s| s.trim_idle())
}

/// Trims (with `trim`) every entry that `walk` passes to its callback, then asks the OS
/// once, if what was given to the system allocator since the last request (their release
/// included) reaches the threshold; returns the bytes released. (`trim_idle`, a buffer
/// allocator's trims, and a block source's own trims over its classes and large blocks.)
pub(crate) fn trim_each(
    walk: impl FnOnce(&mut dyn FnMut(&dyn Registered)),
    trim: impl Fn(&dyn Registered) -> usize,
) -> usize {
    let mut released = 0;
    walk(&mut |s| released += trim(s));
    crate::core::backing::release_to_os();
    released
}

#[cfg(all(test, not(proxalloc_loom)))]
#[path = "tests/registry.rs"]
mod tests;
