//! `trim_idle`'s interval: what counts as idle, and the shortest interval judged. A leaf:
//! the engine, its administrators and the block source's large blocks all keep one.

/// The shortest interval `trim_idle` judges idleness over: a call sooner than this after
/// the previous one that counted (back to back, or two callers at once) releases nothing
/// and leaves the interval running, instead of finding every cache idle in an interval
/// of microseconds. (None under loom, whose models make their calls back to back.)
#[cfg(not(proxalloc_loom))]
pub(crate) const MIN_IDLE_INTERVAL: std::time::Duration = std::time::Duration::from_millis(1);
#[cfg(proxalloc_loom)]
pub(crate) const MIN_IDLE_INTERVAL: std::time::Duration = std::time::Duration::ZERO;

/// [`MIN_IDLE_INTERVAL`], or in the crate's tests this thread's override of it (so that
/// a test of a call too soon depends on no clock: under Miri, or on a loaded machine,
/// two calls in a row may be milliseconds apart).
pub(crate) fn min_idle_interval() -> std::time::Duration {
    #[cfg(all(test, not(proxalloc_loom)))]
    if let Some(d) = MIN_IDLE_INTERVAL_OVERRIDE.with(std::cell::Cell::get) {
        return d;
    }
    MIN_IDLE_INTERVAL
}

#[cfg(all(test, not(proxalloc_loom)))]
std::thread_local! {
    /// This thread's override of [`MIN_IDLE_INTERVAL`] (see [`min_idle_interval`]).
    pub(crate) static MIN_IDLE_INTERVAL_OVERRIDE: std::cell::Cell<Option<std::time::Duration>> =
        const { std::cell::Cell::new(None) };
}

/// What `trim_idle` found of one allocator's interval.
pub(crate) enum IdleInterval {
    /// Shorter than [`MIN_IDLE_INTERVAL`]: nothing done.
    TooShort,
    /// Judged: the objects of idle caches' stashes released, and whether the whole
    /// engine made no operation in it.
    Ended { released: usize, engine_idle: bool },
}

/// What one observer last saw of something's activity: its operations (allocations
/// plus frees), wrapping and kept to 32 bits so that a thread cache holds one in 4
/// bytes. An interval is idle when the count did not move. The idle collector keeps one
/// in each thread cache, `trim_idle` one for each registered cache and, with a time
/// ([`IdleWatch`]), one for each allocator: one idea, one type. (An interval of exactly
/// 2^32 operations looks idle; nothing is lost then, the cache only gives back early.)
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Seen(u32);

impl Seen {
    /// A look at `ops` operations.
    pub(crate) const fn at(ops: u64) -> Self {
        Seen(ops as u32)
    }
}

/// One `trim_idle` interval of something that counts its operations (an engine, all
/// its caches together; a block source's large blocks): its count and when, at the
/// previous call that counted.
#[derive(Debug, Default)]
pub(crate) struct IdleWatch(Option<(Seen, std::time::Instant)>);

impl IdleWatch {
    /// Whether a call now would come sooner than the minimum interval after the previous
    /// one that counted (see [`MIN_IDLE_INTERVAL`]).
    pub(crate) fn too_soon(&self) -> bool {
        self.0
            .is_some_and(|(_, at)| at.elapsed() < min_idle_interval())
    }

    /// Ends the interval at `ops` operations and starts the next: whether none happened
    /// in it (false for the first).
    pub(crate) fn end(&mut self, ops: u64) -> bool {
        let now = Seen::at(ops);
        let idle = self.0.is_some_and(|(before, _)| before == now);
        self.0 = Some((now, std::time::Instant::now()));
        idle
    }
}
