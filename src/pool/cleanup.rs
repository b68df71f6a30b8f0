//! Cleanups: closures registered with [`Pool::on_clear`] and values whose destructor
//! the pool runs ([`Pool::alloc_owned`]), kept as a list of nodes in pool memory and run
//! last-registered first when the pool is cleared or dropped.

use std::alloc::Layout;
use std::any::Any;
use std::fmt;
use std::marker::PhantomData;
use std::mem::ManuallyDrop;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::ptr;

use super::Pool;
use crate::core::backing::discard_panic;

/// A registered cleanup: a closure or a value's destructor, in pool memory.
#[repr(C)]
pub(super) struct CleanupHeader {
    next: *mut CleanupHeader,
    /// Runs (or, with `false`, only drops) the cleanup. Called at most once.
    run: unsafe fn(*mut CleanupHeader, bool),
    live: bool,
}

#[repr(C)]
struct ClosureNode<F> {
    header: CleanupHeader,
    f: ManuallyDrop<F>,
}

/// # Safety
/// `h` heads a live `ClosureNode<F>` whose closure has not been taken.
unsafe fn run_closure<F: FnOnce()>(h: *mut CleanupHeader, call: bool) {
    // SAFETY: per the contract; the closure is taken exactly once.
    let f = unsafe { ManuallyDrop::take(&mut (*h.cast::<ClosureNode<F>>()).f) };
    if call {
        f();
    }
}

#[repr(C)]
struct OwnedNode<T> {
    header: CleanupHeader,
    value: T,
}

/// # Safety
/// `h` heads a live `OwnedNode<T>` whose value has not been dropped.
unsafe fn drop_owned<T>(h: *mut CleanupHeader, _call: bool) {
    // SAFETY: per the contract.
    unsafe { ptr::drop_in_place(&mut (*h.cast::<OwnedNode<T>>()).value) };
}

fn run_closure_of<F: FnOnce()>(_: &F) -> unsafe fn(*mut CleanupHeader, bool) {
    run_closure::<F>
}

/// A cleanup registered with [`Pool::on_clear`], to [`cancel`](Pool::cancel) it.
///
/// ```
/// let mut pool = proxalloc::Pool::new();
/// let key: proxalloc::CleanupKey<'_> = pool.on_clear(|| println!("cleared"));
/// pool.cancel(key);
/// pool.clear();
/// ```
pub struct CleanupKey<'p> {
    node: *mut CleanupHeader,
    pool: *const (),
    _pool: PhantomData<&'p ()>,
}

impl fmt::Debug for CleanupKey<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CleanupKey").finish_non_exhaustive()
    }
}

impl<'s> Pool<'s> {
    /// Allocates `value` and drops it when the pool is cleared or dropped (destructors
    /// run last-registered first, interleaved with [`on_clear`](Self::on_clear)
    /// cleanups; if one panics the others still run and the panic continues after).
    ///
    /// `T: 'static` keeps a destructor from reading other pool memory, which may be
    /// gone by the time it runs.
    ///
    /// ```
    /// let mut pool = proxalloc::Pool::new();
    /// let names = pool.alloc_owned(vec![String::from("a")]); // dropped at clear
    /// names.push("b".into());
    /// assert_eq!(names.len(), 2);
    /// pool.clear(); // the Vec and its Strings are dropped here
    /// ```
    #[allow(clippy::mut_from_ref)]
    pub fn alloc_owned<T: Send + 'static>(&self, value: T) -> &mut T {
        if !std::mem::needs_drop::<T>() {
            return self.alloc(value);
        }
        let node = self
            .alloc_layout(Layout::new::<OwnedNode<T>>())
            .cast::<OwnedNode<T>>();
        let st = self.st();
        // SAFETY: fresh memory for the node, handed out once.
        unsafe {
            node.as_ptr().write(OwnedNode {
                header: CleanupHeader {
                    next: st.cleanups,
                    run: drop_owned::<T>,
                    live: true,
                },
                value,
            });
            st.cleanups = node.as_ptr().cast();
            st.cleanup_count += 1;
            &mut (*node.as_ptr()).value
        }
    }

    /// Registers `f` to run when the pool is cleared or dropped (last registered runs
    /// first, APR's order). Cancel it with [`cancel`](Self::cancel).
    ///
    /// ```
    /// use std::sync::atomic::{AtomicUsize, Ordering};
    /// static CLOSED: AtomicUsize = AtomicUsize::new(0);
    /// let mut pool = proxalloc::Pool::new();
    /// pool.on_clear(|| { CLOSED.fetch_add(1, Ordering::Relaxed); });
    /// let key = pool.on_clear(|| unreachable!());
    /// pool.cancel(key);
    /// pool.clear();
    /// assert_eq!(CLOSED.load(Ordering::Relaxed), 1);
    /// ```
    pub fn on_clear(&self, f: impl FnOnce() + Send + 'static) -> CleanupKey<'_> {
        let node = self.alloc_with(|| ClosureNode {
            header: CleanupHeader {
                next: ptr::null_mut(),
                run: run_closure_of(&f),
                live: true,
            },
            f: ManuallyDrop::new(f),
        });
        let header: *mut CleanupHeader = (node as *mut ClosureNode<_>).cast();
        let st = self.st();
        // SAFETY: the node was just allocated and initialised.
        unsafe { (*header).next = st.cleanups };
        st.cleanups = header;
        st.cleanup_count += 1;
        CleanupKey {
            node: header,
            pool: self.state.get().cast_const().cast(),
            _pool: PhantomData,
        }
    }

    /// Cancels a cleanup registered with [`on_clear`](Self::on_clear): its closure is
    /// dropped without running.
    ///
    /// # Panics
    /// If `key` belongs to another pool.
    ///
    /// ```
    /// let mut pool = proxalloc::Pool::new();
    /// let key = pool.on_clear(|| panic!("never runs"));
    /// pool.cancel(key);
    /// pool.clear();
    /// ```
    pub fn cancel(&self, key: CleanupKey<'_>) {
        assert!(
            ptr::eq(key.pool, self.state.get().cast_const().cast()),
            "proxalloc: cleanup key of another pool"
        );
        // SAFETY: the key borrows this pool, so the node is live and registered here, and
        // a key is consumed once, so its closure is still there.
        unsafe { (*key.node).live = false };
        // Counted before the closure is dropped, which is user code that may panic.
        self.st().cleanup_count -= 1;
        // SAFETY: as above.
        unsafe { ((*key.node).run)(key.node, false) };
    }

    pub(super) fn run_cleanups(&mut self) -> Option<Box<dyn Any + Send>> {
        let mut first_panic = None;
        loop {
            let st = self.st();
            let node = st.cleanups;
            if node.is_null() {
                break;
            }
            // SAFETY: registered nodes are live pool memory; each runs once, after it
            // is unlinked (so a cleanup that registers another is safe).
            unsafe {
                st.cleanups = (*node).next;
                if (*node).live {
                    (*node).live = false;
                    st.cleanup_count -= 1;
                    let run = (*node).run;
                    if let Err(p) = catch_unwind(AssertUnwindSafe(|| run(node, true))) {
                        // The first panic goes on once every cleanup has run; later
                        // payloads are dropped here, with a panic from a payload's own
                        // `Drop` contained, so the other cleanups still run.
                        match first_panic {
                            None => first_panic = Some(p),
                            Some(_) => discard_panic(p),
                        }
                    }
                }
            }
        }
        first_panic
    }
}
