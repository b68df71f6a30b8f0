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

use std::alloc::Layout;
use std::any::Any;
use std::cell::UnsafeCell;
use std::fmt;
use std::marker::PhantomData;
use std::mem::{align_of, size_of, ManuallyDrop};
use std::ops::{Deref, DerefMut};
use std::panic::{catch_unwind, resume_unwind, AssertUnwindSafe};
use std::ptr::{self, NonNull};

use crate::block_source::{BlockSource, RawBlock, BLOCK_ALIGN, BLOCK_CLASSES};
use crate::class::AllocError;
use crate::debug::POISON;

/// Bytes at the start of every block holding its header (one cache line, so the data
/// that follows keeps the block's alignment).
const HEADER: usize = 64;
/// The largest block a pool grows to.
const LARGEST: usize = BLOCK_CLASSES[BLOCK_CLASSES.len() - 1];
/// Requests that do not fit in the largest class block get a block of their own,
/// sized to fit (4 KiB grain, as APR sizes its nodes).
const DEDICATED: usize = LARGEST - HEADER;

#[repr(C)]
struct BlockHeader {
    next: *mut BlockHeader,
    size: usize,
    /// Where free room starts, for a block that is not the active one.
    free: *mut u8,
}

const _: () =
    assert!(size_of::<BlockHeader>() <= HEADER && BLOCK_ALIGN >= align_of::<BlockHeader>());
// Block starts, data starts, block sizes and the sentinel keep the cursor and `end`
// multiples of `MIN_ALIGN`.
const _: () = assert!(BLOCK_ALIGN % MIN_ALIGN == 0 && HEADER % MIN_ALIGN == 0);

impl BlockHeader {
    fn data(this: *mut BlockHeader) -> *mut u8 {
        this.cast::<u8>().wrapping_add(HEADER)
    }

    /// # Safety
    /// `this` is a live block header.
    unsafe fn end(this: *mut BlockHeader) -> *mut u8 {
        // SAFETY: per the contract.
        this.cast::<u8>().wrapping_add(unsafe { (*this).size })
    }

    /// # Safety
    /// As for [`end`](Self::end).
    unsafe fn room(this: *mut BlockHeader) -> usize {
        // SAFETY: per the contract.
        unsafe { Self::end(this).addr() - (*this).free.addr() }
    }

    /// # Safety
    /// `this` is a live block header.
    unsafe fn raw(this: *mut BlockHeader) -> RawBlock {
        RawBlock {
            // SAFETY: headers are never null.
            ptr: unsafe { NonNull::new_unchecked(this.cast()) },
            // SAFETY: per the contract.
            size: unsafe { (*this).size },
        }
    }
}

/// A registered cleanup: a closure or a value's destructor, in pool memory.
#[repr(C)]
struct CleanupHeader {
    next: *mut CleanupHeader,
    /// Runs (or, with `false`, only drops) the cleanup. Called at most once.
    run: unsafe fn(*mut CleanupHeader, bool),
    live: bool,
}

#[repr(C)]
struct ClosureNode<F> {
    header: CleanupHeader,
    f: ManuallyDrop<F>,
}

/// # Safety
/// `h` heads a live `ClosureNode<F>` whose closure has not been taken.
unsafe fn run_closure<F: FnOnce()>(h: *mut CleanupHeader, call: bool) {
    // SAFETY: per the contract; the closure is taken exactly once.
    let f = unsafe { ManuallyDrop::take(&mut (*h.cast::<ClosureNode<F>>()).f) };
    if call {
        f();
    }
}

#[repr(C)]
struct OwnedNode<T> {
    header: CleanupHeader,
    value: T,
}

/// # Safety
/// `h` heads a live `OwnedNode<T>` whose value has not been dropped.
unsafe fn drop_owned<T>(h: *mut CleanupHeader, _call: bool) {
    // SAFETY: per the contract.
    unsafe { ptr::drop_in_place(&mut (*h.cast::<OwnedNode<T>>()).value) };
}

impl State {
    /// Bytes handed out since the last clear (alignment padding included), counted from
    /// the blocks: the fast path keeps no counter.
    fn used(&self) -> usize {
        let mut used = self.debug_used;
        if !self.active.is_null() {
            used += self.cursor.addr() - BlockHeader::data(self.active).addr();
        }
        for mut b in [self.retained, self.large] {
            while !b.is_null() {
                // SAFETY: blocks on the lists are live headers owned by the pool.
                unsafe {
                    used += (*b).free.addr() - BlockHeader::data(b).addr();
                    b = (*b).next;
                }
            }
        }
        used
    }

    /// Moves the active block to the retained list.
    ///
    /// # Safety
    /// `active` is a live header (or null).
    unsafe fn retire_active(&mut self) {
        if self.active.is_null() {
            return;
        }
        // SAFETY: per the contract.
        unsafe {
            (*self.active).free = self.cursor;
            (*self.active).next = self.retained;
        }
        self.retained = self.active;
        self.active = ptr::null_mut();
    }

    /// # Safety
    /// `block` is a live header owned by the pool, not on any list.
    unsafe fn activate(&mut self, block: *mut BlockHeader, cursor: *mut u8) {
        self.active = block;
        self.cursor = cursor;
        // SAFETY: per the contract.
        self.end = unsafe { BlockHeader::end(block) };
    }
}

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
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
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
    /// `clear` poisons memory (with [`POISON`]) before freeing it, so valgrind or ASan
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

    /// Allocates memory for `layout` (uninitialised), or an error if the source fails.
    ///
    /// ```
    /// use std::alloc::Layout;
    /// let pool = proxalloc::Pool::new();
    /// let p = pool.try_alloc_layout(Layout::from_size_align(100, 16).unwrap()).unwrap();
    /// assert_eq!(p.as_ptr() as usize % 16, 0);
    /// ```
    #[inline]
    #[must_use = "the allocation stays in the pool until it is cleared; an unused one only wastes pool memory"]
    pub fn try_alloc_layout(&self, layout: Layout) -> Result<NonNull<u8>, AllocError> {
        // A debug pool, and a pool without a block, have `cursor == end` at a non-null
        // sentinel, so everything but a zero-sized request takes the slow path.
        //
        // The cursor and `end` are always multiples of `MIN_ALIGN` (sizes are rounded up
        // to it, as APR rounds to `APR_ALIGN_DEFAULT`), so a request aligned to at most
        // that needs no padding, and the bump is one add after one compare: the cursor's
        // chain from one allocation to the next is as short as bumpalo's.
        let st = self.st();
        // `Layout` keeps `size + align - 1` within `isize::MAX`: no overflow below.
        let size = round_up(layout.size());
        let pad = if layout.align() <= MIN_ALIGN {
            0
        } else {
            st.cursor.addr().wrapping_neg() & (layout.align() - 1)
        };
        if pad + size <= st.end.addr() - st.cursor.addr() {
            let start = st.cursor.wrapping_add(pad);
            // One store: the most recent allocation is found by where it ends (see
            // `ends_at_cursor`), not by remembering where it starts.
            st.cursor = start.wrapping_add(size);
            // SAFETY: inside the active block or at the sentinel, so non-null.
            return Ok(unsafe { NonNull::new_unchecked(start) });
        }
        self.alloc_slow(layout)
    }

    /// Allocates memory for `layout` (uninitialised).
    ///
    /// # Panics
    /// Through [`std::alloc::handle_alloc_error`] if the source fails.
    ///
    /// ```
    /// use std::alloc::Layout;
    /// let pool = proxalloc::Pool::new();
    /// let p = pool.alloc_layout(Layout::array::<u64>(4).unwrap());
    /// // SAFETY: room for four `u64`s, aligned.
    /// unsafe { p.cast::<u64>().as_ptr().write_bytes(0, 4) };
    /// ```
    #[inline]
    #[must_use = "the allocation stays in the pool until it is cleared; an unused one only wastes pool memory"]
    pub fn alloc_layout(&self, layout: Layout) -> NonNull<u8> {
        self.try_alloc_layout(layout)
            .unwrap_or_else(|_| std::alloc::handle_alloc_error(layout))
    }

    #[cold]
    #[inline(never)]
    fn alloc_slow(&self, layout: Layout) -> Result<NonNull<u8>, AllocError> {
        if layout.size() == 0 {
            return Ok(dangling(layout.align()));
        }
        if self.debug {
            return self.debug_alloc(layout);
        }
        let st = self.st();
        // The cursor is `MIN_ALIGN`-aligned, so padding takes at most `align - MIN_ALIGN`.
        let need = round_up(layout.size()) + layout.align().max(MIN_ALIGN) - MIN_ALIGN;
        if need > DEDICATED {
            return self.alloc_large(layout, need);
        }
        // APR's probe: the retained block with the most room, if it fits.
        // SAFETY: retained blocks are live headers owned by the pool.
        if let Some(best) = unsafe { best_retained(st.retained) } {
            // SAFETY: as above.
            if unsafe { BlockHeader::room(best) } >= need {
                // SAFETY: as above.
                unsafe {
                    unlink(&mut st.retained, best);
                    st.retire_active();
                    st.activate(best, (*best).free);
                }
                return self.try_alloc_layout(layout);
            }
        }
        let size = st.next_block.max(BlockSource::block_size(HEADER + need));
        // The source may run user code (a recycled value's destructor, released by its
        // thread cache's slow path), which may use this pool: no borrow of the state
        // across the call.
        let block = self.source.alloc(size).ok_or(AllocError)?;
        let st = self.st();
        let header = block.ptr.as_ptr().cast::<BlockHeader>();
        // SAFETY: a fresh block, large enough for its header.
        unsafe {
            header.write(BlockHeader {
                next: ptr::null_mut(),
                size: block.size,
                free: BlockHeader::data(header),
            })
        };
        st.blocks += 1;
        st.retained_bytes += block.size;
        st.next_block = (block.size * 2).min(LARGEST);
        if st.first.is_null() {
            st.first = header;
        }
        // SAFETY: the active block is a live header (or null); `header` is a live header
        // owned by the pool, on no list.
        unsafe {
            st.retire_active();
            st.activate(header, BlockHeader::data(header));
        }
        self.try_alloc_layout(layout)
    }

    /// A block of its own for a request larger than the largest class.
    fn alloc_large(&self, layout: Layout, need: usize) -> Result<NonNull<u8>, AllocError> {
        // Before borrowing the state: see `alloc_slow`.
        let block = self
            .source
            .alloc_dedicated(HEADER.checked_add(need).ok_or(AllocError)?)
            .ok_or(AllocError)?;
        let st = self.st();
        let header = block.ptr.as_ptr().cast::<BlockHeader>();
        let data = BlockHeader::data(header);
        let start = data.wrapping_add(data.addr().wrapping_neg() & (layout.align() - 1));
        // SAFETY: a fresh block, large enough for its header.
        unsafe {
            header.write(BlockHeader {
                next: st.large,
                size: block.size,
                free: start.wrapping_add(layout.size()),
            })
        };
        st.large = header;
        st.blocks += 1;
        st.retained_bytes += block.size;
        // SAFETY: inside the block.
        Ok(unsafe { NonNull::new_unchecked(start) })
    }

    fn debug_alloc(&self, layout: Layout) -> Result<NonNull<u8>, AllocError> {
        let layout = layout.align_to(16).map_err(|_| AllocError)?;
        // SAFETY: non-zero size (zero-sized requests never get here).
        let p = NonNull::new(unsafe { std::alloc::alloc(layout) }).ok_or(AllocError)?;
        let st = self.st();
        st.debug_blocks.push((p, layout));
        st.debug_used += layout.size();
        Ok(p)
    }

    /// Grows the allocation at `ptr` from `old` to `new` bytes (`new >= old`), in place
    /// when it is the pool's most recent allocation and its block has room, else by
    /// copying into a new allocation. Returns the (possibly new) start.
    ///
    /// # Safety
    /// `ptr` came from this pool with `Layout::from_size_align(old, align)` (or grew to
    /// `old` through this function), and no reference into it is live.
    pub(crate) unsafe fn grow(
        &self,
        ptr: NonNull<u8>,
        old: usize,
        new: usize,
        align: usize,
    ) -> Result<NonNull<u8>, AllocError> {
        if self.ends_at_cursor(ptr, old) {
            let st = self.st();
            // `end` and `ptr` are multiples of `MIN_ALIGN`, so when `new` fits, so does
            // `new` rounded up.
            if new <= st.end.addr() - ptr.as_ptr().addr() {
                st.cursor = ptr.as_ptr().wrapping_add(round_up(new));
                return Ok(ptr);
            }
        }
        let layout = Layout::from_size_align(new, align).map_err(|_| AllocError)?;
        let fresh = self.try_alloc_layout(layout)?;
        // SAFETY: both regions are valid for `old` bytes and distinct.
        unsafe { ptr::copy_nonoverlapping(ptr.as_ptr(), fresh.as_ptr(), old) };
        Ok(fresh)
    }

    /// Gives back the end of the allocation at `ptr` (shrinking it from `old` to `new`
    /// bytes) when it is the pool's most recent one; otherwise nothing happens.
    ///
    /// # Safety
    /// `ptr` is a live allocation of this pool of `old` bytes (as for
    /// [`grow`](Self::grow)), `new <= old`, and no reference into its last `old - new`
    /// bytes is live.
    pub(crate) unsafe fn shrink_last(&self, ptr: NonNull<u8>, old: usize, new: usize) {
        if self.ends_at_cursor(ptr, old) {
            self.st().cursor = ptr.as_ptr().wrapping_add(round_up(new));
        }
    }

    /// Whether the live allocation of `size` bytes at `ptr` is the most recent one in the
    /// active block, so the room after it is free: it ends (rounded up, as the fast path
    /// bumps) exactly at the cursor.
    ///
    /// Nothing else can end there. The cursor is at or past the end of every allocation
    /// made in the active block since it became active, and moves back only to the end of
    /// the allocation that ended at it (here). An allocation in another block (class or
    /// dedicated) cannot end inside the active block's data area, since blocks are
    /// disjoint and each data area starts after a header. Zero-sized allocations, which
    /// may be dangling, are never the one (their room is not theirs to grow into); a
    /// debug pool's allocations are heap blocks of their own, and its cursor a sentinel.
    fn ends_at_cursor(&self, ptr: NonNull<u8>, size: usize) -> bool {
        !self.debug
            && size != 0
            && ptr.as_ptr().addr().wrapping_add(round_up(size)) == self.st().cursor.addr()
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

    /// Allocates `value` and drops it when the pool is cleared or dropped (destructors
    /// run last-registered first, interleaved with [`on_clear`](Self::on_clear)
    /// cleanups; if one panics the others still run and the panic continues after).
    ///
    /// `T: 'static` keeps a destructor from reading other pool memory, which may be
    /// gone by the time it runs.
    ///
    /// ```
    /// let mut pool = proxalloc::Pool::new();
    /// let names = pool.alloc_owned(vec![String::from("a")]); // dropped at clear
    /// names.push("b".into());
    /// assert_eq!(names.len(), 2);
    /// pool.clear(); // the Vec and its Strings are dropped here
    /// ```
    #[allow(clippy::mut_from_ref)]
    pub fn alloc_owned<T: Send + 'static>(&self, value: T) -> &mut T {
        if !std::mem::needs_drop::<T>() {
            return self.alloc(value);
        }
        let node = self
            .alloc_layout(Layout::new::<OwnedNode<T>>())
            .cast::<OwnedNode<T>>();
        let st = self.st();
        // SAFETY: fresh memory for the node, handed out once.
        unsafe {
            node.as_ptr().write(OwnedNode {
                header: CleanupHeader {
                    next: st.cleanups,
                    run: drop_owned::<T>,
                    live: true,
                },
                value,
            });
            st.cleanups = node.as_ptr().cast();
            st.cleanup_count += 1;
            &mut (*node.as_ptr()).value
        }
    }

    /// Registers `f` to run when the pool is cleared or dropped (last registered runs
    /// first, APR's order). Cancel it with [`cancel`](Self::cancel).
    ///
    /// ```
    /// use std::sync::atomic::{AtomicUsize, Ordering};
    /// static CLOSED: AtomicUsize = AtomicUsize::new(0);
    /// let mut pool = proxalloc::Pool::new();
    /// pool.on_clear(|| { CLOSED.fetch_add(1, Ordering::Relaxed); });
    /// let key = pool.on_clear(|| unreachable!());
    /// pool.cancel(key);
    /// pool.clear();
    /// assert_eq!(CLOSED.load(Ordering::Relaxed), 1);
    /// ```
    pub fn on_clear(&self, f: impl FnOnce() + Send + 'static) -> CleanupKey<'_> {
        let node = self.alloc_with(|| ClosureNode {
            header: CleanupHeader {
                next: ptr::null_mut(),
                run: run_closure_of(&f),
                live: true,
            },
            f: ManuallyDrop::new(f),
        });
        let header: *mut CleanupHeader = (node as *mut ClosureNode<_>).cast();
        let st = self.st();
        // SAFETY: the node was just allocated and initialised.
        unsafe { (*header).next = st.cleanups };
        st.cleanups = header;
        st.cleanup_count += 1;
        CleanupKey {
            node: header,
            pool: self.state.get().cast_const().cast(),
            _pool: PhantomData,
        }
    }

    /// Cancels a cleanup registered with [`on_clear`](Self::on_clear): its closure is
    /// dropped without running.
    ///
    /// # Panics
    /// If `key` belongs to another pool.
    ///
    /// ```
    /// let mut pool = proxalloc::Pool::new();
    /// let key = pool.on_clear(|| panic!("never runs"));
    /// pool.cancel(key);
    /// pool.clear();
    /// ```
    pub fn cancel(&self, key: CleanupKey<'_>) {
        assert!(
            ptr::eq(key.pool, self.state.get().cast_const().cast()),
            "proxalloc: cleanup key of another pool"
        );
        // SAFETY: the key borrows this pool, so the node is live and registered here, and
        // a key is consumed once, so its closure is still there.
        unsafe { (*key.node).live = false };
        // Counted before the closure is dropped, which is user code that may panic.
        self.st().cleanup_count -= 1;
        // SAFETY: as above.
        unsafe { ((*key.node).run)(key.node, false) };
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

    /// Formats `args` straight into pool memory (APR's `apr_psprintf`); see also the
    /// [`pformat!`](crate::pformat) macro.
    ///
    /// ```
    /// let pool = proxalloc::Pool::new();
    /// let s = pool.alloc_fmt(format_args!("{}-{}", "a", 1));
    /// assert_eq!(s, "a-1");
    /// ```
    #[allow(clippy::mut_from_ref)]
    #[must_use = "the allocation stays in the pool until it is cleared; an unused one only wastes pool memory"]
    pub fn alloc_fmt(&self, args: fmt::Arguments<'_>) -> &mut str {
        if let Some(s) = args.as_str() {
            return self.alloc_str(s);
        }
        let mut w = PoolWriter::new(self);
        fmt::Write::write_fmt(&mut w, args)
            .expect("a formatting trait implementation returned an error");
        // SAFETY: only `fmt::Write` wrote to it, so it holds UTF-8.
        unsafe { std::str::from_utf8_unchecked_mut(w.finish()) }
    }

    /// A child pool drawing from the same source. It borrows this pool, so this pool can
    /// be neither cleared nor dropped while the child lives (APR's "clearing a pool
    /// destroys its children" becomes a compile-time rule). Clear the child on its own to
    /// reuse its memory: the iterpool idiom.
    ///
    /// ```
    /// let pool = proxalloc::Pool::new();
    /// let mut iterpool = pool.subpool();
    /// for i in 0..1000 {
    ///     iterpool.clear();
    ///     let scratch = iterpool.alloc_slice_fill_with(100, |j| i * j);
    ///     assert_eq!(scratch[99], i * 99);
    /// }
    /// ```
    pub fn subpool(&self) -> SubPool<'_, 's> {
        SubPool {
            pool: Pool::with_source_debug(self.source, self.debug),
            _parent: PhantomData,
        }
    }

    /// Runs `f` with a fresh subpool, freed when `f` returns.
    ///
    /// ```
    /// let pool = proxalloc::Pool::new();
    /// let total: usize = pool.scope(|tmp| {
    ///     // `tmp` is a subpool, cleared when the closure returns.
    ///     let parts = tmp.alloc_slice_fill_with(10, |i| i);
    ///     parts.iter().sum()
    /// });
    /// assert_eq!(total, 45);
    /// ```
    pub fn scope<R>(&self, f: impl FnOnce(&Pool<'s>) -> R) -> R {
        let sub = self.subpool();
        f(&sub)
    }

    /// A writer that appends to a buffer in pool memory (see [`PoolWriter`]).
    ///
    /// ```
    /// use std::fmt::Write;
    /// let pool = proxalloc::Pool::new();
    /// let mut w = pool.writer();
    /// write!(w, "{} {}", 404, "Not Found").unwrap();
    /// assert_eq!(w.finish(), b"404 Not Found");
    /// ```
    pub fn writer(&self) -> PoolWriter<'_, 's> {
        PoolWriter::new(self)
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

    fn run_cleanups(&mut self) -> Option<Box<dyn Any + Send>> {
        let mut first_panic = None;
        loop {
            let st = self.st();
            let node = st.cleanups;
            if node.is_null() {
                break;
            }
            // SAFETY: registered nodes are live pool memory; each runs once, after it
            // is unlinked (so a cleanup that registers another is safe).
            unsafe {
                st.cleanups = (*node).next;
                if (*node).live {
                    (*node).live = false;
                    st.cleanup_count -= 1;
                    let run = (*node).run;
                    if let Err(p) = catch_unwind(AssertUnwindSafe(|| run(node, true))) {
                        // The first panic goes on once every cleanup has run; later
                        // payloads are forgotten, not dropped: a payload whose own `Drop`
                        // panics would unwind out of here and skip the other cleanups.
                        match first_panic {
                            None => first_panic = Some(p),
                            Some(_) => std::mem::forget(p),
                        }
                    }
                }
            }
        }
        first_panic
    }

    /// Returns blocks to the source: all but the first (`clear`), or all (`drop`).
    fn release_blocks(&mut self, all: bool) {
        let st = self.state.get_mut();
        st.high_water = st.high_water.max(st.used());
        st.debug_used = 0;
        for (p, layout) in st.debug_blocks.drain(..) {
            // SAFETY: each debug allocation is its own heap block, freed once here.
            unsafe {
                p.as_ptr().write_bytes(POISON, layout.size());
                std::alloc::dealloc(p.as_ptr(), layout);
            }
        }
        let mut lists = [st.retained, st.large];
        if st.active != st.first {
            // SAFETY: the active block is a live header owned by the pool.
            unsafe { (*st.active).next = lists[0] };
            lists[0] = st.active;
        }
        for mut b in lists {
            while !b.is_null() {
                // SAFETY: blocks on the lists are live headers owned by the pool; each is
                // freed once (the first block, which may be on the retained list after a
                // probe made another block active, is handled below).
                unsafe {
                    let next = (*b).next;
                    if b != st.first {
                        self.source.free(BlockHeader::raw(b));
                    }
                    b = next;
                }
            }
        }
        st.retained = ptr::null_mut();
        st.large = ptr::null_mut();
        if st.first.is_null() {
            st.blocks = 0;
            st.retained_bytes = 0;
            return;
        }
        if all {
            // SAFETY: the first block is a live header owned by the pool.
            unsafe { self.source.free(BlockHeader::raw(st.first)) };
            st.first = ptr::null_mut();
            st.active = ptr::null_mut();
            st.cursor = SENTINEL;
            st.end = SENTINEL;
            st.blocks = 0;
            st.retained_bytes = 0;
        } else {
            let first = st.first;
            // SAFETY: as above.
            unsafe {
                st.retained_bytes = (*first).size;
                st.blocks = 1;
                st.active = first;
                st.cursor = BlockHeader::data(first);
                st.end = BlockHeader::end(first);
            }
            if self.debug {
                // SAFETY: the block's data area is the pool's; poison what was used.
                unsafe {
                    st.cursor
                        .write_bytes(POISON, st.end.addr() - st.cursor.addr())
                };
            }
        }
        st.next_block = BLOCK_CLASSES[0];
    }
}

impl Drop for Pool<'_> {
    fn drop(&mut self) {
        let panic = self.run_cleanups();
        self.release_blocks(true);
        if let Some(p) = panic {
            if !std::thread::panicking() {
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

fn run_closure_of<F: FnOnce()>(_: &F) -> unsafe fn(*mut CleanupHeader, bool) {
    run_closure::<F>
}

/// Every allocation's size is rounded up to a multiple of this, so the cursor stays
/// aligned to it (APR's `APR_ALIGN_DEFAULT`).
const MIN_ALIGN: usize = 8;

/// `size` rounded up to a multiple of [`MIN_ALIGN`] (no overflow for a `Layout`'s size,
/// which is at most `isize::MAX`).
#[inline(always)]
const fn round_up(size: usize) -> usize {
    (size + MIN_ALIGN - 1) & !(MIN_ALIGN - 1)
}

/// Where `cursor` and `end` point while the pool has no active block: non-null, so the
/// fast path can hand out zero-sized allocations without a check, and equal, so it hands
/// out nothing else.
const SENTINEL: *mut u8 = ptr::without_provenance_mut(BLOCK_ALIGN);

fn dangling(align: usize) -> NonNull<u8> {
    // SAFETY: alignments are non-zero.
    unsafe { NonNull::new_unchecked(ptr::without_provenance_mut(align)) }
}

/// The block with the most room on a list.
///
/// # Safety
/// The list is made of live headers.
unsafe fn best_retained(mut b: *mut BlockHeader) -> Option<*mut BlockHeader> {
    let mut best: Option<(*mut BlockHeader, usize)> = None;
    while !b.is_null() {
        // SAFETY: per the contract.
        let room = unsafe { BlockHeader::room(b) };
        if best.is_none_or(|(_, r)| room > r) {
            best = Some((b, room));
        }
        // SAFETY: per the contract.
        b = unsafe { (*b).next };
    }
    best.map(|(b, _)| b)
}

/// Removes `target` from the list at `head`.
///
/// # Safety
/// The list is made of live headers and contains `target`.
unsafe fn unlink(head: &mut *mut BlockHeader, target: *mut BlockHeader) {
    let mut link: *mut *mut BlockHeader = head;
    // SAFETY: per the contract.
    unsafe {
        while *link != target {
            link = &mut (**link).next;
        }
        *link = (*target).next;
        (*target).next = ptr::null_mut();
    }
}

/// A cleanup registered with [`Pool::on_clear`], to [`cancel`](Pool::cancel) it.
///
/// ```
/// let mut pool = proxalloc::Pool::new();
/// let key: proxalloc::CleanupKey<'_> = pool.on_clear(|| println!("cleared"));
/// pool.cancel(key);
/// pool.clear();
/// ```
pub struct CleanupKey<'p> {
    node: *mut CleanupHeader,
    pool: *const (),
    _pool: PhantomData<&'p ()>,
}

impl fmt::Debug for CleanupKey<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CleanupKey").finish_non_exhaustive()
    }
}

/// A child pool from [`Pool::subpool`]: a [`Pool`] that borrows its parent.
///
/// ```
/// let pool = proxalloc::Pool::new();
/// let mut iter = pool.subpool();
/// for i in 0..3 {
///     let _ = iter.alloc(i); // per-iteration scratch
///     iter.clear();
/// }
/// ```
pub struct SubPool<'p, 's> {
    pool: Pool<'s>,
    _parent: PhantomData<&'p Pool<'s>>,
}

impl<'s> SubPool<'_, 's> {
    /// Clears the child (see [`Pool::clear`]).
    ///
    /// ```
    /// let pool = proxalloc::Pool::new();
    /// let mut child = pool.subpool();
    /// let _ = child.alloc_str("scratch");
    /// child.clear();
    /// assert_eq!(child.stats().used_bytes, 0);
    /// ```
    pub fn clear(&mut self) {
        self.pool.clear();
    }
}

impl<'s> Deref for SubPool<'_, 's> {
    type Target = Pool<'s>;
    fn deref(&self) -> &Pool<'s> {
        &self.pool
    }
}

impl fmt::Debug for SubPool<'_, '_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("SubPool").field(&self.pool).finish()
    }
}

/// Builds bytes in pool memory, coalescing many small writes into one growing buffer
/// (grown in place while it is the pool's most recent allocation). Implements
/// [`fmt::Write`] and [`std::io::Write`].
///
/// ```
/// use std::io::Write;
/// let pool = proxalloc::Pool::new();
/// let mut w = pool.writer();
/// write!(w, "HTTP/1.1 {} {}\r\n", 200, "OK").unwrap();
/// for (k, v) in [("a", "1"), ("b", "2")] {
///     w.write_all(k.as_bytes()).unwrap();
///     w.write_all(b": ").unwrap();
///     w.write_all(v.as_bytes()).unwrap();
///     w.write_all(b"\r\n").unwrap();
/// }
/// let response: &[u8] = w.finish();
/// assert_eq!(response, b"HTTP/1.1 200 OK\r\na: 1\r\nb: 2\r\n");
/// ```
pub struct PoolWriter<'p, 's> {
    pool: &'p Pool<'s>,
    buf: NonNull<u8>,
    len: usize,
    cap: usize,
}

impl<'p, 's> PoolWriter<'p, 's> {
    fn new(pool: &'p Pool<'s>) -> Self {
        PoolWriter {
            pool,
            buf: dangling(1),
            len: 0,
            cap: 0,
        }
    }

    /// Appends `bytes`.
    ///
    /// # Panics
    /// Through [`std::alloc::handle_alloc_error`] if the pool's source fails.
    ///
    /// ```
    /// let pool = proxalloc::Pool::new();
    /// let mut w = pool.writer();
    /// w.push_bytes(b"GET ");
    /// w.push_bytes(b"/");
    /// assert_eq!(w.finish(), b"GET /");
    /// ```
    pub fn push_bytes(&mut self, bytes: &[u8]) {
        if bytes.len() > self.cap - self.len {
            let want = (self.len + bytes.len()).max(self.cap * 2).max(64);
            self.buf = if self.cap == 0 {
                self.pool
                    .alloc_layout(Layout::array::<u8>(want).expect("too large"))
            } else {
                // SAFETY: the buffer is this pool's, `cap` bytes, byte-aligned.
                unsafe { self.pool.grow(self.buf, self.cap, want, 1) }.unwrap_or_else(|_| {
                    std::alloc::handle_alloc_error(Layout::array::<u8>(want).unwrap())
                })
            };
            self.cap = want;
        }
        // SAFETY: room for `bytes` after `len`.
        unsafe {
            ptr::copy_nonoverlapping(bytes.as_ptr(), self.buf.as_ptr().add(self.len), bytes.len())
        };
        self.len += bytes.len();
    }

    /// Bytes written so far.
    ///
    /// ```
    /// let pool = proxalloc::Pool::new();
    /// let mut w = pool.writer();
    /// w.push_bytes(b"abc");
    /// assert_eq!(w.len(), 3);
    /// ```
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether nothing was written.
    ///
    /// ```
    /// let pool = proxalloc::Pool::new();
    /// assert!(pool.writer().is_empty());
    /// ```
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The bytes written, in pool memory; unused room goes back to the pool.
    ///
    /// ```
    /// let pool = proxalloc::Pool::new();
    /// let mut w = pool.writer();
    /// w.push_bytes(b"done");
    /// let bytes: &mut [u8] = w.finish(); // stays in the pool until it is cleared
    /// assert_eq!(bytes, b"done");
    /// ```
    pub fn finish(self) -> &'p mut [u8] {
        // SAFETY: the buffer is this pool's, with `len` initialised bytes.
        unsafe {
            if self.cap > 0 {
                self.pool.shrink_last(self.buf, self.cap, self.len);
            }
            std::slice::from_raw_parts_mut(self.buf.as_ptr(), self.len)
        }
    }
}

impl fmt::Write for PoolWriter<'_, '_> {
    fn write_str(&mut self, s: &str) -> fmt::Result {
        self.push_bytes(s.as_bytes());
        Ok(())
    }
}

impl std::io::Write for PoolWriter<'_, '_> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.push_bytes(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// Formats into pool memory: `pformat!(pool, "{} {}", a, b)` returns a `&mut str` that
/// lives as long as the pool borrow (APR's `apr_psprintf`).
#[macro_export]
macro_rules! pformat {
    ($pool:expr, $($arg:tt)*) => {
        $pool.alloc_fmt(::std::format_args!($($arg)*))
    };
}

/// A vector in pool memory: elements are not zeroed, and it grows in place while it is
/// the pool's most recent allocation (copying otherwise). Dropping it drops its
/// elements; [`into_slice`](Self::into_slice) leaves them in the pool.
///
/// ```
/// let pool = proxalloc::Pool::new();
/// let mut v = proxalloc::PoolVec::new_in(&pool);
/// for i in 0..100 { v.push(i); }
/// assert_eq!(v.iter().sum::<i32>(), 4950);
/// let kept: &mut [i32] = v.into_slice();
/// assert_eq!(kept.len(), 100);
/// ```
pub struct PoolVec<'p, 's, T> {
    pool: &'p Pool<'s>,
    ptr: NonNull<T>,
    len: usize,
    cap: usize,
}

impl<'p, 's, T> PoolVec<'p, 's, T> {
    /// An empty vector (takes no memory until the first push).
    ///
    /// ```
    /// let pool = proxalloc::Pool::new();
    /// let mut v = proxalloc::PoolVec::new_in(&pool);
    /// v.push("x");
    /// assert_eq!(v.len(), 1);
    /// ```
    pub fn new_in(pool: &'p Pool<'s>) -> Self {
        PoolVec {
            pool,
            ptr: NonNull::dangling(),
            len: 0,
            cap: if size_of::<T>() == 0 { usize::MAX } else { 0 },
        }
    }

    /// An empty vector with room for `cap` elements.
    ///
    /// ```
    /// let pool = proxalloc::Pool::new();
    /// let v = proxalloc::PoolVec::<u64>::with_capacity_in(32, &pool);
    /// assert!(v.capacity() >= 32);
    /// ```
    pub fn with_capacity_in(cap: usize, pool: &'p Pool<'s>) -> Self {
        let mut v = Self::new_in(pool);
        v.reserve(cap);
        v
    }

    /// Makes room for `additional` more elements.
    ///
    /// ```
    /// let pool = proxalloc::Pool::new();
    /// let mut v = proxalloc::PoolVec::<u8>::new_in(&pool);
    /// v.reserve(100);
    /// assert!(v.capacity() >= 100);
    /// ```
    pub fn reserve(&mut self, additional: usize) {
        let need = self.len.checked_add(additional).expect("capacity overflow");
        if need <= self.cap {
            return;
        }
        let new_cap = need.max(self.cap * 2).max(4);
        let layout = Layout::array::<T>(new_cap).expect("capacity overflow");
        let ptr = if self.cap == 0 {
            self.pool.alloc_layout(layout)
        } else {
            // SAFETY: the buffer is this pool's, `cap` elements of `T`; elements are moved
            // bitwise, as Rust moves are.
            unsafe {
                self.pool.grow(
                    self.ptr.cast(),
                    self.cap * size_of::<T>(),
                    layout.size(),
                    align_of::<T>(),
                )
            }
            .unwrap_or_else(|_| std::alloc::handle_alloc_error(layout))
        };
        self.ptr = ptr.cast();
        self.cap = new_cap;
    }

    /// Appends `value`.
    ///
    /// ```
    /// let pool = proxalloc::Pool::new();
    /// let mut v = proxalloc::PoolVec::new_in(&pool);
    /// v.push(String::from("owned")); // dropped with the vector
    /// assert_eq!(v[0], "owned");
    /// ```
    #[inline]
    pub fn push(&mut self, value: T) {
        if self.len == self.cap {
            self.reserve(1);
        }
        // SAFETY: `len < cap`.
        unsafe { self.ptr.as_ptr().add(self.len).write(value) };
        self.len += 1;
    }

    /// Removes and returns the last element.
    ///
    /// ```
    /// let pool = proxalloc::Pool::new();
    /// let mut v = proxalloc::PoolVec::new_in(&pool);
    /// v.push(1);
    /// assert_eq!(v.pop(), Some(1));
    /// assert_eq!(v.pop(), None);
    /// ```
    pub fn pop(&mut self) -> Option<T> {
        if self.len == 0 {
            return None;
        }
        self.len -= 1;
        // SAFETY: the element at `len` was initialised and is now outside the vector.
        Some(unsafe { self.ptr.as_ptr().add(self.len).read() })
    }

    /// Elements allocated room for.
    ///
    /// ```
    /// let pool = proxalloc::Pool::new();
    /// let mut v = proxalloc::PoolVec::new_in(&pool);
    /// v.push(1u32);
    /// assert!(v.capacity() >= 1);
    /// ```
    pub fn capacity(&self) -> usize {
        self.cap
    }

    /// Drops every element (the memory stays with the pool).
    ///
    /// ```
    /// let pool = proxalloc::Pool::new();
    /// let mut v = proxalloc::PoolVec::new_in(&pool);
    /// v.extend([1, 2, 3]);
    /// v.clear();
    /// assert!(v.is_empty());
    /// ```
    pub fn clear(&mut self) {
        let len = std::mem::replace(&mut self.len, 0);
        // SAFETY: the first `len` elements were initialised; now outside the vector.
        unsafe { ptr::drop_in_place(ptr::slice_from_raw_parts_mut(self.ptr.as_ptr(), len)) };
    }

    /// The elements, left in the pool (never dropped).
    ///
    /// ```
    /// let pool = proxalloc::Pool::new();
    /// let mut v = proxalloc::PoolVec::new_in(&pool);
    /// v.extend_from_slice(&[3, 2, 1]);
    /// let s = v.into_slice(); // lives as long as the pool's borrow, never dropped
    /// s.sort();
    /// assert_eq!(s, [1, 2, 3]);
    /// ```
    pub fn into_slice(self) -> &'p mut [T] {
        let this = ManuallyDrop::new(self);
        // SAFETY: `len` initialised elements in pool memory that lives for `'p`.
        unsafe { std::slice::from_raw_parts_mut(this.ptr.as_ptr(), this.len) }
    }
}

impl<T: Clone> PoolVec<'_, '_, T> {
    /// Appends clones of `items`.
    ///
    /// ```
    /// let pool = proxalloc::Pool::new();
    /// let mut v = proxalloc::PoolVec::new_in(&pool);
    /// v.extend_from_slice(&["a", "b"]);
    /// assert_eq!(&v[..], ["a", "b"]);
    /// ```
    pub fn extend_from_slice(&mut self, items: &[T]) {
        self.reserve(items.len());
        for x in items {
            self.push(x.clone());
        }
    }
}

impl<T> Extend<T> for PoolVec<'_, '_, T> {
    fn extend<I: IntoIterator<Item = T>>(&mut self, iter: I) {
        let iter = iter.into_iter();
        self.reserve(iter.size_hint().0);
        for x in iter {
            self.push(x);
        }
    }
}

impl<T> Deref for PoolVec<'_, '_, T> {
    type Target = [T];
    fn deref(&self) -> &[T] {
        // SAFETY: `len` initialised elements.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }
}

impl<T> DerefMut for PoolVec<'_, '_, T> {
    fn deref_mut(&mut self) -> &mut [T] {
        // SAFETY: `len` initialised elements, borrowed exclusively.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len) }
    }
}

impl<T> Drop for PoolVec<'_, '_, T> {
    fn drop(&mut self) {
        self.clear();
    }
}

impl<T: fmt::Debug> fmt::Debug for PoolVec<'_, '_, T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_list().entries(self.iter()).finish()
    }
}

// SAFETY: the pool hands out distinct, suitably aligned regions that stay valid until the
// pool is cleared, which needs `&mut Pool` and so cannot happen while a `&Pool` (this
// allocator) is alive. Deallocation and shrinking only ever give back the most recent
// allocation's tail; growth in place only extends the most recent allocation.
unsafe impl allocator_api2::alloc::Allocator for &Pool<'_> {
    fn allocate(&self, layout: Layout) -> Result<NonNull<[u8]>, allocator_api2::alloc::AllocError> {
        let p = self
            .try_alloc_layout(layout)
            .map_err(|_| allocator_api2::alloc::AllocError)?;
        Ok(NonNull::slice_from_raw_parts(p, layout.size()))
    }

    unsafe fn deallocate(&self, ptr: NonNull<u8>, layout: Layout) {
        if layout.size() != 0 {
            // SAFETY: per the trait's contract `ptr` is a live allocation of `layout`.
            unsafe { self.shrink_last(ptr, layout.size(), 0) };
        }
    }

    unsafe fn grow(
        &self,
        ptr: NonNull<u8>,
        old: Layout,
        new: Layout,
    ) -> Result<NonNull<[u8]>, allocator_api2::alloc::AllocError> {
        let p = if old.size() == 0 || ptr.as_ptr().addr() % new.align() != 0 {
            let fresh = self
                .try_alloc_layout(new)
                .map_err(|_| allocator_api2::alloc::AllocError)?;
            // SAFETY: distinct regions, `old.size()` bytes valid in both.
            unsafe { ptr::copy_nonoverlapping(ptr.as_ptr(), fresh.as_ptr(), old.size()) };
            fresh
        } else {
            // SAFETY: per the trait's contract `ptr` is a live allocation of `old`.
            unsafe { Pool::grow(self, ptr, old.size(), new.size(), new.align()) }
                .map_err(|_| allocator_api2::alloc::AllocError)?
        };
        Ok(NonNull::slice_from_raw_parts(p, new.size()))
    }

    unsafe fn shrink(
        &self,
        ptr: NonNull<u8>,
        old: Layout,
        new: Layout,
    ) -> Result<NonNull<[u8]>, allocator_api2::alloc::AllocError> {
        if ptr.as_ptr().addr() % new.align() != 0 {
            let fresh = self
                .try_alloc_layout(new)
                .map_err(|_| allocator_api2::alloc::AllocError)?;
            // SAFETY: distinct regions, `new.size()` bytes valid in both.
            unsafe { ptr::copy_nonoverlapping(ptr.as_ptr(), fresh.as_ptr(), new.size()) };
            return Ok(NonNull::slice_from_raw_parts(fresh, new.size()));
        }
        if old.size() != 0 {
            // SAFETY: per the trait's contract `ptr` is a live allocation of `old`.
            unsafe { self.shrink_last(ptr, old.size(), new.size()) };
        }
        Ok(NonNull::slice_from_raw_parts(ptr, new.size()))
    }
}

#[cfg(all(test, not(proxalloc_loom)))]
mod tests {
    use super::*;

    #[test]
    fn the_cursor_stays_aligned_and_sizes_round_up() {
        let src = BlockSource::new(1 << 20);
        let pool = Pool::with_source(&src);
        let mut prev: Option<usize> = None;
        for size in [1usize, 3, 8, 9, 15, 16, 17, 0, 5] {
            let p = pool.alloc_layout(Layout::from_size_align(size, 1).unwrap());
            assert_eq!(p.as_ptr().addr() % MIN_ALIGN, 0, "size {size}");
            if let Some(q) = prev {
                assert!(p.as_ptr().addr() >= q, "bumps upward");
            }
            prev = Some(p.as_ptr().addr() + round_up(size));
        }
        let wide = pool.alloc_layout(Layout::from_size_align(3, 64).unwrap());
        assert_eq!(wide.as_ptr().addr() % 64, 0);
        let next = pool.alloc_layout(Layout::from_size_align(1, 1).unwrap());
        assert_eq!(next.as_ptr().addr(), wide.as_ptr().addr() + MIN_ALIGN);
    }

    #[test]
    fn only_the_allocation_ending_at_the_cursor_grows_or_shrinks_in_place() {
        let src = BlockSource::new(1 << 20);
        let pool = Pool::with_source(&src);
        let a = pool.alloc_layout(Layout::from_size_align(13, 1).unwrap());
        // SAFETY: `a` is this pool's 13-byte allocation, the most recent one.
        let g = unsafe { pool.grow(a, 13, 100, 1) }.unwrap();
        assert_eq!(g, a, "in place");
        let b = pool.alloc_layout(Layout::from_size_align(5, 1).unwrap());
        assert_eq!(b.as_ptr().addr(), a.as_ptr().addr() + 104);
        // SAFETY: `a` is now 100 bytes, and not the most recent allocation.
        let moved = unsafe { pool.grow(a, 100, 200, 1) }.unwrap();
        assert_ne!(moved, a, "copied");
        // SAFETY: `a` is 100 bytes and not last: nothing happens.
        unsafe { pool.shrink_last(a, 100, 0) };
        // SAFETY: `moved` is the last allocation, 200 bytes; give all of it back.
        unsafe { pool.shrink_last(moved, 200, 0) };
        let c = pool.alloc_layout(Layout::from_size_align(8, 8).unwrap());
        assert_eq!(c, moved, "its room was given back");
    }

    #[test]
    fn a_probed_block_grows_its_last_allocation_in_place() {
        let src = BlockSource::new(1 << 20);
        let pool = Pool::with_source(&src);
        // Fill the first block but for ~1 KiB, then move to a second block.
        let a = pool.alloc_layout(Layout::from_size_align(7000, 8).unwrap());
        let _ = pool.alloc_layout(Layout::from_size_align(9000, 8).unwrap());
        let _ = pool.alloc_layout(Layout::from_size_align(7000, 8).unwrap());
        // The 16 KiB block has about 300 bytes left, the first block about 1 KiB: the
        // probe makes the first block active again, with its cursor right after `a`.
        let b = pool.alloc_layout(Layout::from_size_align(800, 8).unwrap());
        assert_eq!(b.as_ptr().addr(), a.as_ptr().addr() + 7000);
        // SAFETY: `b` is the most recent allocation, 800 bytes.
        assert_eq!(unsafe { pool.grow(b, 800, 1000, 8) }.unwrap(), b);
        // SAFETY: `a` is 7000 bytes, not the most recent allocation.
        assert_ne!(unsafe { pool.grow(a, 7000, 7100, 8) }.unwrap(), a);
    }
}
