"""LoRA adapter upkeep through real Envoy + service + simulator: `lora_prewarm` adapters are loaded on every
endpoint before any request and kept however idle; an adapter loaded on demand stays while requests use it and is
unloaded once idle for `lora_idle_unload_s`, then loaded again (the request held meanwhile) when asked for."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pytest
import pytest_asyncio

from extproc.bench.procs import ProcessGroup
from extproc.bench.stack import SimPool, Stack, launch
from tests.integration.endpoints.test_adapters import chat
from tests.support import eventually, holds_for

pytestmark = pytest.mark.asyncio(loop_scope="module")

LOAD_S = 0.5
IDLE_S = 2.0
POOL = SimPool("tended", "org/tended", 2, aliases=("tended",),
               options=(("lora_adapters", ["fr", "pt"]),
                        ("lora_paths", {"fr": "/adapters/fr", "pt": "/adapters/pt"}),
                        ("lora_prewarm", ["pt"]), ("lora_idle_unload_s", IDLE_S)))


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def stack(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Stack]:
    workdir: Path = tmp_path_factory.mktemp("adapter-upkeep")
    profile = workdir / "lora.json"
    profile.write_text(json.dumps({"base": "fast", "name": "lora", "lora_load_s": LOAD_S}))
    async with ProcessGroup(workdir / "logs") as group:
        yield await launch(group, workdir, [POOL], extra_policy={"scheduling": {"scrape": {"interval_ms": 50}}},
                           sim_args=["--profile", str(profile)])


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def http() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30)) as session:
        yield session


async def stats(http: aiohttp.ClientSession, stack: Stack) -> dict[str, dict[str, list[str]]]:
    found = {}
    for port in stack.sim_ports["tended"]:
        async with http.get(f"http://127.0.0.1:{port}/sim/stats") as response:
            body = await response.json()
            found[f"127.0.0.1:{port}"] = {"adapters": sorted(body["adapters"]), "loads": body["adapter_loads"],
                                         "unloads": body["adapter_unloads"]}
    return found


async def test_a_prewarmed_adapter_is_on_every_endpoint_before_any_request(
        stack: Stack, http: aiohttp.ClientSession) -> None:
    async def everywhere() -> bool:
        return all(s["adapters"] == ["pt"] for s in (await stats(http, stack)).values())

    await eventually(everywhere, "pt loaded on both endpoints", timeout_s=15)
    before = await stats(http, stack)
    assert all((s["loads"], s["unloads"]) == (1, 0) for s in before.values())
    status, _, took, body = await chat(http, stack, "pt")
    assert status == 200, body
    assert await stats(http, stack) == before and took < LOAD_S  # nothing to load: straight to one that has it


async def test_an_adapter_in_use_stays_and_one_idle_is_unloaded_but_not_a_prewarmed_one(
        stack: Stack, http: aiohttp.ClientSession) -> None:
    status, host, _, body = await chat(http, stack, "fr")
    assert status == 200, body
    assert (await stats(http, stack))[host]["adapters"] == ["fr", "pt"]

    async def used_and_loaded() -> bool:
        status, served_by, _, _ = await chat(http, stack, "fr")
        return status == 200 and served_by == host and "fr" in (await stats(http, stack))[host]["adapters"]

    await holds_for(used_and_loaded, "fr loaded while requests use it", 2 * IDLE_S, interval_s=0.3)

    async def unloaded() -> bool:
        return all(s["adapters"] == ["pt"] for s in (await stats(http, stack)).values())

    await eventually(unloaded, "fr unloaded after lora_idle_unload_s without use", timeout_s=IDLE_S + 10)
    # pt was idle longer than fr (used once, in the first test) and stayed: prewarmed adapters are kept.
    after = (await stats(http, stack)).values()
    assert sum(s["unloads"] for s in after) == 1 and sum(s["loads"] for s in after) == 3  # fr's; pt twice, fr
    status, again, took, body = await chat(http, stack, "fr")  # asked for again: held while loaded, then served
    assert status == 200, body
    assert took >= LOAD_S and "fr" in (await stats(http, stack))[again]["adapters"]
