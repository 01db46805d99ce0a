"""Virtual time (no lock): does flow control's candidate filter change routing below saturation?

With flow control on, the gateway (`extproc/gateway/schedule.py` `_candidates`) drops, before the scheduling
profile runs, every endpoint without room for the request's class *keeping the class's reserve* (standard: 0.1),
whether or not the pool is saturated; with flow control off (no class) it drops none. The profile's own
saturation filter applies in both, with no reserve. The two differ only on an endpoint with a learned capacity C
whose load is in [C - ceil(0.1 C), C): on, it is dropped; off, kept.

This runs the issue's workload (8 h100-8b engines, KV 3,615 blocks, 48 x 3,000-token prompts, 300-token questions,
100 output tokens) through the real scheduler, engines, prefix caches and load model (tests/unit/scheduling/
fleet_harness.py), 5 s warm-up + 30 s, with the candidate filter on (reserve 0.1, as a standard request with flow
control on) or off, and reports per seed: TTFT p99, hit rate, capacities learned, and what the filter dropped
(`dropped`: requests for which it dropped an endpoint; `diverted`: endpoints it dropped that the profile's own
saturation filter keeps, i.e. where on and off can differ).

    PYTHONPATH=. nice -n 10 .venv/bin/python reports/i13-s12/candidates_vt.py [--popularity zipf:1.1] [--rate 60]
        [--reserve 0.1] SEEDS...
"""

from __future__ import annotations

import argparse

from extproc.bench.loadgen import RequestSpec
from extproc.bench.routing_metrics import kv_blocks_for
from extproc.bench.routing_workloads import shared_prefix_workload
from tests.unit.scheduling import fleet_harness
from tests.unit.scheduling.fleet_harness import RoutedFleet


class FilteredFleet(RoutedFleet):
    reserve: float = 0.0
    diverted = 0
    dropped = 0

    def offer(self, spec: RequestSpec) -> None:
        if self.reserve <= 0:
            super().offer(spec)
            return
        now = self.time.now
        # As _candidates with a class: keep the endpoints with room for it (all when none has any).
        with_room = [e for e in self.pool if (room := self.load.room(e, now, self.reserve)) is None or room > 0]
        kept = with_room or list(self.pool)
        if len(kept) < len(self.pool):
            self.dropped += 1
            # Dropped although the profile's own saturation filter (no reserve) keeps it.
            self.diverted += sum(1 for e in self.pool if e not in kept and not self.load.saturated(e, now))
        original = self.pool
        self.pool = tuple(kept)
        try:
            super().offer(spec)
        finally:
            self.pool = original


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--popularity", default="zipf:1.1")
    parser.add_argument("--rate", type=float, default=60.0)
    parser.add_argument("--reserve", type=float, default=0.1)
    parser.add_argument("--duration", type=float, default=30.0)
    parser.add_argument("seeds", type=int, nargs="*", default=[0, 1, 2])
    args = parser.parse_args()
    for seed in args.seeds:
        line = []
        for reserve in (args.reserve, 0.0):
            shared = shared_prefix_workload("m", groups=48, prefix_tokens=(3000, 3000), question_tokens=(300, 300),
                                            max_tokens=(100, 100), popularity=args.popularity, seed=seed)
            kv = kv_blocks_for(shared.prefix_working_set_tokens["chat"], 8)
            FilteredFleet.reserve = reserve
            fleets: list[FilteredFleet] = []

            def make(*a: object, fleets: list[FilteredFleet] = fleets, **k: object) -> FilteredFleet:
                fleet = FilteredFleet(*a, **k)  # type: ignore[arg-type]
                fleets.append(fleet)
                return fleet

            fleet_harness.RoutedFleet = make  # type: ignore[assignment,misc]
            try:
                result = fleet_harness.run(shared.next_spec, args.rate, endpoints=8, kv_blocks=kv, warmup_s=5.0,
                                           duration_s=args.duration, seed=seed)
            finally:
                fleet_harness.RoutedFleet = RoutedFleet  # type: ignore[misc]
            fleet = fleets[0]
            caps = [n.endpoint.engine.capacity for n in fleet.nodes]
            line.append(f"{'on ' if reserve else 'off'} p99 {result.ttft_percentile(99) * 1e3:6.1f} ms "
                        f"p99.9 {result.ttft_percentile(99.9) * 1e3:6.1f} hit {result.hit_rate:.4f} "
                        f"capacities {caps} dropped {fleet.dropped} diverted {fleet.diverted}")
        print(f"seed {seed}: " + " | ".join(line), flush=True)


if __name__ == "__main__":
    main()
