"""What an InferencePool and its pods say about a pool's endpoints (pure functions; the watch itself is tested
against a list/watch server in tests/integration/endpoints)."""

from __future__ import annotations

from typing import Any

from extproc.endpoints.inference_pool import Backoff, PoolSpec, pod_addresses, pool_spec, ready_ip


def pod(ip: str | None, ready: str = "True", deleting: bool = False) -> dict[str, Any]:
    metadata: dict[str, Any] = {"name": "p"}
    if deleting:
        metadata["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    status: dict[str, Any] = {"conditions": [{"type": "Ready", "status": ready}]}
    if ip is not None:
        status["podIP"] = ip
    return {"metadata": metadata, "status": status}


def test_the_spec_names_a_selector_and_unique_target_ports() -> None:
    pool = {"spec": {"selector": {"matchLabels": {"b": "2", "a": "1"}},
                     "targetPorts": [{"number": 8001}, {"number": 8000}, {"number": 8000}]}}
    assert pool_spec(pool) == PoolSpec((("a", "1"), ("b", "2")), (8000, 8001))


def test_a_pool_naming_no_selector_or_no_usable_port_names_no_endpoints() -> None:
    for spec in ({}, {"selector": {"matchLabels": {}}, "targetPorts": [{"number": 8000}]},
                 {"selector": {"matchLabels": {"a": "1"}}, "targetPorts": []},
                 {"selector": {"matchLabels": {"a": "1"}}, "targetPorts": [{"number": 0}, {"number": "8000"}]},
                 {"selector": {"matchLabels": {"a": 1}}, "targetPorts": [{"number": 8000}]}):
        assert pool_spec({"spec": spec}) is None, spec


def test_only_ready_pods_with_an_ip_that_are_not_terminating_serve() -> None:
    assert ready_ip(pod("10.0.0.1")) == "10.0.0.1"
    assert ready_ip(pod("10.0.0.1", ready="False")) is None
    assert ready_ip(pod(None)) is None
    assert ready_ip(pod("10.0.0.1", deleting=True)) is None
    assert ready_ip({"metadata": {}, "status": {"podIP": "10.0.0.1"}}) is None  # no Ready condition yet


def test_every_target_port_of_every_ready_pod_is_an_endpoint_ipv6_bracketed() -> None:
    pods = [pod("10.0.0.2"), pod("fd00::1"), pod("10.0.0.3", ready="False"), pod("10.0.0.2")]
    assert pod_addresses(pods, (8000, 8001)) == ("10.0.0.2:8000", "10.0.0.2:8001", "[fd00::1]:8000",
                                                "[fd00::1]:8001")


def test_backoff_doubles_to_its_bound_with_jitter_and_resets() -> None:
    draws = iter([0.0, 1.0, 0.5, 1.0, 0.0, 0.0])
    backoff = Backoff(0.5, 3.0, rand=lambda: next(draws))
    assert [backoff.delay() for _ in range(5)] == [0.25, 1.0, 1.5, 3.0, 1.5]
    backoff.reset()
    assert backoff.delay() == 0.25
