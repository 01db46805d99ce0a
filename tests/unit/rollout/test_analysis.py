from __future__ import annotations

import random

import pytest

from extproc.rollout import OutcomeWindows, PoolWindow, RolloutConfig, analyse, tpot_seconds
from extproc.rollout.analysis import Histogram, bucket_index, bucket_upper

CONFIG = RolloutConfig(canary="v2", baseline="v1", hold_s=300, min_samples=200, max_error_rate_delta=0.02,
                       max_ttft_p99_ratio=1.5, max_tpot_ratio=1.3)
START = 1000.0


def window(n: int, error_rate: float = 0.01, ttft_s: float | None = 0.2, tpot_s: float | None = 0.02,
           seed: int = 1) -> PoolWindow:
    rng = random.Random(seed)
    out = PoolWindow()
    for _ in range(n):
        ok = rng.random() >= error_rate
        jitter = rng.uniform(0.8, 1.2)
        out.record(ok, ttft_s * jitter if ttft_s and ok else None, tpot_s * jitter if tpot_s and ok else None)
    return out


def test_healthy_canary_is_promoted_after_the_hold() -> None:
    canary, baseline = window(300, seed=1), window(3000, seed=2)
    early = analyse(canary, baseline, CONFIG, now=START + 100, step_started_at=START)
    assert early.action == "wait" and "holding" in early.reason
    verdict = analyse(canary, baseline, CONFIG, now=START + 300, step_started_at=START)
    assert verdict.action == "promote", verdict.reason
    assert verdict.stats["canary_requests"] == 300


def test_error_rate_breach_rolls_back_without_waiting_for_the_hold() -> None:
    verdict = analyse(window(200, error_rate=0.10, seed=3), window(2000, seed=4), CONFIG, now=START + 1,
                      step_started_at=START)
    assert verdict.action == "rollback"
    assert "error rate" in verdict.reason and "baseline" in verdict.reason


def test_ttft_three_times_slower_rolls_back() -> None:
    verdict = analyse(window(250, ttft_s=0.6, seed=5), window(2000, ttft_s=0.2, seed=6), CONFIG,
                      now=START + 1, step_started_at=START)
    assert verdict.action == "rollback"
    assert "TTFT p99" in verdict.reason and "x3" in verdict.reason


def test_tpot_breach_rolls_back() -> None:
    verdict = analyse(window(250, tpot_s=0.04, seed=7), window(2000, tpot_s=0.02, seed=8), CONFIG,
                      now=START + 1, step_started_at=START)
    assert verdict.action == "rollback" and "TPOT" in verdict.reason


def test_not_enough_samples_waits_even_when_bad_or_held() -> None:
    bad_but_few = analyse(window(150, error_rate=0.5), window(2000), CONFIG, now=START + 999, step_started_at=START)
    assert bad_but_few.action == "wait" and "need 200 requests" in bad_but_few.reason
    few_baseline = analyse(window(500), window(100), CONFIG, now=START + 999, step_started_at=START)
    assert few_baseline.action == "wait"


def test_latency_metric_reported_by_neither_side_is_not_required() -> None:
    canary, baseline = window(300, ttft_s=None, tpot_s=None), window(300, ttft_s=None, tpot_s=None, seed=9)
    assert analyse(canary, baseline, CONFIG, now=START + 300, step_started_at=START).action == "promote"
    canary.ttft.add(0.1)  # one side reports some TTFT: now it needs min_samples of it
    verdict = analyse(canary, baseline, CONFIG, now=START + 300, step_started_at=START)
    assert verdict.action == "wait" and "TTFT" in verdict.reason


def test_histogram_quantiles_within_bucket_width() -> None:
    histogram = Histogram()
    values = [i / 1000 for i in range(1, 1001)]  # 1 ms .. 1 s
    for value in values:
        histogram.add(value)
    assert histogram.quantile(0.99) == pytest.approx(0.99, rel=0.1)
    assert histogram.quantile(0.5) == pytest.approx(0.5, rel=0.1)
    assert histogram.mean == pytest.approx(sum(values) / len(values))
    assert bucket_index(0.0) == 0 and bucket_index(1e9) == bucket_index(1e12)
    for value in (0.0007, 0.05, 2.0, 90.0):
        assert bucket_upper(bucket_index(value)) >= value > bucket_upper(bucket_index(value) - 1)


def test_windows_merge_exactly_through_counters() -> None:
    a, b = window(100, seed=1), window(50, error_rate=0.2, seed=2)
    merged = PoolWindow.from_counters(a.to_counters())
    merged.merge(PoolWindow.from_counters(b.to_counters()))
    direct = window(100, seed=1)
    direct.merge(b)
    assert merged.requests == direct.requests == 150
    assert merged.errors == direct.errors
    assert merged.ttft.buckets == direct.ttft.buckets
    assert merged.tpot.total == pytest.approx(direct.tpot.total)


def test_outcome_windows_take_and_restore() -> None:
    outcomes = OutcomeWindows()
    outcomes.record("v2", False, None, None, now=5.0)
    outcomes.record("v2", True, 0.1, 0.01, now=6.0)
    taken = outcomes.take()
    assert taken["v2"].requests == 2 and taken["v2"].errors == 1 and taken["v2"].last_at == 6.0
    assert outcomes.take() == {}
    outcomes.restore(taken)
    assert outcomes.get("v2").requests == 2


def test_tpot_from_byte_timings() -> None:
    assert tpot_seconds(0.5, 1.5, 11) == pytest.approx(0.1)
    assert tpot_seconds(0.5, 1.5, 1) is None
    assert tpot_seconds(2.0, 1.0, 5) is None
