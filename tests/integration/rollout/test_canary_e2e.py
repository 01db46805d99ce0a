"""Canaries and live config through real Envoy + service + simulator.

A canary whose replicas start failing is rolled back by itself; a healthy one walks to 100%; policy
reloads (valid and invalid) under load drop no request.
"""

from __future__ import annotations

import asyncio
import json
import os
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import yaml

from extproc.bench.loadgen import RequestSpec, Sample, run_open_loop
from extproc.bench.procs import ProcessGroup
from extproc.bench.stack import SimPool, Stack
from tests.support import eventually, launch_stack, wait_metric

pytestmark = pytest.mark.asyncio

V1 = SimPool("v1", "org/m-v1", 2)
V2 = SimPool("v2", "org/m-v2", 2)


def rollout_policy(hold_s: float) -> dict[str, Any]:
    return {"rollout": {"refresh_interval_s": 0.2, "splits": [{
        "model": "m", "sticky_by": "request",
        "backends": [{"pool": "v1", "weight": 100}, {"pool": "v2", "weight": 0}],
        "rollout": {"canary": "v2", "baseline": "v1", "steps": [20, 50, 100], "hold_s": hold_s,
                    "min_samples": 25, "analysis_interval_s": 0.5, "max_error_rate_delta": 0.05,
                    "max_ttft_p99_ratio": 5.0, "max_tpot_ratio": 5.0},
    }]}}


def spec(index: int) -> RequestSpec:
    body = {"model": "m", "messages": [{"role": "user", "content": f"q{index}"}], "max_tokens": 4}
    return RequestSpec("POST", "/v1/chat/completions", (("content-type", "application/json"),),
                       json.dumps(body).encode())


async def rollout_status(stack: Stack) -> dict[str, Any]:
    async with aiohttp.ClientSession() as http, http.get(f"{stack.admin_url}/debug/rollouts") as response:
        return dict((await response.json())["rollouts"][0])


async def wait_status(stack: Stack, wanted: str, timeout_s: float) -> dict[str, Any]:
    async def reached() -> dict[str, Any]:
        state = await rollout_status(stack)
        assert state["rollout"] is not None and state["rollout"]["status"] == wanted, state
        return state

    return await eventually(reached, f"the rollout {wanted}", timeout_s=timeout_s, interval_s=0.2)


def served_by(samples: list[Sample], stack: Stack, pool: str) -> int:
    hosts = {f"127.0.0.1:{p}" for p in stack.sim_ports[pool]}
    return sum(1 for s in samples if s.headers.get("x-gateway-upstream-host") in hosts)


async def test_degraded_canary_is_rolled_back(tmp_path: Path) -> None:
    async with ProcessGroup(tmp_path / "logs") as group:
        stack = await launch_stack(group, tmp_path, [V1, V2], extra_policy=rollout_policy(hold_s=30),
                             sim_args=["--profile", "fast"])
        async with aiohttp.ClientSession() as http:
            for port in stack.sim_ports["v2"]:  # the new version fails 40% of requests
                async with http.post(f"http://127.0.0.1:{port}/sim/faults", json={"error_rate": 0.4}) as r:
                    assert r.status == 200
        load = asyncio.create_task(run_open_loop("127.0.0.1", stack.envoy_port, spec, rate=60, duration_s=8,
                                                 arrival="fixed", timeout_s=10))
        state = await wait_status(stack, "rolled_back", timeout_s=8)
        samples = await load
        after = [s for s in samples if s.start_s > 7.0]
    assert "error" in state["rollout"]["reason"]
    assert state["weights"] == {"v1": 100.0, "v2": 0.0} or state["weights"].get("v2", 0) == 0
    assert served_by(after, stack, "v2") == 0  # everyone is back on the baseline
    errors = sum(1 for s in samples if s.error is not None)
    assert errors <= 0.2 * 0.4 * len(samples) + 5  # at most the canary's share saw its failures


async def test_healthy_canary_is_promoted_and_reloads_drop_nothing(tmp_path: Path) -> None:
    async with ProcessGroup(tmp_path / "logs") as group:
        stack = await launch_stack(group, tmp_path, [V1, V2], extra_policy=rollout_policy(hold_s=1.0),
                             sim_args=["--profile", "fast"])
        load = asyncio.create_task(run_open_loop("127.0.0.1", stack.envoy_port, spec, rate=60, duration_s=9,
                                                 arrival="fixed", timeout_s=10))
        await wait_status(stack, "promoted", timeout_s=8)
        # Live config under load: an invalid file is rejected (old policy stays), a valid one applies.
        document = yaml.safe_load(stack.policy_path.read_text())
        async with aiohttp.ClientSession() as http:
            replace(stack.policy_path, "pools: [this is not valid\n")
            await wait_metric(http, stack.admin_url, "extproc_config_loads_total", 'result="error"', above=0)
            document["pools"][0]["aliases"] = ["m-old"]
            replace(stack.policy_path, yaml.safe_dump(document))

            async def new_alias_served() -> bool:
                payload = {"model": "m-old", "messages": [{"role": "user", "content": "x"}], "max_tokens": 2}
                async with http.post(f"http://127.0.0.1:{stack.envoy_port}/v1/chat/completions",
                                     json=payload) as response:
                    return response.status == 200

            await eventually(new_alias_served, "the reloaded policy's new alias served", interval_s=0.2)
            async with http.get(f"{stack.admin_url}/metrics") as response:
                metrics = await response.text()
        samples = await load
    assert 'extproc_config_loads_total{result="error"} 1.0' in metrics
    assert 'extproc_config_loads_total{result="ok"} 1.0' in metrics
    assert [s for s in samples if s.error is not None] == []
    assert served_by([s for s in samples if s.start_s > 8.0], stack, "v1") == 0  # 100% on the canary


def replace(path: Path, text: str) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(text)
    os.replace(tmp, path)
