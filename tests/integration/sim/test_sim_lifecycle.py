"""The simulator's sleep mode and runtime LoRA endpoints, with their delays (time is the behaviour here)."""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest

from extproc.sim import Fleet, ReplicaSpec, load_profile
from tests.support import eventually

pytestmark = pytest.mark.integration

MODEL = "org/model:8b"
PROFILE = dataclasses.replace(load_profile("fast"), sleep_s=0.1, wake_up_s=0.6, wake_up_level2_s=1.0,
                              lora_load_s=0.4)


@pytest.fixture
async def replica() -> AsyncIterator[str]:
    async with Fleet([ReplicaSpec(MODEL, "127.0.0.1", 0, PROFILE, lora_adapters=("sql",))]) as fleet:
        yield fleet.replicas[0].url


@pytest.fixture
async def http() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10)) as session:
        yield session


async def chat(http: aiohttp.ClientSession, url: str, model: str = MODEL, tokens: int = 4) -> tuple[int, Any]:
    body = {"model": model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": tokens, "ignore_eos": True}
    async with http.post(url + "/v1/chat/completions", json=body) as response:
        return response.status, await response.json(content_type=None)


async def call(http: aiohttp.ClientSession, method: str, url: str, body: Any = None) -> tuple[int, str, float]:
    started = time.monotonic()
    async with http.request(method, url, json=body) as response:
        return response.status, await response.text(), time.monotonic() - started


async def sleeping(http: aiohttp.ClientSession, url: str) -> bool:
    async with http.get(url + "/is_sleeping") as response:
        return bool((await response.json())["is_sleeping"])


async def stats(http: aiohttp.ClientSession, url: str) -> dict[str, Any]:
    async with http.get(url + "/sim/stats") as response:
        found: dict[str, Any] = await response.json()
        return found


async def test_sleep_refuses_inference_until_woken(replica: str, http: aiohttp.ClientSession) -> None:
    running = asyncio.create_task(chat(http, replica, tokens=100))  # in the engine when the sleep call comes

    async def in_engine() -> bool:
        found = await stats(http, replica)
        return bool(found["running"] + found["waiting"])

    await eventually(in_engine, "the request in the engine")
    status, _, _ = await call(http, "POST", replica + "/sleep?level=1")
    assert status == 200 and await sleeping(http, replica)
    assert (await running)[0] == 200  # the sleep waited for it
    status, body = await chat(http, replica)
    assert status == 503 and "sleeping" in body["error"]["message"]
    async with http.get(replica + "/metrics") as response:  # endpoints without weights still answer
        assert response.status == 200
    async with http.get(replica + "/v1/models") as response:
        assert response.status == 200
    status, _, took = await call(http, "POST", replica + "/wake_up")
    assert status == 200 and took >= PROFILE.wake_up_s and not await sleeping(http, replica)
    assert (await chat(http, replica))[0] == 200
    status, _, took = await call(http, "POST", replica + "/wake_up")  # awake already: at once
    assert status == 200 and took < PROFILE.wake_up_s


async def test_level_two_takes_longer_to_wake_and_bad_levels_are_refused(replica: str,
                                                                         http: aiohttp.ClientSession) -> None:
    assert (await call(http, "POST", replica + "/sleep?level=3"))[0] == 400
    assert not await sleeping(http, replica)
    assert (await call(http, "POST", replica + "/sleep?level=2"))[0] == 200
    status, _, took = await call(http, "POST", replica + "/wake_up")
    assert status == 200 and took >= PROFILE.wake_up_level2_s


async def _loading(http: aiohttp.ClientSession, url: str) -> bool:
    return "chat-fr" in (await stats(http, url))["adapters_loading"]


async def test_adapters_load_and_unload_at_runtime(replica: str, http: aiohttp.ClientSession) -> None:
    assert (await chat(http, replica, "chat-fr"))[0] == 404
    loading = asyncio.create_task(call(http, "POST", replica + "/v1/load_lora_adapter",
                                       {"lora_name": "chat-fr", "lora_path": "/adapters/chat-fr"}))
    await eventually(lambda: _loading(http, replica), "the adapter loading")
    assert (await chat(http, replica, "chat-fr"))[0] == 404  # not usable until loaded
    status, text, took = await loading
    assert status == 200 and "chat-fr" in text and took >= PROFILE.lora_load_s
    assert (await chat(http, replica, "chat-fr"))[0] == 200
    async with http.get(replica + "/v1/models") as response:
        assert {m["id"] for m in (await response.json())["data"]} == {MODEL, "sql", "chat-fr"}
    again = await call(http, "POST", replica + "/v1/load_lora_adapter",
                       {"lora_name": "chat-fr", "lora_path": "/adapters/chat-fr"})
    assert again[0] == 400
    for bad in ({"lora_name": "x"}, {"lora_name": "../../etc", "lora_path": "/a"}, {"lora_name": MODEL,
                                                                                     "lora_path": "/a"}, [1]):
        assert (await call(http, "POST", replica + "/v1/load_lora_adapter", bad))[0] == 400
    assert (await call(http, "POST", replica + "/v1/unload_lora_adapter", {"lora_name": "chat-fr"}))[0] == 200
    assert (await chat(http, replica, "chat-fr"))[0] == 404
    assert (await call(http, "POST", replica + "/v1/unload_lora_adapter", {"lora_name": "chat-fr"}))[0] == 404
