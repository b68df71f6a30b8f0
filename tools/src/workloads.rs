//! The workloads, each written once: W1–W5 and the spike over any object `Contender`,
//! W6, W7 and the create-use-drop loop over any byte `Arena`.
//!
//! W1–W5 time themselves and return nanoseconds per object (per request for W5): the
//! two-thread ones must start the clock after their threads meet at a barrier. W6, W7 and
//! the spike do not (W6 runs bare under callgrind, W7 and the spike measure memory): their
//! callers time or measure them.

use std::alloc::Layout;
use std::hint::black_box;
use std::marker::PhantomData;
use std::mem::MaybeUninit;
use std::sync::{mpsc, Barrier, Mutex, MutexGuard, OnceLock};
use std::time::{Duration, Instant};

use super::arenas::Arena;
use super::contenders::Contender;

/// The N-byte object of W1–W5: zeroes, the index in the first 8 bytes and in the last
/// byte, built by every contender with the same constructor and passed by value.
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

/// The 64-byte object of the fast-path benches (`class_alloc`, `interleaved`): eight
/// words, each the index, built with one broadcast (`Obj<64>` is zeroes and two stores).
/// Those benches' figures in `docs/benchmarks.md` are for this object, and how a value is
/// built decides whether the compiler builds it in place or copies it (`docs/design.md`,
/// "No atomics on the fast path"), so they keep it.
#[derive(Clone, Copy, Default)]
#[repr(C)]
pub struct Words(pub [u64; 8]);

impl Words {
    #[inline(always)]
    pub fn new(i: u64) -> Self {
        Words([i; 8])
    }
}

impl sharded_slab::Clear for Words {
    fn clear(&mut self) {}
}

/// An object of the workloads: built from its index, with what every contender needs
/// (object-pool and sharded-slab keep default values).
pub trait Object: Copy + Default + Send + Sync + sharded_slab::Clear + 'static {
    fn new(i: u64) -> Self;
}

impl<const N: usize> Object for Obj<N> {
    #[inline(always)]
    fn new(i: u64) -> Self {
        Obj::new(i)
    }
}

/// The N-byte object of W5 as the design's targets define it ("touched at first and last
/// word"): the index in the first and the last 8 bytes, the rest never written. A request's
/// I/O buffers and header heaps are not zeroed when they are handed out; [`Obj`], which
/// is, costs W5 10.75 KiB of stores per request whoever allocates, which hides the
/// allocators' differences (`docs/benchmarks.md`, W5 rows). `N` is at least 16.
#[derive(Clone, Copy)]
#[repr(C, align(8))]
pub struct Sparse<const N: usize>(pub [MaybeUninit<u8>; N]);

impl<const N: usize> Object for Sparse<N> {
    #[inline(always)]
    fn new(i: u64) -> Self {
        let mut o = Sparse([MaybeUninit::uninit(); N]);
        for (k, b) in i.to_le_bytes().into_iter().enumerate() {
            o.0[k].write(b);
            o.0[N - 8 + k].write(b);
        }
        o
    }
}

impl<const N: usize> Default for Sparse<N> {
    fn default() -> Self {
        Sparse::new(0)
    }
}

impl<const N: usize> sharded_slab::Clear for Sparse<N> {
    fn clear(&mut self) {}
}

/// A family of objects of every size, for W5's request mix: [`Obj`] (zeroed) or
/// [`Sparse`] (first and last word).
pub trait Objects: 'static {
    /// The object of `N` bytes.
    type Of<const N: usize>: Object;
}

/// W5 with [`Obj`]: every object zeroed, then its index written.
pub struct Zeroed;
impl Objects for Zeroed {
    type Of<const N: usize> = Obj<N>;
}

/// W5 with [`Sparse`]: the first and last word written.
pub struct Ends;
impl Objects for Ends {
    type Of<const N: usize> = Sparse<N>;
}

impl Object for Words {
    #[inline(always)]
    fn new(i: u64) -> Self {
        Words::new(i)
    }
}

/// Live objects per round of W2 (and W3).
pub const BATCH: u64 = 1024;

/// W1: `iters` alloc/write/free pairs on this thread (ns per pair).
///
/// `inline(always)` (W2 too), so that the loop lands inside the caller (for
/// `proxalloc-local`, inside the `with_local` closure) as it did when each bench wrote its
/// own loop. (This is how `LocalCache::alloc_with` was found to stay a call in a
/// generic caller; it is always inlined now.)
#[inline(always)]
pub fn w1<'a, T, C>(c: &'a C, iters: u64, make: impl Fn(u64) -> T + Copy + Send + Sync) -> f64
where
    C: Contender<'a, T>,
{
    let t = Instant::now();
    for i in 0..iters {
        let h = c.alloc(make(i));
        C::touch(&h);
        c.free(h);
    }
    t.elapsed().as_nanos() as f64 / iters as f64
}

/// W2: `rounds` of [`BATCH`] live objects, touched, then all freed (ns per object).
#[inline(always)]
pub fn w2<'a, T, C>(c: &'a C, rounds: u64, make: impl Fn(u64) -> T + Copy + Send + Sync) -> f64
where
    C: Contender<'a, T>,
{
    let mut live = Vec::with_capacity(BATCH as usize);
    let t = Instant::now();
    for r in 0..rounds {
        for i in 0..BATCH {
            live.push(c.alloc(make(r ^ i)));
        }
        for h in &live {
            C::touch(h);
        }
        for h in live.drain(..) {
            c.free(h);
        }
    }
    t.elapsed().as_nanos() as f64 / (rounds * BATCH) as f64
}

/// Runs `work` on the two long-lived worker threads, started together (at a barrier),
/// and returns the longer of their two times.
///
/// The workers live as long as the process, as a server's do, so a sample measures two
/// threads in their steady state: what each thread set up on its first use (its cache
/// of every allocator, or the floor's stacks, which a new thread fills from `malloc`
/// object by object) is not measured again in every sample. [`on_two_new_threads`]
/// measures that too.
pub fn on_two_threads(work: impl Fn() + Sync) -> Duration {
    on_two_workers(&|_| work())
}

/// As [`on_two_threads`], on two threads started for this sample (their start and
/// join left out): each sample includes each thread's first use of the contender.
pub fn on_two_new_threads(work: impl Fn() + Sync) -> Duration {
    let barrier = Barrier::new(2);
    std::thread::scope(|s| {
        let hs: Vec<_> = (0..2)
            .map(|_| {
                s.spawn(|| {
                    barrier.wait();
                    let start = Instant::now();
                    work();
                    start.elapsed()
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).max().unwrap()
    })
}

/// A job for a worker: runs, returns its time.
type Job = Box<dyn FnOnce() -> Duration + Send>;

/// The two long-lived workers: a queue of jobs each, one queue of their results.
struct Workers {
    jobs: [mpsc::Sender<Job>; 2],
    done: mpsc::Receiver<std::thread::Result<Duration>>,
}

/// The workers, started on first use; one sample at a time holds them.
fn workers() -> MutexGuard<'static, Workers> {
    static WORKERS: OnceLock<Mutex<Workers>> = OnceLock::new();
    let w = WORKERS.get_or_init(|| {
        let (done_tx, done) = mpsc::channel();
        let jobs = std::array::from_fn(|_| {
            let (tx, rx) = mpsc::channel::<Job>();
            let done_tx = done_tx.clone();
            std::thread::spawn(move || {
                for job in rx {
                    // A panic is reported, not fatal, so the worker (and the sample that
                    // waits for it) carries on.
                    let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(job));
                    if done_tx.send(r).is_err() {
                        return;
                    }
                }
            });
            tx
        });
        Mutex::new(Workers { jobs, done })
    });
    // A panic in a sample poisons the lock after both workers are done: still usable.
    w.lock().unwrap_or_else(|e| e.into_inner())
}

/// Runs `work(0)` and `work(1)` on the two workers, started together at a barrier;
/// returns the longer of their two times. A panic in either is resumed here, once both
/// have ended.
fn on_two_workers(work: &(dyn Fn(usize) + Sync)) -> Duration {
    let w = workers();
    let barrier = Barrier::new(2);
    let barrier = &barrier;
    for (i, tx) in w.jobs.iter().enumerate() {
        let job: Box<dyn FnOnce() -> Duration + Send + '_> = Box::new(move || {
            barrier.wait();
            let start = Instant::now();
            work(i);
            start.elapsed()
        });
        // SAFETY: only the lifetime changes. The job borrows `work` and `barrier`, and
        // this function neither returns nor unwinds before both workers have reported
        // that their jobs ended: a failure to hand a job over or to hear back aborts.
        let job: Job = unsafe { std::mem::transmute(job) };
        if tx.send(job).is_err() {
            std::process::abort();
        }
    }
    let mut longest = Duration::ZERO;
    let mut panic = None;
    for _ in 0..2 {
        match w.done.recv() {
            Ok(Ok(t)) => longest = longest.max(t),
            Ok(Err(p)) => panic = Some(p),
            Err(_) => std::process::abort(),
        }
    }
    if let Some(p) = panic {
        std::panic::resume_unwind(p);
    }
    longest
}

/// W3: two threads each doing W2 on the same allocator (aggregate ns per object), on
/// the long-lived workers.
pub fn w3<T, C>(c: &'static C, rounds: u64, make: impl Fn(u64) -> T + Copy + Send + Sync) -> f64
where
    C: Contender<'static, T> + Sync,
{
    let t = on_two_threads(|| {
        w2(c, rounds, make);
    });
    t.as_nanos() as f64 / (2 * rounds * BATCH) as f64
}

/// W3 on two threads started for the sample: each sample includes both threads' first
/// use of the contender (for a cache, registering and filling it).
pub fn w3_new_threads<T, C>(
    c: &'static C,
    rounds: u64,
    make: impl Fn(u64) -> T + Copy + Send + Sync,
) -> f64
where
    C: Contender<'static, T> + Sync,
{
    let t = on_two_new_threads(|| {
        w2(c, rounds, make);
    });
    t.as_nanos() as f64 / (2 * rounds * BATCH) as f64
}

/// W4: one worker allocates and sends batches of 64 over a bounded channel (capacity
/// 4); the other frees them (ns per object).
pub fn w4<T, C>(c: &'static C, batches: u64, make: impl Fn(u64) -> T + Copy + Send + Sync) -> f64
where
    C: Contender<'static, T> + Sync,
    C::Handle: Send,
{
    let (tx, rx) = mpsc::sync_channel::<Vec<C::Handle>>(4);
    // Each end goes to its worker, which drops it when done (the consumer's loop ends
    // when the producer's end is dropped).
    let (tx, rx) = (Mutex::new(Some(tx)), Mutex::new(Some(rx)));
    let t = on_two_workers(&|i| {
        if i == 0 {
            let tx = tx.lock().unwrap().take().expect("one producer");
            for b in 0..batches {
                tx.send((0..64).map(|i| c.alloc(make(b ^ i))).collect())
                    .unwrap();
            }
        } else {
            let rx = rx.lock().unwrap().take().expect("one consumer");
            for batch in rx {
                for h in batch {
                    C::touch(&h);
                    c.free(h);
                }
            }
        }
    });
    t.as_nanos() as f64 / (batches * 64) as f64
}

/// W4 without the channel's sleeps: the same batches of 64 between the same two
/// workers, handed over through a queue of 4 that both ends poll (spinning, then
/// yielding), so that no thread blocks in the kernel. What is left is the allocator's
/// cross-thread cost (the objects' memory moving between cores, and for a cache its
/// exchanges with a shared level) with the queue's own, the same for every contender
/// (ns per object).
pub fn w4_polled<T, C>(
    c: &'static C,
    batches: u64,
    make: impl Fn(u64) -> T + Copy + Send + Sync,
) -> f64
where
    C: Contender<'static, T> + Sync,
    C::Handle: Send,
{
    /// Spins a little, then yields, until `f` succeeds.
    fn poll<R>(mut f: impl FnMut() -> Option<R>) -> R {
        let mut spins = 0u32;
        loop {
            if let Some(r) = f() {
                return r;
            }
            spins += 1;
            if spins < 64 {
                std::hint::spin_loop();
            } else {
                std::thread::yield_now();
            }
        }
    }
    let q = crossbeam_queue::ArrayQueue::<Vec<C::Handle>>::new(4);
    let t = on_two_workers(&|i| {
        if i == 0 {
            for b in 0..batches {
                let mut batch: Vec<C::Handle> = (0..64).map(|i| c.alloc(make(b ^ i))).collect();
                poll(|| match q.push(std::mem::take(&mut batch)) {
                    Ok(()) => Some(()),
                    Err(back) => {
                        batch = back;
                        None
                    }
                });
            }
        } else {
            for _ in 0..batches {
                for h in poll(|| q.pop()) {
                    C::touch(&h);
                    c.free(h);
                }
            }
        }
    });
    t.as_nanos() as f64 / (batches * 64) as f64
}

/// The allocators of one W5 contender: one per object size of the request mix, for the
/// objects of family `F`.
pub struct Mix<F, C2: 'static, C5: 'static, C1: 'static, C128: 'static> {
    pub k2: &'static C2,
    pub b512: &'static C5,
    pub k1: &'static C1,
    pub b128: &'static C128,
    pub objects: PhantomData<fn() -> F>,
}

/// W5: `requests` requests, each allocating 4×2 KiB, 3×512 B, 2×128 B and 1×1 KiB
/// objects, touching and freeing them all (ns per request).
pub fn w5<F, C2, C5, C1, C128>(m: &Mix<F, C2, C5, C1, C128>, requests: u64) -> f64
where
    F: Objects,
    C2: Contender<'static, F::Of<2048>>,
    C5: Contender<'static, F::Of<512>>,
    C1: Contender<'static, F::Of<1024>>,
    C128: Contender<'static, F::Of<128>>,
{
    let t = Instant::now();
    for r in 0..requests {
        let a: [C2::Handle; 4] =
            std::array::from_fn(|i| m.k2.alloc(<F::Of<2048>>::new(r ^ i as u64)));
        let b: [C5::Handle; 3] =
            std::array::from_fn(|i| m.b512.alloc(<F::Of<512>>::new(r ^ i as u64)));
        let c: [C128::Handle; 2] =
            std::array::from_fn(|i| m.b128.alloc(<F::Of<128>>::new(r ^ i as u64)));
        let d = m.k1.alloc(<F::Of<1024>>::new(r));
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
pub fn w5_two<F, C2, C5, C1, C128>(m: &Mix<F, C2, C5, C1, C128>, requests: u64) -> f64
where
    F: Objects,
    C2: Contender<'static, F::Of<2048>> + Sync,
    C5: Contender<'static, F::Of<512>> + Sync,
    C1: Contender<'static, F::Of<1024>> + Sync,
    C128: Contender<'static, F::Of<128>> + Sync,
{
    let t = on_two_threads(|| {
        w5(m, requests);
    });
    t.as_nanos() as f64 / (2 * requests) as f64
}

/// The spike: `live` objects allocated and held, `measure` called, all freed, `measure`
/// called again. Returns the two measurements (at the spike, after the free).
pub fn spike<'a, T, C, M>(
    c: &'a C,
    live: u64,
    make: impl Fn(u64) -> T,
    measure: impl Fn() -> M,
) -> (M, M)
where
    C: Contender<'a, T>,
{
    let held: Vec<C::Handle> = (0..live).map(|i| c.alloc(make(i))).collect();
    black_box(&held);
    let at_spike = measure();
    for h in held {
        c.free(h);
    }
    (at_spike, measure())
}

/// The next value of a xorshift64 sequence (the workloads' fixed pseudo-random sizes).
fn xorshift(x: &mut u64) -> u64 {
    *x ^= *x << 13;
    *x ^= *x >> 7;
    *x ^= *x << 17;
    *x
}

/// Allocations per W6 round.
pub const W6_ALLOCS: usize = 200;
/// W6 rounds per call of [`w6`] (one timed sample).
pub const W6_ROUNDS: usize = 50;

/// The W6 sizes: [`W6_ALLOCS`] sizes of 8..=256 bytes, a fixed pseudo-random sequence.
/// A type of its own, so that the workloads know every size is non-zero.
pub struct W6Sizes(Vec<usize>);

impl W6Sizes {
    pub fn new() -> Self {
        let mut x = 0x2545_F491_4F6C_DD1Du64;
        W6Sizes(
            (0..W6_ALLOCS)
                .map(|_| 8 + (xorshift(&mut x) % 249) as usize)
                .collect(),
        )
    }
}

impl Default for W6Sizes {
    fn default() -> Self {
        Self::new()
    }
}

/// W6: [`W6_ROUNDS`] rounds of one allocation per size in `sizes` (one byte written to
/// each), then clear.
pub fn w6<A: Arena>(a: &mut A, sizes: &W6Sizes) {
    for _ in 0..W6_ROUNDS {
        for &s in &sizes.0 {
            // SAFETY: `s` is at least 8 (`W6Sizes`).
            let p = unsafe { a.alloc(Layout::from_size_align(s, 8).unwrap()) };
            // SAFETY: `s` bytes of fresh arena memory.
            unsafe { p.write(s as u8) };
            black_box(p);
        }
        a.clear();
    }
}

/// Create, use, drop: `iters` times a fresh arena from `new`, one allocation per size in
/// `sizes`, then the arena dropped.
pub fn create_use_drop<A: Arena>(new: fn() -> A, sizes: &W6Sizes, iters: usize) {
    for _ in 0..iters {
        let mut a = new();
        for &s in &sizes.0 {
            // SAFETY: `s` is at least 8 (`W6Sizes`).
            black_box(unsafe { a.alloc(Layout::from_size_align(s, 8).unwrap()) });
        }
    }
}

/// W7 iterations (the Subversion pattern).
pub const W7_ITERATIONS: u64 = 200_000;

/// The W7 buffer sizes of iteration `i`: 1–8 buffers of 1–64 KiB, plus 1 MiB every
/// 1000th iteration (`rng` is the sequence's state, carried across iterations).
fn w7_buffers(i: u64, rng: &mut u64) -> Vec<usize> {
    let n = 1 + xorshift(rng) % 8;
    let mut v: Vec<usize> = (0..n)
        .map(|_| 1024 + (xorshift(rng) % (63 * 1024)) as usize)
        .collect();
    if i % 1000 == 999 {
        v.push(1 << 20);
    }
    v
}

/// Writes one byte per page, so the memory is really resident.
///
/// # Safety
/// `p` is valid for writes of `len` bytes.
unsafe fn touch_pages(p: *mut u8, len: usize) {
    for off in (0..len).step_by(4096) {
        // SAFETY: `off < len`, and `p` is valid for `len` bytes per the contract.
        unsafe { p.add(off).write(1) };
    }
    black_box(p);
}

/// W7: [`W7_ITERATIONS`] iterations, each allocating its buffers (one byte written per
/// page) into the arena and clearing it.
pub fn w7<A: Arena>(a: &mut A) {
    let mut rng = 0x9E37_79B9_7F4A_7C15u64;
    for i in 0..W7_ITERATIONS {
        for len in w7_buffers(i, &mut rng) {
            // SAFETY: `len` is at least 1 KiB, so not zero; the arena hands out `len`
            // writable bytes, valid until its next clear.
            unsafe { touch_pages(a.alloc(Layout::from_size_align(len, 8).unwrap()), len) };
        }
        a.clear();
    }
}
