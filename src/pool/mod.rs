//! Pools in the manner of Apache APR: bump allocation in blocks drawn from a
//! [`BlockSource`], freed all at once by [`Pool::clear`], with subpools and cleanups.
//!
//! The borrow checker does what APR's debug modes check at run time: allocation takes
//! `&self` and returns references tied to that borrow, and `clear` takes `&mut self`, so
//! no reference survives a clear:
//!
//! ```compile_fail
//! let mut pool = proxalloc::Pool::new();
//! let s = pool.alloc_str("request line");
//! pool.clear();        // error: `pool` is borrowed by `s`
//! println!("{s}");
//! ```
//!
//! A subpool borrows its parent, so the parent cannot be cleared (or dropped) while the
//! child lives:
//!
//! ```compile_fail
//! let mut parent = proxalloc::Pool::new();
//! let child = parent.subpool();
//! parent.clear();      // error: `parent` is borrowed by `child`
//! drop(child);
//! ```
//!
//! One file per part: `bump.rs` the blocks, the cursor and the fast path; `cleanup.rs`
//! cleanups and owned values; `subpool.rs`; `writer.rs` (`PoolWriter`, `pformat!`);
//! `vec.rs` (`PoolVec`); `allocator_api.rs` (`&Pool` as an `allocator_api2` allocator);
//! `block_source.rs` and `large_blocks.rs`, where the blocks come from.

mod allocator_api;
mod block_source;
mod bump;
mod cleanup;
#[cfg(all(feature = "bytes", not(proxalloc_loom)))]
mod into_bytes;
mod large_blocks;
mod subpool;
mod vec;
mod writer;

#[cfg(all(test, proxalloc_loom))]
mod tests;

use std::alloc::Layout;
use std::cell::UnsafeCell;
use std::fmt;
use std::marker::PhantomData;
use std::panic::resume_unwind;
use std::ptr::{self, NonNull};

pub use crate::core::backing::BlockAllocator;
pub use block_source::{BlockSource, RawBlock, BLOCK_ALIGN, BLOCK_CLASSES, DEFAULT_MAX_FREE};
use bump::{BlockHeader, SENTINEL};
use cleanup::CleanupHeader;
pub use cleanup::CleanupKey;
pub use subpool::SubPool;
pub use vec::PoolVec;
pub use writer::PoolWriter;

use crate::error::AllocError;

struct State {
    /// The block `clear` keeps (null until the first allocation).
    first: *mut BlockHeader,
    /// The block being bumped.
    active: *mut BlockHeader,
    cursor: *mut u8,
    end: *mut u8,
    /// Blocks held besides the active one (their `free` fields are current).
    retained: *mut BlockHeader,
    /// Blocks of their own for requests larger than the largest class.
    large: *mut BlockHeader,
    cleanups: *mut CleanupHeader,
    next_block: usize,
    /// The most bytes in use seen at a clear or a `stats` call.
    high_water: usize,
    blocks: usize,
    retained_bytes: usize,
    cleanup_count: usize,
    /// Debug mode: every allocation is its own heap block.
    debug_blocks: Vec<(NonNull<u8>, Layout)>,
    debug_used: usize,
}

/// Counters of one pool, from [`Pool::stats`].
///
/// ```
/// let mut pool = proxalloc::Pool::new();
/// let _ = pool.alloc_str("hello");
/// let s = pool.stats();
/// assert!(s.used_bytes >= 5 && s.blocks == 1 && s.retained_bytes >= 8 << 10);
/// pool.clear();
/// assert_eq!(pool.stats().used_bytes, 0);
/// ```
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub struct PoolStats {
    /// Bytes handed out since the last clear (alignment padding included, and sizes
    /// rounded up to 8 bytes, as APR rounds them).
    pub used_bytes: usize,
    /// Bytes of blocks the pool holds now.
    pub retained_bytes: usize,
    /// Blocks the pool holds now.
    pub blocks: usize,
    /// The most `used_bytes` ever reached.
    pub high_water: usize,
    /// Cleanups and owned values registered and not yet run.
    pub cleanups: usize,
}

/// A pool: allocate with `&self`, free everything at once with [`clear`](Self::clear) or
/// by dropping it.
///
/// ```
/// use proxalloc::Pool;
///
/// let mut pool = Pool::new();
/// for request in ["GET / HTTP/1.1", "GET /a HTTP/1.1"] {
///     let line = pool.alloc_str(request);
///     let words: &mut [&str] = pool.alloc_slice_fill_with(3, |i| line.split(' ').nth(i).unwrap());
///     assert_eq!(words[1].as_bytes()[0], b'/');
///     let status = proxalloc::pformat!(pool, "{} {}", 200, "OK");
///     assert_eq!(status, "200 OK");
///     pool.clear(); // everything above is gone; the first block is kept for the next one
/// }
/// ```
///
/// A pool is `Send` (it can move to another thread, and its blocks are freed into that
/// thread's cache) but not `Sync`.
///
/// # Pools in async code
///
/// A task on a multi-thread runtime owns its pool: a `Pool<'static>` (from
/// [`Pool::new`], or [`with_source`](Pool::with_source) on a `'static` source) moves into
/// `tokio::spawn` like any `Send` value. What the pool hands out (`&mut str`, slices,
/// values) may be held across an `.await`: those references are `Send`. What holds the
/// pool itself may not: a `&Pool`, a [`PoolVec`], a [`PoolWriter`], a [`SubPool`] or an
/// allocator-api2 collection in the pool. The task may resume on another thread, and a
/// `&Pool` there would let two threads use one pool, which is not `Sync`. So end those
/// borrows in a block before an `.await` (not with `drop(v)`: the compiler counts a
/// variable that was borrowed as held until its scope ends), using
/// [`leak`](allocator_api2::vec::Vec::leak) to keep a vector's elements as a slice, and
/// clear the pool between requests:
///
/// ```
/// use proxalloc::{pformat, Pool, PoolVec};
///
/// async fn serve(requests: u32) -> usize {
///     let mut pool = Pool::new(); // owned by the task
///     let mut sent = 0;
///     for id in 0..requests {
///         let status = pformat!(pool, "HTTP/1.1 200 OK\r\nx-request: {id}\r\n");
///         let headers: &mut [&mut str] = {
///             let mut v = PoolVec::new_in(&pool);
///             v.push(pool.alloc_str("server: proxalloc"));
///             v.leak() // the vector (and its `&Pool`) ends here; the slice lives on
///         };
///         tokio::task::yield_now().await; // e.g. writing to the socket
///         sent += status.len() + headers.iter().map(|h| h.len()).sum::<usize>();
///         pool.clear(); // the next request reuses the memory
///     }
///     sent
/// }
///
/// let rt = tokio::runtime::Builder::new_multi_thread().build().unwrap();
/// let sent = rt.block_on(async { tokio::spawn(serve(3)).await.unwrap() });
/// assert!(sent > 0);
/// ```
///
/// Holding the vector itself across the `.await` does not compile: the error says the
/// future is not `Send` because "within `Pool<'_>`, the trait `Sync` is not implemented
/// for `UnsafeCell<proxalloc::pool::State>`", and points at the vector held across the
/// `.await`:
///
/// ```compile_fail
/// use proxalloc::{Pool, PoolVec};
///
/// async fn serve() -> usize {
///     let pool = Pool::new();
///     let mut v = PoolVec::new_in(&pool);
///     v.push(pool.alloc_str("server: proxalloc"));
///     tokio::task::yield_now().await; // error: `v` (a `&Pool` inside) lives across it
///     v.len()
/// }
///
/// let rt = tokio::runtime::Builder::new_multi_thread().build().unwrap();
/// rt.block_on(async { tokio::spawn(serve()).await.unwrap() });
/// ```
///
/// A pool that several tasks share needs a lock around it (and a lock guard held across
/// an `.await` has the same problem): give each task its own pool instead, on one shared
/// [`BlockSource`] if their blocks should come from one budget.
pub struct Pool<'s> {
    source: &'s BlockSource,
    state: UnsafeCell<State>,
    debug: bool,
    _not_sync: PhantomData<*mut ()>,
}

// SAFETY: the pool owns its blocks and cleanups exclusively; the closures and owned
// values it holds are `Send` (required at registration); the source is `Sync`.
unsafe impl Send for Pool<'_> {}

#[cfg(not(proxalloc_loom))]
impl Pool<'static> {
    /// A pool drawing from [`BlockSource::global`]. Takes no memory until first used.
    ///
    /// ```
    /// let pool = proxalloc::Pool::new();
    /// assert_eq!(pool.stats().blocks, 0); // no memory until first used
    /// assert_eq!(*pool.alloc(7u32), 7);
    /// ```
    pub fn new() -> Self {
        Pool::with_source(BlockSource::global())
    }

    /// A debug pool on the global source: every allocation is its own heap block, and
    /// `clear` poisons memory (with [`POISON`](crate::POISON)) before freeing it, so valgrind or ASan
    /// find a use after clear in unsafe code that escaped the borrow checker.
    ///
    /// ```
    /// // Each allocation is its own heap block, for valgrind or ASan runs.
    /// let pool = proxalloc::Pool::new_debug();
    /// assert_eq!(pool.alloc_str("checked"), "checked");
    /// ```
    pub fn new_debug() -> Self {
        Pool::with_source_debug(BlockSource::global(), true)
    }
}

#[cfg(not(proxalloc_loom))]
impl Default for Pool<'static> {
    fn default() -> Self {
        Pool::new()
    }
}

impl<'s> Pool<'s> {
    /// A pool drawing its blocks from `source`.
    ///
    /// ```
    /// let source = proxalloc::BlockSource::new(64 << 10); // caches at most 64 KiB of blocks
    /// let pool = proxalloc::Pool::with_source(&source);
    /// assert_eq!(*pool.alloc(1u8), 1);
    /// ```
    pub fn with_source(source: &'s BlockSource) -> Self {
        Self::with_source_debug(source, false)
    }

    /// A pool drawing from `source`, in debug mode if `debug` (see
    /// [`new_debug`](Pool::new_debug)).
    ///
    /// ```
    /// let source = proxalloc::BlockSource::new(1 << 20);
    /// let debug = cfg!(debug_assertions);
    /// let pool = proxalloc::Pool::with_source_debug(&source, debug);
    /// assert_eq!(*pool.alloc(2u16), 2);
    /// ```
    pub fn with_source_debug(source: &'s BlockSource, debug: bool) -> Self {
        Pool {
            source,
            state: UnsafeCell::new(State {
                first: ptr::null_mut(),
                active: ptr::null_mut(),
                cursor: SENTINEL,
                end: SENTINEL,
                retained: ptr::null_mut(),
                large: ptr::null_mut(),
                cleanups: ptr::null_mut(),
                next_block: BLOCK_CLASSES[0],
                high_water: 0,
                blocks: 0,
                retained_bytes: 0,
                cleanup_count: 0,
                debug_blocks: Vec::new(),
                debug_used: 0,
            }),
            debug,
            _not_sync: PhantomData,
        }
    }

    /// The block source.
    ///
    /// ```
    /// let source = proxalloc::BlockSource::new(1 << 20);
    /// let pool = proxalloc::Pool::with_source(&source);
    /// assert!(std::ptr::eq(pool.source(), &source));
    /// ```
    pub fn source(&self) -> &'s BlockSource {
        self.source
    }

    /// The pool's state. Only ever borrowed inside one method call, never across user
    /// code, so two borrows never overlap.
    #[allow(clippy::mut_from_ref)]
    #[inline(always)]
    fn st(&self) -> &mut State {
        // SAFETY: `Pool` is `!Sync`, and no method holds this borrow while calling out
        // to user code or to another method that takes it.
        unsafe { &mut *self.state.get() }
    }

    /// Allocates `value` and returns it. It is never dropped (like bumpalo): use
    /// [`alloc_owned`](Self::alloc_owned) for values whose destructor must run.
    ///
    /// ```
    /// let pool = proxalloc::Pool::new();
    /// let n = pool.alloc(41u64);
    /// *n += 1;
    /// assert_eq!(*n, 42);
    /// ```
    #[inline]
    #[allow(clippy::mut_from_ref)]
    #[must_use = "the allocation stays in the pool until it is cleared; an unused one only wastes pool memory"]
    pub fn alloc<T>(&self, value: T) -> &mut T {
        self.alloc_with(|| value)
    }

    /// Allocates the value `init` returns, written straight into pool memory.
    ///
    /// ```
    /// let pool = proxalloc::Pool::new();
    /// let table = pool.alloc_with(|| [0u32; 256]); // built in pool memory
    /// assert_eq!(table.len(), 256);
    /// ```
    #[inline]
    #[allow(clippy::mut_from_ref)]
    #[must_use = "the allocation stays in the pool until it is cleared; an unused one only wastes pool memory"]
    pub fn alloc_with<T>(&self, init: impl FnOnce() -> T) -> &mut T {
        let p = self.alloc_layout(Layout::new::<T>()).cast::<T>();
        // SAFETY: fresh memory for one `T`, handed out once.
        unsafe {
            p.as_ptr().write(init());
            &mut *p.as_ptr()
        }
    }

    /// Allocates `value`, or returns it back with the error if the source fails.
    ///
    /// ```
    /// let pool = proxalloc::Pool::new();
    /// match pool.try_alloc([1u8; 64]) {
    ///     Ok(v) => assert_eq!(v[0], 1),
    ///     Err((_, v)) => drop(v), // out of memory: the value comes back
    /// }
    /// ```
    #[allow(clippy::mut_from_ref)]
    #[must_use = "the allocation stays in the pool until it is cleared; an unused one only wastes pool memory"]
    pub fn try_alloc<T>(&self, value: T) -> Result<&mut T, (AllocError, T)> {
        match self.try_alloc_layout(Layout::new::<T>()) {
            // SAFETY: fresh memory for one `T`, handed out once.
            Ok(p) => unsafe {
                let p = p.cast::<T>().as_ptr();
                p.write(value);
                Ok(&mut *p)
            },
            Err(e) => Err((e, value)),
        }
    }

    /// Copies `s` into the pool.
    ///
    /// ```
    /// let pool = proxalloc::Pool::new();
    /// let host = pool.alloc_str("Example.COM");
    /// host.make_ascii_lowercase();
    /// assert_eq!(host, "example.com");
    /// ```
    #[allow(clippy::mut_from_ref)]
    #[must_use = "the allocation stays in the pool until it is cleared; an unused one only wastes pool memory"]
    pub fn alloc_str(&self, s: &str) -> &mut str {
        let bytes = self.alloc_slice_copy(s.as_bytes());
        // SAFETY: a copy of a `str`.
        unsafe { std::str::from_utf8_unchecked_mut(bytes) }
    }

    /// Copies `src` into the pool.
    ///
    /// ```
    /// let pool = proxalloc::Pool::new();
    /// let v = pool.alloc_slice_copy(&[3, 1, 2]);
    /// v.sort();
    /// assert_eq!(v, [1, 2, 3]);
    /// ```
    #[allow(clippy::mut_from_ref)]
    #[must_use = "the allocation stays in the pool until it is cleared; an unused one only wastes pool memory"]
    pub fn alloc_slice_copy<T: Copy>(&self, src: &[T]) -> &mut [T] {
        let layout = Layout::for_value(src);
        let p = self.alloc_layout(layout).cast::<T>();
        // SAFETY: fresh memory for `src.len()` values, handed out once.
        unsafe {
            ptr::copy_nonoverlapping(src.as_ptr(), p.as_ptr(), src.len());
            std::slice::from_raw_parts_mut(p.as_ptr(), src.len())
        }
    }

    /// Allocates `len` values made by `f(0)`, `f(1)`, ... (never dropped, like
    /// [`alloc`](Self::alloc)). If `f` panics, the values made so far are leaked.
    ///
    /// ```
    /// let pool = proxalloc::Pool::new();
    /// let squares = pool.alloc_slice_fill_with(5, |i| i * i);
    /// assert_eq!(squares, [0, 1, 4, 9, 16]);
    /// ```
    #[allow(clippy::mut_from_ref)]
    #[must_use = "the allocation stays in the pool until it is cleared; an unused one only wastes pool memory"]
    pub fn alloc_slice_fill_with<T>(&self, len: usize, mut f: impl FnMut(usize) -> T) -> &mut [T] {
        let layout = Layout::array::<T>(len).expect("slice too large");
        let p = self.alloc_layout(layout).cast::<T>();
        for i in 0..len {
            // SAFETY: inside the fresh allocation.
            unsafe { p.as_ptr().add(i).write(f(i)) };
        }
        // SAFETY: all `len` values initialised, handed out once.
        unsafe { std::slice::from_raw_parts_mut(p.as_ptr(), len) }
    }

    /// The pool's counters.
    ///
    /// ```
    /// let pool = proxalloc::Pool::new();
    /// let _ = pool.alloc_slice_copy(&[0u8; 1000]);
    /// assert!(pool.stats().used_bytes >= 1000);
    /// ```
    pub fn stats(&self) -> PoolStats {
        let st = self.st();
        let used = st.used();
        st.high_water = st.high_water.max(used);
        PoolStats {
            used_bytes: used,
            retained_bytes: st.retained_bytes,
            blocks: st.blocks,
            high_water: st.high_water,
            cleanups: st.cleanup_count,
        }
    }

    /// Runs every cleanup and owned value's destructor (last registered first) and frees
    /// every block but the first, keeping it for the next use. If cleanups panic, all the
    /// others still run and the memory is still freed; then the first panic continues.
    ///
    /// ```
    /// let mut pool = proxalloc::Pool::new();
    /// for i in 0..3 {
    ///     let _ = pool.alloc(i);
    ///     pool.clear(); // the memory of `i` is reused next time
    /// }
    /// assert_eq!(pool.stats().used_bytes, 0);
    /// ```
    pub fn clear(&mut self) {
        let panic = self.run_cleanups();
        self.release_blocks(false);
        if let Some(p) = panic {
            resume_unwind(p);
        }
    }
}

impl Drop for Pool<'_> {
    fn drop(&mut self) {
        let panic = self.run_cleanups();
        self.release_blocks(true);
        if let Some(p) = panic {
            if std::thread::panicking() {
                // Already unwinding: a second panic out of here would abort, so the
                // cleanup's payload is dropped, and a payload whose own `Drop` panics
                // is contained as the other cleanup paths contain it.
                crate::core::backing::discard_panic(p);
            } else {
                resume_unwind(p);
            }
        }
    }
}

impl fmt::Debug for Pool<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Pool")
            .field("stats", &self.stats())
            .field("debug", &self.debug)
            .finish_non_exhaustive()
    }
}
