//! One-word handles (`Thin<C>`) of `static` class allocators declared with
//! `static_class!`.

use std::sync::atomic::{AtomicUsize, Ordering};

use proxalloc::{static_class, ClassAllocator, Config, StaticClass, Thin};

static DROPS: AtomicUsize = AtomicUsize::new(0);

struct Counted(u64);

impl Drop for Counted {
    fn drop(&mut self) {
        DROPS.fetch_add(1, Ordering::SeqCst);
    }
}

static_class!(Counteds: Counted = "thin-counted", Config::new().magazine_size(4));
static_class!(pub Words: [u64; 8] = "thin-words");

#[test]
fn a_thin_handle_is_one_word_and_frees_on_drop() {
    assert_eq!(
        std::mem::size_of::<Thin<Words>>(),
        std::mem::size_of::<usize>()
    );
    assert_eq!(
        std::mem::size_of::<Option<Thin<Words>>>(),
        std::mem::size_of::<usize>()
    );
    let before = DROPS.load(Ordering::SeqCst);
    let hs: Vec<Thin<Counteds>> = (0..100).map(|i| Counteds::alloc(Counted(i))).collect();
    assert_eq!(hs.iter().map(|h| h.0).sum::<u64>(), 4950);
    drop(hs);
    assert_eq!(DROPS.load(Ordering::SeqCst) - before, 100);
    assert_eq!(Counteds::allocator().stats().live, 0);
    assert_eq!(
        Counteds::allocator().config().magazine_size(4),
        Config::new().magazine_size(4)
    );
}

#[test]
fn thin_handles_cross_threads_and_convert_to_and_from_class_box() {
    let hs: Vec<Thin<Words>> = (0..64).map(|i| Thin::new([i; 8])).collect();
    let sum = std::thread::spawn(move || hs.iter().map(|h| h[7]).sum::<u64>())
        .join()
        .unwrap();
    assert_eq!(sum, (0..64).sum::<u64>());
    let boxed = Thin::into_class_box(Words::alloc([5; 8]));
    let thin: Thin<Words> = Thin::from(boxed);
    assert_eq!(Thin::into_inner(thin), [5; 8]);
    let s = Words::allocator().stats();
    assert_eq!(s.live, 0, "{s}");
}

#[test]
#[should_panic(expected = "made into a Thin of")]
fn a_class_box_of_another_allocator_is_refused() {
    static OTHER: ClassAllocator<[u64; 8]> = ClassAllocator::new("thin-other");
    let _ = Thin::<Words>::from(OTHER.alloc([0; 8]));
}
