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
/// owner) is 32 bytes, the global allocators' 32-byte class, not the 48-byte one a whole
/// `PooledBuf` needs (see `buf::Frozen`).
#[test]
#[cfg(target_pointer_width = "64")]
fn a_frozen_buffer_is_three_words() {
    assert_eq!(
        std::mem::size_of::<buf::Frozen>(),
        3 * std::mem::size_of::<usize>()
    );
}

/// A buffer is four words (pointer, capacity, length, and a source that carries the
/// leak tracker's bit), so a move of it copies less (on 64-bit targets two 16-byte
/// halves, not three; see `buf::PooledBuf`).
#[test]
fn a_pooled_buffer_is_four_words() {
    assert_eq!(
        std::mem::size_of::<buf::PooledBuf>(),
        4 * std::mem::size_of::<usize>()
    );
}

/// A buffer freezes into the three-word owner while its length and capacity fit in 32
/// bits, and whole above (a capacity of 4 GiB truncated to 32 bits would free the slot
/// as a 0-byte class buffer). The buffers here are never dropped: their memory is not
/// real.
#[test]
fn a_buffer_of_4_gib_or_more_is_frozen_whole() {
    static BUFS: BufferAllocator = BufferAllocator::new();
    let fake = |cap: usize| {
        buf::PooledBuf::from_parts(
            buf::Parts {
                ptr: std::ptr::NonNull::dangling(),
                cap,
                tracked: false,
            },
            buf::Source::Static(&BUFS),
        )
    };
    match buf::Frozen::new(fake(u32::MAX as usize)) {
        Ok(small) => std::mem::forget(small),
        Err(b) => {
            std::mem::forget(b);
            panic!("a capacity of u32::MAX fits the three-word owner");
        }
    }
    #[cfg(target_pointer_width = "64")]
    match buf::Frozen::new(fake(1 << 32)) {
        Ok(small) => {
            std::mem::forget(small);
            panic!("a capacity of 4 GiB was truncated into the three-word owner");
        }
        Err(b) => std::mem::forget(b),
    }
}
