//! The showdown (`examples/showdown/`) with jemalloc as a third global allocator: the
//! same program, whose comparison then has rows for proxalloc's default mode over
//! jemalloc and for jemalloc alone. It lives here, with the other peers, because
//! jemalloc's C build takes minutes on a small machine and the example is the README's
//! first command.
//!
//! `cargo run --release -p proxalloc-tools --bin showdown [-- OPTIONS]` (the example's
//! options, and `--global jemalloc`).

#[path = "../../../examples/showdown/demo.rs"]
mod demo;
#[path = "../../../examples/showdown/global.rs"]
mod global;
#[path = "../../../examples/showdown/load.rs"]
mod load;
#[path = "../../../examples/showdown/origin.rs"]
mod origin;
#[path = "../../../examples/showdown/proxy.rs"]
mod proxy;
#[path = "../../../examples/showdown/server.rs"]
mod server;

/// glibc's malloc, mimalloc or jemalloc, chosen from `SHOWDOWN_GLOBAL` before the first
/// allocation.
#[global_allocator]
static GLOBAL: global::Global<tikv_jemallocator::Jemalloc> =
    global::Global::new(Some(tikv_jemallocator::Jemalloc));

fn main() {
    demo::run();
}
