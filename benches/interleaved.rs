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
    run: fn(u64),
    samples: Vec<f64>,
}

/// Rows for W1 and W2 of one contender.
fn rows<C: Contender>(peer: bool) -> [Row; 2] {
    let row = |run| Row {
        name: C::NAME,
        peer,
        run,
        samples: Vec::new(),
    };
    [row(C::w1), row(C::w2)]
}

fn report(title: &str, rows: &[Row]) {
    let min = |r: &Row| r.samples.iter().copied().fold(f64::INFINITY, f64::min);
    let lower = rows
        .iter()
        .find(|r| r.name == "lower-bound")
        .map(min)
        .unwrap();
    let best_peer = rows
        .iter()
        .filter(|r| r.peer)
        .map(min)
        .fold(f64::INFINITY, f64::min);
    println!(
        "\n{title} (min of {} interleaved samples, ns per operation)",
        rows[0].samples.len()
    );
    println!("| contender | ns/op | vs lower bound | vs best peer |");
    println!("| --- | ---: | ---: | ---: |");
    for r in rows {
        let m = min(r);
        println!(
            "| {} | {:.2} | {:.2}x | {:.2}x |",
            r.name,
            m,
            m / lower,
            m / best_peer
        );
    }
}

fn main() {
    let rounds: usize = std::env::args()
        .skip(1)
        .find_map(|a| a.parse().ok())
        .unwrap_or(200);
    let mut w1_rows = Vec::new();
    let mut w2_rows = Vec::new();
    for [w1, w2] in [
        rows::<LowerBound>(false),
        rows::<Proxalloc>(false),
        rows::<ProxallocLocal>(false),
        rows::<DepotOnly>(false),
        rows::<SystemBox>(true),
        rows::<Mimalloc>(true),
    ] {
        w1_rows.push(w1);
        w2_rows.push(w2);
    }
    const W1_ITERS: u64 = 20_000;
    const W2_ROUNDS: u64 = 20;
    // Warm every contender's caches first.
    for (w1, w2) in w1_rows.iter().zip(&w2_rows) {
        (w1.run)(W1_ITERS);
        (w2.run)(W2_ROUNDS);
    }
    for _ in 0..rounds {
        for (w1, w2) in w1_rows.iter_mut().zip(&mut w2_rows) {
            let run = w1.run;
            w1.samples.push(time(|| run(W1_ITERS)) / W1_ITERS as f64);
            let run = w2.run;
            w2.samples
                .push(time(|| run(W2_ROUNDS)) / (W2_ROUNDS as f64 * BATCH as f64));
        }
    }
    report("W1 pair: alloc, write, free one 64 B object", &w1_rows);
    report(
        "W2 batch: 1024 live 64 B objects, then free all (per object: alloc + free)",
        &w2_rows,
    );
}
