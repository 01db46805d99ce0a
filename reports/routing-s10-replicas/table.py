"""Per strategy and seed: hit rate and client TTFT p50/p90/p99 (ms), then the median over seeds and the change of
the median p90 from the one-replica strategy (`default`), from `extproc bench routing` results.json files.

    .venv/bin/python reports/routing-s10-replicas/table.py OUT_DIR...
"""
from __future__ import annotations

import json
import statistics
import sys
from collections import defaultdict

for out in sys.argv[1:]:
    results = json.load(open(f"{out}/results.json"))
    rows: dict[str, list[dict]] = defaultdict(list)
    for point in results["points"]:
        rows[point["strategy"]].append(point)
    print(f"{out} ({results['workload']}, seeds {results['seeds']})")
    print("| strategy | seed | hit | p50 | p90 | p99 |\n|---|---|---|---|---|---|")
    medians = {}
    for strategy, points in rows.items():
        for p in sorted(points, key=lambda p: p["seed"]):
            print(f"| {strategy} | {p['seed']} | {p['hit_rate']:.4f} | {p['ttft_p50_ms']:.1f} | {p['ttft_p90_ms']:.1f} "
                  f"| {p['ttft_p99_ms']:.1f} |")
        medians[strategy] = {k: statistics.median(p[k] for p in points)
                             for k in ("hit_rate", "ttft_p50_ms", "ttft_p90_ms", "ttft_p99_ms")}
    base = medians.get("default")
    for strategy, m in medians.items():
        change = f" ({(m['ttft_p90_ms'] / base['ttft_p90_ms'] - 1) * 100:+.1f}% p90 vs default)" if base else ""
        print(f"| {strategy} | median | {m['hit_rate']:.4f} | {m['ttft_p50_ms']:.1f} | {m['ttft_p90_ms']:.1f} "
              f"| {m['ttft_p99_ms']:.1f} |{change}")
    print()
