"""Virtual time: an overload that starts from a busy pool (0.9x for 10 s, then 2x for 10 s, measured): critical's
TTFT p99 over the 2x phase and over its first 2 s, flow control on, 1 and 3 replicas, per seed.

Run: PYTHONPATH=. .venv/bin/python reports/i13-s11/vt_busy_2x.py SEEDS...
"""

from __future__ import annotations

import random
import sys

from extproc.config.schema import SaturationConfig
from extproc.flow import FlowControlConfig
from extproc.sim.engine import GenRequest
from extproc.sim.profile import BUILTIN_PROFILES
from tests.unit.flow.harness import FlowFleet

MIX = {"critical": 0.15, "standard": 0.5, "sheddable": 0.35}


def p99(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))] if ordered else float("nan")


def run(seed: int, replicas: int) -> tuple[float, float, float]:
    profile = BUILTIN_PROFILES["h100-8b"]
    capacity = 4 * profile.capacity_rps(110, 96)
    config = FlowControlConfig()
    fleet = FlowFleet(profile, 4, config, SaturationConfig(), None,
                      {name: spec.reserve for name, spec in config.classes.items()}, replicas=replicas)
    rng = random.Random(seed)
    measured: list[tuple[GenRequest, str, float]] = []
    at, index = 0.0, 0
    for rate, length, keep in ((1.5, 8.0, False), (0.0, 12.0, False), (0.9, 10.0, False), (2.0, 10.0, True)):
        end = at + length
        if rate > 0:
            while (at := at + rng.expovariate(rate * capacity)) < end:
                klass = rng.choices(list(MIX), list(MIX.values()))[0]
                base = 20_000 * (index := index + 1)
                request = GenRequest(f"r{index}", list(range(base, base + 110)), list(range(rng.randint(64, 128))))
                if keep:
                    measured.append((request, klass, at))
                fleet.time.call_at(at, lambda r=request, k=klass: fleet.offer(r, k))
        at = end
    fleet.run(at + 30.0)
    start = at - 10.0
    crit = [(r.first_token_at - t, t) for r, k, t in measured if k == "critical" and r.first_token_at > 0]
    return (p99([d for d, _ in crit]), p99([d for d, t in crit if t < start + 2.0]),
            max((d for d, t in crit), default=float("nan")))


for replicas in (1, 3):
    for seed in [int(s) for s in sys.argv[1:]] or [1, 2, 3]:
        whole, first, worst = run(seed, replicas)
        print(f"replicas {replicas} seed {seed}: critical p99 over 2x {whole * 1000:.0f} ms, first 2 s "
              f"{first * 1000:.0f} ms, max {worst * 1000:.0f} ms", flush=True)
