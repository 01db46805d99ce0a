"""The admin HTTP server on a real socket: open health and metrics, token- or loopback-protected debug and
rollout endpoints, CSRF-safe POSTs, a rate-limited explain that never checks keys and never answers 500."""

from __future__ import annotations

import gc
import json
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import pytest_asyncio
from prometheus_client.parser import text_string_to_metric_families

from extproc.config import parse_policy
from extproc.server.app import Service, build_service
from extproc.tenants import hash_key
from tests.support import eventually

pytestmark = pytest.mark.asyncio

POLICY = """\
service: {{grpc_port: {grpc}, admin_port: {admin}, explain_per_s: 2{extra}}}
auth: {{mode: api-key, keys_file: {keys}}}
pools:
  - {{name: chat, model: org/chat, aliases: [chat], endpoints: ["127.0.0.1:9"]}}
  - {{name: next, model: org/next, endpoints: ["127.0.0.1:10"]}}
rollout:
  splits:
    - {{model: canary, backends: [{{pool: chat, weight: 90}}, {{pool: next, weight: 10}}],
       rollout: {{canary: next, baseline: chat, steps: [10, 50], hold_s: 3600}}}}
"""


async def start(tmp_path: Path, extra: str = "") -> Service:
    from extproc.bench.stack import free_ports

    grpc_port, admin_port = free_ports(2)
    keys = tmp_path / "keys.json"
    keys.write_text(json.dumps({"tenants": [{"name": "acme", "keys": [{"sha256": hash_key("k-acme")}]}]}))
    text = POLICY.format(grpc=grpc_port, admin=admin_port, keys=keys, extra=extra)
    service = build_service(parse_policy(text), tmp_path / "policy.yaml")
    await service.start()
    return service


@pytest_asyncio.fixture
async def http() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession() as session:
        yield session


async def test_without_a_token_debug_answers_loopback_names_only(tmp_path: Path, http: aiohttp.ClientSession) -> None:
    service = await start(tmp_path)
    url = f"http://127.0.0.1:{service.admin_port}"
    try:
        async with http.get(f"{url}/debug/pools") as response:
            assert response.status == 200
        # A page that rebinds its own DNS name to 127.0.0.1 still sends its own Host: refused.
        async with http.get(f"{url}/debug/pools", headers={"host": "evil.example"}) as response:
            assert response.status == 403
        async with http.get(f"{url}/metrics", headers={"host": "evil.example"}) as response:
            assert response.status == 200  # metrics and health stay open
    finally:
        await service.stop(grace_s=0)


async def test_with_a_token_everything_but_health_and_metrics_needs_it(tmp_path: Path,
                                                                      http: aiohttp.ClientSession) -> None:
    token = tmp_path / "admin-token"
    token.write_text("adm1n")
    service = await start(tmp_path, f", admin_token_file: {token}")
    url, auth = f"http://127.0.0.1:{service.admin_port}", {"authorization": "Bearer adm1n"}
    try:
        for path in ("/metrics", "/healthz", "/readyz"):
            async with http.get(url + path) as response:
                assert response.status == 200, path
        for path in ("/debug/pools", "/debug/flow", "/debug/rollouts", "/debug/loop"):
            async with http.get(url + path) as response:
                assert response.status == 401, path
            async with http.get(url + path, headers={"authorization": "Bearer wrong"}) as response:
                assert response.status == 401, path
            async with http.get(url + path, headers=auth) as response:
                assert response.status == 200, path
        # Even with the token a state change needs a JSON body: no form post from a page can make one.
        async with http.post(f"{url}/rollouts/pause?model=canary", data="x", headers={
                **auth, "content-type": "application/x-www-form-urlencoded"}) as response:
            assert response.status == 415
        async with http.post(f"{url}/rollouts/pause?model=canary", json={}, headers=auth) as response:
            assert response.status == 200
            assert "paused" in (await response.json())["state"]
    finally:
        await service.stop(grace_s=0)


async def test_explain_decides_as_a_named_tenant_and_is_rate_limited(tmp_path: Path,
                                                                    http: aiohttp.ClientSession) -> None:
    service = await start(tmp_path)
    url = f"http://127.0.0.1:{service.admin_port}/debug/explain"
    body = {"model": "chat", "messages": [{"role": "user", "content": "hi"}]}
    try:
        async with http.post(url, json={"body": body, "tenant": "acme"}) as response:
            assert response.status == 200
            assert (await response.json())["decision"] == "route"
        async with http.post(url, json={"body": body, "tenant": "nobody"}) as response:
            assert response.status == 404
        seen = set()
        for spec in ([], {"headers": "x"}, {"headers": {"a": {"b": 1}}}, {"path": None}, {"body": body},
                     {"body": body, "headers": {"authorization": "Bearer k-acme"}}):
            async with http.post(url, json=spec) as response:
                seen.add(response.status)
        async with http.post(url, data=b"\xff\xfe", headers={"content-type": "application/json"}) as response:
            seen.add(response.status)
        assert seen <= {400, 429} and 429 in seen  # never a 500; 2 calls per second, a burst of 4
    finally:
        await service.stop(grace_s=0)



async def test_a_blocked_event_loop_shows_in_debug_loop_and_in_the_lag_histogram(
        tmp_path: Path, http: aiohttp.ClientSession) -> None:
    service = await start(tmp_path)
    url = f"http://127.0.0.1:{service.admin_port}"

    async def loop_state() -> dict[str, Any]:
        async with http.get(f"{url}/debug/loop") as response:
            assert response.status == 200
            state: dict[str, Any] = (await response.json())["loop"]
            return state

    async def lagged_over(bound: float) -> float:
        async with http.get(f"{url}/metrics") as response:
            text = await response.text()
        buckets = {s.labels["le"]: s.value for f in text_string_to_metric_families(text)
                   for s in f.samples if s.name == "extproc_event_loop_lag_seconds_bucket"}
        return buckets["+Inf"] - buckets[str(bound)]

    try:
        await eventually(lambda: _ticked(loop_state), "the lag monitor ticks")
        end = time.perf_counter() + 0.4
        while time.perf_counter() < end:  # hold the service's loop (it runs in this test's loop)
            pass
        state = await eventually(lambda: _max_over(loop_state, 0.3), "the 0.4 s block in /debug/loop")
        assert state["max_lag_at"] is not None
        assert await eventually(lambda: lagged_over(0.25), "the block in extproc_event_loop_lag_seconds") == 1
    finally:
        await service.stop(grace_s=0)


async def _ticked(state: Callable[[], Awaitable[dict[str, Any]]]) -> bool:
    return int((await state())["ticks"]) > 0


async def _max_over(state: Callable[[], Awaitable[dict[str, Any]]], bound: float) -> dict[str, Any] | None:
    found = await state()
    return found if found["max_lag_s"] >= bound else None


async def test_the_service_exports_its_garbage_collections(tmp_path: Path, http: aiohttp.ClientSession) -> None:
    service = await start(tmp_path)  # runs in this test's process: its collections are the service's

    async def collections() -> dict[str, float]:
        async with http.get(f"http://127.0.0.1:{service.admin_port}/metrics") as response:
            text = await response.text()
        return {s.name: s.value for f in text_string_to_metric_families(text) for s in f.samples
                if s.labels.get("generation") == "2" and s.name in (
                    "extproc_gc_pause_seconds_count", "extproc_gc_collected_objects_total")}

    try:
        before = await collections()
        cycle: list[object] = []
        cycle.append(cycle)
        del cycle
        gc.collect(2)
        after = await collections()
        assert after["extproc_gc_pause_seconds_count"] >= before["extproc_gc_pause_seconds_count"] + 1
        assert after["extproc_gc_collected_objects_total"] >= before["extproc_gc_collected_objects_total"] + 1
    finally:
        await service.stop(grace_s=0)
