"""The endpoints the peer routers call on a worker, against a live simulated replica."""

from __future__ import annotations

import asyncio

import aiohttp
import pytest

from extproc.sim import Fleet
from tests.support import eventually

pytestmark = pytest.mark.integration


async def _load(http: aiohttp.ClientSession, url: str) -> int:
    async with http.get(f"{url}/get_load") as response:
        assert response.status == 200
        body = await response.json()
    assert set(body) == {"load"}
    return int(body["load"])


async def _loaded(http: aiohttp.ClientSession, url: str, count: int) -> bool:
    return await _load(http, url) >= count


async def test_get_load_counts_the_requests_the_engine_holds(fleet: Fleet, http: aiohttp.ClientSession) -> None:
    url = fleet.replicas[0].url
    assert await _load(http, url) == 0
    body = {"model": "org/model:8b", "prompt": "a long answer please", "max_tokens": 400, "ignore_eos": True}
    requests = [asyncio.create_task(http.post(f"{url}/v1/completions", json=body)) for _ in range(3)]
    await eventually(lambda: _loaded(http, url, 3), "the three requests to show in /get_load")
    for response in await asyncio.gather(*requests):
        assert response.status == 200
        await response.read()
    assert await _load(http, url) == 0


async def test_server_and_model_info_in_sglang_shape_without_a_model_path(
    fleet: Fleet, http: aiohttp.ClientSession
) -> None:
    replica = fleet.replicas[0]
    for path in ("/server_info", "/get_server_info"):
        async with http.get(replica.url + path) as response:
            info = await response.json()
        assert info["served_model_name"] == "org/model:8b" and info["dp_size"] == 1
        assert info["max_running_requests"] == replica.spec.profile.max_num_seqs
        assert info["internal_states"][0]["load"] == 0
        # A model_path would make smg try to download that model's tokenizer from the Hugging Face hub.
        assert "model_path" not in info and "tokenizer_path" not in info
    for path in ("/model_info", "/get_model_info"):
        async with http.get(replica.url + path) as response:
            info = await response.json()
        assert info["is_generation"] is True
        assert "model_path" not in info and "tokenizer_path" not in info
