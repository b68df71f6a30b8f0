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
