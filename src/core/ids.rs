//! Numbers that name an allocator's engine: a dense *table index* (its entry in every
//! thread's cache table), reused after the allocator is dropped, and a process-unique
//! *instance* number that tells the successive owners of one index apart.

use crate::sync::process::{AtomicU64, Mutex};
use crate::sync::Ordering;

struct FreeIndices {
    next: u32,
    free: Vec<u32>,
}

#[cfg(not(proxalloc_loom))]
static INDICES: Mutex<FreeIndices> = Mutex::new(FreeIndices {
    next: 0,
    free: Vec::new(),
});

// Under loom, one per model execution (still not modelled): a model's engines then get
// the same indices in every execution, whatever other models run meanwhile, so a thread
// sweeps its caches in the same order each time (loom rejects executions that differ).
#[cfg(proxalloc_loom)]
loom::lazy_static! {
    static ref INDICES: Mutex<FreeIndices> = Mutex::new(FreeIndices {
        next: 0,
        free: Vec::new(),
    });
}
static INSTANCES: AtomicU64 = AtomicU64::new(1);

/// Instance number of an unused thread-cache table entry (engines are numbered from 1).
pub(crate) const EMPTY: u64 = 0;

/// A number unique in the process (never 0), for engines and other stats sources.
pub(crate) fn fresh_instance() -> u64 {
    INSTANCES.fetch_add(1, Ordering::Relaxed)
}

/// A free table index and a fresh instance number (never 0, which marks an empty
/// entry).
pub(crate) fn claim() -> (u32, u64) {
    let instance = fresh_instance();
    let mut indices = INDICES.lock().unwrap_or_else(|e| e.into_inner());
    let index = match indices.free.pop() {
        Some(i) => i,
        None => {
            indices.next = indices
                .next
                .checked_add(1)
                .expect("too many live allocators");
            indices.next - 1
        }
    };
    (index, instance)
}

/// Returns a table index for reuse.
pub(crate) fn release(index: u32) {
    let mut indices = INDICES.lock().unwrap_or_else(|e| e.into_inner());
    indices.free.push(index);
}
