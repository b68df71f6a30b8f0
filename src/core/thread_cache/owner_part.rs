//! The owner-only part of a thread cache: the loaded magazine unpacked (slot array,
//! count, capacity), as the fast paths read it, and the previous magazine.

use std::ptr::{self, NonNull};

use crate::core::exchange::MagazinePair;
use crate::core::magazine::Magazine;

/// The owner-only part of a [`ThreadCache`](super::ThreadCache).
#[derive(Debug)]
#[repr(C)]
pub(crate) struct OwnerPart {
    /// Instance number of the engine this cache belongs to ([`EMPTY`](crate::core::ids::EMPTY) when unused).
    pub(crate) instance: u64,
    /// Slot array of the loaded magazine (dangling when `cap == 0`).
    pub(super) slots: *mut *mut u8,
    /// Objects in the loaded magazine.
    pub(super) len: usize,
    /// Capacity of the loaded magazine; 0 when there is none, so both fast paths fall
    /// through to the slow path.
    pub(super) cap: usize,
    /// The loaded magazine's descriptor (its `len` is stale while it is loaded).
    pub(super) loaded: *const Magazine,
    /// The previous magazine, or null; its descriptor's `len` is current.
    pub(super) previous: *const Magazine,
}

impl OwnerPart {
    pub(super) const fn empty(instance: u64) -> Self {
        OwnerPart {
            instance,
            slots: ptr::null_mut(),
            len: 0,
            cap: 0,
            loaded: ptr::null(),
            previous: ptr::null(),
        }
    }

    #[cfg(test)]
    pub(crate) fn previous(&self) -> Option<&Magazine> {
        // SAFETY: a non-null `previous` is a descriptor of the engine's table, which
        // outlives every cache of the engine.
        unsafe { self.previous.as_ref() }
    }

    /// Objects in the loaded magazine.
    pub(crate) fn loaded_len(&self) -> usize {
        self.len
    }

    /// Capacity of the loaded magazine (0 when none).
    pub(crate) fn loaded_cap(&self) -> usize {
        self.cap
    }

    /// Removes the loaded magazine (writing its count back); the caller owns it.
    pub(crate) fn unload(&mut self) -> Option<NonNull<Magazine>> {
        let mag = NonNull::new(self.loaded.cast_mut())?;
        let len = self.len;
        // SAFETY: a non-null `loaded` is a live descriptor, owned by this cache.
        unsafe { mag.as_ref().with_rounds(|r| r.len = len) };
        self.loaded = ptr::null();
        self.slots = ptr::null_mut();
        self.len = 0;
        self.cap = 0;
        Some(mag)
    }

    /// Makes `mag` (owned by the caller, with slot storage) the loaded magazine. There
    /// must be no loaded magazine.
    pub(crate) fn load(&mut self, mag: &Magazine, capacity: usize) {
        debug_assert!(self.loaded.is_null());
        // SAFETY: the caller hands over ownership.
        let (slots, len) = unsafe { mag.with_rounds(|r| (r.slots, r.len)) };
        debug_assert!(!slots.is_null() && len <= capacity);
        self.slots = slots;
        self.len = len;
        self.cap = capacity;
        self.loaded = mag;
    }

    /// Removes the previous magazine; the caller owns it.
    pub(crate) fn take_previous(&mut self) -> Option<NonNull<Magazine>> {
        let mag = NonNull::new(self.previous.cast_mut());
        self.previous = ptr::null();
        mag
    }

    /// Makes `mag` (owned by the caller) the previous magazine. There must be none.
    pub(crate) fn set_previous(&mut self, mag: Option<NonNull<Magazine>>) {
        debug_assert!(self.previous.is_null(), "a previous magazine would be lost");
        self.previous = mag.map_or(ptr::null(), |m| m.as_ptr());
    }

    /// Packs the loaded magazine (its count written back) and the previous one into a
    /// pair of `capacity`, for the exchange rules; the cache holds no magazine until
    /// [`put_pair`](Self::put_pair).
    ///
    /// # Safety
    /// The cache's magazines are descriptors that outlive `'m` (an engine's table).
    pub(crate) unsafe fn take_pair<'m>(&mut self, capacity: usize) -> MagazinePair<'m> {
        // SAFETY: per the contract; the cache owns both, and hands them over.
        let own = |m: Option<NonNull<Magazine>>| m.map(|m| unsafe { &*m.as_ptr() });
        MagazinePair {
            loaded: own(self.unload()),
            previous: own(self.take_previous()),
            capacity,
        }
    }

    /// Takes the magazines of `pair` back (the loaded one unpacked for the fast paths).
    pub(crate) fn put_pair(&mut self, pair: MagazinePair<'_>) {
        self.set_previous(pair.previous.map(NonNull::from));
        if let Some(loaded) = pair.loaded {
            self.load(loaded, pair.capacity);
        }
    }
}
