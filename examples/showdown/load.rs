//! A keep-alive HTTP/1.1 load generator for the showdown: `connections` threads, each with
//! one connection, send requests with a dozen headers back to back until the deadline or
//! the request budget, and record each request's latency.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// Latencies up to this many microseconds are counted exactly; longer ones in one bucket.
const HISTOGRAM_US: usize = 20_000;

/// A fixed-size latency histogram (1 µs buckets), so a long run does not grow memory.
#[derive(Clone)]
pub struct Histogram(Vec<u64>);

impl Histogram {
    fn new() -> Self {
        Histogram(vec![0; HISTOGRAM_US + 1])
    }

    fn record(&mut self, d: Duration) {
        let us = (d.as_micros() as usize).min(HISTOGRAM_US);
        self.0[us] += 1;
    }

    fn merge(&mut self, other: &Histogram) {
        for (a, b) in self.0.iter_mut().zip(&other.0) {
            *a += b;
        }
    }
}

/// What a load run measured.
pub struct LoadResult {
    pub requests: u64,
    pub errors: u64,
    pub elapsed: Duration,
    pub latencies: Histogram,
}

impl LoadResult {
    pub fn rate(&self) -> f64 {
        self.requests as f64 / self.elapsed.as_secs_f64()
    }

    /// The latency below which a share `p` of requests completed, in microseconds.
    pub fn percentile_us(&self, p: f64) -> u32 {
        let total: u64 = self.latencies.0.iter().sum();
        if total == 0 {
            return 0;
        }
        let target = ((total - 1) as f64 * p).round() as u64;
        let mut seen = 0;
        for (us, &n) in self.latencies.0.iter().enumerate() {
            seen += n;
            if seen > target {
                return us as u32;
            }
        }
        HISTOGRAM_US as u32
    }
}

fn request(i: u64) -> Vec<u8> {
    format!(
        "GET /objects/{i}/detail?view=full HTTP/1.1\r\n\
         Host: 127.0.0.1\r\n\
         User-Agent: proxalloc-showdown/1.0\r\n\
         Accept: text/plain, */*;q=0.8\r\n\
         Accept-Language: en-US,en;q=0.5\r\n\
         Accept-Encoding: identity\r\n\
         Cache-Control: no-cache\r\n\
         Pragma: no-cache\r\n\
         X-Request-Id: {i:016x}\r\n\
         X-Forwarded-For: 10.0.0.{}\r\n\
         Cookie: session=abcdef0123456789; theme=dark\r\n\
         Referer: http://127.0.0.1/objects\r\n\
         Connection: keep-alive\r\n\r\n",
        i % 250
    )
    .into_bytes()
}

/// Reads one response (head plus `Content-Length` body) into `buf`; false on error.
fn read_response(conn: &mut TcpStream, buf: &mut Vec<u8>) -> bool {
    buf.clear();
    let mut chunk = [0u8; 8192];
    loop {
        if let Some(head_end) = buf.windows(4).position(|w| w == b"\r\n\r\n").map(|p| p + 4) {
            let head = std::str::from_utf8(&buf[..head_end]).unwrap_or("");
            if !head.starts_with("HTTP/1.1 200") {
                return false;
            }
            let len: usize = head
                .lines()
                .find_map(|l| l.strip_prefix("Content-Length: "))
                .and_then(|v| v.trim().parse().ok())
                .unwrap_or(0);
            while buf.len() < head_end + len {
                match conn.read(&mut chunk) {
                    Ok(0) | Err(_) => return false,
                    Ok(n) => buf.extend_from_slice(&chunk[..n]),
                }
            }
            return true;
        }
        match conn.read(&mut chunk) {
            Ok(0) | Err(_) => return false,
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
        }
    }
}

/// Drives `addr` with `connections` keep-alive connections for `duration` or until
/// `max_requests` requests were sent, whichever comes first.
pub fn run(
    addr: SocketAddr,
    connections: usize,
    duration: Duration,
    max_requests: u64,
) -> LoadResult {
    let sent = AtomicU64::new(0);
    let start = Instant::now();
    let deadline = start + duration;
    let per_thread: Vec<(u64, u64, Histogram)> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..connections.max(1))
            .map(|_| {
                let sent = &sent;
                s.spawn(move || {
                    let (mut ok, mut errors, mut lat) = (0u64, 0u64, Histogram::new());
                    let Ok(mut conn) = TcpStream::connect(addr) else {
                        return (0, 1, lat);
                    };
                    let _ = conn.set_nodelay(true);
                    let _ = conn.set_read_timeout(Some(Duration::from_secs(5)));
                    let mut buf = Vec::with_capacity(8192);
                    while Instant::now() < deadline {
                        let i = sent.fetch_add(1, Ordering::Relaxed);
                        if i >= max_requests {
                            break;
                        }
                        let t = Instant::now();
                        if conn.write_all(&request(i)).is_err()
                            || !read_response(&mut conn, &mut buf)
                        {
                            errors += 1;
                            break;
                        }
                        lat.record(t.elapsed());
                        ok += 1;
                    }
                    (ok, errors, lat)
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let elapsed = start.elapsed();
    let mut latencies = Histogram::new();
    for t in &per_thread {
        latencies.merge(&t.2);
    }
    LoadResult {
        requests: per_thread.iter().map(|t| t.0).sum(),
        errors: per_thread.iter().map(|t| t.1).sum(),
        elapsed,
        latencies,
    }
}
