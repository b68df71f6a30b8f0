//! The byte arenas of the pool workloads (W6, W7, create-use-drop), behind one trait:
//! proxalloc's `Pool`, bumpalo, typed-arena, and malloc/free per allocation through any
//! `GlobalAlloc`, so that `super::workloads` writes each loop once.

use std::alloc::{GlobalAlloc, Layout};

use proxalloc::Pool;

/// Memory handed out by the allocation and released all at once by `clear`.
pub trait Arena {
    /// Memory for `layout`, valid until the next `clear` (or the arena's drop).
    ///
    /// # Safety
    /// `layout.size()` is not zero (`GlobalAlloc::alloc`'s rule, which the malloc/free
    /// contender passes on).
    unsafe fn alloc(&mut self, layout: Layout) -> *mut u8;
    /// Releases every allocation since the last `clear`.
    fn clear(&mut self);
}

impl Arena for Pool<'_> {
    #[inline(always)]
    unsafe fn alloc(&mut self, layout: Layout) -> *mut u8 {
        self.alloc_layout(layout).as_ptr()
    }
    #[inline(always)]
    fn clear(&mut self) {
        Pool::clear(self)
    }
}

impl Arena for bumpalo::Bump {
    #[inline(always)]
    unsafe fn alloc(&mut self, layout: Layout) -> *mut u8 {
        self.alloc_layout(layout).as_ptr()
    }
    #[inline(always)]
    fn clear(&mut self) {
        self.reset()
    }
}

/// typed-arena over bytes. It cannot be cleared: `clear` drops it and starts a new one,
/// so each round pays an arena's creation and drop. Sizes only: its bytes have no
/// alignment beyond 1.
pub struct TypedArena(pub typed_arena::Arena<u8>);

impl TypedArena {
    pub fn new() -> Self {
        TypedArena(typed_arena::Arena::new())
    }
}

impl Default for TypedArena {
    fn default() -> Self {
        Self::new()
    }
}

impl Arena for TypedArena {
    #[inline(always)]
    unsafe fn alloc(&mut self, layout: Layout) -> *mut u8 {
        // SAFETY: the bytes are only written through the raw pointer, never read first.
        unsafe { self.0.alloc_uninitialized(layout.size()) }
            .as_mut_ptr()
            .cast()
    }
    #[inline(always)]
    fn clear(&mut self) {
        self.0 = typed_arena::Arena::new();
    }
}

/// No arena at all: every allocation is a `malloc` of the given allocator, and `clear`
/// frees them one by one, in allocation order.
pub struct MallocFree<A: GlobalAlloc> {
    alloc: A,
    live: Vec<(*mut u8, Layout)>,
}

impl<A: GlobalAlloc> MallocFree<A> {
    /// `capacity`: the allocations expected between two clears (the list of live blocks
    /// then never grows while measured).
    pub fn new(alloc: A, capacity: usize) -> Self {
        MallocFree {
            alloc,
            live: Vec::with_capacity(capacity),
        }
    }
}

impl<A: GlobalAlloc> Arena for MallocFree<A> {
    #[inline(always)]
    unsafe fn alloc(&mut self, layout: Layout) -> *mut u8 {
        // SAFETY: a non-zero size (this function's contract); freed in `clear` with it.
        let p = unsafe { self.alloc.alloc(layout) };
        assert!(!p.is_null(), "out of memory");
        self.live.push((p, layout));
        p
    }
    #[inline(always)]
    fn clear(&mut self) {
        for (p, layout) in self.live.drain(..) {
            // SAFETY: allocated in `alloc` with this layout, freed once.
            unsafe { self.alloc.dealloc(p, layout) };
        }
    }
}

impl<A: GlobalAlloc> Drop for MallocFree<A> {
    fn drop(&mut self) {
        self.clear();
    }
}
