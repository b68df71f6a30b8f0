//! Misuse detection (debug builds, or release with `--features debug-checks`): a double
//! free and a free into the wrong allocator panic with a message naming the allocator and
//! the address; freed objects are poisoned.
#![cfg(all(any(debug_assertions, feature = "debug-checks"), not(miri)))]

use proxalloc::{ClassAllocator, ClassBox, POISON};

#[test]
#[should_panic(expected = "double free of 0x")]
fn double_free_panics() {
    let a = ClassAllocator::<u64>::new("double");
    let raw = ClassBox::into_raw(a.alloc(7));
    // SAFETY (deliberately violated): the second `from_raw` reuses a freed pointer.
    unsafe {
        drop(ClassBox::from_raw(&a, raw));
        drop(ClassBox::from_raw(&a, raw));
    }
}

#[test]
#[should_panic(expected = "of allocator \"owner\" freed into allocator \"intruder\"")]
fn free_into_the_wrong_allocator_panics() {
    let owner = ClassAllocator::<u64>::new("owner");
    let intruder = ClassAllocator::<u64>::new("intruder");
    let raw = ClassBox::into_raw(owner.alloc(7));
    // SAFETY (deliberately violated): `raw` belongs to `owner`.
    drop(unsafe { ClassBox::from_raw(&intruder, raw) });
}

#[test]
fn message_names_the_address() {
    let a = ClassAllocator::<u64>::new("addr");
    let raw = ClassBox::into_raw(a.alloc(1));
    // SAFETY: from `into_raw` on `a`.
    drop(unsafe { ClassBox::from_raw(&a, raw) });
    let err = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        // SAFETY (deliberately violated): already freed.
        drop(unsafe { ClassBox::from_raw(&a, raw) });
    }))
    .unwrap_err();
    let msg = err.downcast_ref::<String>().unwrap();
    assert!(
        msg.contains(&format!("{:#x}", raw.as_ptr() as usize)),
        "{msg}"
    );
    assert!(msg.contains("\"addr\""), "{msg}");
    // The allocator is still consistent: the failed free touched nothing.
    let s = a.stats();
    assert_eq!((s.allocs, s.frees, s.live), (1, 1, 0), "{s}");
}

#[test]
fn freed_objects_are_poisoned() {
    let a = ClassAllocator::<[u64; 4]>::new("poison");
    let h = a.alloc([1, 2, 3, 4]);
    let p = ClassBox::as_ptr(&h).cast::<u8>();
    drop(h);
    // The memory stays allocated (it sits in this thread's cache), so reading it is
    // defined; it must hold the poison pattern, not the old value.
    // SAFETY: the object's memory is still allocated by the global allocator.
    let bytes = unsafe { std::slice::from_raw_parts(p, 32) };
    assert!(bytes.iter().all(|&b| b == POISON), "{bytes:?}");
}

#[test]
fn correct_use_does_not_trip_the_checks() {
    static A: ClassAllocator<String> = ClassAllocator::new("fine");
    let a = &A;
    let v: Vec<_> = (0..1000).map(|i| a.alloc(i.to_string())).collect();
    let moved = std::thread::spawn(move || v.len()).join();
    assert_eq!(moved.unwrap(), 1000);
    let x = ClassBox::into_inner(a.alloc("x".into()));
    assert_eq!(x, "x");
    a.with_local(|c| {
        let y = c.alloc("y".into());
        c.free(y);
    });
}
