"""Turns the engine's steps into real time: one loop per replica, one waiting coroutine per request."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable

from extproc.sim.engine import Engine, GenRequest, RequestState

__all__ = ["Emit", "EngineLoop", "Sleep", "generate"]

# Called with (index of the first new output token, number of new tokens) once they exist.
Emit = Callable[[int, int], Awaitable[None]]
Sleep = Callable[[float], Awaitable[None]]
# A loop that fell behind (a busy event loop) runs its next steps back to back to catch up, but never
# replays more than this much lost time: after a long stall the engine simply resumes.
MAX_CATCH_UP_S = 0.05


class EngineLoop:
    """Runs `engine`'s steps while it has work: schedule, sleep the step's duration, finish the step.

    Step boundaries are kept on an absolute schedule (each step starts when the previous one ended), so
    event-loop lag does not slow the simulated GPU down; it idles on an event when there is no work.
    """

    def __init__(self, engine: Engine, sleep: Sleep = asyncio.sleep) -> None:
        self.engine = engine
        self._sleep = sleep
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.create_task(self._run(), name="sim-engine-loop")

    async def stop(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    def kick(self) -> None:
        """New work arrived: wake an idle loop (a busy one picks it up at the next step boundary)."""
        self._wake.set()

    async def _run(self) -> None:
        engine = self.engine
        clock = engine.clock
        boundary: float | None = None  # when the previous step ended, while the engine stays busy
        while True:
            now = clock()
            start = now if boundary is None else max(boundary, now - MAX_CATCH_UP_S)
            step = engine.begin_step(min(start, now))
            if step is None:
                boundary = None
                self._wake.clear()
                if not engine.has_work:
                    await self._wake.wait()
                continue
            end = start + step.duration_s
            delay = end - clock()
            # Sleep even when late so the request handlers get the loop between steps.
            await self._sleep(delay if delay > 0 else 0)
            engine.end_step(step, end)
            boundary = end


async def generate(engine: Engine, loop: EngineLoop, request: GenRequest, chunk_tokens: int,
                   emit: Emit | None) -> None:
    """Submit `request` and wait for it; `emit` sees the first token alone, then about `chunk_tokens` at a
    time (whatever the engine produced since the last call). Any exception (client gone, crash fault,
    cancellation) aborts the request in the engine, which frees its KV blocks."""
    progress: asyncio.Future[None] = asyncio.get_running_loop().create_future()

    def wake(_: GenRequest) -> None:
        if not progress.done():
            progress.set_result(None)

    request.on_progress = wake
    request.notify_every = chunk_tokens if emit is not None else 0
    sent = 0
    try:
        engine.submit(request)
        loop.kick()
        while True:
            await progress
            progress = asyncio.get_running_loop().create_future()
            produced = request.generated
            if emit is not None and produced > sent:
                if sent == 0 and produced > 1:  # the first token always goes alone
                    await emit(0, 1)
                    sent = 1
                await emit(sent, produced - sent)
                sent = produced
            if request.state is RequestState.FINISHED:
                return
    except BaseException:
        engine.abort(request)
        raise
