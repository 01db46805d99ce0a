"""Where does a prompt group's first request (a cold prefill) land, against the prefix-affinity scorer's rendezvous
rank of the anchor block over the point's endpoint addresses (127.0.0.1:<port>, ports drawn afresh for every point)?
Prints, per point, how often the first placement of a group went to the engine ranked first for it (and second, ...),
and, per seed, how many groups two strategies' port sets send to the same first-ranked engine (position in the pool).

    python3 reports/i13-s12/ranks.py RUN_DIR FIRST SECOND
"""

from __future__ import annotations

import json
import sys
from collections import Counter
from pathlib import Path

import yaml

from extproc.openai import Api
from extproc.openai.prompt import MESSAGE_START, prompt_text
from extproc.scheduling.prefix import PrefixChains, rendezvous

sys.path.insert(0, str(Path(__file__).parent))
from pairs import point, shape_of  # noqa: E402

from extproc.bench.routing_plan import DRIFT_AT, layout_for  # noqa: E402

ANCHOR_BLOCKS = 8


def anchors(meta: dict, seed: int, rate: float) -> dict[str, int]:
    workload = layout_for(meta["workload"], meta["endpoints"], shape_of(meta)).workload(
        seed, round(rate * (meta["warmup_s"] + DRIFT_AT * meta["duration_s"])))
    chains = PrefixChains(MESSAGE_START)
    out: dict[str, int] = {}
    for i in range(4000):
        spec = workload.next_spec(i)
        group = spec.labels["group"]
        if group not in out:
            blocks = chains(prompt_text(Api.CHAT, json.loads(spec.body)))
            out[group] = blocks[min(len(blocks), ANCHOR_BLOCKS) - 1]
        if len(out) == 48:
            break
    return out


def main(run: Path, first: str, second: str) -> None:
    meta = json.loads((run / "results.json").read_text())
    rows = {(r["strategy"], r["qps"], r["seed"]): r for r in meta["points"] if "failed" not in r}
    for (strategy, rate, seed), row in sorted(rows.items(), key=lambda kv: (kv[0][1], kv[0][2], kv[0][0])):
        if strategy not in (first, second):
            continue
        keys = anchors(meta, seed, rate)
        policy = yaml.safe_load((Path(meta["workdir"]) / f"s{seed}-{strategy}-q{rate:g}" / "policy.yaml").read_text())
        addresses = policy["pools"][0]["endpoints"]
        requests = point(run, meta, row)
        positions: Counter[int] = Counter()
        seen: set[str] = set()
        for r in requests:
            if r["group"] in seen:
                continue
            seen.add(r["group"])
            ranked = sorted(range(len(addresses)), key=lambda i: -rendezvous(keys[r["group"]], addresses[i]))
            positions[ranked.index(r["engine"])] += 1
        top = {g: max(range(len(addresses)), key=lambda i: rendezvous(k, addresses[i])) for g, k in keys.items()}
        load = Counter(top.values())
        print(f"q{rate:g} s{seed} {strategy:15s}: first placements by rank {dict(sorted(positions.items()))} "
              f"of {sum(positions.values())}; groups per first-ranked engine {sorted(load.values(), reverse=True)}")


if __name__ == "__main__":
    main(Path(sys.argv[1]), sys.argv[2], sys.argv[3])
