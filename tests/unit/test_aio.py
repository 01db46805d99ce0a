from __future__ import annotations

import asyncio

from extproc.aio import cancel_and_wait


async def test_cancels_and_waits_for_the_task_to_unwind() -> None:
    unwound: list[str] = []

    async def loop() -> None:
        try:
            await asyncio.sleep(3600)
        finally:
            await asyncio.sleep(0)  # cleanup that itself awaits
            unwound.append("done")

    task = asyncio.create_task(loop())
    await asyncio.sleep(0)
    await cancel_and_wait(task)
    assert task.cancelled() and unwound == ["done"]
    await cancel_and_wait(None)
    await cancel_and_wait(task)  # twice is harmless
