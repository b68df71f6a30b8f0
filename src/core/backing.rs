//! Where object memory comes from on a miss and goes back to on overflow: the Rust global
//! allocator, one block per object.
//!
//! Using the global allocator (rather than carving slabs) means every object released here
//! really returns to the system allocator, so `trim()` and the depot budget bound the
//! footprint, and a program that installs mimalloc or jemalloc gets it underneath.
//!
//! For a recycling allocator ([`RecyclingAllocator`](crate::RecyclingAllocator)) cached
//! objects are live values: the backing then constructs each object it hands out and
//! destroys each one it takes back, through [`ObjectHooks`].
//!
//! A pool [`BlockSource`](crate::BlockSource) built with a user's [`BlockAllocator`]
//! passes it down through the same hooks, and its classes' backings then take memory from
//! it instead of the global allocator. Without one, nothing changes on the default path
//! but a test of a field that is `None`, on the way to the global allocator.

use std::alloc::Layout;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::ptr::NonNull;

use crate::sync::{self, StatCounter};

/// Where a [`BlockSource`](crate::BlockSource) gets its memory, instead of the global allocator: see
/// [`BlockSource::with_block_allocator`](crate::BlockSource::with_block_allocator).
///
/// Requests are for whole blocks: 8, 16, 32 or 64 KiB, or a multiple of 4 KiB above
/// that, aligned to [`BLOCK_ALIGN`](crate::BLOCK_ALIGN). The source caches freed blocks within its
/// `max_free` budget and returns the rest (and everything, on [`BlockSource::trim`](crate::BlockSource::trim) and
/// when it is dropped) through [`free_block`](Self::free_block). Both methods may be
/// called from any thread, concurrently; they run outside every lock of the source, and
/// may themselves allocate (from the global allocator, or from other allocators of this
/// crate, though not from the same source, which would recurse).
///
/// # Safety
/// An implementation must hand out memory that is valid for reads and writes of
/// `layout.size()` bytes, aligned to `layout.align()`, and not used by anything else
/// until it is given back with `free_block`, like
/// [`GlobalAlloc::alloc`](std::alloc::GlobalAlloc::alloc). The source writes into the
/// blocks as soon as it has them.
///
/// ```
/// use std::alloc::{GlobalAlloc, Layout, System};
/// use std::ptr::NonNull;
/// use std::sync::atomic::{AtomicUsize, Ordering};
/// use std::sync::Arc;
/// use proxalloc::{BlockAllocator, BlockSource, Pool};
///
/// /// Counts the bytes of pool blocks it holds.
/// #[derive(Default)]
/// struct Counted(AtomicUsize);
///
/// // SAFETY: the memory comes from `System` with the same layout.
/// unsafe impl BlockAllocator for Counted {
///     fn alloc_block(&self, layout: Layout) -> Option<NonNull<u8>> {
///         self.0.fetch_add(layout.size(), Ordering::Relaxed);
///         // SAFETY: block layouts are never zero-sized.
///         NonNull::new(unsafe { System.alloc(layout) })
///     }
///     unsafe fn free_block(&self, ptr: NonNull<u8>, layout: Layout) {
///         self.0.fetch_sub(layout.size(), Ordering::Relaxed);
///         // SAFETY: allocated above with this layout.
///         unsafe { System.dealloc(ptr.as_ptr(), layout) }
///     }
/// }
///
/// let counted = Arc::new(Counted::default());
/// let source = BlockSource::with_block_allocator(1 << 20, counted.clone());
/// let mut pool = Pool::with_source(&source);
/// let _ = pool.alloc_str("in a counted block");
/// assert!(counted.0.load(Ordering::Relaxed) >= 8 << 10);
/// pool.clear();
/// drop(pool);
/// drop(source); // every block goes back to `counted` (this thread's cache included)
/// assert_eq!(counted.0.load(Ordering::Relaxed), 0);
/// ```
pub unsafe trait BlockAllocator: Send + Sync + 'static {
    /// A block of `layout`, or `None` if there is no memory (the pool then reports an
    /// allocation failure).
    fn alloc_block(&self, layout: Layout) -> Option<NonNull<u8>>;

    /// Takes back a block. A panic here is caught and discarded (the block is lost).
    ///
    /// # Safety
    /// `ptr` came from [`alloc_block`](Self::alloc_block) on this allocator with the same
    /// `layout`, and is not used afterwards.
    unsafe fn free_block(&self, ptr: NonNull<u8>, layout: Layout);
}

/// The system allocator (`malloc`), bypassing a `#[global_allocator]`.
///
/// ```
/// use std::sync::Arc;
/// let source = proxalloc::BlockSource::with_block_allocator(1 << 20, Arc::new(std::alloc::System));
/// let block = source.alloc(20_000).unwrap();
/// // SAFETY: from `source`, not used again.
/// unsafe { source.free(block) };
/// ```
// SAFETY: `System` hands out memory as `GlobalAlloc` promises.
unsafe impl BlockAllocator for std::alloc::System {
    fn alloc_block(&self, layout: Layout) -> Option<NonNull<u8>> {
        // SAFETY: block layouts have a non-zero size.
        NonNull::new(unsafe { std::alloc::GlobalAlloc::alloc(self, layout) })
    }

    unsafe fn free_block(&self, ptr: NonNull<u8>, layout: Layout) {
        // SAFETY: per the caller's contract, allocated by `alloc_block` with `layout`.
        unsafe { std::alloc::GlobalAlloc::dealloc(self, ptr.as_ptr(), layout) }
    }
}

/// Type-erased construction and destruction of the objects of a recycling allocator.
#[derive(Clone, Copy, Debug)]
pub struct ValueHooks {
    /// Writes a fresh object into uninitialised memory.
    pub construct: unsafe fn(*mut u8),
    /// Drops the object in place.
    pub destroy: unsafe fn(*mut u8),
}

/// What a backing does besides taking plain memory from the global allocator: build and
/// drop values (a recycling allocator), and/or take memory from a user's block allocator
/// (a pool block source's classes).
#[derive(Clone, Copy, Debug)]
pub struct ObjectHooks {
    /// Construction and destruction of the objects, if they are live values.
    pub values: Option<ValueHooks>,
    /// Where memory comes from instead of the global allocator.
    pub memory: Option<MemoryHook>,
}

/// A user's block allocator as [`ObjectHooks`] carry it (they are `Copy`, and built in
/// `const` contexts): a pointer to an `Arc` that a [`MemoryOwner`] keeps in place. Each
/// [`Backing`] built with it clones the `Arc`, so it lives as long as they do.
#[derive(Clone, Copy)]
pub struct MemoryHook(NonNull<std::sync::Arc<dyn BlockAllocator>>);

/// Keeps a user's block allocator at a fixed address for [`MemoryHook`]s: a leaked box,
/// taken back on drop. (Not a `Box` field: moving a `Box` asserts unique access to what
/// it points to, which would invalidate the hooks' pointers.)
pub struct MemoryOwner(NonNull<std::sync::Arc<dyn BlockAllocator>>);

// SAFETY: it owns an `Arc<dyn BlockAllocator>`, which is `Send + Sync`.
unsafe impl Send for MemoryOwner {}
// SAFETY: as above.
unsafe impl Sync for MemoryOwner {}

impl MemoryOwner {
    /// Keeps `allocator` in place until dropped.
    pub fn new(allocator: std::sync::Arc<dyn BlockAllocator>) -> Self {
        MemoryOwner(NonNull::from(Box::leak(Box::new(allocator))))
    }

    /// A hook for the allocator.
    ///
    /// # Safety
    /// No [`Backing::new`] is given the hook after this owner is dropped (its owner
    /// keeps it next to the allocators that carry the hook, and drops it after them).
    pub unsafe fn hook(&self) -> MemoryHook {
        MemoryHook(self.0)
    }

    /// The allocator.
    pub fn get(&self) -> &std::sync::Arc<dyn BlockAllocator> {
        // SAFETY: owned by `self`, only ever shared.
        unsafe { self.0.as_ref() }
    }
}

impl Drop for MemoryOwner {
    fn drop(&mut self) {
        // SAFETY: leaked in `new`; the hooks that point here are no longer used (the
        // contract of `hook`).
        drop(unsafe { Box::from_raw(self.0.as_ptr()) });
    }
}

// SAFETY: it stands for a shared reference to an `Arc<dyn BlockAllocator>`, which is
// `Send + Sync` (the trait requires both).
unsafe impl Send for MemoryHook {}
// SAFETY: as above.
unsafe impl Sync for MemoryHook {}

impl std::fmt::Debug for MemoryHook {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("MemoryHook")
    }
}

/// A user's block allocator, owned by a backing.
struct UserMemory(std::sync::Arc<dyn BlockAllocator>);

impl std::fmt::Debug for UserMemory {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("UserMemory")
    }
}

/// The backing allocator for objects of one layout, with counts of what it handed out.
#[derive(Debug)]
pub struct Backing {
    layout: Layout,
    hooks: Option<ValueHooks>,
    /// `None` (the global allocator) unless a user supplied the memory.
    memory: Option<UserMemory>,
    allocs: StatCounter,
    frees: StatCounter,
}

/// Frees one block if construction unwinds.
struct FreeOnUnwind<'b>(&'b Backing, NonNull<u8>);

impl Drop for FreeOnUnwind<'_> {
    fn drop(&mut self) {
        // SAFETY: the block was allocated with the backing's layout and holds no value.
        unsafe { self.0.free_block(self.1) };
    }
}

impl Backing {
    /// A backing allocator for objects of `layout`; with `hooks`, objects are constructed
    /// when handed out and destroyed when taken back.
    pub fn new(layout: Layout, hooks: Option<ObjectHooks>) -> Self {
        Backing {
            layout,
            hooks: hooks.and_then(|h| h.values),
            memory: hooks.and_then(|h| h.memory).map(|m| {
                // SAFETY: per `MemoryOwner::hook`, the `Arc` is alive and in place while
                // the hooks are in use, as they are now.
                UserMemory(unsafe { m.0.as_ref() }.clone())
            }),
            allocs: StatCounter::new(),
            frees: StatCounter::new(),
        }
    }

    /// One object's memory (constructed, with hooks), or `None` when the global
    /// allocator (or the user's block allocator) fails. If construction (or the user's
    /// block allocator) panics, the memory is freed and the panic goes on.
    pub fn alloc(&self) -> Option<NonNull<u8>> {
        let p = if self.layout.size() == 0 {
            // Zero-sized objects need no memory, only a well-aligned non-null address.
            NonNull::new(std::ptr::without_provenance_mut(self.layout.align()))
        } else if let Some(UserMemory(m)) = &self.memory {
            m.alloc_block(self.layout)
        } else {
            // SAFETY: the layout has a non-zero size.
            NonNull::new(unsafe { sync::alloc(self.layout) })
        }?;
        if let Some(hooks) = self.hooks {
            let guard = FreeOnUnwind(self, p);
            // SAFETY: fresh memory of the hooks' type.
            unsafe { (hooks.construct)(p.as_ptr()) };
            std::mem::forget(guard);
        }
        self.allocs.add_shared(1);
        Some(p)
    }

    /// Frees a block without touching its contents or the counters.
    ///
    /// # Safety
    /// `p` came from `alloc` on this backing (or its memory part) and is not used again.
    unsafe fn free_block(&self, p: NonNull<u8>) {
        if self.layout.size() != 0 {
            match &self.memory {
                // SAFETY: by the caller's contract `p` was allocated with `self.layout`.
                None => unsafe { sync::dealloc(p.as_ptr(), self.layout) },
                // SAFETY: as above, from this block allocator.
                Some(UserMemory(m)) => unsafe { free_user_block(&**m, p, self.layout) },
            }
        }
    }

    /// Destroys the object at `p` (with hooks). A panic in its destructor is caught and
    /// discarded ([`discard_panic`]): it happens inside the allocator, which must stay
    /// consistent, in the middle of a batch whose remaining objects would otherwise be
    /// destroyed again, and the memory is freed regardless.
    ///
    /// # Safety
    /// `p` holds a live object of the hooks' type, which is not used again.
    unsafe fn destroy(&self, p: NonNull<u8>) {
        if let Some(hooks) = self.hooks {
            // SAFETY: forwarded from the caller.
            let result = catch_unwind(AssertUnwindSafe(|| unsafe { (hooks.destroy)(p.as_ptr()) }));
            if let Err(payload) = result {
                discard_panic(payload);
            }
        }
    }

    /// Returns one object (destroying it, with hooks).
    ///
    /// # Safety
    /// `p` came from [`alloc`](Self::alloc) on this backing and is not used afterwards;
    /// with hooks it holds a live object.
    pub unsafe fn dealloc(&self, p: NonNull<u8>) {
        // SAFETY: forwarded from the caller.
        unsafe {
            self.destroy(p);
            self.free_block(p);
        }
        self.frees.add_shared(1);
    }

    /// Returns one object whose value is already gone (dropped or moved out), even with
    /// hooks.
    ///
    /// # Safety
    /// `p` came from [`alloc`](Self::alloc) on this backing and is not used afterwards.
    pub unsafe fn dealloc_dead(&self, p: NonNull<u8>) {
        // SAFETY: forwarded from the caller.
        unsafe { self.free_block(p) };
        self.frees.add_shared(1);
    }

    /// Returns every object in `objects`, as [`dealloc`](Self::dealloc) does.
    ///
    /// # Safety
    /// As for [`dealloc`](Self::dealloc), for each pointer (magazine slots are never
    /// null).
    pub unsafe fn dealloc_all(&self, objects: &[*mut u8]) {
        for &p in objects {
            // SAFETY: forwarded from the caller.
            unsafe {
                let p = NonNull::new_unchecked(p);
                self.destroy(p);
                self.free_block(p);
            }
        }
        self.frees.add_shared(objects.len() as u64);
        if self.memory.is_none() {
            gave_to_system(objects.len() * self.layout.size());
        }
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

/// Gives a block back to a user's block allocator. A panic there is caught and
/// discarded (the block is then lost), as for a value's destructor in
/// [`Backing::destroy`]: it happens inside the allocator, in the middle of a batch.
///
/// # Safety
/// `p` came from `allocator.alloc_block(layout)` and is not used again.
pub(crate) unsafe fn free_user_block(
    allocator: &dyn BlockAllocator,
    p: NonNull<u8>,
    layout: Layout,
) {
    // SAFETY: forwarded from the caller.
    let result = catch_unwind(AssertUnwindSafe(|| unsafe {
        allocator.free_block(p, layout)
    }));
    if let Err(payload) = result {
        discard_panic(payload);
    }
}

/// Drops the payload of a panic that proxalloc caught and does not pass on. A payload
/// whose own `Drop` panics is contained too: that panic's payload is dropped in turn (a
/// plain message, as a rule), and only a chain of payloads that keep panicking when
/// dropped is cut short and forgotten, so nothing unwinds out of the caller, which is in
/// the middle of releasing a batch or running a pool's cleanups.
pub(crate) fn discard_panic(mut payload: Box<dyn std::any::Any + Send>) {
    for _ in 0..8 {
        match catch_unwind(AssertUnwindSafe(|| drop(payload))) {
            Ok(()) => return,
            Err(again) => payload = again,
        }
    }
    std::mem::forget(payload);
}

/// Bytes that proxalloc gave the global allocator in batches (depot spills over a budget,
/// trims, flushes, an allocator's drop), and pool large blocks as they are freed, since
/// it last asked the OS for memory back: glibc keeps freed small blocks in its bins, even
/// when all of them are free, until someone calls `malloc_trim`. A process-wide hint (a
/// std atomic even under loom): read and reset with no other memory depending on it.
static GIVEN_SINCE_ASKED: sync::process::AtomicU64 = sync::process::AtomicU64::new(0);

/// Requests proxalloc made for memory back to the OS (see [`ask_os_for_memory_back`]).
static ASKED: sync::process::AtomicU64 = sync::process::AtomicU64::new(0);

/// `(requests for memory back so far, bytes given in batches since the last)`: see
/// [`crate::stats::system_trims`].
pub(crate) fn system_trims() -> (u64, u64) {
    use sync::Ordering::Relaxed;
    (ASKED.load(Relaxed), GIVEN_SINCE_ASKED.load(Relaxed))
}

/// What [`release_to_os`] waits for before it asks: `malloc_trim` walks glibc's whole heap,
/// so not for every small release.
pub(crate) const ASK_THRESHOLD: u64 = 1 << 20;

/// Counts `bytes` given to the global allocator in one batch, or one large block (see
/// [`GIVEN_SINCE_ASKED`]). Single objects freed one at a time (bypass mode, a thread
/// without a cache) are not counted: they are what any program frees, and one shared
/// counter per free would cost the threads that free them.
pub(crate) fn gave_to_system(bytes: usize) {
    if bytes > 0 {
        GIVEN_SINCE_ASKED.fetch_add(bytes as u64, sync::Ordering::Relaxed);
    }
}

/// Asks the C allocator to return free memory to the OS if proxalloc gave it 1 MiB or more
/// ([`ASK_THRESHOLD`]) since it last asked, whoever gave it and whenever: a trim's release,
/// and the spills over depot budgets between trims, which are most of a burst when the
/// budget is small. Other platforms return memory on their own schedule.
///
/// Called once per public trim (an allocator's, a block source's, `trim_idle`): calls
/// that a program makes to give memory back. Of two trims that end at once, one asks (the
/// count is taken whole, so none of it is lost either).
pub(crate) fn release_to_os() {
    use sync::Ordering::Relaxed;
    let past_threshold = |given| (given >= ASK_THRESHOLD).then_some(0);
    if let Ok(given) = GIVEN_SINCE_ASKED.fetch_update(Relaxed, Relaxed, past_threshold) {
        request_or_keep(given);
    }
}

/// Asks the C allocator to return free memory to the OS after a drop (an allocator's, a
/// block source's) that released `bytes`, if those alone are 1 MiB or more: the last
/// handle of an allocator shared by `Arc` (`Owned`, a frozen buffer) drops it on whatever
/// thread frees that handle, which must not pay a walk of glibc's heap for other
/// allocators' spills. What it asks for includes them.
pub(crate) fn release_dropped_to_os(bytes: usize) {
    if bytes as u64 >= ASK_THRESHOLD {
        ask_os_for_memory_back();
    }
}

/// Asks the C allocator to return free memory to the OS if proxalloc gave it anything since
/// it last asked (see [`release_to_os`] for the threshold that other trims keep).
pub(crate) fn release_any_to_os() {
    let given = GIVEN_SINCE_ASKED.swap(0, sync::Ordering::Relaxed);
    if given > 0 {
        request_or_keep(given);
    }
}

/// The request (the user's hook, or glibc's `malloc_trim(0)`), whatever was given since
/// the last: the global allocator's free memory back to the OS.
pub(crate) fn ask_os_for_memory_back() {
    request_or_keep(GIVEN_SINCE_ASKED.swap(0, sync::Ordering::Relaxed));
}

/// Makes the request for the `given` bytes the caller took from the count (zeroed before
/// the request: what is given while it runs may be too late for it, and counts towards
/// the next), or puts them back if the request is skipped (see [`request_memory_back`]).
fn request_or_keep(given: u64) {
    if !request_memory_back() {
        GIVEN_SINCE_ASKED.fetch_add(given, sync::Ordering::Relaxed);
    }
}

/// The request itself: the user's hook (see [`set_system_trim`]) or glibc's
/// `malloc_trim`. False, with nothing counted or called, for a request the hook makes
/// from within itself (a trim inside the hook), rather than recurse, and for one with a
/// hook on a thread whose thread-locals are gone (where that cannot be told).
fn request_memory_back() -> bool {
    // Copied out: the hook runs with no lock held (it may allocate, or set a new hook).
    let hook = *SYSTEM_TRIM.lock().unwrap_or_else(|e| e.into_inner());
    // Held until the hook has returned (or unwound).
    let _inside = if hook.is_some() {
        let Some(inside) = InsideHook::enter() else {
            return false;
        };
        Some(inside)
    } else {
        None
    };
    ASKED.fetch_add(1, sync::Ordering::Relaxed);
    #[cfg(all(test, not(proxalloc_loom)))]
    OS_RELEASES.with(|n| n.set(n.get() + 1));
    match hook {
        // A panic in it is contained: it runs inside a trim or an allocator's drop, which
        // must finish.
        Some(trim) => {
            if let Err(payload) = catch_unwind(trim) {
                discard_panic(payload);
            }
        }
        None => glibc_trim(),
    }
    true
}

/// What a request calls instead of glibc's `malloc_trim` (see [`set_system_trim`]).
static SYSTEM_TRIM: sync::process::Mutex<Option<fn()>> = sync::process::Mutex::new(None);

/// Replaces what a request for memory back calls (see `proxalloc::set_system_trim`).
pub(crate) fn set_system_trim(trim: Option<fn()>) {
    *SYSTEM_TRIM.lock().unwrap_or_else(|e| e.into_inner()) = trim;
}

std::thread_local! {
    /// Whether this thread is inside the user's system trim hook.
    static IN_SYSTEM_TRIM: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// This thread inside the user's hook, until dropped (even by a panic that
/// [`discard_panic`] could not contain).
struct InsideHook;

impl InsideHook {
    /// `None` if this thread is inside the hook already, or its thread-locals are gone.
    fn enter() -> Option<InsideHook> {
        match IN_SYSTEM_TRIM.try_with(|inside| inside.replace(true)) {
            Ok(false) => Some(InsideHook),
            Ok(true) | Err(_) => None,
        }
    }
}

impl Drop for InsideHook {
    fn drop(&mut self) {
        let _ = IN_SYSTEM_TRIM.try_with(|inside| inside.set(false));
    }
}

/// glibc's `malloc_trim(0)`, where glibc is the C allocator (elsewhere nothing).
fn glibc_trim() {
    #[cfg(all(
        target_os = "linux",
        target_env = "gnu",
        not(miri),
        not(proxalloc_loom)
    ))]
    {
        extern "C" {
            fn malloc_trim(pad: usize) -> i32;
        }
        // SAFETY: glibc's `malloc_trim` has no preconditions.
        unsafe { malloc_trim(0) };
    }
}

/// Whether a request was made after the count was `before` (for tests, which share the
/// count with other tests' threads). A request zeroes the bytes given before it counts
/// itself, so a thread whose bytes another thread's request took may look a moment
/// before that count moves: wait for it (a few instructions away, unless that thread is
/// descheduled) rather than fail.
#[cfg(all(test, not(proxalloc_loom)))]
pub(crate) fn requested_since(before: u64) -> bool {
    for _ in 0..5_000 {
        if system_trims().0 > before {
            return true;
        }
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
    false
}

#[cfg(all(test, not(proxalloc_loom)))]
std::thread_local! {
    /// How many times this thread asked the OS for memory back (see [`release_to_os`]).
    pub(crate) static OS_RELEASES: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
}
