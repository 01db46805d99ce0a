"""Virtual-time comparison of queue orders while the pool is not saturated (the overload mix of
tests/unit/flow/test_overload_priority.py: 4 h100-8b engines, capacity learned, warm-up at 1.5x, drain, measure).

Per seed: per-class TTFT p99 at 0.9x with flow control on (each variant) and off; critical's p99 ratio 2x / 0.7x
from an idle fleet, and "onset": critical's p99 over the first 3 s of a 2x overload that follows 10 s at 0.9x
(no idle gap), divided by its 0.7x p99.

Run: PYTHONPATH=. .venv/bin/python reports/i13-s9/virtual_time.py
"""

from __future__ import annotations

import random

import extproc.flow.controller as controller
from extproc.config.schema import SaturationConfig
from extproc.flow import FlowControlConfig
from extproc.sim.engine import GenRequest
from extproc.sim.profile import BUILTIN_PROFILES
from tests.unit.flow.harness import FlowFleet

MIX = {"critical": 0.15, "standard": 0.5, "sheddable": 0.35}
PROMPT = 110
ENGINES = 4
SEEDS = (1, 2, 3, 4, 5, 6)


def _kept_s8(reserve: float, reserving: bool, queued: bool) -> float:
    """Before the last change: the top class probes past a learned capacity even while requests queue here."""
    return reserve if reserving or reserve <= 0 else controller._NO_RESERVE


class Rule:
    """A queue rule to compare, applied by patching the controller module for the duration of a run."""

    def __init__(self, seat_lost: bool, peers: bool, probe_while_queued: bool) -> None:
        self.seat_lost, self.peers, self.probe_while_queued = seat_lost, peers, probe_while_queued

    def __enter__(self) -> None:
        self._saved = controller._NO_RESERVE, controller._levels, controller._kept
        if self.seat_lost:  # main before this session: 1e-9 cost a lower class one seat per engine (rounding)
            controller._NO_RESERVE = 1e-7  # type: ignore[misc]  # keeps ceil(32e-7 - 1e-6) = 1 seat: 31 of 32
        if not self.peers:
            controller._levels = lambda config, reserving: None  # type: ignore[assignment]
        if self.probe_while_queued:
            controller._kept = _kept_s8  # type: ignore[assignment]

    def __exit__(self, *_: object) -> None:
        controller._NO_RESERVE, controller._levels, controller._kept = self._saved  # type: ignore[misc]


RULES = {"main (s8)": Rule(seat_lost=True, peers=False, probe_while_queued=True),
         "seat fix + peers": Rule(seat_lost=False, peers=True, probe_while_queued=True),
         "+ no probe while queued (final)": Rule(seat_lost=False, peers=True, probe_while_queued=False)}


def point(phases: list[tuple[float, float, bool]], flow: bool, seed: int) -> tuple[dict[str, list[float]], int]:
    """phases: (load, seconds, measured); a load of 0 is an idle gap."""
    profile = BUILTIN_PROFILES["h100-8b"]
    capacity = ENGINES * profile.capacity_rps(PROMPT, 96)
    config = FlowControlConfig()
    fleet = FlowFleet(profile, ENGINES, config, SaturationConfig(), None,
                      {name: spec.reserve for name, spec in config.classes.items()})
    rng = random.Random(seed)
    measured: list[tuple[GenRequest, str, float]] = []
    refused_at: list[int] = []
    at = 0.0
    index = 0
    for load, length, keep in phases:
        end = at + length
        if load > 0:
            while (at := at + rng.expovariate(load * capacity)) < end:
                klass = rng.choices(list(MIX), list(MIX.values()))[0]
                base = 20_000 * (index := index + 1)
                request = GenRequest(f"r{index}", list(range(base, base + PROMPT)), list(range(rng.randint(64, 128))))
                if keep:
                    measured.append((request, klass, at))
                fleet.time.call_at(at, lambda r=request, k=klass: fleet.offer(r, k) if flow else fleet._route(r))
        at = end
        fleet.time.call_at(at, lambda: refused_at.append(len(fleet.outcome.refused)))
    fleet.run(at + 30.0)
    ttft: dict[str, list[float]] = {klass: [] for klass in MIX}
    for request, klass, offered in measured:
        if request.first_token_at > 0:
            ttft[klass].append(request.first_token_at - offered)
    keep_index = next(i for i, (_, _, keep) in enumerate(phases) if keep)
    before = refused_at[keep_index - 1] if keep_index else 0
    return ttft, refused_at[keep_index] - before


def p99(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))] if ordered else float("nan")


def ms(values: list[float]) -> str:
    return f"{p99(values) * 1000:.0f}"


WARM = [(1.5, 8.0, False), (0.0, 12.0, False)]


def main() -> None:
    print("| seed | rule | 0.9x crit | std | shed | refused | off crit | std | shed | 2x/0.7x | onset/0.7x |")
    print("|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for seed in SEEDS:
        off, _ = point([*WARM, (0.9, 15.0, True)], False, seed)
        for name, rule in RULES.items():
            with rule:
                on, refused = point([*WARM, (0.9, 15.0, True)], True, seed)
                calm, _ = point([*WARM, (0.7, 15.0, True)], True, seed)
                over, _ = point([*WARM, (2.0, 15.0, True)], True, seed)
                onset, _ = point([*WARM, (0.9, 10.0, False), (2.0, 3.0, True)], True, seed)
            base = p99(calm["critical"])
            print(f"| {seed} | {name} | {ms(on['critical'])} | {ms(on['standard'])} | {ms(on['sheddable'])} |"
                  f" {refused} | {ms(off['critical'])} | {ms(off['standard'])} | {ms(off['sheddable'])} |"
                  f" {p99(over['critical']) / base:.2f} | {p99(onset['critical']) / base:.2f} |", flush=True)


if __name__ == "__main__":
    main()
