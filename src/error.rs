//! The crate's one error type, returned by class allocators and pools alike.

use std::fmt;

/// Memory could not be had: the backing allocator failed to supply an object (or a
/// [`Config::max_live`](crate::Config::max_live) cap refused one), or a pool's block
/// source failed to supply a block.
///
/// ```
/// use proxalloc::{AllocError, ClassAllocator, Config};
/// static NONE: ClassAllocator<u32> =
///     ClassAllocator::with_config("doc-class-alloc-error", Config::new().max_live(0));
/// let err = NONE.try_alloc(1).unwrap_err();
/// assert_eq!(err, AllocError);
/// assert_eq!(err.to_string(), "memory allocation failed");
/// let _: &dyn std::error::Error = &err;
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct AllocError;

impl fmt::Display for AllocError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("memory allocation failed")
    }
}

impl std::error::Error for AllocError {}
