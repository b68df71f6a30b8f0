#!/usr/bin/env python3
"""Draws docs/benchmarks.svg from criterion's output of
`cargo bench -p proxalloc-tools --bench peers`.

For each benchmark group (workload) it draws one bar per contender: the time per element
(object, or request for W5) as a multiple of the group's fastest contender, on a log
scale, labelled with the nanoseconds. Standard library only.

    python3 scripts/bench_chart.py [target/criterion] [docs/benchmarks.svg]
"""
import json
import math
import os
import sys

ROOT = sys.argv[1] if len(sys.argv) > 1 else "target/criterion"
OUT = sys.argv[2] if len(sys.argv) > 2 else "docs/benchmarks.svg"
GROUPS = [
    "w1-pair-64B", "w1-pair-256B", "w2-batch-64B", "w2-batch-256B",
    "w3-two-threads-64B", "w4-remote-free-64B",
    "w5-request-mix-1-thread", "w5-request-mix-2-threads",
]
# The contenders of the peer suite (PEER_SUITE in tools/src/lineup.rs; other benches may
# share a group name).
CONTENDERS = {
    "lower-bound", "proxalloc", "proxalloc-one-word", "proxalloc-depot-only",
    "proxalloc-bypass", "box-system",
    "mimalloc", "jemalloc", "object-pool", "lockfree-object-pool", "sharded-slab",
    "arrayqueue-pool",
}
HIGHLIGHT = {"proxalloc": "#1f77b4", "proxalloc-one-word": "#1f77b4", "lower-bound": "#7f7f7f"}
PEER = "#ff7f0e"
OWN = "#aec7e8"


def load(group):
    rows = []
    gdir = os.path.join(ROOT, group)
    if not os.path.isdir(gdir):
        return rows
    for name in sorted(os.listdir(gdir)):
        est = os.path.join(gdir, name, "new", "estimates.json")
        bench = os.path.join(gdir, name, "new", "benchmark.json")
        if not os.path.exists(est):
            continue
        with open(est) as f:
            ns = json.load(f)["median"]["point_estimate"]
        elements = 1
        if os.path.exists(bench):
            with open(bench) as f:
                thr = json.load(f).get("throughput") or {}
                elements = thr.get("Elements", 1) or 1
        with open(bench) as f:
            label = json.load(f).get("function_id", name)
        if label in CONTENDERS:
            rows.append((label, ns / elements))
    return rows


def main():
    panels = [(g, load(g)) for g in GROUPS]
    panels = [(g, r) for g, r in panels if r]
    if not panels:
        sys.exit(f"no criterion results under {ROOT}: run `cargo bench -p proxalloc-tools --bench peers` first")
    bar_h, gap, label_w, plot_w = 16, 4, 190, 560
    height = 40 + sum(30 + len(r) * (bar_h + gap) + 16 for _, r in panels)
    out = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{label_w + plot_w + 120}" height="{height}" '
        'font-family="sans-serif" font-size="12">',
        '<text x="10" y="22" font-size="15" font-weight="bold">proxalloc vs peers: time per '
        'element relative to the fastest contender (log scale; criterion medians)</text>',
    ]
    y = 40
    for group, rows in panels:
        best = min(ns for _, ns in rows)
        worst = max(ns for _, ns in rows)
        span = max(math.log10(worst / best), 1.0)
        out.append(f'<text x="10" y="{y + 16}" font-weight="bold">{group}</text>')
        y += 26
        for label, ns in sorted(rows, key=lambda r: r[1]):
            width = 4 + (plot_w - 4) * math.log10(ns / best) / span
            color = HIGHLIGHT.get(label, OWN if label.startswith("proxalloc") else PEER)
            out.append(f'<text x="{label_w - 6}" y="{y + 12}" text-anchor="end">{label}</text>')
            out.append(f'<rect x="{label_w}" y="{y}" width="{width:.1f}" height="{bar_h}" fill="{color}"/>')
            out.append(
                f'<text x="{label_w + width + 6:.1f}" y="{y + 12}">{ns:.1f} ns ({ns / best:.2f}x)</text>'
            )
            y += bar_h + gap
        y += 16
    out.append("</svg>")
    os.makedirs(os.path.dirname(OUT) or ".", exist_ok=True)
    with open(OUT, "w") as f:
        f.write("\n".join(out) + "\n")
    print(f"wrote {OUT} ({len(panels)} workloads)")


if __name__ == "__main__":
    main()
