//! The one place that names concurrency primitives.
//!
//! Everything the loom models must see (atomics that carry a protocol, cells that hold
//! data handed between threads, thread-locals, mutexes, `Arc`, and the raw allocations of
//! object memory) comes from here. Under `--cfg loom` these are loom's types, so the
//! models check every ordering and every allocation; otherwise they are std's.
//!
//! Two things deliberately stay std under loom:
//! - [`StatCounter`]: statistics counters carry no protocol (nothing is published through
//!   them), and modelling them would multiply the state space for nothing.
//! - [`process`]: process-wide registration (dense slot numbers for the thread-cache
//!   table), touched only outside any modelled protocol.

#[cfg(loom)]
mod imp {
    pub(crate) use loom::alloc::{alloc, dealloc};
    pub(crate) use loom::cell::UnsafeCell;
    pub(crate) use loom::sync::atomic::{AtomicPtr, AtomicU32, AtomicU64, AtomicUsize};
    pub(crate) use loom::sync::{Arc, Mutex, MutexGuard};

    /// A thread-local with a `const` initialiser under std; loom's macro takes no
    /// `const` block, so the same declaration is initialised lazily there.
    macro_rules! const_thread_local {
        (static $name:ident: $t:ty = $init:expr;) => {
            loom::thread_local! { static $name: $t = $init; }
        };
    }
    pub(crate) use const_thread_local;
}

#[cfg(not(loom))]
mod imp {
    pub(crate) use std::alloc::{alloc, dealloc};
    pub(crate) use std::sync::atomic::{AtomicPtr, AtomicU32, AtomicU64, AtomicUsize};
    pub(crate) use std::sync::{Arc, Mutex, MutexGuard};

    /// A thread-local with a `const` initialiser (see the loom twin).
    macro_rules! const_thread_local {
        (static $name:ident: $t:ty = $init:expr;) => {
            std::thread_local! { static $name: $t = const { $init }; }
        };
    }
    pub(crate) use const_thread_local;

    /// `std::cell::UnsafeCell` with loom's closure-based access API, so code written
    /// against the facade compiles unchanged for both.
    #[derive(Debug)]
    #[repr(transparent)]
    pub(crate) struct UnsafeCell<T>(std::cell::UnsafeCell<T>);

    impl<T> UnsafeCell<T> {
        pub(crate) const fn new(value: T) -> Self {
            Self(std::cell::UnsafeCell::new(value))
        }

        #[allow(dead_code)] // loom's API, kept for parity
        #[inline(always)]
        pub(crate) fn with<R>(&self, f: impl FnOnce(*const T) -> R) -> R {
            f(self.0.get())
        }

        #[inline(always)]
        pub(crate) fn with_mut<R>(&self, f: impl FnOnce(*mut T) -> R) -> R {
            f(self.0.get())
        }
    }
}

pub(crate) use imp::*;
pub(crate) use std::sync::atomic::Ordering;

/// Locks a facade mutex, ignoring poison: no code in this crate panics while holding one
/// of its locks (user code never runs under them), so the protected state is consistent.
pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// A statistics counter written by one thread and read by any.
///
/// The owner bumps it with a relaxed load and store (a plain `add` to memory on x86, no
/// locked instruction); readers load it relaxed. It is an atomic only so that a reader
/// racing the owner is not a data race.
#[derive(Debug, Default)]
pub(crate) struct StatCounter(std::sync::atomic::AtomicU64);

impl StatCounter {
    pub(crate) const fn new() -> Self {
        Self(std::sync::atomic::AtomicU64::new(0))
    }

    /// Adds `n`. Only the owning thread may call this (two writers would lose counts).
    #[inline(always)]
    pub(crate) fn bump(&self, n: u64) {
        let v = self.0.load(Ordering::Relaxed);
        self.0.store(v.wrapping_add(n), Ordering::Relaxed);
    }

    /// Adds `n` from any thread (a locked add: slow paths only).
    pub(crate) fn add_shared(&self, n: u64) {
        self.0.fetch_add(n, Ordering::Relaxed);
    }

    /// Subtracts `n` from any thread (a locked sub: slow paths only).
    pub(crate) fn sub_shared(&self, n: u64) {
        self.0.fetch_sub(n, Ordering::Relaxed);
    }

    pub(crate) fn get(&self) -> u64 {
        self.0.load(Ordering::Relaxed)
    }
}

/// Process-wide std primitives that loom does not model (see the module docs).
pub(crate) mod process {
    pub(crate) use std::sync::atomic::AtomicU64;
    pub(crate) use std::sync::Mutex;
}
