//! The caching reverse proxy, allocating the way Traffic Server does.
//!
//! Each request gets a transaction ([`Txn`]) and one [`Field`] object per request header,
//! from `ClassAllocator`s: they live until the answer is ready, across the wait for the
//! origin, so the task often resumes, and frees them, on another worker thread than the
//! one that allocated them (Traffic Server's `HttpSM` and its header heap, from its
//! ProxyAllocators). Each answer the proxy makes itself (an error) is assembled in the
//! transaction's [`Pool`] with its writer, and the pool goes out as `Bytes`
//! ([`Pool::into_bytes`]): hyper writes them from where they were built and the pool's
//! blocks return when hyper drops them. A cacheable origin body is read into a pooled
//! I/O buffer ([`BufferAllocator`], Traffic Server's `ioBufAllocator`) and frozen into
//! `Bytes`: the cache entry holds them, and a hit answers with a clone, so no hit copies
//! the body. Cache entries and their header fields come from class allocators, and the
//! whole cache is held under a byte budget.
//!
//! A request goes:
//!
//! 1. [`Proxy::handle`]: a `Txn`; the request's end-to-end headers into `Field`s
//!    (hop-by-hop ones removed: `Connection` and the headers it lists, `Keep-Alive`,
//!    `TE`, `Transfer-Encoding`, `Upgrade`, ...).
//! 2. A `GET` without `Authorization` or `no-cache` looks in the [`Cache`]; a fresh entry
//!    is answered with its head rebuilt and a clone of its frozen body (`X-Cache: HIT`,
//!    `Age`).
//! 3. Otherwise the request goes to the origin through hyper's pooled client, with the
//!    fields, `Via` and `X-Forwarded-For`; its body streams through with the framing it
//!    came with (`Content-Length` stays, chunked stays chunked).
//! 4. The origin's answer loses its hop-by-hop headers and gains `Via`. A cacheable one
//!    (`200`, `max-age`, a `Content-Length` within [`MAX_ENTRY_BYTES`]) is read whole
//!    into a pooled buffer, frozen, stored and answered (`X-Cache: MISS`); anything else
//!    streams through (`MISS` or `PASS`).

use std::collections::{HashMap, VecDeque};
use std::fmt::Write as _;
use std::io;
use std::mem::size_of;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use bytes::{BufMut, Bytes};
use http_body_util::combinators::UnsyncBoxBody;
use http_body_util::{BodyExt, Either, Full};
use hyper::body::Body;
use hyper::header::{self, HeaderMap, HeaderName, HeaderValue};
use hyper::http::uri::{Authority, PathAndQuery, Scheme};
use hyper::http::{request, response};
use hyper::{Method, Request, Response, StatusCode, Uri};
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use proxalloc::{
    pformat, BlockSource, BufferAllocator, CacheMode, ClassAllocator, ClassBox, Config, Pool,
    DEFAULT_MAX_FREE,
};
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

use crate::origin;
use crate::server::{self, BoxError, Limits, RespBody};

/// How the proxy's objects are allocated: the three contenders.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    /// proxalloc's per-thread caches.
    Caches,
    /// proxalloc's per-CPU caches (Linux rseq; per-thread caches where it is missing).
    PerCpu,
    /// Every allocation and free through the shared depot: Traffic Server's global
    /// freelist, before its ProxyAllocators.
    Depot,
    /// Every object from the global allocator (`CacheMode::Bypass`; with
    /// `PROXALLOC_BYPASS=1`, pool blocks too): glibc's malloc, mimalloc or jemalloc.
    System,
}

impl Mode {
    pub const ALL: [Mode; 4] = [Mode::Caches, Mode::PerCpu, Mode::Depot, Mode::System];

    /// The command-line name.
    pub fn flag(self) -> &'static str {
        match self {
            Mode::Caches => "caches",
            Mode::PerCpu => "percpu",
            Mode::Depot => "depot",
            Mode::System => "system",
        }
    }

    pub fn parse(flag: &str) -> Option<Mode> {
        Mode::ALL.into_iter().find(|m| m.flag() == flag)
    }

    /// proxalloc's default mode in this build (`CacheMode::default()`): CPU caches with
    /// the `percpu` feature (on by default) on Linux x86-64, thread caches otherwise.
    pub fn crate_default() -> Mode {
        match CacheMode::default() {
            CacheMode::PerCpu => Mode::PerCpu,
            _ => Mode::Caches,
        }
    }

    pub fn label(self) -> &'static str {
        let default = self == Mode::crate_default();
        match self {
            Mode::Caches if default => "thread caches (default)",
            Mode::Caches => "thread caches",
            Mode::PerCpu if default => "CPU caches (default)",
            Mode::PerCpu => "CPU caches",
            Mode::Depot => "depot only (global freelist)",
            Mode::System => "global allocator",
        }
    }

    fn cache_mode(self) -> CacheMode {
        match self {
            Mode::Caches => CacheMode::ThreadCaches,
            Mode::PerCpu => CacheMode::PerCpu,
            Mode::Depot => CacheMode::DepotOnly,
            Mode::System => CacheMode::Bypass,
        }
    }
}

/// One request's state. It lives from the request's arrival to its answer.
pub struct Txn {
    client: IpAddr,
    path: PathAndQuery,
    /// Hash of the path: the cache key.
    key: u64,
    /// Whether the cache may answer this request and store its answer.
    cacheable: bool,
    /// The request headers that travel on, one object each.
    fields: Vec<ClassBox<'static, Field>>,
    /// Memory for what the transaction writes: the `X-Forwarded-For` value, the answers
    /// it assembles. No block is taken until something is written.
    pool: Pool<'static>,
    outcome: Outcome,
}

impl Txn {
    /// Hands the pool over (to go out with a response body), leaving an empty one.
    fn take_pool(&mut self) -> Pool<'static> {
        let empty = Pool::with_source(self.pool.source());
        std::mem::replace(&mut self.pool, empty)
    }
}

/// How a transaction was answered (the `X-Cache` header).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// From the cache.
    Hit,
    /// Looked up, not found (or stale): forwarded.
    Miss,
    /// Not for the cache (not a `GET`, or the client said `no-cache`): forwarded.
    Pass,
    /// The proxy answered with an error of its own.
    Error,
}

/// One header field: a request header the proxy forwards, or one of a cached response's.
pub struct Field {
    pub name: HeaderName,
    pub value: HeaderValue,
}

/// Largest body the cache stores.
pub const MAX_ENTRY_BYTES: usize = 64 << 10;

/// A cached response.
pub struct Entry {
    path: PathAndQuery,
    status: StatusCode,
    fields: Vec<ClassBox<'static, Field>>,
    /// The body, frozen in a pooled buffer: a hit clones it.
    body: Bytes,
    /// The pooled buffer's capacity (its class), which the budget counts.
    body_capacity: usize,
    stored: Instant,
    max_age: Duration,
}

impl Entry {
    /// What the entry counts against the cache's budget.
    fn bytes(&self) -> usize {
        size_of::<Entry>() + self.fields.len() * size_of::<Field>() + self.body_capacity
    }

    /// The response head for a hit, `age` after the entry was stored.
    fn response_head(&self, age: Duration) -> Response<()> {
        let mut response = Response::new(());
        *response.status_mut() = self.status;
        let headers = response.headers_mut();
        headers.reserve(self.fields.len() + 3);
        for field in &self.fields {
            headers.append(field.name.clone(), field.value.clone());
        }
        headers.insert(header::AGE, HeaderValue::from(age.as_secs()));
        response
    }
}

/// The allocators of one proxy. A server would make them `static`s; the showdown leaks
/// one set per proxy instead, so that each can have its mode and its own counts (the
/// tests run several proxies at once).
pub struct Allocators {
    pub txns: ClassAllocator<Txn>,
    pub fields: ClassAllocator<Field>,
    pub entries: ClassAllocator<Entry>,
    /// Cached bodies (and the reads of cacheable origin bodies).
    pub buffers: BufferAllocator,
    /// The pools' blocks. A `BlockSource` has no mode of its own: its classes follow
    /// `PROXALLOC_BYPASS`, which the showdown sets for system mode.
    pub blocks: BlockSource,
}

impl Allocators {
    pub fn leak(mode: Mode) -> &'static Allocators {
        let config = Config::new().mode(mode.cache_mode());
        Box::leak(Box::new(Allocators {
            txns: ClassAllocator::with_config("proxy-txn", config),
            fields: ClassAllocator::with_config("proxy-field", config),
            entries: ClassAllocator::with_config("cache-entry", config),
            buffers: BufferAllocator::with_config(config),
            blocks: BlockSource::new(DEFAULT_MAX_FREE),
        }))
    }

    /// Objects and pool blocks in use: zero once the proxy has shut down.
    pub fn live(&self) -> u64 {
        let objects = [self.txns.stats(), self.fields.stats(), self.entries.stats()];
        objects
            .iter()
            .chain(self.blocks.stats().iter())
            .map(|s| s.live)
            .sum::<u64>()
            + self.buffers.stats().live_buffers()
    }
}

/// An in-memory cache: 16 shards, each a map from key to entry, evicting first in first
/// out under its share of the byte budget.
pub struct Cache {
    shards: Vec<Mutex<Shard>>,
    shard_bytes: usize,
}

#[derive(Default)]
struct Shard {
    map: HashMap<u64, ClassBox<'static, Entry>>,
    /// Keys in the order they were stored, with when (to skip entries since replaced).
    order: VecDeque<(u64, Instant)>,
    bytes: usize,
}

impl Cache {
    const SHARDS: usize = 16;

    pub fn new(budget_bytes: usize) -> Self {
        Cache {
            shards: (0..Self::SHARDS).map(|_| Mutex::default()).collect(),
            shard_bytes: budget_bytes / Self::SHARDS,
        }
    }

    fn shard(&self, key: u64) -> MutexGuard<'_, Shard> {
        // Nothing panics while holding a shard; if something did, the shard is still
        // consistent enough to serve.
        let shard = &self.shards[key as usize % Self::SHARDS];
        shard
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Runs `read` on the fresh entry for `path`, with its age, while the shard is locked.
    fn read<R>(
        &self,
        key: u64,
        path: &PathAndQuery,
        read: impl FnOnce(&Entry, Duration) -> R,
    ) -> Option<R> {
        let shard = self.shard(key);
        let entry = shard.map.get(&key).filter(|e| e.path == *path)?;
        let age = entry.stored.elapsed();
        (age < entry.max_age).then(|| read(entry, age))
    }

    /// Stores `entry`, evicting the oldest entries of its shard to make room.
    fn store(&self, key: u64, entry: ClassBox<'static, Entry>) {
        let bytes = entry.bytes();
        if bytes > self.shard_bytes {
            return;
        }
        let mut guard = self.shard(key);
        let shard = &mut *guard;
        if let Some(old) = shard.map.remove(&key) {
            shard.bytes -= old.bytes();
        }
        while shard.bytes + bytes > self.shard_bytes {
            let Some((oldest, stored)) = shard.order.pop_front() else {
                break;
            };
            if shard.map.get(&oldest).is_some_and(|e| e.stored == stored) {
                let evicted = shard.map.remove(&oldest).expect("just found");
                shard.bytes -= evicted.bytes();
            }
        }
        shard.order.push_back((key, entry.stored));
        shard.bytes += bytes;
        shard.map.insert(key, entry);
        if shard.order.len() > 2 * shard.map.len() + 16 {
            let map = &shard.map;
            shard
                .order
                .retain(|(k, t)| map.get(k).is_some_and(|e| e.stored == *t));
        }
    }

    /// Entries and bytes held.
    pub fn usage(&self) -> (usize, usize) {
        self.shards.iter().fold((0, 0), |(n, b), s| {
            let s = s.lock().unwrap_or_else(|p| p.into_inner());
            (n + s.map.len(), b + s.bytes)
        })
    }

    /// Drops every entry (at shutdown: every object back to its allocator).
    pub fn clear(&self) {
        for shard in &self.shards {
            let mut shard = shard.lock().unwrap_or_else(|p| p.into_inner());
            shard.map.clear();
            shard.order.clear();
            shard.bytes = 0;
        }
    }
}

/// Request counts by outcome.
#[derive(Default)]
pub struct Counters {
    pub hits: AtomicU64,
    pub misses: AtomicU64,
    pub passes: AtomicU64,
    pub errors: AtomicU64,
}

/// The body of a request sent to the origin.
type UpBody = UnsyncBoxBody<Bytes, BoxError>;

/// The value of the `Via` header the proxy adds.
const VIA: &str = "1.1 showdown";
static X_CACHE: HeaderName = HeaderName::from_static("x-cache");
static X_FORWARDED_FOR: HeaderName = HeaderName::from_static("x-forwarded-for");

/// Headers that belong to one connection (RFC 9110 section 7.6.1), besides those the
/// `Connection` header lists: never forwarded, never stored. `Expect` too: the proxy has
/// answered it already.
static HOP_BY_HOP: [HeaderName; 10] = [
    header::CONNECTION,
    HeaderName::from_static("keep-alive"),
    HeaderName::from_static("proxy-connection"),
    header::PROXY_AUTHENTICATE,
    header::PROXY_AUTHORIZATION,
    header::TE,
    header::TRAILER,
    header::TRANSFER_ENCODING,
    header::UPGRADE,
    header::EXPECT,
];

/// The proxy: its allocators, its cache, and a pooled client for the origin.
pub struct Proxy {
    allocs: &'static Allocators,
    pub cache: Cache,
    client: Client<HttpConnector, UpBody>,
    origin: Authority,
    pub counters: Counters,
}

impl Proxy {
    pub fn new(allocs: &'static Allocators, origin: SocketAddr, cache_bytes: usize) -> Self {
        let mut connector = HttpConnector::new();
        connector.set_nodelay(true);
        Proxy {
            allocs,
            cache: Cache::new(cache_bytes),
            client: Client::builder(TokioExecutor::new()).build(connector),
            origin: Authority::try_from(origin.to_string()).expect("a socket address"),
            counters: Counters::default(),
        }
    }

    /// Answers one request from `client`. Generic over the body so that the showdown's
    /// in-process row can call it without sockets.
    pub async fn handle<B>(&self, request: Request<B>, client: IpAddr) -> Response<RespBody>
    where
        B: Body<Data = Bytes> + Send + 'static,
        B::Error: Into<BoxError>,
    {
        let (mut head, body) = request.into_parts();
        let mut txn = self.allocs.txns.alloc(self.read_request(&mut head, client));
        let mut response = if head.method == Method::CONNECT {
            self.generated(&mut txn, StatusCode::METHOD_NOT_ALLOWED)
        } else if !txn.path.as_str().starts_with('/') {
            self.generated(&mut txn, StatusCode::BAD_REQUEST)
        } else if let Some(hit) = self.try_hit(&mut txn) {
            hit
        } else {
            self.forward(&mut txn, head, body).await
        };
        let headers = response.headers_mut();
        headers.append(header::VIA, HeaderValue::from_static(VIA));
        let (counter, label) = match txn.outcome {
            Outcome::Hit => (&self.counters.hits, "HIT"),
            Outcome::Miss => (&self.counters.misses, "MISS"),
            Outcome::Pass => (&self.counters.passes, "PASS"),
            Outcome::Error => (&self.counters.errors, "ERROR"),
        };
        headers.insert(X_CACHE.clone(), HeaderValue::from_static(label));
        counter.fetch_add(1, Relaxed);
        response
    }

    /// The proxy's view of the request: a transaction with the end-to-end headers.
    fn read_request(&self, head: &mut request::Parts, client: IpAddr) -> Txn {
        remove_hop_by_hop(&mut head.headers);
        let path = match head.uri.path_and_query() {
            Some(p) => p.clone(),
            None => PathAndQuery::from_static("/"),
        };
        let mut cacheable = head.method == Method::GET;
        let mut fields = Vec::with_capacity(head.headers.len());
        for (name, value) in &head.headers {
            if name == header::AUTHORIZATION
                || (name == header::CACHE_CONTROL || name == header::PRAGMA)
                    && has_token(value, &["no-cache", "no-store"])
            {
                cacheable = false;
            }
            fields.push(self.allocs.fields.alloc(Field {
                name: name.clone(),
                value: value.clone(),
            }));
        }
        Txn {
            client,
            key: fnv1a(path.as_str().as_bytes()),
            path,
            cacheable,
            fields,
            pool: Pool::with_source(&self.allocs.blocks),
            outcome: Outcome::Pass,
        }
    }

    /// A fresh entry, answered with a clone of its frozen body (a reference count, no
    /// copy: the entry may be evicted the moment after, and the buffer lives on until
    /// hyper has sent it).
    fn try_hit(&self, txn: &mut Txn) -> Option<Response<RespBody>> {
        if !txn.cacheable {
            return None;
        }
        let (head, body) = self.cache.read(txn.key, &txn.path, |entry, age| {
            (entry.response_head(age), entry.body.clone())
        })?;
        txn.outcome = Outcome::Hit;
        Some(head.map(|()| Either::Left(Full::new(body))))
    }

    /// Forwards the request to the origin, and answers with what it says.
    async fn forward<B>(&self, txn: &mut Txn, head: request::Parts, body: B) -> Response<RespBody>
    where
        B: Body<Data = Bytes> + Send + 'static,
        B::Error: Into<BoxError>,
    {
        txn.outcome = if txn.cacheable {
            Outcome::Miss
        } else {
            Outcome::Pass
        };
        let Some(request) = self.upstream_request(txn, head, body) else {
            return self.generated(txn, StatusCode::BAD_REQUEST);
        };
        let response = match self.client.request(request).await {
            Ok(response) => response,
            Err(e) if client_body_failed(&e) => {
                return self.generated(txn, StatusCode::BAD_REQUEST)
            }
            Err(_) => return self.generated(txn, StatusCode::BAD_GATEWAY),
        };
        let (mut head, body) = response.into_parts();
        remove_hop_by_hop(&mut head.headers);
        let max_age = if txn.cacheable {
            freshness(&head)
        } else {
            None
        };
        let Some(max_age) = max_age else {
            return Response::from_parts(head, Either::Right(body));
        };
        // Cacheable, and at most MAX_ENTRY_BYTES: read it whole into a pooled buffer of
        // its length's class, freeze it, store it and answer with it.
        let Some((body, capacity)) = self.read_body(&head, body).await else {
            return self.generated(txn, StatusCode::BAD_GATEWAY);
        };
        self.store(txn, &head, &body, capacity, max_age);
        Response::from_parts(head, Either::Left(Full::new(body)))
    }

    /// Reads a cacheable body (its `Content-Length` checked by `freshness`) into a pooled
    /// buffer of that class, frame by frame, and freezes it. (hyper reads the socket into
    /// its own buffer: this is the one copy, made once per miss; hits copy nothing.)
    /// Returns the bytes and the buffer's capacity.
    async fn read_body(
        &self,
        head: &response::Parts,
        mut body: hyper::body::Incoming,
    ) -> Option<(Bytes, usize)> {
        let length = head
            .headers
            .get(header::CONTENT_LENGTH)
            .and_then(|v| v.to_str().ok()?.parse::<usize>().ok())
            .unwrap_or(0);
        let mut buf = self.allocs.buffers.alloc(length.max(1));
        while let Some(frame) = body.frame().await {
            if let Ok(data) = frame.ok()?.into_data() {
                buf.put_slice(&data);
            }
        }
        let capacity = buf.capacity();
        Some((buf.freeze(), capacity))
    }

    /// The request for the origin: the transaction's fields, `Via`, `X-Forwarded-For`.
    fn upstream_request<B>(
        &self,
        txn: &Txn,
        head: request::Parts,
        body: B,
    ) -> Option<Request<UpBody>>
    where
        B: Body<Data = Bytes> + Send + 'static,
        B::Error: Into<BoxError>,
    {
        let mut uri = hyper::http::uri::Parts::default();
        uri.scheme = Some(Scheme::HTTP);
        uri.authority = Some(self.origin.clone());
        uri.path_and_query = Some(txn.path.clone());
        let mut request = Request::new(body.map_err(Into::into).boxed_unsync());
        *request.method_mut() = head.method;
        *request.uri_mut() = Uri::from_parts(uri).ok()?;
        let headers = request.headers_mut();
        headers.reserve(txn.fields.len() + 2);
        for field in &txn.fields {
            headers.append(field.name.clone(), field.value.clone());
        }
        headers.append(header::VIA, HeaderValue::from_static(VIA));
        let prior = headers.get(&X_FORWARDED_FOR).and_then(|v| v.to_str().ok());
        let forwarded_for = match prior {
            Some(prior) => pformat!(txn.pool, "{prior}, {}", txn.client),
            None => pformat!(txn.pool, "{}", txn.client),
        };
        let forwarded_for = HeaderValue::from_str(forwarded_for).ok()?;
        headers.insert(X_FORWARDED_FOR.clone(), forwarded_for);
        Some(request)
    }

    /// Stores a cacheable response: its fields copied into objects, its frozen body
    /// shared with the answer.
    fn store(
        &self,
        txn: &Txn,
        head: &response::Parts,
        body: &Bytes,
        body_capacity: usize,
        max_age: Duration,
    ) {
        let a = self.allocs;
        let fields = head
            .headers
            .iter()
            .map(|(name, value)| {
                a.fields.alloc(Field {
                    name: name.clone(),
                    value: value.clone(),
                })
            })
            .collect();
        let entry = a.entries.alloc(Entry {
            path: txn.path.clone(),
            status: head.status,
            fields,
            body: body.clone(),
            body_capacity,
            stored: Instant::now(),
            max_age,
        });
        self.cache.store(txn.key, entry);
    }

    /// An answer the proxy makes itself, assembled in the transaction's pool.
    fn generated(&self, txn: &mut Txn, status: StatusCode) -> Response<RespBody> {
        txn.outcome = Outcome::Error;
        let body = txn.take_pool().into_bytes(|pool| {
            let mut text = pool.writer();
            let reason = status.canonical_reason().unwrap_or("");
            let _ = writeln!(text, "{} {reason}", status.as_u16());
            text.finish()
        });
        let mut response = Response::new(Either::Left(Full::new(body)));
        *response.status_mut() = status;
        response
            .headers_mut()
            .insert(header::CONTENT_TYPE, HeaderValue::from_static("text/plain"));
        response
    }
}

/// Removes the hop-by-hop headers, and those that `Connection` names.
fn remove_hop_by_hop(headers: &mut HeaderMap) {
    let listed: Vec<HeaderName> = headers
        .get_all(header::CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .filter_map(|name| HeaderName::from_bytes(name.trim().as_bytes()).ok())
        .collect();
    for name in listed.iter().chain(&HOP_BY_HOP) {
        headers.remove(name);
    }
}

/// Whether a comma-separated header value has one of `tokens`.
fn has_token(value: &HeaderValue, tokens: &[&str]) -> bool {
    let value = value.to_str().unwrap_or("");
    value.split(',').any(|t| {
        tokens
            .iter()
            .any(|want| t.trim().eq_ignore_ascii_case(want))
    })
}

/// How long a response may be served from the cache, if at all: a `200` with `max-age`,
/// no `no-store`, `no-cache` or `private`, no `Set-Cookie` or `Vary`, and a
/// `Content-Length` of at most [`MAX_ENTRY_BYTES`].
fn freshness(head: &response::Parts) -> Option<Duration> {
    let headers = &head.headers;
    if head.status != StatusCode::OK
        || headers.contains_key(header::SET_COOKIE)
        || headers.contains_key(header::VARY)
    {
        return None;
    }
    let length: usize = headers
        .get(header::CONTENT_LENGTH)?
        .to_str()
        .ok()?
        .parse()
        .ok()?;
    if length > MAX_ENTRY_BYTES {
        return None;
    }
    let mut max_age = None;
    for value in headers.get_all(header::CACHE_CONTROL) {
        for directive in value.to_str().ok()?.split(',') {
            let (name, arg) = directive
                .trim()
                .split_once('=')
                .unwrap_or((directive.trim(), ""));
            if ["no-store", "no-cache", "private"]
                .iter()
                .any(|d| name.eq_ignore_ascii_case(d))
            {
                return None;
            }
            if name.eq_ignore_ascii_case("max-age") {
                max_age = arg.parse::<u64>().ok();
            }
        }
    }
    max_age.filter(|&s| s > 0).map(Duration::from_secs)
}

/// Whether forwarding failed because the client's own body was bad (a broken chunked
/// encoding, a body shorter than its `Content-Length`): then the answer is `400`, not
/// `502`.
fn client_body_failed(e: &hyper_util::client::legacy::Error) -> bool {
    let mut source = std::error::Error::source(e);
    while let Some(err) = source {
        if let Some(h) = err.downcast_ref::<hyper::Error>() {
            if h.is_user() || h.is_parse() || h.is_incomplete_message() {
                return true;
            }
        }
        source = err.source();
    }
    false
}

/// FNV-1a, for cache keys.
fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, &b| {
        (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3)
    })
}

/// A proxy and its origin, serving on loopback.
pub struct Running {
    /// Where the proxy listens.
    pub addr: SocketAddr,
    /// Where the origin listens.
    pub origin: SocketAddr,
    pub proxy: Arc<Proxy>,
    stop: oneshot::Sender<()>,
    done: JoinHandle<bool>,
}

/// Starts the origin on a free port and the proxy on `port` (0: a free one), both on
/// 127.0.0.1, in the current tokio runtime.
pub async fn start(
    allocs: &'static Allocators,
    port: u16,
    limits: Limits,
    cache_bytes: usize,
) -> io::Result<Running> {
    let origin_listener = server::listen(SocketAddr::from((Ipv4Addr::LOCALHOST, 0)))?;
    let listener = server::listen(SocketAddr::from((Ipv4Addr::LOCALHOST, port)))?;
    let (addr, origin_addr) = (listener.local_addr()?, origin_listener.local_addr()?);
    let proxy = Arc::new(Proxy::new(allocs, origin_addr, cache_bytes));
    let (stop, stopped) = oneshot::channel::<()>();
    let (stop_origin, origin_stopped) = oneshot::channel::<()>();
    let origin = tokio::spawn(server::serve(
        origin_listener,
        limits,
        async {
            let _ = origin_stopped.await;
        },
        |request, _| origin::handle(request),
    ));
    let handler_proxy = Arc::clone(&proxy);
    let done = tokio::spawn(async move {
        let handler = move |request, peer: SocketAddr| {
            let proxy = Arc::clone(&handler_proxy);
            async move { proxy.handle(request, peer.ip()).await }
        };
        let stopped = async {
            let _ = stopped.await;
        };
        let drained = server::serve(listener, limits, stopped, handler).await;
        // The origin stops after the proxy: the proxy's last requests may still need it.
        let _ = stop_origin.send(());
        let origin_drained = origin.await.unwrap_or(false);
        drained && origin_drained
    });
    Ok(Running {
        addr,
        origin: origin_addr,
        proxy,
        stop,
        done,
    })
}

impl Running {
    /// Stops accepting, lets the requests in flight finish, stops the origin, and empties
    /// the cache, so that every object is back with its allocator. Returns whether every
    /// connection finished within the drain timeout.
    pub async fn shutdown(self) -> bool {
        let _ = self.stop.send(());
        let drained = self.done.await.unwrap_or(false);
        self.proxy.cache.clear();
        drained
    }
}
