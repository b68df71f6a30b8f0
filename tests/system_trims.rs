//! When proxalloc asks the system allocator for its free memory back (glibc's
//! `malloc_trim`): at a trim, once the bytes it gave the global allocator in batches since
//! its last request (trims' releases and the spills over depot budgets between them)
//! reach 1 MiB; at every `trim_all` (twice when anything was given since the last
//! request: before its trims and after); and at an allocator's or a block source's drop
//! only for a release of 1 MiB of its own (the last `Arc` of an allocator may be dropped
//! by any thread's free).
//!
//! One test in a process of its own: every other test's spills and trims would move the
//! process-wide count, so only here can it be checked exactly, requests not made included.

use std::sync::Arc;

use proxalloc::stats::{system_trims, SystemTrims};
use proxalloc::{BlockSource, ClassAllocator, Config, Owned};

type Kib = [u8; 1024];

const KIB: u64 = 1024;
const THRESHOLD: u64 = 1 << 20;

fn burst(a: &ClassAllocator<Kib>, n: usize) {
    drop((0..n).map(|_| a.alloc([0; 1024])).collect::<Vec<_>>());
}

fn now() -> SystemTrims {
    system_trims()
}

#[test]
fn requests_follow_the_bytes_given_since_the_last() {
    // A known start: `trim_all` always asks.
    let before = now().requests;
    proxalloc::trim_all();
    let start = now();
    assert_eq!(
        start.requests,
        before + 1,
        "trim_all asks even with nothing to give"
    );
    assert_eq!(start.given_since, 0);

    // Releases below the threshold are counted, not asked for; the one that takes the
    // count past it asks, and the count starts again.
    let roomy = Config::new().depot_bytes(4 << 20);
    let a = ClassAllocator::<Kib>::with_config("system-trims-a", roomy);
    let b = ClassAllocator::<Kib>::with_config("system-trims-b", roomy);
    burst(&a, 600);
    burst(&b, 600);
    assert_eq!(now(), start, "all cached: nothing went to the system");
    assert_eq!(a.trim() as u64, 600 * KIB);
    assert_eq!(
        now(),
        SystemTrims {
            requests: start.requests,
            given_since: 600 * KIB
        },
        "600 KiB: counted, below the threshold"
    );
    assert_eq!(b.trim() as u64, 600 * KIB);
    let asked = now();
    assert_eq!(
        asked,
        SystemTrims {
            requests: start.requests + 1,
            given_since: 0
        },
        "1.2 MiB since the last request: asked"
    );

    // Spills over a depot budget between trims count too: a trim that releases nothing
    // asks for them.
    let tight =
        ClassAllocator::<Kib>::with_config("system-trims-tight", Config::new().depot_bytes(0));
    burst(&tight, 2000);
    let spilled = tight.stats().backing_frees * KIB;
    assert!(
        spilled >= THRESHOLD,
        "the caches keep far less than 2000 KiB: {spilled}"
    );
    assert_eq!(
        now(),
        SystemTrims {
            requests: asked.requests,
            given_since: spilled
        },
        "every object that went back to the system, in batches"
    );
    proxalloc::trim_idle(); // the first call: it releases nothing, and asks
    let after_spills = now();
    assert_eq!(after_spills.requests, asked.requests + 1);
    assert_eq!(after_spills.given_since, 0);

    // A small spill and a trim that keeps the count below the threshold: no request.
    burst(&tight, 300);
    let given = tight.stats().backing_frees * KIB - spilled;
    assert!(given < THRESHOLD / 2, "{given}");
    let released = tight.trim() as u64;
    assert_eq!(
        now(),
        SystemTrims {
            requests: after_spills.requests,
            given_since: given + released
        },
        "{given} B spilled and {released} B trimmed: below the threshold"
    );

    // A block source's large blocks count as they go to the system.
    let source = BlockSource::new(0);
    let block = source.alloc(256 << 10).expect("memory");
    // SAFETY: from `source`, not used again.
    unsafe { source.free(block) };
    assert_eq!(now().given_since, given + released + (256 << 10));

    // A user's block allocator's memory is not counted, large blocks or classes (the
    // system allocator through the user's door: glibc's memory, but not proxalloc's to
    // count, since the user frees it).
    let user = BlockSource::with_block_allocator(0, Arc::new(std::alloc::System));
    let given = now().given_since;
    for size in [8 << 10, 256 << 10] {
        let block = user.alloc(size).expect("memory");
        // SAFETY: from `user`, not used again.
        unsafe { user.free(block) };
    }
    user.trim();
    drop(user);
    assert_eq!(
        now().given_since,
        given,
        "the user's blocks are not glibc's"
    );

    // An allocator's drop releases what it cached, and asks past the threshold.
    let dropped = ClassAllocator::<Kib>::with_config("system-trims-dropped", roomy);
    burst(&dropped, 1100);
    let before = now();
    drop(dropped);
    assert_eq!(
        now(),
        SystemTrims {
            requests: before.requests + 1,
            given_since: 0
        },
        "1,100 KiB released by the drop"
    );

    // But not for others' spills: the last `Owned` handle of a small allocator drops it
    // on a free, which must not walk glibc's heap for what another allocator spilled.
    burst(&tight, 2000);
    let spilled = now();
    assert!(spilled.given_since >= THRESHOLD);
    let small = Arc::new(ClassAllocator::<u64>::new("system-trims-owned"));
    let handle: Owned<u64> = small.alloc_arc(7);
    drop(small);
    drop(handle); // the allocator's last `Arc`
    assert_eq!(
        now().requests,
        spilled.requests,
        "a drop asks for its own release only"
    );
    // Nor a block source's drop for less than 1 MiB of its own; for 1 MiB, it does.
    for cached in [768 << 10, 1 << 20] {
        let source = BlockSource::new(4 << 20);
        let blocks: Vec<_> = (0..cached / (256 << 10))
            .map(|_| source.alloc(256 << 10).expect("memory"))
            .collect();
        for b in blocks {
            // SAFETY: from `source`, not used again.
            unsafe { source.free(b) };
        }
        let before = now();
        drop(source);
        let asked = u64::from(cached >= 1 << 20);
        assert_eq!(
            now().requests,
            before.requests + asked,
            "{cached} B of its own"
        );
    }

    // Exactly the threshold asks.
    assert_eq!(now().given_since, 0);
    burst(&a, 1024);
    let before = now();
    assert_eq!(a.trim() as u64, THRESHOLD);
    assert_eq!(now().requests, before.requests + 1, "1 MiB exactly");

    // `trim_all` asks with nothing given since: once, after its trims.
    proxalloc::trim_all();
    assert_eq!(
        now(),
        SystemTrims {
            requests: before.requests + 2,
            given_since: 0
        }
    );
    // With something given since the last request, it asks for that first, then for
    // what its trims release (they join glibc's bins in two steps: less stays resident).
    burst(&tight, 500);
    assert!(now().given_since > 0);
    let released = proxalloc::trim_all();
    assert!(released > 0 && released < 1 << 20, "{released}");
    assert_eq!(
        now(),
        SystemTrims {
            requests: before.requests + 4,
            given_since: 0
        },
        "below the threshold, still two requests"
    );
}
