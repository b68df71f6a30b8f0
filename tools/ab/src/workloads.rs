//! The workloads: W1, W2, W3 and the request shape, each a function of one contender
//! (or one contender per size) that times itself.
//!
//! Each is `#[inline(never)]` and generic, so every contender gets its own copy of the
//! loop, and a sample is one call.

use std::hint::black_box;
use std::mem::MaybeUninit;
use std::sync::{mpsc, Arc, Barrier, Mutex, OnceLock};
use std::time::{Duration, Instant};

/// An object of `W` words as a request's buffers and header heaps are used: written at
/// its first and last word when it is made, the rest never touched (an allocator that
/// zeroed or copied it whole would show).
#[derive(Clone, Copy)]
#[repr(C)]
pub struct Obj<const W: usize>([MaybeUninit<u64>; W]);

impl<const W: usize> Obj<W> {
    /// `i` in the first word and `i * 3` in the last.
    #[inline(always)]
    pub fn new(i: u64) -> Self {
        let mut o = Obj([MaybeUninit::uninit(); W]);
        o.0[0].write(i);
        o.0[W - 1].write(i.wrapping_mul(3));
        o
    }

    /// Both written words, read back from memory: through an address the optimiser
    /// cannot see into ([`opaque`]), so it can neither forward the stores that built the
    /// object to these loads nor drop those stores, whoever allocated the object.
    #[inline(always)]
    pub fn ends(&self) -> u64 {
        let p = opaque(std::ptr::from_ref(self)).cast::<u64>();
        // SAFETY: `new` wrote both ends (objects are made only by `new`), and `p` is
        // `self`'s address.
        unsafe { p.read().wrapping_add(p.add(W - 1).read()) }
    }
}

/// `p` unchanged, through an assembly block with no instruction that reads no memory:
/// a value the optimiser cannot see into, at no cost (`sync::relaxed::opaque` in the
/// crate does the same for the fast path).
#[inline(always)]
pub fn opaque<T>(p: *const T) -> *const T {
    let mut p = p;
    // SAFETY: no instruction; the pointer comes back as it went in.
    unsafe {
        std::arch::asm!(
            "/* {p} */",
            p = inout(reg) p,
            options(nostack, preserves_flags, nomem, pure),
        )
    };
    p
}

/// The sizes of the workloads: 64 B (W1–W3) and the request shape's four.
pub type O64 = Obj<8>;
pub type O128 = Obj<16>;
pub type O512 = Obj<64>;
pub type O1k = Obj<128>;
pub type O2k = Obj<256>;

/// A way to get and give back objects of one type: an allocator with its handle.
pub trait Contender<T>: Sync + 'static {
    /// What the user holds while the object is live.
    type Handle: Send;
    fn alloc(&'static self, value: T) -> Self::Handle;
    fn free(&'static self, handle: Self::Handle);
    fn get(handle: &Self::Handle) -> &T;
}

fn per(t: Duration, n: u64) -> f64 {
    t.as_nanos() as f64 / n as f64
}

/// W1: `pairs` times, an object made, read and freed (ns per pair).
#[inline(never)]
pub fn w1<C: Contender<O64>>(c: &'static C, pairs: u64) -> f64 {
    let mut sum = 0;
    let t = Instant::now();
    for i in 0..pairs {
        let h = c.alloc(O64::new(i));
        sum ^= C::get(&h).ends();
        c.free(h);
    }
    let t = t.elapsed();
    black_box(sum);
    per(t, pairs)
}

/// Live objects in a batch of W2 and W3.
pub const BATCH: u64 = 1024;

/// W2: `batches` times, [`BATCH`] objects made and held, then read and freed (ns per
/// object).
#[inline(never)]
pub fn w2<C: Contender<O64>>(c: &'static C, batches: u64) -> f64 {
    let mut live = Vec::with_capacity(BATCH as usize);
    let mut sum = 0;
    let t = Instant::now();
    for b in 0..batches {
        for i in 0..BATCH {
            live.push(c.alloc(O64::new(b ^ i)));
        }
        for h in live.drain(..) {
            sum ^= C::get(&h).ends();
            c.free(h);
        }
    }
    let t = t.elapsed();
    black_box(sum);
    per(t, batches * BATCH)
}

/// W3: W2 on two threads at once, one allocator (aggregate ns per object).
pub fn w3<C: Contender<O64>>(c: &'static C, batches: u64) -> f64 {
    per(on_two_threads(move || w2(c, batches)), 2 * batches * BATCH)
}

/// The request shape's allocators, one per size.
pub struct Mix<C2k: 'static, C512: 'static, C128: 'static, C1k: 'static> {
    pub k2: &'static C2k,
    pub b512: &'static C512,
    pub b128: &'static C128,
    pub k1: &'static C1k,
}

/// The request shape: `requests` times, 4 × 2 KiB, 3 × 512 B, 2 × 128 B and 1 × 1 KiB
/// objects made (their handles held in arrays), read at both ends and freed (ns per
/// request).
#[inline(never)]
pub fn request<C2k, C512, C128, C1k>(m: &Mix<C2k, C512, C128, C1k>, requests: u64) -> f64
where
    C2k: Contender<O2k>,
    C512: Contender<O512>,
    C128: Contender<O128>,
    C1k: Contender<O1k>,
{
    let mut sum = 0;
    let t = Instant::now();
    for r in 0..requests {
        let a: [C2k::Handle; 4] = std::array::from_fn(|i| m.k2.alloc(O2k::new(r ^ i as u64)));
        let b: [C512::Handle; 3] = std::array::from_fn(|i| m.b512.alloc(O512::new(r ^ i as u64)));
        let c: [C128::Handle; 2] = std::array::from_fn(|i| m.b128.alloc(O128::new(r ^ i as u64)));
        let d = m.k1.alloc(O1k::new(r));
        sum ^= a.iter().map(|h| C2k::get(h).ends()).fold(0, |x, y| x ^ y);
        sum ^= b.iter().map(|h| C512::get(h).ends()).fold(0, |x, y| x ^ y);
        sum ^= c.iter().map(|h| C128::get(h).ends()).fold(0, |x, y| x ^ y);
        sum ^= C1k::get(&d).ends();
        a.into_iter().for_each(|h| m.k2.free(h));
        b.into_iter().for_each(|h| m.b512.free(h));
        c.into_iter().for_each(|h| m.b128.free(h));
        m.k1.free(d);
    }
    let t = t.elapsed();
    black_box(sum);
    per(t, requests)
}

/// The request shape on two threads at once (aggregate ns per request).
pub fn request_two<C2k, C512, C128, C1k>(
    m: &'static Mix<C2k, C512, C128, C1k>,
    requests: u64,
) -> f64
where
    C2k: Contender<O2k>,
    C512: Contender<O512>,
    C128: Contender<O128>,
    C1k: Contender<O1k>,
{
    per(on_two_threads(move || request(m, requests)), 2 * requests)
}

/// A job for a worker thread.
type Job = Arc<dyn Fn() -> f64 + Send + Sync>;

/// The two long-lived worker threads: a server's threads are, so a sample measures
/// them in their steady state, not their first use.
struct Workers {
    jobs: [mpsc::Sender<Job>; 2],
    done: mpsc::Receiver<Duration>,
}

/// Runs `work` on both workers, started together at a barrier; the longer time.
fn on_two_threads(work: impl Fn() -> f64 + Send + Sync + 'static) -> Duration {
    static WORKERS: OnceLock<Mutex<Workers>> = OnceLock::new();
    let w = WORKERS.get_or_init(|| {
        let (done_tx, done) = mpsc::channel();
        let start = Arc::new(Barrier::new(2));
        let jobs = std::array::from_fn(|_| {
            let (tx, rx) = mpsc::channel::<Job>();
            let (done_tx, start) = (done_tx.clone(), start.clone());
            std::thread::spawn(move || {
                for job in rx {
                    start.wait();
                    let t = Instant::now();
                    job();
                    // A worker that panicked would leave the sample waiting here:
                    // release builds abort on panic (Cargo.toml) instead.
                    if done_tx.send(t.elapsed()).is_err() {
                        return;
                    }
                }
            });
            tx
        });
        Mutex::new(Workers { jobs, done })
    });
    let w = w.lock().unwrap();
    let job: Job = Arc::new(work);
    for tx in &w.jobs {
        tx.send(job.clone()).expect("a worker is gone");
    }
    let a = w.done.recv().expect("a worker is gone");
    let b = w.done.recv().expect("a worker is gone");
    a.max(b)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::contenders::Floor;

    #[test]
    fn objects_keep_both_ends() {
        let o = O2k::new(5);
        assert_eq!(o.ends(), 5 + 15);
        assert_ne!(O2k::new(6).ends(), o.ends(), "the ends depend on the index");
        assert_eq!(std::mem::size_of::<O2k>(), 2048);
        assert_eq!(std::mem::size_of::<O128>(), 128);
    }

    #[test]
    fn workloads_run_on_the_floor() {
        static F: Floor = Floor;
        static M: Mix<Floor, Floor, Floor, Floor> = Mix {
            k2: &F,
            b512: &F,
            b128: &F,
            k1: &F,
        };
        assert!(w1(&F, 100) > 0.0);
        assert!(w2(&F, 2) > 0.0);
        assert!(w3(&F, 2) > 0.0);
        assert!(request(&M, 10) > 0.0);
        assert!(request_two(&M, 10) > 0.0);
    }
}
