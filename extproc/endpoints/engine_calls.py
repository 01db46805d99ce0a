"""The HTTP side of the background loops that call engines' management endpoints (sleep mode, LoRA adapters):
one lazily opened session, and on stop the calls still under way cancelled before it closes."""

from __future__ import annotations

import asyncio
from collections.abc import Iterable

import aiohttp

__all__ = ["EngineCalls"]


class EngineCalls:
    def __init__(self) -> None:
        self._session: aiohttp.ClientSession | None = None

    def http(self) -> aiohttp.ClientSession:
        if self._session is None:
            self._session = aiohttp.ClientSession()
        return self._session

    async def close(self, under_way: Iterable[asyncio.Task[None]]) -> None:
        tasks = list(under_way)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        if self._session is not None:
            await self._session.close()
            self._session = None
