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

copy() { # NAME -> a fresh copy of the tree at $work/NAME (newer than the last build)
    rm -rf "${work:?}/$1"
    mkdir -p "$work/$1"
    git -C "$root" ls-files -z | (cd "$root" && xargs -0 tar -c) | tar -x -C "$work/$1"
    find "$work/$1" -type f -exec touch {} +
}

mkdir -p "$work"
copy clean
tests "$work/clean" || { echo "the unseeded tree fails the tests: $work/clean.log"; exit 1; }
echo "unseeded: passes"
missed=0
for i in "${!names[@]}"; do
    name=${names[$i]}
    if [ $# -gt 0 ] && ! printf '%s\n' "$@" | grep -qx "$name"; then continue; fi
    copy "$name"
    python3 - "$work/$name/${files[$i]}" "${olds[$i]}" "${news[$i]}" <<'PY'
import sys
path, old, new = sys.argv[1:4]
s = open(path).read()
assert old in s, f"the seed does not apply: {old!r}"
open(path, 'w').write(s.replace(old, new, 1))
PY
    if tests "$work/$name"; then
        echo "$name: MISSED"
        missed=1
    elif grep -q "could not compile" "$work/$name.log"; then
        echo "$name: the seeded copy does not build ($work/$name.log)"
        missed=1
    else
        why=$(grep -m1 -E "^test .* FAILED|panicked at|signal: [0-9]+" "$work/$name.log" | cut -c1-120 || true)
        echo "$name: caught (${why:-see $work/$name.log})"
    fi
done
exit $missed
