//! The contender list, built once per object size.

use super::*;
use proxalloc::CacheMode;

/// A workload and its size parameter.
#[derive(Clone, Copy, Debug)]
pub enum Work {
    W1(u64),
    W2(u64),
    W3(u64),
    W4(u64),
}

/// One contender, type-erased: runs a workload, returns ns per object (`None` where the
/// workload does not apply).
pub struct Entry {
    pub name: &'static str,
    pub peer: bool,
    pub run: Box<dyn Fn(Work) -> Option<f64>>,
}

fn run_work<C, const N: usize>(c: &'static C, w: Work, remote: bool) -> Option<f64>
where
    C: Contender<Obj<N>>,
{
    Some(match w {
        Work::W1(n) => w1(c, n, Obj::<N>::new),
        Work::W2(n) => w2(c, n, Obj::<N>::new),
        Work::W3(n) => w3(c, n, Obj::<N>::new),
        Work::W4(n) if remote => w4(c, n, Obj::<N>::new),
        Work::W4(_) => return None,
    })
}

/// Every contender for `N`-byte objects, lower bound first.
pub fn contenders<const N: usize>() -> Vec<Entry> {
    let mut v: Vec<Entry> = Vec::new();
    macro_rules! add {
        ($name:expr, $peer:expr, $remote:expr, $c:expr) => {{
            let c = $c;
            v.push(Entry {
                name: $name,
                peer: $peer,
                run: Box::new(move |w| run_work::<_, N>(c, w, $remote)),
            });
        }};
    }
    // The lower bound has no shared level: a remote free would strand memory on B.
    add!("lower-bound", false, false, leak(LowerBound));
    add!(
        "proxalloc",
        false,
        true,
        Proxalloc::<Obj<N>>::new(CacheMode::ThreadCaches)
    );
    add!(
        "proxalloc-depot-only",
        false,
        true,
        Proxalloc::<Obj<N>>::new(CacheMode::DepotOnly)
    );
    add!(
        "proxalloc-one-word",
        false,
        true,
        ProxallocOneWord::<Obj<N>>::new()
    );
    add!(
        "proxalloc-bypass",
        false,
        true,
        Proxalloc::<Obj<N>>::new(CacheMode::Bypass)
    );
    add!("box-system", true, true, leak(SystemBox));
    add!("mimalloc", true, true, leak(ViaGlobal(mimalloc::MiMalloc)));
    add!(
        "jemalloc",
        true,
        true,
        leak(ViaGlobal(tikv_jemallocator::Jemalloc))
    );
    add!(
        "object-pool",
        true,
        true,
        leak(ObjectPool(object_pool::Pool::new(0, Obj::<N>::default)))
    );
    add!(
        "lockfree-object-pool",
        true,
        true,
        leak(LockfreePool(lockfree_object_pool::LinearObjectPool::new(
            Obj::<N>::default,
            |_| {}
        )))
    );
    add!(
        "sharded-slab",
        true,
        true,
        leak(ShardedSlab(sharded_slab::Pool::<Obj<N>>::new()))
    );
    add!(
        "arrayqueue-pool",
        true,
        true,
        leak(ArrayQueuePool(
            crossbeam_queue::ArrayQueue::<Box<Obj<N>>>::new(4096)
        ))
    );
    v
}

/// One W5 contender: `(two_threads, requests) -> ns per request`.
pub struct MixEntry {
    pub name: &'static str,
    pub peer: bool,
    pub run: Box<dyn Fn(bool, u64) -> f64>,
}

/// Every contender for the W5 request mix, lower bound first.
pub fn mixes() -> Vec<MixEntry> {
    let mut v: Vec<MixEntry> = Vec::new();
    macro_rules! add {
        ($name:expr, $peer:expr, |$n:ident| $make:expr) => {{
            let m = leak(Mix {
                k2: {
                    const $n: usize = 2048;
                    $make
                },
                b512: {
                    const $n: usize = 512;
                    $make
                },
                k1: {
                    const $n: usize = 1024;
                    $make
                },
                b128: {
                    const $n: usize = 128;
                    $make
                },
            });
            v.push(MixEntry {
                name: $name,
                peer: $peer,
                run: Box::new(move |two, n| if two { w5_two(m, n) } else { w5(m, n) }),
            });
        }};
    }
    add!("lower-bound", false, |N| leak(LowerBound));
    add!("proxalloc", false, |N| Proxalloc::<Obj<N>>::new(
        CacheMode::ThreadCaches
    ));
    add!("proxalloc-depot-only", false, |N| Proxalloc::<Obj<N>>::new(
        CacheMode::DepotOnly
    ));
    add!("proxalloc-bypass", false, |N| Proxalloc::<Obj<N>>::new(
        CacheMode::Bypass
    ));
    add!("box-system", true, |N| leak(SystemBox));
    add!("mimalloc", true, |N| leak(ViaGlobal(mimalloc::MiMalloc)));
    add!("jemalloc", true, |N| leak(ViaGlobal(
        tikv_jemallocator::Jemalloc
    )));
    add!("object-pool", true, |N| leak(ObjectPool(
        object_pool::Pool::new(0, Obj::<N>::default)
    )));
    add!("lockfree-object-pool", true, |N| leak(LockfreePool(
        lockfree_object_pool::LinearObjectPool::new(Obj::<N>::default, |_| {})
    )));
    add!("sharded-slab", true, |N| leak(ShardedSlab(
        sharded_slab::Pool::<Obj<N>>::new()
    )));
    add!("arrayqueue-pool", true, |N| leak(ArrayQueuePool(
        crossbeam_queue::ArrayQueue::<Box<Obj<N>>>::new(4096)
    )));
    v
}
