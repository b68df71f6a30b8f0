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
//! Two kinds of program use it: the root crate's `benches/` (which include this file with
//! `#[path = "../tools/src/lib.rs"] mod harness;`, since a dev-dependency on this crate
//! would give each bench a second build of proxalloc besides the one under test) and this crate's binaries (callgrind loops and
//! footprint runs, see `src/bin/`). Paths inside the harness are relative (`super::`)
//! so that the same source compiles as this library and as a module of a bench.

pub mod arenas;
pub mod contenders;
pub mod criterion_groups;
pub mod lineup;
pub mod rss;
pub mod runner;
pub mod workloads;
