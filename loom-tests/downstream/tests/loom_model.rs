//! The user's loom models, run with `RUSTFLAGS="--cfg loom"` (the way loom is normally
//! switched on, which also reaches proxalloc). proxalloc builds in its std mode there:
//! its statics keep their `const` constructors, and each of its calls is one opaque step
//! of the model (loom explores the user's mailboxes and channels, not proxalloc's
//! protocols; those have their own models under `--cfg proxalloc_loom`).
//!
//! Loom runs every thread of a model as a coroutine on the test's OS thread, so all of
//! them share that thread's proxalloc caches, and what the caches hold at the end of one
//! execution is still there for the next. For plain memory (a `ClassAllocator`'s objects,
//! a pool's blocks) and for recycled values that own no loom object, that is harmless:
//! loom neither tracks nor checks that memory, and the accounting stays exact. A value
//! that owns loom objects must not be cached by a `RecyclingAllocator` in a loom build
//! (`Session` declines under `cfg(loom)`); the last two tests show what loom reports
//! otherwise.
#![cfg(loom)]

mod common;

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::OnceLock;

use common::assert_settled;
use proxalloc::{BlockSource, ClassAllocator, Recycle, RecyclingAllocator};
use proxalloc_downstream_tests::{Body, SESSIONS};

#[test]
fn class_box_crosses_loom_threads_through_mailboxes() {
    static MSGS: ClassAllocator<[u64; 8]> = ClassAllocator::new("downstream-loom-mailbox");
    static EXECUTIONS: AtomicU64 = AtomicU64::new(0);
    loom::model(|| {
        EXECUTIONS.fetch_add(1, Relaxed);
        common::mailbox_handoff(&MSGS);
    });
    let n = EXECUTIONS.load(Relaxed);
    assert!(n > 1, "loom explored more than one interleaving");
    let s = MSGS.stats();
    assert_eq!((s.allocs, s.frees), (2 * n, 2 * n), "{s}");
    assert_settled(&s);
    // Memory left in the (shared) thread cache by one execution served the next ones.
    assert!(s.backing_allocs < s.allocs, "{s}");
}

#[test]
fn request_body_and_pool_cross_a_loom_channel() {
    static REQS: ClassAllocator<[u8; 64]> = ClassAllocator::new("downstream-loom-reqs");
    static BODIES: RecyclingAllocator<Body> = RecyclingAllocator::new("downstream-loom-bodies");
    static SOURCE: OnceLock<BlockSource> = OnceLock::new();
    static EXECUTIONS: AtomicU64 = AtomicU64::new(0);
    let source = SOURCE.get_or_init(|| BlockSource::new(1 << 20));
    loom::model(move || {
        EXECUTIONS.fetch_add(1, Relaxed);
        common::channel_handoff(&REQS, &BODIES, source);
    });
    let n = EXECUTIONS.load(Relaxed);
    assert!(n > 1, "loom explored more than one interleaving");
    let (r, b) = (REQS.stats(), BODIES.stats());
    assert_eq!((r.allocs, r.frees), (n, n), "{r}");
    assert_eq!((b.allocs, b.frees), (n, n), "{b}");
    // A body owns no loom object, so it may stay cached from one execution to the next.
    assert!(b.backing_allocs < n, "{b}");
    assert_eq!(source.stats()[0].allocs, n, "one 8 KiB block per pool");
}

/// `Session` owns loom objects and declines to be recycled under `cfg(loom)`: nothing is
/// ever cached, each execution creates and drops its own sessions.
#[test]
fn sessions_owning_loom_objects_are_not_cached() {
    static EXECUTIONS: AtomicU64 = AtomicU64::new(0);
    loom::model(|| {
        EXECUTIONS.fetch_add(1, Relaxed);
        common::two_sessions(&SESSIONS);
        let s = SESSIONS.stats();
        assert_eq!(s.reserved_objects(), 0, "{s}");
    });
    let n = EXECUTIONS.load(Relaxed);
    assert!(n > 1, "loom explored more than one interleaving");
    let s = SESSIONS.stats();
    assert_eq!((s.allocs, s.frees), (2 * n, 2 * n), "{s}");
    assert_eq!(s.backing_allocs, 2 * n, "{s}");
}

/// The mistake `Session` avoids: a value owning a loom object, recycled in a loom build.
struct CachedSession {
    requests: loom::sync::Arc<loom::sync::atomic::AtomicUsize>,
}

impl Recycle for CachedSession {
    fn create() -> Self {
        CachedSession {
            requests: loom::sync::Arc::new(loom::sync::atomic::AtomicUsize::new(0)),
        }
    }

    fn recycle(&mut self) -> bool {
        true
    }
}

/// One loom thread caches a session, the other takes it from the cache they share:
/// loom sees the second thread use the first one's atomic with nothing ordering the two
/// (the hand-off went through proxalloc, which loom cannot see), and fails the model.
#[test]
#[should_panic(expected = "Causality violation")]
fn cached_loom_objects_handed_between_loom_threads_fail_the_model() {
    static CACHED: RecyclingAllocator<CachedSession> =
        RecyclingAllocator::new("downstream-loom-cached");
    loom::model(|| {
        let worker = loom::thread::spawn(|| {
            CACHED.get().requests.fetch_add(1, Relaxed);
        });
        CACHED.get().requests.fetch_add(1, Relaxed);
        worker.join().unwrap();
    });
}

/// A session cached at the end of an execution still owns its `loom::sync::Arc`, and
/// loom's leak check fails that execution.
#[test]
#[should_panic(expected = "leaked")]
fn cached_loom_objects_outliving_an_execution_fail_the_model() {
    static LEAKY: RecyclingAllocator<CachedSession> =
        RecyclingAllocator::new("downstream-loom-leaky");
    loom::model(|| {
        LEAKY.get().requests.fetch_add(1, Relaxed);
    });
}
