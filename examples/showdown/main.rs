//! The showdown: Traffic Server's TS-1684 experiment on a caching reverse proxy, against
//! glibc's malloc and mimalloc as global allocators (`demo.rs` says what it runs).
//! `cargo run --release -p proxalloc-tools --bin showdown` is the same program with
//! jemalloc too.

mod demo;
mod global;
mod load;
mod origin;
mod proxy;
mod server;

/// glibc's malloc or mimalloc, chosen from `SHOWDOWN_GLOBAL` before the first allocation.
#[global_allocator]
static GLOBAL: global::Global<global::NoJemalloc> = global::Global::new(None);

fn main() {
    demo::run();
}
