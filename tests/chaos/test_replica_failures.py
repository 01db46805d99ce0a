"""Replica failures under load, through real Envoy + service + simulator: no client sees them."""

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

from extproc.bench.loadgen import RequestSpec, run_open_loop
from extproc.bench.procs import ProcessGroup
from extproc.bench.stack import SimPool, Stack
from tests.support import debug_pools, eventually, holds_for, launch_stack

pytestmark = pytest.mark.asyncio(loop_scope="module")

POOL = SimPool("chat", "org/chat", 4, aliases=("chat",))


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def stack(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Stack]:
    workdir: Path = tmp_path_factory.mktemp("chaos")
    async with ProcessGroup(workdir / "logs") as group:
        yield await launch_stack(group, workdir, [POOL], sim_args=["--profile", "fast"])


def spec(index: int) -> RequestSpec:
    body = {"model": "chat", "messages": [{"role": "user", "content": f"question {index}"}], "max_tokens": 16}
    return RequestSpec("POST", "/v1/chat/completions", (("content-type", "application/json"),),
                       json.dumps(body).encode())


async def faults(http: aiohttp.ClientSession, stack: Stack, victim: int, settings: dict[str, object]) -> None:
    sibling = next(p for p in stack.sim_ports["chat"] if p != victim)
    async with http.post(f"http://127.0.0.1:{sibling}/sim/faults?port={victim}", json=settings) as response:
        assert response.status == 200


async def picked(http: aiohttp.ClientSession, stack: Stack) -> dict[str, int]:
    return {e["address"]: e["picked_total"] for e in (await debug_pools(http, stack.admin_url))["chat"]}


async def test_killed_replica_costs_no_client_error_and_comes_back(stack: Stack) -> None:
    victim = stack.sim_ports["chat"][0]
    address = f"127.0.0.1:{victim}"
    async with aiohttp.ClientSession() as http:
        load = asyncio.create_task(run_open_loop("127.0.0.1", stack.envoy_port, spec, rate=40, duration_s=7,
                                                 arrival="fixed", timeout_s=10))

        async def victim_state(check: Callable[[dict[str, Any]], bool]) -> dict[str, Any]:
            state = next(e for e in (await debug_pools(http, stack.admin_url))["chat"] if e["address"] == address)
            assert check(state), state
            return state

        async def victim_picks_at_least(count: int) -> int:
            now = (await picked(http, stack))[address]
            assert now >= count, f"picked {now} times"
            return now

        await eventually(lambda: victim_picks_at_least(10), "the victim in rotation under load")
        await faults(http, stack, victim, {"refuse": True})  # like a crashed process: refused + resets
        killed_at = time.monotonic()
        # Our breaker/active check stops picking it within 1 s of the first failure (the bound is the behaviour),
        # and it stays out while it refuses.
        state = await eventually(lambda: victim_state(lambda e: e["available"] is False), "the victim out of rotation",
                                 timeout_s=1.0)
        await holds_for(lambda: victim_state(lambda e: not e["available"] and e["picked_total"] == state[
            "picked_total"]), "the victim not picked while it refuses", max(0.0, killed_at + 2.5 - time.monotonic()))
        await faults(http, stack, victim, {"refuse": False})
        revived_at = time.monotonic()
        before = (await picked(http, stack))[address]
        await eventually(lambda: victim_picks_at_least(before + 1), "traffic back on the revived replica",
                         timeout_s=1.0)  # within a second
        samples = await load
    errors = [s for s in samples if s.error is not None]
    assert len(samples) == 280
    assert errors == [], errors[:3]
    assert revived_at - killed_at > 2  # the outage really lasted (the scenario, not a speed claim)


async def test_streams_on_a_crashing_replica_end_cleanly_and_new_ones_succeed(stack: Stack) -> None:
    victim = stack.sim_ports["chat"][1]
    body = {"model": "chat", "messages": [{"role": "user", "content": "tell me a long story"}],
            "max_tokens": 3000, "stream": True}

    streaming: list[str] = []

    async def stream(http: aiohttp.ClientSession) -> tuple[str, bool]:
        async with http.post(f"http://127.0.0.1:{stack.envoy_port}/v1/chat/completions", json=body) as response:
            host = response.headers["x-gateway-upstream-host"]
            streaming.append(host)
            try:
                raw = await response.read()
                return host, raw.rstrip().endswith(b"[DONE]")
            except aiohttp.ClientPayloadError:
                return host, False

    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30)) as http:
        tasks = [asyncio.create_task(stream(http)) for _ in range(8)]
        await eventually(lambda: len(streaming) == 8, "eight streams under way")
        await faults(http, stack, victim, {"refuse": True})
        async with asyncio.timeout(20):  # nothing hangs
            results = await asyncio.gather(*tasks)
        on_victim = [done for host, done in results if host == f"127.0.0.1:{victim}"]
        elsewhere = [done for host, done in results if host != f"127.0.0.1:{victim}"]
        assert on_victim and not any(on_victim)  # cut off, not hung
        assert elsewhere and all(elsewhere)
        short = dict(body, max_tokens=8, stream=False)
        for _ in range(8):
            async with http.post(f"http://127.0.0.1:{stack.envoy_port}/v1/chat/completions", json=short) as r:
                assert r.status == 200
        await faults(http, stack, victim, {"refuse": False})
