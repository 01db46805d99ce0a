"""Slow cache hits (TTFT > 100 ms) of a `--samples` point: how many were submitted to an engine while it was
prefilling a cache miss (engine stamps), and the engine times of the others.

    python3 reports/i13-s12/behind.py POINT_DIR...
"""

from __future__ import annotations

import glob
import json
import sys
from pathlib import Path

for point in sys.argv[1:]:
    stamps = {}
    for name in glob.glob(point + "/sim-timings-*.json"):
        stamps.update({s["id"]: s for s in json.loads(Path(name).read_text())})
    with open(point + "/requests.jsonl") as lines:
        records = [json.loads(line) for line in lines]
    pairs = [(r, stamps[r["sim_request"]]) for r in records if r["sim_request"] in stamps]
    misses = [(r["endpoint"], s["submit"], s["token"]) for r, s in pairs if r["cached_tokens"] == 0]
    slow = [(r, s) for r, s in pairs if r["cached_tokens"] > 0 and r["ttft_s"] > 0.1]
    behind = 0
    other = []
    for r, s in slow:
        if any(e == r["endpoint"] and sub <= s["submit"] + 0.001 and tok >= s["submit"] for e, sub, tok in misses):
            behind += 1
        else:
            other.append(round((s["token"] - s["submit"]) * 1000))
    print(Path(point).name, "slow hits", len(slow), "behind a miss prefill", behind, "others engine ms", sorted(other))
