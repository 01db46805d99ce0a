"""The autoscale bench's controller rules (KEDA + the HPA) and its report arithmetic."""

from __future__ import annotations

import argparse

import pytest

from extproc.bench.autoscale import capacity_rps, configure, demand_lags, direction_changes, follow_lags, phases
from extproc.bench.keda_controller import desired_replicas


def desired(value: float, current: int, active: bool = True, inactive_for_s: float = 0.0) -> int:
    return desired_replicas(value, 4.0, current, active, inactive_for_s, minimum=0, maximum=5, cooldown_s=30)


def test_replicas_are_the_metric_over_the_target_within_bounds() -> None:
    assert desired(13.0, 1) == 4
    assert desired(100.0, 1) == 5  # capped at maximum
    assert desired(0.5, 0) == 1  # active: at least one replica
    assert desired(8.5, 2) == 2  # within the HPA's 10% tolerance: no change
    assert desired(9.0, 2) == 3


def test_zero_only_after_the_cooldown() -> None:
    assert desired(0.0, 2, active=False, inactive_for_s=10) == 2
    assert desired(0.0, 2, active=False, inactive_for_s=31) == 0
    assert desired(0.0, 0, active=False) == 0


def test_lags_count_until_the_desired_replicas_are_ready() -> None:
    timeline = [{"t": 0.0, "desired": 0.0}, {"t": 1.0, "desired": 2.0}, {"t": 2.0, "desired": 2.0},
                {"t": 3.0, "desired": 3.0}]
    assert follow_lags(timeline, [(4.0, 1), (5.5, 2), (9.0, 3)]) == [4.5, 6.0]
    assert follow_lags(timeline, [(4.0, 1)]) == [float("inf"), float("inf")]


def test_direction_changes_count_flapping() -> None:
    assert direction_changes([0, 1, 2, 2, 3, 1, 0]) == 1
    assert direction_changes([0, 2, 1, 2, 1]) == 3
    assert direction_changes([]) == 0


def test_the_load_is_a_staircase_up_a_hold_and_down() -> None:
    parser = argparse.ArgumentParser()
    configure(parser)
    args = parser.parse_args(["--ramp", "10", "--hold", "5"])
    peak = args.peak * capacity_rps()
    segments = phases(args, peak)
    rates = [rate for _, _, _, rate in segments]
    assert rates[0] == pytest.approx(peak / 5) and max(rates) == pytest.approx(peak) and rates[-1] == 0.0
    assert [p for p, *_ in segments].count("hold") == 1
    ends = [start + duration for _, start, duration, _ in segments]
    assert all(abs(end - nxt[1]) < 1e-9 for end, nxt in zip(ends, segments[1:], strict=False))


def test_load_follow_counts_from_when_the_offered_load_needs_each_replica() -> None:
    segments = [("ramp-up", 2.0, 2.0, 5.0), ("ramp-up", 4.0, 2.0, 10.0), ("ramp-up", 6.0, 2.0, 15.0),
                ("ramp-up", 8.0, 2.0, 20.0), ("hold", 10.0, 5.0, 20.0)]
    timeline = [{"t": 2.5, "desired": 1.0}, {"t": 6.5, "desired": 2.0}, {"t": 8.5, "desired": 3.0}]
    rows = demand_lags(segments, 10.0, timeline, [(7.0, 1), (12.0, 2)])
    assert [(r["replicas"], r["load_needs_at_s"], r["asked_after_s"], r["ready_after_s"]) for r in rows] == [
        (1, 2.0, 0.5, 5.0), (2, 6.0, 0.5, 6.0)]  # 10 rps is exactly one replica's: 2 only above it
    rows = demand_lags(segments, 5.0, timeline, [(7.0, 1)])
    assert [(r["replicas"], r["asked_at_s"], r["ready_at_s"]) for r in rows][-1] == (4, None, None)
