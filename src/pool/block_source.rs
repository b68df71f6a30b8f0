//! Where pools get their blocks: APR's allocator, built on the class allocators.
//!
//! Blocks of 8, 16, 32 and 64 KiB come from four [`ClassAllocator`]s, so a pool created
//! and cleared on a warm thread takes them from that thread's cache: no lock, no system
//! call. Larger blocks (rounded up to 4 KiB) are kept in size buckets under a mutex, taken
//! back most recent first; a cached block is not handed out for a request less than half
//! its size (APR trunk's rule, so a small pool does not pin a big block). All of it is
//! charged to one `max_free` byte budget: the class depots and the large buckets together
//! never cache more than `max_free` bytes, and freed blocks beyond it go back to the
//! system. (Each thread may also hold up to two magazines per block class in its own
//! cache, outside `max_free`: 64 KiB per class per thread, 128 KiB for the 64 KiB class
//! whose magazines hold one block each, so at most 320 KiB per thread; given back at
//! thread exit, on `trim`, or by the idle collector. The block classes' thread caches do
//! not grow a stash: beyond those two magazines, blocks go to the depots, under
//! `max_free`.)
//!
//! Blocks come from the global allocator unless the source is built with a
//! [`BlockAllocator`] ([`BlockSource::with_block_allocator`]): then every block, of the
//! classes and large, comes from it and goes back to it, so a server can put pool memory
//! in huge pages, keep it out of core dumps, or account for it on its own.

use std::ptr::NonNull;
#[cfg(not(proxalloc_loom))]
use std::sync::OnceLock;

use super::large_blocks::Large;
use crate::class::{ClassAllocator, RawBytes as Block};
use crate::config::{CacheMode, Config};
use crate::core::backing::{BlockAllocator, MemoryOwner, ObjectHooks};
use crate::core::budget::ByteBudget;
use crate::registry::{self, Registered};
use crate::rows::{BlockSourceStats, Stats};
use crate::sync::Arc;

/// Sizes of the block classes served through per-thread caches.
///
/// ```
/// use proxalloc::{BlockSource, BLOCK_CLASSES};
/// assert_eq!(BlockSource::block_size(9000), BLOCK_CLASSES[1]);
/// ```
pub const BLOCK_CLASSES: [usize; 4] = [8 << 10, 16 << 10, 32 << 10, 64 << 10];

/// Alignment of every block.
///
/// ```
/// let source = proxalloc::BlockSource::new(1 << 20);
/// let b = source.alloc(100).unwrap();
/// assert_eq!(b.ptr.as_ptr() as usize % proxalloc::BLOCK_ALIGN, 0);
/// // SAFETY: from `source`, not used again.
/// unsafe { source.free(b) };
/// ```
pub const BLOCK_ALIGN: usize = 64;

/// Large blocks are sized in multiples of this.
const LARGE_GRAIN: usize = 4 << 10;

/// The default `max_free`: 2 MiB, httpd's `MaxMemFree` (APR's own default is unlimited,
/// which both httpd and Subversion override).
///
/// ```
/// assert_eq!(proxalloc::BlockSource::global().max_free(), proxalloc::DEFAULT_MAX_FREE);
/// ```
pub const DEFAULT_MAX_FREE: usize = 2 << 20;

/// A block handed out by a [`BlockSource`]: `size` bytes at `ptr`, aligned to
/// [`BLOCK_ALIGN`].
///
/// ```
/// let source = proxalloc::BlockSource::new(1 << 20);
/// let b = source.alloc(5000).unwrap();
/// assert_eq!(b.size, 8 << 10);
/// // SAFETY: the block is ours, `size` bytes at `ptr`.
/// unsafe { b.ptr.as_ptr().write_bytes(0, b.size) };
/// // SAFETY: from `source`, not used again.
/// unsafe { source.free(b) };
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RawBlock {
    /// Start of the block.
    pub ptr: NonNull<u8>,
    /// Its size in bytes.
    pub size: usize,
}

/// Hands out blocks of 8 KiB and more to pools, caching freed ones within a `max_free`
/// byte budget. Safe to share between threads.
///
/// ```
/// use proxalloc::BlockSource;
/// let source = BlockSource::new(4 << 20); // Subversion's 4 MiB
/// let block = source.alloc(10_000).unwrap();
/// assert!(block.size >= 10_000);
/// // SAFETY: the block came from `source` and is not used again.
/// unsafe { source.free(block) };
/// // The block sits in this thread's cache; handing the cache to the source's depots
/// // charges it to `max_free`.
/// source.release_thread_cache();
/// assert_eq!(source.cached_bytes(), 16 << 10);
/// ```
pub struct BlockSource {
    c8: ClassAllocator<Block<{ 8 << 10 }>>,
    c16: ClassAllocator<Block<{ 16 << 10 }>>,
    c32: ClassAllocator<Block<{ 32 << 10 }>>,
    c64: ClassAllocator<Block<{ 64 << 10 }>>,
    large: Arc<Large>,
    /// The user's block allocator, where the classes' hooks point; dropped after the
    /// classes. (Each class's backing holds its own clone of the `Arc` once built.)
    _memory: Option<MemoryOwner>,
}

impl BlockSource {
    /// A source that caches at most `max_free` bytes of free blocks, and takes blocks
    /// from the global allocator.
    ///
    /// ```
    /// use proxalloc::{BlockSource, Pool};
    /// let source = BlockSource::new(4 << 20);
    /// let pool = Pool::with_source(&source);
    /// assert_eq!(pool.alloc_str("from my source"), "from my source");
    /// ```
    pub fn new(max_free: usize) -> Self {
        Self::build(max_free, None)
    }

    /// A source that caches at most `max_free` bytes of free blocks, and takes every
    /// block from `allocator` (and gives it back there): huge pages, memory kept out of
    /// core dumps, an arena of the server's own. See `examples/hugepage_blocks.rs`.
    ///
    /// Blocks go back to `allocator` as they go back to the system otherwise: beyond
    /// `max_free`, on [`trim`](Self::trim), from threads' caches when the threads exit,
    /// and all of the source's when it is dropped. The source keeps `allocator` alive
    /// until then.
    ///
    /// ```
    /// use std::sync::Arc;
    /// use proxalloc::{BlockSource, Pool};
    /// let source = BlockSource::with_block_allocator(4 << 20, Arc::new(std::alloc::System));
    /// let pool = Pool::with_source(&source);
    /// assert_eq!(pool.alloc_str("hello"), "hello");
    /// ```
    pub fn with_block_allocator(
        max_free: usize,
        allocator: std::sync::Arc<dyn BlockAllocator>,
    ) -> Self {
        Self::build(max_free, Some(MemoryOwner::new(allocator)))
    }

    fn build(max_free: usize, memory: Option<MemoryOwner>) -> Self {
        let budget = Arc::new(ByteBudget::new(max_free));
        // No stash (`thread_cache_growth_bytes(0)`): a thread's cache for a block class
        // stays at two magazines, so what a thread holds outside `max_free` is bounded
        // (320 KiB); with the default growth, W7 left a stash of 64 KiB blocks in one
        // thread's cache (`docs/benchmarks.md#w7-footprint-the-subversion-pattern`).
        // Pools take one or two blocks of a class per clear, which the two magazines
        // already serve. Per-thread caches in every build (the `percpu` feature's default
        // is not theirs): `max_free` bounds what the depot keeps beside the threads'
        // bounded caches, and `release_thread_cache` gives a thread's blocks back.
        let cfg = Config::new()
            .mode(CacheMode::ThreadCaches)
            .magazine_size(8)
            .thread_cache_bytes(64 << 10)
            .thread_cache_growth_bytes(0);
        let hooks = memory.as_ref().map(|m| ObjectHooks {
            values: None,
            // SAFETY: the owner is kept in the source with the classes that carry the
            // hook, and dropped after them (it is the last field).
            memory: Some(unsafe { m.hook() }),
        });
        fn class<T>(
            name: &'static str,
            cfg: Config,
            hooks: Option<ObjectHooks>,
            budget: &Arc<ByteBudget>,
        ) -> ClassAllocator<T> {
            ClassAllocator::with_parts(name, cfg, hooks, Some(budget.clone()))
        }
        let large = Large::new(budget.clone(), memory.as_ref().map(|m| m.get().clone()));
        BlockSource {
            c8: class("pool-blocks-8K", cfg, hooks, &budget),
            c16: class("pool-blocks-16K", cfg, hooks, &budget),
            c32: class("pool-blocks-32K", cfg, hooks, &budget),
            c64: class("pool-blocks-64K", cfg, hooks, &budget),
            large,
            _memory: memory,
        }
    }

    /// The process-wide source that [`Pool::new`](crate::Pool::new) uses, with
    /// [`DEFAULT_MAX_FREE`].
    ///
    /// ```
    /// let pool = proxalloc::Pool::with_source(proxalloc::BlockSource::global()); // as Pool::new()
    /// let _ = pool.alloc(1u64);
    /// ```
    #[cfg(not(proxalloc_loom))]
    pub fn global() -> &'static BlockSource {
        static GLOBAL: OnceLock<BlockSource> = OnceLock::new();
        GLOBAL.get_or_init(|| BlockSource::new(DEFAULT_MAX_FREE))
    }

    /// The `max_free` budget in bytes.
    ///
    /// ```
    /// assert_eq!(proxalloc::BlockSource::new(1 << 20).max_free(), 1 << 20);
    /// ```
    pub fn max_free(&self) -> usize {
        self.large.budget().limit()
    }

    /// Bytes of free blocks cached by the source (class depots and large buckets; not
    /// the blocks in threads' own caches). Never more than [`max_free`](Self::max_free).
    ///
    /// ```
    /// let source = proxalloc::BlockSource::new(1 << 20);
    /// let b = source.alloc(200_000).unwrap(); // a large block: cached in the source when freed
    /// // SAFETY: from `source`, not used again.
    /// unsafe { source.free(b) };
    /// assert_eq!(source.cached_bytes(), 200_704);
    /// source.trim();
    /// assert_eq!(source.cached_bytes(), 0);
    /// ```
    pub fn cached_bytes(&self) -> usize {
        self.large.budget().used()
    }

    /// Size of the block that serves a request of `size` bytes.
    ///
    /// ```
    /// use proxalloc::BlockSource;
    /// assert_eq!(BlockSource::block_size(1), 8 << 10);
    /// assert_eq!(BlockSource::block_size(40_000), 64 << 10);
    /// assert_eq!(BlockSource::block_size(70_000), 73_728); // 18 × 4 KiB
    /// ```
    pub fn block_size(size: usize) -> usize {
        match BLOCK_CLASSES.iter().find(|&&c| c >= size) {
            Some(&c) => c,
            None => size.div_ceil(LARGE_GRAIN).saturating_mul(LARGE_GRAIN),
        }
    }

    /// A block of at least `size` bytes, or `None` if the system allocator fails.
    ///
    /// ```
    /// let source = proxalloc::BlockSource::new(1 << 20);
    /// let b = source.alloc(20_000).expect("out of memory");
    /// assert_eq!(b.size, 32 << 10);
    /// // SAFETY: from `source`, not used again.
    /// unsafe { source.free(b) };
    /// ```
    #[must_use = "a block not given back with `BlockSource::free` leaks"]
    pub fn alloc(&self, size: usize) -> Option<RawBlock> {
        let size = Self::block_size(size);
        let ptr = match size {
            s if s == BLOCK_CLASSES[0] => self.c8.alloc_raw().ok()?.cast(),
            s if s == BLOCK_CLASSES[1] => self.c16.alloc_raw().ok()?.cast(),
            s if s == BLOCK_CLASSES[2] => self.c32.alloc_raw().ok()?.cast(),
            s if s == BLOCK_CLASSES[3] => self.c64.alloc_raw().ok()?.cast(),
            _ => return self.large.alloc(size),
        };
        Some(RawBlock { ptr, size })
    }

    /// A block of at least `size` bytes sized to fit (4 KiB grain) rather than to a
    /// class, from the large-block cache; `None` if the system allocator fails. Free it
    /// with [`free`](Self::free) like any other block. Blocks are 8 KiB at least, as
    /// every block of a source is: a smaller `size` (0 included) gets the 8 KiB class.
    ///
    /// ```
    /// let source = proxalloc::BlockSource::new(1 << 20);
    /// let b = source.alloc_dedicated(40_000).unwrap();
    /// assert_eq!(b.size, 40_960); // 10 × 4 KiB, not the 64 KiB class
    /// let small = source.alloc_dedicated(0).unwrap();
    /// assert_eq!(small.size, 8 << 10);
    /// // SAFETY: from `source`, not used again.
    /// unsafe { source.free(b) };
    /// unsafe { source.free(small) };
    /// ```
    #[must_use = "a block not given back with `BlockSource::free` leaks"]
    pub fn alloc_dedicated(&self, size: usize) -> Option<RawBlock> {
        // Never a zero-sized layout for the system or the user's block allocator.
        let size = size
            .max(BLOCK_CLASSES[0])
            .div_ceil(LARGE_GRAIN)
            .saturating_mul(LARGE_GRAIN);
        if BLOCK_CLASSES.contains(&size) {
            return self.alloc(size);
        }
        self.large.alloc(size)
    }

    /// Takes a block back.
    ///
    /// # Safety
    /// `block` came from [`alloc`](Self::alloc) or
    /// [`alloc_dedicated`](Self::alloc_dedicated) on this source, unchanged, and is not
    /// used afterwards.
    ///
    /// ```
    /// let source = proxalloc::BlockSource::new(1 << 20);
    /// let b = source.alloc(8000).unwrap();
    /// // SAFETY: from `source`, unchanged, not used again.
    /// unsafe { source.free(b) };
    /// assert_eq!(source.stats()[0].live, 0);
    /// ```
    pub unsafe fn free(&self, block: RawBlock) {
        // SAFETY: per the contract, the block came from the matching class.
        unsafe {
            match block.size {
                s if s == BLOCK_CLASSES[0] => self.c8.free_raw(block.ptr.cast()),
                s if s == BLOCK_CLASSES[1] => self.c16.free_raw(block.ptr.cast()),
                s if s == BLOCK_CLASSES[2] => self.c32.free_raw(block.ptr.cast()),
                s if s == BLOCK_CLASSES[3] => self.c64.free_raw(block.ptr.cast()),
                _ => self.large.free(block),
            }
        }
    }

    /// Stats of the four block classes and of the large blocks, in that order.
    ///
    /// ```
    /// let source = proxalloc::BlockSource::new(1 << 20);
    /// let b = source.alloc(10_000).unwrap();
    /// let [_8k, k16, _32k, _64k, _large] = source.stats();
    /// assert_eq!((k16.name, k16.live), ("pool-blocks-16K", 1));
    /// // SAFETY: from `source`, not used again.
    /// unsafe { source.free(b) };
    /// ```
    pub fn stats(&self) -> [Stats; 5] {
        [
            self.c8.stats(),
            self.c16.stats(),
            self.c32.stats(),
            self.c64.stats(),
            self.large.stats(),
        ]
    }

    /// The source's budget and its large blocks in bytes (see [`BlockSourceStats`]).
    ///
    /// ```
    /// let source = proxalloc::BlockSource::new(4 << 20);
    /// let s = source.source_stats();
    /// assert_eq!((s.max_free, s.cached_bytes, s.large_live_blocks), (4 << 20, 0, 0));
    /// ```
    pub fn source_stats(&self) -> BlockSourceStats {
        self.large.source_stats()
    }

    /// Gives every cached block back to the system (the depots, the large buckets and the
    /// calling thread's cache; other threads are asked to flush theirs, as
    /// [`ClassAllocator::trim`](crate::ClassAllocator::trim) does). Returns the bytes
    /// released.
    ///
    /// ```
    /// let source = proxalloc::BlockSource::new(1 << 20);
    /// let b = source.alloc(8000).unwrap();
    /// // SAFETY: from `source`, not used again.
    /// unsafe { source.free(b) };
    /// assert_eq!(source.trim(), 8 << 10); // from this thread's cache
    /// ```
    pub fn trim(&self) -> usize {
        self.trim_parts(|part| part.trim())
    }

    /// Gives back the blocks that went unused since the previous call, as
    /// [`trim_idle`](crate::trim_idle) does for every allocator; returns the bytes
    /// released. The first call only starts the interval.
    ///
    /// ```
    /// let source = proxalloc::BlockSource::new(1 << 20);
    /// let b = source.alloc(200_000).unwrap(); // a large block
    /// // SAFETY: from `source`, not used again.
    /// unsafe { source.free(b) };
    /// assert_eq!(source.trim_idle(), 0); // starts the interval
    /// std::thread::sleep(std::time::Duration::from_millis(5));
    /// assert_eq!(source.trim_idle(), 200_704); // no block taken since
    /// ```
    pub fn trim_idle(&self) -> usize {
        self.trim_parts(|part| part.trim_idle())
    }

    /// Trims the four classes and the large blocks with `trim`, asking the OS once for
    /// what they released together (as `trim_all` does for every allocator).
    fn trim_parts(&self, trim: impl Fn(&dyn Registered) -> usize) -> usize {
        registry::trim_each(
            |part| {
                // A class never used has nothing to trim, and gets no engine for it.
                for class in [
                    self.c8.used_engine(),
                    self.c16.used_engine(),
                    self.c32.used_engine(),
                    self.c64.used_engine(),
                ]
                .into_iter()
                .flatten()
                {
                    part(class);
                }
                part(&*self.large);
            },
            trim,
        )
    }

    /// Hands the calling thread's cached blocks to the source's depots.
    ///
    /// ```
    /// let source = proxalloc::BlockSource::new(1 << 20);
    /// let b = source.alloc(8000).unwrap();
    /// // SAFETY: from `source`, not used again.
    /// unsafe { source.free(b) };
    /// assert_eq!(source.cached_bytes(), 0); // in this thread's cache
    /// source.release_thread_cache();
    /// assert_eq!(source.cached_bytes(), 8 << 10); // in the depot, for any thread
    /// ```
    pub fn release_thread_cache(&self) {
        self.c8.release_thread_cache();
        self.c16.release_thread_cache();
        self.c32.release_thread_cache();
        self.c64.release_thread_cache();
    }
}

impl std::fmt::Debug for BlockSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BlockSource")
            .field("max_free", &self.max_free())
            .field("cached_bytes", &self.cached_bytes())
            .finish_non_exhaustive()
    }
}

impl Drop for BlockSource {
    fn drop(&mut self) {
        // The class allocators drop themselves (returning their cached blocks); the large
        // cache is emptied here.
        crate::core::backing::release_dropped_to_os(self.large.trim());
    }
}

#[cfg(all(test, not(proxalloc_loom)))]
mod tests {
    use super::{BlockSource, BLOCK_CLASSES};
    use crate::core::backing::OS_RELEASES;

    /// A source's classes that each give back less than the threshold for asking the OS,
    /// and more together: its `trim` asks, once.
    #[test]
    fn a_source_trim_asks_the_os_for_what_its_classes_release_together() {
        let source = BlockSource::new(4 << 20);
        // 320 KiB in each class, taken and given back.
        let cache_blocks = || {
            let blocks: Vec<_> = BLOCK_CLASSES
                .iter()
                .flat_map(|&size| (0..(320 << 10) / size).map(move |_| size))
                .map(|size| source.alloc(size).expect("memory"))
                .collect();
            for b in blocks {
                // SAFETY: from `source`, unchanged, not used again.
                unsafe { source.free(b) };
            }
        };
        // Other tests ask too (see `src/tests/registry.rs`): a request was made after
        // the release, and this thread made one at most.
        let requests = || crate::core::backing::system_trims().0;
        let mine = || OS_RELEASES.with(|n| n.get());
        cache_blocks();
        let before = (requests(), mine());
        assert_eq!(source.trim(), 4 * (320 << 10));
        assert!(crate::core::backing::requested_since(before.0));
        assert!(mine() - before.1 <= 1);
        // The same through `trim_idle`, over an interval in which nothing was used.
        cache_blocks();
        assert_eq!(source.trim_idle(), 0, "the first call starts the interval");
        std::thread::sleep(crate::core::idle::MIN_IDLE_INTERVAL * 3);
        let before = (requests(), mine());
        assert_eq!(source.trim_idle(), 4 * (320 << 10));
        assert!(crate::core::backing::requested_since(before.0));
        assert!(mine() - before.1 <= 1);
    }
}
