//! The benchmark suite's contenders and workloads, shared by the criterion bench
//! (`benches/peers.rs`) and the interleaved ratio runner (`benches/peers_interleaved.rs`).
//!
//! Every contender hands out an owning handle for a value of `Obj<N>` (N bytes) and takes
//! it back; the workloads only see [`Contender`].
#![allow(dead_code)]

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::UnsafeCell;
use std::hint::black_box;
use std::ptr::NonNull;
use std::sync::{mpsc, Barrier};
use std::time::{Duration, Instant};

use proxalloc::{CacheMode, ClassAllocator, ClassBox, Config};

/// An N-byte object.
#[derive(Clone, Copy)]
#[repr(C, align(8))]
pub struct Obj<const N: usize>(pub [u8; N]);

impl<const N: usize> Obj<N> {
    #[inline(always)]
    pub fn new(i: u64) -> Self {
        let mut o = Obj([0; N]);
        o.0[..8].copy_from_slice(&i.to_le_bytes());
        o.0[N - 1] = i as u8;
        o
    }
}

impl<const N: usize> Default for Obj<N> {
    fn default() -> Self {
        Obj([0; N])
    }
}

impl<const N: usize> sharded_slab::Clear for Obj<N> {
    fn clear(&mut self) {}
}

/// An allocator of `T`s under test.
pub trait Contender<T: Send + 'static>: Sync + 'static {
    type Handle: Send;
    fn alloc(&'static self, v: T) -> Self::Handle;
    fn free(&'static self, h: Self::Handle);
    /// Touches the object (so no contender is measured without using its memory).
    fn touch(h: &Self::Handle);
}

/// Leaks a value to get the `'static` reference the handles borrow.
pub fn leak<T>(v: T) -> &'static T {
    Box::leak(Box::new(v))
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

impl<const N: usize> Contender<Obj<N>> for Proxalloc<Obj<N>> {
    type Handle = ClassBox<'static, Obj<N>>;
    #[inline(always)]
    fn alloc(&'static self, v: Obj<N>) -> Self::Handle {
        self.0.alloc(v)
    }
    #[inline(always)]
    fn free(&'static self, h: Self::Handle) {
        drop(h)
    }
    #[inline(always)]
    fn touch(h: &Self::Handle) {
        black_box(&**h);
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

/// A raw object pointer that may cross threads (it owns an `Obj`, which is `Send`).
pub struct OneWord<T>(std::ptr::NonNull<T>);
// SAFETY: the handle owns its object exclusively, like `Box<T>`; `T` is `Send`.
unsafe impl<T: Send> Send for OneWord<T> {}

impl<const N: usize> Contender<Obj<N>> for ProxallocOneWord<Obj<N>> {
    type Handle = OneWord<Obj<N>>;
    #[inline(always)]
    fn alloc(&'static self, v: Obj<N>) -> Self::Handle {
        OneWord(ClassBox::into_raw(self.0.alloc(v)))
    }
    #[inline(always)]
    fn free(&'static self, h: Self::Handle) {
        // SAFETY: `h` came from `into_raw` on this allocator and is freed once.
        drop(unsafe { ClassBox::from_raw(&self.0, h.0) })
    }
    #[inline(always)]
    fn touch(h: &Self::Handle) {
        // SAFETY: the handle owns a live object.
        black_box(unsafe { h.0.as_ref() });
    }
}

// ---- Box under the system allocator ----

pub struct SystemBox;

impl<const N: usize> Contender<Obj<N>> for SystemBox {
    type Handle = Box<Obj<N>>;
    #[inline(always)]
    fn alloc(&'static self, v: Obj<N>) -> Self::Handle {
        Box::new(v)
    }
    #[inline(always)]
    fn free(&'static self, h: Self::Handle) {
        drop(h)
    }
    #[inline(always)]
    fn touch(h: &Self::Handle) {
        black_box(&**h);
    }
}

// ---- mimalloc and jemalloc through their GlobalAlloc impls ----

pub struct RawBox<T>(NonNull<T>);
// SAFETY: owns its `T` like a `Box`.
unsafe impl<T: Send> Send for RawBox<T> {}

pub struct ViaGlobal<A: GlobalAlloc + Sync + 'static>(pub A);

impl<A: GlobalAlloc + Sync + 'static, const N: usize> Contender<Obj<N>> for ViaGlobal<A> {
    type Handle = RawBox<Obj<N>>;
    #[inline(always)]
    fn alloc(&'static self, v: Obj<N>) -> Self::Handle {
        // SAFETY: non-zero layout; the block gets one value and is freed once in `free`.
        unsafe {
            let p = self.0.alloc(Layout::new::<Obj<N>>()).cast::<Obj<N>>();
            let p = NonNull::new(p).expect("out of memory");
            p.as_ptr().write(v);
            RawBox(p)
        }
    }
    #[inline(always)]
    fn free(&'static self, h: Self::Handle) {
        // SAFETY: allocated in `alloc` with this layout.
        unsafe { self.0.dealloc(h.0.as_ptr().cast(), Layout::new::<Obj<N>>()) }
    }
    #[inline(always)]
    fn touch(h: &Self::Handle) {
        // SAFETY: a live value.
        black_box(unsafe { h.0.as_ref() });
    }
}

// ---- object-pool (Mutex<Vec<T>>) ----

pub struct ObjectPool<T: 'static>(pub object_pool::Pool<T>);

impl<const N: usize> Contender<Obj<N>> for ObjectPool<Obj<N>> {
    type Handle = object_pool::Reusable<'static, Obj<N>>;
    #[inline(always)]
    fn alloc(&'static self, v: Obj<N>) -> Self::Handle {
        let mut h = self.0.pull(Obj::default);
        *h = v;
        h
    }
    #[inline(always)]
    fn free(&'static self, h: Self::Handle) {
        drop(h)
    }
    #[inline(always)]
    fn touch(h: &Self::Handle) {
        black_box(&**h);
    }
}

// ---- lockfree-object-pool (LinearObjectPool) ----

pub struct LockfreePool<T: 'static>(pub lockfree_object_pool::LinearObjectPool<T>);

impl<const N: usize> Contender<Obj<N>> for LockfreePool<Obj<N>> {
    type Handle = lockfree_object_pool::LinearReusable<'static, Obj<N>>;
    #[inline(always)]
    fn alloc(&'static self, v: Obj<N>) -> Self::Handle {
        let mut h = self.0.pull();
        *h = v;
        h
    }
    #[inline(always)]
    fn free(&'static self, h: Self::Handle) {
        drop(h)
    }
    #[inline(always)]
    fn touch(h: &Self::Handle) {
        black_box(&**h);
    }
}

// ---- sharded-slab Pool (keys, released with `clear`) ----

pub struct ShardedSlab<T: sharded_slab::Clear + Default + 'static>(pub sharded_slab::Pool<T>);

impl<const N: usize> Contender<Obj<N>> for ShardedSlab<Obj<N>> {
    type Handle = usize;
    #[inline(always)]
    fn alloc(&'static self, v: Obj<N>) -> Self::Handle {
        self.0.create_with(|o| *o = v).expect("slab full")
    }
    #[inline(always)]
    fn free(&'static self, h: Self::Handle) {
        self.0.clear(h);
    }
    #[inline(always)]
    fn touch(h: &Self::Handle) {
        black_box(*h);
    }
}

// ---- crossbeam ArrayQueue<Box<T>> pool ----

pub struct ArrayQueuePool<T: 'static>(pub crossbeam_queue::ArrayQueue<Box<T>>);

impl<const N: usize> Contender<Obj<N>> for ArrayQueuePool<Obj<N>> {
    type Handle = Box<Obj<N>>;
    #[inline(always)]
    fn alloc(&'static self, v: Obj<N>) -> Self::Handle {
        match self.0.pop() {
            Some(mut b) => {
                *b = v;
                b
            }
            None => Box::new(v),
        }
    }
    #[inline(always)]
    fn free(&'static self, h: Self::Handle) {
        let _ = self.0.push(h);
    }
    #[inline(always)]
    fn touch(h: &Self::Handle) {
        black_box(&**h);
    }
}

// ---- the lower bound: a thread-local Vec of pointers per size ----

thread_local! {
    static STACKS: UnsafeCell<[Vec<NonNull<u8>>; 8]> = const { UnsafeCell::new([const { Vec::new() }; 8]) };
}

pub struct LowerBound;

fn stack_index(size: usize) -> usize {
    (size.trailing_zeros() as usize).saturating_sub(5).min(7)
}

impl<const N: usize> Contender<Obj<N>> for LowerBound {
    type Handle = RawBox<Obj<N>>;
    #[inline(always)]
    fn alloc(&'static self, v: Obj<N>) -> Self::Handle {
        // SAFETY: this thread's stacks, not borrowed elsewhere.
        let p = STACKS.with(|s| unsafe { (*s.get())[stack_index(N)].pop() });
        let p = p.unwrap_or_else(|| {
            // SAFETY: non-zero layout.
            NonNull::new(unsafe { System.alloc(Layout::new::<Obj<N>>()) }).expect("out of memory")
        });
        let p = p.cast::<Obj<N>>();
        // SAFETY: memory for one value.
        unsafe { p.as_ptr().write(v) };
        RawBox(p)
    }
    #[inline(always)]
    fn free(&'static self, h: Self::Handle) {
        // SAFETY: this thread's stacks, not borrowed elsewhere.
        STACKS.with(|s| unsafe { (*s.get())[stack_index(N)].push(h.0.cast()) });
    }
    #[inline(always)]
    fn touch(h: &Self::Handle) {
        // SAFETY: a live value.
        black_box(unsafe { h.0.as_ref() });
    }
}

// ---- workloads: each returns nanoseconds per object (or per request for W5) ----

/// W1: `iters` alloc/write/free pairs on this thread.
pub fn w1<T, C>(c: &'static C, iters: u64, make: impl Fn(u64) -> T + Copy + Send + Sync) -> f64
where
    T: Send + 'static,
    C: Contender<T>,
{
    let t = Instant::now();
    for i in 0..iters {
        let h = c.alloc(make(i));
        C::touch(&h);
        c.free(h);
    }
    t.elapsed().as_nanos() as f64 / iters as f64
}

/// W2: `rounds` of 1024 live objects, then free all (ns per object).
pub fn w2<T, C>(c: &'static C, rounds: u64, make: impl Fn(u64) -> T + Copy + Send + Sync) -> f64
where
    T: Send + 'static,
    C: Contender<T>,
{
    let mut live = Vec::with_capacity(1024);
    let t = Instant::now();
    for r in 0..rounds {
        for i in 0..1024 {
            live.push(c.alloc(make(r ^ i)));
        }
        for h in &live {
            C::touch(h);
        }
        for h in live.drain(..) {
            c.free(h);
        }
    }
    t.elapsed().as_nanos() as f64 / (rounds * 1024) as f64
}

/// W3: two threads each doing W2 on the same allocator (aggregate ns per object).
pub fn w3<T, C>(c: &'static C, rounds: u64, make: impl Fn(u64) -> T + Copy + Send + Sync) -> f64
where
    T: Send + 'static,
    C: Contender<T>,
{
    let barrier = Barrier::new(2);
    let t = std::thread::scope(|s| {
        let hs: Vec<_> = (0..2)
            .map(|_| {
                s.spawn(|| {
                    barrier.wait();
                    let start = Instant::now();
                    w2(c, rounds, make);
                    start.elapsed()
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).max().unwrap()
    });
    t.as_nanos() as f64 / (2 * rounds * 1024) as f64
}

/// W4: thread A allocates and sends batches of 64 over a bounded channel; thread B frees
/// them (ns per object).
pub fn w4<T, C>(c: &'static C, batches: u64, make: impl Fn(u64) -> T + Copy + Send + Sync) -> f64
where
    T: Send + 'static,
    C: Contender<T>,
{
    let (tx, rx) = mpsc::sync_channel::<Vec<C::Handle>>(4);
    let t = Instant::now();
    std::thread::scope(|s| {
        s.spawn(move || {
            for b in 0..batches {
                tx.send((0..64).map(|i| c.alloc(make(b ^ i))).collect())
                    .unwrap();
            }
        });
        s.spawn(move || {
            for batch in rx {
                for h in batch {
                    C::touch(&h);
                    c.free(h);
                }
            }
        });
    });
    t.elapsed().as_nanos() as f64 / (batches * 64) as f64
}

/// The allocators of one W5 contender: one per object size of the request mix.
pub struct Mix<C2: 'static, C5: 'static, C1: 'static, C128: 'static> {
    pub k2: &'static C2,
    pub b512: &'static C5,
    pub k1: &'static C1,
    pub b128: &'static C128,
}

/// W5: `requests` requests, each allocating 4×2 KiB, 3×512 B, 2×128 B and 1×1 KiB
/// objects, touching and freeing them all (ns per request).
pub fn w5<C2, C5, C1, C128>(m: &Mix<C2, C5, C1, C128>, requests: u64) -> f64
where
    C2: Contender<Obj<2048>>,
    C5: Contender<Obj<512>>,
    C1: Contender<Obj<1024>>,
    C128: Contender<Obj<128>>,
{
    let t = Instant::now();
    for r in 0..requests {
        let a: [C2::Handle; 4] = std::array::from_fn(|i| m.k2.alloc(Obj::new(r ^ i as u64)));
        let b: [C5::Handle; 3] = std::array::from_fn(|i| m.b512.alloc(Obj::new(r ^ i as u64)));
        let c: [C128::Handle; 2] = std::array::from_fn(|i| m.b128.alloc(Obj::new(r ^ i as u64)));
        let d = m.k1.alloc(Obj::new(r));
        a.iter().for_each(C2::touch);
        b.iter().for_each(C5::touch);
        c.iter().for_each(C128::touch);
        C1::touch(&d);
        a.into_iter().for_each(|h| m.k2.free(h));
        b.into_iter().for_each(|h| m.b512.free(h));
        c.into_iter().for_each(|h| m.b128.free(h));
        m.k1.free(d);
    }
    t.elapsed().as_nanos() as f64 / requests as f64
}

/// W5 on two threads at once (aggregate ns per request).
pub fn w5_two<C2, C5, C1, C128>(m: &Mix<C2, C5, C1, C128>, requests: u64) -> f64
where
    C2: Contender<Obj<2048>>,
    C5: Contender<Obj<512>>,
    C1: Contender<Obj<1024>>,
    C128: Contender<Obj<128>>,
{
    let barrier = Barrier::new(2);
    let t = std::thread::scope(|s| {
        let hs: Vec<_> = (0..2)
            .map(|_| {
                s.spawn(|| {
                    barrier.wait();
                    let start = Instant::now();
                    w5(m, requests);
                    start.elapsed()
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).max().unwrap()
    });
    t.as_nanos() as f64 / (2 * requests) as f64
}

/// Nanoseconds to a `Duration` (for criterion's `iter_custom`).
pub fn total(ns_per: f64, n: u64) -> Duration {
    Duration::from_nanos((ns_per * n as f64) as u64)
}
pub mod contenders;
