"""Pooled TTFT of one (one replica) vs three replicas per run directory and over rounds, per exchange interval.

    python3 summarize.py PREFIX      (e.g. u80 -> u80-ms10-r1, u80-ms20-r1, ...)
"""
import glob, gzip, json, sys

def pct(xs, q):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))]

prefix = sys.argv[1]
pooled: dict[tuple[str, str], list[float]] = {}
for run in sorted(glob.glob(f"{prefix}-ms*-r*")):
    if not run[-1].isdigit():
        continue
    ms = run.split("-ms")[1].split("-")[0]
    ttfts = json.load(gzip.open(f"{run}/ttfts.json.gz"))
    res = json.load(open(f"{run}/results.json"))
    cores = {s["strategy"]: s["cores"] for s in res["summary"]}
    line = []
    for strategy in ("default", "default@3"):
        xs = [x for k, v in ttfts.items() if k.split("-q")[0] == strategy for x in v if x is not None]
        pooled.setdefault((ms, strategy), []).extend(xs)
        line.append((pct(xs, .5), pct(xs, .9), pct(xs, .99)))
    c1, c3 = cores["default"], cores["default@3"]
    per = [c3[k] for k in c3 if k.startswith("service")]
    print(f"{run}: one {line[0][1]:.1f} / {line[0][2]:.1f}, three {line[1][1]:.1f} / {line[1][2]:.1f} -> p90 "
          f"x{line[1][1] / line[0][1]:.2f}; CPU one {c1['service']:.3f}, three {sum(per) / len(per):.3f} per replica, "
          f"redis {c3.get('redis', 0):.3f}")
for ms in sorted({m for m, _ in pooled}, key=int):
    one, three = pooled[(ms, "default")], pooled[(ms, "default@3")]
    print(f"{ms} ms, all rounds: one {pct(one, .9):.1f} / {pct(one, .99):.1f}, three {pct(three, .9):.1f} / "
          f"{pct(three, .99):.1f} -> p90 x{pct(three, .9) / pct(one, .9):.2f} (p90 / p99 ms, {len(one)} / {len(three)} requests)")
