//! `&Pool` as an `allocator_api2` allocator, so `allocator_api2`'s (or, with the
//! `nightly` feature, the standard library's) collections can live in a pool.

use std::alloc::Layout;
use std::ptr::{self, NonNull};

use super::Pool;

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
