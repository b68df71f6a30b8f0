//! Where object memory comes from on a miss and goes back to on overflow: the Rust global
//! allocator, one block per object.
//!
//! Using the global allocator (rather than carving slabs) means every object released here
//! really returns to the system allocator, so `trim()` and the depot budget bound the
//! footprint, and a program that installs mimalloc or jemalloc gets it underneath.

use std::alloc::Layout;
use std::ptr::NonNull;

use crate::sync::{self, StatCounter};

/// The backing allocator for objects of one layout, with counts of what it handed out.
#[derive(Debug)]
pub struct Backing {
    layout: Layout,
    allocs: StatCounter,
    frees: StatCounter,
}

impl Backing {
    /// A backing allocator for objects of `layout`.
    pub fn new(layout: Layout) -> Self {
        Backing {
            layout,
            allocs: StatCounter::new(),
            frees: StatCounter::new(),
        }
    }

    /// One object's memory, or `None` when the global allocator fails.
    pub fn alloc(&self) -> Option<NonNull<u8>> {
        let p = if self.layout.size() == 0 {
            // Zero-sized objects need no memory, only a well-aligned non-null address.
            NonNull::new(std::ptr::without_provenance_mut(self.layout.align()))
        } else {
            // SAFETY: the layout has a non-zero size.
            NonNull::new(unsafe { sync::alloc(self.layout) })
        }?;
        self.allocs.add_shared(1);
        Some(p)
    }

    /// Returns one object's memory.
    ///
    /// # Safety
    /// `p` came from [`alloc`](Self::alloc) on this backing and is not used afterwards.
    pub unsafe fn dealloc(&self, p: NonNull<u8>) {
        if self.layout.size() != 0 {
            // SAFETY: by the caller's contract `p` was allocated with `self.layout`.
            unsafe { sync::dealloc(p.as_ptr(), self.layout) };
        }
        self.frees.add_shared(1);
    }

    /// Returns every object in `objects`.
    ///
    /// # Safety
    /// As for [`dealloc`](Self::dealloc), for each pointer.
    pub unsafe fn dealloc_all(&self, objects: &[*mut u8]) {
        if self.layout.size() != 0 {
            for &p in objects {
                // SAFETY: forwarded from the caller.
                unsafe { sync::dealloc(p, self.layout) };
            }
        }
        self.frees.add_shared(objects.len() as u64);
    }

    /// Size of one object in bytes.
    pub fn object_size(&self) -> usize {
        self.layout.size()
    }

    /// Objects handed out so far.
    pub fn allocs(&self) -> u64 {
        self.allocs.get()
    }

    /// Objects returned so far.
    pub fn frees(&self) -> u64 {
        self.frees.get()
    }
}
