//! The crate's `static` allocators (the README's headline line among them) used from std
//! threads, with exact accounting. Runs in every build: plain, under the user's
//! `--cfg loom` (where proxalloc still builds in its std mode, `const` constructors and
//! all) and under Miri.

use std::sync::{mpsc, OnceLock};
use std::thread;

use proxalloc::{stats::Stats, BlockSource, Pool};
use proxalloc_downstream_tests::{BODIES, REQS};

const N: u64 = if cfg!(miri) { 20 } else { 2_000 };

fn assert_delta(before: &Stats, after: &Stats, n: u64) {
    assert_eq!(after.allocs - before.allocs, n, "{after}");
    assert_eq!(after.frees - before.frees, n, "{after}");
    assert_eq!(after.live, 0, "{after}");
    assert!(after.is_consistent(), "{after}");
}

/// Allocated on a producer thread, sent through a channel, freed on a consumer thread.
#[test]
fn headline_statics_cross_std_threads() {
    let before = (REQS.stats(), BODIES.stats());
    let (tx, rx) = mpsc::channel();
    let producer = thread::spawn(move || {
        for i in 0..N {
            let mut body = BODIES.get();
            body.bytes.push(i as u8);
            tx.send((REQS.alloc([i as u8; 64]), body)).unwrap();
        }
    });
    let consumer = thread::spawn(move || {
        for (i, (req, body)) in rx.iter().enumerate() {
            assert_eq!(*req, [i as u8; 64]);
            assert_eq!(body.bytes, [i as u8]);
        }
    });
    producer.join().unwrap();
    consumer.join().unwrap();
    assert_delta(&before.0, &REQS.stats(), N);
    assert_delta(&before.1, &BODIES.stats(), N);
}

/// A pool filled on one thread and cleared and dropped on another; its blocks go back
/// through the second thread's cache.
#[test]
fn pool_moves_between_std_threads() {
    static SOURCE: OnceLock<BlockSource> = OnceLock::new();
    let source = SOURCE.get_or_init(|| BlockSource::new(1 << 20));
    let rounds = N / 10;
    let (tx, rx) = mpsc::channel();
    let producer = thread::spawn(move || {
        for i in 0..rounds {
            let pool = Pool::with_source(source);
            let s = proxalloc::pformat!(pool, "request {i}").len();
            tx.send((pool, s)).unwrap();
        }
    });
    let consumer = thread::spawn(move || {
        for (mut pool, len) in rx {
            assert!(pool.stats().used_bytes >= len);
            pool.clear();
        }
    });
    producer.join().unwrap();
    consumer.join().unwrap();
    let blocks = source.stats()[0];
    assert_delta(&Stats::default(), &blocks, rounds);
}
