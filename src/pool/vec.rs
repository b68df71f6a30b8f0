//! [`PoolVec`]: a growable vector in pool memory.
//!
//! It is allocator-api2's `Vec` with `&Pool` as its allocator, not a vector of this
//! crate's own: that `Vec` is the standard library's code (every method and trait impl,
//! drop and panic handling that Miri and years of use have checked), and the pool's
//! allocator impl gives it what a pool vector is for: growth in place while the vector
//! is the pool's most recent allocation, and its memory back to the pool when it is
//! dropped as the most recent one.

use super::Pool;

/// A vector in pool memory: allocator-api2's [`Vec`](allocator_api2::vec::Vec) with
/// `&Pool` as its allocator, so it has all of `Vec`'s methods and traits (iteration by
/// value and by reference, `insert`, `remove`, `retain`, `drain`, `truncate`, `dedup`,
/// `Clone`, `PartialEq` with other vectors and slices, `Hash`, `Ord`, `Debug`,
/// `Extend`, ...).
///
/// While it is the pool's most recent allocation it grows in place (no copy); otherwise
/// growth copies it to a new allocation, and the old buffer stays in the pool until
/// [`Pool::clear`]. Dropping it drops its elements, and gives its memory back to the
/// pool if nothing was allocated after it. [`leak`](allocator_api2::vec::Vec::leak)
/// leaves the elements in the pool (never dropped) as a `&mut [T]` that lives as long as
/// the pool's borrow.
///
/// ```
/// use proxalloc::{Pool, PoolVec};
///
/// let pool = Pool::new();
/// let mut v = PoolVec::new_in(&pool);
/// for i in 0..100 {
///     v.push(i);
/// }
/// v.retain(|&x| x % 2 == 0);
/// v.insert(0, -1);
/// assert_eq!(v.remove(0), -1);
/// assert_eq!(v.iter().sum::<i32>(), 2450);
/// for x in &mut v {
///     *x += 1;
/// }
/// assert_eq!(v.drain(..3).collect::<Vec<_>>(), [1, 3, 5]);
/// assert_eq!(v.clone(), v);
/// let kept: &mut [i32] = v.leak(); // stays in the pool, never dropped
/// assert_eq!(kept.len(), 47);
/// ```
///
/// It holds a `&Pool`, which is not `Send` (a pool is not `Sync`), so it cannot be held
/// across an `.await` in a task that moves between threads (see "Pools in async code" in
/// the [`Pool`] docs).
/// The name is spelt with the crate's own re-export, [`crate::allocator_api2`] (0.2);
/// with the `allocator-api2-04` feature, allocator-api2 0.4's `Vec` takes `&Pool` too.
pub type PoolVec<'p, 's, T> = allocator_api2::vec::Vec<T, &'p Pool<'s>>;
