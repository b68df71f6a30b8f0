//! The buffers above the largest class: their counters and their registry row.

use crate::registry::Registered;
use crate::rows::Stats;
use std::sync::atomic::{AtomicU64, Ordering};

/// Counters of the buffers above the largest class, which come from the global
/// allocator; registered (as the `buffers-oversize` row) at the first such buffer.
pub(super) struct Oversize {
    pub(super) id: u64,
    pub(super) allocs: AtomicU64,
    pub(super) frees: AtomicU64,
    pub(super) live_bytes: AtomicU64,
}

impl Oversize {
    /// Counters at zero (`id` 0: a row for an allocator that had no oversize buffer).
    pub(super) const fn new(id: u64) -> Self {
        Oversize {
            id,
            allocs: AtomicU64::new(0),
            frees: AtomicU64::new(0),
            live_bytes: AtomicU64::new(0),
        }
    }

    pub(super) fn stats(&self) -> Stats {
        // Frees first, with Acquire against the free's Release: the buffer's alloc
        // happened before its free, so a free seen here is never counted without its
        // alloc, and `live` never reads low.
        let frees = self.frees.load(Ordering::Acquire);
        let allocs = self.allocs.load(Ordering::Relaxed);
        Stats {
            name: "buffers-oversize",
            id: self.id,
            // Oversize buffers vary in size: the row counts buffers (their bytes are
            // `BufferStats::oversize_live_bytes`).
            object_size: 0,
            allocs,
            frees,
            live: allocs.saturating_sub(frees),
            backing_allocs: allocs,
            backing_frees: frees,
            mode: crate::CacheMode::Bypass,
            ..Stats::default()
        }
    }
}

impl Registered for Oversize {
    fn stats(&self) -> Option<Stats> {
        Some(Oversize::stats(self))
    }
    fn trim(&self) -> usize {
        0
    }
    fn trim_idle(&self) -> usize {
        0
    }
}
