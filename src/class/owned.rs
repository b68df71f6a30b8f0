//! Owned, `'static` handles for allocators built at run time: [`Owned<T>`] keeps its
//! allocator alive through an `Arc`, so it can move into `tokio::spawn` or a long-lived
//! struct.
//!
//! A handle from a `static` allocator (`ClassBox<'static, T>`) is already `'static` and
//! costs nothing extra; `Owned` is for allocators that are values. Its price is the
//! `Arc`: one reference-count increment when the object is allocated and one decrement
//! when it is freed (atomic read-modify-writes on the allocator's `Arc`, shared by every
//! thread that uses it), on top of the pair's fast paths.

use std::fmt;
use std::mem::ManuallyDrop;
use std::ops::{Deref, DerefMut};
use std::ptr::NonNull;
use std::sync::Arc;

use crate::class::{ClassAllocator, ClassBox};
use crate::error::AllocError;

/// An object owned through an `Arc` of its [`ClassAllocator`]: `'static`, `Send` when `T`
/// is, and dropping it runs `T`'s destructor and recycles the memory into the cache
/// nearest the dropping thread (its CPU's, or its own), like [`ClassBox`].
///
/// ```
/// use std::sync::Arc;
/// use proxalloc::{ClassAllocator, Owned};
///
/// let requests = Arc::new(ClassAllocator::<String>::new("requests"));
/// let r: Owned<String> = requests.alloc_arc("GET /".to_string());
/// let worker = std::thread::spawn(move || r.len()); // moves with its allocator
/// assert_eq!(worker.join().unwrap(), 5);
/// assert_eq!(requests.stats().live, 0);
/// ```
///
/// Like `ClassBox`, it is `Send` only when `T` is:
///
/// ```compile_fail
/// use std::{rc::Rc, sync::Arc};
/// use proxalloc::ClassAllocator;
/// let rcs = Arc::new(ClassAllocator::<Rc<u8>>::new("rcs"));
/// let h = rcs.alloc_arc(Rc::new(1));
/// std::thread::spawn(move || drop(h)); // error: `Rc<u8>` cannot be sent between threads
/// ```
pub struct Owned<T> {
    ptr: NonNull<T>,
    alloc: Arc<ClassAllocator<T>>,
}

// SAFETY: the handle owns its `T` exclusively (like `Box<T>`), and the allocator is
// `Send + Sync` for every `T` (it holds raw memory only).
unsafe impl<T: Send> Send for Owned<T> {}
// SAFETY: `&Owned<T>` only gives out `&T`.
unsafe impl<T: Sync> Sync for Owned<T> {}

impl<T> ClassAllocator<T> {
    /// Allocates an object holding `value`, owned through a clone of this `Arc` (see
    /// [`Owned`]).
    ///
    /// # Aborts
    /// If the backing allocator fails or a [`Config::max_live`](crate::Config::max_live)
    /// cap is reached, through [`std::alloc::handle_alloc_error`].
    ///
    /// ```
    /// use std::sync::Arc;
    /// use proxalloc::{ClassAllocator, Owned};
    /// let jobs = Arc::new(ClassAllocator::<Vec<u32>>::new("doc-owned-alloc-arc"));
    /// let job: Owned<Vec<u32>> = jobs.alloc_arc(vec![1, 2, 3]);
    /// assert_eq!(Arc::strong_count(&jobs), 2); // the handle holds the allocator
    /// let sum = std::thread::spawn(move || job.iter().sum::<u32>()).join().unwrap();
    /// assert_eq!(sum, 6);
    /// assert_eq!(Arc::strong_count(&jobs), 1);
    /// ```
    #[inline]
    #[must_use = "dropping the handle frees the object at once"]
    pub fn alloc_arc(self: &Arc<Self>, value: T) -> Owned<T> {
        let ptr = ClassBox::into_raw(self.alloc(value));
        Owned {
            ptr,
            alloc: Arc::clone(self),
        }
    }

    /// Like [`alloc_arc`](Self::alloc_arc), but returns an error (dropping `value`) if
    /// the backing allocator fails, or if a [`Config::max_live`](crate::Config::max_live)
    /// cap is reached.
    ///
    /// ```
    /// use std::sync::Arc;
    /// use proxalloc::{AllocError, ClassAllocator, Config};
    /// let conns = Arc::new(ClassAllocator::<u64>::with_config(
    ///     "doc-owned-try-alloc-arc",
    ///     Config::new().max_live(1),
    /// ));
    /// let c = conns.try_alloc_arc(1).expect("under the cap");
    /// assert_eq!(conns.try_alloc_arc(2).err(), Some(AllocError));
    /// drop(c);
    /// assert_eq!(*conns.try_alloc_arc(3).unwrap(), 3);
    /// ```
    #[inline]
    #[must_use = "dropping the result frees the object at once"]
    pub fn try_alloc_arc(self: &Arc<Self>, value: T) -> Result<Owned<T>, AllocError> {
        let ptr = ClassBox::into_raw(self.try_alloc(value)?);
        Ok(Owned {
            ptr,
            alloc: Arc::clone(self),
        })
    }
}

impl<T> Owned<T> {
    /// The allocator this object came from (an associated function: call it as
    /// `Owned::allocator(&handle)`).
    ///
    /// ```
    /// use std::sync::Arc;
    /// use proxalloc::{ClassAllocator, Owned};
    /// let names = Arc::new(ClassAllocator::<String>::new("doc-owned-allocator"));
    /// let n = names.alloc_arc("a".to_string());
    /// assert!(Arc::ptr_eq(Owned::allocator(&n), &names));
    /// assert_eq!(Owned::allocator(&n).stats().live, 1);
    /// ```
    pub fn allocator(this: &Self) -> &Arc<ClassAllocator<T>> {
        &this.alloc
    }

    /// Moves the value out and recycles the memory.
    ///
    /// ```
    /// use std::sync::Arc;
    /// use proxalloc::{ClassAllocator, Owned};
    /// let bodies = Arc::new(ClassAllocator::<Vec<u8>>::new("doc-owned-into-inner"));
    /// let body = bodies.alloc_arc(b"payload".to_vec());
    /// let v: Vec<u8> = Owned::into_inner(body);
    /// assert_eq!(v, b"payload");
    /// assert_eq!(bodies.stats().live, 0);
    /// assert_eq!(Arc::strong_count(&bodies), 1); // the handle's clone is gone too
    /// ```
    pub fn into_inner(this: Self) -> T {
        let this = ManuallyDrop::new(this);
        // SAFETY: the handle owns an initialised object of `alloc`; the handle is given
        // up here, and the allocator reference lives until the end of this call.
        let value = ClassBox::into_inner(unsafe { ClassBox::from_raw(&this.alloc, this.ptr) });
        // SAFETY: read once: the handle is never used or dropped again.
        drop(unsafe { std::ptr::read(&this.alloc) });
        value
    }
}

impl<T> Drop for Owned<T> {
    #[inline]
    fn drop(&mut self) {
        // SAFETY: the handle owns an initialised object of `alloc`, dropped and
        // recycled exactly once here; the `Arc` field drops after, so the allocator
        // outlives the free.
        drop(unsafe { ClassBox::from_raw(&*self.alloc, self.ptr) });
    }
}

impl<T> Deref for Owned<T> {
    type Target = T;
    #[inline]
    fn deref(&self) -> &T {
        // SAFETY: the handle owns an initialised value.
        unsafe { self.ptr.as_ref() }
    }
}

impl<T> DerefMut for Owned<T> {
    #[inline]
    fn deref_mut(&mut self) -> &mut T {
        // SAFETY: the handle owns an initialised value, exclusively.
        unsafe { self.ptr.as_mut() }
    }
}

impl<T> AsRef<T> for Owned<T> {
    fn as_ref(&self) -> &T {
        self
    }
}

impl<T> AsMut<T> for Owned<T> {
    fn as_mut(&mut self) -> &mut T {
        self
    }
}

impl<T: fmt::Debug> fmt::Debug for Owned<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&**self, f)
    }
}

impl<T: fmt::Display> fmt::Display for Owned<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&**self, f)
    }
}
