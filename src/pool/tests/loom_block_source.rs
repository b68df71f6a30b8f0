//! The pool block source's shared part: its block classes charge one `max_free` budget.
//! Two threads free blocks of different classes at once; the source never caches more
//! than `max_free`, and dropping it returns every block (loom's leak check).

use loom::sync::Arc;
use loom::thread;

use crate::{BlockSource, BLOCK_CLASSES};

#[test]
fn two_classes_share_one_max_free() {
    loom::model(|| {
        // Room for one 16 KiB block: the three blocks freed below do not all fit.
        let src = Arc::new(BlockSource::new(BLOCK_CLASSES[1]));
        let workers: Vec<_> = [BLOCK_CLASSES[0], BLOCK_CLASSES[1]]
            .into_iter()
            .enumerate()
            .map(|(t, size)| {
                let src = Arc::clone(&src);
                thread::spawn(move || {
                    let blocks: Vec<_> = (0..1 + t).map(|_| src.alloc(size).unwrap()).collect();
                    for b in blocks {
                        // SAFETY: from this source, freed once.
                        unsafe { src.free(b) };
                    }
                    src.release_thread_cache();
                    assert!(src.cached_bytes() <= src.max_free(), "over max_free");
                })
            })
            .collect();
        for w in workers {
            w.join().unwrap();
        }
        assert!(src.cached_bytes() <= src.max_free());
        let Ok(src) = Arc::try_unwrap(src) else {
            panic!("a thread kept the source")
        };
        drop(src);
    });
}
