"""LoRA adapters loaded on demand through real Envoy + service + simulator: a request for an adapter loaded
nowhere is held while the service loads it, then served where it is loaded; beyond the per-endpoint bound the
least recently used adapter is unloaded first."""

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

pytestmark = pytest.mark.asyncio(loop_scope="module")

LOAD_S = 1.0
ADAPTERS = ("fr", "de", "es")
# The engines start without adapters (no --lora for the simulator); the policy names them and their paths.
POOL = SimPool("lora", "org/base", 2, aliases=("base",),
               options=(("lora_adapters", list(ADAPTERS)),
                        ("lora_paths", {name: f"/adapters/{name}" for name in ADAPTERS}),
                        ("max_adapters_per_endpoint", 1)))
# Adapters that take longer to load than requests may wait.
SLOW = SimPool("slow", "org/slow", 1, aliases=("slow",),
               options=(("lora_adapters", ["it"]), ("lora_paths", {"it": "/adapters/it"}),
                        ("lora_load_timeout_s", 0.4)))


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def stack(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Stack]:
    workdir: Path = tmp_path_factory.mktemp("adapters")
    profile = workdir / "lora.json"
    profile.write_text(json.dumps({"base": "fast", "name": "lora", "lora_load_s": LOAD_S}))
    async with ProcessGroup(workdir / "logs") as group:
        yield await launch(group, workdir, [POOL, SLOW], extra_policy={"scheduling": {"scrape": {"interval_ms": 50}}},
                           sim_args=["--profile", str(profile)])


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def http() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30)) as session:
        yield session


async def chat(http: aiohttp.ClientSession, stack: Stack, model: str) -> tuple[int, str, float, Any]:
    started = time.monotonic()
    payload = {"model": model, "messages": [{"role": "user", "content": "bonjour"}], "max_tokens": 4}
    async with http.post(f"http://127.0.0.1:{stack.envoy_port}/v1/chat/completions", json=payload) as response:
        body = await response.json(content_type=None)
        return response.status, response.headers.get("x-gateway-upstream-host", ""), time.monotonic() - started, body


async def loaded(http: aiohttp.ClientSession, stack: Stack) -> dict[str, list[str]]:
    found = {}
    for port in stack.sim_ports["lora"]:
        async with http.get(f"http://127.0.0.1:{port}/sim/stats") as response:
            found[f"127.0.0.1:{port}"] = (await response.json())["adapters"]
    return found


async def test_adapters_are_loaded_on_demand_and_the_least_recently_used_makes_room(
        stack: Stack, http: aiohttp.ClientSession) -> None:
    status, host, took, body = await chat(http, stack, "fr")
    assert status == 200, body
    assert took >= LOAD_S  # held while the adapter loaded (time is the behaviour), not refused
    assert (await loaded(http, stack))[host] == ["fr"]
    status, again, took, _ = await chat(http, stack, "fr")
    assert (status, again) == (200, host) and took < LOAD_S  # loaded: straight to the endpoint that has it
    status, other, _, _ = await chat(http, stack, "de")  # the other endpoint has none yet: it loads there
    assert status == 200 and other != host
    assert await loaded(http, stack) == {host: ["fr"], other: ["de"]}
    await chat(http, stack, "fr")  # fr used last: de is the least recently used of the two
    status, third, _, body = await chat(http, stack, "es")
    assert status == 200, body
    after = await loaded(http, stack)
    assert sorted(after.values()) == [["es"], ["fr"]] and after[third] == ["es"] and third == other


async def test_a_load_slower_than_the_wait_is_refused_with_retry_after_and_nothing_hangs(
        stack: Stack, http: aiohttp.ClientSession) -> None:
    status, _, took, body = await chat(http, stack, "it")
    assert status == 503 and body["error"]["code"] == "overloaded_adapter_unavailable"
    assert 0.3 < took < LOAD_S  # refused at lora_load_timeout_s, before the load finished
    deadline = time.monotonic() + 10
    while (status := (await chat(http, stack, "it"))[0]) != 200:  # the load went on: served once it is loaded
        assert status == 503 and time.monotonic() < deadline
