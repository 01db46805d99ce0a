from __future__ import annotations

from extproc.config.schema import HealthPolicy
from extproc.endpoints import Endpoint
from extproc.endpoints.health import HealthTracker

POOL = [Endpoint(f"10.0.0.{i}:8000") for i in range(1, 5)]


def tracker(**overrides: float) -> HealthTracker:
    policy = HealthPolicy.model_validate(overrides)
    return HealthTracker(lambda: policy)


def test_consecutive_failures_eject_and_success_resets_the_count() -> None:
    health = tracker()
    target = POOL[0]
    assert not health.record(target.address, False, 0.0, POOL)
    assert not health.record(target.address, False, 0.1, POOL)
    assert not health.record(target.address, True, 0.2, POOL)  # the streak is broken
    assert not health.record(target.address, False, 0.3, POOL)
    assert not health.record(target.address, False, 0.4, POOL)
    assert health.record(target.address, False, 0.5, POOL)
    assert not health.available(target, 1.0)
    assert health.usable(POOL, 1.0) == POOL[1:]
    assert health.states(1.0)[target.address] == "open"


def test_half_open_allows_one_probe_and_ejection_time_grows() -> None:
    health = tracker(base_ejection_s=5.0)
    target = POOL[0]
    for t in (0.0, 0.1, 0.2):
        health.record(target.address, False, t, POOL)
    assert not health.available(target, 5.1)
    assert health.available(target, 5.3)  # ejection over: half-open
    health.picked(target, 5.3)
    assert not health.available(target, 5.4)  # the single probe is in flight
    assert health.record(target.address, False, 5.5, POOL)  # probe failed: ejected again, for longer
    assert not health.available(target, 5.5 + 9.9)
    assert health.available(target, 5.5 + 10.1)
    health.picked(target, 15.7)
    health.record(target.address, True, 15.8, POOL)  # probe ok: closed
    assert health.states(15.9)[target.address] == "closed"
    assert health.available(target, 15.9)


def test_never_ejects_more_than_the_cap() -> None:
    health = tracker(max_ejected_percent=50.0)
    ejected = 0
    for endpoint in POOL:
        for t in (0.0, 0.1, 0.2):
            ejected += health.record(endpoint.address, False, t, POOL)
    assert ejected == 2
    assert len(health.usable(POOL, 0.5)) == 2


def test_failed_scrapes_make_an_endpoint_unavailable_until_one_succeeds() -> None:
    health = tracker(scrape_failures=3)
    endpoint = Endpoint("10.0.0.9:8000", scrape_failures=3)
    assert not health.available(endpoint, 0.0)
    endpoint.scrape_failures = 0
    assert health.available(endpoint, 0.0)
