"""The shared limits store (Redis) killed under load, then restarted, with each `on_store_failure` policy.

fail-open: requests keep succeeding, limited by the replica's local share of every limit;
fail-closed: once the replica's slices of the limits are used up or expired, requests get 503
`limits_unavailable` with Retry-After.
Once Redis is back, limits are enforced through Redis again, and no state is left behind: in_flight is 0
on every endpoint and the tenant can hold its full concurrency (its leases in Redis, then gone).
The scenario runs once per policy (module fixture); the tests check different parts of its outcome.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import pytest_asyncio
from redis.asyncio import Redis

from extproc.bench.loadgen import Sample, run_open_loop
from extproc.bench.procs import ProcessGroup
from extproc.bench.stack import SimPool, Stack
from extproc.tenants import hash_key
from tests.chaos.conftest import assert_no_leaked_in_flight, chat_body, chat_spec, launch_stack, metric_value
from tests.integration.limits.redis_server import RedisServer
from tests.support import LoadProgress, eventually

pytestmark = pytest.mark.asyncio(loop_scope="module")

POOL = SimPool("chat", "org/chat", 2, aliases=("chat",))
CONCURRENCY = 4
BURST = 32
KEYS = {"cc": "chaos-key-concurrency", "bulk": "chaos-key-bulk"}


def keys_file() -> str:
    def tenant(name: str, limits: dict[str, int]) -> dict[str, Any]:
        return {"name": name, "tier": "default", "limits": limits, "keys": [{"sha256": hash_key(KEYS[name])}]}

    # "cc" checks the concurrency limit; "bulk" (limited too, so every request asks the store) carries the load,
    # with a token budget.
    return json.dumps({"tenants": [tenant("cc", {"concurrency": CONCURRENCY}),
                                   tenant("bulk", {"concurrency": 1000, "tokens_per_min": 10_000_000})]})


def auth(tenant: str) -> tuple[tuple[str, str], ...]:
    return (("authorization", f"Bearer {KEYS[tenant]}"),)


@dataclass
class Hold:
    holders: list[int]  # statuses of CONCURRENCY simultaneous long streams
    extra: int  # status of one more request while they run
    in_redis: int | None  # concurrency leases in Redis meanwhile (None: not looked at)


@dataclass
class Outcome:
    policy: str
    stack: Stack
    redis_url: str
    samples: list[Sample] = field(default_factory=list)
    killed_at: float = 0.0  # on the load's timeline
    back_at: float = 0.0
    while_down: Hold | None = None  # fail-open
    down_reply: tuple[int, dict[str, str], Any] | None = None  # fail-closed
    # Right after the service used Redis again: a burst of concurrent admissions, then the concurrency check,
    # and how many Redis calls failed meanwhile.
    burst_after: list[int] = field(default_factory=list)
    first_after: Hold | None = None
    failures_after: float = 0.0
    decided_alone: float = 0.0


async def post(http: aiohttp.ClientSession, stack: Stack, tenant: str,
               body: dict[str, Any]) -> tuple[int, dict[str, str], Any]:
    async with http.post(f"http://127.0.0.1:{stack.envoy_port}/v1/chat/completions", json=body,
                         headers=dict(auth(tenant))) as response:
        text = await response.text()
        parsed = json.loads(text) if response.content_type == "application/json" else text
        return response.status, {k.lower(): v for k, v in response.headers.items()}, parsed


async def leases_in_redis(url: str, tenant: str = "cc") -> int:
    """The tenant's concurrency leases held in Redis (a fresh connection each time: the server gets killed)."""
    total = 0
    async with Redis.from_url(url) as redis:
        async for key in redis.scan_iter(match=f"*{{{tenant}}}:*:cc"):
            total += await redis.zcard(key)
    return total


async def hold_full_concurrency(http: aiohttp.ClientSession, stack: Stack, redis_url: str | None) -> Hold:
    long = chat_body("chat", "hold a slot", max_tokens=700, stream=True, ignore_eos=True)

    answered = 0  # holders whose response headers came: each admitted (streaming) or refused by now

    async def one() -> int:
        nonlocal answered
        async with http.post(f"http://127.0.0.1:{stack.envoy_port}/v1/chat/completions", json=long,
                             headers=dict(auth("cc"))) as response:
            answered += 1
            await response.read()
            return response.status

    holders = [asyncio.create_task(one()) for _ in range(CONCURRENCY)]
    await eventually(lambda: answered == CONCURRENCY, f"the {CONCURRENCY} holders' response headers")
    extra = (await post(http, stack, "cc", chat_body("chat", "one too many")))[0]
    in_redis = await leases_in_redis(redis_url) if redis_url is not None else None
    return Hold(list(await asyncio.gather(*holders)), extra, in_redis)


async def wait_store_up(http: aiohttp.ClientSession, stack: Stack) -> None:
    """Until an admission went through Redis again (the failover probes it at most once a second)."""
    async def up() -> bool:
        await post(http, stack, "bulk", chat_body("chat", "probe"))
        return await metric_value(http, stack.admin_url, "extproc_limits_store_up") == 1.0

    await eventually(up, "the service using Redis again after it came back", timeout_s=6.0, interval_s=0.2)


async def wait_stable(http: aiohttp.ClientSession, stack: Stack) -> None:
    """Until a burst of concurrent admissions all go through Redis without a single store failure."""
    deadline = time.monotonic() + 10.0
    while time.monotonic() < deadline:
        await wait_store_up(http, stack)
        failures = await metric_value(http, stack.admin_url, "extproc_limits_store_primary_failures")
        burst = await asyncio.gather(*(post(http, stack, "bulk", chat_body("chat", f"burst {i}")) for i in range(8)))
        if (all(status == 200 for status, _, _ in burst)
                and await metric_value(http, stack.admin_url, "extproc_limits_store_primary_failures") == failures):
            return
    raise AssertionError("admissions never went through Redis steadily again")


@pytest_asyncio.fixture(loop_scope="module", scope="module", params=["fail-open", "fail-closed"])
async def outcome(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
                  ) -> AsyncIterator[Outcome]:
    policy: str = request.param
    workdir: Path = tmp_path_factory.mktemp(f"redis-{policy}")
    workdir.joinpath("keys.yaml").write_text(keys_file())
    redis_server = RedisServer().start()
    extra = {
        "auth": {"mode": "api-key", "keys_file": str(workdir / "keys.yaml")},
        # A generous deadline: only a dead Redis, never a busy test machine, may trigger the policy.
        "limits": {"store": "redis", "redis_url": redis_server.url, "on_store_failure": policy,
                   "decision_deadline_ms": 250},
    }
    try:
        async with ProcessGroup(workdir / "logs") as group, \
                aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=20)) as http:
            stack = await launch_stack(group, workdir, [POOL], extra_policy=extra)
            result = Outcome(policy, stack, redis_server.url)
            # Through Redis from the start: the leases live there, and the limit holds.
            before = await hold_full_concurrency(http, stack, redis_server.url)
            assert before == Hold([200] * CONCURRENCY, 429, CONCURRENCY)

            progress = LoadProgress()  # the outage follows the load's replies (20 a second), not seconds
            load = asyncio.create_task(run_open_loop("127.0.0.1", stack.envoy_port,
                                                     chat_spec("chat", headers=auth("bulk")), rate=20,
                                                     duration_s=3.5, arrival="fixed", timeout_s=10,
                                                     progress=progress, progress_interval_s=0.05))
            started = time.monotonic()
            await progress.answered(20)  # ~1 s through Redis
            redis_server.kill()
            result.killed_at = time.monotonic() - started
            await progress.answered(30)  # ~0.5 s with Redis dead
            if policy == "fail-open":
                result.while_down = await hold_full_concurrency(http, stack, None)
            else:
                result.down_reply = await post(http, stack, "cc", chat_body("chat", "while redis is down"))
            await progress.answered(50)  # Redis away for ~1.5 s of load (more than a slice's 1 s lifetime)
            redis_server.start()
            result.back_at = time.monotonic() - started
            result.samples = await load

            await wait_store_up(http, stack)
            failures = await metric_value(http, stack.admin_url, "extproc_limits_store_primary_failures")
            burst = await asyncio.gather(*(post(http, stack, "bulk", chat_body("chat", f"back {i}"))
                                           for i in range(BURST)))
            result.burst_after = [status for status, _, _ in burst]
            result.first_after = await hold_full_concurrency(http, stack, redis_server.url)
            result.failures_after = await metric_value(http, stack.admin_url,
                                                       "extproc_limits_store_primary_failures") - failures
            await wait_stable(http, stack)
            result.decided_alone = await metric_value(http, stack.admin_url, "extproc_limits_degraded_admits")
            yield result
    finally:
        redis_server.kill()


async def test_while_redis_is_down_the_policy_applies(outcome: Outcome) -> None:
    samples = outcome.samples
    assert len(samples) == 70
    if outcome.policy == "fail-open":
        assert [(s.start_s, s.status) for s in samples if s.error is not None] == []
        # One service replica: its local share is the whole limit, and it is enforced.
        assert outcome.while_down == Hold([200] * CONCURRENCY, 429, None)
        # The load went on, decided by the replica alone.
        assert outcome.decided_alone > 0
        return
    assert outcome.down_reply is not None
    status, headers, payload = outcome.down_reply
    assert status == 503, payload
    assert payload["error"]["code"] == "limits_unavailable" and int(headers["retry-after"]) >= 1
    before = [s for s in samples if s.start_s < outcome.killed_at - 0.1]
    # The replica first admits what its slice of the busy tenant's limits allows (at most a slice's
    # lifetime, limits.slice_ttl_ms 1000), then refuses.
    down = [s for s in samples if outcome.killed_at + 1.0 < s.start_s < outcome.back_at - 0.1]
    assert before and all(s.status == 200 for s in before)
    assert down and all(s.status == 503 for s in down), [s.status for s in down]
    assert {s.status for s in samples} <= {200, 503}


async def test_limits_go_through_redis_as_soon_as_it_is_back(outcome: Outcome) -> None:
    assert outcome.failures_after == 0
    assert outcome.burst_after == [200] * BURST
    assert outcome.first_after == Hold([200] * CONCURRENCY, 429, CONCURRENCY)


async def test_no_state_is_left_behind(outcome: Outcome) -> None:
    stack = outcome.stack
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=20)) as http:
        await assert_no_leaked_in_flight(http, [stack.admin_url])
        # The tenant has its full concurrency back, enforced through Redis.
        assert await hold_full_concurrency(http, stack, outcome.redis_url) == Hold([200] * CONCURRENCY, 429,
                                                                                   CONCURRENCY)
        await assert_no_leaked_in_flight(http, [stack.admin_url])

    async def no_leases() -> bool:  # the holders' streams are over; their ext_proc streams close just after
        return await leases_in_redis(outcome.redis_url) == 0

    await eventually(no_leases, "no concurrency lease left in Redis")
