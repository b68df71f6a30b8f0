use super::*;

/// Set in the child process of
/// `without_glibcs_areas_our_own_serve_and_a_refused_one_is_asked_for_once`.
const OWN_AREA_CHILD: &str = "PROXALLOC_TEST_OWN_AREA_CHILD";

/// The child's side: glibc registers no area (its tunable says so), so this process
/// registers its own, and the detecting thread must be able to use it; a thread whose
/// rseq is someone else's is refused once and not asked for again, and an allocator
/// first used there is still per-CPU for the others.
#[test]
#[ignore = "run in a child process by its parent test"]
fn own_areas_child() {
    if std::env::var_os(OWN_AREA_CHILD).is_none() {
        return;
    }
    if glibc_offset().is_some() {
        println!("glibc registers areas despite its tunable: nothing to test");
        return;
    }
    use crate::{CacheMode, ClassAllocator, Config};
    // The first thread to ask registers its own area, which decides for the process.
    assert!(
        available(),
        "rseq works here (the parent checked): our own area must"
    );
    assert!(!thread_area().is_null(), "this thread's own area");
    let a = std::sync::Arc::new(ClassAllocator::<u64>::with_config(
        "own-areas",
        Config::new().mode(CacheMode::PerCpu),
    ));
    let on_foreign = a.clone();
    std::thread::spawn(move || {
        std::thread_local! {
            static FOREIGN: UnsafeCell<Area> = const {
                UnsafeCell::new(Area::UNREGISTERED)
            };
        }
        // Another library's registration, as tcmalloc makes where glibc makes none.
        // SAFETY: a 32-byte, 32-aligned area living until the thread exits.
        let r = FOREIGN.with(|a| unsafe { syscall(SYS_RSEQ, a.get(), 32u32, 0, RSEQ_SIG) });
        assert_eq!(r, 0, "the foreign registration");
        let registrations = REGISTRATIONS.load(Ordering::Relaxed);
        assert!(available(), "decided for the process, not for this thread");
        // The allocator's first use (its engine is built on this thread, which has
        // no area) and this thread's operations, in a per-thread cache.
        drop((0..1000).map(|i| on_foreign.alloc(i)).collect::<Vec<_>>());
        assert_eq!(on_foreign.mode(), CacheMode::PerCpu);
        assert_eq!(on_foreign.stats().threads, 1, "this thread's own cache");
        // Which serves it from then on: a round of operations takes nothing from the
        // depot or the backing allocator, and makes no slow path's refill.
        let before = on_foreign.stats();
        drop((0..100).map(|i| on_foreign.alloc(i)).collect::<Vec<_>>());
        let after = on_foreign.stats();
        assert_eq!(
            (after.backing_allocs, after.refills),
            (before.backing_allocs, before.refills),
            "the thread cache serves a thread without an area: {after}"
        );
        for _ in 0..100 {
            assert!(thread_area().is_null());
        }
        let asked = REGISTRATIONS.load(Ordering::Relaxed) - registrations;
        assert_eq!(asked, 1, "asked for once");
    })
    .join()
    .unwrap();
    drop((0..1000).map(|i| a.alloc(i)).collect::<Vec<_>>());
    // A thread with an area makes no thread cache of a per-CPU allocator (the
    // foreign thread's went at its exit): the CPU caches serve it.
    let s = a.stats();
    assert_eq!(s.threads, 0, "{s}");
    assert!(s.is_consistent() && s.live == 0 && s.allocs == 2100, "{s}");
    // Nothing lost inside the allocator (`is_consistent` would count it as cached): the
    // foreign thread is joined, so a trim leaves nothing reserved.
    a.trim();
    let s = a.stats();
    assert!(s.is_consistent(), "{s}");
    assert_eq!((s.live, s.reserved_objects()), (0, 0), "{s}");
    println!("own areas: checked");
}

#[test]
fn without_glibcs_areas_our_own_serve_and_a_refused_one_is_asked_for_once() {
    if !available() {
        eprintln!("rseq unavailable here: nothing to test");
        return;
    }
    let out = std::process::Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "core::rseq::platform::area::tests::own_areas_child",
        ])
        .args(["--include-ignored", "--nocapture", "--test-threads=1"])
        .env("GLIBC_TUNABLES", "glibc.pthread.rseq=0")
        .env(OWN_AREA_CHILD, "1")
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success()
            && (stdout.contains("own areas: checked")
                || stdout.contains("glibc registers areas")),
        "child: {}\n{stdout}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
}
