//! The showdown: Traffic Server's TS-1684 experiment on a real (small) HTTP/1.1 server.
//!
//! The same server runs in three allocation modes, each in a fresh process: proxalloc's
//! per-thread caches; the depot only (Traffic Server's global freelist, before its proxy
//! allocators); and the system allocator for every object and pool allocation. A built-in
//! load generator drives each over loopback with keep-alive connections and the table
//! shows requests/s, p50/p99 latency, RSS at the end, and the allocator dump.
//!
//! ```sh
//! cargo run --release --example showdown                      # the showdown (~20 s)
//! cargo run --release --example showdown -- --seconds 30      # longer runs
//! cargo run --release --example showdown -- --serve --port 8080 --mode caches
//! wrk -t2 -c16 -d10s http://127.0.0.1:8080/                   # drive it from outside
//! ```

mod load;
mod server;

use std::net::TcpListener;
use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use server::{Allocators, Counters, Mode};

struct Args {
    seconds: f64,
    requests: u64,
    connections: usize,
    workers: usize,
    mode: Option<Mode>,
    serve: bool,
    port: u16,
    child: bool,
}

fn parse_args() -> Args {
    let mut a = Args {
        seconds: 5.0,
        requests: u64::MAX,
        connections: 4,
        workers: 4,
        mode: None,
        serve: false,
        port: 8080,
        child: false,
    };
    let mut it = std::env::args().skip(1);
    while let Some(arg) = it.next() {
        let mut value = |name: &str| {
            it.next().unwrap_or_else(|| {
                eprintln!("{name} needs a value");
                std::process::exit(2)
            })
        };
        match arg.as_str() {
            "--seconds" => a.seconds = value("--seconds").parse().expect("--seconds: a number"),
            "--requests" => a.requests = value("--requests").parse().expect("--requests: a number"),
            "--connections" => {
                a.connections = value("--connections")
                    .parse()
                    .expect("--connections: a number")
            }
            "--workers" => a.workers = value("--workers").parse().expect("--workers: a number"),
            "--port" => a.port = value("--port").parse().expect("--port: a port number"),
            "--mode" => {
                let m = value("--mode");
                a.mode = Some(Mode::parse(&m).unwrap_or_else(|| {
                    eprintln!("--mode: one of caches, depot, system (got {m:?})");
                    std::process::exit(2)
                }))
            }
            "--serve" => a.serve = true,
            "--child" => a.child = true,
            "-h" | "--help" => {
                println!(
                    "showdown [--seconds S] [--requests N] [--connections C] [--workers W] [--mode caches|depot|system]\n\
                     showdown --serve [--port P] [--workers W] [--mode M] [--seconds S (0: until killed)]"
                );
                std::process::exit(0)
            }
            other => {
                eprintln!("unknown argument {other:?} (see --help)");
                std::process::exit(2)
            }
        }
    }
    a
}

/// VmRSS in KiB.
fn rss_kib() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .unwrap_or(0)
}

/// Serves on `127.0.0.1:port` until killed (or for `seconds`, if positive).
fn serve_only(a: &Args) {
    let mode = a.mode.unwrap_or(Mode::Caches);
    let allocs = Allocators::new(mode);
    let listener = TcpListener::bind(("127.0.0.1", a.port)).expect("bind");
    let stop = AtomicBool::new(false);
    let counters = Counters::default();
    println!(
        "serving http://{} in mode {:?} with {} workers",
        listener.local_addr().unwrap(),
        mode,
        a.workers
    );
    std::thread::scope(|s| {
        s.spawn(|| server::serve(listener, a.workers, &allocs, &stop, &counters));
        if a.seconds > 0.0 {
            std::thread::sleep(Duration::from_secs_f64(a.seconds));
            stop.store(true, Ordering::Relaxed);
        }
    });
    let mut out = std::io::stdout();
    proxalloc::stats::dump(&mut out).unwrap();
}

/// One mode, in this process: prints a tab-separated result line and the dump.
fn run_mode(a: &Args, mode: Mode) {
    let allocs = Allocators::new(mode);
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
    let addr = listener.local_addr().unwrap();
    let stop = AtomicBool::new(false);
    let counters = Counters::default();
    let sampling = AtomicBool::new(true);
    let (result, samples) = std::thread::scope(|s| {
        s.spawn(|| server::serve(listener, a.workers, &allocs, &stop, &counters));
        load::run(addr, a.connections, Duration::from_millis(300), u64::MAX); // warm-up
                                                                              // RSS once a second while the load runs: it must not grow after warm-up.
        let sampler = s.spawn(|| {
            let mut v = Vec::new();
            while sampling.load(Ordering::Relaxed) {
                v.push(rss_kib());
                std::thread::sleep(Duration::from_secs(1));
            }
            v
        });
        let r = load::run(
            addr,
            a.connections,
            Duration::from_secs_f64(a.seconds),
            u64::MAX,
        );
        sampling.store(false, Ordering::Relaxed);
        stop.store(true, Ordering::Relaxed);
        (r, sampler.join().unwrap())
    });
    let after_warmup = samples.get(1).or(samples.first()).copied().unwrap_or(0);
    let peak = samples.iter().copied().max().unwrap_or(0);
    let live = allocs.requests.stats().live + allocs.headers.stats().live;
    println!(
        "RESULT\t{}\t{:.0}\t{}\t{}\t{}\t{}\t{}\t{}\t{}",
        mode.name(),
        result.rate(),
        result.percentile_us(0.5),
        result.percentile_us(0.99),
        rss_kib(),
        result.errors,
        live,
        after_warmup,
        peak
    );
    if mode != Mode::System {
        proxalloc::stats::dump(&mut std::io::stdout()).unwrap();
    }
}

fn main() {
    let a = parse_args();
    if a.serve {
        return serve_only(&a);
    }
    if a.child {
        return run_mode(&a, a.mode.expect("--child needs --mode"));
    }
    let modes: Vec<Mode> = a.mode.map_or(Mode::ALL.to_vec(), |m| vec![m]);
    println!(
        "showdown: {} keep-alive connections, {} server workers, {} s per mode, each mode in a fresh process\n",
        a.connections, a.workers, a.seconds
    );
    let exe = std::env::current_exe().expect("own path");
    let mut rows = Vec::new();
    let mut dumps = Vec::new();
    for mode in modes {
        let flag = match mode {
            Mode::Caches => "caches",
            Mode::DepotOnly => "depot",
            Mode::System => "system",
        };
        let out = Command::new(&exe)
            .args(["--child", "--mode", flag])
            .args(["--seconds", &a.seconds.to_string()])
            .args(["--requests", &a.requests.to_string()])
            .args(["--connections", &a.connections.to_string()])
            .args(["--workers", &a.workers.to_string()])
            .output()
            .expect("run a mode");
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        let Some(line) = text.lines().find(|l| l.starts_with("RESULT\t")) else {
            eprintln!(
                "mode {flag} failed:\n{text}\n{}",
                String::from_utf8_lossy(&out.stderr)
            );
            std::process::exit(1);
        };
        let f: Vec<String> = line.split('\t').skip(1).map(str::to_string).collect();
        rows.push(f);
        let dump: Vec<&str> = text
            .lines()
            .filter(|l| !l.starts_with("RESULT\t"))
            .collect();
        if !dump.is_empty() {
            dumps.push((mode.name(), dump.join("\n")));
        }
    }
    let base: f64 = rows[0][1].parse().unwrap_or(1.0);
    println!(
        "| mode | requests/s | vs first | p50 µs | p99 µs | RSS after warm-up (MiB) | peak RSS | RSS at end | errors | live objects after |"
    );
    println!("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |");
    let mib = |s: &str| s.parse::<f64>().unwrap_or(0.0) / 1024.0;
    for r in &rows {
        let rate: f64 = r[1].parse().unwrap_or(0.0);
        println!(
            "| {} | {:.0} | {:.2}x | {} | {} | {:.1} | {:.1} | {:.1} | {} | {} |",
            r[0],
            rate,
            rate / base,
            r[2],
            r[3],
            mib(&r[7]),
            mib(&r[8]),
            mib(&r[4]),
            r[5],
            r[6]
        );
    }
    for (name, dump) in dumps {
        println!("\nallocator dump after the run, {name}:\n{dump}");
    }
}
