//! [`PoolVec`]: a growable vector in pool memory.

use std::alloc::Layout;
use std::fmt;
use std::mem::ManuallyDrop;
use std::ops::{Deref, DerefMut};
use std::ptr::{self, NonNull};

use super::Pool;

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
