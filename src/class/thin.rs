//! One-word handles for `static` allocators: [`Thin<C>`] is the object's pointer alone,
//! the allocator being known from the type `C` (declared with [`static_class!`](crate::static_class)).
//!
//! A [`ClassBox`] handle is two words: the object and its allocator. A request that holds
//! a thousand objects keeps a thousand handles, so their size shows: one-word handles
//! make such a batch faster (measured: `docs/benchmarks.md#one-word-handles` in the
//! repository).

use std::fmt;
use std::marker::PhantomData;
use std::mem::ManuallyDrop;
use std::ops::{Deref, DerefMut};
use std::ptr::NonNull;

use crate::class::{ClassAllocator, ClassBox};
use crate::error::AllocError;

/// A `static` [`ClassAllocator`] named by a type, so that its handles ([`Thin`]) need
/// not carry it. Implemented by [`static_class!`](crate::static_class!).
///
/// # Safety
/// [`allocator`](Self::allocator) returns the same allocator every time: a handle made
/// from one call is freed through another. (`static_class!` implements it with one
/// `static`; an implementation that alternated would free objects into an allocator they
/// do not belong to.) A hand-written `impl` must say `unsafe`:
///
/// ```compile_fail
/// use proxalloc::{ClassAllocator, StaticClass};
/// struct Mine;
/// static A: ClassAllocator<u8> = ClassAllocator::new("mine");
/// impl StaticClass for Mine { // error: the trait is unsafe to implement
///     type Object = u8;
///     fn allocator() -> &'static ClassAllocator<u8> { &A }
/// }
/// ```
pub unsafe trait StaticClass: Sized + 'static {
    /// The type of the objects.
    type Object;

    /// The allocator.
    ///
    /// ```
    /// use proxalloc::{static_class, StaticClass};
    /// static_class!(Timers: u64 = "doc-static-class-allocator");
    /// let t = Timers::alloc(500);
    /// assert_eq!(Timers::allocator().name(), "doc-static-class-allocator");
    /// assert_eq!(Timers::allocator().stats().live, 1);
    /// # drop(t);
    /// ```
    fn allocator() -> &'static ClassAllocator<Self::Object>;

    /// Allocates an object holding `value`, with a one-word handle.
    ///
    /// # Aborts
    /// If the backing allocator fails or a [`Config::max_live`](crate::Config::max_live)
    /// cap is reached, through [`std::alloc::handle_alloc_error`].
    ///
    /// ```
    /// use proxalloc::{static_class, StaticClass, Thin};
    /// static_class!(Spans: (u32, u32) = "doc-static-class-alloc");
    /// let s: Thin<Spans> = Spans::alloc((10, 20));
    /// assert_eq!(s.1 - s.0, 10);
    /// ```
    #[inline(always)]
    #[must_use = "dropping the handle frees the object at once"]
    fn alloc(value: Self::Object) -> Thin<Self> {
        Thin::new(value)
    }

    /// Like [`alloc`](Self::alloc), but returns an error (dropping `value`) if the
    /// backing allocator fails or a [`Config::max_live`](crate::Config::max_live) cap is
    /// reached.
    ///
    /// ```
    /// use proxalloc::{static_class, AllocError, Config, StaticClass};
    /// static_class!(Seats: u32 = "doc-static-class-try-alloc", Config::new().max_live(1));
    /// let first = Seats::try_alloc(1).expect("under the cap");
    /// assert_eq!(Seats::try_alloc(2).err(), Some(AllocError));
    /// drop(first);
    /// assert!(Seats::try_alloc(3).is_ok());
    /// ```
    #[inline(always)]
    #[must_use = "dropping the result frees the object at once"]
    fn try_alloc(value: Self::Object) -> Result<Thin<Self>, AllocError> {
        Thin::try_new(value)
    }
}

/// Declares a `static` class allocator as a type, for one-word [`Thin`] handles.
///
/// ```
/// use proxalloc::{static_class, StaticClass, Thin};
///
/// struct Header { name: u32, value: u32 }
/// static_class!(Headers: Header = "headers");
///
/// let h: Thin<Headers> = Headers::alloc(Header { name: 1, value: 2 });
/// assert_eq!(std::mem::size_of_val(&h), std::mem::size_of::<usize>());
/// assert_eq!(h.value, 2);
/// drop(h);
/// assert_eq!(Headers::allocator().stats().live, 0);
/// ```
///
/// A [`Config`](crate::Config) may follow the name:
/// `static_class!(Bufs: [u8; 4096] = "bufs", Config::new().magazine_size(16));`
#[macro_export]
macro_rules! static_class {
    ($(#[$meta:meta])* $vis:vis $class:ident : $object:ty = $name:expr $(,)?) => {
        $crate::static_class!($(#[$meta])* $vis $class: $object = $name, $crate::Config::new());
    };
    ($(#[$meta:meta])* $vis:vis $class:ident : $object:ty = $name:expr, $config:expr $(,)?) => {
        $(#[$meta])*
        #[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
        $vis struct $class;

        // SAFETY: `allocator` returns the one `static` below, every time.
        unsafe impl $crate::StaticClass for $class {
            type Object = $object;

            #[inline(always)]
            fn allocator() -> &'static $crate::ClassAllocator<$object> {
                static ALLOCATOR: $crate::ClassAllocator<$object> =
                    $crate::ClassAllocator::with_config($name, $config);
                &ALLOCATOR
            }
        }
    };
}

/// An object of the `static` class allocator `C`, in one word: dropping it runs the
/// object's destructor and recycles the memory into the cache nearest the dropping
/// thread (its CPU's, or its own), as [`ClassBox`] does. `Send`/`Sync` exactly when the
/// object type is.
///
/// ```
/// use proxalloc::{static_class, StaticClass, Thin};
/// static_class!(Jobs: Vec<u8> = "doc-thin");
/// let mut job: Thin<Jobs> = Thin::new(Vec::new());
/// job.push(1); // `DerefMut` to the object
/// let handles: Vec<Thin<Jobs>> = (0..3).map(|_| Jobs::alloc(vec![0; 8])).collect();
/// assert_eq!(std::mem::size_of_val(&handles[..]), 3 * std::mem::size_of::<usize>());
/// let len = std::thread::spawn(move || job.len()).join().unwrap(); // `Send`: `Vec` is
/// assert_eq!(len, 1);
/// ```
///
/// ```compile_fail
/// use proxalloc::{static_class, StaticClass};
/// static_class!(Rcs: std::rc::Rc<u8> = "rcs");
/// let h = Rcs::alloc(std::rc::Rc::new(1));
/// std::thread::spawn(move || drop(h)); // error: `Rc<u8>` cannot be sent between threads
/// ```
pub struct Thin<C: StaticClass> {
    ptr: NonNull<C::Object>,
    _owns: PhantomData<C::Object>,
}

// SAFETY: the handle owns its object exclusively (like `Box`); the allocator is a
// `static`, `Sync` for every object type.
unsafe impl<C: StaticClass> Send for Thin<C> where C::Object: Send {}
// SAFETY: `&Thin<C>` only gives out `&C::Object`.
unsafe impl<C: StaticClass> Sync for Thin<C> where C::Object: Sync {}

impl<C: StaticClass> Thin<C> {
    /// Allocates an object holding `value` (see [`StaticClass::alloc`]).
    ///
    /// ```
    /// use proxalloc::{static_class, StaticClass, Thin};
    /// static_class!(Ids: u64 = "doc-thin-new");
    /// let id = Thin::<Ids>::new(7);
    /// assert_eq!(*id, 7);
    /// assert_eq!(Ids::allocator().stats().live, 1);
    /// ```
    #[inline(always)]
    #[must_use = "dropping the handle frees the object at once"]
    pub fn new(value: C::Object) -> Self {
        Thin {
            ptr: ClassBox::into_raw(C::allocator().alloc(value)),
            _owns: PhantomData,
        }
    }

    /// Like [`new`](Self::new), but returns an error (dropping `value`) if the backing
    /// allocator fails.
    ///
    /// ```
    /// use proxalloc::{static_class, AllocError, Config, Thin};
    /// static_class!(Capped: u64 = "doc-thin-try-new", Config::new().max_live(0));
    /// assert_eq!(Thin::<Capped>::try_new(1).err(), Some(AllocError));
    /// static_class!(Open: u64 = "doc-thin-try-new-open");
    /// assert_eq!(*Thin::<Open>::try_new(2).unwrap(), 2);
    /// ```
    #[inline(always)]
    #[must_use = "dropping the result frees the object at once"]
    pub fn try_new(value: C::Object) -> Result<Self, AllocError> {
        Ok(Thin {
            ptr: ClassBox::into_raw(C::allocator().try_alloc(value)?),
            _owns: PhantomData,
        })
    }

    /// The two-word handle for the same object (and back with `Thin::from`).
    ///
    /// ```
    /// use proxalloc::{static_class, ClassBox, StaticClass, Thin};
    /// static_class!(Frames: [u8; 16] = "doc-thin-into-class-box");
    /// let thin = Frames::alloc([3; 16]);
    /// let addr = &*thin as *const [u8; 16];
    /// let boxed: ClassBox<'static, [u8; 16]> = Thin::into_class_box(thin);
    /// assert_eq!(ClassBox::as_ptr(&boxed), addr); // the same object, not a copy
    /// assert!(std::ptr::eq(ClassBox::allocator(&boxed), Frames::allocator()));
    /// let thin_again: Thin<Frames> = Thin::from(boxed);
    /// assert_eq!(thin_again[0], 3);
    /// ```
    pub fn into_class_box(this: Self) -> ClassBox<'static, C::Object> {
        let this = ManuallyDrop::new(this);
        // SAFETY: the handle owns an initialised object of `C`'s allocator, and gives
        // it up here.
        unsafe { ClassBox::from_raw(C::allocator(), this.ptr) }
    }

    /// Moves the value out and recycles the memory.
    ///
    /// ```
    /// use proxalloc::{static_class, StaticClass, Thin};
    /// static_class!(Names: String = "doc-thin-into-inner");
    /// let name = Names::alloc("proxalloc".to_string());
    /// let s: String = Thin::into_inner(name);
    /// assert_eq!(s, "proxalloc");
    /// assert_eq!(Names::allocator().stats().live, 0);
    /// ```
    pub fn into_inner(this: Self) -> C::Object {
        ClassBox::into_inner(Self::into_class_box(this))
    }
}

impl<C: StaticClass> From<ClassBox<'static, C::Object>> for Thin<C> {
    /// Takes over a handle of `C`'s allocator.
    ///
    /// # Panics
    /// If the handle belongs to another allocator.
    fn from(handle: ClassBox<'static, C::Object>) -> Self {
        assert!(
            std::ptr::eq(ClassBox::allocator(&handle), C::allocator()),
            "proxalloc: a handle of allocator {:?} made into a Thin of {:?}",
            ClassBox::allocator(&handle).name(),
            C::allocator().name(),
        );
        Thin {
            ptr: ClassBox::into_raw(handle),
            _owns: PhantomData,
        }
    }
}

impl<C: StaticClass> Drop for Thin<C> {
    #[inline(always)]
    fn drop(&mut self) {
        // SAFETY: the handle owns an initialised object of `C`'s allocator, dropped and
        // recycled exactly once here.
        drop(unsafe { ClassBox::from_raw(C::allocator(), self.ptr) });
    }
}

impl<C: StaticClass> Deref for Thin<C> {
    type Target = C::Object;
    #[inline(always)]
    fn deref(&self) -> &C::Object {
        // SAFETY: the handle owns an initialised object.
        unsafe { self.ptr.as_ref() }
    }
}

impl<C: StaticClass> DerefMut for Thin<C> {
    #[inline(always)]
    fn deref_mut(&mut self) -> &mut C::Object {
        // SAFETY: the handle owns an initialised object, exclusively.
        unsafe { self.ptr.as_mut() }
    }
}

impl<C: StaticClass> AsRef<C::Object> for Thin<C> {
    fn as_ref(&self) -> &C::Object {
        self
    }
}

impl<C: StaticClass> AsMut<C::Object> for Thin<C> {
    fn as_mut(&mut self) -> &mut C::Object {
        self
    }
}

impl<C: StaticClass> fmt::Debug for Thin<C>
where
    C::Object: fmt::Debug,
{
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&**self, f)
    }
}

impl<C: StaticClass> fmt::Display for Thin<C>
where
    C::Object: fmt::Display,
{
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&**self, f)
    }
}
