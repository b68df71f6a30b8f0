#!/usr/bin/env bash
# Seeds each bug of the pooled-buffer list into a copy of this tree and checks that the
# buffer tests (tests/buffers.rs and the unit tests in src/buffer/) fail on it:
#
#   tools/seeds/buffers.sh [SEED...]     # every seed, or the ones named
#
# Prints one line per seed, caught or missed, and fails if a seed is missed or does not
# build. The unseeded tree must pass. (Not run by CI: eleven builds of the test binary.)
set -euo pipefail
root=$(git -C "$(dirname "$0")" rev-parse --show-toplevel)
work=$root/target/seeds-buffers
buf=src/buffer/buf.rs
alloc=src/buffer/mod.rs
leaks=src/buffer/leaks.rs

# Each seed: file, the text it replaces, and the replacement (first occurrence).
names=() files=() olds=() news=()
seed() { names+=("$1"); files+=("$2"); olds+=("$3"); news+=("$4"); }
seed frozen-drop-leaks-the-slot $buf "        Bytes::from_owner(Frozen(self))" \
    "        let b = Bytes::copy_from_slice(&self); std::mem::forget(self); b"
seed growth-keeps-the-old-slot $buf "            alloc.free_parts(&Parts {" "            drop(&Parts {"
seed growth-copies-a-byte-short $buf ".copy_from_nonoverlapping(self.mem.ptr.as_ptr(), self.len)" \
    ".copy_from_nonoverlapping(self.mem.ptr.as_ptr(), self.len.saturating_sub(1))"
seed class-one-too-small $alloc "        Some((usize::BITS - (capacity - 1).leading_zeros()) as usize - 9)" \
    "        Some((usize::BITS - capacity.leading_zeros()) as usize - 9)"
seed advance-past-the-capacity $buf "        assert!(
            cnt <= spare," "        debug_assert!(
            cnt <= spare || true,"
seed full-buffer-gives-an-empty-chunk $buf "        if self.len == self.cap {" "        if false {"
seed zero-capacity-accepted $alloc "            Some(0) if capacity == 0 => return Err(BufferError::ZeroCapacity)," \
    "            Some(0) if capacity == 0 && false => return Err(BufferError::ZeroCapacity),"
seed oversize-free-not-counted $alloc "                o.frees.fetch_add(1, Ordering::Relaxed);" \
    "                o.frees.fetch_add(0, Ordering::Relaxed);"
seed tracked-free-not-forgotten $alloc "        if parts.tracked {" "        if parts.tracked && false {"
seed record-lost-on-growth $buf "            alloc.leaks.moved(old.ptr, new.ptr, new.cap);" "            let _ = (old.ptr, new.ptr, new.cap);"
seed free-to-the-wrong-class $alloc "        match class_of(parts.cap) {" "        match class_of(parts.cap).map(|c| c.saturating_sub(1)) {"
seed sampling-every-nth $leaks "            x % u64::from(LeakLevel::SAMPLE_INTERVAL) == 0" \
    "            { thread_local!(static N: Cell<u64> = const { Cell::new(0) }); N.with(|n| { n.set(n.get() + 1); n.get() % 128 == 1 }) }"

tests() { # DIR -> 0 if the tests pass
    (cd "$1" && CARGO_TARGET_DIR=$work/target timeout 600 cargo test -q --test buffers >"$1.log" 2>&1 &&
        CARGO_TARGET_DIR=$work/target timeout 600 cargo test -q --lib buffer:: >>"$1.log" 2>&1)
}

# shellcheck source=replace-one.sh
source "$(dirname "$0")/replace-one.sh"
run_seeds "$@"
