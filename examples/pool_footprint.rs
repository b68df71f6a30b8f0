//! W7, the Subversion pattern: 200,000 iterations, each allocating 1–8 buffers of
//! 1–64 KiB into a per-iteration pool and clearing it, with a 1 MiB buffer every 1000th
//! iteration. Reports peak RSS and RSS after the last clear, also over the RSS at start
//! (which varies by a hundred KiB or so from process to process), for one contender per
//! process (run each in a fresh process; `--all` does that for every contender). The
//! pool contenders also print, on stderr, where the source's blocks are at the end: in
//! the thread's cache, in the depots, and how many were taken from the system.
//!
//! ```sh
//! cargo run --release --example pool_footprint -- --all
//! cargo run --release --example pool_footprint -- pool-2M   # one contender
//! ```

use std::alloc::Layout;
use std::hint::black_box;

use proxalloc::{BlockSource, Pool};

const ITERATIONS: u64 = 200_000;
const CONTENDERS: [&str; 5] = ["pool-2M", "pool-4M", "pool-unlimited", "bumpalo", "malloc"];

/// The buffer sizes of iteration `i`.
fn buffers(i: u64, rng: &mut u64) -> Vec<usize> {
    let mut next = || {
        *rng ^= *rng << 13;
        *rng ^= *rng >> 7;
        *rng ^= *rng << 17;
        *rng
    };
    let n = 1 + next() % 8;
    let mut v: Vec<usize> = (0..n)
        .map(|_| 1024 + (next() % (63 * 1024)) as usize)
        .collect();
    if i % 1000 == 999 {
        v.push(1 << 20);
    }
    v
}

/// Writes one byte per page, so the memory is really resident.
fn touch(p: *mut u8, len: usize) {
    for off in (0..len).step_by(4096) {
        // SAFETY: `p` is valid for `len` bytes.
        unsafe { p.add(off).write(1) };
    }
    black_box(p);
}

/// (VmRSS, VmHWM) in KiB, from /proc/self/status.
fn rss_kib() -> (u64, u64) {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let field = |name: &str| {
        status
            .lines()
            .find(|l| l.starts_with(name))
            .and_then(|l| l.split_whitespace().nth(1))
            .and_then(|v| v.parse().ok())
            .unwrap_or(0)
    };
    (field("VmRSS:"), field("VmHWM:"))
}

fn run(contender: &str) -> (u64, u64, u64) {
    let (start, _) = rss_kib();
    let mut rng = 0x9E37_79B9_7F4A_7C15u64;
    match contender {
        "bumpalo" => {
            let mut bump = bumpalo::Bump::new();
            for i in 0..ITERATIONS {
                for len in buffers(i, &mut rng) {
                    touch(
                        bump.alloc_layout(Layout::from_size_align(len, 8).unwrap())
                            .as_ptr(),
                        len,
                    );
                }
                bump.reset();
            }
        }
        "malloc" => {
            for i in 0..ITERATIONS {
                let bufs: Vec<Vec<u8>> = buffers(i, &mut rng)
                    .into_iter()
                    .map(|len| {
                        let mut b = Vec::<u8>::with_capacity(len);
                        touch(b.as_mut_ptr(), len);
                        b
                    })
                    .collect();
                black_box(&bufs);
            }
        }
        name => {
            let max_free = match name {
                "pool-2M" => 2 << 20,
                "pool-4M" => 4 << 20,
                "pool-unlimited" => usize::MAX,
                other => panic!("unknown contender {other:?}; one of {CONTENDERS:?}"),
            };
            let source = BlockSource::new(max_free);
            let mut pool = Pool::with_source(&source);
            for i in 0..ITERATIONS {
                for len in buffers(i, &mut rng) {
                    touch(
                        pool.alloc_layout(Layout::from_size_align(len, 8).unwrap())
                            .as_ptr(),
                        len,
                    );
                }
                pool.clear();
            }
            let (rss, hwm) = rss_kib();
            for st in source.stats() {
                eprintln!(
                    "  {name} {}: {} in threads, {} in depot, {} reserved, {} backing allocs",
                    st.name,
                    st.cached_in_threads,
                    st.cached_in_depot,
                    st.reserved_objects(),
                    st.backing_allocs
                );
            }
            eprintln!(
                "  {name}: source caches {} KiB (max_free {} KiB)",
                source.cached_bytes() >> 10,
                if max_free == usize::MAX {
                    u64::MAX
                } else {
                    (max_free >> 10) as u64
                }
            );
            return (start, hwm, rss);
        }
    }
    let (rss, hwm) = rss_kib();
    (start, hwm, rss)
}

fn main() {
    let arg = std::env::args().nth(1).unwrap_or_else(|| "--all".into());
    if arg == "--all" {
        let exe = std::env::current_exe().expect("own path");
        println!("W7: {ITERATIONS} iterations of 1-8 buffers of 1-64 KiB, 1 MiB every 1000th (RSS in KiB)");
        println!(
            "| contender | RSS at start | peak RSS | peak over start | RSS after last clear | retained over start |"
        );
        println!("| --- | ---: | ---: | ---: | ---: | ---: |");
        for c in CONTENDERS {
            let out = std::process::Command::new(&exe)
                .arg(c)
                .output()
                .expect("run contender");
            print!("{}", String::from_utf8_lossy(&out.stdout));
            eprint!("{}", String::from_utf8_lossy(&out.stderr));
        }
        return;
    }
    let (start, peak, end) = run(&arg);
    println!(
        "| {arg} | {start} | {peak} | {} | {end} | {} |",
        peak as i64 - start as i64,
        end as i64 - start as i64
    );
}
