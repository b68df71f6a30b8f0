//! The randomized stress run as a soak: the engine of `tests/stress` for as long as asked.
//!
//! ```sh
//! cargo run --release --example stress -- --seconds 600 --threads 16 --seed 0x1234
//! ```
//!
//! Options: `--seconds N` (default 10), `--ops N` (default unbounded), `--seed S`
//! (decimal or 0x-hex; default: a new one, printed), `--threads T` (default: four per
//! core), `--life N` (mean operations per worker thread before it exits, default 5000),
//! `--check-every N` (operations between quiescent checks, default 50000),
//! `--no-allocator-drops` (keep run-time allocators until the end), `--panics P` (per
//! mille chance of an injected panic in recycled values and pool cleanups, default 20).
//! Exits non-zero, with the seed, when an invariant breaks.

#[path = "../tests/stress/engine.rs"]
mod engine;

use std::time::Duration;

use engine::{Knobs, Rng};

fn parse_u64(s: &str) -> u64 {
    match s.strip_prefix("0x") {
        Some(hex) => u64::from_str_radix(hex, 16),
        None => s.parse(),
    }
    .unwrap_or_else(|_| usage(&format!("not a number: {s}")))
}

fn usage(problem: &str) -> ! {
    eprintln!("stress: {problem}");
    eprintln!(
        "usage: stress [--seconds N] [--ops N] [--seed S] [--threads T] [--life N] \
         [--check-every N] [--no-allocator-drops] [--panics P]"
    );
    std::process::exit(2)
}

fn main() {
    let cores = std::thread::available_parallelism().map_or(2, |n| n.get());
    let fresh = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64);
    let mut knobs = Knobs {
        seed: Rng::new(fresh).next(),
        threads: 4 * cores,
        ops: u64::MAX,
        duration: Some(Duration::from_secs(10)),
        thread_life: 5_000,
        check_every: 50_000,
        drop_allocators: true,
        panic_per_mille: 20,
        verbose: true,
    };
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        let mut value = || {
            args.next()
                .unwrap_or_else(|| usage(&format!("{a} needs a value")))
        };
        match a.as_str() {
            "--seconds" => knobs.duration = Some(Duration::from_secs(parse_u64(&value()))),
            "--ops" => knobs.ops = parse_u64(&value()),
            "--seed" => knobs.seed = parse_u64(&value()),
            "--threads" => knobs.threads = parse_u64(&value()).max(1) as usize,
            "--life" => knobs.thread_life = parse_u64(&value()).max(1),
            "--check-every" => knobs.check_every = parse_u64(&value()).max(1),
            "--panics" => knobs.panic_per_mille = parse_u64(&value()).min(1000) as u32,
            "--no-allocator-drops" => knobs.drop_allocators = false,
            "-h" | "--help" => usage("a soak of the randomized stress run"),
            other => usage(&format!("unknown option {other}")),
        }
    }
    eprintln!("stress: {knobs:?}");
    match engine::run(knobs) {
        Ok(report) => println!("stress passed: {report}"),
        Err(problems) => {
            for p in &problems {
                eprintln!("{p}");
            }
            std::process::exit(1);
        }
    }
}
