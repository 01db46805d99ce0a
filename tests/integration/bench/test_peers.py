"""The peer routers of `extproc bench routing` in front of simulated replicas: their policy is in effect.

Real `smg` (sglang-router) and `vllm-router` binaries from the bench extra, real HTTP; the replicas are the
simulator (in this process). Each test starts the peer as `extproc bench routing` does and asserts the
behaviour of its policy, then that the peer's own counters and log show no fallback.
"""

from __future__ import annotations

import asyncio
import json
import random
import re
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pytest

from extproc.bench.httpclient import HttpClient
from extproc.bench.peers import Peer, fallback_lines, policy_check, scrape_peer, start_peer, stop_peer
from extproc.bench.procs import ProcessGroup
from extproc.sim import Fleet, ReplicaSpec, load_profile
from tests.support import eventually

pytestmark = pytest.mark.integration

MODEL = "llama-3.1-8b-instruct"
WORDS = ("gpu", "token", "cache", "prefix", "stream", "router", "batch", "model", "queue", "policy", "shard")


@pytest.fixture
async def fleet() -> AsyncIterator[Fleet]:
    profile = load_profile("fast")
    async with Fleet([ReplicaSpec(MODEL, "127.0.0.1", 0, profile) for _ in range(3)]) as running:
        yield running


async def _chat(http: aiohttp.ClientSession, peer: Peer, system: str, question: str, max_tokens: int) -> str:
    body = {"model": MODEL, "max_tokens": max_tokens, "ignore_eos": True, "stream": True,
            "stream_options": {"include_usage": True},
            "messages": [{"role": "system", "content": system}, {"role": "user", "content": question}]}
    async with http.post(f"http://127.0.0.1:{peer.port}/v1/chat/completions", json=body) as response:
        assert response.status == 200, await response.text()
        text = await response.text()
    assert text.rstrip().endswith("data: [DONE]")
    return response.headers["x-sim-replica"]


async def _prefix_affinity(strategy: str, fleet: Fleet, tmp_path: Path) -> tuple[Peer, dict[str, object]]:
    """Three long system prompts, first requests concurrent (so a miss meets unequal loads), then three
    more questions per prompt one by one: each must land where its prompt's first request went."""
    rng = random.Random(7)
    systems = [f"You are assistant {i}. " + " ".join(rng.choice(WORDS) for _ in range(300)) for i in range(3)]
    workers = [replica.url for replica in fleet.replicas]
    async with ProcessGroup(tmp_path / "logs") as group, HttpClient() as client, aiohttp.ClientSession(
            timeout=aiohttp.ClientTimeout(total=30)) as http:
        peer = await start_peer(group, strategy, workers, log_level="debug")
        before = await scrape_peer(client, peer)
        first = await asyncio.gather(*(_chat(http, peer, s, "what is the first step", 200) for s in systems))
        for system, home in zip(systems, first, strict=True):
            for question in ("how do I start", "and then what", "explain the last part"):
                assert await _chat(http, peer, system, question, 4) == home
        after = await scrape_peer(client, peer)
        await stop_peer(group, peer)
        assert not peer.child.running
    assert len(set(first)) >= 2, f"three new prompts all went to {first[0]}: misses do not spread"
    check = policy_check(peer.router, before, after, served=12)
    assert check["ok"], check
    log = peer.log_path.read_text(errors="replace")
    assert fallback_lines(peer.router, log) == []
    return peer, check


async def test_sglang_router_cache_aware_keeps_prompts_on_their_replica(fleet: Fleet, tmp_path: Path) -> None:
    peer, check = await _prefix_affinity("sglang-cache-aware", fleet, tmp_path)
    assert check["decisions"] == 12
    log = peer.log_path.read_text(errors="replace")
    assert "Assigning policy cache_aware" in log
    # smg read /server_info and /model_info (no fallback to the deprecated paths).
    assert "falling back to '/get_server_info'" not in log and "falling back to '/get_model_info'" not in log


async def test_vllm_router_cache_aware_routes_on_rendered_token_ids(fleet: Fleet, tmp_path: Path) -> None:
    peer, check = await _prefix_affinity("vllm-router-cache-aware", fleet, tmp_path)
    counters = check["counters"]
    assert isinstance(counters, dict)
    # Every request is rendered into token ids on every worker (3 here), and every decision used them.
    assert counters["vllm_router_kv_routing_inputs_total:render"] == 12 * 3
    decided = {k.rpartition(":")[2]: v for k, v in counters.items()
               if k.startswith("vllm_router_prefix_routing_decisions_total:")}
    assert decided.get("prefix_hit", 0) >= 9 and sum(decided.values()) == 12, decided
    assert "Cache prefix decision" in peer.log_path.read_text(errors="replace")


async def test_vllm_router_power_of_two_avoids_the_replica_that_reports_load(tmp_path: Path) -> None:
    profile = load_profile("fast")
    async with Fleet([ReplicaSpec(MODEL, "127.0.0.1", 0, profile) for _ in range(2)]) as fleet, \
            ProcessGroup(tmp_path / "logs") as group, HttpClient() as client, \
            aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30)) as http:
        idle, busy = fleet.replicas
        peer = await start_peer(group, "vllm-router-power-of-two", [idle.url, busy.url])
        before = await scrape_peer(client, peer)
        # Six long requests straight to `busy` (not through the peer): its /get_load reports them.
        long_body = {"model": MODEL, "prompt": "keep going", "max_tokens": 1024, "ignore_eos": True}
        hogs = [asyncio.create_task(http.post(f"{busy.url}/v1/completions", json=long_body)) for _ in range(6)]

        async def loaded() -> bool:
            return bool(json.loads(await (await http.get(f"{busy.url}/get_load")).text())["load"] >= 6)

        await eventually(loaded, "the six hogs counted by /get_load", timeout_s=10)
        # The peer polls /get_load every second: probe until its log shows it compared `busy` as loaded.
        seen = re.compile(re.escape(busy.url) + r"=([1-9]\d*)")
        probes = 0

        async def peer_saw_load() -> bool:
            nonlocal probes
            if seen.search(peer.log_path.read_text(errors="replace")):
                return True
            await _chat(http, peer, "probe", "probe", 1)
            probes += 1
            return False

        await eventually(peer_saw_load, "the peer's log comparing the loaded replica", timeout_s=10,
                         interval_s=0.05)
        # With two workers both are always the two choices: every request goes to the idle one.
        served = [await _chat(http, peer, "system", f"question {i}", 2) for i in range(10)]
        assert served == [idle.address] * 10
        after = await scrape_peer(client, peer)
        for hog in hogs:
            hog.cancel()
        await asyncio.gather(*hogs, return_exceptions=True)
        await stop_peer(group, peer)
    check = policy_check(peer.router, before, after, served=10 + probes)
    assert check["ok"] and check["decisions"] == 10 + probes, check
    log = peer.log_path.read_text(errors="replace")
    assert re.search(peer.router.evidence, log) and fallback_lines(peer.router, log) == []
