"""Session 18: where the slowest requests of a `--samples` run spent their time, per strategy.

Usage: python tails.py OUT  (OUT of `extproc bench routing ... --samples`). For every point: TTFT p99, and for the
slowest 2% of requests: the split of TTFT into before the engine (sent -> submit), in the engine (submit -> first
token step) and after; their cache hit; how many other requests the same engine had been handed in the 100 ms
before (and how many of those were cold, < 50% cached); versus the same for all requests.
"""
import json
import sys
from pathlib import Path
from statistics import mean


def load(point: Path):
    reqs = [json.loads(line) for line in (point / "requests.jsonl").open()]
    stamps = {}
    for f in point.glob("sim-timings-*.json"):
        for s in json.loads(f.read_text()):
            stamps[s["id"]] = s
    return reqs, stamps


def main(out: Path) -> None:
    for point in sorted((out / "samples").iterdir()):
        reqs, stamps = load(point)
        ok = [r for r in reqs if r["ttft_s"] is not None and r.get("sim_request") in stamps]
        for r in ok:
            s = stamps[r["sim_request"]]
            r["pre"] = (s["submit"] - r["sent_clock_s"]) * 1000
            r["eng"] = (s["token"] - s["submit"]) * 1000
            r["post"] = r["ttft_s"] * 1000 - r["pre"] - r["eng"]
            r["hit"] = (r["cached_tokens"] or 0) / max(1, r["prompt_tokens"] or 1)
            r["submit"] = s["submit"]
        by_ep = {}
        for r in ok:
            by_ep.setdefault(r["endpoint"], []).append(r)
        for rs in by_ep.values():
            rs.sort(key=lambda r: r["submit"])
            for i, r in enumerate(rs):
                j, before, cold = i - 1, 0, 0
                while j >= 0 and r["submit"] - rs[j]["submit"] < 0.1:
                    before += 1
                    cold += rs[j]["hit"] < 0.5
                    j -= 1
                r["before"], r["cold_before"] = before, cold
        ok.sort(key=lambda r: r["ttft_s"])
        n = len(ok)
        tail = ok[int(0.98 * n):]
        p99 = ok[int(0.99 * n)]["ttft_s"] * 1000

        def row(rs):
            return (f"pre {mean(r['pre'] for r in rs):5.1f} eng {mean(r['eng'] for r in rs):5.1f} "
                    f"post {mean(r['post'] for r in rs):5.1f} hit {mean(r['hit'] for r in rs):.2f} "
                    f"cold {sum(r['hit'] < 0.5 for r in rs):3d} before {mean(r['before'] for r in rs):.2f} "
                    f"cold_before {mean(r['cold_before'] for r in rs):.2f}")
        print(f"{point.name}: n={n} p99={p99:.1f}")
        print(f"  all : {row(ok)}")
        print(f"  tail: {row(tail)}")
        counts = {}
        for r in ok:
            counts[r["endpoint"]] = counts.get(r["endpoint"], 0) + 1
        print("  per endpoint:", sorted(counts.values()))


if __name__ == "__main__":
    main(Path(sys.argv[1]))
