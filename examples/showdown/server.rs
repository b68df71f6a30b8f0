//! A small multi-threaded HTTP/1.1 server built the way a proxy or origin server uses
//! proxalloc: per request a request-state object and one object per header from
//! `ClassAllocator`s, and a per-connection pool (cleared per request, an iterpool) for the
//! parsed request and the response, whose body is built with the pool's writer.
//!
//! Shared by the `showdown` example and its tests (`tests/showdown.rs`).

use std::io::{self, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{mpsc, Mutex};
use std::time::{Duration, Instant};

use proxalloc::{CacheMode, ClassAllocator, Config, Pool, PoolVec, Pooled};

/// How the server allocates.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    /// proxalloc's per-thread caches.
    Caches,
    /// The depot only: Traffic Server's global freelist, before its proxy allocators.
    DepotOnly,
    /// Every object and every pool allocation straight from the system allocator.
    System,
}

impl Mode {
    pub const ALL: [Mode; 3] = [Mode::Caches, Mode::DepotOnly, Mode::System];

    pub fn name(self) -> &'static str {
        match self {
            Mode::Caches => "proxalloc (thread caches)",
            Mode::DepotOnly => "depot only (global freelist)",
            Mode::System => "system allocator",
        }
    }

    pub fn parse(s: &str) -> Option<Mode> {
        match s {
            "caches" => Some(Mode::Caches),
            "depot" => Some(Mode::DepotOnly),
            "system" => Some(Mode::System),
            _ => None,
        }
    }
}

/// Per-request state, as a proxy keeps it (about 300 bytes).
#[allow(dead_code)]
pub struct RequestState {
    pub method: [u8; 8],
    pub path_hash: u64,
    pub keep_alive: bool,
    pub content_length: usize,
    pub header_count: usize,
    pub started: Instant,
    pub scratch: [u64; 32],
}

/// One parsed header: offsets of its name and value in the request buffer.
#[allow(dead_code)]
pub struct HeaderEntry {
    pub name: (u32, u32),
    pub value: (u32, u32),
    pub hash: u64,
}

/// The allocators of one server instance.
pub struct Allocators {
    pub mode: Mode,
    pub requests: ClassAllocator<RequestState>,
    pub headers: ClassAllocator<HeaderEntry>,
}

impl Allocators {
    pub fn new(mode: Mode) -> Self {
        let cache_mode = match mode {
            Mode::Caches => CacheMode::ThreadCaches,
            Mode::DepotOnly => CacheMode::DepotOnly,
            Mode::System => CacheMode::Bypass,
        };
        let cfg = Config::new().mode(cache_mode);
        Allocators {
            mode,
            requests: ClassAllocator::with_config("http-request-state", cfg),
            headers: ClassAllocator::with_config("http-header", cfg),
        }
    }

    /// A pool for one connection (a debug pool, every allocation from the system
    /// allocator, in system mode).
    fn pool(&self) -> Pool<'static> {
        match self.mode {
            Mode::System => Pool::new_debug(),
            _ => Pool::new(),
        }
    }
}

/// The most bytes a request head may have (request line and headers).
pub const MAX_HEAD: usize = 8 << 10;
/// The most headers a request may have.
pub const MAX_HEADERS: usize = 100;

/// Server counters.
#[derive(Default)]
pub struct Counters {
    pub served: AtomicU64,
    pub rejected: AtomicU64,
    pub connections: AtomicU64,
}

/// Serves `listener` with `workers` connection threads until `stop` is set. Returns when
/// every worker has finished its current connection.
pub fn serve(
    listener: TcpListener,
    workers: usize,
    allocs: &Allocators,
    stop: &AtomicBool,
    counters: &Counters,
) {
    listener
        .set_nonblocking(true)
        .expect("non-blocking listener");
    let (tx, rx) = mpsc::channel::<TcpStream>();
    let rx = Mutex::new(rx);
    std::thread::scope(|s| {
        for _ in 0..workers.max(1) {
            s.spawn(|| loop {
                let next = rx.lock().unwrap().recv();
                match next {
                    Ok(conn) => {
                        counters.connections.fetch_add(1, Ordering::Relaxed);
                        handle_connection(conn, allocs, counters, stop);
                    }
                    Err(_) => break,
                }
            });
        }
        while !stop.load(Ordering::Relaxed) {
            match listener.accept() {
                Ok((conn, _)) => {
                    let _ = conn.set_nonblocking(false);
                    let _ = conn.set_nodelay(true);
                    let _ = conn.set_read_timeout(Some(Duration::from_millis(200)));
                    let _ = tx.send(conn);
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    std::thread::sleep(Duration::from_millis(2));
                }
                Err(_) => std::thread::sleep(Duration::from_millis(2)),
            }
        }
        drop(tx);
    });
}

/// What reading a request head found.
enum Head {
    /// The head ends at this offset (just past the blank line).
    Complete(usize),
    /// The peer closed, or went silent while the server is stopping.
    Closed,
    /// The head exceeded [`MAX_HEAD`].
    TooLarge,
}

/// Reads until the buffer holds a whole request head.
fn read_head(conn: &mut TcpStream, buf: &mut Vec<u8>, stop: &AtomicBool) -> Head {
    loop {
        if let Some(end) = find_head_end(buf) {
            return Head::Complete(end);
        }
        if buf.len() >= MAX_HEAD {
            return Head::TooLarge;
        }
        let mut chunk = [0u8; 4096];
        match conn.read(&mut chunk) {
            Ok(0) => return Head::Closed,
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
            Err(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
                ) =>
            {
                if stop.load(Ordering::Relaxed) {
                    return Head::Closed;
                }
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(_) => return Head::Closed,
        }
    }
}

fn find_head_end(buf: &[u8]) -> Option<usize> {
    buf.windows(4).position(|w| w == b"\r\n\r\n").map(|p| p + 4)
}

fn hash(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, &b| {
        (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3)
    })
}

/// Serves one connection: requests one after another (keep-alive) until the peer closes,
/// asks to close, or sends something the server rejects.
fn handle_connection(
    mut conn: TcpStream,
    allocs: &Allocators,
    counters: &Counters,
    stop: &AtomicBool,
) {
    let mut pool = allocs.pool();
    let mut buf = Vec::with_capacity(MAX_HEAD);
    loop {
        let end = match read_head(&mut conn, &mut buf, stop) {
            Head::Complete(end) => end,
            Head::Closed => return,
            Head::TooLarge => {
                counters.rejected.fetch_add(1, Ordering::Relaxed);
                let _ = conn.write_all(&error_response(431, "Request Header Fields Too Large"));
                return;
            }
        };
        let outcome = respond(&mut conn, &buf[..end], allocs, &pool, counters);
        pool.clear();
        buf.drain(..end);
        match outcome {
            Ok(true) => {}
            Ok(false) | Err(_) => return,
        }
    }
}

fn error_response(status: u16, reason: &str) -> Vec<u8> {
    format!("HTTP/1.1 {status} {reason}\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
        .into_bytes()
}

/// Parses one request head and writes the response; `Ok(keep_alive)`.
fn respond(
    conn: &mut TcpStream,
    head: &[u8],
    allocs: &Allocators,
    pool: &Pool<'static>,
    counters: &Counters,
) -> io::Result<bool> {
    match parse(head, allocs, pool) {
        Ok(req) => {
            let mut body = pool.writer();
            let _ = writeln!(
                body,
                "path-hash {:016x}, {} headers, method {}",
                req.state.path_hash,
                req.state.header_count,
                std::str::from_utf8(&req.state.method)
                    .unwrap_or("?")
                    .trim_end_matches('\0')
            );
            for h in req.headers.iter().take(8) {
                let name = &head[h.name.0 as usize..(h.name.0 + h.name.1) as usize];
                let value = &head[h.value.0 as usize..(h.value.0 + h.value.1) as usize];
                body.push_bytes(name);
                body.push_bytes(b": ");
                body.push_bytes(value);
                body.push_bytes(b"\n");
            }
            let body = body.finish();
            let mut out = pool.writer();
            let _ = write!(
                out,
                "HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: {}\r\nConnection: {}\r\n\r\n",
                body.len(),
                if req.state.keep_alive { "keep-alive" } else { "close" }
            );
            out.push_bytes(body);
            conn.write_all(out.finish())?;
            counters.served.fetch_add(1, Ordering::Relaxed);
            Ok(req.state.keep_alive)
        }
        Err(status) => {
            counters.rejected.fetch_add(1, Ordering::Relaxed);
            let reason = if status == 431 {
                "Request Header Fields Too Large"
            } else {
                "Bad Request"
            };
            conn.write_all(&error_response(status, reason))?;
            Ok(false)
        }
    }
}

/// A parsed request: its state object and its header objects, all from the allocators,
/// listed in pool memory.
pub struct Request<'a, 'p> {
    pub state: Pooled<'a, RequestState>,
    pub headers: PoolVec<'p, 'static, Pooled<'a, HeaderEntry>>,
}

/// Parses a request head; `Err(status)` for a request to reject.
pub fn parse<'a, 'p>(
    head: &[u8],
    allocs: &'a Allocators,
    pool: &'p Pool<'static>,
) -> Result<Request<'a, 'p>, u16> {
    let text = std::str::from_utf8(head).map_err(|_| 400u16)?;
    let mut lines = text.split("\r\n");
    let request_line = lines.next().ok_or(400u16)?;
    let mut parts = request_line.split(' ');
    let (method, path, version) = match (parts.next(), parts.next(), parts.next(), parts.next()) {
        (Some(m), Some(p), Some(v), None) if !m.is_empty() && p.starts_with('/') => (m, p, v),
        _ => return Err(400),
    };
    let keep_alive_default = match version {
        "HTTP/1.1" => true,
        "HTTP/1.0" => false,
        _ => return Err(400),
    };
    if method.len() > 8 || !method.bytes().all(|b| b.is_ascii_uppercase()) {
        return Err(400);
    }
    let mut headers = PoolVec::with_capacity_in(16, pool);
    let mut keep_alive = keep_alive_default;
    let mut content_length = 0usize;
    let base = head.as_ptr() as usize;
    for line in lines.take_while(|l| !l.is_empty()) {
        let (name, value) = line.split_once(':').ok_or(400u16)?;
        if name.is_empty() || name.bytes().any(|b| b == b' ' || b == b'\t') {
            return Err(400);
        }
        let value = value.trim();
        if headers.len() == MAX_HEADERS {
            return Err(431);
        }
        if name.eq_ignore_ascii_case("connection") {
            keep_alive = !value.eq_ignore_ascii_case("close");
        } else if name.eq_ignore_ascii_case("content-length") {
            content_length = value.parse().map_err(|_| 400u16)?;
            if content_length > 0 {
                return Err(400); // this server takes no request bodies
            }
        }
        let off = |s: &str| (s.as_ptr() as usize - base) as u32;
        headers.push(allocs.headers.alloc(HeaderEntry {
            name: (off(name), name.len() as u32),
            value: (off(value), value.len() as u32),
            hash: hash(name.as_bytes()),
        }));
    }
    let mut m = [0u8; 8];
    m[..method.len()].copy_from_slice(method.as_bytes());
    let state = allocs.requests.alloc(RequestState {
        method: m,
        path_hash: hash(path.as_bytes()),
        keep_alive,
        content_length,
        header_count: headers.len(),
        started: Instant::now(),
        scratch: [0; 32],
    });
    Ok(Request { state, headers })
}
