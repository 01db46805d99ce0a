"""Helpers shared by the chaos tests: stack start-up with policy tweaks, faults, leak checks."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import aiohttp
import yaml

from extproc.bench.loadgen import RequestSpec
from extproc.bench.procs import Child, ProcessGroup, wait_http_ok
from extproc.bench.stack import PYTHON, SimPool, Stack, prepare, start_envoy, start_sim
from extproc.config import parse_policy
from extproc.xds import write_config

JSON = (("content-type", "application/json"),)
FAST = ("--profile", "fast")


async def start_service_with(group: ProcessGroup, stack: Stack, index: int, grace_s: float | None = None,
                             drain_delay_s: float | None = None) -> Child:
    """Like `extproc.bench.stack.start_service`, plus explicit `--grace` / `--drain-delay`."""
    grpc_port, admin_port = stack.service_ports[index]
    name = "service" if index == 0 else f"service-{index}"
    argv = [PYTHON, "-m", "extproc", "serve", "--config", str(stack.policy_path),
            "--grpc-port", str(grpc_port), "--admin-port", str(admin_port)]
    if grace_s is not None:
        argv += ["--grace", str(grace_s)]
    if drain_delay_s is not None:
        argv += ["--drain-delay", str(drain_delay_s)]
    child = await group.start(name, argv)
    await wait_http_ok(f"http://127.0.0.1:{admin_port}/readyz", 30, child=child)
    return child


async def launch_stack(
    group: ProcessGroup, workdir: Path, pools: Sequence[SimPool], *,
    envoy: Mapping[str, Any] | None = None, extra_policy: Mapping[str, Any] | None = None,
    patch: Callable[[dict[str, Any]], None] | None = None, service_replicas: int = 1,
    grace_s: float | None = None, drain_delay_s: float = 0.0, sim_args: Sequence[str] = FAST,
) -> Stack:
    """`extproc.bench.stack.launch`, with a hook to edit the policy document (e.g. per-pool keys such as
    `backup_pool`, which `SimPool` cannot express) and the drain settings of the service replicas.

    The drain delay defaults to 0 (not the product's 3 s): only the drain test SIGTERMs a service under
    load; everywhere else SIGTERM is the teardown, which need not wait."""
    stack = prepare(workdir, pools, envoy=envoy, extra_policy=extra_policy, service_replicas=service_replicas)
    if patch is not None:
        document = yaml.safe_load(stack.policy_path.read_text())
        patch(document)
        stack.policy_path.write_text(yaml.safe_dump(document, sort_keys=False))
        stack.policy = parse_policy(stack.policy_path.read_text(), str(stack.policy_path))
        write_config(stack.policy, stack.envoy_dir)
    stack.children["sim"] = await start_sim(group, workdir, pools, stack.sim_ports, sim_args)
    for index in range(service_replicas):
        child = await start_service_with(group, stack, index, grace_s, drain_delay_s)
        stack.children[child.name] = child
    stack.children["envoy"] = await start_envoy(group, stack)
    return stack


def chat_body(model: str, prompt: str, max_tokens: int = 8, **extra: Any) -> dict[str, Any]:
    return {"model": model, "messages": [{"role": "user", "content": prompt}], "max_tokens": max_tokens, **extra}


def chat_spec(model: str, prefix: str = "question", max_tokens: int = 8,
              headers: tuple[tuple[str, str], ...] = ()) -> Callable[[int], RequestSpec]:
    def spec(index: int) -> RequestSpec:
        body = json.dumps(chat_body(model, f"{prefix} {index}", max_tokens)).encode()
        return RequestSpec("POST", "/v1/chat/completions", JSON + headers, body)

    return spec


async def set_faults(http: aiohttp.ClientSession, stack: Stack, victim: int, settings: Mapping[str, Any]) -> None:
    """Fault settings of the replica on port `victim`, sent through another replica of the same sim
    process (a refusing replica cannot be reached itself)."""
    sibling = next(p for ports in stack.sim_ports.values() for p in ports if p != victim)
    async with http.post(f"http://127.0.0.1:{sibling}/sim/faults?port={victim}", json=dict(settings)) as response:
        assert response.status == 200, await response.text()


async def debug_pools(http: aiohttp.ClientSession, admin_url: str) -> dict[str, list[dict[str, Any]]]:
    async with http.get(f"{admin_url}/debug/pools") as response:
        assert response.status == 200
        pools: dict[str, list[dict[str, Any]]] = (await response.json())["pools"]
        return pools


async def endpoint(http: aiohttp.ClientSession, stack: Stack, pool: str, port: int) -> dict[str, Any]:
    address = f"127.0.0.1:{port}"
    return next(e for e in (await debug_pools(http, stack.admin_url))[pool] if e["address"] == address)


async def assert_no_leaked_in_flight(http: aiohttp.ClientSession, admin_urls: Sequence[str],
                                     settle_s: float = 3.0) -> None:
    """Every endpoint of every pool of every given replica is back to in_flight 0 (after a settle loop:
    Envoy closes each ext_proc stream just after its exchange)."""
    deadline = time.monotonic() + settle_s
    while True:
        busy = {}
        for url in admin_urls:
            for pool, endpoints in (await debug_pools(http, url)).items():
                busy.update({f"{url} {pool} {e['address']}": e["in_flight"] for e in endpoints if e["in_flight"]})
        if not busy:
            return
        assert time.monotonic() < deadline, f"leaked in-flight leases: {busy}"
        await asyncio.sleep(0.1)


async def metric_value(http: aiohttp.ClientSession, admin_url: str, name: str, labels: str = "") -> float:
    """Sum of the samples of `name` whose label text contains `labels` (Prometheus text format)."""
    async with http.get(f"{admin_url}/metrics") as response:
        text = await response.text()
    total = 0.0
    for line in text.splitlines():
        if line.startswith(name) and (line[len(name)] in " {") and labels in line:
            total += float(line.rsplit(" ", 1)[1])
    return total
