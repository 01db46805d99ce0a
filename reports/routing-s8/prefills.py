"""Every full prefill after warm-up in one virtual-time run of issue 15's shared-prefix / drift workload, with why:
`first` (the prompt's first request: every router pays it) or `new-home` (the prompt was cached elsewhere).

    .venv/bin/python reports/routing-s8/prefills.py "" drift:zipf:1.1 35.16 1
    .venv/bin/python reports/routing-s8/prefills.py "hot_hold_ms=0" uniform 70.53 0

Arguments as reports/routing-s8/virtual_time.py (prefix-affinity-scorer overrides, popularity, req/s), then a seed.
"""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from extproc.bench.loadgen import RequestSpec
from extproc.bench.routing_metrics import kv_blocks_for
from extproc.bench.routing_workloads import shared_prefix_workload
from extproc.scheduling.plugins import prefix_affinity
from extproc.sim.engine import Engine, GenRequest
from tests.unit.scheduling import fleet_harness

WARMUP_S, DURATION_S = 5.0, 20.0


def main(overrides: str, popularity: str, rate: float, seed: int) -> None:
    changes = dict(item.split("=") for item in overrides.split(",") if item)
    create = prefix_affinity.create

    def patched(name: str, parameters: Any) -> prefix_affinity.PrefixAffinityScorer:
        params = create(name, parameters).params
        typed = {key: type(getattr(params, key))(value) for key, value in changes.items()}
        return prefix_affinity.PrefixAffinityScorer(name, dataclasses.replace(params, **typed))

    prefix_affinity.create = patched
    drift = popularity.startswith("drift:")
    shared = shared_prefix_workload(
        "m", groups=48, prefix_tokens=(3000, 3000), question_tokens=(300, 300), max_tokens=(100, 100),
        popularity=popularity.removeprefix("drift:"), seed=seed,
        drift_after=round(rate * (WARMUP_S + DURATION_S / 2)) if drift else None)
    sent: list[tuple[Engine, GenRequest, float, str]] = []
    state: dict[str, Any] = {}
    submit, offer = Engine.submit, fleet_harness.RoutedFleet.offer

    def recording_submit(engine: Engine, generation: GenRequest) -> None:
        sent.append((engine, generation, state["fleet"].time.now, state["group"]))
        submit(engine, generation)

    def recording_offer(fleet: fleet_harness.RoutedFleet, spec: RequestSpec) -> None:
        state["fleet"], state["group"] = fleet, spec.labels["group"]
        offer(fleet, spec)

    Engine.submit = recording_submit  # type: ignore[method-assign]
    fleet_harness.RoutedFleet.offer = recording_offer  # type: ignore[method-assign]
    result = fleet_harness.run(shared.next_spec, rate, endpoints=8, kv_blocks=kv_blocks_for(
        shared.prefix_working_set_tokens["chat"], 8), warmup_s=WARMUP_S, duration_s=DURATION_S, seed=seed)
    index = {id(node.engine): i for i, node in enumerate(state["fleet"].nodes)}
    seen: dict[str, set[int]] = {}
    for engine, generation, at, group in sent:
        where = index[id(engine)]
        if generation.cached_tokens < 2000 and at >= WARMUP_S:
            why = "first" if group not in seen else "new-home" if where not in seen[group] else "evicted"
            print(f"t={at:6.2f} s prompt {group:>2} engine {where} TTFT "
                  f"{(generation.first_token_at - at) * 1e3:6.1f} ms {why}")
        seen.setdefault(group, set()).add(where)
    print(f"hit {result.hit_rate:.4f}")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], float(sys.argv[3]), int(sys.argv[4]))
