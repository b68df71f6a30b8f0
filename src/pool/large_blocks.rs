//! A source's blocks that no class fits (larger than the largest class, or asked for by
//! size with `BlockSource::alloc_dedicated`): kept in size buckets under a mutex, taken
//! back most recent first, and charged to the source's `max_free` budget. Registered on
//! its own, so `stats::all` shows it and `trim_all` empties it.

use std::alloc::Layout;
use std::collections::BTreeMap;
use std::ptr::NonNull;

use super::{BlockAllocator, RawBlock, BLOCK_ALIGN};
use crate::core::backing::{free_user_block, gave_to_system};
use crate::core::budget::ByteBudget;
use crate::core::idle::IdleWatch;
use crate::registry::Registered;
use crate::rows::BlockSourceStats;
use crate::rows::Stats;
use crate::sync::{self, Arc, Mutex, StatCounter};

/// A cached large block's address.
struct Cached(NonNull<u8>);

// SAFETY: a cached block is plain memory owned by the cache; it moves between threads
// only under the cache's mutex.
unsafe impl Send for Cached {}

/// Cached large blocks: size → blocks, most recently freed last.
#[derive(Default)]
struct LargeBlocks {
    buckets: BTreeMap<usize, Vec<Cached>>,
}

/// The large-block part of a source, registered for stats and `trim_all`.
pub(super) struct Large {
    cache: Mutex<LargeBlocks>,
    budget: Arc<ByteBudget>,
    /// The user's block allocator, or `None` for the global allocator.
    memory: Option<std::sync::Arc<dyn BlockAllocator>>,
    id: u64,
    allocs: StatCounter,
    frees: StatCounter,
    cached_blocks: StatCounter,
    system_allocs: StatCounter,
    system_frees: StatCounter,
    /// Bytes of the blocks handed out and not given back (the row counts blocks only,
    /// as their sizes vary).
    live_bytes: StatCounter,
    /// Bytes of the blocks in the buckets.
    cached_bytes: StatCounter,
    /// The `trim_idle` interval, over `allocs`.
    idle_watch: sync::process::Mutex<IdleWatch>,
}

/// The layout of a large block that was allocated (so its size is known to fit one).
fn large_layout(size: usize) -> Layout {
    Layout::from_size_align(size, BLOCK_ALIGN).expect("an allocated block's layout")
}

impl Large {
    /// The large-block part of a source whose classes share `budget`, registered for
    /// stats and `trim_all`.
    pub(super) fn new(
        budget: Arc<ByteBudget>,
        memory: Option<std::sync::Arc<dyn BlockAllocator>>,
    ) -> Arc<Large> {
        let large = Arc::new(Large {
            cache: Mutex::new(LargeBlocks::default()),
            budget,
            memory,
            id: crate::core::ids::fresh_instance(),
            allocs: StatCounter::new(),
            frees: StatCounter::new(),
            cached_blocks: StatCounter::new(),
            system_allocs: StatCounter::new(),
            system_frees: StatCounter::new(),
            live_bytes: StatCounter::new(),
            cached_bytes: StatCounter::new(),
            idle_watch: sync::process::Mutex::new(IdleWatch::default()),
        });
        #[cfg(not(proxalloc_loom))]
        crate::registry::register(&large);
        large
    }

    /// The `max_free` budget the source's classes and these blocks share.
    pub(super) fn budget(&self) -> &ByteBudget {
        &self.budget
    }

    pub(super) fn alloc(&self, size: usize) -> Option<RawBlock> {
        {
            let mut cache = sync::lock(&self.cache);
            // The smallest cached size that fits and is at most twice the request.
            let hit = cache
                .buckets
                .range_mut(size..=size.saturating_mul(2))
                .find_map(|(&s, list)| list.pop().map(|addr| (s, addr)));
            if let Some((s, Cached(ptr))) = hit {
                if cache.buckets.get(&s).is_some_and(Vec::is_empty) {
                    cache.buckets.remove(&s);
                }
                drop(cache);
                self.uncache(s);
                self.handed_out(s);
                return Some(RawBlock { ptr, size: s });
            }
        }
        // A size no layout can describe is a failed allocation, not a panic (and, like
        // any failure, not counted).
        let layout = Layout::from_size_align(size, BLOCK_ALIGN).ok()?;
        let ptr = self.alloc_memory(layout)?;
        self.handed_out(size);
        self.system_allocs.add_shared(1);
        Some(RawBlock { ptr, size })
    }

    /// # Safety
    /// As for [`BlockSource::free`](super::BlockSource::free).
    pub(super) unsafe fn free(&self, block: RawBlock) {
        self.frees.add_shared(1);
        self.live_bytes.sub_shared(block.size as u64);
        if self.budget.reserve(block.size) {
            self.cached_blocks.add_shared(1);
            self.cached_bytes.add_shared(block.size as u64);
            let mut cache = sync::lock(&self.cache);
            cache
                .buckets
                .entry(block.size)
                .or_default()
                .push(Cached(block.ptr));
        } else {
            // SAFETY: allocated in `alloc` with this layout.
            unsafe { self.free_memory(block.ptr, large_layout(block.size)) };
            self.system_frees.add_shared(1);
        }
    }

    /// Memory for a block of `layout`, from the user's allocator or the global one.
    fn alloc_memory(&self, layout: Layout) -> Option<NonNull<u8>> {
        match &self.memory {
            // SAFETY: non-zero size.
            None => NonNull::new(unsafe { sync::alloc(layout) }),
            Some(m) => m.alloc_block(layout),
        }
    }

    /// Gives back a block's memory.
    ///
    /// # Safety
    /// `p` came from [`alloc_memory`](Self::alloc_memory) with `layout`, and is not used
    /// again.
    unsafe fn free_memory(&self, p: NonNull<u8>, layout: Layout) {
        match &self.memory {
            None => {
                // SAFETY: forwarded from the caller.
                unsafe { sync::dealloc(p.as_ptr(), layout) };
                gave_to_system(layout.size());
            }
            // SAFETY: forwarded from the caller.
            Some(m) => unsafe { free_user_block(&**m, p, layout) },
        }
    }

    /// Accounts for a cached block of `size` bytes leaving the cache.
    fn uncache(&self, size: usize) {
        self.budget.release(size);
        self.cached_blocks.sub_shared(1);
        self.cached_bytes.sub_shared(size as u64);
    }

    /// Accounts for a block of `size` bytes handed to a pool.
    fn handed_out(&self, size: usize) {
        self.allocs.add_shared(1);
        self.live_bytes.add_shared(size as u64);
    }

    /// The source's numbers that its rows do not carry.
    pub(super) fn source_stats(&self) -> BlockSourceStats {
        let allocs = self.allocs.get();
        BlockSourceStats {
            id: self.id,
            max_free: self.budget.limit(),
            cached_bytes: self.budget.used(),
            large_live_blocks: allocs.saturating_sub(self.frees.get()),
            large_live_bytes: self.live_bytes.get(),
            large_cached_blocks: self.cached_blocks.get(),
            large_cached_bytes: self.cached_bytes.get(),
        }
    }

    pub(super) fn trim(&self) -> usize {
        let buckets = std::mem::take(&mut sync::lock(&self.cache).buckets);
        let mut released = 0;
        for (size, list) in buckets {
            for Cached(p) in list {
                self.uncache(size);
                // SAFETY: a cached block, allocated with this layout, owned by the cache.
                unsafe { self.free_memory(p, large_layout(size)) };
                self.system_frees.add_shared(1);
                released += size;
            }
        }
        released
    }

    /// Empties the cache if no block was taken since the previous call that counted
    /// (the first call only starts the interval, and one sooner than
    /// [`MIN_IDLE_INTERVAL`](crate::core::idle::MIN_IDLE_INTERVAL) does nothing);
    /// returns the bytes released.
    pub(super) fn trim_idle(&self) -> usize {
        let idle = {
            let mut watch = self.idle_watch.lock().unwrap_or_else(|e| e.into_inner());
            if watch.too_soon() {
                return 0;
            }
            watch.end(self.allocs.get())
        };
        if idle {
            self.trim()
        } else {
            0
        }
    }

    pub(super) fn stats(&self) -> Stats {
        let allocs = self.allocs.get();
        let frees = self.frees.get();
        Stats {
            name: "pool-blocks-large",
            id: self.id,
            // Large blocks vary in size: the row counts blocks, not bytes.
            object_size: 0,
            allocs,
            frees,
            live: allocs.saturating_sub(frees),
            cached_in_threads: 0,
            cached_in_depot: self.cached_blocks.get(),
            backing_allocs: self.system_allocs.get(),
            backing_frees: self.system_frees.get(),
            threads: 0,
            mode: crate::CacheMode::ThreadCaches,
            ..Stats::default()
        }
    }
}

impl Registered for Large {
    fn stats(&self) -> Option<Stats> {
        Some(Large::stats(self))
    }

    fn trim(&self) -> usize {
        Large::trim(self)
    }

    fn trim_idle(&self) -> usize {
        Large::trim_idle(self)
    }

    fn source(&self) -> Option<BlockSourceStats> {
        Some(self.source_stats())
    }
}
