from __future__ import annotations

import asyncio
import time

import aiohttp
import pytest

from extproc.sim import Fleet
from tests.support import eventually, holds_for

pytestmark = pytest.mark.integration

MODEL = "org/model:8b"
CHAT = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 20, "ignore_eos": True}


async def post_faults(http: aiohttp.ClientSession, url: str, body: dict[str, object]) -> dict[str, object]:
    async with http.post(url + "/sim/faults", json=body) as resp:
        assert resp.status == 200, await resp.text()
        result: dict[str, object] = await resp.json()
        return result


async def test_error_burst_then_recovery(fleet: Fleet, http: aiohttp.ClientSession) -> None:
    url = fleet.replicas[0].url
    await post_faults(http, url, {"burst": {"count": 2, "status": 429}})
    statuses = []
    for _ in range(3):
        async with http.post(url + "/v1/chat/completions", json=CHAT) as resp:
            statuses.append(resp.status)
            if resp.status == 429:
                assert resp.headers["Retry-After"] == "1"
                assert (await resp.json())["error"]["code"] == 429
    assert statuses == [429, 429, 200]
    async with http.get(url + "/sim/faults") as resp:
        assert (await resp.json())["burst"]["count"] == 0


async def test_bad_fault_update_is_400_and_changes_nothing(fleet: Fleet, http: aiohttp.ClientSession) -> None:
    url = fleet.replicas[0].url
    async with http.post(url + "/sim/faults", json={"error_rate": 3}) as resp:
        assert resp.status == 400
    assert fleet.replicas[0].faults.settings.error_rate == 0.0


async def test_refuse_then_resume_via_a_sibling(fleet: Fleet, http: aiohttp.ClientSession) -> None:
    target, sibling = fleet.replicas
    await post_faults(http, target.url, {"refuse": True})
    with pytest.raises(aiohttp.ClientConnectorError):
        async with http.get(target.url + "/health"):
            pass
    async with http.post(f"{sibling.url}/sim/faults?port={target.port}", json={"refuse": False}) as resp:
        assert resp.status == 200
    async with http.get(target.url + "/health") as resp:
        assert resp.status == 200


async def test_refuse_for_a_while_resumes_by_itself(fleet: Fleet, http: aiohttp.ClientSession) -> None:
    target = fleet.replicas[0]
    await post_faults(http, target.url, {"refuse": True, "refuse_for_s": 0.2})
    assert not target.listening

    async def healthy() -> bool:
        try:
            async with http.get(target.url + "/health") as resp:
                return resp.status == 200
        except aiohttp.ClientConnectorError:
            return False

    await eventually(healthy, "the replica listening again by itself")
    assert target.faults.settings.refuse is False


async def test_crash_mid_stream_cuts_after_k_chunks_and_frees_the_slot(
    fleet: Fleet, http: aiohttp.ClientSession
) -> None:
    replica = fleet.replicas[0]
    await post_faults(http, replica.url, {"crash_mid_stream": 3})
    lines = 0
    with pytest.raises(aiohttp.ClientPayloadError):
        async with http.post(replica.url + "/v1/chat/completions", json={**CHAT, "stream": True}) as resp:
            assert resp.status == 200
            async for line in resp.content:
                if line.startswith(b"data: "):
                    lines += 1
    assert lines == 4  # role + first token, then two single-token chunks
    await eventually(lambda: replica.stats()["finished"]["abort"] == 1, "the cut stream to be aborted")
    stats = replica.stats()
    assert stats["running"] == 0 and stats["kv_used_blocks"] == 0


async def test_hang_until_cleared_and_unhealthy(fleet: Fleet, http: aiohttp.ClientSession) -> None:
    url = fleet.replicas[0].url
    await post_faults(http, url, {"hang": True})
    pending = asyncio.ensure_future(http.post(url + "/v1/chat/completions", json=CHAT))
    # Not answered while the fault lasts: a hang is a property in time, watched for 0.2 s.
    await holds_for(lambda: not pending.done(), "no answer from the hanging replica", 0.2)
    await post_faults(http, url, {"hang": False, "unhealthy": True})
    resp = await pending
    assert resp.status == 200
    resp.release()
    async with http.get(url + "/health") as health:
        assert health.status == 503


async def test_slow_factor_stretches_latency(fleet: Fleet, http: aiohttp.ClientSession) -> None:
    url = fleet.replicas[0].url

    async def timed() -> float:
        start = time.perf_counter()
        async with http.post(url + "/v1/chat/completions", json=CHAT) as resp:
            await resp.read()
        return time.perf_counter() - start

    await post_faults(http, url, {"slow_factor": 5})
    slow = await timed()
    await post_faults(http, url, {"clear": True})
    normal = await timed()
    assert slow > 2.5 * normal  # latency is what slow_factor changes: a ratio with a generous margin (5x set)


async def test_reset_clears_cache_and_counters(fleet: Fleet, http: aiohttp.ClientSession) -> None:
    url = fleet.replicas[0].url
    async with http.post(url + "/v1/chat/completions", json=CHAT) as resp:
        await resp.read()
    async with http.post(url + "/sim/reset") as resp:
        stats = await resp.json()
    assert stats["requests"] == 0 and stats["kv_cached_blocks"] == 0
