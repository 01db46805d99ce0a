"""Pool a `bench routing --repeat N --samples` run over its seeds, flow control on vs off.

`bench routing` reports medians and ranges over seeds, not pooled percentiles (only `--workload overload` pools).
This reads OUT/results.json (per-seed rows: goodput, hit tokens, flow control's counters) and
OUT/samples/<strategy>-q<rate>-s<seed>/requests.jsonl (every measured request) and prints, per rate and strategy:
TTFT p50/p90/p99 over every seed's requests together (numpy linear interpolation, as the bench's summaries),
the per-seed p99 range, goodput (mean of the seeds' req/s within the SLO), hit rate (hit tokens / query tokens
summed over seeds), errors, and flow control's queued / waited > 1 s / refused summed; then on-vs-off deltas.

    python3 reports/i13-s12/pool.py reports/i13-s12/NAME [...]
"""

from __future__ import annotations

import json
import sys
from collections import defaultdict
from pathlib import Path
from typing import Any

import numpy as np


def ttfts(path: Path) -> list[float]:
    out = []
    with path.open() as lines:
        for line in lines:
            record = json.loads(line)
            if record["error"] is None and record["ttft_s"] is not None:
                out.append(record["ttft_s"] * 1000.0)
    return out


def pool(out: Path) -> list[dict[str, Any]]:
    report = json.loads((out / "results.json").read_text())
    groups: dict[tuple[float, str], list[dict[str, Any]]] = defaultdict(list)
    for row in report["points"]:
        if "failed" in row:
            print(f"FAILED point {row}", file=sys.stderr)
            continue
        groups[(row["qps"], row["strategy"])].append(row)
    result = []
    for (qps, strategy), rows in sorted(groups.items()):
        values: list[float] = []
        for row in rows:
            values += ttfts(out / "samples" / f"{strategy}-q{qps:g}-s{row['seed']}" / "requests.jsonl")
        p50, p90, p99 = np.percentile(np.asarray(values), [50, 90, 99])
        flow = {k: sum(r.get("flow", {}).get(k, 0.0) for r in rows) for k in ("queued", "waited_over_1s", "rejected")}
        hits = sum(r["cache"]["hit_tokens"] for r in rows)
        queries = sum(r["cache"]["query_tokens"] for r in rows)
        result.append({
            "run": out.name, "qps": qps, "load": rows[0].get("load"), "strategy": strategy,
            "seeds": sorted(r["seed"] for r in rows), "requests": len(values),
            "errors": sum(r["errors"] for r in rows),
            "ttft_p50_ms": round(float(p50), 1), "ttft_p90_ms": round(float(p90), 1),
            "ttft_p99_ms": round(float(p99), 1),
            "p99_per_seed": [r["ttft_p99_ms"] for r in sorted(rows, key=lambda r: r["seed"])],
            "goodput_rps": round(sum(r["goodput_rps"] for r in rows) / len(rows), 2),
            "goodput_per_seed": [r["goodput_rps"] for r in sorted(rows, key=lambda r: r["seed"])],
            "hit_rate": round(hits / queries, 4) if queries else None,
            "hit_per_seed": [r["hit_rate"] for r in sorted(rows, key=lambda r: r["seed"])],
            **{f"flow_{k}": v for k, v in flow.items()},
        })
    return result


def main(dirs: list[str]) -> None:
    rows = [r for d in dirs for r in pool(Path(d))]
    print("| run | req/s | load | strategy | seeds | requests | err | TTFT p50 | p90 | p99 pooled | p99 per seed "
          "| goodput | hit | fc queued | fc >1 s | fc refused |")
    print("|---|---:|---:|---|---:|---:|---:|---:|---:|---:|---|---:|---:|---:|---:|---:|")
    for r in rows:
        print(f"| {r['run']} | {r['qps']:g} | {r['load'] if r['load'] is not None else '-'} | {r['strategy']} "
              f"| {len(r['seeds'])} | {r['requests']} | {r['errors']} | {r['ttft_p50_ms']} | {r['ttft_p90_ms']} "
              f"| {r['ttft_p99_ms']} | {' / '.join(f'{v:g}' for v in r['p99_per_seed'])} | {r['goodput_rps']} "
              f"| {r['hit_rate']} | {r['flow_queued']:g} | {r['flow_waited_over_1s']:g} | {r['flow_rejected']:g} |")
    print()
    print("| run, pair | req/s | p99 first / second | delta | per-seed p99 deltas | goodput | delta | hit "
          "| verdict (<= +10% p99, >= -2% goodput, 0 refused, 0 > 1 s) |")
    print("|---|---:|---|---:|---|---|---:|---|---|")
    by = {(r["run"], r["qps"], r["strategy"]): r for r in rows}
    # A/B: each profile with flow control on against the same profile off; A/A: a copy of the default profile
    # with flow control off (twin.yaml) against default off (the verdict column is then only a yardstick).
    pairs = [(s, f"{s}+noflow") for s in {k[2] for k in by} if not s.endswith("+noflow")]
    pairs += [("twin+noflow", "default+noflow")] if any(k[2] == "twin+noflow" for k in by) else []
    for (run, qps, strategy), on in by.items():
        for first, second in pairs:
            off = by.get((run, qps, second))
            if strategy != first or off is None:
                continue
            d99 = on["ttft_p99_ms"] / off["ttft_p99_ms"] - 1
            dgood = on["goodput_rps"] / off["goodput_rps"] - 1
            seeds = " / ".join(f"{a / b - 1:+.1%}" for a, b in zip(on["p99_per_seed"], off["p99_per_seed"],
                                                                    strict=True))
            ok = d99 <= 0.10 and dgood >= -0.02 and on["flow_rejected"] == 0 and on["flow_waited_over_1s"] == 0
            print(f"| {run} {first} vs {second} | {qps:g} | {on['ttft_p99_ms']} / {off['ttft_p99_ms']} | {d99:+.1%} "
                  f"| {seeds} | {on['goodput_rps']} / {off['goodput_rps']} | {dgood:+.2%} "
                  f"| {on['hit_rate']} / {off['hit_rate']} | {'pass' if ok else 'FAIL'} |")
    for d in dirs:
        (Path(d) / "pooled.json").write_text(json.dumps([r for r in rows if r["run"] == Path(d).name], indent=1))


if __name__ == "__main__":
    main(sys.argv[1:])
