"""A tier's max_output_tokens through real Envoy, our service and the simulator: requests asking for more
(or for nothing) get at most the cap from the engine, streamed or not; smaller requests are untouched."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from extproc.bench.procs import ProcessGroup
from extproc.bench.stack import SimPool, launch

pytestmark = pytest.mark.asyncio

POOL = SimPool("chat", "org/chat", 1, aliases=("chat",))
CAP = 6


async def ask(http: aiohttp.ClientSession, port: int, **fields: Any) -> dict[str, Any]:
    # ignore_eos (a vLLM sampling parameter): the engine generates up to max_tokens, never stops early.
    payload = {"model": "chat", "messages": [{"role": "user", "content": "write a long story"}], "ignore_eos": True,
               **fields}
    async with http.post(f"http://127.0.0.1:{port}/v1/chat/completions", json=payload) as response:
        assert response.status == 200
        text = await response.text()
    if not fields.get("stream"):
        return dict(json.loads(text))
    chunks = [json.loads(line[6:]) for line in text.splitlines() if line.startswith("data: {")]
    usage = next(c["usage"] for c in chunks if c.get("usage"))
    finish = next(ch["finish_reason"] for c in chunks for ch in c["choices"] if ch.get("finish_reason"))
    return {"usage": usage, "choices": [{"finish_reason": finish}]}


async def test_tier_cap_limits_what_the_engine_generates(tmp_path: Path) -> None:
    policy = {"tiers": {"default": {"max_output_tokens": CAP}}}
    async with ProcessGroup(tmp_path / "logs") as group:
        stack = await launch(group, tmp_path, [POOL], extra_policy=policy, sim_args=["--profile", "fast"])
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30)) as http:
            port = stack.envoy_port
            unbounded = await ask(http, port)  # the fast profile would generate 16 by default
            asked_more = await ask(http, port, max_tokens=500)
            streamed = await ask(http, port, max_completion_tokens=500, stream=True,
                                 stream_options={"include_usage": True})
            small = await ask(http, port, max_tokens=2)
    for reply in (unbounded, asked_more, streamed):
        assert reply["usage"]["completion_tokens"] == CAP
        assert reply["choices"][0]["finish_reason"] == "length"
    assert small["usage"]["completion_tokens"] == 2
