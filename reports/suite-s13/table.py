"""Markdown rows from repro_item4.py outputs: python3 reports/suite-s13/table.py FILE.jsonl ..."""

import json
import statistics
import sys

print("| file | commit tree | busy | rounds | service cores (median) | victims 200 / 500 | rounds with a victim 500 "
      "| victim e2e p50 per round (ms, min-max) | victim e2e max (ms, max) | attackers 404 / 429 / 500 / 0 "
      "| Envoy message_timeouts |")
print("|---|---|---:|---:|---:|---|---:|---|---:|---|---:|")
for name in sys.argv[1:]:
    rows = [json.loads(line) for line in open(name) if line.startswith("{")]
    rounds = [r for r in rows if "summary" not in r]
    summary = next(r for r in rows if "summary" in r)
    cores = statistics.median(r["cores"]["service"] if "cores" in r else r["service_cores"] for r in rounds)
    p50s = [r["victim_e2e_ms_p50_max"][0] for r in rounds]
    maxes = [r["victim_e2e_ms_p50_max"][1] for r in rounds]
    a = summary.get("attacker_statuses") or summary.get("attackers") or {}
    timeouts = sum(r["envoy"].get("http.llm.ext_proc.message_timeouts", 0) for r in rounds)
    v = summary["victims"]
    print(f"| {name.rsplit('/', 1)[-1]} | {summary['pythonpath'].rsplit('-', 1)[-1]} | {summary['busy']} | {len(rounds)} "
          f"| {cores:.2f} | {v.get('200', 0)} / {v.get('500', 0)} | {summary['rounds_with_a_victim_not_200']} "
          f"| {min(p50s):.0f}-{max(p50s):.0f} | {max(maxes):.0f} "
          f"| {a.get('404', 0)} / {a.get('429', 0)} / {a.get('500', 0)} / {a.get('0', 0)} | {timeouts:g} |")
