//! Byte budgets for cached free memory: one depot's (a class allocator's), one shared by
//! several depots (the block classes of a pool block source share one `max_free`), and
//! the process-wide thread-cache budget that every thread's stash is granted from.

use crossbeam_utils::CachePadded;

use crate::sync::{const_fn, AtomicUsize, Ordering};

/// Bytes of free memory that may be cached, and how many are, on a cache line of its
/// own: a budget that several threads' depots share (a block source's `max_free`, the
/// process-wide thread-cache budget). Its counting is [`BudgetCount`]'s, which a depot
/// with a budget of its own keeps on its stacks' line instead (see `Depot`).
#[derive(Debug)]
pub struct ByteBudget(CachePadded<BudgetCount>);

impl ByteBudget {
    const_fn! {
        /// A budget of `limit` bytes.
        pub fn new(limit: usize) -> Self {
            ByteBudget(CachePadded::new(BudgetCount::new(limit)))
        }
    }
}

impl std::ops::Deref for ByteBudget {
    type Target = BudgetCount;
    fn deref(&self) -> &BudgetCount {
        &self.0
    }
}

/// A byte budget's two words, with no padding: the limit and how many bytes are claimed.
#[derive(Debug)]
pub struct BudgetCount {
    used: AtomicUsize,
    limit: AtomicUsize,
}

impl BudgetCount {
    const_fn! {
        /// A budget of `limit` bytes.
        pub fn new(limit: usize) -> Self {
            BudgetCount {
                used: AtomicUsize::new(0),
                limit: AtomicUsize::new(limit),
            }
        }
    }

    /// Changes the limit. Bytes claimed beyond a lowered limit stay claimed until
    /// released; nothing new is claimed until the count is back under it.
    pub fn set_limit(&self, limit: usize) {
        self.limit.store(limit, Ordering::Relaxed);
    }

    /// Claims `bytes`; false (claiming nothing) if that would pass the limit.
    pub fn reserve(&self, bytes: usize) -> bool {
        bytes == 0 || self.reserve_up_to(1, bytes) == 1
    }

    /// Claims room for as many of `n` objects of `size` bytes as fit (all of them when
    /// `size` is 0) and returns that number. The count is a plain number (nothing is
    /// published through it), so `Relaxed` suffices.
    pub fn reserve_up_to(&self, n: usize, size: usize) -> usize {
        if size == 0 {
            return n;
        }
        let mut cur = self.used.load(Ordering::Relaxed);
        loop {
            let k = n.min(self.limit().saturating_sub(cur) / size);
            if k == 0 {
                return 0;
            }
            match self.used.compare_exchange_weak(
                cur,
                cur + k * size,
                Ordering::Relaxed,
                Ordering::Relaxed,
            ) {
                Ok(_) => return k,
                Err(now) => cur = now,
            }
        }
    }

    /// Gives back `bytes` claimed earlier.
    pub fn release(&self, bytes: usize) {
        if bytes > 0 {
            self.used.fetch_sub(bytes, Ordering::Relaxed);
        }
    }

    /// Bytes claimed now.
    pub fn used(&self) -> usize {
        self.used.load(Ordering::Relaxed)
    }

    /// The limit in bytes.
    pub fn limit(&self) -> usize {
        self.limit.load(Ordering::Relaxed)
    }
}

/// Default of the process-wide thread-cache budget: 32 MiB.
pub(crate) const DEFAULT_THREAD_CACHE_BUDGET: usize = 32 << 20;

/// Bytes that thread caches may grow by, all threads and allocators together (each
/// cache holds a grant from it for its stash).
#[cfg(not(proxalloc_loom))]
static THREAD_CACHE_BUDGET: ByteBudget = ByteBudget::new(DEFAULT_THREAD_CACHE_BUDGET);

// Under loom, one per model execution (a process-wide value would carry one
// execution's grants into the next, which loom rejects as non-determinism).
#[cfg(proxalloc_loom)]
loom::lazy_static! {
    static ref THREAD_CACHE_BUDGET: ByteBudget = ByteBudget::new(DEFAULT_THREAD_CACHE_BUDGET);
}

/// The process-wide thread-cache budget.
pub(crate) fn thread_cache_budget() -> &'static ByteBudget {
    &THREAD_CACHE_BUDGET
}

/// Gives a stash's grant back to the process-wide budget.
pub(crate) fn return_grant(bytes: usize) {
    // Most caches never grow: leave the shared line alone for them (and, under loom,
    // the budget is not reachable from the thread-local destructors at a model's end).
    if bytes > 0 {
        thread_cache_budget().release(bytes);
    }
}
