"""Per-request stamps (extproc/sim/timings.py) against a live simulated replica: the id on the response names the
stamps, which sit on the client's clock and in the order the request went through the replica."""

from __future__ import annotations

import time

import aiohttp
import pytest

from extproc.sim import Fleet
from extproc.sim.timings import HEADER

pytestmark = pytest.mark.integration


async def _stream(http: aiohttp.ClientSession, url: str, content: str) -> tuple[str, float, float]:
    body = {"model": "org/model:8b", "messages": [{"role": "user", "content": content}], "max_tokens": 8,
            "stream": True}
    sent = time.perf_counter()
    async with http.post(f"{url}/v1/chat/completions", json=body) as response:
        assert response.status == 200
        first = 0.0
        async for _ in response.content.iter_any():
            first = first or time.perf_counter()
        return response.headers[HEADER], sent, first


async def test_each_stream_is_stamped_in_order_on_the_clients_clock(fleet: Fleet,
                                                                    http: aiohttp.ClientSession) -> None:
    replica = fleet.replicas[1]
    seen = [await _stream(http, replica.url, f"question {n}") for n in range(3)]
    async with http.get(f"{replica.url}/sim/timings") as response:
        stamps = {item["id"]: item for item in await response.json()}
    assert len({request_id for request_id, _, _ in seen}) == 3 and set(stamps) == {r for r, _, _ in seen}
    for request_id, sent, first in seen:
        assert request_id.startswith(f"{replica.port}-")
        stamp = stamps[request_id]
        assert sent <= stamp["arrive"] <= stamp["submit"] < stamp["token"] <= stamp["written"] <= first


async def test_non_streamed_requests_are_not_stamped_and_other_replicas_keep_their_own(
    fleet: Fleet, http: aiohttp.ClientSession
) -> None:
    body = {"model": "org/model:8b", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
    async with http.post(f"{fleet.replicas[0].url}/v1/chat/completions", json=body) as response:
        assert response.status == 200 and HEADER not in response.headers
    await _stream(http, fleet.replicas[1].url, "hello")
    for replica, count in ((fleet.replicas[0], 0), (fleet.replicas[1], 1)):
        async with http.get(f"{replica.url}/sim/timings") as response:
            assert len(await response.json()) == count

