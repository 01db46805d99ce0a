"""Per-pool gauges through the real scraper: a simulated engine with 2 batch slots and 6 streams sent to it
(flow control off, so they queue inside the engine) shows 2 running and 4 waiting in the service's
/metrics; when the streams end, both return to 0."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import aiohttp
import pytest

from extproc.bench.loadgen import RequestSpec, run_open_loop
from extproc.bench.procs import ProcessGroup
from extproc.bench.stack import SimPool
from tests.support import eventually, launch_stack

pytestmark = pytest.mark.asyncio

POOL = SimPool("chat", "org/chat", 1, aliases=("chat",))


async def gauges(http: aiohttp.ClientSession, admin_url: str) -> dict[str, float]:
    async with http.get(f"{admin_url}/metrics") as response:
        text = await response.text()
    found: dict[str, float] = {}
    for line in text.splitlines():
        if line.startswith("extproc_pool_") and 'pool="chat"' in line:
            name, _, value = line.rpartition(" ")
            found[name.partition("{")[0]] = float(value)
    return found


async def test_pool_gauges_follow_the_engine(tmp_path: Path) -> None:
    profile = tmp_path / "two-slots.json"
    profile.write_text(json.dumps({"base": "fast", "max_num_seqs": 2, "step_base_s": 0.005}))
    body = json.dumps({"model": "chat", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 150,
                       "stream": True}).encode()
    spec = RequestSpec("POST", "/v1/chat/completions", (("content-type", "application/json"),), body, stream=True)
    async with ProcessGroup(tmp_path / "logs") as group:
        stack = await launch_stack(group, tmp_path, [POOL], extra_policy={"flow_control": {"enabled": False}},
                             sim_args=["--profile", str(profile)])
        async with aiohttp.ClientSession() as http:
            load = asyncio.create_task(run_open_loop("127.0.0.1", stack.envoy_port, lambda _: spec, rate=200,
                                                     duration_s=0.03, arrival="fixed", timeout_s=30))
            busiest: dict[str, float] = {}

            async def four_waiting() -> bool:
                nonlocal busiest
                seen = await gauges(http, stack.admin_url)
                if seen.get("extproc_pool_requests_waiting", 0) >= busiest.get("extproc_pool_requests_waiting", 0):
                    busiest = seen
                return busiest.get("extproc_pool_requests_waiting") == 4

            await eventually(four_waiting, "4 requests waiting in the pool gauges", timeout_s=3)
            samples = await load

            async def drained() -> dict[str, float]:
                seen = await gauges(http, stack.admin_url)
                assert (seen["extproc_pool_requests_running"], seen["extproc_pool_requests_waiting"]) == (0, 0), seen
                return seen

            idle = await eventually(drained, "the gauges scraped after the last stream ended")
    assert len(samples) == 6 and all(s.status == 200 for s in samples)
    assert busiest["extproc_pool_endpoints"] == busiest["extproc_pool_endpoints_ready"] == 1
    assert (busiest["extproc_pool_requests_running"], busiest["extproc_pool_requests_waiting"]) == (2, 4)
    assert (idle["extproc_pool_requests_running"], idle["extproc_pool_requests_waiting"]) == (0, 0)
    assert 0 <= idle["extproc_pool_kv_cache_usage"] <= 1
