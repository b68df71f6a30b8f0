# The runner shared by the seed scripts whose seeds each replace one text (sourced by
# buffers.sh and engine.sh). They define `root`, `work`, the seed arrays (`names`,
# `files`, `olds`, `news`) and `tests DIR` (0 if the tests pass in DIR), then call
# `run_seeds "$@"`: a fresh copy of the tree per seed, the unseeded copy first (it must
# pass), one line per seed, and a failing status if a seed is missed or does not build.

copy() { # NAME -> a fresh copy of the tree at $work/NAME (newer than the last build)
    rm -rf "${work:?}/$1"
    mkdir -p "$work/$1"
    git -C "$root" ls-files -z | (cd "$root" && xargs -0 tar -c) | tar -x -C "$work/$1"
    find "$work/$1" -type f -exec touch {} +
}

run_seeds() { # [SEED...] -> every seed, or the ones named
    mkdir -p "$work"
    copy clean
    tests "$work/clean" || { echo "the unseeded tree fails the tests: $work/clean.log"; exit 1; }
    echo "unseeded: passes"
    local missed=0 i name why
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
}
