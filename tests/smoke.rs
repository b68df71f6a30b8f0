use proxalloc::ClassAllocator;

#[test]
fn alloc_free_cycle_counts() {
    let a = ClassAllocator::<[u64; 8]>::new("smoke");
    for round in 0..3 {
        let v: Vec<_> = (0..1000).map(|i| a.alloc([i; 8])).collect();
        for (i, h) in v.iter().enumerate() {
            assert_eq!(h[7], i as u64);
        }
        assert_eq!(a.stats().live, 1000, "round {round}");
        drop(v);
        assert_eq!(a.stats().live, 0);
    }
    let s = a.stats();
    assert_eq!(s.allocs, 3000);
    assert_eq!(s.live + s.cached_in_threads + s.cached_in_depot, s.reserved_objects());
    a.trim();
    let s = a.stats();
    assert_eq!(s.cached_in_depot, 0);
    assert_eq!(s.cached_in_threads, 0);
    assert_eq!(s.backing_allocs, s.backing_frees);
}
