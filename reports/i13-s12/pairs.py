"""Request-by-request comparison of two strategies of one `bench routing --samples` run, per seed (same seed = same
arrival schedule and prompts): did request i go to the same engine (the engine's position in the pool's endpoint
list, from the point's policy.yaml in the bench's workdir), was it a cache hit in one and a miss in the other, and
where do the two first diverge. Warm-up requests (not in requests.jsonl) are taken from the engines' own timings
(sim-timings-*.json, every request the engine saw, in arrival order): the first `warmup_requests` arrivals over all
engines are the warm-up, in index order (checked: gaps between arrivals, ~17 ms at 60 req/s, are far above the
spread of the gateway hop), their prompt groups regenerated from the workload (same seed). Hit/miss of a warm-up
request is inferred (the engine has served the group before), checked against `cached_tokens` of measured ones.
Also the gateway hop (client send -> engine handler) of each request, paired.

    python3 reports/i13-s12/pairs.py RUN_DIR FIRST SECOND [--detail SEED]
"""

from __future__ import annotations

import glob
import json
import sys
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from extproc.bench.routing_options import PrefixShape
from extproc.bench.routing_plan import DRIFT_AT, layout_for


def shape_of(meta: dict[str, Any]) -> PrefixShape:
    command = meta["command"].split()
    def arg(name: str, default: str) -> str:
        values = [command[i + 1] for i, word in enumerate(command) if word == name]
        return values[-1] if values else default
    ranges = [(int(arg(n, d)), int(arg(n, d))) for n, d in (("--prefix-tokens", "3000"), ("--question-tokens", "300"),
                                                              ("--output-tokens", "100"))]
    return PrefixShape(int(arg("--groups", "48")), ranges[0], ranges[1], ranges[2], arg("--popularity", "uniform"))


def point(run: Path, meta: dict[str, Any], row: dict[str, Any]) -> list[dict[str, Any]]:
    strategy, rate, seed = row["strategy"], row["qps"], row["seed"]
    samples = run / "samples" / f"{strategy}-q{rate:g}-s{seed}"
    policy = yaml.safe_load((Path(meta["workdir"]) / f"s{seed}-{strategy}-q{rate:g}" / "policy.yaml").read_text())
    order = {address.rpartition(":")[2]: i for i, address in enumerate(policy["pools"][0]["endpoints"])}
    stamps: dict[str, dict[str, float]] = {}
    for name in glob.glob(str(samples / "sim-timings-*.json")):
        for s in json.loads(Path(name).read_text()):
            stamps[s["id"]] = s
    records = [json.loads(line) for line in (samples / "requests.jsonl").open()]
    measured = {r["sim_request"] for r in records}
    warm_n = row["warmup_requests"]
    warm = sorted((s for i, s in stamps.items() if i not in measured), key=lambda s: s["arrive"])
    assert len(warm) == warm_n, (samples, len(warm), warm_n)
    shape = shape_of(meta)
    workload = layout_for(meta["workload"], meta["endpoints"], shape).workload(
        seed, round(rate * (meta["warmup_s"] + DRIFT_AT * meta["duration_s"])))
    out: list[dict[str, Any]] = []
    for index, s in enumerate(warm):
        group = workload.next_spec(index).labels["group"]
        out.append({"index": index, "warm": True, "engine": order[s["id"].split("-")[0]], "group": group,
                    "arrive": s["arrive"], "submit": s["submit"], "token": s["token"], "ttft": None, "hit": None,
                    "gateway": None})
    for r in records:
        s = stamps.get(r["sim_request"])
        assert workload.next_spec(warm_n + r["index"]).labels["group"] == r["labels"]["group"]
        out.append({"index": warm_n + r["index"], "warm": False, "engine": order[r["endpoint"].rpartition(":")[2]],
                    "group": r["labels"]["group"], "arrive": s["arrive"] if s else None,
                    "submit": s["submit"] if s else None, "token": s["token"] if s else None,
                    "ttft": r["ttft_s"] * 1e3 if r["ttft_s"] is not None else None,
                    "hit": r["cached_tokens"] > 0,
                    "gateway": (s["arrive"] - r["sent_clock_s"]) * 1e3 if s and r["sent_clock_s"] else None})
    seen: set[tuple[int, str]] = set()
    wrong = 0
    for o in out:  # the engine had the group's prefix: it served the group before (no eviction assumed)
        o["model_hit"] = (o["engine"], o["group"]) in seen
        seen.add((o["engine"], o["group"]))
        if o["hit"] is not None and o["hit"] != o["model_hit"]:
            wrong += 1
        if o["hit"] is None:
            o["hit"] = o["model_hit"]
    out[0]["model_wrong"] = wrong
    return out


def main(argv: list[str]) -> None:
    run, first, second = Path(argv[0]), argv[1], argv[2]
    detail = int(argv[4]) if argv[3:4] == ["--detail"] else None
    meta = json.loads((run / "results.json").read_text())
    rows = {(r["strategy"], r["qps"], r["seed"]): r for r in meta["points"] if "failed" not in r}
    print(f"## {run.name}: {first} vs {second}")
    gw_a: list[float] = []
    gw_b: list[float] = []
    for (strategy, rate, seed), row in sorted(rows.items(), key=lambda kv: (kv[0][1], kv[0][2])):
        if strategy != first or (second, rate, seed) not in rows:
            continue
        a, b = point(run, meta, row), point(run, meta, rows[(second, rate, seed)])
        assert len(a) == len(b)
        diverge = next((x for x, y in zip(a, b, strict=True) if x["engine"] != y["engine"]), None)
        same = sum(1 for x, y in zip(a, b, strict=True) if x["engine"] == y["engine"])
        measured = [(x, y) for x, y in zip(a, b, strict=True) if not x["warm"]]
        same_m = sum(1 for x, y in measured if x["engine"] == y["engine"])
        miss_a = sum(1 for x, _ in measured if not x["hit"])
        miss_b = sum(1 for _, y in measured if not y["hit"])
        warm_miss_a = sum(1 for x in a if x["warm"] and not x["hit"])
        warm_miss_b = sum(1 for y in b if y["warm"] and not y["hit"])
        flip = sum(1 for x, y in measured if x["hit"] != y["hit"])
        slow_a = sum(1 for x, _ in measured if x["ttft"] and x["ttft"] > 100)
        slow_b = sum(1 for _, y in measured if y["ttft"] and y["ttft"] > 100)
        pairs = [(x["gateway"], y["gateway"]) for x, y in measured if x["gateway"] is not None and y["gateway"] is not None]
        gw_a += [p for p, _ in pairs]
        gw_b += [q for _, q in pairs]
        d = np.asarray([p - q for p, q in pairs])
        where = "none" if diverge is None else (
            f"#{diverge['index']}{' (warm-up)' if diverge['warm'] else ''} group {diverge['group']} "
            f"{'hit' if diverge['hit'] else 'MISS'} -> e{diverge['engine']} vs "
            f"{'hit' if b[diverge['index']]['hit'] else 'MISS'} -> e{b[diverge['index']]['engine']}")
        print(f"q{rate:g} s{seed}: n={len(a)} (warm {row['warmup_requests']}) same engine {same / len(a):.1%} "
              f"(measured {same_m / len(measured):.1%}); first divergence {where}; measured misses {miss_a}/{miss_b} "
              f"(warm-up {warm_miss_a}/{warm_miss_b}), hit<->miss flips {flip}; >100 ms {slow_a}/{slow_b}; "
              f"gateway hop p50 {np.median([p for p, _ in pairs]):.2f}/{np.median([q for _, q in pairs]):.2f} ms, "
              f"paired diff mean {d.mean():+.3f} median {np.median(d):+.3f} ms; hit model wrong {a[0]['model_wrong']}/"
              f"{b[0]['model_wrong']}")
        if detail == seed:
            for x, y in zip(a[:diverge["index"] + 12 if diverge else 40], b, strict=False):
                mark = "" if x["engine"] == y["engine"] else " <-"
                print(f"  #{x['index']:4d} g{x['group']:>3s} e{x['engine']} {'h' if x['hit'] else 'M'} "
                      f"arr {x['arrive'] - a[0]['arrive']:.3f} | e{y['engine']} {'h' if y['hit'] else 'M'} "
                      f"arr {y['arrive'] - b[0]['arrive']:.3f}{mark}")
    if gw_a:
        print(f"gateway hop pooled p50/p90/p99 ms: {first} "
              f"{'/'.join(f'{v:.2f}' for v in np.percentile(gw_a, [50, 90, 99]))}, {second} "
              f"{'/'.join(f'{v:.2f}' for v in np.percentile(gw_b, [50, 90, 99]))}")


if __name__ == "__main__":
    main(sys.argv[1:])
