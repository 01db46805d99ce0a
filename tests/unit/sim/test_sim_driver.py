from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest

from extproc.sim.driver import EngineLoop, generate
from extproc.sim.engine import Engine, GenRequest, RequestState
from extproc.sim.profile import Profile
from tests.support import eventually

# Millisecond steps so real time stays short; one seat so ordering is observable.
PROFILE = Profile(name="t", step_base_s=0.001, step_per_seq_s=0.0, prefill_per_token_s=0.0, max_num_seqs=1,
                  num_gpu_blocks=64, max_model_len=1024)


def request(out: int, rid: str = "r") -> GenRequest:
    return GenRequest(rid, list(range(30)), list(range(1000, 1000 + out)), finish_reason="length")


@pytest.fixture
async def running() -> AsyncIterator[tuple[Engine, EngineLoop]]:
    engine = Engine(PROFILE, asyncio.get_running_loop().time)
    loop = EngineLoop(engine)
    loop.start()
    yield engine, loop
    await loop.stop()


async def test_first_token_alone_then_chunks_of_n(running: tuple[Engine, EngineLoop]) -> None:
    engine, loop = running
    emitted: list[tuple[int, int]] = []

    async def emit(start: int, count: int) -> None:
        emitted.append((start, count))

    req = request(out=10)
    await generate(engine, loop, req, 4, emit)
    assert emitted[0] == (0, 1)
    assert sum(count for _, count in emitted) == 10
    assert all(start == sum(c for _, c in emitted[:i]) for i, (start, _) in enumerate(emitted))
    assert req.state is RequestState.FINISHED and engine.counters.finished["length"] == 1
    assert engine.kv.used_blocks == 0
    assert engine.steps == 10  # one step per token, none while idle


async def test_second_request_waits_for_the_seat(running: tuple[Engine, EngineLoop]) -> None:
    engine, loop = running
    first, second = request(5, "a"), request(5, "b")
    await asyncio.gather(generate(engine, loop, first, 1, None), generate(engine, loop, second, 1, None))
    assert second.scheduled_at is not None and second.scheduled_at >= first.last_token_at
    assert engine.counters.finished["length"] == 2


async def test_emit_failure_aborts_and_frees_blocks(running: tuple[Engine, EngineLoop]) -> None:
    engine, loop = running

    async def emit(start: int, count: int) -> None:
        if start > 0:
            raise ConnectionResetError

    with pytest.raises(ConnectionResetError):
        await generate(engine, loop, request(out=10), 1, emit)
    assert engine.counters.finished["abort"] == 1 and engine.kv.used_blocks == 0 and not engine.running


async def test_cancelled_while_waiting_leaves_the_queue(running: tuple[Engine, EngineLoop]) -> None:
    engine, loop = running
    blocker = asyncio.create_task(generate(engine, loop, request(10_000 // 20, "blocker"), 1, None))
    waiting = request(5, "w")
    task = asyncio.create_task(generate(engine, loop, waiting, 1, None))
    await eventually(lambda: waiting in engine.waiting, "the request queued behind the blocker")
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert waiting not in engine.waiting and engine.counters.finished["abort"] == 1
    blocker.cancel()
    with pytest.raises(asyncio.CancelledError):
        await blocker


async def test_embedding_style_request_finishes_after_prefill(running: tuple[Engine, EngineLoop]) -> None:
    engine, loop = running
    req = GenRequest("e", list(range(30)), [])
    await generate(engine, loop, req, 1, None)
    assert engine.counters.finished["stop"] == 1 and engine.counters.generation_tokens == 0
    assert engine.steps == 1
