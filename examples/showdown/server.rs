//! The connection loop that the proxy and its origin share: hyper's HTTP/1.1 server on
//! tokio, with the limits a server that faces the internet needs, and a graceful
//! shutdown.
//!
//! - **Slow heads.** A client has [`Limits::header_read_timeout`] to send a whole request
//!   head, counted from the connection's start or from the end of its previous response,
//!   so the same timer closes idle keep-alive connections. A slowloris client (a head
//!   trickled a byte at a time, or half a head and silence) costs one small task until
//!   then, and never holds up anyone else: every connection is its own task.
//! - **Stalls.** A connection that moves no byte either way for [`Limits::idle_timeout`]
//!   while a request is under way (a body trickled forever, an answer never read) is
//!   closed by a watchdog.
//! - **Big or bad heads.** Over [`Limits::max_head_bytes`] of request line and headers,
//!   or over [`MAX_HEADERS`] headers: `431`. A head hyper cannot parse: `400`. Both close
//!   the connection.
//! - **Shutdown.** When `shutdown` resolves the listener closes, idle connections close,
//!   and requests in flight finish (for at most [`Limits::drain_timeout`]).

use std::convert::Infallible;
use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{Either, Full};
use hyper::body::Incoming;
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Request, Response};
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::server::graceful::GracefulShutdown;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};

/// What errors inside bodies are boxed as.
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// A response body: bytes the server has whole (`Full`), or a body streamed through from
/// the other side (`Incoming`: a proxied answer, an echoed request).
pub type RespBody = Either<Full<Bytes>, Incoming>;

/// Headers a request may have: hyper's own limit (it keeps them on the stack), `431`
/// beyond.
pub const MAX_HEADERS: usize = 100;

/// The limits of one server.
#[derive(Clone, Copy, Debug)]
pub struct Limits {
    /// Time to send a whole request head; also the keep-alive idle timeout.
    pub header_read_timeout: Duration,
    /// A request during which no byte moves for this long loses its connection.
    pub idle_timeout: Duration,
    /// Most bytes of request line and headers (at least 8 KiB): `431` beyond.
    pub max_head_bytes: usize,
    /// Time that requests in flight get to finish at shutdown.
    pub drain_timeout: Duration,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            header_read_timeout: Duration::from_secs(10),
            idle_timeout: Duration::from_secs(30),
            max_head_bytes: 16 << 10,
            drain_timeout: Duration::from_secs(10),
        }
    }
}

/// Serves `listener` until `shutdown` resolves, then drains. Every request goes to
/// `handler` with the client's address. Returns whether every connection finished
/// within the drain timeout.
pub async fn serve<H, F>(
    listener: TcpListener,
    limits: Limits,
    shutdown: impl Future<Output = ()>,
    handler: H,
) -> bool
where
    H: Fn(Request<Incoming>, SocketAddr) -> F + Clone + Send + 'static,
    F: Future<Output = Response<RespBody>> + Send + 'static,
{
    let mut http = http1::Builder::new();
    http.timer(TokioTimer::new())
        .header_read_timeout(limits.header_read_timeout)
        .max_header_size(limits.max_head_bytes)
        .max_buf_size(limits.max_head_bytes.max(8 << 10));
    let graceful = GracefulShutdown::new();
    tokio::pin!(shutdown);
    loop {
        let (stream, peer) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(conn) => conn,
                // Out of file descriptors, or a connection reset before it was accepted:
                // back off a little instead of spinning.
                Err(_) => {
                    tokio::time::sleep(Duration::from_millis(10)).await;
                    continue;
                }
            },
            () = &mut shutdown => break,
        };
        let _ = stream.set_nodelay(true);
        let handler = handler.clone();
        let service = service_fn(move |req| {
            let response = handler(req, peer);
            async move { Ok::<_, Infallible>(response.await) }
        });
        let (io, progress) = Watched::new(stream);
        let conn = graceful.watch(http.serve_connection(TokioIo::new(io), service));
        tokio::spawn(watchdog(conn, progress, limits.idle_timeout));
    }
    drop(listener);
    tokio::time::timeout(limits.drain_timeout, graceful.shutdown())
        .await
        .is_ok()
}

/// Drives one connection, and drops it (closing the socket) if a whole `idle` period
/// passes without a byte read or written. Errors (a client gone mid-request, a bad head
/// already answered with 4xx) end the connection and are not reported.
async fn watchdog(conn: impl Future, progress: Arc<AtomicU64>, idle: Duration) {
    tokio::pin!(conn);
    let mut seen = progress.load(Ordering::Relaxed);
    loop {
        tokio::select! {
            _ = conn.as_mut() => return,
            () = tokio::time::sleep(idle) => {
                let now = progress.load(Ordering::Relaxed);
                if now == seen {
                    return;
                }
                seen = now;
            }
        }
    }
}

/// A TCP stream that counts the reads and writes that moved bytes, for the watchdog.
struct Watched {
    stream: TcpStream,
    progress: Arc<AtomicU64>,
}

impl Watched {
    fn new(stream: TcpStream) -> (Self, Arc<AtomicU64>) {
        let progress = Arc::new(AtomicU64::new(0));
        let watched = Watched {
            stream,
            progress: Arc::clone(&progress),
        };
        (watched, progress)
    }

    fn moved<T>(
        &self,
        result: Poll<io::Result<T>>,
        bytes: impl Fn(&T) -> usize,
    ) -> Poll<io::Result<T>> {
        if let Poll::Ready(Ok(value)) = &result {
            if bytes(value) > 0 {
                self.progress.fetch_add(1, Ordering::Relaxed);
            }
        }
        result
    }
}

impl AsyncRead for Watched {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let before = buf.filled().len();
        let result = Pin::new(&mut self.stream).poll_read(cx, buf);
        let read = buf.filled().len() - before;
        self.moved(result, |()| read)
    }
}

impl AsyncWrite for Watched {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let result = Pin::new(&mut self.stream).poll_write(cx, buf);
        self.moved(result, |n| *n)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let result = Pin::new(&mut self.stream).poll_write_vectored(cx, bufs);
        self.moved(result, |n| *n)
    }

    fn is_write_vectored(&self) -> bool {
        self.stream.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_shutdown(cx)
    }
}
