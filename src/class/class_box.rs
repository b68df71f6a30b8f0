//! [`ClassBox`], the owning handle of a [`ClassAllocator`]'s object, and its standard
//! trait implementations.

use std::borrow::{Borrow, BorrowMut};
use std::cmp::Ordering as CmpOrdering;
use std::fmt;
use std::hash::{Hash, Hasher};
use std::marker::PhantomData;
use std::mem::ManuallyDrop;
use std::ops::{Deref, DerefMut};
use std::ptr::NonNull;

use super::raw::FreeOnUnwind;
use super::ClassAllocator;

/// An object owned through a [`ClassAllocator`]: dropping it runs `T`'s destructor and
/// recycles the memory into the cache nearest the dropping thread (its CPU's, or its
/// own).
///
/// ```
/// use proxalloc::{ClassAllocator, ClassBox};
/// static NUMS: ClassAllocator<Vec<u32>> = ClassAllocator::new("doc-pooled");
/// let mut v: ClassBox<'static, Vec<u32>> = NUMS.alloc(vec![1, 2]);
/// v.push(3); // `DerefMut` to the object
/// assert_eq!(*v, [1, 2, 3]);
/// let moved = std::thread::spawn(move || v.len()).join().unwrap(); // `Send`: `Vec` is
/// assert_eq!(moved, 3);
/// assert_eq!(NUMS.stats().live, 0); // freed on the other thread
/// ```
///
/// A `ClassBox` is two words, the object and its allocator, so it works with every
/// allocator, one made at run time included. For a `static` allocator,
/// [`Thin`](crate::Thin) handles ([`static_class!`](crate::static_class!)) are one word
/// and the faster choice: the allocator's address is a constant in the code that frees,
/// not a word to load (see `docs/benchmarks.md`, the request shape).
///
/// It is `Send`/`Sync` exactly when `T` is. A handle to a `!Send` type stays on its
/// thread:
///
/// ```compile_fail
/// use proxalloc::ClassAllocator;
/// use std::rc::Rc;
/// static RCS: ClassAllocator<Rc<u8>> = ClassAllocator::new("rcs");
/// let h = RCS.alloc(Rc::new(1));
/// std::thread::spawn(move || drop(h)); // error: `Rc<u8>` cannot be sent between threads
/// ```
pub struct ClassBox<'a, T> {
    ptr: NonNull<T>,
    pub(super) alloc: &'a ClassAllocator<T>,
    _owns: PhantomData<T>,
}

// SAFETY: the handle owns its `T` exclusively (like `Box<T>`); the allocator reference is
// to a `Sync` allocator.
unsafe impl<T: Send> Send for ClassBox<'_, T> {}
// SAFETY: `&ClassBox<T>` only gives out `&T`.
unsafe impl<T: Sync> Sync for ClassBox<'_, T> {}

impl<'a, T> ClassBox<'a, T> {
    /// The allocator this object came from. (An associated function, not a method, so
    /// that it cannot shadow a method of `T`: call it as `ClassBox::allocator(&handle)`.)
    ///
    /// ```
    /// use proxalloc::{ClassAllocator, ClassBox};
    /// static IDS: ClassAllocator<u64> = ClassAllocator::new("doc-pooled-allocator");
    /// let id = IDS.alloc(9);
    /// assert!(std::ptr::eq(ClassBox::allocator(&id), &IDS));
    /// assert_eq!(ClassBox::allocator(&id).name(), "doc-pooled-allocator");
    /// ```
    pub fn allocator(this: &Self) -> &'a ClassAllocator<T> {
        this.alloc
    }

    /// Moves the value out and recycles the memory.
    ///
    /// ```
    /// use proxalloc::{ClassAllocator, ClassBox};
    /// static LINES: ClassAllocator<String> = ClassAllocator::new("doc-pooled-into-inner");
    /// let line = LINES.alloc("GET / HTTP/1.1".to_string());
    /// let owned: String = ClassBox::into_inner(line);
    /// assert_eq!(owned, "GET / HTTP/1.1");
    /// assert_eq!(LINES.stats().live, 0); // its memory is back in the cache
    /// ```
    pub fn into_inner(this: Self) -> T {
        let this = ManuallyDrop::new(this);
        // SAFETY: the handle owns an initialised value, read exactly once here.
        let value = unsafe { this.ptr.as_ptr().read() };
        // SAFETY: the memory came from `alloc` and its value was moved out.
        unsafe { this.alloc.free_raw(this.ptr) };
        value
    }

    /// Gives up ownership without dropping or recycling; the object stays allocated.
    /// Pair with [`from_raw`](Self::from_raw) or [`ClassAllocator`]-aware code.
    ///
    /// ```
    /// use proxalloc::{ClassAllocator, ClassBox};
    /// static NODES: ClassAllocator<u64> = ClassAllocator::new("doc-pooled-into-raw");
    /// let raw = ClassBox::into_raw(NODES.alloc(5)); // e.g. stored in an intrusive list
    /// assert_eq!(NODES.stats().live, 1);
    /// // SAFETY: `raw` came from `into_raw` on an object of `NODES`, and is used once.
    /// let back = unsafe { ClassBox::from_raw(&NODES, raw) };
    /// assert_eq!(*back, 5);
    /// ```
    pub fn into_raw(this: Self) -> NonNull<T> {
        ManuallyDrop::new(this).ptr
    }

    /// Rebuilds a handle from [`into_raw`](Self::into_raw).
    ///
    /// # Safety
    /// `ptr` is an object of `alloc` holding an initialised value (as `into_raw` gives
    /// out), and no other handle owns it.
    ///
    /// ```
    /// use proxalloc::{ClassAllocator, ClassBox};
    /// static TIMERS: ClassAllocator<u32> = ClassAllocator::new("doc-pooled-from-raw");
    /// let p = ClassBox::into_raw(TIMERS.alloc(30));
    /// // SAFETY: `p` is an initialised object of `TIMERS` that no handle owns.
    /// let h = unsafe { ClassBox::from_raw(&TIMERS, p) };
    /// assert_eq!(ClassBox::as_ptr(&h), p.as_ptr().cast_const());
    /// drop(h); // dropped and recycled as usual
    /// assert_eq!(TIMERS.stats().live, 0);
    /// ```
    pub unsafe fn from_raw(alloc: &'a ClassAllocator<T>, ptr: NonNull<T>) -> Self {
        ClassBox {
            ptr,
            alloc,
            _owns: PhantomData,
        }
    }

    /// Leaks the object: it is never dropped and its memory never recycled.
    ///
    /// ```
    /// use proxalloc::{ClassAllocator, ClassBox};
    /// static SETTINGS: ClassAllocator<u32> = ClassAllocator::new("doc-pooled-leak");
    /// let forever: &'static mut u32 = ClassBox::leak(SETTINGS.alloc(1));
    /// *forever += 1;
    /// assert_eq!(*forever, 2);
    /// assert_eq!(SETTINGS.stats().live, 1); // still counted as live
    /// ```
    pub fn leak(this: Self) -> &'a mut T {
        // SAFETY: the value is initialised and owned; it is never freed.
        unsafe { &mut *Self::into_raw(this).as_ptr() }
    }

    /// A raw pointer to the object (the handle keeps ownership).
    ///
    /// ```
    /// use proxalloc::{ClassAllocator, ClassBox};
    /// static KEYS: ClassAllocator<u64> = ClassAllocator::new("doc-pooled-as-ptr");
    /// let k = KEYS.alloc(11);
    /// let p = ClassBox::as_ptr(&k);
    /// assert_eq!(p, &*k as *const u64);
    /// // SAFETY: `k` still owns the object, so it is live.
    /// assert_eq!(unsafe { *p }, 11);
    /// ```
    pub fn as_ptr(this: &Self) -> *const T {
        this.ptr.as_ptr()
    }
}

impl<T> Drop for ClassBox<'_, T> {
    #[inline(always)]
    fn drop(&mut self) {
        if std::mem::needs_drop::<T>() {
            // Recycles the memory even if `T::drop` unwinds.
            let guard = FreeOnUnwind {
                alloc: self.alloc,
                object: self.ptr,
            };
            // SAFETY: the handle owns an initialised value, dropped exactly once here.
            unsafe { self.ptr.as_ptr().drop_in_place() };
            std::mem::forget(guard);
        }
        // SAFETY: the memory came from `alloc` and its value is gone.
        unsafe { self.alloc.free_raw(self.ptr) };
    }
}

impl<T> Deref for ClassBox<'_, T> {
    type Target = T;
    #[inline]
    fn deref(&self) -> &T {
        // SAFETY: the handle owns an initialised value.
        unsafe { self.ptr.as_ref() }
    }
}

impl<T> DerefMut for ClassBox<'_, T> {
    #[inline]
    fn deref_mut(&mut self) -> &mut T {
        // SAFETY: the handle owns an initialised value, exclusively.
        unsafe { self.ptr.as_mut() }
    }
}

impl<T> AsRef<T> for ClassBox<'_, T> {
    fn as_ref(&self) -> &T {
        self
    }
}

impl<T> AsMut<T> for ClassBox<'_, T> {
    fn as_mut(&mut self) -> &mut T {
        self
    }
}

impl<T> Borrow<T> for ClassBox<'_, T> {
    fn borrow(&self) -> &T {
        self
    }
}

impl<T> BorrowMut<T> for ClassBox<'_, T> {
    fn borrow_mut(&mut self) -> &mut T {
        self
    }
}

impl<T: fmt::Debug> fmt::Debug for ClassBox<'_, T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&**self, f)
    }
}

impl<T: fmt::Display> fmt::Display for ClassBox<'_, T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&**self, f)
    }
}

impl<T> fmt::Pointer for ClassBox<'_, T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Pointer::fmt(&self.ptr, f)
    }
}

impl<T: PartialEq> PartialEq for ClassBox<'_, T> {
    fn eq(&self, other: &Self) -> bool {
        **self == **other
    }
}

impl<T: Eq> Eq for ClassBox<'_, T> {}

impl<T: PartialOrd> PartialOrd for ClassBox<'_, T> {
    fn partial_cmp(&self, other: &Self) -> Option<CmpOrdering> {
        (**self).partial_cmp(&**other)
    }
}

impl<T: Ord> Ord for ClassBox<'_, T> {
    fn cmp(&self, other: &Self) -> CmpOrdering {
        (**self).cmp(&**other)
    }
}

impl<T: Hash> Hash for ClassBox<'_, T> {
    fn hash<H: Hasher>(&self, state: &mut H) {
        (**self).hash(state)
    }
}
