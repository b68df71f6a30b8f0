//! Pooled I/O buffers (feature `bytes`): [`BufferAllocator`] hands out [`PooledBuf`]s
//! in eight size classes from 512 B to 64 KiB, each class a [`ClassAllocator`] with the
//! same caches, depot and budgets as every other allocator. A buffer is a
//! [`bytes::BufMut`] (so `tokio`'s `read_buf` reads straight into it) and
//! [`freeze`](PooledBuf::freeze)s into a [`bytes::Bytes`] without copying: the slot goes
//! back to its class when the last clone or slice of those `Bytes` is dropped, on
//! whichever thread that happens.
//!
//! Requests above the largest class go to the global allocator, and are counted in
//! their own stats row (`buffers-oversize`). With misuse detection compiled in (debug
//! builds or the `debug-checks` feature) the allocator can list its oldest live buffers
//! and where each was allocated ([`BufferAllocator::oldest_live`]), netty's leak
//! detector in the manner of this crate.

mod buf;
mod oversize;
use oversize::Oversize;
mod leaks;

pub use buf::PooledBuf;
pub use leaks::{LeakLevel, LiveBuffer};

use std::alloc::Layout;
use std::fmt;
use std::ptr::NonNull;
use std::sync::atomic::Ordering;
use std::sync::{Arc, OnceLock};

use crate::class::{ClassAllocator, RawBytes};
use crate::config::Config;
use crate::registry::{self, Registered};
use crate::rows::Stats;

/// The buffer size classes: a request is served by the smallest class that holds it,
/// and the buffer's [`capacity`](PooledBuf::capacity) is the class size.
///
/// ```
/// use proxalloc::{BufferAllocator, BUFFER_CLASSES};
/// static BUFS: BufferAllocator = BufferAllocator::new();
/// assert_eq!(BUFS.alloc(1500).capacity(), BUFFER_CLASSES[2]); // 2 KiB
/// ```
pub const BUFFER_CLASSES: [usize; 8] = [
    512,
    1 << 10,
    2 << 10,
    4 << 10,
    8 << 10,
    16 << 10,
    32 << 10,
    64 << 10,
];

/// Alignment of every buffer's memory (a cache line).
pub const BUFFER_ALIGN: usize = 64;

/// Oversize buffers are sized in multiples of this.
const OVERSIZE_GRAIN: usize = 4 << 10;

/// The class of a capacity, or `None` above the largest.
#[inline(always)]
fn class_of(capacity: usize) -> Option<usize> {
    if capacity <= BUFFER_CLASSES[0] {
        Some(0)
    } else if capacity <= BUFFER_CLASSES[7] {
        // 513..=1024 → 1, ..., 32K+1..=64K → 7.
        Some((usize::BITS - (capacity - 1).leading_zeros()) as usize - 9)
    } else {
        None
    }
}

/// Why a buffer could not be had.
///
/// ```
/// use proxalloc::{BufferAllocator, BufferError};
/// static BUFS: BufferAllocator = BufferAllocator::new();
/// assert_eq!(BUFS.try_alloc(0).unwrap_err(), BufferError::ZeroCapacity);
/// let err = BUFS.try_alloc(usize::MAX).unwrap_err();
/// assert_eq!(err, BufferError::TooLarge(usize::MAX));
/// assert!(err.to_string().contains("isize::MAX"));
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum BufferError {
    /// A buffer of capacity 0 was asked for: every buffer has room for at least one byte.
    ZeroCapacity,
    /// The capacity asked for (carried; for a growth, the length it would reach) is
    /// above `isize::MAX` once rounded up, the most any allocation may have.
    TooLarge(usize),
    /// The class allocator refused (the global allocator failed under it, or a
    /// [`Config::max_live`] cap was reached), or the global allocator failed an
    /// oversize buffer.
    OutOfMemory,
}

impl fmt::Display for BufferError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            BufferError::ZeroCapacity => f.write_str("a buffer of capacity 0 was asked for"),
            BufferError::TooLarge(n) => write!(
                f,
                "a buffer of {n} bytes was asked for: more than isize::MAX once rounded up"
            ),
            BufferError::OutOfMemory => f.write_str("memory allocation failed"),
        }
    }
}

impl std::error::Error for BufferError {}

/// A buffer allocator's numbers: one [`Stats`] row per size class (whose `live` is the
/// live buffers of that class), and the oversize buffers'.
///
/// ```
/// use proxalloc::BufferAllocator;
/// static BUFS: BufferAllocator = BufferAllocator::new();
/// let a = BUFS.alloc(2000);
/// let b = BUFS.alloc(100_000);
/// let s = BUFS.stats();
/// assert_eq!((s.classes[2].live, s.oversize.live, s.live_buffers()), (1, 1, 2));
/// assert_eq!(s.oversize_live_bytes, 100 << 10); // rounded up to 4 KiB
/// # drop((a, b));
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub struct BufferStats {
    /// One row per class of [`BUFFER_CLASSES`], in order.
    pub classes: [Stats; 8],
    /// The buffers above the largest class (from the global allocator); its
    /// `object_size` is 0, as their sizes vary.
    pub oversize: Stats,
    /// Bytes of the live oversize buffers.
    pub oversize_live_bytes: u64,
}

impl BufferStats {
    /// Buffers in users' hands (or in `Bytes` not yet dropped), all classes and the
    /// oversize ones.
    pub fn live_buffers(&self) -> u64 {
        self.classes.iter().map(|s| s.live).sum::<u64>() + self.oversize.live
    }
}

/// Panics with `e`'s message, or aborts as the standard library does when memory
/// cannot be had.
#[cold]
#[track_caller]
pub(super) fn fail(e: BufferError, capacity: usize) -> ! {
    match e {
        BufferError::OutOfMemory => {
            let size = class_of(capacity).map_or(capacity, |c| BUFFER_CLASSES[c]);
            let layout = Layout::from_size_align(size, BUFFER_ALIGN);
            std::alloc::handle_alloc_error(layout.unwrap_or(Layout::new::<u8>()))
        }
        e => panic!("{e}"),
    }
}

/// Hands out [`PooledBuf`]s in the size classes of [`BUFFER_CLASSES`], each served by
/// its own class allocator (per-thread or per-CPU caches, a depot under a byte budget,
/// `trim`, stats). It is usually a `static`, or the process-wide
/// [`BufferAllocator::global`]; an allocator made at run time hands out buffers through
/// an `Arc` ([`alloc_arc`](Self::alloc_arc)).
///
/// ```
/// use bytes::{BufMut, Bytes};
/// use proxalloc::BufferAllocator;
///
/// static BUFS: BufferAllocator = BufferAllocator::new();
///
/// let mut buf = BUFS.alloc(2048);
/// buf.put_slice(b"HTTP/1.1 200 OK\r\n");
/// let head: Bytes = buf.freeze(); // no copy
/// let again = head.clone(); // a reference count, as for any `Bytes`
/// std::thread::spawn(move || drop(again)).join().unwrap();
/// assert_eq!(&head[..], b"HTTP/1.1 200 OK\r\n");
/// drop(head); // the last one: the 2 KiB slot goes back to this CPU's (or thread's) cache
/// assert_eq!(BUFS.stats().live_buffers(), 0);
/// ```
pub struct BufferAllocator {
    c512: ClassAllocator<RawBytes<512>>,
    c1k: ClassAllocator<RawBytes<{ 1 << 10 }>>,
    c2k: ClassAllocator<RawBytes<{ 2 << 10 }>>,
    c4k: ClassAllocator<RawBytes<{ 4 << 10 }>>,
    c8k: ClassAllocator<RawBytes<{ 8 << 10 }>>,
    c16k: ClassAllocator<RawBytes<{ 16 << 10 }>>,
    c32k: ClassAllocator<RawBytes<{ 32 << 10 }>>,
    c64k: ClassAllocator<RawBytes<{ 64 << 10 }>>,
    oversize: OnceLock<Arc<Oversize>>,
    leaks: leaks::Tracker,
}

/// Runs `$body` with `$c` bound to class `$i`'s allocator (each class has its own type).
macro_rules! on_class {
    ($alloc:expr, $i:expr, $c:ident => $body:expr) => {
        match $i {
            0 => {
                let $c = &$alloc.c512;
                $body
            }
            1 => {
                let $c = &$alloc.c1k;
                $body
            }
            2 => {
                let $c = &$alloc.c2k;
                $body
            }
            3 => {
                let $c = &$alloc.c4k;
                $body
            }
            4 => {
                let $c = &$alloc.c8k;
                $body
            }
            5 => {
                let $c = &$alloc.c16k;
                $body
            }
            6 => {
                let $c = &$alloc.c32k;
                $body
            }
            7 => {
                let $c = &$alloc.c64k;
                $body
            }
            _ => unreachable!("a buffer class above 7"),
        }
    };
}

impl BufferAllocator {
    /// An allocator whose classes have the default [`Config`].
    pub const fn new() -> Self {
        Self::with_config(Config::new())
    }

    /// An allocator whose classes each have `config` (its byte bounds apply per class:
    /// `depot_bytes` is each class's depot budget).
    ///
    /// ```
    /// use proxalloc::{BufferAllocator, CacheMode, Config};
    /// static READS: BufferAllocator =
    ///     BufferAllocator::with_config(Config::new().mode(CacheMode::PerCpu).depot_bytes(4 << 20));
    /// assert!(READS.alloc(4096).capacity() >= 4096);
    /// ```
    pub const fn with_config(config: Config) -> Self {
        BufferAllocator {
            c512: ClassAllocator::with_config("buffers-512", config),
            c1k: ClassAllocator::with_config("buffers-1K", config),
            c2k: ClassAllocator::with_config("buffers-2K", config),
            c4k: ClassAllocator::with_config("buffers-4K", config),
            c8k: ClassAllocator::with_config("buffers-8K", config),
            c16k: ClassAllocator::with_config("buffers-16K", config),
            c32k: ClassAllocator::with_config("buffers-32K", config),
            c64k: ClassAllocator::with_config("buffers-64K", config),
            oversize: OnceLock::new(),
            leaks: leaks::Tracker::new(),
        }
    }

    /// The process-wide buffer allocator, with the default [`Config`].
    ///
    /// ```
    /// let buf = proxalloc::BufferAllocator::global().alloc(512);
    /// assert_eq!(buf.capacity(), 512);
    /// ```
    pub fn global() -> &'static BufferAllocator {
        static GLOBAL: BufferAllocator = BufferAllocator::new();
        &GLOBAL
    }

    /// An empty buffer with room for at least `capacity` bytes.
    ///
    /// # Panics
    /// If `capacity` is 0 or above `isize::MAX` once rounded up (the messages are
    /// [`BufferError`]'s); aborts through [`std::alloc::handle_alloc_error`] if memory
    /// cannot be had (or a [`Config::max_live`] cap refuses, as for any class
    /// allocator). [`try_alloc`](Self::try_alloc) returns these as errors: use it for
    /// sizes that come from the network (a `Content-Length` of 0 or of 2^62).
    ///
    /// ```should_panic
    /// static BUFS: proxalloc::BufferAllocator = proxalloc::BufferAllocator::new();
    /// let _ = BUFS.alloc(0); // panics: "a buffer of capacity 0 was asked for"
    /// ```
    #[track_caller]
    #[inline]
    #[must_use = "dropping the buffer gives its slot back at once"]
    pub fn alloc(&'static self, capacity: usize) -> PooledBuf {
        PooledBuf::from_parts(self.alloc_parts(capacity), buf::Source::Static(self))
    }

    /// Like [`alloc`](Self::alloc), but returns an error instead of panicking or
    /// aborting. (As with [`ClassAllocator::try_alloc`](crate::ClassAllocator::try_alloc),
    /// bookkeeping that the allocator itself allocates, such as the first oversize
    /// buffer's stats row or a leak record, still aborts if the global allocator fails.)
    ///
    /// ```
    /// static BUFS: proxalloc::BufferAllocator = proxalloc::BufferAllocator::new();
    /// let buf = BUFS.try_alloc(3000).unwrap();
    /// assert_eq!((buf.len(), buf.capacity()), (0, 4096));
    /// ```
    #[track_caller]
    #[inline]
    #[must_use = "dropping the buffer gives its slot back at once"]
    pub fn try_alloc(&'static self, capacity: usize) -> Result<PooledBuf, BufferError> {
        let parts = self.try_alloc_parts(capacity)?;
        Ok(PooledBuf::from_parts(parts, buf::Source::Static(self)))
    }

    /// An empty buffer of at least `capacity` bytes from an allocator made at run time,
    /// which the buffer (and the `Bytes` it freezes into) keeps alive through a clone of
    /// the `Arc`: one atomic increment per buffer, and a decrement when it is freed.
    ///
    /// # Panics
    /// As [`alloc`](Self::alloc).
    ///
    /// ```
    /// use std::sync::Arc;
    /// use bytes::BufMut;
    /// let bufs = Arc::new(proxalloc::BufferAllocator::new());
    /// let mut b = bufs.alloc_arc(100);
    /// b.put_slice(b"owned");
    /// let frozen = b.freeze();
    /// drop(bufs); // the frozen bytes keep the allocator alive
    /// assert_eq!(&frozen[..], b"owned");
    /// ```
    #[track_caller]
    #[must_use = "dropping the buffer gives its slot back at once"]
    pub fn alloc_arc(self: &Arc<Self>, capacity: usize) -> PooledBuf {
        let parts = self.alloc_parts(capacity);
        PooledBuf::from_parts(parts, buf::Source::Shared(Arc::clone(self)))
    }

    /// Like [`alloc_arc`](Self::alloc_arc), but returns an error instead of panicking
    /// or aborting.
    ///
    /// ```
    /// use std::sync::Arc;
    /// let bufs = Arc::new(proxalloc::BufferAllocator::new());
    /// assert!(bufs.try_alloc_arc(0).is_err());
    /// assert_eq!(bufs.try_alloc_arc(700).unwrap().capacity(), 1024);
    /// ```
    #[track_caller]
    #[must_use = "dropping the buffer gives its slot back at once"]
    pub fn try_alloc_arc(self: &Arc<Self>, capacity: usize) -> Result<PooledBuf, BufferError> {
        let parts = self.try_alloc_parts(capacity)?;
        Ok(PooledBuf::from_parts(
            parts,
            buf::Source::Shared(Arc::clone(self)),
        ))
    }

    #[track_caller]
    #[inline]
    fn alloc_parts(&self, capacity: usize) -> buf::Parts {
        self.try_alloc_parts(capacity)
            .unwrap_or_else(|e| fail(e, capacity))
    }

    /// Memory for a buffer of at least `capacity` bytes, recorded for leak detection.
    #[track_caller]
    #[inline]
    fn try_alloc_parts(&self, capacity: usize) -> Result<buf::Parts, BufferError> {
        let mut parts = self.try_alloc_untracked(capacity)?;
        parts.tracked = self.leaks.on_alloc(parts.ptr, parts.cap);
        Ok(parts)
    }

    /// Memory for a buffer of at least `capacity` bytes, not recorded. Its capacity
    /// says where it came from: exactly a class's size, or above the largest class.
    #[inline]
    fn try_alloc_untracked(&self, capacity: usize) -> Result<buf::Parts, BufferError> {
        let (ptr, cap) = match class_of(capacity) {
            Some(0) if capacity == 0 => return Err(BufferError::ZeroCapacity),
            Some(class) => {
                let ptr = on_class!(self, class, c => c.alloc_raw().map(NonNull::cast::<u8>))
                    .map_err(|_| BufferError::OutOfMemory)?;
                (ptr, BUFFER_CLASSES[class])
            }
            None => self.alloc_oversize(capacity)?,
        };
        Ok(buf::Parts {
            ptr,
            cap,
            tracked: false,
        })
    }

    #[cold]
    fn alloc_oversize(&self, capacity: usize) -> Result<(NonNull<u8>, usize), BufferError> {
        let too_large = BufferError::TooLarge(capacity);
        let cap = capacity
            .checked_next_multiple_of(OVERSIZE_GRAIN)
            .ok_or(too_large)?;
        let layout = Layout::from_size_align(cap, BUFFER_ALIGN).map_err(|_| too_large)?;
        // SAFETY: `layout` has a non-zero size (`capacity` is above the largest class).
        let ptr =
            NonNull::new(unsafe { std::alloc::alloc(layout) }).ok_or(BufferError::OutOfMemory)?;
        let o = self.oversize_counters();
        o.allocs.fetch_add(1, Ordering::Relaxed);
        o.live_bytes.fetch_add(cap as u64, Ordering::Relaxed);
        Ok((ptr, cap))
    }

    fn oversize_counters(&self) -> &Oversize {
        self.oversize.get_or_init(|| {
            let o = Arc::new(Oversize::new(crate::core::ids::fresh_instance()));
            registry::register(&o);
            o
        })
    }

    /// Gives a buffer's memory back.
    ///
    /// # Safety
    /// `parts` came from this allocator's `try_alloc_parts` and is not used again.
    #[inline]
    unsafe fn free_parts(&self, parts: &buf::Parts) {
        if parts.tracked {
            self.leaks.on_free(parts.ptr);
        }
        // A class's memory has exactly its size; oversize memory is larger than any.
        match class_of(parts.cap) {
            Some(class) => {
                // SAFETY: from this class (its size is the capacity), given back once (the caller's
                // contract).
                on_class!(self, class, c => unsafe { c.free_raw(parts.ptr.cast()) })
            }
            None => {
                // SAFETY: allocated in `alloc_oversize` with this layout (`cap` is the
                // rounded size, already checked there).
                unsafe {
                    std::alloc::dealloc(
                        parts.ptr.as_ptr(),
                        Layout::from_size_align_unchecked(parts.cap, BUFFER_ALIGN),
                    )
                };
                let o = self.oversize_counters();
                // Release: a `stats()` that sees this free sees the buffer's alloc.
                o.frees.fetch_add(1, Ordering::Release);
                o.live_bytes.fetch_sub(parts.cap as u64, Ordering::Relaxed);
            }
        }
    }

    /// The classes' rows and the oversize buffers' numbers.
    pub fn stats(&self) -> BufferStats {
        let mut classes = [Stats::default(); 8];
        for (i, row) in classes.iter_mut().enumerate() {
            // A class never used has an all-zero row, and is not created to say so.
            *row = on_class!(self, i, c => match c.used_engine() {
                Some(e) => e.stats(),
                None => Stats {
                    name: c.name(),
                    object_size: BUFFER_CLASSES[i],
                    mode: c.config().mode,
                    ..Stats::default()
                },
            });
        }
        let unused = Oversize::new(0);
        let o = self.oversize.get().map_or(&unused, |o| &**o);
        let (oversize, oversize_live_bytes) = (o.stats(), o.live_bytes.load(Ordering::Relaxed));
        BufferStats {
            classes,
            oversize,
            oversize_live_bytes,
        }
    }

    /// Gives back what every class caches (its depot, its CPU caches, this thread's
    /// cache and other threads' stashes, as [`ClassAllocator::trim`] does), asking the
    /// OS once for all of it; returns the bytes released.
    ///
    /// ```
    /// static BUFS: proxalloc::BufferAllocator = proxalloc::BufferAllocator::new();
    /// drop((0..100).map(|_| BUFS.alloc(4096)).collect::<Vec<_>>());
    /// assert!(BUFS.trim() >= 100 * 4096);
    /// assert_eq!(BUFS.stats().classes[3].reserved_bytes(), 0);
    /// ```
    pub fn trim(&self) -> usize {
        self.trim_classes(|class| class.trim())
    }

    /// Gives back what went unused since the previous call, as
    /// [`trim_idle`](crate::trim_idle) does for every allocator; returns the bytes
    /// released. The first call only starts the interval, which is each class's own and
    /// shared with every caller of this and of [`trim_idle`](crate::trim_idle); a call
    /// less than a millisecond after the previous one does nothing.
    pub fn trim_idle(&self) -> usize {
        self.trim_classes(|class| class.trim_idle())
    }

    fn trim_classes(&self, trim: impl Fn(&dyn Registered) -> usize) -> usize {
        registry::trim_each(
            |part| {
                for i in 0..BUFFER_CLASSES.len() {
                    if let Some(e) = on_class!(self, i, c => c.used_engine()) {
                        part(e);
                    }
                }
            },
            trim,
        )
    }

    /// Hands this thread's cached buffers of every class to the depots (see
    /// [`ClassAllocator::release_thread_cache`]: per-CPU classes, the default, have only
    /// a fallback thread cache to release; `trim` takes their CPUs' buffers).
    pub fn release_thread_cache(&self) {
        for i in 0..BUFFER_CLASSES.len() {
            if on_class!(self, i, c => c.used_engine()).is_some() {
                on_class!(self, i, c => c.release_thread_cache());
            }
        }
    }

    /// Sets which allocations are recorded for [`oldest_live`](Self::oldest_live)
    /// (default [`LeakLevel::Sampled`]). Recording is compiled in only with misuse
    /// detection (debug builds, or the `debug-checks` feature); otherwise nothing is
    /// recorded whatever the level.
    pub fn set_leak_level(&self, level: LeakLevel) {
        self.leaks.set_level(level);
    }

    /// The level set by [`set_leak_level`](Self::set_leak_level).
    pub fn leak_level(&self) -> LeakLevel {
        self.leaks.level()
    }

    /// The live buffers recorded (see [`LeakLevel`]), oldest first, at most `max` of
    /// them: where each was allocated, its capacity and its age. A buffer that stays in
    /// this list long after its request ended is a leak: held in a forgotten structure,
    /// or `mem::forget`-ten. Empty unless misuse detection is compiled in.
    ///
    /// ```
    /// use proxalloc::{BufferAllocator, LeakLevel};
    /// static BUFS: BufferAllocator = BufferAllocator::new();
    /// BUFS.set_leak_level(LeakLevel::All);
    /// let kept = BUFS.alloc(100);
    /// let leaked = BUFS.alloc(100);
    /// std::mem::forget(leaked);
    /// let live = BUFS.oldest_live(10);
    /// if cfg!(debug_assertions) {
    ///     assert_eq!(live.len(), 2);
    ///     // Oldest first, each with its line: `kept`'s, then `leaked`'s.
    ///     assert_eq!(live[1].location.line(), live[0].location.line() + 1);
    ///     println!("{}", live[1]); // "512-byte buffer allocated at src/...:9:18, 0.1 ms ago"
    /// }
    /// # drop(kept);
    /// ```
    pub fn oldest_live(&self, max: usize) -> Vec<LiveBuffer> {
        self.leaks.oldest(max)
    }
}

// A buffer (`Send + Sync`) reaches its allocator from any thread.
const _: () = {
    const fn sync<T: Send + Sync>() {}
    sync::<BufferAllocator>();
};

impl Default for BufferAllocator {
    fn default() -> Self {
        Self::new()
    }
}

impl fmt::Debug for BufferAllocator {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("BufferAllocator")
            .field("config", self.c512.config())
            .field("leak_level", &self.leak_level())
            .finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests;
