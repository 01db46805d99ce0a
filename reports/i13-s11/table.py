"""Tables of the locked runs: per strategy and load, TTFT p99 per class pooled over the seeds (and the per-seed
range), goodput, refused / queued / queued over 1 s by flow control. Run: python3 reports/i13-s11/table.py DIRS..."""

from __future__ import annotations

import json
import sys
from pathlib import Path

CLASSES = ("critical", "standard", "sheddable")

print("| run | strategy | load | seeds | critical p99 | standard p99 | sheddable p99 | per-seed p99 range (crit / std / "
      "shed) | goodput | refused | queued (>1 s) | Jain (min) |")
print("|---|---|---:|---:|---:|---:|---:|---|---:|---:|---:|---:|")
for directory in sys.argv[1:]:
    data = json.loads((Path(directory) / "results.json").read_text())
    rows = [r for r in data["rows"] if "failed" not in r]
    failed = [r for r in data["rows"] if "failed" in r]
    for pooled in data.get("pooled") or rows:
        mine = [r for r in rows if r["strategy"] == pooled["strategy"] and r["load"] == pooled["load"]]
        ranges = " / ".join(f"{min(r['classes'][k]['ttft_p99_ms'] or 0 for r in mine):.0f}-"
                            f"{max(r['classes'][k]['ttft_p99_ms'] or 0 for r in mine):.0f}" for k in CLASSES)
        flow = pooled.get("flow_run", {})
        print(f"| {Path(directory).name} | {pooled['strategy']} | {pooled['load']:g} | {len(mine)} | "
              + " | ".join(f"{pooled['classes'][k]['ttft_p99_ms']}" for k in CLASSES)
              + f" | {ranges} | {pooled['goodput_rps']} | {flow.get('rejected', 0):.0f} | {flow.get('queued', 0):.0f} "
              f"({flow.get('waited_over_1s', 0):.0f}) | {pooled['fairness']['jain']} |")
    for r in failed:
        print(f"| {Path(directory).name} | {r['strategy']} | {r['load']:g} | seed {r.get('seed')} FAILED: "
              f"{r['failed'][:80]} | | | | | | | | |")
