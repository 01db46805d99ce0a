"""The overload benchmark's reading of the service's event-loop lag over a run (before/after, subtracted)."""

from __future__ import annotations

from extproc.bench.looplag import LoopLagCounts, parse_lag_buckets

TEXT = """\
# HELP extproc_event_loop_lag_seconds How late the event loop ran a periodic timer
# TYPE extproc_event_loop_lag_seconds histogram
extproc_event_loop_lag_seconds_bucket{le="0.001"} 290.0
extproc_event_loop_lag_seconds_bucket{le="0.01"} 299.0
extproc_event_loop_lag_seconds_bucket{le="0.1"} 299.0
extproc_event_loop_lag_seconds_bucket{le="1.0"} 300.0
extproc_event_loop_lag_seconds_bucket{le="+Inf"} 300.0
extproc_event_loop_lag_seconds_count 300.0
extproc_event_loop_lag_seconds_sum 0.9
"""


def test_the_run_p99_and_largest_lag_come_from_the_difference() -> None:
    after = LoopLagCounts(tuple(sorted(parse_lag_buckets(TEXT).items())), (0.8, 0.002))
    before = LoopLagCounts(((0.001, 10.0), (0.01, 10.0), (0.1, 10.0), (1.0, 10.0), (float("inf"), 10.0)),
                           (0.004, 0.002))
    run = (after - before).summary()
    # 290 ticks in the run: 280 under 1 ms, 9 under 10 ms, one between 0.1 and 1 s (the stall, under 1%).
    assert run["ticks"] == 290
    assert run["p99_ms_le"] == 10.0
    # The first replica's maximum grew in the run: the stall's exact length.
    assert run["max_ms"] == 800.0 and run["max_exact"]


def test_without_a_new_maximum_the_largest_lag_is_the_highest_counted_bucket() -> None:
    after = LoopLagCounts(((0.001, 50.0), (0.01, 60.0), (float("inf"), 60.0)), (2.0,))
    before = LoopLagCounts(((0.001, 10.0), (0.01, 10.0), (float("inf"), 10.0)), (2.0,))
    assert (after - before).summary() == {"ticks": 50, "p99_ms_le": 10.0, "max_ms": 10.0, "max_exact": False}
    assert LoopLagCounts().summary() == {"ticks": 0, "p99_ms_le": None, "max_ms": None, "max_exact": False}
