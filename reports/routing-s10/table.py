"""One markdown table per run directory: per strategy, medians over seeds (ranges) of hit, TTFT p50/p90/p99, engine
p90, and each process's cores (from results.json).

    .venv/bin/python reports/routing-s10/table.py reports/routing-s10/b-uniform80 [...]
"""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path


def cell(values: list[float], digits: int = 2) -> str:
    med = statistics.median(values)
    if len(values) > 1 and max(values) != min(values):
        return f"{med:.{digits}f} ({min(values):.{digits}f}-{max(values):.{digits}f})"
    return f"{med:.{digits}f}"


def main(runs: list[str]) -> None:
    for run in runs:
        data = json.loads(Path(run, "results.json").read_text())
        print(f"### {Path(run).name}\n\n`{data['command']}`\n")
        uptime = Path(run, "uptime.txt")
        if uptime.exists():
            print("  \n".join(uptime.read_text().splitlines()) + "\n")
        print("| strategy | hit | TTFT p50 | p90 | p99 | engine p90 | cores (sim / service / envoy or peer / client) |")
        print("|---|---|---|---|---|---|---|")
        by: dict[str, list[dict]] = {}
        for point in data["points"]:
            if "failed" not in point:
                by.setdefault(point["strategy"], []).append(point)
        for strategy, points in by.items():
            cores = {}
            for point in points:
                for name, value in point["cores"].items():
                    cores.setdefault(name, []).append(value)
            front = [k for k in cores if k not in ("sim", "service", "client")]
            text = " / ".join(f"{statistics.median(cores[k]):.3f}" for k in ("sim", "service") if k in cores)
            text += "".join(f" / {k} {statistics.median(cores[k]):.3f}" for k in front)
            text += f" / {statistics.median(cores['client']):.3f}" if "client" in cores else ""
            eng = [p["engine_ttft_ms"]["p90"] for p in points if p.get("engine_ttft_ms")]
            print(f"| {strategy} | {cell([p['hit_rate'] for p in points], 4)} | "
                  f"{cell([p['ttft_p50_ms'] for p in points])} | {cell([p['ttft_p90_ms'] for p in points])} | "
                  f"{cell([p['ttft_p99_ms'] for p in points])} | {cell(eng) if eng else '-'} | {text} |")
        print()


if __name__ == "__main__":
    main(sys.argv[1:])
