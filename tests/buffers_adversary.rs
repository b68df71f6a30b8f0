//! Pooled buffers attacked (feature `bytes`): buffers and frozen `Bytes` that outlive
//! their thread's caches (thread-local destructors), allocators that die on another
//! thread and successors at the same address, an allocator moved after use, growth
//! through every class with the leak record following, panics in the middle of a write,
//! requests at the overflow edges, every cache mode handing buffers over. From an
//! adversarial review (2026-12-07). Natively in CI; under Miri (`cargo +nightly miri test
//! --test buffers_adversary`, strict provenance: ten pass, two are ignored) it takes
//! about two minutes, so it is not in `.ci/miri`'s list.

use std::cell::RefCell;
use std::io::Write;
use std::sync::Arc;

use bytes::{Buf, BufMut, Bytes};
use proxalloc::{BufferAllocator, BufferError, LeakLevel, BUFFER_CLASSES};

#[path = "common/buffer_books.rs"]
mod buffer_books;
use buffer_books::assert_all_back as all_back;

/// Bytes kept in a thread-local that was initialised before proxalloc's own thread
/// state: at thread exit it is dropped after that state is torn down.
#[test]
fn bytes_dropped_in_a_tls_destructor_after_the_cache_teardown() {
    static BUFS: BufferAllocator = BufferAllocator::new();
    thread_local! { static KEEP: RefCell<Vec<Bytes>> = const { RefCell::new(Vec::new()) }; }
    std::thread::spawn(|| {
        KEEP.with(|_| ()); // registered first: destroyed last
        for i in 0..40usize {
            let mut b = BUFS.alloc(1 + i * 300);
            b.put_bytes(i as u8, 10);
            let f = b.freeze();
            KEEP.with(|k| k.borrow_mut().push(f));
        }
        // a few dropped while the cache lives, to warm it
        for _ in 0..3 {
            drop(BUFS.alloc(700));
        }
    })
    .join()
    .unwrap();
    let s = BUFS.stats();
    all_back(&s);
    // and the slots are usable again
    let v: Vec<_> = (0..50).map(|i| BUFS.alloc(1 + i * 200)).collect();
    drop(v);
    all_back(&BUFS.stats());
}

/// The last count of a run-time allocator dropped inside a TLS destructor after the
/// thread's cache teardown.
#[test]
fn last_arc_dropped_in_a_tls_destructor() {
    thread_local! { static KEEP: RefCell<Vec<Bytes>> = const { RefCell::new(Vec::new()) }; }
    let bufs = Arc::new(BufferAllocator::new());
    let weak = Arc::downgrade(&bufs);
    std::thread::spawn(move || {
        KEEP.with(|_| ());
        for i in 0..20usize {
            let mut b = bufs.alloc_arc(1 + i * 500);
            b.put_bytes(1, 5);
            KEEP.with(|k| k.borrow_mut().push(b.freeze()));
        }
        drop(bufs.alloc_arc(100));
        drop(bufs);
    })
    .join()
    .unwrap();
    assert!(weak.upgrade().is_none());
}

/// A run-time allocator whose last buffer is dropped on another thread (the allocator
/// dies there), then a new allocator on that thread (perhaps at the same address).
#[test]
fn allocator_dies_on_another_thread_then_a_new_one_is_used_there() {
    let (tx, rx) = std::sync::mpsc::channel::<Bytes>();
    let (tx2, rx2) = std::sync::mpsc::channel::<()>();
    let t = std::thread::spawn(move || {
        for round in 0..4 {
            // warm this thread's caches of this allocator
            let b = rx.recv().unwrap();
            assert!(b.iter().all(|&x| x == round as u8));
            drop(b); // last count: the allocator is dropped here
            let fresh = Arc::new(BufferAllocator::new());
            let mut keep = Vec::new();
            for i in 0..10usize {
                let mut x = fresh.alloc_arc(1 + i * 700);
                x.put_bytes(9, 3);
                keep.push(x);
            }
            drop(keep);
            all_back(&fresh.stats());
            tx2.send(()).unwrap();
        }
    });
    for round in 0..4u8 {
        let bufs = Arc::new(BufferAllocator::new());
        let mut b = bufs.alloc_arc(3000);
        b.put_bytes(round, 3000);
        let f = b.freeze();
        drop(bufs);
        tx.send(f).unwrap();
        rx2.recv().unwrap();
    }
    t.join().unwrap();
}

/// Growth through every class into oversize and further, tracked, with the tracker's
/// record following; then frozen and dropped on another thread.
#[test]
fn growth_through_all_classes_into_oversize_tracked() {
    static BUFS: BufferAllocator = BufferAllocator::new();
    BUFS.set_leak_level(LeakLevel::All);
    let mut b = BUFS.alloc(1);
    let mut n = 0usize;
    let limit = if cfg!(miri) { 140 << 10 } else { 1 << 20 };
    while n < limit {
        let chunk = [(n % 251) as u8; 333];
        b.put_slice(&chunk);
        n += chunk.len();
        assert!(b.capacity() >= b.len());
        if cfg!(debug_assertions) && !cfg!(miri) {
            let live = BUFS.oldest_live(10);
            assert_eq!(live.len(), 1);
            assert_eq!(live[0].capacity, b.capacity());
            assert_eq!(live[0].address, b.as_ptr() as usize);
        }
    }
    let mut expect = 0usize;
    for c in b.chunks(333) {
        assert!(c.iter().all(|&x| x == (expect % 251) as u8));
        expect += 333;
    }
    let f = b.freeze();
    let g = f.slice(100..);
    drop(f);
    std::thread::spawn(move || drop(g)).join().unwrap();
    all_back(&BUFS.stats());
    assert!(BUFS.oldest_live(10).is_empty());
}

/// `Buf` source that panics midway through `put`.
struct Panicky {
    left: usize,
    chunk: Vec<u8>,
}
impl Buf for Panicky {
    fn remaining(&self) -> usize {
        self.left
    }
    fn chunk(&self) -> &[u8] {
        if self.left < 5000 {
            panic!("boom");
        }
        &self.chunk[..self.chunk.len().min(self.left)]
    }
    fn advance(&mut self, cnt: usize) {
        self.left -= cnt;
    }
}

#[test]
fn panic_in_the_middle_of_put_leaves_a_consistent_buffer() {
    static BUFS: BufferAllocator = BufferAllocator::new();
    let mut b = BUFS.alloc(10);
    b.put_slice(b"abc");
    let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        b.put(Panicky {
            left: 20000,
            chunk: vec![7; 700],
        });
    }));
    assert!(r.is_err());
    assert!(b.len() <= b.capacity());
    assert_eq!(&b[..3], b"abc");
    assert!(b[3..].iter().all(|&x| x == 7));
    let f = b.freeze();
    drop(f);
    all_back(&BUFS.stats());

    // a panicking Display in write!
    struct P;
    impl std::fmt::Display for P {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str(&"x".repeat(1000))?;
            panic!("display")
        }
    }
    let mut b = BUFS.alloc(10);
    let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        let _ = write!(b, "{}", P);
    }));
    assert!(r.is_err());
    assert_eq!(b.len(), 1000);
    drop(b);
    all_back(&BUFS.stats());
}

#[test]
#[cfg_attr(miri, ignore = "Miri cannot fail a huge allocation")]
fn huge_and_zero_requests() {
    static BUFS: BufferAllocator = BufferAllocator::new();
    for cap in [
        isize::MAX as usize,
        isize::MAX as usize - 1,
        isize::MAX as usize - 4095,
        isize::MAX as usize - 4096 - 63,
        (isize::MAX as usize) + 1,
        usize::MAX,
        usize::MAX - 4095,
    ] {
        match BUFS.try_alloc(cap) {
            Err(BufferError::TooLarge(_)) | Err(BufferError::OutOfMemory) => {}
            other => panic!("{cap}: {other:?}"),
        }
    }
    let mut b = BUFS.alloc(100);
    b.put_slice(b"xyz");
    for add in [
        usize::MAX,
        usize::MAX - 2,
        usize::MAX - 3,
        isize::MAX as usize,
        isize::MAX as usize - 3,
        isize::MAX as usize - 4,
        isize::MAX as usize - 4095,
    ] {
        match b.try_reserve(add) {
            Err(BufferError::TooLarge(_)) | Err(BufferError::OutOfMemory) => {}
            other => panic!("{add}: {other:?}"),
        }
        assert_eq!((&b[..], b.capacity()), (&b"xyz"[..], 512));
    }
    assert_eq!(b.remaining_mut(), isize::MAX as usize - 3);
    drop(b);
    all_back(&BUFS.stats());
}

#[test]
fn exact_class_boundaries_through_bufmut() {
    static BUFS: BufferAllocator = BufferAllocator::new();
    for &c in BUFFER_CLASSES.iter() {
        let mut b = BUFS.alloc(c);
        assert_eq!(b.capacity(), c);
        // fill exactly via chunk_mut
        let spare = b.chunk_mut().len();
        assert_eq!(spare, c);
        b.chunk_mut().copy_from_slice(&vec![3u8; c]);
        // SAFETY: the `c` bytes of spare capacity were just written.
        unsafe { b.advance_mut(c) };
        assert_eq!(b.len(), c);
        // full: chunk_mut grows
        let l = b.chunk_mut().len();
        assert!(l >= 64, "{l}");
        assert!(b.iter().all(|&x| x == 3));
        let f = b.freeze();
        assert_eq!(f.len(), c);
    }
    all_back(&BUFS.stats());
}

/// Main warms its caches of allocator X; X dies on another thread (last `Bytes`);
/// main then uses a new allocator Y (maybe at X's address): nothing of X may surface.
#[test]
fn warm_caches_of_a_dead_allocator_do_not_leak_into_its_successor() {
    for round in 0..3u8 {
        let x = Arc::new(BufferAllocator::new());
        // warm: many allocs and frees of several classes on this thread
        for _ in 0..3 {
            let v: Vec<_> = (0..40).map(|i| x.alloc_arc(1 + (i % 4) * 600)).collect();
            drop(v);
        }
        let mut b = x.alloc_arc(1000);
        b.put_bytes(round, 1000);
        let f = b.freeze();
        drop(x);
        std::thread::spawn(move || drop(f)).join().unwrap();
        let y = Arc::new(BufferAllocator::new());
        let v: Vec<_> = (0..60)
            .map(|i| {
                let mut b = y.alloc_arc(1 + (i % 4) * 600);
                b.put_bytes(0xEE, b.capacity());
                b
            })
            .collect();
        let s = y.stats();
        assert_eq!(s.live_buffers(), 60, "{s:?}");
        drop(v);
        all_back(&y.stats());
    }
}

/// A used allocator moved out of its `Arc` (all buffers gone) and used again from its
/// new place, on two threads.
#[test]
fn a_used_allocator_moved_out_of_its_arc_keeps_working() {
    let a = Arc::new(BufferAllocator::new());
    for _ in 0..3 {
        let v: Vec<_> = (0..30).map(|i| a.alloc_arc(1 + (i % 5) * 900)).collect();
        drop(v);
    }
    let a2 = Arc::clone(&a);
    std::thread::spawn(move || {
        let v: Vec<_> = (0..30).map(|i| a2.alloc_arc(1 + (i % 5) * 900)).collect();
        drop(v);
    })
    .join()
    .unwrap();
    let moved: BufferAllocator = Arc::try_unwrap(a).ok().unwrap();
    let boxed = Box::new(moved); // a new address
    let b = Arc::new(*boxed);
    for _ in 0..3 {
        let v: Vec<_> = (0..30)
            .map(|i| {
                let mut x = b.alloc_arc(1 + (i % 5) * 900);
                x.put_bytes(1, x.capacity());
                x
            })
            .collect();
        assert_eq!(b.stats().live_buffers(), 30);
        drop(v);
    }
    let b2 = Arc::clone(&b);
    std::thread::spawn(move || {
        let v: Vec<_> = (0..30).map(|i| b2.alloc_arc(1 + (i % 5) * 900)).collect();
        drop(v);
    })
    .join()
    .unwrap();
    all_back(&b.stats());
    b.trim();
    drop(b);
}

/// Buffers allocated (and some grown) inside a TLS destructor after the thread's cache
/// is gone, kept past the thread's exit and freed on main.
#[test]
fn buffers_allocated_in_a_tls_destructor_after_teardown() {
    static BUFS: BufferAllocator = BufferAllocator::new();
    static OUT: std::sync::Mutex<Vec<proxalloc::PooledBuf>> = std::sync::Mutex::new(Vec::new());
    struct Late;
    impl Drop for Late {
        fn drop(&mut self) {
            for i in 0..30usize {
                let mut b = BUFS.alloc(1 + i * 250);
                b.put_bytes(i as u8, 600 + i * 10); // grows the small ones
                let f = BUFS.alloc(900);
                drop(f);
                OUT.lock().unwrap().push(b);
            }
        }
    }
    thread_local! { static LATE: RefCell<Option<Late>> = const { RefCell::new(None) }; }
    std::thread::spawn(|| {
        LATE.with(|l| *l.borrow_mut() = Some(Late));
        for _ in 0..3 {
            let v: Vec<_> = (0..20).map(|i| BUFS.alloc(1 + i * 250)).collect();
            drop(v);
        }
    })
    .join()
    .unwrap();
    let v = std::mem::take(&mut *OUT.lock().unwrap());
    assert_eq!(v.len(), 30);
    for (i, b) in v.iter().enumerate() {
        assert!(b.iter().all(|&x| x == i as u8));
    }
    drop(v);
    all_back(&BUFS.stats());
}

/// Every cache mode (and a cap): grow, freeze, hand over, drop; books exact.
#[test]
fn every_mode_grows_freezes_and_hands_over() {
    use proxalloc::{CacheMode, Config};
    static T: BufferAllocator =
        BufferAllocator::with_config(Config::new().mode(CacheMode::ThreadCaches));
    static P: BufferAllocator = BufferAllocator::with_config(Config::new().mode(CacheMode::PerCpu));
    static D: BufferAllocator =
        BufferAllocator::with_config(Config::new().mode(CacheMode::DepotOnly));
    static B: BufferAllocator = BufferAllocator::with_config(Config::new().mode(CacheMode::Bypass));
    for a in [&T, &P, &D, &B] {
        let (tx, rx) = std::sync::mpsc::channel::<Bytes>();
        let h = std::thread::spawn(move || {
            for b in rx {
                assert!(b.iter().all(|&x| x == b[0]));
                drop(b);
            }
        });
        for i in 0..60usize {
            let mut b = a.alloc(1 + (i * 37) % 600);
            let _ = b.try_reserve((i * 911) % 70000);
            b.put_bytes((i % 200) as u8, 1 + (i * 413) % 3000);
            let f = b.freeze();
            tx.send(f.slice(..f.len() / 2 + 1)).unwrap();
            drop(f);
        }
        drop(tx);
        h.join().unwrap();
        all_back(&a.stats());
        a.trim();
        all_back(&a.stats());
    }
}

/// Leak records under a two-thread churn with growth and freezing: at the end every
/// record is gone, and while buffers are held the records match them one for one.
#[test]
#[cfg(debug_assertions)]
#[cfg_attr(miri, ignore = "no misuse detection under Miri")]
fn leak_records_match_live_buffers_under_churn() {
    static BUFS: BufferAllocator = BufferAllocator::new();
    BUFS.set_leak_level(LeakLevel::All);
    let (tx, rx) = std::sync::mpsc::channel::<Bytes>();
    let workers: Vec<_> = (0..2)
        .map(|t| {
            let tx = tx.clone();
            std::thread::spawn(move || {
                for i in 0..3000usize {
                    let mut b = BUFS.alloc(1 + (i * 131 + t) % 2000);
                    b.put_bytes(1, (i * 7919) % 90000 + 1);
                    if i % 3 == 0 {
                        tx.send(b.freeze()).unwrap();
                    } else if i % 3 == 1 {
                        let mut c = BUFS.alloc(100);
                        c.put_bytes(2, 700);
                        drop(b);
                        drop(c);
                    }
                }
            })
        })
        .collect();
    drop(tx);
    let mut held = Vec::new();
    for b in rx {
        held.push(b);
        if held.len() > 50 {
            held.drain(..25);
        }
    }
    for w in workers {
        w.join().unwrap();
    }
    let live = BUFS.stats().live_buffers();
    assert_eq!(BUFS.oldest_live(usize::MAX).len() as u64, live);
    drop(held);
    assert!(BUFS.oldest_live(usize::MAX).is_empty());
    all_back(&BUFS.stats());
}
