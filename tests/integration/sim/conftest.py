from __future__ import annotations

from collections.abc import AsyncIterator

import aiohttp
import pytest

from extproc.sim import Fleet, ReplicaSpec, load_profile


@pytest.fixture
async def fleet() -> AsyncIterator[Fleet]:
    profile = load_profile("fast")
    specs = [
        ReplicaSpec("org/model:8b", "127.0.0.1", 0, profile, lora_adapters=("sql",)),
        ReplicaSpec("org/model:8b", "127.0.0.1", 0, profile, stream_chunk_tokens=4),
    ]
    async with Fleet(specs) as running:
        yield running


@pytest.fixture
async def http() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10)) as session:
        yield session
