//! The strong accounting check for integration tests. Test files include it with
//! `#[path = "common/books.rs"] mod books;`.

use proxalloc::ClassAllocator;

/// Nothing lost inside the allocator: `is_consistent` cannot see an object dropped in a
/// spill, flush or trim (it would count as cached), so at a quiescent point (every other
/// thread joined, its cache flushed at exit) trim everything and check that what is still
/// reserved from the backing allocator is exactly what is live, and what is live is what
/// the test still holds.
pub fn assert_nothing_lost<T>(a: &ClassAllocator<T>, still_held: u64) {
    a.trim();
    let s = a.stats();
    assert!(s.is_consistent(), "{s}");
    assert_eq!(s.live, still_held, "{s}");
    assert_eq!(
        s.reserved_objects(),
        s.live,
        "objects lost inside the allocator: {s}"
    );
}
