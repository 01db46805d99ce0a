"""Rebuild reports/routing-s8/README.md's tables from the runs' results.json (`.venv/bin/python
reports/routing-s8/summarize.py`): per run, its command, the uptime before and after, one table (medians over the
seeds, ranges min-max, latency in ms, eng = the engines' own TTFT) and issue 15's verdicts for `default` against
the peers in the same run (extproc.bench.routing_suite.verdicts)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from extproc.bench.report import format_markdown_table
from extproc.bench.routing_suite import verdicts

HERE = Path(__file__).resolve().parent
# run directory -> the suite's case name (for the verdict rules: "zipf" adds the 1/5 of sglang's p90 check)
RUNS = {
    "hold-uniform80": "uniform", "hold-drift40": "drift",
    "waiting-drift40": "drift", "waiting-uniform80": "uniform", "waiting-zipf80": "zipf",
    "uniform40": "uniform", "zipf40": "zipf", "multi-turn40": "multi-turn", "mixed": "mixed", "drift80": "drift",
    "fix-uniform40": "uniform", "fix-uniform80": "uniform", "fix-zipf80": "zipf",
}
TABLE = [("strategy", "strategy"), ("load", "load"), ("qps", "req/s"), ("hit_rate", "hit"),
         ("hit_rate_range", "hit range"), ("ttft_p50_ms", "TTFT p50"), ("ttft_p90_ms", "p90"),
         ("ttft_p90_ms_range", "p90 range"), ("ttft_p99_ms", "p99"), ("ttft_p99_ms_range", "p99 range"),
         ("eng90", "eng p90"), ("eng99", "eng p99"), ("errors", "err"), ("peer_ok", "peer ok"),
         ("max_cores", "max core")]


def section(name: str, case: str) -> str:
    report = json.loads((HERE / name / "results.json").read_text())
    rows = []
    for row in report["summary"]:
        engine = row.get("engine_ttft_ms") or {}
        rows.append({**row, "hit_rate": f"{row['hit_rate']:.4f}", "eng90": engine.get("p90"),
                     "eng99": engine.get("p99")})
    uptime = (HERE / name / "uptime.txt").read_text().strip().replace("\n", "  \n")
    seeds = [p["seed"] for p in report["points"]]
    return "\n".join([
        f"### {name}\n", f"`{report['command']}`\n", f"{uptime}\n",
        f"Seeds {sorted(set(seeds))}, {report['duration_s']:g} s measured after {report['warmup_s']:g} s warm-up; "
        f"capacity {report['capacity'].get('rps')} req/s. [results]({name}/results.md)\n",
        format_markdown_table(rows, TABLE), "",
        *(line if "peers 0)" not in line else "- no peer router in this run: our variants compared"
          for line in verdicts(case, report["summary"])), ""])


def main() -> None:
    for name, case in RUNS.items():
        if (HERE / name / "results.json").exists():
            print(section(name, case))


if __name__ == "__main__":
    main()
