//! Property tests of pools against std models: random operation sequences on `Pool`
//! (allocations of random sizes and alignments, owned values, cleanups and their
//! cancelling, subpools, clears), on `PoolVec` against a `Vec` (values whose drops are
//! counted one by one, and a zero-sized type), on `&Pool` as an allocator-api2
//! allocator (allocate, grow, shrink, deallocate with changing alignments, against a
//! byte model of every live block), and on hashbrown's map in a pool against std's.
//!
//! Case counts are modest so that the suite stays fast; under Miri they are smaller
//! still (`PROPTEST_CASES` overrides both).

use std::alloc::Layout;
use std::cell::{Cell, RefCell};
use std::collections::hash_map::DefaultHasher;
use std::fmt;
use std::hash::{Hash, Hasher};
use std::ptr::NonNull;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use proptest::prelude::*;
use proptest::sample::Index;
use proxalloc::allocator_api2::alloc::Allocator;
use proxalloc::{BlockSource, CleanupKey, Pool, PoolVec};

fn config() -> ProptestConfig {
    if cfg!(miri) {
        // No regression files under Miri's isolation, and few cases: each is slow there.
        ProptestConfig {
            cases: 4,
            failure_persistence: None,
            ..ProptestConfig::default()
        }
    } else {
        ProptestConfig::with_cases(64)
    }
}

/// Longest operation sequence per case.
const OPS: usize = if cfg!(miri) { 20 } else { 80 };

// ---------------------------------------------------------------------------------------
// PoolVec against Vec

/// An element type for the `PoolVec` model: made from a key, and read back as one; its
/// constructions and drops are counted so that the test can check every value is
/// dropped exactly once.
trait Elem: Clone + Hash + Ord + fmt::Debug {
    fn make(key: u32) -> Self;
    fn key(&self) -> u32;
    /// The key of `make(key)`.
    fn key_of(key: u32) -> u32;
    /// The key after `bump(d)` (what `for x in &mut v` does to each element).
    fn bumped(key: u32, d: u32) -> u32;
    fn bump(&mut self, d: u32);
    /// Starts a case's counting.
    fn reset();
    /// Values made and not yet dropped; panics if one was dropped twice.
    fn live() -> usize;
}

thread_local! {
    /// Drops of each `Tracked` value, by id (the id is the index).
    static LEDGER: RefCell<Vec<u8>> = const { RefCell::new(Vec::new()) };
    static UNITS_MADE: Cell<usize> = const { Cell::new(0) };
    static UNITS_DROPPED: Cell<usize> = const { Cell::new(0) };
}

/// A value with a destructor and an identity. Its last field is a check of the others,
/// so that a byte lost or torn in a move (its last bytes above all) is noticed.
#[repr(C)]
struct Tracked {
    id: usize,
    key: u32,
    check: u32,
}

impl Tracked {
    fn check_of(id: usize, key: u32) -> u32 {
        !key.rotate_left(7) ^ (id as u32).wrapping_mul(0x9e37_79b9)
    }
}

impl Elem for Tracked {
    fn make(key: u32) -> Self {
        let id = LEDGER.with_borrow_mut(|l| {
            l.push(0);
            l.len() - 1
        });
        let check = Tracked::check_of(id, key);
        Tracked { id, key, check }
    }
    fn key(&self) -> u32 {
        assert_eq!(
            self.check,
            Tracked::check_of(self.id, self.key),
            "a torn value"
        );
        self.key
    }
    fn key_of(key: u32) -> u32 {
        key
    }
    fn bumped(key: u32, d: u32) -> u32 {
        key.wrapping_add(d)
    }
    fn bump(&mut self, d: u32) {
        self.key = Self::bumped(self.key(), d);
        self.check = Tracked::check_of(self.id, self.key);
    }
    fn reset() {
        LEDGER.with_borrow_mut(Vec::clear);
    }
    fn live() -> usize {
        LEDGER.with_borrow(|l| {
            assert!(l.iter().all(|&d| d <= 1), "a value was dropped twice");
            l.iter().filter(|&&d| d == 0).count()
        })
    }
}

impl Clone for Tracked {
    fn clone(&self) -> Self {
        Tracked::make(self.key())
    }
}

impl Drop for Tracked {
    fn drop(&mut self) {
        LEDGER.with_borrow_mut(|l| l[self.id] += 1);
    }
}

impl Hash for Tracked {
    fn hash<H: Hasher>(&self, h: &mut H) {
        self.key.hash(h);
    }
}

impl PartialEq for Tracked {
    fn eq(&self, other: &Self) -> bool {
        self.key == other.key
    }
}

impl Eq for Tracked {}

impl PartialOrd for Tracked {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for Tracked {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        self.key.cmp(&other.key)
    }
}

impl fmt::Debug for Tracked {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.key.fmt(f)
    }
}

/// A zero-sized value with a destructor: its key is always 0.
#[derive(PartialEq, Eq, PartialOrd, Ord)]
struct Unit;

impl Elem for Unit {
    fn make(_: u32) -> Self {
        UNITS_MADE.set(UNITS_MADE.get() + 1);
        Unit
    }
    fn key(&self) -> u32 {
        0
    }
    fn key_of(_: u32) -> u32 {
        0
    }
    fn bumped(key: u32, _: u32) -> u32 {
        key
    }
    fn bump(&mut self, _: u32) {}
    fn reset() {
        UNITS_MADE.set(0);
        UNITS_DROPPED.set(0);
    }
    fn live() -> usize {
        UNITS_MADE
            .get()
            .checked_sub(UNITS_DROPPED.get())
            .expect("more units dropped than made")
    }
}

impl Clone for Unit {
    fn clone(&self) -> Self {
        Unit::make(0)
    }
}

impl Drop for Unit {
    fn drop(&mut self) {
        UNITS_DROPPED.set(UNITS_DROPPED.get() + 1);
    }
}

impl Hash for Unit {
    fn hash<H: Hasher>(&self, h: &mut H) {
        0u32.hash(h);
    }
}

impl fmt::Debug for Unit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        0u32.fmt(f)
    }
}

#[derive(Clone, Debug)]
enum VecOp {
    Push(u32),
    Pop,
    Insert(Index, u32),
    Remove(Index),
    SwapRemove(Index),
    Truncate(Index),
    Retain(u32),
    DedupByKey,
    /// `drain(a..b)`, of which the first `k` items are taken before the rest is dropped.
    Drain(Index, Index, Index),
    Extend(Vec<u32>),
    ExtendFromSlice(Vec<u32>),
    Clear,
    /// A clone compared with the original (`==`, `Ord`, `Hash`).
    CloneCompare,
    /// `for x in &v` and `for x in &mut v`.
    Iterate(u32),
    /// A clone's `into_iter`, of which `k` items are taken before it is dropped.
    IntoIterPart(Index),
    SplitOffAppend(Index),
    Reserve(u16),
    ShrinkToFit,
    /// An allocation after the vector's buffer, so that its next growth copies.
    AllocAfter(u16),
}

fn vec_op() -> impl Strategy<Value = VecOp> {
    prop_oneof![
        6 => any::<u32>().prop_map(VecOp::Push),
        2 => Just(VecOp::Pop),
        2 => (any::<Index>(), any::<u32>()).prop_map(|(i, x)| VecOp::Insert(i, x)),
        2 => any::<Index>().prop_map(VecOp::Remove),
        1 => any::<Index>().prop_map(VecOp::SwapRemove),
        1 => any::<Index>().prop_map(VecOp::Truncate),
        1 => (1u32..5).prop_map(VecOp::Retain),
        1 => Just(VecOp::DedupByKey),
        1 => (any::<Index>(), any::<Index>(), any::<Index>())
            .prop_map(|(a, b, k)| VecOp::Drain(a, b, k)),
        2 => prop::collection::vec(0u32..16, 0..40).prop_map(VecOp::Extend),
        1 => prop::collection::vec(0u32..16, 0..20).prop_map(VecOp::ExtendFromSlice),
        1 => Just(VecOp::Clear),
        1 => Just(VecOp::CloneCompare),
        1 => any::<u32>().prop_map(VecOp::Iterate),
        1 => any::<Index>().prop_map(VecOp::IntoIterPart),
        1 => any::<Index>().prop_map(VecOp::SplitOffAppend),
        1 => (0u16..if cfg!(miri) { 300 } else { 6000 }).prop_map(VecOp::Reserve),
        1 => Just(VecOp::ShrinkToFit),
        1 => (0u16..200).prop_map(VecOp::AllocAfter),
    ]
}

fn hash_of(x: &impl Hash) -> u64 {
    let mut h = DefaultHasher::new();
    x.hash(&mut h);
    h.finish()
}

/// Runs `ops` on a `PoolVec<T>` and on a `Vec<u32>` of keys, checking after each that
/// they hold the same keys, that bytes allocated after the vector are intact, and that
/// exactly the vector's values are alive; and at the end that every value was dropped.
fn vec_matches_model<T: Elem>(ops: &[VecOp]) {
    T::reset();
    let src = BlockSource::new(1 << 20);
    let pool = Pool::with_source(&src);
    let mut v: PoolVec<'_, '_, T> = PoolVec::new_in(&pool);
    let mut model: Vec<u32> = Vec::new();
    // Allocations made after the vector: (bytes, the byte they were filled with).
    let mut after: Vec<(&[u8], u8)> = Vec::new();
    for (step, op) in ops.iter().enumerate() {
        match op {
            VecOp::Push(x) => {
                v.push(T::make(*x));
                model.push(T::key_of(*x));
            }
            VecOp::Pop => assert_eq!(v.pop().map(|x| x.key()), model.pop()),
            VecOp::Insert(i, x) => {
                let i = i.index(model.len() + 1);
                v.insert(i, T::make(*x));
                model.insert(i, T::key_of(*x));
            }
            VecOp::Remove(i) if !model.is_empty() => {
                let i = i.index(model.len());
                assert_eq!(v.remove(i).key(), model.remove(i));
            }
            VecOp::SwapRemove(i) if !model.is_empty() => {
                let i = i.index(model.len());
                assert_eq!(v.swap_remove(i).key(), model.swap_remove(i));
            }
            VecOp::Remove(_) | VecOp::SwapRemove(_) => {}
            VecOp::Truncate(n) => {
                let n = n.index(model.len() + 3);
                v.truncate(n);
                model.truncate(n);
            }
            VecOp::Retain(m) => {
                v.retain(|x| x.key() % m != 0);
                model.retain(|k| k % m != 0);
            }
            VecOp::DedupByKey => {
                v.dedup_by_key(|x| x.key() / 4);
                model.dedup_by_key(|k| *k / 4);
            }
            VecOp::Drain(a, b, k) => {
                let (a, b) = {
                    let (a, b) = (a.index(model.len() + 1), b.index(model.len() + 1));
                    (a.min(b), a.max(b))
                };
                let k = k.index(b - a + 1);
                let taken: Vec<u32> = v.drain(a..b).take(k).map(|x| x.key()).collect();
                let expected: Vec<u32> = model.drain(a..b).take(k).collect();
                assert_eq!(taken, expected);
            }
            VecOp::Extend(xs) => {
                v.extend(xs.iter().map(|&x| T::make(x)));
                model.extend(xs.iter().map(|&x| T::key_of(x)));
            }
            VecOp::ExtendFromSlice(xs) => {
                let items: Vec<T> = xs.iter().map(|&x| T::make(x)).collect();
                v.extend_from_slice(&items);
                drop(items);
                model.extend(xs.iter().map(|&x| T::key_of(x)));
            }
            VecOp::Clear => {
                v.clear();
                model.clear();
            }
            VecOp::CloneCompare => {
                let c = v.clone();
                assert!(c == v && c[..] == v[..]);
                assert_eq!(c.cmp(&v), std::cmp::Ordering::Equal);
                assert_eq!(hash_of(&c), hash_of(&v));
                assert_eq!(c.len(), model.len());
            }
            VecOp::Iterate(d) => {
                let mut keys = Vec::new();
                for x in &v {
                    keys.push(x.key());
                }
                assert_eq!(keys, model);
                for x in &mut v {
                    x.bump(*d);
                }
                for k in &mut model {
                    *k = T::bumped(*k, *d);
                }
            }
            VecOp::IntoIterPart(k) => {
                let k = k.index(model.len() + 1);
                let taken: Vec<u32> = v.clone().into_iter().take(k).map(|x| x.key()).collect();
                assert_eq!(taken, model[..k]);
            }
            VecOp::SplitOffAppend(at) => {
                let at = at.index(model.len() + 1);
                let mut tail = v.split_off(at);
                assert!(tail.iter().map(Elem::key).eq(model[at..].iter().copied()));
                assert_eq!(v.len(), at);
                v.append(&mut tail);
                assert!(tail.is_empty());
            }
            VecOp::Reserve(n) => {
                v.reserve(usize::from(*n));
                assert!(v.capacity() >= v.len() + usize::from(*n));
            }
            VecOp::ShrinkToFit => {
                v.shrink_to_fit();
                if size_of::<T>() != 0 {
                    assert_eq!(v.capacity(), v.len());
                }
            }
            VecOp::AllocAfter(n) => {
                let fill = step as u8;
                after.push((pool.alloc_slice_fill_with(usize::from(*n), |_| fill), fill));
            }
        }
        assert!(
            v.iter().map(Elem::key).eq(model.iter().copied()),
            "after {op:?}: {v:?} vs {model:?}"
        );
        assert_eq!(format!("{v:?}"), format!("{model:?}"));
        assert!(v.capacity() >= v.len());
        assert_eq!(v.as_ptr().addr() % align_of::<T>(), 0);
        assert_eq!(T::live(), v.len(), "values alive after {op:?}");
        for (bytes, fill) in &after {
            assert!(bytes.iter().all(|b| b == fill), "overwritten after {op:?}");
        }
    }
    drop(v);
    assert_eq!(T::live(), 0, "every value dropped once");
}

proptest! {
    #![proptest_config(config())]

    #[test]
    fn pool_vec_matches_a_vec(ops in prop::collection::vec(vec_op(), 0..OPS)) {
        vec_matches_model::<Tracked>(&ops);
    }

    #[test]
    fn pool_vec_of_a_zero_sized_type_matches_a_vec(ops in prop::collection::vec(vec_op(), 0..OPS)) {
        vec_matches_model::<Unit>(&ops);
    }
}

#[test]
fn a_dropped_pool_vec_gives_its_memory_back_while_last() {
    let src = BlockSource::new(1 << 20);
    let pool = Pool::with_source(&src);
    let mut v = PoolVec::new_in(&pool);
    v.extend(0..100u64);
    let start = v.as_ptr().addr();
    let used = pool.stats().used_bytes;
    drop(v);
    assert!(pool.stats().used_bytes < used);
    let w: PoolVec<'_, '_, u64> = PoolVec::with_capacity_in(1, &pool);
    assert_eq!(w.as_ptr().addr(), start, "the next vector reuses the room");
}

// ---------------------------------------------------------------------------------------
// Pool: allocations, owned values, cleanups, subpools

/// Counts values made and dropped (owned values, cleanup closures' captures).
#[derive(Default)]
struct Counts {
    made: AtomicUsize,
    dropped: AtomicUsize,
}

/// A value whose drop is counted; owned values also log their id when dropped.
struct Token {
    counts: Arc<Counts>,
    log: Option<(Arc<Mutex<Vec<u32>>>, u32)>,
}

impl Token {
    fn new(counts: &Arc<Counts>, log: Option<(Arc<Mutex<Vec<u32>>>, u32)>) -> Token {
        counts.made.fetch_add(1, Ordering::Relaxed);
        Token {
            counts: counts.clone(),
            log,
        }
    }
}

impl Drop for Token {
    fn drop(&mut self) {
        if let Some((log, id)) = &self.log {
            log.lock().unwrap().push(*id);
        }
        self.counts.dropped.fetch_add(1, Ordering::Relaxed);
    }
}

#[derive(Clone, Debug)]
enum PoolOp {
    /// `alloc_layout` of `size` bytes aligned to `1 << align_log2`, filled.
    Alloc { size: usize, align_log2: u8 },
    /// An owned value, dropped (and logged) when the pool is cleared.
    Owned,
    /// A cleanup that logs its id; its closure owns a counted token.
    Cleanup,
    /// Cancels one of this round's cleanups still registered.
    Cancel(Index),
    /// A subpool running these operations, cleared after the first `clear_at` of them,
    /// then dropped.
    Sub(Vec<PoolOp>, Index),
}

fn leaf_op() -> impl Strategy<Value = PoolOp> {
    // Past the largest block class (64 KiB), so some get a block of their own.
    let big = if cfg!(miri) { 20_000 } else { 90_000 };
    prop_oneof![
        8 => (0usize..400, 0u8..8).prop_map(|(size, align_log2)| PoolOp::Alloc { size, align_log2 }),
        1 => (1000usize..big, 0u8..8).prop_map(|(size, align_log2)| PoolOp::Alloc { size, align_log2 }),
        2 => Just(PoolOp::Owned),
        2 => Just(PoolOp::Cleanup),
        1 => any::<Index>().prop_map(PoolOp::Cancel),
    ]
}

fn pool_op() -> impl Strategy<Value = PoolOp> {
    prop_oneof![
        8 => leaf_op(),
        1 => (prop::collection::vec(leaf_op(), 0..20), any::<Index>())
            .prop_map(|(ops, at)| PoolOp::Sub(ops, at)),
    ]
}

/// What one pool has been given since its last clear, to check it against.
struct Round<'p> {
    /// Live allocations: start, length, fill byte.
    allocs: Vec<(NonNull<u8>, usize, u8)>,
    /// Ids of cleanups and owned values in registration order, cancelled ones removed.
    registered: Vec<u32>,
    /// Keys of this round's cleanups not cancelled yet, with their ids.
    keys: Vec<(CleanupKey<'p>, u32)>,
    /// Bytes asked for (a lower bound on `used_bytes`).
    asked: usize,
}

impl Round<'_> {
    fn new() -> Self {
        Round {
            allocs: Vec::new(),
            registered: Vec::new(),
            keys: Vec::new(),
            asked: 0,
        }
    }

    fn check_intact(&self) {
        for &(p, len, fill) in &self.allocs {
            // SAFETY: a live allocation of `len` bytes of this round's pool, written once.
            let bytes = unsafe { std::slice::from_raw_parts(p.as_ptr(), len) };
            // Compared as slices (`memset`, `memcmp`): byte loops are slow in debug builds.
            assert!(bytes == vec![fill; len], "an allocation was overwritten");
        }
    }
}

struct PoolModel {
    log: Arc<Mutex<Vec<u32>>>,
    counts: Arc<Counts>,
    next_id: u32,
    step: u8,
}

impl PoolModel {
    fn run<'p>(&mut self, pool: &'p Pool<'_>, round: &mut Round<'p>, op: &PoolOp) {
        self.step = self.step.wrapping_add(1);
        match op {
            PoolOp::Alloc { size, align_log2 } => {
                let layout = Layout::from_size_align(*size, 1 << align_log2).unwrap();
                let p = pool.alloc_layout(layout);
                assert_eq!(p.as_ptr().addr() % layout.align(), 0, "{layout:?}");
                // SAFETY: a fresh allocation of `size` bytes.
                unsafe { p.as_ptr().write_bytes(self.step, *size) };
                round.allocs.push((p, *size, self.step));
                round.asked += size;
            }
            PoolOp::Owned => {
                let id = self.id();
                let t = pool.alloc_owned(Token::new(&self.counts, Some((self.log.clone(), id))));
                assert_eq!(t.log.as_ref().unwrap().1, id);
                round.registered.push(id);
            }
            PoolOp::Cleanup => {
                let id = self.id();
                let log = self.log.clone();
                let token = Token::new(&self.counts, None);
                let key = pool.on_clear(move || {
                    log.lock().unwrap().push(id);
                    drop(token);
                });
                round.registered.push(id);
                round.keys.push((key, id));
            }
            PoolOp::Cancel(i) if !round.keys.is_empty() => {
                let (key, id) = round.keys.remove(i.index(round.keys.len()));
                let dropped = self.counts.dropped.load(Ordering::Relaxed);
                pool.cancel(key);
                assert_eq!(
                    self.counts.dropped.load(Ordering::Relaxed),
                    dropped + 1,
                    "a cancelled cleanup's closure is dropped at once"
                );
                round.registered.retain(|&r| r != id);
            }
            PoolOp::Cancel(_) => {}
            PoolOp::Sub(ops, clear_at) => {
                let mut sub = pool.subpool();
                let (before, after) = ops.split_at(clear_at.index(ops.len() + 1));
                let mut first = Round::new();
                for op in before {
                    self.run(&sub, &mut first, op);
                }
                // The round's borrows of the subpool end before it is cleared.
                let registered = first.registered;
                let from = self.log.lock().unwrap().len();
                sub.clear();
                check_ran(&self.log, from, &registered);
                assert_eq!((sub.stats().used_bytes, sub.stats().cleanups), (0, 0));
                let mut second = Round::new();
                for op in after {
                    self.run(&sub, &mut second, op);
                }
                let registered = second.registered;
                let from = self.log.lock().unwrap().len();
                drop(sub);
                check_ran(&self.log, from, &registered);
            }
        }
        round.check_intact();
        let s = pool.stats();
        assert!(s.used_bytes >= round.asked, "{s:?} < {}", round.asked);
        assert_eq!(s.cleanups, round.registered.len());
        assert!(s.high_water >= s.used_bytes);
    }

    fn id(&mut self) -> u32 {
        self.next_id += 1;
        self.next_id
    }
}

/// The log's entries from `from` on are `registered`, last first.
fn check_ran(log: &Mutex<Vec<u32>>, from: usize, registered: &[u32]) {
    let log = log.lock().unwrap();
    let expected: Vec<u32> = registered.iter().rev().copied().collect();
    assert_eq!(log[from..], expected, "cleanups and owned drops run LIFO");
}

/// Runs rounds of operations on a pool, clearing it after each round but the last,
/// which ends with the pool's drop.
fn pool_matches_model(rounds: &[Vec<PoolOp>]) {
    let src = BlockSource::new(256 << 10);
    let mut model = PoolModel {
        log: Arc::new(Mutex::new(Vec::new())),
        counts: Arc::new(Counts::default()),
        next_id: 0,
        step: 0,
    };
    let mut pool = Pool::with_source(&src);
    for ops in rounds {
        let mut round = Round::new();
        for op in ops {
            model.run(&pool, &mut round, op);
        }
        let registered = round.registered;
        let from = model.log.lock().unwrap().len();
        pool.clear();
        check_ran(&model.log, from, &registered);
        let s = pool.stats();
        assert_eq!((s.used_bytes, s.cleanups), (0, 0));
        assert!(s.blocks <= 1, "clear keeps only the first block: {s:?}");
    }
    // The pool's drop runs what is registered then, last first, as a clear does.
    let mut round = Round::new();
    for op in rounds.last().into_iter().flatten() {
        model.run(&pool, &mut round, op);
    }
    let registered = round.registered;
    let from = model.log.lock().unwrap().len();
    drop(pool);
    check_ran(&model.log, from, &registered);
    let made = model.counts.made.load(Ordering::Relaxed);
    assert_eq!(
        model.counts.dropped.load(Ordering::Relaxed),
        made,
        "every value dropped exactly once"
    );
    src.trim();
    for s in src.stats() {
        assert_eq!(s.live, 0, "a block was not returned: {s}");
    }
}

proptest! {
    #![proptest_config(config())]

    #[test]
    fn pools_keep_allocations_intact_and_run_cleanups_lifo(
        rounds in prop::collection::vec(prop::collection::vec(pool_op(), 0..OPS / 2), 1..4)
    ) {
        pool_matches_model(&rounds);
    }
}

// ---------------------------------------------------------------------------------------
// `&Pool` as an allocator-api2 allocator, called directly, and hashbrown in a pool

#[derive(Clone, Debug)]
enum RawOp {
    Alloc {
        size: usize,
        align_log2: u8,
        zeroed: bool,
    },
    /// Grows a live block by `by` bytes to alignment `1 << align_log2`.
    Grow {
        which: Index,
        by: usize,
        align_log2: u8,
    },
    /// Shrinks a live block to `to` of its bytes (an index into `0..=size`).
    Shrink {
        which: Index,
        to: Index,
        align_log2: u8,
    },
    Dealloc(Index),
}

fn raw_op() -> impl Strategy<Value = RawOp> {
    let big = if cfg!(miri) { 3000 } else { 70_000 };
    prop_oneof![
        4 => (0usize..300, 0u8..8, any::<bool>())
            .prop_map(|(size, align_log2, zeroed)| RawOp::Alloc { size, align_log2, zeroed }),
        3 => (any::<Index>(), 0usize..500, 0u8..8)
            .prop_map(|(which, by, align_log2)| RawOp::Grow { which, by, align_log2 }),
        1 => (any::<Index>(), 500usize..big, 0u8..8)
            .prop_map(|(which, by, align_log2)| RawOp::Grow { which, by, align_log2 }),
        2 => (any::<Index>(), any::<Index>(), 0u8..8)
            .prop_map(|(which, to, align_log2)| RawOp::Shrink { which, to, align_log2 }),
        2 => any::<Index>().prop_map(RawOp::Dealloc),
    ]
}

/// A live block from the allocator, and the bytes it must hold.
struct Block {
    ptr: NonNull<u8>,
    layout: Layout,
    bytes: Vec<u8>,
}

/// Fills `block`'s bytes from `from` on with a pattern of `seed`, in memory and in the
/// model.
fn fill(block: &mut Block, from: usize, seed: u8) {
    for i in from..block.layout.size() {
        let b = seed.wrapping_mul(31).wrapping_add(i as u8);
        // SAFETY: inside the block, which is live.
        unsafe { block.ptr.as_ptr().add(i).write(b) };
    }
    block.bytes.resize(block.layout.size(), 0);
    for (i, b) in block.bytes.iter_mut().enumerate().skip(from) {
        *b = seed.wrapping_mul(31).wrapping_add(i as u8);
    }
}

fn allocator_matches_model(ops: &[RawOp]) {
    let src = BlockSource::new(1 << 20);
    let pool = Pool::with_source(&src);
    let a = &pool;
    let mut live: Vec<Block> = Vec::new();
    for (step, op) in ops.iter().enumerate() {
        let seed = step as u8;
        match *op {
            RawOp::Alloc {
                size,
                align_log2,
                zeroed,
            } => {
                let layout = Layout::from_size_align(size, 1 << align_log2).unwrap();
                let p = if zeroed {
                    a.allocate_zeroed(layout)
                } else {
                    a.allocate(layout)
                }
                .unwrap();
                assert!(p.len() >= size);
                let mut block = Block {
                    ptr: p.cast(),
                    layout,
                    bytes: Vec::new(),
                };
                if zeroed {
                    // SAFETY: a fresh allocation of `size` bytes.
                    let got = unsafe { std::slice::from_raw_parts(block.ptr.as_ptr(), size) };
                    assert!(got.iter().all(|&b| b == 0), "allocate_zeroed");
                    block.bytes = vec![0; size];
                } else {
                    fill(&mut block, 0, seed);
                }
                live.push(block);
            }
            RawOp::Grow {
                which,
                by,
                align_log2,
            } if !live.is_empty() => {
                let i = which.index(live.len());
                let block = &mut live[i];
                let old = block.layout;
                let new = Layout::from_size_align(old.size() + by, 1 << align_log2).unwrap();
                // SAFETY: a live block of `old` from this allocator, growing.
                let p = unsafe { a.grow(block.ptr, old, new) }.unwrap();
                assert!(p.len() >= new.size());
                block.ptr = p.cast();
                block.layout = new;
                fill(block, old.size(), seed);
            }
            RawOp::Shrink {
                which,
                to,
                align_log2,
            } if !live.is_empty() => {
                let i = which.index(live.len());
                let block = &mut live[i];
                let old = block.layout;
                let new =
                    Layout::from_size_align(to.index(old.size() + 1), 1 << align_log2).unwrap();
                // SAFETY: a live block of `old` from this allocator, shrinking.
                let p = unsafe { a.shrink(block.ptr, old, new) }.unwrap();
                assert!(p.len() >= new.size());
                block.ptr = p.cast();
                block.layout = new;
                block.bytes.truncate(new.size());
            }
            RawOp::Dealloc(which) if !live.is_empty() => {
                let block = live.swap_remove(which.index(live.len()));
                // SAFETY: a live block of this layout from this allocator, not used again.
                unsafe { a.deallocate(block.ptr, block.layout) };
            }
            RawOp::Grow { .. } | RawOp::Shrink { .. } | RawOp::Dealloc(_) => {}
        }
        for block in &live {
            assert_eq!(block.ptr.as_ptr().addr() % block.layout.align(), 0);
            // SAFETY: a live block of `layout.size()` bytes.
            let got = unsafe { std::slice::from_raw_parts(block.ptr.as_ptr(), block.bytes.len()) };
            assert!(got == block.bytes, "a block lost its bytes after {op:?}");
        }
    }
}

#[derive(Clone, Debug)]
enum MapOp {
    Insert(u16, u64),
    Remove(u16),
    Retain(u16),
    ShrinkToFit,
    Clear,
}

fn map_op() -> impl Strategy<Value = MapOp> {
    prop_oneof![
        8 => (0u16..300, any::<u64>()).prop_map(|(k, v)| MapOp::Insert(k, v)),
        3 => (0u16..300).prop_map(MapOp::Remove),
        1 => (1u16..5).prop_map(MapOp::Retain),
        1 => Just(MapOp::ShrinkToFit),
        1 => Just(MapOp::Clear),
    ]
}

fn hashbrown_matches_std(ops: &[MapOp]) {
    let src = BlockSource::new(1 << 20);
    let pool = Pool::with_source(&src);
    let mut map = hashbrown::HashMap::new_in(&pool);
    let mut model = std::collections::HashMap::new();
    for op in ops {
        match *op {
            MapOp::Insert(k, v) => assert_eq!(map.insert(k, v), model.insert(k, v)),
            MapOp::Remove(k) => assert_eq!(map.remove(&k), model.remove(&k)),
            MapOp::Retain(m) => {
                map.retain(|k, _| k % m != 0);
                model.retain(|k, _| k % m != 0);
            }
            MapOp::ShrinkToFit => map.shrink_to_fit(),
            MapOp::Clear => {
                map.clear();
                model.clear();
            }
        }
        assert_eq!(map.len(), model.len());
        assert!(model.iter().all(|(k, v)| map.get(k) == Some(v)));
    }
}

proptest! {
    #![proptest_config(config())]

    #[test]
    fn pool_as_an_allocator_keeps_bytes_and_alignment(ops in prop::collection::vec(raw_op(), 0..OPS)) {
        allocator_matches_model(&ops);
    }

    #[test]
    fn hashbrown_in_a_pool_matches_std(ops in prop::collection::vec(map_op(), 0..OPS * 2)) {
        hashbrown_matches_std(&ops);
    }
}
