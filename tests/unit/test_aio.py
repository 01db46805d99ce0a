from __future__ import annotations

import asyncio

from extproc.aio import cancel_and_wait


async def test_cancels_and_waits_for_the_task_to_unwind() -> None:
    running, cleaning, may_finish = asyncio.Event(), asyncio.Event(), asyncio.Event()
    unwound: list[str] = []

    async def loop() -> None:
        try:
            running.set()
            await asyncio.Event().wait()  # until cancelled
        finally:
            cleaning.set()
            await may_finish.wait()  # cleanup that itself awaits
            unwound.append("done")

    task = asyncio.create_task(loop())
    await running.wait()
    stopping = asyncio.create_task(cancel_and_wait(task))
    await cleaning.wait()  # cancel_and_wait has cancelled the task, which is now in its cleanup
    assert not stopping.done() and unwound == []  # cancel_and_wait is still waiting for it
    may_finish.set()
    await stopping
    assert task.cancelled() and unwound == ["done"]
    await cancel_and_wait(None)
    await cancel_and_wait(task)  # twice is harmless
