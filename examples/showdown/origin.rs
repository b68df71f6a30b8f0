//! The origin server behind the proxy: a few kinds of resource, so that every path of the
//! proxy has something to do.
//!
//! | path | answer |
//! | --- | --- |
//! | `GET /objects/N` | 0.5 to 4 KiB of text, `Cache-Control: public, max-age=300`: cached |
//! | `GET /live/N` | a short text, `Cache-Control: no-store`: forwarded every time |
//! | `GET /slow/MS` | a short text after MS milliseconds, `no-store` (for shutdown tests) |
//! | `GET /headers` | the request headers as the origin got them, `no-store` |
//! | `POST /echo` | the request body streamed back, with `X-Origin-Framing` saying how it arrived |
//! | anything else | `404` |
//!
//! `HEAD` is answered like `GET` (hyper leaves the body out).
//!
//! The origin is plain hyper; only the proxy in front of it allocates from proxalloc.

use std::time::Duration;

use bytes::Bytes;
use http_body_util::{Either, Full};
use hyper::body::{Body, Incoming};
use hyper::header::{HeaderValue, CACHE_CONTROL, CONTENT_TYPE};
use hyper::{Method, Request, Response, StatusCode};

use crate::server::RespBody;

/// Answers one request.
pub async fn handle(req: Request<Incoming>) -> Response<RespBody> {
    let path = req.uri().path();
    let number = |prefix: &str| {
        path.strip_prefix(prefix)
            .and_then(|n| n.parse::<u64>().ok())
    };
    if req.method() == Method::GET || req.method() == Method::HEAD {
        if let Some(n) = number("/objects/") {
            return text(object_body(n), "public, max-age=300");
        }
        if let Some(n) = number("/live/") {
            return text(format!("live object {n}\n").into(), "no-store");
        }
        if let Some(ms) = number("/slow/") {
            tokio::time::sleep(Duration::from_millis(ms.min(10_000))).await;
            return text(format!("slow answer after {ms} ms\n").into(), "no-store");
        }
        if path == "/headers" {
            let mut seen = String::new();
            for (name, value) in req.headers() {
                seen.push_str(&format!("{name}: {}\n", value.to_str().unwrap_or("?")));
            }
            return text(seen.into(), "no-store");
        }
    }
    if req.method() == Method::POST && path == "/echo" {
        let framing = match req.body().size_hint().exact() {
            Some(n) => format!("length {n}"),
            None => "chunked".to_string(),
        };
        let mut response = Response::new(Either::Right(req.into_body()));
        let headers = response.headers_mut();
        headers.insert("x-origin-framing", HeaderValue::from_str(&framing).unwrap());
        headers.insert(CACHE_CONTROL, HeaderValue::from_static("no-store"));
        return response;
    }
    let mut response = text(Bytes::from_static(b"not found\n"), "no-store");
    *response.status_mut() = StatusCode::NOT_FOUND;
    response
}

/// The body of `/objects/n`: 512 bytes to 4 KiB, a line per 64 bytes.
pub fn object_body(n: u64) -> Bytes {
    let lines = 8 * (1 + n % 8);
    let mut body = String::with_capacity(lines as usize * 64);
    for line in 0..lines {
        let text = format!("object {n} line {line}");
        body.push_str(&format!("{text:-<63}\n"));
    }
    body.into()
}

fn text(body: Bytes, cache_control: &'static str) -> Response<RespBody> {
    let mut response = Response::new(Either::Left(Full::new(body)));
    let headers = response.headers_mut();
    headers.insert(CONTENT_TYPE, HeaderValue::from_static("text/plain"));
    headers.insert(CACHE_CONTROL, HeaderValue::from_static(cache_control));
    response
}
