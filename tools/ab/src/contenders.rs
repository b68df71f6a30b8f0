//! The contenders: proxalloc with each handle, the floor, and (feature `peers`) the
//! global allocators a user would pick instead.

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::UnsafeCell;
use std::ptr::NonNull;

use proxalloc::{ClassAllocator, ClassBox, StaticClass, Thin};

#[cfg(feature = "peers")]
use crate::workloads::opaque;
use crate::workloads::Contender;

/// A raw object pointer, the handle of every contender without one of its own.
pub struct Raw<T>(NonNull<T>);

// SAFETY: the handle owns its object exclusively, like `Box<T>`.
unsafe impl<T: Send> Send for Raw<T> {}

/// proxalloc with its default handle, [`ClassBox`] (the object and its allocator).
pub struct Boxed<T: 'static>(pub ClassAllocator<T>);

impl<T: Send + Sync + 'static> Contender<T> for Boxed<T> {
    type Handle = ClassBox<'static, T>;
    #[inline(always)]
    fn alloc(&'static self, value: T) -> Self::Handle {
        self.0.alloc(value)
    }
    #[inline(always)]
    fn free(&'static self, handle: Self::Handle) {
        drop(handle)
    }
    #[inline(always)]
    fn get(handle: &Self::Handle) -> &T {
        handle
    }
}

/// proxalloc with a one-word handle: the object alone, its allocator known to the code
/// that frees it (as `Thin` handles of a `static` allocator are).
pub struct OneWord<T: 'static>(pub ClassAllocator<T>);

impl<T: Send + Sync + 'static> Contender<T> for OneWord<T> {
    type Handle = Raw<T>;
    #[inline(always)]
    fn alloc(&'static self, value: T) -> Self::Handle {
        Raw(ClassBox::into_raw(self.0.alloc(value)))
    }
    #[inline(always)]
    fn free(&'static self, handle: Self::Handle) {
        // SAFETY: `handle` came from `into_raw` on this allocator and is freed once.
        drop(unsafe { ClassBox::from_raw(&self.0, handle.0) })
    }
    #[inline(always)]
    fn get(handle: &Self::Handle) -> &T {
        // SAFETY: the handle owns a live object.
        unsafe { handle.0.as_ref() }
    }
}

/// proxalloc's one-word handle of a `static` allocator, [`Thin`] (declared with
/// `static_class!`): the allocator is known from the type, so a free reads nothing but
/// the object's address.
pub struct ThinOf<C>(std::marker::PhantomData<fn() -> C>);

impl<C> ThinOf<C> {
    pub const NEW: Self = ThinOf(std::marker::PhantomData);
}

impl<C: StaticClass + 'static> Contender<C::Object> for ThinOf<C>
where
    C::Object: Send + Sync + 'static,
{
    type Handle = Thin<C>;
    #[inline(always)]
    fn alloc(&'static self, value: C::Object) -> Self::Handle {
        Thin::new(value)
    }
    #[inline(always)]
    fn free(&'static self, handle: Self::Handle) {
        drop(handle)
    }
    #[inline(always)]
    fn get(handle: &Self::Handle) -> &C::Object {
        handle
    }
}

/// Free objects a floor stack holds, per size; W2's batch fits.
const FLOOR_SLOTS: usize = 1024;

struct Stack {
    len: usize,
    slots: [*mut u8; FLOOR_SLOTS],
}

const SIZES: usize = 5;

std::thread_local! {
    static STACKS: UnsafeCell<[Stack; SIZES]> = const {
        UnsafeCell::new([const { Stack { len: 0, slots: [std::ptr::null_mut(); FLOOR_SLOTS] } }; SIZES])
    };
}

/// The stack of objects of `size` bytes; evaluated at compile time (`const { .. }` at
/// the call), so the floor's fast path has no check of it.
const fn stack_of(size: usize) -> usize {
    match size {
        64 => 0,
        128 => 1,
        512 => 2,
        1024 => 3,
        2048 => 4,
        _ => panic!("the floor takes the workloads' sizes"),
    }
}

/// The floor: a thread-local array of free pointers per size used as a stack, filled
/// from malloc on a miss; no synchronisation, no accounting, no shared level.
pub struct Floor;

impl<T: Send + Sync + 'static> Contender<T> for Floor {
    type Handle = Raw<T>;
    #[inline(always)]
    fn alloc(&'static self, value: T) -> Self::Handle {
        self.alloc_floor(value)
    }
    #[inline(always)]
    fn free(&'static self, handle: Self::Handle) {
        self.free_floor(handle)
    }
    #[inline(always)]
    fn get(handle: &Self::Handle) -> &T {
        // SAFETY: the handle owns a live object.
        unsafe { handle.0.as_ref() }
    }
}

impl Floor {
    #[inline(always)]
    fn alloc_floor<T>(&self, value: T) -> Raw<T> {
        let k = const { stack_of(size_of::<T>()) };
        // SAFETY: this thread's stacks, borrowed only here and in `free`.
        let p = STACKS.with(|s| unsafe {
            let s = &mut (*s.get())[k];
            if s.len == 0 {
                std::ptr::null_mut()
            } else {
                s.len -= 1;
                s.slots[s.len]
            }
        });
        let p = if p.is_null() {
            // SAFETY: a non-zero layout.
            unsafe { System.alloc(Layout::new::<T>()) }
        } else {
            p
        };
        let p = NonNull::new(p).expect("out of memory").cast::<T>();
        // SAFETY: memory for one `T`.
        unsafe { p.as_ptr().write(value) };
        Raw(p)
    }

    #[inline(always)]
    fn free_floor<T>(&self, handle: Raw<T>) {
        let k = const { stack_of(size_of::<T>()) };
        let p = handle.0.as_ptr().cast::<u8>();
        // SAFETY: as in `alloc`.
        let kept = STACKS.with(|s| unsafe {
            let s = &mut (*s.get())[k];
            if s.len == FLOOR_SLOTS {
                return false;
            }
            s.slots[s.len] = p;
            s.len += 1;
            true
        });
        if !kept {
            // SAFETY: from `System` with this layout (a thread's stack may also hold
            // another thread's objects, all from `System`).
            unsafe { System.dealloc(p, Layout::new::<T>()) }
        }
    }
}

/// The floor with a handle shaped as a [`ClassBox`]: two words, the second read by its
/// `Drop`, which frees: what that shape costs by itself (handles in arrays are built,
/// moved and dropped by the standard library's array code, as users hold them).
pub struct Floor2;

/// [`Raw`] and a second word, as a [`ClassBox`] carries its allocator; dropping it frees.
pub struct Raw2<T> {
    object: NonNull<T>,
    floor: &'static Floor2,
}

// SAFETY: as for `Raw`.
unsafe impl<T: Send> Send for Raw2<T> {}

impl<T> Drop for Raw2<T> {
    #[inline(always)]
    fn drop(&mut self) {
        // The drop needs the second word in a register, as a `ClassBox`'s needs its
        // allocator's address (an instruction-free block that reads no memory).
        let floor = std::ptr::from_ref(self.floor);
        // SAFETY: no instruction.
        unsafe {
            std::arch::asm!("/* {f} */", f = in(reg) floor, options(nostack, preserves_flags, nomem))
        };
        Floor.free_floor(Raw(self.object))
    }
}

impl<T: Send + Sync + 'static> Contender<T> for Floor2 {
    type Handle = Raw2<T>;
    #[inline(always)]
    fn alloc(&'static self, value: T) -> Self::Handle {
        Raw2 {
            object: Floor.alloc_floor(value).0,
            floor: self,
        }
    }
    #[inline(always)]
    fn free(&'static self, handle: Self::Handle) {
        drop(handle)
    }
    #[inline(always)]
    fn get(handle: &Self::Handle) -> &T {
        // SAFETY: the handle owns a live object.
        unsafe { handle.object.as_ref() }
    }
}

std::thread_local! {
    static VEC_STACKS: UnsafeCell<[Vec<*mut u8>; SIZES]> = const { UnsafeCell::new([const { Vec::new() }; SIZES]) };
}

/// The floor the project's suite has used (`lower-bound` in tools/): a thread-local
/// `Vec` of free pointers per size. Its thread-local has a destructor, so every access
/// checks that it is live, and a push checks the `Vec`'s capacity.
pub struct VecFloor;

impl<T: Send + Sync + 'static> Contender<T> for VecFloor {
    type Handle = Raw<T>;
    #[inline(always)]
    fn alloc(&'static self, value: T) -> Self::Handle {
        let k = const { stack_of(size_of::<T>()) };
        // SAFETY: this thread's stacks, borrowed only here and in `free`.
        let p = VEC_STACKS.with(|s| unsafe { (*s.get())[k].pop() });
        let p = p.unwrap_or_else(|| {
            // SAFETY: a non-zero layout.
            unsafe { System.alloc(Layout::new::<T>()) }
        });
        let p = NonNull::new(p).expect("out of memory").cast::<T>();
        // SAFETY: memory for one `T`.
        unsafe { p.as_ptr().write(value) };
        Raw(p)
    }
    #[inline(always)]
    fn free(&'static self, handle: Self::Handle) {
        let k = const { stack_of(size_of::<T>()) };
        // SAFETY: as in `alloc`.
        VEC_STACKS.with(|s| unsafe { (*s.get())[k].push(handle.0.as_ptr().cast()) });
    }
    #[inline(always)]
    fn get(handle: &Self::Handle) -> &T {
        // SAFETY: the handle owns a live object.
        unsafe { handle.0.as_ref() }
    }
}

/// A global allocator called directly (feature `peers`).
#[cfg(feature = "peers")]
pub struct Global<A: GlobalAlloc + Sync + 'static>(pub A);

#[cfg(feature = "peers")]
impl<T: Send + Sync + 'static, A: GlobalAlloc + Sync + 'static> Contender<T> for Global<A> {
    type Handle = Raw<T>;
    #[inline(always)]
    fn alloc(&'static self, value: T) -> Self::Handle {
        // SAFETY: a non-zero layout.
        let p = unsafe { self.0.alloc(Layout::new::<T>()) };
        // Opaque (no instruction), so the optimiser cannot pair a `malloc` with its
        // `free` and remove both, or the stores between (it knows glibc's calls).
        let p = opaque(p).cast_mut();
        let p = NonNull::new(p).expect("out of memory").cast::<T>();
        // SAFETY: memory for one `T`.
        unsafe { p.as_ptr().write(value) };
        Raw(p)
    }
    #[inline(always)]
    fn free(&'static self, handle: Self::Handle) {
        // SAFETY: allocated by `self.0` with this layout.
        unsafe { self.0.dealloc(handle.0.as_ptr().cast(), Layout::new::<T>()) }
    }
    #[inline(always)]
    fn get(handle: &Self::Handle) -> &T {
        // SAFETY: the handle owns a live object.
        unsafe { handle.0.as_ref() }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::workloads::O2k;

    /// Every contender hands back what it was given, and the floor reuses what it took.
    #[test]
    fn contenders_keep_values_and_the_floor_reuses_its_objects() {
        fn check<C: Contender<O2k>>(c: &'static C) -> usize {
            let h = c.alloc(O2k::new(9));
            assert_eq!(C::get(&h).ends(), 9 + 27);
            let p = C::get(&h) as *const O2k as usize;
            c.free(h);
            p
        }
        static F: Floor = Floor;
        let p = check(&F);
        assert_eq!(check(&F), p, "the floor pops what it pushed");
        check(Box::leak(Box::new(Boxed(ClassAllocator::new("ab-test")))));
        check(Box::leak(Box::new(OneWord(ClassAllocator::new("ab-test")))));
    }
}
