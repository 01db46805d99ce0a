"""Model-server faults under load, through real Envoy + service + simulator (one stack for the module).

- a replica answering 503s is ejected by our breaker after a bounded number of client-visible errors,
  and comes back through a half-open probe once the fault is cleared;
- a slow replica loses its share of the traffic, without errors;
- a pool whose replicas all refuse connections answers fast 503s with Retry-After, or is served by its
  `backup_pool`.
Each test ends with no in-flight lease left on any endpoint.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import pytest_asyncio

from extproc.bench.loadgen import run_open_loop
from extproc.bench.procs import ProcessGroup
from extproc.bench.stack import SimPool, Stack
from tests.chaos.conftest import (
    assert_no_leaked_in_flight,
    chat_body,
    chat_spec,
    debug_pools,
    endpoint,
    launch_stack,
    metric_value,
    set_faults,
)
from tests.support import LoadProgress, eventually, holds_for

pytestmark = pytest.mark.asyncio(loop_scope="module")

CHAT = SimPool("chat", "org/chat", 4, aliases=("chat",))
SOLO = SimPool("solo", "org/solo", 2, aliases=("solo",))  # no backup pool
LONE = SimPool("lone", "org/lone", 2, aliases=("lone",))  # backup_pool: spare
SPARE = SimPool("spare", "org/spare", 1, aliases=("spare",))

BASE_EJECTION_S = 1.0
CONSECUTIVE_FAILURES = 3  # the policy default, stated here because the bound below is built from it


def add_backup_pool(document: dict[str, Any]) -> None:
    for pool in document["pools"]:
        if pool["name"] == "lone":
            pool["backup_pool"] = "spare"


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def stack(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Stack]:
    workdir: Path = tmp_path_factory.mktemp("endpoint-faults")
    async with ProcessGroup(workdir / "logs") as group:
        yield await launch_stack(group, workdir, [CHAT, SOLO, LONE, SPARE], patch=add_backup_pool,
                                 extra_policy={"health": {"base_ejection_s": BASE_EJECTION_S}})


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def http() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10)) as session:
        yield session


async def post(http: aiohttp.ClientSession, stack: Stack, body: dict[str, Any]) -> tuple[int, dict[str, str], Any,
                                                                                         float]:
    started = time.monotonic()
    async with http.post(f"http://127.0.0.1:{stack.envoy_port}/v1/chat/completions", json=body) as response:
        text = await response.text()
        payload = json.loads(text) if response.content_type == "application/json" else text
        headers = {k.lower(): v for k, v in response.headers.items()}
        return response.status, headers, payload, time.monotonic() - started


async def test_5xx_replica_is_ejected_after_a_bounded_number_of_errors_and_comes_back(
        stack: Stack, http: aiohttp.ClientSession) -> None:
    victim = stack.sim_ports["chat"][0]
    address = f"127.0.0.1:{victim}"
    load = asyncio.create_task(run_open_loop("127.0.0.1", stack.envoy_port, chat_spec("chat"), rate=40,
                                             duration_s=7, arrival="fixed", timeout_s=10))

    async def state_where(check: Callable[[dict[str, Any]], bool]) -> dict[str, Any]:
        state = await endpoint(http, stack, "chat", victim)
        assert check(state), state
        return state

    # It had its share before the fault.
    await eventually(lambda: state_where(lambda s: s["picked_total"] >= 5), "the victim picked a few times")
    await set_faults(http, stack, victim, {"error_rate": 1.0, "error_status": 503})
    opened = await eventually(lambda: state_where(lambda s: s["breaker"] == "open"), "the breaker to open",
                              timeout_s=2.5)
    # The ejection lasts BASE_EJECTION_S (time is the behaviour): not picked at all for most of it.
    await holds_for(lambda: state_where(lambda s: s["breaker"] == "open" and s["picked_total"] == opened[
        "picked_total"]), "no pick while ejected", 0.8 * BASE_EJECTION_S)
    await set_faults(http, stack, victim, {"clear": True})
    before = (await endpoint(http, stack, "chat", victim))["picked_total"]
    # Within 4 s: at most the rest of the second ejection (2 x base) and one successful probe.
    await eventually(lambda: state_where(lambda s: s["breaker"] == "closed" and s["picked_total"] > before + 3),
                     "the replica back in rotation after the fault was cleared", timeout_s=4.0)
    samples = await load
    ejections = await metric_value(http, stack.admin_url, "extproc_endpoint_ejections_total", 'pool="chat"')
    errors = [s for s in samples if s.error is not None]
    assert {(s.status, s.headers.get("x-gateway-upstream-host")) for s in errors} <= {(503, address)}
    # Bound: CONSECUTIVE_FAILURES to trip the breaker, + 2 already routed while Envoy's access log (flushed
    # every 0.1 s) delivers them, + 1 failed half-open probe per re-ejection. Envoy's own outlier detection
    # adds nothing (observed: override_host still sends to the header's endpoint while Envoy has it ejected).
    assert 1 <= ejections <= 3
    assert len(errors) <= CONSECUTIVE_FAILURES + 2 + (ejections - 1), [(s.start_s, s.status) for s in errors]
    assert len(samples) == 280
    await assert_no_leaked_in_flight(http, [stack.admin_url])


async def test_slow_replica_loses_its_share_without_errors(stack: Stack, http: aiohttp.ClientSession) -> None:
    victim = stack.sim_ports["chat"][1]
    await set_faults(http, stack, victim, {"slow_factor": 10.0})
    try:
        progress = LoadProgress()
        load = asyncio.create_task(run_open_loop("127.0.0.1", stack.envoy_port,
                                                 chat_spec("chat", "slow question", max_tokens=32), rate=40,
                                                 duration_s=5, arrival="fixed", timeout_s=15, progress=progress,
                                                 progress_interval_s=0.05))
        # Warm-up, counted in replies (~2 s): its load builds up and shows in the scraped metrics.
        await progress.answered(80)
        start = {e["address"]: e["picked_total"] for e in (await debug_pools(http, stack.admin_url))["chat"]}
        samples = await load
        end = {e["address"]: e["picked_total"] for e in (await debug_pools(http, stack.admin_url))["chat"]}
    finally:
        await set_faults(http, stack, victim, {"clear": True})
    picked = {address: end[address] - start[address] for address in end}
    share = picked[f"127.0.0.1:{victim}"] / sum(picked.values())
    assert share < 0.12, picked  # a fair share would be 25%
    assert [s for s in samples if s.error is not None] == []
    assert len(samples) == 200
    await assert_no_leaked_in_flight(http, [stack.admin_url])


async def refuse_all(http: aiohttp.ClientSession, stack: Stack, pool: str, refuse: bool) -> None:
    for port in stack.sim_ports[pool]:
        await set_faults(http, stack, port, {"refuse": refuse})


async def wait_available(http: aiohttp.ClientSession, stack: Stack, pool: str, available: bool) -> None:
    async def all_so() -> bool:
        return all(e["available"] is available for e in (await debug_pools(http, stack.admin_url))[pool])

    await eventually(all_so, f"pool {pool} endpoints available={available}", timeout_s=3.0)


async def test_pool_with_every_replica_down_answers_fast_503_with_retry_after(
        stack: Stack, http: aiohttp.ClientSession) -> None:
    await refuse_all(http, stack, "solo", True)
    try:
        # At once (before the scraper noticed: Envoy's connect failures) and after (our no_capacity).
        replies = [await post(http, stack, chat_body("solo", f"down {i}")) for i in range(3)]
        await wait_available(http, stack, "solo", False)
        replies += await asyncio.gather(*(post(http, stack, chat_body("solo", f"down {i}")) for i in range(3, 13)))
    finally:
        await refuse_all(http, stack, "solo", False)
    for status, headers, payload, elapsed in replies:
        assert status == 503, payload
        assert int(headers["retry-after"]) >= 1
        assert set(payload["error"]) >= {"message", "type", "code"}
        assert elapsed < 2.0  # fast: no waiting on dead replicas (the behaviour; a wide margin)
    assert {payload["error"]["code"] for _, _, payload, _ in replies[3:]} == {"no_capacity"}
    await wait_available(http, stack, "solo", True)
    status, _, _, _ = await post(http, stack, chat_body("solo", "back"))
    assert status == 200
    await assert_no_leaked_in_flight(http, [stack.admin_url])


async def test_pool_with_every_replica_down_is_served_by_its_backup_pool(
        stack: Stack, http: aiohttp.ClientSession) -> None:
    spare = f"127.0.0.1:{stack.sim_ports['spare'][0]}"
    await refuse_all(http, stack, "lone", True)
    try:
        early = await post(http, stack, chat_body("lone", "early"))  # may race the scraper: fast either way
        await wait_available(http, stack, "lone", False)
        replies = await asyncio.gather(*(post(http, stack, chat_body("lone", f"backup {i}")) for i in range(10)))
    finally:
        await refuse_all(http, stack, "lone", False)
    assert early[0] in (200, 503) and early[3] < 2.0
    for status, headers, payload, elapsed in replies:
        assert status == 200, payload
        assert headers["x-gateway-upstream-host"] == spare
        assert payload["model"] == "org/spare"  # the body was rewritten to the backup's model
        assert elapsed < 2.0  # straight to the backup, no waiting on dead replicas (a wide margin)
    await wait_available(http, stack, "lone", True)
    status, headers, _, _ = await post(http, stack, chat_body("lone", "back"))
    assert status == 200 and headers["x-gateway-upstream-host"] != spare
    await assert_no_leaked_in_flight(http, [stack.admin_url])
