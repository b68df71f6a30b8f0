//! Misuse detection, compiled in with `debug_assertions` or the `debug-checks` feature
//! (and out of release builds otherwise, so the fast paths do not change).
//!
//! Every object handed out is recorded in a process-wide table with the allocator it came
//! from. A free of an address the table does not hold is a double free (or a pointer the
//! allocator never gave out); a free of an address recorded for another allocator is a
//! free into the wrong allocator. Both panic with a message naming the allocator and the
//! address, before the allocator's state is touched. Freed objects are poisoned (filled
//! with [`POISON`]) so that a use after free reads an obviously wrong value.
//!
//! These are safety nets for code that uses the `unsafe` escape hatches
//! (`ClassBox::from_raw`); safe code cannot free twice.

use std::collections::HashMap;
use std::sync::Mutex;

/// Whether the checks are compiled in. Not under Miri, which detects double frees and
/// uses after free itself, and for which the global table would only be slow.
pub(crate) const ENABLED: bool = cfg!(all(
    any(debug_assertions, feature = "debug-checks"),
    not(miri)
));

/// The byte freed objects are filled with.
pub const POISON: u8 = 0xA5;

/// Live objects: address → (allocator instance, allocator name).
static LIVE: Mutex<Option<HashMap<usize, (u64, &'static str)>>> = Mutex::new(None);

fn with_live<R>(f: impl FnOnce(&mut HashMap<usize, (u64, &'static str)>) -> R) -> R {
    let mut guard = LIVE.lock().unwrap_or_else(|e| e.into_inner());
    f(guard.get_or_insert_with(HashMap::new))
}

/// Records that allocator `(instance, name)` handed out the object at `addr`.
/// Zero-sized objects share addresses and are not tracked.
pub(crate) fn on_alloc(addr: usize, size: usize, instance: u64, name: &'static str) {
    if size == 0 {
        return;
    }
    let previous = with_live(|live| live.insert(addr, (instance, name)));
    if let Some((_, owner)) = previous {
        panic!(
            "proxalloc: allocator {name:?} handed out {addr:#x}, which allocator {owner:?} \
             still considers live (memory corrupted?)"
        );
    }
}

/// Checks and forgets the object at `addr`, freed into allocator `(instance, name)`;
/// panics on a double free or a free into the wrong allocator.
pub(crate) fn on_free(addr: usize, size: usize, instance: u64, name: &'static str) {
    if size == 0 {
        return;
    }
    let outcome = with_live(|live| match live.get(&addr) {
        None => Err(None),
        Some(&(owner_instance, owner)) if owner_instance != instance => Err(Some(owner)),
        Some(_) => {
            live.remove(&addr);
            Ok(())
        }
    });
    match outcome {
        Ok(()) => {}
        Err(None) => panic!(
            "proxalloc: double free of {addr:#x} into allocator {name:?} (or a pointer it \
             never handed out)"
        ),
        Err(Some(owner)) => panic!(
            "proxalloc: object {addr:#x} of allocator {owner:?} freed into allocator {name:?}"
        ),
    }
}
