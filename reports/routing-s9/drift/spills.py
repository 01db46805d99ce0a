"""Every time a request of a known prompt is sent away from its prompt's homes (a spill: a full prefill elsewhere),
in one virtual-time run of issue 15's shared-prefix / drift workload, with the state the scheduler saw: the homes'
load (scraped running + waiting + sent since), the hot bound, the homes' running / waiting at their last scrape,
and the engine-side TTFT the spilled request got. Also prints, per engine, the longest run of scrapes with a queue.

    .venv/bin/python reports/routing-s9/drift/spills.py "" drift:zipf:1.1 35.16 0

Arguments: prefix-affinity-scorer overrides (k=v,...), popularity (`drift:` prefix for the drift workload), req/s,
seed.
"""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))

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
    state: dict[str, Any] = {"homes": {}, "events": [], "queues": {}}
    submit, offer, scrape = Engine.submit, fleet_harness.RoutedFleet.offer, fleet_harness.RoutedFleet._scrape

    def recording_submit(engine: Engine, generation: GenRequest) -> None:
        fleet = state["fleet"]
        where = next(i for i, n in enumerate(fleet.nodes) if n.engine is engine)
        homes = state["homes"].setdefault(state["group"], set())
        if homes and where not in homes and fleet.time.now >= WARMUP_S:
            now = fleet.time.now
            loads = [fleet.load.requests(n.endpoint, now) for n in fleet.nodes]
            bound = 1.5 * sum(loads) / len(loads) + 8.0
            seen = [(i, loads[i], fleet.nodes[i].endpoint.metrics) for i in sorted(homes)]
            state["events"].append((now, state["group"], where, loads[where], bound, seen, generation))
        homes.add(where)
        submit(engine, generation)

    def recording_offer(fleet: fleet_harness.RoutedFleet, spec: RequestSpec) -> None:
        state["fleet"], state["group"] = fleet, spec.labels["group"]
        offer(fleet, spec)

    def recording_scrape(fleet: fleet_harness.RoutedFleet, node: fleet_harness.Node) -> None:
        scrape(fleet, node)
        metrics = node.endpoint.metrics
        run = state["queues"].setdefault(id(node), [0, 0, 0])  # current run, longest run, most waiting
        run[0] = run[0] + 1 if metrics is not None and metrics.waiting > 0 else 0
        run[1] = max(run[1], run[0])
        run[2] = max(run[2], metrics.waiting if metrics is not None else 0)

    Engine.submit = recording_submit  # type: ignore[method-assign]
    fleet_harness.RoutedFleet.offer = recording_offer  # type: ignore[method-assign]
    fleet_harness.RoutedFleet._scrape = recording_scrape  # type: ignore[method-assign]
    result = fleet_harness.run(shared.next_spec, rate, endpoints=8, kv_blocks=kv_blocks_for(
        shared.prefix_working_set_tokens["chat"], 8), warmup_s=WARMUP_S, duration_s=DURATION_S, seed=seed)
    for now, group, where, load, bound, seen, generation in state["events"]:
        homes = "; ".join(f"engine {i} load {x:.0f} running {m.running:.0f} waiting {m.waiting:.0f}"
                          for i, x, m in seen if m is not None)
        print(f"t={now:6.2f} s prompt {group:>2} -> engine {where} (load {load:.0f}, bound {bound:.1f}) from {homes};"
              f" TTFT {(generation.first_token_at - now) * 1e3:.1f} ms")
    queues = [state["queues"][id(n)] for n in state["fleet"].nodes]
    print("longest queued scrapes per engine", [q[1] for q in queues], "most waiting", [q[2] for q in queues])
    ordered = sorted(result.ttft_s)
    pick = lambda q: ordered[min(len(ordered) - 1, int(q / 100 * len(ordered)))] * 1e3  # noqa: E731
    print(f"hit {result.hit_rate:.4f} p50 {pick(50):.1f} p90 {pick(90):.1f} p99 {pick(99):.1f} ms")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], float(sys.argv[3]), int(sys.argv[4]))
