use super::ClassAllocator;

/// The tests here that make dozens of allocators hold it: table indices are
/// process-wide and reused last freed first, so one test's allocators (the other's
/// fillers take every free inline index) decide which indices the other gets.
static INDICES: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn indices() -> std::sync::MutexGuard<'static, ()> {
    INDICES.lock().unwrap_or_else(|e| e.into_inner())
}

/// Per-thread caches by name: these tests check the thread table's lookups, which a
/// default build's per-CPU allocators do not use on a thread with an rseq area.
fn thread_caches() -> crate::Config {
    crate::Config::new().mode(crate::CacheMode::ThreadCaches)
}

/// The fast paths find the cache through the hints alone: once set, they read as the
/// engine's own numbers (a wrong offset or a dirty upper half would send every
/// operation to the slow path, which no other test notices), an inline index is
/// served by the inline fast path (a wrong mask would miss some), and a boxed one by
/// the boxed lookup only.
#[test]
fn the_fast_paths_read_the_engines_numbers_from_the_hints() {
    use crate::core::table::{hint_offset, inline_offset};
    let _indices = indices();
    let all = allocators_of_every_index_kind("hints-read");
    for a in &all {
        // An object in this thread's cache, again: making hundreds of allocators (while
        // other tests hold the inline indices) takes enough slow paths for idle passes,
        // which release the magazines of the caches not used since the last one.
        drop(a.alloc(1));
        let e = a.engine();
        let inline = inline_offset(e.index() as usize);
        let offset = hint_offset(e.index() as usize).expect("a small index");
        assert!(inline.is_none_or(|o| o == offset));
        assert_eq!(
            a.hints.offset_and_instance(),
            (offset as usize, e.instance())
        );
        if inline.is_some() {
            // The fast path serves this thread from its cache.
            let p = a
                .hints
                .thread_alloc()
                .expect("the object just freed, from the fast path");
            // SAFETY: the object was just taken from this allocator and is unused.
            assert!(
                unsafe { a.hints.thread_free(p) },
                "freed through the fast path"
            );
            assert!(a.hints.boxed_alloc().is_none(), "an inline cache");
        } else {
            assert!(
                a.hints.thread_alloc().is_none(),
                "a boxed cache is not inline"
            );
            // The boxed lookup serves this thread from its cache.
            let p = a
                .hints
                .boxed_alloc()
                .expect("the object just freed, from the boxed lookup");
            // SAFETY: as above.
            assert!(
                unsafe { a.hints.boxed_free(p) },
                "freed through the boxed lookup"
            );
        }
    }
}

/// Per-thread allocators (named `name`) until one of each kind of table index is live:
/// inline, boxed with its address in thread-local storage, and boxed past those. Each
/// has made one allocation on this thread. The caller holds [`indices`].
fn allocators_of_every_index_kind(name: &'static str) -> Vec<ClassAllocator<u64>> {
    use crate::core::table::{inline_offset, DIRECT_BOXED, INLINE_CACHES};
    // Indices are dense and reused last freed first, so after other tests' allocators
    // the first ones made here may all be boxed.
    let mut all = Vec::new();
    let index = |a: &ClassAllocator<u64>| a.engine().index() as usize;
    let boxed = |a: &ClassAllocator<u64>| inline_offset(index(a)).is_none();
    let inline = |a: &ClassAllocator<u64>| !boxed(a);
    let far = |a: &ClassAllocator<u64>| index(a) >= INLINE_CACHES + DIRECT_BOXED;
    let direct = |a: &ClassAllocator<u64>| boxed(a) && !far(a);
    while all.len() < INLINE_CACHES + DIRECT_BOXED + 2
        || !all.iter().any(direct)
        || !all.iter().any(inline)
        || !all.iter().any(far)
    {
        assert!(all.len() < 4096, "no inline index came free");
        let a = ClassAllocator::<u64>::with_config(name, thread_caches());
        drop(a.alloc(1));
        all.push(a);
    }
    all
}

/// Once a thread's cache of an allocator holds an object, allocating and freeing through
/// `ClassAllocator` never leaves the fast paths (the inline one, or the miss path's
/// boxed lookup), whatever kind of index the allocator has. Everything still works
/// when a fast path misses (the slow path does the same job), so only a count shows
/// it: a miss path that forgets the boxed lookup sends every operation of an allocator
/// past the inline caches to the slow path.
#[test]
fn a_warm_cache_serves_the_front_end_without_a_slow_path() {
    use crate::class::raw::slow_entries;
    let _indices = indices();
    let all = allocators_of_every_index_kind("no-slow-path");
    for a in &all {
        // The object back in this thread's cache (making hundreds of allocators takes
        // idle passes, which may have released it).
        drop(a.alloc(0));
        let before = slow_entries::taken();
        for i in 0..8 {
            let b = a.alloc(i);
            assert_eq!(*b, i);
        }
        let s = a.stats();
        assert_eq!(
            slow_entries::taken() - before,
            0,
            "slow paths for an allocator of index {} ({} allocs)",
            a.engine().index(),
            s.allocs
        );
    }
}

/// A dropped allocator's index passes to the next one made. A thread that still holds
/// the old allocator's boxed cache (its magazines wait for that thread's next slow
/// path) must not serve the new allocator from it: the boxed lookup compares
/// instances, as the inline one does. (A seeded lookup that skips the compare pops the
/// old allocator's object: the new one's books miss the allocation.)
#[test]
fn a_reused_boxed_index_is_not_served_from_the_old_allocators_cache() {
    use crate::core::table::inline_offset;
    use std::sync::mpsc;
    let _indices = indices();
    let index = |a: &ClassAllocator<u64>| a.engine().index() as usize;
    // Allocators in use until a new one's index is boxed.
    let mut filler = Vec::new();
    let old = loop {
        let a = ClassAllocator::<u64>::with_config("reuse-old", thread_caches());
        drop(a.alloc(0));
        if inline_offset(index(&a)).is_none() {
            break a;
        }
        filler.push(a);
    };
    let old_index = index(&old);
    let old = std::sync::Arc::new(old);
    let (to_main, from_thread) = mpsc::channel();
    let (to_thread, from_main) = mpsc::channel::<std::sync::Arc<ClassAllocator<u64>>>();
    let held = std::sync::Arc::clone(&old);
    let thread = std::thread::spawn(move || {
        // Objects left in this thread's boxed cache of `old`.
        drop((0..3).map(|i| held.alloc(i)).collect::<Vec<_>>());
        drop(held);
        to_main.send(()).unwrap();
        let new = from_main.recv().unwrap();
        let b = new.alloc(7);
        assert_eq!(*b, 7);
        let s = new.stats();
        assert_eq!((s.allocs, s.live), (1, 1), "served from another cache: {s}");
    });
    from_thread.recv().unwrap();
    drop(old);
    // Indices are reused last freed first; another test may take this one first.
    let mut made = Vec::new();
    let new = loop {
        let a = ClassAllocator::<u64>::with_config("reuse-new", thread_caches());
        let _ = a.engine();
        if index(&a) == old_index || made.len() == 64 {
            break a;
        }
        made.push(a);
    };
    to_thread.send(std::sync::Arc::new(new)).unwrap();
    thread.join().unwrap();
}

/// A dropped allocator gives its table index back (`ids::release` in the shutdown),
/// so allocators made and dropped one after another keep reusing a few indices
/// (inline caches) instead of climbing into boxed ones. Other tests claim indices
/// meanwhile, so this counts distinct indices rather than expecting one.
#[test]
fn a_dropped_allocators_index_is_reused() {
    let _indices = indices();
    let rounds = if cfg!(miri) { 20 } else { 2000 };
    let mut seen = std::collections::HashSet::new();
    for i in 0..rounds {
        let a = ClassAllocator::<u64>::new("index-reuse");
        drop(a.alloc(i));
        seen.insert(a.engine().index());
    }
    assert!(
        seen.len() <= rounds as usize / 2,
        "{} distinct indices for {rounds} allocators made and dropped in turn",
        seen.len()
    );
}

/// An engine that loses the race to be published is shut down on the allocation's slow
/// path that made it, and must not ask glibc for memory back there (`malloc_trim` walks
/// the whole heap). With 1 MiB and more given to the system allocator since the last
/// request, a losing publication makes no request. (Another test's request between the
/// spill and the publication would only let a seeded bug through, never fail this;
/// `tests/system_trims.rs` checks the drops' requests exactly.)
#[test]
fn an_engine_that_loses_the_race_to_be_published_asks_no_one() {
    use crate::core::backing::OS_RELEASES;
    let _indices = indices(); // the losing engine claims an index for a moment
    let mine = || OS_RELEASES.with(|n| n.get());
    let a = ClassAllocator::<[u8; 1024]>::with_config(
        "class-lost-publication",
        crate::Config::new().depot_bytes(0),
    );
    drop((0..2000).map(|_| a.alloc([0; 1024])).collect::<Vec<_>>());
    let before = mine();
    let published: *const _ = a.engine();
    let kept: *const _ = a.init_engine(); // publishes a fresh engine, and loses
    assert_eq!(kept, published, "the first engine stays");
    assert_eq!(mine(), before, "no request on the allocation's path");
}
