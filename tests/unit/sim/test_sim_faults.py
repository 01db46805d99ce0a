from __future__ import annotations

import pytest

from extproc.sim.faults import FaultError, Faults, FaultSettings, apply_update


def test_partial_update_keeps_other_settings_and_clear_resets() -> None:
    s = apply_update(FaultSettings(), {"error_rate": 0.5, "slow_factor": 2})
    s = apply_update(s, {"hang": True})
    assert (s.error_rate, s.slow_factor, s.hang) == (0.5, 2.0, True)
    s = apply_update(s, {"clear": True, "unhealthy": True})
    assert s == FaultSettings(unhealthy=True)


@pytest.mark.parametrize("update", [
    {"error_rate": 1.5}, {"error_rate": "x"}, {"burst": {"count": 2, "status": 404}}, {"burst": 3},
    {"hang": 1}, {"slow_factor": 0}, {"bogus": True}, {"crash_mid_stream": -1}, {"error_status": 200},
])
def test_bad_updates_are_rejected(update: dict[str, object]) -> None:
    with pytest.raises(FaultError):
        apply_update(FaultSettings(), update)


def test_burst_fails_exactly_n_requests_then_serves() -> None:
    faults = Faults(FaultSettings(), seed=1)
    faults.update({"burst": {"count": 3, "status": 429}})
    assert [faults.inference_error() for _ in range(5)] == [429, 429, 429, None, None]
    assert faults.settings.burst_count == 0


def test_error_rate_fails_about_that_fraction_deterministically() -> None:
    def draws(seed: int) -> list[int | None]:
        faults = Faults(FaultSettings(error_rate=0.25, error_status=503), seed=seed)
        return [faults.inference_error() for _ in range(2000)]

    first = draws(7)
    assert first == draws(7)
    failures = sum(1 for d in first if d == 503)
    assert 400 < failures < 600
    assert sum(1 for d in draws(7) if d is None) == 2000 - failures


def test_settings_round_trip_as_json_shape() -> None:
    data = FaultSettings(burst_count=2, burst_status=500).to_json()
    assert data["burst"] == {"count": 2, "status": 500}
    assert apply_update(FaultSettings(), {k: v for k, v in data.items()}) == FaultSettings(
        burst_count=2, burst_status=500)
