//! The showdown server under bad input: malformed requests, oversized heads, clients that
//! disconnect mid-request. It answers with a clear 4xx or closes the connection, keeps
//! serving, and loses no objects.

#[path = "../examples/showdown/server.rs"]
#[allow(dead_code)]
mod server;

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use server::{Allocators, Counters, Mode};

/// Sends `bytes` on a fresh connection and returns everything the server sends back
/// before it closes (or goes quiet).
fn exchange(addr: SocketAddr, bytes: &[u8]) -> String {
    let mut c = TcpStream::connect(addr).unwrap();
    c.set_read_timeout(Some(Duration::from_secs(2))).unwrap();
    c.write_all(bytes).unwrap();
    let mut out = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        match c.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => out.extend_from_slice(&buf[..n]),
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

fn with_server(mode: Mode, f: impl FnOnce(SocketAddr)) -> (u64, u64) {
    let allocs = Allocators::new(mode);
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let stop = AtomicBool::new(false);
    let counters = Counters::default();
    std::thread::scope(|s| {
        s.spawn(|| server::serve(listener, 2, &allocs, &stop, &counters));
        f(addr);
        stop.store(true, Ordering::Relaxed);
    });
    let live = allocs.requests.stats().live + allocs.headers.stats().live;
    assert_eq!(
        live,
        0,
        "objects leaked: {} / {}",
        allocs.requests.stats(),
        allocs.headers.stats()
    );
    (
        counters.served.load(Ordering::Relaxed),
        counters.rejected.load(Ordering::Relaxed),
    )
}

const GOOD: &[u8] = b"GET /a HTTP/1.1\r\nHost: x\r\nX-One: 1\r\n\r\n";

#[test]
fn keep_alive_serves_several_requests_on_one_connection() {
    let (served, rejected) = with_server(Mode::Caches, |addr| {
        let mut two = GOOD.to_vec();
        two.extend_from_slice(b"GET /b HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
        let out = exchange(addr, &two);
        assert_eq!(out.matches("HTTP/1.1 200 OK").count(), 2, "{out}");
        assert!(out.contains("Host: x"), "{out}");
        let out = exchange(addr, b"GET / HTTP/1.0\r\n\r\n");
        assert!(
            out.starts_with("HTTP/1.1 200 OK") && out.contains("Connection: close"),
            "{out}"
        );
    });
    assert_eq!((served, rejected), (3, 0));
}

#[test]
fn malformed_requests_get_400_and_the_server_keeps_serving() {
    let (served, rejected) = with_server(Mode::Caches, |addr| {
        for bad in [
            &b"NOT A REQUEST\r\n\r\n"[..],
            b"GET noslash HTTP/1.1\r\n\r\n",
            b"GET / HTTP/9.9\r\n\r\n",
            b"get / HTTP/1.1\r\n\r\n",
            b"GET / HTTP/1.1\r\nNo-Colon-Here\r\n\r\n",
            b"GET / HTTP/1.1\r\nBad Name: x\r\n\r\n",
            b"GET / HTTP/1.1\r\nContent-Length: nope\r\n\r\n",
            b"POST / HTTP/1.1\r\nContent-Length: 5\r\n\r\nhello",
            b"GET / HTTP/1.1\r\n\xff\xfe: x\r\n\r\n",
        ] {
            let out = exchange(addr, bad);
            assert!(
                out.starts_with("HTTP/1.1 400 Bad Request"),
                "{:?} -> {out}",
                String::from_utf8_lossy(bad)
            );
        }
        assert!(exchange(addr, GOOD).starts_with("HTTP/1.1 200"));
    });
    assert_eq!((served, rejected), (1, 9));
}

#[test]
fn oversized_heads_and_too_many_headers_get_431() {
    let (_, rejected) = with_server(Mode::Caches, |addr| {
        let mut huge = b"GET / HTTP/1.1\r\nX-Big: ".to_vec();
        huge.extend(std::iter::repeat_n(b'a', server::MAX_HEAD));
        huge.extend_from_slice(b"\r\n\r\n");
        let out = exchange(addr, &huge);
        assert!(out.starts_with("HTTP/1.1 431"), "{out}");
        let mut many = b"GET / HTTP/1.1\r\n".to_vec();
        for i in 0..=server::MAX_HEADERS {
            many.extend_from_slice(format!("X-{i}: v\r\n").as_bytes());
        }
        many.extend_from_slice(b"\r\n");
        let out = exchange(addr, &many);
        assert!(out.starts_with("HTTP/1.1 431"), "{out}");
        assert!(exchange(addr, GOOD).starts_with("HTTP/1.1 200"));
    });
    assert_eq!(rejected, 2);
}

#[test]
fn clients_that_disconnect_mid_request_lose_nothing() {
    for mode in Mode::ALL {
        let (served, _) = with_server(mode, |addr| {
            for cut in [1, 10, GOOD.len() - 2] {
                let mut c = TcpStream::connect(addr).unwrap();
                c.write_all(&GOOD[..cut]).unwrap();
                drop(c); // gone mid-request
            }
            // A client that sends a request and leaves without reading the answer.
            let mut c = TcpStream::connect(addr).unwrap();
            c.write_all(GOOD).unwrap();
            drop(c);
            std::thread::sleep(Duration::from_millis(50));
            assert!(exchange(addr, GOOD).starts_with("HTTP/1.1 200"), "{mode:?}");
        });
        assert!(served >= 1);
    }
}
