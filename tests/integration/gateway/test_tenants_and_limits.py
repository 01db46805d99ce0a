"""Tenancy and limits through real Envoy + service + simulator (one service process), with the memory store
and with Redis (slices on, their default)."""

from __future__ import annotations

import asyncio
import json
import random
from collections.abc import AsyncIterator
from functools import partial
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import pytest_asyncio
from redis.asyncio import Redis

from extproc.bench.loadgen import RequestSpec, run_open_loop
from extproc.bench.procs import ProcessGroup
from extproc.bench.stack import SimPool, Stack, launch
from extproc.tenants import hash_key
from tests.integration.limits.redis_server import RedisServer
from tests.support import debug_pools, eventually, metric_value, wait_metric

pytestmark = pytest.mark.asyncio(loop_scope="module")

POOL = SimPool("chat", "org/chat", 2, aliases=("chat",))
KEYS = {"tok": "tenant-tokens", "cc": "tenant-concurrency", "free": "tenant-free", "dead": "tenant-revoked"}


def keys_file() -> str:
    def tenant(name: str, key: str, limits: dict[str, Any], revoked: bool = False) -> dict[str, Any]:
        return {"name": name, "tier": "default", "limits": limits,
                "keys": [{"sha256": hash_key(key), "revoked": revoked}]}

    return json.dumps({"tenants": [
        tenant("tokens", KEYS["tok"], {"tokens_per_min": 600}),
        tenant("concurrency", KEYS["cc"], {"concurrency": 2}),
        tenant("free", KEYS["free"], {"concurrency": 40}),
        tenant("revoked", KEYS["dead"], {}, revoked=True),
    ]})


REDIS_DB = 5  # the session's redis-server is shared: this module's limits keys live in their own database


@pytest.fixture(scope="module", params=["memory", "redis"])
def store_url(request: pytest.FixtureRequest) -> str | None:
    """The limits store of the stack: None (memory) or a Redis URL."""
    if request.param == "memory":
        return None
    server: RedisServer = request.getfixturevalue("redis_server")
    return f"redis://127.0.0.1:{server.port}/{REDIS_DB}"


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def stack(tmp_path_factory: pytest.TempPathFactory, store_url: str | None) -> AsyncIterator[Stack]:
    workdir: Path = tmp_path_factory.mktemp("limits")
    workdir.joinpath("keys.yaml").write_text(keys_file())
    policy: dict[str, Any] = {"auth": {"mode": "api-key", "keys_file": str(workdir / "keys.yaml")}}
    if store_url is not None:
        redis = Redis.from_url(store_url)
        await redis.flushdb()
        await redis.aclose()
        policy["limits"] = {"store": "redis", "redis_url": store_url}
    async with ProcessGroup(workdir / "logs") as group:
        yield await launch(group, workdir, [POOL], extra_policy=policy, sim_args=["--profile", "fast"])


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def http() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30)) as session:
        yield session


def body(max_tokens: int = 8, stream: bool = False, prompt: str = "hello") -> dict[str, Any]:
    return {"model": "chat", "messages": [{"role": "user", "content": prompt}], "max_tokens": max_tokens,
            "stream": stream}


async def post(http: aiohttp.ClientSession, stack: Stack, key: str | None, payload: dict[str, Any],
               **headers: str) -> tuple[int, dict[str, str], Any]:
    all_headers = {**headers, **({"authorization": f"Bearer {key}"} if key else {})}
    async with http.post(f"http://127.0.0.1:{stack.envoy_port}/v1/chat/completions", json=payload,
                         headers=all_headers) as response:
        text = await response.text()
        parsed = json.loads(text) if response.content_type == "application/json" else text
        return response.status, {k.lower(): v for k, v in response.headers.items()}, parsed


async def test_api_keys(stack: Stack, http: aiohttp.ClientSession) -> None:
    for key in (None, "wrong-key", KEYS["dead"]):
        status, _, payload = await post(http, stack, key, body())
        assert status == 401, payload
        assert payload["error"]["code"] == "invalid_api_key"
    status, _, _ = await post(http, stack, KEYS["free"], body())
    assert status == 200
    # A client cannot claim a tenant by header when keys are required.
    status, _, _ = await post(http, stack, None, body(), **{"x-tenant-id": "free"})
    assert status == 401


async def test_tokens_per_minute_reconciled_to_real_usage(stack: Stack, http: aiohttp.ClientSession) -> None:
    completion_before = await metric_value(http, stack.admin_url, "extproc_usage_tokens_total", 'kind="completion"')
    status, headers, payload = await post(http, stack, KEYS["tok"], body(max_tokens=200))
    assert status == 200
    used = payload["usage"]["total_tokens"]
    reserved_remaining = int(headers["x-ratelimit-remaining-tokens"])
    assert reserved_remaining <= 600 - 200  # the estimate (prompt + max_tokens) was reserved
    # The access log delivers the real usage after the exchange: wait until this replica has recorded this
    # reply's completion tokens (an earlier test's late entry counts at most 8); the settle is sent on the store
    # connection before the next request's admission.
    completion = payload["usage"]["completion_tokens"]
    await wait_metric(http, stack.admin_url, "extproc_usage_tokens_total", 'kind="completion"',
                      above=completion_before + completion - 1)
    status, headers, _ = await post(http, stack, KEYS["tok"], body(max_tokens=8))
    assert status == 200
    # Now only real usage (plus this request's reservation) counts against the minute.
    assert int(headers["x-ratelimit-remaining-tokens"]) >= 600 - used - 8 - 10
    refused = 0
    for _ in range(6):
        status, headers, payload = await post(http, stack, KEYS["tok"], body(max_tokens=150))
        if status == 429:
            refused += 1
            assert payload["error"]["code"] == "rate_limit_exceeded"
            assert int(headers["retry-after"]) >= 1
            assert "x-ratelimit-remaining-tokens" in headers
    assert refused >= 1


async def test_concurrency_limit_and_release(stack: Stack, http: aiohttp.ClientSession) -> None:
    slow = body(max_tokens=1500, stream=True)

    async def hold() -> int:
        status, _, _ = await post(http, stack, KEYS["cc"], slow)
        return status

    holders = [asyncio.create_task(hold()) for _ in range(2)]

    async def both_streaming() -> bool:
        return sum(e["in_flight"] for e in (await debug_pools(http, stack.admin_url))["chat"]) == 2

    await eventually(both_streaming, "both held streams routed (their concurrency leases taken)")
    status, _, payload = await post(http, stack, KEYS["cc"], body())
    assert status == 429 and "concurrent" in payload["error"]["message"]
    assert await asyncio.gather(*holders) == [200, 200]
    status, _, _ = await post(http, stack, KEYS["cc"], body())
    assert status == 200


async def test_no_leaked_lease_after_1000_requests_with_random_disconnects(stack: Stack, http: aiohttp.ClientSession,
                                                                           store_url: str | None) -> None:
    rng = random.Random(7)
    aborts = [rng.random() < 0.3 for _ in range(1000)]
    payloads = [json.dumps(body(max_tokens=rng.randint(20, 120), stream=rng.random() < 0.5)).encode()
                for _ in range(1000)]

    def spec(index: int) -> RequestSpec:
        return RequestSpec("POST", "/v1/chat/completions",
                           (("content-type", "application/json"), ("authorization", f"Bearer {KEYS['free']}")),
                           payloads[index], stream=b'"stream": true' in payloads[index],
                           abort_after_s=rng.uniform(0.005, 0.08) if aborts[index] else None)

    samples = await run_open_loop("127.0.0.1", stack.envoy_port, spec, rate=150, duration_s=1000 / 150,
                                  arrival="fixed", max_in_flight=200, timeout_s=20)
    assert len(samples) == 1000
    assert sum(s.aborted for s in samples) > 100
    unexpected = [s for s in samples if s.error is not None and s.status != 429]
    assert not unexpected, unexpected[:3]
    # Every lease comes back: no exchange left in this process, none on an endpoint, and (Redis) no lease
    # stored for anyone; then the tenant can hold all 40 concurrent slots again at once.
    await eventually(partial(nothing_held, http, stack, store_url), "every aborted exchange released")
    hold = json.dumps(body(max_tokens=400, stream=True)).encode()
    results = await run_open_loop("127.0.0.1", stack.envoy_port,
                                  lambda i: RequestSpec("POST", "/v1/chat/completions",
                                                        (("content-type", "application/json"),
                                                         ("authorization", f"Bearer {KEYS['free']}")), hold,
                                                        stream=True),
                                  rate=400, duration_s=0.1, arrival="fixed", timeout_s=20)
    assert len(results) == 40
    assert [s.status for s in results] == [200] * 40
    # Envoy closes each ext_proc stream just after the response: then nothing may remain.
    await eventually(partial(nothing_held, http, stack, store_url), "the 40 held streams released")
    if store_url is not None:
        # Both admission paths took leases here: from this replica's slices and decided by Redis.
        local = await metric_value(http, stack.admin_url, "extproc_limits_admissions", 'path="slice"')
        awaited = await metric_value(http, stack.admin_url, "extproc_limits_admissions", 'path="awaited"')
        assert local > 50 and awaited > 0


async def nothing_held(http: aiohttp.ClientSession, stack: Stack, store_url: str | None) -> bool:
    """No exchange in flight in the service or on an endpoint and, with Redis, no concurrency lease stored."""
    in_flight = sum(e["in_flight"] for e in (await debug_pools(http, stack.admin_url))["chat"])
    assert in_flight == 0 and await metric_value(http, stack.admin_url, "extproc_in_flight") == 0, in_flight
    if store_url is None:
        return True
    redis = Redis.from_url(store_url)
    try:
        lease_sets = [key async for key in redis.scan_iter(match="*:cc")]  # empty sets vanish
        leases = sum([await redis.zcard(key) for key in lease_sets])
    finally:
        await redis.aclose()
    assert leases == 0, f"{leases} leases in Redis"
    return True
