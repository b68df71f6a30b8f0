//! Pooled I/O buffers (feature `bytes`, which the crate's dev-dependency on itself turns
//! on): classes and capacities, growth, `BufMut` and `io::Write`, freezing into `Bytes`
//! and dropping on other threads, trims while frozen buffers are shared, leak listing,
//! bad input, and exact accounting. Each test has its own `static` allocator, so the
//! counts it asserts are its own.

use std::io::Write;
use std::sync::{Arc, Barrier};

use bytes::{BufMut, Bytes};
use proxalloc::{BufferAllocator, BufferError, LeakLevel, Pool, BUFFER_ALIGN, BUFFER_CLASSES};

#[path = "common/buffer_books.rs"]
mod buffer_books;
use buffer_books::assert_all_back;

#[test]
fn each_request_gets_the_smallest_class_that_holds_it_and_reports_its_real_capacity() {
    static BUFS: BufferAllocator = BufferAllocator::new();
    let mut held = Vec::new();
    for (class, &size) in BUFFER_CLASSES.iter().enumerate() {
        let below = if class == 0 {
            1
        } else {
            BUFFER_CLASSES[class - 1] + 1
        };
        for request in [below, size] {
            let b = BUFS.alloc(request);
            assert_eq!(b.capacity(), size, "request {request}");
            assert_eq!(b.as_ptr() as usize % BUFFER_ALIGN, 0);
            held.push(b);
        }
    }
    let big = BUFS.alloc((64 << 10) + 1);
    assert_eq!(big.capacity(), 68 << 10, "oversize rounds up to 4 KiB");
    let s = BUFS.stats();
    for (class, row) in s.classes.iter().enumerate() {
        assert_eq!(
            (row.live, row.object_size),
            (2, BUFFER_CLASSES[class]),
            "{row:?}"
        );
    }
    assert_eq!((s.oversize.live, s.oversize_live_bytes), (1, 68 << 10));
    assert_eq!(s.live_buffers(), 17);
    drop((held, big));
    assert_all_back(&BUFS.stats());
}

#[test]
fn bad_requests_are_errors_with_clear_messages_and_change_nothing() {
    static BUFS: BufferAllocator = BufferAllocator::new();
    assert_eq!(BUFS.try_alloc(0).unwrap_err(), BufferError::ZeroCapacity);
    for huge in [isize::MAX as usize + 1, usize::MAX, isize::MAX as usize] {
        let e = BUFS.try_alloc(huge).unwrap_err();
        assert_eq!(e, BufferError::TooLarge(huge));
        assert!(e.to_string().contains(&huge.to_string()), "{e}");
    }
    let zero = std::panic::catch_unwind(|| BUFS.alloc(0)).unwrap_err();
    assert_eq!(
        zero.downcast_ref::<String>().map(String::as_str),
        Some("a buffer of capacity 0 was asked for")
    );
    assert!(std::panic::catch_unwind(|| BUFS.alloc(usize::MAX)).is_err());
    let s = BUFS.stats();
    assert_eq!(s.live_buffers(), 0);
    assert!(s.classes.iter().all(|r| r.allocs == 0));
    assert_eq!(s.oversize.allocs, 0);
}

#[test]
fn writing_past_the_capacity_grows_into_the_next_class_and_keeps_the_bytes() {
    static BUFS: BufferAllocator = BufferAllocator::new();
    let mut b = BUFS.alloc(512);
    let (total, step) = if cfg!(miri) {
        (70_000, 7_000)
    } else {
        (200_000, 700)
    };
    let pattern: Vec<u8> = (0..total as u32).map(|i| (i % 251) as u8).collect();
    let mut written = 0;
    for piece in pattern.chunks(step) {
        b.put_slice(piece);
        written += piece.len();
        assert_eq!(&b[..], &pattern[..written]);
        assert!(b.capacity() >= b.len());
    }
    assert!(
        b.capacity() >= total,
        "past the classes into the global allocator"
    );
    let s = BUFS.stats();
    assert_eq!(
        (s.live_buffers(), s.oversize.live),
        (1, 1),
        "each old slot went back"
    );
    drop(b);
    assert_all_back(&BUFS.stats());
}

#[test]
fn buf_mut_hands_out_all_of_the_spare_capacity_and_refuses_to_advance_past_it() {
    static BUFS: BufferAllocator = BufferAllocator::new();
    let mut b = BUFS.alloc(1000);
    assert_eq!(b.chunk_mut().len(), 1024, "all of the 1 KiB class");
    b.put_slice(b"abc");
    assert_eq!(b.chunk_mut().len(), 1021);
    let chunk = b.chunk_mut();
    chunk.copy_from_slice(&[7; 1021]);
    // SAFETY: the whole chunk was just written.
    unsafe { b.advance_mut(1021) };
    assert_eq!(b.len(), 1024);
    assert_eq!(b[3..].iter().filter(|&&x| x == 7).count(), 1021);
    assert_ne!(
        b.chunk_mut().len(),
        0,
        "a full buffer grows to give a chunk"
    );
    assert_eq!(b.capacity(), 2048);
    let err = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        // SAFETY: it panics before claiming any byte.
        unsafe { b.advance_mut(2000) }
    }))
    .unwrap_err();
    let msg = err.downcast_ref::<String>().unwrap();
    assert!(
        msg.contains("past the 1024 bytes of spare capacity"),
        "{msg}"
    );
    assert_eq!(b.len(), 1024, "nothing claimed");
}

/// A growth that the class allocator refuses (here a `max_live` cap) is an error from
/// `io::Write` and from `try_reserve`, with the buffer unchanged; `alloc` refused is an
/// error from `try_alloc`.
#[test]
fn refused_growth_is_an_io_error_and_changes_nothing() {
    static CAPPED: BufferAllocator =
        BufferAllocator::with_config(proxalloc::Config::new().max_live(1));
    let full_1k = CAPPED.alloc(1000);
    assert_eq!(
        CAPPED.try_alloc(1000).unwrap_err(),
        BufferError::OutOfMemory
    );
    let mut b = CAPPED.alloc(512);
    b.put_slice(b"kept");
    let e = b.write_all(&[0; 600]).unwrap_err();
    assert_eq!(e.kind(), std::io::ErrorKind::OutOfMemory);
    assert_eq!((&b[..], b.capacity()), (&b"kept"[..], 512));
    assert_eq!(b.try_reserve(600), Err(BufferError::OutOfMemory));
    drop(full_1k);
    b.write_all(&[1; 600]).unwrap();
    assert_eq!((b.len(), b.capacity()), (604, 1024));
    drop(b);
    assert_all_back(&CAPPED.stats());
}

#[test]
fn io_write_and_fmt_append() {
    static BUFS: BufferAllocator = BufferAllocator::new();
    let mut b = BUFS.alloc(16);
    let (status, reason) = (200, "OK");
    write!(b, "HTTP/1.1 {status} {reason}\r\n").unwrap();
    b.write_all(&[b'x'; 600]).unwrap();
    assert_eq!(&b[..17], b"HTTP/1.1 200 OK\r\n");
    assert_eq!(b.len(), 617);
    assert_eq!(b.capacity(), 1024);
}

/// The hyper pattern: one thread writes and freezes, others hold clones and slices and
/// drop them; the slot goes back when the last one goes, wherever that is. (Run under
/// Miri by CI, as is the rest of this file but the tokio test.)
#[test]
fn frozen_bytes_are_shared_across_threads_and_the_last_drop_returns_the_slot() {
    static BUFS: BufferAllocator = BufferAllocator::new();
    let rounds = if cfg!(miri) { 4 } else { 200 };
    for round in 0..rounds {
        let mut b = BUFS.alloc(2048);
        b.put_u64(round);
        b.put_bytes(b'z', 100);
        let frozen: Bytes = b.freeze();
        let (head, tail) = (frozen.slice(..8), frozen.slice(8..));
        let clones: Vec<Bytes> = (0..2).map(|_| frozen.clone()).collect();
        drop(frozen);
        let t = std::thread::spawn(move || {
            assert_eq!(u64::from_be_bytes(head[..].try_into().unwrap()), round);
            assert_eq!(clones[1].len(), 108);
            drop(clones);
            tail
        });
        let tail = t.join().unwrap();
        assert_eq!(BUFS.stats().classes[2].live, 1, "the tail still holds it");
        assert!(tail.iter().all(|&x| x == b'z'));
        drop(tail);
        assert_eq!(BUFS.stats().classes[2].live, 0);
    }
    let s = BUFS.stats();
    assert_eq!(s.classes[2].allocs, rounds);
    assert_all_back(&s);
}

#[test]
fn an_empty_buffer_freezes_to_empty_bytes_and_gives_its_slot_back() {
    static BUFS: BufferAllocator = BufferAllocator::new();
    let b = BUFS.alloc(100).freeze();
    assert!(b.is_empty());
    assert_eq!(BUFS.stats().live_buffers(), 0);
}

#[test]
fn an_allocator_made_at_run_time_lives_as_long_as_its_frozen_bytes() {
    let bufs = Arc::new(BufferAllocator::new());
    let mut b = bufs.alloc_arc(5000);
    b.put_slice(b"outlives");
    let frozen = b.freeze();
    let weak = Arc::downgrade(&bufs);
    assert_eq!(bufs.stats().classes[4].live, 1);
    drop(bufs);
    assert!(weak.upgrade().is_some(), "held by the frozen buffer");
    let f2 = frozen.clone();
    std::thread::spawn(move || drop(f2)).join().unwrap();
    assert_eq!(&frozen[..], b"outlives");
    drop(frozen);
    assert!(weak.upgrade().is_none(), "the last drop released it");
}

/// A buffer of an allocator made at run time, grown and dropped unfrozen (on another
/// thread): the memory goes back to the class it ended in, and the buffer's count of
/// the allocator goes with it, exactly once (the count lives in the buffer's tagged
/// source word).
#[test]
fn a_buffer_of_a_run_time_allocator_grows_and_drops_unfrozen() {
    // Recorded where misuse detection is compiled in (not under Miri): the record (a
    // bit in the same word as the count) must follow the growth and go with the drop.
    let records = cfg!(all(debug_assertions, not(miri)));
    let bufs = Arc::new(BufferAllocator::new());
    bufs.set_leak_level(LeakLevel::All);
    let mut b = bufs.alloc_arc(100);
    b.put_bytes(7, 3000); // 512 B → 4 KiB
    let other = bufs.try_alloc_arc(600).unwrap();
    assert_eq!(Arc::strong_count(&bufs), 3, "one count a buffer");
    let weak = Arc::downgrade(&bufs);
    let watcher = Arc::clone(&bufs);
    drop(bufs);
    let s = watcher.stats();
    assert_eq!((s.classes[0].live, s.classes[3].live), (0, 1));
    if records {
        let live = watcher.oldest_live(10);
        assert_eq!(live.len(), 2);
        assert_eq!((live[0].capacity, live[1].capacity), (4096, 1024));
    }
    std::thread::spawn(move || {
        assert_eq!(b.capacity(), 4096);
        assert!(b.iter().all(|&x| x == 7));
        drop(b)
    })
    .join()
    .unwrap();
    assert_eq!(Arc::strong_count(&watcher), 2);
    if records {
        assert_eq!(
            watcher.oldest_live(10).len(),
            1,
            "the grown buffer's record stayed"
        );
    }
    drop(other);
    assert_eq!(Arc::strong_count(&watcher), 1);
    assert_eq!(watcher.stats().live_buffers(), 0);
    assert!(watcher.oldest_live(10).is_empty());
    drop(watcher);
    assert!(weak.upgrade().is_none());
}

/// `trim_all` and the allocator's own `trim` run while frozen buffers are shared by
/// other threads and dropped there: no byte changes under a reader, and every slot
/// comes back exactly once.
#[test]
fn trims_while_frozen_buffers_are_shared_across_threads_lose_nothing() {
    static BUFS: BufferAllocator = BufferAllocator::new();
    let threads = 2;
    let per_thread = if cfg!(miri) { 20 } else { 3000 };
    let start = Arc::new(Barrier::new(threads + 1));
    let (tx, rx) = std::sync::mpsc::channel::<Bytes>();
    let readers: Vec<_> = (0..threads)
        .map(|_| {
            let start = start.clone();
            let tx = tx.clone();
            std::thread::spawn(move || {
                start.wait();
                for i in 0..per_thread {
                    let mut b = BUFS.alloc(1 + (i * 997) % if cfg!(miri) { 1500 } else { 9000 });
                    let fill = (i % 251) as u8;
                    b.put_bytes(fill, b.capacity());
                    let frozen = b.freeze();
                    tx.send(frozen.slice(1..)).unwrap();
                    assert!(frozen.iter().all(|&x| x == fill));
                }
            })
        })
        .collect();
    drop(tx);
    start.wait();
    let mut received = 0;
    for bytes in rx {
        let first = bytes[0];
        if received % 64 == 0 {
            proxalloc::trim_all();
            BUFS.trim();
        }
        assert!(
            bytes.iter().all(|&x| x == first),
            "a trimmed slot was reused under us"
        );
        received += 1;
    }
    for r in readers {
        r.join().unwrap();
    }
    assert_eq!(received, threads * per_thread);
    let s = BUFS.stats();
    assert_eq!(
        s.classes.iter().map(|r| r.allocs).sum::<u64>(),
        received as u64
    );
    assert_all_back(&s);
}

#[test]
fn a_pool_leaves_as_bytes_and_its_blocks_go_back_with_the_last_clone() {
    // A `static`, which Miri does not count as leaked.
    static SOURCE: std::sync::OnceLock<proxalloc::BlockSource> = std::sync::OnceLock::new();
    let source = SOURCE.get_or_init(|| proxalloc::BlockSource::new(1 << 20));
    let pool = Pool::with_source(source);
    let body = pool.into_bytes(|pool| {
        let mut w = pool.writer();
        for i in 0..2000 {
            std::fmt::Write::write_fmt(&mut w, format_args!("{i},")).unwrap();
        }
        w.finish()
    });
    assert!(body.starts_with(b"0,1,2,"));
    assert!(
        source.stats()[0].live + source.stats()[1].live >= 1,
        "the pool's block is held"
    );
    let clone = body.slice(2..10);
    drop(body);
    std::thread::spawn(move || assert_eq!(&clone[..], b"1,2,3,4,"))
        .join()
        .unwrap();
    let live: u64 = source.stats().iter().map(|s| s.live).sum();
    assert_eq!(live, 0, "the pool was dropped with the last slice");
}

#[test]
#[cfg_attr(miri, ignore = "tokio's reactor under Miri is slow and out of scope")]
fn tokio_read_buf_reads_into_the_spare_capacity() {
    use tokio::io::AsyncReadExt;
    static BUFS: BufferAllocator = BufferAllocator::new();
    let rt = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    rt.block_on(async {
        let data: Vec<u8> = (0..3000u32).map(|i| i as u8).collect();
        let mut src = &data[..];
        let mut b = BUFS.alloc(2048);
        let n = src.read_buf(&mut b).await.unwrap();
        assert_eq!(n, 2048, "the whole class, in one read");
        let n = src.read_buf(&mut b).await.unwrap();
        assert_eq!(
            (n, b.capacity()),
            (952, 4096),
            "grew when full, as BytesMut does"
        );
        assert_eq!(&b[..], &data[..]);
    });
}

#[test]
fn exact_books_over_random_lifecycles_on_two_threads() {
    static BUFS: BufferAllocator = BufferAllocator::new();
    // Under Miri, small buffers: the consumer reads every byte.
    let (ops, max_size) = if cfg!(miri) {
        (100, 3000)
    } else {
        (10_000, 70_000)
    };
    let (tx, rx) = std::sync::mpsc::sync_channel::<Bytes>(64);
    let consumer = std::thread::spawn(move || {
        let mut n = 0u64;
        for b in rx {
            assert!(b.iter().all(|&x| x == b[0]));
            n += 1;
        }
        n
    });
    let mut seed = 0x9E37_79B9_7F4A_7C15u64;
    let mut next = || {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed
    };
    let mut kept = Vec::new();
    let mut sent = 0;
    for _ in 0..ops {
        let r = next();
        let mut b = BUFS.alloc(1 + (r as usize % max_size));
        let fill = (r >> 32) as u8;
        b.put_bytes(fill, 1 + (r >> 40) as usize % (2 * b.capacity()));
        match r % 4 {
            0 => drop(b),
            1 => kept.push(b.freeze()),
            2 => {
                tx.send(b.freeze()).unwrap();
                sent += 1;
            }
            _ => {
                let f = b.freeze();
                tx.send(f.slice(..f.len() / 2)).unwrap();
                sent += 1;
                kept.push(f);
            }
        }
        if kept.len() > 50 {
            kept.drain(..25);
        }
    }
    drop(tx);
    assert_eq!(consumer.join().unwrap(), sent);
    drop(kept);
    assert_all_back(&BUFS.stats());
}

/// A buffer leaked on purpose is listed, with the line that allocated it, oldest first;
/// freed and frozen-then-dropped ones are not. (Misuse detection is compiled into test
/// builds; in a release build without `debug-checks` nothing is recorded.)
#[test]
#[cfg(debug_assertions)]
#[cfg_attr(miri, ignore = "misuse detection is compiled out under Miri")]
fn a_leaked_buffer_is_listed_with_the_place_it_was_allocated() {
    static BUFS: BufferAllocator = BufferAllocator::new();
    BUFS.set_leak_level(LeakLevel::All);
    let leaked_line = line!() + 1;
    let leaked = BUFS.alloc(3000);
    std::mem::forget(leaked);
    drop(BUFS.alloc(100));
    let mut grown = BUFS.alloc(100);
    grown.put_bytes(1, 5000); // moves to the 8 KiB class: the record follows
    drop(BUFS.alloc(100).freeze());
    // Frozen with bytes in it (an empty buffer freezes to `Bytes::new()`, dropping the
    // buffer at once): its record must survive the frozen owner and go with its drop.
    let mut frozen = BUFS.alloc(100);
    frozen.put_slice(b"frozen");
    let frozen = frozen.freeze();
    assert_eq!(
        BUFS.oldest_live(10).len(),
        3,
        "a frozen buffer is still live"
    );
    std::thread::spawn(move || drop(frozen)).join().unwrap();
    let live = BUFS.oldest_live(10);
    assert_eq!(live.len(), 2, "{live:?}");
    assert_eq!(
        (live[0].location.line(), live[0].capacity),
        (leaked_line, 4096)
    );
    assert_eq!(live[0].location.file(), file!());
    assert_eq!(live[1].capacity, 8192);
    assert!(live[0]
        .to_string()
        .contains("4096-byte buffer allocated at tests/buffers.rs"));
    assert_eq!(BUFS.oldest_live(1).len(), 1);
    drop(grown);
    assert_eq!(BUFS.oldest_live(10).len(), 1, "only the leak is left");

    BUFS.set_leak_level(LeakLevel::AllWithBacktraces);
    let b = BUFS.alloc(10);
    let live = BUFS.oldest_live(10);
    assert!(live[1].backtrace.is_some());
    drop(b);

    // Sampled: one allocation in 128, at random: 40 expected of 5,120 (the bounds are
    // over 4 standard deviations away).
    BUFS.set_leak_level(LeakLevel::Sampled);
    let held: Vec<_> = (0..LeakLevel::SAMPLE_INTERVAL * 40)
        .map(|_| BUFS.alloc(10))
        .collect();
    let sampled = BUFS.oldest_live(usize::MAX).len() - 1;
    assert!((15..=70).contains(&sampled), "{sampled} sampled");
    drop(held);
    BUFS.set_leak_level(LeakLevel::Disabled);
    let untracked = BUFS.alloc(10);
    assert_eq!(BUFS.oldest_live(100).len(), 1);
    drop(untracked);
}

/// A recorded buffer of an allocator made at run time, frozen and dropped on another
/// thread: its record goes, and so does the allocator's last count (the frozen owner
/// keeps both in one tagged word).
#[test]
#[cfg(debug_assertions)]
#[cfg_attr(miri, ignore = "misuse detection is compiled out under Miri")]
fn a_recorded_buffer_of_a_shared_allocator_freezes_and_goes() {
    let bufs = Arc::new(BufferAllocator::new());
    bufs.set_leak_level(LeakLevel::All);
    let mut b = bufs.alloc_arc(700);
    b.put_slice(b"shared and recorded");
    let frozen = b.freeze();
    assert_eq!(bufs.oldest_live(10).len(), 1);
    let weak = Arc::downgrade(&bufs);
    let watcher = Arc::clone(&bufs);
    drop(bufs);
    std::thread::spawn(move || {
        assert_eq!(&frozen[..], b"shared and recorded");
        drop(frozen)
    })
    .join()
    .unwrap();
    assert!(watcher.oldest_live(10).is_empty(), "the record stayed");
    assert_eq!(watcher.stats().live_buffers(), 0);
    drop(watcher);
    assert!(weak.upgrade().is_none(), "the frozen buffer kept a count");
}

/// The default, sampled level finds a leak that a request makes every time at the same
/// step, after a buffer freed at another step: a sampler that took every n-th
/// allocation would fall on the same step each time and never see it.
#[test]
#[cfg(debug_assertions)]
#[cfg_attr(miri, ignore = "misuse detection is compiled out under Miri")]
fn sampling_finds_a_leak_at_every_other_allocation() {
    static BUFS: BufferAllocator = BufferAllocator::new();
    assert_eq!(BUFS.leak_level(), LeakLevel::Sampled);
    let body_line = line!() + 3;
    for _ in 0..2000 {
        drop(BUFS.alloc(200)); // the head, freed
        std::mem::forget(BUFS.alloc(3000)); // the body, leaked
    }
    let live = BUFS.oldest_live(usize::MAX);
    assert!(!live.is_empty(), "about 16 expected");
    assert!(live.iter().all(|b| b.location.line() == body_line));
}

/// The last `Bytes` of a pool is dropped on another thread, whose drop runs the pool's
/// cleanup: the cleanup allocates and freezes a buffer from the same allocator (re-entry
/// from a destructor), then parks inside the drop while this thread runs `trim_all`,
/// the allocator's `trim` and `stats`; nothing is lost and the books are exact.
#[test]
fn a_cleanup_run_by_the_last_bytes_drop_reenters_and_parks_while_others_trim() {
    static BUFS: BufferAllocator = BufferAllocator::new();
    let parked = Arc::new(Barrier::new(2));
    let resume = Arc::new(Barrier::new(2));
    let pool = Pool::new();
    {
        let (parked, resume) = (parked.clone(), resume.clone());
        let _key = pool.on_clear(move || {
            let mut inner = BUFS.alloc(700);
            inner.put_slice(b"from a destructor");
            let frozen = inner.freeze();
            parked.wait();
            resume.wait();
            assert_eq!(&frozen[..], b"from a destructor");
        });
    }
    let body = pool.into_bytes(|pool| pool.alloc_str("pool body").as_bytes());
    let dropper = std::thread::spawn(move || drop(body));
    parked.wait(); // the dropping thread is inside the pool's drop now
    let held = BUFS.alloc(3000);
    proxalloc::trim_all();
    BUFS.trim();
    let s = BUFS.stats();
    assert_eq!(
        (s.classes[1].live, s.classes[3].live),
        (1, 1),
        "the parked one and ours"
    );
    resume.wait();
    dropper.join().unwrap();
    drop(held);
    assert_all_back(&BUFS.stats());
}
