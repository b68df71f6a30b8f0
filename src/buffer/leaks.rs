//! The leak tracker: which live buffers were allocated where, for
//! [`BufferAllocator::oldest_live`](super::BufferAllocator::oldest_live). Compiled in
//! with misuse detection only (`crate::debug::ENABLED`); otherwise `on_alloc` is a
//! constant `false` and nothing is recorded.

use std::backtrace::Backtrace;
use std::cell::Cell;
use std::collections::BTreeMap;
use std::fmt;
use std::panic::Location;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use crate::debug;

/// Which buffer allocations the leak tracker records (with misuse detection compiled
/// in: debug builds or the `debug-checks` feature). The levels follow netty's leak
/// detector: sampling by default, everything when hunting a leak.
///
/// ```
/// use proxalloc::{BufferAllocator, LeakLevel};
/// static BUFS: BufferAllocator = BufferAllocator::new();
/// assert_eq!(BUFS.leak_level(), LeakLevel::Sampled); // the default
/// BUFS.set_leak_level(LeakLevel::AllWithBacktraces);
/// ```
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum LeakLevel {
    /// Nothing is recorded.
    Disabled = 0,
    /// One allocation in [`SAMPLE_INTERVAL`](LeakLevel::SAMPLE_INTERVAL), drawn at
    /// random, is recorded with the place it was made (the default: a lock, a clock
    /// read and two map inserts per sampled buffer, and the lock again at its free). A leak that repeats is found after a few hundred
    /// occurrences.
    #[default]
    Sampled = 1,
    /// Every allocation is recorded with the place it was made.
    All = 2,
    /// Every allocation is recorded with the place it was made and a captured
    /// backtrace (microseconds each: for finding a leak, not for production).
    AllWithBacktraces = 3,
}

impl LeakLevel {
    /// One allocation in this many is recorded at the `Sampled` level, on average
    /// (netty's default sampling interval).
    pub const SAMPLE_INTERVAL: u32 = 128;

    fn from_u8(v: u8) -> LeakLevel {
        match v {
            0 => LeakLevel::Disabled,
            1 => LeakLevel::Sampled,
            2 => LeakLevel::All,
            _ => LeakLevel::AllWithBacktraces,
        }
    }
}

/// A live buffer the leak tracker recorded, from
/// [`BufferAllocator::oldest_live`](super::BufferAllocator::oldest_live).
#[derive(Clone, Debug)]
pub struct LiveBuffer {
    /// The address of its memory.
    pub address: usize,
    /// Its capacity in bytes (after any growth).
    pub capacity: usize,
    /// How long ago it was allocated.
    pub age: Duration,
    /// Where it was allocated (the caller of `alloc`, `try_alloc`, `alloc_arc` or
    /// `try_alloc_arc`).
    pub location: &'static Location<'static>,
    /// The stack at its allocation, at [`LeakLevel::AllWithBacktraces`].
    pub backtrace: Option<Arc<Backtrace>>,
}

impl fmt::Display for LiveBuffer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}-byte buffer allocated at {}, {:.1} ms ago",
            self.capacity,
            self.location,
            self.age.as_secs_f64() * 1e3
        )?;
        if let Some(bt) = &self.backtrace {
            write!(f, "\n{bt}")?;
        }
        Ok(())
    }
}

struct Record {
    /// Allocation order, to list the oldest first.
    seq: u64,
    at: Instant,
    capacity: usize,
    location: &'static Location<'static>,
    backtrace: Option<Arc<Backtrace>>,
}

struct Live {
    next_seq: u64,
    by_address: BTreeMap<usize, Record>,
    /// Sequence number → address, so that listing the oldest few reads only them.
    by_age: BTreeMap<u64, usize>,
}

pub(super) struct Tracker {
    level: AtomicU8,
    live: Mutex<Live>,
}

impl Tracker {
    pub(super) const fn new() -> Self {
        Tracker {
            level: AtomicU8::new(LeakLevel::Sampled as u8),
            live: Mutex::new(Live {
                next_seq: 0,
                by_address: BTreeMap::new(),
                by_age: BTreeMap::new(),
            }),
        }
    }

    fn live(&self) -> MutexGuard<'_, Live> {
        // No code panics while holding it (a poisoned lock still holds consistent data).
        self.live.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub(super) fn set_level(&self, level: LeakLevel) {
        self.level.store(level as u8, Ordering::Relaxed);
    }

    pub(super) fn level(&self) -> LeakLevel {
        LeakLevel::from_u8(self.level.load(Ordering::Relaxed))
    }

    /// Records a buffer just allocated if the level asks for it; returns whether it did
    /// (the buffer must then be forgotten by `on_free`).
    #[inline(always)]
    #[track_caller]
    pub(super) fn on_alloc(&self, ptr: NonNull<u8>, capacity: usize) -> bool {
        if !debug::ENABLED {
            return false;
        }
        let level = self.level();
        let record = match level {
            LeakLevel::Disabled => false,
            LeakLevel::Sampled => sample(),
            LeakLevel::All | LeakLevel::AllWithBacktraces => true,
        };
        if record {
            self.record(ptr, capacity, Location::caller(), level);
        }
        record
    }

    #[cold]
    fn record(
        &self,
        ptr: NonNull<u8>,
        capacity: usize,
        location: &'static Location<'static>,
        level: LeakLevel,
    ) {
        let backtrace =
            (level == LeakLevel::AllWithBacktraces).then(|| Arc::new(Backtrace::force_capture()));
        let at = Instant::now();
        let mut live = self.live();
        let seq = live.next_seq;
        live.next_seq += 1;
        live.by_age.insert(seq, ptr.as_ptr() as usize);
        live.by_address.insert(
            ptr.as_ptr() as usize,
            Record {
                seq,
                at,
                capacity,
                location,
                backtrace,
            },
        );
    }

    /// Forgets a recorded buffer being freed.
    #[cold]
    pub(super) fn on_free(&self, ptr: NonNull<u8>) {
        let mut live = self.live();
        let removed = live.by_address.remove(&(ptr.as_ptr() as usize));
        if let Some(r) = &removed {
            live.by_age.remove(&r.seq);
        }
        // Checked with the lock released: nothing panics while it is held.
        drop(live);
        debug_assert!(
            removed.is_some(),
            "a recorded buffer was not in the tracker"
        );
    }

    /// A recorded buffer's bytes moved to `to` (it grew), keeping its record.
    #[cold]
    pub(super) fn moved(&self, from: NonNull<u8>, to: NonNull<u8>, capacity: usize) {
        let mut live = self.live();
        if let Some(mut r) = live.by_address.remove(&(from.as_ptr() as usize)) {
            r.capacity = capacity;
            live.by_age.insert(r.seq, to.as_ptr() as usize);
            live.by_address.insert(to.as_ptr() as usize, r);
        }
    }

    /// The oldest `max` recorded live buffers, oldest first (the lock is held while
    /// those `max` are copied, not the rest).
    pub(super) fn oldest(&self, max: usize) -> Vec<LiveBuffer> {
        let now = Instant::now();
        let live = self.live();
        live.by_age
            .values()
            .take(max)
            .filter_map(|&address| {
                let r = live.by_address.get(&address)?;
                Some(LiveBuffer {
                    address,
                    capacity: r.capacity,
                    age: now.saturating_duration_since(r.at),
                    location: r.location,
                    backtrace: r.backtrace.clone(),
                })
            })
            .collect()
    }
}

/// Whether to record this allocation: a draw of one in `SAMPLE_INTERVAL` from a
/// per-thread xorshift generator. Random, as netty's is, not every n-th: a counter
/// would fall on the same allocation site of a request every time (a request that
/// allocates a head buffer, then a body buffer, would only ever record one of them)
/// and would let one allocator's allocations decide another's samples.
fn sample() -> bool {
    thread_local! { static STATE: Cell<u64> = const { Cell::new(0) }; }
    STATE
        .try_with(|state| {
            let mut x = state.get();
            if x == 0 {
                // Seeded once per thread, from its state's address and the clock.
                let here = state as *const Cell<u64> as u64;
                let nanos = std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .map_or(0, |d| d.as_nanos() as u64);
                x = (here ^ nanos.rotate_left(32)) | 1;
            }
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            state.set(x);
            x % u64::from(LeakLevel::SAMPLE_INTERVAL) == 0
        })
        .unwrap_or(false)
}
