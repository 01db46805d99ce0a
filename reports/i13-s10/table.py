"""Prints the report's tables from the run directories: `python3 reports/i13-s10/table.py DIR...`."""

import json
import re
import sys

print("| run | commit | strategy | load | critical | standard | sheddable | refused | queued (>1 s) | goodput | load avg before -> after |")
print("|---|---|---|---:|---:|---:|---:|---:|---:|---:|---|")
for d in sys.argv[1:]:
    log = open(f"{d}/run.log").read()
    commit = re.search(r"^commit (\w+)", log, re.M).group(1)
    before = re.search(r"uptime before:.*load average: ([\d.]+)", log).group(1)
    after = re.search(r"uptime after:.*load average: ([\d.]+)", log).group(1)
    for row in json.load(open(f"{d}/results.json"))["rows"]:
        c = row["classes"]
        flow = row.get("flow_run") or {}
        queued = f"{flow.get('queued', 0):.0f} ({flow.get('waited_over_1s', 0):.0f})"
        refused = sum(v["rejected"] for v in c.values())
        cells = " | ".join(f"{c[k]['ttft_p99_ms']}" for k in ("critical", "standard", "sheddable"))
        print(f"| {d.rstrip('/').split('/')[-1]} | {commit} | {row['strategy']} | {row['load']} | {cells} | {refused} |"
              f" {queued} | {row['goodput_rps']} | {before} -> {after} |")
