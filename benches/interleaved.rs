//! Interleaved ratio runner: every contender runs one sample in turn, round after round,
//! so machine state changes (this 2-core box switches between a fast and a slow state)
//! hit all of them alike. Reports the minimum per-operation time over all samples and
//! the ratio to the lower bound and to the best peer.
//!
//! `cargo bench --bench interleaved -- [rounds]` (default 200 rounds).

mod common;

use common::*;

struct Row {
    name: &'static str,
    peer: bool,
    samples: Vec<f64>,
}

fn row<C: Contender>(peer: bool) -> (Row, fn(u64), fn(u64)) {
    (
        Row {
            name: C::NAME,
            peer,
            samples: Vec::new(),
        },
        C::w1,
        C::w2,
    )
}

fn report(title: &str, rows: &[Row]) {
    let min = |r: &Row| r.samples.iter().copied().fold(f64::INFINITY, f64::min);
    let lower = rows.iter().find(|r| r.name == "lower-bound").map(min).unwrap();
    let best_peer = rows.iter().filter(|r| r.peer).map(min).fold(f64::INFINITY, f64::min);
    println!("\n{title} (min of {} interleaved samples, ns per operation)", rows[0].samples.len());
    println!("| contender | ns/op | vs lower bound | vs best peer |");
    println!("| --- | ---: | ---: | ---: |");
    for r in rows {
        let m = min(r);
        println!("| {} | {:.2} | {:.2}x | {:.2}x |", r.name, m, m / lower, m / best_peer);
    }
}

fn main() {
    let rounds: usize = std::env::args()
        .skip(1)
        .find_map(|a| a.parse().ok())
        .unwrap_or(200);
    let mut w1_rows = Vec::new();
    let mut w2_rows = Vec::new();
    let mut fns = Vec::new();
    for (r, f1, f2) in [
        row::<LowerBound>(false),
        row::<Proxalloc>(false),
        row::<ProxallocLocal>(false),
        row::<DepotOnly>(false),
        row::<SystemBox>(true),
        row::<Mimalloc>(true),
    ] {
        w1_rows.push(Row { samples: Vec::new(), ..r });
        w2_rows.push(Row { samples: Vec::new(), ..r });
        fns.push((f1, f2));
    }
    const W1_ITERS: u64 = 20_000;
    const W2_ROUNDS: u64 = 20;
    // Warm every contender's caches first.
    for (f1, f2) in &fns {
        f1(W1_ITERS);
        f2(W2_ROUNDS);
    }
    for _ in 0..rounds {
        for (i, (f1, f2)) in fns.iter().enumerate() {
            w1_rows[i].samples.push(time(|| f1(W1_ITERS)) / W1_ITERS as f64);
            w2_rows[i].samples.push(time(|| f2(W2_ROUNDS)) / (W2_ROUNDS as f64 * BATCH as f64));
        }
    }
    report("W1 pair: alloc, write, free one 64 B object", &w1_rows);
    report("W2 batch: 1024 live 64 B objects, then free all (per object: alloc + free)", &w2_rows);
}
