use super::*;
use crate::core::stack::MAX_GENERATION_BITS;
use std::alloc::Layout;

fn depot(capacity: usize, budget_objects: usize) -> Depot {
    Depot::new(
        Backing::new(Layout::new::<u64>(), None),
        capacity,
        DepotBudget::Own(budget_objects * cached_bytes(8)),
        MAX_GENERATION_BITS,
    )
}

/// Hands `m` (owned) to the depot, finishing any eviction at once; says where its
/// objects went.
fn put<'d>(d: &'d Depot, m: &'d Magazine) -> &'static str {
    // SAFETY: owned by the caller, who gives it up.
    match unsafe { d.put(m) } {
        Put::Empty => "empty",
        Put::Cached => "cached",
        Put::Evicted(e) => {
            let partial = e.keeps_some();
            // SAFETY: from this depot.
            unsafe { d.evict(e) };
            if partial {
                "partial"
            } else {
                "overflowed"
            }
        }
    }
}

/// Fills a magazine from `depot` with fresh objects.
fn filled(depot: &Depot, n: usize) -> &Magazine {
    let mag = depot.take_empty().unwrap();
    // SAFETY: owned here.
    unsafe {
        mag.with_rounds(|r| {
            for i in 0..n {
                *r.slots.add(i) = depot.backing().alloc().unwrap().as_ptr();
            }
            r.len = n;
        })
    };
    mag
}

#[test]
fn budget_bounds_cached_objects_and_overflow_returns_to_backing() {
    let d = depot(4, 8);
    let puts: Vec<&str> = (0..3).map(|_| put(&d, filled(&d, 4))).collect();
    assert_eq!(puts, ["cached", "cached", "overflowed"]);
    assert_eq!(d.cached_objects(), 8);
    assert_eq!(d.backing().frees(), 4);
    let m = d.take_full().unwrap();
    assert_eq!(d.cached_objects(), 4);
    // SAFETY: owned.
    unsafe { d.release_objects(m) };
    assert_eq!(put(&d, m), "empty");
    assert_eq!(d.trim(), 4);
    assert_eq!(d.cached_objects(), 0);
    assert_eq!(d.backing().allocs(), d.backing().frees());
}

/// `trim_cold` releases the bottom of the full stack that no take reached since its
/// previous call, keeps what was pushed above, and starts the next interval there.
#[test]
fn trim_cold_releases_what_no_take_reached_since_the_last_call() {
    let d = depot(4, 100);
    let first: Vec<u32> = (0..5)
        .map(|_| {
            let m = filled(&d, 4);
            assert_eq!(put(&d, m), "cached");
            m.index
        })
        .collect();
    assert_eq!(
        d.trim_cold(),
        0,
        "a new depot's interval starts at 0 objects"
    );
    // Three taken (the low point: 2 magazines, 8 objects), two given back, one
    // of them partial.
    let taken: Vec<&Magazine> = (0..3).map(|_| d.take_full().unwrap()).collect();
    assert_eq!(put(&d, taken[0]), "cached");
    // SAFETY: owned; one object back to the backing allocator.
    unsafe {
        taken[1].with_rounds(|r| {
            r.len -= 1;
            d.backing().dealloc_all(&[*r.slots.add(r.len)]);
        })
    };
    assert_eq!(put(&d, taken[1]), "cached");
    assert_eq!(d.cached_objects(), 15);
    assert_eq!(d.trim_cold(), 8, "the two bottom magazines");
    assert_eq!(d.cached_objects(), 7);
    let kept: Vec<u32> = std::iter::from_fn(|| d.take_full().map(|m| m.index)).collect();
    assert_eq!(
        kept,
        [taken[1].index, taken[0].index],
        "the warm part, in order"
    );
    assert!(!kept.contains(&first[0]) && !kept.contains(&first[1]));
    for &i in kept.iter().rev() {
        // SAFETY: taken above, owned.
        assert_eq!(put(&d, unsafe { d.magazine(i) }), "cached");
    }
    // The interval started at 7 objects; the takes above went down to 0.
    assert_eq!(d.trim_cold(), 0);
    assert_eq!(d.trim_cold(), 7, "untouched for a whole interval");
    assert_eq!(d.cached_objects(), 0);
    // SAFETY: owned.
    unsafe { d.release_objects(taken[2]) };
    assert_eq!(put(&d, taken[2]), "empty");
    assert_eq!(d.backing().allocs(), d.backing().frees());
    // A full trim ends an interval at 0 too.
    assert_eq!(put(&d, filled(&d, 4)), "cached");
    d.trim();
    assert_eq!(put(&d, filled(&d, 4)), "cached");
    assert_eq!(d.trim_cold(), 0);
    d.trim();
}

#[test]
fn trim_releases_storage_and_magazines_are_reused() {
    let d = depot(2, 100);
    let a = filled(&d, 2);
    let ai = a.index;
    assert_eq!(put(&d, a), "cached");
    d.trim();
    let b = d.take_empty().unwrap();
    assert_eq!(b.index, ai, "the trimmed magazine is recycled");
    // SAFETY: owned.
    assert!(unsafe { b.with_rounds(|r| !r.slots.is_null()) });
    assert_eq!(put(&d, b), "empty");
}

#[test]
fn partial_spill_keeps_what_fits() {
    let d = depot(4, 6);
    assert_eq!(put(&d, filled(&d, 4)), "cached");
    assert_eq!(put(&d, filled(&d, 4)), "partial");
    assert_eq!(d.cached_objects(), 6);
    assert_eq!(d.backing().frees(), 2);
    assert_eq!(d.trim(), 6);
    assert_eq!(d.backing().allocs(), d.backing().frees());
}

#[test]
fn depots_sharing_a_budget_count_their_own_objects() {
    // Six objects' bytes between two depots (charged object bytes only, as a block
    // source's classes are): each depot counts its objects, the budget their bytes.
    let budget = Arc::new(ByteBudget::new(6 * 8));
    let shared = || {
        Depot::new(
            Backing::new(Layout::new::<u64>(), None),
            4,
            DepotBudget::Shared(budget.clone()),
            MAX_GENERATION_BITS,
        )
        .charging_object_bytes_only()
    };
    let (a, b) = (shared(), shared());
    assert_eq!(put(&a, filled(&a, 4)), "cached");
    assert_eq!(put(&b, filled(&b, 4)), "partial");
    assert_eq!((a.cached_objects(), b.cached_objects()), (4, 2));
    assert_eq!(budget.used(), 6 * 8);
    let m = a.take_full().unwrap();
    assert_eq!((a.cached_objects(), b.cached_objects()), (0, 2));
    assert_eq!(budget.used(), 2 * 8);
    // SAFETY: owned.
    unsafe { a.release_objects(m) };
    assert_eq!(put(&a, m), "empty");
    assert_eq!(a.trim() + b.trim(), 2);
    assert_eq!(
        (a.cached_objects(), b.cached_objects(), budget.used()),
        (0, 0, 0)
    );
}

#[test]
fn an_own_budget_counts_the_objects_it_holds() {
    // The count of an own budget's depot comes from its bytes: exact through
    // spills, a partial spill, refills and a trim.
    let d = depot(4, 10);
    assert_eq!(put(&d, filled(&d, 3)), "cached");
    assert_eq!(put(&d, filled(&d, 4)), "cached");
    assert_eq!(put(&d, filled(&d, 4)), "partial");
    assert_eq!(d.cached_objects(), 10);
    let m = d.take_full().unwrap();
    assert_eq!(d.cached_objects(), 7);
    // SAFETY: owned.
    unsafe { d.release_objects(m) };
    assert_eq!(put(&d, m), "empty");
    assert_eq!(d.trim(), 7);
    assert_eq!(d.cached_objects(), 0);
    assert_eq!(d.backing().allocs(), d.backing().frees());
}

#[test]
fn dropping_the_depot_releases_what_it_caches() {
    let d = depot(4, 100);
    assert_eq!(put(&d, filled(&d, 4)), "cached");
    let backing_frees_before = d.backing().frees();
    assert_eq!(backing_frees_before, 0);
    drop(d); // leak-checked under Miri
}

#[test]
fn concurrent_spill_and_refill_conserve_objects() {
    let d = depot(4, 1 << 20);
    let rounds = if cfg!(miri) { 20 } else { 2000 };
    let taken: Vec<Vec<usize>> = std::thread::scope(|s| {
        let producers: Vec<_> = (0..2)
            .map(|_| {
                s.spawn(|| {
                    for _ in 0..rounds {
                        assert_eq!(put(&d, filled(&d, 4)), "cached");
                    }
                })
            })
            .collect();
        let consumers: Vec<_> = (0..2)
            .map(|_| {
                s.spawn(|| {
                    let mut got = Vec::new();
                    for _ in 0..rounds {
                        if let Some(m) = d.take_full() {
                            // SAFETY: owned.
                            unsafe {
                                m.with_rounds(|r| {
                                    got.extend((0..r.len).map(|i| *r.slots.add(i) as usize));
                                });
                                d.release_objects(m);
                            }
                            assert_eq!(put(&d, m), "empty");
                        }
                    }
                    got
                })
            })
            .collect();
        producers.into_iter().for_each(|p| p.join().unwrap());
        consumers.into_iter().map(|c| c.join().unwrap()).collect()
    });
    let consumed: usize = taken.iter().map(Vec::len).sum();
    let trimmed = d.trim();
    assert_eq!(
        consumed + trimmed,
        2 * rounds * 4,
        "objects lost or duplicated"
    );
    assert_eq!(d.backing().allocs(), d.backing().frees());
    assert_eq!(d.backing().allocs(), (2 * rounds * 4) as u64);
}
