"""Turns the engine's numbers into real time: one coroutine per request, sleeping to absolute deadlines."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

from extproc.sim.engine import Engine, GenRequest

__all__ = ["Emit", "Sleep", "drive"]

# Called with (index of the first new output token, number of new tokens) once they exist.
Emit = Callable[[int, int], Awaitable[None]]
Sleep = Callable[[float], Awaitable[None]]


async def drive(engine: Engine, request: GenRequest, chunk_tokens: int, emit: Emit | None,
                sleep: Sleep = asyncio.sleep) -> None:
    """Queue, prefill and decode `request`; `emit` sees the first token alone, then `chunk_tokens` at a time.

    Deadlines are absolute (admission + prefill + sum of per-chunk ITLs), so event-loop lag does not
    accumulate into slower streams. Each chunk's ITL is read when the chunk starts, so it follows the
    batch size as requests join and leave. Any exception (client gone, crash fault, cancellation)
    aborts the request in the engine, which frees its KV blocks.
    """
    loop_clock = engine.clock
    admitted: asyncio.Future[None] = asyncio.get_running_loop().create_future()

    def wake() -> None:
        if not admitted.done():
            admitted.set_result(None)

    request.on_admit = wake
    try:
        engine.submit(request)
        await admitted
        deadline = request.admitted_at + request.prefill_s
        await _sleep_until(deadline, loop_clock, sleep)
        total = len(request.output_ids)
        if total == 0:
            engine.finish(request, request.finish_reason)
            return
        engine.first_token(request)
        if emit is not None:
            await emit(0, 1)
        position = 1
        while position < total:
            count = min(chunk_tokens, total - position)
            deadline += count * engine.itl_s()
            await _sleep_until(deadline, loop_clock, sleep)
            engine.tokens(request, count)
            if emit is not None:
                await emit(position, count)
            position += count
        engine.finish(request, request.finish_reason)
    except BaseException:
        engine.abort(request)
        raise


async def _sleep_until(deadline: float, clock: Callable[[], float], sleep: Sleep) -> None:
    delay = deadline - clock()
    # Sleep even when late so one overdue stream cannot starve the others on the loop.
    await sleep(delay if delay > 0 else 0)
