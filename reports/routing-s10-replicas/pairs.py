"""Which system prompts shared an engine in a real run, and what that did to the tail, from
`extproc bench routing --workload multi-turn --samples` output.

Per point: per engine, the system prompts it served (those with >= 10% of its requests), the smallest gap
between two of them (the workload asks its 12 system prompts in turn, so prompts g and g+1 mod 12 arrive back
to back), its request count and client TTFT p50/p90/p99; then client TTFT by the time since the previous request
sent to the same engine (< 10 ms, 10-30 ms, >= 30 ms).

    .venv/bin/python reports/routing-s10-replicas/pairs.py OUT_DIR...
"""
from __future__ import annotations

import json
import sys
from collections import Counter, defaultdict
from pathlib import Path

PROMPTS = 12


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q / 100 * len(ordered)))] if ordered else float("nan")


def gap(a: int, b: int) -> int:
    return min((a - b) % PROMPTS, (b - a) % PROMPTS)


def point(where: Path) -> None:
    rows = [json.loads(line) for line in (where / "requests.jsonl").open()]
    rows = [r for r in rows if r["ttft_s"] is not None]
    by_engine: dict[str, list[dict]] = defaultdict(list)
    for r in rows:
        by_engine[r["endpoint"]].append(r)
    every = [r["ttft_s"] * 1e3 for r in rows]
    print(f"{where.name}: {len(rows)} requests, TTFT p50/p90/p99 {pct(every, 50):.1f}/{pct(every, 90):.1f}/"
          f"{pct(every, 99):.1f} ms")
    for engine, served in sorted(by_engine.items(), key=lambda kv: -len(kv[1])):
        groups = Counter(int(r["labels"]["group"]) for r in served)
        main = sorted(g for g, n in groups.items() if n >= 0.1 * len(served))
        gaps = [gap(a, b) for i, a in enumerate(main) for b in main[i + 1:]]
        ttft = [r["ttft_s"] * 1e3 for r in served]
        print(f"  {engine}: {len(served)} req, prompts {main} min gap {min(gaps) if gaps else '-'}, "
              f"TTFT p50/p90/p99 {pct(ttft, 50):.1f}/{pct(ttft, 90):.1f}/{pct(ttft, 99):.1f}")
    spaced: dict[str, list[float]] = defaultdict(list)
    for served in by_engine.values():
        served.sort(key=lambda r: r["start_s"])
        for before, r in zip(served, served[1:]):
            since = (r["start_s"] - before["start_s"]) * 1e3
            spaced["<10" if since < 10 else "10-30" if since < 30 else ">=30"].append(r["ttft_s"] * 1e3)
    print("  by time since the engine's previous request (ms): " + "; ".join(
        f"{k}: {len(v) / len(rows):.1%} of requests, p50/p90/p99 {pct(v, 50):.1f}/{pct(v, 90):.1f}/{pct(v, 99):.1f}"
        for k, v in ((k, spaced[k]) for k in ("<10", "10-30", ">=30"))))


for out in sys.argv[1:]:
    for where in sorted(Path(out, "samples").iterdir()):
        point(where)
