"""Per point: the requests at or above the point's p98 TTFT split into req (client send -> engine arrival), tok
(arrival -> engine submit), eng (submit -> first token) and rest, their medians against all requests'; the request
path's and the engine's p50/p90/p98/max; and when the slowest 2% of request paths were sent (seconds mod 10).
    python3 reports/i15-s23/tail.py RUN"""
import sys
from samples import pct, points

for name, rows in points(sys.argv[1]):
    parts = []
    for r in rows:
        s = r["s"]
        if not s or r["ttft_s"] is None:
            continue
        t0 = r["sent_clock_s"]
        parts.append(dict(ttft=r["ttft_s"] * 1e3, req=(s["arrive"] - t0) * 1e3, tok=(s["submit"] - s["arrive"]) * 1e3,
                          eng=(s["token"] - s["submit"]) * 1e3, rest=(t0 + r["ttft_s"] - s["token"]) * 1e3, t0=t0,
                          un=r["prompt_tokens"] - r["cached_tokens"]))
    column = lambda key, among: [x[key] for x in among]  # noqa: E731
    p98, p99 = pct(column("ttft", parts), .98), pct(column("ttft", parts), .99)
    tail = [x for x in parts if x["ttft"] >= p98]
    med = lambda key, among: pct(column(key, among), .5)  # noqa: E731
    print(name, "n", len(parts), "p98 %.1f p99 %.1f" % (p98, p99),
          "| all med req %.2f tok %.2f eng %.1f rest %.2f" % tuple(med(k, parts) for k in ("req", "tok", "eng", "rest")),
          "| tail med req %.2f tok %.2f eng %.1f rest %.2f uncached %d" % (
              *(med(k, tail) for k in ("req", "tok", "eng", "rest")), med("un", tail)))
    req, eng = column("req", parts), column("eng", parts)
    slow = sorted((x for x in parts if x["req"] >= pct(req, .98)), key=lambda x: x["t0"])
    print("    req p50/p90/p98/max %.2f %.2f %.2f %.2f" % (pct(req, .5), pct(req, .9), pct(req, .98), max(req)),
          " slow-req times:", " ".join("%.2f" % (x["t0"] % 10) for x in slow[:30]))
    print("    eng p50/p90/p98/max %.1f %.1f %.1f %.1f" % (pct(eng, .5), pct(eng, .9), pct(eng, .98), max(eng)))
