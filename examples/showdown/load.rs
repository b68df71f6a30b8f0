//! The built-in load generator: `connections` keep-alive connections, each sending a
//! request, reading the answer and sending the next, on one tokio thread (so that it takes
//! at most one core from the server). Nine requests in ten are for one of 1,000 cacheable
//! objects (hits once the cache is warm); one in ten is for a `no-store` resource that the
//! proxy must fetch from the origin each time.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// What one run measured.
#[derive(Default)]
pub struct LoadResult {
    /// Answers with a 2xx status.
    pub ok: u64,
    /// Answers with another status.
    pub non_2xx: u64,
    /// Connections that failed: refused, reset, timed out, or a garbled answer.
    pub errors: u64,
    pub elapsed: Duration,
    /// Latency of every 2xx answer, in microseconds.
    latencies_us: Vec<u32>,
}

impl LoadResult {
    pub fn rate(&self) -> f64 {
        self.ok as f64 / self.elapsed.as_secs_f64()
    }

    /// The latency under which a share `p` of the answers came, in milliseconds.
    pub fn percentile_ms(&mut self, p: f64) -> f64 {
        if self.latencies_us.is_empty() {
            return 0.0;
        }
        self.latencies_us.sort_unstable();
        let i = ((self.latencies_us.len() - 1) as f64 * p).round() as usize;
        f64::from(self.latencies_us[i]) / 1000.0
    }
}

/// Drives `addr` with `connections` connections for `duration`.
pub fn run(addr: SocketAddr, connections: usize, duration: Duration) -> LoadResult {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a tokio runtime");
    runtime.block_on(async {
        let next = Arc::new(AtomicU64::new(0));
        let start = Instant::now();
        let deadline = start + duration;
        let tasks: Vec<_> = (0..connections.max(1))
            .map(|_| tokio::spawn(connection(addr, deadline, Arc::clone(&next))))
            .collect();
        let mut total = LoadResult::default();
        for task in tasks {
            let one = task.await.unwrap_or_default();
            total.ok += one.ok;
            total.non_2xx += one.non_2xx;
            total.errors += one.errors;
            total.latencies_us.extend(one.latencies_us);
        }
        total.elapsed = start.elapsed();
        total
    })
}

/// The request for number `i`.
fn request(i: u64, out: &mut Vec<u8>) {
    use std::io::Write;
    out.clear();
    let path = if i % 10 == 0 {
        format!("/live/{i}")
    } else {
        format!("/objects/{}", i % 1000)
    };
    let _ = write!(
        out,
        "GET {path} HTTP/1.1\r\n\
         Host: showdown.test\r\n\
         User-Agent: showdown-load/1.0\r\n\
         Accept: text/plain, */*;q=0.8\r\n\
         Accept-Language: en-US,en;q=0.5\r\n\
         Accept-Encoding: identity\r\n\
         X-Request-Id: {i:016x}\r\n\
         Cookie: session=abcdef0123456789; theme=dark\r\n\
         Referer: http://showdown.test/objects\r\n\
         Connection: keep-alive\r\n\r\n"
    );
}

/// One connection's requests until the deadline.
async fn connection(addr: SocketAddr, deadline: Instant, next: Arc<AtomicU64>) -> LoadResult {
    let mut result = LoadResult::default();
    let Ok(mut stream) = TcpStream::connect(addr).await else {
        result.errors += 1;
        return result;
    };
    let _ = stream.set_nodelay(true);
    let (mut out, mut buf) = (Vec::with_capacity(512), Vec::with_capacity(16 << 10));
    while Instant::now() < deadline {
        request(next.fetch_add(1, Relaxed), &mut out);
        let sent = Instant::now();
        let answer = tokio::time::timeout(Duration::from_secs(10), async {
            stream.write_all(&out).await.ok()?;
            read_response(&mut stream, &mut buf).await
        });
        match answer.await {
            Ok(Some(status)) if (200..300).contains(&status) => {
                result.ok += 1;
                let us = sent.elapsed().as_micros().min(u128::from(u32::MAX)) as u32;
                result.latencies_us.push(us);
            }
            Ok(Some(_)) => result.non_2xx += 1,
            Ok(None) | Err(_) => {
                result.errors += 1;
                break;
            }
        }
    }
    result
}

/// Reads one answer (a head and a `Content-Length` body); returns its status, or `None`
/// if the connection broke or the answer was not one this generator understands.
async fn read_response(stream: &mut TcpStream, buf: &mut Vec<u8>) -> Option<u16> {
    buf.clear();
    let head_end = loop {
        if let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            break end + 4;
        }
        if buf.len() > 64 << 10 || read_more(stream, buf).await? == 0 {
            return None;
        }
    };
    let head = std::str::from_utf8(&buf[..head_end]).ok()?;
    let status = head.strip_prefix("HTTP/1.1 ")?.get(..3)?.parse().ok()?;
    let length: usize = head.lines().find_map(|line| {
        let (name, value) = line.split_once(':')?;
        name.eq_ignore_ascii_case("content-length")
            .then(|| value.trim().parse().ok())?
    })?;
    while buf.len() < head_end + length {
        if read_more(stream, buf).await? == 0 {
            return None;
        }
    }
    Some(status)
}

async fn read_more(stream: &mut TcpStream, buf: &mut Vec<u8>) -> Option<usize> {
    let mut chunk = [0u8; 8192];
    let n = stream.read(&mut chunk).await.ok()?;
    buf.extend_from_slice(&chunk[..n]);
    Some(n)
}
