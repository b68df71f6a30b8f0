#!/usr/bin/env bash
# The fast paths' wall-time A/B, in one command:
#
#   tools/ab/ab.sh OLD NEW [RUNS] [-- RUN_ARGS..]
#
# OLD and NEW are commits (anything `git rev-parse` takes), or `.` for the working tree
# as it is, uncommitted changes included. This checkout's harness (tools/ab) is built
# against the library of each, so both builds run the same workloads; the two builds
# then run in alternation (ABBA order), RUNS times each (default 20), each run taking
# ROUNDS samples of every cell (RUN_ARGS are the harness's `run` arguments: `[ROUNDS]
# [--only NAME,..] [--work TEXT,..]`; default 30 rounds). It prints the table of
# interleaved ratios: new / old per workload and handle (the min over the samples for
# one thread, the median for two), each build against its floor, and the floor's own
# new / old (the same code in both builds: the run's noise).
#
# AB_FEATURES=percpu adds per-CPU allocators (both commits need CacheMode::PerCpu).
# Sources and builds are kept under target/ab/ (a commit's build is reused); the
# samples of each A/B are kept in target/ab/runs/<time>/.
set -euo pipefail

usage() {
    sed -n '2,19p' "$0" | sed 's/^# \{0,1\}//' >&2
    exit 2
}

[ $# -ge 2 ] || usage
old=$1
new=$2
shift 2
runs=20
if [ $# -gt 0 ] && [ "$1" != -- ]; then
    runs=$1
    shift
fi
[ $# -eq 0 ] || { [ "$1" = -- ] && shift; } || usage
run_args=("$@")
[ ${#run_args[@]} -gt 0 ] || run_args=(30)
[[ $runs =~ ^[0-9]+$ ]] && [ "$runs" -gt 0 ] || { echo "ab.sh: RUNS is a positive number" >&2; exit 2; }

root=$(git -C "$(dirname "$0")" rev-parse --show-toplevel)
out=$root/target/ab
features=${AB_FEATURES:-}

# Builds the harness against `$1`'s library; prints the binary's path.
build() {
    local rev=$1 tree key
    if [ "$rev" = . ]; then
        tree=$root
        key=worktree
    else
        key=$(git -C "$root" rev-parse --verify --quiet "$rev^{commit}") ||
            { echo "ab.sh: $rev is not a commit" >&2; exit 2; }
        tree=$out/src/$key
        if [ ! -f "$tree/Cargo.toml" ]; then
            rm -rf "$tree"
            mkdir -p "$tree"
            git -C "$root" archive "$key" | tar -x -C "$tree"
        fi
        # This checkout's harness, whatever the commit had.
        rm -rf "$tree/tools/ab"
        mkdir -p "$tree/tools/ab"
        tar -C "$root/tools/ab" -c Cargo.toml Cargo.lock src | tar -x -C "$tree/tools/ab"
    fi
    echo "ab.sh: building the harness against $rev" >&2
    CARGO_TARGET_DIR=$out/build/$key cargo build --release --quiet \
        --manifest-path "$tree/tools/ab/Cargo.toml" ${features:+--features "$features"} >&2
    echo "$out/build/$key/release/proxalloc-ab"
}

label() {
    if [ "$1" = . ]; then
        echo "working tree ($(git -C "$root" rev-parse --short HEAD) + changes)"
    else
        echo "$1 ($(git -C "$root" rev-parse --short "$1^{commit}"))"
    fi
}

bin_old=$(build "$old")
bin_new=$(build "$new")
[ "$old" != . ] || [ "$new" != . ] || { echo "ab.sh: OLD and NEW are both the working tree" >&2; exit 2; }
# The working tree's binary is rebuilt in place: a copy keeps each run on one build.
dir=$out/runs/$(date +%Y%m%d-%H%M%S)
mkdir -p "$dir"
cp "$bin_old" "$dir/old-bin"
cp "$bin_new" "$dir/new-bin"

echo "ab.sh: $runs runs of each build, alternating; samples in $dir" >&2
echo "machine: $(uname -m), $(grep -m1 'model name' /proc/cpuinfo 2>/dev/null | cut -d: -f2 | sed 's/^ //'), $(nproc) CPUs, load $(cut -d' ' -f1-3 /proc/loadavg 2>/dev/null)"
for i in $(seq 1 "$runs"); do
    if [ $((i % 2)) -eq 1 ]; then order="old new"; else order="new old"; fi
    for side in $order; do
        "$dir/$side-bin" run "${run_args[@]}" >>"$dir/$side.tsv"
    done
    printf '.' >&2
done
echo >&2
echo "load after: $(cut -d' ' -f1-3 /proc/loadavg 2>/dev/null)"
echo
"$dir/new-bin" report "$dir/old.tsv" "$dir/new.tsv" --labels "$(label "$old"),$(label "$new")"
