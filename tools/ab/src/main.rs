//! proxalloc's wall-time A/B harness and its request-shape benchmark.
//!
//! The workloads use nothing of proxalloc but `ClassAllocator::new`/`with_config`,
//! `alloc` and `ClassBox` (its drop, `into_raw`, `from_raw`), so this one harness builds
//! against the library of any commit: `tools/ab/ab.sh OLD NEW` builds it twice and runs
//! the two builds in alternation.
//!
//! ```text
//! proxalloc-ab run [ROUNDS] [--only NAME,..] [--work TEXT,..] [--all]
//!     ROUNDS rounds (default 10) after one to warm up, each one sample of every cell
//!     (a contender on a workload), printed as `workload<TAB>contender<TAB>ns` lines;
//!     `--all` adds the floors that explain the others (`floor-vec`, `floor-2w`)
//! proxalloc-ab report OLD.tsv NEW.tsv [--old-label NAME] [--new-label NAME]
//!     the A/B table of two builds' samples
//! proxalloc-ab table FILE.tsv..
//!     one build's table; with several files (runs), each figure's range over them
//! proxalloc-ab bench [--runs R] [RUN_ARGS..]
//!     `run RUN_ARGS` in R processes (default 3), then their table: the request-shape
//!     benchmark in one command (with `--features peers`, against jemalloc and mimalloc)
//! ```
//!
//! The contenders: `floor`, `ClassBox`, `one-word` (a run-time allocator's object
//! through `into_raw`/`from_raw`; both in the library build's default mode: per-CPU
//! caches with `--features proxalloc/percpu`, per-thread ones without), `Thin`
//! (`static_class!` allocators' one-word handles;
//! and with `--all`, `floor-vec`: a thread-local `Vec` per size, as the suite's
//! `lower-bound`; `floor-2w`: the floor with a handle shaped as a `ClassBox`, two words
//! and a `Drop`); with the `percpu` feature
//! `ClassBox-percpu` and `one-word-percpu` (explicitly per-CPU) and `ClassBox-threads`
//! (explicitly per-thread); with `peers`, `jemalloc`, `mimalloc` and
//! `glibc`. The workloads: `W1 pair 64 B`, `W2 batch 64 B`, `W3 64 B 2t`, `request`
//! and `request 2t`.

// The harness's instruction-free `asm!` blocks hold pointers in registers and touch no
// memory, which is what `nomem` says.
#![allow(clippy::pointers_in_nomem_asm_block)]

mod contenders;
mod report;
mod workloads;

use std::io::Write as _;

use proxalloc::{static_class, ClassAllocator};
#[cfg(feature = "percpu")]
use proxalloc::{CacheMode, Config};

use contenders::{Boxed, Floor, Floor2, OneWord, ThinOf, VecFloor};
use report::Samples;
use workloads::{request, request_two, w1, w2, w3, Contender, Mix, O1k, O2k, O128, O512, O64};

/// Floors that explain the others, run only when asked (`--all`, `--only`): a `Vec`
/// per size, and the floor with a two-word handle.
const EXTRA_FLOORS: [&str; 2] = ["floor-vec", "floor-2w"];

/// One sample of one cell.
type Sample = Box<dyn Fn() -> f64>;

struct Cell {
    work: &'static str,
    who: &'static str,
    run: Sample,
}

fn leak<T>(v: T) -> &'static T {
    Box::leak(Box::new(v))
}

/// Samples' sizes: each takes a few hundred microseconds on one thread, a millisecond
/// or more on two (so that the workers' start at the barrier, tens of microseconds
/// apart at worst, is a small part of a sample).
const W1_PAIRS: u64 = 200_000;
const W2_BATCHES: u64 = 64;
const REQUESTS: u64 = 10_000;
const TWO_THREADS: u64 = 4;

/// The cells of contender `who`: its 64-byte allocator for W1–W3, its request mix.
fn add<C64, C2k, C512, C128, C1k>(
    cells: &mut Vec<Cell>,
    who: &'static str,
    c64: &'static C64,
    mix: &'static Mix<C2k, C512, C128, C1k>,
) where
    C64: Contender<O64>,
    C2k: Contender<O2k>,
    C512: Contender<O512>,
    C128: Contender<O128>,
    C1k: Contender<O1k>,
{
    let mut cell = |work, run: Sample| cells.push(Cell { work, who, run });
    cell("W1 pair 64 B", Box::new(move || w1(c64, W1_PAIRS)));
    cell("W2 batch 64 B", Box::new(move || w2(c64, W2_BATCHES)));
    cell(
        "W3 64 B 2t",
        Box::new(move || w3(c64, TWO_THREADS * W2_BATCHES)),
    );
    cell("request", Box::new(move || request(mix, REQUESTS)));
    cell(
        "request 2t",
        Box::new(move || request_two(mix, TWO_THREADS * REQUESTS)),
    );
}

/// A proxalloc contender: `$handle` (`Boxed` or `OneWord`) over one run-time allocator
/// per size, made by the generic function `$make(name)`.
macro_rules! proxalloc_cells {
    ($cells:expr, $who:expr, $handle:ident, $make:ident) => {{
        let mix = leak(Mix {
            k2: leak($handle($make("ab-2k"))),
            b512: leak($handle($make("ab-512"))),
            b128: leak($handle($make("ab-128"))),
            k1: leak($handle($make("ab-1k"))),
        });
        add($cells, $who, leak($handle($make("ab-64"))), mix);
    }};
}

/// An allocator as most users make one: the build's default mode (per-CPU caches with
/// the library's `percpu` feature, per-thread caches without).
fn default_mode<T>(name: &'static str) -> ClassAllocator<T> {
    ClassAllocator::new(name)
}

/// An allocator with per-thread caches, whatever the default.
#[cfg(feature = "percpu")]
fn per_thread<T>(name: &'static str) -> ClassAllocator<T> {
    ClassAllocator::with_config(name, Config::new().mode(CacheMode::ThreadCaches))
}

/// An allocator with per-CPU caches.
#[cfg(feature = "percpu")]
fn per_cpu<T>(name: &'static str) -> ClassAllocator<T> {
    ClassAllocator::with_config(name, Config::new().mode(CacheMode::PerCpu))
}

/// A contender that serves every size itself (the floor, a global allocator).
fn add_uniform<C>(cells: &mut Vec<Cell>, who: &'static str, c: &'static C)
where
    C: Contender<O64> + Contender<O2k> + Contender<O512> + Contender<O128> + Contender<O1k>,
{
    add(
        cells,
        who,
        c,
        leak(Mix {
            k2: c,
            b512: c,
            b128: c,
            k1: c,
        }),
    );
}

// The `Thin` contender's `static` allocators, one per size.
static_class!(Thin64: O64 = "ab-thin-64");
static_class!(Thin2k: O2k = "ab-thin-2k");
static_class!(Thin512: O512 = "ab-thin-512");
static_class!(Thin128: O128 = "ab-thin-128");
static_class!(Thin1k: O1k = "ab-thin-1k");

fn cells() -> Vec<Cell> {
    let mut cells = Vec::new();
    add_uniform(&mut cells, report::FLOOR, &Floor);
    add_uniform(&mut cells, "floor-vec", &VecFloor);
    add_uniform(&mut cells, "floor-2w", &Floor2);
    proxalloc_cells!(&mut cells, "ClassBox", Boxed, default_mode);
    proxalloc_cells!(&mut cells, "one-word", OneWord, default_mode);
    add(
        &mut cells,
        "Thin",
        &ThinOf::<Thin64>::NEW,
        leak(Mix {
            k2: &ThinOf::<Thin2k>::NEW,
            b512: &ThinOf::<Thin512>::NEW,
            b128: &ThinOf::<Thin128>::NEW,
            k1: &ThinOf::<Thin1k>::NEW,
        }),
    );
    #[cfg(feature = "percpu")]
    {
        proxalloc_cells!(&mut cells, "ClassBox-percpu", Boxed, per_cpu);
        proxalloc_cells!(&mut cells, "one-word-percpu", OneWord, per_cpu);
        proxalloc_cells!(&mut cells, "ClassBox-threads", Boxed, per_thread);
    }
    #[cfg(feature = "peers")]
    {
        use contenders::Global;
        add_uniform(
            &mut cells,
            "jemalloc",
            leak(Global(tikv_jemallocator::Jemalloc)),
        );
        add_uniform(&mut cells, "mimalloc", leak(Global(mimalloc::MiMalloc)));
        add_uniform(&mut cells, "glibc", leak(Global(std::alloc::System)));
    }
    cells
}

/// `--flag a,b`'s list, if given.
fn list(args: &[String], flag: &str) -> Option<Vec<String>> {
    let i = args.iter().position(|a| a == flag)?;
    let v = args
        .get(i + 1)
        .unwrap_or_else(|| fail(&format!("{flag} takes a comma-separated list")));
    Some(v.split(',').map(str::to_owned).collect())
}

fn fail(msg: &str) -> ! {
    eprintln!("proxalloc-ab: {msg}");
    std::process::exit(2)
}

fn read(path: &str) -> Samples {
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| fail(&format!("{path}: {e}")));
    Samples::parse(&text).unwrap_or_else(|e| fail(&format!("{path}: {e}")))
}

/// The positional arguments of `args`: those that are neither a flag nor a flag's value.
fn positional(args: &[String]) -> Vec<&String> {
    let mut out = Vec::new();
    let mut it = args.iter();
    while let Some(a) = it.next() {
        match a.as_str() {
            "--only" | "--work" | "--old-label" | "--new-label" | "--runs" => {
                it.next();
            }
            a if a.starts_with("--") => {}
            _ => out.push(a),
        }
    }
    out
}

fn run(args: &[String]) {
    let rounds: usize = match positional(args).as_slice() {
        [] => 10,
        [r] => r.parse().unwrap_or_else(|_| fail("ROUNDS is a number")),
        more => fail(&format!("one ROUNDS, not {more:?}")),
    };
    let only = list(args, "--only");
    let work = list(args, "--work");
    let all = args.iter().any(|a| a == "--all");
    let cells: Vec<Cell> = cells()
        .into_iter()
        .filter(|c| match &only {
            Some(o) => o.iter().any(|n| n == c.who),
            None => all || !EXTRA_FLOORS.contains(&c.who),
        })
        .filter(|c| {
            work.as_ref()
                .is_none_or(|w| w.iter().any(|t| c.work.contains(t.as_str())))
        })
        .collect();
    if cells.is_empty() {
        fail("no cell left by --only and --work");
    }
    let mut samples = vec![Vec::with_capacity(rounds); cells.len()];
    // Round 0 warms up. Each round starts one cell later than the one before, so that
    // no cell always runs first (or right after the same neighbour).
    for round in 0..=rounds {
        for k in 0..cells.len() {
            let i = (k + round) % cells.len();
            let ns = (cells[i].run)();
            if round > 0 {
                samples[i].push(ns);
            }
        }
    }
    let mut out = std::io::stdout().lock();
    for (c, s) in cells.iter().zip(&samples) {
        for ns in s {
            let _ = writeln!(out, "{}\t{}\t{ns:.3}", c.work, c.who);
        }
    }
}

/// `bench [--runs R] RUN_ARGS..`: `run RUN_ARGS` in R processes of its own, one after
/// the other (default 3: each process lays out its heap and thread-local storage anew),
/// then their table.
fn bench(args: &[String]) {
    let mut args = args.to_vec();
    let mut runs = 3;
    if let Some(i) = args.iter().position(|a| a == "--runs") {
        runs = args
            .get(i + 1)
            .and_then(|r| r.parse().ok())
            .filter(|&r: &usize| r > 0)
            .unwrap_or_else(|| fail("--runs takes a positive number"));
        args.drain(i..i + 2);
    }
    let me = std::env::current_exe().unwrap_or_else(|e| fail(&format!("this program: {e}")));
    let samples: Vec<Samples> = (0..runs)
        .map(|r| {
            eprintln!("proxalloc-ab: run {} of {runs}", r + 1);
            let out = std::process::Command::new(&me)
                .arg("run")
                .args(&args)
                .output()
                .unwrap_or_else(|e| fail(&format!("run: {e}")));
            if !out.status.success() {
                fail(&format!(
                    "a run failed: {}",
                    String::from_utf8_lossy(&out.stderr)
                ));
            }
            Samples::parse(&String::from_utf8_lossy(&out.stdout)).unwrap_or_else(|e| fail(&e))
        })
        .collect();
    print!("{}", report::table_runs(&samples));
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match args.first().map(String::as_str) {
        Some("run") => run(&args[1..]),
        Some("report") => {
            let [old, new] = [args.get(1), args.get(2)]
                .map(|p| p.unwrap_or_else(|| fail("report OLD.tsv NEW.tsv")));
            let label = |flag: &str, default: &String| match args.iter().position(|a| a == flag) {
                Some(i) => args
                    .get(i + 1)
                    .unwrap_or_else(|| fail(&format!("{flag} takes a name")))
                    .clone(),
                None => default.clone(),
            };
            print!(
                "{}",
                report::ab_table(
                    &read(old),
                    &read(new),
                    &label("--old-label", old),
                    &label("--new-label", new)
                )
            );
        }
        Some("table") if args.len() > 1 => {
            let runs: Vec<Samples> = args[1..].iter().map(|p| read(p)).collect();
            print!("{}", report::table_runs(&runs));
        }
        Some("bench") => bench(&args[1..]),
        _ => fail(
            "usage: run [ROUNDS] [--only NAME,..] [--work TEXT,..] [--all] \
             | report OLD NEW [--old-label A] [--new-label B] | table FILE.. \
             | bench [--runs R] [RUN_ARGS..]",
        ),
    }
}
