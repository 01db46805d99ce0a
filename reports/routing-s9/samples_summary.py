"""Summarise `extproc bench routing --samples` output: client TTFT vs engine-side TTFT per point, and where the
service replicas spend time (decision seconds, event-loop lag), from each point's samples/ directory.

    .venv/bin/python reports/routing-s9/samples_summary.py reports/routing-s9/d1-multi-turn80
"""

from __future__ import annotations

import json
import sys
from collections import defaultdict
from pathlib import Path


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q / 100 * len(ordered)))] if ordered else float("nan")


def histogram(text: str, name: str) -> tuple[list[tuple[float, float]], float, float]:
    """Cumulative buckets summed over label sets, the sum and the count of histogram `name`."""
    buckets: dict[float, float] = defaultdict(float)
    total = count = 0.0
    for line in text.splitlines():
        if line.startswith(name + "_bucket"):
            le = line.split('le="')[1].split('"')[0]
            buckets[float("inf") if le == "+Inf" else float(le)] += float(line.rsplit(" ", 1)[1])
        elif line.startswith(name + "_sum"):
            total += float(line.rsplit(" ", 1)[1])
        elif line.startswith(name + "_count"):
            count += float(line.rsplit(" ", 1)[1])
    return sorted(buckets.items()), total, count


def over(buckets: list[tuple[float, float]], bound: float) -> float:
    """Share of observations above `bound` (a bucket edge)."""
    total = buckets[-1][1] if buckets else 0.0
    below = next((c for le, c in buckets if le >= bound), total)
    return (total - below) / total if total else 0.0


def main(run: str) -> None:
    for point in sorted(Path(run, "samples").iterdir()):
        rows = [json.loads(line) for line in (point / "requests.jsonl").read_text().splitlines()]
        ttft = [r["ttft_s"] * 1e3 for r in rows if r["ttft_s"] is not None]
        by_endpoint: dict[str, list[float]] = defaultdict(list)
        for r in rows:
            if r["ttft_s"] is not None:
                by_endpoint[r["endpoint"]].append(r["ttft_s"] * 1e3)
        eng_over40 = eng_n = 0.0
        queue_over = 0.0
        for prom in point.glob("sim-*.prom"):
            b, _, n = histogram(prom.read_text(), "vllm:time_to_first_token_seconds")
            eng_over40 += over(b, 0.04) * n
            eng_n += n
            q, _, _ = histogram(prom.read_text(), "vllm:request_queue_time_seconds")
            queue_over += over(q, 0.02) * n
        print(f"{point.name}: {len(ttft)} requests, client TTFT p50/p90/p99 {pct(ttft, 50):.1f}/{pct(ttft, 90):.1f}/"
              f"{pct(ttft, 99):.1f} ms; engines (whole run incl. warm-up): TTFT > 40 ms {eng_over40 / eng_n:.2%}, "
              f"queue > 20 ms {queue_over / eng_n:.2%}")
        heavy = sorted(by_endpoint, key=lambda e: -len(by_endpoint[e]))
        print("  per endpoint (requests: p50/p90/p99): " + ", ".join(
            f"{len(by_endpoint[e])}: {pct(by_endpoint[e], 50):.0f}/{pct(by_endpoint[e], 90):.0f}/"
            f"{pct(by_endpoint[e], 99):.0f}" for e in heavy))
        for prom in sorted(point.glob("service-*.prom")):
            text = prom.read_text()
            d, dsum, dn = histogram(text, "extproc_decision_seconds")
            lag, lsum, ln = histogram(text, "extproc_event_loop_lag_seconds")
            lag_text = ", ".join(f"> {b * 1e3:g} ms {over(lag, b):.1%}" for b in (0.005, 0.01, 0.025) if lag)
            send, ssum, sn = histogram(text, "extproc_upstream_send_seconds")
            if sn:
                print(f"  {prom.stem}: upstream send (request start to first byte upstream) over {sn:.0f} entries: "
                      f"mean {ssum / sn * 1e3:.2f} ms, " + ", ".join(
                          f"> {b * 1e3:g} ms {over(send, b):.1%}" for b in (0.003, 0.005, 0.01, 0.02, 0.05)))
            print(f"  {prom.stem}: decisions {dn:.0f}, mean {dsum / dn * 1e3 if dn else 0:.2f} ms, "
                  f"> 5 ms {over(d, 0.005):.1%}; loop lag mean {lsum / ln * 1e3 if ln else 0:.2f} ms, {lag_text}")


if __name__ == "__main__":
    main(sys.argv[1])
