"""Table of an A/B directory written by ab.sh: per run the service CPU per request (total and by phase), added
latency (with_extproc minus envoy_only, p50/p95/p99) and the harness's in-process figures; then medians per side.
Usage: python summarize.py DIR"""
from __future__ import annotations

import json
import re
import statistics
import sys
from pathlib import Path

root = Path(sys.argv[1])
rows: dict[str, list[dict[str, float]]] = {"A": [], "B": []}
print("run side  cpu_us  req_headers  req_body  stream_end  access_log  grpc_loop  add_p50  add_p95  add_p99"
      "  | harness headers body end")
for path in sorted(root.glob("overhead-*-?.json"), key=lambda p: int(p.stem.split("-")[1])):
    _, number, side = path.stem.split("-")
    report = json.loads(path.read_text())
    fixed = report["fixed_rate"]["with_extproc"]
    phase = fixed["cpu_us_per_phase"]
    added = report["added_ms"]["with_extproc"]
    harness = (root / f"harness-{number}-{side}.txt").read_text()
    h = dict(zip(("h_headers", "h_body", "h_end"),
                 map(float, re.findall(r"headers ([\d.]+) us\s+body ([\d.]+) us\s+end ([\d.]+)", harness)[0]),
                 strict=True))
    row = {"cpu": fixed["cpu_us_per_request"], "headers": phase["request_headers"], "body": phase["request_body"],
           "end": phase["stream_end"], "log": phase["access_log"], "loop": phase["grpc_and_loop"],
           "p50": added["p50"], "p95": added["p95"], "p99": added["p99"], **h}
    rows[side].append(row)
    print(f"{number:>3} {side:>4}  {row['cpu']:6.1f}  {row['headers']:11.1f}  {row['body']:8.1f}  {row['end']:10.1f}"
          f"  {row['log']:10.1f}  {row['loop']:9.1f}  {row['p50']:7.3f}  {row['p95']:7.3f}  {row['p99']:7.3f}"
          f"  | {h['h_headers']:6.1f} {h['h_body']:6.1f} {h['h_end']:5.1f}")
for side, values in rows.items():
    if values:
        med = {k: statistics.median(v[k] for v in values) for k in values[0]}
        print(f"median {side} (n={len(values)}): " + ", ".join(f"{k} {v:.3f}" if k.startswith("p") else
                                                             f"{k} {v:.1f}" for k, v in med.items()))
