//! The contenders by name, type-erased: what a run lists, the runner interleaves and
//! criterion groups. Each name is built in one place (`object_table`, `mix_table`), so a
//! contender has the same name, peer flag and construction in every bench and tool.

use proxalloc::CacheMode;

use super::contenders::*;
use super::workloads::{
    w1, w2, w3, w3_new_threads, w4, w4_polled, w5, w5_two, Mix, Object, Objects,
};

/// The peer suite (`peers`, `peers_interleaved`): every contender but `proxalloc-local`
/// (whose cache is one thread's), the floor first.
pub const PEER_SUITE: [&str; 14] = [
    "lower-bound",
    "proxalloc",
    "proxalloc-percpu",
    "proxalloc-threads",
    "proxalloc-depot-only",
    "proxalloc-one-word",
    "proxalloc-bypass",
    "box-system",
    "mimalloc",
    "jemalloc",
    "object-pool",
    "lockfree-object-pool",
    "sharded-slab",
    "arrayqueue-pool",
];

/// The fast-path runs (`class_alloc`, `interleaved`): proxalloc's paths (thread-local
/// lookup, `with_local`, depot only) between the floor and the two general allocators.
pub const FAST_PATH: [&str; 6] = [
    "lower-bound",
    "proxalloc",
    "proxalloc-local",
    "proxalloc-depot-only",
    "box-system",
    "mimalloc",
];

/// A workload of one object size and its size parameter.
#[derive(Clone, Copy, Debug)]
pub enum Work {
    W1(u64),
    W2(u64),
    /// On the two long-lived workers.
    W3(u64),
    /// On two threads started for each sample.
    W3New(u64),
    W4(u64),
    /// W4 with a polled hand-off instead of the blocking channel.
    W4Polled(u64),
}

/// One contender, type-erased: runs a workload, returns ns per object (`None` where the
/// workload does not apply to it).
pub struct Entry {
    pub name: &'static str,
    /// A peer (another project's allocator or pool), not proxalloc or the floor: the
    /// tables' "vs best peer" is against the best of these.
    pub peer: bool,
    pub run: Box<dyn Fn(Work) -> Option<f64>>,
}

/// An entry for a `'static` contender; `remote`: whether it takes W4's frees from
/// another thread.
fn entry<O: Object, C>(name: &'static str, peer: bool, remote: bool, c: &'static C) -> Entry
where
    C: Contender<'static, O> + Sync,
    C::Handle: Send,
{
    let run = move |w| {
        Some(match w {
            Work::W1(n) => w1(c, n, O::new),
            Work::W2(n) => w2(c, n, O::new),
            Work::W3(n) => w3(c, n, O::new),
            Work::W3New(n) => w3_new_threads(c, n, O::new),
            Work::W4(n) if remote => w4(c, n, O::new),
            Work::W4Polled(n) if remote => w4_polled(c, n, O::new),
            Work::W4(_) | Work::W4Polled(_) => return None,
        })
    };
    Entry {
        name,
        peer,
        run: Box::new(run),
    }
}

type Make = fn(&'static str) -> Entry;

/// Every object contender for objects of type `O`: its name and how to build it.
fn object_table<O: Object>() -> [(&'static str, Make); 15] {
    [
        // The thread-local stack has no shared level (a remote free would strand memory
        // on the freeing thread), so W4 gets its own floor: a ring of slots.
        ("lower-bound", |n| {
            let stack = entry::<O, _>(n, false, false, leak(LowerBound));
            // SAFETY: the ring serves only W4, where one worker allocates and at most 384
            // objects are live (`HandoffFloor::SLOTS`).
            let ring = leak(unsafe { HandoffFloor::<O>::new() });
            let run = move |w| match w {
                Work::W4(k) => Some(w4(ring, k, O::new)),
                Work::W4Polled(k) => Some(w4_polled(ring, k, O::new)),
                _ => (stack.run)(w),
            };
            Entry {
                name: n,
                peer: false,
                run: Box::new(run),
            }
        }),
        // The build's default mode: per-CPU caches with the library's `percpu` feature (on
        // by default, and in this crate's dependency), per-thread caches without.
        ("proxalloc", |n| {
            entry::<O, _>(n, false, true, Proxalloc::<O>::new(CacheMode::default()))
        }),
        // Per-CPU caches (Linux rseq; per-thread caches where they cannot work).
        ("proxalloc-percpu", |n| {
            entry::<O, _>(n, false, true, Proxalloc::<O>::new(CacheMode::PerCpu))
        }),
        // Per-thread caches by name (behind the call in a default build).
        ("proxalloc-threads", |n| {
            entry::<O, _>(n, false, true, Proxalloc::<O>::new(CacheMode::ThreadCaches))
        }),
        ("proxalloc-local", |n| {
            let p = Proxalloc::<O>::new(CacheMode::ThreadCaches);
            // The cache is this thread's: the workloads on two threads do not apply.
            let run = move |w| match w {
                Work::W1(k) => Some(p.0.with_local(|c| w1(c, k, O::new))),
                Work::W2(k) => Some(p.0.with_local(|c| w2(c, k, O::new))),
                Work::W3(_) | Work::W3New(_) | Work::W4(_) | Work::W4Polled(_) => None,
            };
            Entry {
                name: n,
                peer: false,
                run: Box::new(run),
            }
        }),
        ("proxalloc-depot-only", |n| {
            entry::<O, _>(n, false, true, Proxalloc::<O>::new(CacheMode::DepotOnly))
        }),
        ("proxalloc-one-word", |n| {
            entry::<O, _>(n, false, true, ProxallocOneWord::<O>::new())
        }),
        ("proxalloc-bypass", |n| {
            entry::<O, _>(n, false, true, Proxalloc::<O>::new(CacheMode::Bypass))
        }),
        ("box-system", |n| {
            entry::<O, _>(n, true, true, leak(SystemBox))
        }),
        ("mimalloc", |n| {
            entry::<O, _>(n, true, true, leak(ViaGlobal(mimalloc::MiMalloc)))
        }),
        ("jemalloc", |n| {
            entry::<O, _>(n, true, true, leak(ViaGlobal(tikv_jemallocator::Jemalloc)))
        }),
        ("object-pool", |n| {
            let p = object_pool::Pool::new(0, O::default);
            entry::<O, _>(n, true, true, leak(ObjectPool(p)))
        }),
        ("lockfree-object-pool", |n| {
            let p = lockfree_object_pool::LinearObjectPool::new(O::default, |_| {});
            entry::<O, _>(n, true, true, leak(LockfreePool(p)))
        }),
        ("sharded-slab", |n| {
            entry::<O, _>(
                n,
                true,
                true,
                leak(ShardedSlab(sharded_slab::Pool::<O>::new())),
            )
        }),
        ("arrayqueue-pool", |n| {
            let q = crossbeam_queue::ArrayQueue::<Box<O>>::new(4096);
            entry::<O, _>(n, true, true, leak(ArrayQueuePool(q)))
        }),
    ]
}

/// The object contender called `name` for objects of type `O`, if there is one.
pub fn contender<O: Object>(name: &str) -> Option<Entry> {
    let (name, make) = object_table::<O>().into_iter().find(|(n, _)| *n == name)?;
    Some(make(name))
}

/// The named contenders for objects of type `O`, in the order given.
pub fn contenders<O: Object>(names: &[&str]) -> Vec<Entry> {
    names
        .iter()
        .map(|n| contender::<O>(n).unwrap_or_else(|| panic!("no contender {n:?}")))
        .collect()
}

/// One W5 contender: `(two_threads, requests) -> ns per request`.
pub struct MixEntry {
    pub name: &'static str,
    pub peer: bool,
    pub run: Box<dyn Fn(bool, u64) -> f64>,
}

type MakeMix = fn(&'static str) -> MixEntry;

/// Every W5 contender: its name and how to build it (one allocator per object size).
///
/// `#[inline]`, like `mix` and `mixes`: they are the library's only non-generic code that
/// calls mimalloc and jemalloc, and inline functions are compiled only into the programs
/// that use them. Otherwise W5's code would share an object file with functions every
/// tool uses (`w7`'s helpers, `rss`), and linking that file would bring both allocators,
/// whose start-up code runs and adds to the RSS of `pool_footprint` and `idle_threads`,
/// which measure RSS and never use them
/// (`docs/benchmarks.md#peers-kept-out-of-the-rss-tools`).
#[inline]
fn mix_table<F: Objects>() -> [(&'static str, MakeMix); 14] {
    // `$make` builds the allocator for `$n`-byte objects; contenders that serve every
    // size with one value (`leak(SystemBox)`) do not name `$n`, hence the `allow`.
    macro_rules! mix {
        ($peer:expr, |$n:ident| $make:expr) => {
            |name| {
                let m = leak(Mix {
                    k2: {
                        #[allow(dead_code)]
                        const $n: usize = 2048;
                        $make
                    },
                    b512: {
                        #[allow(dead_code)]
                        const $n: usize = 512;
                        $make
                    },
                    k1: {
                        #[allow(dead_code)]
                        const $n: usize = 1024;
                        $make
                    },
                    b128: {
                        #[allow(dead_code)]
                        const $n: usize = 128;
                        $make
                    },
                    objects: std::marker::PhantomData::<fn() -> F>,
                });
                MixEntry {
                    name,
                    peer: $peer,
                    run: Box::new(move |two, n| if two { w5_two(m, n) } else { w5(m, n) }),
                }
            }
        };
    }
    [
        ("lower-bound", mix!(false, |N| leak(LowerBound))),
        (
            "proxalloc",
            mix!(false, |N| Proxalloc::<F::Of<N>>::new(CacheMode::default())),
        ),
        (
            "proxalloc-percpu",
            mix!(false, |N| Proxalloc::<F::Of<N>>::new(CacheMode::PerCpu)),
        ),
        (
            "proxalloc-threads",
            mix!(false, |N| Proxalloc::<F::Of<N>>::new(
                CacheMode::ThreadCaches
            )),
        ),
        (
            "proxalloc-one-word",
            mix!(false, |N| ProxallocOneWord::<F::Of<N>>::new()),
        ),
        (
            "proxalloc-depot-only",
            mix!(false, |N| Proxalloc::<F::Of<N>>::new(CacheMode::DepotOnly)),
        ),
        (
            "proxalloc-bypass",
            mix!(false, |N| Proxalloc::<F::Of<N>>::new(CacheMode::Bypass)),
        ),
        ("box-system", mix!(true, |N| leak(SystemBox))),
        (
            "mimalloc",
            mix!(true, |N| leak(ViaGlobal(mimalloc::MiMalloc))),
        ),
        (
            "jemalloc",
            mix!(true, |N| leak(ViaGlobal(tikv_jemallocator::Jemalloc))),
        ),
        (
            "object-pool",
            mix!(true, |N| leak(ObjectPool(object_pool::Pool::new(
                0,
                <F::Of<N>>::default
            )))),
        ),
        (
            "lockfree-object-pool",
            mix!(true, |N| leak(LockfreePool(
                lockfree_object_pool::LinearObjectPool::new(<F::Of<N>>::default, |_| {})
            ))),
        ),
        (
            "sharded-slab",
            mix!(true, |N| leak(ShardedSlab(
                sharded_slab::Pool::<F::Of<N>>::new()
            ))),
        ),
        (
            "arrayqueue-pool",
            mix!(true, |N| leak(ArrayQueuePool(
                crossbeam_queue::ArrayQueue::<Box<F::Of<N>>>::new(4096)
            ))),
        ),
    ]
}

/// The W5 contender called `name`, with objects of family `F`, if there is one.
#[inline]
pub fn mix<F: Objects>(name: &str) -> Option<MixEntry> {
    let (name, make) = mix_table::<F>().into_iter().find(|(n, _)| *n == name)?;
    Some(make(name))
}

/// The peer suite's W5 contenders, in its order (every one has a request mix).
#[inline]
pub fn peer_mixes<F: Objects>() -> Vec<MixEntry> {
    PEER_SUITE.iter().filter_map(|n| mix::<F>(n)).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::workloads::{Ends, Obj, Zeroed};

    /// Every name the tables list builds a contender, so none drops out of a run unseen.
    #[test]
    fn every_listed_name_has_its_contender() {
        for n in PEER_SUITE.iter().chain(&FAST_PATH) {
            assert!(contender::<Obj<64>>(n).is_some(), "{n}");
        }
        let mixes: Vec<_> = peer_mixes::<Zeroed>().iter().map(|m| m.name).collect();
        assert_eq!(mixes, PEER_SUITE);
        let mixes: Vec<_> = peer_mixes::<Ends>().iter().map(|m| m.name).collect();
        assert_eq!(mixes, PEER_SUITE);
    }

    /// W5's objects as the targets define them: the index at both ends, whatever the size.
    #[test]
    fn sparse_objects_carry_their_index_at_both_ends() {
        use crate::workloads::Sparse;
        fn ends<const N: usize>(o: &Sparse<N>) -> [u8; 16] {
            // SAFETY: `Object::new` writes the first and last 8 bytes.
            std::array::from_fn(|k| unsafe {
                o.0[if k < 8 { k } else { N - 16 + k }].assume_init()
            })
        }
        let i = 0x0123_4567_89ab_cdef_u64;
        let want: Vec<u8> = [i.to_le_bytes(), i.to_le_bytes()].concat();
        assert_eq!(ends(&<Sparse<2048> as Object>::new(i)).to_vec(), want);
        assert_eq!(ends(&<Sparse<16> as Object>::new(i)).to_vec(), want);
        // Every contender runs both forms of W5 (a few requests, one thread).
        for m in peer_mixes::<Ends>().iter().chain(&peer_mixes::<Zeroed>()) {
            assert!((m.run)(false, 3) >= 0.0, "{}", m.name);
        }
    }

    /// Every contender runs every object workload it takes, and the ones a table needs
    /// for its ratios take all of theirs: the floor (W4 through its ring) and proxalloc.
    #[test]
    fn every_contender_runs_its_workloads() {
        let works = [
            Work::W1(10),
            Work::W2(1),
            Work::W3(1),
            Work::W3New(1),
            Work::W4(8),
            Work::W4Polled(8),
        ];
        for e in contenders::<Obj<256>>(&PEER_SUITE) {
            for w in works {
                let r = (e.run)(w);
                if matches!(e.name, "lower-bound" | "proxalloc" | "arrayqueue-pool") {
                    assert!(r.is_some(), "{} {w:?}", e.name);
                }
                assert!(r.is_none_or(|ns| ns >= 0.0), "{} {w:?}", e.name);
            }
        }
    }
}
