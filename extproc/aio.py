"""Small asyncio helpers shared by the service's background tasks."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable
from typing import Any

__all__ = ["Sleep", "cancel_and_wait"]

# What a background loop awaits between rounds: `asyncio.sleep` in the service; tests inject one that
# runs the loop a round at a time (no real time passes).
Sleep = Callable[[float], Awaitable[None]]


async def cancel_and_wait(task: asyncio.Task[Any] | None) -> None:
    """Cancel a background task (if any) and wait until it has finished unwinding."""
    if task is None:
        return
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task
