"""Helpers shared by the chaos tests: request bodies, faults, leak checks (stack start-up and the admin
helpers live in tests/support.py and are re-exported here)."""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import aiohttp

from extproc.bench.loadgen import RequestSpec
from extproc.bench.stack import Stack
from tests.support import FAST, debug_pools, eventually, launch_stack, metric_value, pool_endpoint

__all__ = ["FAST", "JSON", "assert_no_leaked_in_flight", "chat_body", "chat_spec", "debug_pools", "endpoint",
           "launch_stack", "metric_value", "set_faults"]

JSON = (("content-type", "application/json"),)


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


async def endpoint(http: aiohttp.ClientSession, stack: Stack, pool: str, port: int) -> dict[str, Any]:
    return await pool_endpoint(http, stack.admin_url, pool, f"127.0.0.1:{port}")


async def assert_no_leaked_in_flight(http: aiohttp.ClientSession, admin_urls: Sequence[str],
                                     settle_s: float = 3.0) -> None:
    """Every endpoint of every pool of every given replica is back to in_flight 0 (within `settle_s`: Envoy
    closes each ext_proc stream just after its exchange)."""
    async def none_in_flight() -> bool:
        busy = {}
        for url in admin_urls:
            for pool, endpoints in (await debug_pools(http, url)).items():
                busy.update({f"{url} {pool} {e['address']}": e["in_flight"] for e in endpoints if e["in_flight"]})
        assert not busy, f"leaked in-flight leases: {busy}"
        return True

    await eventually(none_in_flight, "no in-flight lease left", timeout_s=settle_s)
