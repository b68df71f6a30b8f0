//! How a server prints its allocators on demand: an admin thread answers "dump" requests
//! (here from a channel; in a server, an admin endpoint or a signal-handling thread)
//! with the table from `proxalloc::stats::dump`, and "delta" with the change since a
//! baseline, like Traffic Server's `ink_freelists_dump` and its baseline dumps.
//!
//! `cargo run --release --example stats_dump`

use std::sync::mpsc;
use std::time::Duration;

use proxalloc::{stats, ClassAllocator};

#[allow(dead_code)]
struct Session([u64; 32]);
#[allow(dead_code)]
struct Header([u8; 96]);

static SESSIONS: ClassAllocator<Session> = ClassAllocator::new("session");
static HEADERS: ClassAllocator<Header> = ClassAllocator::new("header");

enum Admin {
    Dump,
    Delta(stats::Snapshot),
}

fn main() {
    let (admin_tx, admin_rx) = mpsc::channel::<Admin>();
    let admin = std::thread::spawn(move || {
        for req in admin_rx {
            let stdout = std::io::stdout();
            let mut out = stdout.lock();
            match req {
                Admin::Dump => stats::dump(&mut out).unwrap(),
                Admin::Delta(base) => stats::dump_since(&base, &mut out).unwrap(),
            }
            println!();
        }
    });

    let baseline = stats::snapshot();
    std::thread::scope(|s| {
        for w in 0..2 {
            s.spawn(move || {
                let mut open = Vec::new();
                for i in 0..200_000u64 {
                    let session = SESSIONS.alloc(Session([i; 32]));
                    let headers: Vec<_> = (0..8).map(|_| HEADERS.alloc(Header([w; 96]))).collect();
                    if i % 1000 == 0 {
                        open.push(session); // a few long-lived sessions stay open
                    }
                    drop(headers);
                }
                std::thread::sleep(Duration::from_millis(50));
                drop(open);
            });
        }
        std::thread::sleep(Duration::from_millis(20));
        println!("-- dump while the workers run");
        admin_tx.send(Admin::Dump).unwrap();
    });
    std::thread::sleep(Duration::from_millis(50));
    println!("-- change since the baseline, after the workers exited");
    admin_tx.send(Admin::Delta(baseline)).unwrap();
    std::thread::sleep(Duration::from_millis(50));
    let released = proxalloc::trim_all();
    println!("-- after trim_all (released {released} bytes)");
    admin_tx.send(Admin::Dump).unwrap();
    drop(admin_tx);
    admin.join().unwrap();
}
