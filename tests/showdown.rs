//! The showdown's caching proxy (`examples/showdown/`) under good and bad clients: slow
//! heads, oversized and malformed heads, chunked and sized bodies, cache hits and misses,
//! stalled and vanished clients, a burst of connections, and a graceful shutdown with
//! requests in flight and heads under way. After every test the proxy's allocators hold
//! no live object.
//!
//! The clients are plain blocking sockets on the test thread; the proxy runs on its own
//! multi-thread tokio runtime. Deadlines here are hang guards, never assertions on speed.

#[path = "../examples/showdown/global.rs"]
#[allow(dead_code)]
mod global;
#[path = "../examples/showdown/origin.rs"]
#[allow(dead_code)]
mod origin;
#[path = "../examples/showdown/proxy.rs"]
#[allow(dead_code)]
mod proxy;
#[path = "../examples/showdown/server.rs"]
#[allow(dead_code)]
mod server;

use std::io::{ErrorKind, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};

use proxy::{Allocators, Mode, Running};
use server::Limits;

/// Longest any single read may wait before the test calls it a hang.
const HANG_GUARD: Duration = Duration::from_secs(20);

/// A proxy and its origin on a runtime of their own.
struct Harness {
    runtime: tokio::runtime::Runtime,
    running: Option<Running>,
    allocs: &'static Allocators,
    addr: SocketAddr,
}

impl Harness {
    fn start(mode: Mode, limits: Limits) -> Harness {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap();
        let allocs = Allocators::leak(mode);
        let running = runtime
            .block_on(proxy::start(allocs, 0, limits, 1 << 20))
            .unwrap();
        Harness {
            addr: running.addr,
            runtime,
            running: Some(running),
            allocs,
        }
    }

    fn new() -> Harness {
        Harness::start(Mode::Caches, Limits::default())
    }

    /// Shuts down gracefully, drops the runtime, and checks that no object is live.
    /// Returns whether everything drained in time.
    fn finish(mut self) -> bool {
        let running = self.running.take().unwrap();
        let drained = self.runtime.block_on(running.shutdown());
        drop(self.runtime);
        assert_eq!(self.allocs.live(), 0, "objects left after shutdown");
        drained
    }
}

/// An answer, as read off the socket.
#[derive(Debug)]
struct Answer {
    status: u16,
    head: String,
    body: Vec<u8>,
}

impl Answer {
    fn header(&self, name: &str) -> Option<&str> {
        self.head.lines().find_map(|l| {
            let (n, v) = l.split_once(':')?;
            n.eq_ignore_ascii_case(name).then(|| v.trim())
        })
    }

    fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }
}

fn connect(addr: SocketAddr) -> TcpStream {
    let c = TcpStream::connect(addr).unwrap();
    c.set_read_timeout(Some(HANG_GUARD)).unwrap();
    c
}

/// Reads one answer (sized, chunked, or up to the close); `None` if the connection closed
/// before a whole head arrived.
fn read_answer(c: &mut TcpStream) -> Option<Answer> {
    let mut buf = Vec::new();
    let mut chunk = [0u8; 8192];
    let mut more = |buf: &mut Vec<u8>| -> bool {
        match c.read(&mut chunk) {
            Ok(0) => false,
            Ok(n) => {
                buf.extend_from_slice(&chunk[..n]);
                true
            }
            Err(e) if e.kind() == ErrorKind::ConnectionReset => false,
            Err(e) => panic!("hang guard: no answer within {HANG_GUARD:?} ({e})"),
        }
    };
    let head_end = loop {
        if let Some(p) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            break p + 4;
        }
        if !more(&mut buf) {
            return None;
        }
    };
    let head = String::from_utf8(buf[..head_end].to_vec()).unwrap();
    let status = head[9..12].parse().unwrap();
    let mut answer = Answer {
        status,
        head,
        body: Vec::new(),
    };
    let mut rest = buf[head_end..].to_vec();
    if let Some(len) = answer.header("content-length") {
        let len: usize = len.parse().unwrap();
        while rest.len() < len && more(&mut rest) {}
        answer.body = rest[..len.min(rest.len())].to_vec();
    } else if answer.header("transfer-encoding") == Some("chunked") {
        loop {
            let Some(line_end) = rest.windows(2).position(|w| w == b"\r\n") else {
                assert!(more(&mut rest), "closed inside a chunked body");
                continue;
            };
            let size =
                usize::from_str_radix(std::str::from_utf8(&rest[..line_end]).unwrap(), 16).unwrap();
            while rest.len() < line_end + 2 + size + 2 {
                assert!(more(&mut rest), "closed inside a chunk");
            }
            answer
                .body
                .extend_from_slice(&rest[line_end + 2..line_end + 2 + size]);
            rest.drain(..line_end + 2 + size + 2);
            if size == 0 {
                break;
            }
        }
    } else {
        while more(&mut rest) {}
        answer.body = rest;
    }
    Some(answer)
}

/// Sends `raw` on a fresh connection and reads one answer.
fn exchange(addr: SocketAddr, raw: &[u8]) -> Option<Answer> {
    let mut c = connect(addr);
    c.write_all(raw).unwrap();
    read_answer(&mut c)
}

/// Sends `raw` on a fresh connection and reads one answer, on a new connection again
/// (up to 20 tries) whenever the server closed the last one without answering. For the
/// tests that set a timeout of a few hundred milliseconds: a test thread that stalls
/// between its connect and its write (a loaded machine) finds its connection timed out,
/// which is the behaviour under test, not a failure. Returns the connection, still open
/// unless the answer closed it, and the answer.
fn ask_under_short_timeouts(addr: SocketAddr, raw: &[u8]) -> (TcpStream, Answer) {
    for _ in 0..20 {
        let mut c = connect(addr);
        if c.write_all(raw).is_err() {
            continue;
        }
        if let Some(answer) = read_answer(&mut c) {
            return (c, answer);
        }
    }
    panic!("20 connections in a row closed before their answer")
}

fn get(addr: SocketAddr, path: &str) -> Answer {
    let raw = format!("GET {path} HTTP/1.1\r\nHost: showdown.test\r\nConnection: close\r\n\r\n");
    exchange(addr, raw.as_bytes()).expect("an answer")
}

/// Whether the peer has closed `c` (without waiting).
fn closed(mut c: &TcpStream) -> bool {
    c.set_nonblocking(true).unwrap();
    let mut b = [0u8; 1];
    let gone = match c.read(&mut b) {
        Ok(0) => true,
        Ok(_) => false,
        Err(e) => e.kind() != ErrorKind::WouldBlock,
    };
    c.set_nonblocking(false).unwrap();
    gone
}

#[test]
fn slowloris_clients_do_not_delay_others() {
    let limits = Limits {
        header_read_timeout: Duration::from_secs(60), // far longer than this test takes
        ..Limits::default()
    };
    let h = Harness::start(Mode::Caches, limits);
    let slow: Vec<TcpStream> = (0..200)
        .map(|i| {
            let mut c = connect(h.addr);
            write!(
                c,
                "GET /objects/{i} HTTP/1.1\r\nHost: showdown.test\r\nX-Slow: "
            )
            .unwrap();
            c
        })
        .collect();
    // A normal client is answered while all of them hold half a head.
    let answer = get(h.addr, "/objects/1");
    assert_eq!(answer.status, 200);
    assert_eq!(answer.body, origin::object_body(1));
    let open = slow.iter().filter(|c| !closed(c)).count();
    assert_eq!(open, 200, "slow connections closed early");
    drop(slow);
    assert!(h.finish());
}

#[test]
fn the_header_timeout_drops_slow_silent_and_idle_connections() {
    let limits = Limits {
        header_read_timeout: Duration::from_millis(500),
        ..Limits::default()
    };
    let h = Harness::start(Mode::Caches, limits);
    let mut conns: Vec<TcpStream> = (0..20)
        .map(|_| {
            let mut c = connect(h.addr);
            c.write_all(b"GET /objects/1 HTTP/1.1\r\nHost: x\r\nX-Slow: ")
                .unwrap();
            c
        })
        .collect();
    conns.push(connect(h.addr)); // sends nothing
                                 // One request, then nothing.
    let (idle, answer) =
        ask_under_short_timeouts(h.addr, b"GET /objects/1 HTTP/1.1\r\nHost: x\r\n\r\n");
    assert_eq!(answer.status, 200);
    conns.push(idle);
    for c in &mut conns {
        // The server closes each one, with no answer (read_to_end returns at the close;
        // the hang guard turns a connection left open into an error).
        let mut rest = Vec::new();
        match c.read_to_end(&mut rest) {
            Ok(_) => assert!(rest.is_empty(), "{}", String::from_utf8_lossy(&rest)),
            Err(e) => assert_eq!(e.kind(), ErrorKind::ConnectionReset, "hang guard: {e}"),
        }
    }
    assert!(h.finish());
}

#[test]
fn malformed_heads_get_400_and_oversized_heads_431() {
    let h = Harness::new();
    for bad in [
        &b"NOT A REQUEST\r\n\r\n"[..],
        b"GET / HTTP/9.9\r\n\r\n",
        b"GET / HTTP/1.1\r\nNo-Colon-Here\r\n\r\n",
        b"GET / HTTP/1.1\r\nBad Name: x\r\n\r\n",
        b"GET / HTTP/1.1\r\nX: \x01\x02\r\n\r\n",
        b"GET / HTTP/1.1\r\nContent-Length: nope\r\n\r\n",
        b"GET / HTTP/1.1\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\n",
        b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03\r\n\r\n", // TLS to a plain port
    ] {
        let answer = exchange(h.addr, bad);
        // A 4xx, or a close without an answer: never a hang, never a 2xx or 5xx.
        if let Some(a) = answer {
            assert!(
                (400..500).contains(&a.status),
                "{:?} -> {}",
                String::from_utf8_lossy(bad),
                a.head
            );
        }
    }
    for bad in [
        &b"NOT A REQUEST\r\n\r\n"[..],
        b"GET / HTTP/1.1\r\nBad Name: x\r\n\r\n",
    ] {
        assert_eq!(exchange(h.addr, bad).unwrap().status, 400);
    }
    let mut huge = b"GET / HTTP/1.1\r\nX-Big: ".to_vec();
    huge.extend(std::iter::repeat_n(b'a', 64 << 10));
    huge.extend_from_slice(b"\r\n\r\n");
    assert_eq!(exchange(h.addr, &huge).unwrap().status, 431);
    let mut many = b"GET / HTTP/1.1\r\n".to_vec();
    for i in 0..=server::MAX_HEADERS {
        many.extend_from_slice(format!("X-{i}: v\r\n").as_bytes());
    }
    many.extend_from_slice(b"\r\n");
    assert_eq!(exchange(h.addr, &many).unwrap().status, 431);
    // The proxy's own refusals.
    let connect_method = b"CONNECT example.test:443 HTTP/1.1\r\nHost: example.test:443\r\n\r\n";
    assert_eq!(exchange(h.addr, connect_method).unwrap().status, 405);
    assert_eq!(
        exchange(h.addr, b"OPTIONS * HTTP/1.1\r\nHost: x\r\n\r\n")
            .unwrap()
            .status,
        400
    );
    // A broken chunked body is the client's fault.
    let broken = b"POST /echo HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\nhello\r\n0\r\n\r\n";
    assert_eq!(exchange(h.addr, broken).unwrap().status, 400);
    // And it still serves.
    assert_eq!(get(h.addr, "/objects/2").status, 200);
    assert!(h.finish());
}

#[test]
fn chunked_and_sized_bodies_pass_through_with_their_framing() {
    let h = Harness::new();
    let mut c = connect(h.addr);
    let pieces: Vec<String> = (0..20)
        .map(|i| format!("piece {i} of a chunked body\n"))
        .collect();
    write!(
        c,
        "POST /echo HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
    )
    .unwrap();
    for piece in &pieces {
        write!(c, "{:x}\r\n{piece}\r\n", piece.len()).unwrap();
    }
    write!(c, "0\r\n\r\n").unwrap();
    let answer = read_answer(&mut c).unwrap();
    assert_eq!(answer.status, 200, "{}", answer.head);
    assert_eq!(answer.header("x-origin-framing"), Some("chunked"));
    assert_eq!(answer.header("transfer-encoding"), Some("chunked"));
    assert_eq!(answer.text(), pieces.concat());
    // The same connection, kept alive: a body with a Content-Length.
    let body = "x".repeat(100_000);
    write!(
        c,
        "POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    let answer = read_answer(&mut c).unwrap();
    assert_eq!(answer.status, 200, "{}", answer.head);
    assert_eq!(
        answer.header("x-origin-framing"),
        Some(format!("length {}", body.len()).as_str())
    );
    assert_eq!(answer.text(), body);
    assert!(h.finish());
}

#[test]
fn a_miss_is_stored_and_then_answered_from_the_cache() {
    let h = Harness::new();
    let miss = get(h.addr, "/objects/3");
    assert_eq!((miss.status, miss.header("x-cache")), (200, Some("MISS")));
    assert_eq!(miss.body, origin::object_body(3));
    let hit = get(h.addr, "/objects/3");
    assert_eq!((hit.status, hit.header("x-cache")), (200, Some("HIT")));
    assert_eq!(hit.body, origin::object_body(3));
    assert!(hit.header("age").is_some(), "{}", hit.head);
    assert_eq!(hit.header("via"), Some("1.1 showdown"));
    // no-store resources are fetched every time; a client's no-cache skips the cache.
    assert_eq!(get(h.addr, "/live/1").header("x-cache"), Some("MISS"));
    assert_eq!(get(h.addr, "/live/1").header("x-cache"), Some("MISS"));
    let raw = b"GET /objects/3 HTTP/1.1\r\nHost: x\r\nCache-Control: no-cache\r\nConnection: close\r\n\r\n";
    assert_eq!(
        exchange(h.addr, raw).unwrap().header("x-cache"),
        Some("PASS")
    );
    // The origin sees Via and X-Forwarded-For, and no hop-by-hop header.
    let raw = b"GET /headers HTTP/1.1\r\nHost: x\r\nConnection: close, x-secret\r\nX-Secret: 1\r\nKeep-Alive: 5\r\nX-Kept: yes\r\n\r\n";
    let seen = exchange(h.addr, raw).unwrap().text();
    assert!(seen.contains("x-kept: yes"), "{seen}");
    assert!(seen.contains("via: 1.1 showdown"), "{seen}");
    assert!(seen.contains("x-forwarded-for: 127.0.0.1"), "{seen}");
    for gone in ["x-secret", "keep-alive", "connection: close"] {
        assert!(!seen.contains(gone), "{gone} forwarded: {seen}");
    }
    assert!(h.finish());
}

#[test]
fn many_keep_alive_requests_on_one_connection() {
    let h = Harness::new();
    let mut c = connect(h.addr);
    for i in 0..50 {
        write!(c, "GET /objects/{} HTTP/1.1\r\nHost: x\r\n\r\n", i % 5).unwrap();
        let answer = read_answer(&mut c).unwrap();
        assert_eq!(answer.status, 200);
        assert_eq!(answer.body, origin::object_body(i % 5));
    }
    assert!(h.finish());
}

#[test]
fn graceful_shutdown_finishes_the_requests_in_flight() {
    let mut h = Harness::new();
    let addr = h.addr;
    let clients: Vec<_> = (0..8)
        .map(|_| std::thread::spawn(move || get(addr, "/slow/300")))
        .collect();
    // Wait (bounded) until all eight transactions are under way at the proxy.
    let start = Instant::now();
    while h.allocs.txns.stats().live < 8 {
        assert!(start.elapsed() < HANG_GUARD, "requests never arrived");
        std::thread::sleep(Duration::from_millis(5));
    }
    let running = h.running.take().unwrap();
    let shutdown = h.runtime.spawn(running.shutdown());
    for client in clients {
        let answer = client.join().unwrap();
        assert_eq!(answer.status, 200, "{}", answer.head);
        assert!(answer.text().starts_with("slow answer"));
    }
    assert!(h.runtime.block_on(shutdown).unwrap(), "did not drain");
    assert!(
        TcpStream::connect(addr).is_err(),
        "still accepting after shutdown"
    );
    drop(h.runtime);
    assert_eq!(h.allocs.live(), 0);
}

#[test]
fn stalled_and_vanished_clients_lose_nothing() {
    let limits = Limits {
        idle_timeout: Duration::from_millis(300),
        ..Limits::default()
    };
    let h = Harness::start(Mode::Caches, limits);
    // Promises 10 bytes and sends 3: the watchdog closes the connection.
    let mut stalled = connect(h.addr);
    stalled
        .write_all(b"POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 10\r\n\r\nabc")
        .unwrap();
    let mut rest = Vec::new();
    let _ = stalled.read_to_end(&mut rest); // returns at the close (or the hang guard panics below)
    assert!(closed(&stalled));
    // Clients that leave mid-head, mid-body, or before the answer.
    let slow = b"GET /slow/100 HTTP/1.1\r\nHost: x\r\n\r\n";
    for raw in [
        &slow[..10],
        &slow[..],
        b"POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 50\r\n\r\nab",
    ] {
        let mut c = connect(h.addr);
        c.write_all(raw).unwrap();
        drop(c);
    }
    let get4 = b"GET /objects/4 HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n";
    assert_eq!(ask_under_short_timeouts(h.addr, get4).1.status, 200);
    assert!(h.finish());
}

#[test]
fn every_mode_serves_and_frees_everything() {
    // System mode's pool blocks follow PROXALLOC_BYPASS, which a test cannot set safely;
    // its objects bypass through their Config all the same.
    for mode in Mode::ALL {
        let h = Harness::start(mode, Limits::default());
        for _ in 0..2 {
            assert_eq!(get(h.addr, "/objects/9").body, origin::object_body(9));
            assert_eq!(get(h.addr, "/live/9").status, 200);
        }
        assert!(h.finish());
    }
}

#[test]
fn shutdown_closes_heads_under_way_and_finishes_requests_in_flight() {
    // A head timeout far past the hang guard: the drain must not wait for it.
    let limits = Limits {
        header_read_timeout: Duration::from_secs(3600),
        ..Limits::default()
    };
    let mut h = Harness::start(Mode::Caches, limits);
    let addr = h.addr;
    let mut half = connect(addr);
    half.write_all(b"GET /objects/1 HTTP/1.1\r\nHost: x\r\nX-Slow: ")
        .unwrap();
    let mut between = connect(addr); // keep-alive, between two requests
    between
        .write_all(b"GET /objects/2 HTTP/1.1\r\nHost: x\r\n\r\n")
        .unwrap();
    assert_eq!(read_answer(&mut between).unwrap().status, 200);
    let mut silent = connect(addr); // has sent nothing yet
    let slow = std::thread::spawn(move || get(addr, "/slow/300"));
    // The slow request is under way at the proxy; a whole exchange on a later
    // connection gives the proxy time to have read the half head too (if it had not,
    // hyper would close that connection as one that sent nothing, and the test would
    // pass without the head-under-way rule: seeding a bug there shows it runs).
    let start = Instant::now();
    while h.allocs.txns.stats().live < 1 {
        assert!(
            start.elapsed() < HANG_GUARD,
            "the slow request never arrived"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    let mut after = connect(addr);
    after
        .write_all(b"GET /objects/3 HTTP/1.1\r\nHost: x\r\n\r\n")
        .unwrap();
    assert_eq!(read_answer(&mut after).unwrap().status, 200);
    let running = h.running.take().unwrap();
    let shutdown = h.runtime.spawn(running.shutdown());
    // The request in flight is answered; every other connection is closed unanswered.
    let answer = slow.join().unwrap();
    assert_eq!(answer.status, 200, "{}", answer.head);
    for c in [&mut half, &mut between, &mut silent, &mut after] {
        let mut rest = Vec::new();
        match c.read_to_end(&mut rest) {
            Ok(_) => assert!(rest.is_empty(), "{}", String::from_utf8_lossy(&rest)),
            Err(e) => assert_eq!(e.kind(), ErrorKind::ConnectionReset, "hang guard: {e}"),
        }
    }
    // Drained within the drain timeout, which a head left waiting would have outlasted.
    assert!(h.runtime.block_on(shutdown).unwrap(), "did not drain");
    drop(h.runtime);
    assert_eq!(h.allocs.live(), 0);
}

#[test]
fn the_listener_queues_a_burst_of_connections_it_has_not_accepted() {
    // Nothing accepts: every connection whose handshake completes waits in the kernel's
    // accept queue, which holds about `backlog` (std's and tokio's `bind` ask for 128).
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let listener = runtime
        .block_on(async { server::listen(SocketAddr::from(([127, 0, 0, 1], 0))) })
        .unwrap();
    let addr = listener.local_addr().unwrap();
    let somaxconn: u32 = std::fs::read_to_string("/proc/sys/net/core/somaxconn")
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(4096);
    assert!(
        server::backlog() >= somaxconn.max(1024),
        "{}",
        server::backlog()
    );
    let burst = somaxconn.min(1100) as usize;
    raise_fd_limit(burst + 64);
    // A connection past a full queue loses its SYN and its connect never completes: the
    // hang guard turns that into a failure.
    let conns: Vec<TcpStream> = (0..burst)
        .map(|i| {
            TcpStream::connect_timeout(&addr, HANG_GUARD)
                .unwrap_or_else(|e| panic!("connection {i} of {burst} not queued: {e}"))
        })
        .collect();
    assert_eq!(conns.len(), burst);
    drop(conns);
    drop(listener);
}

/// Raises the soft limit on open files to at least `n` (up to the hard limit).
fn raise_fd_limit(n: usize) {
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit and setrlimit read and write the struct we pass.
    unsafe {
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) == 0 && limit.rlim_cur < n as u64 {
            limit.rlim_cur = limit.rlim_max.min(n as u64);
            libc::setrlimit(libc::RLIMIT_NOFILE, &limit);
        }
    }
}

#[test]
fn the_global_allocator_is_the_one_the_environment_names_and_this_build_has() {
    use global::{choose, Kind};
    for kind in Kind::ALL {
        assert_eq!(Kind::parse(kind.flag()), Some(kind));
    }
    assert_eq!(choose(None, true), Kind::Glibc);
    assert_eq!(choose(Some(b"glibc"), true), Kind::Glibc);
    assert_eq!(choose(Some(b"mimalloc"), false), Kind::Mimalloc);
    assert_eq!(choose(Some(b"jemalloc"), true), Kind::Jemalloc);
    // A build without jemalloc runs under glibc, and `ensure` says why.
    assert_eq!(choose(Some(b"jemalloc"), false), Kind::Glibc);
    assert_eq!(choose(Some(b"tcmalloc"), true), Kind::Glibc);
    assert_eq!(global::ENV, "SHOWDOWN_GLOBAL");
    let example = global::Global::<global::NoJemalloc>::new(None);
    assert!(example.has(Kind::Mimalloc) && !example.has(Kind::Jemalloc));
}
