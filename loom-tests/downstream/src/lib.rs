//! A stand-in for a crate that uses proxalloc: a server that keeps per-request objects in
//! `static` allocators and model-checks its own concurrency with loom, switched on the
//! usual way (`RUSTFLAGS="--cfg loom"`). That flag reaches proxalloc too; proxalloc's own
//! loom mode answers only to `--cfg proxalloc_loom`, so here it builds as it always does.
//!
//! - `tests/statics.rs` (every build, Miri included): the statics below, used from std
//!   threads, with exact accounting.
//! - `tests/std_threads.rs` (without `--cfg loom`, Miri included): the user's hand-off
//!   code ([`Mailbox`], a channel) carrying proxalloc handles between std threads.
//! - `tests/loom_model.rs` (only with `--cfg loom`): the same hand-offs as loom models.
//!
//! Under the user's loom, proxalloc is an opaque, correct component: each of its calls is
//! one step that loom does not look inside (its atomics and thread-locals are std's), so
//! the user's model explores the user's code, not proxalloc's. Loom threads are
//! coroutines on the test's OS thread, so they share that thread's proxalloc caches; an
//! object allocated on one loom thread and dropped on another is accounted exactly, and
//! freed memory parked in the caches is simply reused by the next execution. The one
//! thing to do by hand is [`Session`]'s: a value that owns loom objects must not be
//! cached by a `RecyclingAllocator` in a loom build, because loom would see it reused by
//! another loom thread with no synchronisation (proxalloc's hand-off is invisible to
//! it) or outliving its execution (see `tests/loom_model.rs`).

use proxalloc::{ClassAllocator, Recycle, RecyclingAllocator};

/// The user's concurrency facade: loom's types under `--cfg loom`, std's otherwise.
pub mod sync {
    #[cfg(loom)]
    pub use loom::{
        sync::{atomic, mpsc, Arc, Mutex},
        thread,
    };
    #[cfg(not(loom))]
    pub use std::{
        sync::{atomic, mpsc, Arc, Mutex},
        thread,
    };
}

use sync::{Arc, Mutex};

/// The README's headline line; it must compile under the user's `--cfg loom`, where
/// proxalloc keeps its `const` constructors.
pub static REQS: ClassAllocator<[u8; 64]> = ClassAllocator::new("reqs");

/// A response body whose buffer survives from one request to the next.
#[derive(Debug)]
pub struct Body {
    /// The bytes of the body.
    pub bytes: Vec<u8>,
}

impl Recycle for Body {
    fn create() -> Self {
        Body {
            bytes: Vec::with_capacity(256),
        }
    }

    fn recycle(&mut self) -> bool {
        self.bytes.clear();
        self.bytes.capacity() <= 64 << 10
    }
}

/// Recycled response bodies, also a `static`.
pub static BODIES: RecyclingAllocator<Body> = RecyclingAllocator::new("bodies");

/// Per-connection state shared with a connection's other tasks through the facade's
/// types, so under `--cfg loom` it owns loom objects.
#[derive(Debug)]
pub struct Session {
    /// Requests served on this connection, shared with its other tasks.
    pub requests: Arc<sync::atomic::AtomicUsize>,
}

impl Recycle for Session {
    fn create() -> Self {
        Session {
            requests: Arc::new(sync::atomic::AtomicUsize::new(0)),
        }
    }

    /// Kept for reuse, except in loom builds: there a cached session would be reused by
    /// another loom thread with no synchronisation that loom can see (proxalloc's caches
    /// are opaque to it), and would outlive the execution that created its loom objects.
    /// Declining here drops it at once instead, on the loom thread that dropped it.
    fn recycle(&mut self) -> bool {
        self.requests.store(0, sync::atomic::Ordering::Relaxed);
        cfg!(not(loom))
    }
}

/// Recycled sessions.
pub static SESSIONS: RecyclingAllocator<Session> = RecyclingAllocator::new("sessions");

/// The user's own concurrent code: a one-slot hand-off between two threads, built on
/// the facade, so that loom checks it under `--cfg loom`.
#[derive(Debug)]
pub struct Mailbox<T>(Arc<Mutex<Option<T>>>);

impl<T> Clone for Mailbox<T> {
    fn clone(&self) -> Self {
        Mailbox(self.0.clone())
    }
}

impl<T> Default for Mailbox<T> {
    fn default() -> Self {
        Self::new()
    }
}

impl<T> Mailbox<T> {
    /// An empty mailbox.
    pub fn new() -> Self {
        Mailbox(Arc::new(Mutex::new(None)))
    }

    /// Puts `value` in, returning what was there.
    pub fn put(&self, value: T) -> Option<T> {
        self.0.lock().unwrap().replace(value)
    }

    /// Takes what is there, if anything.
    pub fn take(&self) -> Option<T> {
        self.0.lock().unwrap().take()
    }
}
