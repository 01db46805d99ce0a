"""Small asyncio helpers shared by the service's background tasks."""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

__all__ = ["cancel_and_wait"]


async def cancel_and_wait(task: asyncio.Task[Any] | None) -> None:
    """Cancel a background task (if any) and wait until it has finished unwinding."""
    if task is None:
        return
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task
