use super::lookup::{cache_start, CACHE_BYTES};
use super::*;

/// Every allocator's offset finds its own cache, and any other offset some cache's
/// start inside the table (the lookup reads there before it compares instances).
#[test]
fn any_offset_lands_on_a_cache_and_an_allocators_on_its_own() {
    let table = INLINE_CACHES * CACHE_BYTES;
    for index in 0..INLINE_CACHES {
        let own = inline_offset(index).unwrap() as usize;
        assert_eq!(own, index * CACHE_BYTES);
        assert_eq!(cache_start(own), Some(own));
    }
    assert_eq!(inline_offset(INLINE_CACHES), None);
    for offset in [
        1,
        CACHE_BYTES - 1,
        table,
        table + CACHE_BYTES,
        u32::MAX as usize,
    ] {
        if let Some(start) = cache_start(offset) {
            assert!(
                start < table && start % CACHE_BYTES == 0,
                "{offset} -> {start}"
            );
        }
    }
    // No cache has an instance no engine has, whatever the offset.
    for offset in [0, 3 * CACHE_BYTES + 5, table + 7, usize::MAX] {
        assert!(lookup_fast(offset, u64::MAX).is_none());
    }
}
