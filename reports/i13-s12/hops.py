"""Split each measured request's TTFT into hops, from a `bench routing --samples` point directory:
gateway = client send -> simulator handler start (Envoy + ext_proc), engine = submit -> first token's step end,
rest = the remainder (tokenize, write, Envoy back, client). Prints, per point, the p50/p99 of each hop and how
many requests over THRESHOLD ms had most of their time in the engine, split by cache hit / miss.

    python3 reports/i13-s12/hops.py [--threshold MS] POINT_DIR...
"""

from __future__ import annotations

import glob
import json
import sys
from pathlib import Path

import numpy as np


def hops(point: Path) -> list[dict[str, float]]:
    stamps = {}
    for name in glob.glob(str(point / "sim-timings-*.json")):
        for s in json.loads(Path(name).read_text()):
            stamps[s["id"]] = s
    out = []
    for line in (point / "requests.jsonl").open():
        r = json.loads(line)
        s = stamps.get(r["sim_request"])
        if r["ttft_s"] is None or s is None or not r["sent_clock_s"]:
            continue
        gateway = s["arrive"] - r["sent_clock_s"]
        engine = s["token"] - s["submit"]
        out.append({"ttft": r["ttft_s"] * 1e3, "gateway": gateway * 1e3, "engine": engine * 1e3,
                    "rest": (r["ttft_s"] - gateway - engine) * 1e3, "hit": r["cached_tokens"] > 0,
                    "start": r["start_s"], "endpoint": r["endpoint"]})
    return out


def main(argv: list[str]) -> None:
    threshold = 100.0
    if argv[:1] == ["--threshold"]:
        threshold, argv = float(argv[1]), argv[2:]
    for point in argv:
        rows = hops(Path(point))
        def pct(key: str, rows: list[dict[str, float]] = rows) -> str:
            values = np.asarray([r[key] for r in rows])
            return "/".join(f"{v:.1f}" for v in np.percentile(values, [50, 99]))
        slow = [r for r in rows if r["ttft"] > threshold]
        print(f"{Path(point).name:28s} n={len(rows)} p50/p99 ms: ttft {pct('ttft')} gateway {pct('gateway')} "
              f"engine {pct('engine')} rest {pct('rest')} | >{threshold:g} ms: {len(slow)} "
              f"(engine-bound hit {sum(1 for r in slow if r['hit'] and r['engine'] > r['ttft'] / 2)}, "
              f"miss {sum(1 for r in slow if not r['hit'])}, gateway-bound "
              f"{sum(1 for r in slow if r['gateway'] > r['ttft'] / 2)})")


if __name__ == "__main__":
    main(sys.argv[1:])
