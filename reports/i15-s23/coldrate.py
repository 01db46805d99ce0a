"""Every cold request of each point as TTFT:rate/[least..most] nN: the requests/s its endpoint was sent over the 3 s
before it, the least and most of any endpoint, and N requests sent to its endpoint within 230 ms after it.
    python3 reports/i15-s23/coldrate.py RUN"""
import collections, sys
from samples import points

for name, rows in points(sys.argv[1]):
    endpoints = {r["endpoint"] for r in rows}
    out = []
    for c in (r for r in rows if r["cold"]):
        t = c["sent_clock_s"]
        sent = collections.Counter(r["endpoint"] for r in rows if t - 3 < r["sent_clock_s"] < t)
        rates = sorted(sent.get(e, 0) / 3 for e in endpoints)
        after = sum(1 for r in rows if r["endpoint"] == c["endpoint"] and t < r["sent_clock_s"] < t + 0.23)
        out.append("%.0f:%.1f/[%.1f..%.1f] n%d" % (c["ttft_s"] * 1e3, sent.get(c["endpoint"], 0) / 3, rates[0],
                                                   rates[-1], after))
    print(name, " ".join(out))
