//! A pool's bytes as [`bytes::Bytes`] (feature `bytes`): [`Pool::into_bytes`].

use bytes::Bytes;

use super::Pool;

/// A pool moved into `Bytes` with the bytes it holds: read only from then on.
struct PoolOwner {
    _pool: Pool<'static>,
    ptr: *const u8,
    len: usize,
}

// SAFETY: a `Pool` is `Send`; the pointer only reads bytes that the pool owns and that
// nothing writes any more (the pool is never used again but to be dropped).
unsafe impl Send for PoolOwner {}

impl AsRef<[u8]> for PoolOwner {
    fn as_ref(&self) -> &[u8] {
        // What `write` returned with the pool's borrow is pool memory (heap blocks that
        // stay put when the `Pool` value moves, freed only by a clear or a drop, which
        // need the pool, now ours) or `'static` data, and its borrow was shared.
        // SAFETY: that slice, alive and unwritten while the pool is ours and unused.
        unsafe { std::slice::from_raw_parts(self.ptr, self.len) }
    }
}

impl Pool<'static> {
    /// Runs `write` on the pool and returns the bytes it returns as [`Bytes`] that own
    /// the pool: hyper or tokio send them from where they were written, with no copy,
    /// and the pool is dropped when the last clone or slice of them is, on whichever
    /// thread that is: its blocks go back to its source and its cleanups
    /// ([`on_clear`](Pool::on_clear), [`alloc_owned`](Pool::alloc_owned) values) run
    /// there; a cleanup that panics panics out of that drop. The pool can no longer be
    /// used. (A method of `Pool<'static>`: the bytes may outlive any scope, so the pool's
    /// block source must too.)
    ///
    /// Like [`PooledBuf::freeze`](crate::PooledBuf::freeze), it allocates the
    /// `Bytes::from_owner` box from the global allocator, here holding the whole `Pool`
    /// value (about 170 bytes); an empty result is `Bytes::new()`, and the pool is
    /// dropped at once.
    ///
    /// ```
    /// use std::fmt::Write;
    /// let pool = proxalloc::Pool::new();
    /// let page = pool.into_bytes(|pool| {
    ///     let mut w = pool.writer();
    ///     write!(w, "<h1>{}</h1>", 404).unwrap();
    ///     w.finish()
    /// });
    /// let shared = page.clone();
    /// std::thread::spawn(move || assert_eq!(&shared[..], b"<h1>404</h1>")).join().unwrap();
    /// assert_eq!(&page[..], b"<h1>404</h1>");
    /// ```
    ///
    /// What `write` returns must be borrowed from the pool (or be `'static`): the pool
    /// is not there to return a borrow of a local:
    ///
    /// ```compile_fail
    /// let local = vec![1u8, 2, 3];
    /// let pool = proxalloc::Pool::new();
    /// let b = pool.into_bytes(|_| &local[..]); // error: borrowed data escapes
    /// # drop(local);
    /// ```
    #[must_use = "dropping the bytes drops the pool at once"]
    pub fn into_bytes(self, write: impl for<'p> FnOnce(&'p Pool<'static>) -> &'p [u8]) -> Bytes {
        let (ptr, len) = {
            let bytes = write(&self);
            (bytes.as_ptr(), bytes.len())
        };
        if len == 0 {
            // No box for nothing: the pool goes now.
            return Bytes::new();
        }
        Bytes::from_owner(PoolOwner {
            _pool: self,
            ptr,
            len,
        })
    }
}
