//! The showdown: Traffic Server's TS-1684 experiment on a caching reverse proxy.
//!
//! A proxy and its origin run in one process on tokio's multi-thread runtime with hyper
//! (`proxy.rs`, `origin.rs`, `server.rs`). The proxy allocates its per-request objects
//! from proxalloc, in one of four modes: per-thread caches; per-CPU caches (Linux rseq);
//! the depot only (Traffic Server's global freelist, before its ProxyAllocators); the
//! global allocator. The
//! global allocator itself is glibc's malloc, mimalloc or (in the tools build) jemalloc
//! (`global.rs`). The default run starts the proxy once per pairing, each in a fresh
//! process, drives it with the built-in load generator (`load.rs`), and prints
//! requests/s, latency, CPU time per request, memory, errors and the objects left after
//! a graceful shutdown; then the handler alone, in process, without sockets.
//!
//! ```sh
//! cargo run --release --example showdown                     # the table (about a minute)
//! cargo run --release -p proxalloc-tools --bin showdown      # the same with jemalloc rows
//! cargo run --release --example showdown -- --seconds 20 --connections 512
//! cargo run --release --example showdown -- --serve --port 8080 --mode caches --seconds 0
//! curl -v http://127.0.0.1:8080/objects/7                     # then: X-Cache: HIT
//! wrk -t2 -c256 -d10s http://127.0.0.1:8080/objects/1
//! ```

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::Empty;
use hyper::Request;

use crate::global::{self, Kind};
use crate::load;
use crate::proxy::{self, Allocators, Mode};
use crate::server::{self, Limits};

/// The cache's byte budget.
const CACHE_BYTES: usize = 32 << 20;

/// How long each in-process row runs.
const INPROC_SECONDS: f64 = 1.5;

struct Args {
    serve: bool,
    inproc: bool,
    port: u16,
    mode: Option<Mode>,
    global: Option<Kind>,
    /// Serving: how long (0: until Ctrl-C). Comparing: the measured time per mode.
    seconds: f64,
    warmup: f64,
    connections: usize,
    threads: usize,
    rounds: usize,
}

const USAGE: &str = "\
showdown [--seconds S] [--warmup S] [--connections C] [--threads T] [--rounds R]
         [--mode M] [--global G]
    the comparison: each pairing in fresh processes under the built-in load generator
    (--mode and --global choose the rows)
showdown --serve [--port P] [--mode caches|percpu|depot|system] [--global glibc|mimalloc|jemalloc]
         [--seconds S] [--threads T]
    the proxy alone on 127.0.0.1:P for S seconds (0, the default: until Ctrl-C)";

fn parse_args() -> Args {
    let mut a = Args {
        serve: false,
        inproc: false,
        port: 8080,
        mode: None,
        global: None,
        seconds: f64::NAN,
        warmup: 1.5,
        connections: 256,
        rounds: 2,
        threads: std::thread::available_parallelism().map_or(2, |n| n.get()),
    };
    let mut it = std::env::args().skip(1);
    while let Some(arg) = it.next() {
        let mut value = || {
            it.next().unwrap_or_else(|| {
                eprintln!("{arg} needs a value\n{USAGE}");
                std::process::exit(2)
            })
        };
        fn number<T: std::str::FromStr>(name: &str, v: String) -> T {
            v.parse().unwrap_or_else(|_| {
                eprintln!("{name}: not a number: {v:?}");
                std::process::exit(2)
            })
        }
        match arg.as_str() {
            "--serve" => a.serve = true,
            "--inproc" => a.inproc = true,
            "--port" => a.port = number("--port", value()),
            "--seconds" => a.seconds = number("--seconds", value()),
            "--warmup" => a.warmup = number("--warmup", value()),
            "--connections" => a.connections = number("--connections", value()),
            "--threads" => a.threads = number("--threads", value()),
            "--rounds" => a.rounds = number::<usize>("--rounds", value()).max(1),
            "--mode" => {
                let m = value();
                a.mode = Some(Mode::parse(&m).unwrap_or_else(|| {
                    eprintln!("--mode: one of caches, percpu, depot, system (got {m:?})");
                    std::process::exit(2)
                }))
            }
            "--global" => {
                let g = value();
                a.global = Some(Kind::parse(&g).unwrap_or_else(|| {
                    eprintln!("--global: one of glibc, mimalloc, jemalloc (got {g:?})");
                    std::process::exit(2)
                }))
            }
            "-h" | "--help" => {
                println!("{USAGE}");
                std::process::exit(0)
            }
            other => {
                eprintln!("unknown argument {other:?}\n{USAGE}");
                std::process::exit(2)
            }
        }
    }
    a
}

/// The program: the comparison, or one server (`--serve`), or one in-process row
/// (`--inproc`).
pub fn run() {
    let a = parse_args();
    if a.serve || a.inproc {
        global::ensure(&crate::GLOBAL, a.global.unwrap_or(Kind::Glibc));
    }
    raise_fd_limit();
    if a.mode == Some(Mode::System) {
        // Before anything allocates: the pools' block source has no mode of its own, and
        // follows this variable.
        std::env::set_var(proxalloc::BYPASS_ENV, "1");
    }
    if a.serve {
        serve(&a);
    } else if a.inproc {
        inproc(&a);
    } else {
        compare(&a);
    }
}

fn runtime(threads: usize) -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(threads.max(1))
        .enable_all()
        .build()
        .expect("a tokio runtime")
}

/// `--serve`: the proxy on 127.0.0.1:port until Ctrl-C (or `--seconds`), then a graceful
/// shutdown and the allocator dump.
fn serve(a: &Args) {
    let mode = a.mode.unwrap_or_else(Mode::crate_default);
    global::install_system_trim(crate::GLOBAL.current());
    let allocs = Allocators::leak(mode);
    let seconds = if a.seconds.is_nan() { 0.0 } else { a.seconds };
    let runtime = runtime(a.threads);
    let (drained, counters) = runtime.block_on(async {
        let running = proxy::start(allocs, a.port, Limits::default(), CACHE_BYTES)
            .await
            .unwrap_or_else(|e| {
                eprintln!("cannot listen on 127.0.0.1:{}: {e}", a.port);
                std::process::exit(1)
            });
        let l = Limits::default();
        println!(
            "proxy on http://{} (origin on http://{}), allocator mode {} over {}, {} threads; Ctrl-C stops",
            running.addr,
            running.origin,
            mode.flag(),
            crate::GLOBAL.current().flag(),
            a.threads
        );
        println!(
            "limits: head {} KiB and {} headers, {} s to send a head (and keep-alive idle), {} s stalled mid-request",
            l.max_head_bytes >> 10,
            server::MAX_HEADERS,
            l.header_read_timeout.as_secs(),
            l.idle_timeout.as_secs()
        );
        tokio::spawn(dump_on_sigusr1());
        tokio::spawn(trim_on_sigusr2());
        let ctrl_c = tokio::signal::ctrl_c();
        if seconds > 0.0 {
            tokio::select! {
                _ = ctrl_c => {}
                () = tokio::time::sleep(Duration::from_secs_f64(seconds)) => {}
            }
        } else {
            let _ = ctrl_c.await;
        }
        let proxy = Arc::clone(&running.proxy);
        let (entries, bytes) = proxy.cache.usage();
        println!(
            "stopping: {entries} cache entries ({} KiB); draining (Ctrl-C again: quit now)",
            bytes >> 10
        );
        let drained = tokio::select! {
            drained = running.shutdown() => drained,
            _ = tokio::signal::ctrl_c() => std::process::exit(130),
        };
        let c = &proxy.counters;
        let load = |n: &AtomicU64| n.load(Relaxed);
        let counters = [
            load(&c.hits),
            load(&c.misses),
            load(&c.passes),
            load(&c.errors),
        ];
        (drained, counters)
    });
    drop(runtime); // every task is gone: nothing can hold an object any more
    let [hits, misses, passes, errors] = counters;
    println!(
        "shut down ({}): {hits} hits, {misses} misses, {passes} passes, {errors} errors",
        if drained {
            "drained"
        } else {
            "drain timed out"
        }
    );
    println!("live objects after shutdown: {}", allocs.live());
    proxalloc::stats::dump(&mut std::io::stdout()).expect("stdout");
}

/// The line before each dump that SIGUSR1 asks for.
const DUMP_MARK: &str = "allocator dump (SIGUSR1):";

/// Prints the allocator dump each time the process gets SIGUSR1 (`kill -USR1 PID`): what
/// the allocators hold while the server runs.
async fn dump_on_sigusr1() {
    use tokio::signal::unix::{signal, SignalKind};
    let Ok(mut usr1) = signal(SignalKind::user_defined1()) else {
        return;
    };
    while usr1.recv().await.is_some() {
        // A few KiB to stdout: a blocking write this task can afford.
        let mut out = std::io::stdout().lock();
        let _ = writeln!(out, "{DUMP_MARK}");
        let _ = proxalloc::stats::dump(&mut out);
        let _ = out.flush();
    }
}

/// Gives every allocator's cached memory back (`proxalloc::trim_all`) each time the
/// process gets SIGUSR2 (`kill -USR2 PID`), as an idle server's maintenance would.
async fn trim_on_sigusr2() {
    use tokio::signal::unix::{signal, SignalKind};
    let Ok(mut usr2) = signal(SignalKind::user_defined2()) else {
        return;
    };
    while usr2.recv().await.is_some() {
        let released = proxalloc::trim_all();
        println!("trim_all (SIGUSR2): {} KiB given back", released >> 10);
    }
}

/// A request as the load generator sends it, for the in-process row.
fn inproc_request(i: u64) -> Request<Empty<Bytes>> {
    Request::get(format!("/objects/{}", i % 1000))
        .header("host", "showdown.test")
        .header("user-agent", "showdown-load/1.0")
        .header("accept", "text/plain, */*;q=0.8")
        .header("accept-language", "en-US,en;q=0.5")
        .header("accept-encoding", "identity")
        .header("x-request-id", format!("{i:016x}"))
        .header("cookie", "session=abcdef0123456789; theme=dark")
        .header("referer", "http://showdown.test/objects")
        .header("connection", "keep-alive")
        .body(Empty::new())
        .expect("a valid request")
}

/// `--inproc`: the handler alone (cache hits, no sockets), in tasks on the multi-thread
/// runtime. Prints `INPROC <requests/s> <CPU µs per request> <live objects after>`.
fn inproc(a: &Args) {
    const TASKS: u64 = 8;
    let allocs = Allocators::leak(a.mode.unwrap_or_else(Mode::crate_default));
    let seconds = if a.seconds.is_nan() { 2.0 } else { a.seconds };
    let runtime = runtime(a.threads);
    let (rate, cpu_us) = runtime.block_on(async {
        let running = proxy::start(allocs, 0, Limits::default(), CACHE_BYTES)
            .await
            .expect("listen on loopback");
        let proxy = Arc::clone(&running.proxy);
        let client = IpAddr::V4(Ipv4Addr::LOCALHOST);
        for i in 0..1000 {
            drop(proxy.handle(inproc_request(i), client).await); // fill the cache
        }
        let (cpu0, start) = (cpu_seconds("self"), Instant::now());
        let deadline = start + Duration::from_secs_f64(seconds);
        let tasks: Vec<_> = (0..TASKS)
            .map(|t| {
                let proxy = Arc::clone(&proxy);
                tokio::spawn(async move {
                    let mut served = 0u64;
                    while Instant::now() < deadline {
                        for i in 0..64 {
                            let response = proxy.handle(inproc_request(t * 7919 + i), client).await;
                            std::hint::black_box(response);
                        }
                        served += 64;
                        tokio::task::yield_now().await;
                    }
                    served
                })
            })
            .collect();
        let mut served = 0;
        for t in tasks {
            served += t.await.unwrap_or(0);
        }
        let (cpu, elapsed) = (cpu_seconds("self") - cpu0, start.elapsed());
        drop(proxy);
        running.shutdown().await;
        (
            served as f64 / elapsed.as_secs_f64(),
            cpu / served as f64 * 1e6,
        )
    });
    drop(runtime);
    println!("INPROC\t{rate:.0}\t{cpu_us:.2}\t{}", allocs.live());
}

/// What one row compares: where the proxy's objects come from, and the process's global
/// allocator (which everything else uses: tokio, hyper, the origin, and the objects in
/// `system` mode).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Pairing {
    mode: Mode,
    global: Kind,
}

impl Pairing {
    /// The rows of a default run: each proxalloc mode over glibc, and over each other
    /// global allocator this build has both proxalloc's default mode and the allocator
    /// alone.
    fn default_rows() -> Vec<Pairing> {
        let mut rows: Vec<Pairing> = Mode::ALL
            .into_iter()
            .map(|mode| Pairing::new(mode, Kind::Glibc))
            .collect();
        for global in [Kind::Mimalloc, Kind::Jemalloc] {
            if crate::GLOBAL.has(global) {
                rows.push(Pairing::new(Mode::crate_default(), global));
                rows.push(Pairing::new(Mode::System, global));
            }
        }
        rows
    }

    fn new(mode: Mode, global: Kind) -> Pairing {
        Pairing { mode, global }
    }

    /// The rows `--mode` and `--global` ask for: every pairing of the named ones with
    /// all of the other kind (that this build has), or the default rows.
    fn chosen(a: &Args) -> Vec<Pairing> {
        if a.mode.is_none() && a.global.is_none() {
            return Pairing::default_rows();
        }
        let modes = a.mode.map_or(Mode::ALL.to_vec(), |m| vec![m]);
        let globals = a.global.map_or(Kind::ALL.to_vec(), |g| vec![g]);
        modes
            .iter()
            .flat_map(|&m| globals.iter().map(move |&g| Pairing::new(m, g)))
            .filter(|p| crate::GLOBAL.has(p.global))
            .collect()
    }

    fn label(self) -> String {
        format!("{} | {}", self.mode.label(), self.global.flag())
    }

    /// The arguments and environment of a child process for this pairing.
    fn command(self, exe: &std::path::Path, a: &Args) -> Command {
        let mut c = Command::new(exe);
        c.args(["--mode", self.mode.flag(), "--global", self.global.flag()])
            .args(["--threads", &a.threads.to_string()])
            .env(global::ENV, self.global.flag());
        c
    }
}

/// One run of one pairing.
struct Row {
    pairing: Pairing,
    load: load::LoadResult,
    cpu_us: f64,
    rss_warm: f64,
    rss_peak: f64,
    rss_end: f64,
    /// RSS once the load has stopped and the server ran `proxalloc::trim_all()` (SIGUSR2).
    rss_trimmed: f64,
    live: String,
    /// The allocator dump at the end of the warm-up.
    warm_dump: String,
    /// What the server printed when it stopped.
    stopped: String,
}

/// Starts a fresh `--serve` process for `pairing`, warms it up, measures it, and stops
/// it with Ctrl-C as a user would.
fn run_mode(exe: &std::path::Path, a: &Args, pairing: Pairing, seconds: f64) -> Row {
    let mut child = pairing
        .command(exe, a)
        .args(["--serve", "--port", "0", "--seconds", "0"])
        .stdout(Stdio::piped())
        .spawn()
        .expect("start a server process");
    let pid = child.id().to_string();
    let mut out = BufReader::new(child.stdout.take().expect("piped"));
    let mut first = String::new();
    let _ = out.read_line(&mut first);
    let Some(addr) = first
        .split_whitespace()
        .find_map(|w| w.strip_prefix("http://")?.parse::<SocketAddr>().ok())
    else {
        eprintln!("\nthe {} server did not start: {first:?}", pairing.label());
        let _ = child.kill();
        std::process::exit(1);
    };
    load::run(addr, a.connections, Duration::from_secs_f64(a.warmup));
    let (cpu0, rss_warm) = (cpu_seconds(&pid), memory_mib(&pid, "VmRSS"));
    // SAFETY: kill(2) on our own child's pid; no memory is involved.
    unsafe { libc::kill(child.id() as libc::pid_t, libc::SIGUSR1) };
    let load = load::run(addr, a.connections, Duration::from_secs_f64(seconds));
    let cpu = cpu_seconds(&pid) - cpu0;
    let rss_end = memory_mib(&pid, "VmRSS");
    // The kernel updates the high-water mark lazily (when memory is unmapped), so it can
    // trail a reading it should cover.
    let rss_peak = memory_mib(&pid, "VmHWM").max(rss_warm).max(rss_end);
    // What an idle server can give back: it trims every allocator on SIGUSR2, as a
    // server's maintenance task would once its load stops.
    // SAFETY: kill(2) on our own child's pid; no memory is involved.
    unsafe { libc::kill(child.id() as libc::pid_t, libc::SIGUSR2) };
    std::thread::sleep(Duration::from_millis(300));
    let rss_trimmed = memory_mib(&pid, "VmRSS");
    // SAFETY: kill(2) on our own child's pid; no memory is involved.
    unsafe { libc::kill(child.id() as libc::pid_t, libc::SIGINT) };
    let mut rest = String::new();
    let _ = out.read_to_string(&mut rest);
    let _ = child.wait();
    let (warm_dump, stopped) = split_dump(&rest);
    let live = stopped
        .lines()
        .find_map(|l| l.strip_prefix("live objects after shutdown: "))
        .unwrap_or("?")
        .to_string();
    Row {
        pairing,
        cpu_us: cpu / (load.ok + load.non_2xx).max(1) as f64 * 1e6,
        load,
        rss_warm,
        rss_peak,
        rss_end,
        rss_trimmed,
        live,
        warm_dump,
        stopped,
    }
}

/// A server's output split into the dump that SIGUSR1 asked for (up to its TOTAL line)
/// and everything else.
fn split_dump(out: &str) -> (String, String) {
    let Some((before, after)) = out.split_once(DUMP_MARK) else {
        return (String::new(), out.to_string());
    };
    let mut dump = String::new();
    let mut lines = after.trim_start_matches('\n').split_inclusive('\n');
    for line in lines.by_ref() {
        dump.push_str(line);
        if line.starts_with("TOTAL") {
            break;
        }
    }
    (dump, format!("{before}{}", lines.collect::<String>()))
}

/// The handler alone in a fresh `--inproc` process: requests/s, CPU µs per request, live
/// objects after.
fn run_inproc(exe: &std::path::Path, a: &Args, pairing: Pairing) -> [String; 3] {
    let out = pairing
        .command(exe, a)
        .args(["--inproc", "--seconds", &INPROC_SECONDS.to_string()])
        .output()
        .expect("run the in-process row");
    let text = String::from_utf8_lossy(&out.stdout);
    let mut f = text
        .lines()
        .find_map(|l| l.strip_prefix("INPROC\t"))
        .unwrap_or("?\t?\t?")
        .split('\t')
        .map(str::to_string);
    [(); 3].map(|()| f.next().unwrap_or_default())
}

/// Of one pairing's rounds, the one with the least CPU per request (other processes on
/// the machine only ever add to it), and every round's figure.
fn best<T>(runs: Vec<T>, cpu: impl Fn(&T) -> f64) -> (T, String) {
    let all: Vec<String> = runs.iter().map(|r| format!("{:.2}", cpu(r))).collect();
    let best = runs
        .into_iter()
        .min_by(|x, y| cpu(x).total_cmp(&cpu(y)))
        .expect("at least one round");
    (best, all.join(", "))
}

/// The comparison: each pairing in fresh processes, `rounds` times, interleaved.
fn compare(a: &Args) {
    let seconds = if a.seconds.is_nan() { 3.0 } else { a.seconds };
    let rows = Pairing::chosen(a);
    if rows.is_empty() {
        eprintln!("this build has no {}", a.global.map_or("", Kind::flag));
        std::process::exit(2);
    }
    println!(
        "showdown: a caching reverse proxy and its origin in one process (tokio, hyper; {} worker \
         threads),\ndriven by {} keep-alive connections from this process: {} s of warm-up, then \
         {seconds} s measured.\n9 requests in 10 are cache hits; 1 in 10 goes to the origin. Each \
         row runs {} times in fresh\nprocesses, interleaved; the row is its round with the least \
         CPU per request (all rounds in brackets).\n",
        a.threads, a.connections, a.warmup, a.rounds
    );
    println!("{}\n", default_mode_note());
    let exe = std::env::current_exe().expect("own path");
    let mut runs: Vec<Vec<Row>> = rows.iter().map(|_| Vec::new()).collect();
    let mut inproc: Vec<Vec<[String; 3]>> = rows.iter().map(|_| Vec::new()).collect();
    for round in 1..=a.rounds {
        for (i, &pairing) in rows.iter().enumerate() {
            eprint!(
                "round {round}, {} over {}: ",
                pairing.mode.label(),
                pairing.global.flag()
            );
            let row = run_mode(&exe, a, pairing, seconds);
            let f = run_inproc(&exe, a, pairing);
            eprintln!(
                "{:.0} requests/s, {:.2} µs CPU each; in process {} µs",
                row.load.rate(),
                row.cpu_us,
                f[1]
            );
            runs[i].push(row);
            inproc[i].push(f);
        }
    }
    println!(
        "| proxy objects | global allocator | requests/s | p50 ms | p99 ms | CPU µs/request | RSS after warm-up MiB | peak MiB | at end MiB | after `trim_all` MiB | errors | non-2xx | live objects after |"
    );
    println!("| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |");
    let mut dump = None;
    for rounds in runs {
        let (mut r, all) = best(rounds, |r| r.cpu_us);
        println!(
            "| {} | {:.0} | {:.2} | {:.2} | {:.2} ({all}) | {:.1} | {:.1} | {:.1} | {:.1} | {} | {} | {} |",
            r.pairing.label(),
            r.load.rate(),
            r.load.percentile_ms(0.5),
            r.load.percentile_ms(0.99),
            r.cpu_us,
            r.rss_warm,
            r.rss_peak,
            r.rss_end,
            r.rss_trimmed,
            r.load.errors,
            r.load.non_2xx,
            r.live
        );
        if r.pairing == Pairing::new(Mode::crate_default(), Kind::Glibc) {
            dump = Some((r.warm_dump, r.stopped));
        }
    }
    println!(
        "\nthe handler alone, in process (cache hits, no sockets; {INPROC_SECONDS} s per round):\n"
    );
    println!(
        "| proxy objects | global allocator | requests/s | CPU µs/request | live objects after |"
    );
    println!("| --- | --- | ---: | ---: | ---: |");
    for (pairing, rounds) in rows.iter().zip(inproc) {
        let (f, all) = best(rounds, |f| f[1].parse().unwrap_or(f64::MAX));
        println!(
            "| {} | {} | {} ({all}) | {} |",
            pairing.label(),
            f[0],
            f[1],
            f[2]
        );
    }
    if let Some((warm, stopped)) = dump {
        let stopped: Vec<&str> = stopped
            .lines()
            .filter(|l| l.starts_with("stopping:") || l.starts_with("shut down"))
            .collect();
        println!(
            "\nthe {} server over glibc, at the end of its warm-up (kill -USR1):\n{warm}{}",
            Mode::crate_default().label(),
            stopped.join("\n")
        );
    }
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    println!("\n{}", NOTE.replace("{cores}", &cores.to_string()));
    if !crate::GLOBAL.has(Kind::Jemalloc) {
        println!("\n{JEMALLOC_NOTE}");
    }
}

/// Which cache mode proxalloc's allocators get here by default, and why: the build's
/// default, and what this machine gives an allocator that asks for it.
fn default_mode_note() -> String {
    use proxalloc::{CacheMode, ClassAllocator};
    // What an allocator made with no mode gets here: per-CPU caches fall back to
    // per-thread ones where rseq or membarrier cannot be used.
    let probe = ClassAllocator::<u64>::new("showdown-mode-probe");
    drop(probe.alloc(0));
    let got = probe.mode();
    let status = proxalloc::stats::percpu_status();
    match (CacheMode::default(), got) {
        (CacheMode::PerCpu, CacheMode::PerCpu) => "proxalloc's default here: CPU caches (the `percpu` feature, on by default, makes \
             per-CPU caches the default on Linux x86-64, and rseq and membarrier work on this machine).\n\
             Their memory follows CPUs, not threads, and any thread can trim it; the thread-caches row is \
             what a build without the feature gets."
            .to_string(),
        (CacheMode::PerCpu, _) => format!(
            "proxalloc's default here: thread caches (the build asks for CPU caches, but they fell back: {}).",
            status
                .disabled
                .unwrap_or_else(|| "rseq or membarrier unavailable, or PROXALLOC_PERCPU=off".into())
        ),
        _ => "proxalloc's default here: thread caches (a build without the `percpu` feature, not Linux \
              x86-64, or a ThreadSanitizer build); the CPU-caches row asks for them by name."
            .to_string(),
    }
}

/// Where the jemalloc rows are.
const JEMALLOC_NOTE: &str = "\
jemalloc rows: `cargo run --release -p proxalloc-tools --bin showdown` runs this comparison with
them (its first build compiles jemalloc's C code, which this example leaves out to start fast).";

/// The closing note.
const NOTE: &str = "\
What the figures mean. Here {cores} cores run the proxy, its origin, this load generator and
whatever else the machine runs. Most of a request's CPU time is the kernel's socket work and
hyper's parsing, and requests/s follows the share of the cores the server happens to get, so it
says little about the allocator. CPU time per request (the server process's user + system time
over the answers it gave) is where the allocator's share shows; the in-process rows, without
sockets, show its own effect. The global allocator serves everything else in every row (tokio,
hyper, the origin), so compare rows over the same one: proxalloc's default (CPU caches where
rseq works, thread caches elsewhere) against the global allocator alone is what proxalloc adds
to a server that already installs that allocator. Depot
only is Traffic Server's global freelist: every allocation and free is a compare-and-swap on one
shared stack, and the more cores contend for it, the more each one costs. Traffic Server, on a
many-core machine, measured 137,070 -> 259,192 fetches/s when its global freelist gave way to
per-thread caches. CPU caches hold memory per CPU, thread caches per thread (a server with
a few worker threads per core shows little difference; one with many threads, idle ones
above all, shows it). Memory: proxalloc keeps what its caches hold (the dump's reserved bytes; the
pools' free blocks up to the block source's 2 MiB), and each global allocator keeps its own.
`trim_all` gives proxalloc's back and then asks the global allocator to return free memory to
the OS: glibc's malloc_trim, or over mimalloc its mi_collect (proxalloc::set_system_trim: the
trimming thread's heap and mimalloc's free arena memory), in every row over that allocator, its
own included; jemalloc's rows leave its purge to its own schedule.";

/// User + system CPU seconds of process `pid` ("self" for this one), from /proc.
fn cpu_seconds(pid: &str) -> f64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    // Fields after the command name (which may hold spaces) start at field 3, the state;
    // utime and stime are fields 14 and 15, in clock ticks.
    let after = stat.rsplit_once(')').map_or("", |(_, rest)| rest);
    let fields: Vec<&str> = after.split_whitespace().collect();
    let ticks: u64 = [11, 12]
        .iter()
        .filter_map(|&i| fields.get(i)?.parse::<u64>().ok())
        .sum();
    // SAFETY: sysconf reads a constant.
    let per_second = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1);
    ticks as f64 / per_second as f64
}

/// A memory figure of process `pid` from /proc/PID/status (VmRSS, VmHWM), in MiB.
fn memory_mib(pid: &str, field: &str) -> f64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    let kib: f64 = status
        .lines()
        .find_map(|l| l.strip_prefix(field)?.strip_prefix(':'))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .unwrap_or(0.0);
    kib / 1024.0
}

/// Thousands of connections need thousands of file descriptors: raise the soft limit to
/// the hard one.
fn raise_fd_limit() {
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit and setrlimit read and write the struct we pass.
    unsafe {
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) == 0 && limit.rlim_cur < limit.rlim_max
        {
            limit.rlim_cur = limit.rlim_max;
            libc::setrlimit(libc::RLIMIT_NOFILE, &limit);
        }
    }
}
