use super::{trim_each, trim_fully, Registered};
use crate::core::backing::{requested_since, OS_RELEASES};
use crate::{ClassAllocator, Config};

/// Process-wide requests to the OS so far. Other tests' trims ask too, so these tests
/// check that a request was made after their releases (by their own trim, or by another
/// thread's, which took those bytes along), never that none was: `tests/system_trims.rs`
/// checks the threshold exactly, in a process of its own.
fn requests() -> u64 {
    crate::core::backing::system_trims().0
}

/// Allocators that each release less than the threshold for asking the OS, and more
/// together: a walk over them asks once, at its end; and two separate trims ask by the
/// second, whose release takes the count since the last request past the threshold.
/// (A walk over these two allocators only: the real `trim_all` would trim other tests'
/// allocators.)
#[test]
fn trims_that_release_a_megabyte_between_them_ask_the_os() {
    let config = Config::new().depot_bytes(4 << 20);
    let a = ClassAllocator::<[u8; 1024]>::with_config("registry-os-release-a", config);
    let b = ClassAllocator::<[u8; 1024]>::with_config("registry-os-release-b", config);
    for x in [&a, &b] {
        drop((0..600).map(|_| x.alloc([0; 1024])).collect::<Vec<_>>());
    }
    let (before, mine) = (requests(), OS_RELEASES.with(|n| n.get()));
    let released = trim_each(
        |trim| {
            for e in [a.engine(), b.engine()] {
                trim(e as &dyn Registered);
            }
        },
        |s| s.trim(),
    );
    assert_eq!(released, 2 * 600 * 1024);
    assert!(
        requested_since(before),
        "1.2 MiB released in all: a request"
    );
    assert!(
        OS_RELEASES.with(|n| n.get()) - mine <= 1,
        "one request for the walk at most, not one per allocator"
    );
    for x in [&a, &b] {
        drop((0..600).map(|_| x.alloc([0; 1024])).collect::<Vec<_>>());
    }
    let before = requests();
    assert_eq!(a.trim() + b.trim(), 2 * 600 * 1024);
    assert!(
        requested_since(before),
        "600 KiB each, 1.2 MiB since the last request"
    );
}

/// A full trim (`trim_all`'s, here over two allocators only) asks the OS even when it
/// releases little or nothing: what went to the system allocator earlier (spills over a
/// depot budget, small trims) is still in glibc's bins. (Once after the trims, always, and
/// once before them if anything was given since the last request, which other tests'
/// spills may have done: `tests/system_trims.rs` counts exactly.)
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
    let mine = || OS_RELEASES.with(|n| n.get());
    let before = mine();
    let released = trim_fully(walk);
    assert!(
        released < 1 << 20,
        "at most this thread's two magazines: {released}"
    );
    assert!(
        (1..=2).contains(&(mine() - before)),
        "below the threshold, and asked"
    );
    let before = mine();
    assert_eq!(trim_fully(walk), 0, "nothing left to release");
    assert!(
        (1..=2).contains(&(mine() - before)),
        "nothing released, and asked"
    );
}

/// One allocator's `trim` and `trim_idle` that release a megabyte ask the OS (the
/// single-allocator spike that `malloc_trim` is called for).
#[test]
fn an_allocators_trim_and_trim_idle_ask_the_os_for_a_megabyte() {
    let a = ClassAllocator::<[u8; 1024]>::with_config(
        "registry-os-release-one",
        Config::new().depot_bytes(4 << 20),
    );
    let spike = || drop((0..1100).map(|_| a.alloc([0; 1024])).collect::<Vec<_>>());
    spike();
    let before = requests();
    assert_eq!(a.trim(), 1100 * 1024);
    assert!(requested_since(before), "trim");
    spike();
    assert_eq!(a.trim_idle(), 0, "the first call starts the interval");
    std::thread::sleep(crate::core::idle::MIN_IDLE_INTERVAL * 3);
    let before = requests();
    assert_eq!(a.trim_idle(), 1100 * 1024);
    assert!(requested_since(before), "trim_idle");
}
