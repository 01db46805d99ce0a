"""Per point of `--samples` runs: each process's CPU run delay (s waited for a CPU per s of the run, from
run-delay.json) against the point's inbound hop p90/p99 and its parts (split.py), sorted by the stack's total
run delay: how much of the hop is waiting for a CPU on the shared 2-core machine.

    .venv/bin/python reports/i15-s14/hop/contention.py RUN_DIR [...]
"""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import numpy as np

_spec = importlib.util.spec_from_file_location("split", Path(__file__).parent / "split.py")
assert _spec is not None and _spec.loader is not None
split = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(split)


def main(runs: list[str]) -> None:
    rows = []
    for run in runs:
        for point in sorted(Path(run, "samples").iterdir()):
            delay_file = point / "run-delay.json"
            if not delay_file.exists():
                continue
            recorded = json.loads(delay_file.read_text())
            delays = recorded["run_delay_s_per_s"]
            machine = recorded.get("machine_s_per_s", {})
            requests, _ = split.point_rows(point)
            parts = {part: np.array([r[part] for r in requests if part in r]) for part in ("inbound", "xp", "to_sim")}
            p = {k: (np.percentile(v, 90), np.percentile(v, 99)) if len(v) else (float("nan"),) * 2
                 for k, v in parts.items()}
            rows.append((sum(delays.values()), f"{Path(run).name}/{point.name}", delays, p, machine))
    print("| point | run delay s/s: total (per process) | SCHED_IDLE cores | inbound p90 p99 | xp p90 p99 | "
          "to_sim p90 p99 |")
    print("|---|---|---|---|---|---|")
    for total, name, delays, p, machine in sorted(rows, key=lambda row: row[0]):
        each = " ".join(f"{k} {v:.3f}" for k, v in delays.items())
        idle = f"{machine['idle_class_cpu']:.2f}" if "idle_class_cpu" in machine else "-"
        cells = " | ".join(f"{p[k][0]:.1f} {p[k][1]:.1f}" for k in ("inbound", "xp", "to_sim"))
        print(f"| {name} | {total:.3f} ({each}) | {idle} | {cells} |")


if __name__ == "__main__":
    main(sys.argv[1:])
