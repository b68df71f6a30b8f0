//! The scenarios of `tests/common` on std threads, without `--cfg loom` (the facade is
//! loom's under it). Miri runs these too (`.ci/miri`).
#![cfg(not(loom))]

mod common;

use std::sync::OnceLock;

use common::assert_settled;
use proxalloc::{BlockSource, ClassAllocator, RecyclingAllocator};
use proxalloc_downstream_tests::Body;

const ROUNDS: u64 = if cfg!(miri) { 3 } else { 200 };

#[test]
fn class_box_crosses_std_threads_through_mailboxes() {
    static MSGS: ClassAllocator<[u64; 8]> = ClassAllocator::new("downstream-std-mailbox");
    for _ in 0..ROUNDS {
        common::mailbox_handoff(&MSGS);
    }
    let s = MSGS.stats();
    assert_eq!((s.allocs, s.frees), (2 * ROUNDS, 2 * ROUNDS), "{s}");
    assert_settled(&s);
}

#[test]
fn request_body_and_pool_cross_a_std_channel() {
    static REQS: ClassAllocator<[u8; 64]> = ClassAllocator::new("downstream-std-reqs");
    static BODIES: RecyclingAllocator<Body> = RecyclingAllocator::new("downstream-std-bodies");
    static SOURCE: OnceLock<BlockSource> = OnceLock::new();
    let source = SOURCE.get_or_init(|| BlockSource::new(1 << 20));
    for _ in 0..ROUNDS {
        common::channel_handoff(&REQS, &BODIES, source);
    }
    let (r, b) = (REQS.stats(), BODIES.stats());
    assert_eq!((r.allocs, r.frees), (ROUNDS, ROUNDS), "{r}");
    assert_eq!((b.allocs, b.frees), (ROUNDS, ROUNDS), "{b}");
    let blocks = source.stats()[0];
    assert_eq!(blocks.allocs, ROUNDS, "one 8 KiB block per pool: {blocks}");
}

#[test]
fn sessions_are_recycled_across_std_threads() {
    for _ in 0..ROUNDS {
        common::two_sessions(&proxalloc_downstream_tests::SESSIONS);
    }
    let s = proxalloc_downstream_tests::SESSIONS.stats();
    assert_eq!((s.allocs, s.frees), (2 * ROUNDS, 2 * ROUNDS), "{s}");
    // Off loom, sessions are kept: far fewer were created than handed out.
    assert!(s.backing_allocs < s.allocs, "{s}");
}
