"""Where the p99 of a shared-prefix point sits: per strategy, over every given run's seeds together, TTFT p98 /
p99 / p99.5, p99 of the requests sent from 5 s into the measured window on (the first seconds hold the cold
prefills of prompts not yet placed), cache misses, and requests over 100 ms per seed.

    python3 reports/i13-s12/tail.py RATE RUN_DIR...   (e.g. 60 reports/i13-s12/exact-zipf60)
"""

from __future__ import annotations

import glob
import json
import sys

import numpy as np

rate, runs = sys.argv[1], sys.argv[2:]
for strategy in ("default", "default+noflow", "twin+noflow"):
    every: list[float] = []
    warm: list[float] = []
    slow: list[int] = []
    misses = 0
    for run in runs:
        for point in sorted(glob.glob(f"{run}/samples/{strategy}-q{rate}-s*")):
            values = []
            with open(f"{point}/requests.jsonl") as lines:
                records = [json.loads(line) for line in lines]
            for record in records:
                if record["error"] is None:
                    values.append(record["ttft_s"] * 1e3)
                    misses += record["cached_tokens"] == 0
                    if record["start_s"] >= 5:
                        warm.append(record["ttft_s"] * 1e3)
            every += values
            slow.append(sum(1 for v in values if v > 100))
    if not every:
        continue
    p98, p99, p995 = np.percentile(every, [98, 99, 99.5])
    print(f"{strategy:15s} seeds {len(slow)} requests {len(every)} misses {misses}: p98 {p98:.1f} p99 {p99:.1f} "
          f"p99.5 {p995:.1f} | from 5 s on: p99 {np.percentile(warm, 99):.1f} | >100 ms per seed {slow} "
          f"total {sum(slow)} ({sum(slow) / len(every):.2%})")
