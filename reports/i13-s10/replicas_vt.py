"""Virtual time, several service replicas: flow control on vs off at 0.9x (the overload mix, 4 h100-8b engines, seats
learned, warm-up 1.5x for 8 s, 12 s idle, 15 s measured), with 1 or 3 replicas exchanging in-flight counts every
20 ms, and with shared scrapes. Harness: tests/unit/flow/harness.py (FlowFleet(replicas=..., share=...)).

Run: PYTHONPATH=. .venv/bin/python reports/i13-s10/replicas_vt.py [SEEDS...]
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
PROMPT = 110
ENGINES = 4
WARM = [(1.5, 8.0, False), (0.0, 12.0, False)]


def point(load: float, flow: bool, seed: int, replicas: int, share: bool) -> tuple[dict[str, list[float]], int, int, int]:
    profile = BUILTIN_PROFILES["h100-8b"]
    capacity = ENGINES * profile.capacity_rps(PROMPT, 96)
    config = FlowControlConfig()
    fleet = FlowFleet(profile, ENGINES, config, SaturationConfig(), None,
                      {name: spec.reserve for name, spec in config.classes.items()}, replicas=replicas, share=share)
    rng = random.Random(seed)
    measured: list[tuple[GenRequest, str, float]] = []
    marks: list[tuple[int, int, int]] = []
    at = 0.0
    index = 0
    turn = [0]

    def offer_off(request: GenRequest) -> None:
        fleet._route(request, turn[0])
        turn[0] = (turn[0] + 1) % replicas

    for rate, length, keep in [*WARM, (load, 15.0, True)]:
        end = at + length
        if rate > 0:
            while (at := at + rng.expovariate(rate * capacity)) < end:
                klass = rng.choices(list(MIX), list(MIX.values()))[0]
                base = 20_000 * (index := index + 1)
                request = GenRequest(f"r{index}", list(range(base, base + PROMPT)), list(range(rng.randint(64, 128))))
                if keep:
                    measured.append((request, klass, at))
                fleet.time.call_at(at, lambda r=request, k=klass: fleet.offer(r, k) if flow else offer_off(r))
        at = end
        fleet.time.call_at(at, lambda: marks.append((len(fleet.outcome.refused), fleet.outcome.held,
                                                     len(fleet.outcome.violations))))
    fleet.run(at + 30.0)
    ttft: dict[str, list[float]] = {klass: [] for klass in MIX}
    for request, klass, offered in measured:
        if request.first_token_at > 0:
            ttft[klass].append(request.first_token_at - offered)
    o = fleet.outcome
    return ttft, len(o.refused) - marks[1][0], o.held - marks[1][1], len(o.violations) - marks[1][2]


def p99(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))] if ordered else float("nan")


def main() -> None:
    seeds = [int(s) for s in sys.argv[1:]] or [1, 2, 3, 4, 5, 6]
    print("| seed | replicas | share | on crit | std | shed | off crit | std | shed | refused | held | violations |")
    print("|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for seed in seeds:
        for replicas, share in ((1, False), (3, False), (3, True)):
            on, refused, held, violations = point(0.9, True, seed, replicas, share)
            off, _, _, _ = point(0.9, False, seed, replicas, share)
            cells = " | ".join(f"{p99(t[k]) * 1000:.0f}" for t in (on, off) for k in MIX)
            print(f"| {seed} | {replicas} | {share} | {cells} | {refused} | {held} | {violations} |", flush=True)


if __name__ == "__main__":
    main()
