//! The bump core: blocks, the cursor, the fast path ([`Pool::try_alloc_layout`]) and its
//! slow path (APR's probe of retained blocks, then a new block from the source), in-place
//! growth of the most recent allocation, and giving blocks back at `clear` and drop.

use std::alloc::Layout;
use std::mem::{align_of, size_of};
use std::ptr::{self, NonNull};

use super::{BlockSource, Pool, RawBlock, State, BLOCK_ALIGN, BLOCK_CLASSES};
use crate::debug::POISON;
use crate::error::AllocError;

/// Bytes at the start of every block holding its header (one cache line, so the data
/// that follows keeps the block's alignment).
const HEADER: usize = 64;
/// The largest block a pool grows to.
const LARGEST: usize = BLOCK_CLASSES[BLOCK_CLASSES.len() - 1];
/// Requests that do not fit in the largest class block get a block of their own,
/// sized to fit (4 KiB grain, as APR sizes its nodes).
const DEDICATED: usize = LARGEST - HEADER;

#[repr(C)]
pub(super) struct BlockHeader {
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

impl State {
    /// Bytes handed out since the last clear (alignment padding included), counted from
    /// the blocks: the fast path keeps no counter.
    pub(super) fn used(&self) -> usize {
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
pub(super) const SENTINEL: *mut u8 = ptr::without_provenance_mut(BLOCK_ALIGN);

pub(super) fn dangling(align: usize) -> NonNull<u8> {
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

impl<'s> Pool<'s> {
    /// Allocates memory for `layout` (uninitialised), or an error if the source fails.
    ///
    /// Alignment is paid in padding: a request whose size plus alignment is more than the
    /// largest block class holds gets a block of its own with room for the padding, so
    /// an alignment of `A` bytes can cost about `A` bytes of memory (a 1 GiB-aligned
    /// byte takes a block of over 1 GiB).
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

    /// Returns blocks to the source: all but the first (`clear`), or all (`drop`).
    pub(super) fn release_blocks(&mut self, all: bool) {
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

    #[test]
    fn the_probe_takes_the_retained_block_with_the_most_room_even_at_an_exact_fit() {
        let src = BlockSource::new(1 << 20);
        let pool = Pool::with_source(&src);
        let bytes = |n| Layout::from_size_align(n, 8).unwrap();
        // Block A (8 KiB): 1128 bytes left after `a`.
        let a = pool.alloc_layout(bytes(7000));
        // Block B (16 KiB): 320 bytes left.
        let _ = pool.alloc_layout(bytes(9000));
        let _ = pool.alloc_layout(bytes(7000));
        // Block C (32 KiB), filled to the last byte: A and B are retained.
        let _ = pool.alloc_layout(bytes(20_000));
        let _ = pool.alloc_layout(bytes((32 << 10) - HEADER - 20_000));
        assert_eq!(pool.stats().blocks, 3);
        // Exactly A's room: the probe must pick A (not B, with less room), and take it
        // though nothing would be left over.
        let room_a = (8 << 10) - HEADER - 7000;
        let b = pool.alloc_layout(bytes(room_a));
        assert_eq!(
            b.as_ptr().addr(),
            a.as_ptr().addr() + 7000,
            "not in block A"
        );
        assert_eq!(pool.stats().blocks, 3, "a new block for a request that fit");
    }

    #[test]
    fn each_new_block_is_twice_the_last_one() {
        let src = BlockSource::new(1 << 20);
        let pool = Pool::with_source(&src);
        let retained: Vec<usize> = (0..8)
            .map(|_| {
                let _ = pool.alloc_layout(Layout::from_size_align(7000, 8).unwrap());
                pool.stats().retained_bytes >> 10
            })
            .collect();
        // Blocks of 8, 16 (two requests), 32 (four) and 64 KiB, in KiB held so far.
        assert_eq!(retained, [8, 24, 24, 56, 56, 56, 56, 120]);
    }

    #[test]
    fn a_request_of_exactly_a_largest_blocks_room_takes_a_block_that_clear_keeps() {
        let src = BlockSource::new(1 << 20);
        let mut pool = Pool::with_source(&src);
        let p = pool.alloc_layout(Layout::from_size_align(DEDICATED, 8).unwrap());
        let s = pool.stats();
        assert_eq!((s.blocks, s.retained_bytes), (1, LARGEST), "{s:?}");
        assert_eq!(src.source_stats().large_live_blocks, 0, "a dedicated block");
        pool.clear();
        let s = pool.stats();
        assert_eq!((s.blocks, s.retained_bytes), (1, LARGEST), "{s:?}");
        // The kept block serves the next request from its start.
        let q = pool.alloc_layout(Layout::from_size_align(8, 8).unwrap());
        assert_eq!(q, p);
    }
}
