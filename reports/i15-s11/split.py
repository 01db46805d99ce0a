"""Where each point's TTFT tail comes from, per seed and pooled: client TTFT p90/p99 against the engine hop
(queue + prefill steps: placement) and the request path (inbound: front door + ext_proc; emit: simulator's
event loop), from a `--samples` run (stamps joined by reports/routing-s10/hops.py).

    .venv/bin/python reports/i15-s11/split.py reports/i15-s11/suite/CASE [...]
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import numpy as np

_spec = importlib.util.spec_from_file_location("hops", Path(__file__).parent.parent / "routing-s10" / "hops.py")
assert _spec is not None and _spec.loader is not None
hops = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(hops)


def cells(parts: dict[str, np.ndarray]) -> str:
    out = []
    for part in ("ttft", "engine", "inbound", "emit"):
        values = parts[part]
        out.append(f"{np.percentile(values, 90):6.1f} {np.percentile(values, 99):6.1f}" if len(values) else "-")
    return " | ".join(out)


def main(runs: list[str]) -> None:
    for run in runs:
        print(f"# {run}\n\n| point | TTFT p90 p99 | engine p90 p99 | inbound p90 p99 | emit p90 p99 |\n|---|---|---|---|---|")
        pooled: dict[str, dict[str, list[np.ndarray]]] = {}
        for point in sorted(Path(run, "samples").iterdir()):
            parts = hops.point_parts(point)
            print(f"| {point.name} | {cells(parts)} |")
            key = point.name.rpartition("-s")[0]
            for part, values in parts.items():
                pooled.setdefault(key, {}).setdefault(part, []).append(values)
        for key, lists in sorted(pooled.items(), key=lambda kv: (kv[0].rpartition("-q")[2], kv[0])):
            print(f"| **{key} pooled** | {cells({p: np.concatenate(v) for p, v in lists.items()})} |")
        print()


if __name__ == "__main__":
    main(sys.argv[1:])
