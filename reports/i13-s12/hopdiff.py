"""Gateway hop (client send -> engine handler start) paired request by request over runs: FIRST - SECOND, all seeds.

    python3 reports/i13-s12/hopdiff.py FIRST SECOND RUN_DIR...
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).parent))
from pairs import point  # noqa: E402

first, second, runs = sys.argv[1], sys.argv[2], sys.argv[3:]
diffs: list[float] = []
a_all: list[float] = []
b_all: list[float] = []
for run in map(Path, runs):
    meta = json.loads((run / "results.json").read_text())
    rows = {(r["strategy"], r["qps"], r["seed"]): r for r in meta["points"] if "failed" not in r}
    for (strategy, rate, seed), row in rows.items():
        other = rows.get((second, rate, seed))
        if strategy != first or other is None:
            continue
        for x, y in zip(point(run, meta, row), point(run, meta, other), strict=True):
            if x["gateway"] is not None and y["gateway"] is not None:
                diffs.append(x["gateway"] - y["gateway"])
                a_all.append(x["gateway"])
                b_all.append(y["gateway"])
d = np.asarray(diffs)
print(f"{first} - {second} over {len(d)} request pairs: mean {d.mean():+.3f} ms (se {d.std() / len(d) ** 0.5:.3f}), "
      f"median {np.median(d):+.3f} ms; p50 {np.median(a_all):.2f} / {np.median(b_all):.2f} ms, "
      f"p99 {np.percentile(a_all, 99):.2f} / {np.percentile(b_all, 99):.2f} ms")
