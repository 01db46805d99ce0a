"""Zipf 1.1 at 40% (35.16 req/s): every seed measured on the same routing code (sessions 21 and 23), ours vs
sglang-router: per-seed TTFT p90/p99 from each run's results.json, their means and medians, how many seeds each
wins, and the TTFT pooled over the runs that kept their samples (ttfts.json.gz: this session's).

    python3 reports/i15-s23/seeds.py RESULTS.json ... [-- TTFTS.json.gz ...]
"""
import gzip, json, statistics as st, sys

args = sys.argv[1:]
split = args.index("--") if "--" in args else len(args)
results, ttfts = args[:split], args[split + 1:]
seeds: dict[str, dict[tuple[str, int], tuple[float, float]]] = {}
for path in results:
    for point in json.load(open(path))["points"]:
        if abs(point["qps"] - 35.16) < 0.5:
            seeds.setdefault(point["strategy"], {})[(path, point["seed"])] = (point["ttft_p90_ms"], point["ttft_p99_ms"])
ours, peer = seeds["default"], seeds["sglang-cache-aware"]
print("run / seed: ours p90 p99 | sglang-router p90 p99")
for key in ours:
    print(f"  {key[0]} seed {key[1]}: {ours[key][0]:.1f} {ours[key][1]:.1f} | {peer[key][0]:.1f} {peer[key][1]:.1f}")
for name, i in (("p90", 0), ("p99", 1)):
    a, b = [ours[k][i] for k in ours], [peer[k][i] for k in ours]
    wins = sum(x < y for x, y in zip(a, b))
    ties = sum(x == y for x, y in zip(a, b))
    print(f"{name}: {len(a)} seeds; mean {st.mean(a):.1f} vs {st.mean(b):.1f}; median {st.median(a):.1f} vs "
          f"{st.median(b):.1f}; ours lower in {wins}, equal in {ties}")
pooled: dict[str, list[float]] = {}
for path in ttfts:
    for key, values in json.load(gzip.open(path)).items():
        if "-q35.16" in key:
            pooled.setdefault(key.split("-q")[0], []).extend(x for x in values if x is not None)
def pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))]
for strategy, xs in sorted(pooled.items()):
    print(f"pooled {strategy:20} p50/p90/p99 {pct(xs, .5):.1f} / {pct(xs, .9):.1f} / {pct(xs, .99):.1f} ({len(xs)})")
