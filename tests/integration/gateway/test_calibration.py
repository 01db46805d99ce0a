"""Prompt calibration end to end: Envoy's access log brings our raw estimate and the engine's
usage.prompt_tokens back to the service, which fits one to the other; its estimate for a new prompt then
lands much closer to what the (simulated) engine counts than the raw character estimate."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from extproc.bench.procs import ProcessGroup
from extproc.bench.stack import SimPool, launch
from extproc.openai import Api, estimate_tokens, parse_request
from tests.support import eventually

pytestmark = pytest.mark.asyncio

POOL = SimPool("chat", "org/chat", 1, aliases=("chat",))
WORDS = ["the", "quick", "brown", "fox", "jumps", "over", "the", "lazy", "dog", "near", "a", "quiet", "river", "at",
         "dawn"]


def body(i: int) -> dict[str, Any]:
    text = " ".join(WORDS[(i + k) % len(WORDS)] for k in range(3 + (i * 7) % 40))
    return {"model": "chat", "max_tokens": 1,
            "messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": text}]}


async def test_calibrated_estimate_tracks_the_engine(tmp_path: Path) -> None:
    async with ProcessGroup(tmp_path / "logs") as group:
        stack = await launch(group, tmp_path, [POOL], sim_args=["--profile", "fast"])
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30)) as http:
            async def send(payload: dict[str, Any]) -> int:
                url = f"http://127.0.0.1:{stack.envoy_port}/v1/chat/completions"
                async with http.post(url, json=payload) as response:
                    assert response.status == 200
                    return int((await response.json())["usage"]["prompt_tokens"])

            for i in range(30):
                await send(body(i))

            async def fitted() -> dict[str, float]:
                async with http.get(f"{stack.admin_url}/debug/pools") as response:
                    fit: dict[str, float] = (await response.json())["prompt_calibration"].get("chat", {})
                assert fit.get("observations", 0) >= 30, fit  # the access log reports usage after each reply
                return fit

            fit = await eventually(fitted, "the 30 replies' usage in the prompt calibration")
            fresh = body(1000)
            real = await send(fresh)
    assert fit["observations"] == 30
    raw = estimate_tokens(parse_request(Api.CHAT, json.dumps(fresh).encode(), max_bytes=10**6,
                                        max_depth=8).prompt_text)
    calibrated = fit["intercept"] + fit["slope"] * raw
    assert abs(calibrated - real) <= max(2.0, 0.1 * real)
    assert abs(calibrated - real) < abs(raw - real)
