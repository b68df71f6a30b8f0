#!/usr/bin/env bash
# Seeds each bug of the per-CPU sequences' list into a copy of this tree and checks that
# the injection test (core::percpu::injection_tests) fails on it, in every run:
#
#   tools/seeds/percpu.sh [RUNS]      # default 3 runs of each seeded copy
#
# The seeds: a pop's commit before its last load; an abort handler that restarts
# without arming again; a reclaim without the fence; the capacity read before the
# sequence; a push that stores its slot after its commit. The unseeded tree must pass.
# Prints one line per seed: caught in N of RUNS runs; fails unless every seed is caught
# in every run. CI runs it once per seed.
set -euo pipefail
runs=${1:-3}
root=$(git -C "$(dirname "$0")" rev-parse --show-toplevel)
work=$root/target/seeds
seq=src/core/rseq/platform/x86_64.rs
percpu=src/core/percpu/mod.rs

# Each seed: a name and a Python snippet that edits the copy (run in its root).
declare -A seeds
seeds[commit-before-last-load]="
p='$seq'; s=open(p).read()
old='''                \"mov {t}, qword ptr [{t} + {l} * 8]\",
                \"add {w}, 0xffff\",
                delay!(),
                \"mov qword ptr [{cache}], {w}\",'''
new='''                \"add {w}, 0xffff\",
                delay!(),
                \"mov qword ptr [{cache}], {w}\",
                \"mov {t}, qword ptr [{t} + {l} * 8]\",'''
assert old in s; open(p,'w').write(s.replace(old,new))"
seeds[handler-skips-the-arming]="
p='$seq'; s=open(p).read()
old='''\"lock inc qword ptr [rip + {aborts}]\\\\n\",
            \"jmp 2b\\\\n\",'''
new='''\"lock inc qword ptr [rip + {aborts}]\\\\n\",
            \"jmp 4b\\\\n\",'''
assert old in s, old; open(p,'w').write(s.replace(old,new))"
seeds[reclaim-without-the-fence]="
p='$percpu'; s=open(p).read()
old='''        if rseq::fence_cpu(cpu).is_err() {'''
new='''        if false && rseq::fence_cpu(cpu).is_err() {'''
assert old in s; open(p,'w').write(s.replace(old,new))"
seeds[capacity-read-before-the-sequence]="
p='$seq'; s=open(p).read()
old='''pub(crate) unsafe fn push(area: *mut u8, cpu: u32, cache: usize, p: *mut u8) -> bool {
    let ok: u64;'''
new='''pub(crate) unsafe fn push(area: *mut u8, cpu: u32, cache: usize, p: *mut u8) -> bool {
    let ok: u64;
    let cap = unsafe { (cache as *const u32).add(4).read_volatile() };'''
assert old in s; s=s.replace(old,new)
old='''                \"cmp {l:e}, dword ptr [{cache} + 16]\",
                \"jae 9f\",
                \"mov {t}, qword ptr [{cache} + 8]\",
                \"mov qword ptr [{t} + {l} * 8], {p}\",'''
new='''                \"cmp {l:e}, {cap:e}\",
                \"jae 9f\",
                \"mov {t}, qword ptr [{cache} + 8]\",
                \"mov qword ptr [{t} + {l} * 8], {p}\",'''
assert old in s; s=s.replace(old,new)
old='''            p = in(reg) p,
            t = out(reg) ok,'''
new='''            p = in(reg) p,
            cap = in(reg) cap,
            t = out(reg) ok,'''
assert old in s; open(p,'w').write(s.replace(old,new))"
seeds[push-slot-after-commit]="
p='$seq'; s=open(p).read()
old='''                \"mov qword ptr [{t} + {l} * 8], {p}\",
                \"mov {t:e}, 1\",
                \"add {w}, 0x10001\",
                delay!(),
                \"mov qword ptr [{cache}], {w}\",
            ),'''
new='''                \"add {w}, 0x10001\",
                delay!(),
                \"mov qword ptr [{cache}], {w}\",
                \"mov qword ptr [{t} + {l} * 8], {p}\",
                \"mov {t:e}, 1\",
            ),'''
assert old in s; open(p,'w').write(s.replace(old,new))"

test_once() { # DIR -> 0 if the test passed
    (cd "$1" && CARGO_TARGET_DIR=$work/target timeout 600 cargo test -q --lib -- \
        core::percpu::injection_tests >"$1.log" 2>&1)
}
builds() { # DIR -> 0 if the test builds (a seed that does not compile is a broken seed)
    (cd "$1" && CARGO_TARGET_DIR=$work/target cargo test -q --lib --no-run >"$1.log" 2>&1)
}

mkdir -p "$work"
copy() { # NAME -> a fresh copy of the tree at $work/NAME
    rm -rf "$work/$1"
    mkdir -p "$work/$1"
    git -C "$root" ls-files -z | (cd "$root" && xargs -0 tar -c) | tar -x -C "$work/$1"
    # Every copy builds to the same test binary (the shared target dir, one package):
    # files newer than it, or cargo would take the last copy's build for this one's.
    find "$work/$1" -type f -exec touch {} +
}

copy clean
test_once "$work/clean" || { echo "the unseeded tree fails the test: $work/clean.log"; exit 1; }
echo "unseeded: passes"
missed=0
for name in "${!seeds[@]}"; do
    copy "$name"
    (cd "$work/$name" && python3 -c "${seeds[$name]}")
    builds "$work/$name" || { echo "$name: the seeded copy does not build: $work/$name.log"; missed=1; continue; }
    caught=0
    for _ in $(seq 1 "$runs"); do
        test_once "$work/$name" || caught=$((caught + 1))
    done
    why=$(grep -m1 -E "assertion|double free|signal: [0-9]+" "$work/$name.log" | cut -c1-160 || true)
    echo "$name: caught in $caught of $runs runs (${why:-see $work/$name.log})"
    [ "$caught" = "$runs" ] || missed=1
done
exit $missed
