//! Subpools: a child [`Pool`] on the same source that borrows its parent, so the parent
//! can be neither cleared nor dropped while the child lives.

use std::fmt;
use std::marker::PhantomData;
use std::ops::Deref;

use super::Pool;

impl<'s> Pool<'s> {
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
