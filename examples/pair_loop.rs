//! A fixed number of W1 pairs (allocate, write, free one 64-byte object), for counting
//! instructions with callgrind when tuning the fast path:
//!
//! ```sh
//! cargo build --release --example pair_loop
//! valgrind --tool=callgrind --callgrind-out-file=/dev/null target/release/examples/pair_loop 1000000
//! ```
//! (The total divided by the pair count, minus the start-up cost measured with 0 pairs,
//! is the per-pair instruction count.)

use proxalloc::ClassAllocator;

static OBJS: ClassAllocator<[u64; 8]> = ClassAllocator::new("pair-loop");

#[inline(never)]
fn pair(i: u64) {
    let h = OBJS.alloc([i; 8]);
    std::hint::black_box(&*h);
}

fn main() {
    let n: u64 = std::env::args()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(10_000_000);
    for i in 0..n {
        pair(i);
    }
}
