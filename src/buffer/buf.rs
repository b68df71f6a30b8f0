//! [`PooledBuf`]: a writable buffer in a class slot, and its frozen form inside `Bytes`.

use std::fmt;
use std::io;
use std::ops::{Deref, DerefMut};
use std::ptr::NonNull;
use std::sync::Arc;

use bytes::buf::UninitSlice;
use bytes::{BufMut, Bytes};

use super::{BufferAllocator, BufferError};

/// The allocator a buffer goes back to: a `static` one, or one kept alive by the buffer.
pub(super) enum Source {
    Static(&'static BufferAllocator),
    Shared(Arc<BufferAllocator>),
}

/// A buffer's memory as its allocator handed it out.
#[derive(Clone, Copy)]
pub(super) struct Parts {
    pub(super) ptr: NonNull<u8>,
    /// The bytes at `ptr`: a class's size exactly, or (oversize) more than the largest
    /// class's, which is how a free finds where the memory goes back.
    pub(super) cap: usize,
    /// Recorded by the leak tracker (to be forgotten there when freed).
    pub(super) tracked: bool,
}

/// A writable byte buffer from a [`BufferAllocator`]'s size classes: `len` initialised
/// bytes followed by spare capacity, like a `Vec<u8>` that never shrinks. Dropping it
/// gives the slot back to the cache nearest to the dropping thread;
/// [`freeze`](Self::freeze) turns it into [`Bytes`] without copying.
///
/// It implements [`BufMut`] (so `tokio::io::AsyncReadExt::read_buf` reads into its
/// spare capacity), [`std::io::Write`], and derefs to `[u8]` (its written bytes).
/// Writing past the capacity grows it as `BytesMut` grows: into the next class that
/// holds the new length (one copy of what was written), or the global allocator above
/// 64 KiB. [`capacity`](Self::capacity) is what the slot really holds, so a reader can
/// fill all of it before any growth.
///
/// ```
/// use std::io::Write;
/// use bytes::BufMut;
/// static BUFS: proxalloc::BufferAllocator = proxalloc::BufferAllocator::new();
///
/// let mut buf = BUFS.alloc(600);
/// assert_eq!(buf.capacity(), 1024); // the 1 KiB class
/// write!(buf, "{} {}", 200, "OK").unwrap();
/// buf.put_u8(b'!');
/// assert_eq!(&buf[..], b"200 OK!");
/// buf.put_bytes(b'.', 2000); // past 1 KiB: moves to the 2 KiB class
/// assert_eq!((buf.len(), buf.capacity()), (2007, 2048));
/// ```
pub struct PooledBuf {
    // Four words (the `Parts` and `Source` it was made from would be six), so that
    // moving a buffer, returned by value or into `freeze`, copies less.
    ptr: NonNull<u8>,
    /// As [`Parts::cap`].
    cap: usize,
    len: usize,
    source: TaggedSource,
}

// SAFETY: the buffer owns its bytes exclusively (as a `Vec<u8>` does), and its source
// word stands for a `&'static BufferAllocator` or an owned `Arc<BufferAllocator>`, both
// `Send + Sync` since the allocator is (asserted in mod.rs: it is shared by every thread
// by design).
unsafe impl Send for PooledBuf {}
// SAFETY: `&PooledBuf` gives out `&[u8]` only.
unsafe impl Sync for PooledBuf {}

impl PooledBuf {
    #[inline(always)]
    pub(super) fn from_parts(mem: Parts, source: Source) -> Self {
        PooledBuf {
            ptr: mem.ptr,
            cap: mem.cap,
            len: 0,
            source: TaggedSource::new(source, mem.tracked),
        }
    }

    /// Bytes written.
    #[inline]
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether nothing was written.
    #[inline]
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The bytes the buffer's memory holds: its class's size (or, above the largest
    /// class, the request rounded up to 4 KiB; after a growth there, at least twice
    /// the capacity before it).
    #[inline]
    pub fn capacity(&self) -> usize {
        self.cap
    }

    /// Forgets what was written; the capacity stays.
    #[inline]
    pub fn clear(&mut self) {
        self.len = 0;
    }

    /// Keeps the first `len` bytes (no effect if `len` is not below the length).
    ///
    /// ```
    /// use bytes::BufMut;
    /// let mut b = proxalloc::BufferAllocator::global().alloc(16);
    /// b.put_slice(b"keep this");
    /// b.truncate(4);
    /// assert_eq!(&b[..], b"keep");
    /// ```
    #[inline]
    pub fn truncate(&mut self, len: usize) {
        self.len = self.len.min(len);
    }

    /// Appends `bytes`, growing first if they do not fit.
    ///
    /// # Panics
    /// As [`reserve`](Self::reserve).
    #[inline]
    #[track_caller]
    pub fn extend_from_slice(&mut self, bytes: &[u8]) {
        self.reserve(bytes.len());
        // SAFETY: `reserve` made room.
        unsafe { self.append(bytes) };
    }

    /// Appends `bytes`.
    ///
    /// # Safety
    /// The spare capacity holds them (`reserve` or `try_reserve` made room).
    #[inline]
    unsafe fn append(&mut self, bytes: &[u8]) {
        let at = self.len;
        debug_assert!(bytes.len() <= self.cap - at);
        // The length is stored before the copy, not after: a move of the buffer right
        // after the copy (into `freeze`, a `Vec`, a call) reads the length with its
        // neighbour in one 16-byte load, which a store still in flight cannot forward
        // to (a stall that cost a 2 KiB fill-and-drop half its time).
        self.len = at + bytes.len();
        // SAFETY: room for `bytes.len()` bytes after `at` (the caller's contract); a `&[u8]`
        // cannot overlap the buffer's spare capacity, which nothing else borrows.
        unsafe {
            self.ptr
                .as_ptr()
                .add(at)
                .copy_from_nonoverlapping(bytes.as_ptr(), bytes.len());
        }
    }

    /// Makes room for at least `additional` more bytes: if they do not fit, moves what
    /// was written into a slot of the smallest class that holds both (or the global
    /// allocator above 64 KiB) and gives the old slot back.
    ///
    /// # Panics
    /// If the new capacity would pass `isize::MAX` once rounded up; aborts through
    /// `handle_alloc_error` if memory cannot be had or a
    /// [`Config::max_live`](crate::Config::max_live) cap refuses
    /// ([`try_reserve`](Self::try_reserve) returns these as errors). Above 64 KiB a
    /// growth at least doubles the capacity.
    ///
    /// ```
    /// let mut b = proxalloc::BufferAllocator::global().alloc(512);
    /// b.reserve(512); // fits: nothing moves
    /// assert_eq!(b.capacity(), 512);
    /// b.reserve(513);
    /// assert_eq!(b.capacity(), 1024);
    /// ```
    #[inline]
    #[track_caller]
    pub fn reserve(&mut self, additional: usize) {
        if additional > self.cap - self.len {
            if let Err(e) = self.grow(additional) {
                super::fail(e, self.len.saturating_add(additional));
            }
        }
    }

    /// Like [`reserve`](Self::reserve), but returns an error instead of panicking or
    /// aborting (the buffer is unchanged then).
    ///
    /// ```
    /// use proxalloc::BufferError;
    /// let mut b = proxalloc::BufferAllocator::global().alloc(512);
    /// assert_eq!(b.try_reserve(usize::MAX), Err(BufferError::TooLarge(usize::MAX)));
    /// assert_eq!(b.try_reserve(4000), Ok(()));
    /// assert_eq!(b.capacity(), 4096);
    /// ```
    #[inline]
    pub fn try_reserve(&mut self, additional: usize) -> Result<(), BufferError> {
        if additional > self.cap - self.len {
            self.grow(additional)?;
        }
        Ok(())
    }

    /// Moves to memory of at least `len + additional` bytes; on an error nothing changed.
    #[cold]
    #[inline(never)]
    fn grow(&mut self, additional: usize) -> Result<(), BufferError> {
        let needed = self
            .len
            .checked_add(additional)
            .filter(|&n| n <= isize::MAX as usize)
            .ok_or(BufferError::TooLarge(self.len.saturating_add(additional)))?;
        // Above the classes, double at least (as `Vec` does), so a loop of small writes
        // stays linear; within them, the next class already doubles.
        let target = if needed > super::BUFFER_CLASSES[7] {
            needed.max(self.cap.saturating_mul(2).min(isize::MAX as usize))
        } else {
            needed
        };
        let alloc = self.source.get();
        let new = alloc.try_alloc_untracked(target)?;
        // SAFETY: the new memory holds at least `needed >= len` bytes and is not the
        // old (both are live at once); `len` bytes of the old are initialised.
        unsafe {
            new.ptr
                .as_ptr()
                .copy_from_nonoverlapping(self.ptr.as_ptr(), self.len)
        };
        // The buffer owns the new memory before anything else runs; the record (the
        // source's tracked bit, unchanged) follows the bytes, with the place of the
        // first allocation.
        let (old_ptr, old_cap) = (self.ptr, self.cap);
        (self.ptr, self.cap) = (new.ptr, new.cap);
        if self.source.tracked() {
            alloc.leaks.moved(old_ptr, new.ptr, new.cap);
        }
        // SAFETY: the old memory came from this allocator, and nothing refers to it any
        // more (the buffer now holds the new); the tracker's record moved with the bytes.
        unsafe {
            alloc.free_parts(&Parts {
                ptr: old_ptr,
                cap: old_cap,
                tracked: false,
            })
        };
        Ok(())
    }

    /// The buffer's written bytes as [`Bytes`], without copying: clones and slices of
    /// them share the slot, which goes back to its class when the last of them is
    /// dropped, on whichever thread that is.
    ///
    /// This allocates once from the global allocator: `Bytes::from_owner` boxes its
    /// owner with a reference count (a 32-byte box on 64-bit targets; see docs/buffers.md for what it
    /// costs). An empty buffer freezes into `Bytes::new()` with no box, and gives its
    /// slot back at once.
    ///
    /// ```
    /// use bytes::BufMut;
    /// static BUFS: proxalloc::BufferAllocator = proxalloc::BufferAllocator::new();
    /// let mut b = BUFS.alloc(2048);
    /// b.put_slice(b"cached body");
    /// let body = b.freeze();
    /// let (a, rest) = (body.slice(..6), body.slice(7..));
    /// drop(body);
    /// assert_eq!((&a[..], &rest[..]), (&b"cached"[..], &b"body"[..]));
    /// assert_eq!(BUFS.stats().classes[2].live, 1); // still held by the slices
    /// drop((a, rest));
    /// assert_eq!(BUFS.stats().classes[2].live, 0);
    /// ```
    #[must_use = "dropping the bytes gives the slot back at once"]
    pub fn freeze(self) -> Bytes {
        if self.is_empty() {
            return Bytes::new();
        }
        match Frozen::new(self) {
            Ok(small) => Bytes::from_owner(small),
            Err(huge) => Bytes::from_owner(FrozenHuge(huge)),
        }
    }

    /// The spare capacity, as `UninitSlice`.
    #[inline]
    fn spare(&mut self) -> &mut UninitSlice {
        // SAFETY: `ptr + len .. ptr + cap` is the buffer's own memory, borrowed mutably
        // with `self`; `UninitSlice` allows no reads of it.
        unsafe {
            UninitSlice::from_raw_parts_mut(self.ptr.as_ptr().add(self.len), self.cap - self.len)
        }
    }
}

impl Drop for PooledBuf {
    #[inline]
    fn drop(&mut self) {
        // SAFETY: the buffer's memory, from `source`'s allocator, given back once, here;
        // `source` (an `Arc`'s count) is dropped after this.
        unsafe { self.source.free(self.ptr, self.cap) }
    }
}

impl From<PooledBuf> for Bytes {
    /// [`PooledBuf::freeze`].
    fn from(buf: PooledBuf) -> Bytes {
        buf.freeze()
    }
}

/// A frozen buffer inside `Bytes` (its owner): read only, dropped with the last clone.
/// Three words, where a `PooledBuf` is four (on 64-bit targets), so that `from_owner`'s
/// box (its count and this) is 32 bytes, the small allocators' 32-byte class, where the
/// whole buffer would make it 40 (the 48-byte class): a body frozen on one thread and
/// dropped on another frees that box there, and under mimalloc a 56-byte one (the
/// 64-byte class, the whole buffer when it was six words) made the two-thread handoff
/// slower (docs/benchmarks.md). Buffers of 4 GiB or more are frozen whole
/// ([`FrozenHuge`]).
pub(super) struct Frozen {
    ptr: NonNull<u8>,
    len: u32,
    cap: u32,
    source: TaggedSource,
}

// SAFETY: as for `PooledBuf`, whose memory and source it holds.
unsafe impl Send for Frozen {}
// SAFETY: as for `PooledBuf`: `&Frozen` gives out `&[u8]` only.
unsafe impl Sync for Frozen {}

impl Frozen {
    /// `buf`'s memory and source, or `buf` back if its length or capacity does not fit
    /// in 32 bits.
    #[inline]
    pub(super) fn new(buf: PooledBuf) -> Result<Frozen, PooledBuf> {
        debug_assert!(buf.len <= buf.cap, "a buffer longer than its capacity");
        let (Ok(len), Ok(cap)) = (u32::try_from(buf.len), u32::try_from(buf.cap)) else {
            return Err(buf);
        };
        let buf = std::mem::ManuallyDrop::new(buf);
        // SAFETY: `buf` is never dropped, so its source is moved out once, here.
        let source = unsafe { std::ptr::read(&buf.source) };
        Ok(Frozen {
            ptr: buf.ptr,
            len,
            cap,
            source,
        })
    }
}

impl AsRef<[u8]> for Frozen {
    #[inline]
    fn as_ref(&self) -> &[u8] {
        // SAFETY: the first `len` bytes of the buffer were written before it was frozen,
        // and nobody writes them since.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len as usize) }
    }
}

impl Drop for Frozen {
    #[inline]
    fn drop(&mut self) {
        // SAFETY: the buffer's memory (unchanged since the freeze), from `source`'s
        // allocator, given back once, here; `source` is dropped after it, as a
        // `PooledBuf`'s is.
        unsafe { self.source.free(self.ptr, self.cap as usize) }
    }
}

/// A frozen buffer of 4 GiB or more: the whole `PooledBuf` (see [`Frozen`]).
struct FrozenHuge(PooledBuf);

impl AsRef<[u8]> for FrozenHuge {
    #[inline]
    fn as_ref(&self) -> &[u8] {
        &self.0
    }
}

/// A [`Source`] in one word: the allocator's address, with [`TaggedSource::SHARED`] set
/// for an `Arc` (one strong count, owned by this word and given back by its drop) and
/// [`TaggedSource::TRACKED`] for a buffer the leak tracker recorded. The allocator's
/// alignment leaves both bits free.
///
/// The word owns what it stands for, as the `Source` it was made from did: it is never
/// `Clone` or `Copy`, and only an owner that is never dropped moves it out (`Frozen::new`,
/// with `ptr::read` under `ManuallyDrop`), so the count is given back exactly once.
struct TaggedSource(NonNull<BufferAllocator>);

const _: () = assert!(std::mem::align_of::<BufferAllocator>() >= 4);

impl TaggedSource {
    const SHARED: usize = 1;
    const TRACKED: usize = 2;

    #[inline(always)]
    fn new(source: Source, tracked: bool) -> Self {
        let (ptr, shared) = match source {
            Source::Static(a) => (NonNull::from(a), 0),
            // The count moves into this word; the drop gives it back to an `Arc`.
            // SAFETY: `Arc::into_raw` never returns null.
            Source::Shared(a) => (
                unsafe { NonNull::new_unchecked(Arc::into_raw(a).cast_mut()) },
                Self::SHARED,
            ),
        };
        let tag = shared | if tracked { Self::TRACKED } else { 0 };
        TaggedSource(ptr.map_addr(|a| a | tag))
    }

    /// The allocator's address, the tag bits cleared.
    #[inline(always)]
    fn untagged(&self) -> NonNull<BufferAllocator> {
        // SAFETY: the address with its tag bits cleared is the allocator's (aligned to
        // at least 4, so the address is not 0).
        unsafe {
            self.0.map_addr(|a| {
                std::num::NonZeroUsize::new_unchecked(a.get() & !(Self::SHARED | Self::TRACKED))
            })
        }
    }

    /// The allocator the buffer goes back to.
    #[inline(always)]
    fn get(&self) -> &BufferAllocator {
        // SAFETY: a `&'static BufferAllocator`, or an `Arc`'s whose count this word owns
        // until its drop, so the allocator outlives the borrow of `self`.
        unsafe { self.untagged().as_ref() }
    }

    /// Whether the leak tracker recorded the buffer.
    #[inline(always)]
    fn tracked(&self) -> bool {
        self.0.addr().get() & Self::TRACKED != 0
    }

    /// Gives a buffer's memory (`cap` bytes at `ptr`) back to the allocator, and its
    /// record to the leak tracker if it has one: the free of both owners, the writable
    /// buffer and the frozen one.
    ///
    /// # Safety
    /// `ptr` and `cap` are a buffer's memory as this source's allocator handed it out
    /// (or as a growth left it), not used again.
    #[inline(always)]
    unsafe fn free(&self, ptr: NonNull<u8>, cap: usize) {
        let parts = Parts {
            ptr,
            cap,
            tracked: self.tracked(),
        };
        // SAFETY: forwarded from the caller.
        unsafe { self.get().free_parts(&parts) }
    }
}

impl Drop for TaggedSource {
    #[inline(always)]
    fn drop(&mut self) {
        if self.0.addr().get() & Self::SHARED != 0 {
            // SAFETY: from `Arc::into_raw` in `new`, whose count this word owned; given
            // back once, here.
            drop(unsafe { Arc::from_raw(self.untagged().as_ptr()) });
        }
    }
}

impl Deref for PooledBuf {
    type Target = [u8];
    #[inline]
    fn deref(&self) -> &[u8] {
        // SAFETY: the first `len` bytes were written (by `extend_from_slice`, or by a
        // `BufMut` writer that vouched for them in `advance_mut`).
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }
}

impl DerefMut for PooledBuf {
    #[inline]
    fn deref_mut(&mut self) -> &mut [u8] {
        // SAFETY: as for `deref`, borrowed mutably with `self`.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len) }
    }
}

impl AsRef<[u8]> for PooledBuf {
    fn as_ref(&self) -> &[u8] {
        self
    }
}

impl AsMut<[u8]> for PooledBuf {
    fn as_mut(&mut self) -> &mut [u8] {
        self
    }
}

/// As `BytesMut`'s: writes past the capacity grow the buffer (see
/// [`PooledBuf::reserve`], whose panics and aborts they share: under a
/// [`Config::max_live`](crate::Config::max_live) cap, a growth refused aborts, so call
/// [`try_reserve`](PooledBuf::try_reserve) first), and `advance_mut` past the spare
/// capacity panics.
// SAFETY: `remaining_mut` never shrinks except by `advance_mut`; `chunk_mut` returns the
// spare capacity, which is never empty (it grows first when full); `advance_mut` moves
// `len` only over spare capacity, panicking otherwise.
unsafe impl BufMut for PooledBuf {
    /// As `BytesMut`'s: the buffer grows, so only `isize::MAX` bounds it.
    #[inline]
    fn remaining_mut(&self) -> usize {
        isize::MAX as usize - self.len
    }

    #[inline]
    unsafe fn advance_mut(&mut self, cnt: usize) {
        let spare = self.cap - self.len;
        assert!(
            cnt <= spare,
            "PooledBuf::advance_mut: advancing by {cnt} bytes past the {spare} bytes of spare capacity"
        );
        self.len += cnt;
    }

    #[inline]
    fn chunk_mut(&mut self) -> &mut UninitSlice {
        if self.len == self.cap {
            // Full: grow by what `BytesMut` grows by when full.
            self.reserve(64);
        }
        self.spare()
    }

    #[inline]
    #[track_caller]
    fn put_slice(&mut self, src: &[u8]) {
        self.extend_from_slice(src);
    }

    #[inline]
    #[track_caller]
    fn put_bytes(&mut self, val: u8, cnt: usize) {
        self.reserve(cnt);
        // SAFETY: `reserve` made room for `cnt` bytes after `len`.
        unsafe { self.ptr.as_ptr().add(self.len).write_bytes(val, cnt) };
        self.len += cnt;
    }
}

/// Writes grow the buffer; where growth fails (memory, a `max_live` cap, `isize::MAX`)
/// the write returns an error of kind `OutOfMemory` and the buffer is unchanged.
impl io::Write for PooledBuf {
    #[inline]
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.write_all(buf).map(|()| buf.len())
    }

    #[inline]
    fn write_all(&mut self, buf: &[u8]) -> io::Result<()> {
        self.try_reserve(buf.len())
            .map_err(|e| io::Error::new(io::ErrorKind::OutOfMemory, e))?;
        // SAFETY: `try_reserve` made room.
        unsafe { self.append(buf) };
        Ok(())
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

impl fmt::Debug for PooledBuf {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PooledBuf")
            .field("len", &self.len)
            .field("capacity", &self.cap)
            .finish_non_exhaustive()
    }
}
