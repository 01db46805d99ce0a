"""The demand KEDA is told: trend projected ahead when rising, falls held for the stabilisation window."""

from __future__ import annotations

import pytest

from extproc.autoscale import AutoscalingConfig, DemandTracker
from extproc.autoscale.demand import slope


def tracker(**settings: float) -> DemandTracker:
    config = AutoscalingConfig.model_validate({"sample_interval_s": 1.0, **settings})
    return DemandTracker(lambda: config)


def test_slope_is_the_least_squares_fit() -> None:
    assert slope([(0, 1), (1, 3), (2, 5)]) == pytest.approx(2.0)
    assert slope([(0, 4)]) == 0.0
    assert slope([(1, 4), (1, 9)]) == 0.0


def test_a_rising_demand_is_projected_ahead_and_a_falling_one_is_not() -> None:
    demand = tracker(predict_s=10, trend_window_s=5, scale_down_stabilization_s=0)
    for t in range(5):
        estimate = demand.observe("p", float(t), 2.0 * t)  # +2 requests per second
    assert estimate.trend_per_s == pytest.approx(2.0)
    assert estimate.value == pytest.approx(8.0 + 2.0 * 10)
    for t in range(5, 12):
        estimate = demand.observe("p", float(t), 20.0 - 2.0 * t)
    assert estimate.trend_per_s < 0
    assert estimate.value == pytest.approx(max(0.0, 20.0 - 2.0 * 11))  # the present, never less


def test_a_fall_is_reported_only_after_the_stabilisation_window() -> None:
    demand = tracker(predict_s=0, scale_down_stabilization_s=30)
    demand.observe("p", 0.0, 12.0)
    assert demand.observe("p", 1.0, 2.0).value == 12.0
    assert demand.observe("p", 29.0, 2.0).value == 12.0
    assert demand.observe("p", 31.0, 2.0).value == 2.0
    assert demand.observe("p", 32.0, 40.0).value == 40.0  # a rise shows at once


def test_activity_follows_demand_through_the_window() -> None:
    demand = tracker(predict_s=0, scale_down_stabilization_s=5)
    assert not demand.observe("p", 0.0, 0.0).active
    held = demand.observe("p", 1.0, 1.0, held=1)  # one request held for a pool at zero replicas
    assert held.active and held.held == 1
    assert demand.observe("p", 2.0, 0.0).active  # served: the window still reports it
    assert not demand.observe("p", 7.0, 0.0).active
    demand.keep(["other"])
    assert demand.estimate("p") is None


def test_samples_older_than_every_window_are_dropped() -> None:
    demand = tracker(predict_s=0, trend_window_s=10, scale_down_stabilization_s=10)
    for t in range(100):
        demand.observe("p", float(t), 1.0)
    assert len(demand._samples["p"]) <= 12


def test_a_past_forecast_is_not_held_by_the_window() -> None:
    demand = tracker(predict_s=10, trend_window_s=3, scale_down_stabilization_s=60)
    for t in range(4):
        rising = demand.observe("p", float(t), 2.0 * t)
    assert rising.value == pytest.approx(6.0 + 2.0 * 10)
    for t in range(4, 8):
        flat = demand.observe("p", float(t), 6.0)
    assert flat.trend_per_s == pytest.approx(0.0)
    assert flat.value == 6.0  # the window keeps the highest demand seen, not the forecast made on the way up


def test_smoothing_reports_the_mean_of_a_noisy_load_not_its_peaks() -> None:
    noisy = [4.0, 20.0, 6.0, 18.0, 8.0, 16.0, 12.0, 12.0] * 5  # mean 12, peaks 20
    raw, smooth = (tracker(predict_s=0, scale_down_stabilization_s=10, smoothing_s=s) for s in (0.0, 4.0))
    for i, d in enumerate(noisy):
        first, second = raw.observe("p", i * 0.5, d), smooth.observe("p", i * 0.5, d)
    assert first.value == 20.0  # the window's highest sample
    assert second.value == pytest.approx(12.0, abs=1.0)  # the highest 4 s mean: the load's level
    assert second.demand == 12.0  # the sample itself is kept as it was


def test_a_smoothed_rise_shows_in_full_within_the_smoothing_window() -> None:
    demand = tracker(predict_s=0, scale_down_stabilization_s=0, smoothing_s=2)
    for i in range(4):
        demand.observe("p", i * 0.5, 0.0)
    assert 0 < demand.observe("p", 2.0, 10.0).value < 10.0
    for t in (2.5, 3.0, 3.5):
        estimate = demand.observe("p", t, 10.0)
    assert estimate.value == pytest.approx(10.0)
