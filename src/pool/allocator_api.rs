//! `&Pool` as an allocator-api2 allocator, so allocator-api2's collections (and, with
//! `--cfg proxalloc_nightly` and allocator-api2's `nightly`, the standard library's) can
//! live in a pool. One implementation serves both supported versions of the trait (0.2,
//! and 0.4 with the `allocator-api2-04` feature): `impl_allocator!` writes the impl for
//! a crate path, over the version-free functions below.

use std::alloc::Layout;
use std::ptr::{self, NonNull};

use super::Pool;
use crate::error::AllocError;

/// `Allocator::allocate`.
#[inline]
fn allocate(pool: &Pool<'_>, layout: Layout) -> Result<NonNull<[u8]>, AllocError> {
    let p = pool.try_alloc_layout(layout)?;
    Ok(NonNull::slice_from_raw_parts(p, layout.size()))
}

/// `Allocator::deallocate`.
///
/// # Safety
/// As for the trait: `ptr` is a live allocation of `layout` from `pool`.
#[inline]
unsafe fn deallocate(pool: &Pool<'_>, ptr: NonNull<u8>, layout: Layout) {
    if layout.size() != 0 {
        // SAFETY: per the contract `ptr` is a live allocation of `layout`.
        unsafe { pool.shrink_last(ptr, layout.size(), 0) };
    }
}

/// `Allocator::grow`.
///
/// # Safety
/// As for the trait: `ptr` is a live allocation of `old` from `pool`, and
/// `new.size() >= old.size()`.
#[inline]
unsafe fn grow(
    pool: &Pool<'_>,
    ptr: NonNull<u8>,
    old: Layout,
    new: Layout,
) -> Result<NonNull<[u8]>, AllocError> {
    let p = if old.size() == 0 || ptr.as_ptr().addr() % new.align() != 0 {
        // SAFETY: per the contract `ptr` is valid for `old.size()` bytes.
        unsafe { copy_to_new(pool, ptr, new, old.size()) }?
    } else {
        // SAFETY: per the contract `ptr` is a live allocation of `old`.
        unsafe { Pool::grow(pool, ptr, old.size(), new.size(), new.align()) }?
    };
    Ok(NonNull::slice_from_raw_parts(p, new.size()))
}

/// `Allocator::shrink`.
///
/// # Safety
/// As for the trait: `ptr` is a live allocation of `old` from `pool`, and
/// `new.size() <= old.size()`.
#[inline]
unsafe fn shrink(
    pool: &Pool<'_>,
    ptr: NonNull<u8>,
    old: Layout,
    new: Layout,
) -> Result<NonNull<[u8]>, AllocError> {
    if ptr.as_ptr().addr() % new.align() != 0 {
        // SAFETY: per the contract `ptr` is valid for `old.size()` bytes, which is at
        // least `new.size()`.
        let fresh = unsafe { copy_to_new(pool, ptr, new, new.size()) }?;
        return Ok(NonNull::slice_from_raw_parts(fresh, new.size()));
    }
    if old.size() != 0 {
        // SAFETY: per the contract `ptr` is a live allocation of `old`.
        unsafe { pool.shrink_last(ptr, old.size(), new.size()) };
    }
    Ok(NonNull::slice_from_raw_parts(ptr, new.size()))
}

/// A new allocation of `layout` holding the first `len` bytes at `ptr`: for a resize that
/// cannot happen in place, or whose new alignment the old start does not meet.
///
/// # Safety
/// `ptr` is valid for reads of `len` bytes, and `len <= layout.size()`.
unsafe fn copy_to_new(
    pool: &Pool<'_>,
    ptr: NonNull<u8>,
    layout: Layout,
    len: usize,
) -> Result<NonNull<u8>, AllocError> {
    let fresh = pool.try_alloc_layout(layout)?;
    // SAFETY: `fresh` is a new allocation of at least `len` bytes, so distinct from the
    // caller's region, which is valid for `len` bytes per the contract.
    unsafe { ptr::copy_nonoverlapping(ptr.as_ptr(), fresh.as_ptr(), len) };
    Ok(fresh)
}

/// `unsafe impl $api::alloc::Allocator for &Pool<'_>`, forwarding to the functions above.
macro_rules! impl_allocator {
    ($api:ident) => {
        // SAFETY: regions are distinct, aligned and valid until a clear, which needs
        // `&mut Pool` (impossible while this `&Pool` lives); freeing and shrinking give
        // back only the last allocation's tail, and growing in place only extends it.
        unsafe impl $api::alloc::Allocator for &Pool<'_> {
            #[inline]
            fn allocate(&self, layout: Layout) -> Result<NonNull<[u8]>, $api::alloc::AllocError> {
                allocate(self, layout).map_err(|_| $api::alloc::AllocError)
            }

            #[inline]
            unsafe fn deallocate(&self, ptr: NonNull<u8>, layout: Layout) {
                // SAFETY: the trait's contract is `deallocate`'s.
                unsafe { deallocate(self, ptr, layout) }
            }

            #[inline]
            unsafe fn grow(
                &self,
                ptr: NonNull<u8>,
                old: Layout,
                new: Layout,
            ) -> Result<NonNull<[u8]>, $api::alloc::AllocError> {
                // SAFETY: the trait's contract is `grow`'s.
                unsafe { grow(self, ptr, old, new) }.map_err(|_| $api::alloc::AllocError)
            }

            #[inline]
            unsafe fn shrink(
                &self,
                ptr: NonNull<u8>,
                old: Layout,
                new: Layout,
            ) -> Result<NonNull<[u8]>, $api::alloc::AllocError> {
                // SAFETY: the trait's contract is `shrink`'s.
                unsafe { shrink(self, ptr, old, new) }.map_err(|_| $api::alloc::AllocError)
            }
        }
    };
}

impl_allocator!(allocator_api2);
#[cfg(feature = "allocator-api2-04")]
impl_allocator!(allocator_api2_04);

#[cfg(all(test, not(proxalloc_loom)))]
mod tests {
    use allocator_api2::alloc::Allocator;

    use super::*;
    use crate::BlockSource;

    fn filled(pool: &Pool<'_>, layout: Layout) -> NonNull<u8> {
        let p = (&pool).allocate(layout).unwrap().cast::<u8>();
        for i in 0..layout.size() {
            // SAFETY: inside the fresh allocation.
            unsafe { p.as_ptr().add(i).write(i as u8) };
        }
        p
    }

    fn holds_prefix(p: NonNull<u8>, len: usize) -> bool {
        // SAFETY: the caller's allocation is valid for `len` bytes.
        (0..len).all(|i| unsafe { *p.as_ptr().add(i) } == i as u8)
    }

    #[test]
    fn resizes_that_need_a_new_alignment_copy_and_keep_the_bytes() {
        let src = BlockSource::new(1 << 20);
        let pool = Pool::with_source(&src);
        let a: &Pool<'_> = &pool;
        // An 8-aligned start that is not 64-aligned: growing to align 64 must copy.
        let _ = filled(&pool, Layout::from_size_align(8, 8).unwrap());
        let old = Layout::from_size_align(24, 8).unwrap();
        let p = filled(&pool, old);
        assert_ne!(p.as_ptr().addr() % 64, 0);
        let new = Layout::from_size_align(100, 64).unwrap();
        // SAFETY: `p` is a live allocation of `old` from this pool.
        let g = unsafe { Allocator::grow(&a, p, old, new) }
            .unwrap()
            .cast::<u8>();
        assert_eq!(g.as_ptr().addr() % 64, 0);
        assert!(holds_prefix(g, 24));

        // The next allocation starts 104 bytes after the 64-aligned `g`: not 128-aligned.
        let old = Layout::from_size_align(40, 8).unwrap();
        let p = filled(&pool, old);
        assert_ne!(p.as_ptr().addr() % 128, 0);
        let new = Layout::from_size_align(16, 128).unwrap();
        // SAFETY: `p` is a live allocation of `old` from this pool.
        let s = unsafe { Allocator::shrink(&a, p, old, new) }
            .unwrap()
            .cast::<u8>();
        assert_eq!(s.as_ptr().addr() % 128, 0);
        assert!(holds_prefix(s, 16));

        // Growing a zero-sized allocation copies nothing and gives real memory.
        let z = Layout::from_size_align(0, 8).unwrap();
        let p = (&pool).allocate(z).unwrap().cast::<u8>();
        // SAFETY: `p` is a live (zero-sized) allocation of `z`.
        let g =
            unsafe { Allocator::grow(&a, p, z, Layout::from_size_align(32, 8).unwrap()) }.unwrap();
        assert_eq!(g.len(), 32);
    }
}
