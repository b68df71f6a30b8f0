//! Magazines: fixed-capacity arrays of free-object pointers, and the grow-only table that
//! owns their descriptors.
//!
//! A magazine always has exactly one owner: the thread cache that holds it, the thread
//! that just popped or created it, or a depot stack (where nobody may touch its rounds).
//! Ownership moves between threads only through the depot's release/acquire CASes, so
//! the rounds need no synchronisation of their own.
//!
//! Descriptors are immortal for the life of the table (they are freed only when the table
//! is dropped): a thread holding a stale depot head may still read a descriptor's `next`
//! link, so the link must stay valid memory, and it is an atomic so that read is not a
//! data race.

use std::alloc::Layout;
use std::ptr::{self, NonNull};

use crate::sync::{self, AtomicPtr, AtomicU32, Ordering, UnsafeCell};

/// Bits of a descriptor index: the depot packs an index with a generation in one
/// `u64`, and the fewer bits the index takes, the longer the generation takes to wrap.
/// 2^24 - 1 magazines of up to 1024 objects is more memory than any allocator caches.
pub const INDEX_BITS: u32 = 24;

/// Bytes a cached object costs beyond its own: its slot in a magazine's array. Budgets
/// charge it (see [`cached_bytes`]), so they bound what a cache really holds, zero-sized
/// objects included.
pub const SLOT_BYTES: usize = std::mem::size_of::<*mut u8>();

/// What one cached object of `object_size` bytes is charged to a budget: the object and
/// its slot.
pub const fn cached_bytes(object_size: usize) -> usize {
    object_size + SLOT_BYTES
}

/// Index value that means "no magazine".
pub const NIL: u32 = (1 << INDEX_BITS) - 1;

/// The first segment holds `1 << BASE_SHIFT` descriptors; each next one twice as many.
const BASE_SHIFT: u32 = if cfg!(proxalloc_loom) { 1 } else { 4 };
/// Enough segments to address every index below [`NIL`].
const SEGMENTS: usize = (INDEX_BITS + 1 - BASE_SHIFT) as usize;

/// The free objects in a magazine: `slots[..len]` are valid object pointers.
#[derive(Debug)]
pub struct Rounds {
    pub len: usize,
    /// Array of `capacity` object pointers, or null when the magazine holds no storage
    /// (a new descriptor, or an empty magazine whose storage `trim` released).
    pub slots: *mut *mut u8,
    /// For an evicted magazine on a chain of evictions (`engine::Evictions`): how many
    /// of its objects stay cached. Meaningless otherwise.
    pub keep: usize,
}

/// A magazine descriptor.
#[derive(Debug)]
pub struct Magazine {
    /// Link to the next magazine on whatever list holds this one ([`NIL`] at the end):
    /// a depot stack, a stash, a cache's kept empties, a chain of evictions. Written only
    /// by the magazine's owner (before it pushes, or while it links its own chain); read
    /// by any popper, even a stale one, hence the atomic.
    pub next: AtomicU32,
    /// This descriptor's index in its table (immutable).
    pub index: u32,
    rounds: UnsafeCell<Rounds>,
}

impl Magazine {
    /// Runs `f` on the rounds.
    ///
    /// # Safety
    /// The caller owns the magazine (see the module docs).
    #[inline(always)]
    pub unsafe fn with_rounds<R>(&self, f: impl FnOnce(&mut Rounds) -> R) -> R {
        // SAFETY: the owner is the only thread that accesses the rounds, and the depot's
        // release/acquire hand-off orders its accesses after the previous owner's.
        self.rounds.with_mut(|r| f(unsafe { &mut *r }))
    }

    /// Takes the top object, if any.
    ///
    /// # Safety
    /// As for [`with_rounds`](Self::with_rounds).
    #[inline]
    pub unsafe fn pop_round(&self) -> Option<NonNull<u8>> {
        // SAFETY: per the contract; `slots[..len]` are objects.
        unsafe {
            self.with_rounds(|r| {
                (r.len > 0).then(|| {
                    r.len -= 1;
                    slot(r.slots, r.len)
                })
            })
        }
    }

    /// Puts `p` on top; false (nothing changed) if `cap` objects are held already.
    ///
    /// # Safety
    /// As for [`with_rounds`](Self::with_rounds); `cap` is at most the slot array's
    /// length.
    #[inline]
    pub unsafe fn push_round(&self, p: NonNull<u8>, cap: usize) -> bool {
        // SAFETY: per the contract; `len < cap` stays inside the slot array.
        unsafe {
            self.with_rounds(|r| {
                let room = r.len < cap;
                if room {
                    *r.slots.add(r.len) = p.as_ptr();
                    r.len += 1;
                }
                room
            })
        }
    }

    /// Number of objects held.
    ///
    /// # Safety
    /// As for [`with_rounds`](Self::with_rounds).
    // A count for the loom models' checks; nothing asks a magazine whether it is empty.
    #[allow(clippy::len_without_is_empty)]
    pub unsafe fn len(&self) -> usize {
        // SAFETY: forwarded.
        unsafe { self.with_rounds(|r| r.len) }
    }
}

/// Grow-only table of magazine descriptors, each with `capacity` slots.
#[derive(Debug)]
pub struct MagazineTable {
    segments: [AtomicPtr<Magazine>; SEGMENTS],
    /// Descriptor indices handed out so far.
    claimed: AtomicU32,
    capacity: usize,
}

/// Segment number, offset in it and its length for descriptor `index`.
fn locate(index: u32) -> (usize, usize, usize) {
    let j = index as u64 + (1 << BASE_SHIFT);
    let bit = 63 - j.leading_zeros();
    let seg_len = 1usize << bit;
    ((bit - BASE_SHIFT) as usize, (j as usize) - seg_len, seg_len)
}

fn segment_layout(len: usize) -> Layout {
    Layout::array::<Magazine>(len).expect("magazine segment size overflows")
}

fn slots_layout(capacity: usize) -> Layout {
    Layout::array::<*mut u8>(capacity).expect("magazine size overflows")
}

impl MagazineTable {
    /// An empty table of magazines holding `capacity` objects each.
    pub fn new(capacity: usize) -> Self {
        assert!(capacity > 0, "magazine capacity must be at least one");
        MagazineTable {
            segments: std::array::from_fn(|_| AtomicPtr::new(ptr::null_mut())),
            claimed: AtomicU32::new(0),
            capacity,
        }
    }

    /// Objects each magazine holds when full.
    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// The descriptor with `index`.
    ///
    /// # Safety
    /// `index` was returned by [`create_descriptor`](Self::create_descriptor) on this
    /// table (in any thread; indices travel between threads only through release/acquire
    /// depot operations or in descriptors already reached that way).
    pub unsafe fn get(&self, index: u32) -> &Magazine {
        let (seg, off, _) = locate(index);
        // Acquire pairs with the Release CAS that installed the segment, so its
        // initialised descriptors are visible.
        let base = self.segments[seg].load(Ordering::Acquire);
        debug_assert!(!base.is_null(), "magazine index {index} was never created");
        // SAFETY: by the caller's contract the segment exists and `off` is within it;
        // descriptors live as long as the table.
        unsafe { &*base.add(off) }
    }

    /// A new empty magazine with storage, owned by the caller; `None` when memory for
    /// the descriptor or its slots cannot be had. For tests and models: a descriptor
    /// whose slots cannot be had is lost here, so the depot uses
    /// [`create_descriptor`](Self::create_descriptor) and keeps it.
    #[cfg(any(test, proxalloc_loom))]
    pub fn create(&self) -> Option<&Magazine> {
        let mag = self.create_descriptor()?;
        // SAFETY: the index was claimed by this call alone, so nobody else has seen it.
        unsafe { self.ensure_slots(mag) }.then_some(mag)
    }

    /// A new descriptor without slot storage, owned by the caller; `None` when every
    /// index is taken or memory for its segment cannot be had.
    pub fn create_descriptor(&self) -> Option<&Magazine> {
        let index = self
            .claimed
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| {
                (n < NIL).then_some(n + 1)
            })
            .ok()?;
        let (seg, off, seg_len) = locate(index);
        let mut base = self.segments[seg].load(Ordering::Acquire);
        if base.is_null() {
            let Some(installed) = self.install_segment(seg, seg_len) else {
                // Give the index back unless another claim followed it (that one then
                // installs the segment, and this descriptor stays unused).
                let _ = self.claimed.compare_exchange(
                    index + 1,
                    index,
                    Ordering::Relaxed,
                    Ordering::Relaxed,
                );
                return None;
            };
            base = installed;
        }
        // SAFETY: `base` is a live segment of `seg_len > off` descriptors.
        Some(unsafe { &*base.add(off) })
    }

    /// Allocates and installs segment `seg`, or adopts the one another thread installed.
    fn install_segment(&self, seg: usize, seg_len: usize) -> Option<*mut Magazine> {
        let layout = segment_layout(seg_len);
        // SAFETY: the layout is non-zero-sized (Magazine is not a ZST).
        let fresh = unsafe { sync::alloc(layout) }.cast::<Magazine>();
        if fresh.is_null() {
            return None;
        }
        let first = ((1u64 << (seg as u32 + BASE_SHIFT)) - (1 << BASE_SHIFT)) as u32;
        for off in 0..seg_len {
            let mag = Magazine {
                next: AtomicU32::new(NIL),
                index: first + off as u32,
                rounds: UnsafeCell::new(Rounds {
                    len: 0,
                    slots: ptr::null_mut(),
                    keep: 0,
                }),
            };
            // SAFETY: `off < seg_len`, inside the fresh allocation.
            unsafe { fresh.add(off).write(mag) };
        }
        // Release publishes the initialised descriptors to `get`'s Acquire load.
        match self.segments[seg].compare_exchange(
            ptr::null_mut(),
            fresh,
            Ordering::AcqRel,
            Ordering::Acquire,
        ) {
            Ok(_) => Some(fresh),
            Err(winner) => {
                // SAFETY: `fresh` was never published; drop and free it.
                unsafe { Self::free_segment(fresh, seg_len, 0) };
                Some(winner)
            }
        }
    }

    /// Gives `mag` slot storage if it has none; false when memory cannot be had.
    ///
    /// # Safety
    /// The caller owns `mag`.
    pub unsafe fn ensure_slots(&self, mag: &Magazine) -> bool {
        // SAFETY: the caller owns `mag`.
        unsafe {
            mag.with_rounds(|r| {
                if r.slots.is_null() {
                    r.slots = sync::alloc(slots_layout(self.capacity)).cast();
                }
                !r.slots.is_null()
            })
        }
    }

    /// Releases an empty magazine's slot storage (it gets new storage when next used).
    ///
    /// # Safety
    /// The caller owns `mag`, and it holds no objects.
    pub unsafe fn release_slots(&self, mag: &Magazine) {
        // SAFETY: the caller owns `mag`.
        unsafe {
            mag.with_rounds(|r| {
                debug_assert_eq!(r.len, 0, "releasing storage of a non-empty magazine");
                if !r.slots.is_null() {
                    sync::dealloc(r.slots.cast(), slots_layout(self.capacity));
                    r.slots = ptr::null_mut();
                }
            })
        }
    }

    /// Drops `len` descriptors at `base` (freeing the slot storage of each when
    /// `capacity > 0`) and frees the segment.
    ///
    /// # Safety
    /// Nothing else references the segment any more.
    unsafe fn free_segment(base: *mut Magazine, len: usize, capacity: usize) {
        for off in 0..len {
            // SAFETY: every descriptor in the segment was initialised; we own them all.
            unsafe {
                let mag = base.add(off);
                if capacity > 0 {
                    let slots = (*mag).with_rounds(|r| r.slots);
                    if !slots.is_null() {
                        sync::dealloc(slots.cast(), slots_layout(capacity));
                    }
                }
                ptr::drop_in_place(mag);
            }
        }
        // SAFETY: allocated in `install_segment` with this layout.
        unsafe { sync::dealloc(base.cast(), segment_layout(len)) };
    }
}

impl Drop for MagazineTable {
    fn drop(&mut self) {
        for (seg, segment) in self.segments.iter().enumerate() {
            let base = segment.swap(ptr::null_mut(), Ordering::Acquire);
            if !base.is_null() {
                let len = 1usize << (seg as u32 + BASE_SHIFT);
                // SAFETY: `&mut self`: no other reference to the table or its segments.
                unsafe { Self::free_segment(base, len, self.capacity) };
            }
        }
    }
}

/// A null-free object pointer taken out of a magazine slot.
///
/// # Safety
/// `slots` points to an array with at least `i + 1` initialised entries.
#[inline(always)]
pub unsafe fn slot(slots: *mut *mut u8, i: usize) -> NonNull<u8> {
    // SAFETY: slots hold only pointers from the backing allocator, never null.
    unsafe { NonNull::new_unchecked(*slots.add(i)) }
}

#[cfg(all(test, not(proxalloc_loom)))]
#[path = "tests/magazine.rs"]
mod tests;
