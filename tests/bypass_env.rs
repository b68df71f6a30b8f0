//! `PROXALLOC_BYPASS=1` forces bypass mode (its own test binary: it sets the environment).

use proxalloc::{CacheMode, ClassAllocator, BYPASS_ENV};

#[test]
fn environment_variable_forces_bypass() {
    std::env::set_var(BYPASS_ENV, "1");
    let a = ClassAllocator::<u64>::new("env");
    assert_eq!(a.mode(), CacheMode::Bypass);
    drop((0..10).map(|i| a.alloc(i)).collect::<Vec<_>>());
    let s = a.stats();
    assert_eq!(
        (s.backing_allocs, s.backing_frees, s.live),
        (10, 10, 0),
        "{s}"
    );
    std::env::set_var(BYPASS_ENV, "off");
    // The default mode again (per-CPU caches fall back to per-thread ones where rseq
    // cannot work).
    let mode = ClassAllocator::<u64>::new("env2").mode();
    assert_ne!(mode, CacheMode::Bypass);
    assert!(
        mode == CacheMode::default() || mode == CacheMode::ThreadCaches,
        "{mode:?}"
    );
}
