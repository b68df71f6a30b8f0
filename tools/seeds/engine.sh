#!/usr/bin/env bash
# Seeds bugs into the engine's shared pieces (the exchange rules, the two kinds of owner
# that use them, the counter list, the idle snapshot) in a copy of this tree and checks
# that the tests fail on each:
#
#   tools/seeds/engine.sh [SEED...]     # every seed, or the ones named
#
# Prints one line per seed, caught or missed, and fails if a seed is missed or does not
# build. The unseeded tree must pass. (Not run by CI: a build of every test per seed.)
set -euo pipefail
root=$(git -C "$(dirname "$0")" rev-parse --show-toplevel)
work=$root/target/seeds-engine
rules=src/core/exchange.rs

# Each seed: file, the text it replaces, and the replacement (first occurrence).
names=() files=() olds=() news=()
seed() { names+=("$1"); files+=("$2"); olds+=("$3"); news+=("$4"); }
# The rules: a refill that swaps in an empty previous magazine.
seed swap-with-empty-previous $rules "if self.previous_len().is_some_and(|n| n > 0) {" \
    "if self.previous_len().is_some() {"
# The rules: a make-room that swaps in a full previous magazine.
seed swap-with-full-previous $rules "if self.previous_len().is_some_and(|n| n < self.capacity) {" \
    "if self.previous_len().is_some_and(|n| n <= self.capacity) {"
# The rules: what the depot's budget refused is never released.
seed evictions-dropped $rules "evictions.push(supply.give_full(previous));" \
    "let _ = supply.give_full(previous);"
# A thread cache's supply: a spill the stash could not take is not noted (no growth).
seed spill-not-noted src/core/engine/supply.rs "        c.note_spill();
" ""
# The pair: a rotation that drops the loaded magazine instead of keeping it.
seed rotate-loses-loaded $rules \
    "        self.previous = self.loaded.replace(mag);" "        self.loaded = Some(mag);"
# A thread cache's pair: packing loses the previous magazine.
seed pack-loses-previous src/core/thread_cache/owner_part.rs \
    "            previous: own(self.take_previous())," "            previous: None,"
# The counter list: the dump's columns forget the counters (header and values disagree).
seed dump-columns-forgotten src/stats/table.rs \
    "                \$(\$(#[\$attr])* v.push(&mut self.\$name);)*" ""
# The idle snapshot: trim_idle never records what it saw.
seed trim-seen-never-updated src/core/admin.rs \
    "if listed.trim_seen.replace(now) == Some(now) {" "if listed.trim_seen == Some(now) {"

tests() { # DIR -> 0 if the tests pass
    (cd "$1" && CARGO_TARGET_DIR=$work/target timeout 900 cargo test -q >"$1.log" 2>&1)
}

# shellcheck source=replace-one.sh
source "$(dirname "$0")/replace-one.sh"
run_seeds "$@"
