use super::{trim_each, trim_fully, Registered};
use crate::core::backing::OS_RELEASES;
use crate::{ClassAllocator, Config};

/// Allocators that each release less than the threshold for asking the OS, and more
/// together: one request for the whole walk, none for each. (A walk over these two
/// allocators only: the real `trim_all` would trim other tests' allocators.)
#[test]
fn a_walk_of_trims_asks_the_os_once_for_what_they_release_together() {
    let config = Config::new().depot_bytes(4 << 20);
    let a = ClassAllocator::<[u8; 1024]>::with_config("registry-os-release-a", config);
    let b = ClassAllocator::<[u8; 1024]>::with_config("registry-os-release-b", config);
    for x in [&a, &b] {
        drop((0..600).map(|_| x.alloc([0; 1024])).collect::<Vec<_>>());
    }
    let before = OS_RELEASES.with(|n| n.get());
    let released = trim_each(
        |trim| {
            for e in [a.engine(), b.engine()] {
                trim(e as &dyn Registered);
            }
        },
        |s| s.trim(),
    );
    assert_eq!(released, 2 * 600 * 1024);
    assert_eq!(
        OS_RELEASES.with(|n| n.get()) - before,
        1,
        "1.2 MiB released in all: one request to the OS"
    );
    for x in [&a, &b] {
        drop((0..600).map(|_| x.alloc([0; 1024])).collect::<Vec<_>>());
    }
    let before = OS_RELEASES.with(|n| n.get());
    assert_eq!(a.trim() + b.trim(), 2 * 600 * 1024);
    assert_eq!(
        OS_RELEASES.with(|n| n.get()),
        before,
        "600 KiB per allocator: below the threshold each time"
    );
}

/// A full trim (`trim_all`'s, here over two allocators only) asks the OS once even when
/// it releases little or nothing: what went to the system allocator earlier (spills over
/// a depot budget, small trims) is still in glibc's bins.
#[test]
fn a_full_trim_asks_the_os_whatever_it_releases() {
    // No depot: every spill goes to the system allocator, and a trim finds nothing.
    let config = Config::new().depot_bytes(0);
    let a = ClassAllocator::<[u8; 1024]>::with_config("registry-os-release-full-a", config);
    let b = ClassAllocator::<[u8; 64]>::with_config("registry-os-release-full-b", config);
    drop((0..600).map(|_| a.alloc([0; 1024])).collect::<Vec<_>>());
    let walk = |trim: &mut dyn FnMut(&dyn Registered)| {
        for e in [a.engine(), b.engine()] {
            trim(e as &dyn Registered);
        }
    };
    let before = OS_RELEASES.with(|n| n.get());
    let released = trim_fully(walk);
    assert!(
        released < 1 << 20,
        "at most this thread's two magazines: {released}"
    );
    assert_eq!(
        OS_RELEASES.with(|n| n.get()) - before,
        1,
        "below the threshold"
    );
    let before = OS_RELEASES.with(|n| n.get());
    assert_eq!(trim_fully(walk), 0, "nothing left to release");
    assert_eq!(
        OS_RELEASES.with(|n| n.get()) - before,
        1,
        "nothing released"
    );
}

/// One allocator's `trim` and `trim_idle` that release a megabyte ask the OS once
/// each (the single-allocator spike that `malloc_trim` is called for).
#[test]
fn an_allocators_trim_and_trim_idle_ask_the_os_for_a_megabyte() {
    let a = ClassAllocator::<[u8; 1024]>::with_config(
        "registry-os-release-one",
        Config::new().depot_bytes(4 << 20),
    );
    let spike = || drop((0..1100).map(|_| a.alloc([0; 1024])).collect::<Vec<_>>());
    let asked = || OS_RELEASES.with(|n| n.get());
    spike();
    let before = asked();
    assert_eq!(a.trim(), 1100 * 1024);
    assert_eq!(asked() - before, 1, "trim");
    spike();
    let before = asked();
    assert_eq!(a.trim_idle(), 0, "the first call starts the interval");
    std::thread::sleep(crate::core::idle::MIN_IDLE_INTERVAL * 3);
    assert_eq!(a.trim_idle(), 1100 * 1024);
    assert_eq!(asked() - before, 1, "trim_idle");
}
