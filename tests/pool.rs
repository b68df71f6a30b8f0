//! APR-style pools: allocation, clear, the block source's caching and budget, subpools,
//! cleanups, PoolVec, the writer, and the allocator_api2 integration.

use std::alloc::Layout;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::{Arc, Mutex};

use proxalloc::{pformat, BlockSource, Pool, PoolVec, BLOCK_CLASSES};

/// Reserved (obtained from the system, not returned) blocks of every class of `src`.
fn reserved_blocks(src: &BlockSource) -> u64 {
    src.stats().iter().map(|s| s.reserved_objects()).sum()
}

fn backing_allocs(src: &BlockSource) -> u64 {
    src.stats().iter().map(|s| s.backing_allocs).sum()
}

#[test]
fn values_survive_until_clear_and_stats_add_up() {
    let src = BlockSource::new(1 << 20);
    let mut pool = Pool::with_source(&src);
    assert_eq!(pool.stats().blocks, 0, "no memory until first use");
    let a = pool.alloc(7u64);
    let s = pool.alloc_str("hello");
    let v = pool.alloc_slice_copy(&[1u16, 2, 3]);
    let w = pool.alloc_slice_fill_with(4, |i| i * 10);
    *a += 1;
    s.make_ascii_uppercase();
    assert_eq!(
        (*a, &*s, &*v, &*w),
        (8, "HELLO", &[1u16, 2, 3][..], &[0usize, 10, 20, 30][..])
    );
    let st = pool.stats();
    assert_eq!((st.blocks, st.retained_bytes), (1, BLOCK_CLASSES[0]));
    assert!(st.used_bytes >= 8 + 5 + 6 + 32, "{st:?}");
    pool.clear();
    let st = pool.stats();
    assert_eq!(
        (st.used_bytes, st.blocks),
        (0, 1),
        "clear keeps the first block"
    );
    assert!(st.high_water >= 51);
}

#[test]
fn alignment_is_honoured() {
    let pool = Pool::new();
    for align in [1usize, 2, 8, 16, 64, 256, 4096] {
        let _ = pool.alloc(1u8);
        let p = pool.alloc_layout(Layout::from_size_align(24, align).unwrap());
        assert_eq!(p.as_ptr() as usize % align, 0, "align {align}");
    }
    #[repr(align(128))]
    struct Wide(u8);
    let w = pool.alloc(Wide(3));
    assert_eq!((w as *mut Wide as usize) % 128, 0);
    assert_eq!(w.0, 3);
}

#[test]
fn a_warm_pool_makes_no_system_allocation() {
    let src = BlockSource::new(1 << 20);
    let run = || {
        for _ in 0..if cfg!(miri) { 5 } else { 200 } {
            let mut pool = Pool::with_source(&src);
            for i in 0..2000u64 {
                let _ = pool.alloc(i);
            }
            pool.clear();
            let _ = pool.alloc_str("after clear");
        }
    };
    run();
    let before = backing_allocs(&src);
    run();
    assert_eq!(
        backing_allocs(&src),
        before,
        "blocks came from the thread cache and depot"
    );
}

#[test]
fn retained_block_with_room_is_probed_before_the_source() {
    let src = BlockSource::new(1 << 20);
    let pool = Pool::with_source(&src);
    let _ = pool.alloc_layout(Layout::from_size_align(100, 8).unwrap()); // first block: 8 KiB
    let _ = pool.alloc_layout(Layout::from_size_align(9000, 8).unwrap()); // new 16 KiB block
    assert_eq!(pool.stats().blocks, 2);
    // The 16 KiB block is active with ~7 KiB free; the first block has ~8 KiB free.
    let _ = pool.alloc_layout(Layout::from_size_align(7500, 8).unwrap());
    assert_eq!(pool.stats().blocks, 2, "the retained first block served it");
    // Left: ~500 bytes in the first block, ~7.3 KiB in the 16 KiB one.
    let _ = pool.alloc_layout(Layout::from_size_align(7000, 8).unwrap());
    assert_eq!(pool.stats().blocks, 2, "the 16 KiB block, probed back");
    let _ = pool.alloc_layout(Layout::from_size_align(2000, 8).unwrap());
    assert_eq!(pool.stats().blocks, 3, "nothing had room: a new block");
}

#[test]
fn large_requests_get_their_own_block_returned_on_clear() {
    let src = BlockSource::new(0);
    let mut pool = Pool::with_source(&src);
    let _ = pool.alloc(1u8);
    let big = pool.alloc_slice_fill_with(200_000, |i| i as u8);
    assert_eq!(big[199_999], (199_999 % 256) as u8);
    let st = pool.stats();
    assert_eq!(st.blocks, 2);
    assert!(st.retained_bytes >= 200_000 + BLOCK_CLASSES[0]);
    pool.clear();
    assert_eq!(pool.stats().blocks, 1);
    let large = &src.stats()[4];
    assert_eq!(
        large.reserved_objects(),
        0,
        "max_free 0: the large block went back: {large}"
    );
    drop(pool);
    src.trim();
    assert_eq!(reserved_blocks(&src), 0);
}

/// A cached large block serves a request of at least half its size (APR trunk's rule),
/// never a smaller one: a small pool does not pin a big block.
#[test]
fn a_cached_large_block_serves_only_requests_of_at_least_half_its_size() {
    let src = BlockSource::new(1 << 20);
    let big = src.alloc_dedicated(400 << 10).unwrap();
    // SAFETY: from `src`, not used again.
    unsafe { src.free(big) };
    let small = src.alloc_dedicated(196 << 10).unwrap();
    assert_ne!(small.ptr, big.ptr, "a 400 KiB block for a 196 KiB request");
    assert_eq!(small.size, 196 << 10);
    let half = src.alloc_dedicated(200 << 10).unwrap();
    assert_eq!(
        (half.ptr, half.size),
        (big.ptr, big.size),
        "exactly half: reused"
    );
    let s = src.source_stats();
    assert_eq!(
        (s.large_live_blocks, s.large_cached_blocks),
        (2, 0),
        "{s:?}"
    );
    for b in [small, half] {
        // SAFETY: from `src`, not used again.
        unsafe { src.free(b) };
    }
    assert_eq!(src.trim(), 596 << 10);
}

/// `release_thread_cache` hands this thread's cached blocks of every class to the
/// depots, the largest class's too.
#[test]
fn release_thread_cache_empties_every_block_classs_thread_cache() {
    let src = BlockSource::new(1 << 20);
    let blocks: Vec<_> = BLOCK_CLASSES
        .iter()
        .map(|&size| src.alloc(size).unwrap())
        .collect();
    for b in blocks {
        // SAFETY: from `src`, not used again.
        unsafe { src.free(b) };
    }
    let cached = |s: &proxalloc::Stats| (s.cached_in_threads, s.cached_in_depot);
    assert!(src.stats()[..4].iter().all(|s| cached(s) == (1, 0)));
    src.release_thread_cache();
    for s in &src.stats()[..4] {
        assert_eq!(cached(s), (0, 1), "{s}");
    }
    assert_eq!(src.cached_bytes(), BLOCK_CLASSES.iter().sum::<usize>());
}

#[test]
#[cfg_attr(miri, ignore = "Miri's allocator grants any size")]
fn try_alloc_layout_reports_failure() {
    let pool = Pool::new();
    let huge = Layout::from_size_align(1 << 46, 8).unwrap();
    assert!(pool.try_alloc_layout(huge).is_err());
    assert_eq!(*pool.alloc(5u8), 5, "the pool still works");
}

#[test]
fn cleanups_and_owned_drops_run_lifo_and_survive_panics() {
    let log = Arc::new(Mutex::new(Vec::new()));
    struct Noisy(&'static str, Arc<Mutex<Vec<&'static str>>>);
    impl Drop for Noisy {
        fn drop(&mut self) {
            self.1.lock().unwrap().push(self.0);
            if self.0 == "bomb" {
                panic!("bomb");
            }
        }
    }
    let mut pool = Pool::new();
    let l = log.clone();
    pool.on_clear(move || l.lock().unwrap().push("cleanup-1"));
    pool.alloc_owned(Noisy("owned-2", log.clone()));
    pool.alloc_owned(Noisy("bomb", log.clone()));
    let l = log.clone();
    let key = pool.on_clear(move || l.lock().unwrap().push("cancelled"));
    let l = log.clone();
    pool.on_clear(move || l.lock().unwrap().push("cleanup-4"));
    pool.cancel(key);
    assert_eq!(pool.stats().cleanups, 4);
    let r = catch_unwind(AssertUnwindSafe(|| pool.clear()));
    assert!(r.is_err(), "the destructor's panic continues after clear");
    assert_eq!(
        *log.lock().unwrap(),
        ["cleanup-4", "bomb", "owned-2", "cleanup-1"]
    );
    let st = pool.stats();
    assert_eq!((st.cleanups, st.used_bytes, st.blocks), (0, 0, 1), "{st:?}");
    pool.alloc_owned(Noisy("after", log.clone()));
    drop(pool);
    assert_eq!(
        log.lock().unwrap().last(),
        Some(&"after"),
        "drop runs cleanups too"
    );
}

#[test]
#[should_panic(expected = "cleanup key of another pool")]
fn cancelling_another_pools_cleanup_panics() {
    let a = Pool::new();
    let b = Pool::new();
    let key = a.on_clear(|| {});
    b.cancel(key);
}

#[test]
fn subpools_clear_on_their_own_and_children_clean_up_first() {
    let log = Arc::new(Mutex::new(Vec::new()));
    let mut parent = Pool::new();
    let l = log.clone();
    parent.on_clear(move || l.lock().unwrap().push("parent"));
    {
        let mut child = parent.subpool();
        let l = log.clone();
        child.on_clear(move || l.lock().unwrap().push("child"));
        let x = child.alloc(1u32);
        assert_eq!(*x, 1);
        child.clear();
        assert_eq!(child.stats().used_bytes, 0);
        let l = log.clone();
        child.on_clear(move || l.lock().unwrap().push("child-2"));
        let y = parent.alloc(2u32); // the parent can still allocate
        assert_eq!(*y, 2);
    }
    parent.clear();
    assert_eq!(*log.lock().unwrap(), ["child", "child-2", "parent"]);
    let sum = parent.scope(|p| p.alloc_slice_fill_with(10, |i| i).iter().sum::<usize>());
    assert_eq!(sum, 45);
}

#[test]
fn iterpool_reuses_its_block() {
    let src = BlockSource::new(1 << 20);
    let pool = Pool::with_source(&src);
    let mut it = pool.subpool();
    let _ = it.alloc(0u8);
    let before = backing_allocs(&src);
    for i in 0..if cfg!(miri) { 20 } else { 1000u64 } {
        it.clear();
        let v = it.alloc_slice_fill_with(500, |j| i + j as u64);
        assert_eq!(v[499], i + 499);
        assert_eq!(it.stats().blocks, 1);
    }
    assert_eq!(backing_allocs(&src), before);
}

#[test]
fn pool_vec_grows_in_place_while_last_and_copies_otherwise() {
    let pool = Pool::new();
    let mut v = PoolVec::new_in(&pool);
    v.push(0u64);
    let start = v.as_ptr();
    for i in 1..500 {
        v.push(i);
    }
    assert_eq!(v.as_ptr(), start, "grew in place");
    let _other = pool.alloc(1u64);
    for i in 500..600 {
        v.push(i);
    }
    assert_ne!(
        v.as_ptr(),
        start,
        "copied once another allocation followed it"
    );
    assert!(v.iter().copied().eq(0..600));
    assert_eq!(v.pop(), Some(599));
    let s = v.leak();
    assert_eq!(s.len(), 599);

    let drops = Arc::new(Mutex::new(0));
    struct D(Arc<Mutex<i32>>);
    impl Drop for D {
        fn drop(&mut self) {
            *self.0.lock().unwrap() += 1;
        }
    }
    let mut w = PoolVec::with_capacity_in(2, &pool);
    w.extend((0..10).map(|_| D(drops.clone())));
    drop(w);
    assert_eq!(
        *drops.lock().unwrap(),
        10,
        "dropping the vector drops its elements"
    );
}

#[test]
fn writer_coalesces_small_writes_and_formats() {
    use std::io::Write;
    let pool = Pool::new();
    let mut w = pool.writer();
    for i in 0..1000 {
        write!(w, "{}", i % 10).unwrap();
        w.write_all(b",").unwrap();
    }
    let before = pool.stats().used_bytes;
    let out = w.finish();
    assert_eq!(out.len(), 2000);
    assert!(out.starts_with(b"0,1,2,") && out.ends_with(b"8,9,"));
    assert!(pool.stats().used_bytes <= before, "unused room went back");
    let s = pformat!(pool, "{}-{:04}", "id", 42);
    assert_eq!(s, "id-0042");
    assert_eq!(pformat!(pool, "plain"), "plain");
}

#[test]
fn allocator_api2_collections_work_in_a_pool() {
    let pool = Pool::new();
    let mut v: allocator_api2::vec::Vec<u32, &Pool> = allocator_api2::vec::Vec::new_in(&pool);
    for i in 0..1000 {
        v.push(i);
    }
    assert_eq!(v.iter().map(|&x| x as u64).sum::<u64>(), 499_500);
    let mut m = hashbrown::HashMap::new_in(&pool);
    for i in 0..1000u32 {
        m.insert(i, i * 2);
    }
    assert_eq!(m[&500], 1000);
    drop(m);
    drop(v);
}

#[test]
fn max_free_is_honoured_exactly() {
    let src = BlockSource::new(5 * BLOCK_CLASSES[0]);
    std::thread::scope(|s| {
        s.spawn(|| {
            let pools: Vec<_> = (0..40)
                .map(|_| {
                    let p = Pool::with_source(&src);
                    let _ = p.alloc(1u8);
                    p
                })
                .collect();
            drop(pools);
            src.release_thread_cache();
        });
    });
    assert!(src.cached_bytes() <= src.max_free());
    assert_eq!(
        src.cached_bytes(),
        5 * BLOCK_CLASSES[0],
        "filled exactly to the budget"
    );
    let s = &src.stats()[0];
    assert_eq!(
        s.reserved_objects(),
        5,
        "the rest went back to the system: {s}"
    );
    assert_eq!(src.trim(), 5 * BLOCK_CLASSES[0]);
    assert_eq!(reserved_blocks(&src), 0);
}

#[test]
fn pools_in_many_threads_return_every_block() {
    let src = BlockSource::new(512 << 10);
    let (tx, rx) = std::sync::mpsc::channel::<Pool<'_>>();
    std::thread::scope(|s| {
        for t in 0..if cfg!(miri) { 3 } else { 8u64 } {
            let tx = tx.clone();
            let src = &src;
            s.spawn(move || {
                let rounds = if cfg!(miri) { 8 } else { 200 };
                for round in 0..rounds {
                    let mut pool = Pool::with_source(src);
                    let mut sub = pool.subpool();
                    let n = ((t * 31 + round * 17) % 3000) as usize;
                    let v = sub.alloc_slice_fill_with(n, |i| i as u64 ^ t);
                    assert!(v.iter().enumerate().all(|(i, &x)| x == i as u64 ^ t));
                    sub.clear();
                    drop(sub);
                    let _ = pool.alloc_str(&"x".repeat((round % 100_000) as usize));
                    if round % 7 == 0 {
                        // A large block.
                        let _ = pool.alloc_slice_fill_with(20_000, |i| i as u64);
                    }
                    if round % 3 == 0 {
                        // Dropped on another thread than the one that took its blocks.
                        tx.send(pool).unwrap();
                    } else {
                        pool.clear();
                    }
                }
                src.release_thread_cache();
            });
        }
        drop(tx);
        s.spawn(|| {
            for pool in rx {
                drop(pool);
            }
            src.release_thread_cache();
        });
    });
    assert!(src.cached_bytes() <= src.max_free());
    src.trim();
    for s in src.stats() {
        assert_eq!(s.live, 0, "{s}");
        assert_eq!(s.reserved_objects(), 0, "a block was not returned: {s}");
    }
}

#[test]
fn debug_pools_give_each_allocation_its_own_block() {
    let mut pool = Pool::new_debug();
    let a = pool.alloc(1u64) as *mut u64 as usize;
    let b = pool.alloc(2u64) as *mut u64 as usize;
    assert!(a.abs_diff(b) >= 16);
    let mut v = PoolVec::new_in(&pool);
    v.extend(0..100u32);
    assert_eq!(v.len(), 100);
    drop(v);
    assert_eq!(pool.stats().blocks, 0, "no blocks from the source");
    pool.clear();
    assert_eq!(pool.stats().used_bytes, 0);
}

/// A debug pool's subpools and scopes are debug pools too: their allocations are heap
/// blocks of their own, none from the source.
#[test]
fn subpools_of_a_debug_pool_are_debug_pools() {
    let pool = Pool::new_debug();
    let sub = pool.subpool();
    let _ = sub.alloc(1u64);
    assert_eq!(
        sub.stats().blocks,
        0,
        "a subpool took a block from the source"
    );
    let blocks = pool.scope(|p| {
        let _ = p.alloc(2u64);
        p.stats().blocks
    });
    assert_eq!(blocks, 0, "a scope took a block from the source");
}

/// allocator-api2 0.4's collections take `&Pool` too (feature `allocator-api2-04`), next
/// to 0.2's in the same pool: growth in place while last, a copy otherwise, the memory
/// back on drop.
#[cfg(feature = "allocator-api2-04")]
#[test]
fn allocator_api2_04_collections_work_in_a_pool() {
    use proxalloc::allocator_api2_04::boxed::Box as Box04;
    use proxalloc::allocator_api2_04::vec::Vec as Vec04;

    let src = BlockSource::new(1 << 20);
    let pool = Pool::with_source(&src);
    let mut v: Vec04<u64, &Pool> = Vec04::new_in(&pool);
    v.push(0);
    let start = v.as_ptr();
    v.extend(1..500);
    assert_eq!(v.as_ptr(), start, "grew in place while last");
    let mut old: PoolVec<'_, '_, u64> = PoolVec::new_in(&pool);
    old.extend(0..10);
    v.extend(500..600);
    assert_ne!(
        v.as_ptr(),
        start,
        "copied once another allocation followed it"
    );
    assert!(v.iter().copied().eq(0..600));
    assert!(old.iter().copied().eq(0..10));
    v.truncate(3);
    v.shrink_to_fit();
    assert_eq!((v.capacity(), &v[..]), (3, &[0, 1, 2][..]));
    let b = Box04::new_in([7u8; 100], &pool);
    assert_eq!(b[99], 7);
    let used = pool.stats().used_bytes;
    drop(b);
    assert!(
        pool.stats().used_bytes < used,
        "the last allocation went back on drop"
    );
}

/// Alignments past a block (up to 2^40 for a zero-sized request) and sizes around the
/// point where a request gets a block of its own: every pointer aligned, the books sane,
/// an impossible layout an error, and nothing left live after the pool.
#[test]
#[cfg_attr(miri, ignore)] // megabyte-aligned blocks; the arithmetic is the same natively
fn alignments_past_a_block_and_sizes_at_the_dedicated_edge() {
    let source = BlockSource::new(1 << 20);
    let mut pool = Pool::with_source(&source);
    for round in 0..3u8 {
        for (size, align) in [
            (8, 1 << 17),
            (1, 1 << 20),
            (0, 1 << 40),
            (70_000, 4096),
            (65_472, 8),
            (65_473, 8),
            (3, 32 << 10),
            (1, 64 << 10),
        ] {
            let layout = Layout::from_size_align(size, align).unwrap();
            let p = pool.try_alloc_layout(layout).unwrap();
            assert_eq!(p.as_ptr() as usize % align, 0, "size {size}, align {align}");
            // SAFETY: `size` bytes handed out by the pool.
            unsafe { p.as_ptr().write_bytes(round, size) };
            let s = pool.stats();
            assert!(s.used_bytes <= s.retained_bytes, "{s:?}");
        }
        let impossible = Layout::from_size_align(isize::MAX as usize / 2, 1 << 30).unwrap();
        assert!(pool.try_alloc_layout(impossible).is_err());
        pool.clear();
    }
    drop(pool);
    source.release_thread_cache();
    assert_eq!(source.stats().iter().map(|s| s.live).sum::<u64>(), 0);
}
