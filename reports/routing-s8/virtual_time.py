"""Issue 15's shared-prefix and drift workloads in virtual time (tests/unit/scheduling/fleet_harness.py: the real
scheduler, the simulator's step engines, scrapes every 100 ms), with prefix-affinity-scorer parameters overridden.
Session 8's copy of reports/routing-s7/virtual_time.py, with the drift workload (the hot set moves to the cold half
of the prompts halfway through the measured 20 s, as `extproc bench routing --workload drift` does).

    .venv/bin/python reports/routing-s8/virtual_time.py spread_waiting=0 drift:zipf:1.1 35.16 0,1,2,3
    .venv/bin/python reports/routing-s8/virtual_time.py spread_waiting=1 zipf:1.1 70.33 0,1,2,3

Prints, per seed: hit rate, TTFT p50/p90/p99 (engine-side: the harness has no Envoy or service hop), the most and
fewest requests an engine served, how many prefixes were served by more than one engine after warm-up, and how
many engines the hottest prefix (after the drift: the new hottest) was served by.
"""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from extproc.bench.routing_metrics import kv_blocks_for
from extproc.bench.routing_workloads import shared_prefix_workload
from extproc.scheduling.plugins import prefix_affinity
from tests.unit.scheduling.fleet_harness import run

ENDPOINTS, WARMUP_S, DURATION_S = 8, 5.0, 20.0


def main(overrides: str, popularity: str, rate: float, seeds: str) -> None:
    changes = dict(item.split("=") for item in overrides.split(",") if item)
    create = prefix_affinity.create

    def patched(name: str, parameters: Any) -> prefix_affinity.PrefixAffinityScorer:
        params = create(name, parameters).params
        typed = {key: type(getattr(params, key))(value) for key, value in changes.items()}
        return prefix_affinity.PrefixAffinityScorer(name, dataclasses.replace(params, **typed))

    prefix_affinity.create = patched
    drift = popularity.startswith("drift:")
    popularity = popularity.removeprefix("drift:")
    for seed in (int(s) for s in seeds.split(",")):
        shared = shared_prefix_workload(
            "m", groups=48, prefix_tokens=(3000, 3000), question_tokens=(300, 300), max_tokens=(100, 100),
            popularity=popularity, seed=seed,
            drift_after=round(rate * (WARMUP_S + DURATION_S / 2)) if drift else None)
        kv_blocks = kv_blocks_for(shared.prefix_working_set_tokens["chat"], ENDPOINTS)
        r = run(shared.next_spec, rate, endpoints=ENDPOINTS, kv_blocks=kv_blocks, warmup_s=WARMUP_S,
                duration_s=DURATION_S, seed=seed)
        moved = sum(1 for homes in r.homes.values() if len(homes) > 1)
        per_engine = [sum(1 for homes in r.homes.values() if i in homes) for i in range(ENDPOINTS)]
        hottest = r.homes.get("24" if drift else "0", set())
        print(f"{overrides or 'defaults'} {'drift:' if drift else ''}{popularity} {rate:g} req/s seed {seed}: "
              f"hit {r.hit_rate:.4f} TTFT p50 {r.ttft_percentile(50) * 1e3:.1f} "
              f"p90 {r.ttft_percentile(90) * 1e3:.1f} p99 {r.ttft_percentile(99) * 1e3:.1f} ms; "
              f"requests per engine {max(r.requests)}/{min(r.requests)}; prefixes on more than one engine {moved}; "
              f"hottest on {len(hottest)}; prefixes per engine {sorted(per_engine, reverse=True)}", flush=True)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], float(sys.argv[3]), sys.argv[4])
