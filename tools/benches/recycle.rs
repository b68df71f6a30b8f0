//! Reuse of constructed state: a request-header object holding 20 `(String, String)`
//! fields, filled and released per request.
//!
//! - recycle: `RecyclingAllocator<Headers>`: the strings keep their capacity;
//! - drop-and-allocate: `ClassAllocator<Headers>`: the object's memory is cached, but its
//!   `Vec` and strings are allocated and freed every request;
//! - box-mimalloc: `Box<Headers>` with mimalloc as the global allocator (installed in
//!   this bench binary, so every string of every contender comes from mimalloc).
//!
//! Interleaved samples (the harness's runner); reports the minimum time per request.
//! `cargo bench -p proxalloc-tools --bench recycle -- [rounds] [--csv PATH]`
//! (default 200 rounds)

use std::hint::black_box;

use proxalloc_tools::runner::{time_per, Args, Runner, Stat};

use proxalloc::{ClassAllocator, Recycle, RecyclingAllocator};

#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

const FIELDS: usize = 20;
const NAMES: [&str; FIELDS] = [
    "host",
    "user-agent",
    "accept",
    "accept-language",
    "accept-encoding",
    "connection",
    "cookie",
    "referer",
    "cache-control",
    "pragma",
    "if-none-match",
    "if-modified-since",
    "x-forwarded-for",
    "x-request-id",
    "x-real-ip",
    "origin",
    "sec-fetch-mode",
    "sec-fetch-site",
    "upgrade-insecure-requests",
    "te",
];
const VALUE: &str = "a typical header value, about forty bytes";

#[derive(Default)]
struct Headers {
    fields: Vec<(String, String)>,
}

impl Recycle for Headers {
    fn create() -> Self {
        Headers::default()
    }
    fn recycle(&mut self) -> bool {
        self.fields.clear();
        self.fields.capacity() <= 64
    }
}

/// Parses one request's headers into `h`, reusing its strings where it has them.
#[inline(always)]
fn fill(h: &mut Headers, salt: usize) {
    for (i, name) in NAMES.iter().enumerate() {
        let value = &VALUE[..VALUE.len() - (i + salt) % 8];
        if h.fields.len() > i {
            let (n, v) = &mut h.fields[i];
            n.push_str(name);
            v.push_str(value);
        } else {
            h.fields.push((name.to_string(), value.to_string()));
        }
    }
}

/// Recycled fields keep their strings: truncate instead of dropping them.
struct RecycledHeaders(Headers);

impl Recycle for RecycledHeaders {
    fn create() -> Self {
        RecycledHeaders(Headers::default())
    }
    fn recycle(&mut self) -> bool {
        for (n, v) in &mut self.0.fields {
            n.clear();
            v.clear();
        }
        self.0.fields.capacity() <= 64
    }
}

static RECYCLING: RecyclingAllocator<RecycledHeaders> = RecyclingAllocator::new("headers-recycled");
static PLAIN: ClassAllocator<Headers> = ClassAllocator::new("headers-plain");

const REQUESTS: usize = 2_000;

fn recycle() {
    for r in 0..REQUESTS {
        let mut h = RECYCLING.get();
        fill(&mut h.0, r);
        black_box(&h.0.fields[FIELDS - 1]);
    }
}

fn drop_and_allocate() {
    for r in 0..REQUESTS {
        let mut h = PLAIN.alloc(Headers {
            fields: Vec::with_capacity(FIELDS),
        });
        fill(&mut h, r);
        black_box(&h.fields[FIELDS - 1]);
    }
}

fn box_mimalloc() {
    for r in 0..REQUESTS {
        let mut h = Box::new(Headers {
            fields: Vec::with_capacity(FIELDS),
        });
        fill(&mut h, r);
        black_box(&h.fields[FIELDS - 1]);
    }
}

fn main() {
    let args = Args::parse(200);
    let mut run = Runner::new("recycle");
    let t = run.table(
        "request headers, 20 (String, String) fields",
        "ns/request",
        Stat::Min,
        "recycle",
    );
    let contenders: [(&str, fn()); 3] = [
        ("recycle", recycle),
        ("drop-and-allocate", drop_and_allocate),
        ("box-mimalloc", box_mimalloc),
    ];
    for (name, f) in contenders {
        run.cell(t, name, false, move || Some(time_per(REQUESTS as f64, f)));
    }
    run.run(args.rounds);
    run.report(&args);
}
