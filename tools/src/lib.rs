//! proxalloc's measuring harness: where every shared workload and contender lives (a
//! bench adds only loops that no other target reports, such as `recycle`'s headers).
//!
//! - [`contenders`]: every allocator and object pool compared, behind the `Contender`
//!   trait (alloc, free, touch one object);
//! - [`arenas`]: the byte arenas of the pool workloads, behind the `Arena` trait;
//! - [`workloads`]: W1–W7 and the spike, each written once, generic over those traits;
//! - [`lineup`]: the contenders by name, type-erased, as the runs list them;
//! - [`runner`]: interleaved rounds and their markdown tables (and CSV);
//! - [`criterion_groups`]: the same workloads as criterion groups;
//! - [`rss`]: resident memory, and fresh processes to measure it in.
//!
//! Two kinds of program use it, both in this crate: the benches (`benches/`, criterion
//! and interleaved runs: `cargo bench -p proxalloc-tools --bench NAME`) and the binaries
//! (callgrind loops and footprint runs, see `src/bin/`).

pub mod arenas;
pub mod contenders;
pub mod criterion_groups;
pub mod lineup;
pub mod rss;
pub mod runner;
pub mod workloads;
