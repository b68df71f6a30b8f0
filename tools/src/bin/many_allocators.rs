//! W5's request mix on allocators made after others: where an allocator's table index
//! falls (inline in the thread's table, or boxed past it) decides its lookup, and
//! indices go in order of first use, process-wide.
//!
//! ```sh
//! cargo run --release -p proxalloc-tools --bin many_allocators -- --before 40 proxalloc proxalloc-one-word
//! ```
//! `--before N` makes and uses N allocators first (default 0); then each named W5
//! contender runs three rounds of 20 samples of 20,000 requests, and the minimum of each
//! round is printed (ns per request).

use proxalloc::ClassAllocator;
use proxalloc_tools::lineup::mix;
use proxalloc_tools::workloads::Ends;

fn main() {
    let mut args = std::env::args().skip(1).peekable();
    let mut before = 0;
    let mut names = Vec::new();
    while let Some(a) = args.next() {
        if a == "--before" {
            before = args
                .next()
                .and_then(|n| n.parse().ok())
                .expect("--before N");
        } else {
            names.push(a);
        }
    }
    for i in 0..before {
        let a: &'static ClassAllocator<u64> =
            Box::leak(Box::new(ClassAllocator::new("many-allocators-before")));
        drop(a.alloc(i as u64));
    }
    let mixes: Vec<_> = names
        .iter()
        .map(|n| mix::<Ends>(n).unwrap_or_else(|| panic!("no W5 contender {n:?}")))
        .collect();
    for round in 0..3 {
        for (name, m) in names.iter().zip(&mixes) {
            (m.run)(false, 100);
            let best = (0..20)
                .map(|_| (m.run)(false, 20_000))
                .fold(f64::MAX, f64::min);
            println!("round {round}: {name} after {before}: {best:.2} ns/request");
        }
    }
}
