"""`extproc serve --workers 2` behind real Envoy, with Redis limits: every worker serves, a killed worker is
restarted and serves again, and a tenant's limit holds exactly across the workers; on both front ends (the lean
one ages its connections out as grpc's max_connection_age does, extproc/server/h2/lifetime.py)."""

from __future__ import annotations

import asyncio
import os
import signal
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from extproc.bench.procs import ProcessGroup
from extproc.bench.stack import SimPool, Stack, launch
from tests.integration.limits.redis_server import RedisServer
from tests.support import eventually

pytestmark = pytest.mark.asyncio

BURST = 20  # each model's bucket: requests_per_s far too slow to refill during the test
CONCURRENT = 64  # streams at once: at 4 per HTTP/2 connection, Envoy opens ~16 connections


def policy(redis: RedisServer, front_end: str) -> dict[str, Any]:
    return {
        "service": {"front_end": front_end},
        "limits": {"store": "redis", "redis_url": f"{redis.url}/0", "slices": False},
        "tiers": {"default": {"model_limits": {"requests_per_s": 0.0001, "burst": BURST}}},
    }


async def burst(http: aiohttp.ClientSession, stack: Stack, model: str) -> list[int]:
    async def one() -> int:
        payload = {"model": model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 16}
        async with http.post(f"http://127.0.0.1:{stack.envoy_port}/v1/chat/completions", json=payload) as response:
            await response.read()
            return response.status

    return list(await asyncio.gather(*(one() for _ in range(CONCURRENT))))


async def supervisor(http: aiohttp.ClientSession, stack: Stack, path: str) -> tuple[int, str]:
    async with http.get(f"{stack.admin_url}{path}") as response:
        return response.status, await response.text()


async def streams_by_worker(http: aiohttp.ClientSession, stack: Stack) -> dict[str, float]:
    _, page = await supervisor(http, stack, "/metrics")
    found: dict[str, float] = {}
    for line in page.splitlines():
        if line.startswith('extproc_streams_total{worker="'):
            labels, _, value = line.rpartition(" ")
            found[labels.split('"')[1]] = float(value)
    return found


async def spread(http: aiohttp.ClientSession, stack: Stack, worker: str, since: dict[str, float]) -> None:
    """Until `worker` has served streams beyond `since`: bursts of model listings (answered by the service). The
    kernel spreads Envoy's connections, not its streams, and Envoy may have opened only a couple of them, both to
    one worker; workers send GOAWAY after CONNECTION_AGE_S (30 s), so a later burst reaches every worker."""

    async def served() -> bool:
        async def one() -> None:
            async with http.get(f"http://127.0.0.1:{stack.envoy_port}/v1/models") as response:
                await response.read()

        await asyncio.gather(*(one() for _ in range(CONCURRENT)))
        return (await streams_by_worker(http, stack)).get(worker, 0.0) > since.get(worker, 0.0)

    await eventually(served, f"worker {worker} serving Envoy's streams", timeout_s=45, interval_s=0.2)


@pytest.mark.parametrize("front_end", ["lean", "grpcio"])
async def test_workers_share_the_port_restart_and_keep_limits_exact(tmp_path: Path, redis_server: RedisServer,
                                                                    front_end: str) -> None:
    # Models named per front end: the session's Redis keeps the other run's buckets (keyed by model).
    pools = [SimPool("a", f"model-a-{front_end}", 1), SimPool("b", f"model-b-{front_end}", 1)]
    async with ProcessGroup(tmp_path / "logs") as group, aiohttp.ClientSession() as http:
        stack = await launch(group, tmp_path, pools, extra_policy=policy(redis_server, front_end),
                             sim_args=["--profile", "fast"], service_workers=2)
        await spread(http, stack, "0", {})
        await spread(http, stack, "1", {})  # both workers hold Envoy connections now
        statuses = await burst(http, stack, f"model-a-{front_end}")
        assert statuses.count(200) == BURST and statuses.count(429) == CONCURRENT - BURST, statuses

        health = await (await http.get(f"{stack.admin_url}/healthz")).json()
        victim = health["workers"][0]
        os.kill(victim["pid"], signal.SIGKILL)

        async def restarted() -> bool:
            workers = (await (await http.get(f"{stack.admin_url}/healthz")).json())["workers"]
            ready, _ = await supervisor(http, stack, "/readyz")
            return workers[0]["restarts"] == 1 and workers[0]["running"] and workers[0]["pid"] != victim["pid"] \
                and ready == 200 and len(await streams_by_worker(http, stack)) == 2

        await eventually(restarted, "worker 0 restarted, ready and exporting metrics", timeout_s=30,
                         interval_s=0.1)  # three admin requests per check
        await spread(http, stack, "0", {})  # the new worker 0 counts from zero
        statuses = await burst(http, stack, f"model-b-{front_end}")
        assert statuses.count(200) == BURST and statuses.count(429) == CONCURRENT - BURST, statuses
