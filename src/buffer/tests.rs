//! Unit tests of the buffer classes (the public API's tests are in tests/buffers.rs).

use super::*;

#[test]
fn class_of_picks_the_smallest_class_that_holds_the_request() {
    for (i, &size) in BUFFER_CLASSES.iter().enumerate() {
        assert_eq!(class_of(size), Some(i), "exactly {size}");
        if i > 0 {
            assert_eq!(
                class_of(BUFFER_CLASSES[i - 1] + 1),
                Some(i),
                "just above the class below {size}"
            );
        }
    }
    assert_eq!(class_of(1), Some(0));
    assert_eq!(class_of(0), Some(0));
    assert_eq!(class_of((64 << 10) + 1), None);
    assert_eq!(class_of(usize::MAX), None);
}

/// A frozen buffer is three words, so that `Bytes::from_owner`'s box (a count and the
/// owner) is 32 bytes, the global allocators' 32-byte class, not the 64-byte one a whole
/// `PooledBuf` needs (see `buf::Frozen`).
#[test]
#[cfg(target_pointer_width = "64")]
fn a_frozen_buffer_is_three_words() {
    assert_eq!(
        std::mem::size_of::<buf::Frozen>(),
        3 * std::mem::size_of::<usize>()
    );
}
