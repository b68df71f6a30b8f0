//! Runs one workload of the peer suite for one contender, for profiling with
//! `valgrind --tool=callgrind` or `perf`:
//!
//! ```sh
//! cargo build --release -p proxalloc-tools --bin suite_profile
//! valgrind --tool=callgrind --callgrind-out-file=/dev/null \
//!     target/release/suite_profile proxalloc w1 1000000
//! ```
//! Arguments: contender name (as in the suite's tables), `w1`, `w2`, `w3`, `w3new` (W3
//! on two threads started for the run), `w4`, `w4polled` (64-byte objects), `w5` or `w5zeroed` (W5 with objects zeroed whole), and the
//! iteration count (pairs, rounds of 1024, batches of 64, or requests), and for W1-W4 the
//! object size (64, the default, or 256). Subtract a run with count 0 to get the per-iteration instruction count.
//! With `STATS` in the environment it also prints proxalloc's stats dump at the end.

use proxalloc_tools::lineup::{contender, mix, Work};
use proxalloc_tools::workloads::{Ends, Obj, Zeroed};

fn main() {
    let mut a = std::env::args().skip(1);
    let name = a.next().unwrap_or_else(|| "proxalloc".into());
    let work = a.next().unwrap_or_else(|| "w1".into());
    let n: u64 = a.next().and_then(|s| s.parse().ok()).unwrap_or(1_000_000);
    if work == "w5" || work == "w5zeroed" {
        let m = if work == "w5" {
            mix::<Ends>(&name)
        } else {
            mix::<Zeroed>(&name)
        }
        .expect("contender");
        (m.run)(false, 100);
        let ns = (m.run)(false, n);
        println!("{name} {work}: {ns:.2} ns/request");
        dump_if_asked();
        return;
    }
    let size: usize = a.next().and_then(|s| s.parse().ok()).unwrap_or(64);
    let c = match size {
        64 => contender::<Obj<64>>(&name),
        256 => contender::<Obj<256>>(&name),
        _ => panic!("object size: 64 or 256"),
    }
    .expect("contender");
    let w = match work.as_str() {
        "w1" => Work::W1(n),
        "w2" => Work::W2(n),
        "w3" => Work::W3(n),
        "w3new" => Work::W3New(n),
        "w4" => Work::W4(n),
        "w4polled" => Work::W4Polled(n),
        _ => panic!("workload: w1, w2, w3, w3new, w4, w4polled, w5 or w5zeroed"),
    };
    let warm = match work.as_str() {
        "w1" => Work::W1(1000),
        _ => Work::W2(1),
    };
    (c.run)(warm);
    let ns = (c.run)(w).expect("the workload applies to this contender");
    println!("{name} {work}: {ns:.2} ns/object");
    dump_if_asked();
}

/// With `STATS` in the environment, the allocator dump (depot trips, what is cached).
fn dump_if_asked() {
    if std::env::var_os("STATS").is_some() {
        proxalloc::stats::dump(&mut std::io::stdout()).expect("stdout");
    }
}
