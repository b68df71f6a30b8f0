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
# [--only NAME,..] [--work TEXT,..] [--all]`; ROUNDS defaults to 30). It prints the
# table of interleaved ratios: new / old per workload and handle (the min over the
# samples for one thread, the median for two), each build against its floor, and the
# floor's own new / old (the same code in both builds: the run's noise).
#
# AB_FEATURES=percpu adds per-CPU allocators (both commits need CacheMode::PerCpu).
# AB_OLD_FEATURES and AB_NEW_FEATURES set one side's features (default AB_FEATURES), so
# one tree can be measured against itself with other features: `percpu,proxalloc/percpu`
# builds the library with its own `percpu` feature too (per-CPU sequences inline).
# AB_OLD_ENV and AB_NEW_ENV (default AB_ENV) are `NAME=VALUE` words set for that side's
# cargo build, so one tree can be measured against itself in another build profile:
# AB_NEW_ENV=CARGO_PROFILE_RELEASE_CODEGEN_UNITS=1 (one codegen unit).
# Sources and builds are kept under target/ab/ (a commit's build is reused); the
# samples of each A/B are kept in target/ab/runs/<time>/.
set -euo pipefail
shopt -s inherit_errexit

usage() {
    sed -n '2,24p' "$0" | sed 's/^# \{0,1\}//' >&2
    exit 2
}
fail() {
    echo "ab.sh: $*" >&2
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
if [ $# -gt 0 ]; then
    [ "$1" = -- ] || usage
    shift
fi
run_args=("$@")
# ROUNDS defaults to 30 here (the harness's own default is 10) when none is given.
has_rounds=0
skip=0
for a in "${run_args[@]}"; do
    if [ $skip = 1 ]; then
        skip=0
    elif [[ $a == --only || $a == --work ]]; then
        skip=1
    elif [[ $a != --* ]]; then
        has_rounds=1
    fi
done
[ $has_rounds = 1 ] || run_args=(30 "${run_args[@]}")
[[ $runs =~ ^[0-9]+$ ]] && [ "$runs" -gt 0 ] || fail "RUNS is a positive number"
features=${AB_FEATURES:-}
old_features=${AB_OLD_FEATURES-$features}
new_features=${AB_NEW_FEATURES-$features}
build_env=${AB_ENV:-}
old_env=${AB_OLD_ENV-$build_env}
new_env=${AB_NEW_ENV-$build_env}
for word in $old_env $new_env; do
    [[ $word =~ ^[A-Z_][A-Z0-9_]*=[^[:space:]]*$ ]] || fail "AB_*ENV takes NAME=VALUE words, not $word"
done
[ "$old" != . ] || [ "$new" != . ] || [ "$old_features" != "$new_features" ] ||
    [ "$old_env" != "$new_env" ] ||
    fail "OLD and NEW are both the working tree, with the same features and build environment"

root=$(git -C "$(dirname "$0")" rev-parse --show-toplevel)
out=$root/target/ab

# Builds the harness against `$1`'s library into `$2` (a file this script owns, removed
# first, so a failed build can never leave an older binary to be measured), with the
# harness features `$3` and the build environment `$4` (NAME=VALUE words).
build() {
    local rev=$1 dest=$2 features=$3 build_env=$4 tree key tmp
    rm -f "$dest"
    if [ "$rev" = . ]; then
        tree=$root
        key=worktree
    else
        key=$(git -C "$root" rev-parse --verify --quiet "$rev^{commit}") ||
            fail "$rev is not a commit"
        tree=$out/src/$key
        if [ ! -f "$tree/.ab-complete" ]; then
            # Extracted beside and moved into place, so an interrupted extraction is
            # never taken for a whole tree.
            rm -rf "$tree" "$tree.tmp"
            mkdir -p "$tree.tmp"
            git -C "$root" archive "$key" | tar -x -C "$tree.tmp"
            touch "$tree.tmp/.ab-complete"
            mv "$tree.tmp" "$tree"
        fi
        # This checkout's harness, whatever the commit had.
        rm -rf "$tree/tools/ab"
        mkdir -p "$tree/tools/ab"
        tar -C "$root/tools/ab" -c Cargo.toml Cargo.lock src | tar -x -C "$tree/tools/ab"
    fi
    echo "ab.sh: building the harness against $rev${features:+ with $features}${build_env:+ ($build_env)}" >&2
    # Features and the build environment change the code: each has its own build.
    key=$key${features:+-${features//[,\/]/-}}
    [ -z "$build_env" ] || key=$key-env-$(printf '%s' "$build_env" | cksum | cut -d' ' -f1)
    # shellcheck disable=SC2086 # NAME=VALUE words, checked above
    env $build_env CARGO_TARGET_DIR="$out/build/$key" cargo build --release --quiet \
        --manifest-path "$tree/tools/ab/Cargo.toml" ${features:+--features "$features"} >&2 ||
        fail "the build against $rev failed"
    cp "$out/build/$key/release/proxalloc-ab" "$dest"
}

label() {
    local features=${2:+, features $2}${3:+, $3}
    if [ "$1" != . ]; then
        echo "$1 ($(git -C "$root" rev-parse --short "$1^{commit}")$features)"
    elif [ -n "$(git -C "$root" status --porcelain -- . ':!tools/ab')" ]; then
        echo "working tree ($(git -C "$root" rev-parse --short HEAD) + changes$features)"
    else
        echo "working tree ($(git -C "$root" rev-parse --short HEAD) unchanged$features)"
    fi
}

dir=$out/runs/$(date +%Y%m%d-%H%M%S)
mkdir -p "$dir"
# Each side's binary is copied out of its build folder: the working tree's is rebuilt
# in place by the next A/B, and each run must stay on one build.
build "$old" "$dir/old-bin" "$old_features" "$old_env"
build "$new" "$dir/new-bin" "$new_features" "$new_env"

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
"$dir/new-bin" report "$dir/old.tsv" "$dir/new.tsv" --old-label "$(label "$old" "$old_features" "$old_env")" --new-label "$(label "$new" "$new_features" "$new_env")"
# The samples stay; the binaries (tens of MB with their debug info) go.
rm -f "$dir/old-bin" "$dir/new-bin"
