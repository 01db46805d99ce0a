"""Flow control through real Envoy + service + simulator: held replies, shedding, timeouts, disconnects.

Simulated replicas that run one sequence at a time. Pool `chat` tells the service so (max_num_seqs 1): one
long request fills it and later ones queue in the service. Pool `learn` does not: requests queue in the
engine until that queue has lasted `saturation.sustain_ms`, which teaches the service the capacity.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import pytest_asyncio

from extproc.bench.procs import ProcessGroup
from extproc.bench.stack import SimPool, Stack
from tests.support import debug_flow, debug_pools, eventually, launch_stack

pytestmark = pytest.mark.asyncio(loop_scope="module")

POOL = SimPool("chat", "org/chat", 1, aliases=("chat",), max_num_seqs=1)
LEARN = SimPool("learn", "org/learn", 1, aliases=("learn",))
LONG_TOKENS = 300  # x 10 ms per step: each long request holds the only seat ~3 s
STANDARD_WAIT_S = 1.5

POLICY: dict[str, Any] = {
    "auth": {"mode": "trusted-header"},
    "tiers": {"default": {}, "gold": {"priority": "standard", "max_priority": "critical"},
              "batch": {"priority": "sheddable"}, "metered": {"limits": {"tokens_per_min": 100_000}}},
    "scheduling": {"scrape": {"interval_ms": 50}},
    "flow_control": {
        "classes": {"critical": {"priority": 100, "max_wait_s": 10.0},
                    "standard": {"priority": 50, "max_wait_s": STANDARD_WAIT_S},
                    "sheddable": {"priority": 0, "max_wait_s": 0}},
    },
    "saturation": {"sustain_ms": 500},
}


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def stack(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Stack]:
    workdir: Path = tmp_path_factory.mktemp("flow")
    profile = workdir / "one-seq.yaml"
    profile.write_text(json.dumps({"base": "fast", "name": "one-seq", "max_num_seqs": 1, "step_base_s": 0.01,
                                   "max_tokens_cap": 2048, "min_output_fraction": 1.0}))
    async with ProcessGroup(workdir / "logs") as group:
        yield await launch_stack(group, workdir, [POOL, LEARN], extra_policy=POLICY,
                           sim_args=["--profile", str(profile), "--stream-chunk-tokens", "8"])


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def http() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30)) as session:
        yield session


def body(max_tokens: int = 4, stream: bool = False, model: str = "chat") -> dict[str, Any]:
    return {"model": model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": max_tokens,
            "stream": stream}


async def post(http: aiohttp.ClientSession, stack: Stack, payload: dict[str, Any], tier: str = "default",
               **headers: str) -> tuple[int, dict[str, str], Any, float]:
    started = time.monotonic()
    all_headers = {"x-tenant-id": f"t-{tier}", "x-tenant-tier": tier, **headers}
    async with http.post(f"http://127.0.0.1:{stack.envoy_port}/v1/chat/completions", json=payload,
                         headers=all_headers) as response:
        text = await response.text()
        parsed = json.loads(text) if response.content_type == "application/json" else text
        return response.status, {k.lower(): v for k, v in response.headers.items()}, parsed, (
            time.monotonic() - started)


async def flow_stats(http: aiohttp.ClientSession, stack: Stack, pool: str = "chat") -> dict[str, Any]:
    return await debug_flow(http, stack.admin_url, pool)


async def pool_view(http: aiohttp.ClientSession, stack: Stack, pool: str) -> dict[str, Any]:
    return (await debug_pools(http, stack.admin_url))[pool][0]  # each pool here has one endpoint


async def queued(http: aiohttp.ClientSession, stack: Stack, klass: str, pool: str = "chat") -> int:
    count: int = (await flow_stats(http, stack, pool)).get("queued", {}).get(klass, 0)
    return count


async def wait_queued(http: aiohttp.ClientSession, stack: Stack, klass: str, count: int, pool: str = "chat",
                      timeout_s: float = 5.0) -> None:
    async def reached() -> bool:
        now = await queued(http, stack, klass, pool)
        assert now == count, f"{now} queued"
        return True

    await eventually(reached, f"{count} {klass} request(s) queued in the service for {pool}", timeout_s=timeout_s)


async def wait_idle(http: aiohttp.ClientSession, stack: Stack, pool: str = "chat") -> None:
    """Nothing in flight and the last scrape shows nothing running: the next request finds the seat free."""
    async def idle() -> bool:
        view = await pool_view(http, stack, pool)
        assert view["in_flight"] == 0 and not view["running"], view
        return True

    await eventually(idle, f"pool {pool} idle")


async def saturate(http: aiohttp.ClientSession, stack: Stack) -> list[asyncio.Task[Any]]:
    """Two long critical requests: one runs, the other waits in the service's queue (the pool's one seat is
    taken). The pool is saturated for ~2 x 3 s."""
    critical = {"x-gateway-priority": "critical"}
    await wait_idle(http, stack)
    holders = [asyncio.create_task(post(http, stack, body(LONG_TOKENS), tier="gold", **critical))]

    async def seated() -> bool:
        view = await pool_view(http, stack, "chat")
        assert view["in_flight"] == 1, view
        return True

    await eventually(seated, "the first long request on the pool's one seat")
    holders.append(asyncio.create_task(post(http, stack, body(LONG_TOKENS), tier="gold", **critical)))
    await wait_queued(http, stack, "critical", 1)
    return holders


async def test_unknown_priority_is_a_400(stack: Stack, http: aiohttp.ClientSession) -> None:
    status, _, payload, _ = await post(http, stack, body(), **{"x-gateway-priority": "urgent"})
    assert status == 400 and payload["error"]["code"] == "invalid_priority"


async def test_saturated_pool_sheds_queues_times_out_and_serves_by_priority(
        stack: Stack, http: aiohttp.ClientSession) -> None:
    holders = await saturate(http, stack)
    shed, timed_out, clamped, critical = await asyncio.gather(
        post(http, stack, body(), tier="batch"),
        post(http, stack, body(max_tokens=2000), tier="metered"),
        post(http, stack, body(), **{"x-gateway-priority": "critical"}),  # default tier: lowered to standard
        post(http, stack, body(), tier="gold", **{"x-gateway-priority": "critical"}),
    )
    # Sheddable: refused at once, OpenAI-shaped, with Retry-After. (The times below are the behaviour: how long
    # each class may be held. Bounds are generous; the queue's own accounting is checked at the end.)
    status, headers, payload, elapsed = shed
    assert status == 503 and payload["error"]["code"] == "overloaded_saturated", payload
    assert int(headers["retry-after"]) >= 1 and elapsed < 1.0  # not queued at all (max_wait_s 0)
    # Standard: held past Envoy's 1 s message timeout (the service extended it), refused at its limit.
    for status, _headers, payload, elapsed in (timed_out, clamped):
        assert status == 503 and payload["error"]["code"] == "overloaded_timeout", payload
        assert STANDARD_WAIT_S - 0.1 <= elapsed <= STANDARD_WAIT_S + 1.0  # its class's max_wait_s
    # Critical: waited for the slot and was served.
    status, _, payload, elapsed = critical
    assert status == 200, payload
    assert elapsed > STANDARD_WAIT_S  # it outwaited the standard class's limit
    for holder in holders:
        assert (await holder)[0] == 200
    # The metered tenant's timed-out request reserved ~2,000 tokens at admission: refunded, since it
    # never reached a model. Only this request's own reservation (prompt + 4) counts now.
    status, headers, _, _ = await post(http, stack, body(), tier="metered")
    assert status == 200 and int(headers["x-ratelimit-remaining-tokens"]) >= 100_000 - 50
    stats = await flow_stats(http, stack)
    assert stats["queued"].get("critical", 0) == 0 and stats["queued"].get("standard", 0) == 0
    assert stats["classes"]["critical"]["max_wait_s"] <= 10.0
    assert stats["classes"]["standard"]["max_wait_s"] <= STANDARD_WAIT_S + 0.2


async def test_a_queued_request_whose_client_left_leaves_the_queue_at_once(
        stack: Stack, http: aiohttp.ClientSession) -> None:
    holders = await saturate(http, stack)
    stats = await flow_stats(http, stack)
    before, waiting = stats["classes"].get("critical", {}).get("left", 0), stats["queued"].get("critical", 0)
    gone = asyncio.create_task(post(http, stack, body(), tier="gold", **{"x-gateway-priority": "critical"}))
    await wait_queued(http, stack, "critical", waiting + 1)
    gone.cancel()  # the client closes its connection
    # It may wait 10 s (critical max_wait_s) and the seat frees in ~3 s: only the disconnect ends it within 1 s.
    await wait_queued(http, stack, "critical", waiting, timeout_s=1.0)
    stats = await flow_stats(http, stack)
    assert stats["classes"]["critical"]["left"] == before + 1
    for holder in holders:
        assert (await holder)[0] == 200
    # Nothing leaked: with the pool idle again a request goes straight through.
    status, _, _, _ = await post(http, stack, body())
    assert status == 200
    assert (await flow_stats(http, stack))["pending_grants"] == 0


async def test_a_queue_that_lasts_teaches_the_capacity_then_requests_wait_in_the_service(
        stack: Stack, http: aiohttp.ClientSession) -> None:
    view = await pool_view(http, stack, "learn")
    assert view["capacity"] is None and view["room"] == "inf"  # nothing known: nothing is held
    critical = {"x-gateway-priority": "critical"}
    holders = [asyncio.create_task(post(http, stack, body(LONG_TOKENS, model="learn"), tier="gold", **critical))
               for _ in range(3)]  # one runs, two wait in the engine's own queue
    async def learned() -> dict[str, Any]:
        seen = await pool_view(http, stack, "learn")
        assert seen["capacity"] is not None, seen
        return seen

    view = await eventually(learned, "the learn pool's capacity to be learned from its lasting queue")
    assert view["capacity"] == 1.0 and view["running"] == 1.0, view
    assert view["queued_for_s"] >= 0.5
    # Now a new request is held by the service, not sent to the engine's queue.
    held = asyncio.create_task(post(http, stack, body(model="learn")))
    await wait_queued(http, stack, "standard", 1, pool="learn", timeout_s=2.0)
    status, _, payload, _ = await held
    assert status == 503 and payload["error"]["code"] == "overloaded_timeout", payload
    for holder in holders:
        assert (await holder)[0] == 200
