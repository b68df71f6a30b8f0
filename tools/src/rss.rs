//! Resident memory, for the footprint runs: this process's RSS and peak RSS from
//! `/proc/self/status` (Linux; zero elsewhere), and a fresh process of the running binary,
//! since a contender's footprint is only its own in a process nothing else has used.

use std::process::{Command, Output};

/// This process's memory, in KiB.
#[derive(Clone, Copy, Debug)]
pub struct Memory {
    /// Resident now (VmRSS).
    pub rss: u64,
    /// The highest resident so far (VmHWM).
    pub peak: u64,
}

/// Both figures from one read of `/proc/self/status`.
pub fn memory_kib() -> Memory {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let field = |name: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|v| v.split_whitespace().next()?.parse().ok())
            .unwrap_or(0)
    };
    Memory {
        rss: field("VmRSS:"),
        peak: field("VmHWM:"),
    }
}

/// Resident memory now (VmRSS), in KiB.
pub fn rss_kib() -> u64 {
    memory_kib().rss
}

/// Runs this same binary with `args` in a new process and waits for it.
pub fn fresh_process(args: &[&str]) -> Output {
    let exe = std::env::current_exe().expect("own path");
    Command::new(exe)
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("run {args:?} in a fresh process: {e}"))
}
