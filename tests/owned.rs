//! Owned handles (`Owned<T>`): `'static` objects of allocators built at run time, moved
//! into spawned threads and tokio tasks, freed on other threads.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use proxalloc::{ClassAllocator, Owned};

#[path = "common/books.rs"]
mod books;
use books::assert_nothing_lost;

#[test]
fn an_owned_handle_moves_into_a_spawned_thread_and_keeps_its_allocator_alive() {
    static DROPS: AtomicUsize = AtomicUsize::new(0);
    struct Counted(u64);
    impl Drop for Counted {
        fn drop(&mut self) {
            DROPS.fetch_add(1, Ordering::SeqCst);
        }
    }
    let a = Arc::new(ClassAllocator::<Counted>::new("owned-thread"));
    let handles: Vec<Owned<Counted>> = (0..100).map(|i| a.alloc_arc(Counted(i))).collect();
    let weak = Arc::downgrade(&a);
    drop(a); // the handles keep the allocator alive
    let sum = std::thread::spawn(move || handles.iter().map(|h| h.0).sum::<u64>())
        .join()
        .unwrap();
    assert_eq!(sum, 4950);
    assert_eq!(DROPS.load(Ordering::SeqCst), 100);
    assert!(
        weak.upgrade().is_none(),
        "the last handle dropped the allocator"
    );
}

#[test]
fn into_inner_moves_the_value_out() {
    let a = Arc::new(ClassAllocator::<String>::new("owned-into-inner"));
    let h = a.alloc_arc("value".to_string());
    assert_eq!(Owned::allocator(&h).name(), "owned-into-inner");
    assert_eq!(Owned::into_inner(h), "value");
    let s = a.stats();
    assert_eq!((s.allocs, s.frees, s.live), (1, 1, 0), "{s}");
}

#[test]
fn owned_handles_cross_tokio_workers_across_awaits() {
    let a = Arc::new(ClassAllocator::<[u64; 8]>::new("owned-tokio"));
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let total: u64 = rt.block_on({
        let a = Arc::clone(&a);
        async move {
            let tasks: Vec<_> = (0..200u64)
                .map(|i| {
                    let h = a.alloc_arc([i; 8]);
                    tokio::spawn(async move {
                        tokio::task::yield_now().await; // may resume on another worker
                        h[0] + h[7]
                    })
                })
                .collect();
            let mut total = 0;
            for t in tasks {
                total += t.await.unwrap();
            }
            total
        }
    });
    drop(rt);
    assert_eq!(total, 2 * (0..200).sum::<u64>());
    let s = a.stats();
    assert_eq!(s.live, 0, "{s}");
    assert!(s.is_consistent(), "{s}");
    // The runtime's drop joined its worker threads (their teardown flushed their caches).
    assert_nothing_lost(&a, 0);
}

#[test]
fn owned_recycled_values_move_between_threads_and_come_back() {
    use proxalloc::{Recycle, RecyclingAllocator};
    struct Buf(Vec<u8>);
    impl Recycle for Buf {
        fn create() -> Self {
            Buf(Vec::with_capacity(64))
        }
        fn recycle(&mut self) -> bool {
            self.0.clear();
            true
        }
    }
    let bufs = Arc::new(RecyclingAllocator::<Buf>::new("owned-recycled"));
    let mut b = bufs.get_arc();
    b.0.extend_from_slice(b"abc");
    let cap = b.0.capacity();
    let weak = Arc::downgrade(&bufs);
    std::thread::spawn(move || assert_eq!(b.0, b"abc"))
        .join()
        .unwrap();
    let again = bufs.get_arc();
    assert!(again.0.is_empty() && again.0.capacity() >= cap.min(64));
    drop(again);
    assert_eq!(bufs.stats().live, 0);
    drop(bufs);
    assert!(weak.upgrade().is_none());
}
