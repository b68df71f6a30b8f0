#!/usr/bin/env python3
"""Draw src/'s structure from its imports: arrows between files, circles, arrows that run
back up, and files over the size limit.

Usage: python3 tools/house.py [--arrows]

Rooms are the top-level files and folders of src/, except that core/ is drawn one file
(or one subfolder) a room. Files under a `tests/` folder are not rooms; every other file's
imports, its inline `#[cfg(test)] mod tests` included, are its room's.
Every `crate::...` and `super::...` path is followed to the file that defines the name,
through `pub use` re-exports. "Back up" is judged against FLOORS below, the layering that
docs/design.md draws (lowest first): an arrow from a lower floor to a higher one runs back
up. Within one floor, arrows are free as long as they make no circle.
"""
import os
import re
import sys

SRC = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "src")
LIMIT = 600

# Lowest floor first; a room's floor is the first prefix it matches.
FLOORS = [
    ["sync.rs", "error.rs", "debug.rs", "core/ids.rs", "core/idle.rs"],
    ["core/backing.rs", "core/budget.rs", "core/magazine.rs", "core/counters.rs", "config.rs"],
    ["core/stack.rs"],
    ["core/depot.rs", "core/rseq/", "rows.rs"],
    ["registry.rs"],
    ["core/stash.rs", "core/exchange.rs"],
    ["core/thread_cache/", "core/percpu/"],
    ["core/admin.rs"],
    ["core/engine/"],
    ["core/table/"],
    ["core/cache/", "core/mod.rs"],
    ["stats/"],
    ["class/"],
    ["pool/"],
    ["buffer/"],
    ["lib.rs"],
]


def floor(room):
    for i, prefixes in enumerate(FLOORS):
        for p in prefixes:
            if room == p or (p.endswith("/") and room.startswith(p)):
                return i
    return None


def is_test(rel):
    return "tests" in rel.split("/")[:-1]


def room_of(rel):
    parts = rel.split("/")
    if len(parts) == 1:
        return rel
    if parts[0] == "core" and len(parts) > 1:
        return "core/" + parts[1] + ("/" if len(parts) > 2 else "")
    return parts[0] + "/"


def module_of(rel):
    p = rel[:-3].split("/")
    if p == ["lib"]:
        return ()
    if p[-1] == "mod":
        p = p[:-1]
    return tuple(p)


files = {}
for root, _, names in os.walk(SRC):
    for n in names:
        if n.endswith(".rs"):
            full = os.path.join(root, n)
            rel = os.path.relpath(full, SRC).replace(os.sep, "/")
            # comments (doc links included) are not imports
            files[rel] = re.sub(r"//[^\n]*", "", open(full).read())

mod_file = {module_of(r): r for r in files}

ITEM = re.compile(
    r"^\s*(?:#\[[^\]]*\]\s*)*(?:pub(?:\([^)]*\))?\s+)?(?:unsafe\s+)?(?:const\s+)?"
    r"(?:struct|enum|fn|trait|const|static|type|union|macro_rules!)\s+(?:ref\s+)?(\w+)",
    re.M,
)
defined = {r: set(ITEM.findall(t)) for r, t in files.items()}
# Items made inside macro bodies or cfg twins count too; good enough for a drawing.
USE = re.compile(r"\b(?:pub(?:\([^)]*\))?\s+)?use\s+([^;]+);", re.S)


def expand(tree):
    """`a::{b, c::{d, e}}` -> [a::b, a::c::d, a::c::e]."""
    tree = re.sub(r"\s+as\s+\w+", "", tree)
    tree = re.sub(r"\s+", "", tree)
    out = []

    def walk(prefix, s):
        depth, start, items = 0, 0, []
        for i, ch in enumerate(s):
            if ch == "{":
                depth += 1
            elif ch == "}":
                depth -= 1
            elif ch == "," and depth == 0:
                items.append(s[start:i])
                start = i + 1
        items.append(s[start:])
        for it in items:
            if not it:
                continue
            m = re.match(r"^(.*?)::\{(.*)\}$", it)
            if m:
                walk(prefix + m.group(1) + "::", m.group(2))
            elif it.startswith("{") and it.endswith("}"):
                walk(prefix, it[1:-1])
            else:
                out.append(prefix + it)

    walk("", tree)
    return out


reexports = {}  # (module, name) -> absolute path list
for r, t in files.items():
    mod = module_of(r)
    for m in USE.finditer(t):
        if not t[m.start():].startswith("pub"):
            continue
        for p in expand(m.group(1)):
            segs = p.split("::")
            name = segs[-1]
            if name in ("*", "self"):
                continue
            reexports[(mod, name)] = (segs, mod)


def absolutize(segs, mod):
    if segs[0] == "crate":
        return list(segs[1:])
    if segs[0] == "super":
        base = list(mod)
        while segs and segs[0] == "super":
            base = base[:-1]
            segs = segs[1:]
        return base + list(segs)
    if segs[0] == "self":
        return list(mod) + list(segs[1:])
    if (tuple(mod) + (segs[0],)) in mod_file:
        return list(mod) + list(segs)
    return None  # an external crate or a std path


# `#[macro_export]` macros live at the crate root but are defined where they are written
exported = {
    m.group(1): r
    for r, t in files.items()
    for m in re.finditer(r"#\[macro_export\]\s*(?:#\[[^\]]*\]\s*)*macro_rules!\s+(\w+)", t)
}


def resolve(path, depth=0):
    """Absolute segment list -> defining file, or None."""
    if depth > 8 or path is None:
        return None
    path = list(path)
    # the longest module prefix
    for k in range(len(path), -1, -1):
        mod = tuple(path[:k])
        if mod in mod_file:
            rest = path[k:]
            if not rest:
                return mod_file[mod]
            name = rest[0]
            f = mod_file[mod]
            if name in defined[f]:
                return f
            if not mod and name in exported:
                return exported[name]
            if (mod, name) in reexports:
                segs, at = reexports[(mod, name)]
                return resolve(absolutize(segs, at), depth + 1)
            return f
    return None


PATH = re.compile(r"\b((?:crate|super)(?:::\w+)+)")
arrows = {}
for r, t in files.items():
    mod = module_of(r)
    src_room = r
    # inline modules: positions of `mod x {` and their extents, for super:: inside them
    inline = []
    for m in re.finditer(r"\bmod\s+\w+\s*\{", t):
        depth, i = 1, m.end()
        while i < len(t) and depth:
            depth += {"{": 1, "}": -1}.get(t[i], 0)
            i += 1
        inline.append((m.start(), i))

    def mod_at(pos):
        extra = sum(1 for s, e in inline if s <= pos < e)
        return tuple(mod) + ("<inline>",) * extra

    refs = []
    for m in USE.finditer(t):
        for p in expand(m.group(1)):
            refs.append((p.split("::"), m.start()))
    text_no_use = USE.sub(lambda m: " " * len(m.group(0)), t)
    for m in PATH.finditer(text_no_use):
        refs.append((m.group(1).split("::"), m.start()))
    for segs, pos in refs:
        if segs[0] not in ("crate", "super", "self") and not any(
            (tuple(mod) + (segs[0],)) == k for k in mod_file
        ):
            continue
        here = mod_at(pos)
        ab = absolutize(segs, here)
        if ab is None:
            continue
        ab = [s for s in ab if s != "<inline>"]
        if segs[-1] == "*":
            ab = ab[:-1]
        target = resolve(ab)
        if target and target != r:
            arrows.setdefault(r, {}).setdefault(target, set()).add(segs[-1])

rooms = sorted({room_of(r) for r in files if not is_test(r)})
edges = {}
for a, bs in arrows.items():
    if is_test(a):
        continue
    for b, names in bs.items():
        ra, rb = room_of(a), room_of(b)
        if ra != rb and not is_test(b):
            edges.setdefault((ra, rb), set()).update(names)

# circles: strongly connected components
index, low, stack, on, sccs, counter = {}, {}, [], set(), [], [0]


def strong(v):
    index[v] = low[v] = counter[0]
    counter[0] += 1
    stack.append(v)
    on.add(v)
    for (a, b) in edges:
        if a != v:
            continue
        if b not in index:
            strong(b)
            low[v] = min(low[v], low[b])
        elif b in on:
            low[v] = min(low[v], index[b])
    if low[v] == index[v]:
        comp = []
        while True:
            w = stack.pop()
            on.discard(w)
            comp.append(w)
            if w == v:
                break
        if len(comp) > 1:
            sccs.append(sorted(comp))


sys.setrecursionlimit(10000)
for v in rooms:
    if v not in index:
        strong(v)

unplaced = [r for r in rooms if floor(r) is None]
up = sorted(
    (a, b, names) for (a, b), names in edges.items()
    if floor(a) is not None and floor(b) is not None and floor(b) > floor(a)
)
big = sorted(
    ((len(files[r].splitlines()), r) for r in files if len(files[r].splitlines()) > LIMIT),
    reverse=True,
)

print(f"{len(rooms)} rooms, {len(edges)} arrows, {len(sccs)} circles, "
      f"{len(up)} arrows back up, {len(big)} files over {LIMIT} lines")
for c in sccs:
    print("circle:", " ".join(c))
    for a in c:
        for b in c:
            if (a, b) in edges:
                print(f"    {a} -> {b} ({', '.join(sorted(edges[(a, b)]))})")
for a, b, names in up:
    print(f"back up: {a} -> {b} ({', '.join(sorted(names))})")
for n, r in big:
    print(f"over {LIMIT}: {r} {n}")
for r in unplaced:
    print("no floor:", r)
if "--arrows" in sys.argv:
    for (a, b), names in sorted(edges.items()):
        print(f"{a} -> {b} ({', '.join(sorted(names))})")
