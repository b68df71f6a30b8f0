//! Handles in async tasks: tasks on a multi-thread tokio runtime allocate request objects
//! from a `static` `ClassAllocator`, hold them across `.await` points (the task may be
//! resumed on another worker thread each time) and pass some to a consumer task through
//! a channel; each handle is dropped on whichever worker runs its task then. After the
//! runtime shuts down, the allocator's stats show no live object, and every object freed
//! on another worker than the one that allocated it went back through the cache nearest
//! that worker (its CPU's, with per-CPU caches; its own, with per-thread caches).
//!
//! ```sh
//! cargo run --release --example tokio_tasks
//! ```
//!
//! A `ClassBox<'static, T>` from a `static` allocator is `Send` when `T` is, so it moves
//! into `tokio::spawn` like a `Box`. (For an allocator built at run time, make it an
//! `Arc<ClassAllocator<T>>` and use `alloc_arc`, which gives an owned `'static` handle.)

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::thread::{self, ThreadId};
use std::time::Duration;

use proxalloc::{ClassAllocator, ClassBox};
use tokio::sync::mpsc;
use tokio::task::JoinSet;

struct Request {
    id: u64,
    allocated_on: ThreadId,
    body: [u8; 240],
}

static REQUESTS: ClassAllocator<Request> = ClassAllocator::new("tokio-requests");

/// Requests dropped on another thread than the one that allocated them.
static MOVED: AtomicU64 = AtomicU64::new(0);

const TASKS: u64 = 20_000;

fn note_drop(req: ClassBox<'static, Request>) {
    if req.allocated_on != thread::current().id() {
        MOVED.fetch_add(1, Relaxed);
    }
}

/// One request's life: allocated, held across several awaits, then either dropped here
/// or handed to the consumer.
async fn handle(id: u64, to_log: mpsc::Sender<ClassBox<'static, Request>>) -> u64 {
    let mut req = REQUESTS.alloc(Request {
        id,
        allocated_on: thread::current().id(),
        body: [0; 240],
    });
    for step in 0..3u8 {
        // Each await may resume the task on another worker.
        tokio::task::yield_now().await;
        if id % 16 == 0 {
            tokio::time::sleep(Duration::from_micros(50)).await;
        }
        req.body[step as usize] = id as u8 ^ step;
    }
    let sum = req.body.iter().map(|&b| u64::from(b)).sum::<u64>() + req.id;
    if id % 4 == 0 {
        // The consumer task drops it, on whatever worker it runs.
        to_log.send(req).await.expect("consumer gone");
    } else {
        note_drop(req);
    }
    sum
}

fn main() {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(4)
        .enable_time()
        .build()
        .expect("runtime");

    let total = runtime.block_on(async {
        let (to_log, mut log) = mpsc::channel::<ClassBox<'static, Request>>(64);
        let consumer = tokio::spawn(async move {
            let mut logged = 0u64;
            while let Some(req) = log.recv().await {
                logged += 1;
                note_drop(req);
            }
            logged
        });
        let mut tasks = JoinSet::new();
        for id in 0..TASKS {
            tasks.spawn(handle(id, to_log.clone()));
        }
        drop(to_log);
        let mut total = 0;
        while let Some(sum) = tasks.join_next().await {
            total += sum.expect("task panicked");
        }
        let logged = consumer.await.expect("consumer panicked");
        assert_eq!(logged, TASKS / 4);
        total
    });
    // Shutting the runtime down ends its worker threads, whose thread caches (if the
    // allocator has per-thread caches) go back to the allocator's depot; CPU caches stay
    // until a trim.
    drop(runtime);

    let s = REQUESTS.stats();
    println!("{TASKS} tasks, checksum {total}");
    println!(
        "{} requests dropped on another thread than the one that allocated them",
        MOVED.load(Relaxed)
    );
    println!("{s}");
    assert_eq!(s.allocs, TASKS);
    assert_eq!(s.live, 0, "live objects after the runtime shut down");
    assert_eq!(s.frees, s.allocs);
    println!(
        "after shutdown: 0 live objects; trim_all gave back {} bytes",
        proxalloc::trim_all()
    );
}
