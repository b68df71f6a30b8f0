//! Formatting and byte building into pool memory: [`PoolWriter`], [`Pool::alloc_fmt`] and
//! the [`pformat!`](crate::pformat) macro.

use std::alloc::Layout;
use std::fmt;
use std::ptr::{self, NonNull};

use super::bump::dangling;
use super::Pool;

impl<'s> Pool<'s> {
    /// Formats `args` straight into pool memory (APR's `apr_psprintf`); see also the
    /// [`pformat!`](crate::pformat) macro.
    ///
    /// ```
    /// let pool = proxalloc::Pool::new();
    /// let s = pool.alloc_fmt(format_args!("{}-{}", "a", 1));
    /// assert_eq!(s, "a-1");
    /// ```
    #[allow(clippy::mut_from_ref)]
    #[must_use = "the allocation stays in the pool until it is cleared; an unused one only wastes pool memory"]
    pub fn alloc_fmt(&self, args: fmt::Arguments<'_>) -> &mut str {
        if let Some(s) = args.as_str() {
            return self.alloc_str(s);
        }
        let mut w = PoolWriter::new(self);
        fmt::Write::write_fmt(&mut w, args)
            .expect("a formatting trait implementation returned an error");
        // SAFETY: only `fmt::Write` wrote to it, so it holds UTF-8.
        unsafe { std::str::from_utf8_unchecked_mut(w.finish()) }
    }

    /// A writer that appends to a buffer in pool memory (see [`PoolWriter`]).
    ///
    /// ```
    /// use std::fmt::Write;
    /// let pool = proxalloc::Pool::new();
    /// let mut w = pool.writer();
    /// write!(w, "{} {}", 404, "Not Found").unwrap();
    /// assert_eq!(w.finish(), b"404 Not Found");
    /// ```
    pub fn writer(&self) -> PoolWriter<'_, 's> {
        PoolWriter::new(self)
    }
}

/// Builds bytes in pool memory, coalescing many small writes into one growing buffer
/// (grown in place while it is the pool's most recent allocation). Implements
/// [`fmt::Write`] and [`std::io::Write`].
///
/// ```
/// use std::io::Write;
/// let pool = proxalloc::Pool::new();
/// let mut w = pool.writer();
/// write!(w, "HTTP/1.1 {} {}\r\n", 200, "OK").unwrap();
/// for (k, v) in [("a", "1"), ("b", "2")] {
///     w.write_all(k.as_bytes()).unwrap();
///     w.write_all(b": ").unwrap();
///     w.write_all(v.as_bytes()).unwrap();
///     w.write_all(b"\r\n").unwrap();
/// }
/// let response: &[u8] = w.finish();
/// assert_eq!(response, b"HTTP/1.1 200 OK\r\na: 1\r\nb: 2\r\n");
/// ```
pub struct PoolWriter<'p, 's> {
    pool: &'p Pool<'s>,
    buf: NonNull<u8>,
    len: usize,
    cap: usize,
}

impl<'p, 's> PoolWriter<'p, 's> {
    fn new(pool: &'p Pool<'s>) -> Self {
        PoolWriter {
            pool,
            buf: dangling(1),
            len: 0,
            cap: 0,
        }
    }

    /// Appends `bytes`.
    ///
    /// # Panics
    /// Through [`std::alloc::handle_alloc_error`] if the pool's source fails.
    ///
    /// ```
    /// let pool = proxalloc::Pool::new();
    /// let mut w = pool.writer();
    /// w.push_bytes(b"GET ");
    /// w.push_bytes(b"/");
    /// assert_eq!(w.finish(), b"GET /");
    /// ```
    pub fn push_bytes(&mut self, bytes: &[u8]) {
        if bytes.len() > self.cap - self.len {
            let want = (self.len + bytes.len()).max(self.cap * 2).max(64);
            self.buf = if self.cap == 0 {
                self.pool
                    .alloc_layout(Layout::array::<u8>(want).expect("too large"))
            } else {
                // SAFETY: the buffer is this pool's, `cap` bytes, byte-aligned.
                unsafe { self.pool.grow(self.buf, self.cap, want, 1) }.unwrap_or_else(|_| {
                    std::alloc::handle_alloc_error(Layout::array::<u8>(want).unwrap())
                })
            };
            self.cap = want;
        }
        // SAFETY: room for `bytes` after `len`.
        unsafe {
            ptr::copy_nonoverlapping(bytes.as_ptr(), self.buf.as_ptr().add(self.len), bytes.len())
        };
        self.len += bytes.len();
    }

    /// Bytes written so far.
    ///
    /// ```
    /// let pool = proxalloc::Pool::new();
    /// let mut w = pool.writer();
    /// w.push_bytes(b"abc");
    /// assert_eq!(w.len(), 3);
    /// ```
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether nothing was written.
    ///
    /// ```
    /// let pool = proxalloc::Pool::new();
    /// assert!(pool.writer().is_empty());
    /// ```
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The bytes written, in pool memory; unused room goes back to the pool.
    ///
    /// ```
    /// let pool = proxalloc::Pool::new();
    /// let mut w = pool.writer();
    /// w.push_bytes(b"done");
    /// let bytes: &mut [u8] = w.finish(); // stays in the pool until it is cleared
    /// assert_eq!(bytes, b"done");
    /// ```
    pub fn finish(self) -> &'p mut [u8] {
        // SAFETY: the buffer is this pool's, with `len` initialised bytes.
        unsafe {
            if self.cap > 0 {
                self.pool.shrink_last(self.buf, self.cap, self.len);
            }
            std::slice::from_raw_parts_mut(self.buf.as_ptr(), self.len)
        }
    }
}

impl fmt::Write for PoolWriter<'_, '_> {
    fn write_str(&mut self, s: &str) -> fmt::Result {
        self.push_bytes(s.as_bytes());
        Ok(())
    }
}

impl std::io::Write for PoolWriter<'_, '_> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.push_bytes(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// Formats into pool memory: `pformat!(pool, "{} {}", a, b)` returns a `&mut str` that
/// lives as long as the pool borrow (APR's `apr_psprintf`).
#[macro_export]
macro_rules! pformat {
    ($pool:expr, $($arg:tt)*) => {
        $pool.alloc_fmt(::std::format_args!($($arg)*))
    };
}
