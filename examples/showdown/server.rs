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
//!   connections part-way through a request head close (a slowloris client would
//!   otherwise hold the drain for its whole header-read timeout), and requests in flight
//!   finish (for at most [`Limits::drain_timeout`]).
//! - **Bursts.** [`listen`] asks the kernel for a long accept queue ([`backlog`]), so a
//!   burst of new connections waits in it instead of losing its SYNs.

use std::convert::Infallible;
use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{Either, Full};
use hyper::body::{Body, Frame, Incoming, SizeHint};
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Request, Response};
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::server::graceful::GracefulShutdown;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpSocket, TcpStream};
use tokio::sync::watch;

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

/// The accept queue [`listen`] asks for: `net.core.somaxconn` (the kernel's cap on it),
/// and at least 4096 where that cannot be read. `std`'s and tokio's `bind` ask for 128,
/// which a burst of a few hundred new connections overflows: the kernel then drops
/// their SYNs, and each waits a 1 s retransmit.
pub fn backlog() -> u32 {
    std::fs::read_to_string("/proc/sys/net/core/somaxconn")
        .ok()
        .and_then(|s| s.trim().parse::<u32>().ok())
        .map_or(4096, |max| max.clamp(1024, i32::MAX as u32))
}

/// A listening socket on `addr` (with `SO_REUSEADDR`, as `TcpListener::bind` sets) and an
/// accept queue of [`backlog`]. Needs a tokio runtime.
pub fn listen(addr: SocketAddr) -> io::Result<TcpListener> {
    let socket = if addr.is_ipv4() {
        TcpSocket::new_v4()?
    } else {
        TcpSocket::new_v6()?
    };
    socket.set_reuseaddr(true)?;
    socket.bind(addr)?;
    socket.listen(backlog())
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
    let (stopping, stop_seen) = watch::channel(());
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
        let state = Arc::new(ConnState::default());
        let service_state = Arc::clone(&state);
        let service = service_fn(move |req| {
            // Counted from here until hyper drops the response body (sent, or the
            // connection gone), or this future if it never answers.
            let in_flight = InFlight::enter(&service_state);
            let response = handler(req, peer);
            async move {
                let response = response.await;
                Ok::<_, Infallible>(response.map(|body| Tracked {
                    body,
                    _in_flight: in_flight,
                }))
            }
        });
        let io = Watched {
            stream,
            state: Arc::clone(&state),
        };
        let conn = graceful.watch(http.serve_connection(TokioIo::new(io), service));
        let stop = stop_seen.clone();
        tokio::spawn(watchdog(conn, state, limits.idle_timeout, stop));
    }
    drop(listener);
    let _ = stopping.send(());
    tokio::time::timeout(limits.drain_timeout, graceful.shutdown())
        .await
        .is_ok()
}

/// Drives one connection, and drops it (closing the socket) if a whole `idle` period
/// passes without a byte read or written, or if the server stops while the connection
/// is part-way through a request head. Errors (a client gone mid-request, a bad head
/// already answered with 4xx) end the connection and are not reported.
async fn watchdog(
    conn: impl Future,
    state: Arc<ConnState>,
    idle: Duration,
    mut stopping: watch::Receiver<()>,
) {
    tokio::pin!(conn);
    let mut seen = state.progress.load(Relaxed);
    let mut stopped = false;
    loop {
        tokio::select! {
            _ = conn.as_mut() => return,
            () = tokio::time::sleep(idle) => {
                let now = state.progress.load(Relaxed);
                if now == seen {
                    return;
                }
                seen = now;
            }
            // A sent value or a dropped sender: either way the server is stopping.
            _ = stopping.changed(), if !stopped => {
                stopped = true;
                // hyper's graceful shutdown closes a connection between requests, but
                // waits for a head under way; one that has not reached the handler is
                // closed here, as a keep-alive connection closed just as a request
                // arrives would be (which every HTTP/1.1 client must handle).
                if state.mid_head() {
                    return;
                }
            }
        }
    }
}

/// What a connection's watchdog knows of it. Only the connection's own task touches it
/// (hyper polls the stream and calls the service inside the task the watchdog drives),
/// so relaxed atomics suffice; they are atomics because the service must be `Sync`.
#[derive(Default)]
struct ConnState {
    /// Reads and writes that moved bytes.
    progress: AtomicU64,
    /// Requests handed to the handler whose response has not been dropped by hyper.
    in_flight: AtomicU32,
    /// Bytes were read while no request was in flight: a head has begun.
    head_begun: AtomicBool,
    /// Bytes were written and hyper has not flushed since.
    unflushed: AtomicBool,
}

impl ConnState {
    /// Part-way through a head: bytes read since the last request ended, none handed to
    /// the handler yet, and nothing of an earlier answer left to flush.
    fn mid_head(&self) -> bool {
        self.in_flight.load(Relaxed) == 0
            && self.head_begun.load(Relaxed)
            && !self.unflushed.load(Relaxed)
    }
}

/// One request in flight on a connection, until dropped.
struct InFlight(Arc<ConnState>);

impl InFlight {
    fn enter(state: &Arc<ConnState>) -> InFlight {
        state.in_flight.fetch_add(1, Relaxed);
        state.head_begun.store(false, Relaxed);
        InFlight(Arc::clone(state))
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.in_flight.fetch_sub(1, Relaxed);
    }
}

/// A response body that keeps its request counted as in flight until hyper drops it.
struct Tracked {
    body: RespBody,
    _in_flight: InFlight,
}

impl Body for Tracked {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        // `RespBody` is `Unpin` (`Full` and `Incoming` are), and so is `Tracked`.
        Pin::new(&mut self.body).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.body.size_hint()
    }
}

/// A TCP stream that tells its connection's [`ConnState`] what moved.
struct Watched {
    stream: TcpStream,
    state: Arc<ConnState>,
}

impl Watched {
    fn moved<T>(
        &self,
        result: Poll<io::Result<T>>,
        bytes: impl Fn(&T) -> usize,
    ) -> Poll<io::Result<T>> {
        if let Poll::Ready(Ok(value)) = &result {
            if bytes(value) > 0 {
                self.state.progress.fetch_add(1, Relaxed);
            }
        }
        result
    }

    fn wrote(&self, result: Poll<io::Result<usize>>) -> Poll<io::Result<usize>> {
        if matches!(result, Poll::Ready(Ok(n)) if n > 0) {
            self.state.unflushed.store(true, Relaxed);
        }
        self.moved(result, |n| *n)
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
        if read > 0 && self.state.in_flight.load(Relaxed) == 0 {
            self.state.head_begun.store(true, Relaxed);
        }
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
        self.wrote(result)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let result = Pin::new(&mut self.stream).poll_write_vectored(cx, bufs);
        self.wrote(result)
    }

    fn is_write_vectored(&self) -> bool {
        self.stream.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        // hyper flushes once it has written all it holds: nothing of an answer is left.
        let result = Pin::new(&mut self.stream).poll_flush(cx);
        if matches!(result, Poll::Ready(Ok(()))) {
            self.state.unflushed.store(false, Relaxed);
        }
        result
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_shutdown(cx)
    }
}
