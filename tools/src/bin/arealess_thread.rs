//! W1 pairs (allocate, write, free one 64-byte object) of a per-CPU allocator on a
//! thread without an rseq area, against the same pairs with per-thread caches, and the
//! per-CPU pairs on a thread with an area:
//!
//! ```sh
//! cargo run --release -p proxalloc-tools --bin arealess_thread
//! ```
//! A thread has no area when someone else registered one for it (another allocator's
//! own, where glibc registers none). The tool runs itself again with glibc's
//! registration turned off (`GLIBC_TUNABLES=glibc.pthread.rseq=0`), so the crate
//! registers its own areas; one thread registers a foreign area first, as such a
//! library would, and is then refused. Interleaved rounds; the minimum of each
//! contender's samples is printed, in ns per pair.

use std::hint::black_box;

use proxalloc::{CacheMode, ClassAllocator, Config};
use proxalloc_tools::runner::time_per;

type Object = [u64; 8];

static CPU: ClassAllocator<Object> =
    ClassAllocator::with_config("arealess-percpu", Config::new().mode(CacheMode::PerCpu));
static THREAD: ClassAllocator<Object> = ClassAllocator::with_config(
    "arealess-thread-caches",
    Config::new().mode(CacheMode::ThreadCaches),
);

const CHILD: &str = "PROXALLOC_AREALESS_CHILD";
const PAIRS: u64 = 200_000;
const ROUNDS: usize = 30;

#[inline(never)]
fn pairs(a: &'static ClassAllocator<Object>, n: u64) -> f64 {
    time_per(n as f64, || {
        for i in 0..n {
            let h = a.alloc([i; 8]);
            black_box(&*h);
        }
    })
}

/// The minimum ns per pair of each contender over interleaved rounds.
fn measure(contenders: &[&'static ClassAllocator<Object>]) -> Vec<f64> {
    let mut best = vec![f64::MAX; contenders.len()];
    for a in contenders {
        pairs(a, PAIRS);
    }
    for _ in 0..ROUNDS {
        for (b, a) in best.iter_mut().zip(contenders) {
            *b = b.min(pairs(a, PAIRS));
        }
    }
    best
}

fn main() {
    if std::env::var_os(CHILD).is_none() {
        let status = std::process::Command::new(std::env::current_exe().unwrap())
            .env("GLIBC_TUNABLES", "glibc.pthread.rseq=0")
            .env(CHILD, "1")
            .status()
            .unwrap();
        std::process::exit(status.code().unwrap_or(1));
    }
    // The first use decides per-CPU mode and registers this thread's own area.
    drop(CPU.alloc([0; 8]));
    if CPU.mode() != CacheMode::PerCpu {
        println!(
            "per-CPU caches are off here ({:?}): nothing to measure",
            CPU.mode()
        );
        return;
    }
    let with_area = measure(&[&CPU, &THREAD]);
    println!(
        "thread with an area: per-CPU {:.2} ns/pair, thread caches {:.2}",
        with_area[0], with_area[1]
    );
    std::thread::spawn(|| {
        if !register_foreign_area() {
            println!("could not register a foreign area: nothing to measure");
            return;
        }
        let without = measure(&[&CPU, &THREAD]);
        println!(
            "thread without an area: per-CPU {:.2} ns/pair, thread caches {:.2} ({:.2}x)",
            without[0],
            without[1],
            without[0] / without[1]
        );
    })
    .join()
    .unwrap();
}

/// Registers an rseq area for this thread as another library would (one that lives
/// until the process exits), so that the crate's own registration is refused.
#[cfg(target_os = "linux")]
fn register_foreign_area() -> bool {
    #[repr(C, align(32))]
    struct Area([u8; 32]);
    let area: &'static mut Area = Box::leak(Box::new(Area([0; 32])));
    const RSEQ_SIG: u32 = 0x5305_3053;
    // SAFETY: a 32-byte, 32-aligned area that lives until the process exits.
    let r = unsafe { libc::syscall(libc::SYS_rseq, area as *mut Area, 32u32, 0, RSEQ_SIG) };
    r == 0
}

/// No rseq here (and no per-CPU caches: `main` stops before this).
#[cfg(not(target_os = "linux"))]
fn register_foreign_area() -> bool {
    false
}
