//! Pool blocks in transparent huge pages, left out of core dumps: a `BlockAllocator`
//! over one `mmap`ed arena advised with `MADV_HUGEPAGE` and `MADV_DONTDUMP`, the way
//! Traffic Server offers `proxy.config.allocator.hugepages` and
//! `proxy.config.allocator.dontdump_iobuffers`.
//!
//! Request pools on two threads draw their blocks from the arena through
//! `BlockSource::with_block_allocator`; the example prints the arena's use, the kernel's
//! view of the mapping (`/proc/self/smaps`: `hg` and `dd` in `VmFlags`, and
//! `AnonHugePages` where the kernel backed it with huge pages), and checks that every
//! block went back to the arena once the source was dropped.
//!
//! ```sh
//! cargo run --release --example hugepage_blocks
//! ```
//!
//! Linux only (the `madvise` flags are Linux's); elsewhere it says so and exits.

#[cfg(target_os = "linux")]
mod arena {
    use std::alloc::Layout;
    use std::collections::HashMap;
    use std::io;
    use std::ptr::NonNull;
    use std::sync::Mutex;

    use proxalloc::BlockAllocator;

    /// Huge page size on x86-64 and most aarch64 kernels.
    pub const HUGE_PAGE: usize = 2 << 20;

    /// Freed blocks by size, and the bump offset of fresh ones.
    #[derive(Default)]
    struct State {
        next: usize,
        free: HashMap<usize, Vec<usize>>,
        blocks_out: usize,
        bytes_out: usize,
    }

    /// One anonymous mapping, carved into blocks: fresh ones by bumping an offset,
    /// freed ones kept by size for reuse (the source asks for few distinct sizes). The
    /// arena never returns memory to the kernel before it is dropped; the source's
    /// `max_free` bounds what sits unused in its caches, and the free lists here hold
    /// the rest.
    pub struct HugePageArena {
        /// Start of the mapping as `mmap` returned it (for `munmap`), and its length.
        map: *mut u8,
        map_len: usize,
        /// The huge-page-aligned part that blocks come from.
        base: *mut u8,
        len: usize,
        state: Mutex<State>,
    }

    // SAFETY: the pointers are to a private mapping that only this arena manages, and
    // the arena's state is behind a mutex.
    unsafe impl Send for HugePageArena {}
    // SAFETY: as above.
    unsafe impl Sync for HugePageArena {}

    impl HugePageArena {
        /// Maps `len` bytes (rounded up to huge pages), aligned to a huge page, and
        /// advises the kernel to back them with huge pages and leave them out of core
        /// dumps. Memory is committed only as blocks are first written.
        pub fn new(len: usize) -> io::Result<Self> {
            let len = len.div_ceil(HUGE_PAGE) * HUGE_PAGE;
            let map_len = len + HUGE_PAGE;
            // SAFETY: an anonymous private mapping; no existing memory is touched.
            let map = unsafe {
                libc::mmap(
                    std::ptr::null_mut(),
                    map_len,
                    libc::PROT_READ | libc::PROT_WRITE,
                    libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
                    -1,
                    0,
                )
            };
            if map == libc::MAP_FAILED {
                return Err(io::Error::last_os_error());
            }
            let map = map.cast::<u8>();
            // Huge pages need a huge-page-aligned range.
            let pad = map.align_offset(HUGE_PAGE);
            // SAFETY: `pad < HUGE_PAGE`, inside the mapping.
            let base = unsafe { map.add(pad) };
            for (advice, name) in [
                (libc::MADV_HUGEPAGE, "MADV_HUGEPAGE"),
                (libc::MADV_DONTDUMP, "MADV_DONTDUMP"),
            ] {
                // SAFETY: advice on a range of our own mapping.
                if unsafe { libc::madvise(base.cast(), len, advice) } != 0 {
                    // E.g. a kernel built without transparent huge pages: the blocks
                    // still work, in ordinary pages.
                    eprintln!("madvise({name}): {}", io::Error::last_os_error());
                }
            }
            Ok(HugePageArena {
                map,
                map_len,
                base,
                len,
                state: Mutex::new(State::default()),
            })
        }

        /// Address range of the advised part.
        pub fn range(&self) -> (usize, usize) {
            (self.base as usize, self.base as usize + self.len)
        }

        /// Blocks and bytes handed out and not yet given back.
        pub fn in_use(&self) -> (usize, usize) {
            let st = self.state.lock().unwrap();
            (st.blocks_out, st.bytes_out)
        }

        /// Bytes of the arena ever carved into blocks.
        pub fn carved(&self) -> usize {
            self.state.lock().unwrap().next
        }
    }

    // SAFETY: every block is a distinct range of the mapping, aligned as asked (offsets
    // are kept multiples of the alignment, and `base` is huge-page-aligned), and is
    // handed out again only after `free_block`.
    unsafe impl BlockAllocator for HugePageArena {
        fn alloc_block(&self, layout: Layout) -> Option<NonNull<u8>> {
            let mut st = self.state.lock().unwrap();
            let offset = match st.free.get_mut(&layout.size()).and_then(Vec::pop) {
                Some(offset) => offset,
                None => {
                    let offset = st.next.next_multiple_of(layout.align());
                    if offset + layout.size() > self.len {
                        return None; // the arena is full: the pool reports failure
                    }
                    st.next = offset + layout.size();
                    offset
                }
            };
            st.blocks_out += 1;
            st.bytes_out += layout.size();
            // SAFETY: inside the mapping.
            NonNull::new(unsafe { self.base.add(offset) })
        }

        unsafe fn free_block(&self, ptr: NonNull<u8>, layout: Layout) {
            let mut st = self.state.lock().unwrap();
            let offset = ptr.as_ptr() as usize - self.base as usize;
            st.free.entry(layout.size()).or_default().push(offset);
            st.blocks_out -= 1;
            st.bytes_out -= layout.size();
        }
    }

    impl Drop for HugePageArena {
        fn drop(&mut self) {
            // SAFETY: our mapping, no longer used (the source that used it is gone).
            unsafe { libc::munmap(self.map.cast(), self.map_len) };
        }
    }

    /// The `/proc/self/smaps` entry of the mapping that contains `addr`: its header,
    /// `AnonHugePages`, `Rss` and `VmFlags` lines.
    pub fn smaps_of(addr: usize) -> Vec<String> {
        let Ok(smaps) = std::fs::read_to_string("/proc/self/smaps") else {
            return vec!["(no /proc/self/smaps)".into()];
        };
        let mut out = Vec::new();
        let mut inside = false;
        for line in smaps.lines() {
            let first = line.split_whitespace().next().unwrap_or("");
            if let Some((lo, hi)) = first.split_once('-') {
                if let (Ok(lo), Ok(hi)) =
                    (usize::from_str_radix(lo, 16), usize::from_str_radix(hi, 16))
                {
                    inside = (lo..hi).contains(&addr);
                    if inside {
                        out.push(line.to_string());
                    }
                    continue;
                }
            }
            if inside && ["Rss:", "AnonHugePages:", "VmFlags:"].contains(&first) {
                out.push(line.to_string());
            }
        }
        out
    }
}

#[cfg(target_os = "linux")]
fn main() {
    use std::sync::Arc;

    use arena::{smaps_of, HugePageArena};
    use proxalloc::{pformat, BlockSource, Pool, PoolVec};

    let arena = Arc::new(HugePageArena::new(64 << 20).expect("mmap failed"));
    let source = BlockSource::with_block_allocator(8 << 20, arena.clone());

    // Two workers, each with a per-request pool cleared after every request. (Joined
    // threads: a join waits for the thread's exit, when its cache gives its blocks back;
    // a scope ends before that.)
    let source = Arc::new(source);
    let workers: Vec<_> = (0..2u64)
        .map(|worker| {
            let source = source.clone();
            std::thread::spawn(move || {
                let mut pool = Pool::with_source(&source);
                for request in 0..20_000u64 {
                    {
                        let path = pformat!(&pool, "/objects/{worker}/{request}");
                        let mut headers = PoolVec::new_in(&pool);
                        for h in 0..8 + request % 8 {
                            headers.push((pool.alloc_str("x-header"), h));
                        }
                        if request % 100 == 0 {
                            // An occasional big body: a large block.
                            let body = pool.alloc_slice_fill_with(100_000, |i| i as u8);
                            assert_eq!(body.len(), 100_000);
                        }
                        assert!(path.starts_with("/objects/") && headers.len() >= 8);
                    }
                    pool.clear();
                }
            })
        })
        .collect();
    for w in workers {
        w.join().expect("worker panicked");
    }
    let source = Arc::into_inner(source).expect("workers are gone");

    let (blocks, bytes) = arena.in_use();
    println!(
        "after the workers: {blocks} blocks ({} KiB) out of the arena, {} KiB of it carved",
        bytes >> 10,
        arena.carved() >> 10,
    );
    println!("pool blocks (all from the arena):");
    for s in source.stats() {
        println!("  {s}");
    }
    let (lo, hi) = arena.range();
    println!(
        "kernel's view of the arena {lo:#x}-{hi:#x} (hg: huge pages advised, dd: not dumped):"
    );
    for line in smaps_of(lo) {
        println!("  {line}");
    }

    drop(source);
    let (blocks, bytes) = arena.in_use();
    println!("after dropping the source: {blocks} blocks, {bytes} bytes out of the arena");
    assert_eq!(
        (blocks, bytes),
        (0, 0),
        "every block goes back to the arena"
    );
    assert_eq!(
        Arc::strong_count(&arena),
        1,
        "the source let go of the arena"
    );
}

#[cfg(not(target_os = "linux"))]
fn main() {
    eprintln!("hugepage_blocks needs Linux (MADV_HUGEPAGE and MADV_DONTDUMP)");
}
