"""Issue 15's shared-prefix workloads in virtual time (tests/unit/scheduling/fleet_harness.py: the real scheduler,
the simulator's step engines, scrapes every 100 ms), with prefix-affinity-scorer parameters overridden.

    .venv/bin/python reports/routing-s7/virtual_time.py hot_hold_ms=0 uniform 70 0,1,2,3
    .venv/bin/python reports/routing-s7/virtual_time.py hot_hold_ms=300 zipf:1.1 70 0,1,2,3

Prints, per seed: hit rate, TTFT p50/p90/p99 (engine-side: the harness has no Envoy or service hop), the most and
fewest requests an engine served, and how many prefixes were served by more than one engine after warm-up.
"""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from extproc.scheduling.plugins import prefix_affinity
from tests.unit.scheduling.fleet_harness import run
from tests.unit.scheduling.test_placement_in_virtual_time import ENDPOINTS, workload


def main(overrides: str, popularity: str, rate: float, seeds: str) -> None:
    changes = dict(item.split("=") for item in overrides.split(",") if item)
    create = prefix_affinity.create

    def patched(name: str, parameters: Any) -> prefix_affinity.PrefixAffinityScorer:
        params = create(name, parameters).params
        typed = {key: type(getattr(params, key))(value) for key, value in changes.items()}
        return prefix_affinity.PrefixAffinityScorer(name, dataclasses.replace(params, **typed))

    prefix_affinity.create = patched
    for seed in (int(s) for s in seeds.split(",")):
        next_spec, kv_blocks = workload(popularity)
        r = run(next_spec, rate, endpoints=ENDPOINTS, kv_blocks=kv_blocks, warmup_s=5.0, duration_s=20.0, seed=seed)
        moved = sum(1 for homes in r.homes.values() if len(homes) > 1)
        print(f"{overrides or 'defaults'} {popularity} {rate:g} req/s seed {seed}: hit {r.hit_rate:.4f} "
              f"TTFT p50 {r.ttft_percentile(50) * 1e3:.1f} p90 {r.ttft_percentile(90) * 1e3:.1f} "
              f"p99 {r.ttft_percentile(99) * 1e3:.1f} ms; requests per engine {max(r.requests)}/{min(r.requests)}; "
              f"prefixes on more than one engine {moved}", flush=True)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], float(sys.argv[3]), sys.argv[4])
