"""Every cold request (its prompt not cached) of each point: engine time (submit -> first token), requests running
at its endpoint when it was submitted (and the least over endpoints), requests submitted there during its prefill,
other cold prefills overlapping it there.   python3 reports/i15-s23/cold.py RUN"""
import sys
from samples import points

for name, rows in points(sys.argv[1]):
    print(name)
    for r in rows:
        r["end"] = r["sent_clock_s"] + r["e2e_s"]
    endpoints = {r["endpoint"] for r in rows}
    for c in sorted((r for r in rows if r["cold"] and r["s"]), key=lambda r: r["ttft_s"]):
        t0, t1 = c["s"]["submit"], c["s"]["token"]
        same = [r for r in rows if r["endpoint"] == c["endpoint"] and r is not c and r["s"]]
        running = sum(1 for r in same if r["s"]["submit"] < t0 < r["end"])
        during = sum(1 for r in same if t0 < r["s"]["submit"] < t1)
        other_cold = sum(1 for r in same if r["cold"] and r["s"]["submit"] < t1 and r["s"]["token"] > t0)
        busy: dict[str, int] = {}
        for r in rows:
            if r["s"] and r["s"]["submit"] < t0 < r["end"]:
                busy[r["endpoint"]] = busy.get(r["endpoint"], 0) + 1
        least = min(busy.get(e, 0) for e in endpoints)
        print("  ttft %.0f eng %.0f  running-at-submit %d (min over engines %d) arrivals-during %d other-cold %d" % (
            c["ttft_s"] * 1e3, (t1 - t0) * 1e3, running, least, during, other_cold))
