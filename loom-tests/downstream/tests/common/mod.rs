//! Hand-off scenarios written once against the user's facade
//! (`proxalloc_downstream_tests::sync`): `tests/loom_model.rs` runs them as loom models
//! (`--cfg loom`), `tests/std_threads.rs` runs them on std threads (and under Miri).

use proxalloc::{BlockSource, ClassAllocator, ClassBox, Pool, Recycled, RecyclingAllocator, Stats};
use proxalloc_downstream_tests::sync::atomic::Ordering::Relaxed;
use proxalloc_downstream_tests::sync::{mpsc, thread};
use proxalloc_downstream_tests::{Body, Mailbox, Session};

/// No object in users' hands, and every object accounted for exactly once.
pub fn assert_settled(s: &Stats) {
    assert_eq!(s.live, 0, "{s}");
    assert_eq!(s.allocs, s.frees, "{s}");
    assert!(s.is_consistent(), "{s}");
}

/// Two threads each allocate one object and hand it to the other through a [`Mailbox`];
/// whichever thread finds it frees it, and what is still in a mailbox after the join is
/// freed by the main thread. Each object may be freed on the thread that did not
/// allocate it, in either direction. Two allocations and two frees per run.
pub fn mailbox_handoff(msgs: &'static ClassAllocator<[u64; 8]>) {
    let to_main: Mailbox<ClassBox<'static, [u64; 8]>> = Mailbox::new();
    let to_worker: Mailbox<ClassBox<'static, [u64; 8]>> = Mailbox::new();
    let worker = {
        let (to_main, to_worker) = (to_main.clone(), to_worker.clone());
        thread::spawn(move || {
            assert!(to_main.put(msgs.alloc([1; 8])).is_none());
            // Freed here if the main thread's object is already there.
            if let Some(m) = to_worker.take() {
                assert_eq!(*m, [2; 8]);
            }
        })
    };
    assert!(to_worker.put(msgs.alloc([2; 8])).is_none());
    let early = to_main.take();
    worker.join().unwrap();
    let late = to_main.take();
    let from_worker = match (early, late) {
        (Some(m), None) | (None, Some(m)) => m,
        _ => panic!("the worker sent exactly one object"),
    };
    assert_eq!(*from_worker, [1; 8]);
    drop(from_worker);
    drop(to_worker.take());
    assert_settled(&msgs.stats());
}

/// A producer thread allocates a request, a recycled body and a pool (with a string in
/// it) and sends all three through a channel; a consumer thread checks and drops them.
pub fn channel_handoff(
    reqs: &'static ClassAllocator<[u8; 64]>,
    bodies: &'static RecyclingAllocator<Body>,
    source: &'static BlockSource,
) {
    const LINE: &str = "GET / HTTP/1.1";
    let (tx, rx) = mpsc::channel();
    let producer = thread::spawn(move || {
        let req = reqs.alloc([1; 64]);
        let mut body = bodies.get();
        assert!(body.bytes.is_empty(), "a recycled body comes back cleared");
        body.bytes.extend_from_slice(b"hello");
        let pool = Pool::with_source(source);
        assert_eq!(pool.alloc_str(LINE), LINE);
        tx.send((req, body, pool)).unwrap();
    });
    let consumer = thread::spawn(move || {
        let (req, body, mut pool) = rx.recv().unwrap();
        assert_eq!(*req, [1; 64]);
        assert_eq!(body.bytes, b"hello");
        assert!(pool.stats().used_bytes >= LINE.len());
        pool.clear();
        // The handles and the pool's last block are freed here, on the consumer.
    });
    producer.join().unwrap();
    consumer.join().unwrap();
    assert_settled(&reqs.stats());
    assert_settled(&bodies.stats());
    for s in source.stats() {
        assert_settled(&s);
    }
}

/// Two threads each take a [`Session`] and use it; the worker hands its session to the
/// main thread through a [`Mailbox`], which uses it again and drops it (maybe before the
/// join, maybe after). Two sessions handed out and given back per run.
pub fn two_sessions(sessions: &'static RecyclingAllocator<Session>) {
    let mailbox: Mailbox<Recycled<'static, Session>> = Mailbox::new();
    let worker = {
        let mailbox = mailbox.clone();
        thread::spawn(move || {
            let s = sessions.get();
            s.requests.fetch_add(1, Relaxed);
            assert!(mailbox.put(s).is_none());
        })
    };
    let own = sessions.get();
    own.requests.fetch_add(1, Relaxed);
    let early = mailbox.take();
    worker.join().unwrap();
    let theirs = early
        .or_else(|| mailbox.take())
        .expect("the worker sent its session");
    assert_eq!(
        theirs.requests.fetch_add(1, Relaxed),
        1,
        "a fresh or reset session"
    );
    drop((own, theirs));
    assert_settled(&sessions.stats());
}
