use super::*;

/// The fast paths touch the owned part and the `allocs`/`frees` counters: one line.
/// A cache is a power of two in size, for the table's masked lookup: two lines in
/// release builds, four in debug ones (aligned to 128 for that).
#[test]
fn fast_path_fields_share_one_cache_line() {
    let c = ThreadCache::new(super::super::ids::EMPTY);
    let base = std::ptr::addr_of!(c) as usize;
    let frees_end = std::ptr::addr_of!(c.counters.frees) as usize + 8;
    assert!(std::mem::align_of::<ThreadCache>() >= 64);
    assert!(std::mem::size_of::<ThreadCache>().is_power_of_two());
    #[cfg(not(debug_assertions))]
    assert_eq!(std::mem::size_of::<ThreadCache>(), 128);
    assert!(
        frees_end - base <= 64,
        "counters end at byte {}",
        frees_end - base
    );
}
