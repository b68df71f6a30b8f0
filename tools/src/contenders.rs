//! The contenders: every allocator and object pool the benchmarks compare, behind one
//! trait, so that each workload (`super::workloads`) is written once and every contender
//! runs exactly the same loop.
//!
//! Each contender hands out an owning handle for a value of `T` and takes it back. The
//! trait has a lifetime so that a handle may borrow its contender: a `'static` contender
//! (leaked, see [`leak`]) for the workloads that cross threads, or proxalloc's
//! `LocalCache`, which lives only inside a `with_local` call.

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::UnsafeCell;
use std::hint::black_box;
use std::mem::MaybeUninit;
use std::ops::Deref;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicUsize, Ordering};

use proxalloc::{CacheMode, ClassAllocator, ClassBox, Config, LocalCache};

/// An allocator of `T`s under test, borrowed for `'a`.
pub trait Contender<'a, T> {
    type Handle;
    fn alloc(&'a self, v: T) -> Self::Handle;
    fn free(&'a self, h: Self::Handle);
    /// Touches the object (so no contender is measured without using its memory).
    fn touch(h: &Self::Handle);
}

/// Leaks a value to get the `'static` reference the handles borrow.
pub fn leak<T>(v: T) -> &'static T {
    Box::leak(Box::new(v))
}

/// Writes a [`Contender`] impl: the same three methods for every contender, each
/// `#[inline(always)]`, so that a workload's loop is measured with the contender's code
/// inlined into it, as a program calling that allocator directly has it: a generic
/// harness does not always get the inlining a direct caller gets, and a call per
/// operation would be part of the figure (`docs/benchmarks.md#localcache-inlined`).
/// `free` may be left out when dropping the handle frees the object, and `touch` when
/// the handle dereferences to it.
macro_rules! contender {
    (
        $(#[$attr:meta])*
        impl[$($gen:tt)*] Contender<$l:lifetime, $t:ty> for $ty:ty {
            type Handle = $handle:ty;
            fn alloc(&$sa:ident, $v:ident) $alloc:block
            $(fn free(&$sf:ident, $h:ident) $free:block)?
            $(fn touch($ht:ident) $touch:block)?
        }
    ) => {
        $(#[$attr])*
        impl<$($gen)*> Contender<$l, $t> for $ty {
            type Handle = $handle;
            #[inline(always)]
            fn alloc(&$l $sa, $v: $t) -> Self::Handle $alloc
            contender!(@free $l; $(&$sf, $h $free)?);
            contender!(@touch $(($ht) $touch)?);
        }
    };
    (@free $l:lifetime;) => {
        #[inline(always)]
        fn free(&$l self, h: Self::Handle) {
            drop(h)
        }
    };
    (@free $l:lifetime; &$s:ident, $h:ident $body:block) => {
        #[inline(always)]
        fn free(&$l $s, $h: Self::Handle) $body
    };
    (@touch) => {
        #[inline(always)]
        fn touch(h: &Self::Handle) {
            black_box(&**h);
        }
    };
    (@touch ($h:ident) $body:block) => {
        #[inline(always)]
        fn touch($h: &Self::Handle) $body
    };
}

// ---- proxalloc (thread caches, depot only, bypass) ----

pub struct Proxalloc<T: 'static>(pub ClassAllocator<T>);

impl<T: 'static> Proxalloc<T> {
    pub fn new(mode: CacheMode) -> &'static Self {
        leak(Proxalloc(ClassAllocator::with_config(
            "bench",
            Config::new().mode(mode),
        )))
    }
}

contender! {
    impl['a, T] Contender<'a, T> for Proxalloc<T> {
        type Handle = ClassBox<'a, T>;
        fn alloc(&self, v) {
            self.0.alloc(v)
        }
    }
}

contender! {
    /// proxalloc through `with_local`: the cache in hand, no per-operation thread-local
    /// lookup (as an event-loop worker that owns its thread uses it).
    impl['b, 'a: 'b, T] Contender<'b, T> for LocalCache<'a, T> {
        type Handle = ClassBox<'a, T>;
        fn alloc(&self, v) {
            LocalCache::alloc(self, v)
        }
        fn free(&self, h) {
            LocalCache::free(self, h)
        }
    }
}

/// proxalloc with a one-word handle (the pointer alone; the allocator known from the
/// contender): the experiment behind "should `ClassBox` drop its allocator reference for
/// `static` allocators?". Same allocator code, half the handle.
pub struct ProxallocOneWord<T: 'static>(pub ClassAllocator<T>);

impl<T: 'static> ProxallocOneWord<T> {
    pub fn new() -> &'static Self {
        leak(ProxallocOneWord(ClassAllocator::with_config(
            "bench-one-word",
            Config::new(),
        )))
    }
}

/// A raw object pointer that may cross threads (it owns a `T`, which is `Send`).
pub struct OneWord<T>(NonNull<T>);
// SAFETY: the handle owns its object exclusively, like `Box<T>`; `T` is `Send`.
unsafe impl<T: Send> Send for OneWord<T> {}

impl<T> Deref for OneWord<T> {
    type Target = T;
    #[inline(always)]
    fn deref(&self) -> &T {
        // SAFETY: the handle owns a live object (made only by `alloc` below, consumed by
        // `free`).
        unsafe { self.0.as_ref() }
    }
}

contender! {
    impl['a, T] Contender<'a, T> for ProxallocOneWord<T> {
        type Handle = OneWord<T>;
        fn alloc(&self, v) {
            OneWord(ClassBox::into_raw(self.0.alloc(v)))
        }
        fn free(&self, h) {
            // SAFETY: `h` came from `into_raw` on this allocator and is freed once.
            drop(unsafe { ClassBox::from_raw(&self.0, h.0) })
        }
    }
}

// ---- Box under the system allocator (no global allocator is installed) ----

pub struct SystemBox;

contender! {
    impl['a, T] Contender<'a, T> for SystemBox {
        type Handle = Box<T>;
        fn alloc(&self, v) {
            Box::new(v)
        }
    }
}

// ---- mimalloc and jemalloc through their GlobalAlloc impls (not installed) ----

/// An owning pointer to a value in memory of some `GlobalAlloc`.
pub struct RawBox<T>(NonNull<T>);
// SAFETY: owns its `T` like a `Box`.
unsafe impl<T: Send> Send for RawBox<T> {}

impl<T> Deref for RawBox<T> {
    type Target = T;
    #[inline(always)]
    fn deref(&self) -> &T {
        // SAFETY: a `RawBox` holds a live value: it is made only by an `alloc` below,
        // after the value is written, and consumed by the matching `free`.
        unsafe { self.0.as_ref() }
    }
}

pub struct ViaGlobal<A: GlobalAlloc>(pub A);

contender! {
    impl['a, A: GlobalAlloc, T] Contender<'a, T> for ViaGlobal<A> {
        type Handle = RawBox<T>;
        fn alloc(&self, v) {
            // SAFETY: non-zero layout; the block gets one value and is freed once in
            // `free`.
            unsafe {
                let p = self.0.alloc(Layout::new::<T>()).cast::<T>();
                let p = NonNull::new(p).expect("out of memory");
                p.as_ptr().write(v);
                RawBox(p)
            }
        }
        fn free(&self, h) {
            // SAFETY: allocated in `alloc` with this layout.
            unsafe { self.0.dealloc(h.0.as_ptr().cast(), Layout::new::<T>()) }
        }
    }
}

// ---- object-pool (Mutex<Vec<T>>) ----

pub struct ObjectPool<T>(pub object_pool::Pool<T>);

contender! {
    impl['a, T: Default + 'a] Contender<'a, T> for ObjectPool<T> {
        type Handle = object_pool::Reusable<'a, T>;
        fn alloc(&self, v) {
            let mut h = self.0.pull(T::default);
            *h = v;
            h
        }
    }
}

// ---- lockfree-object-pool (LinearObjectPool) ----

pub struct LockfreePool<T>(pub lockfree_object_pool::LinearObjectPool<T>);

contender! {
    impl['a, T: 'a] Contender<'a, T> for LockfreePool<T> {
        type Handle = lockfree_object_pool::LinearReusable<'a, T>;
        fn alloc(&self, v) {
            let mut h = self.0.pull();
            *h = v;
            h
        }
    }
}

// ---- sharded-slab Pool (keys, released with `clear`) ----

pub struct ShardedSlab<T: sharded_slab::Clear + Default>(pub sharded_slab::Pool<T>);

contender! {
    impl['a, T: sharded_slab::Clear + Default] Contender<'a, T> for ShardedSlab<T> {
        type Handle = usize;
        fn alloc(&self, v) {
            self.0.create_with(|o| *o = v).expect("slab full")
        }
        fn free(&self, h) {
            self.0.clear(h);
        }
        fn touch(h) {
            black_box(*h);
        }
    }
}

// ---- W4's floor: a ring of slots, no allocator ----

/// W4's floor: no allocator at all. The allocating thread takes the slots of a fixed ring
/// in turn, and a free only drops the value, so what W4 costs with it is the workload's
/// own: building the objects, handing their handles over in batches, and the objects'
/// and handles' lines moving between the two cores. The W1-W3 floor (a thread-local
/// stack) cannot take a remote free; this one takes nothing else.
///
/// It checks nothing, so that it costs nothing: [`HandoffFloor::new`]'s caller promises
/// the workload's shape instead.
pub struct HandoffFloor<T> {
    slots: Box<[UnsafeCell<MaybeUninit<T>>]>,
    /// The next slot to hand out; only the one allocating thread reads and writes it.
    next: AtomicUsize,
}

// SAFETY: the slots are shared between the allocating thread, which writes a value into
// a slot it hands out, and the freeing one, which drops it; `new`'s contract keeps the
// two from touching one slot at the same time. W4's bounded channel or queue orders the
// accesses both ways: a handle is received after its value was written, and a slot comes
// round again only after the producer has pushed batches that needed the consumer to take
// (after freeing) the batch that held it.
unsafe impl<T: Send> Sync for HandoffFloor<T> {}

impl<T> HandoffFloor<T> {
    /// Slots for W4: the least power of two above what it keeps in flight (a batch of 64
    /// being built, four in the queue and one being freed: 384 objects).
    pub const SLOTS: usize = 512;

    /// # Safety
    /// Only one thread allocates, and each object is freed (happening before) within
    /// [`Self::SLOTS`] allocations after its own, as in W4, which frees its batches in
    /// the order it made them and keeps at most 384 objects in flight.
    pub unsafe fn new() -> Self {
        HandoffFloor {
            slots: (0..Self::SLOTS)
                .map(|_| UnsafeCell::new(MaybeUninit::uninit()))
                .collect(),
            next: AtomicUsize::new(0),
        }
    }
}

contender! {
    impl['a, T] Contender<'a, T> for HandoffFloor<T> {
        type Handle = RawBox<T>;
        fn alloc(&self, v) {
            // Load and store, not an atomic add: the allocating thread is the only one.
            let i = self.next.load(Ordering::Relaxed);
            self.next.store((i + 1) % Self::SLOTS, Ordering::Relaxed);
            let p = self.slots[i].get().cast::<T>();
            // SAFETY: `new`'s contract: the slot's previous value was freed, and nobody
            // else uses the slot until this handle is freed.
            unsafe { p.write(v) };
            RawBox(NonNull::new(p).expect("a slot's address"))
        }
        fn free(&self, h) {
            // SAFETY: the handle owns the live value it points to.
            unsafe { h.0.as_ptr().drop_in_place() }
        }
    }
}

// ---- crossbeam ArrayQueue<Box<T>> pool ----

/// A bounded queue of boxes: `alloc` pops one (or boxes anew), `free` pushes it back (or
/// drops it when the queue is full).
pub struct ArrayQueuePool<T>(pub crossbeam_queue::ArrayQueue<Box<T>>);

contender! {
    impl['a, T] Contender<'a, T> for ArrayQueuePool<T> {
        type Handle = Box<T>;
        fn alloc(&self, v) {
            match self.0.pop() {
                Some(mut b) => {
                    *b = v;
                    b
                }
                None => Box::new(v),
            }
        }
        fn free(&self, h) {
            let _ = self.0.push(h);
        }
    }
}

// ---- the lower bound: a thread-local Vec of pointers per size ----

thread_local! {
    static STACKS: UnsafeCell<[Vec<NonNull<u8>>; 8]> = const { UnsafeCell::new([const { Vec::new() }; 8]) };
}

/// The floor: a thread-local `Vec` of free pointers per size used as a stack; no
/// synchronisation, no accounting, no bound, and no shared level (a remote free would
/// strand the memory on the freeing thread).
pub struct LowerBound;

/// The stack for objects of `size` bytes: by power of two, so two sizes never share one.
/// Evaluated at compile time (`const { .. }` at the call), so a size the floor cannot
/// take fails the build and the fast path keeps no check.
const fn stack_index(size: usize) -> usize {
    assert!(
        size.is_power_of_two() && size >= 32 && size <= 4096,
        "the floor takes power-of-two sizes of 32 B to 4 KiB"
    );
    size.trailing_zeros() as usize - 5
}

contender! {
    impl['a, T] Contender<'a, T> for LowerBound {
        type Handle = RawBox<T>;
        fn alloc(&self, v) {
            let i = const { stack_index(size_of::<T>()) };
            // SAFETY: this thread's stacks, not borrowed elsewhere.
            let p = STACKS.with(|s| unsafe { (*s.get())[i].pop() });
            let p = p.unwrap_or_else(|| {
                // SAFETY: non-zero layout.
                NonNull::new(unsafe { System.alloc(Layout::new::<T>()) })
                    .expect("out of memory")
            });
            let p = p.cast::<T>();
            // SAFETY: memory for one value.
            unsafe { p.as_ptr().write(v) };
            RawBox(p)
        }
        fn free(&self, h) {
            let i = const { stack_index(size_of::<T>()) };
            // SAFETY: this thread's stacks, not borrowed elsewhere.
            STACKS.with(|s| unsafe { (*s.get())[i].push(h.0.cast()) });
        }
    }
}
