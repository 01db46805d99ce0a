"""Sleeping engines through real Envoy + service + simulator: an idle engine is put to sleep, and a request that
then arrives is held while the service wakes it, then served."""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import pytest_asyncio

from extproc.bench.procs import ProcessGroup
from extproc.bench.stack import SimPool, Stack, launch
from tests.support import eventually

pytestmark = pytest.mark.asyncio(loop_scope="module")

WAKE_S = 1.5
NAP = SimPool("nap", "org/nap", 1, aliases=("nap",),
              options=(("sleep_after_idle_s", 1.0), ("cold_start_timeout_s", 20.0)))


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def stack(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Stack]:
    workdir: Path = tmp_path_factory.mktemp("sleep")
    profile = workdir / "sleepy.json"
    profile.write_text(json.dumps({"base": "fast", "name": "sleepy", "sleep_s": 0.1, "wake_up_s": WAKE_S}))
    async with ProcessGroup(workdir / "logs") as group:
        yield await launch(group, workdir, [NAP], extra_policy={"scheduling": {"scrape": {"interval_ms": 50}}},
                           sim_args=["--profile", str(profile)])


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def http() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30)) as session:
        yield session


async def chat(http: aiohttp.ClientSession, url: str) -> tuple[int, Any]:
    payload = {"model": "nap", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
    async with http.post(url + "/v1/chat/completions", json=payload) as response:
        return response.status, await response.json(content_type=None)


async def sim_stats(http: aiohttp.ClientSession, sim: str) -> dict[str, Any]:
    async with http.get(sim + "/sim/stats") as response:
        stats: dict[str, Any] = await response.json()
        return stats


async def test_an_idle_engine_sleeps_and_a_request_wakes_it(stack: Stack, http: aiohttp.ClientSession) -> None:
    envoy = f"http://127.0.0.1:{stack.envoy_port}"
    sim = f"http://127.0.0.1:{stack.sim_ports['nap'][0]}"
    assert (await chat(http, envoy))[0] == 200
    async def asleep() -> bool:  # idle for sleep_after_idle_s: the service puts it to sleep
        return bool((await sim_stats(http, sim))["sleeping"])

    await eventually(asleep, "the idle engine put to sleep", timeout_s=15, interval_s=0.1)
    status, body = await chat(http, sim)  # really asleep: the engine itself refuses
    assert status == 503 and "sleeping" in body["error"]["message"]
    started = time.monotonic()
    status, body = await chat(http, envoy)  # held while the service wakes the engine, then served
    took = time.monotonic() - started
    assert status == 200, body
    assert took >= WAKE_S  # time is the behaviour: it waited for the wake-up, not for an error
    stats = await sim_stats(http, sim)
    assert stats["wake_ups"] == 1 and stats["sleeps"] == 1 and not stats["sleeping"]
    async with http.get(f"{stack.admin_url}/debug/flow") as response:
        flow = (await response.json())["pools"]["nap"]["classes"]
    assert sum(c["granted"] for c in flow.values()) >= 1
    assert all(c["rejected"] == {} for c in flow.values())
