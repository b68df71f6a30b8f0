//! The buffers' accounting check for integration tests. Test files include it with
//! `#[path = "common/buffer_books.rs"] mod buffer_books;`.

use proxalloc::BufferStats;

/// Every buffer handed out came back: nothing live, and each class's books balance.
pub fn assert_all_back(s: &BufferStats) {
    for row in s.classes.iter().chain([&s.oversize]) {
        assert_eq!(row.allocs, row.frees, "{row:?}");
        assert_eq!(row.live, 0, "{row:?}");
    }
    assert_eq!(s.oversize_live_bytes, 0);
}
