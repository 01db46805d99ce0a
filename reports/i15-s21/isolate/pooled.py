"""Pooled TTFT p50/p90/p99 per (mode, strategy) over run directories PREFIX-MODE-rN (ttfts.json.gz).

    python3 pooled.py PREFIX [MODE ...]
"""
import glob, gzip, json, sys

def pct(xs, q):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))]

prefix, modes = sys.argv[1], sys.argv[2:]
for mode in modes:
    pooled: dict[str, list[float]] = {}
    for run in sorted(glob.glob(f"{prefix}-{mode}-r*")):
        if not run[-1].isdigit():
            continue
        for key, values in json.load(gzip.open(f"{run}/ttfts.json.gz")).items():
            pooled.setdefault(key.split("-q")[0], []).extend(x for x in values if x is not None)
    for strategy, xs in sorted(pooled.items()):
        print(f"{mode:6} {strategy:22} p50/p90/p99 {pct(xs, .5):.1f} / {pct(xs, .9):.1f} / {pct(xs, .99):.1f} "
              f"({len(xs)} requests)")
