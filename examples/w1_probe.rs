use proxalloc::ClassAllocator;
static A: ClassAllocator<[u64; 8]> = ClassAllocator::new("probe");
#[inline(never)]
fn pair(i: u64) {
    let h = A.alloc([i; 8]);
    std::hint::black_box(&*h);
}
fn main() {
    let n: u64 = std::env::args().nth(1).and_then(|s| s.parse().ok()).unwrap_or(1_000_000);
    for i in 0..n { pair(i); }
}
